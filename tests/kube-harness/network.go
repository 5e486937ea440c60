// Where a Pod's container goes on the network, decided when the container
// is made: the names it answers to (the Pod's, and those of the Services
// selecting it, for Docker's embedded DNS), and its Docker networks. With
// no CNI, a NetworkPolicy limiting a Pod's egress is approximated with an
// internal Docker network: the Pods it selects are put only there, the Pods
// its egress rules name by podSelector there too (besides the Pod network).
package main

import (
	"context"
	"fmt"
	"sort"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// isolatedNetwork is the internal network of one harness's egress-isolated
// Pods: no route out of it, no address of the host on it.
func isolatedNetwork(instance string) string { return isolatedNetworkBase + "-" + instance }

const (
	isolatedNetworkBase = "hermes-kube-harness-isolated"
	labelNetwork        = harnessLabel + ".network"
)

// podNetworking is where a Pod's container goes: its networks (the first is
// the one its Pod IP is on) and the names it answers to on each.
type podNetworking struct {
	networks []string
	aliases  []string
}

// planNetworking reads the Services and NetworkPolicies of the Pod's
// namespace (from the API, not a cache: what was made before the Pod
// counts) and decides where its container goes.
func (a *nodeAgent) planNetworking(ctx context.Context, pod *corev1.Pod) (podNetworking, error) {
	svcs, err := a.client.CoreV1().Services(pod.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return podNetworking{}, fmt.Errorf("list services of %s: %w", pod.Namespace, err)
	}
	pols, err := a.client.NetworkingV1().NetworkPolicies(pod.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return podNetworking{}, fmt.Errorf("list networkpolicies of %s: %w", pod.Namespace, err)
	}
	plan := podNetworking{aliases: append([]string{pod.Name}, serviceAliases(svcs.Items, pod)...)}
	isolated, peer := egressRole(pols.Items, pod)
	switch {
	case isolated:
		plan.networks = []string{isolatedNetwork(a.instance)}
	case peer:
		plan.networks = []string{podNetwork(a.instance), isolatedNetwork(a.instance)}
	default:
		plan.networks = []string{podNetwork(a.instance)}
	}
	return plan, nil
}

// serviceAliases are the DNS names of the Services selecting the Pod.
func serviceAliases(svcs []corev1.Service, pod *corev1.Pod) []string {
	sort.Slice(svcs, func(i, j int) bool { return svcs[i].Name < svcs[j].Name })
	var out []string
	for _, s := range svcs {
		if len(s.Spec.Selector) == 0 || s.Spec.Type == corev1.ServiceTypeExternalName {
			continue
		}
		if !labels.SelectorFromSet(s.Spec.Selector).Matches(labels.Set(pod.Labels)) {
			continue
		}
		ns := s.Name + "." + pod.Namespace
		out = append(out, s.Name, ns, ns+".svc", ns+".svc.cluster.local")
	}
	return out
}

// egressRole says whether a NetworkPolicy limits the Pod's egress
// (isolated), and whether such a policy's egress rules name it as a peer
// by podSelector (same namespace: no namespaceSelector, no ipBlock).
func egressRole(pols []networkingv1.NetworkPolicy, pod *corev1.Pod) (isolated, peer bool) {
	for i := range pols {
		p := &pols[i]
		if !limitsEgress(p) {
			continue
		}
		if selects(&p.Spec.PodSelector, pod) {
			isolated = true
		}
		for _, rule := range p.Spec.Egress {
			for _, to := range rule.To {
				if to.PodSelector != nil && to.NamespaceSelector == nil && to.IPBlock == nil && selects(to.PodSelector, pod) {
					peer = true
				}
			}
		}
	}
	return isolated, peer
}

// limitsEgress: "Egress" in policyTypes, or (policyTypes unset, which the
// API server's defaulting leaves only for an object without them) egress
// rules.
func limitsEgress(p *networkingv1.NetworkPolicy) bool {
	for _, t := range p.Spec.PolicyTypes {
		if t == networkingv1.PolicyTypeEgress {
			return true
		}
	}
	return len(p.Spec.PolicyTypes) == 0 && len(p.Spec.Egress) > 0
}

// selects matches a label selector (empty: every Pod) against the Pod's
// labels; a selector that does not parse selects nothing.
func selects(sel *metav1.LabelSelector, pod *corev1.Pod) bool {
	s, err := metav1.LabelSelectorAsSelector(sel)
	return err == nil && s.Matches(labels.Set(pod.Labels))
}

// ensureNetwork makes one of the instance's networks unless it exists.
func (a *nodeAgent) ensureNetwork(ctx context.Context, name string) error {
	labels := map[string]string{harnessLabel: "1", labelInstance: a.instance}
	if err := a.docker.networkEnsure(ctx, name, labels, name == isolatedNetwork(a.instance)); err != nil {
		return fmt.Errorf("docker network %s: %w", name, err)
	}
	return nil
}

// createContainer makes the container on its first network and connects it
// to the others before it starts. A network removed under the harness is
// made again.
func (a *nodeAgent) createContainer(ctx context.Context, name string, spec containerCreate, plan podNetworking) (string, error) {
	for _, n := range plan.networks {
		if err := a.ensureNetwork(ctx, n); err != nil {
			return "", err
		}
	}
	id, err := a.docker.containerCreate(ctx, name, spec)
	if isNotFound(err) {
		if nerr := a.ensureNetwork(ctx, plan.networks[0]); nerr != nil {
			return "", nerr
		}
		id, err = a.docker.containerCreate(ctx, name, spec)
	}
	if err != nil {
		return "", err
	}
	for _, n := range plan.networks[1:] {
		err := a.docker.networkConnect(ctx, n, id, plan.aliases)
		if isNotFound(err) {
			if nerr := a.ensureNetwork(ctx, n); nerr != nil {
				err = nerr
			} else {
				err = a.docker.networkConnect(ctx, n, id, plan.aliases)
			}
		}
		if err != nil {
			_ = a.docker.containerRemove(ctx, id, true)
			return "", fmt.Errorf("connect to network %s: %w", n, err)
		}
	}
	return id, nil
}

// ownNetwork is the network of the container's Pod IP.
func (a *nodeAgent) ownNetwork(c *containerInfo) string {
	if n := c.Config.Labels[labelNetwork]; n != "" {
		return n
	}
	return podNetwork(a.instance)
}
