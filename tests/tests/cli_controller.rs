//! `hermes controller` against the real engine: edits of config.yaml,
//! containers removed or stopped by hand, invalid edits, a second
//! controller, signals.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use hermes_tests::cli::{Run, TestHome};
use hermes_tests::docker_cli::{ProfileCleanup, containers_of, docker};

/// A running controller, killed if the test ends early.
struct Running {
    child: Child,
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Running {
    fn start(home: &TestHome, profile: &str) -> Running {
        Running::start_to(home, profile, Stdio::null())
    }

    /// [`Running::start`] with its log (stderr) going to `log`.
    fn start_to(home: &TestHome, profile: &str, log: impl Into<Stdio>) -> Running {
        let child = home
            .command(["--profile", profile, "controller"])
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        Running { child }
    }

    /// SIGTERM, then the exit code.
    fn terminate(mut self) -> Option<i32> {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.code();
            }
            assert!(Instant::now() < deadline, "the controller ignored SIGTERM");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// Polls `check` every 100 ms for up to `within`.
fn eventually(within: Duration, what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !check() {
        assert!(Instant::now() < deadline, "not within {within:?}: {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn config(extra: &str) -> String {
    format!(
        "terminal:\n  backend: docker\n  docker_image: {}\n{extra}",
        hermes_tests::test_image()
    )
}

/// Replaces config.yaml the way editors and GitOps tools do: a new file
/// renamed over the old one.
fn write_by_rename(home: &TestHome, text: &str) {
    let tmp = home.path().join(".config.yaml.edit");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, home.config_path()).unwrap();
}

/// A field of the container, or "" while it does not exist (between the
/// remove and the create of a recreate).
fn inspect(name: &str, format: &str) -> String {
    std::process::Command::new("docker")
        .args(["inspect", "--format", format, name])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

#[test]
fn the_controller_converges_edits_removals_and_stops_and_survives_bad_edits() {
    let profile = format!("cc{}", std::process::id());
    let _cleanup = ProfileCleanup(profile.clone());
    let home = TestHome::with_profile(&profile);
    home.write_config(config(""));
    let name = format!("hermes-{profile}-default");
    let log_path = home.path().join("controller.log");
    let controller = Running::start_to(&home, &profile, std::fs::File::create(&log_path).unwrap());
    let running = || containers_of(&profile) == [(name.clone(), "running".to_string())];
    eventually(Duration::from_secs(30), "the sandbox is created", running);

    // A second controller for the same home is refused, naming the holder.
    let second = home.run(["--profile", &profile, "controller"]);
    assert_eq!(second.code, 1, "{second:?}");
    assert!(
        second.stderr.contains(&format!(
            "another controller (pid {})",
            controller.child.id()
        )),
        "{}",
        second.stderr
    );

    let marker = home.run([
        "--profile",
        &profile,
        "exec",
        "--",
        "sh",
        "-c",
        "echo kept > /workspace/marker",
    ]);
    assert_eq!(marker.code, 0, "{marker:?}");

    // An edit renamed into place: recreated with no command run.
    let before = inspect(&name, "{{.Id}}");
    write_by_rename(&home, &config("  container_memory: 1024\n"));
    eventually(Duration::from_secs(15), "recreated with 1 GiB", || {
        containers_of(&profile).len() == 1
            && inspect(&name, "{{.HostConfig.Memory}}") == "1073741824"
            && inspect(&name, "{{.State.Status}}") == "running"
    });
    assert_ne!(inspect(&name, "{{.Id}}"), before);

    // Removed by hand: recreated, and the log names what happened to
    // which container (once the last pass's own events are past).
    eventually(Duration::from_secs(40), "the last pass is 4 s past", || {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let ended = status_field(&home, "last_pass_at").unwrap_or(now)
            + status_field(&home, "last_pass_ms").unwrap_or(0) / 1000
            + 1;
        now >= ended + 4
    });
    docker(&["rm", "-f", &name]);
    eventually(Duration::from_secs(15), "recreated after rm -f", running);
    let log = std::fs::read_to_string(&log_path).unwrap();
    // (kill, die, destroy: those that come before the pass it wakes.)
    assert!(
        log.lines()
            .any(|l| l.contains("container event action=")
                && l.ends_with(&format!("container={name}"))),
        "{log}"
    );
    // Stopped by hand: started again.
    docker(&["stop", "-t", "1", &name]);
    eventually(Duration::from_secs(15), "started after stop", running);

    // An invalid edit touches nothing and is reported with key and line.
    let id = inspect(&name, "{{.Id}}");
    write_by_rename(&home, &config("  container_memory: lots\n"));
    eventually(
        Duration::from_secs(10),
        "status shows the bad config",
        || {
            let status = home.run(["status"]);
            status.stdout.contains("Config:      invalid since")
                && status.stdout.contains("terminal.container_memory")
        },
    );
    assert_eq!(inspect(&name, "{{.Id}}"), id);
    let status = home.run(["status", "--output", "json"]);
    assert_eq!(status.code, 1, "{status:?}");
    let json: serde_json::Value = serde_json::from_str(&status.stdout).unwrap();
    assert_eq!(json["controller"]["running"], true);
    assert_eq!(json["config"]["valid"], false);
    assert!(
        json["controller"]["status"]["config_error"]
            .as_str()
            .unwrap()
            .contains(":4:21: terminal.container_memory:")
    );

    // The next valid edit converges.
    write_by_rename(&home, &config("  container_memory: 2048\n"));
    eventually(Duration::from_secs(15), "recreated with 2 GiB", || {
        inspect(&name, "{{.HostConfig.Memory}}") == "2147483648"
            && inspect(&name, "{{.State.Status}}") == "running"
    });
    let read = home.run([
        "--profile",
        &profile,
        "exec",
        "--",
        "cat",
        "/workspace/marker",
    ]);
    assert_eq!((read.code, read.stdout.as_str()), (0, "kept\n"));
    eventually(Duration::from_secs(10), "status is healthy again", || {
        home.run(["status"]).code == 0
    });

    assert_eq!(controller.terminate(), Some(0));
    // The sandbox outlives the controller.
    assert!(running());
    let after = home.run(["status"]);
    assert!(
        after.stdout.contains("Controller:  not running"),
        "{}",
        after.stdout
    );
}

#[test]
fn sigterm_mid_pass_leaves_no_duplicate_and_the_next_controller_converges() {
    let profile = format!("cs{}", std::process::id());
    let _cleanup = ProfileCleanup(profile.clone());
    let home = TestHome::with_profile(&profile);
    let name = format!("hermes-{profile}-default");
    for round in 0..5u64 {
        write_by_rename(
            &home,
            &config(&format!("  docker_env:\n    ROUND: \"{round}\"\n")),
        );
        let controller = Running::start(&home, &profile);
        // Somewhere inside the first pass (start-up, remove, create, start).
        std::thread::sleep(Duration::from_millis(60 + 70 * round));
        assert_eq!(controller.terminate(), Some(0), "round {round}");
        assert!(
            containers_of(&profile).len() <= 1,
            "round {round}: {:?}",
            containers_of(&profile)
        );
    }
    let once = home.run(["--profile", &profile, "controller", "--once"]);
    assert_eq!(once.code, 0, "{once:?}");
    assert_eq!(
        containers_of(&profile),
        [(name.clone(), "running".to_string())]
    );
    assert_eq!(
        inspect(&name, "{{range .Config.Env}}{{println .}}{{end}}")
            .lines()
            .filter(|l| l.starts_with("ROUND="))
            .collect::<Vec<_>>(),
        ["ROUND=4"]
    );
}

/// The controller's pass count, from its status file.
fn passes(home: &TestHome) -> u64 {
    status_field(home, "passes").unwrap_or(0)
}

/// reconcile.resync_seconds as the controller's last pass read it.
fn resync_seconds(home: &TestHome) -> Option<u64> {
    status_field(home, "resync_seconds")
}

fn status_field(home: &TestHome, field: &str) -> Option<u64> {
    let text = std::fs::read_to_string(home.path().join("run/controller.json")).unwrap_or_default();
    serde_json::from_str::<serde_json::Value>(&text)
        .ok()
        .and_then(|v| v[field].as_u64())
}

/// The pass count once no pass has come for 3 s (longer than the longest
/// a burst's follow-up pass waits, 2 s), waited for at most 60 s. A pass
/// that does not come leaves no trace: quiet for a while is the only
/// sign that nothing more is on its way.
fn settled(home: &TestHome) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut last = passes(home);
    loop {
        std::thread::sleep(Duration::from_secs(3));
        let now = passes(home);
        if now == last {
            return now;
        }
        assert!(Instant::now() < deadline, "passes never stopped coming");
        last = now;
    }
}

/// A change is acted on at once, a burst of writes (renames and in-place
/// saves, 10 ms apart) makes at most two passes, and a file being written
/// in place is not read before its writer closes it.
#[test]
fn a_change_starts_a_pass_at_once_and_a_burst_makes_at_most_two() {
    use std::io::Write;
    let profile = format!("cb{}", std::process::id());
    let _cleanup = ProfileCleanup(profile.clone());
    let home = TestHome::with_profile(&profile);
    let name = format!("hermes-{profile}-default");
    // No resync pass can come in between: only config changes wake it.
    write_by_rename(&home, &config("reconcile:\n  resync_seconds: 3600\n"));
    let _controller = Running::start(&home, &profile);
    eventually(Duration::from_secs(60), "the sandbox runs", || {
        containers_of(&profile) == [(name.clone(), "running".to_string())]
    });
    // The start's own container events settle.
    let before = settled(&home);

    let mut written = Vec::new();
    for i in 0..10u64 {
        let text = config(&format!("reconcile:\n  resync_seconds: {}\n", 3600 + i));
        if i % 2 == 0 {
            write_by_rename(&home, &text);
        } else {
            std::fs::write(home.config_path(), text).unwrap();
        }
        written.push(Instant::now());
        std::thread::sleep(Duration::from_millis(10));
    }
    // A write that comes 100 ms (the controller's settle time) or more
    // after the one before starts a burst of its own, by the controller's
    // rule: a loaded machine can stall this thread that long.
    let gaps: Vec<Duration> = written.windows(2).map(|w| w[1] - w[0]).collect();
    let bursts = 1 + gaps
        .iter()
        .filter(|g| **g >= Duration::from_millis(100))
        .count() as u64;
    // A pass read the last write; the burst's follow-up, if any, has had
    // its chance once no pass comes for a while.
    eventually(
        Duration::from_secs(60),
        "a pass read the last write",
        || resync_seconds(&home) == Some(3609),
    );
    let burst = settled(&home) - before;
    assert!(
        (1..=2 * bursts).contains(&burst),
        "{bursts} burst(s) of 10 writes made {burst} passes; the gaps: {gaps:?}"
    );

    // Written in place in two steps, 1.5 s apart: the half (a valid file
    // that would recreate the sandbox with 256 MB) is never acted on.
    let id = inspect(&name, "{{.Id}}");
    let before = passes(&home);
    let full = config("  container_memory: 2560\nreconcile:\n  resync_seconds: 3600\n");
    let half = full.find("2560").unwrap() + 3;
    let mut file = std::fs::File::create(home.config_path()).unwrap();
    file.write_all(&full.as_bytes()[..half]).unwrap();
    file.flush().unwrap();
    // Nothing shows that the watch has seen the write and let it be: time
    // is the only witness here. A slow machine can only make this pass
    // for want of a chance, never fail it.
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(passes(&home), before, "a pass read the half-written file");
    assert_eq!(inspect(&name, "{{.Id}}"), id);
    file.write_all(&full.as_bytes()[half..]).unwrap();
    drop(file);
    eventually(Duration::from_secs(60), "the sandbox is recreated", || {
        inspect(&name, "{{.HostConfig.Memory}}") == (2560u64 * 1024 * 1024).to_string()
    });
}

/// The controller's status file, as JSON.
fn controller_status(home: &TestHome) -> serde_json::Value {
    let path = home.path().join("run").join("controller.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

#[test]
fn a_local_only_host_converges_without_a_docker_engine() {
    let profile = format!("cl{}", std::process::id());
    let home = TestHome::with_profile(&profile);
    let port = hermes_tests::egress::free_port_pair(None);
    home.write_config(format!(
        "terminal:\n  backend: local\nproxy:\n  enabled: true\n  tunnel_port: {port}\n"
    ));
    // The pass starts the proxy: stopped when the test ends.
    let _stop = hermes_tests::egress::StopProxy(&home);
    // Nothing listens there: no engine on this host.
    let nowhere = home.path().join("no-docker.sock");
    let docker_host = format!("unix://{}", nowhere.display());

    let dry = home
        .command([
            "--profile",
            &profile,
            "reconcile",
            "--dry-run",
            "--output",
            "json",
        ])
        .env("DOCKER_HOST", &docker_host)
        .output()
        .unwrap();
    assert_eq!(dry.status.code(), Some(2), "changes pending: {dry:?}");
    let plan: serde_json::Value = serde_json::from_slice(&dry.stdout).unwrap();
    // The setup, then the start once set up: two stages of one plan.
    let mut ops: Vec<&serde_json::Value> = plan["operations"].as_array().unwrap().iter().collect();
    for stage in plan["stages"].as_array().into_iter().flatten() {
        ops.extend(stage["operations"].as_array().unwrap());
    }
    let planned: Vec<String> = ops
        .iter()
        .map(|op| format!("{}/ok", op["action"].as_str().unwrap()))
        .collect();
    assert_eq!(planned, ["setup/ok", "start/ok"], "the dry run: {plan}");

    let once = home
        .command(["--profile", &profile, "controller", "--once"])
        .env("DOCKER_HOST", &docker_host)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&once.stderr);
    assert_eq!(once.status.code(), Some(0), "controller --once: {stderr}");
    assert!(!stderr.contains("engine"), "no word of an engine: {stderr}");
    let status = controller_status(&home);
    assert_eq!(status["last_error"], serde_json::Value::Null, "{status}");
    assert_eq!(
        status["engine_unreachable_since"],
        serde_json::Value::Null,
        "{status}"
    );
    // Exactly what the dry run printed, nothing else.
    let done: Vec<String> = status["operations"]
        .as_object()
        .unwrap()
        .keys()
        .cloned()
        .collect();
    assert_eq!(done, planned, "{status}");
    assert!(home.path().join("proxy").join("ca.crt").exists());
}

/// One log line: its level, message and `action` field (an operation's).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Event {
    level: String,
    message: String,
    action: Option<String>,
}

/// A text line of tracing's format: `TIME LEVEL [span{…}: ]module: message
/// key=value …`.
fn text_event(line: &str) -> Event {
    let mut words = line.split_whitespace();
    let _time = words.next();
    let level = words.next().unwrap_or_default().to_string();
    let unexpected = || panic!("not a log line of tracing's text format: {line:?}");
    let rest = line
        .split_once(&format!(" {level} "))
        .unwrap_or_else(unexpected)
        .1;
    let rest = rest.split_once("hermes::").unwrap_or_else(unexpected).1;
    let rest = rest.split_once(": ").unwrap_or_else(unexpected).1;
    // The message ends where the first `key=` field starts.
    let fields_at = rest
        .match_indices(' ')
        .map(|(i, _)| i)
        .find(|&i| {
            let word = &rest[i + 1..];
            word.split_once('=').is_some_and(|(key, _)| {
                !key.is_empty() && key.chars().all(|c| c.is_ascii_lowercase() || c == '_')
            })
        })
        .unwrap_or(rest.len());
    let action = rest[fields_at..].split_once(" action=").map(|(_, v)| {
        let value = v.split_whitespace().next().unwrap_or_default();
        value.trim_matches('"').to_string()
    });
    Event {
        level,
        message: rest[..fields_at].to_string(),
        action,
    }
}

fn json_event(line: &str) -> Event {
    let json: serde_json::Value =
        serde_json::from_str(line).unwrap_or_else(|e| panic!("not a JSON line ({e}): {line}"));
    Event {
        level: json["level"].as_str().unwrap().to_string(),
        message: json["fields"]["message"].as_str().unwrap().to_string(),
        action: json["fields"]["action"].as_str().map(str::to_string),
    }
}

/// Runs a controller at the default log level, its stderr in a file, with
/// `--log-format FORMAT`, through: the first pass (a create, with a
/// warning about the config), idle passes (the warning still stands), an
/// invalid edit, its repair (a recreate), idle again, SIGTERM. Checks the
/// quiet times on the way; returns the lines, the home's path written
/// `HOME`.
fn controller_log(format: &str) -> String {
    let profile = format!("cg{}{format}", std::process::id());
    let _cleanup = ProfileCleanup(profile.clone());
    let home = TestHome::with_profile(&profile);
    let name = format!("hermes-{profile}-default");
    // A pass every second, so that idle passes happen while we watch.
    let resync = "reconcile:\n  resync_seconds: 1\n";
    write_by_rename(&home, &config(&format!("{resync}unknown_key: 1\n")));
    let log_path = home.path().join("controller.log");
    let log_file = std::fs::File::create(&log_path).unwrap();
    // `command` clears RUST_LOG: the default level.
    let child = home
        .command(["--profile", &profile, "--log-format", format, "controller"])
        .stdout(Stdio::null())
        .stderr(log_file)
        .spawn()
        .unwrap();
    let controller = Running { child };
    let log = || std::fs::read_to_string(&log_path).unwrap();
    let count = |what: &str| log().matches(what).count();

    eventually(Duration::from_secs(60), "the first pass applied", || {
        count("pass applied its plan") == 1
            && containers_of(&profile) == [(name.clone(), "running".to_string())]
    });
    // Quiet through `idle` passes (a second apart), counted from the one
    // after the last that acted (the container's own events settle).
    let quiet = |idle: u64, when: &str| {
        let acted = passes(&home);
        eventually(Duration::from_secs(60), "a pass after the last", || {
            passes(&home) > acted
        });
        let (before, passes_before) = (log(), passes(&home));
        eventually(Duration::from_secs(120), "idle passes", || {
            passes(&home) >= passes_before + idle
        });
        assert_eq!(log(), before, "{when}: lines while idle");
    };
    quiet(4, "after the create");

    write_by_rename(
        &home,
        &config(&format!("  container_memory: lots\n{resync}")),
    );
    eventually(Duration::from_secs(15), "the error is logged", || {
        count("config.yaml cannot be used") == 1
    });
    // Passes go on with the bad file: the error is said once.
    let passes_before = passes(&home);
    eventually(Duration::from_secs(15), "passes go on", || {
        passes(&home) >= passes_before + 2
    });
    assert_eq!(count("config.yaml cannot be used"), 1, "{}", log());

    write_by_rename(
        &home,
        &config(&format!("  container_memory: 1024\n{resync}")),
    );
    eventually(Duration::from_secs(60), "the repair is applied", || {
        count("config.yaml is valid again") == 1 && count("pass applied its plan") == 2
    });
    quiet(3, "after the recreate");
    assert_eq!(controller.terminate(), Some(0));
    log().replace(&home.path().display().to_string(), "HOME")
}

/// At the default level the controller says what it does and nothing else:
/// a line per operation done and one for its pass, a line for an error and
/// one for its recovery, nothing while idle; `--log-format json` gives the
/// same lines as JSON; no colour codes in a file.
#[test]
fn the_controller_logs_each_change_error_and_recovery_and_nothing_while_idle() {
    let text = controller_log("text");
    let json = controller_log("json");
    for log in [&text, &json] {
        assert!(!log.contains('\x1b'), "colour codes in a file:\n{log}");
    }
    let text_events: Vec<Event> = text.lines().map(text_event).collect();
    let json_events: Vec<Event> = json.lines().map(json_event).collect();
    let event = |level: &str, message: &str, action: Option<&str>| Event {
        level: level.to_string(),
        message: message.to_string(),
        action: action.map(str::to_string),
    };
    assert_eq!(
        text_events,
        [
            event("INFO", "controller started", None),
            event(
                "WARN",
                "HOME/config.yaml:6:1: unknown_key: unknown key, ignored",
                None
            ),
            event("INFO", "done", Some("create")),
            event("INFO", "pass applied its plan", None),
            event(
                "ERROR",
                "config.yaml cannot be used; the last good config stands",
                None
            ),
            event("INFO", "config.yaml is valid again", None),
            event("INFO", "done", Some("recreate")),
            event("INFO", "pass applied its plan", None),
            event(
                "INFO",
                "stopping after the operation in flight (a second signal exits at once)",
                None
            ),
            event("INFO", "controller stopped", None),
        ],
        "{text}"
    );
    assert_eq!(json_events, text_events, "{json}");
    // Each operation's line names what it acted on and how it ended; in
    // JSON as `fields.resource`, apart from the top-level `target` (the
    // module that logged it).
    let done = text.lines().find(|l| l.contains(" done ")).unwrap();
    assert!(done.contains("resource=sandbox"), "{done}");
    let done: serde_json::Value = json
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|l| l["fields"]["message"] == "done")
        .unwrap();
    assert!(
        done["fields"]["resource"]
            .as_str()
            .unwrap()
            .starts_with("sandbox "),
        "{done}"
    );
    assert!(done["fields"].get("target").is_none(), "{done}");
    // The start line says who and where; the first pass is the start's.
    let started = text.lines().next().unwrap();
    assert!(
        started.contains("controller started") && started.contains("home=HOME"),
        "{started}"
    );
    let first = text
        .lines()
        .find(|l| l.contains("pass{"))
        .unwrap_or_default();
    assert!(first.contains("trigger=\"start\""), "{text}");
    let pass = text
        .lines()
        .find(|l| l.contains("pass applied its plan"))
        .unwrap();
    assert!(pass.contains("done=1 failed=0"), "{pass}");
    let error = text.lines().find(|l| l.contains("ERROR")).unwrap();
    assert!(error.contains("terminal.container_memory"), "{error}");
}

/// An operation that fails is one log line per try (the error, the
/// failure count and the retry), none on stderr beside the log, and its
/// recovery is the operation's `done` line.
#[test]
fn a_failed_operation_is_one_line_per_try_and_its_recovery_one() {
    let profile = format!("cf{}", std::process::id());
    let _cleanup = ProfileCleanup(profile.clone());
    let home = TestHome::with_profile(&profile);
    let name = format!("hermes-{profile}-default");
    // More CPUs than the host has: the engine refuses the create.
    write_by_rename(&home, &config("  container_cpu: 4096\n"));
    let log_path = home.path().join("controller.log");
    let child = home
        .command(["--profile", &profile, "controller"])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log_path).unwrap())
        .spawn()
        .unwrap();
    let controller = Running { child };
    let log = || std::fs::read_to_string(&log_path).unwrap();
    eventually(Duration::from_secs(30), "the create fails", || {
        log().contains("operation failed")
    });
    write_by_rename(&home, &config("  container_cpu: 1\n"));
    eventually(Duration::from_secs(60), "the create is done", || {
        containers_of(&profile) == [(name.clone(), "running".to_string())]
            && log().contains(" done ")
    });
    assert_eq!(controller.terminate(), Some(0));
    let log = log();
    let events: Vec<Event> = log.lines().map(text_event).collect();
    let failures: Vec<&Event> = events
        .iter()
        .filter(|e| e.message == "operation failed")
        .collect();
    assert!(!failures.is_empty(), "{log}");
    assert!(
        failures.iter().all(|e| e.level == "WARN"),
        "one line per failure, at WARN:\n{log}"
    );
    let tries = log
        .lines()
        .filter(|l| l.contains("pass applied its plan") && l.contains("failed=1"))
        .count();
    assert_eq!(failures.len(), tries, "one line per try:\n{log}");
    let failure = log
        .lines()
        .find(|l| l.contains("operation failed"))
        .unwrap();
    for part in [
        "resource=sandbox",
        "Range of CPUs",
        "failures=1",
        "retry_in_ms=",
    ] {
        assert!(failure.contains(part), "{part}: {failure}");
    }
    assert_eq!(
        events
            .iter()
            .filter(|e| e.message == "done")
            .map(|e| e.action.as_deref())
            .collect::<Vec<_>>(),
        [Some("create")],
        "{log}"
    );
}

/// `controller --once` is a check a script can trust: with the Docker
/// engine away its pass cannot go through, and it exits 1. `status` then
/// gives that stopped controller's last report as history, never an engine
/// line of its own beside the live one.
#[test]
fn once_with_the_engine_away_exits_1_and_status_calls_its_report_history() {
    let home = TestHome::new();
    home.write_config("terminal:\n  backend: docker\n");
    let away = "unix:///nonexistent/hermes-once-test.sock";
    let once: Run = home
        .command(["controller", "--once"])
        .env("DOCKER_HOST", away)
        .output()
        .unwrap()
        .into();
    assert_eq!(once.code, 1, "{once:?}");
    assert!(once.stderr.contains("controller started"), "{once:?}");
    let status: Run = home
        .command(["status"])
        .env("DOCKER_HOST", away)
        .output()
        .unwrap()
        .into();
    assert!(
        status
            .stdout
            .contains("Controller:  not running\n  Its last report, from before it stopped:\n"),
        "{}",
        status.stdout
    );
    assert!(
        !status.stdout.contains("Engine:      "),
        "{}",
        status.stdout
    );
}
