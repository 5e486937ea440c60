// How a Pod's first container becomes a Docker container: command and
// environment, security context, resource limits, and volumes (claims and
// emptyDirs as Docker volumes; configMap, secret, projected and downwardAPI
// volumes as files bind-mounted read-only).
package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

func everything() labels.Selector { return labels.Everything() }

func configError(format string, args ...any) *podFailure {
	return &podFailure{reason: "CreateContainerConfigError", message: fmt.Sprintf(format, args...), retry: 5 * time.Second}
}

// waitingFor is a missing object the container needs (kubelet keeps the Pod
// in ContainerCreating).
func waitingFor(format string, args ...any) *podFailure {
	return &podFailure{reason: "ContainerCreating", message: fmt.Sprintf(format, args...), retry: 2 * time.Second}
}

func (a *nodeAgent) buildContainer(ctx context.Context, pod *corev1.Pod, c *corev1.Container, img *imageInfo, plan podNetworking) (containerCreate, error) {
	spec := containerCreate{
		Image:      c.Image,
		Entrypoint: c.Command,
		Cmd:        c.Args,
		WorkingDir: c.WorkingDir,
		Tty:        c.TTY,
		OpenStdin:  c.Stdin,
		StdinOnce:  c.StdinOnce,
		Labels: map[string]string{
			harnessLabel:                  "1",
			labelInstance:                 a.instance,
			labelNamespace:                pod.Namespace,
			labelPod:                      pod.Name,
			labelPodUID:                   string(pod.UID),
			labelContainer:                c.Name,
			labelNetwork:                  plan.networks[0],
			"io.kubernetes.pod.name":      pod.Name,
			"io.kubernetes.pod.namespace": pod.Namespace,
		},
	}
	spec.Hostname = pod.Name
	if pod.Spec.Hostname != "" {
		spec.Hostname = pod.Spec.Hostname
	}
	if len(spec.Hostname) > 63 {
		spec.Hostname = spec.Hostname[:63]
	}
	// The other networks are connected once the container is made (the
	// engine API the harness speaks takes one network at creation).
	spec.HostConfig.NetworkMode = plan.networks[0]
	spec.NetworkingConfig.EndpointsConfig = map[string]endpointSettings{plan.networks[0]: {Aliases: plan.aliases}}

	env, err := a.resolveEnv(ctx, pod, c)
	if err != nil {
		return spec, err
	}
	spec.Env = env

	if err := applySecurity(&spec, pod, c, img); err != nil {
		return spec, err
	}
	if q, ok := c.Resources.Limits[corev1.ResourceCPU]; ok {
		spec.HostConfig.NanoCPUs = q.MilliValue() * 1_000_000
	}
	if q, ok := c.Resources.Limits[corev1.ResourceMemory]; ok {
		spec.HostConfig.Memory = q.Value()
	}
	mounts, err := a.buildMounts(ctx, pod, c)
	if err != nil {
		return spec, err
	}
	spec.HostConfig.Mounts = mounts
	return spec, nil
}

// applySecurity maps the Pod's and the container's securityContext.
func applySecurity(spec *containerCreate, pod *corev1.Pod, c *corev1.Container, img *imageInfo) error {
	psc := pod.Spec.SecurityContext
	if psc == nil {
		psc = &corev1.PodSecurityContext{}
	}
	sc := c.SecurityContext
	if sc == nil {
		sc = &corev1.SecurityContext{}
	}
	user, group, nonRoot := psc.RunAsUser, psc.RunAsGroup, psc.RunAsNonRoot
	if sc.RunAsUser != nil {
		user = sc.RunAsUser
	}
	if sc.RunAsGroup != nil {
		group = sc.RunAsGroup
	}
	if sc.RunAsNonRoot != nil {
		nonRoot = sc.RunAsNonRoot
	}
	imageUser := img.Config.User
	switch {
	case user != nil && group != nil:
		spec.User = fmt.Sprintf("%d:%d", *user, *group)
	case user != nil:
		spec.User = fmt.Sprint(*user)
	case group != nil:
		u := strings.SplitN(imageUser, ":", 2)[0]
		if u == "" {
			u = "0"
		}
		spec.User = fmt.Sprintf("%s:%d", u, *group)
	}
	if nonRoot != nil && *nonRoot {
		switch {
		case user != nil && *user == 0:
			return configError("container's runAsUser breaks non-root policy (pod: %q, container: %s)", pod.Name, c.Name)
		case user == nil:
			u := strings.SplitN(imageUser, ":", 2)[0]
			if u == "" || u == "0" || u == "root" {
				return configError("container has runAsNonRoot and image will run as root (pod: %q, container: %s)", pod.Name, c.Name)
			}
			if strings.Trim(u, "0123456789") != "" {
				return configError("container has runAsNonRoot and image has non-numeric user (%s), cannot verify user is non-root (pod: %q, container: %s)", u, pod.Name, c.Name)
			}
		}
	}
	if psc.FSGroup != nil {
		spec.HostConfig.GroupAdd = append(spec.HostConfig.GroupAdd, fmt.Sprint(*psc.FSGroup))
	}
	for _, g := range psc.SupplementalGroups {
		spec.HostConfig.GroupAdd = append(spec.HostConfig.GroupAdd, fmt.Sprint(g))
	}
	if len(psc.Sysctls) > 0 {
		spec.HostConfig.Sysctls = map[string]string{}
		for _, s := range psc.Sysctls {
			spec.HostConfig.Sysctls[s.Name] = s.Value
		}
	}
	if sc.Capabilities != nil {
		for _, cap := range sc.Capabilities.Drop {
			spec.HostConfig.CapDrop = append(spec.HostConfig.CapDrop, string(cap))
		}
		for _, cap := range sc.Capabilities.Add {
			spec.HostConfig.CapAdd = append(spec.HostConfig.CapAdd, string(cap))
		}
	}
	if sc.Privileged != nil && *sc.Privileged {
		spec.HostConfig.Privileged = true
	}
	if sc.AllowPrivilegeEscalation != nil && !*sc.AllowPrivilegeEscalation {
		spec.HostConfig.SecurityOpt = append(spec.HostConfig.SecurityOpt, "no-new-privileges")
	}
	if sc.ReadOnlyRootFilesystem != nil && *sc.ReadOnlyRootFilesystem {
		spec.HostConfig.ReadonlyRootfs = true
	}
	seccomp := psc.SeccompProfile
	if sc.SeccompProfile != nil {
		seccomp = sc.SeccompProfile
	}
	if seccomp != nil {
		switch seccomp.Type {
		case corev1.SeccompProfileTypeRuntimeDefault:
			// Docker's default profile.
		case corev1.SeccompProfileTypeUnconfined:
			spec.HostConfig.SecurityOpt = append(spec.HostConfig.SecurityOpt, "seccomp=unconfined")
		case corev1.SeccompProfileTypeLocalhost:
			return configError("seccomp profile type Localhost is not supported by the harness")
		}
	}
	return nil
}

// --- environment ----------------------------------------------------------

func (a *nodeAgent) configMapData(ctx context.Context, ns, name string) (map[string][]byte, error) {
	cm, err := a.client.CoreV1().ConfigMaps(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	out := map[string][]byte{}
	for k, v := range cm.Data {
		out[k] = []byte(v)
	}
	for k, v := range cm.BinaryData {
		out[k] = v
	}
	return out, nil
}

func (a *nodeAgent) secretData(ctx context.Context, ns, name string) (map[string][]byte, error) {
	s, err := a.client.CoreV1().Secrets(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	return s.Data, nil
}

func fieldValue(pod *corev1.Pod, path string) (string, error) {
	switch path {
	case "metadata.name":
		return pod.Name, nil
	case "metadata.namespace":
		return pod.Namespace, nil
	case "metadata.uid":
		return string(pod.UID), nil
	case "spec.nodeName":
		return pod.Spec.NodeName, nil
	case "spec.serviceAccountName":
		return pod.Spec.ServiceAccountName, nil
	case "status.hostIP":
		return "127.0.0.1", nil
	case "status.podIP":
		return pod.Status.PodIP, nil
	}
	if strings.HasPrefix(path, "metadata.labels['") && strings.HasSuffix(path, "']") {
		return pod.Labels[strings.TrimSuffix(strings.TrimPrefix(path, "metadata.labels['"), "']")], nil
	}
	if strings.HasPrefix(path, "metadata.annotations['") && strings.HasSuffix(path, "']") {
		return pod.Annotations[strings.TrimSuffix(strings.TrimPrefix(path, "metadata.annotations['"), "']")], nil
	}
	if path == "metadata.labels" || path == "metadata.annotations" {
		m := pod.Labels
		if path == "metadata.annotations" {
			m = pod.Annotations
		}
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		var b strings.Builder
		for _, k := range keys {
			fmt.Fprintf(&b, "%s=%q\n", k, m[k])
		}
		return b.String(), nil
	}
	return "", fmt.Errorf("field path %q is not supported by the harness", path)
}

// keyLookup returns one key of a ConfigMap or Secret; a missing object or key
// blocks the container unless optional.
func (a *nodeAgent) keyLookup(ctx context.Context, ns, kind, name, key string, optional *bool, get func(context.Context, string, string) (map[string][]byte, error)) (string, bool, error) {
	opt := optional != nil && *optional
	data, err := get(ctx, ns, name)
	if apierrors.IsNotFound(err) {
		if opt {
			return "", false, nil
		}
		return "", false, configError("%s %q not found", kind, name)
	}
	if err != nil {
		return "", false, err
	}
	v, ok := data[key]
	if !ok {
		if opt {
			return "", false, nil
		}
		return "", false, configError("couldn't find key %s in %s %s/%s", key, kind, ns, name)
	}
	return string(v), true, nil
}

func (a *nodeAgent) resolveEnv(ctx context.Context, pod *corev1.Pod, c *corev1.Container) ([]string, error) {
	vals := map[string]string{}
	var order []string
	set := func(k, v string) {
		if _, ok := vals[k]; !ok {
			order = append(order, k)
		}
		vals[k] = v
	}
	for _, from := range c.EnvFrom {
		var data map[string][]byte
		var err error
		var optional *bool
		switch {
		case from.ConfigMapRef != nil:
			optional = from.ConfigMapRef.Optional
			data, err = a.configMapData(ctx, pod.Namespace, from.ConfigMapRef.Name)
		case from.SecretRef != nil:
			optional = from.SecretRef.Optional
			data, err = a.secretData(ctx, pod.Namespace, from.SecretRef.Name)
		default:
			continue
		}
		if apierrors.IsNotFound(err) {
			if optional != nil && *optional {
				continue
			}
			return nil, configError("envFrom: %v", err)
		}
		if err != nil {
			return nil, err
		}
		keys := make([]string, 0, len(data))
		for k := range data {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			set(from.Prefix+k, string(data[k]))
		}
	}
	for _, e := range c.Env {
		if e.ValueFrom == nil {
			set(e.Name, expandEnv(e.Value, vals))
			continue
		}
		vf := e.ValueFrom
		switch {
		case vf.FieldRef != nil:
			v, err := fieldValue(pod, vf.FieldRef.FieldPath)
			if err != nil {
				return nil, configError("env %s: %v", e.Name, err)
			}
			set(e.Name, v)
		case vf.ConfigMapKeyRef != nil:
			r := vf.ConfigMapKeyRef
			v, ok, err := a.keyLookup(ctx, pod.Namespace, "configmap", r.Name, r.Key, r.Optional, a.configMapData)
			if err != nil {
				return nil, err
			}
			if ok {
				set(e.Name, v)
			}
		case vf.SecretKeyRef != nil:
			r := vf.SecretKeyRef
			v, ok, err := a.keyLookup(ctx, pod.Namespace, "secret", r.Name, r.Key, r.Optional, a.secretData)
			if err != nil {
				return nil, err
			}
			if ok {
				set(e.Name, v)
			}
		case vf.ResourceFieldRef != nil:
			r := vf.ResourceFieldRef
			var q string
			switch r.Resource {
			case "limits.cpu":
				q = fmt.Sprint(c.Resources.Limits.Cpu().Value())
			case "limits.memory":
				q = fmt.Sprint(c.Resources.Limits.Memory().Value())
			case "requests.cpu":
				q = fmt.Sprint(c.Resources.Requests.Cpu().Value())
			case "requests.memory":
				q = fmt.Sprint(c.Resources.Requests.Memory().Value())
			default:
				return nil, configError("env %s: resource %q is not supported by the harness", e.Name, r.Resource)
			}
			set(e.Name, q)
		default:
			return nil, configError("env %s: this valueFrom is not supported by the harness", e.Name)
		}
	}
	out := make([]string, 0, len(order))
	for _, k := range order {
		out = append(out, k+"="+vals[k])
	}
	return out, nil
}

// expandEnv expands $(VAR) references to variables defined earlier, as the
// kubelet does; $$ escapes.
func expandEnv(s string, vals map[string]string) string {
	if !strings.Contains(s, "$") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '$' || i+1 >= len(s) {
			b.WriteByte(s[i])
			continue
		}
		switch s[i+1] {
		case '$':
			b.WriteByte('$')
			i++
		case '(':
			end := strings.IndexByte(s[i+2:], ')')
			if end < 0 {
				b.WriteString(s[i:])
				return b.String()
			}
			name := s[i+2 : i+2+end]
			if v, ok := vals[name]; ok {
				b.WriteString(v)
			} else {
				b.WriteString(s[i : i+3+end])
			}
			i += 2 + end
		default:
			b.WriteByte('$')
		}
	}
	return b.String()
}

// --- volumes --------------------------------------------------------------

type fileSet map[string]fileEntry

type fileEntry struct {
	data []byte
	mode os.FileMode
}

func modeOf(m *int32, def os.FileMode) os.FileMode {
	if m == nil {
		return def
	}
	return os.FileMode(*m) & 0o777
}

// keyed projects a ConfigMap's or Secret's data by items, or every key.
func keyed(files fileSet, data map[string][]byte, items []corev1.KeyToPath, mode os.FileMode, kind, name string) error {
	if len(items) == 0 {
		for k, v := range data {
			files[k] = fileEntry{v, mode}
		}
		return nil
	}
	for _, it := range items {
		v, ok := data[it.Key]
		if !ok {
			return configError("configmap references non-existent config key: %s (%s %s)", it.Key, kind, name)
		}
		files[it.Path] = fileEntry{v, modeOf(it.Mode, mode)}
	}
	return nil
}

func (a *nodeAgent) downwardFiles(files fileSet, pod *corev1.Pod, items []corev1.DownwardAPIVolumeFile, mode os.FileMode) error {
	for _, it := range items {
		if it.FieldRef == nil {
			return configError("downwardAPI %s: only fieldRef is supported by the harness", it.Path)
		}
		v, err := fieldValue(pod, it.FieldRef.FieldPath)
		if err != nil {
			return configError("downwardAPI %s: %v", it.Path, err)
		}
		files[it.Path] = fileEntry{[]byte(v), modeOf(it.Mode, mode)}
	}
	return nil
}

func (a *nodeAgent) serviceAccountToken(ctx context.Context, pod *corev1.Pod, src *corev1.ServiceAccountTokenProjection) ([]byte, error) {
	exp := int64(3600)
	if src.ExpirationSeconds != nil {
		exp = *src.ExpirationSeconds
	}
	tr := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		ExpirationSeconds: &exp,
		BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID},
	}}
	if src.Audience != "" {
		tr.Spec.Audiences = []string{src.Audience}
	}
	sa := pod.Spec.ServiceAccountName
	if sa == "" {
		sa = "default"
	}
	tok, err := a.client.CoreV1().ServiceAccounts(pod.Namespace).CreateToken(ctx, sa, tr, metav1.CreateOptions{})
	if err != nil {
		return nil, err
	}
	return []byte(tok.Status.Token), nil
}

// volumeFiles returns the files of a file-backed volume, or nil for others.
func (a *nodeAgent) volumeFiles(ctx context.Context, pod *corev1.Pod, v *corev1.Volume) (fileSet, error) {
	files := fileSet{}
	switch {
	case v.ConfigMap != nil:
		data, err := a.configMapData(ctx, pod.Namespace, v.ConfigMap.Name)
		if apierrors.IsNotFound(err) {
			if v.ConfigMap.Optional != nil && *v.ConfigMap.Optional {
				return files, nil
			}
			return nil, waitingFor("configmap %q not found", v.ConfigMap.Name)
		}
		if err != nil {
			return nil, err
		}
		return files, keyed(files, data, v.ConfigMap.Items, modeOf(v.ConfigMap.DefaultMode, 0o644), "configmap", v.ConfigMap.Name)
	case v.Secret != nil:
		data, err := a.secretData(ctx, pod.Namespace, v.Secret.SecretName)
		if apierrors.IsNotFound(err) {
			if v.Secret.Optional != nil && *v.Secret.Optional {
				return files, nil
			}
			return nil, waitingFor("secret %q not found", v.Secret.SecretName)
		}
		if err != nil {
			return nil, err
		}
		return files, keyed(files, data, v.Secret.Items, modeOf(v.Secret.DefaultMode, 0o644), "secret", v.Secret.SecretName)
	case v.DownwardAPI != nil:
		return files, a.downwardFiles(files, pod, v.DownwardAPI.Items, modeOf(v.DownwardAPI.DefaultMode, 0o644))
	case v.Projected != nil:
		mode := modeOf(v.Projected.DefaultMode, 0o644)
		for _, src := range v.Projected.Sources {
			switch {
			case src.ConfigMap != nil:
				data, err := a.configMapData(ctx, pod.Namespace, src.ConfigMap.Name)
				if apierrors.IsNotFound(err) {
					if src.ConfigMap.Optional != nil && *src.ConfigMap.Optional {
						continue
					}
					return nil, waitingFor("configmap %q not found", src.ConfigMap.Name)
				}
				if err != nil {
					return nil, err
				}
				if err := keyed(files, data, src.ConfigMap.Items, mode, "configmap", src.ConfigMap.Name); err != nil {
					return nil, err
				}
			case src.Secret != nil:
				data, err := a.secretData(ctx, pod.Namespace, src.Secret.Name)
				if apierrors.IsNotFound(err) {
					if src.Secret.Optional != nil && *src.Secret.Optional {
						continue
					}
					return nil, waitingFor("secret %q not found", src.Secret.Name)
				}
				if err != nil {
					return nil, err
				}
				if err := keyed(files, data, src.Secret.Items, mode, "secret", src.Secret.Name); err != nil {
					return nil, err
				}
			case src.DownwardAPI != nil:
				if err := a.downwardFiles(files, pod, src.DownwardAPI.Items, mode); err != nil {
					return nil, err
				}
			case src.ServiceAccountToken != nil:
				tok, err := a.serviceAccountToken(ctx, pod, src.ServiceAccountToken)
				if err != nil {
					return nil, waitingFor("service account token: %v", err)
				}
				files[src.ServiceAccountToken.Path] = fileEntry{tok, mode}
			default:
				return nil, configError("volume %s: this projected source is not supported by the harness", v.Name)
			}
		}
		return files, nil
	}
	return nil, nil
}

// writeFiles writes a volume's files under the Pod's directory.
// writeFiles writes a file volume under dir; with the Pod's fsGroup
// (gid >= 0) its files are group-owned by it, as the kubelet makes them.
func writeFiles(dir string, files fileSet, gid int) error {
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for rel, f := range files {
		clean := filepath.Clean("/" + rel)
		path := filepath.Join(dir, clean)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(path, f.data, f.mode); err != nil {
			return err
		}
		if gid >= 0 {
			if err := os.Lchown(path, 0, gid); err != nil {
				return err
			}
		}
		if err := os.Chmod(path, f.mode); err != nil {
			return err
		}
	}
	return nil
}

// fsGroupOf is the Pod's fsGroup, or -1.
func fsGroupOf(pod *corev1.Pod) int {
	if psc := pod.Spec.SecurityContext; psc != nil && psc.FSGroup != nil {
		return int(*psc.FSGroup)
	}
	return -1
}

// subPathMount turns the mount of the Docker volume m.Source into a bind
// of its sub-directory vm.SubPath, made when missing, as the kubelet does.
// Like the kubelet it refuses a sub-path that leaves the volume: an
// absolute path, "..", or a symbolic link on the way (the Pod may have
// put one there).
func (a *nodeAgent) subPathMount(ctx context.Context, m *mount, vm corev1.VolumeMount) error {
	sub := vm.SubPath
	if filepath.IsAbs(sub) || sub != filepath.Clean(sub) || sub == "." || strings.HasPrefix(sub, "..") {
		return configError("volume mount %s: subPath %q must be a relative path within the volume", vm.Name, sub)
	}
	root, err := a.docker.volumeMountpoint(ctx, m.Source)
	if err != nil {
		return err
	}
	dir := root
	for _, part := range strings.Split(sub, "/") {
		dir = filepath.Join(dir, part)
		fi, err := os.Lstat(dir)
		switch {
		case os.IsNotExist(err):
			if err := os.Mkdir(dir, 0o755); err != nil {
				return err
			}
		case err != nil:
			return err
		case fi.Mode()&os.ModeSymlink != 0 || !fi.IsDir():
			return configError("volume mount %s: subPath %q: %s is not a directory of the volume", vm.Name, sub, part)
		}
	}
	m.Type, m.Source = "bind", dir
	return nil
}

func (a *nodeAgent) buildMounts(ctx context.Context, pod *corev1.Pod, c *corev1.Container) ([]mount, error) {
	byName := map[string]*corev1.Volume{}
	for i := range pod.Spec.Volumes {
		byName[pod.Spec.Volumes[i].Name] = &pod.Spec.Volumes[i]
	}
	var mounts []mount
	prepared := map[string]string{} // volume name -> host dir of its files
	for _, vm := range c.VolumeMounts {
		v, ok := byName[vm.Name]
		if !ok {
			return nil, configError("volume mount %s: no volume of that name", vm.Name)
		}
		m := mount{Target: vm.MountPath, ReadOnly: vm.ReadOnly}
		switch {
		case v.PersistentVolumeClaim != nil:
			claim := v.PersistentVolumeClaim.ClaimName
			pvc, err := a.pvcs.PersistentVolumeClaims(pod.Namespace).Get(claim)
			if apierrors.IsNotFound(err) {
				return nil, waitingFor("persistentvolumeclaim %q not found", claim)
			}
			if err != nil {
				return nil, err
			}
			if pvc.DeletionTimestamp != nil {
				return nil, waitingFor("persistentvolumeclaim %q is being deleted", claim)
			}
			if vm.SubPathExpr != "" {
				return nil, configError("volume mount %s: subPathExpr is not supported by the harness", vm.Name)
			}
			name := claimVolumeName(a.instance, pod.Namespace, claim)
			if err := a.docker.volumeCreate(ctx, name, map[string]string{
				harnessLabel: "1", labelInstance: a.instance, labelVolumeKind: "pvc",
				labelNamespace: pod.Namespace, labelClaim: claim,
			}); err != nil {
				return nil, err
			}
			m.Type, m.Source = "volume", name
			m.ReadOnly = m.ReadOnly || v.PersistentVolumeClaim.ReadOnly
			if vm.SubPath != "" {
				if err := a.subPathMount(ctx, &m, vm); err != nil {
					return nil, err
				}
			}
		case v.EmptyDir != nil:
			if vm.SubPathExpr != "" || (vm.SubPath != "" && v.EmptyDir.Medium == corev1.StorageMediumMemory) {
				return nil, configError("volume mount %s: subPath on a memory emptyDir, or subPathExpr, is not supported by the harness", vm.Name)
			}
			if v.EmptyDir.Medium == corev1.StorageMediumMemory {
				m.Type = "tmpfs"
				m.TmpfsOptions = &tmpfsOptions{Mode: 0o1777}
				if v.EmptyDir.SizeLimit != nil {
					m.TmpfsOptions.SizeBytes = v.EmptyDir.SizeLimit.Value()
				}
				break
			}
			name := fmt.Sprintf("hermes-kube-harness-empty-%s-%s", uid8(pod.UID), v.Name)
			if err := a.docker.volumeCreate(ctx, name, map[string]string{
				harnessLabel: "1", labelInstance: a.instance, labelVolumeKind: "emptydir",
				labelPodUID: string(pod.UID),
			}); err != nil {
				return nil, err
			}
			m.Type, m.Source = "volume", name
			if vm.SubPath != "" {
				if err := a.subPathMount(ctx, &m, vm); err != nil {
					return nil, err
				}
			}
		default:
			dir, ok := prepared[v.Name]
			if !ok {
				files, err := a.volumeFiles(ctx, pod, v)
				if err != nil {
					return nil, err
				}
				if files == nil {
					return nil, configError("volume %s: this volume type is not supported by the harness", v.Name)
				}
				dir = filepath.Join(a.volumesDir, string(pod.UID), v.Name)
				if err := writeFiles(dir, files, fsGroupOf(pod)); err != nil {
					return nil, err
				}
				prepared[v.Name] = dir
			}
			m.Type, m.Source, m.ReadOnly = "bind", dir, true
			if vm.SubPath != "" {
				m.Source = filepath.Join(dir, filepath.Clean("/"+vm.SubPath))
				if _, err := os.Stat(m.Source); err != nil {
					return nil, configError("volume mount %s: subPath %s: %v", vm.Name, vm.SubPath, err)
				}
			}
		}
		mounts = append(mounts, m)
	}
	return mounts, nil
}
