//! A real Kubernetes API server for the tests: the harness of
//! `tests/kube-harness/` (kube-apiserver and etcd of k8s.io/kubernetes in
//! one process, real TLS, authentication and RBAC, and a node agent that
//! runs each bound Pod as a container of the test engine and serves the
//! kubelet's exec API). `scripts/test` builds it and exports
//! [`HARNESS_ENV`]; without it a test panics saying so, never skips.
//!
//! Each [`Harness`] is a server of its own in a temporary directory,
//! stopped (its containers and volumes removed) when it is dropped: its
//! standard input closes, which the harness reads as the end.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::Duration;

/// The variable naming the harness binary.
pub const HARNESS_ENV: &str = "HERMES_KUBE_HARNESS";

/// How long a harness may take to be ready (etcd, the API server, RBAC,
/// the node).
const READY_TIMEOUT: Duration = Duration::from_secs(180);

/// One running API server.
#[derive(Debug)]
pub struct Harness {
    child: Child,
    stdin: Option<ChildStdin>,
    /// The harness's directory (kubeconfigs, its log).
    pub dir: tempfile::TempDir,
    pub server: String,
    /// A cluster-admin kubeconfig, for what a test sets up or checks.
    pub admin_kubeconfig: PathBuf,
    /// The service account hermes runs as: only the verbs the README lists.
    pub hermes_kubeconfig: PathBuf,
    /// The namespace that service account may use.
    pub namespace: String,
    /// That service account through the harness's front, which fails the
    /// requests a test chooses ([`Harness::fail_next`]).
    pub front_kubeconfig: PathBuf,
    front_control: String,
    /// The Docker network the Pods' containers join.
    pub pod_network: String,
}

/// One request the front saw, and the status it got.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct SeenRequest {
    /// When it came (Unix milliseconds).
    pub at_ms: i64,
    pub method: String,
    /// Its path and query.
    pub path: String,
    pub status: u16,
}

#[derive(serde::Deserialize)]
struct Ready {
    ready: bool,
    server: String,
    admin_kubeconfig: PathBuf,
    hermes_kubeconfig: PathBuf,
    namespace: String,
    front_kubeconfig: PathBuf,
    front_control: String,
    pod_network: String,
}

/// The harness binary, from [`HARNESS_ENV`].
///
/// # Panics
///
/// When the variable is not set or names no file.
pub fn harness_binary() -> PathBuf {
    let path = std::env::var_os(HARNESS_ENV)
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            panic!(
                "{HARNESS_ENV} is not set: the kubernetes tests need the API server harness; \
             run scripts/test, which builds it (tests/kube-harness, Go 1.26)"
            )
        });
    assert!(
        path.is_file(),
        "{HARNESS_ENV}={} is not a file: run scripts/kube-harness-build",
        path.display()
    );
    path
}

impl Harness {
    /// Starts a harness and waits until it is ready.
    ///
    /// # Panics
    ///
    /// When it cannot start or is not ready within its time; the panic
    /// holds the end of its log.
    pub fn start() -> Harness {
        Harness::start_with(&[])
    }

    /// A harness that also runs agent-sandbox's controller and the garbage
    /// collector (`serve --agent-sandbox`).
    pub fn with_agent_sandbox() -> Harness {
        Harness::start_with(&["--agent-sandbox"])
    }

    fn start_with(flags: &[&str]) -> Harness {
        let dir = tempfile::Builder::new()
            .prefix("hermes-kube-")
            .tempdir()
            .unwrap_or_else(|e| panic!("a directory for the harness: {e}"));
        let log = std::fs::File::create(dir.path().join("harness.log"))
            .unwrap_or_else(|e| panic!("the harness log: {e}"));
        let mut child = Command::new(harness_binary())
            .arg("serve")
            .arg("--dir")
            .arg(dir.path())
            .args(flags)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("the harness starts: {e}"));
        let stdin = child.stdin.take();
        let stdout = child
            .stdout
            .take()
            .unwrap_or_else(|| panic!("the harness's stdout"));
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let line = rx.recv_timeout(READY_TIMEOUT).unwrap_or_default();
        let ready: Option<Ready> = serde_json::from_str(line.trim()).ok();
        let Some(ready) = ready.filter(|r| r.ready) else {
            let _ = child.kill();
            let _ = child.wait();
            let log = std::fs::read_to_string(dir.path().join("harness.log")).unwrap_or_default();
            let tail: String = log
                .lines()
                .rev()
                .take(40)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect::<Vec<_>>()
                .join("\n");
            panic!("the kube harness was not ready (first line {line:?}); its log ends:\n{tail}");
        };
        Harness {
            child,
            stdin,
            dir,
            server: ready.server,
            admin_kubeconfig: ready.admin_kubeconfig,
            hermes_kubeconfig: ready.hermes_kubeconfig,
            namespace: ready.namespace,
            front_kubeconfig: ready.front_kubeconfig,
            front_control: ready.front_control,
            pod_network: ready.pod_network,
        }
    }

    /// The host's address on the Pods' network (its bridge's gateway):
    /// where a test's own server is reached from a Pod that may leave it.
    pub fn pod_gateway(&self) -> std::net::IpAddr {
        let out = crate::docker_cli::docker(&[
            "network",
            "inspect",
            "-f",
            "{{range .IPAM.Config}}{{.Gateway}} {{end}}",
            &self.pod_network,
        ]);
        out.split_whitespace()
            .find_map(|a| a.parse::<std::net::Ipv4Addr>().ok())
            .map(std::net::IpAddr::V4)
            .unwrap_or_else(|| panic!("no IPv4 gateway on {}: {out:?}", self.pod_network))
    }

    /// Makes the front answer the next `count` requests of `method` whose
    /// path starts with `path_prefix` with `status` (and `Retry-After:
    /// retry_after` when given), before they reach the server.
    ///
    /// # Panics
    ///
    /// When the front does not take it.
    pub fn fail_next(
        &self,
        method: &str,
        path_prefix: &str,
        count: u32,
        status: u16,
        retry_after: Option<&str>,
    ) {
        let body = serde_json::json!({
            "method": method,
            "path_prefix": path_prefix,
            "count": count,
            "status": status,
            "retry_after": retry_after.unwrap_or(""),
        });
        let (code, text) = self.control("POST", "/faults", &body.to_string());
        assert_eq!(code, 204, "the front refused the fault: {text}");
    }

    /// Every request the front saw, oldest first.
    pub fn front_requests(&self) -> Vec<SeenRequest> {
        let (code, text) = self.control("GET", "/requests", "");
        assert_eq!(code, 200, "the front's record: {text}");
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("the front's record: {e}: {text}"))
    }

    /// One plain HTTP/1.0 request to the front's loopback control port:
    /// (status, body).
    fn control(&self, method: &str, path: &str, body: &str) -> (u16, String) {
        use std::io::{Read, Write};
        let addr = self
            .front_control
            .strip_prefix("http://")
            .unwrap_or(&self.front_control);
        let mut conn = std::net::TcpStream::connect(addr)
            .unwrap_or_else(|e| panic!("the front's control at {addr}: {e}"));
        conn.set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap_or_else(|e| panic!("a read timeout: {e}"));
        write!(
            conn,
            "{method} {path} HTTP/1.0\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap_or_else(|e| panic!("to the front's control: {e}"));
        let mut answer = String::new();
        conn.read_to_string(&mut answer)
            .unwrap_or_else(|e| panic!("from the front's control: {e}"));
        let code = answer
            .split(' ')
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        let text = answer
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_string())
            .unwrap_or_default();
        (code, text)
    }

    /// [`Harness::config`] through the front.
    pub fn front_config(&self, extra: &str) -> String {
        self.config(extra).replace(
            &self.hermes_kubeconfig.display().to_string(),
            &self.front_kubeconfig.display().to_string(),
        )
    }

    /// The config.yaml lines of the kubernetes backend on this server, as
    /// the `hermes` service account, `extra` appended under `terminal:`.
    pub fn config(&self, extra: &str) -> String {
        format!(
            "terminal:\n  backend: kubernetes\n  kubernetes_kubeconfig: {}\n  kubernetes_namespace: {}\n  kubernetes_image: {}\n  kubernetes_cpu: 0.5\n  kubernetes_memory: 256\n  kubernetes_disk: 64\n{extra}",
            self.hermes_kubeconfig.display(),
            self.namespace,
            crate::test_image()
        )
    }

    /// A request as the cluster admin: `method` on `path` with a JSON
    /// `body` (or none), its answer as JSON.
    ///
    /// # Panics
    ///
    /// When the server refuses it.
    pub fn admin(
        &self,
        method: &str,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> serde_json::Value {
        self.try_admin(method, path, body)
            .unwrap_or_else(|e| panic!("{method} {path}: {e}"))
    }

    /// [`Harness::admin`], the server's refusal as an error (its code
    /// first: `404 …`).
    pub fn try_admin(
        &self,
        method: &str,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> Result<serde_json::Value, String> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap_or_else(|e| panic!("a runtime: {e}"));
        rt.block_on(async {
            let kc = kube::config::Kubeconfig::read_from(&self.admin_kubeconfig)
                .unwrap_or_else(|e| panic!("admin kubeconfig: {e}"));
            let config = kube::Config::from_custom_kubeconfig(
                kc,
                &kube::config::KubeConfigOptions::default(),
            )
            .await
            .unwrap_or_else(|e| panic!("admin config: {e}"));
            let client =
                kube::Client::try_from(config).unwrap_or_else(|e| panic!("admin client: {e}"));
            let body = body.map(|b| b.to_string().into_bytes()).unwrap_or_default();
            let req = http::Request::builder()
                .method(method)
                .uri(path)
                .header("content-type", "application/json")
                .body(body)
                .unwrap_or_else(|e| panic!("a request: {e}"));
            client
                .request::<serde_json::Value>(req)
                .await
                .map_err(|e| match e {
                    kube::Error::Api(s) => format!("{} {}", s.code, s.message),
                    other => other.to_string(),
                })
        })
    }

    /// `GET path` as the admin.
    pub fn admin_get(&self, path: &str) -> serde_json::Value {
        self.admin("GET", path, None)
    }

    /// What the admin reads at `path` once `cond` holds of it (asked every
    /// 300 ms, for two minutes at most; a refusal reads as
    /// `{"error": …}`).
    ///
    /// # Panics
    ///
    /// When it never holds, saying `what` and the last answer.
    pub fn wait_for(
        &self,
        path: &str,
        what: &str,
        cond: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        let deadline = std::time::Instant::now() + Duration::from_secs(120);
        loop {
            let got = self
                .try_admin("GET", path, None)
                .unwrap_or_else(|e| serde_json::json!({ "error": e }));
            if cond(&got) {
                return got;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{what} never came: {got}"
            );
            std::thread::sleep(Duration::from_millis(300));
        }
    }

    /// The names of the objects at `path` (a list), with their uids.
    pub fn names(&self, path: &str) -> Vec<(String, String)> {
        let list = self.admin_get(path);
        list["items"]
            .as_array()
            .map(|items| {
                items
                    .iter()
                    .map(|i| {
                        (
                            i["metadata"]["name"]
                                .as_str()
                                .unwrap_or_default()
                                .to_string(),
                            i["metadata"]["uid"]
                                .as_str()
                                .unwrap_or_default()
                                .to_string(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default()
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        // Its input closed is its end: it removes what it made.
        drop(self.stdin.take());
        for _ in 0..300 {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The image the egress proxy's Pod runs in the tests: the test image with
/// the `hermes` binary under test on its `PATH` (its debug symbols
/// stripped), built once per test process.
///
/// # Panics
///
/// When the image cannot be built.
pub fn proxy_image() -> String {
    static IMAGE: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    IMAGE
        .get_or_init(|| {
            let image = "hermes-test-proxy:local".to_string();
            let context = tempfile::tempdir().unwrap_or_else(|e| panic!("a build context: {e}"));
            let bin = context.path().join("hermes");
            let out = Command::new("objcopy")
                .arg("--strip-debug")
                .arg(crate::cli::hermes_bin())
                .arg(&bin)
                .output()
                .unwrap_or_else(|e| panic!("objcopy: {e}"));
            assert!(
                out.status.success(),
                "objcopy --strip-debug: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            std::fs::write(
                context.path().join("Dockerfile"),
                format!(
                    "FROM {}\nCOPY hermes /usr/local/bin/hermes\n",
                    crate::test_image()
                ),
            )
            .unwrap_or_else(|e| panic!("the Dockerfile: {e}"));
            let dir = context.path().display().to_string();
            crate::docker_cli::docker(&["build", "-q", "-t", &image, &dir]);
            image
        })
        .clone()
}
