//! The SSH library against a real OpenSSH server, without the binary: a
//! remote port forward brings the server's `127.0.0.1:PORT` back to a
//! listener here, over the same connection the commands use; a dry
//! connection (no learning) trusts nothing; the remote tree kill leaves
//! nothing of a cancelled command.

use std::net::SocketAddr;
use std::time::Duration;

use hermes_backends::exec::{ExecIo, ExecRequest};
use hermes_backends::ssh::{
    ConnectOptions, Connection, Destination, Identity, RemoteExec, SshError,
};
use hermes_tests::sshd::{Sshd, USER};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn options(sshd: &Sshd, known_hosts: &std::path::Path, learn: bool) -> ConnectOptions {
    ConnectOptions {
        dest: Destination {
            host: sshd.host.clone(),
            port: sshd.port,
            user: USER.to_string(),
        },
        identity: Identity::KeyFile(sshd.key_path().to_path_buf()),
        known_hosts: known_hosts.to_path_buf(),
        learn,
        timeout: Duration::from_secs(20),
    }
}

fn remote(default_cwd: &str) -> RemoteExec {
    RemoteExec {
        default_cwd: default_cwd.to_string(),
        ..RemoteExec::default()
    }
}

/// Runs `cmd` in the remote home and returns its exit code and stdout.
async fn run(c: &Connection, cmd: &[&str]) -> (i64, String) {
    let req = ExecRequest {
        cmd: cmd.iter().map(|s| s.to_string()).collect(),
        env: Vec::new(),
        cwd: Some(".".into()),
        timeout: Duration::from_secs(30),
    };
    let running = c
        .start(&req, &remote("."))
        .await
        .unwrap_or_else(|e| panic!("start: {e}"));
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let io = ExecIo {
        stdin: None,
        stdout: &mut out,
        stderr: &mut err,
    };
    let outcome = running
        .finish(io, std::future::pending())
        .await
        .unwrap_or_else(|e| panic!("finish: {e}"));
    (
        outcome.exit_code,
        String::from_utf8_lossy(&out).into_owned(),
    )
}

#[tokio::test]
async fn a_remote_port_forward_reaches_a_listener_here() {
    let sshd = Sshd::start();
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
    let known_hosts = dir.path().join("known_hosts");

    // A dry connection to a new host trusts nothing and writes nothing.
    match Connection::connect(&options(&sshd, &known_hosts, false)).await {
        Err(SshError::HostKeyUnknown { fingerprint, .. }) => {
            assert_eq!(fingerprint, sshd.host_key_fingerprint());
        }
        other => panic!("expected HostKeyUnknown, got {other:?}"),
    }
    assert!(!known_hosts.exists());
    let c = Connection::connect(&options(&sshd, &known_hosts, true))
        .await
        .unwrap_or_else(|e| panic!("connect: {e}"));

    // A one-shot HTTP server on loopback here.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap_or_else(|e| panic!("bind: {e}"));
    let local: SocketAddr = listener
        .local_addr()
        .unwrap_or_else(|e| panic!("addr: {e}"));
    let server = tokio::spawn(async move {
        let (mut s, _) = listener
            .accept()
            .await
            .unwrap_or_else(|e| panic!("accept: {e}"));
        let mut buf = vec![0u8; 4096];
        let n = s.read(&mut buf).await.unwrap_or(0);
        let request = String::from_utf8_lossy(&buf[..n]).into_owned();
        let _ = s
            .write_all(
                b"HTTP/1.1 200 OK\r\ncontent-length: 9\r\nconnection: close\r\n\r\nforwarded",
            )
            .await;
        request
    });
    c.forward_remote_port(19090, local)
        .await
        .unwrap_or_else(|e| panic!("forward: {e}"));
    assert_eq!(c.forwards_to(19090), Some(local));
    let (code, body) = run(
        &c,
        &[
            "curl",
            "-sS",
            "--max-time",
            "10",
            "http://127.0.0.1:19090/hello",
        ],
    )
    .await;
    assert_eq!((code, body.as_str()), (0, "forwarded"));
    let request = tokio::time::timeout(Duration::from_secs(10), server)
        .await
        .unwrap_or_else(|_| panic!("the listener saw nothing"))
        .unwrap_or_else(|e| panic!("server: {e}"));
    assert!(request.starts_with("GET /hello "), "{request}");
    // The server listens on its loopback only (19090 is 4A92).
    let listening = sshd.exec(&["cat", "/proc/net/tcp"]);
    assert!(
        listening.contains("0100007F:4A92 00000000:0000 0A"),
        "{listening}"
    );
    assert!(!listening.contains("00000000:4A92"), "{listening}");
}

#[tokio::test]
async fn a_cancelled_command_leaves_nothing_running() {
    let sshd = Sshd::start();
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
    let c = Connection::connect(&options(&sshd, &dir.path().join("known_hosts"), true))
        .await
        .unwrap_or_else(|e| panic!("connect: {e}"));
    let req = ExecRequest {
        cmd: vec!["sh".into(), "-c".into(), "sleep 321 & sleep 322".into()],
        env: Vec::new(),
        cwd: None,
        timeout: Duration::from_secs(300),
    };
    let running = c
        .start(&req, &remote("w"))
        .await
        .unwrap_or_else(|e| panic!("start: {e}"));
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let io = ExecIo {
        stdin: None,
        stdout: &mut out,
        stderr: &mut err,
    };
    // The caller goes away after a second.
    let result = running
        .finish(io, tokio::time::sleep(Duration::from_secs(1)))
        .await;
    assert!(matches!(result, Err(SshError::Output { .. })), "{result:?}");
    let witness = sshd.exec(&["ps", "-eo", "args"]);
    assert!(!witness.contains("sleep 32"), "{witness}");
    let (_, pwd) = run(&c, &["sh", "-c", "test -d w && echo made"]).await;
    assert_eq!(pwd, "made\n");
}
