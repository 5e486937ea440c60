//! The `hermes egress status` report: whether the proxy is set up and
//! running, where it listens, its counters, each provider's token (masked
//! unless asked) and whether the running proxy holds its real key (asked
//! of the proxy, not read from this process's environment), how each
//! credential is kept out of the sandboxes (the proxy's header swap) or
//! why it is not (uncovered). [`EgressStatus`] is built once; its JSON form
//! is its `Serialize`, its text form its `Display`.

use std::fmt;

use hermes_egress::tokens::{self, MappingsFile, TokensFile};
use hermes_model::config::Config;
use hermes_model::desired::HostEnv;
use serde::{Serialize, Serializer};

use super::daemon::{is_proxy_process, read_pid};
use super::files::{Paths, load_ca, read_config, read_file};
use super::health::{self, Counters};
use crate::home::Home;

/// The report.
#[derive(Debug, Clone, Serialize)]
pub struct EgressStatus {
    #[serde(rename = "enabled")]
    pub enabled: bool,
    /// This binary.
    #[serde(rename = "binary")]
    pub binary: String,
    #[serde(rename = "binary_version")]
    pub binary_version: String,
    /// `config.json`, when it is there.
    #[serde(rename = "config")]
    pub config: Option<String>,
    /// `ca.crt`, when the CA loads.
    #[serde(rename = "ca_cert")]
    pub ca_cert: Option<String>,
    #[serde(rename = "tunnel_port")]
    pub tunnel_port: u16,
    #[serde(rename = "process")]
    pub process: Process,
    #[serde(rename = "running")]
    pub running: bool,
    /// Where the running proxy says it accepts CONNECT; empty when none
    /// answers.
    #[serde(rename = "listening")]
    pub listening: Vec<String>,
    /// Transparent egress: where the running proxy's DNS responder
    /// listens (the network's ports 443, 80 and 53 lead to the proxy).
    #[serde(rename = "transparent")]
    pub transparent: Option<String>,
    #[serde(rename = "credential_source")]
    pub credential_source: String,
    #[serde(rename = "docker_enforce")]
    pub docker_enforce: bool,
    #[serde(rename = "uncovered_backends")]
    pub uncovered_backends: Vec<Uncovered>,
    /// The running proxy's counters, when it answers.
    #[serde(rename = "counters")]
    pub counters: Option<Counters>,
    #[serde(rename = "tokens")]
    pub tokens: Vec<TokenRow>,
    /// Per credential, how it is covered.
    #[serde(rename = "credentials")]
    pub credentials: Vec<CredentialRow>,
    /// Text: every provider and credential, not only what matters here
    /// (`--all`).
    #[serde(skip)]
    pub all: bool,
    #[serde(rename = "warnings")]
    pub warnings: Vec<String>,
}

/// The daemon's process, as the pid file and `/proc` say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Process {
    Running {
        pid: i32,
    },
    /// The pid file names a process that is not the proxy.
    Stale {
        pid: i32,
    },
    NotRunning,
}

impl fmt::Display for Process {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Process::Running { pid } => write!(f, "running (pid {pid})"),
            Process::Stale { pid } => write!(f, "not running (stale pid file naming {pid})"),
            Process::NotRunning => f.write_str("not running"),
        }
    }
}

/// In JSON, `{"state": "running" | "stale" | "not_running", "pid"}`.
impl Serialize for Process {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let (state, pid) = match *self {
            Process::Running { pid } => ("running", Some(pid)),
            Process::Stale { pid } => ("stale", Some(pid)),
            Process::NotRunning => ("not_running", None),
        };
        let mut out = serializer.serialize_struct("Process", 2)?;
        out.serialize_field("state", state)?;
        out.serialize_field("pid", &pid)?;
        out.end()
    }
}

/// A backend whose sandboxes the proxy cannot stand in front of.
#[derive(Debug, Clone, Serialize)]
pub struct Uncovered {
    #[serde(rename = "backend")]
    pub backend: String,
    /// The real keys config.yaml forwards into its sandboxes.
    #[serde(rename = "forwarded_keys")]
    pub forwarded_keys: Vec<String>,
}

/// One provider.
#[derive(Debug, Clone, Serialize)]
pub struct TokenRow {
    #[serde(rename = "provider")]
    pub provider: String,
    /// The variables a sandbox gets the token in.
    #[serde(rename = "env")]
    pub env: Vec<String>,
    /// The token, masked unless `--show-tokens`.
    #[serde(rename = "token")]
    pub token: Option<String>,
    /// The variable the running proxy's real key came from.
    #[serde(rename = "key")]
    pub key: Option<String>,
    /// Whether the running proxy holds a real key (it refuses the
    /// provider's requests without one); `None` when no running proxy
    /// answered. Asked of the proxy, never read from this process's
    /// environment.
    #[serde(rename = "key_loaded")]
    pub key_loaded: Option<bool>,
}

/// How a credential is kept out of the sandboxes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Coverage {
    /// The sandbox holds a token; the proxy puts the real key in its
    /// place (a header or the query), towards the provider's hosts only.
    HeaderSwap,
    /// The sandbox signs with a placeholder AWS key pair; the proxy
    /// checks that signature and signs the request again with the real
    /// pair, towards the AWS hosts only.
    #[serde(rename = "sigv4-resign")]
    SigV4Resign,
    /// The sandbox holds a token; the proxy puts an access token it
    /// minted from the host's Google service account in its place.
    OauthMinting,
    /// Forwarded to a Vercel sandbox as a token; Vercel's network policy
    /// sets the real key's header towards the provider's hosts.
    #[serde(rename = "service-side-transform-vercel")]
    ServiceTransformVercel,
    /// Forwarded to a Modal sandbox as a token; Modal's outbound policy
    /// sets the real key's header towards the provider's hosts.
    #[serde(rename = "service-side-transform-modal")]
    ServiceTransformModal,
    /// Nothing stands in for it: it is not passed to sandboxes behind
    /// the proxy, or it goes into a sandbox that reaches the internet
    /// directly.
    Uncovered,
}

impl fmt::Display for Coverage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Coverage::HeaderSwap => "header swap",
            Coverage::SigV4Resign => "SigV4 re-sign",
            Coverage::OauthMinting => "OAuth minting",
            Coverage::ServiceTransformVercel => "service-side transform (vercel)",
            Coverage::ServiceTransformModal => "service-side transform (modal)",
            Coverage::Uncovered => "uncovered",
        })
    }
}

/// One credential variable and its coverage.
#[derive(Debug, Clone, Serialize)]
pub struct CredentialRow {
    /// The variable holding it on the host.
    #[serde(rename = "credential")]
    pub credential: String,
    /// The provider whose key it is, for a provider key.
    #[serde(rename = "provider")]
    pub provider: Option<String>,
    #[serde(rename = "coverage")]
    pub coverage: Coverage,
    /// Where the key is put, or why it is uncovered.
    #[serde(rename = "detail")]
    pub detail: String,
    /// Whether the variable is set on this host (its environment or
    /// `.env`).
    #[serde(rename = "set_on_host")]
    pub set_on_host: bool,
}

/// The coverage of every credential: each provider key variable (swapped
/// where its clients carry it; uncovered where config.yaml forwards it to
/// a cloud backend), then the credentials no swap can stand in for.
fn credential_rows(
    mappings: &MappingsFile,
    uncovered_backends: &[(hermes_model::config::Backend, Vec<String>)],
    service_covered: &[(hermes_model::config::Backend, Vec<String>)],
    env: &HostEnv,
) -> Vec<CredentialRow> {
    use hermes_model::config::Backend;
    let mut rows = Vec::new();
    for m in &mappings.mappings {
        let places: Vec<String> = m
            .places
            .iter()
            .map(|p| match p {
                tokens::Place::Query(name) => format!("?{name}= query"),
                other => other.to_string(),
            })
            .collect();
        let sigv4 = m.places.contains(&tokens::Place::SigV4);
        let secrets: &[&str] = if sigv4 {
            hermes_model::providers::AWS_SECRET_VARIABLES
        } else {
            &[]
        };
        let variables = m
            .env
            .iter()
            .map(String::as_str)
            .chain(secrets.iter().copied());
        for variable in variables {
            let variable = &variable.to_string();
            let set_on_host = env.lookup(variable).is_some_and(|v| !v.is_empty());
            rows.push(CredentialRow {
                set_on_host,
                credential: variable.clone(),
                provider: Some(m.provider.clone()),
                coverage: if sigv4 {
                    Coverage::SigV4Resign
                } else {
                    Coverage::HeaderSwap
                },
                detail: if sigv4 {
                    format!(
                        "sandboxes sign with the placeholder pair; the proxy checks the signature and signs again with the real key id, secret and session token for {}",
                        m.hosts.join(", ")
                    )
                } else {
                    places.join(", ")
                },
            });
            for (backend, keys) in service_covered {
                if keys.contains(variable) {
                    let (coverage, how) = match backend {
                        Backend::Modal => {
                            (Coverage::ServiceTransformModal, "Modal's outbound policy")
                        }
                        _ => (Coverage::ServiceTransformVercel, "Vercel's network policy"),
                    };
                    rows.push(CredentialRow {
                        set_on_host,
                        credential: variable.clone(),
                        provider: Some(m.provider.clone()),
                        coverage,
                        detail: format!(
                            "forwarded into {backend} sandboxes (terminal.{}_forward_env) as the {} token; {how} sets the real key's header towards {}",
                            backend.as_str().trim_end_matches("_sandbox"),
                            m.provider,
                            m.hosts.join(", ")
                        ),
                    });
                }
            }
            for (backend, keys) in uncovered_backends {
                if keys.contains(variable) {
                    rows.push(CredentialRow {
                        set_on_host,
                        credential: variable.clone(),
                        provider: Some(m.provider.clone()),
                        coverage: Coverage::Uncovered,
                        detail: format!(
                            "forwarded into {backend} sandboxes (terminal.{}_forward_env), which reach the provider directly{}",
                            backend.as_str().trim_end_matches("_sandbox"),
                            if *backend == Backend::Daytona {
                                "; Daytona offers no outbound header transform"
                            } else {
                                "; its service cannot set this key as a header"
                            }
                        ),
                    });
                }
            }
        }
    }
    if let Some(gcp) = mappings
        .mappings
        .iter()
        .find(|m| m.provider == hermes_egress::google::PROVIDER)
    {
        let name = hermes_egress::google::KEY_FILE_VARIABLE;
        let set = env.lookup(name).is_some_and(|v| !v.is_empty());
        rows.push(CredentialRow {
            set_on_host: set,
            credential: name.to_string(),
            provider: Some(gcp.provider.clone()),
            coverage: Coverage::OauthMinting,
            detail: format!(
                "the proxy mints access tokens from the service account for proxy.google_oauth_hosts; sandboxes send the {} token ({}) as their bearer token; never passed to sandboxes ({})",
                gcp.provider,
                gcp.env.join(", "),
                if set { "set on this host" } else { "not set" }
            ),
        });
    }
    for (name, why) in tokens::UNCOVERED {
        let set = env.lookup(name).is_some_and(|v| !v.is_empty());
        rows.push(CredentialRow {
            set_on_host: set,
            credential: (*name).to_string(),
            provider: None,
            coverage: Coverage::Uncovered,
            detail: format!(
                "{why}: no token can stand in for it; never passed to sandboxes ({})",
                if set { "set on this host" } else { "not set" }
            ),
        });
    }
    rows
}

impl EgressStatus {
    /// Gathers the report; asks the running proxy's health endpoint.
    pub async fn gather(
        home: &Home,
        config: &Config,
        env: &HostEnv,
        show_tokens: bool,
    ) -> anyhow::Result<EgressStatus> {
        let paths = Paths::new(home);
        let proxy = &config.proxy;
        let file = read_config(&paths)?;
        let ca_ok = load_ca(&paths).ok().flatten().is_some();
        let pid = read_pid(&paths)?;
        let running = pid.filter(|p| is_proxy_process(*p));
        let health = match (&file, running, super::state::read(&paths)) {
            (Some(file), Some(_), Ok(Some(state))) => {
                health::probe(state.mgmt, &file.mgmt_token).await.ok()
            }
            _ => None,
        };
        let tokens = read_file(&paths.tokens())?.and_then(|b| TokensFile::parse(&b).ok());
        let mappings = read_file(&paths.mappings())?
            .and_then(|b| MappingsFile::parse(&b).ok())
            .unwrap_or_else(MappingsFile::builtin);
        // What the running proxy holds, as it says.
        let held = |provider: &str| {
            health
                .as_ref()
                .and_then(|h| h.keys.as_ref())
                .and_then(|keys| keys.iter().find(|k| k.provider == provider))
                .filter(|k| k.loaded)
        };
        let rows = mappings
            .mappings
            .iter()
            .map(|m| TokenRow {
                provider: m.provider.clone(),
                env: m.env.clone(),
                token: tokens
                    .as_ref()
                    .and_then(|t| t.tokens.get(&m.provider))
                    .map(|t| {
                        if show_tokens {
                            t.clone()
                        } else {
                            tokens::mask(t)
                        }
                    }),
                key: held(&m.provider).and_then(|k| k.from.clone()),
                key_loaded: health
                    .as_ref()
                    .and_then(|h| h.keys.as_ref())
                    .map(|_| held(&m.provider).is_some_and(|k| k.loaded)),
            })
            .collect();
        let mut warnings: Vec<String> = tokens::UNCOVERED
            .iter()
            .filter(|(name, _)| env.lookup(name).is_some_and(|v| !v.is_empty()))
            .map(|(name, why)| {
                format!("{name} is set but cannot go through the proxy ({why}); it is not passed to sandboxes")
            })
            .collect();
        // The cloud services' sandboxes reach the internet directly: the
        // proxy cannot stand between them and a provider.
        let uncovered = hermes_model::cloud::uncovered_backends(config);
        if hermes_model::cloud::is_cloud(config.terminal.backend) {
            warnings.push(format!(
                "terminal.backend is {}: its sandboxes reach the internet directly, not through this proxy",
                config.terminal.backend
            ));
        }
        if config.terminal.backend == hermes_model::config::Backend::Kubernetes {
            warnings.push(format!(
                "terminal.backend is kubernetes: the proxy runs in the cluster (Pod hermes-proxy-<home> in namespace {}, from the files here; `hermes status` says whether it is Ready), not as a daemon of this host: the process and KEY columns here speak of this host only",
                config.terminal.kubernetes.namespace
            ));
        }
        for (backend, keys) in &uncovered {
            for key in keys {
                warnings.push(format!(
                    "terminal.{}_forward_env names {key}: the real key goes into {backend} sandboxes",
                    backend.as_str().trim_end_matches("_sandbox")
                ));
            }
        }
        let process = match (pid, running) {
            (_, Some(pid)) => Process::Running { pid },
            (Some(pid), None) => Process::Stale { pid },
            (None, None) => Process::NotRunning,
        };
        Ok(EgressStatus {
            enabled: proxy.enabled,
            binary: std::env::current_exe()
                .map(|p| p.display().to_string())
                .unwrap_or_default(),
            binary_version: env!("CARGO_PKG_VERSION").to_string(),
            config: file.as_ref().map(|_| paths.config().display().to_string()),
            ca_cert: ca_ok.then(|| paths.ca_cert().display().to_string()),
            tunnel_port: proxy.tunnel_port,
            process,
            running: running.is_some(),
            listening: health
                .as_ref()
                .map(|h| h.tunnel.iter().map(ToString::to_string).collect())
                .unwrap_or_default(),
            transparent: health
                .as_ref()
                .and_then(|h| h.dns.as_ref())
                .map(|d| d.listen.clone().unwrap_or_default()),
            credential_source: proxy.credential_source.clone(),
            docker_enforce: proxy.enforce_on_docker,
            uncovered_backends: uncovered
                .iter()
                .map(|(backend, keys)| Uncovered {
                    backend: backend.as_str().to_string(),
                    forwarded_keys: keys.clone(),
                })
                .collect(),
            counters: health.map(|h| h.counters),
            tokens: rows,
            credentials: credential_rows(
                &mappings,
                &uncovered,
                &hermes_model::cloud::service_covered(config),
                env,
            ),
            all: false,
            warnings,
        })
    }
}

/// The width of a column: its header's or its longest value's.
fn width<'a>(header: &str, values: impl Iterator<Item = &'a str>) -> usize {
    values
        .map(|v| v.chars().count())
        .chain([header.chars().count()])
        .max()
        .unwrap_or_default()
}

impl fmt::Display for EgressStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let or = |v: &Option<String>, none: &str| v.clone().unwrap_or_else(|| none.to_string());
        writeln!(f, "Enabled:         {}", self.enabled)?;
        writeln!(f, "Binary:          {}", self.binary)?;
        writeln!(f, "Binary version:  {}", self.binary_version)?;
        writeln!(
            f,
            "Config:          {}",
            or(&self.config, "missing (run `hermes egress setup`)")
        )?;
        writeln!(f, "CA cert:         {}", or(&self.ca_cert, "missing"))?;
        writeln!(
            f,
            "Tunnel port:     {} (plain HTTP {})",
            self.tunnel_port,
            self.tunnel_port.saturating_add(1)
        )?;
        writeln!(f, "Process:         {}", self.process)?;
        if self.listening.is_empty() {
            writeln!(f, "Listening:       no")?;
        } else {
            writeln!(f, "Listening:       {}", self.listening.join(", "))?;
        }
        match &self.transparent {
            Some(dns) => writeln!(
                f,
                "Transparent:     on (names resolve to the proxy; DNS on {dns})"
            )?,
            None => writeln!(f, "Transparent:     off")?,
        }
        writeln!(f, "Credential src:  {}", self.credential_source)?;
        writeln!(
            f,
            "Docker enforce:  {} (singularity too)",
            self.docker_enforce
        )?;
        let uncovered: Vec<&str> = self
            .uncovered_backends
            .iter()
            .map(|u| u.backend.as_str())
            .collect();
        writeln!(
            f,
            "Uncovered:       {} (their sandboxes reach the internet directly: see each key's COVERAGE below)",
            uncovered.join(", ")
        )?;
        match &self.counters {
            None => writeln!(f, "Counters:        none (no answer from a running proxy)")?,
            Some(counters) => {
                writeln!(f, "Counters:")?;
                let entries = counters.entries();
                let name_width = width("", entries.iter().map(|e| e.0));
                for (name, value) in entries {
                    writeln!(f, "  {name:<name_width$}  {value}")?;
                }
            }
        }
        writeln!(f)?;
        let no_tokens = self.tokens.iter().all(|r| r.token.is_none());
        if no_tokens && !self.all {
            writeln!(
                f,
                "Tokens:          none yet (`hermes egress setup` makes one for each of {} providers)",
                self.tokens.len()
            )?;
        } else {
            self.token_table(f)?;
        }
        writeln!(f)?;
        let shown: Vec<&CredentialRow> = self
            .credentials
            .iter()
            .filter(|c| self.all || c.matters())
            .collect();
        if !shown.is_empty() {
            credential_table(f, &shown)?;
        }
        let rest = self.credentials.len() - shown.len();
        let how = "provider keys by header swap, AWS's by SigV4 re-sign, a Google service account by OAuth minting (`hermes egress status --all` lists each)";
        if shown.is_empty() && rest > 0 {
            writeln!(
                f,
                "Credentials:     none of the {rest} known is set on this host; once set, they are covered: {how}"
            )?;
        } else if rest > 0 {
            writeln!(
                f,
                "{rest} more credentials, not set on this host, are covered once set: {how}"
            )?;
        }
        for w in &self.warnings {
            writeln!(f, "warning: {w}")?;
        }
        Ok(())
    }
}

impl CredentialRow {
    /// Whether the short report shows it: set on this host, or forwarded
    /// by config.yaml to a backend the proxy does not stand in front of.
    fn matters(&self) -> bool {
        self.set_on_host
            || (self.provider.is_some()
                && matches!(
                    self.coverage,
                    Coverage::Uncovered
                        | Coverage::ServiceTransformModal
                        | Coverage::ServiceTransformVercel
                ))
    }
}

impl EgressStatus {
    /// The table of providers: token, variables, the running proxy's key.
    fn token_table(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let variables: Vec<String> = self.tokens.iter().map(|r| r.env.join(",")).collect();
        let tokens: Vec<&str> = self
            .tokens
            .iter()
            .map(|r| r.token.as_deref().unwrap_or("-"))
            .collect();
        let w_provider = width("PROVIDER", self.tokens.iter().map(|r| r.provider.as_str()));
        let w_token = width("TOKEN", tokens.iter().copied());
        let w_vars = width("VARIABLES", variables.iter().map(String::as_str));
        writeln!(
            f,
            "{:<w_provider$} {:<w_token$} {:<w_vars$} KEY",
            "PROVIDER", "TOKEN", "VARIABLES"
        )?;
        for ((row, token), vars) in self.tokens.iter().zip(&tokens).zip(&variables) {
            let key = match (row.key_loaded, &row.key) {
                (Some(true), Some(n)) => format!("from {n}"),
                (Some(true), None) => "loaded".to_string(),
                (Some(false), _) => "missing".to_string(),
                (None, _) if !self.running => "proxy not running".to_string(),
                (None, _) => "unknown (the proxy does not say)".to_string(),
            };
            writeln!(
                f,
                "{:<w_provider$} {token:<w_token$} {vars:<w_vars$} {key}",
                row.provider
            )?;
        }
        Ok(())
    }
}

/// The table of credentials: provider, coverage, detail.
fn credential_table(f: &mut fmt::Formatter<'_>, credentials: &[&CredentialRow]) -> fmt::Result {
    {
        let providers: Vec<&str> = credentials
            .iter()
            .map(|c| c.provider.as_deref().unwrap_or("-"))
            .collect();
        let coverages: Vec<String> = credentials.iter().map(|c| c.coverage.to_string()).collect();
        let w_name = width(
            "CREDENTIAL",
            credentials.iter().map(|c| c.credential.as_str()),
        );
        let w_provider = width("PROVIDER", providers.iter().copied());
        let w_coverage = width("COVERAGE", coverages.iter().map(String::as_str));
        writeln!(
            f,
            "{:<w_name$} {:<w_provider$} {:<w_coverage$} DETAIL",
            "CREDENTIAL", "PROVIDER", "COVERAGE"
        )?;
        let mut above: Option<(&str, &str)> = None;
        for ((row, provider), coverage) in credentials.iter().zip(&providers).zip(&coverages) {
            // A provider's second and third variable covered the same way
            // (AWS's key id, secret, session token) say it once.
            let detail = if above == Some((provider, row.detail.as_str())) {
                "(as above)"
            } else {
                row.detail.as_str()
            };
            above = Some((provider, row.detail.as_str()));
            writeln!(
                f,
                "{:<w_name$} {provider:<w_provider$} {coverage:<w_coverage$} {detail}",
                row.credential
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn report() -> EgressStatus {
        EgressStatus {
            enabled: true,
            binary: "/bin/hermes".into(),
            binary_version: "0.1.0".into(),
            config: None,
            ca_cert: Some("/h/proxy/ca.crt".into()),
            tunnel_port: 8080,
            process: Process::Running { pid: 7 },
            running: true,
            listening: vec!["127.0.0.1:8080".into()],
            transparent: None,
            credential_source: "env".into(),
            docker_enforce: true,
            uncovered_backends: vec![Uncovered {
                backend: "modal".into(),
                forwarded_keys: vec!["OPENAI_API_KEY".into()],
            }],
            counters: Some(Counters {
                requests: 12,
                denied: 3,
                ..Counters::default()
            }),
            tokens: vec![
                TokenRow {
                    provider: "openai".into(),
                    env: vec!["OPENAI_API_KEY".into()],
                    token: Some("hermes-openai-0123456789abcdef0123456789abcdef0123".into()),
                    key: Some("OPENAI_API_KEY".into()),
                    key_loaded: Some(true),
                },
                TokenRow {
                    provider: "a-provider-with-a-long-name".into(),
                    env: vec!["A_KEY".into(), "A_SECOND_VERY_LONG_VARIABLE_NAME".into()],
                    token: None,
                    key: None,
                    key_loaded: Some(false),
                },
            ],
            credentials: vec![
                CredentialRow {
                    credential: "OPENAI_API_KEY".into(),
                    provider: Some("openai".into()),
                    coverage: Coverage::HeaderSwap,
                    detail: "authorization: Bearer".into(),
                    set_on_host: true,
                },
                CredentialRow {
                    credential: "GOOGLE_APPLICATION_CREDENTIALS".into(),
                    provider: None,
                    coverage: Coverage::Uncovered,
                    detail: "why".into(),
                    set_on_host: false,
                },
            ],
            all: false,
            warnings: vec!["w".into()],
        }
    }

    #[test]
    fn a_fresh_home_s_report_is_short_and_all_of_it_is_one_flag_away() {
        let mut fresh = report();
        for row in &mut fresh.tokens {
            row.token = None;
        }
        fresh.credentials[0].set_on_host = false;
        let text = fresh.to_string();
        assert!(!text.contains("PROVIDER"), "{text}");
        assert!(!text.contains("CREDENTIAL "), "{text}");
        assert!(text.contains("Tokens:          none yet"), "{text}");
        assert!(
            text.contains("none of the 2 known is set on this host"),
            "{text}"
        );
        // A key set on the host is shown, with the count of the rest.
        fresh.credentials[0].set_on_host = true;
        let text = fresh.to_string();
        assert!(text.contains("OPENAI_API_KEY openai"), "{text}");
        assert!(text.contains("1 more credentials"), "{text}");
        assert!(!text.contains("GOOGLE_APPLICATION_CREDENTIALS"), "{text}");
        fresh.all = true;
        let text = fresh.to_string();
        assert!(text.contains("PROVIDER"), "{text}");
        assert!(text.contains("GOOGLE_APPLICATION_CREDENTIALS"), "{text}");
        assert!(!text.contains("more credentials"), "{text}");
    }

    #[test]
    fn each_credential_says_how_it_is_covered_or_why_not() {
        let env = HostEnv {
            process: [("AWS_ACCESS_KEY_ID".to_string(), "AKIA0000".to_string())].into(),
            ..HostEnv::default()
        };
        use hermes_model::config::Backend;
        let rows = credential_rows(
            &MappingsFile::builtin(),
            &[(Backend::Daytona, vec!["OPENAI_API_KEY".to_string()])],
            &[
                (Backend::VercelSandbox, vec!["OPENAI_API_KEY".to_string()]),
                (Backend::Modal, vec!["ANTHROPIC_API_KEY".to_string()]),
            ],
            &env,
        );
        let find = |name: &str, coverage: Coverage| {
            rows.iter()
                .find(|r| r.credential == name && r.coverage == coverage)
                .unwrap_or_else(|| panic!("no {coverage} row for {name}: {rows:?}"))
        };
        assert_eq!(
            find("OPENAI_API_KEY", Coverage::HeaderSwap).detail,
            "authorization: Bearer"
        );
        assert_eq!(
            find("GEMINI_API_KEY", Coverage::HeaderSwap).detail,
            "x-goog-api-key, ?key= query"
        );
        let daytona = find("OPENAI_API_KEY", Coverage::Uncovered);
        assert!(
            daytona
                .detail
                .contains("forwarded into daytona sandboxes (terminal.daytona_forward_env)")
                && daytona
                    .detail
                    .contains("Daytona offers no outbound header transform"),
            "{}",
            daytona.detail
        );
        let vercel = find("OPENAI_API_KEY", Coverage::ServiceTransformVercel);
        assert_eq!(
            vercel.detail,
            "forwarded into vercel_sandbox sandboxes (terminal.vercel_forward_env) as the openai token; Vercel's network policy sets the real key's header towards api.openai.com"
        );
        assert_eq!(
            Coverage::ServiceTransformVercel.to_string(),
            "service-side transform (vercel)"
        );
        let modal = find("ANTHROPIC_API_KEY", Coverage::ServiceTransformModal);
        assert!(
            modal.detail.contains("Modal's outbound policy"),
            "{}",
            modal.detail
        );
        // Covered by a service: not uncovered.
        assert!(
            !rows
                .iter()
                .any(|r| r.credential == "ANTHROPIC_API_KEY" && r.coverage == Coverage::Uncovered)
        );
        for variable in [
            "AWS_ACCESS_KEY_ID",
            "AWS_SECRET_ACCESS_KEY",
            "AWS_SESSION_TOKEN",
        ] {
            let aws = find(variable, Coverage::SigV4Resign);
            assert_eq!(aws.provider.as_deref(), Some("aws"));
            assert!(aws.detail.contains("bedrock-runtime"), "{}", aws.detail);
        }
        let gcp = find("GOOGLE_APPLICATION_CREDENTIALS", Coverage::OauthMinting);
        assert_eq!(gcp.provider.as_deref(), Some("gcp"));
        assert!(gcp.detail.ends_with("(not set)"), "{}", gcp.detail);
        assert!(gcp.detail.contains("GOOGLE_OAUTH_ACCESS_TOKEN"));
        // Every provider key variable has its row.
        for variable in hermes_model::providers::key_variables() {
            assert!(rows.iter().any(|r| r.credential == variable), "{variable}");
        }
    }

    #[test]
    fn the_json_keeps_its_field_names() {
        let json = serde_json::to_value(report()).unwrap();
        let keys: Vec<&String> = json.as_object().unwrap().keys().collect();
        assert_eq!(
            keys,
            [
                "enabled",
                "binary",
                "binary_version",
                "config",
                "ca_cert",
                "tunnel_port",
                "process",
                "running",
                "listening",
                "transparent",
                "credential_source",
                "docker_enforce",
                "uncovered_backends",
                "counters",
                "tokens",
                "credentials",
                "warnings"
            ]
        );
        assert_eq!(json["credentials"][0]["coverage"], "header-swap");
        assert_eq!(json["credentials"][1]["coverage"], "uncovered");
        assert_eq!(json["credentials"][1]["provider"], serde_json::Value::Null);
        assert_eq!(
            json["process"],
            serde_json::json!({"state": "running", "pid": 7})
        );
        assert_eq!(json["config"], serde_json::Value::Null);
        assert_eq!(json["counters"]["requests"], 12);
        assert_eq!(
            json["uncovered_backends"][0]["forwarded_keys"][0],
            "OPENAI_API_KEY"
        );
        assert_eq!(json["tokens"][1]["token"], serde_json::Value::Null);
        assert_eq!(json["tokens"][0]["key"], "OPENAI_API_KEY");
    }

    #[test]
    fn the_text_shows_every_counter_the_json_has() {
        let report = report();
        let text = report.to_string();
        let json = serde_json::to_value(&report).unwrap();
        for (name, value) in json["counters"].as_object().unwrap() {
            let line = text
                .lines()
                .find(|l| l.trim_start().starts_with(&format!("{name} ")))
                .unwrap_or_else(|| panic!("{name} missing:\n{text}"));
            assert!(line.trim_end().ends_with(&format!(" {value}")), "{line}");
        }
        let mut idle = report.clone();
        idle.counters = None;
        assert!(idle.to_string().contains("Counters:        none"));
    }

    #[test]
    fn the_key_column_says_when_no_proxy_runs_to_ask() {
        let mut idle = report();
        idle.running = false;
        for row in &mut idle.tokens {
            row.key_loaded = None;
            row.key = None;
        }
        let text = idle.to_string();
        let rows: Vec<&str> = text
            .lines()
            .skip_while(|l| !l.starts_with("PROVIDER"))
            .skip(1)
            .take(2)
            .collect();
        assert!(
            rows.iter().all(|r| r.ends_with(" proxy not running")),
            "{text}"
        );
    }

    #[test]
    fn the_token_columns_fit_their_longest_value() {
        let text = report().to_string();
        let table: Vec<&str> = text
            .lines()
            .skip_while(|l| !l.starts_with("PROVIDER"))
            .take(3)
            .collect();
        assert_eq!(table.len(), 3, "{text}");
        // Each column starts at the same place on every line, one space
        // after the longest value of the column before.
        let starts = |line: &str, values: [&str; 4]| -> Vec<usize> {
            let chars: Vec<char> = line.chars().collect();
            let mut at = 0;
            values
                .iter()
                .map(|v| {
                    let s: String = chars[at..].iter().collect();
                    let found = at + s.find(v).map(|b| s[..b].chars().count()).unwrap();
                    at = found + v.chars().count();
                    found
                })
                .collect()
        };
        let header = starts(table[0], ["PROVIDER", "TOKEN", "VARIABLES", "KEY"]);
        let first = starts(
            table[1],
            [
                "openai",
                "hermes-openai-",
                "OPENAI_API_KEY",
                "from OPENAI_API_KEY",
            ],
        );
        let second = starts(
            table[2],
            [
                "a-provider-with-a-long-name",
                "-",
                "A_KEY,A_SECOND_VERY_LONG_VARIABLE_NAME",
                "missing",
            ],
        );
        assert_eq!(header, first, "{text}");
        assert_eq!(header, second, "{text}");
        assert_eq!(header[1], "a-provider-with-a-long-name".len() + 1, "{text}");
        assert_eq!(
            header[2],
            header[1] + "hermes-openai-0123456789abcdef0123456789abcdef0123".len() + 1,
            "{text}"
        );
        assert_eq!(
            header[3],
            header[2] + "A_KEY,A_SECOND_VERY_LONG_VARIABLE_NAME".len() + 1,
            "{text}"
        );
    }
}
