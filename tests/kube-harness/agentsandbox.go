// agent-sandbox on the harness (--agent-sandbox): the CRDs of
// kubernetes-sigs/agent-sandbox (crds.go), its real controller
// (sigs.k8s.io/agent-sandbox/cmd/agent-sandbox-controller, built by
// scripts/kube-harness-build beside this binary) run as a child process
// with the admin's kubeconfig, and kube-controller-manager's garbage
// collector, so that what the controller makes for a Sandbox (its Pod,
// claims and headless Service, each owned by it) goes with it as on a
// real cluster.
package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/metadata/metadatainformer"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"k8s.io/controller-manager/pkg/informerfactory"
	"k8s.io/kubernetes/pkg/controller/garbagecollector"
)

// agentSandboxVersion is the release of the controller and CRDs.
const agentSandboxVersion = "v1.0.1"

// controllerBinary is the agent-sandbox controller: --agent-sandbox-controller,
// else agent-sandbox-controller beside this binary.
func controllerBinary(flagged string) (string, error) {
	if flagged != "" {
		return flagged, nil
	}
	self, err := os.Executable()
	if err != nil {
		return "", err
	}
	path := filepath.Join(filepath.Dir(self), "agent-sandbox-controller")
	if _, err := os.Stat(path); err != nil {
		return "", fmt.Errorf("the agent-sandbox controller is not beside the harness (%s): run scripts/kube-harness-build", path)
	}
	return path, nil
}

// agentSandbox is the running controller.
type agentSandbox struct {
	cmd  *exec.Cmd
	done chan error
}

// startAgentSandbox starts the controller with the admin kubeconfig; its
// output goes to DIR/agent-sandbox-controller.log.
func startAgentSandbox(binary, dir, adminKubeconfig string, logf func(string, ...any)) (*agentSandbox, error) {
	log, err := os.OpenFile(filepath.Join(dir, "agent-sandbox-controller.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(binary,
		"--kubeconfig="+adminKubeconfig,
		"--leader-elect=false",
		"--metrics-bind-address=0",
		"--health-probe-bind-address=0",
	)
	cmd.Stdout = log
	cmd.Stderr = log
	// Ends with the harness even when the harness is killed.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	if err := cmd.Start(); err != nil {
		log.Close()
		return nil, fmt.Errorf("start %s: %w", binary, err)
	}
	a := &agentSandbox{cmd: cmd, done: make(chan error, 1)}
	go func() {
		a.done <- cmd.Wait()
		log.Close()
	}()
	logf("agent-sandbox controller %s started (pid %d)", agentSandboxVersion, cmd.Process.Pid)
	return a, nil
}

// stop ends the controller: SIGTERM, then SIGKILL after 10 s.
func (a *agentSandbox) stop() {
	_ = a.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-a.done:
	case <-time.After(10 * time.Second):
		_ = a.cmd.Process.Kill()
		<-a.done
	}
}

// runGarbageCollector runs kube-controller-manager's garbage collector
// until ctx ends: objects whose owners are gone are deleted, as on a real
// cluster.
func runGarbageCollector(ctx context.Context, cfg *rest.Config, logf func(string, ...any)) error {
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	md, err := metadata.NewForConfig(cfg)
	if err != nil {
		return err
	}
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return err
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))
	shared := informers.NewSharedInformerFactory(client, 0)
	mdInformers := metadatainformer.NewSharedInformerFactory(md, 0)
	started := make(chan struct{})
	gc, err := garbagecollector.NewGarbageCollector(ctx, client, md, mapper,
		garbagecollector.DefaultIgnoredResources(),
		informerfactory.NewInformerFactory(shared, mdInformers), started)
	if err != nil {
		return fmt.Errorf("garbage collector: %w", err)
	}
	shared.Start(ctx.Done())
	mdInformers.Start(ctx.Done())
	close(started)
	const syncPeriod = 5 * time.Second
	go gc.Run(ctx, 4, syncPeriod)
	go gc.Sync(ctx, dc, syncPeriod)
	logf("garbage collector running")
	return nil
}
