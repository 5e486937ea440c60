// `kube-harness selftest`: starts a harness in a temporary directory and
// drives it as the `hermes` ServiceAccount the way the project's tests do:
// a claim and a Pod, exec over WebSocket and SPDY, data kept across Pods,
// logs, a missing image, RBAC that really refuses, Services by name,
// NetworkPolicy egress isolation, and readiness probes.
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/remotecommand"
	utilexec "k8s.io/client-go/util/exec"
)

type selftest struct {
	cfg        *rest.Config
	client     kubernetes.Interface
	image      string
	podNetwork string
	failures   int
}

func (t *selftest) check(name string, err error) bool {
	if err != nil {
		t.failures++
		fmt.Printf("FAIL %s: %v\n", name, err)
		return false
	}
	fmt.Printf("PASS %s\n", name)
	return true
}

func cmdSelftest(args []string) error {
	fs := flag.NewFlagSet("selftest", flag.ContinueOnError)
	image := fs.String("image-default", defaultImage(), "image of the test Pods (must be present locally)")
	keep := fs.Bool("keep", false, "keep the temporary directory")
	if err := fs.Parse(args); err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "kube-harness-selftest-")
	if err != nil {
		return err
	}
	if !*keep {
		defer os.RemoveAll(dir)
	} else {
		fmt.Printf("dir %s\n", dir)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	serveCtx, stopServe := context.WithCancel(ctx)
	readyCh := make(chan readyInfo, 1)
	served := make(chan error, 1)
	started := time.Now()
	go func() {
		served <- serve(serveCtx, serveOptions{
			dir: dir, image: *image, maxLifetime: 20 * time.Minute, stderr: os.Stderr,
			klogToFile: true, readyTimeout: 5 * time.Minute, agentSandbox: true,
		}, func(r readyInfo) { readyCh <- r })
	}()
	var ready readyInfo
	select {
	case ready = <-readyCh:
	case err := <-served:
		stopServe()
		return fmt.Errorf("FAIL harness did not start: %v", err)
	}
	fmt.Printf("PASS harness ready in %s: %s\n", time.Since(started).Round(100*time.Millisecond), ready.Server)

	t := &selftest{image: *image, podNetwork: ready.PodNetwork}
	t.cfg, err = clientcmd.BuildConfigFromFlags("", ready.HermesKubeconfig)
	if err == nil {
		t.cfg.Timeout = 60 * time.Second
		t.client, err = kubernetes.NewForConfig(t.cfg)
	}
	if t.check("hermes kubeconfig loads", err) {
		t.run(ctx)
	}

	stopServe()
	select {
	case err := <-served:
		t.check("harness stops cleanly", err)
	case <-time.After(3 * time.Minute):
		t.check("harness stops cleanly", errors.New("still running after 3 minutes"))
	}
	if d, err := newDocker(); err == nil {
		lctx, lcancel := context.WithTimeout(context.Background(), 30*time.Second)
		cs, err1 := d.containerList(lctx, labelInstance+"="+ready.Instance)
		vs, err2 := d.volumeList(lctx, labelInstance+"="+ready.Instance)
		ns, err3 := d.networkList(lctx, labelInstance+"="+ready.Instance)
		lcancel()
		err = errors.Join(err1, err2, err3)
		if err == nil && len(cs)+len(vs)+len(ns) > 0 {
			err = fmt.Errorf("%d containers, %d volumes and %d networks (%v) left", len(cs), len(vs), len(ns), ns)
		}
		t.check("no Docker objects left", err)
	}
	if t.failures > 0 {
		return fmt.Errorf("%d checks failed", t.failures)
	}
	fmt.Println("PASS all")
	return nil
}

func poll(ctx context.Context, limit time.Duration, what string, cond func() (bool, error)) error {
	deadline := time.Now().Add(limit)
	var last error
	for {
		ok, err := cond()
		if ok {
			return nil
		}
		if err != nil {
			last = err
		}
		if time.Now().After(deadline) {
			if last != nil {
				return fmt.Errorf("%s: not within %s (last: %v)", what, limit, last)
			}
			return fmt.Errorf("%s: not within %s", what, limit)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

func (t *selftest) pod(name string, command []string) *corev1.Pod {
	grace := int64(2)
	no := false
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app": "kube-harness-selftest"}},
		Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: &grace,
			Containers: []corev1.Container{{
				Name:    "main",
				Image:   t.image,
				Command: command,
				Env:     []corev1.EnvVar{{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}}},
				SecurityContext: &corev1.SecurityContext{
					Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
					AllowPrivilegeEscalation: &no,
					SeccompProfile:           &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
				},
				Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{
					corev1.ResourceCPU:    resource.MustParse("1"),
					corev1.ResourceMemory: resource.MustParse("256Mi"),
				}},
				VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data"}},
			}},
			Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
				PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "selftest-data"},
			}}},
		},
	}
}

func (t *selftest) waitRunning(ctx context.Context, name string) error {
	pods := t.client.CoreV1().Pods(testNamespace)
	return poll(ctx, 2*time.Minute, "pod "+name+" Running and Ready", func() (bool, error) {
		p, err := pods.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		if p.Status.Phase != corev1.PodRunning || p.Status.PodIP == "" {
			return false, fmt.Errorf("phase %s %v", p.Status.Phase, p.Status.ContainerStatuses)
		}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
				return true, nil
			}
		}
		return false, nil
	})
}

func (t *selftest) waitGone(ctx context.Context, name string) error {
	pods := t.client.CoreV1().Pods(testNamespace)
	return poll(ctx, 90*time.Second, "pod "+name+" gone", func() (bool, error) {
		_, err := pods.Get(ctx, name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), err
	})
}

type execResult struct {
	stdout, stderr string
	code           int
}

// exec runs a command in the Pod over WebSocket (v5) or SPDY.
func (t *selftest) exec(ctx context.Context, pod string, cmd []string, stdin string, transport string, tty bool) (execResult, error) {
	req := t.client.CoreV1().RESTClient().Post().Resource("pods").Namespace(testNamespace).Name(pod).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{
			Container: "main", Command: cmd, Stdin: stdin != "", Stdout: true, Stderr: !tty, TTY: tty,
		}, scheme.ParameterCodec)
	var ex remotecommand.Executor
	var err error
	switch transport {
	case "websocket":
		ex, err = remotecommand.NewWebSocketExecutor(t.cfg, "GET", req.URL().String())
	case "websocket-v4":
		ex, err = remotecommand.NewWebSocketExecutorForProtocols(t.cfg, "GET", req.URL().String(), "v4.channel.k8s.io")
	case "websocket-v5-v4":
		// What kube-rs offers.
		ex, err = remotecommand.NewWebSocketExecutorForProtocols(t.cfg, "GET", req.URL().String(), "v5.channel.k8s.io", "v4.channel.k8s.io")
	default:
		ex, err = remotecommand.NewSPDYExecutor(t.cfg, "POST", req.URL())
	}
	if err != nil {
		return execResult{}, err
	}
	var out, errb bytes.Buffer
	opts := remotecommand.StreamOptions{Stdout: &out, Tty: tty}
	if !tty {
		opts.Stderr = &errb
	}
	if stdin != "" {
		opts.Stdin = strings.NewReader(stdin)
	}
	ectx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	err = ex.StreamWithContext(ectx, opts)
	res := execResult{stdout: out.String(), stderr: errb.String()}
	var ee utilexec.ExitError
	if errors.As(err, &ee) {
		res.code = ee.ExitStatus()
		err = nil
	}
	return res, err
}

func expect(r execResult, stdout, stderr string, code int) error {
	if r.stdout != stdout || r.stderr != stderr || r.code != code {
		return fmt.Errorf("got stdout %q stderr %q exit %d; want %q %q %d", r.stdout, r.stderr, r.code, stdout, stderr, code)
	}
	return nil
}

func (t *selftest) run(ctx context.Context) {
	pods := t.client.CoreV1().Pods(testNamespace)
	claims := t.client.CoreV1().PersistentVolumeClaims(testNamespace)

	_, err := t.client.Discovery().ServerVersion()
	t.check("discovery (/version) as the ServiceAccount", err)

	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "selftest-data"},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
		},
	}
	_, err = claims.Create(ctx, pvc, metav1.CreateOptions{})
	if err == nil {
		err = poll(ctx, 30*time.Second, "claim Bound", func() (bool, error) {
			c, err := claims.Get(ctx, "selftest-data", metav1.GetOptions{})
			return err == nil && c.Status.Phase == corev1.ClaimBound, err
		})
	}
	t.check("PVC created and Bound", err)

	_, err = pods.Create(ctx, t.pod("selftest", []string{"sleep", "infinity"}), metav1.CreateOptions{})
	if err == nil {
		err = t.waitRunning(ctx, "selftest")
	}
	if !t.check("Pod (drop ALL, PVC at /data) Running and Ready", err) {
		return
	}

	r, err := t.exec(ctx, "selftest", []string{"sh", "-c", "echo hi; echo err >&2; cat; exit 3"}, "in\n", "websocket", false)
	if err == nil {
		err = expect(r, "hi\nin\n", "err\n", 3)
	}
	t.check("exec over WebSocket v5 (stdin, stdout, stderr, exit 3)", err)

	r, err = t.exec(ctx, "selftest", []string{"sh", "-c", "echo hi; echo err >&2; cat; exit 3"}, "in\n", "spdy", false)
	if err == nil {
		err = expect(r, "hi\nin\n", "err\n", 3)
	}
	t.check("exec over SPDY (stdin, stdout, stderr, exit 3)", err)

	r, err = t.exec(ctx, "selftest", []string{"sh", "-c", "echo hi; echo err >&2; cat; exit 3"}, "in\n", "websocket-v5-v4", false)
	if err == nil {
		err = expect(r, "hi\nin\n", "err\n", 3)
	}
	t.check("exec over WebSocket offering v5.channel.k8s.io, v4.channel.k8s.io", err)

	r, err = t.exec(ctx, "selftest", []string{"sh", "-c", "echo hi; echo err >&2; exit 4"}, "", "websocket-v4", false)
	if err == nil {
		err = expect(r, "hi\n", "err\n", 4)
	}
	t.check("exec over WebSocket v4.channel.k8s.io (stdout, stderr, exit 4)", err)

	r, err = t.exec(ctx, "selftest", []string{"sh", "-c", "test -t 0 && echo tty"}, "", "websocket", true)
	if err == nil && strings.TrimSpace(r.stdout) != "tty" {
		err = fmt.Errorf("got %q", r.stdout)
	}
	t.check("exec with a tty", err)

	r, err = t.exec(ctx, "selftest", []string{"sh", "-c", "grep CapEff /proc/self/status; id -u; echo $POD_NAME"}, "", "websocket", false)
	if err == nil {
		err = expect(r, "CapEff:\t0000000000000000\n0\nselftest\n", "", 0)
	}
	t.check("capabilities dropped, env from fieldRef", err)

	r, err = t.exec(ctx, "selftest", []string{"sh", "-c", "echo persisted > /data/f && cat /var/run/secrets/kubernetes.io/serviceaccount/namespace"}, "", "websocket", false)
	if err == nil {
		err = expect(r, testNamespace, "", 0)
	}
	t.check("write to the claim; service-account volume mounted", err)

	err = pods.Delete(ctx, "selftest", metav1.DeleteOptions{})
	if err == nil {
		err = t.waitGone(ctx, "selftest")
	}
	t.check("Pod deleted and finalised by the node", err)

	_, err = pods.Create(ctx, t.pod("selftest", []string{"sh", "-c", "echo log-line; exec sleep infinity"}), metav1.CreateOptions{})
	if err == nil {
		err = t.waitRunning(ctx, "selftest")
	}
	if err == nil {
		r, err = t.exec(ctx, "selftest", []string{"cat", "/data/f"}, "", "websocket", false)
		if err == nil {
			err = expect(r, "persisted\n", "", 0)
		}
	}
	t.check("recreated Pod reads the claim's file back", err)

	var logs []byte
	err = poll(ctx, 20*time.Second, "logs", func() (bool, error) {
		logs, err = pods.GetLogs("selftest", &corev1.PodLogOptions{Container: "main"}).DoRaw(ctx)
		return err == nil && string(logs) == "log-line\n", err
	})
	if err != nil {
		err = fmt.Errorf("%v (got %q)", err, logs)
	}
	t.check("pods/log", err)

	missing := t.pod("selftest-missing-image", []string{"true"})
	missing.Spec.Containers[0].Image = "hermes-kube-harness-missing-image:never"
	missing.Spec.Volumes, missing.Spec.Containers[0].VolumeMounts = nil, nil
	_, err = pods.Create(ctx, missing, metav1.CreateOptions{})
	if err == nil {
		err = poll(ctx, 30*time.Second, "ErrImagePull", func() (bool, error) {
			p, err := pods.Get(ctx, missing.Name, metav1.GetOptions{})
			if err != nil || len(p.Status.ContainerStatuses) == 0 || p.Status.ContainerStatuses[0].State.Waiting == nil {
				return false, err
			}
			w := p.Status.ContainerStatuses[0].State.Waiting
			return p.Status.Phase == corev1.PodPending && (w.Reason == "ErrImagePull" || w.Reason == "ImagePullBackOff"), nil
		})
	}
	t.check("missing image: Pending with ErrImagePull, never pulled", err)

	forbidden := func(name string, err error) {
		if err == nil {
			err = errors.New("allowed")
		} else if apierrors.IsForbidden(err) {
			err = nil
		}
		t.check(name, err)
	}
	_, err = t.client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	forbidden("RBAC: list nodes is forbidden", err)
	_, err = t.client.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "selftest"}}, metav1.CreateOptions{})
	forbidden("RBAC: create clusterroles is forbidden", err)
	_, err = t.client.CoreV1().Pods("kube-system").List(ctx, metav1.ListOptions{})
	forbidden("RBAC: list pods in kube-system is forbidden", err)
	_, err = t.client.CoreV1().Events(testNamespace).List(ctx, metav1.ListOptions{})
	t.check("RBAC: list events in hermes-test is allowed", err)

	t.check("restartPolicy Never: exit 7 makes the Pod Failed", t.exitedPod(ctx))
	t.check("restartPolicy Always: a crashing container is restarted", t.restartedPod(ctx))
	t.check("configMap volume and secretKeyRef env", t.configPod(ctx))

	t.servicesByName(ctx)
	t.egressIsolation(ctx)
	t.readinessProbes(ctx)

	t.check("agent-sandbox: the ServiceAccount's v1beta1 Sandbox gets a running Pod from the controller, which goes with it", t.sandbox(ctx))

	err = errors.Join(pods.Delete(ctx, "selftest", metav1.DeleteOptions{}), pods.Delete(ctx, missing.Name, metav1.DeleteOptions{}))
	if err == nil {
		err = errors.Join(t.waitGone(ctx, "selftest"), t.waitGone(ctx, missing.Name))
	}
	if err == nil {
		err = claims.Delete(ctx, "selftest-data", metav1.DeleteOptions{})
	}
	if err == nil {
		err = poll(ctx, 60*time.Second, "claim gone", func() (bool, error) {
			_, err := claims.Get(ctx, "selftest-data", metav1.GetOptions{})
			return apierrors.IsNotFound(err), err
		})
	}
	t.check("Pods and PVC deleted (claim's finalizer released)", err)
}

// sandbox creates an agents.x-k8s.io/v1beta1 Sandbox as the ServiceAccount,
// waits for the controller's Pod to run, deletes the Sandbox and waits for
// the garbage collector to take the Pod.
func (t *selftest) sandbox(ctx context.Context) error {
	dyn, err := dynamic.NewForConfig(t.cfg)
	if err != nil {
		return err
	}
	gvr := schema.GroupVersionResource{Group: "agents.x-k8s.io", Version: "v1beta1", Resource: "sandboxes"}
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "agents.x-k8s.io/v1beta1",
		"kind":       "Sandbox",
		"metadata":   map[string]any{"name": "selftest-sandbox"},
		"spec": map[string]any{"podTemplate": map[string]any{"spec": map[string]any{
			"containers": []any{map[string]any{"name": "main", "image": t.image, "command": []any{"sleep", "3600"}}},
		}}},
	}}
	res := dyn.Resource(gvr).Namespace(testNamespace)
	if _, err := res.Create(ctx, obj, metav1.CreateOptions{}); err != nil {
		return err
	}
	pods := t.client.CoreV1().Pods(testNamespace)
	err = poll(ctx, 120*time.Second, "the Sandbox's Pod running", func() (bool, error) {
		p, err := pods.Get(ctx, "selftest-sandbox", metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return err == nil && p.Status.Phase == corev1.PodRunning, err
	})
	if err != nil {
		return err
	}
	if err := res.Delete(ctx, "selftest-sandbox", metav1.DeleteOptions{}); err != nil {
		return err
	}
	return poll(ctx, 120*time.Second, "the Sandbox's Pod gone with it", func() (bool, error) {
		_, err := pods.Get(ctx, "selftest-sandbox", metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		return false, err
	})
}

func (t *selftest) plainPod(name string, command []string) *corev1.Pod {
	p := t.pod(name, command)
	p.Spec.Volumes, p.Spec.Containers[0].VolumeMounts = nil, nil
	return p
}

func (t *selftest) deletePod(ctx context.Context, name string) error {
	zero := int64(0)
	err := t.client.CoreV1().Pods(testNamespace).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
	if err != nil {
		return err
	}
	return t.waitGone(ctx, name)
}

func (t *selftest) exitedPod(ctx context.Context) error {
	pods := t.client.CoreV1().Pods(testNamespace)
	p := t.plainPod("selftest-exit", []string{"sh", "-c", "exit 7"})
	p.Spec.RestartPolicy = corev1.RestartPolicyNever
	if _, err := pods.Create(ctx, p, metav1.CreateOptions{}); err != nil {
		return err
	}
	err := poll(ctx, 60*time.Second, "Failed with exit code 7", func() (bool, error) {
		got, err := pods.Get(ctx, p.Name, metav1.GetOptions{})
		if err != nil || got.Status.Phase != corev1.PodFailed || len(got.Status.ContainerStatuses) == 0 {
			return false, err
		}
		term := got.Status.ContainerStatuses[0].State.Terminated
		if term == nil || term.ExitCode != 7 {
			return false, fmt.Errorf("terminated state %+v", term)
		}
		return true, nil
	})
	return errors.Join(err, t.deletePod(ctx, p.Name))
}

func (t *selftest) restartedPod(ctx context.Context) error {
	pods := t.client.CoreV1().Pods(testNamespace)
	p := t.plainPod("selftest-crash", []string{"sh", "-c", "sleep 1; exit 1"})
	if _, err := pods.Create(ctx, p, metav1.CreateOptions{}); err != nil {
		return err
	}
	err := poll(ctx, 60*time.Second, "restarted", func() (bool, error) {
		got, err := pods.Get(ctx, p.Name, metav1.GetOptions{})
		if err != nil || len(got.Status.ContainerStatuses) == 0 {
			return false, err
		}
		cs := got.Status.ContainerStatuses[0]
		last := cs.LastTerminationState.Terminated
		return cs.RestartCount >= 1 && last != nil && last.ExitCode == 1, fmt.Errorf("status %+v", cs)
	})
	return errors.Join(err, t.deletePod(ctx, p.Name))
}

func (t *selftest) configPod(ctx context.Context) error {
	cms := t.client.CoreV1().ConfigMaps(testNamespace)
	secrets := t.client.CoreV1().Secrets(testNamespace)
	if _, err := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "selftest"}, Data: map[string]string{"greeting": "hello"}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	if _, err := secrets.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "selftest"}, StringData: map[string]string{"token": "s3cret"}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	mode := int32(0o440)
	p := t.plainPod("selftest-config", []string{"sleep", "infinity"})
	p.Spec.Volumes = []corev1.Volume{{Name: "cfg", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
		LocalObjectReference: corev1.LocalObjectReference{Name: "selftest"}, DefaultMode: &mode,
	}}}}
	p.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "cfg", MountPath: "/etc/selftest"}}
	p.Spec.Containers[0].Env = append(p.Spec.Containers[0].Env, corev1.EnvVar{Name: "TOKEN", ValueFrom: &corev1.EnvVarSource{
		SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "selftest"}, Key: "token"},
	}})
	if _, err := t.client.CoreV1().Pods(testNamespace).Create(ctx, p, metav1.CreateOptions{}); err != nil {
		return err
	}
	err := t.waitRunning(ctx, p.Name)
	if err == nil {
		var r execResult
		r, err = t.exec(ctx, p.Name, []string{"sh", "-c", "cat /etc/selftest/greeting; echo; stat -c %a /etc/selftest/greeting; echo $TOKEN; touch /etc/selftest/x 2>/dev/null || echo read-only"}, "", "websocket", false)
		if err == nil {
			err = expect(r, "hello\n440\ns3cret\nread-only\n", "", 0)
		}
	}
	return errors.Join(err, t.deletePod(ctx, p.Name),
		cms.Delete(ctx, "selftest", metav1.DeleteOptions{}), secrets.Delete(ctx, "selftest", metav1.DeleteOptions{}))
}

// --- Services, NetworkPolicy, readiness probes -----------------------------

// servingPod serves body at http://POD:8080/ (python3's http.server), with
// the labels and readiness probe given.
func (t *selftest) servingPod(name, body string, labels map[string]string, probe *corev1.Probe) *corev1.Pod {
	p := t.plainPod(name, []string{"sh", "-c", "mkdir -p /tmp/www && echo " + body + " > /tmp/www/index.html && cd /tmp/www && exec python3 -m http.server 8080"})
	for k, v := range labels {
		p.Labels[k] = v
	}
	p.Spec.Containers[0].ReadinessProbe = probe
	return p
}

func tcpProbe(port int) *corev1.Probe {
	return &corev1.Probe{PeriodSeconds: 1, ProbeHandler: corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt32(int32(port))}}}
}

func httpGetProbe(path string, port int) *corev1.Probe {
	return &corev1.Probe{PeriodSeconds: 1, ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: path, Port: intstr.FromInt32(int32(port))}}}
}

func execProbe(cmd ...string) *corev1.Probe {
	return &corev1.Probe{PeriodSeconds: 1, ProbeHandler: corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: cmd}}}
}

func service(name string, selector map[string]string) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.ServiceSpec{
			Selector: selector,
			Ports:    []corev1.ServicePort{{Port: 8080, TargetPort: intstr.FromInt32(8080)}},
		},
	}
}

// createRunning creates the Pods and waits for each to be Running and Ready.
func (t *selftest) createRunning(ctx context.Context, pods ...*corev1.Pod) error {
	for _, p := range pods {
		if _, err := t.client.CoreV1().Pods(testNamespace).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create pod %s: %w", p.Name, err)
		}
	}
	for _, p := range pods {
		if err := t.waitRunning(ctx, p.Name); err != nil {
			return err
		}
	}
	return nil
}

// deletePods deletes the Pods (grace 0), the ones never made included.
func (t *selftest) deletePods(ctx context.Context, pods ...*corev1.Pod) error {
	var errs []error
	for _, p := range pods {
		if err := t.deletePod(ctx, p.Name); err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// curl GETs url from inside the Pod (2 s at most).
func (t *selftest) curl(ctx context.Context, pod, url string) (execResult, error) {
	return t.exec(ctx, pod, []string{"curl", "-sS", "--max-time", "2", url}, "", "websocket", false)
}

// reaches checks that pod gets want from url.
func (t *selftest) reaches(ctx context.Context, pod, url, want string) error {
	r, err := t.curl(ctx, pod, url)
	if err == nil && (r.code != 0 || r.stdout != want) {
		err = fmt.Errorf("curl %s from %s: exit %d, got %q (%s), want %q", url, pod, r.code, r.stdout, strings.TrimSpace(r.stderr), want)
	}
	return err
}

// cannotReach checks that pod gets nothing from url (curl fails).
func (t *selftest) cannotReach(ctx context.Context, pod, url string) error {
	r, err := t.curl(ctx, pod, url)
	if err == nil && r.code == 0 {
		err = fmt.Errorf("curl %s from %s: reached it (got %q)", url, pod, r.stdout)
	}
	return err
}

func (t *selftest) podIP(ctx context.Context, name string) (string, error) {
	p, err := t.client.CoreV1().Pods(testNamespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return "", err
	}
	if p.Status.PodIP == "" {
		return "", fmt.Errorf("pod %s has no IP", name)
	}
	return p.Status.PodIP, nil
}

// servicesByName: a Service's selected Pod answers to the Service's names
// for other Pods (by Docker's DNS).
func (t *selftest) servicesByName(ctx context.Context) {
	svcs := t.client.CoreV1().Services(testNamespace)
	web := t.servingPod("selftest-web-pod", "web-ok", map[string]string{"selftest-role": "web"}, httpGetProbe("/", 8080))
	client := t.plainPod("selftest-client", []string{"sleep", "infinity"})
	svc, err := svcs.Create(ctx, service("selftest-web", map[string]string{"selftest-role": "web"}), metav1.CreateOptions{})
	if err == nil && (svc.Spec.ClusterIP == "" || svc.Spec.ClusterIP == corev1.ClusterIPNone) {
		err = fmt.Errorf("no ClusterIP allocated: %q", svc.Spec.ClusterIP)
	}
	if t.check("Service created with a ClusterIP", err) {
		err = t.createRunning(ctx, web, client)
		if t.check("Pod with an httpGet readiness probe becomes Ready", err) {
			t.check("Service by name: a Pod reaches the Service's Pod as selftest-web",
				t.reaches(ctx, client.Name, "http://selftest-web:8080/", "web-ok\n"))
			t.check("Service by name: ... and as selftest-web."+testNamespace+".svc.cluster.local",
				t.reaches(ctx, client.Name, "http://selftest-web."+testNamespace+".svc.cluster.local:8080/", "web-ok\n"))
		}
	}
	t.check("Service test cleaned up", errors.Join(t.deletePods(ctx, web, client), ignoreNotFound(svcs.Delete(ctx, "selftest-web", metav1.DeleteOptions{}))))
}

func ignoreNotFound(err error) error {
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// hostListener serves "host-ok" over HTTP on the gateway address of the
// Pod network (the host's address there), until stopped.
func (t *selftest) hostListener(ctx context.Context) (string, func(), error) {
	d, err := newDocker()
	if err != nil {
		return "", nil, err
	}
	gw, err := d.networkGateway(ctx, t.podNetwork)
	if err != nil {
		return "", nil, err
	}
	l, err := net.Listen("tcp", net.JoinHostPort(gw, "0"))
	if err != nil {
		return "", nil, err
	}
	srv := &http.Server{
		Handler:           http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "host-ok\n") }),
		ReadHeaderTimeout: 5 * time.Second,
	}
	go func() { _ = srv.Serve(l) }()
	return "http://" + l.Addr().String() + "/", func() { _ = srv.Close() }, nil
}

// egressIsolation: a NetworkPolicy limits role=sandbox Pods' egress to
// role=proxy Pods; the sandbox reaches the proxy by its Service's name, not
// a third Pod nor the host, which the proxy (on the Pod network too) does.
func (t *selftest) egressIsolation(ctx context.Context) {
	pols := t.client.NetworkingV1().NetworkPolicies(testNamespace)
	svcs := t.client.CoreV1().Services(testNamespace)
	proxy := t.servingPod("selftest-proxy-pod", "proxy-ok", map[string]string{"role": "proxy"},
		execProbe("curl", "-sf", "-o", "/dev/null", "--max-time", "1", "http://127.0.0.1:8080/"))
	other := t.servingPod("selftest-other", "other-ok", nil, nil)
	// Served and probed by tcpSocket: the probe reaches the isolated Pod.
	sandbox := t.servingPod("selftest-sandbox", "sandbox-ok", map[string]string{"role": "sandbox"}, tcpProbe(8080))
	defer func() {
		t.check("NetworkPolicy test cleaned up", errors.Join(t.deletePods(ctx, sandbox, proxy, other),
			ignoreNotFound(svcs.Delete(ctx, "selftest-proxy", metav1.DeleteOptions{})),
			ignoreNotFound(pols.Delete(ctx, "selftest-egress", metav1.DeleteOptions{}))))
	}()
	_, err := pols.Create(ctx, &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "selftest-egress"},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"role": "sandbox"}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress},
			Egress: []networkingv1.NetworkPolicyEgressRule{{
				To: []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"role": "proxy"}}}},
			}},
		},
	}, metav1.CreateOptions{})
	if err == nil {
		_, err = svcs.Create(ctx, service("selftest-proxy", map[string]string{"role": "proxy"}), metav1.CreateOptions{})
	}
	if err == nil {
		err = t.createRunning(ctx, proxy, other, sandbox)
	}
	if !t.check("NetworkPolicy, Service and Pods (exec probe; tcpSocket probe of the isolated Pod) Ready", err) {
		return
	}
	hostURL, stop, err := t.hostListener(ctx)
	if !t.check("listener on the Pod network's gateway", err) {
		return
	}
	defer stop()
	otherIP, err := t.podIP(ctx, other.Name)
	if !t.check("third Pod's IP", err) {
		return
	}
	otherURL := "http://" + net.JoinHostPort(otherIP, "8080") + "/"
	t.check("egress control: the proxy Pod reaches the third Pod by IP", t.reaches(ctx, proxy.Name, otherURL, "other-ok\n"))
	t.check("egress control: the proxy Pod reaches the host", t.reaches(ctx, proxy.Name, hostURL, "host-ok\n"))
	t.check("egress: the isolated Pod reaches the allowed Pod by its Service's name",
		t.reaches(ctx, sandbox.Name, "http://selftest-proxy:8080/", "proxy-ok\n"))
	t.check("egress: ... and by selftest-proxy."+testNamespace+".svc.cluster.local",
		t.reaches(ctx, sandbox.Name, "http://selftest-proxy."+testNamespace+".svc.cluster.local:8080/", "proxy-ok\n"))
	t.check("egress: ... and by the Pod's name",
		t.reaches(ctx, sandbox.Name, "http://"+proxy.Name+":8080/", "proxy-ok\n"))
	t.check("egress: the isolated Pod cannot reach the third Pod by IP", t.cannotReach(ctx, sandbox.Name, otherURL))
	t.check("egress: the isolated Pod cannot reach the host (Pod network gateway)", t.cannotReach(ctx, sandbox.Name, hostURL))
}

// readinessProbes: a tcpSocket probe keeps a Pod not Ready until its port
// opens; probes that never succeed keep Pods not Ready, though Running.
func (t *selftest) readinessProbes(ctx context.Context) {
	slow := t.plainPod("selftest-slow", []string{"sh", "-c", "sleep 3; cd /tmp && exec python3 -m http.server 8080"})
	slow.Spec.Containers[0].ReadinessProbe = tcpProbe(8080)
	neverTCP := t.plainPod("selftest-never-tcp", []string{"sleep", "infinity"})
	neverTCP.Spec.Containers[0].ReadinessProbe = tcpProbe(8081)
	neverHTTP := t.servingPod("selftest-never-http", "x", nil, httpGetProbe("/missing", 8080))
	neverExec := t.plainPod("selftest-never-exec", []string{"sleep", "infinity"})
	neverExec.Spec.Containers[0].ReadinessProbe = execProbe("false")
	all := []*corev1.Pod{slow, neverTCP, neverHTTP, neverExec}
	defer func() { t.check("readiness test cleaned up", t.deletePods(ctx, all...)) }()
	pods := t.client.CoreV1().Pods(testNamespace)
	for _, p := range all {
		if _, err := pods.Create(ctx, p, metav1.CreateOptions{}); !t.check("create "+p.Name, err) {
			return
		}
	}
	err := t.waitPhaseRunning(ctx, slow.Name)
	if err == nil {
		err = t.notReady(ctx, slow.Name)
	}
	t.check("tcpSocket probe: Running but not Ready before the port opens", err)
	t.check("tcpSocket probe: Ready once the port opens", t.waitRunning(ctx, slow.Name))
	for _, p := range all[1:] {
		err := t.waitPhaseRunning(ctx, p.Name)
		if err == nil {
			// Several periods (1 s) and failure thresholds (3).
			time.Sleep(4 * time.Second)
			err = t.notReady(ctx, p.Name)
		}
		t.check("a probe that never succeeds keeps "+p.Name+" Running and not Ready", err)
	}
}

func (t *selftest) waitPhaseRunning(ctx context.Context, name string) error {
	return poll(ctx, 2*time.Minute, "pod "+name+" Running", func() (bool, error) {
		p, err := t.client.CoreV1().Pods(testNamespace).Get(ctx, name, metav1.GetOptions{})
		return err == nil && p.Status.Phase == corev1.PodRunning, err
	})
}

// notReady checks the Pod is Running with its container not ready, as the
// kubelet reports it.
func (t *selftest) notReady(ctx context.Context, name string) error {
	p, err := t.client.CoreV1().Pods(testNamespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	if p.Status.Phase != corev1.PodRunning || len(p.Status.ContainerStatuses) == 0 || p.Status.ContainerStatuses[0].Ready {
		return fmt.Errorf("pod %s: phase %s, container statuses %+v", name, p.Status.Phase, p.Status.ContainerStatuses)
	}
	want := "containers with unready status: [main]"
	for _, typ := range []corev1.PodConditionType{corev1.ContainersReady, corev1.PodReady} {
		found := false
		for _, c := range p.Status.Conditions {
			if c.Type == typ {
				found = true
				if c.Status != corev1.ConditionFalse || c.Reason != "ContainersNotReady" || c.Message != want {
					return fmt.Errorf("pod %s: condition %s is %s (%s: %q)", name, typ, c.Status, c.Reason, c.Message)
				}
			}
		}
		if !found {
			return fmt.Errorf("pod %s: no condition %s", name, typ)
		}
	}
	return nil
}
