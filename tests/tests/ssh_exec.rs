//! `hermes exec` on the ssh backend against a real OpenSSH server: output,
//! exit codes, input, environment and directories; large output; a
//! timeout that kills the remote process tree; one login shared by every
//! exec; a restarted server or a killed holder replaced once; a changed
//! host key refused with both fingerprints; the controller converging the
//! host with no Docker engine.

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use hermes_tests::cli::{Run, TestHome};
use hermes_tests::sshd::Sshd;

fn home_for(sshd: &Sshd, extra: &str) -> TestHome {
    let home = TestHome::new();
    home.write_config(sshd.config(extra));
    home
}

fn exec(home: &TestHome, args: &[&str]) -> Run {
    let mut all = vec!["exec"];
    all.extend_from_slice(args);
    home.run(all)
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o777
}

fn holder_socket(home: &TestHome) -> PathBuf {
    let run = home.path().join("run");
    std::fs::read_dir(&run)
        .unwrap_or_else(|e| panic!("{}: {e}", run.display()))
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "sock"))
        .unwrap_or_else(|| panic!("no holder socket in {}", run.display()))
}

#[test]
fn exec_streams_output_with_the_exit_code_input_environment_and_directories() {
    let sshd = Sshd::start();
    let home = home_for(&sshd, "");

    let run = exec(&home, &["--", "sh", "-c", "echo out; echo err >&2; exit 7"]);
    assert_eq!(run.code, 7, "{run:?}");
    assert_eq!(run.stdout, "out\n");
    assert!(run.stderr.contains("err\n"), "{run:?}");

    // The default directory is the task's workspace, made on first use.
    let run = exec(&home, &["--", "pwd"]);
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(
        run.stdout,
        "/home/hermes/.hermes-sandbox/default/default/workspace\n"
    );
    let run = exec(&home, &["--task", "t2", "--cwd", "/tmp", "--", "pwd"]);
    assert_eq!((run.code, run.stdout.as_str()), (0, "/tmp\n"), "{run:?}");

    // Environment values arrive as given and never on a command line.
    let value = "s3cr3t value with 'quotes' and $dollars\nand a newline";
    let run = exec(
        &home,
        &[
            "--env",
            &format!("SECRET={value}"),
            "--",
            "sh",
            "-c",
            "printf %s \"$SECRET\"; ps -eo args | grep -c '[s]3cr3t' || true",
        ],
    );
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(run.stdout, format!("{value}0\n"));

    // Standard input reaches the command.
    let input: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    let mut child = home
        .command(["exec", "--", "sh", "-c", "cksum"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn: {e}"));
    child
        .stdin
        .take()
        .unwrap_or_else(|| panic!("no stdin"))
        .write_all(&input)
        .unwrap_or_else(|e| panic!("write: {e}"));
    let out: Run = child
        .wait_with_output()
        .unwrap_or_else(|e| panic!("wait: {e}"))
        .into();
    let mut local = std::process::Command::new("cksum")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cksum: {e}"));
    local
        .stdin
        .take()
        .unwrap_or_else(|| panic!("no stdin"))
        .write_all(&input)
        .unwrap_or_else(|e| panic!("write: {e}"));
    let expected = local
        .wait_with_output()
        .unwrap_or_else(|e| panic!("cksum: {e}"));
    assert_eq!(out.code, 0, "{out:?}");
    assert_eq!(out.stdout, String::from_utf8_lossy(&expected.stdout));

    // The files of the connection are the user's alone.
    let known_hosts = home.path().join("known_hosts");
    assert_eq!(mode(&known_hosts), 0o600);
    let recorded = std::fs::read_to_string(&known_hosts).unwrap_or_default();
    assert!(
        recorded.starts_with(&format!("{} ssh-", sshd.host)),
        "{recorded}"
    );
    assert_eq!(mode(&home.path().join("run")), 0o700);
    assert_eq!(mode(&holder_socket(&home)), 0o600);
}

#[test]
fn large_output_arrives_whole() {
    let sshd = Sshd::start();
    let home = home_for(&sshd, "");
    let run = exec(&home, &["--", "seq", "1", "1000000"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let expected: String = (1..=1_000_000).map(|i| format!("{i}\n")).collect();
    assert_eq!(run.stdout.len(), expected.len());
    assert!(run.stdout == expected, "the output differs");
}

#[test]
fn a_timeout_kills_the_whole_remote_process_tree() {
    let sshd = Sshd::start();
    let home = home_for(&sshd, "");
    let started = Instant::now();
    let run = exec(
        &home,
        &[
            "--timeout",
            "2",
            "--",
            "sh",
            "-c",
            "sleep 311 & (sleep 312 &); sleep 313; echo never",
        ],
    );
    assert_eq!(run.code, 124, "{run:?}");
    assert!(
        run.stderr.contains("[Command timed out after 2s]"),
        "{run:?}"
    );
    assert!(!run.stdout.contains("never"));
    assert!(started.elapsed() < Duration::from_secs(30));
    // Looked at over a second channel, and from inside the container.
    let seen = exec(&home, &["--", "ps", "-eo", "args"]);
    assert_eq!(seen.code, 0, "{seen:?}");
    assert!(!seen.stdout.contains("sleep 31"), "{}", seen.stdout);
    let witness = sshd.exec(&["ps", "-eo", "args"]);
    assert!(!witness.contains("sleep 31"), "{witness}");
}

#[test]
fn every_exec_shares_one_login_and_a_restarted_server_is_reconnected_once() {
    let sshd = Sshd::start();
    let home = home_for(&sshd, "");
    for i in 0..3 {
        let run = exec(&home, &["--", "echo", &i.to_string()]);
        assert_eq!(
            (run.code, run.stdout.as_str()),
            (0, format!("{i}\n").as_str()),
            "{run:?}"
        );
    }
    assert_eq!(sshd.logins(), 1, "{}", sshd.log());

    sshd.restart();
    let run = exec(&home, &["--", "echo", "again"]);
    assert_eq!((run.code, run.stdout.as_str()), (0, "again\n"), "{run:?}");
    let run = exec(&home, &["--", "echo", "and again"]);
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(sshd.logins(), 2, "{}", sshd.log());
}

#[test]
fn a_killed_holder_is_replaced_and_an_idle_one_ends_by_itself() {
    let sshd = Sshd::start();
    let home = home_for(&sshd, "  ssh_persist_seconds: 3\n");
    assert_eq!(exec(&home, &["--", "true"]).code, 0);
    let lock = holder_socket(&home).with_extension("lock");
    let pid = std::fs::read_to_string(&lock).unwrap_or_default();
    let pid: i32 = pid
        .trim()
        .parse()
        .unwrap_or_else(|e| panic!("pid {pid:?}: {e}"));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap_or_else(|e| panic!("kill {pid}: {e}"));
    let run = exec(&home, &["--", "echo", "still here"]);
    assert_eq!(
        (run.code, run.stdout.as_str()),
        (0, "still here\n"),
        "{run:?}"
    );
    assert_eq!(sshd.logins(), 2, "{}", sshd.log());

    // Three idle seconds later the holder has gone, and taken its socket.
    let socket = holder_socket(&home);
    let deadline = Instant::now() + Duration::from_secs(15);
    while socket.exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(!socket.exists(), "the idle holder is still there");
    let run = exec(&home, &["--", "echo", "back"]);
    assert_eq!((run.code, run.stdout.as_str()), (0, "back\n"), "{run:?}");
}

#[test]
fn a_changed_host_key_is_refused_with_both_fingerprints() {
    let sshd = Sshd::start();
    let home = home_for(&sshd, "");
    assert_eq!(exec(&home, &["--", "true"]).code, 0);
    let old = sshd.host_key_fingerprint();
    sshd.change_host_keys();
    let new = sshd.host_key_fingerprint();
    assert_ne!(old, new);
    let before = sshd.logins();

    let run = exec(&home, &["--", "echo", "must not run"]);
    assert_eq!(run.code, 1, "{run:?}");
    assert!(!run.stdout.contains("must not run"));
    for needle in [
        old.as_str(),
        new.as_str(),
        sshd.host.as_str(),
        "ssh-keygen -R",
        "known_hosts",
    ] {
        assert!(
            run.stderr.contains(needle),
            "{needle} missing: {}",
            run.stderr
        );
    }
    assert_eq!(sshd.logins(), before, "logged in to a changed host");

    let plan = home.run(["reconcile", "--dry-run"]);
    assert_eq!(plan.code, 2, "{plan:?}");
    assert!(
        plan.stdout.contains(&format!(
            "! ssh hermes@{}   blocked     host key changed: ",
            sshd.host
        )),
        "{plan:?}"
    );
    assert!(plan.stdout.contains(&new), "{plan:?}");

    // Accepting the new key is OpenSSH's own command on hermes's file.
    let known_hosts = home.path().join("known_hosts");
    let out = std::process::Command::new("ssh-keygen")
        .args(["-R", &sshd.host, "-f"])
        .arg(&known_hosts)
        .output()
        .unwrap_or_else(|e| panic!("ssh-keygen: {e}"));
    assert!(out.status.success());
    let run = exec(&home, &["--", "echo", "trusted again"]);
    assert_eq!(
        (run.code, run.stdout.as_str()),
        (0, "trusted again\n"),
        "{run:?}"
    );
}

#[test]
fn reconcile_prepares_the_workspace_and_a_dry_run_trusts_nothing() {
    let sshd = Sshd::start();
    let home = home_for(&sshd, "");
    let known_hosts = home.path().join("known_hosts");
    let fingerprint = sshd.host_key_fingerprint();

    let plan = home.run(["reconcile", "--dry-run"]);
    assert_eq!(plan.code, 2, "{plan:?}");
    assert!(
        plan.stdout.starts_with(&format!(
            "+ ssh hermes@{}   prepare     workspace ~/.hermes-sandbox/default/default/workspace; new host, its key {fingerprint} is trusted on first use\n",
            sshd.host
        )),
        "{plan:?}"
    );
    assert!(!known_hosts.exists(), "a dry run trusted the host");
    assert_eq!(sshd.logins(), 0);

    let applied = home.run(["reconcile"]);
    assert_eq!(applied.code, 0, "{applied:?}");
    assert!(
        applied.stdout.contains("The host is converged."),
        "{applied:?}"
    );
    sshd.exec(&[
        "test",
        "-d",
        "/home/hermes/.hermes-sandbox/default/default/workspace",
    ]);
    assert!(known_hosts.exists());

    let plan = home.run(["reconcile", "--dry-run"]);
    assert_eq!(plan.code, 0, "{plan:?}");
    assert!(plan.stdout.contains("No changes."), "{plan:?}");

    sshd.exec(&["rm", "-r", "/home/hermes/.hermes-sandbox"]);
    let plan = home.run(["reconcile", "--dry-run", "--output", "json"]);
    assert_eq!(plan.code, 2, "{plan:?}");
    assert!(plan.stdout.contains("\"action\": \"prepare\""), "{plan:?}");
    assert_eq!(sshd.logins(), 1, "{}", sshd.log());
}

#[test]
fn an_unreachable_host_is_an_error_that_names_it() {
    let home = TestHome::new();
    // A port nothing listens on, on loopback.
    let listener =
        std::net::TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("bind: {e}"));
    let port = listener
        .local_addr()
        .unwrap_or_else(|e| panic!("addr: {e}"))
        .port();
    drop(listener);
    home.write_config(format!(
        "terminal:\n  backend: ssh\n  ssh_host: 127.0.0.1\n  ssh_port: {port}\n  ssh_user: nobody\n  ssh_key: /nonexistent\n"
    ));
    let run = exec(&home, &["--", "true"]);
    assert_eq!(run.code, 1, "{run:?}");
    assert!(
        run.stderr.contains(&format!("nobody@127.0.0.1:{port}")),
        "{run:?}"
    );
    let plan = home.run(["reconcile", "--dry-run"]);
    assert_eq!(plan.code, 2, "{plan:?}");
    assert!(
        plan.stdout.contains("blocked     unreachable: "),
        "{plan:?}"
    );
}

#[test]
fn the_controller_prepares_the_workspace_too() {
    let sshd = Sshd::start();
    let home = home_for(&sshd, "");
    let run = home.run(["controller", "--once"]);
    assert_eq!(run.code, 0, "{run:?}");
    sshd.exec(&[
        "test",
        "-d",
        "/home/hermes/.hermes-sandbox/default/default/workspace",
    ]);
    let plan = home.run(["reconcile", "--dry-run"]);
    assert_eq!(plan.code, 0, "{plan:?}");
}

#[test]
#[allow(clippy::unwrap_used)]
fn the_controller_converges_an_ssh_only_host_without_a_docker_engine() {
    let sshd = Sshd::start();
    let home = home_for(&sshd, "");
    // Nothing listens there: hermes has no engine (the server is the
    // test's own container).
    let docker_host = format!("unix://{}", home.path().join("no-docker.sock").display());
    let run = |args: &[&str]| -> Run {
        home.command(args)
            .env("DOCKER_HOST", &docker_host)
            .output()
            .unwrap()
            .into()
    };

    let plan = run(&["reconcile", "--dry-run", "--output", "json"]);
    assert_eq!(plan.code, 2, "{plan:?}");
    let plan: serde_json::Value = serde_json::from_str(&plan.stdout).unwrap();
    let planned: Vec<String> = plan["operations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|op| format!("{}/ok", op["action"].as_str().unwrap()))
        .collect();
    assert_eq!(planned, ["prepare/ok"], "{plan}");

    let once = run(&["controller", "--once"]);
    assert_eq!(once.code, 0, "{once:?}");
    assert!(!once.stderr.contains("engine"), "{once:?}");
    let status = home.path().join("run").join("controller.json");
    let status: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(status).unwrap()).unwrap();
    assert_eq!(status["last_error"], serde_json::Value::Null, "{status}");
    assert_eq!(
        status["engine_unreachable_since"],
        serde_json::Value::Null,
        "{status}"
    );
    // Exactly what the dry run printed.
    let done: Vec<String> = status["operations"]
        .as_object()
        .unwrap()
        .keys()
        .cloned()
        .collect();
    assert_eq!(done, planned, "{status}");
    sshd.exec(&[
        "test",
        "-d",
        "/home/hermes/.hermes-sandbox/default/default/workspace",
    ]);
    let plan = run(&["reconcile", "--dry-run"]);
    assert_eq!(plan.code, 0, "{plan:?}");
    assert!(plan.stdout.contains("No changes."), "{plan:?}");
}
