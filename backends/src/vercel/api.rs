//! The Vercel Sandbox request and answer bodies hermes uses, and the pure
//! parts: credentials from an OIDC token's claims, resources, the NDJSON
//! log lines, the gzipped tar of a file write.

use std::collections::BTreeMap;
use std::io::Write as _;

use base64::Engine as _;
use serde::{Deserialize, Serialize};

use crate::cloud::{CloudSpec, CloudState};

/// The runtimes Vercel Sandbox offers.
pub const RUNTIMES: &[&str] = &["node24", "node22", "python3.13"];

/// The sandbox's working directory, where relative paths resolve.
pub const SANDBOX_CWD: &str = "/vercel/sandbox";

/// The shortest lifetime hermes asks for (the service's default).
pub const MIN_TIMEOUT_MS: u64 = 5 * 60 * 1000;

/// Memory comes with vCPUs: 2048 MB each.
pub const MB_PER_VCPU: u64 = 2048;

/// The most vCPUs a sandbox can have.
pub const MAX_VCPUS: u64 = 8;

/// The team and project an OIDC token is for (its `owner_id` and
/// `project_id` claims, read without verifying: the service verifies).
pub fn oidc_claims(token: &str) -> Option<(String, Option<String>)> {
    let mut parts = token.split('.');
    let (_, payload, _) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() {
        return None;
    }
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .ok()?;
    #[derive(Deserialize)]
    struct Claims {
        owner_id: Option<String>,
        project_id: Option<String>,
    }
    let claims: Claims = serde_json::from_slice(&bytes).ok()?;
    Some((claims.owner_id?, claims.project_id))
}

/// vCPUs for `cpu` and `memory_mb` (memory comes 2048 MB per vCPU): the
/// larger need, 1 to [`MAX_VCPUS`].
pub fn vcpus(cpu: f64, memory_mb: u64) -> u64 {
    let for_cpu = if cpu.is_finite() && cpu > 1.0 {
        // Bounded and positive: the cast cannot wrap.
        cpu.ceil().min(MAX_VCPUS as f64) as u64
    } else {
        1
    };
    for_cpu
        .max(memory_mb.div_ceil(MB_PER_VCPU))
        .clamp(1, MAX_VCPUS)
}

/// `POST /v1/sandboxes`.
#[derive(Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CreateSandbox {
    pub project_id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub runtime: Option<String>,
    /// Milliseconds the sandbox lives.
    pub timeout: u64,
    pub resources: Resources,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<Source>,
    /// Only with header transforms: otherwise the service's default
    /// (`allow-all`) is left alone.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub network_policy: Option<NetworkPolicy>,
}

/// The create request's `networkPolicy` as the REST API defines it (what
/// `@vercel/sandbox`'s `toAPINetworkPolicy` sends): mode `custom`, the
/// allowed domains (`*` keeps every other host reachable, as before) and
/// one `injectionRules` entry per provider host, whose `headers` the
/// firewall sets on the sandbox's HTTPS requests to that domain. The
/// service answers with the header names only.
#[derive(Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NetworkPolicy {
    pub mode: &'static str,
    pub allowed_domains: Vec<String>,
    pub injection_rules: Vec<InjectionRule>,
}

#[derive(Serialize, PartialEq)]
pub struct InjectionRule {
    pub domain: String,
    /// Header name → value; a value is a real key.
    pub headers: BTreeMap<String, String>,
}

impl std::fmt::Debug for NetworkPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let rules: Vec<(&str, Vec<&str>)> = self
            .injection_rules
            .iter()
            .map(|r| {
                (
                    r.domain.as_str(),
                    r.headers.keys().map(String::as_str).collect(),
                )
            })
            .collect();
        f.debug_struct("NetworkPolicy")
            .field("mode", &self.mode)
            .field("allowed_domains", &self.allowed_domains)
            .field("injection_rules", &rules)
            .finish()
    }
}

impl NetworkPolicy {
    /// The policy for `transforms`, none without any.
    pub fn for_transforms(
        transforms: &[hermes_model::cloud::HeaderTransform],
    ) -> Option<NetworkPolicy> {
        if transforms.is_empty() {
            return None;
        }
        let mut rules: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
        for t in transforms {
            rules
                .entry(t.host.clone())
                .or_default()
                .insert(t.header.clone(), t.value.clone());
        }
        let mut allowed_domains: Vec<String> = rules.keys().cloned().collect();
        allowed_domains.push("*".to_string());
        Some(NetworkPolicy {
            mode: "custom",
            allowed_domains,
            injection_rules: rules
                .into_iter()
                .map(|(domain, headers)| InjectionRule { domain, headers })
                .collect(),
        })
    }
}

#[derive(Debug, Serialize, PartialEq)]
pub struct Resources {
    pub vcpus: u64,
}

#[derive(Debug, Serialize, PartialEq)]
#[serde(tag = "type", rename_all = "camelCase")]
pub enum Source {
    #[serde(rename = "snapshot", rename_all = "camelCase")]
    Snapshot { snapshot_id: String },
}

impl CreateSandbox {
    pub fn new(project_id: &str, spec: &CloudSpec, snapshot: Option<&str>) -> CreateSandbox {
        let timeout = u64::try_from(spec.lifetime.as_millis())
            .unwrap_or(u64::MAX)
            .max(MIN_TIMEOUT_MS);
        CreateSandbox {
            project_id: project_id.to_owned(),
            // A snapshot brings its runtime.
            runtime: snapshot.is_none().then(|| spec.image.clone()),
            timeout,
            resources: Resources {
                vcpus: vcpus(spec.cpu, spec.memory_mb),
            },
            source: snapshot.map(|id| Source::Snapshot {
                snapshot_id: id.to_owned(),
            }),
            network_policy: NetworkPolicy::for_transforms(&spec.transforms),
        }
    }
}

/// A sandbox as the service describes it (what hermes reads).
#[derive(Debug, Deserialize)]
pub struct Sandbox {
    pub id: String,
    pub status: String,
}

impl Sandbox {
    /// The status in the driver's words: `running`; `pending`,
    /// `stopping` and `snapshotting` are the service at work; `stopped` and
    /// `failed` are over (a stopped Vercel sandbox cannot start again: it
    /// can only be replaced, from its snapshot). A status this client does
    /// not know is left alone as pending rather than replaced.
    pub fn cloud_state(&self) -> CloudState {
        match self.status.as_str() {
            "running" => CloudState::Running,
            "stopped" | "failed" => CloudState::Dead,
            _ => CloudState::Pending,
        }
    }
}

/// `{ "sandbox": … }`.
#[derive(Debug, Deserialize)]
pub struct SandboxResponse {
    pub sandbox: Sandbox,
}

/// `POST /v1/sandboxes/{id}/snapshot`.
#[derive(Debug, Deserialize)]
pub struct SnapshotResponse {
    pub snapshot: Snapshot,
}

#[derive(Debug, Deserialize)]
pub struct Snapshot {
    pub id: String,
}

/// `POST /v1/sandboxes/{id}/cmd`.
#[derive(Debug, Serialize)]
pub struct RunCommand {
    pub command: String,
    pub args: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    pub env: BTreeMap<String, String>,
    pub sudo: bool,
}

/// `{ "command": … }`.
#[derive(Debug, Deserialize)]
pub struct CommandResponse {
    pub command: Command,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Command {
    pub id: String,
    #[serde(default)]
    pub exit_code: Option<i64>,
}

/// One line of a command's log stream.
#[derive(Debug, Deserialize, PartialEq, Eq)]
#[serde(tag = "stream", content = "data", rename_all = "lowercase")]
pub enum LogLine {
    Stdout(String),
    Stderr(String),
    Error { code: String, message: String },
}

/// Cuts a byte stream into NDJSON lines.
#[derive(Debug, Default)]
pub struct Lines {
    buf: Vec<u8>,
}

impl Lines {
    /// The whole lines `bytes` completes (blank lines skipped).
    pub fn push(&mut self, bytes: &[u8]) -> Vec<Vec<u8>> {
        self.buf.extend_from_slice(bytes);
        let mut out = Vec::new();
        while let Some(at) = self.buf.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = self.buf.drain(..=at).collect();
            let line = line.trim_ascii();
            if !line.is_empty() {
                out.push(line.to_vec());
            }
        }
        out
    }

    /// A last line without its newline.
    pub fn finish(&mut self) -> Option<Vec<u8>> {
        let rest = std::mem::take(&mut self.buf);
        let rest = rest.trim_ascii();
        (!rest.is_empty()).then(|| rest.to_vec())
    }
}

/// Where a file write extracts (`x-cwd`) and the tar entry's name.
pub fn tar_target(path: &str) -> (String, String) {
    match path.strip_prefix('/') {
        Some(rest) => ("/".to_owned(), rest.to_owned()),
        None => (SANDBOX_CWD.to_owned(), path.to_owned()),
    }
}

/// A gzipped tar holding one file `name`, mode 0644.
pub fn gzipped_tar(name: &str, contents: &[u8]) -> std::io::Result<Vec<u8>> {
    let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    let mut tar = tar::Builder::new(gz);
    let mut header = tar::Header::new_gnu();
    header.set_size(contents.len() as u64);
    header.set_mode(0o644);
    header.set_entry_type(tar::EntryType::Regular);
    header.set_mtime(0);
    tar.append_data(&mut header, name, contents)?;
    let mut gz = tar.into_inner()?;
    gz.flush()?;
    gz.finish()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::io::Read as _;
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_status_is_replaced_only_when_it_is_over() {
        let state = |status: &str| {
            Sandbox {
                id: "sbx".into(),
                status: status.into(),
            }
            .cloud_state()
        };
        assert_eq!(state("running"), CloudState::Running);
        for s in ["pending", "stopping", "snapshotting", "a-status-from-later"] {
            assert_eq!(state(s), CloudState::Pending, "{s}");
        }
        for s in ["stopped", "failed"] {
            assert_eq!(state(s), CloudState::Dead, "{s}");
        }
    }

    fn spec() -> CloudSpec {
        CloudSpec {
            task: "t".to_owned(),
            profile: "p".to_owned(),
            image: "node24".to_owned(),
            cpu: 1.0,
            memory_mb: 5120,
            disk_mb: 1,
            lifetime: Duration::from_secs(60),
            env: Vec::new(),
            transforms: Vec::new(),
        }
    }

    #[test]
    fn claims_of_an_oidc_token() {
        let payload = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .encode(r#"{"owner_id":"team_1","project_id":"prj_2","sub":"x"}"#);
        assert_eq!(
            oidc_claims(&format!("h.{payload}.s")),
            Some(("team_1".to_owned(), Some("prj_2".to_owned())))
        );
        assert_eq!(oidc_claims("not-a-jwt"), None);
        assert_eq!(oidc_claims("a.b.c"), None);
    }

    #[test]
    fn vcpus_cover_cpu_and_memory() {
        assert_eq!(vcpus(1.0, 2048), 1);
        assert_eq!(vcpus(1.0, 5120), 3);
        assert_eq!(vcpus(2.5, 1024), 3);
        assert_eq!(vcpus(64.0, 1), MAX_VCPUS);
        assert_eq!(vcpus(f64::NAN, 0), 1);
    }

    #[test]
    fn create_bodies() {
        let body = serde_json::to_value(CreateSandbox::new("prj", &spec(), None)).unwrap();
        assert_eq!(body["projectId"], "prj");
        assert_eq!(body["runtime"], "node24");
        assert_eq!(body["timeout"], MIN_TIMEOUT_MS);
        assert_eq!(body["resources"]["vcpus"], 3);
        assert!(body.get("source").is_none());
        let body =
            serde_json::to_value(CreateSandbox::new("prj", &spec(), Some("snap_1"))).unwrap();
        assert_eq!(
            body["source"],
            serde_json::json!({ "type": "snapshot", "snapshotId": "snap_1" })
        );
        assert!(body.get("runtime").is_none());
        assert!(body.get("networkPolicy").is_none());
        // Transforms become the network policy's injection rules.
        let mut with = spec();
        with.transforms = hermes_model::cloud::service_side(
            hermes_model::config::Backend::VercelSandbox,
            &[("OPENROUTER_API_KEY".to_string(), "sk-or-real".to_string())],
            &|p| Some(format!("{p}-token")),
        )
        .1;
        let create = CreateSandbox::new("prj", &with, None);
        assert!(!format!("{create:?}").contains("sk-or-real"));
        let body = serde_json::to_value(create).unwrap();
        assert_eq!(
            body["networkPolicy"],
            serde_json::json!({
                "mode": "custom",
                "allowedDomains": ["*.openrouter.ai", "openrouter.ai", "*"],
                "injectionRules": [
                    { "domain": "*.openrouter.ai", "headers": { "authorization": "Bearer sk-or-real" } },
                    { "domain": "openrouter.ai", "headers": { "authorization": "Bearer sk-or-real" } },
                ],
            })
        );
    }

    #[test]
    fn ndjson_lines_across_chunks() {
        let mut lines = Lines::default();
        assert!(lines.push(br#"{"stream":"stdout","da"#).is_empty());
        let got = lines.push(b"ta\":\"a\\n\"}\n\n{\"stream\":\"stderr\",\"data\":\"b\"}\n{\"str");
        let parsed: Vec<LogLine> = got
            .iter()
            .map(|l| serde_json::from_slice(l).unwrap())
            .collect();
        assert_eq!(
            parsed,
            vec![
                LogLine::Stdout("a\n".to_owned()),
                LogLine::Stderr("b".to_owned())
            ]
        );
        assert_eq!(lines.finish(), Some(br#"{"str"#.to_vec()));
        let error: LogLine = serde_json::from_str(
            r#"{"stream":"error","data":{"code":"sandbox_stopped","message":"gone"}}"#,
        )
        .unwrap();
        assert_eq!(
            error,
            LogLine::Error {
                code: "sandbox_stopped".to_owned(),
                message: "gone".to_owned()
            }
        );
    }

    #[test]
    fn one_file_tars() {
        assert_eq!(tar_target("/etc/x"), ("/".to_owned(), "etc/x".to_owned()));
        assert_eq!(
            tar_target("a/b"),
            (SANDBOX_CWD.to_owned(), "a/b".to_owned())
        );
        let gz = gzipped_tar("a/b.txt", b"hi").unwrap();
        let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(&gz[..]));
        let mut entries = archive.entries().unwrap();
        let mut entry = entries.next().unwrap().unwrap();
        assert_eq!(entry.path().unwrap().to_str(), Some("a/b.txt"));
        let mut body = String::new();
        entry.read_to_string(&mut body).unwrap();
        assert_eq!(body, "hi");
        assert!(entries.next().is_none());
    }
}
