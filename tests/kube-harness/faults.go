// The front: a TLS reverse proxy before the API server, on a loopback port
// of its own, that answers chosen requests with a chosen failure before
// they reach the server (429 or 503 with Retry-After, say), and records
// every request it saw. Tests point hermes at it (front.kubeconfig, the
// same service account's token) to prove what a client does when a real
// server pushes back: the API server's own priority and fairness cannot
// be made to refuse on cue. A control endpoint, plain HTTP on loopback,
// takes the faults and hands out the record:
//
//	POST /faults    {"method":"GET","path_prefix":"/api/v1/…","count":2,
//	                 "status":429,"retry_after":"1"}   adds a fault
//	GET  /requests  [{"at_ms":…,"method":"GET","path":"/api/…?…","status":429}, …]
//
// A fault answers the next `count` requests whose method and path match,
// with `status`, a Status body of the API's shape and, when set, the
// Retry-After header. Everything else (WebSocket upgrades included) goes
// through unchanged.
package main

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"time"
)

// fault is one planned failure.
type fault struct {
	Method     string `json:"method"`
	PathPrefix string `json:"path_prefix"`
	Count      int    `json:"count"`
	Status     int    `json:"status"`
	RetryAfter string `json:"retry_after"`
}

// seenRequest is one request the front saw, and how it was answered.
type seenRequest struct {
	AtMs   int64  `json:"at_ms"`
	Method string `json:"method"`
	Path   string `json:"path"`
	Status int    `json:"status"`
}

// maxRecorded bounds the record: the oldest requests go first.
const maxRecorded = 10000

type front struct {
	mu      sync.Mutex
	faults  []*fault
	seen    []seenRequest
	proxy   *httputil.ReverseProxy
	server  *http.Server
	control *http.Server
	URL     string
	Control string
}

// startFront serves the front on 127.0.0.1 with a certificate of the
// harness's CA, forwarding to upstream.
func startFront(p *pki, upstream string, logf func(string, ...any)) (*front, error) {
	certPEM, keyPEM, err := p.issue("front", "kube-harness-front", nil, []net.IP{net.ParseIP("127.0.0.1")}, []string{"localhost"}, x509.ExtKeyUsageServerAuth)
	if err != nil {
		return nil, err
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, err
	}
	target, err := url.Parse(upstream)
	if err != nil {
		return nil, err
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(p.caPEM)
	f := &front{}
	f.proxy = httputil.NewSingleHostReverseProxy(target)
	f.proxy.Transport = &http.Transport{
		TLSClientConfig:     &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12},
		ForceAttemptHTTP2:   false,
		MaxIdleConnsPerHost: 64,
		IdleConnTimeout:     90 * time.Second,
	}
	f.proxy.FlushInterval = -1 // watches and exec stream as they come
	l, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{
		Certificates: []tls.Certificate{cert},
		MinVersion:   tls.VersionTLS12,
		NextProtos:   []string{"http/1.1"},
	})
	if err != nil {
		return nil, err
	}
	f.URL = fmt.Sprintf("https://%s", l.Addr().String())
	f.server = &http.Server{
		Handler:           http.HandlerFunc(f.serve),
		ReadHeaderTimeout: 30 * time.Second,
		// HTTP/1.1 only: upgrades (exec) pass through as they are.
		TLSNextProto: map[string]func(*http.Server, *tls.Conn, http.Handler){},
	}
	go func() { _ = f.server.Serve(l) }()

	cl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		f.server.Close()
		return nil, err
	}
	f.Control = fmt.Sprintf("http://%s", cl.Addr().String())
	mux := http.NewServeMux()
	mux.HandleFunc("POST /faults", f.addFault)
	mux.HandleFunc("GET /requests", f.requests)
	f.control = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = f.control.Serve(cl) }()
	logf("front on %s (control %s)", f.URL, f.Control)
	return f, nil
}

func (f *front) stop() {
	_ = f.server.Close()
	_ = f.control.Close()
}

// statusRecorder notes the status a forwarded request got.
type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (s *statusRecorder) WriteHeader(code int) {
	if s.status == 0 {
		s.status = code
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusRecorder) Flush() {
	if fl, ok := s.ResponseWriter.(http.Flusher); ok {
		fl.Flush()
	}
}

// Unwrap lets the reverse proxy reach the connection for an upgrade.
func (s *statusRecorder) Unwrap() http.ResponseWriter { return s.ResponseWriter }

func (f *front) serve(w http.ResponseWriter, r *http.Request) {
	path := r.URL.RequestURI()
	if ft := f.take(r.Method, r.URL.Path); ft != nil {
		f.record(r.Method, path, ft.Status)
		if ft.RetryAfter != "" {
			w.Header().Set("Retry-After", ft.RetryAfter)
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(ft.Status)
		reason := map[int]string{429: "TooManyRequests", 503: "ServiceUnavailable", 504: "Timeout", 500: "InternalError"}[ft.Status]
		_ = json.NewEncoder(w).Encode(map[string]any{
			"kind": "Status", "apiVersion": "v1", "status": "Failure",
			"message": "the harness's front refused this request on purpose",
			"reason":  reason, "code": ft.Status,
		})
		return
	}
	rec := &statusRecorder{ResponseWriter: w}
	f.proxy.ServeHTTP(rec, r)
	status := rec.status
	if status == 0 {
		status = http.StatusOK
	}
	f.record(r.Method, path, status)
}

// take consumes one use of the first fault matching the request.
func (f *front) take(method, path string) *fault {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i, ft := range f.faults {
		if (ft.Method == "" || strings.EqualFold(ft.Method, method)) && strings.HasPrefix(path, ft.PathPrefix) {
			ft.Count--
			if ft.Count <= 0 {
				f.faults = append(f.faults[:i], f.faults[i+1:]...)
			}
			c := *ft
			return &c
		}
	}
	return nil
}

func (f *front) record(method, path string, status int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.seen) >= maxRecorded {
		f.seen = f.seen[1:]
	}
	f.seen = append(f.seen, seenRequest{AtMs: time.Now().UnixMilli(), Method: method, Path: path, Status: status})
}

func (f *front) addFault(w http.ResponseWriter, r *http.Request) {
	var ft fault
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<16)).Decode(&ft); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if ft.Count <= 0 || ft.Status < 400 || ft.Status > 599 || !strings.HasPrefix(ft.PathPrefix, "/") {
		http.Error(w, "a fault needs count > 0, a status of 400-599 and a path_prefix starting with /", http.StatusBadRequest)
		return
	}
	f.mu.Lock()
	f.faults = append(f.faults, &ft)
	f.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

func (f *front) requests(w http.ResponseWriter, _ *http.Request) {
	f.mu.Lock()
	out := append([]seenRequest(nil), f.seen...)
	f.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(out)
}
