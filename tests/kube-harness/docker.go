// A small Docker Engine API client over the engine's unix socket: the calls
// the node agent and the exec server need (containers, exec, volumes,
// networks, images, logs), as plain JSON over HTTP.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"
)

// dockerAPIVersion is the Engine API version the harness speaks (Docker 20.10
// and later accept it).
const dockerAPIVersion = "v1.41"

// harnessLabel marks every Docker object the harness makes.
const harnessLabel = "hermes-kube-harness"

// docker talks to one engine.
type docker struct {
	socket string
	http   *http.Client
}

// dockerError is a non-2xx answer of the engine.
type dockerError struct {
	Status  int
	Message string
}

func (e *dockerError) Error() string {
	return fmt.Sprintf("docker: %d %s", e.Status, e.Message)
}

func isNotFound(err error) bool {
	var de *dockerError
	return errors.As(err, &de) && de.Status == http.StatusNotFound
}

func isConflict(err error) bool {
	var de *dockerError
	return errors.As(err, &de) && de.Status == http.StatusConflict
}

// newDocker connects to $DOCKER_HOST (unix:// only) or /var/run/docker.sock.
func newDocker() (*docker, error) {
	socket := "/var/run/docker.sock"
	if h := os.Getenv("DOCKER_HOST"); h != "" {
		if !strings.HasPrefix(h, "unix://") {
			return nil, fmt.Errorf("DOCKER_HOST=%s: only unix:// sockets are supported", h)
		}
		socket = strings.TrimPrefix(h, "unix://")
	}
	d := &docker{socket: socket}
	d.http = &http.Client{
		Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				var dialer net.Dialer
				return dialer.DialContext(ctx, "unix", socket)
			},
			MaxIdleConns:    8,
			IdleConnTimeout: 30 * time.Second,
		},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := d.do(ctx, http.MethodGet, "/_ping", nil, nil, nil); err != nil {
		return nil, fmt.Errorf("docker engine at %s does not answer: %w", socket, err)
	}
	return d, nil
}

func (d *docker) url(path string, q url.Values) string {
	u := "http://docker/" + dockerAPIVersion + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	return u
}

// do sends one request with an optional JSON body and decodes a JSON answer
// into out (when not nil). Calls without a deadline of their own get 2 minutes.
func (d *docker) do(ctx context.Context, method, path string, q url.Values, body, out any) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 2*time.Minute)
		defer cancel()
	}
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, d.url(path, q), rd)
	if err != nil {
		return err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := d.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return readDockerError(resp)
	}
	if out == nil {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
		return nil
	}
	return json.NewDecoder(resp.Body).Decode(out)
}

func readDockerError(resp *http.Response) error {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	var m struct {
		Message string `json:"message"`
	}
	msg := strings.TrimSpace(string(b))
	if json.Unmarshal(b, &m) == nil && m.Message != "" {
		msg = m.Message
	}
	return &dockerError{Status: resp.StatusCode, Message: msg}
}

// stream sends a request and hands back the open answer body (logs, follow).
func (d *docker) stream(ctx context.Context, path string, q url.Values) (io.ReadCloser, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, d.url(path, q), nil)
	if err != nil {
		return nil, err
	}
	resp, err := d.http.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode/100 != 2 {
		defer resp.Body.Close()
		return nil, readDockerError(resp)
	}
	return resp.Body, nil
}

// --- images ---------------------------------------------------------------

type imageInfo struct {
	ID     string `json:"Id"`
	Config struct {
		User string `json:"User"`
	} `json:"Config"`
}

// imageInspect returns the local image, or a not-found error: never pulls.
func (d *docker) imageInspect(ctx context.Context, ref string) (*imageInfo, error) {
	var info imageInfo
	if err := d.do(ctx, http.MethodGet, "/images/"+ref+"/json", nil, nil, &info); err != nil {
		return nil, err
	}
	return &info, nil
}

// --- containers -----------------------------------------------------------

type mount struct {
	Type          string         `json:"Type"`
	Source        string         `json:"Source,omitempty"`
	Target        string         `json:"Target"`
	ReadOnly      bool           `json:"ReadOnly,omitempty"`
	TmpfsOptions  *tmpfsOptions  `json:"TmpfsOptions,omitempty"`
	VolumeOptions *volumeOptions `json:"VolumeOptions,omitempty"`
}

type tmpfsOptions struct {
	SizeBytes int64 `json:"SizeBytes,omitempty"`
	Mode      uint32
}

type volumeOptions struct {
	NoCopy bool              `json:"NoCopy,omitempty"`
	Labels map[string]string `json:"Labels,omitempty"`
}

type hostConfig struct {
	Mounts         []mount           `json:"Mounts,omitempty"`
	NetworkMode    string            `json:"NetworkMode,omitempty"`
	CapAdd         []string          `json:"CapAdd,omitempty"`
	CapDrop        []string          `json:"CapDrop,omitempty"`
	SecurityOpt    []string          `json:"SecurityOpt,omitempty"`
	ReadonlyRootfs bool              `json:"ReadonlyRootfs,omitempty"`
	Privileged     bool              `json:"Privileged,omitempty"`
	NanoCPUs       int64             `json:"NanoCpus,omitempty"`
	Memory         int64             `json:"Memory,omitempty"`
	GroupAdd       []string          `json:"GroupAdd,omitempty"`
	Sysctls        map[string]string `json:"Sysctls,omitempty"`
	Init           bool              `json:"Init,omitempty"`
}

type endpointSettings struct {
	Aliases   []string `json:"Aliases,omitempty"`
	IPAddress string   `json:"IPAddress,omitempty"`
}

type containerCreate struct {
	Hostname         string            `json:"Hostname,omitempty"`
	User             string            `json:"User,omitempty"`
	Env              []string          `json:"Env,omitempty"`
	Cmd              []string          `json:"Cmd,omitempty"`
	Entrypoint       []string          `json:"Entrypoint,omitempty"`
	Image            string            `json:"Image"`
	WorkingDir       string            `json:"WorkingDir,omitempty"`
	Labels           map[string]string `json:"Labels,omitempty"`
	OpenStdin        bool              `json:"OpenStdin,omitempty"`
	StdinOnce        bool              `json:"StdinOnce,omitempty"`
	AttachStdin      bool              `json:"AttachStdin,omitempty"`
	Tty              bool              `json:"Tty,omitempty"`
	StopSignal       string            `json:"StopSignal,omitempty"`
	HostConfig       hostConfig        `json:"HostConfig"`
	NetworkingConfig struct {
		EndpointsConfig map[string]endpointSettings `json:"EndpointsConfig,omitempty"`
	} `json:"NetworkingConfig"`
}

func (d *docker) containerCreate(ctx context.Context, name string, spec containerCreate) (string, error) {
	var out struct {
		ID string `json:"Id"`
	}
	if err := d.do(ctx, http.MethodPost, "/containers/create", url.Values{"name": {name}}, spec, &out); err != nil {
		return "", err
	}
	return out.ID, nil
}

func (d *docker) containerStart(ctx context.Context, id string) error {
	err := d.do(ctx, http.MethodPost, "/containers/"+id+"/start", nil, nil, nil)
	var de *dockerError
	if errors.As(err, &de) && de.Status == http.StatusNotModified {
		return nil
	}
	return err
}

// containerStop stops with the given grace (then the engine kills).
func (d *docker) containerStop(ctx context.Context, id string, grace time.Duration) error {
	secs := int(grace / time.Second)
	if secs < 0 {
		secs = 0
	}
	sctx, cancel := context.WithTimeout(ctx, grace+30*time.Second)
	defer cancel()
	err := d.do(sctx, http.MethodPost, "/containers/"+id+"/stop", url.Values{"t": {fmt.Sprint(secs)}}, nil, nil)
	var de *dockerError
	if errors.As(err, &de) && de.Status == http.StatusNotModified {
		return nil
	}
	return err
}

func (d *docker) containerRemove(ctx context.Context, id string, withVolumes bool) error {
	q := url.Values{"force": {"1"}}
	if withVolumes {
		q.Set("v", "1")
	}
	err := d.do(ctx, http.MethodDelete, "/containers/"+id, q, nil, nil)
	if isNotFound(err) {
		return nil
	}
	return err
}

type containerState struct {
	Status     string `json:"Status"`
	Running    bool   `json:"Running"`
	Pid        int    `json:"Pid"`
	ExitCode   int    `json:"ExitCode"`
	Error      string `json:"Error"`
	OOMKilled  bool   `json:"OOMKilled"`
	StartedAt  string `json:"StartedAt"`
	FinishedAt string `json:"FinishedAt"`
}

type containerInfo struct {
	ID      string         `json:"Id"`
	Name    string         `json:"Name"`
	Image   string         `json:"Image"`
	State   containerState `json:"State"`
	Created string         `json:"Created"`
	Config  struct {
		Labels map[string]string `json:"Labels"`
		Tty    bool              `json:"Tty"`
	} `json:"Config"`
	NetworkSettings struct {
		Networks map[string]struct {
			IPAddress string `json:"IPAddress"`
		} `json:"Networks"`
	} `json:"NetworkSettings"`
}

func (d *docker) containerInspect(ctx context.Context, id string) (*containerInfo, error) {
	var info containerInfo
	if err := d.do(ctx, http.MethodGet, "/containers/"+id+"/json", nil, nil, &info); err != nil {
		return nil, err
	}
	return &info, nil
}

type containerSummary struct {
	ID     string            `json:"Id"`
	Names  []string          `json:"Names"`
	State  string            `json:"State"`
	Labels map[string]string `json:"Labels"`
}

// containerList lists all containers (running or not) carrying every label.
func (d *docker) containerList(ctx context.Context, labels ...string) ([]containerSummary, error) {
	filters, _ := json.Marshal(map[string][]string{"label": labels})
	var out []containerSummary
	err := d.do(ctx, http.MethodGet, "/containers/json", url.Values{"all": {"1"}, "filters": {string(filters)}}, nil, &out)
	return out, err
}

// containerLogs streams a container's logs; muxed unless the container has a tty.
func (d *docker) containerLogs(ctx context.Context, id string, q url.Values) (io.ReadCloser, error) {
	return d.stream(ctx, "/containers/"+id+"/logs", q)
}

// --- exec -----------------------------------------------------------------

type execCreate struct {
	AttachStdin  bool     `json:"AttachStdin"`
	AttachStdout bool     `json:"AttachStdout"`
	AttachStderr bool     `json:"AttachStderr"`
	Tty          bool     `json:"Tty"`
	Cmd          []string `json:"Cmd"`
}

func (d *docker) execCreate(ctx context.Context, container string, spec execCreate) (string, error) {
	var out struct {
		ID string `json:"Id"`
	}
	if err := d.do(ctx, http.MethodPost, "/containers/"+container+"/exec", nil, spec, &out); err != nil {
		return "", err
	}
	return out.ID, nil
}

type execInfo struct {
	Running  bool `json:"Running"`
	ExitCode int  `json:"ExitCode"`
	Pid      int  `json:"Pid"`
}

func (d *docker) execInspect(ctx context.Context, id string) (*execInfo, error) {
	var info execInfo
	if err := d.do(ctx, http.MethodGet, "/exec/"+id+"/json", nil, nil, &info); err != nil {
		return nil, err
	}
	return &info, nil
}

func (d *docker) execResize(ctx context.Context, id string, width, height uint16) error {
	q := url.Values{"w": {fmt.Sprint(width)}, "h": {fmt.Sprint(height)}}
	return d.do(ctx, http.MethodPost, "/exec/"+id+"/resize", q, nil, nil)
}

// hijacked is the raw two-way stream of a started exec.
type hijacked struct {
	conn net.Conn
	r    *bufio.Reader
}

func (h *hijacked) Read(p []byte) (int, error) { return h.r.Read(p) }

func (h *hijacked) Write(p []byte) (int, error) { return h.conn.Write(p) }

// CloseWrite ends the process's stdin.
func (h *hijacked) CloseWrite() error {
	if cw, ok := h.conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

func (h *hijacked) Close() error { return h.conn.Close() }

// execStart starts an exec and hands back its hijacked connection.
func (d *docker) execStart(ctx context.Context, id string, tty bool) (*hijacked, error) {
	body, err := json.Marshal(map[string]bool{"Detach": false, "Tty": tty})
	if err != nil {
		return nil, err
	}
	var dialer net.Dialer
	dctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	conn, err := dialer.DialContext(dctx, "unix", d.socket)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequest(http.MethodPost, d.url("/exec/"+id+"/start", nil), bytes.NewReader(body))
	if err != nil {
		conn.Close()
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", "tcp")
	_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
	if err := req.Write(conn); err != nil {
		conn.Close()
		return nil, err
	}
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, req)
	if err != nil {
		conn.Close()
		return nil, err
	}
	if resp.StatusCode != http.StatusSwitchingProtocols && resp.StatusCode != http.StatusOK {
		defer conn.Close()
		return nil, readDockerError(resp)
	}
	_ = conn.SetDeadline(time.Time{})
	return &hijacked{conn: conn, r: br}, nil
}

// demux copies Docker's multiplexed stream (8-byte frame headers) to stdout
// and stderr; a nil writer drops its frames.
func demux(src io.Reader, stdout, stderr io.Writer) error {
	var hdr [8]byte
	for {
		if _, err := io.ReadFull(src, hdr[:]); err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
				return nil
			}
			return err
		}
		size := int64(binary.BigEndian.Uint32(hdr[4:]))
		var dst io.Writer
		switch hdr[0] {
		case 0, 1:
			dst = stdout
		case 2:
			dst = stderr
		default:
			dst = nil
		}
		if dst == nil {
			dst = io.Discard
		}
		if _, err := io.CopyN(dst, src, size); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
	}
}

// --- volumes and networks -------------------------------------------------

func (d *docker) volumeCreate(ctx context.Context, name string, labels map[string]string) error {
	return d.do(ctx, http.MethodPost, "/volumes/create", nil, map[string]any{"Name": name, "Labels": labels}, nil)
}

// volumeMountpoint is where the engine keeps a local volume's files on
// this host.
func (d *docker) volumeMountpoint(ctx context.Context, name string) (string, error) {
	var out struct {
		Mountpoint string `json:"Mountpoint"`
	}
	if err := d.do(ctx, http.MethodGet, "/volumes/"+name, nil, nil, &out); err != nil {
		return "", err
	}
	if out.Mountpoint == "" {
		return "", fmt.Errorf("volume %s has no mountpoint", name)
	}
	return out.Mountpoint, nil
}

func (d *docker) volumeRemove(ctx context.Context, name string) error {
	err := d.do(ctx, http.MethodDelete, "/volumes/"+name, url.Values{"force": {"1"}}, nil, nil)
	if isNotFound(err) {
		return nil
	}
	return err
}

func (d *docker) volumeExists(ctx context.Context, name string) (bool, error) {
	err := d.do(ctx, http.MethodGet, "/volumes/"+name, nil, nil, nil)
	if isNotFound(err) {
		return false, nil
	}
	return err == nil, err
}

type volumeSummary struct {
	Name   string            `json:"Name"`
	Labels map[string]string `json:"Labels"`
}

func (d *docker) volumeList(ctx context.Context, labels ...string) ([]volumeSummary, error) {
	filters, _ := json.Marshal(map[string][]string{"label": labels})
	var out struct {
		Volumes []volumeSummary `json:"Volumes"`
	}
	err := d.do(ctx, http.MethodGet, "/volumes", url.Values{"filters": {string(filters)}}, nil, &out)
	return out.Volumes, err
}

// networkEnsure makes the bridge network unless it exists. An isolated one
// is internal (no route out, no outbound NAT) and has no address of the
// host on its bridge, so its containers cannot reach the host either.
func (d *docker) networkEnsure(ctx context.Context, name string, labels map[string]string, isolated bool) error {
	err := d.do(ctx, http.MethodGet, "/networks/"+name, nil, nil, nil)
	if err == nil {
		return nil
	}
	if !isNotFound(err) {
		return err
	}
	body := map[string]any{
		"Name":           name,
		"Driver":         "bridge",
		"CheckDuplicate": true,
		"Labels":         labels,
	}
	if isolated {
		body["Internal"] = true
		body["Options"] = map[string]string{"com.docker.network.bridge.inhibit_ipv4": "true"}
	}
	err = d.do(ctx, http.MethodPost, "/networks/create", nil, body, nil)
	if isConflict(err) {
		return nil
	}
	return err
}

// networkConnect attaches a created container to one more network, with
// the names it answers to there.
func (d *docker) networkConnect(ctx context.Context, network, container string, aliases []string) error {
	return d.do(ctx, http.MethodPost, "/networks/"+network+"/connect", nil, map[string]any{
		"Container":      container,
		"EndpointConfig": endpointSettings{Aliases: aliases},
	}, nil)
}

// networkGateway is the gateway address of a network's (first) subnet.
func (d *docker) networkGateway(ctx context.Context, name string) (string, error) {
	var out struct {
		IPAM struct {
			Config []struct {
				Gateway string `json:"Gateway"`
			} `json:"Config"`
		} `json:"IPAM"`
	}
	if err := d.do(ctx, http.MethodGet, "/networks/"+name, nil, nil, &out); err != nil {
		return "", err
	}
	for _, c := range out.IPAM.Config {
		if c.Gateway != "" {
			return c.Gateway, nil
		}
	}
	return "", fmt.Errorf("network %s has no gateway", name)
}

// networkList names the networks with every one of the labels.
func (d *docker) networkList(ctx context.Context, labels ...string) ([]string, error) {
	filters, _ := json.Marshal(map[string][]string{"label": labels})
	var out []struct {
		Name string `json:"Name"`
	}
	if err := d.do(ctx, http.MethodGet, "/networks", url.Values{"filters": {string(filters)}}, nil, &out); err != nil {
		return nil, err
	}
	names := make([]string, 0, len(out))
	for _, n := range out {
		names = append(names, n.Name)
	}
	return names, nil
}

func (d *docker) networkRemove(ctx context.Context, name string) error {
	err := d.do(ctx, http.MethodDelete, "/networks/"+name, nil, nil, nil)
	if isNotFound(err) {
		return nil
	}
	return err
}
