//! What a user feels under chaos: `hermes exec` started while another
//! hermes process recreates the sandbox, and `hermes exec` killed with
//! `kill -9` while its command runs.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use hermes_tests::cli::TestHome;
use hermes_tests::docker_cli::{ProfileCleanup, containers_of};

/// Rounds of the recreate race: each makes a recreate and races it.
const RACE_ROUNDS: u32 = 10;
/// Execs started against each recreate.
const RACING_EXECS: usize = 6;

fn docker_config(generation: u32) -> String {
    // Each generation changes the spec, so the sandbox needs a recreate.
    format!(
        "terminal:\n  backend: docker\n  docker_image: {}\n  docker_env:\n    GENERATION: \"{generation}\"\n",
        hermes_tests::test_image()
    )
}

/// A home whose profile (`prefix` and this process's id, removed at the
/// end) has a running Docker sandbox of generation 0.
fn with_a_sandbox(prefix: &str) -> (TestHome, String, ProfileCleanup) {
    let profile = format!("{prefix}{}", std::process::id());
    let cleanup = ProfileCleanup(profile.clone());
    let home = TestHome::with_profile(&profile);
    home.write_config(docker_config(0));
    let first = home.run(["--profile", &profile, "exec", "--", "true"]);
    assert_eq!(first.code, 0, "{first:?}");
    (home, profile, cleanup)
}

fn spawn(home: &TestHome, args: &[&str]) -> Child {
    home.command(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn finish(child: Child) -> (i32, String) {
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        format!(
            "stdout: {}\nstderr: {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// A config edit, then `hermes reconcile` and, 10 to 40 ms later, several
/// `hermes exec -- true`: every exec succeeds (in the old sandbox, ending
/// before the replacement stops it, or in the new one, once it runs), and
/// one container is left.
#[test]
fn execs_racing_a_recreate_wait_for_it_and_succeed() {
    let (home, profile, _cleanup) = with_a_sandbox("chr");

    let started = Instant::now();
    for generation in 1..=RACE_ROUNDS {
        home.write_config(docker_config(generation));
        let reconcile = spawn(&home, &["--profile", &profile, "reconcile"]);
        // From 10 to 40 ms after it, spread: the execs land in every phase
        // of the recreate (the removal, the engine still reporting the old
        // container, the create, the start).
        let mut execs = Vec::new();
        let mut at = 0;
        for i in 0..RACING_EXECS {
            let offset = 10 + i as u64 * 30 / (RACING_EXECS as u64 - 1);
            std::thread::sleep(Duration::from_millis(offset - at));
            at = offset;
            execs.push((
                offset,
                spawn(&home, &["--profile", &profile, "exec", "--", "true"]),
            ));
        }
        for (offset, exec) in execs {
            let (code, output) = finish(exec);
            assert_eq!(
                code, 0,
                "round {generation}: the exec started {offset} ms after the reconcile failed:\n{output}"
            );
        }
        let (code, output) = finish(reconcile);
        assert_eq!(code, 0, "round {generation}: reconcile failed:\n{output}");
        let now = containers_of(&profile);
        assert_eq!(now.len(), 1, "round {generation}: {now:?}");
        assert_eq!(now[0].1, "running", "round {generation}: {now:?}");
        assert!(
            started.elapsed() < Duration::from_secs(240),
            "the race loop took too long"
        );
    }
}

/// A command running when a reconcile replaces its sandbox ends first:
/// the replacement waits for it (within its grace), so the command runs
/// to its end and exits 0, and only then is the old container stopped.
#[test]
fn a_recreate_lets_a_running_command_end_first() {
    let (home, profile, _cleanup) = with_a_sandbox("chl");

    // The command runs until the test lets it go (within the grace), once
    // the reconcile says it waits for it.
    let running = spawn(
        &home,
        &[
            "--profile",
            &profile,
            "exec",
            "--",
            "touch /workspace/started; i=0; while [ ! -e /workspace/go ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done; echo finished",
        ],
    );
    let workspace = home.path().join("sandboxes/docker/default/workspace");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !workspace.join("started").exists() {
        assert!(Instant::now() < deadline, "the command never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    home.write_config(docker_config(1));
    let mut reconcile = home
        .command(["--profile", &profile, "reconcile"])
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = reconcile.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let lines = std::thread::spawn(move || {
        let mut all = String::new();
        for line in std::io::BufRead::lines(std::io::BufReader::new(stderr)).map_while(Result::ok) {
            if line.contains("waiting up to 10 s for the commands running in it to end") {
                let _ = tx.send(());
            }
            all.push_str(&line);
            all.push('\n');
        }
        all
    });
    let waiting = rx.recv_timeout(Duration::from_secs(60));
    std::fs::write(workspace.join("go"), "").unwrap();
    let (code, output) = finish(running);
    let status = reconcile.wait().unwrap();
    let log = lines.join().unwrap();
    assert!(waiting.is_ok(), "the reconcile did not wait:\n{log}");
    assert!(status.success(), "reconcile failed:\n{log}");
    assert_eq!(code, 0, "the running command was cut short:\n{output}");
    assert!(output.contains("stdout: finished"), "{output}");
    let now = containers_of(&profile);
    assert_eq!(now.len(), 1, "{now:?}");
    assert_eq!(now[0].1, "running", "{now:?}");
}

/// Removals of one container by several processes at once: the engine
/// answers all but the first with "removal already in progress" while it
/// still has the container; each returns only once it is gone, so that a
/// create of the name that follows never meets the old container.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removal_in_progress_elsewhere_returns_once_the_container_is_gone() {
    use bollard::models::{ContainerCreateBody, HostConfig};
    use bollard::query_parameters::CreateContainerOptionsBuilder;
    use hermes_backends::docker::Engine;

    let docker = hermes_tests::engine().await;
    for round in 0..5 {
        let name = format!("hermes-chaos-rm-{}-{round}", std::process::id());
        let _cleanup = ContainerCleanup(name.clone());
        let body = ContainerCreateBody {
            image: Some(hermes_tests::test_image()),
            cmd: Some(vec!["sleep".to_string(), "infinity".to_string()]),
            host_config: Some(HostConfig {
                init: Some(true),
                network_mode: Some("none".to_string()),
                ..Default::default()
            }),
            ..Default::default()
        };
        let options = CreateContainerOptionsBuilder::default().name(&name).build();
        let id = docker
            .create_container(Some(options), body)
            .await
            .unwrap()
            .id;
        docker.start_container(&id, None).await.unwrap();

        let removals: Vec<_> = (0..6u64)
            .map(|i| {
                let (id, docker) = (id.clone(), docker.clone());
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(i * 8)).await;
                    let engine = Engine::connect().await.unwrap();
                    let outcome = engine.remove(&id).await;
                    let after = docker.inspect_container(&id, None).await;
                    (i, outcome, after.map(|c| c.state.and_then(|s| s.status)))
                })
            })
            .collect();
        for removal in removals {
            let (i, outcome, after) = removal.await.unwrap();
            assert!(outcome.is_ok(), "round {round}, removal {i}: {outcome:?}");
            assert!(
                after.is_err(),
                "round {round}, removal {i} returned {outcome:?} while the engine still has the container: {after:?}"
            );
        }
    }
}

/// Removes a container by name however the test ends.
struct ContainerCleanup(String);

impl Drop for ContainerCleanup {
    fn drop(&mut self) {
        let _ = std::process::Command::new("docker")
            .args(["rm", "-f", &self.0])
            .output();
    }
}

/// Waits until `probe` says yes, up to `limit`.
fn eventually(limit: Duration, mut probe: impl FnMut() -> bool) -> bool {
    let until = Instant::now() + limit;
    loop {
        if probe() {
            return true;
        }
        if Instant::now() >= until {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Starts `hermes exec -- sh -c 'sleep SECONDS'`, waits until `running`
/// sees it, and kills hermes with SIGKILL.
fn kill_9_mid_command(home: &TestHome, args: &[&str], running: impl Fn() -> bool) {
    let mut exec = home
        .command(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    assert!(
        eventually(Duration::from_secs(60), &running),
        "the command did not start"
    );
    exec.kill().unwrap(); // SIGKILL
    exec.wait().unwrap();
}

/// The processes of a container, as `docker top` shows them.
fn docker_top(container: &str) -> String {
    hermes_tests::docker_cli::docker(&["top", container, "-eo", "pid,args"])
}

/// Docker (through the sandbox's runner): `kill -9` of `hermes exec` ends
/// its command, long before the command would have ended; a
/// `--background` command survives the exec that started it.
#[test]
fn a_killed_exec_takes_its_command_with_it_on_docker() {
    let profile = format!("chk{}", std::process::id());
    let _cleanup = ProfileCleanup(profile.clone());
    let home = TestHome::with_profile(&profile);
    home.write_config(docker_config(0));
    let container = format!("hermes-{profile}-default");
    let first = home.run(["--profile", &profile, "exec", "--", "true"]);
    assert_eq!(first.code, 0, "{first:?}");

    kill_9_mid_command(
        &home,
        &[
            "--profile",
            &profile,
            "exec",
            "--",
            "sh",
            "-c",
            "sleep 300; echo after",
        ],
        || docker_top(&container).contains("sleep 300"),
    );
    assert!(
        eventually(Duration::from_secs(30), || !docker_top(&container)
            .contains("sleep 300")),
        "the command outlived its hermes exec:\n{}",
        docker_top(&container)
    );

    let before = docker_top(&container);
    let started = home.run([
        "--profile",
        &profile,
        "exec",
        "--background",
        "--",
        "sh",
        "-c",
        "sleep 301",
    ]);
    assert_eq!(started.code, 0, "{started:?}");
    // Whatever of the runner handled that request has ended (its
    // processes are gone): it had its chance to take the command along.
    let runner = |top: &str| -> Vec<String> {
        top.lines()
            .filter(|l| l.contains("# hermes-runner"))
            .map(str::to_string)
            .collect()
    };
    assert!(
        eventually(Duration::from_secs(30), || {
            runner(&docker_top(&container))
                .iter()
                .all(|p| before.contains(p))
        }),
        "the background request's handler did not end:\n{}",
        docker_top(&container)
    );
    assert!(
        docker_top(&container).contains("sleep 301"),
        "the background command did not survive its hermes exec:\n{}",
        docker_top(&container)
    );
}

/// Whether a process of this host runs exactly `argv`.
fn host_process_running(argv: &[&str]) -> bool {
    let wanted: Vec<u8> = argv
        .iter()
        .flat_map(|a| [a.as_bytes(), b"\0"].concat())
        .collect();
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .any(|entry| std::fs::read(entry.path().join("cmdline")).is_ok_and(|c| c == wanted))
}

/// Local: `kill -9` of `hermes exec` ends its command (and what it
/// started), long before the command would have ended.
#[test]
fn a_killed_exec_takes_its_command_with_it_on_local() {
    let home = TestHome::new();
    home.write_config("terminal:\n  backend: local\n");
    // A duration no other process of the host sleeps for.
    let sleep = format!("300.{}", std::process::id());
    let script = format!("sleep {sleep}; echo after");
    let sleeping = || host_process_running(&["sleep", &sleep]);
    kill_9_mid_command(&home, &["exec", "--", "sh", "-c", &script], sleeping);
    assert!(
        eventually(Duration::from_secs(30), || !sleeping()),
        "the command outlived its hermes exec"
    );
}

/// Docker through the engine's exec (an image without `setsid`, where the
/// runner cannot run): `kill -9` of `hermes exec` ends its command, long
/// before the command would have ended; a command that ended on its own
/// gives its exit code and output as before.
#[test]
fn a_killed_exec_takes_its_command_with_it_through_the_engines_exec() {
    let pid = std::process::id();
    let image = format!("hermes-test-chaos-nosetsid:{pid}");
    let maker = format!("hermes-chaos-nosetsid-{pid}");
    let _maker = ContainerCleanup(maker.clone());
    hermes_tests::docker_cli::docker(&[
        "run",
        "--name",
        &maker,
        &hermes_tests::test_image(),
        "rm",
        "/usr/bin/setsid",
    ]);
    hermes_tests::docker_cli::docker(&["commit", &maker, &image]);
    let _image = ImageCleanup(image.clone());

    let profile = format!("che{pid}");
    let _cleanup = ProfileCleanup(profile.clone());
    let home = TestHome::with_profile(&profile);
    home.write_config(format!(
        "terminal:\n  backend: docker\n  docker_image: {image}\n"
    ));
    let container = format!("hermes-{profile}-default");
    let first = home.run([
        "--profile",
        &profile,
        "exec",
        "--",
        "sh",
        "-c",
        "echo $PPID; echo err >&2; exit 3",
    ]);
    // The command is the engine exec's own process (no runner above it).
    assert_eq!((first.code, first.stdout.as_str()), (3, "0\n"), "{first:?}");
    assert!(first.stderr.contains("err"), "{first:?}");
    // Its watch ended with it.
    assert!(
        !docker_top(&container).contains("hermes-watch"),
        "the watch outlived its command:\n{}",
        docker_top(&container)
    );

    kill_9_mid_command(
        &home,
        &[
            "--profile",
            &profile,
            "exec",
            "--",
            "sh",
            "-c",
            "sleep 302; echo after",
        ],
        || docker_top(&container).contains("sleep 302"),
    );
    assert!(
        eventually(Duration::from_secs(30), || !docker_top(&container)
            .contains("sleep 302")),
        "the command outlived its hermes exec:\n{}",
        docker_top(&container)
    );

    // What a command that ended on its own left in the background stays.
    let left = home.run([
        "--profile",
        &profile,
        "exec",
        "--",
        "sh",
        "-c",
        "sleep 303 >/dev/null 2>&1 &",
    ]);
    assert_eq!(left.code, 0, "{left:?}");
    // The command's watch, which would kill it, has ended: it had its
    // chance.
    assert!(
        eventually(Duration::from_secs(30), || !docker_top(&container)
            .contains("hermes-watch")),
        "the watch outlived its command:\n{}",
        docker_top(&container)
    );
    assert!(
        docker_top(&container).contains("sleep 303"),
        "what the command left in the background was killed:\n{}",
        docker_top(&container)
    );
}

/// Removes an image however the test ends.
struct ImageCleanup(String);

impl Drop for ImageCleanup {
    fn drop(&mut self) {
        let _ = std::process::Command::new("docker")
            .args(["rmi", "-f", &self.0])
            .output();
    }
}

/// SSH: `kill -9` of `hermes exec` ends the remote command, long before it
/// would have ended (the connection holder kills its tree when its client
/// goes).
#[test]
fn a_killed_exec_takes_its_command_with_it_on_ssh() {
    let sshd = hermes_tests::sshd::Sshd::start();
    let home = TestHome::new();
    home.write_config(sshd.config(""));
    let first = home.run(["exec", "--", "true"]);
    assert_eq!(first.code, 0, "{first:?}");
    let remote = || sshd.exec(&["ps", "-eo", "pid,args"]);
    kill_9_mid_command(
        &home,
        &["exec", "--", "sh", "-c", "sleep 304; echo after"],
        || remote().contains("sleep 304"),
    );
    assert!(
        eventually(Duration::from_secs(30), || !remote().contains("sleep 304")),
        "the command outlived its hermes exec:\n{}",
        remote()
    );
}
