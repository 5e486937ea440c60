//! `terminal.docker_extra_args`: the `docker run` flags a user puts there
//! (Hermes Agent passes them to `docker run` as they are), mapped onto the
//! engine's create call.
//!
//! Both spellings are read, `--flag value` (two items) and
//! `--flag=value` (one), and the short ones (`-v`, `-e`, `-l`, `-u`).
//! A flag hermes does not map, or a value it cannot read, is an
//! [`ExtraArgError`] naming its item; so is a flag that would undo the
//! sandbox's hardening in any mode (`--privileged`, `--security-opt
//! seccomp=unconfined`, a host namespace). What depends on the egress
//! proxy's mode (a host device, the host's network, another runtime, a
//! volume of the Docker socket) is [`crate::config`]'s isolation check.
//!
//! Every flag mapped becomes a field of the [`SandboxSpec`]
//! ([`SandboxSpec::apply_extra_args`]), and so part of its spec hash and
//! of its settings label: a change is a planned recreate.

use std::fmt;
use std::net::IpAddr;

use crate::config::{Volume, is_env_name, parse_size, parse_volume};

use super::{Bind, SandboxSpec};

/// The options of `docker_extra_args` that map onto the create call.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExtraArgs {
    pub cap_add: Vec<String>,
    pub devices: Vec<String>,
    pub add_hosts: Vec<String>,
    pub env: Vec<(String, String)>,
    /// `name=soft[:hard]`.
    pub ulimits: Vec<(String, i64, i64)>,
    pub shm_size_bytes: Option<u64>,
    pub labels: Vec<(String, String)>,
    /// `--gpus`.
    pub gpus: Vec<GpuRequest>,
    /// `--user`: `name|uid[:group|gid]`.
    pub user: Option<String>,
    /// `-v`/`--volume`, as `terminal.docker_volumes` entries are.
    pub volumes: Vec<Volume>,
    /// `--network`: `none`, `host`, `container:<name>` or a network's name
    /// (`bridge` and `default` are the engine's default and not kept).
    pub network: Option<String>,
    /// `--dns`: name servers.
    pub dns: Vec<String>,
    /// `--cpuset-cpus`: `0-3,6`.
    pub cpuset_cpus: Option<String>,
    /// `--runtime`.
    pub runtime: Option<String>,
    /// `--security-opt` beyond the `no-new-privileges` every sandbox has.
    pub security_opt: Vec<String>,
}

/// A request for GPUs (`--gpus all`, `--gpus 2`,
/// `--gpus '"device=0,1"'`, `--gpus count=1,capabilities=compute`), as
/// the Docker CLI reads it.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct GpuRequest {
    pub driver: Option<String>,
    /// `-1`: all of them.
    pub count: Option<i64>,
    pub device_ids: Vec<String>,
    /// One AND list; `gpu` is always in it.
    pub capabilities: Vec<String>,
}

impl fmt::Display for GpuRequest {
    /// The request in the CLI's words, for the spec hash and the
    /// settings label: `count=all,capabilities=gpu`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        if let Some(driver) = &self.driver {
            parts.push(format!("driver={driver}"));
        }
        match self.count {
            Some(-1) => parts.push("count=all".to_string()),
            Some(n) => parts.push(format!("count={n}")),
            None => {}
        }
        if !self.device_ids.is_empty() {
            parts.push(format!("device={}", self.device_ids.join(",")));
        }
        parts.push(format!("capabilities={}", self.capabilities.join(",")));
        f.write_str(&parts.join(";"))
    }
}

/// Why a `docker_extra_args` entry was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ExtraArgError {
    /// The index of the offending list item (the value's, for a value
    /// that cannot be read).
    pub index: usize,
    pub message: String,
}

/// The flags `docker_extra_args` may use, each with its other spellings.
pub const EXTRA_OPTIONS: &[&str] = &[
    "--add-host",
    "--cap-add",
    "--cpuset-cpus",
    "--device",
    "--dns",
    "--env",
    "--gpus",
    "--label",
    "--network",
    "--runtime",
    "--security-opt",
    "--shm-size",
    "--ulimit",
    "--user",
    "--volume",
];

/// The canonical name of a flag hermes maps, for any of its spellings.
fn canonical(option: &str) -> Option<&'static str> {
    Some(match option {
        "-e" | "--env" => "--env",
        "-l" | "--label" => "--label",
        "-u" | "--user" => "--user",
        "-v" | "--volume" => "--volume",
        "--net" | "--network" => "--network",
        other => EXTRA_OPTIONS.iter().find(|o| **o == other)?,
    })
}

/// Flags of `docker run` that take no value: an unmapped one does not
/// swallow the next item.
const SWITCHES: &[&str] = &[
    "--privileged",
    "--init",
    "--rm",
    "--read-only",
    "-d",
    "--detach",
    "-i",
    "--interactive",
    "-t",
    "--tty",
    "-it",
    "-P",
    "--publish-all",
    "--oom-kill-disable",
    "--no-healthcheck",
    "--sig-proxy",
    "-q",
    "--quiet",
];

/// Why hermes does not map a flag it knows of, and what to use instead.
fn refusal(option: &str) -> Option<&'static str> {
    Some(match option {
        "--privileged" => {
            "gives the sandbox every capability and device of the host; hermes never makes a privileged sandbox"
        }
        "--pid" | "--ipc" | "--uts" | "--userns" | "--cgroupns" | "--cgroup-parent" => {
            "would share a namespace of the host (or another container's) with the sandbox; hermes keeps the sandbox's own"
        }
        "--mount" => {
            "is not mapped; write the mount as `-v HOST:CONTAINER[:OPTIONS]` or in terminal.docker_volumes"
        }
        "--cpus" | "-c" | "--cpu-shares" | "--cpu-quota" | "--cpu-period" => {
            "is not mapped; set terminal.container_cpu"
        }
        "-m" | "--memory" | "--memory-swap" | "--memory-reservation" => {
            "is not mapped; set terminal.container_memory"
        }
        "--storage-opt" => "is not mapped; terminal.container_disk limits what a sandbox writes",
        "--pids-limit" => "is not mapped; every sandbox is limited to 256 processes",
        "--tmpfs" => "is not mapped; hermes mounts /tmp, /var/tmp and /run as tmpfs itself",
        "-w" | "--workdir" => "is not mapped; commands run in /workspace (terminal.cwd inside it)",
        "--name" => "is not mapped; hermes names its sandboxes",
        "--entrypoint" => "is not mapped; a sandbox runs `sleep infinity` under an init",
        "-p" | "--publish" | "-P" | "--publish-all" | "--expose" => {
            "is not mapped; hermes publishes no port of a sandbox"
        }
        "--restart" | "--rm" | "-d" | "--detach" | "-i" | "--interactive" | "-t" | "--tty"
        | "-it" | "--init" => {
            "is not mapped; hermes starts, keeps and removes its sandboxes itself"
        }
        "--env-file" => {
            "is not mapped: it is read by the Docker client; set terminal.docker_env or terminal.docker_forward_env"
        }
        "--network-alias" | "--ip" | "--ip6" | "--link" | "--mac-address" => {
            "is not mapped; a sandbox gets its address from its network"
        }
        "--cap-drop" => "is not mapped; every sandbox drops all capabilities but five",
        _ => return None,
    })
}

/// One flag of `docker_extra_args` as written, with its value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExtraOption {
    /// The canonical name of a mapped flag (`--volume` for `-v`), else
    /// the flag as written.
    pub option: String,
    /// The flag as written (`-v`, `--net`).
    pub written: String,
    pub value: Option<String>,
    /// The item holding the flag.
    pub index: usize,
    /// The item holding the value (the flag's own for `--flag=value`).
    pub value_index: usize,
}

impl ExtraOption {
    /// `--flag value` as written, for messages.
    pub fn text(&self) -> String {
        match &self.value {
            Some(v) => format!("{} {v}", self.written),
            None => self.written.clone(),
        }
    }

    fn error(&self, message: impl Into<String>) -> ExtraArgError {
        ExtraArgError {
            index: self.value_index,
            message: message.into(),
        }
    }
}

/// The flags of `args` in order, and the items that are not flags of a
/// value hermes can read.
pub fn options(args: &[String]) -> (Vec<ExtraOption>, Vec<ExtraArgError>) {
    let mut options = Vec::new();
    let mut errors = Vec::new();
    let mut i = 0;
    while i < args.len() {
        let arg = args[i].trim();
        let index = i;
        i += 1;
        if !arg.starts_with('-') || arg == "-" || arg == "--" {
            let hint = if arg.contains(' ') {
                "; a flag and its value go in two items (`--flag`, `value`) or in one as `--flag=value`"
            } else {
                ""
            };
            errors.push(ExtraArgError {
                index,
                message: format!("`{arg}` is not a flag{hint}"),
            });
            continue;
        }
        if let Some((flag, _)) = arg.split_once(' ') {
            if !flag.contains('=') {
                errors.push(ExtraArgError {
                    index,
                    message: format!(
                        "`{arg}` holds a space: a flag and its value go in two items (`{flag}`, `…`) or in one as `{flag}=…`"
                    ),
                });
                continue;
            }
        }
        let (written, inline) = match arg.split_once('=') {
            Some((o, v)) => (o, Some(v.to_string())),
            None => (arg, None),
        };
        let mapped = canonical(written);
        let (value, value_index) = match inline {
            Some(v) => (Some(v), index),
            None if mapped.is_none() && SWITCHES.contains(&written) => (None, index),
            None => match args.get(i) {
                // An unmapped flag swallows what follows unless it is a
                // flag itself.
                Some(next) if mapped.is_some() || !next.trim().starts_with('-') => {
                    i += 1;
                    (Some(next.clone()), i - 1)
                }
                _ => (None, index),
            },
        };
        if mapped.is_some() && value.is_none() {
            errors.push(ExtraArgError {
                index,
                message: format!("`{written}` needs a value"),
            });
            continue;
        }
        options.push(ExtraOption {
            option: mapped.unwrap_or(written).to_string(),
            written: written.to_string(),
            value,
            index,
            value_index,
        });
    }
    (options, errors)
}

/// Maps `docker_extra_args` onto the create call: what it can, and every
/// item it cannot, each with why.
pub fn map_extra_args(args: &[String]) -> (ExtraArgs, Vec<ExtraArgError>) {
    let (options, mut errors) = options(args);
    let mut out = ExtraArgs::default();
    for option in &options {
        if let Err(e) = map_one(&mut out, option) {
            errors.push(e);
        }
    }
    errors.sort_by_key(|e| e.index);
    (out, errors)
}

/// [`map_extra_args`], failing at the first item it cannot map.
pub fn parse_extra_args(args: &[String]) -> Result<ExtraArgs, ExtraArgError> {
    let (out, errors) = map_extra_args(args);
    match errors.into_iter().next() {
        Some(e) => Err(e),
        None => Ok(out),
    }
}

fn map_one(out: &mut ExtraArgs, option: &ExtraOption) -> Result<(), ExtraArgError> {
    let Some(value) = option.value.clone() else {
        // Only a flag hermes does not map has no value here.
        return Err(unmapped(option));
    };
    let text = option.text();
    match option.option.as_str() {
        "--cap-add" => out.cap_add.push(value.trim().to_ascii_uppercase()),
        "--device" if !value.trim().is_empty() => out.devices.push(value.trim().to_string()),
        "--device" => return Err(option.error(format!("`{text}`: name a host device"))),
        "--add-host" => {
            // `host:address`, or `host=address` as newer clients take it.
            let (host, address) = value
                .split_once('=')
                .or_else(|| value.split_once(':'))
                .ok_or_else(|| option.error(format!("`{text}` must be host:address")))?;
            if host.is_empty() || address.is_empty() {
                return Err(option.error(format!("`{text}` must be host:address")));
            }
            out.add_hosts.push(format!("{host}:{address}"));
        }
        "--env" => match value.split_once('=') {
            Some((k, v)) if is_env_name(k) => out.env.push((k.to_string(), v.to_string())),
            _ => return Err(option.error(format!("`{text}` must be NAME=value"))),
        },
        "--ulimit" => out
            .ulimits
            .push(parse_ulimit(&value).map_err(|m| option.error(m))?),
        "--shm-size" => match parse_size(&value) {
            Some(n) if n > 0 => out.shm_size_bytes = Some(n),
            _ => return Err(option.error(format!("`{text}` is not a size such as 512m or 1g"))),
        },
        "--label" => {
            let (k, v) = value.split_once('=').unwrap_or((value.as_str(), ""));
            if k.is_empty() {
                return Err(option.error(format!("`{text}` must be key=value")));
            }
            if k.starts_with("hermes-") {
                return Err(option.error(format!(
                    "`{text}`: labels beginning with `hermes-` are hermes's own (they say which sandbox a container is)"
                )));
            }
            out.labels.push((k.to_string(), v.to_string()));
        }
        "--gpus" => out
            .gpus
            .push(parse_gpus(&value).map_err(|m| option.error(format!("`{text}`: {m}")))?),
        "--user" => {
            let ok = !value.is_empty()
                && value.split(':').count() <= 2
                && value.split(':').all(|part| {
                    !part.is_empty()
                        && part
                            .chars()
                            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
                });
            if !ok {
                return Err(option.error(format!(
                    "`{text}` must be a user or uid, with a group or gid after a colon (1000:1000)"
                )));
            }
            out.user = Some(value);
        }
        "--volume" => {
            if !value.contains(':') {
                return Err(option.error(format!(
                    "`{text}`: an anonymous volume (a container path alone) is not mapped; name a volume or a host directory: NAME:/path"
                )));
            }
            let volume = parse_volume(value.trim()).map_err(|m| option.error(m))?;
            out.volumes.push(volume);
        }
        "--network" => {
            let value = value.trim();
            let named = value
                .strip_prefix("container:")
                .unwrap_or(value)
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
            if value.is_empty() || !named {
                return Err(option.error(format!("`{text}` is not a network's name")));
            }
            out.network = match value {
                "bridge" | "default" => None,
                other => Some(other.to_string()),
            };
        }
        "--dns" => match value.trim().parse::<IpAddr>() {
            Ok(addr) => out.dns.push(addr.to_string()),
            Err(_) => {
                return Err(option.error(format!(
                    "`{text}`: a name server is an IP address (such as 1.1.1.1)"
                )));
            }
        },
        "--cpuset-cpus" => {
            let value = value.trim();
            if !is_cpu_list(value) {
                return Err(
                    option.error(format!("`{text}` is not a list of CPUs such as 0-3 or 0,2"))
                );
            }
            out.cpuset_cpus = Some(value.to_string());
        }
        "--runtime" => {
            let value = value.trim();
            if value.is_empty()
                || !value
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
            {
                return Err(option.error(format!("`{text}` is not a runtime's name")));
            }
            out.runtime = Some(value.to_string());
        }
        "--security-opt" => {
            if let Some(opt) =
                security_opt(&value).map_err(|m| option.error(format!("`{text}` {m}")))?
            {
                if !out.security_opt.contains(&opt) {
                    out.security_opt.push(opt);
                }
            }
        }
        _ => return Err(unmapped(option)),
    }
    Ok(())
}

/// The refusal of a flag hermes does not map.
fn unmapped(option: &ExtraOption) -> ExtraArgError {
    let message = match refusal(&option.written) {
        Some(why) => format!("`{}` {why}", option.written),
        None => format!(
            "`{}` is not mapped by hermes; it maps {}",
            option.written,
            EXTRA_OPTIONS.join(", ")
        ),
    };
    // A flag is refused at its own item.
    ExtraArgError {
        index: option.index,
        message,
    }
}

/// A `--security-opt` hermes passes on (`None`: the `no-new-privileges`
/// every sandbox has), or why not.
fn security_opt(value: &str) -> Result<Option<String>, String> {
    let value = value.trim();
    // The CLI takes `key=value` and the older `key:value`.
    let (key, setting) = match value.split_once('=').or_else(|| value.split_once(':')) {
        Some((k, v)) => (k, Some(v)),
        None => (value, None),
    };
    match (key, setting) {
        ("no-new-privileges", None | Some("true")) => Ok(None),
        ("no-new-privileges", Some(_)) => {
            Err("would let the sandbox's processes gain privileges; every sandbox has no-new-privileges".to_string())
        }
        ("seccomp" | "apparmor" | "systempaths", Some("unconfined")) | ("label", Some("disable")) => {
            Err("turns off a confinement every sandbox keeps".to_string())
        }
        ("seccomp", Some(_)) => Err(
            "is not mapped: a seccomp profile is a file the Docker client reads; the engine's default profile stays".to_string(),
        ),
        ("apparmor", Some(profile)) if !profile.is_empty() => Ok(Some(format!("apparmor={profile}"))),
        ("label", Some(label)) if !label.is_empty() => Ok(Some(format!("label={label}"))),
        _ => Err(
            "is not mapped; hermes passes on apparmor=PROFILE, label=… and no-new-privileges".to_string(),
        ),
    }
}

/// `0-3`, `0,2,4-7`.
fn is_cpu_list(text: &str) -> bool {
    let number = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    !text.is_empty()
        && text.split(',').all(|part| match part.split_once('-') {
            Some((a, b)) => number(a) && number(b),
            None => number(part),
        })
}

fn parse_ulimit(value: &str) -> Result<(String, i64, i64), String> {
    let bad = || format!("`--ulimit {value}` must be name=soft[:hard]");
    let (name, limits) = value.split_once('=').ok_or_else(bad)?;
    let (soft, hard) = match limits.split_once(':') {
        Some((s, h)) => (s, h),
        None => (limits, limits),
    };
    let soft: i64 = soft.parse().map_err(|_| bad())?;
    let hard: i64 = hard.parse().map_err(|_| bad())?;
    if name.is_empty() {
        return Err(bad());
    }
    Ok((name.to_string(), soft, hard))
}

/// Splits a CSV line as the Docker CLI's `--gpus` does: commas, with
/// double quotes around a field that holds one.
fn csv_fields(text: &str) -> Result<Vec<String>, String> {
    let mut fields = Vec::new();
    let mut field = String::new();
    let mut quoted = false;
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '"' if quoted && chars.peek() == Some(&'"') => {
                field.push('"');
                chars.next();
            }
            '"' => quoted = !quoted,
            ',' if !quoted => fields.push(std::mem::take(&mut field)),
            c => field.push(c),
        }
    }
    if quoted {
        return Err("a quote is not closed".to_string());
    }
    fields.push(field);
    Ok(fields)
}

/// A `--gpus` value, as the Docker CLI reads it.
fn parse_gpus(value: &str) -> Result<GpuRequest, String> {
    let count = |text: &str| -> Result<i64, String> {
        match text {
            "all" => Ok(-1),
            n => n
                .parse::<i64>()
                .ok()
                .filter(|n| *n > 0)
                .ok_or_else(|| format!("`{n}` is not a count of GPUs (a number, or all)")),
        }
    };
    let mut request = GpuRequest::default();
    let mut seen: Vec<&str> = Vec::new();
    let fields = csv_fields(value.trim())?;
    for field in &fields {
        let (key, val) = match field.split_once('=') {
            Some((k, v)) => (k, Some(v)),
            None => ("count", None),
        };
        if seen.contains(&key) {
            return Err(format!("`{key}` is given twice"));
        }
        seen.push(key);
        match (key, val) {
            ("count", None) => request.count = Some(count(field)?),
            ("count", Some(v)) => request.count = Some(count(v)?),
            ("driver", Some(v)) if !v.is_empty() => request.driver = Some(v.to_string()),
            ("device", Some(v)) if !v.is_empty() => {
                request.device_ids = v.split(',').map(str::to_string).collect();
            }
            ("capabilities", Some(v)) if !v.is_empty() => {
                request.capabilities = v.split(',').map(str::to_string).collect();
            }
            (other, _) => {
                return Err(format!(
                    "`{other}` is not mapped (count, device, driver and capabilities are)"
                ));
            }
        }
    }
    if request.count.is_none() && request.device_ids.is_empty() {
        request.count = Some(1);
    }
    if !request.capabilities.iter().any(|c| c == "gpu") {
        request.capabilities.push("gpu".to_string());
    }
    Ok(request)
}

impl SandboxSpec {
    /// Sets the fields of the flags [`SandboxSpec::new`] does not read
    /// itself: volumes, the network, name servers, security options, GPUs,
    /// the user, the CPU set and the runtime.
    pub fn apply_extra_args(&mut self, extra: &ExtraArgs) {
        self.binds.extend(extra.volumes.iter().map(Bind::from));
        match extra.network.as_deref() {
            Some("none") => self.network = false,
            Some(name) => self.network_name = Some(name.to_string()),
            None => {}
        }
        self.dns.extend(extra.dns.iter().cloned());
        for opt in &extra.security_opt {
            if !self.security_opt.contains(opt) {
                self.security_opt.push(opt.clone());
            }
        }
        self.gpus = extra.gpus.clone();
        self.user = extra.user.clone();
        self.cpuset_cpus = extra.cpuset_cpus.clone();
        self.runtime = extra.runtime.clone();
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn args(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn both_spellings_of_every_mapped_flag_are_read() {
        let extra = parse_extra_args(&args(&[
            "--gpus",
            "all",
            "--user=1000:1000",
            "-v",
            "/srv/data:/data:ro",
            "--volume=cache:/cache",
            "--network",
            "ml-net",
            "--add-host=db:10.0.0.5",
            "--add-host",
            "db2=10.0.0.6",
            "--device",
            "/dev/fuse",
            "--shm-size=2g",
            "--ulimit",
            "nofile=1024:2048",
            "--cpuset-cpus=0-3,6",
            "--dns",
            "1.1.1.1",
            "--label",
            "team=ml",
            "-l",
            "tier",
            "--runtime=runsc",
            "--security-opt",
            "apparmor=docker-default",
            "--security-opt=no-new-privileges:true",
            "-e",
            "A=1",
        ]))
        .unwrap();
        assert_eq!(
            extra.gpus,
            [GpuRequest {
                count: Some(-1),
                capabilities: vec!["gpu".into()],
                ..GpuRequest::default()
            }]
        );
        assert_eq!(extra.user.as_deref(), Some("1000:1000"));
        assert_eq!(
            extra.volumes,
            [
                parse_volume("/srv/data:/data:ro").unwrap(),
                parse_volume("cache:/cache").unwrap()
            ]
        );
        assert_eq!(extra.network.as_deref(), Some("ml-net"));
        assert_eq!(extra.add_hosts, ["db:10.0.0.5", "db2:10.0.0.6"]);
        assert_eq!(extra.devices, ["/dev/fuse"]);
        assert_eq!(extra.shm_size_bytes, Some(2 << 30));
        assert_eq!(extra.ulimits, [("nofile".to_string(), 1024, 2048)]);
        assert_eq!(extra.cpuset_cpus.as_deref(), Some("0-3,6"));
        assert_eq!(extra.dns, ["1.1.1.1"]);
        assert_eq!(
            extra.labels,
            [
                ("team".to_string(), "ml".to_string()),
                ("tier".to_string(), String::new())
            ]
        );
        assert_eq!(extra.runtime.as_deref(), Some("runsc"));
        // no-new-privileges is every sandbox's already.
        assert_eq!(extra.security_opt, ["apparmor=docker-default"]);
        assert_eq!(extra.env, [("A".to_string(), "1".to_string())]);
    }

    #[test]
    fn gpu_requests_read_as_the_docker_cli_reads_them() {
        let gpus = |v: &str| parse_gpus(v);
        assert_eq!(gpus("2").unwrap().count, Some(2));
        let r = gpus("\"device=0,1\"").unwrap();
        assert_eq!(
            (r.count, r.device_ids.clone()),
            (None, vec!["0".into(), "1".into()])
        );
        // Unquoted, a comma ends the field.
        let r = gpus("count=1,capabilities=compute,driver=nvidia").unwrap();
        assert_eq!(r.capabilities, ["compute", "gpu"]);
        let r = gpus("count=1,\"capabilities=compute,utility\",driver=nvidia").unwrap();
        assert_eq!(r.capabilities, ["compute", "utility", "gpu"]);
        assert_eq!(r.driver.as_deref(), Some("nvidia"));
        assert_eq!(
            r.to_string(),
            "driver=nvidia;count=1;capabilities=compute,utility,gpu"
        );
        assert!(gpus("0").is_err());
        assert!(gpus("options=x").is_err());
        assert!(gpus("2,count=3").is_err());
    }

    #[test]
    fn a_flag_hermes_does_not_map_is_refused_at_its_item_and_the_rest_still_map() {
        let (extra, errors) = map_extra_args(&args(&[
            "--cap-add=SYS_PTRACE",
            "--privileged",
            "--memory",
            "2g",
            "--shm-size",
            "1g",
            "--frobnicate=1",
        ]));
        let got: Vec<(usize, &str)> = errors
            .iter()
            .map(|e| (e.index, e.message.as_str()))
            .collect();
        assert_eq!(got.len(), 3, "{got:?}");
        assert_eq!(got[0].0, 1);
        assert!(
            got[0]
                .1
                .starts_with("`--privileged` gives the sandbox every capability"),
            "{got:?}"
        );
        // `--memory` took its value along: `2g` is not read as a flag.
        assert_eq!(got[1].0, 2);
        assert!(
            got[1].1.contains("set terminal.container_memory"),
            "{got:?}"
        );
        assert_eq!(got[2].0, 6);
        assert!(
            got[2]
                .1
                .starts_with("`--frobnicate` is not mapped by hermes; it maps --add-host"),
            "{got:?}"
        );
        assert_eq!(extra.cap_add, ["SYS_PTRACE"]);
        assert_eq!(extra.shm_size_bytes, Some(1 << 30));
    }

    #[test]
    fn values_hermes_cannot_read_name_the_item_of_the_value() {
        let one = |items: &[&str]| {
            let (_, errors) = map_extra_args(&args(items));
            assert_eq!(errors.len(), 1, "{items:?}: {errors:?}");
            (errors[0].index, errors[0].message.clone())
        };
        let (i, m) = one(&["--device"]);
        assert_eq!(i, 0);
        assert!(m.contains("needs a value"), "{m}");
        let (i, m) = one(&["--shm-size", "lots"]);
        assert_eq!(i, 1);
        assert!(m.contains("not a size"), "{m}");
        assert!(
            one(&["--label=hermes-task-id=x"])
                .1
                .contains("hermes's own")
        );
        assert!(one(&["-v", "/data"]).1.contains("anonymous volume"));
        assert!(one(&["--dns", "dns.example"]).1.contains("IP address"));
        assert!(one(&["--cpuset-cpus", "a-b"]).1.contains("list of CPUs"));
        assert!(one(&["--user", "a b"]).1.contains("uid"));
        assert!(one(&["--cap-add SYS_PTRACE"]).1.contains("two items"));
        assert!(one(&["SYS_PTRACE"]).1.contains("is not a flag"));
        assert!(
            one(&["--security-opt", "seccomp=unconfined"])
                .1
                .contains("confinement")
        );
        assert!(
            one(&["--security-opt=apparmor:unconfined"])
                .1
                .contains("confinement")
        );
        assert!(
            one(&["--security-opt", "no-new-privileges=false"])
                .1
                .contains("gain privileges")
        );
        assert!(
            one(&["--security-opt", "seccomp=/p.json"])
                .1
                .contains("profile is a file")
        );
        assert!(one(&["--pid=host"]).1.contains("namespace"));
        assert!(one(&["--network", "a b"]).1.contains("network's name"));
    }

    fn spec_of(extra_args: &str) -> SandboxSpec {
        let config =
            crate::config::load(&format!("terminal:\n  docker_extra_args: {extra_args}\n"))
                .unwrap()
                .config;
        assert!(
            config.sandbox_errors.is_empty(),
            "{:?}",
            config.sandbox_errors
        );
        let extra = parse_extra_args(&config.terminal.docker_extra_args).unwrap();
        SandboxSpec::new(
            &config,
            super::super::SandboxKey::persistent("default", "default"),
            std::path::Path::new("/h"),
            &extra,
        )
    }

    #[test]
    fn every_mapped_flag_is_in_the_spec_its_hash_and_its_settings() {
        let base = spec_of("[]");
        let settings = base.settings();
        for absent in ["user", "network_name", "dns", "docker_extra_args.gpus"] {
            assert!(!settings.contains_key(absent), "{absent}");
        }
        for (args, field, value) in [
            (
                "[--gpus, all]",
                "docker_extra_args.gpus",
                "count=all;capabilities=gpu",
            ),
            ("[--user=1000]", "user", "1000"),
            ("[-v, \"/srv:/srv:ro\"]", "docker_volumes", "/srv:/srv:ro"),
            ("[--network, ml]", "network_name", "ml"),
            ("[--network=none]", "docker_network", "false"),
            ("[--dns, 9.9.9.9]", "dns", "9.9.9.9"),
            (
                "[--cpuset-cpus, \"0,1\"]",
                "docker_extra_args.cpuset_cpus",
                "0,1",
            ),
            ("[--runtime, runsc]", "docker_runtime", "runsc"),
            (
                "[--security-opt, label=level:s0]",
                "docker_extra_args.security_opt",
                "label=level:s0",
            ),
            ("[--label, team=ml]", "docker_extra_args.label", "team=ml"),
            (
                "[--ulimit, nproc=64]",
                "docker_extra_args.ulimit",
                "nproc=64:64",
            ),
            ("[--shm-size, 2g]", "docker_shm_size", "2147483648"),
            (
                "[--add-host, db=10.0.0.5]",
                "docker_extra_args.add_host",
                "db:10.0.0.5",
            ),
            (
                "[--device, /dev/fuse]",
                "docker_extra_args.device",
                "/dev/fuse",
            ),
        ] {
            let spec = spec_of(args);
            assert_ne!(spec.hash(), base.hash(), "{args}");
            assert_eq!(spec.compute_hash(), spec.hash(), "{args}");
            let changes = crate::settings::diff(&base.settings(), &spec.settings());
            assert!(
                changes
                    .iter()
                    .any(|c| c.field == field && c.new.as_deref() == Some(value)),
                "{args}: {changes:?}"
            );
        }
        let spec = spec_of("[--gpus, all, --user=1000, --cpuset-cpus=0, --runtime=runsc]");
        assert_eq!(spec.user.as_deref(), Some("1000"));
        assert_eq!(spec.gpus.len(), 1);
        assert_eq!(spec.cpuset_cpus.as_deref(), Some("0"));
        assert_eq!(spec.runtime.as_deref(), Some("runsc"));
    }

    #[test]
    fn the_network_flag_keeps_only_what_differs_from_the_default() {
        let net = |v: &str| parse_extra_args(&args(&["--network", v])).unwrap().network;
        assert_eq!(net("bridge"), None);
        assert_eq!(net("default"), None);
        assert_eq!(net("none").as_deref(), Some("none"));
        assert_eq!(net("host").as_deref(), Some("host"));
        assert_eq!(net("container:db").as_deref(), Some("container:db"));
        assert_eq!(
            parse_extra_args(&args(&["--net=ml"]))
                .unwrap()
                .network
                .as_deref(),
            Some("ml")
        );
    }
}
