// The node agent: registers one Node and keeps it Ready, binds unscheduled
// Pods to it, runs each bound Pod's first container as a Docker container
// (on the networks network.go picks, readiness probed by probes.go) and
// reports its status, finalises deleted Pods, binds PersistentVolumeClaims
// to Docker volumes, and gives every namespace its `default` ServiceAccount
// and kube-root-ca.crt ConfigMap.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
)

// podNetwork is the bridge network of one harness's Pods: its own, so
// harnesses that start together never race to make (or remove) one.
func podNetwork(instance string) string { return podNetworkBase + "-" + instance }

const (
	nodeName        = "hermes-node-0"
	podNetworkBase  = "hermes-kube-harness-pods"
	labelInstance   = harnessLabel + ".instance"
	labelNamespace  = harnessLabel + ".namespace"
	labelPod        = harnessLabel + ".pod"
	labelPodUID     = harnessLabel + ".pod-uid"
	labelContainer  = harnessLabel + ".container"
	labelVolumeKind = harnessLabel + ".volume"
	labelClaim      = harnessLabel + ".claim"
	pvcProtection   = "kubernetes.io/pvc-protection"
	pvProtection    = "kubernetes.io/pv-protection"
	podWorkers      = 4
	maxCrashBackoff = 60 * time.Second
)

// nodeAgent is the harness's kubelet, scheduler and the few controllers the
// tests need.
type nodeAgent struct {
	client      kubernetes.Interface
	docker      *docker
	instance    string
	volumesDir  string
	caPEM       []byte
	kubeletPort int
	logf        func(string, ...any)

	factory   informers.SharedInformerFactory
	pods      corelisters.PodLister
	pvcs      corelisters.PersistentVolumeClaimLister
	podQueue  workqueue.TypedRateLimitingInterface[string]
	pvcQueue  workqueue.TypedRateLimitingInterface[string]
	nsQueue   workqueue.TypedRateLimitingInterface[string]
	events    record.EventBroadcaster
	kubelet   record.EventRecorder
	scheduler record.EventRecorder

	ctx       context.Context // the agent's, set by run
	mu        sync.Mutex
	lastState map[string]string // docker container id -> state seen
	probeMu   sync.Mutex
	probes    map[string]*prober // pod key -> its container's readiness prober
	wg        sync.WaitGroup
}

func newNodeAgent(client kubernetes.Interface, d *docker, instance, dir string, caPEM []byte, kubeletPort int, logf func(string, ...any)) *nodeAgent {
	a := &nodeAgent{
		client:      client,
		docker:      d,
		instance:    instance,
		volumesDir:  filepath.Join(dir, "volumes"),
		caPEM:       caPEM,
		kubeletPort: kubeletPort,
		logf:        logf,
		lastState:   map[string]string{},
		probes:      map[string]*prober{},
	}
	a.factory = informers.NewSharedInformerFactory(client, 30*time.Second)
	rl := func(name string) workqueue.TypedRateLimitingInterface[string] {
		return workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[string](200*time.Millisecond, 30*time.Second),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: name})
	}
	a.podQueue, a.pvcQueue, a.nsQueue = rl("pods"), rl("pvcs"), rl("namespaces")
	a.events = record.NewBroadcaster()
	a.kubelet = a.events.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "kubelet", Host: nodeName})
	a.scheduler = a.events.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "default-scheduler"})
	return a
}

func keyOf(obj any) (string, bool) {
	k, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj)
	return k, err == nil
}

func enqueue(q workqueue.TypedRateLimitingInterface[string]) cache.ResourceEventHandlerFuncs {
	add := func(obj any) {
		if k, ok := keyOf(obj); ok {
			q.Add(k)
		}
	}
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    add,
		UpdateFunc: func(_, obj any) { add(obj) },
		DeleteFunc: add,
	}
}

// run registers the node, starts the informers and workers, and returns
// once the caches are in sync; everything stops with ctx.
func (a *nodeAgent) run(ctx context.Context) error {
	a.events.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: a.client.CoreV1().Events("")})
	a.ctx = ctx
	if err := a.ensureNetwork(ctx, podNetwork(a.instance)); err != nil {
		return err
	}
	if err := a.registerNode(ctx); err != nil {
		return fmt.Errorf("node %s: %w", nodeName, err)
	}
	podInf := a.factory.Core().V1().Pods()
	pvcInf := a.factory.Core().V1().PersistentVolumeClaims()
	nsInf := a.factory.Core().V1().Namespaces()
	if _, err := podInf.Informer().AddEventHandler(enqueue(a.podQueue)); err != nil {
		return err
	}
	// A Pod's change can unblock a claim's deletion.
	if _, err := podInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		DeleteFunc: func(obj any) { a.enqueueClaimsOf(obj) },
		UpdateFunc: func(_, obj any) { a.enqueueClaimsOf(obj) },
	}); err != nil {
		return err
	}
	if _, err := pvcInf.Informer().AddEventHandler(enqueue(a.pvcQueue)); err != nil {
		return err
	}
	if _, err := nsInf.Informer().AddEventHandler(enqueue(a.nsQueue)); err != nil {
		return err
	}
	a.pods = podInf.Lister()
	a.pvcs = pvcInf.Lister()
	a.factory.Start(ctx.Done())
	syncCtx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	for typ, ok := range a.factory.WaitForCacheSync(syncCtx.Done()) {
		if !ok {
			return fmt.Errorf("informer %v did not sync", typ)
		}
	}
	for i := 0; i < podWorkers; i++ {
		a.worker(ctx, a.podQueue, a.syncPod)
	}
	a.worker(ctx, a.pvcQueue, a.syncClaim)
	a.worker(ctx, a.nsQueue, a.syncNamespace)
	a.wg.Add(2)
	go func() { defer a.wg.Done(); a.heartbeat(ctx) }()
	go func() { defer a.wg.Done(); a.watchContainers(ctx) }()
	go func() {
		<-ctx.Done()
		a.podQueue.ShutDown()
		a.pvcQueue.ShutDown()
		a.nsQueue.ShutDown()
	}()
	return nil
}

// requeueAfter is returned by a sync to look at the object again later.
type requeueAfter time.Duration

func (r requeueAfter) Error() string { return fmt.Sprintf("requeue after %s", time.Duration(r)) }

func (a *nodeAgent) worker(ctx context.Context, q workqueue.TypedRateLimitingInterface[string], sync func(context.Context, string) error) {
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		for {
			key, shutdown := q.Get()
			if shutdown {
				return
			}
			sctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
			err := sync(sctx, key)
			cancel()
			var ra requeueAfter
			switch {
			case err == nil:
				q.Forget(key)
			case errors.As(err, &ra):
				q.Forget(key)
				q.AddAfter(key, time.Duration(ra))
			case ctx.Err() != nil:
			default:
				if !apierrors.IsConflict(err) {
					a.logf("sync %s: %v", key, err)
				}
				q.AddRateLimited(key)
			}
			q.Done(key)
		}
	}()
}

// wait waits for the workers, bounded.
func (a *nodeAgent) wait(limit time.Duration) {
	done := make(chan struct{})
	go func() { a.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(limit):
		a.logf("node agent workers still busy after %s", limit)
	}
	a.events.Shutdown()
}

// --- the node -------------------------------------------------------------

func (a *nodeAgent) nodeStatus(now metav1.Time) corev1.NodeStatus {
	capacity := corev1.ResourceList{
		corev1.ResourceCPU:              resource.MustParse("64"),
		corev1.ResourceMemory:           resource.MustParse("256Gi"),
		corev1.ResourcePods:             resource.MustParse("1000"),
		corev1.ResourceEphemeralStorage: resource.MustParse("1Ti"),
	}
	cond := func(t corev1.NodeConditionType, s corev1.ConditionStatus, reason, msg string) corev1.NodeCondition {
		return corev1.NodeCondition{Type: t, Status: s, Reason: reason, Message: msg, LastHeartbeatTime: now, LastTransitionTime: now}
	}
	return corev1.NodeStatus{
		Capacity:    capacity,
		Allocatable: capacity,
		Phase:       corev1.NodeRunning,
		Conditions: []corev1.NodeCondition{
			cond(corev1.NodeMemoryPressure, corev1.ConditionFalse, "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
			cond(corev1.NodeDiskPressure, corev1.ConditionFalse, "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
			cond(corev1.NodePIDPressure, corev1.ConditionFalse, "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
			cond(corev1.NodeReady, corev1.ConditionTrue, "KubeletReady", "hermes kube-harness node agent is posting ready status"),
		},
		Addresses: []corev1.NodeAddress{
			{Type: corev1.NodeInternalIP, Address: "127.0.0.1"},
			{Type: corev1.NodeHostName, Address: nodeName},
		},
		DaemonEndpoints: corev1.NodeDaemonEndpoints{KubeletEndpoint: corev1.DaemonEndpoint{Port: int32(a.kubeletPort)}},
		NodeInfo: corev1.NodeSystemInfo{
			MachineID:               a.instance,
			SystemUUID:              a.instance,
			BootID:                  a.instance,
			KernelVersion:           kernelVersion(),
			OSImage:                 "hermes kube-harness (Docker)",
			ContainerRuntimeVersion: "docker://" + dockerAPIVersion,
			KubeletVersion:          "v1.37.2",
			KubeProxyVersion:        "",
			OperatingSystem:         "linux",
			Architecture:            runtime.GOARCH,
		},
	}
}

func kernelVersion() string {
	b, err := os.ReadFile("/proc/sys/kernel/osrelease")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

func (a *nodeAgent) registerNode(ctx context.Context) error {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{
		Name: nodeName,
		Labels: map[string]string{
			"kubernetes.io/hostname": nodeName,
			"kubernetes.io/os":       "linux",
			"kubernetes.io/arch":     runtime.GOARCH,
		},
	}}
	created, err := a.client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		created, err = a.client.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
	}
	if err != nil {
		return err
	}
	// The admission plugin TaintNodesByCondition taints a new node not-ready;
	// with no node lifecycle controller, the agent lifts it once Ready.
	created.Status = a.nodeStatus(metav1.Now())
	updated, err := a.client.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{})
	if err != nil {
		return err
	}
	if len(updated.Spec.Taints) > 0 {
		updated.Spec.Taints = nil
		if _, err := a.client.CoreV1().Nodes().Update(ctx, updated, metav1.UpdateOptions{}); err != nil {
			return err
		}
	}
	return nil
}

// heartbeat renews the node's Lease every 10s and its status every minute.
func (a *nodeAgent) heartbeat(ctx context.Context) {
	leases := a.client.CoordinationV1().Leases(corev1.NamespaceNodeLease)
	holder := nodeName
	duration := int32(40)
	tick := time.NewTicker(10 * time.Second)
	defer tick.Stop()
	n := 0
	for {
		func() {
			hctx, cancel := context.WithTimeout(ctx, 15*time.Second)
			defer cancel()
			now := metav1.NewMicroTime(time.Now())
			lease, err := leases.Get(hctx, nodeName, metav1.GetOptions{})
			switch {
			case apierrors.IsNotFound(err):
				_, err = leases.Create(hctx, &coordinationv1.Lease{
					ObjectMeta: metav1.ObjectMeta{Name: nodeName, Namespace: corev1.NamespaceNodeLease},
					Spec:       coordinationv1.LeaseSpec{HolderIdentity: &holder, LeaseDurationSeconds: &duration, RenewTime: &now},
				}, metav1.CreateOptions{})
			case err == nil:
				lease.Spec.RenewTime = &now
				_, err = leases.Update(hctx, lease, metav1.UpdateOptions{})
			}
			if err != nil && ctx.Err() == nil {
				a.logf("node lease: %v", err)
			}
			if n%6 == 5 {
				node, err := a.client.CoreV1().Nodes().Get(hctx, nodeName, metav1.GetOptions{})
				if err == nil {
					st := a.nodeStatus(metav1.Now())
					for i := range st.Conditions {
						for _, old := range node.Status.Conditions {
							if old.Type == st.Conditions[i].Type && old.Status == st.Conditions[i].Status {
								st.Conditions[i].LastTransitionTime = old.LastTransitionTime
							}
						}
					}
					node.Status = st
					_, err = a.client.CoreV1().Nodes().UpdateStatus(hctx, node, metav1.UpdateOptions{})
				}
				if err != nil && ctx.Err() == nil {
					a.logf("node status: %v", err)
				}
			}
			n++
		}()
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// watchContainers polls the engine for the harness's containers and requeues
// a Pod whenever its container changes state (exits, restarts, vanishes).
func (a *nodeAgent) watchContainers(ctx context.Context) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		lctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		list, err := a.docker.containerList(lctx, labelInstance+"="+a.instance)
		cancel()
		if err != nil {
			continue
		}
		seen := map[string]bool{}
		a.mu.Lock()
		for _, c := range list {
			seen[c.ID] = true
			if a.lastState[c.ID] != c.State {
				a.lastState[c.ID] = c.State
				a.podQueue.Add(c.Labels[labelNamespace] + "/" + c.Labels[labelPod])
			}
		}
		for id := range a.lastState {
			if !seen[id] {
				delete(a.lastState, id)
			}
		}
		a.mu.Unlock()
	}
}

// --- namespaces -----------------------------------------------------------

func (a *nodeAgent) syncNamespace(ctx context.Context, name string) error {
	ns, err := a.factory.Core().V1().Namespaces().Lister().Get(name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if ns.DeletionTimestamp != nil || ns.Status.Phase == corev1.NamespaceTerminating {
		return nil
	}
	if err := ensureDefaultServiceAccount(ctx, a.client, name); err != nil && !apierrors.IsForbidden(err) {
		return err
	}
	if err := ensureRootCA(ctx, a.client, name, a.caPEM); err != nil && !apierrors.IsForbidden(err) {
		return err
	}
	return nil
}

// --- pods -----------------------------------------------------------------

func uid8(uid types.UID) string {
	s := strings.ReplaceAll(string(uid), "-", "")
	if len(s) > 8 {
		s = s[:8]
	}
	return s
}

func containerName(pod *corev1.Pod) string {
	return fmt.Sprintf("hermes-kube-harness-%s-%s-%s", pod.Namespace, pod.Name, uid8(pod.UID))
}

func claimVolumeName(instance, namespace, claim string) string {
	return fmt.Sprintf("hermes-kube-harness-pvc-%s-%s-%s", instance, namespace, claim)
}

func isDefaultScheduler(name string) bool {
	return name == "" || name == corev1.DefaultSchedulerName
}

func (a *nodeAgent) syncPod(ctx context.Context, key string) error {
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return nil
	}
	pod, err := a.pods.Pods(ns).Get(name)
	if apierrors.IsNotFound(err) {
		a.stopProbe(key)
		return a.removeContainers(ctx, ns, name, "")
	}
	if err != nil {
		return err
	}
	if pod.Spec.NodeName == "" {
		if !isDefaultScheduler(pod.Spec.SchedulerName) || pod.DeletionTimestamp != nil {
			return nil
		}
		return a.bind(ctx, pod)
	}
	if pod.Spec.NodeName != nodeName {
		return nil
	}
	// Containers of an earlier Pod of the same name go first.
	if err := a.removeContainers(ctx, ns, name, pod.UID); err != nil {
		return err
	}
	if pod.DeletionTimestamp != nil {
		return a.terminate(ctx, pod)
	}
	if pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
		return nil
	}
	return a.ensureRunning(ctx, pod)
}

func (a *nodeAgent) bind(ctx context.Context, pod *corev1.Pod) error {
	b := &corev1.Binding{
		ObjectMeta: metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace, UID: pod.UID},
		Target:     corev1.ObjectReference{Kind: "Node", Name: nodeName},
	}
	err := a.client.CoreV1().Pods(pod.Namespace).Bind(ctx, b, metav1.CreateOptions{})
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		return nil
	}
	if err != nil {
		return err
	}
	a.scheduler.Eventf(pod, corev1.EventTypeNormal, "Scheduled", "Successfully assigned %s/%s to %s", pod.Namespace, pod.Name, nodeName)
	return nil
}

// removeContainers removes the harness's containers of namespace/name except
// those of Pod keepUID, with their emptyDir volumes and files.
func (a *nodeAgent) removeContainers(ctx context.Context, ns, name string, keepUID types.UID) error {
	list, err := a.docker.containerList(ctx, labelInstance+"="+a.instance, labelNamespace+"="+ns, labelPod+"="+name)
	if err != nil {
		return err
	}
	for _, c := range list {
		uid := c.Labels[labelPodUID]
		if types.UID(uid) == keepUID {
			continue
		}
		if err := a.docker.containerRemove(ctx, c.ID, true); err != nil {
			return err
		}
		if err := a.removePodVolumes(ctx, types.UID(uid)); err != nil {
			return err
		}
	}
	return nil
}

func (a *nodeAgent) removePodVolumes(ctx context.Context, uid types.UID) error {
	if uid == "" {
		return nil
	}
	vols, err := a.docker.volumeList(ctx, labelInstance+"="+a.instance, labelPodUID+"="+string(uid))
	if err != nil {
		return err
	}
	for _, v := range vols {
		if err := a.docker.volumeRemove(ctx, v.Name); err != nil {
			return err
		}
	}
	return os.RemoveAll(filepath.Join(a.volumesDir, string(uid)))
}

func (a *nodeAgent) podContainer(ctx context.Context, pod *corev1.Pod) (*containerInfo, error) {
	list, err := a.docker.containerList(ctx, labelInstance+"="+a.instance, labelPodUID+"="+string(pod.UID))
	if err != nil || len(list) == 0 {
		return nil, err
	}
	return a.docker.containerInspect(ctx, list[0].ID)
}

// terminate stops the Pod's container within its grace period, removes it,
// and finalises the Pod's deletion as a kubelet does.
func (a *nodeAgent) terminate(ctx context.Context, pod *corev1.Pod) error {
	grace := 30 * time.Second
	if pod.DeletionGracePeriodSeconds != nil {
		grace = time.Duration(*pod.DeletionGracePeriodSeconds) * time.Second
	} else if pod.Spec.TerminationGracePeriodSeconds != nil {
		grace = time.Duration(*pod.Spec.TerminationGracePeriodSeconds) * time.Second
	}
	if grace > 4*time.Minute {
		grace = 4 * time.Minute
	}
	c, err := a.podContainer(ctx, pod)
	if err != nil {
		return err
	}
	a.stopProbe(pod.Namespace + "/" + pod.Name)
	if c != nil {
		if c.State.Running {
			a.kubelet.Eventf(pod, corev1.EventTypeNormal, "Killing", "Stopping container %s", pod.Spec.Containers[0].Name)
			if err := a.docker.containerStop(ctx, c.ID, grace); err != nil && !isNotFound(err) {
				return err
			}
		}
		if err := a.docker.containerRemove(ctx, c.ID, true); err != nil {
			return err
		}
	}
	if err := a.removePodVolumes(ctx, pod.UID); err != nil {
		return err
	}
	zero := int64(0)
	uid := pod.UID
	err = a.client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{
		GracePeriodSeconds: &zero,
		Preconditions:      &metav1.Preconditions{UID: &uid},
	})
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		return nil
	}
	return err
}

// podFailure is a reason a Pod's container cannot be made yet.
type podFailure struct {
	reason  string // the container's waiting reason
	message string
	retry   time.Duration
}

func (f *podFailure) Error() string { return f.reason + ": " + f.message }

func (a *nodeAgent) ensureRunning(ctx context.Context, pod *corev1.Pod) error {
	spec := &pod.Spec.Containers[0]
	c, err := a.podContainer(ctx, pod)
	if err != nil {
		return err
	}
	prev := findStatus(pod.Status.ContainerStatuses, spec.Name)
	restarts := int32(0)
	if prev != nil {
		restarts = prev.RestartCount
	}
	if c == nil {
		img, err := a.docker.imageInspect(ctx, spec.Image)
		if isNotFound(err) {
			reason := "ErrImagePull"
			if prev != nil && prev.State.Waiting != nil && (prev.State.Waiting.Reason == "ErrImagePull" || prev.State.Waiting.Reason == "ImagePullBackOff") {
				reason = "ImagePullBackOff"
			}
			msg := fmt.Sprintf("image %q is not present on node %s, and the harness never pulls", spec.Image, nodeName)
			if reason == "ErrImagePull" {
				a.kubelet.Eventf(pod, corev1.EventTypeWarning, "Failed", "Failed to pull image %q: %s", spec.Image, msg)
			}
			return a.reportWaiting(ctx, pod, &podFailure{reason: reason, message: msg, retry: 10 * time.Second}, nil)
		}
		if err != nil {
			return err
		}
		plan, err := a.planNetworking(ctx, pod)
		if err != nil {
			return err
		}
		create, err := a.buildContainer(ctx, pod, spec, img, plan)
		var pf *podFailure
		if errors.As(err, &pf) {
			if pf.reason == "CreateContainerConfigError" {
				a.kubelet.Eventf(pod, corev1.EventTypeWarning, "Failed", "Error: %s", pf.message)
			}
			return a.reportWaiting(ctx, pod, pf, nil)
		}
		if err != nil {
			return err
		}
		id, err := a.createContainer(ctx, containerName(pod), create, plan)
		if isConflict(err) {
			return requeueAfter(time.Second)
		}
		if err != nil {
			return a.reportWaiting(ctx, pod, &podFailure{reason: "CreateContainerError", message: err.Error(), retry: 5 * time.Second}, nil)
		}
		a.kubelet.Eventf(pod, corev1.EventTypeNormal, "Pulled", "Container image %q already present on machine", spec.Image)
		a.kubelet.Eventf(pod, corev1.EventTypeNormal, "Created", "Created container %s", spec.Name)
		if err := a.docker.containerStart(ctx, id); err != nil {
			a.kubelet.Eventf(pod, corev1.EventTypeWarning, "Failed", "Error: %v", err)
			_ = a.docker.containerRemove(ctx, id, true)
			return a.reportWaiting(ctx, pod, &podFailure{reason: "RunContainerError", message: err.Error(), retry: 5 * time.Second}, nil)
		}
		a.kubelet.Eventf(pod, corev1.EventTypeNormal, "Started", "Started container %s", spec.Name)
		c, err = a.docker.containerInspect(ctx, id)
		if err != nil {
			return err
		}
		return a.reportContainer(ctx, pod, c, restarts, nil)
	}
	if c.State.Running {
		return a.reportContainer(ctx, pod, c, restarts, lastTermination(prev))
	}
	if c.State.Status == "created" {
		if err := a.docker.containerStart(ctx, c.ID); err != nil {
			return a.reportWaiting(ctx, pod, &podFailure{reason: "RunContainerError", message: err.Error(), retry: 5 * time.Second}, nil)
		}
		return requeueAfter(200 * time.Millisecond)
	}
	// The container has exited.
	term := terminatedState(c)
	restart := pod.Spec.RestartPolicy == corev1.RestartPolicyAlways ||
		(pod.Spec.RestartPolicy == corev1.RestartPolicyOnFailure && c.State.ExitCode != 0)
	if !restart {
		return a.reportContainer(ctx, pod, c, restarts, lastTermination(prev))
	}
	backoff := 2 * time.Second << min(restarts, 5)
	if backoff > maxCrashBackoff {
		backoff = maxCrashBackoff
	}
	if wait := time.Until(term.FinishedAt.Add(backoff)); wait > 0 {
		msg := fmt.Sprintf("back-off %s restarting failed container=%s pod=%s_%s(%s)", backoff, spec.Name, pod.Name, pod.Namespace, pod.UID)
		if err := a.reportWaiting(ctx, pod, &podFailure{reason: "CrashLoopBackOff", message: msg, retry: wait}, term); err != nil {
			return err
		}
		return requeueAfter(wait)
	}
	if err := a.docker.containerStart(ctx, c.ID); err != nil {
		return a.reportWaiting(ctx, pod, &podFailure{reason: "RunContainerError", message: err.Error(), retry: 5 * time.Second}, term)
	}
	a.kubelet.Eventf(pod, corev1.EventTypeNormal, "Started", "Started container %s", spec.Name)
	c, err = a.docker.containerInspect(ctx, c.ID)
	if err != nil {
		return err
	}
	return a.reportContainer(ctx, pod, c, restarts+1, term)
}

func findStatus(list []corev1.ContainerStatus, name string) *corev1.ContainerStatus {
	for i := range list {
		if list[i].Name == name {
			return &list[i]
		}
	}
	return nil
}

func lastTermination(prev *corev1.ContainerStatus) *corev1.ContainerStateTerminated {
	if prev == nil {
		return nil
	}
	return prev.LastTerminationState.Terminated
}

func parseDockerTime(s string) metav1.Time {
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil || t.Year() < 2000 {
		return metav1.Time{}
	}
	return metav1.NewTime(t.Truncate(time.Second))
}

func terminatedState(c *containerInfo) *corev1.ContainerStateTerminated {
	reason := "Completed"
	if c.State.ExitCode != 0 {
		reason = "Error"
	}
	if c.State.OOMKilled {
		reason = "OOMKilled"
	}
	return &corev1.ContainerStateTerminated{
		ExitCode:    int32(c.State.ExitCode),
		Reason:      reason,
		Message:     c.State.Error,
		StartedAt:   parseDockerTime(c.State.StartedAt),
		FinishedAt:  parseDockerTime(c.State.FinishedAt),
		ContainerID: "docker://" + c.ID,
	}
}

// setCondition sets a condition, keeping its transition time when unchanged.
func setCondition(st *corev1.PodStatus, old []corev1.PodCondition, t corev1.PodConditionType, s corev1.ConditionStatus, reason, msg string) {
	c := corev1.PodCondition{Type: t, Status: s, Reason: reason, Message: msg, LastTransitionTime: metav1.NewTime(time.Now().Truncate(time.Second))}
	for _, o := range old {
		if o.Type == t && o.Status == s {
			c.LastTransitionTime = o.LastTransitionTime
		}
	}
	for i := range st.Conditions {
		if st.Conditions[i].Type == t {
			st.Conditions[i] = c
			return
		}
	}
	st.Conditions = append(st.Conditions, c)
}

// baseStatus is the status every report starts from.
func baseStatus(pod *corev1.Pod) corev1.PodStatus {
	st := corev1.PodStatus{
		Phase:    corev1.PodPending,
		HostIP:   "127.0.0.1",
		HostIPs:  []corev1.HostIP{{IP: "127.0.0.1"}},
		QOSClass: pod.Status.QOSClass,
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodScheduled {
			st.Conditions = append(st.Conditions, c)
		}
	}
	st.StartTime = pod.Status.StartTime
	if st.StartTime == nil {
		now := metav1.NewTime(time.Now().Truncate(time.Second))
		st.StartTime = &now
	}
	return st
}

// otherContainers reports the containers the harness does not run.
func otherContainers(pod *corev1.Pod) []corev1.ContainerStatus {
	var out []corev1.ContainerStatus
	for _, c := range pod.Spec.Containers[1:] {
		out = append(out, corev1.ContainerStatus{
			Name:  c.Name,
			Image: c.Image,
			State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{
				Reason:  "NotRunByHarness",
				Message: "the kube-harness node agent runs only a Pod's first container",
			}},
		})
	}
	return out
}

func (a *nodeAgent) reportWaiting(ctx context.Context, pod *corev1.Pod, f *podFailure, last *corev1.ContainerStateTerminated) error {
	a.stopProbe(pod.Namespace + "/" + pod.Name)
	spec := pod.Spec.Containers[0]
	st := baseStatus(pod)
	prev := findStatus(pod.Status.ContainerStatuses, spec.Name)
	cs := corev1.ContainerStatus{
		Name:  spec.Name,
		Image: spec.Image,
		State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: f.reason, Message: f.message}},
	}
	if prev != nil {
		cs.RestartCount = prev.RestartCount
		cs.ImageID = prev.ImageID
		cs.ContainerID = prev.ContainerID
		cs.LastTerminationState = prev.LastTerminationState
	}
	if last != nil {
		cs.LastTerminationState = corev1.ContainerState{Terminated: last}
	}
	started := false
	cs.Started = &started
	st.ContainerStatuses = append([]corev1.ContainerStatus{cs}, otherContainers(pod)...)
	old := pod.Status.Conditions
	setCondition(&st, old, corev1.PodReadyToStartContainers, corev1.ConditionTrue, "", "")
	setCondition(&st, old, corev1.PodInitialized, corev1.ConditionTrue, "", "")
	msg := fmt.Sprintf("containers with unready status: [%s]", spec.Name)
	setCondition(&st, old, corev1.ContainersReady, corev1.ConditionFalse, "ContainersNotReady", msg)
	setCondition(&st, old, corev1.PodReady, corev1.ConditionFalse, "ContainersNotReady", msg)
	if err := a.updateStatus(ctx, pod, st); err != nil {
		return err
	}
	if f.retry > 0 {
		return requeueAfter(f.retry)
	}
	return nil
}

// reportContainer reports a created container: running, or exited for good.
func (a *nodeAgent) reportContainer(ctx context.Context, pod *corev1.Pod, c *containerInfo, restarts int32, last *corev1.ContainerStateTerminated) error {
	spec := pod.Spec.Containers[0]
	st := baseStatus(pod)
	imageID := ""
	if img, err := a.docker.imageInspect(ctx, spec.Image); err == nil {
		imageID = "docker://" + img.ID
	}
	cs := corev1.ContainerStatus{
		Name:         spec.Name,
		Image:        spec.Image,
		ImageID:      imageID,
		ContainerID:  "docker://" + c.ID,
		RestartCount: restarts,
	}
	if last != nil {
		cs.LastTerminationState = corev1.ContainerState{Terminated: last}
	}
	old := pod.Status.Conditions
	setCondition(&st, old, corev1.PodReadyToStartContainers, corev1.ConditionTrue, "", "")
	setCondition(&st, old, corev1.PodInitialized, corev1.ConditionTrue, "", "")
	if ip := c.NetworkSettings.Networks[a.ownNetwork(c)].IPAddress; ip != "" {
		st.PodIP = ip
		st.PodIPs = []corev1.PodIP{{IP: ip}}
	}
	only := len(pod.Spec.Containers) == 1
	if c.State.Running {
		st.Phase = corev1.PodRunning
		started := true
		cs.Started = &started
		cs.Ready = a.readiness(pod, c)
		cs.State = corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: parseDockerTime(c.State.StartedAt)}}
		msg := ""
		switch {
		case !cs.Ready:
			msg = fmt.Sprintf("containers with unready status: [%s]", spec.Name)
		case !only:
			msg = "containers with unready status: the harness runs only the first container"
		}
		if msg == "" {
			setCondition(&st, old, corev1.ContainersReady, corev1.ConditionTrue, "", "")
			setCondition(&st, old, corev1.PodReady, corev1.ConditionTrue, "", "")
		} else {
			setCondition(&st, old, corev1.ContainersReady, corev1.ConditionFalse, "ContainersNotReady", msg)
			setCondition(&st, old, corev1.PodReady, corev1.ConditionFalse, "ContainersNotReady", msg)
		}
	} else {
		a.stopProbe(pod.Namespace + "/" + pod.Name)
		term := terminatedState(c)
		started := false
		cs.Started = &started
		cs.State = corev1.ContainerState{Terminated: term}
		st.Phase = corev1.PodSucceeded
		reason := "PodCompleted"
		if term.ExitCode != 0 {
			st.Phase = corev1.PodFailed
			reason = "PodFailed"
		}
		setCondition(&st, old, corev1.ContainersReady, corev1.ConditionFalse, reason, "")
		setCondition(&st, old, corev1.PodReady, corev1.ConditionFalse, reason, "")
	}
	st.ContainerStatuses = append([]corev1.ContainerStatus{cs}, otherContainers(pod)...)
	return a.updateStatus(ctx, pod, st)
}

// updateStatus writes st unless the Pod already says it.
func (a *nodeAgent) updateStatus(ctx context.Context, pod *corev1.Pod, st corev1.PodStatus) error {
	if apiequality.Semantic.DeepEqual(pod.Status, st) {
		return nil
	}
	p := pod.DeepCopy()
	p.Status = st
	_, err := a.client.CoreV1().Pods(pod.Namespace).UpdateStatus(ctx, p, metav1.UpdateOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// --- persistent volume claims ---------------------------------------------

func (a *nodeAgent) enqueueClaimsOf(obj any) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	for _, v := range pod.Spec.Volumes {
		if v.PersistentVolumeClaim != nil {
			a.pvcQueue.Add(pod.Namespace + "/" + v.PersistentVolumeClaim.ClaimName)
		}
	}
}

func pvName(pvc *corev1.PersistentVolumeClaim) string {
	return "hermes-kube-harness-pv-" + uid8(pvc.UID)
}

func (a *nodeAgent) claimInUse(ns, claim string) (bool, error) {
	pods, err := a.pods.Pods(ns).List(everything())
	if err != nil {
		return false, err
	}
	for _, p := range pods {
		for _, v := range p.Spec.Volumes {
			if v.PersistentVolumeClaim != nil && v.PersistentVolumeClaim.ClaimName == claim {
				return true, nil
			}
		}
	}
	return false, nil
}

func (a *nodeAgent) syncClaim(ctx context.Context, key string) error {
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return nil
	}
	pvc, err := a.pvcs.PersistentVolumeClaims(ns).Get(name)
	if apierrors.IsNotFound(err) {
		return a.removeClaimVolume(ctx, ns, name)
	}
	if err != nil {
		return err
	}
	if pvc.DeletionTimestamp != nil {
		inUse, err := a.claimInUse(ns, name)
		if err != nil {
			return err
		}
		if inUse {
			return requeueAfter(2 * time.Second)
		}
		if err := a.removeClaimVolume(ctx, ns, name); err != nil {
			return err
		}
		if err := a.deletePV(ctx, pvName(pvc)); err != nil {
			return err
		}
		return a.dropFinalizer(ctx, pvc)
	}
	if pvc.Status.Phase == corev1.ClaimBound {
		return nil
	}
	return a.bindClaim(ctx, pvc)
}

func (a *nodeAgent) removeClaimVolume(ctx context.Context, ns, name string) error {
	err := a.docker.volumeRemove(ctx, claimVolumeName(a.instance, ns, name))
	if isConflict(err) {
		// Still used by a container that is going away.
		return requeueAfter(2 * time.Second)
	}
	return err
}

func (a *nodeAgent) dropFinalizer(ctx context.Context, pvc *corev1.PersistentVolumeClaim) error {
	var keep []string
	for _, f := range pvc.Finalizers {
		if f != pvcProtection {
			keep = append(keep, f)
		}
	}
	if len(keep) == len(pvc.Finalizers) {
		return nil
	}
	p := pvc.DeepCopy()
	p.Finalizers = keep
	_, err := a.client.CoreV1().PersistentVolumeClaims(p.Namespace).Update(ctx, p, metav1.UpdateOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

func (a *nodeAgent) deletePV(ctx context.Context, name string) error {
	pvs := a.client.CoreV1().PersistentVolumes()
	pv, err := pvs.Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if len(pv.Finalizers) > 0 {
		pv.Finalizers = nil
		if pv, err = pvs.Update(ctx, pv, metav1.UpdateOptions{}); err != nil {
			return err
		}
	}
	err = pvs.Delete(ctx, name, metav1.DeleteOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// bindClaim makes the claim's Docker volume and a PersistentVolume for it,
// and binds the two as the PV controller would.
func (a *nodeAgent) bindClaim(ctx context.Context, pvc *corev1.PersistentVolumeClaim) error {
	vol := claimVolumeName(a.instance, pvc.Namespace, pvc.Name)
	if err := a.docker.volumeCreate(ctx, vol, map[string]string{
		harnessLabel: "1", labelInstance: a.instance, labelVolumeKind: "pvc",
		labelNamespace: pvc.Namespace, labelClaim: pvc.Name,
	}); err != nil {
		return err
	}
	size := pvc.Spec.Resources.Requests[corev1.ResourceStorage]
	if size.IsZero() {
		size = resource.MustParse("1Gi")
	}
	modes := pvc.Spec.AccessModes
	if len(modes) == 0 {
		modes = []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}
	}
	class := ""
	if pvc.Spec.StorageClassName != nil {
		class = *pvc.Spec.StorageClassName
	}
	name := pvName(pvc)
	hostPathType := corev1.HostPathDirectoryOrCreate
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{
			Name:        name,
			Labels:      map[string]string{harnessLabel: "1"},
			Annotations: map[string]string{"pv.kubernetes.io/provisioned-by": "kube-harness.hermes.local/docker-volume", harnessLabel + "/docker-volume": vol},
		},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: size},
			AccessModes:                   modes,
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimDelete,
			StorageClassName:              class,
			VolumeMode:                    pvc.Spec.VolumeMode,
			ClaimRef: &corev1.ObjectReference{
				Kind: "PersistentVolumeClaim", APIVersion: "v1",
				Namespace: pvc.Namespace, Name: pvc.Name, UID: pvc.UID,
			},
			PersistentVolumeSource: corev1.PersistentVolumeSource{
				HostPath: &corev1.HostPathVolumeSource{Path: "/var/lib/docker/volumes/" + vol + "/_data", Type: &hostPathType},
			},
		},
	}
	pvs := a.client.CoreV1().PersistentVolumes()
	created, err := pvs.Create(ctx, pv, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		created, err = pvs.Get(ctx, name, metav1.GetOptions{})
	}
	if err != nil {
		return err
	}
	if created.Status.Phase != corev1.VolumeBound {
		created.Status.Phase = corev1.VolumeBound
		if _, err := pvs.UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
			return err
		}
	}
	claims := a.client.CoreV1().PersistentVolumeClaims(pvc.Namespace)
	p := pvc.DeepCopy()
	if p.Spec.VolumeName == "" {
		p.Spec.VolumeName = name
		if p.Annotations == nil {
			p.Annotations = map[string]string{}
		}
		p.Annotations["pv.kubernetes.io/bind-completed"] = "yes"
		p.Annotations["pv.kubernetes.io/bound-by-controller"] = "yes"
		if p, err = claims.Update(ctx, p, metav1.UpdateOptions{}); err != nil {
			return err
		}
	}
	p.Status.Phase = corev1.ClaimBound
	p.Status.AccessModes = modes
	p.Status.Capacity = corev1.ResourceList{corev1.ResourceStorage: size}
	_, err = claims.UpdateStatus(ctx, p, metav1.UpdateOptions{})
	return err
}

// --- shutdown -------------------------------------------------------------

// cleanupDocker removes every container, volume and pod network of this
// instance (of every instance when it is empty).
func cleanupDocker(ctx context.Context, d *docker, instance string, logf func(string, ...any)) {
	sel := []string{harnessLabel + "=1"}
	if instance != "" {
		sel = append(sel, labelInstance+"="+instance)
	}
	if list, err := d.containerList(ctx, sel...); err == nil {
		for _, c := range list {
			if err := d.containerRemove(ctx, c.ID, true); err != nil {
				logf("remove container %s: %v", c.ID[:12], err)
			}
		}
	} else {
		logf("list containers: %v", err)
	}
	if vols, err := d.volumeList(ctx, sel...); err == nil {
		for _, v := range vols {
			if err := d.volumeRemove(ctx, v.Name); err != nil {
				logf("remove volume %s: %v", v.Name, err)
			}
		}
	} else {
		logf("list volumes: %v", err)
	}
	if nets, err := d.networkList(ctx, sel...); err == nil {
		for _, n := range nets {
			if err := d.networkRemove(ctx, n); err != nil {
				logf("remove network %s: %v", n, err)
			}
		}
	} else {
		logf("list networks: %v", err)
	}
}
