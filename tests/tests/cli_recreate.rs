//! A recreate on the Docker backend creates before it removes: a spec the
//! engine refuses leaves the old sandbox running, and a temporary container
//! left behind by a pass cut short is converged by the next one. The real
//! binary against the real engine and the test image.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use hermes_tests::cli::{Run, TestHome};
use hermes_tests::docker_cli::{ProfileCleanup, containers_of, docker};

fn config(extra: &str) -> String {
    format!(
        "terminal:\n  backend: docker\n  docker_image: {}\n{extra}",
        hermes_tests::test_image()
    )
}

fn id_of(name: &str) -> String {
    docker(&["inspect", "--format", "{{.Id}}", name])
        .trim()
        .to_string()
}

fn hermes<'a>(home: &'a TestHome, profile: &'a str) -> impl Fn(&[&str]) -> Run + 'a {
    move |args: &[&str]| {
        let mut all = vec!["--profile", profile];
        all.extend_from_slice(args);
        home.run(all)
    }
}

#[test]
fn a_recreate_the_engine_refuses_keeps_the_old_sandbox_running() {
    let profile = format!("cbr{}", std::process::id());
    let home = TestHome::with_profile(&profile);
    let _cleanup = ProfileCleanup(profile.clone());
    let hermes = hermes(&home, &profile);
    home.write_config(config(""));
    assert_eq!(hermes(&["reconcile"]).code, 0);
    let write = hermes(&["exec", "--", "sh", "-c", "echo kept > /workspace/marker"]);
    assert_eq!(write.code, 0, "{write:?}");
    let name = format!("hermes-{profile}-default");
    let old_id = id_of(&name);

    // Valid to `config check`, refused by the engine: a capability it does
    // not know at the create, a device missing on the host at the start.
    for (extra, reason) in [
        ("--cap-add=HERMESBOGUS", "unknown capability"),
        (
            "--device=/dev/hermes-no-such-device",
            "error gathering device information",
        ),
    ] {
        home.write_config(config(&format!("  docker_extra_args: [\"{extra}\"]\n")));
        let check = hermes(&["config", "check"]);
        assert_eq!(check.code, 0, "{check:?}");
        let dry = hermes(&["reconcile", "--dry-run"]);
        assert_eq!(dry.code, 2, "{dry:?}");
        assert!(dry.stdout.contains("recreate"), "{}", dry.stdout);
        let failed = hermes(&["reconcile"]);
        assert_eq!(failed.code, 1, "{failed:?}");
        assert!(
            failed.stderr.contains(reason),
            "the engine's reason: {}",
            failed.stderr
        );
        assert!(failed.stderr.contains("recreate"), "{}", failed.stderr);
        // The old sandbox, running, alone, with its files.
        assert_eq!(
            containers_of(&profile),
            [(name.clone(), "running".to_string())],
            "{extra}"
        );
        assert_eq!(id_of(&name), old_id, "{extra}");
        assert_eq!(
            docker(&["exec", &name, "cat", "/workspace/marker"]),
            "kept\n"
        );
    }

    // A valid change recreates it: a new container, the files kept.
    home.write_config(config("  container_memory: 1024\n"));
    let apply = hermes(&["reconcile"]);
    assert_eq!(apply.code, 0, "{apply:?}");
    assert_eq!(
        containers_of(&profile),
        [(name.clone(), "running".to_string())]
    );
    assert_ne!(id_of(&name), old_id);
    let read = hermes(&["exec", "--", "cat", "/workspace/marker"]);
    assert_eq!((read.code, read.stdout.as_str()), (0, "kept\n"));
    assert_eq!(hermes(&["reconcile", "--dry-run"]).code, 0);
}

/// A container as a recreate cut short after its create leaves it: the
/// labels of `name`'s container, the marker, a temporary name, not started.
fn leftover_next(name: &str) -> String {
    let labels = docker(&[
        "inspect",
        "--format",
        "{{range $k, $v := .Config.Labels}}{{$k}}={{$v}}\n{{end}}",
        name,
    ]);
    let next = format!("{name}-next-0badc0de");
    let mut args = vec!["create".to_string(), "--name".into(), next.clone()];
    for label in labels.lines().filter(|l| !l.is_empty()) {
        args.push("--label".into());
        args.push(label.to_string());
    }
    args.extend([
        "--label".into(),
        format!("hermes-next={name}"),
        hermes_tests::test_image(),
        "sleep".into(),
        "infinity".into(),
    ]);
    docker(&args.iter().map(String::as_str).collect::<Vec<_>>());
    next
}

#[test]
fn a_recreate_cut_short_is_converged_by_the_next_pass() {
    let profile = format!("cbs{}", std::process::id());
    let home = TestHome::with_profile(&profile);
    let _cleanup = ProfileCleanup(profile.clone());
    let hermes = hermes(&home, &profile);
    home.write_config(config(""));
    assert_eq!(hermes(&["reconcile"]).code, 0);
    let write = hermes(&["exec", "--", "sh", "-c", "echo kept > /workspace/marker"]);
    assert_eq!(write.code, 0, "{write:?}");
    let name = format!("hermes-{profile}-default");
    let old_id = id_of(&name);

    // Cut short after the create: the old sandbox still runs, and the
    // temporary container is removed by a planned operation.
    let next = leftover_next(&name);
    let dry = hermes(&["reconcile", "--dry-run"]);
    assert_eq!(dry.code, 2, "{dry:?}");
    assert!(
        dry.stdout
            .contains(&format!("remove      duplicate {next}")),
        "{}",
        dry.stdout
    );
    assert_eq!(hermes(&["reconcile"]).code, 0);
    assert_eq!(
        containers_of(&profile),
        [(name.clone(), "running".to_string())]
    );
    assert_eq!(id_of(&name), old_id);

    // Cut short after the new one's start: the old one stopped, the
    // temporary one running. The old one is removed by a planned
    // operation, the new one recreated under the sandbox's name.
    let next = leftover_next(&name);
    docker(&["stop", "-t", "0", &name]);
    docker(&["start", &next]);
    let dry = hermes(&["reconcile", "--dry-run"]);
    assert_eq!(dry.code, 2, "{dry:?}");
    assert!(
        dry.stdout
            .contains(&format!("remove      duplicate {name}")),
        "{}",
        dry.stdout
    );
    let apply = hermes(&["reconcile"]);
    assert_eq!(apply.code, 0, "{apply:?}");
    assert_eq!(
        containers_of(&profile),
        [(name.clone(), "running".to_string())]
    );
    let read = hermes(&["exec", "--", "cat", "/workspace/marker"]);
    assert_eq!((read.code, read.stdout.as_str()), (0, "kept\n"));

    // Cut short after the old one's removal: only the temporary container
    // is left; the next pass puts a sandbox under the right name, running,
    // with the files.
    let next = leftover_next(&name);
    docker(&["rm", "-f", &name]);
    let apply = hermes(&["reconcile"]);
    assert_eq!(apply.code, 0, "{apply:?}");
    assert_eq!(
        containers_of(&profile),
        [(name.clone(), "running".to_string())]
    );
    assert!(
        !docker(&["ps", "-a", "--format", "{{.Names}}"])
            .lines()
            .any(|n| n == next),
        "{next} is left"
    );
    let read = hermes(&["exec", "--", "cat", "/workspace/marker"]);
    assert_eq!((read.code, read.stdout.as_str()), (0, "kept\n"));
    assert_eq!(hermes(&["reconcile", "--dry-run"]).code, 0);
}

/// Spawns `hermes --profile P ARGS…` with stdout and stderr piped.
fn spawn(home: &TestHome, profile: &str, args: &[&str]) -> std::process::Child {
    let mut all = vec!["--profile", profile];
    all.extend_from_slice(args);
    home.command(all)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

#[test]
fn a_reconcile_interrupted_while_it_waits_for_a_command_changes_nothing() {
    use std::io::{BufRead, Read};
    use std::time::{Duration, Instant};
    let profile = format!("cbi{}", std::process::id());
    let home = TestHome::with_profile(&profile);
    let _cleanup = ProfileCleanup(profile.clone());
    let hermes = hermes(&home, &profile);
    home.write_config(config(""));
    assert_eq!(hermes(&["reconcile"]).code, 0);
    let name = format!("hermes-{profile}-default");
    let old_id = id_of(&name);

    // A command runs in the sandbox; then an edit makes its recreate due.
    let command = spawn(
        &home,
        &profile,
        &[
            "exec",
            "--",
            "touch /workspace/started; sleep 15; echo finished",
        ],
    );
    let until = Instant::now() + Duration::from_secs(60);
    while docker(&[
        "exec",
        &name,
        "sh",
        "-c",
        "test -e /workspace/started && echo yes || true",
    ]) != "yes\n"
    {
        assert!(Instant::now() < until, "the command did not start");
        std::thread::sleep(Duration::from_millis(100));
    }
    home.write_config(config("  container_memory: 2048\n"));

    // The reconcile says that it waits; Ctrl-C then stops it at once.
    let mut reconcile = spawn(&home, &profile, &["reconcile"]);
    let stderr = reconcile.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut said = Vec::new();
    loop {
        let line = rx
            .recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|e| panic!("no word of the wait ({e}): {said:?}"));
        let waiting = line.contains("waiting up to 10 s for the commands running in it to end");
        said.push(line);
        if waiting {
            break;
        }
    }
    let interrupted = Instant::now();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(reconcile.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let status = reconcile.wait().unwrap();
    let stopped_after = interrupted.elapsed();
    said.extend(rx.try_iter());
    let mut stdout = String::new();
    reconcile
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut stdout)
        .unwrap();
    let said = said.join("\n");
    assert_eq!(status.code(), Some(130), "{said}\n{stdout}");
    assert!(stopped_after < Duration::from_secs(3), "{stopped_after:?}");
    assert!(said.contains("cancelled before anything changed"), "{said}");
    assert!(said.contains("stopped by a signal"), "{said}");

    // Nothing changed: the old sandbox alone, running, no temporary
    // container; its command runs on to its end.
    assert_eq!(
        containers_of(&profile),
        [(name.clone(), "running".to_string())]
    );
    assert_eq!(id_of(&name), old_id);
    let ran = command.wait_with_output().unwrap();
    assert_eq!(
        (
            ran.status.code(),
            String::from_utf8_lossy(&ran.stdout).as_ref()
        ),
        (Some(0), "finished\n"),
        "{ran:?}"
    );
    // The next plan is the recreate, and no duplicate to remove.
    let dry = hermes(&["reconcile", "--dry-run"]);
    assert_eq!(dry.code, 2, "{dry:?}");
    assert!(dry.stdout.contains("recreate"), "{}", dry.stdout);
    assert!(!dry.stdout.contains("duplicate"), "{}", dry.stdout);
}

/// Runs `hermes --profile P reconcile ARGS…` on a terminal (a pty made by
/// util-linux's `script`), typing `answer`: (exit code, what the terminal
/// showed).
fn on_a_terminal(home: &TestHome, profile: &str, args: &str, answer: &str) -> (i32, String) {
    use std::io::Write;
    let line = format!(
        "{} --home {} --profile {profile} reconcile {args}",
        hermes_tests::cli::hermes_bin().display(),
        home.path().display()
    );
    let mut child = std::process::Command::new("script")
        .args(["-qec", &line, "/dev/null"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("script (util-linux) runs");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(answer.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

#[test]
fn on_a_terminal_a_recreate_asks_first_and_a_no_changes_nothing() {
    let profile = format!("cbq{}", std::process::id());
    let home = TestHome::with_profile(&profile);
    let _cleanup = ProfileCleanup(profile.clone());
    let hermes = hermes(&home, &profile);
    home.write_config(config(""));
    // A create stops nothing: no question, on a terminal either.
    let (code, shown) = on_a_terminal(&home, &profile, "", "");
    assert_eq!(code, 0, "{shown}");
    assert!(!shown.contains("Carry it out?"), "{shown}");
    let name = format!("hermes-{profile}-default");
    let old_id = id_of(&name);

    home.write_config(config("  container_memory: 2048\n"));
    let (code, shown) = on_a_terminal(&home, &profile, "", "n\n");
    assert_eq!(code, 1, "{shown}");
    assert!(
        shown.contains(&format!(
            "This plan stops what runs in, or removes: recreate sandbox {profile}/default."
        )),
        "{shown}"
    );
    assert!(
        shown.contains("Not carried out: nothing was changed."),
        "{shown}"
    );
    assert_eq!(id_of(&name), old_id, "a no recreated it");
    // Yes carries it out; so does --yes without a question.
    let (code, shown) = on_a_terminal(&home, &profile, "", "y\n");
    assert_eq!(code, 0, "{shown}");
    assert_ne!(id_of(&name), old_id, "{shown}");
    home.write_config(config("  container_memory: 1024\n"));
    let again = id_of(&name);
    let (code, shown) = on_a_terminal(&home, &profile, "--yes", "");
    assert_eq!(code, 0, "{shown}");
    assert!(!shown.contains("Carry it out?"), "{shown}");
    assert_ne!(id_of(&name), again);
    // Without a terminal it never asks.
    home.write_config(config("  container_memory: 2048\n"));
    let run = hermes(&["reconcile"]);
    assert_eq!(run.code, 0, "{run:?}");
}
