// The node agent's kubelet endpoint: the HTTPS server the API server's
// pods/exec and pods/log subresources reach. Exec is served by the kubelet
// streaming library (SPDY and WebSocket remotecommand protocols) and carried
// out with `docker exec`; logs come from `docker logs`.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/cri-streaming/pkg/streaming/remotecommand"
	utilexec "k8s.io/utils/exec"
)

const (
	execIdleTimeout       = 4 * time.Hour
	execStreamCreationMax = 30 * time.Second
)

// kubeletServer serves /exec, /containerLogs and /healthz on 127.0.0.1.
type kubeletServer struct {
	agent    *nodeAgent
	docker   *docker
	listener net.Listener
	srv      *http.Server
	logf     func(string, ...any)
}

// listenKubelet opens the TLS listener early so the node can advertise its port.
func listenKubelet(certPEM, keyPEM, caPEM []byte) (net.Listener, int, error) {
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, 0, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, 0, errors.New("bad CA")
	}
	cfg := &tls.Config{
		Certificates: []tls.Certificate{cert},
		ClientCAs:    pool,
		// Only the API server, with its kubelet client certificate, gets in.
		ClientAuth: tls.RequireAndVerifyClientCert,
		MinVersion: tls.VersionTLS12,
		NextProtos: []string{"http/1.1"},
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, 0, err
	}
	return tls.NewListener(l, cfg), l.Addr().(*net.TCPAddr).Port, nil
}

func newKubeletServer(agent *nodeAgent, l net.Listener, logf func(string, ...any)) *kubeletServer {
	k := &kubeletServer{agent: agent, docker: agent.docker, listener: l, logf: logf}
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") })
	mux.HandleFunc("/exec/", k.serveExec)
	mux.HandleFunc("/containerLogs/", k.serveLogs)
	k.srv = &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 30 * time.Second,
		// HTTP/1.1 only: the streams upgrade the connection.
		TLSNextProto: map[string]func(*http.Server, *tls.Conn, http.Handler){},
	}
	return k
}

func (k *kubeletServer) serve() {
	if err := k.srv.Serve(k.listener); err != nil && !errors.Is(err, http.ErrServerClosed) {
		k.logf("kubelet endpoint: %v", err)
	}
}

func (k *kubeletServer) shutdown() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := k.srv.Shutdown(ctx); err != nil {
		_ = k.srv.Close()
	}
}

// target resolves /<verb>/{namespace}/{pod}/{container} to the Pod and its
// running Docker container.
func (k *kubeletServer) target(ctx context.Context, path, prefix string) (*corev1.Pod, *containerInfo, int, error) {
	parts := strings.Split(strings.TrimPrefix(path, prefix), "/")
	if len(parts) < 3 {
		return nil, nil, http.StatusNotFound, fmt.Errorf("want %s{namespace}/{pod}/{container}", prefix)
	}
	ns, name, container := parts[0], parts[1], parts[2]
	pod, err := k.agent.pods.Pods(ns).Get(name)
	if apierrors.IsNotFound(err) {
		return nil, nil, http.StatusNotFound, fmt.Errorf("pod %s/%s not found", ns, name)
	}
	if err != nil {
		return nil, nil, http.StatusInternalServerError, err
	}
	if len(parts) >= 4 && parts[3] != "" && parts[3] != string(pod.UID) {
		return nil, nil, http.StatusNotFound, fmt.Errorf("pod %s/%s with uid %s not found", ns, name, parts[3])
	}
	if len(pod.Spec.Containers) == 0 || pod.Spec.Containers[0].Name != container {
		return nil, nil, http.StatusNotFound, fmt.Errorf("container %q in pod %s/%s is not run by the harness (only the first container is)", container, ns, name)
	}
	c, err := k.agent.podContainer(ctx, pod)
	if err != nil {
		return nil, nil, http.StatusInternalServerError, err
	}
	if c == nil {
		return nil, nil, http.StatusNotFound, fmt.Errorf("container %q of pod %s/%s not found", container, ns, name)
	}
	return pod, c, 0, nil
}

func (k *kubeletServer) serveExec(w http.ResponseWriter, req *http.Request) {
	_, c, code, err := k.target(req.Context(), req.URL.Path, "/exec/")
	if err != nil {
		http.Error(w, err.Error(), code)
		return
	}
	if !c.State.Running {
		http.Error(w, fmt.Sprintf("container %s is not running", c.ID[:12]), http.StatusBadRequest)
		return
	}
	opts, err := remotecommand.NewOptions(req)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	cmd := req.URL.Query()[corev1.ExecCommandParam]
	if len(cmd) == 0 {
		http.Error(w, "no command", http.StatusBadRequest)
		return
	}
	remotecommand.ServeExec(w, req, &dockerExecutor{docker: k.docker, logf: k.logf}, c.ID, "", "", cmd, opts,
		execIdleTimeout, execStreamCreationMax, remotecommand.SupportedStreamingProtocols)
}

// dockerExecutor runs a command in a container with `docker exec`.
type dockerExecutor struct {
	docker *docker
	logf   func(string, ...any)
}

// ExecInContainer implements remotecommand.Executor; name is the Docker
// container ID. A non-zero exit comes back as utilexec.CodeExitError, which
// the streaming library reports to the client as the exit code.
func (e *dockerExecutor) ExecInContainer(ctx context.Context, name string, _ string, _ string, cmd []string, in io.Reader, out, errOut io.WriteCloser, tty bool, resize <-chan remotecommand.TerminalSize, _ time.Duration) error {
	id, err := e.docker.execCreate(ctx, name, execCreate{
		AttachStdin:  in != nil,
		AttachStdout: out != nil,
		AttachStderr: errOut != nil && !tty,
		Tty:          tty,
		Cmd:          cmd,
	})
	if err != nil {
		return err
	}
	conn, err := e.docker.execStart(ctx, id, tty)
	if err != nil {
		return err
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()

	var wg sync.WaitGroup
	if resize != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for size := range resize {
				rctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				if err := e.docker.execResize(rctx, id, size.Width, size.Height); err != nil && !isNotFound(err) {
					e.logf("exec resize: %v", err)
				}
				cancel()
			}
		}()
	}
	if in != nil {
		// Not waited for: a client may keep stdin open after the process ends.
		go func() {
			_, _ = io.Copy(conn, in)
			_ = conn.CloseWrite()
		}()
	}
	if tty {
		if out != nil {
			_, _ = io.Copy(out, conn)
		} else {
			_, _ = io.Copy(io.Discard, conn)
		}
	} else {
		var o, eo io.Writer
		if out != nil {
			o = out
		}
		if errOut != nil {
			eo = errOut
		}
		if err := demux(conn, o, eo); err != nil && ctx.Err() == nil {
			e.logf("exec stream: %v", err)
		}
	}
	_ = conn.Close()
	// The resize channel closes with the stream; don't wait on it long.
	resizeDone := make(chan struct{})
	go func() { wg.Wait(); close(resizeDone) }()
	select {
	case <-resizeDone:
	case <-time.After(time.Second):
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	// The stream has ended; the exit code follows shortly.
	deadline := time.Now().Add(10 * time.Second)
	for {
		ictx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		info, err := e.docker.execInspect(ictx, id)
		cancel()
		if err != nil {
			return err
		}
		if !info.Running {
			if info.ExitCode != 0 {
				return utilexec.CodeExitError{Err: fmt.Errorf("command terminated with exit code %d", info.ExitCode), Code: info.ExitCode}
			}
			return nil
		}
		if time.Now().After(deadline) {
			return errors.New("exec stream ended but the process is still running")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// serveLogs answers the kubelet's containerLogs API from `docker logs`.
func (k *kubeletServer) serveLogs(w http.ResponseWriter, req *http.Request) {
	_, c, code, err := k.target(req.Context(), req.URL.Path, "/containerLogs/")
	if err != nil {
		http.Error(w, err.Error(), code)
		return
	}
	q := req.URL.Query()
	dq := url.Values{"stdout": {"1"}, "stderr": {"1"}}
	follow := q.Get("follow") == "true"
	if follow {
		dq.Set("follow", "1")
	}
	if q.Get("timestamps") == "true" {
		dq.Set("timestamps", "1")
	}
	if v := q.Get("tailLines"); v != "" {
		dq.Set("tail", v)
	}
	if v := q.Get("sinceSeconds"); v != "" {
		if n, err := strconv.ParseInt(v, 10, 64); err == nil {
			dq.Set("since", fmt.Sprint(time.Now().Unix()-n))
		}
	}
	if v := q.Get("sinceTime"); v != "" {
		if t, err := time.Parse(time.RFC3339, v); err == nil {
			dq.Set("since", fmt.Sprint(t.Unix()))
		}
	}
	var limit int64 = -1
	if v := q.Get("limitBytes"); v != "" {
		if n, err := strconv.ParseInt(v, 10, 64); err == nil && n > 0 {
			limit = n
		}
	}
	ctx := req.Context()
	if !follow {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 2*time.Minute)
		defer cancel()
	}
	body, err := k.docker.containerLogs(ctx, c.ID, dq)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	defer body.Close()
	w.Header().Set("Content-Type", "text/plain")
	w.WriteHeader(http.StatusOK)
	var dst io.Writer = flushWriter{w}
	if limit > 0 {
		dst = &limitWriter{w: dst, n: limit}
	}
	if c.Config.Tty {
		_, _ = io.Copy(dst, body)
		return
	}
	_ = demux(body, dst, dst)
}

type flushWriter struct{ w http.ResponseWriter }

func (f flushWriter) Write(p []byte) (int, error) {
	n, err := f.w.Write(p)
	if fl, ok := f.w.(http.Flusher); ok {
		fl.Flush()
	}
	return n, err
}

type limitWriter struct {
	w io.Writer
	n int64
}

func (l *limitWriter) Write(p []byte) (int, error) {
	if l.n <= 0 {
		return 0, io.ErrShortWrite
	}
	if int64(len(p)) > l.n {
		p = p[:l.n]
	}
	n, err := l.w.Write(p)
	l.n -= int64(n)
	return n, err
}
