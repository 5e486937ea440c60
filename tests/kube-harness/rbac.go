// What the cluster holds before a test starts: the test namespace, the
// `hermes` ServiceAccount and the Role that says exactly what it may do, the
// namespace's `default` ServiceAccount and kube-root-ca.crt ConfigMap, a
// default StorageClass, and the kubeconfigs of the admin and of `hermes`.
package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

const (
	testNamespace      = "hermes-test"
	serviceAccountName = "hermes"
	storageClassName   = "hermes-kube-harness"
	tokenLifetime      = 24 * time.Hour
)

var metav1GetOptions = metav1.GetOptions{}

// hermesRules is everything the `hermes` ServiceAccount may do, in its
// namespace only (Role + RoleBinding). `kube-harness rbac` prints it.
var hermesRules = []rbacv1.PolicyRule{
	{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch", "create", "update", "patch", "delete"}},
	{APIGroups: []string{""}, Resources: []string{"pods/exec"}, Verbs: []string{"create", "get"}},
	{APIGroups: []string{""}, Resources: []string{"pods/log"}, Verbs: []string{"get"}},
	{APIGroups: []string{""}, Resources: []string{"persistentvolumeclaims"}, Verbs: []string{"get", "list", "watch", "create", "update", "patch", "delete"}},
	{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "list", "watch", "create", "update", "patch", "delete"}},
	{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"get", "list", "watch", "create", "update", "patch", "delete"}},
	{APIGroups: []string{""}, Resources: []string{"services"}, Verbs: []string{"get", "list", "watch", "create", "update", "patch", "delete"}},
	{APIGroups: []string{"networking.k8s.io"}, Resources: []string{"networkpolicies"}, Verbs: []string{"get", "list", "watch", "create", "update", "patch", "delete"}},
	{APIGroups: []string{"", "events.k8s.io"}, Resources: []string{"events"}, Verbs: []string{"list", "watch"}},
}

// sandboxRules is added to hermesRules with --serve-agent-sandbox-crds.
var sandboxRules = []rbacv1.PolicyRule{
	{APIGroups: []string{"agents.x-k8s.io"}, Resources: []string{"sandboxes"}, Verbs: []string{"get", "list", "watch", "create", "update", "patch", "delete"}},
	{APIGroups: []string{"agents.x-k8s.io"}, Resources: []string{"sandboxes/status"}, Verbs: []string{"get"}},
	{APIGroups: []string{"extensions.agents.x-k8s.io"}, Resources: []string{"sandboxtemplates", "sandboxclaims", "sandboxwarmpools"}, Verbs: []string{"get", "list", "watch", "create", "update", "patch", "delete"}},
}

// formatRules renders rules one a line: `group/resource: verbs`.
func formatRules(rules []rbacv1.PolicyRule) string {
	var b strings.Builder
	for _, r := range rules {
		for _, g := range r.APIGroups {
			for _, res := range r.Resources {
				name := res
				if g != "" {
					name = res + "." + g
				}
				fmt.Fprintf(&b, "%s: %s\n", name, strings.Join(r.Verbs, ","))
			}
		}
	}
	return b.String()
}

// createOrUpdate creates obj, or updates it when it exists.
func createOrUpdate[T any](ctx context.Context, create func(context.Context) (T, error), update func(context.Context) (T, error)) error {
	_, err := create(ctx)
	if apierrors.IsAlreadyExists(err) {
		_, err = update(ctx)
	}
	return err
}

// bootstrap makes the namespace, the ServiceAccounts, RBAC and storage class.
func bootstrap(ctx context.Context, c kubernetes.Interface, withSandbox bool) error {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: testNamespace}}
	if _, err := c.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("namespace %s: %w", testNamespace, err)
	}
	for _, name := range []string{"default", serviceAccountName} {
		sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: testNamespace}}
		if _, err := c.CoreV1().ServiceAccounts(testNamespace).Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("serviceaccount %s: %w", name, err)
		}
	}
	rules := append([]rbacv1.PolicyRule{}, hermesRules...)
	if withSandbox {
		rules = append(rules, sandboxRules...)
	}
	role := &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: serviceAccountName, Namespace: testNamespace},
		Rules:      rules,
	}
	roles := c.RbacV1().Roles(testNamespace)
	if err := createOrUpdate(ctx,
		func(ctx context.Context) (*rbacv1.Role, error) {
			return roles.Create(ctx, role, metav1.CreateOptions{})
		},
		func(ctx context.Context) (*rbacv1.Role, error) {
			return roles.Update(ctx, role, metav1.UpdateOptions{})
		},
	); err != nil {
		return fmt.Errorf("role: %w", err)
	}
	binding := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: serviceAccountName, Namespace: testNamespace},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: serviceAccountName},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: serviceAccountName, Namespace: testNamespace}},
	}
	if _, err := c.RbacV1().RoleBindings(testNamespace).Create(ctx, binding, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("rolebinding: %w", err)
	}
	mode := storagev1.VolumeBindingImmediate
	reclaim := corev1.PersistentVolumeReclaimDelete
	sc := &storagev1.StorageClass{
		ObjectMeta: metav1.ObjectMeta{
			Name:        storageClassName,
			Annotations: map[string]string{"storageclass.kubernetes.io/is-default-class": "true"},
		},
		Provisioner:       "kube-harness.hermes.local/docker-volume",
		ReclaimPolicy:     &reclaim,
		VolumeBindingMode: &mode,
	}
	if _, err := c.StorageV1().StorageClasses().Create(ctx, sc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("storageclass: %w", err)
	}
	return nil
}

// ensureRootCA writes the kube-root-ca.crt ConfigMap into a namespace, as
// the controller-manager's root-ca publisher would.
func ensureRootCA(ctx context.Context, c kubernetes.Interface, namespace string, ca []byte) error {
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "kube-root-ca.crt", Namespace: namespace},
		Data:       map[string]string{"ca.crt": string(ca)},
	}
	_, err := c.CoreV1().ConfigMaps(namespace).Create(ctx, cm, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	return err
}

// ensureDefaultServiceAccount makes a namespace's `default` ServiceAccount,
// as the controller-manager's serviceaccount controller would.
func ensureDefaultServiceAccount(ctx context.Context, c kubernetes.Interface, namespace string) error {
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default", Namespace: namespace}}
	_, err := c.CoreV1().ServiceAccounts(namespace).Create(ctx, sa, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	return err
}

// writeHermesKubeconfig requests a token for the `hermes` ServiceAccount and
// writes a kubeconfig that uses it.
func writeHermesKubeconfig(ctx context.Context, c kubernetes.Interface, path, server string, ca []byte) error {
	secs := int64(tokenLifetime / time.Second)
	tr := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &secs}}
	tok, err := c.CoreV1().ServiceAccounts(testNamespace).CreateToken(ctx, serviceAccountName, tr, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("token for %s/%s: %w", testNamespace, serviceAccountName, err)
	}
	return writeKubeconfig(path, server, ca, serviceAccountName, &clientcmdapi.AuthInfo{Token: tok.Status.Token}, testNamespace)
}
