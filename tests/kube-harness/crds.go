// The CustomResourceDefinitions of kubernetes-sigs/agent-sandbox (release
// v1.0.1, copied verbatim from its k8s/crds/: agents.x-k8s.io/v1beta1
// Sandbox; extensions.agents.x-k8s.io/v1beta1 SandboxTemplate, SandboxClaim,
// SandboxWarmPool), installed with --serve-agent-sandbox-crds (stored
// only) or --agent-sandbox (with its controller: agentsandbox.go).
package main

import (
	"bytes"
	"context"
	"embed"
	"fmt"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"
)

//go:embed crds/*.yaml
var sandboxCRDs embed.FS

// installSandboxCRDs creates the CRDs and waits until they are served.
func installSandboxCRDs(ctx context.Context, cfg *rest.Config) error {
	client, err := apiextensionsclient.NewForConfig(cfg)
	if err != nil {
		return err
	}
	entries, err := sandboxCRDs.ReadDir("crds")
	if err != nil {
		return err
	}
	var names []string
	for _, e := range entries {
		raw, err := sandboxCRDs.ReadFile("crds/" + e.Name())
		if err != nil {
			return err
		}
		raw = bytes.TrimPrefix(raw, []byte("---\n"))
		var crd apiextensionsv1.CustomResourceDefinition
		if err := yaml.UnmarshalStrict(raw, &crd); err != nil {
			return fmt.Errorf("%s: %w", e.Name(), err)
		}
		_, err = client.ApiextensionsV1().CustomResourceDefinitions().Create(ctx, &crd, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("create CRD %s: %w", crd.Name, err)
		}
		names = append(names, crd.Name)
	}
	deadline := time.Now().Add(60 * time.Second)
	for _, name := range names {
		for {
			crd, err := client.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, name, metav1.GetOptions{})
			if err == nil && established(crd) {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("CRD %s not established within 60s (last error: %v)", name, err)
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(200 * time.Millisecond):
			}
		}
	}
	return nil
}

func established(crd *apiextensionsv1.CustomResourceDefinition) bool {
	for _, c := range crd.Status.Conditions {
		if c.Type == apiextensionsv1.Established && c.Status == apiextensionsv1.ConditionTrue {
			return true
		}
	}
	return false
}
