//! The engine going away under a running controller: dockerd is stopped and
//! started again (with the same command line) while `hermes controller`
//! runs, and the controller converges again without being restarted; the
//! warm pool it kept full is full again, of new members (the old ones
//! stopped with the engine and are never handed out).
//!
//! This file holds this one test on purpose: test binaries run one after
//! another, so no other test sees the engine disappear.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use hermes_tests::cli::TestHome;
use hermes_tests::docker_cli::{ProfileCleanup, containers_of};

fn engine_answers() -> bool {
    Command::new("docker")
        .args(["version", "--format", "{{.Server.Version}}"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn eventually(within: Duration, what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !check() {
        assert!(Instant::now() < deadline, "not within {within:?}: {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The pid and command line of the local dockerd.
fn dockerd() -> (i32, Vec<String>) {
    let out = Command::new("pidof").arg("dockerd").output().unwrap();
    let pids = String::from_utf8_lossy(&out.stdout);
    let pid: i32 = pids
        .split_whitespace()
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| {
            panic!("no local dockerd to restart; run the suite with scripts/test, which starts one")
        });
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
    let args = cmdline
        .split(|b| *b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    (pid, args)
}

#[test]
fn the_controller_converges_again_after_the_engine_restarts() {
    let profile = format!("ce{}", std::process::id());
    let _cleanup = ProfileCleanup(profile.clone());
    let home = TestHome::with_profile(&profile);
    home.write_config(format!(
        "terminal:\n  backend: docker\n  docker_image: {}\n  warm_pool: 2\n",
        hermes_tests::test_image()
    ));
    let mut controller = home
        .command(["--profile", &profile, "controller"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let name = format!("hermes-{profile}-default");
    let running = || containers_of(&profile).contains(&(name.clone(), "running".to_string()));
    eventually(Duration::from_secs(30), "the sandbox runs", running);
    eventually(Duration::from_secs(60), "the pool is full", || {
        ready_members(&home).len() == 2
    });
    let before = ready_members(&home);

    let (pid, args) = dockerd();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    eventually(Duration::from_secs(60), "dockerd stopped", || {
        !std::path::Path::new(&format!("/proc/{pid}")).exists()
    });
    std::thread::sleep(Duration::from_secs(1));
    let log = std::env::var("HERMES_DOCKERD_LOG")
        .unwrap_or_else(|_| "/tmp/hermes-test-dockerd.log".to_string());
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .unwrap();
    // `setsid --fork`: the engine outlives this test, and the command
    // returns at once.
    let forked = Command::new("setsid")
        .arg("--fork")
        .args(&args)
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .status()
        .unwrap();
    assert!(forked.success(), "setsid --fork {args:?}: {forked}");
    eventually(
        Duration::from_secs(60),
        "dockerd answers again",
        engine_answers,
    );
    let answering = Instant::now();

    // The engine stopped the sandbox with itself; the controller, never
    // restarted, starts it again, soon after the engine answers (it used
    // to wait out a back-off that grew with every wake-up while the engine
    // was away: 12 to 27 s).
    eventually(Duration::from_secs(60), "the sandbox runs again", running);
    let converged = answering.elapsed();
    assert!(
        converged < Duration::from_secs(5),
        "converged {converged:?} after the engine answered"
    );
    assert!(
        controller.try_wait().unwrap().is_none(),
        "the controller exited"
    );
    // Once the pass that refills the pool ended, status says so too.
    eventually(
        Duration::from_secs(30),
        "status says the engine answers",
        || {
            home.run(["status"])
                .stdout
                .contains("Engine:      answering")
        },
    );
    // The members stopped with the engine: replaced, never handed out.
    eventually(Duration::from_secs(60), "the pool is full again", || {
        let now = ready_members(&home);
        now.len() == 2 && now.iter().all(|m| !before.contains(m))
    });
    let claim = home.run(["exec", "--session", "after", "--", "true"]);
    assert_eq!(claim.code, 0, "{claim:?}");
    assert!(claim.stderr.contains("   claim  "), "{claim:?}");
    let _ = controller.kill();
    let _ = controller.wait();
}

/// (name, container id) of each unclaimed member `sandbox list` calls
/// ready.
fn ready_members(home: &TestHome) -> Vec<(String, String)> {
    let list = home.run(["sandbox", "list", "--output", "json"]);
    let Ok(v) = serde_json::from_str::<serde_json::Value>(&list.stdout) else {
        return Vec::new();
    };
    v["sandboxes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|s| s["pool"] == "ready")
        .map(|s| {
            let name = s["name"].as_str().unwrap_or_default().to_string();
            let id = hermes_tests::docker_cli::docker(&["inspect", "-f", "{{.Id}}", &name]);
            (name, id.trim().to_string())
        })
        .collect()
}
