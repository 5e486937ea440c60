//! The typed [`Config`] read out of a merged, validated value tree.
//!
//! Every key is named by its [`schema`](crate::schema) entry through
//! [`schema_key!`](crate::schema_key), so a misspelt path does not compile
//! instead of silently reading the default; a unit test holds that the
//! reader reads every key of the table.

use crate::schema::KeySpec;
use crate::schema_key;
use crate::value::Value;

use super::{AgentTerminal, Backend, Config, Proxy, Reconcile, Security, Terminal};
use super::{parse_cidr, parse_size, parse_volume};

impl Config {
    /// Builds the typed config from a merged value tree that passed
    /// validation.
    pub(super) fn from_merged(merged: &Value) -> Config {
        Config::read(&Reader::new(merged))
    }

    /// Builds the typed config through `r`, which names each key by its
    /// schema entry.
    fn read(r: &Reader<'_>) -> Config {
        let docker_image = r.string(schema_key!("terminal.docker_image"));
        let singularity_image = r
            .opt_string(schema_key!("terminal.singularity_image"))
            .unwrap_or_else(|| format!("docker://{docker_image}"));
        let modal_image = r
            .opt_string(schema_key!("terminal.modal_image"))
            .unwrap_or_else(|| docker_image.clone());
        let daytona_image = r
            .opt_string(schema_key!("terminal.daytona_image"))
            .unwrap_or_else(|| docker_image.clone());
        let kubernetes = crate::kubernetes::KubeSettings {
            kubeconfig: r.opt_string(schema_key!("terminal.kubernetes_kubeconfig")),
            context: r.opt_string(schema_key!("terminal.kubernetes_context")),
            in_cluster: r.bool(schema_key!("terminal.kubernetes_in_cluster")),
            namespace: r.string(schema_key!("terminal.kubernetes_namespace")),
            image: r
                .opt_string(schema_key!("terminal.kubernetes_image"))
                .unwrap_or_else(|| docker_image.clone()),
            cpu: r.number(schema_key!("terminal.kubernetes_cpu")),
            memory_mb: r.uint(schema_key!("terminal.kubernetes_memory")),
            disk_mb: r.uint(schema_key!("terminal.kubernetes_disk")),
            storage_class: r.opt_string(schema_key!("terminal.kubernetes_storage_class")),
            runtime_class: r.opt_string(schema_key!("terminal.kubernetes_runtime_class")),
            service_account: r.opt_string(schema_key!("terminal.kubernetes_service_account")),
            node_selector: r
                .env_map(schema_key!("terminal.kubernetes_node_selector"))
                .into_iter()
                .collect(),
            tolerations: r
                .strings(schema_key!("terminal.kubernetes_tolerations"))
                .iter()
                .filter_map(|t| crate::kubernetes::Toleration::parse(t).ok())
                .collect(),
            labels: r
                .env_map(schema_key!("terminal.kubernetes_labels"))
                .into_iter()
                .collect(),
            proxy_image: r.opt_string(schema_key!("terminal.kubernetes_proxy_image")),
        };
        Config {
            terminal: Terminal {
                backend: Backend::from_word(&r.string(schema_key!("terminal.backend")))
                    .unwrap_or(Backend::Local),
                cwd: r.string(schema_key!("terminal.cwd")),
                timeout_seconds: r.uint(schema_key!("terminal.timeout")),
                lifetime_seconds: r.uint(schema_key!("terminal.lifetime_seconds")),
                docker_image,
                container_cpu: r.number(schema_key!("terminal.container_cpu")),
                container_memory_mb: r.uint(schema_key!("terminal.container_memory")),
                container_disk_mb: r.uint(schema_key!("terminal.container_disk")),
                sandbox_dir: r.opt_string(schema_key!("terminal.sandbox_dir")),
                container_persistent: r.bool(schema_key!("terminal.container_persistent")),
                docker_persist_across_processes: r
                    .bool(schema_key!("terminal.docker_persist_across_processes")),
                docker_orphan_reaper: r.bool(schema_key!("terminal.docker_orphan_reaper")),
                docker_volumes: r
                    .strings(schema_key!("terminal.docker_volumes"))
                    .iter()
                    .filter_map(|s| parse_volume(s).ok())
                    .collect(),
                docker_env: r.env_map(schema_key!("terminal.docker_env")),
                docker_forward_env: r.strings(schema_key!("terminal.docker_forward_env")),
                docker_extra_args: r.strings(schema_key!("terminal.docker_extra_args")),
                docker_runtime: r.string(schema_key!("terminal.docker_runtime")),
                warm_pool: r
                    .uint(schema_key!("terminal.warm_pool"))
                    .min(crate::config::MAX_WARM_POOL),
                idle_action: match r.string(schema_key!("terminal.idle_action")).as_str() {
                    "stop" => crate::config::IdleAction::Stop,
                    _ => crate::config::IdleAction::Remove,
                },
                local_sandbox: r.string(schema_key!("terminal.local_sandbox")),
                local_sandbox_writable: r.strings(schema_key!("terminal.local_sandbox_writable")),
                local_sandbox_hidden: r.strings(schema_key!("terminal.local_sandbox_hidden")),
                env_passthrough: r.strings(schema_key!("terminal.env_passthrough")),
                docker_run_as_host_user: r.bool(schema_key!("terminal.docker_run_as_host_user")),
                docker_mount_cwd_to_workspace: r
                    .bool(schema_key!("terminal.docker_mount_cwd_to_workspace")),
                docker_network: r.bool(schema_key!("terminal.docker_network")),
                docker_shm_size_bytes: match r.get(schema_key!("terminal.docker_shm_size")) {
                    Value::Int(i) => u64::try_from(i).unwrap_or(0),
                    Value::Str(s) => parse_size(&s).unwrap_or(0),
                    _ => 0,
                },
                persistent_max_idle_seconds: match r
                    .get(schema_key!("terminal.persistent_max_idle_seconds"))
                {
                    Value::Int(i) => u64::try_from(i).ok(),
                    _ => None,
                },
                singularity_image,
                modal_image,
                modal_forward_env: r.strings(schema_key!("terminal.modal_forward_env")),
                daytona_image,
                daytona_forward_env: r.strings(schema_key!("terminal.daytona_forward_env")),
                ssh_host: r.opt_string(schema_key!("terminal.ssh_host")),
                ssh_user: r.opt_string(schema_key!("terminal.ssh_user")),
                ssh_port: u16::try_from(r.uint(schema_key!("terminal.ssh_port"))).unwrap_or(22),
                ssh_key: r.opt_string(schema_key!("terminal.ssh_key")),
                ssh_persist_seconds: r.uint(schema_key!("terminal.ssh_persist_seconds")),
                vercel_runtime: r.string(schema_key!("terminal.vercel_runtime")),
                vercel_forward_env: r.strings(schema_key!("terminal.vercel_forward_env")),
                kubernetes,
                agent: AgentTerminal {
                    modal_mode: r.string(schema_key!("terminal.modal_mode")),
                    home_mode: r.string(schema_key!("terminal.home_mode")),
                    shell_init_files: r.strings(schema_key!("terminal.shell_init_files")),
                    auto_source_bashrc: r.bool(schema_key!("terminal.auto_source_bashrc")),
                    persistent_shell: r.bool(schema_key!("terminal.persistent_shell")),
                    daemon_term_grace_seconds: r
                        .number(schema_key!("terminal.daemon_term_grace_seconds")),
                },
            },
            proxy: Proxy {
                enabled: r.bool(schema_key!("proxy.enabled")),
                tunnel_port: u16::try_from(r.uint(schema_key!("proxy.tunnel_port")))
                    .unwrap_or(9090),
                credential_source: r.string(schema_key!("proxy.credential_source")),
                bitwarden_project_id: r.opt_string(schema_key!("proxy.bitwarden_project_id")),
                enforce_on_docker: r.bool(schema_key!("proxy.enforce_on_docker")),
                upstream_deny_cidrs: match r.get(schema_key!("proxy.upstream_deny_cidrs")) {
                    Value::Null => None,
                    _ => Some(
                        r.strings(schema_key!("proxy.upstream_deny_cidrs"))
                            .iter()
                            .filter_map(|s| parse_cidr(s).ok())
                            .collect(),
                    ),
                },
                extra_allowed_hosts: r
                    .strings(schema_key!("proxy.extra_allowed_hosts"))
                    .into_iter()
                    .map(|h| h.to_ascii_lowercase())
                    .collect(),
                google_oauth_hosts: match r.get(schema_key!("proxy.google_oauth_hosts")) {
                    Value::Null => crate::providers::GOOGLE_OAUTH_HOSTS
                        .iter()
                        .map(ToString::to_string)
                        .collect(),
                    _ => r
                        .strings(schema_key!("proxy.google_oauth_hosts"))
                        .into_iter()
                        .map(|h| h.to_ascii_lowercase())
                        .collect(),
                },
                enforce_on_ssh: r.bool(schema_key!("proxy.enforce_on_ssh")),
                enforce_network: r.bool(schema_key!("proxy.enforce_network")),
                listen: match r.get(schema_key!("proxy.listen")) {
                    Value::Null => None,
                    _ => Some(
                        r.strings(schema_key!("proxy.listen"))
                            .iter()
                            .filter_map(|s| s.parse().ok())
                            .collect(),
                    ),
                },
                resolve: r
                    .env_map(schema_key!("proxy.resolve"))
                    .into_iter()
                    .filter_map(|(host, ip)| Some((host.to_ascii_lowercase(), ip.parse().ok()?)))
                    .collect(),
                upstream_ca_file: r.opt_string(schema_key!("proxy.upstream_ca_file")),
                upstream_header_timeout_seconds: r
                    .uint(schema_key!("proxy.upstream_header_timeout_seconds")),
                aws_region: r.string(schema_key!("proxy.aws_region")),
                aws_hosts: {
                    let hosts: Vec<String> = r
                        .strings(schema_key!("proxy.aws_hosts"))
                        .into_iter()
                        .map(|h| h.to_ascii_lowercase())
                        .collect();
                    if hosts.is_empty() {
                        vec![crate::providers::bedrock_runtime_host(
                            &r.string(schema_key!("proxy.aws_region")),
                        )]
                    } else {
                        hosts
                    }
                },
            },
            reconcile: Reconcile {
                prune: r.bool(schema_key!("reconcile.prune")),
                resync_seconds: r.uint(schema_key!("reconcile.resync_seconds")),
            },
            security: Security {
                redact_secrets: r.bool(schema_key!("security.redact_secrets")),
            },
            sandbox_errors: Vec::new(),
        }
    }
}

/// Reads typed values out of a validated merged tree. Validation has
/// already refused every wrong shape, so a mismatch here can only be a
/// missing key, which falls back to the key's default.
struct Reader<'a> {
    merged: &'a Value,
    /// The path of every key read, in order, for the unit test that checks
    /// them against the schema.
    #[cfg(test)]
    seen: std::cell::RefCell<Vec<&'static str>>,
}

impl<'a> Reader<'a> {
    fn new(merged: &'a Value) -> Self {
        Reader {
            merged,
            #[cfg(test)]
            seen: std::cell::RefCell::default(),
        }
    }

    /// The file's value (over the default) of `spec`, as merged.
    fn raw(&self, spec: &'static KeySpec) -> Option<&'a Value> {
        #[cfg(test)]
        self.seen.borrow_mut().push(spec.path);
        self.merged.get_path(spec.path)
    }

    fn get(&self, spec: &'static KeySpec) -> Value {
        match self.raw(spec) {
            Some(Value::Null) | None => spec.default.to_value(),
            Some(v) => v.clone(),
        }
    }

    fn string(&self, spec: &'static KeySpec) -> String {
        match self.get(spec) {
            Value::Str(s) => s,
            other => other.to_display(),
        }
    }

    fn opt_string(&self, spec: &'static KeySpec) -> Option<String> {
        match self.raw(spec) {
            Some(Value::Str(s)) => Some(s.clone()),
            _ => None,
        }
    }

    fn bool(&self, spec: &'static KeySpec) -> bool {
        matches!(self.get(spec), Value::Bool(true))
    }

    fn uint(&self, spec: &'static KeySpec) -> u64 {
        match self.get(spec) {
            Value::Int(i) => u64::try_from(i).unwrap_or(0),
            _ => 0,
        }
    }

    fn number(&self, spec: &'static KeySpec) -> f64 {
        match self.get(spec) {
            Value::Int(i) => i as f64,
            Value::Float(f) => f,
            _ => 0.0,
        }
    }

    fn strings(&self, spec: &'static KeySpec) -> Vec<String> {
        match self.get(spec) {
            Value::Seq(items) => items
                .into_iter()
                .filter_map(|v| match v {
                    Value::Str(s) => Some(s),
                    _ => None,
                })
                .collect(),
            _ => Vec::new(),
        }
    }

    fn env_map(&self, spec: &'static KeySpec) -> Vec<(String, String)> {
        match self.get(spec) {
            Value::Map(entries) => entries
                .into_iter()
                .map(|(k, v)| match v {
                    Value::Null => (k, String::new()),
                    v => (k, v.to_display()),
                })
                .collect(),
            _ => Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema;

    /// Every key path the loader reads is in the schema table, and every
    /// key of the table is read: a key added to one but not the other, or
    /// a path spelt by hand, fails here.
    #[test]
    fn every_key_read_is_in_the_schema_and_every_schema_key_is_read() {
        let merged = schema::defaults();
        let reader = Reader::new(&merged);
        let config = Config::read(&reader);
        assert_eq!(config, Config::default());
        let seen = reader.seen.take();
        assert!(!seen.is_empty());
        for path in &seen {
            assert!(
                schema::lookup(path).is_some(),
                "the loader reads `{path}`, which is not in schema::KEYS"
            );
        }
        for spec in schema::KEYS {
            assert!(
                seen.contains(&spec.path),
                "schema key `{}` is never read into Config",
                spec.path
            );
        }
    }
}
