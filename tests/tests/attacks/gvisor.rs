//! A sandbox under gVisor (`terminal.docker_runtime: runsc`) attacked from
//! inside: a fork bomb against its timeout and the runtime's own
//! processes, the host's kernel and processes looked for, escapes by
//! namespace, mount and `/proc/*/root`, and, on the proxy-only network
//! (`proxy.enforce_network`), every way out but the proxy: TCP and UDP to
//! the host's addresses, raw and packet sockets, IPv4-mapped IPv6, another
//! sandbox. Each check that the runtime could change is made under runc
//! too where that tells the two apart (the kernel, the syscalls).

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use hermes_tests::cli::{Run, TestHome};
use hermes_tests::docker_cli::{ProfileCleanup, docker};
use hermes_tests::egress::{bridge_gateway, free_port_pair, network_gateway};

use super::isolation::{EnforcedCleanup, connects, serve_on};

/// One home with a Docker profile of its own under `runtime` (`None`: the
/// default, runc), `extra` lines added to the config.
struct Host {
    home: TestHome,
    profile: String,
    _cleanup: ProfileCleanup,
}

impl Host {
    fn new(tag: &str, runtime: Option<&str>, extra: &str) -> Host {
        let profile = format!("{tag}{}", std::process::id());
        let host = Host {
            home: TestHome::with_profile(&profile),
            _cleanup: ProfileCleanup(profile.clone()),
            profile,
        };
        let runtime = runtime
            .map(|r| format!("  docker_runtime: {r}\n"))
            .unwrap_or_default();
        host.home.write_config(format!(
            "terminal:\n  backend: docker\n  docker_image: {}\n{runtime}{extra}",
            hermes_tests::test_image()
        ));
        host
    }

    fn gvisor(tag: &str, extra: &str) -> Host {
        Host::new(tag, Some(&hermes_tests::runsc_runtime()), extra)
    }

    fn hermes(&self, args: &[&str]) -> Run {
        let mut all = vec!["--profile", self.profile.as_str()];
        all.extend_from_slice(args);
        self.home.run(all)
    }

    fn name(&self) -> String {
        format!("hermes-{}-default", self.profile)
    }

    /// `sh -c script` through hermes; its stdout.
    fn sh(&self, script: &str) -> String {
        let run = self.hermes(&["exec", "--", "sh", "-c", script]);
        assert_eq!(run.code, 0, "{script}: {run:?}");
        run.stdout
    }

    /// The `processes` of the sandbox in `hermes sandbox list`.
    fn processes(&self) -> u64 {
        let list = self.hermes(&["sandbox", "list", "--output", "json"]);
        assert_eq!(list.code, 0, "{list:?}");
        let list: serde_json::Value = serde_json::from_str(&list.stdout).unwrap();
        list["sandboxes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|row| row["name"] == self.name().as_str())
            .map(|row| row["processes"].as_u64().unwrap_or(u64::MAX))
            .unwrap_or_else(|| panic!("{} missing from {list}", self.name()))
    }

    fn started_at(&self) -> String {
        docker(&["inspect", "-f", "{{.State.StartedAt}}", &self.name()])
    }
}

/// What errno `syscall(nr, 0, 0, 0, 0, 0)` gives inside the sandbox.
const SYSCALLS: &str = r#"import ctypes, errno
libc = ctypes.CDLL(None, use_errno=True)
for name, nr in [("io_uring_setup", 425), ("userfaultfd", 323), ("landlock_create_ruleset", 444)]:
    ctypes.set_errno(0)
    libc.syscall(nr, 0, 0, 0, 0, 0)
    print(name, errno.errorcode.get(ctypes.get_errno(), ctypes.get_errno()))
"#;

/// Before the kill of a timeout could start a process in a sandbox whose
/// pids were full, gVisor's sentry died of the host's pids limit (it
/// counts the sentry's own threads and stubs: "unable to create a stub
/// process") and took every process of the sandbox with it. Now the
/// guest's processes are bounded inside (`RLIMIT_NPROC`), a command leaves
/// room for hermes's kill: the exec ends with 124 in bounded time,
/// nothing of it is left, and the sandbox never restarted.
#[test]
fn under_gvisor_a_fork_bomb_is_killed_at_its_timeout_and_the_sandbox_lives_on() {
    let host = Host::gvisor("agb", "");
    assert_eq!(host.hermes(&["exec", "--", "true"]).code, 0);
    let started = host.started_at();
    let bomb =
        "for i in 1 2 3 4; do bash -c 'while :; do sleep 1000 & done' 2>/dev/null & done; wait";
    let t = Instant::now();
    let run = host.hermes(&["exec", "--timeout", "3", "--", "sh", "-c", bomb]);
    assert_eq!(run.code, 124, "{run:?}");
    assert!(t.elapsed() < Duration::from_secs(30), "{:?}", t.elapsed());
    assert_eq!(host.started_at(), started, "the sandbox restarted");
    let deadline = Instant::now() + Duration::from_secs(30);
    while host.processes() != 0 {
        assert!(Instant::now() < deadline, "the bomb's processes are left");
        std::thread::sleep(Duration::from_millis(300));
    }
    // (The pattern does not match its own command line.)
    let left = host.sh("grep -l 'sleep 100[0]' /proc/[0-9]*/cmdline 2>/dev/null | wc -l");
    assert_eq!(left.trim(), "0", "{left}");
    assert_eq!(host.sh("echo alive"), "alive\n");
    assert_eq!(host.started_at(), started, "the sandbox restarted");
}

#[test]
fn under_gvisor_the_sandbox_runs_on_a_kernel_of_its_own_and_sees_no_host_process() {
    let gvisor = Host::gvisor("agk", "");
    let runc = Host::new("agr", None, "");
    let host_release =
        String::from_utf8(Command::new("uname").arg("-r").output().unwrap().stdout).unwrap();
    assert_eq!(
        runc.sh("uname -r"),
        host_release,
        "runc shares the host's kernel"
    );
    let inside = gvisor.sh("uname -r");
    assert_ne!(
        inside, host_release,
        "under gVisor the kernel is the host's"
    );

    // The syscall surface: calls the host's kernel has (runc's sandbox
    // reaches it, and seccomp or the arguments refuse them) are not
    // there at all under gVisor's.
    let host_side = runc.sh(&format!("python3 -c '{SYSCALLS}'"));
    let guest_side = gvisor.sh(&format!("python3 -c '{SYSCALLS}'"));
    for line in host_side.lines() {
        assert!(!line.ends_with(" ENOSYS"), "runc: {host_side}");
    }
    assert!(
        guest_side.contains("io_uring_setup ENOSYS"),
        "gVisor: {guest_side}"
    );

    // A process of the host, named so that it can be looked for: not in
    // the sandbox's /proc, and no signal reaches its pid.
    let tag = format!("hermes-gvisor-host-canary-{}", std::process::id());
    let mut canary = Command::new("sh")
        .args(["-c", "exec sleep 120", &tag])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let pid = canary.id();
    // (The pattern does not match its own command line.)
    let pattern = format!("hermes-gvisor-host-canar[y]-{}", std::process::id());
    let seen = gvisor.sh(&format!(
        "grep -l '{pattern}' /proc/[0-9]*/cmdline 2>/dev/null | wc -l; \
         ls -d /proc/[0-9]* | wc -l; kill -0 {pid} 2>/dev/null && echo SIGNALLED || echo refused"
    ));
    let lines: Vec<&str> = seen.lines().collect();
    assert_eq!(lines[0], "0", "the host's process is seen: {seen}");
    let count: u32 = lines[1].parse().unwrap();
    assert!(count < 20, "{count} processes seen: the host's? {seen}");
    if lines[2] == "SIGNALLED" {
        // Only when the guest happens to have a process of that number.
        let guest = gvisor.sh(&format!("tr '\\0' ' ' < /proc/{pid}/cmdline"));
        assert!(!guest.contains(&tag), "{guest}");
    }
    assert!(
        canary.try_wait().unwrap().is_none(),
        "the host's process died"
    );
    let _ = canary.kill();
    let _ = canary.wait();
}

/// A file of the host outside the sandbox's mounts, looked for by every
/// way out of the sandbox's view: `/proc/*/root`, a new user and mount
/// namespace with a fresh `proc`, a mount, a ptrace of the init, a
/// setuid program run by an unprivileged user.
#[test]
fn under_gvisor_namespaces_mounts_and_proc_roots_reach_nothing_of_the_host() {
    let host = Host::gvisor("age", "");
    let secret = format!("host-only-{}-canary", std::process::id());
    let file = host.home.path().join("host-only.txt");
    std::fs::write(&file, &secret).unwrap();
    let path = file.display().to_string();
    let script = format!(
        r#"for p in /proc/[0-9]*; do cat "$p/root{path}" 2>/dev/null; done
cat "{path}" 2>/dev/null
mount -t tmpfs none /mnt 2>/dev/null && echo MOUNTED
unshare -Urm sh -c 'mount -t proc proc /mnt 2>/dev/null; for p in /mnt/[0-9]*; do cat "$p/root{path}" 2>/dev/null; done; ls -d /mnt/[0-9]* 2>/dev/null | wc -l' 2>/dev/null
python3 -c '
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
print("ptrace", libc.ptrace(16, 1, 0, 0))
'
grep -rlsF {secret} / --exclude-dir=proc --exclude-dir=sys 2>/dev/null
grep NoNewPrivs /proc/self/status
cp /usr/bin/id /opt/suid-id && chmod u+s /opt/suid-id && su -s /bin/sh nobody -c 'echo "setuid-gave uid $(/opt/suid-id -u)"'
echo end
"#
    );
    let out = host.sh(&script);
    assert!(!out.contains(&secret), "the host's file was read: {out}");
    assert!(!out.contains("MOUNTED"), "a mount worked: {out}");
    // A setuid program gains nothing: no new privileges.
    assert!(out.contains("NoNewPrivs:\t1"), "{out}");
    assert!(out.contains("setuid-gave uid 65534"), "{out}");
    assert!(out.ends_with("end\n"), "{out}");
}

/// `proxy.enforce_network` under gVisor, whose network stack is its own:
/// the proxy is reached on the network's gateway and nothing else is:
/// neither a TCP nor a UDP service of the host on that gateway or on
/// docker0, nor IPv4-mapped IPv6, nor another sandbox; raw and packet
/// sockets cannot be opened.
#[test]
fn under_gvisor_with_enforce_network_the_proxy_is_the_only_way_out() {
    let docker0 = bridge_gateway();
    let port = free_port_pair(Some(docker0));
    let host = Host::gvisor(
        "agn",
        &format!(
            "reconcile:\n  resync_seconds: 300\nproxy:\n  enabled: true\n  enforce_network: true\n  tunnel_port: {port}\n"
        ),
    );
    let made = host.hermes(&["reconcile"]);
    let a = host.name();
    let network = docker(&[
        "inspect",
        "--format",
        "{{range $k, $v := .NetworkSettings.Networks}}{{$k}}{{end}}",
        &a,
    ])
    .trim()
    .to_string();
    let _cleanup = EnforcedCleanup {
        home: &host.home,
        profile: host.profile.clone(),
        network: network.clone(),
    };
    assert_eq!(made.code, 0, "{made:?}");
    assert!(network.starts_with("hermes-egress-"), "{network}");
    assert_eq!(
        docker(&["inspect", "-f", "{{.HostConfig.Runtime}}", &a]).trim(),
        hermes_tests::runsc_runtime()
    );
    let gateway = network_gateway(&network).to_string();

    // Services of the host on every address, TCP and UDP.
    let tcp = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
    let tcp_port = tcp.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for mut conn in tcp.incoming().flatten() {
            use std::io::Write;
            let _ = conn.write_all(b"HOST-SERVICE\n");
        }
    });
    let udp = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
    let udp_port = udp.local_addr().unwrap().port();
    udp.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();

    let probe = format!(
        r#"import socket, errno
def tcp(host, port, family=socket.AF_INET):
    s = socket.socket(family); s.settimeout(3)
    try:
        s.connect((host, port)); print("TCP-REACHED", host, port)
    except Exception as e:
        print("tcp-failed", host, port, type(e).__name__)
for h in ("{gateway}", "{docker0}"):
    tcp(h, {tcp_port})
tcp("::ffff:{docker0}", {tcp_port}, socket.AF_INET6)
tcp("::ffff:{gateway}", {tcp_port}, socket.AF_INET6)
for h in ("{gateway}", "{docker0}"):
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        u.sendto(b"UDP-FROM-SANDBOX", (h, {udp_port}))
    except OSError as e:
        print("udp-refused", h, errno.errorcode.get(e.errno))
for fam, typ, proto, what in [(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP, "raw"),
                              (socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_UDP, "raw-udp"),
                              (socket.AF_PACKET, socket.SOCK_RAW, 0, "packet"),
                              (socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_ICMPV6, "raw6")]:
    try:
        socket.socket(fam, typ, proto); print("OPENED", what)
    except OSError as e:
        print("socket-refused", what, errno.errorcode.get(e.errno))
tcp("{gateway}", {port})
"#
    );
    std::fs::write(
        host.home
            .path()
            .join("sandboxes/docker/default/workspace/probe.py"),
        probe,
    )
    .unwrap();
    let out = host.sh("python3 /workspace/probe.py");
    assert_eq!(
        out.matches("TCP-REACHED").count(),
        1,
        "reached past the proxy: {out}"
    );
    assert!(
        out.lines().last() == Some(&format!("TCP-REACHED {gateway} {port}")[..]),
        "the proxy is not reached on the gateway: {out}"
    );
    assert!(
        !out.contains("OPENED"),
        "a raw or packet socket opened: {out}"
    );
    assert_eq!(out.matches("socket-refused").count(), 4, "{out}");
    let mut buf = [0u8; 64];
    let deadline = Instant::now() + Duration::from_secs(2);
    while Instant::now() < deadline {
        if let Ok((n, from)) = udp.recv_from(&mut buf) {
            panic!(
                "a datagram from {from} reached the host: {:?}",
                String::from_utf8_lossy(&buf[..n])
            );
        }
    }

    // Another sandbox of the profile, a server in the first: refused.
    let other = host.hermes(&["exec", "--task", "other", "--", "true"]);
    assert_eq!(other.code, 0, "{other:?}");
    let b = format!("hermes-{}-other", host.profile);
    let a_ip = serve_on(&a, &network);
    assert!(
        connects(&b, &a_ip, 8000).is_err(),
        "a gVisor sandbox reached another one"
    );
}

/// `terminal.container_disk` under gVisor: the sandbox's files are on the
/// host's loop-mounted image, reached through the runtime's file proxy,
/// and a write past the limit fails there as under runc.
#[test]
fn under_gvisor_a_sandbox_cannot_write_past_container_disk() {
    let host = Host::gvisor("agd", "  container_disk: 64\n");
    let out = host.sh("echo kept > /workspace/keep; \
         dd if=/dev/zero of=/workspace/fill bs=1M count=100 2>&1 | grep -v copied; \
         dd if=/dev/zero of=/root/fill bs=1M count=100 2>&1 | grep -v copied; \
         du -sm /workspace/fill /root/fill; cat /workspace/keep");
    assert!(out.contains("No space left on device"), "{out}");
    let sizes: u64 = out
        .lines()
        .filter_map(|l| l.split_whitespace().next()?.parse::<u64>().ok())
        .sum();
    assert!(sizes <= 64, "{sizes} MB written past a 64 MB limit: {out}");
    assert!(out.ends_with("kept\n"), "{out}");
}
