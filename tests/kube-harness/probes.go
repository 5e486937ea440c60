// Readiness probes of a Pod's first container, as the kubelet runs them:
// tcpSocket and httpGet from the harness process (from the container's own
// network namespace when the Pod is on the isolated network, where the
// host has no address), exec with `docker exec`. One goroutine per running
// container probes it and requeues the Pod when its readiness changes; the
// status is written by the Pod's sync, which asks prober.ready.
package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/tools/cache"
)

// prober probes one run of one Pod's container.
type prober struct {
	uid       types.UID
	container string // Docker container id
	started   string // its State.StartedAt: a restart is a new run
	cancel    context.CancelFunc
	ready     bool // guarded by nodeAgent.probeMu
}

// probeTarget is what a probe reaches.
type probeTarget struct {
	ip        string
	pid       int  // the container's process, for its network namespace
	inNetns   bool // dial from the container's network namespace
	container string
	spec      *corev1.Container
}

// readiness reports whether the Pod's running container c is ready: with no
// readinessProbe, always; else what its prober found so far (starting one
// for a new run of the container).
func (a *nodeAgent) readiness(pod *corev1.Pod, c *containerInfo) bool {
	key := pod.Namespace + "/" + pod.Name
	probe := pod.Spec.Containers[0].ReadinessProbe
	if probe == nil {
		a.stopProbe(key)
		return true
	}
	a.probeMu.Lock()
	defer a.probeMu.Unlock()
	if p := a.probes[key]; p != nil {
		if p.uid == pod.UID && p.container == c.ID && p.started == c.State.StartedAt {
			return p.ready
		}
		p.cancel()
		delete(a.probes, key)
	}
	if a.ctx == nil || a.ctx.Err() != nil {
		return false
	}
	ctx, cancel := context.WithCancel(a.ctx)
	p := &prober{uid: pod.UID, container: c.ID, started: c.State.StartedAt, cancel: cancel}
	a.probes[key] = p
	network := a.ownNetwork(c)
	t := probeTarget{
		ip:        c.NetworkSettings.Networks[network].IPAddress,
		pid:       c.State.Pid,
		inNetns:   network == isolatedNetwork(a.instance),
		container: c.ID,
		spec:      &pod.Spec.Containers[0],
	}
	startedAt, err := time.Parse(time.RFC3339Nano, c.State.StartedAt)
	if err != nil {
		startedAt = time.Now()
	}
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		defer a.forgetProbe(key, p)
		a.probeLoop(ctx, key, p, probe, t, startedAt)
	}()
	return false
}

// stopProbe ends the Pod's prober, if any.
func (a *nodeAgent) stopProbe(key string) {
	a.probeMu.Lock()
	defer a.probeMu.Unlock()
	if p := a.probes[key]; p != nil {
		p.cancel()
		delete(a.probes, key)
	}
}

func (a *nodeAgent) forgetProbe(key string, p *prober) {
	a.probeMu.Lock()
	defer a.probeMu.Unlock()
	p.cancel()
	if a.probes[key] == p {
		delete(a.probes, key)
	}
}

// setReady records a change of readiness and requeues the Pod to report it.
func (a *nodeAgent) setReady(key string, p *prober, ready bool) {
	a.probeMu.Lock()
	current := a.probes[key] == p
	if current {
		p.ready = ready
	}
	a.probeMu.Unlock()
	if current {
		a.podQueue.Add(key)
	}
}

func seconds(v int32, def int32) time.Duration {
	if v <= 0 {
		v = def
	}
	return time.Duration(v) * time.Second
}

func atLeastOne(v int32, def int32) int {
	if v <= 0 {
		return int(def)
	}
	return int(v)
}

// probeLoop probes from initialDelaySeconds after the container started,
// every periodSeconds, until ctx ends or the Pod is gone: ready after
// successThreshold successes in a row, not ready after failureThreshold
// failures in a row.
func (a *nodeAgent) probeLoop(ctx context.Context, key string, p *prober, probe *corev1.Probe, t probeTarget, startedAt time.Time) {
	period := seconds(probe.PeriodSeconds, 10)
	timeout := seconds(probe.TimeoutSeconds, 1)
	successes, failures := atLeastOne(probe.SuccessThreshold, 1), atLeastOne(probe.FailureThreshold, 3)
	ns, name, _ := cache.SplitMetaNamespaceKey(key)
	timer := time.NewTimer(max(time.Until(startedAt.Add(time.Duration(probe.InitialDelaySeconds)*time.Second)), 0))
	defer timer.Stop()
	ready, okRun, failRun := false, 0, 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
		pod, err := a.pods.Pods(ns).Get(name)
		if err != nil || pod.UID != p.uid || pod.DeletionTimestamp != nil {
			return
		}
		pctx, cancel := context.WithTimeout(ctx, timeout)
		err = a.runProbe(pctx, &probe.ProbeHandler, t)
		cancel()
		if ctx.Err() != nil {
			return
		}
		if err == nil {
			okRun, failRun = okRun+1, 0
		} else {
			okRun, failRun = 0, failRun+1
			a.kubelet.Eventf(pod, corev1.EventTypeWarning, "Unhealthy", "Readiness probe failed: %v", err)
		}
		switch {
		case !ready && okRun >= successes:
			ready = true
			a.setReady(key, p, true)
		case ready && failRun >= failures:
			ready = false
			a.setReady(key, p, false)
		}
		timer.Reset(period)
	}
}

// runProbe runs one probe within ctx: nil is success.
func (a *nodeAgent) runProbe(ctx context.Context, h *corev1.ProbeHandler, t probeTarget) error {
	switch {
	case h.Exec != nil:
		return a.execProbe(ctx, t.container, h.Exec.Command)
	case h.TCPSocket != nil:
		addr, err := probeAddr(h.TCPSocket.Host, h.TCPSocket.Port, t)
		if err != nil {
			return err
		}
		conn, err := t.dial(ctx, "tcp", addr)
		if err != nil {
			return err
		}
		return conn.Close()
	case h.HTTPGet != nil:
		return httpProbe(ctx, h.HTTPGet, t)
	}
	return errors.New("the harness runs only exec, tcpSocket and httpGet probes")
}

// probeAddr is host:port of a tcpSocket or httpGet probe (host: the Pod
// IP unless given; port: a number or the name of a container port).
func probeAddr(host string, port intstr.IntOrString, t probeTarget) (string, error) {
	if host == "" {
		host = t.ip
	}
	if host == "" {
		return "", errors.New("the container has no IP address")
	}
	n := port.IntValue()
	if port.Type == intstr.String {
		n = 0
		for _, p := range t.spec.Ports {
			if p.Name == port.StrVal {
				n = int(p.ContainerPort)
			}
		}
		if n == 0 {
			return "", fmt.Errorf("no container port named %q", port.StrVal)
		}
	}
	if n <= 0 || n > 65535 {
		return "", fmt.Errorf("invalid port %s", port.String())
	}
	return net.JoinHostPort(host, strconv.Itoa(n)), nil
}

// httpProbe GETs the path: a status of 200-399 is success (redirects are
// not followed, as a 3xx is success anyway). HTTPS is not verified, as the
// kubelet does not verify it.
func httpProbe(ctx context.Context, g *corev1.HTTPGetAction, t probeTarget) error {
	addr, err := probeAddr(g.Host, g.Port, t)
	if err != nil {
		return err
	}
	scheme := "http"
	if g.Scheme == corev1.URISchemeHTTPS {
		scheme = "https"
	}
	path := g.Path
	if !strings.HasPrefix(path, "/") {
		path = "/" + path
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, scheme+"://"+addr+path, nil)
	if err != nil {
		return err
	}
	req.Header.Set("User-Agent", "kube-probe/1.37")
	for _, h := range g.HTTPHeaders {
		if strings.EqualFold(h.Name, "Host") {
			req.Host = h.Value
		} else {
			req.Header.Add(h.Name, h.Value)
		}
	}
	client := &http.Client{
		Transport: &http.Transport{
			DialContext:       t.dial,
			TLSClientConfig:   &tls.Config{InsecureSkipVerify: true},
			DisableKeepAlives: true,
		},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 10<<10))
	if resp.StatusCode < 200 || resp.StatusCode >= 400 {
		return fmt.Errorf("HTTP probe failed with statuscode: %d", resp.StatusCode)
	}
	return nil
}

// probeOutput keeps the first KiB of an exec probe's output.
type probeOutput struct{ b []byte }

func (o *probeOutput) Write(p []byte) (int, error) {
	if room := 1024 - len(o.b); room > 0 {
		o.b = append(o.b, p[:min(room, len(p))]...)
	}
	return len(p), nil
}

func (o *probeOutput) Close() error { return nil }

// execProbe runs the command in the container: exit 0 is success.
func (a *nodeAgent) execProbe(ctx context.Context, container string, cmd []string) error {
	out := &probeOutput{}
	ex := &dockerExecutor{docker: a.docker, logf: a.logf}
	err := ex.ExecInContainer(ctx, container, "", "", cmd, nil, out, out, false, nil, 0)
	if ctx.Err() != nil {
		return fmt.Errorf("command %q timed out", strings.Join(cmd, " "))
	}
	if err != nil {
		if msg := strings.TrimSpace(string(out.b)); msg != "" {
			return fmt.Errorf("%w: %s", err, msg)
		}
	}
	return err
}

// dial connects from the harness, or from the container's network
// namespace for a Pod on the isolated network.
func (t probeTarget) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	if !t.inNetns {
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	}
	return dialInNetns(ctx, t.pid, network, addr)
}

// dialInNetns dials addr (an IP address and port) from the network
// namespace of process pid, on an OS thread of its own that moves there
// and back (needs CAP_SYS_ADMIN, and the engine's processes in sight in
// /proc). A thread that cannot move back is left locked, so the runtime
// ends it.
func dialInNetns(ctx context.Context, pid int, network, addr string) (net.Conn, error) {
	if pid <= 0 {
		return nil, errors.New("the container has no process")
	}
	type result struct {
		conn net.Conn
		err  error
	}
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		conn, back, err := dialFromNetns(ctx, pid, network, addr)
		if back {
			runtime.UnlockOSThread()
		}
		done <- result{conn, err}
	}()
	r := <-done
	return r.conn, r.err
}

// dialFromNetns is dialInNetns on the locked thread; back says the thread
// is in the harness's namespace again.
func dialFromNetns(ctx context.Context, pid int, network, addr string) (net.Conn, bool, error) {
	own, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		return nil, true, fmt.Errorf("own network namespace: %w", err)
	}
	defer own.Close()
	target, err := os.Open(fmt.Sprintf("/proc/%d/ns/net", pid))
	if err != nil {
		return nil, true, fmt.Errorf("network namespace of the container: %w", err)
	}
	defer target.Close()
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		return nil, true, fmt.Errorf("enter the container's network namespace: %w", err)
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, network, addr)
	if serr := unix.Setns(int(own.Fd()), unix.CLONE_NEWNET); serr != nil {
		if conn != nil {
			conn.Close()
		}
		return nil, false, fmt.Errorf("back to the harness's network namespace: %w", serr)
	}
	return conn, true, err
}
