//! The `local` backend under bubblewrap (`terminal.local_sandbox: bwrap`)
//! attacked from inside: the host's secrets (the hermes home and its
//! `.env`, `~/.ssh`, cloud credentials), another task's `/tmp`, writes
//! outside the workspace, the host's processes and loopback services, raw
//! sockets, namespaces, mounts and ptrace, setuid, and a timed-out
//! command's processes; and the one way out, the egress proxy, carrying
//! the real key only past the sandbox.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use hermes_tests::cli::{Run, TestHome};
use hermes_tests::upstream::Upstream;

const REAL_KEY: &str = "sk-or-v1-bwrap-REAL-openrouter-0001";

/// A home on the local backend under bwrap, a user home of its own (with
/// secrets in it), and a workspace to start commands in.
struct Host {
    home: TestHome,
    profile: String,
    user_home: tempfile::TempDir,
    workspace: tempfile::TempDir,
}

impl Host {
    fn new(tag: &str, extra: &str) -> Host {
        let profile = format!("{tag}{}", std::process::id());
        let home = TestHome::with_profile(&profile);
        home.write_config(format!(
            "terminal:\n  backend: local\n  local_sandbox: bwrap\n{extra}"
        ));
        // Outside /tmp, which the sandbox has a private one of.
        let outside = |prefix: &str| {
            tempfile::Builder::new()
                .prefix(prefix)
                .tempdir_in("/var/tmp")
                .unwrap()
        };
        let user_home = outside("hermes-bwrap-home-");
        for (path, text) in [
            (".ssh/id_ed25519", "SSH-PRIVATE-CANARY"),
            (".aws/credentials", "AWS-SECRET-CANARY"),
            (".netrc", "NETRC-CANARY"),
            ("notes.txt", "readable"),
        ] {
            let file = user_home.path().join(path);
            std::fs::create_dir_all(file.parent().unwrap()).unwrap();
            std::fs::write(file, text).unwrap();
        }
        std::fs::write(
            home.path().join(".env"),
            "OPENROUTER_API_KEY=DOTENV-CANARY\n",
        )
        .unwrap();
        Host {
            home,
            profile,
            user_home,
            workspace: outside("hermes-bwrap-ws-"),
        }
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut all = vec!["--profile", self.profile.as_str()];
        all.extend_from_slice(args);
        let mut cmd = self.home.command(all);
        cmd.current_dir(self.workspace.path())
            .env("HOME", self.user_home.path())
            .env("OPENROUTER_API_KEY", REAL_KEY)
            .stdin(Stdio::null());
        cmd
    }

    fn hermes(&self, args: &[&str]) -> Run {
        self.command(args).output().unwrap().into()
    }

    fn sh(&self, script: &str) -> Run {
        self.hermes(&["exec", "--", "sh", "-c", script])
    }
}

#[test]
fn under_bwrap_secrets_other_tasks_and_the_host_are_out_of_reach() {
    let host = Host::new("abw", "");
    let other = host.hermes(&[
        "exec",
        "--task",
        "other",
        "--",
        "sh",
        "-c",
        "echo OTHER-TASK-CANARY > /tmp/mine",
    ]);
    assert_eq!(other.code, 0, "{other:?}");
    // A process of the host, and a TCP and a UDP service on its loopback.
    let tag = format!("bwrap-host-canary-{}", std::process::id());
    let mut canary = Command::new("sh")
        .args(["-c", "exec sleep 120", &tag])
        .spawn()
        .unwrap();
    let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let tcp_port = tcp.local_addr().unwrap().port();
    let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let udp_port = udp.local_addr().unwrap().port();
    udp.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let hermes_home = host.home.path().display().to_string();
    let uh = host.user_home.path().display().to_string();
    let script = format!(
        r#"echo "== read"
cat "{uh}/.ssh/id_ed25519" "{uh}/.aws/credentials" "{uh}/.netrc" "{hermes_home}/.env" /tmp/mine 2>/dev/null
ls -A "{hermes_home}" "{uh}/.ssh" 2>/dev/null
cat "{uh}/notes.txt"; echo
echo "== write"
for f in /etc/hermes-bwrap-x "{uh}/written" /usr/hermes-bwrap-x; do echo x > "$f" 2>/dev/null && echo "WROTE $f"; done
echo ok > ./in-workspace && echo "workspace writable"
echo "== processes"
grep -l 'bwrap-host-canar[y]' /proc/[0-9]*/cmdline 2>/dev/null | wc -l
kill -0 {pid} 2>/dev/null && echo SIGNALLED
echo "== escapes"
unshare -Ur true 2>/dev/null && echo UNSHARED
mount -t tmpfs none /tmp/m 2>/dev/null && echo MOUNTED
grep NoNewPrivs /proc/self/status
python3 - <<'PY'
import ctypes, socket, errno
libc = ctypes.CDLL(None, use_errno=True)
print("ptrace", libc.ptrace(16, 1, 0, 0), errno.errorcode.get(ctypes.get_errno()))
for fam, typ, proto, what in [(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP, "raw"),
                              (socket.AF_PACKET, socket.SOCK_RAW, 0, "packet")]:
    try:
        socket.socket(fam, typ, proto); print("OPENED", what)
    except OSError as e:
        print("refused", what)
s = socket.socket(); s.settimeout(2)
try:
    s.connect(("127.0.0.1", {tcp_port})); print("TCP-REACHED")
except OSError as e:
    print("tcp-failed", type(e).__name__)
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
try:
    u.sendto(b"UDP-FROM-BWRAP", ("127.0.0.1", {udp_port}))
except OSError:
    pass
for h in ("10.0.0.1", "::1"):
    try:
        socket.create_connection((h, {tcp_port}), timeout=2); print("REACHED", h)
    except OSError:
        print("unreachable", h)
PY
echo end
"#,
        pid = canary.id()
    );
    let run = host.sh(&script);
    assert_eq!(run.code, 0, "{run:?}");
    let out = &run.stdout;
    for secret in [
        "SSH-PRIVATE-CANARY",
        "AWS-SECRET-CANARY",
        "NETRC-CANARY",
        "DOTENV-CANARY",
        "OTHER-TASK-CANARY",
        "id_ed25519",
        "config.yaml",
        REAL_KEY,
    ] {
        assert!(
            !out.contains(secret),
            "{secret} seen in the sandbox:\n{out}"
        );
    }
    assert!(
        out.contains("readable\n"),
        "the host's other files are read-only, not gone: {out}"
    );
    assert!(!out.contains("WROTE"), "{out}");
    assert!(out.contains("workspace writable"), "{out}");
    assert!(host.workspace.path().join("in-workspace").exists());
    let section = hermes_tests::egress::section(out, "processes");
    assert_eq!(section.lines().next(), Some("0"), "{out}");
    assert!(!out.contains("SIGNALLED"), "{out}");
    for escape in [
        "UNSHARED",
        "MOUNTED",
        "OPENED",
        "TCP-REACHED",
        "REACHED 10",
        "REACHED ::1",
    ] {
        assert!(!out.contains(escape), "{escape}:\n{out}");
    }
    assert!(out.contains("NoNewPrivs:\t1"), "{out}");
    assert!(out.contains("ptrace -1 EPERM"), "{out}");
    assert!(out.ends_with("end\n"), "{out}");
    let mut buf = [0u8; 64];
    let deadline = Instant::now() + Duration::from_secs(1);
    while Instant::now() < deadline {
        if let Ok((n, _)) = udp.recv_from(&mut buf) {
            panic!(
                "a datagram reached the host: {:?}",
                String::from_utf8_lossy(&buf[..n])
            );
        }
    }
    drop(tcp);
    let _ = canary.kill();
    let _ = canary.wait();
}

/// Waits (10 s at most) until no process of the host runs `sleep TAG…`.
fn no_sleep_left(tag: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let ps = Command::new("ps").args(["-eo", "args"]).output().unwrap();
        let ps = String::from_utf8_lossy(&ps.stdout).into_owned();
        let left: Vec<&str> = ps
            .lines()
            .filter(|l| l.contains(&format!("sleep {tag}")))
            .collect();
        if left.is_empty() {
            return;
        }
        assert!(Instant::now() < deadline, "left on the host: {left:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn under_bwrap_a_timeout_kills_the_command_s_whole_sandbox() {
    let host = Host::new("abt", "");
    let tag = format!("9{}", std::process::id() % 100000);
    let t = Instant::now();
    let run = host.hermes(&[
        "exec",
        "--timeout",
        "2",
        "--",
        "sh",
        "-c",
        &format!("sleep {tag}1 & (sleep {tag}2 &) ; setsid sleep {tag}3 & sleep {tag}4"),
    ]);
    assert_eq!(run.code, 124, "{run:?}");
    assert!(t.elapsed() < Duration::from_secs(20), "{:?}", t.elapsed());
    // Seen from the host: nothing of it is left, daemonized ones included.
    no_sleep_left(&tag);
}

/// The proxy is the only way out: a provider's name reaches the test's
/// upstream (by `proxy.resolve`) through the init's bridge and the
/// proxy's Unix socket, the upstream gets the real key, the sandbox holds
/// only a token; a name off the allowlist is refused by the proxy.
#[test]
fn under_bwrap_the_proxy_is_the_way_out_and_the_sandbox_holds_no_key() {
    let upstream = Upstream::start("127.0.0.1:0".parse().unwrap(), &["openrouter.ai"]);
    let port = hermes_tests::egress::free_port_pair(None);
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("upstream-ca.pem");
    std::fs::write(&ca, &upstream.ca_pem).unwrap();
    let host = Host::new(
        "abp",
        &format!(
            "security:\n  redact_secrets: false\nproxy:\n  enabled: true\n  tunnel_port: {port}\n  upstream_deny_cidrs: [169.254.0.0/16, 10.0.0.0/8]\n  upstream_ca_file: {}\n  resolve:\n    openrouter.ai: 127.0.0.1\n",
            ca.display()
        ),
    );
    let refused = host.sh("true");
    assert_eq!(
        refused.code, 3,
        "fail closed before the proxy runs: {refused:?}"
    );
    let apply = host.hermes(&["reconcile"]);
    assert_eq!(apply.code, 0, "{apply:?}");
    let up = upstream.addr.port();
    let run = host.sh(&format!(
        "echo \"== env\"; printenv OPENROUTER_API_KEY; echo \"== curl\"; \
         curl -sS --max-time 20 https://openrouter.ai:{up}/echo -H \"Authorization: Bearer $OPENROUTER_API_KEY\"; echo; \
         echo \"== denied\"; curl -sS --max-time 5 -o /dev/null -w '%{{http_code}}' https://not-allowed.invalid/ 2>&1; echo"
    ));
    let _stop = host.hermes(&["egress", "stop"]);
    assert_eq!(run.code, 0, "{run:?}");
    let token = hermes_tests::egress::section(&run.stdout, "env");
    assert!(token.trim().starts_with("openrouter-"), "{}", run.stdout);
    assert!(!token.contains(REAL_KEY), "{}", run.stdout);
    let echo: serde_json::Value =
        serde_json::from_str(hermes_tests::egress::section(&run.stdout, "curl").trim())
            .unwrap_or_else(|e| panic!("{e}: {run:?}"));
    assert_eq!(
        echo["headers"]["authorization"],
        format!("Bearer {REAL_KEY}")
    );
    let denied = hermes_tests::egress::section(&run.stdout, "denied");
    assert!(denied.contains("403"), "{}", run.stdout);
}

/// Where bwrap cannot make a sandbox (here: no user namespace may be made,
/// as on a host that turned them off), nothing runs, unsandboxed least of
/// all: `hermes exec` says why and how to fix it, and `status` shows it
/// blocked.
#[test]
fn under_bwrap_without_user_namespaces_nothing_runs_and_status_says_why() {
    let host = Host::new("abn", "");
    let hermes = hermes_tests::cli::hermes_bin();
    let marker = host.workspace.path().join("ran");
    // A user namespace of the test's own whose limit of nested ones is 0.
    let run = |args: &str| -> Run {
        let cmd = host.command(&[]);
        Command::new("unshare")
            .args(["-U", "-r", "sh", "-c"])
            .arg(format!(
                "echo 0 > /proc/sys/user/max_user_namespaces && exec \"$0\" --home {} --profile {} {args}",
                host.home.path().display(),
                host.profile
            ))
            .arg(&hermes)
            .envs(cmd.get_envs().filter_map(|(k, v)| Some((k, v?))))
            .current_dir(host.workspace.path())
            .stdin(Stdio::null())
            .output()
            .unwrap()
            .into()
    };
    let exec = run(&format!("exec -- touch {}", marker.display()));
    assert_ne!(exec.code, 0, "{exec:?}");
    assert!(
        exec.stderr
            .contains("terminal.local_sandbox is bwrap, but bwrap cannot make a sandbox here")
            && exec.stderr.contains("max_*_namespaces"),
        "{exec:?}"
    );
    assert!(!marker.exists(), "the command ran");
    let status = run("status");
    assert!(
        status.stdout.contains("exec on the local backend: terminal.local_sandbox is bwrap, but bwrap cannot make a sandbox here"),
        "{status:?}"
    );
    // Outside that namespace it runs, sandboxed.
    let fine = host.sh(&format!("touch {}", marker.display()));
    assert_eq!(fine.code, 0, "{fine:?}");
    assert!(marker.exists());
}

/// A background command's sandbox (which outlives its exec, and whose
/// files hermes reads from the host for `hermes process`) attacked from
/// inside: its output made a link to a file of the hermes home (which the
/// host's hermes could read), its command line a FIFO, a job directory
/// forged with no launch behind it, its init (PID 1, hermes's) sent
/// SIGKILL and its descriptors looked into. `process list` and `logs`
/// show none of it and never block; `process kill` ends the whole
/// sandbox, daemonized children included, as the host's `ps` sees.
#[test]
fn under_bwrap_a_background_sandbox_cannot_turn_hermes_s_reads_against_the_host() {
    let host = Host::new("abg", "");
    let secret = host.home.path().join("launch-secret");
    std::fs::write(&secret, "HERMES-HOME-CANARY").unwrap();
    let ws = host.workspace.path().display().to_string();
    let tag = format!("7{}", std::process::id() % 100000);
    let script = format!(
        "d=$(ls -d /run/hermes/state/jobs/*/ | head -n 1); d=${{d%/}}; \
         cat {secret} > {ws}/leak 2>&1; \
         rm -f \"$d/out\"; ln -s {secret} \"$d/out\"; \
         rm -f \"$d/cmd\"; mkfifo \"$d/cmd\"; \
         mkdir -p /run/hermes/state/jobs/0badf00d; echo 0 > /run/hermes/state/jobs/0badf00d/exit; \
         kill -KILL 1 2>/dev/null; ls -l /proc/1/fd/ > {ws}/fds 2>&1; \
         sleep {tag}1 & setsid sleep {tag}2 & touch {ws}/ready; wait",
        secret = secret.display()
    );
    let run = host.hermes(&["exec", "--background", "--", &script]);
    assert_eq!(run.code, 0, "{run:?}");
    let id = run.stdout.trim_end().to_string();
    let ready = host.workspace.path().join("ready");
    let until = Instant::now() + Duration::from_secs(20);
    while !ready.exists() {
        assert!(
            Instant::now() < until,
            "the background command never got ready"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let read = |name: &str| std::fs::read_to_string(host.workspace.path().join(name)).unwrap();
    assert!(!read("leak").contains("CANARY"), "{}", read("leak"));
    let fds = read("fds");
    assert!(
        fds.contains("denied") && !fds.contains("socket:"),
        "its init is open: {fds}"
    );

    let t = Instant::now();
    let list = host.hermes(&["process", "list", "--output", "json"]);
    assert_eq!(list.code, 0, "{list:?}");
    let list: serde_json::Value = serde_json::from_str(&list.stdout).unwrap();
    let procs = list["processes"].as_array().unwrap();
    // Its own launch only (the forged one has no record), still running:
    // the SIGKILL from inside did not reach the init.
    assert_eq!(procs.len(), 1, "{list}");
    assert_eq!(procs[0]["id"], id.as_str(), "{list}");
    assert_eq!(procs[0]["state"], "running", "{list}");
    let logs = host.hermes(&["process", "logs", &id]);
    assert_eq!(logs.code, 0, "{logs:?}");
    assert!(!logs.stdout.contains("CANARY"), "{logs:?}");
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    let forged = host.hermes(&["process", "kill", "0badf00d"]);
    assert_eq!(forged.code, 1, "{forged:?}");

    let killed = host.hermes(&["process", "kill", &id]);
    assert!(killed.stdout.starts_with("Killed process"), "{killed:?}");
    no_sleep_left(&tag);
    let list = host.hermes(&["process", "list"]);
    assert!(list.stdout.contains("killed"), "{list:?}");
}

/// A descriptor hermes's caller left open (here one of a directory the
/// sandbox hides, the hermes home) would lead out of every mount of the
/// sandbox: neither a command's sandbox nor a background one keeps it.
#[test]
fn under_bwrap_descriptors_left_open_by_the_caller_do_not_reach_the_sandbox() {
    let host = Host::new("abf", "");
    std::fs::write(host.home.path().join("fd-secret"), "FD-CANARY").unwrap();
    let ws = host.workspace.path().display().to_string();
    // Every descriptor past the standard three, and what it leads to.
    let probe = format!(
        "for f in /proc/self/fd/*; do n=${{f##*/}}; [ \"$n\" -gt 2 ] || continue; \
         cat \"$f/fd-secret\" 2>/dev/null; readlink \"$f\"; done > {ws}/seen-$1 2>&1; touch {ws}/done-$1"
    );
    for (mode, args) in [
        (
            "fg",
            vec!["exec", "--", "sh", "-c", probe.as_str(), "-", "fg"],
        ),
        (
            "bg",
            vec![
                "exec",
                "--background",
                "--",
                "sh",
                "-c",
                probe.as_str(),
                "-",
                "bg",
            ],
        ),
    ] {
        let mut cmd = Command::new("python3");
        cmd.args([
            "-c",
            "import os, subprocess, sys\n\
             fd = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECTORY)\n\
             sys.exit(subprocess.run(sys.argv[2:], pass_fds=[fd]).returncode)",
        ])
        .arg(host.home.path())
        .arg(hermes_tests::cli::hermes_bin());
        let hermes = host.command(&args);
        cmd.args(hermes.get_args())
            .envs(hermes.get_envs().filter_map(|(k, v)| Some((k, v?))))
            .current_dir(host.workspace.path())
            .stdin(Stdio::null());
        let run: Run = cmd.output().unwrap().into();
        assert_eq!(run.code, 0, "{mode}: {run:?}");
        let done = host.workspace.path().join(format!("done-{mode}"));
        let until = Instant::now() + Duration::from_secs(20);
        while !done.exists() {
            assert!(Instant::now() < until, "{mode}: the probe never ran");
            std::thread::sleep(Duration::from_millis(100));
        }
        let seen =
            std::fs::read_to_string(host.workspace.path().join(format!("seen-{mode}"))).unwrap();
        assert!(!seen.contains("FD-CANARY"), "{mode}: {seen}");
        // The listing's own descriptor only.
        assert!(
            seen.lines().all(|l| l.starts_with("/proc/")),
            "{mode}: the sandbox holds {seen}"
        );
    }
}
