//! Config that would defeat a Docker sandbox's isolation.
//!
//! While the egress proxy is enforced ([`proxy_enforced`]) the sandbox must
//! not hold a real secret nor reach the host around the proxy, so each of
//! these is an error naming its key; without the proxy they are warnings:
//!
//! - a volume (of `docker_volumes`, or `-v` in `docker_extra_args`) of the
//!   Docker socket (or any `*.sock` under `/run`, `/var/run`), of `/`,
//!   `/proc`, `/sys`, `/dev` (or below them), or of the hermes home (inside
//!   it, or a directory holding it);
//! - in `docker_extra_args`: `--cap-add` beyond [`CAP_ADD`], `--device`,
//!   `--add-host` of the proxy's host name (any letter case), `--network
//!   host` or `container:…` (the host's or another container's network),
//!   `--runtime` other than `runc` and `runsc` (gVisor), the runtimes under
//!   which the sandbox keeps its hardening;
//! - a `local_sandbox_writable` path (bubblewrap) that is any of the
//!   volumes above: an error in every mode;
//! - a secret that is not a provider key (`GITHUB_TOKEN`, `*_SECRET*`,
//!   `*_PASSWORD`, …) in `docker_env`, `docker_forward_env`,
//!   `env_passthrough` or an `--env`.
//!
//! A volume whose container side lands on a mount hermes makes itself
//! (`/workspace`, `/root`, `/run/hermes` and below, the tmpfs mounts) is an
//! error in every mode: the engine would refuse the create anyway.
//!
//! `--privileged`, `--pid`, `--security-opt seccomp=unconfined` and the
//! like are refused by the mapping of `docker_extra_args` itself
//! ([`crate::sandbox::map_extra_args`]), in every mode. Every error of
//! `docker_extra_args` blocks the Docker sandboxes only
//! ([`crate::config::Config::sandbox_errors`]).
//!
//! Pure: the home directory is passed in by the caller that knows it.

use std::path::{Component, Path, PathBuf};

use crate::config::{Issue, PROXY_HOST_NAME, PROXY_VARIABLES};
use crate::sandbox::{CAP_ADD, RUNNER_MOUNT};
use crate::value::Value;
use crate::yaml::{Node, NodeKind, Pos};

/// Whether the egress proxy is enforced for Docker sandboxes:
/// `proxy.enabled` with `proxy.enforce_on_docker` (fail closed, the
/// default) or `proxy.enforce_network` (the proxy-only network).
pub fn proxy_enforced(root: &Node) -> bool {
    let flag = |key: &str, default: bool| {
        root.get("proxy")
            .and_then(|s| s.value.get(key))
            .map_or(default, |e| match e.value.to_value() {
                Value::Bool(b) => b,
                _ => default,
            })
    };
    flag("enabled", false) && (flag("enforce_on_docker", true) || flag("enforce_network", false))
}

/// Where each issue goes: errors while the proxy is enforced, warnings
/// otherwise.
struct Sink<'a> {
    enforced: bool,
    errors: &'a mut Vec<Issue>,
    warnings: &'a mut Vec<Issue>,
}

impl Sink<'_> {
    /// An issue whose weight depends on the mode.
    fn isolation(&mut self, path: String, pos: Pos, what: String) {
        if self.enforced {
            self.errors.push(Issue {
                path,
                pos: Some(pos),
                message: format!("{what}; refused while the egress proxy is enforced"),
            });
        } else {
            self.warnings.push(Issue {
                path,
                pos: Some(pos),
                message: format!("{what}; an error while the egress proxy is enforced"),
            });
        }
    }

    /// An error in every mode.
    fn error(&mut self, path: String, pos: Pos, message: String) {
        self.errors.push(Issue {
            path,
            pos: Some(pos),
            message,
        });
    }
}

/// Checks the `terminal` section for config that defeats isolation.
/// `home`: the hermes home in each spelling the caller knows (none: not
/// checked).
pub fn check(root: &Node, home: &[&Path], errors: &mut Vec<Issue>, warnings: &mut Vec<Issue>) {
    let Some(terminal) = root.get("terminal") else {
        return;
    };
    let mut sink = Sink {
        enforced: proxy_enforced(root),
        errors,
        warnings,
    };
    let terminal = &terminal.value;
    for (i, item) in seq(terminal, "docker_volumes") {
        let Value::Str(text) = item.to_value() else {
            continue;
        };
        let Ok(volume) = crate::config::parse_volume(&text) else {
            continue; // the type check has reported it
        };
        let path = format!("terminal.docker_volumes[{i}]");
        if let Some(what) = host_side_problem(&volume.host, home) {
            sink.isolation(path.clone(), item.start, format!("`{text}` {what}"));
        }
        if let Some(what) = target_problem(&volume.container) {
            sink.error(path, item.start, format!("`{text}`: {what}"));
        }
    }
    // What a bwrap sandbox may write: never what hands it the host, in
    // every mode (it hides the hermes home; a writable one would undo it).
    for (i, item) in seq(terminal, "local_sandbox_writable") {
        let Value::Str(text) = item.to_value() else {
            continue;
        };
        if let Some(what) = host_side_problem(&text, home) {
            sink.error(
                format!("terminal.local_sandbox_writable[{i}]"),
                item.start,
                format!("`{text}` {what}"),
            );
        }
    }
    if let Some(env) = terminal.get("docker_env") {
        if let NodeKind::Map { entries, .. } = &env.value.kind {
            for entry in entries {
                if is_secret_name(&entry.key) {
                    sink.isolation(
                        format!("terminal.docker_env.{}", entry.key),
                        entry.key_pos,
                        secret_message(&entry.key),
                    );
                }
            }
        }
    }
    for key in ["docker_forward_env", "env_passthrough"] {
        for (i, item) in seq(terminal, key) {
            if let Value::Str(name) = item.to_value() {
                // A name Hermes Agent never passes through is dropped (and
                // said so by `agent`).
                let dropped =
                    key == "env_passthrough" && super::agent::is_passthrough_blocked(&name);
                if is_secret_name(&name) && !dropped {
                    sink.isolation(
                        format!("terminal.{key}[{i}]"),
                        item.start,
                        secret_message(&name),
                    );
                }
            }
        }
    }
    for ExtraOption {
        option,
        value,
        at,
        pos,
    } in extra_arg_options(terminal)
    {
        let what = match option.as_str() {
            "--cap-add" => {
                let extra: Vec<String> = value
                    .split(',')
                    .map(|c| {
                        let c = c.trim().to_ascii_uppercase();
                        c.strip_prefix("CAP_").map_or(c.clone(), str::to_string)
                    })
                    .filter(|c| !CAP_ADD.contains(&c.as_str()))
                    .collect();
                (!extra.is_empty()).then(|| {
                    format!(
                        "`--cap-add {value}` gives the sandbox {} beyond the five it keeps ({})",
                        extra.join(", "),
                        CAP_ADD.join(", ")
                    )
                })
            }
            "--device" => Some(format!(
                "`--device {value}` hands the sandbox a host device"
            )),
            "--add-host"
                if value
                    .split(':')
                    .next()
                    .is_some_and(|h| h.trim().eq_ignore_ascii_case(PROXY_HOST_NAME)) =>
            {
                Some(format!(
                    "`{PROXY_HOST_NAME}` is the egress proxy's address, set by hermes while the proxy is enforced"
                ))
            }
            "--env" => {
                let name = value.split('=').next().unwrap_or_default();
                is_secret_name(name).then(|| secret_message(name))
            }
            "--volume" => {
                let Ok(volume) = crate::config::parse_volume(value.trim()) else {
                    continue; // the mapping has reported it
                };
                let path = format!("terminal.docker_extra_args[{at}]");
                if let Some(what) = target_problem(&volume.container) {
                    sink.error(path.clone(), pos, format!("`-v {value}`: {what}"));
                }
                host_side_problem(&volume.host, home).map(|what| format!("`-v {value}` {what}"))
            }
            "--network" => {
                let value = value.trim();
                if value == "host" {
                    Some("`--network host` hands the sandbox the host's network: its loopback services, the egress proxy's own ports among them".to_string())
                } else if value.starts_with("container:") {
                    Some(format!(
                        "`--network {value}` hands the sandbox another container's network"
                    ))
                } else {
                    None
                }
            }
            "--runtime" => (!matches!(value.trim(), "runc" | "runsc")).then(|| {
                format!(
                    "`--runtime {value}`: hermes knows the sandbox keeps its hardening under runc and runsc (gVisor) only"
                )
            }),
            _ => None,
        };
        if let Some(what) = what {
            sink.isolation(format!("terminal.docker_extra_args[{at}]"), pos, what);
        }
    }
}

/// One option of `terminal.docker_extra_args` with its value: `--opt=value`
/// in one item, or `--opt` then `value` in the next.
pub(super) struct ExtraOption {
    pub option: String,
    pub value: String,
    /// The index of the item holding the value, and where it is.
    pub at: usize,
    pub pos: Pos,
}

/// The options of `terminal.docker_extra_args` that have a value, in order
/// ([`crate::sandbox::options`]), each at the item holding its value.
pub(super) fn extra_arg_options(terminal: &Node) -> Vec<ExtraOption> {
    let items: Vec<&Node> = seq(terminal, "docker_extra_args").map(|(_, n)| n).collect();
    let texts: Vec<String> = items
        .iter()
        .map(|item| match item.to_value() {
            Value::Str(s) => s,
            // Not a flag: the type check reports it.
            _ => String::new(),
        })
        .collect();
    let (options, _) = crate::sandbox::options(&texts);
    options
        .into_iter()
        .filter_map(|o| {
            let item = items.get(o.value_index)?;
            Some(ExtraOption {
                option: o.option,
                value: o.value?,
                at: o.value_index,
                pos: item.start,
            })
        })
        .collect()
}

/// The items of the list `terminal.<key>`, with their indices.
fn seq<'a>(terminal: &'a Node, key: &str) -> impl Iterator<Item = (usize, &'a Node)> {
    let items: &[Node] = match terminal.get(key).map(|e| &e.value.kind) {
        Some(NodeKind::Seq { items, .. }) => items,
        _ => &[],
    };
    items.iter().enumerate()
}

fn secret_message(name: &str) -> String {
    format!(
        "`{name}` looks like a secret, and the sandbox is hostile: whatever runs there can read and send it"
    )
}

/// Whether a variable name looks like a secret the proxy does not stand
/// in for: `*_TOKEN`, `*_PASSWORD`, `*_API_KEY`, `*_PRIVATE_KEY`,
/// `*SECRET*`, the credentials listed in [`crate::providers::UNCOVERED`],
/// the Google service-account key file's variable
/// and the cloud backends' own ([`crate::cloud::CREDENTIALS`]). Provider keys are the proxy's business
/// (see `check_egress_overrides`), and so are the proxy's own variables.
pub fn is_secret_name(name: &str) -> bool {
    if crate::providers::key_variables().any(|v| v == name) || PROXY_VARIABLES.contains(&name) {
        return false;
    }
    if crate::providers::UNCOVERED.iter().any(|(v, _)| *v == name)
        || name == crate::providers::GOOGLE_SERVICE_ACCOUNT_VARIABLE
        || crate::cloud::CREDENTIALS.contains(&name)
    {
        return true;
    }
    let upper = name.to_ascii_uppercase();
    let word = |w: &str| upper == w || upper.ends_with(&format!("_{w}"));
    word("TOKEN")
        || word("PASSWORD")
        || word("PASSWD")
        || word("API_KEY")
        || word("APIKEY")
        || word("PRIVATE_KEY")
        || upper.starts_with("SECRET")
        || upper.contains("_SECRET")
}

/// `path` with `.` and `..` resolved lexically and repeated slashes gone;
/// `None` unless it is absolute (a relative host side names a Docker
/// volume, not a host path).
fn normalize(path: &str) -> Option<PathBuf> {
    let path = Path::new(path);
    if !path.is_absolute() {
        return None;
    }
    let mut out = PathBuf::from("/");
    for c in path.components() {
        match c {
            Component::Normal(part) => out.push(part),
            Component::ParentDir => {
                out.pop();
            }
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    Some(out)
}

/// Paths whose socket is the Docker engine: root on the host.
const DOCKER_SOCKETS: &[&str] = &["/var/run/docker.sock", "/run/docker.sock"];

/// What is wrong with a volume's host side, if anything.
fn host_side_problem(host: &str, home: &[&Path]) -> Option<String> {
    let host = normalize(host)?;
    if host == Path::new("/") {
        return Some("mounts the host's whole filesystem".to_string());
    }
    for dir in ["/proc", "/sys", "/dev"] {
        if host.starts_with(dir) {
            return Some(format!("mounts the host's {dir}"));
        }
    }
    if let Some(socket) = DOCKER_SOCKETS
        .iter()
        .find(|s| Path::new(s).starts_with(&host))
    {
        return Some(format!(
            "hands the sandbox the Docker engine's socket ({socket}), which is root on the host"
        ));
    }
    let sock = host.extension().is_some_and(|e| e == "sock");
    if sock && (host.starts_with("/run") || host.starts_with("/var/run")) {
        return Some("hands the sandbox a host service's socket".to_string());
    }
    home.iter()
        .filter_map(|h| normalize(&h.to_string_lossy()))
        .find(|home| host.starts_with(home) || home.starts_with(&host))
        .map(|home| {
            format!(
                "mounts the hermes home ({}), where the real keys are",
                home.display()
            )
        })
}

/// Mount points hermes makes in every sandbox: a volume may not land on
/// one (the engine refuses a duplicate mount point) nor inside the
/// runner's directory.
const OWN_MOUNTS: &[&str] = &["/workspace", "/root", "/tmp", "/var/tmp", "/run"];

/// What is wrong with a volume's container side, if anything.
fn target_problem(container: &str) -> Option<String> {
    let target = normalize(container)?;
    if target == Path::new("/") {
        return Some("the container side may not be `/`".to_string());
    }
    if target.starts_with(RUNNER_MOUNT) {
        return Some(format!(
            "the container side `{container}` is inside {RUNNER_MOUNT}, which hermes mounts itself"
        ));
    }
    OWN_MOUNTS.iter().find(|m| target == Path::new(m)).map(|m| {
        format!("the container side `{container}` collides with {m}, which hermes mounts itself")
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use crate::config::{load, load_for};

    const ENFORCED: &str = "proxy:\n  enabled: true\n";
    const NETWORK_ONLY: &str =
        "proxy:\n  enabled: true\n  enforce_on_docker: false\n  enforce_network: true\n";
    const OFF: &str = "proxy:\n  enabled: false\n";
    const HOME: &str = "/srv/hermes-home";

    /// (errors, warnings) of `terminal` (from line 2 on) followed by
    /// `proxy`, with the home.
    fn issues(proxy: &str, terminal: &str) -> (Vec<Issue>, Vec<Issue>) {
        let text = format!("terminal:\n{terminal}{proxy}");
        match load_for(&text, &[Path::new(HOME)]) {
            // Errors of docker_extra_args block the Docker sandboxes only.
            Ok(loaded) => (loaded.config.sandbox_errors, loaded.warnings),
            Err(e) => (e.0, Vec::new()),
        }
    }

    /// The terminal snippet is an error naming `key` while enforced (both
    /// ways), and a warning naming it otherwise.
    fn by_mode(terminal: &str, key: &str, line: usize) {
        for proxy in [ENFORCED, NETWORK_ONLY] {
            let (errors, _) = issues(proxy, terminal);
            assert_eq!(errors.len(), 1, "{terminal}: {errors:?}");
            assert_eq!(errors[0].path, key, "{terminal}");
            assert_eq!(errors[0].pos.unwrap().line, line, "{terminal}");
            assert!(errors[0].message.contains("refused"), "{:?}", errors[0]);
        }
        let (errors, warnings) = issues(OFF, terminal);
        assert!(errors.is_empty(), "{terminal}: {errors:?}");
        let ours: Vec<_> = warnings.iter().filter(|w| w.path == key).collect();
        assert_eq!(ours.len(), 1, "{terminal}: {warnings:?}");
        assert_eq!(ours[0].pos.unwrap().line, line);
    }

    #[test]
    fn the_docker_socket_is_refused_in_any_spelling() {
        for v in [
            "/var/run/docker.sock:/var/run/docker.sock",
            "/run/docker.sock:/d.sock:ro",
            "/var/run//docker.sock:/s",
            "/run/containerd/containerd.sock:/c",
            "/var/run:/host-run",
            "/var:/host-var",
            "/run/../run/docker.sock:/s",
        ] {
            by_mode(
                &format!("  docker_volumes:\n    - {v}\n"),
                "terminal.docker_volumes[0]",
                3,
            );
        }
    }

    #[test]
    fn host_system_directories_are_refused() {
        for v in [
            "/:/host",
            "/proc:/p",
            "/sys/fs/cgroup:/c",
            "/dev:/dev2",
            "/etc/../proc:/x",
        ] {
            by_mode(
                &format!("  docker_volumes: [\"{v}\"]\n"),
                "terminal.docker_volumes[0]",
                2,
            );
        }
    }

    #[test]
    fn the_home_and_what_holds_it_are_refused() {
        for v in [
            "/srv/hermes-home:/h",
            "/srv/hermes-home/proxy:/p",
            "/srv/hermes-home/sandboxes/docker/x/y/workspace:/w2",
            "/srv:/srv",
        ] {
            by_mode(
                &format!("  docker_volumes: [\"{v}\"]\n"),
                "terminal.docker_volumes[0]",
                2,
            );
        }
        // A sibling is fine; so is any path when the home is not known.
        let (errors, warnings) = issues(ENFORCED, "  docker_volumes: [/srv/hermes-home2:/d]\n");
        assert!(errors.is_empty() && warnings.is_empty(), "{warnings:?}");
        assert!(
            load(&format!(
                "{ENFORCED}terminal:\n  docker_volumes: [/srv:/srv]\n"
            ))
            .is_ok()
        );
    }

    #[test]
    fn ordinary_volumes_pass() {
        for v in [
            "/srv/data:/data:ro",
            "named-volume:/cache",
            "/home/u/project:/workspace/p",
        ] {
            let (errors, warnings) = issues(ENFORCED, &format!("  docker_volumes: [\"{v}\"]\n"));
            assert!(
                errors.is_empty() && warnings.is_empty(),
                "{v}: {errors:?} {warnings:?}"
            );
        }
    }

    #[test]
    fn targets_on_hermes_own_mounts_are_errors_in_every_mode() {
        for target in [
            "/workspace",
            "/workspace/",
            "/root",
            "/run/hermes",
            "/run/hermes/ctl",
            "/tmp",
            "/",
        ] {
            for proxy in [ENFORCED, OFF] {
                let (errors, _) =
                    issues(proxy, &format!("  docker_volumes: [\"/srv/x:{target}\"]\n"));
                assert_eq!(errors.len(), 1, "{target}: {errors:?}");
                assert_eq!(errors[0].path, "terminal.docker_volumes[0]");
                assert_eq!(errors[0].pos.unwrap().line, 2);
            }
        }
    }

    #[test]
    fn extra_args_that_widen_the_sandbox_depend_on_the_mode() {
        for (args, at, line) in [
            ("[--cap-add=SYS_ADMIN]", 0, 2),
            ("[--cap-add, cap_sys_ptrace]", 1, 2),
            ("[--cap-add=ALL]", 0, 2),
            ("[--device=/dev/fuse]", 0, 2),
            ("[--device, /dev/kvm]", 1, 2),
            ("[--add-host, HOST.Docker.Internal:10.0.0.1]", 1, 2),
            ("[--add-host=host.docker.internal:10.0.0.1]", 0, 2),
            ("[-e, GITHUB_TOKEN=x]", 1, 2),
        ] {
            by_mode(
                &format!("  docker_extra_args: {args}\n"),
                &format!("terminal.docker_extra_args[{at}]"),
                line,
            );
        }
        // The five the sandbox keeps are fine, in any spelling.
        let (errors, warnings) = issues(
            ENFORCED,
            "  docker_extra_args: [--cap-add=CHOWN, --cap-add, cap_setuid, --add-host=db:10.0.0.5]\n",
        );
        assert!(
            errors.is_empty() && warnings.is_empty(),
            "{errors:?} {warnings:?}"
        );
    }

    #[test]
    fn extra_args_that_hand_over_the_host_depend_on_the_mode() {
        for (args, at, line) in [
            ("[--network=host]", 0, 2),
            ("[--net, host]", 1, 2),
            ("[--network=container:db]", 0, 2),
            ("[-v, \"/var/run/docker.sock:/var/run/docker.sock\"]", 1, 2),
            ("[\"--volume=/:/host\"]", 0, 2),
            ("[\"-v=/srv/hermes-home/proxy:/p:ro\"]", 0, 2),
            ("[--runtime=kata]", 0, 2),
        ] {
            by_mode(
                &format!("  docker_extra_args: {args}\n"),
                &format!("terminal.docker_extra_args[{at}]"),
                line,
            );
        }
        // The runtimes that keep the hardening, an ordinary volume, GPUs
        // and a user are fine in every mode.
        let (errors, warnings) = issues(
            ENFORCED,
            "  docker_extra_args: [--runtime=runsc, --runtime, runc, -v, \"/srv/data:/data:ro\", --gpus, all, --user, \"0\"]\n",
        );
        assert!(
            errors.is_empty() && warnings.is_empty(),
            "{errors:?} {warnings:?}"
        );
        // A volume onto hermes's own mounts is an error in every mode.
        for proxy in [ENFORCED, OFF] {
            let (errors, _) = issues(proxy, "  docker_extra_args: [-v, \"/srv/x:/workspace\"]\n");
            assert_eq!(errors.len(), 1, "{errors:?}");
            assert!(
                errors[0].message.contains("collides with /workspace"),
                "{errors:?}"
            );
        }
    }

    #[test]
    fn options_that_undo_the_hardening_are_errors_in_every_mode() {
        for arg in [
            "--privileged",
            "--pid=host",
            "--ipc=host",
            "--uts=host",
            "--userns=host",
            "--security-opt=seccomp=unconfined",
            "--security-opt=apparmor=unconfined",
            "--security-opt=no-new-privileges=false",
            "--security-opt=label=disable",
            "--mount=type=bind,src=/,dst=/host",
        ] {
            for proxy in [ENFORCED, OFF] {
                let (errors, _) = issues(proxy, &format!("  docker_extra_args: [\"{arg}\"]\n"));
                assert_eq!(errors.len(), 1, "{arg}");
                assert_eq!(errors[0].path, "terminal.docker_extra_args[0]");
            }
        }
    }

    #[test]
    fn non_provider_secrets_depend_on_the_mode() {
        for name in [
            "GOOGLE_APPLICATION_CREDENTIALS",
            "GITHUB_TOKEN",
            "DB_PASSWORD",
            "STRIPE_API_KEY",
            "CLIENT_SECRET_VALUE",
            "SECRET_KEY",
        ] {
            by_mode(
                &format!("  docker_env:\n    {name}: x\n"),
                &format!("terminal.docker_env.{name}"),
                3,
            );
            by_mode(
                &format!("  docker_forward_env:\n    - A\n    - {name}\n"),
                "terminal.docker_forward_env[1]",
                4,
            );
        }
        for name in ["PATH", "TOKENIZERS_PARALLELISM", "LANG", "PIP_INDEX_URL"] {
            let (errors, warnings) = issues(ENFORCED, &format!("  docker_env:\n    {name}: x\n"));
            assert!(errors.is_empty() && warnings.is_empty(), "{name}");
        }
        // A provider key is the proxy's business: an error when enforced
        // (it would hand over the real key), nothing without the proxy.
        assert!(!is_secret_name("OPENAI_API_KEY"));
        let (_, warnings) = issues(OFF, "  docker_forward_env: [OPENAI_API_KEY]\n");
        assert!(warnings.is_empty(), "{warnings:?}");
    }

    #[test]
    fn rendered_errors_name_file_line_and_key() {
        let e = load_for(
            &format!("{ENFORCED}terminal:\n  docker_volumes:\n    - /var/run/docker.sock:/var/run/docker.sock\n"),
            &[Path::new(HOME)],
        )
        .unwrap_err();
        let text = e.render("config.yaml");
        assert!(
            text.starts_with("config.yaml:5:7: terminal.docker_volumes[0]: `/var/run/docker.sock:"),
            "{text}"
        );
    }
}
