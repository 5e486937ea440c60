// The control plane of the harness: a certificate authority and the
// certificates signed by it, an embedded etcd, and the real kube-apiserver of
// k8s.io/kubernetes started in this process with real TLS, client
// certificate and service-account token authentication, and RBAC.
package main

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/pflag"
	"go.etcd.io/etcd/server/v3/embed"
	utilerrors "k8s.io/apimachinery/pkg/util/errors"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	basecompatibility "k8s.io/component-base/compatibility"
	"k8s.io/component-base/featuregate"
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
	"k8s.io/kubernetes/cmd/kube-apiserver/app/options"
)

// --- certificates -----------------------------------------------------------

// pki is the harness's one certificate authority and the files it signed.
type pki struct {
	dir    string
	caCert *x509.Certificate
	caKey  crypto.Signer
	caPEM  []byte
}

func writePEM(path, typ string, der []byte, mode os.FileMode) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), mode)
}

func writeKey(path string, key *ecdsa.PrivateKey) error {
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	return writePEM(path, "EC PRIVATE KEY", der, 0o600)
}

func serial() (*big.Int, error) {
	return rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
}

func newPKI(dir string) (*pki, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	sn, err := serial()
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          sn,
		Subject:               pkix.Name{CommonName: "hermes-kube-harness-ca"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(10 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	p := &pki{dir: dir, caCert: cert, caKey: key, caPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
	if err := os.WriteFile(p.path("ca.crt"), p.caPEM, 0o644); err != nil {
		return nil, err
	}
	if err := writeKey(p.path("ca.key"), key); err != nil {
		return nil, err
	}
	return p, nil
}

func (p *pki) path(name string) string { return filepath.Join(p.dir, name) }

// issue signs a certificate for a serving address (ips/dns) or a client
// identity (cn, orgs) and writes name.crt and name.key.
func (p *pki) issue(name, cn string, orgs []string, ips []net.IP, dns []string, usage x509.ExtKeyUsage) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	sn, err := serial()
	if err != nil {
		return nil, nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: sn,
		Subject:      pkix.Name{CommonName: cn, Organization: orgs},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(10 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  []x509.ExtKeyUsage{usage},
		IPAddresses:  ips,
		DNSNames:     dns,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.caCert, key.Public(), p.caKey)
	if err != nil {
		return nil, nil, err
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	certPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	keyPEM = pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
	if err := os.WriteFile(p.path(name+".crt"), certPEM, 0o644); err != nil {
		return nil, nil, err
	}
	if err := os.WriteFile(p.path(name+".key"), keyPEM, 0o600); err != nil {
		return nil, nil, err
	}
	return certPEM, keyPEM, nil
}

// --- etcd -------------------------------------------------------------------

// freeLoopbackPort asks the kernel for a free port on 127.0.0.1.
func freeLoopbackPort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// startEtcd runs a one-member etcd on loopback with its data in dir.
func startEtcd(dir string, logFile string) (*embed.Etcd, string, error) {
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		clientPort, err := freeLoopbackPort()
		if err != nil {
			return nil, "", err
		}
		peerPort, err := freeLoopbackPort()
		if err != nil {
			return nil, "", err
		}
		cu, _ := url.Parse(fmt.Sprintf("http://127.0.0.1:%d", clientPort))
		pu, _ := url.Parse(fmt.Sprintf("http://127.0.0.1:%d", peerPort))
		cfg := embed.NewConfig()
		cfg.Name = "hermes-kube-harness"
		cfg.Dir = dir
		cfg.ListenClientUrls = []url.URL{*cu}
		cfg.AdvertiseClientUrls = []url.URL{*cu}
		cfg.ListenPeerUrls = []url.URL{*pu}
		cfg.AdvertisePeerUrls = []url.URL{*pu}
		cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
		cfg.LogLevel = "warn"
		cfg.LogOutputs = []string{logFile}
		// A throwaway store: no fsync makes it fast on a busy disk.
		cfg.UnsafeNoFsync = true
		cfg.QuotaBackendBytes = 2 << 30
		cfg.ListenMetricsUrls = nil
		e, err := embed.StartEtcd(cfg)
		if err != nil {
			// Most likely a port taken since it was picked: try others.
			lastErr = err
			continue
		}
		select {
		case <-e.Server.ReadyNotify():
			return e, cu.String(), nil
		case err := <-e.Err():
			e.Close()
			lastErr = err
		case <-time.After(60 * time.Second):
			e.Close()
			return nil, "", errors.New("etcd did not become ready within 60s")
		}
	}
	return nil, "", fmt.Errorf("etcd did not start: %w", lastErr)
}

// --- kube-apiserver ---------------------------------------------------------

// controlPlane is a running etcd and kube-apiserver.
type controlPlane struct {
	pki         *pki
	server      string // https://127.0.0.1:PORT
	etcd        *embed.Etcd
	adminConfig *rest.Config
	admin       kubernetes.Interface
	done        chan error // the apiserver's Run result
	cancel      context.CancelFunc
	// Files of the kubelet endpoint (serving cert and the CA it trusts).
	kubeletCert, kubeletKey []byte
}

// startControlPlane makes the certificates and starts etcd and kube-apiserver.
func startControlPlane(ctx context.Context, dir string, logf func(string, ...any)) (*controlPlane, error) {
	p, err := newPKI(filepath.Join(dir, "pki"))
	if err != nil {
		return nil, fmt.Errorf("certificates: %w", err)
	}
	loopback := []net.IP{net.ParseIP("127.0.0.1")}
	serverDNS := []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"}
	if _, _, err := p.issue("apiserver", "kube-apiserver", nil, append(loopback, net.ParseIP("10.0.0.1")), serverDNS, x509.ExtKeyUsageServerAuth); err != nil {
		return nil, err
	}
	if _, _, err := p.issue("apiserver-kubelet-client", "kube-apiserver-kubelet-client", []string{"system:masters"}, nil, nil, x509.ExtKeyUsageClientAuth); err != nil {
		return nil, err
	}
	adminCert, adminKey, err := p.issue("admin", "hermes-kube-harness-admin", []string{"system:masters"}, nil, nil, x509.ExtKeyUsageClientAuth)
	if err != nil {
		return nil, err
	}
	kubeletCert, kubeletKey, err := p.issue("kubelet", "system:node:"+nodeName, []string{"system:nodes"}, loopback, []string{"localhost", nodeName}, x509.ExtKeyUsageServerAuth)
	if err != nil {
		return nil, err
	}
	saKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	if err := writeKey(p.path("sa.key"), saKey); err != nil {
		return nil, err
	}

	logf("starting etcd in %s", filepath.Join(dir, "etcd"))
	etcd, etcdURL, err := startEtcd(filepath.Join(dir, "etcd"), filepath.Join(dir, "etcd.log"))
	if err != nil {
		return nil, err
	}
	cp := &controlPlane{pki: p, etcd: etcd, kubeletCert: kubeletCert, kubeletKey: kubeletKey}
	ok := false
	defer func() {
		if !ok {
			cp.stop()
		}
	}()

	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	port := listener.Addr().(*net.TCPAddr).Port
	cp.server = fmt.Sprintf("https://127.0.0.1:%d", port)

	s := options.NewServerRunOptions()
	fs := pflag.NewFlagSet("kube-apiserver", pflag.ContinueOnError)
	for _, f := range s.Flags().FlagSets {
		fs.AddFlagSet(f)
	}
	flags := []string{
		"--etcd-servers=" + etcdURL,
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		fmt.Sprintf("--secure-port=%d", port),
		"--cert-dir=" + p.dir,
		"--tls-cert-file=" + p.path("apiserver.crt"),
		"--tls-private-key-file=" + p.path("apiserver.key"),
		"--client-ca-file=" + p.path("ca.crt"),
		"--authorization-mode=Node,RBAC",
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + p.path("sa.key"),
		"--service-account-signing-key-file=" + p.path("sa.key"),
		"--service-account-max-token-expiration=48h",
		"--service-cluster-ip-range=10.0.0.0/16",
		"--endpoint-reconciler-type=none",
		"--kubelet-certificate-authority=" + p.path("ca.crt"),
		"--kubelet-client-certificate=" + p.path("apiserver-kubelet-client.crt"),
		"--kubelet-client-key=" + p.path("apiserver-kubelet-client.key"),
		"--kubelet-preferred-address-types=InternalIP,Hostname",
		"--allow-privileged=true",
		"--profiling=false",
		"--anonymous-auth=false",
		"--enable-priority-and-fairness=false",
	}
	if err := fs.Parse(flags); err != nil {
		return nil, fmt.Errorf("kube-apiserver flags: %w", err)
	}
	s.SecureServing.Listener = listener
	s.SecureServing.BindPort = port
	if err := s.GenericServerRunOptions.ComponentGlobalsRegistry.Set(); err != nil {
		return nil, err
	}
	rest.SetDefaultWarningHandler(rest.NoWarnings{})
	informerName, err := cache.NewInformerName("kube-apiserver")
	if err != nil {
		return nil, err
	}
	s.InformerName = informerName

	runCtx, cancel := context.WithCancel(context.Background())
	cp.cancel = cancel
	completed, err := s.Complete(runCtx)
	if err != nil {
		return nil, fmt.Errorf("kube-apiserver options: %w", err)
	}
	if errs := completed.Validate(); len(errs) != 0 {
		return nil, fmt.Errorf("kube-apiserver options: %w", utilerrors.NewAggregate(errs))
	}
	if fg, ok := s.GenericServerRunOptions.ComponentGlobalsRegistry.FeatureGateFor(basecompatibility.DefaultKubeComponent).(featuregate.MutableFeatureGate); ok {
		fg.AddMetrics()
	}
	config, err := app.NewConfig(completed)
	if err != nil {
		return nil, fmt.Errorf("kube-apiserver config: %w", err)
	}
	cc, err := config.Complete()
	if err != nil {
		return nil, fmt.Errorf("kube-apiserver config: %w", err)
	}
	chain, err := app.CreateServerChain(cc)
	if err != nil {
		return nil, fmt.Errorf("kube-apiserver: %w", err)
	}
	prepared, err := chain.PrepareRun()
	if err != nil {
		return nil, fmt.Errorf("kube-apiserver: %w", err)
	}
	cp.done = make(chan error, 1)
	go func() { cp.done <- prepared.Run(runCtx) }()
	logf("kube-apiserver listening on %s", cp.server)

	cp.adminConfig = &rest.Config{
		Host:            cp.server,
		TLSClientConfig: rest.TLSClientConfig{CAData: p.caPEM, CertData: adminCert, KeyData: adminKey},
		QPS:             200,
		Burst:           400,
		Timeout:         60 * time.Second,
		UserAgent:       "hermes-kube-harness",
	}
	cp.admin, err = kubernetes.NewForConfig(cp.adminConfig)
	if err != nil {
		return nil, err
	}
	if err := cp.waitHealthy(ctx, 3*time.Minute); err != nil {
		return nil, err
	}
	ok = true
	return cp, nil
}

// waitHealthy waits for /readyz and the default namespace.
func (cp *controlPlane) waitHealthy(ctx context.Context, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	var last error
	for time.Now().Before(deadline) {
		select {
		case err := <-cp.done:
			return fmt.Errorf("kube-apiserver stopped: %v", err)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		body, err := cp.admin.CoreV1().RESTClient().Get().AbsPath("/readyz").DoRaw(rctx)
		if err == nil {
			_, err = cp.admin.CoreV1().Namespaces().Get(rctx, "default", metav1GetOptions)
		}
		cancel()
		if err == nil {
			return nil
		}
		last = fmt.Errorf("%v %s", err, body)
	}
	return fmt.Errorf("kube-apiserver not ready within %s: %v", limit, last)
}

// stop shuts down the apiserver, then etcd; bounded.
func (cp *controlPlane) stop() {
	if cp.cancel != nil {
		cp.cancel()
		if cp.done != nil {
			select {
			case <-cp.done:
			case <-time.After(30 * time.Second):
			}
		}
	}
	if cp.etcd != nil {
		done := make(chan struct{})
		go func() { cp.etcd.Close(); close(done) }()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
		}
	}
}

// writeKubeconfig writes a 0600 kubeconfig with the CA embedded.
func writeKubeconfig(path, server string, ca []byte, user string, auth *clientcmdapi.AuthInfo, namespace string) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["hermes-kube-harness"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: ca}
	cfg.AuthInfos[user] = auth
	cfg.Contexts[user] = &clientcmdapi.Context{Cluster: "hermes-kube-harness", AuthInfo: user, Namespace: namespace}
	cfg.CurrentContext = user
	b, err := clientcmd.Write(*cfg)
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// adminAuth is the admin's client certificate (group system:masters).
func adminAuth(cp *controlPlane) *clientcmdapi.AuthInfo {
	return &clientcmdapi.AuthInfo{
		ClientCertificateData: cp.adminConfig.TLSClientConfig.CertData,
		ClientKeyData:         cp.adminConfig.TLSClientConfig.KeyData,
	}
}

// waitNodeReady waits until the API server reports the node Ready.
func waitNodeReady(ctx context.Context, cp *controlPlane) error {
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		node, err := cp.admin.CoreV1().Nodes().Get(ctx, nodeName, metav1GetOptions)
		if err == nil {
			for _, c := range node.Status.Conditions {
				if c.Type == "Ready" && c.Status == "True" && node.Status.DaemonEndpoints.KubeletEndpoint.Port > 0 {
					return nil
				}
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	return fmt.Errorf("node %s not Ready within 60s", nodeName)
}
