// kube-harness: a real Kubernetes API server (with etcd) and a Docker-backed
// node in one process, for tests.
//
//	kube-harness serve --dir DIR [--image-default IMG] [--max-lifetime 2h]
//	                   [--serve-agent-sandbox-crds] [--agent-sandbox] [--no-stdin]
//	kube-harness selftest [--image-default IMG] [--keep]
//	kube-harness rbac
//	kube-harness cleanup
//
// `serve` also runs a front (faults.go): a proxy before the API server that
// fails chosen requests on cue, for the tests of a client's retries.
//
// `serve` prints one JSON line on stdout when the cluster is ready, logs to
// stderr and DIR/*.log, and stops (removing its containers, volumes and
// network) when stdin closes, on SIGTERM/SIGINT, or after --max-lifetime.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"k8s.io/klog/v2"
)

func usage() {
	fmt.Fprint(os.Stderr, `usage:
  kube-harness serve --dir DIR [--image-default IMG] [--max-lifetime 2h] [--serve-agent-sandbox-crds] [--agent-sandbox] [--no-stdin]
  kube-harness selftest [--image-default IMG] [--keep]
  kube-harness kubectl ARGS...   (the real kubectl, for the benchmarks)
  kube-harness rbac       print the verbs of the hermes ServiceAccount
  kube-harness cleanup    remove every Docker container, volume and network any harness made
`)
}

func main() {
	if len(os.Args) < 2 {
		usage()
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "serve":
		err = cmdServe(os.Args[2:])
	case "selftest":
		err = cmdSelftest(os.Args[2:])
	case "rbac":
		fmt.Print(formatRules(hermesRules))
	case "cleanup":
		err = cmdCleanup()
	case "kubectl":
		cmdKubectl(os.Args[2:])
	case "-h", "--help", "help":
		usage()
	default:
		usage()
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "kube-harness: %v\n", err)
		os.Exit(1)
	}
}

func defaultImage() string {
	if img := os.Getenv("HERMES_TEST_IMAGE"); img != "" {
		return img
	}
	return "hermes-test-base:bookworm-1"
}

// serveOptions are the settings of one harness.
type serveOptions struct {
	dir          string
	image        string
	maxLifetime  time.Duration
	sandboxCRDs  bool
	agentSandbox bool
	controller   string
	watchStdin   bool
	stderr       io.Writer
	klogToFile   bool
	readyTimeout time.Duration
}

// readyInfo is the JSON line `serve` prints once ready.
type readyInfo struct {
	Ready            bool   `json:"ready"`
	Server           string `json:"server"`
	AdminKubeconfig  string `json:"admin_kubeconfig"`
	HermesKubeconfig string `json:"hermes_kubeconfig"`
	FrontKubeconfig  string `json:"front_kubeconfig"`
	FrontControl     string `json:"front_control"`
	Namespace        string `json:"namespace"`
	Node             string `json:"node"`
	ServiceAccount   string `json:"service_account"`
	CAFile           string `json:"ca_file"`
	Image            string `json:"image"`
	StorageClass     string `json:"storage_class"`
	PodNetwork       string `json:"pod_network"`
	Instance         string `json:"instance"`
	KubeletPort      int    `json:"kubelet_port"`
	SandboxCRDs      bool   `json:"agent_sandbox_crds"`
	AgentSandbox     bool   `json:"agent_sandbox_controller"`
	PID              int    `json:"pid"`
}

func cmdServe(args []string) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	o := serveOptions{stderr: os.Stderr, klogToFile: true}
	fs.StringVar(&o.dir, "dir", "", "state directory (created; kubeconfigs, certificates, etcd data, logs)")
	fs.StringVar(&o.image, "image-default", defaultImage(), "image the ready line names for tests (never pulled)")
	fs.DurationVar(&o.maxLifetime, "max-lifetime", 2*time.Hour, "stop after this long whatever happens")
	fs.BoolVar(&o.sandboxCRDs, "serve-agent-sandbox-crds", false, "install the agent-sandbox CRDs (agents.x-k8s.io)")
	fs.BoolVar(&o.agentSandbox, "agent-sandbox", false, "install the agent-sandbox CRDs and run its controller and a garbage collector")
	fs.StringVar(&o.controller, "agent-sandbox-controller", "", "the agent-sandbox controller binary (default: agent-sandbox-controller beside this one)")
	noStdin := fs.Bool("no-stdin", false, "do not stop when stdin closes")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if o.dir == "" {
		return errors.New("serve: --dir is required")
	}
	o.watchStdin = !*noStdin
	o.readyTimeout = 5 * time.Minute
	return serve(context.Background(), o, func(r readyInfo) {
		b, _ := json.Marshal(r)
		fmt.Fprintf(os.Stdout, "%s\n", b)
	})
}

func cmdCleanup() error {
	d, err := newDocker()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cleanupDocker(ctx, d, "", func(f string, a ...any) { fmt.Fprintf(os.Stderr, f+"\n", a...) })
	return nil
}

// logger writes the harness's own lines to stderr and DIR/harness.log.
type logger struct {
	mu  sync.Mutex
	out []io.Writer
}

func (l *logger) logf(format string, args ...any) {
	line := fmt.Sprintf("%s kube-harness: %s\n", time.Now().Format("15:04:05.000"), fmt.Sprintf(format, args...))
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, w := range l.out {
		_, _ = io.WriteString(w, line)
	}
}

var klogOnce sync.Once

// quietKlog sends the API server's (klog) logs to a file instead of stderr.
func quietKlog(path string) {
	klogOnce.Do(func() {
		fs := flag.NewFlagSet("klog", flag.ContinueOnError)
		klog.InitFlags(fs)
		_ = fs.Set("logtostderr", "false")
		_ = fs.Set("alsologtostderr", "false")
		_ = fs.Set("stderrthreshold", "FATAL")
		_ = fs.Set("one_output", "true")
		_ = fs.Set("log_file", path)
		_ = fs.Set("log_file_max_size", "0")
	})
}

func randomID() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// serve runs the harness until ctx ends, stdin closes, a signal, or the
// lifetime; ready is called once with what tests need.
func serve(parent context.Context, o serveOptions, ready func(readyInfo)) (retErr error) {
	dir, err := filepath.Abs(o.dir)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	logFile, err := os.OpenFile(filepath.Join(dir, "harness.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logFile.Close()
	lg := &logger{out: []io.Writer{o.stderr, logFile}}
	logf := lg.logf
	if o.klogToFile {
		quietKlog(filepath.Join(dir, "kube-apiserver.log"))
	}
	defer klog.Flush()

	ctx, cancel := context.WithCancelCause(parent)
	defer cancel(nil)
	sigCtx, stopSignals := signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
	defer stopSignals()
	go func() {
		<-sigCtx.Done()
		if ctx.Err() == nil {
			cancel(errors.New("signal"))
		}
	}()
	if o.watchStdin {
		go func() {
			_, _ = io.Copy(io.Discard, os.Stdin)
			cancel(errors.New("stdin closed"))
		}()
	}
	lifetime := time.AfterFunc(o.maxLifetime, func() { cancel(fmt.Errorf("max lifetime %s reached", o.maxLifetime)) })
	defer lifetime.Stop()

	instance := randomID()
	logf("instance %s, dir %s", instance, dir)
	d, err := newDocker()
	if err != nil {
		return err
	}
	defer func() {
		cctx, ccancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer ccancel()
		cleanupDocker(cctx, d, instance, logf)
		logf("removed the Docker objects of instance %s", instance)
	}()

	startCtx, startCancel := context.WithTimeout(ctx, o.readyTimeout)
	defer startCancel()
	cp, err := startControlPlane(startCtx, dir, logf)
	if err != nil {
		return err
	}
	defer func() {
		cp.stop()
		logf("control plane stopped")
	}()
	go func() {
		err := <-cp.done
		cp.done <- err // for stop()
		cancel(fmt.Errorf("kube-apiserver stopped: %v", err))
	}()

	var controller string
	if o.agentSandbox {
		o.sandboxCRDs = true
		if controller, err = controllerBinary(o.controller); err != nil {
			return err
		}
	}
	if o.sandboxCRDs {
		if err := installSandboxCRDs(startCtx, cp.adminConfig); err != nil {
			return err
		}
		logf("agent-sandbox CRDs installed")
	}
	if err := bootstrap(startCtx, cp.admin, o.sandboxCRDs); err != nil {
		return err
	}
	if err := ensureRootCA(startCtx, cp.admin, testNamespace, cp.pki.caPEM); err != nil {
		return err
	}
	adminPath := filepath.Join(dir, "admin.kubeconfig")
	if err := writeKubeconfig(adminPath, cp.server, cp.pki.caPEM, "admin", adminAuth(cp), "default"); err != nil {
		return err
	}
	if o.agentSandbox {
		if err := runGarbageCollector(ctx, cp.adminConfig, logf); err != nil {
			return err
		}
		as, err := startAgentSandbox(controller, dir, adminPath, logf)
		if err != nil {
			return err
		}
		defer as.stop()
		go func() {
			err := <-as.done
			as.done <- err // for stop()
			cancel(fmt.Errorf("the agent-sandbox controller stopped: %v", err))
		}()
	}
	hermesPath := filepath.Join(dir, "hermes.kubeconfig")
	if err := writeHermesKubeconfig(startCtx, cp.admin, hermesPath, cp.server, cp.pki.caPEM); err != nil {
		return err
	}

	fr, err := startFront(cp.pki, cp.server, logf)
	if err != nil {
		return fmt.Errorf("front: %w", err)
	}
	defer fr.stop()
	frontPath := filepath.Join(dir, "front.kubeconfig")
	if err := writeHermesKubeconfig(startCtx, cp.admin, frontPath, fr.URL, cp.pki.caPEM); err != nil {
		return err
	}

	kl, kubeletPort, err := listenKubelet(cp.kubeletCert, cp.kubeletKey, cp.pki.caPEM)
	if err != nil {
		return fmt.Errorf("kubelet endpoint: %w", err)
	}
	agentCtx, stopAgent := context.WithCancel(ctx)
	agent := newNodeAgent(cp.admin, d, instance, dir, cp.pki.caPEM, kubeletPort, logf)
	ks := newKubeletServer(agent, kl, logf)
	go ks.serve()
	defer func() {
		stopAgent()
		ks.shutdown()
		agent.wait(15 * time.Second)
	}()
	if err := agent.run(agentCtx); err != nil {
		return err
	}
	if err := waitNodeReady(startCtx, cp); err != nil {
		return err
	}
	ready(readyInfo{
		Ready:            true,
		Server:           cp.server,
		AdminKubeconfig:  adminPath,
		HermesKubeconfig: hermesPath,
		FrontKubeconfig:  frontPath,
		FrontControl:     fr.Control,
		Namespace:        testNamespace,
		Node:             nodeName,
		ServiceAccount:   serviceAccountName,
		CAFile:           cp.pki.path("ca.crt"),
		Image:            o.image,
		StorageClass:     storageClassName,
		PodNetwork:       podNetwork(instance),
		Instance:         instance,
		KubeletPort:      kubeletPort,
		SandboxCRDs:      o.sandboxCRDs,
		AgentSandbox:     o.agentSandbox,
		PID:              os.Getpid(),
	})
	logf("ready: %s (node %s, kubelet endpoint 127.0.0.1:%d)", cp.server, nodeName, kubeletPort)
	<-ctx.Done()
	cause := context.Cause(ctx)
	logf("stopping: %v", cause)
	if parent.Err() == nil && cause != nil && !isOrdinaryStop(cause) {
		return cause
	}
	return nil
}

func isOrdinaryStop(err error) bool {
	switch err.Error() {
	case "signal", "stdin closed":
		return true
	}
	return false
}
