// `kube-harness selftest`: starts a harness in a temporary directory and
// drives it as the `hermes` ServiceAccount the way the project's tests do:
// a claim and a Pod, exec over WebSocket and SPDY, data kept across Pods,
// logs, a missing image, and RBAC that really refuses.
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/remotecommand"
	utilexec "k8s.io/client-go/util/exec"
)

type selftest struct {
	cfg      *rest.Config
	client   kubernetes.Interface
	image    string
	failures int
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

	t := &selftest{image: *image}
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
		lcancel()
		err = errors.Join(err1, err2)
		if err == nil && len(cs)+len(vs) > 0 {
			err = fmt.Errorf("%d containers and %d volumes left", len(cs), len(vs))
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
