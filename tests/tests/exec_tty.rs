//! `hermes exec -t`, through the real binary on a real pseudo-terminal
//! (the test holds its master side, as a terminal emulator would): the
//! command gets a terminal of its own, sized as the user's and resized
//! with it, every key goes to it (Ctrl-C included, which does not end
//! hermes), its exit code is hermes's; on the local backend, in a real
//! Docker sandbox and in a singularity instance (the stand-in runtime).
//! A backend with no terminal to give, or an input that is no terminal,
//! is refused before anything runs.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use hermes_tests::cli::TestHome;
use hermes_tests::docker_cli::docker_home;

/// hermes on a pseudo-terminal: what it shows, collected by a thread.
struct Terminal {
    child: std::process::Child,
    pty: Arc<pty_process::blocking::Pty>,
    shown: mpsc::Receiver<Vec<u8>>,
    seen: Vec<u8>,
}

impl Terminal {
    /// `cmd` started on a new terminal of `rows`×`cols`.
    fn start(cmd: std::process::Command, rows: u16, cols: u16) -> Terminal {
        let (pty, pts) = pty_process::blocking::open().unwrap();
        pty.resize(pty_process::Size::new(rows, cols)).unwrap();
        let child = pty_process::blocking::Command::from(cmd)
            .spawn(pts)
            .unwrap();
        let pty = Arc::new(pty);
        let reader = Arc::clone(&pty);
        let (tx, shown) = mpsc::channel();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            // Ends with EIO once hermes and its command are gone.
            while let Ok(n) = (&*reader).read(&mut buf) {
                if n == 0 || tx.send(buf[..n].to_vec()).is_err() {
                    break;
                }
            }
        });
        Terminal {
            child,
            pty,
            shown,
            seen: Vec::new(),
        }
    }

    /// Waits (60 s at most) until the terminal has shown `text`.
    fn expect(&mut self, text: &str) {
        let until = Instant::now() + Duration::from_secs(60);
        while !String::from_utf8_lossy(&self.seen).contains(text) {
            let left = until.saturating_duration_since(Instant::now());
            match self.shown.recv_timeout(left) {
                Ok(bytes) => self.seen.extend(bytes),
                Err(_) => panic!(
                    "{text:?} never shown; the terminal shows {:?}",
                    String::from_utf8_lossy(&self.seen)
                ),
            }
        }
    }

    fn send(&mut self, keys: &[u8]) {
        (&*self.pty).write_all(keys).unwrap();
    }

    /// hermes's exit code (60 s at most).
    fn wait(&mut self) -> i32 {
        let until = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.code().unwrap_or(-1);
            }
            if Instant::now() > until {
                let _ = self.child.kill();
                panic!(
                    "hermes did not end; shown: {:?}",
                    String::from_utf8_lossy(&self.seen)
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// The same checks on any home whose backend gives a terminal; `env`:
/// what hermes's environment needs for it.
fn a_terminal_of_its_own(home: &TestHome, profile: &str, env: &[(&str, String)]) {
    let command = |args: &[&str]| {
        let mut all = vec!["--profile", profile];
        all.extend_from_slice(args);
        let mut cmd = home.command(all);
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd
    };
    // A terminal, of the user's size; a resize reaches it.
    let cmd = command(&[
        "exec",
        "-t",
        "--",
        "tty; stty size; echo ready; read line; \
         i=0; while [ \"$(stty size)\" != '40 120' ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done; \
         stty size; echo got-$line; exit 7",
    ]);
    let mut term = Terminal::start(cmd, 33, 101);
    term.expect("33 101");
    term.expect("ready");
    assert!(
        String::from_utf8_lossy(&term.seen).contains("/dev/pts/"),
        "{:?}",
        String::from_utf8_lossy(&term.seen)
    );
    term.pty.resize(pty_process::Size::new(40, 120)).unwrap();
    term.send(b"x\r");
    // The resize is a signal to hermes, then a call to the engine: the
    // command waits for it (10 s at most) and says the size it has.
    term.expect("40 120");
    term.expect("got-x");
    assert_eq!(term.wait(), 7);

    // Ctrl-C is a key for the command: it gets SIGINT, hermes goes on.
    let cmd = command(&[
        "exec",
        "-t",
        "--",
        "trap 'echo got-int; exit 9' INT; echo armed; while :; do sleep 0.1; done",
    ]);
    let mut term = Terminal::start(cmd, 24, 80);
    term.expect("armed");
    term.send(b"\x03");
    term.expect("got-int");
    assert_eq!(term.wait(), 9);
}

#[test]
fn the_command_gets_a_terminal_on_local() {
    let home = TestHome::new();
    home.write_config("terminal:\n  backend: local\n");
    a_terminal_of_its_own(&home, "default", &[]);
}

#[test]
fn the_command_gets_a_terminal_in_a_docker_sandbox() {
    let (home, profile, _cleanup) = docker_home("tty", "");
    a_terminal_of_its_own(&home, &profile, &[]);
}

/// On singularity, through the stand-in `apptainer` of the exec contract
/// (`tests/fixtures/apptainer-standin`, which runs the command with the
/// terminal it is given, as Apptainer does).
#[test]
fn the_command_gets_a_terminal_in_a_singularity_instance() {
    use std::os::unix::fs::PermissionsExt;
    let standin = tempfile::tempdir().unwrap();
    let bin = standin.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    let program = bin.join("apptainer");
    std::fs::write(
        &program,
        include_str!("../fixtures/apptainer-standin/apptainer"),
    )
    .unwrap();
    std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).unwrap();
    let home = TestHome::new();
    home.write_config("terminal:\n  backend: singularity\n");
    let env = [
        (
            "PATH",
            format!(
                "{}:{}",
                bin.display(),
                std::env::var("PATH").unwrap_or_default()
            ),
        ),
        ("HOME", home.path().display().to_string()),
    ];
    // Every instance the stand-in started is stopped, the test passed or not.
    struct StopAll(std::path::PathBuf);
    impl Drop for StopAll {
        fn drop(&mut self) {
            let _ = std::process::Command::new(&self.0)
                .args(["instance", "stop", "--all"])
                .output();
        }
    }
    let _stop = StopAll(program.clone());
    a_terminal_of_its_own(&home, "default", &env);
}

#[test]
fn no_terminal_is_refused_before_anything_runs() {
    let home = TestHome::new();
    home.write_config("terminal:\n  backend: local\n");
    // Standard input not a terminal.
    let run = home.run(["exec", "-t", "--", "touch made"]);
    assert_eq!(run.code, 1, "{run:?}");
    assert!(run.stderr.contains("needs one"), "{run:?}");
    // A backend with no terminal to give: said before any connection.
    home.write_config(
        "terminal:\n  backend: ssh\n  ssh_host: 127.0.0.1\n  ssh_port: 1\n  ssh_user: nobody\n",
    );
    let cmd = home.command(["exec", "-t", "--", "true"]);
    let mut term = Terminal::start(cmd, 24, 80);
    assert_eq!(term.wait(), 1);
    term.expect("the ssh backend gives a command no terminal");
    // -t and --background together: a usage error.
    let run = home.run(["exec", "-t", "--background", "--", "true"]);
    assert_eq!(run.code, 64, "{run:?}");
}
