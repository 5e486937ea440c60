//! The command lines hermes gives `apptainer` (or `singularity`), built by
//! pure functions so that each is asserted exactly in tests. No
//! environment value is ever part of one: values go in the process's
//! environment as `APPTAINERENV_<NAME>` (`SINGULARITYENV_<NAME>` for the
//! older binary), which the runtime hands to the command inside.

use hermes_model::singularity::InstanceSpec;

/// Which runtime binary answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavor {
    /// `apptainer`, the Linux Foundation project.
    Apptainer,
    /// `singularity` (SingularityCE, or Apptainer's compatibility name).
    Singularity,
}

impl Flavor {
    /// The binary's name on the PATH.
    pub fn program(self) -> &'static str {
        match self {
            Flavor::Apptainer => "apptainer",
            Flavor::Singularity => "singularity",
        }
    }

    /// The prefix that passes a variable into the container.
    pub fn env_prefix(self) -> &'static str {
        match self {
            Flavor::Apptainer => "APPTAINERENV_",
            Flavor::Singularity => "SINGULARITYENV_",
        }
    }
}

/// Runs the command in its directory (made when missing) with its
/// arguments as they are: `$1` is the directory, the rest the command.
pub const EXEC_SCRIPT: &str = r#"cd -- "$1" 2>/dev/null || { mkdir -p -- "$1" && cd -- "$1"; } || exit 127; shift; exec "$@""#;

/// `build <target> <source>`: the image built once into a SIF file.
pub fn build(target: &str, source: &str) -> Vec<String> {
    strings(&["build", target, source])
}

/// `instance start`: the instance contained (`--containall`: its own
/// PID and IPC namespaces, a clean environment, nothing of the host's
/// file systems but what is bound), without the host's home, writing into
/// its overlay directory (persistent) or a tmpfs (a session's), with the
/// volumes bound and the memory and CPU limits.
pub fn instance_start(spec: &InstanceSpec) -> Vec<String> {
    let mut argv = strings(&["instance", "start", "--containall", "--no-home"]);
    match &spec.overlay {
        Some(dir) => {
            argv.push("--overlay".to_string());
            argv.push(dir.display().to_string());
        }
        None => argv.push("--writable-tmpfs".to_string()),
    }
    for bind in &spec.binds {
        argv.push("--bind".to_string());
        argv.push(bind.to_engine());
    }
    // 0: no limit (terminal.container_memory, container_cpu: 0).
    if spec.memory_mb > 0 {
        argv.push("--memory".to_string());
        argv.push(format!("{}M", spec.memory_mb));
    }
    if spec.cpus > 0.0 {
        argv.push("--cpus".to_string());
        argv.push(format_cpus(spec.cpus));
    }
    argv.push(spec.sif.display().to_string());
    argv.push(spec.name.clone());
    argv
}

/// `exec instance://<name> bash -c …`: the command in `cwd`, with a clean
/// environment (only what the prefixed variables carry).
pub fn exec(name: &str, cwd: &str, cmd: &[String]) -> Vec<String> {
    let mut argv = strings(&["exec", "--cleanenv"]);
    argv.push(format!("instance://{name}"));
    argv.extend(strings(&["bash", "-c", EXEC_SCRIPT, "hermes", cwd]));
    argv.extend(cmd.iter().cloned());
    argv
}

/// The kill of a timed-out command's whole tree inside the instance: the
/// processes that carry `marker`, and their descendants.
pub fn kill_marked(name: &str, marker: &str) -> Vec<String> {
    let mut argv = strings(&["exec", "--cleanenv"]);
    argv.push(format!("instance://{name}"));
    argv.extend(strings(&[
        "sh",
        "-c",
        crate::exec::KILL_SCRIPT,
        "sh",
        marker,
    ]));
    argv
}

/// `instance stop <name>`.
pub fn instance_stop(name: &str) -> Vec<String> {
    strings(&["instance", "stop", name])
}

/// `instance list --json`: the running instances of this user.
pub fn instance_list() -> Vec<String> {
    strings(&["instance", "list", "--json"])
}

/// `(APPTAINERENV_NAME, value)` for each value: what the process's
/// environment carries into the container.
pub fn env(flavor: Flavor, values: &[(String, String)]) -> Vec<(String, String)> {
    values
        .iter()
        .map(|(k, v)| (format!("{}{k}", flavor.env_prefix()), v.clone()))
        .collect()
}

/// `1`, `0.5`, `2.25`: the CPU count as the runtime reads it.
fn format_cpus(cpus: f64) -> String {
    if cpus.fract() == 0.0 {
        format!("{cpus:.0}")
    } else {
        let text = format!("{cpus:.3}");
        text.trim_end_matches('0').to_string()
    }
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::path::Path;

    use hermes_model::config::load;
    use hermes_model::sandbox::SandboxKey;

    use super::*;

    fn spec(config: &str, key: SandboxKey) -> InstanceSpec {
        InstanceSpec::new(
            &load(config).unwrap().config,
            key,
            Path::new("/h"),
            &[("TOKEN".to_string(), "s3cret-value".to_string())],
            None,
        )
    }

    #[test]
    fn a_persistent_instance_starts_contained_on_its_overlay_with_binds_and_limits() {
        let s = spec(
            "terminal:\n  docker_image: python:3.12\n  container_memory: 2048\n  container_cpu: 1.5\n  docker_volumes: [/srv/data:/data:ro]\n",
            SandboxKey::persistent("default", "default"),
        );
        let sif = s.sif.display().to_string();
        assert_eq!(
            instance_start(&s),
            [
                "instance",
                "start",
                "--containall",
                "--no-home",
                "--overlay",
                "/h/sandboxes/singularity/default/default/overlay",
                "--bind",
                "/srv/data:/data:ro",
                "--memory",
                "2048M",
                "--cpus",
                "1.5",
                sif.as_str(),
                "hermes-default-default",
            ]
        );
        // No environment value is on the command line.
        assert!(!instance_start(&s).iter().any(|a| a.contains("s3cret")));
    }

    #[test]
    fn limits_of_0_are_no_limits_on_the_command_line() {
        let s = spec(
            "terminal:\n  container_memory: 0\n  container_cpu: 0\n",
            SandboxKey::persistent("default", "default"),
        );
        let argv = instance_start(&s);
        assert!(
            !argv.iter().any(|a| a == "--memory" || a == "--cpus"),
            "{argv:?}"
        );
    }

    #[test]
    fn a_session_instance_writes_to_a_tmpfs() {
        let s = spec("", SandboxKey::session("p", "t", "s1"));
        let argv = instance_start(&s);
        assert_eq!(
            &argv[..5],
            [
                "instance",
                "start",
                "--containall",
                "--no-home",
                "--writable-tmpfs"
            ]
        );
        assert_eq!(argv.last().unwrap(), "hermes-p-t-s1");
        assert_eq!(&argv[5..9], ["--memory", "5120M", "--cpus", "1"]);
    }

    #[test]
    fn exec_runs_bash_in_the_directory_with_the_arguments_untouched() {
        let cmd = vec![
            "sh".to_string(),
            "-c".to_string(),
            "echo \"$HOME\" 'a b'".to_string(),
        ];
        assert_eq!(
            exec("hermes-default-default", "/workspace", &cmd),
            [
                "exec",
                "--cleanenv",
                "instance://hermes-default-default",
                "bash",
                "-c",
                EXEC_SCRIPT,
                "hermes",
                "/workspace",
                "sh",
                "-c",
                "echo \"$HOME\" 'a b'",
            ]
        );
    }

    #[test]
    fn stop_list_build_and_kill_are_fixed_lines() {
        assert_eq!(
            instance_stop("hermes-p-t"),
            ["instance", "stop", "hermes-p-t"]
        );
        assert_eq!(instance_list(), ["instance", "list", "--json"]);
        assert_eq!(
            build("/h/cache/x.sif.tmp", "docker://python:3.12"),
            ["build", "/h/cache/x.sif.tmp", "docker://python:3.12"]
        );
        let kill = kill_marked("hermes-p-t", "abc123");
        assert_eq!(
            &kill[..5],
            ["exec", "--cleanenv", "instance://hermes-p-t", "sh", "-c"]
        );
        assert_eq!(&kill[6..], ["sh", "abc123"]);
    }

    #[test]
    fn values_travel_in_prefixed_variables() {
        let values = vec![("OPENAI_API_KEY".to_string(), "openai-tok".to_string())];
        assert_eq!(
            env(Flavor::Apptainer, &values),
            [(
                "APPTAINERENV_OPENAI_API_KEY".to_string(),
                "openai-tok".to_string()
            )]
        );
        assert_eq!(
            env(Flavor::Singularity, &values)[0].0,
            "SINGULARITYENV_OPENAI_API_KEY"
        );
    }

    #[test]
    fn cpu_counts_print_without_noise() {
        assert_eq!(format_cpus(1.0), "1");
        assert_eq!(format_cpus(0.5), "0.5");
        assert_eq!(format_cpus(2.25), "2.25");
    }
}
