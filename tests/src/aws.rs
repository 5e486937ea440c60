//! AWS stand-ins for the SigV4 tests (the official SDK for Python, boto3,
//! comes from [`crate::python::pip_target`]): a local TLS upstream standing in
//! for AWS endpoints (the Bedrock runtime, STS) that checks each request's
//! signature with `botocore`'s own signer and the real secret, refusing any
//! other; a signed request whose body the test sends at its own pace; and
//! the proxy's health answer.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The upstream: HTTPS on 127.0.0.1 with a certificate for its hosts. Every
/// request's `Authorization` is recomputed with botocore's `SigV4Auth` and
/// the real credentials (argv) over the headers it names, the body and the
/// request's own `x-amz-date`; a mismatch, or another access key id, gets
/// 403 (`SignatureDoesNotMatch`). `/model/<id>/invoke` answers JSON naming
/// what it checked; `/model/<id>/invoke-with-response-stream` answers
/// three event-stream `chunk` events 400 ms apart; a form body whose
/// `Action` is `GetSessionToken` or `AssumeRole` gets STS's answer, with
/// the temporary credentials [`MINTED_KEY_ID`] (what a sandbox would hold
/// if the proxy signed such a request). Each request appends a JSON line
/// (its headers, body and verdict) to the log file.
const UPSTREAM_PY: &str = r#"
import base64, json, ssl, struct, sys, time, zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

cert, key, log, key_id, secret, session, MINTED = sys.argv[1:8]

def event(payload):
    def header(name, value):
        n, v = name.encode(), value.encode()
        return struct.pack("B", len(n)) + n + b"\x07" + struct.pack(">H", len(v)) + v
    headers = header(":event-type", "chunk") + header(":content-type", "application/json") + header(":message-type", "event")
    total = 12 + len(headers) + len(payload) + 4
    prelude = struct.pack(">II", total, len(headers))
    msg = prelude + struct.pack(">I", zlib.crc32(prelude) & 0xffffffff) + headers + payload
    return msg + struct.pack(">I", zlib.crc32(msg) & 0xffffffff)

class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *args):
        pass
    def verdict(self, body):
        auth = self.headers.get("authorization", "")
        try:
            fields = dict(p.strip().split("=", 1) for p in auth.split(" ", 1)[1].split(","))
            kid, date, region, service, _ = fields["Credential"].split("/")
            names = fields["SignedHeaders"].split(";")
        except Exception as e:
            return "malformed: %r" % e
        if kid != key_id:
            return "another access key id"
        headers = {n: self.headers[n] for n in names}
        if "x-amz-security-token" in names and self.headers["x-amz-security-token"] != session:
            return "another session token"
        if session and "x-amz-security-token" not in names:
            return "the session token is not signed"
        request = AWSRequest(method=self.command, url="https://%s%s" % (self.headers["host"], self.path), data=body, headers=headers)
        request.context["timestamp"] = self.headers["x-amz-date"]
        signer = SigV4Auth(Credentials(key_id, secret, session or None), service, region)
        canonical = signer.canonical_request(request)
        expected = signer.signature(signer.string_to_sign(request, canonical), request)
        return "ok" if expected == fields["Signature"] else "signature mismatch"
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length", "0")))
        verdict = self.verdict(body)
        with open(log, "a") as f:
            f.write(json.dumps({"path": self.path, "headers": dict(self.headers.items()), "body": body.decode(), "verdict": verdict}) + "\n")
        if verdict != "ok":
            out = json.dumps({"message": "SignatureDoesNotMatch: " + verdict}).encode()
            self.send_response(403)
            self.send_header("content-type", "application/json")
            self.send_header("x-amzn-errortype", "AccessDeniedException")
            self.send_header("content-length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)
            return
        form = dict(p.split("=", 1) for p in body.decode(errors="replace").split("&") if "=" in p)
        if form.get("Action") in ("GetSessionToken", "AssumeRole"):
            action = form["Action"]
            creds = "<Credentials><AccessKeyId>%s</AccessKeyId><SecretAccessKey>minted/secret</SecretAccessKey><SessionToken>minted-session</SessionToken><Expiration>2030-01-01T00:00:00Z</Expiration></Credentials>" % MINTED
            out = ("<%sResponse xmlns=\"https://sts.amazonaws.com/doc/2011-06-15/\"><%sResult>%s</%sResult><ResponseMetadata><RequestId>r</RequestId></ResponseMetadata></%sResponse>" % (action, action, creds, action, action)).encode()
            self.send_response(200)
            self.send_header("content-type", "text/xml")
            self.send_header("content-length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)
            return
        if self.path.endswith("/invoke-with-response-stream"):
            self.send_response(200)
            self.send_header("content-type", "application/vnd.amazon.eventstream")
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            for i in range(3):
                part = json.dumps({"bytes": base64.b64encode(json.dumps({"n": i}).encode()).decode()}).encode()
                m = event(part)
                self.wfile.write(b"%x\r\n" % len(m) + m + b"\r\n")
                self.wfile.flush()
                time.sleep(0.4)
            self.wfile.write(b"0\r\n\r\n")
            return
        try:
            parsed = json.loads(body or b"null")
        except ValueError:
            parsed = body.decode(errors="replace")
        out = json.dumps({"checked": verdict, "body": parsed}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
context.load_cert_chain(cert, key)
server.socket = context.wrap_socket(server.socket, server_side=True)
print(server.server_address[1], flush=True)
server.serve_forever()
"#;

/// The access key id of the temporary credentials the upstream's STS
/// answer holds.
pub const MINTED_KEY_ID: &str = "ASIAMINTEDBYTHESTANDIN";

/// A running signature-checking upstream; killed when dropped.
#[derive(Debug)]
pub struct SigningUpstream {
    pub port: u16,
    /// The PEM of the CA that signed its certificate.
    pub ca_pem: String,
    log: PathBuf,
    child: Child,
    _dir: tempfile::TempDir,
}

impl SigningUpstream {
    /// Starts the upstream for `hosts` (its certificate names them all),
    /// checking signatures against the real `key_id`, `secret` and
    /// `session` token, with `botocore` from `boto`.
    pub fn start(boto: &Path, hosts: &[&str], key_id: &str, secret: &str, session: &str) -> Self {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
        let (ca_pem, cert_pem, key_pem) = certificates(hosts);
        let cert = dir.path().join("cert.pem");
        let key = dir.path().join("key.pem");
        let log = dir.path().join("requests.jsonl");
        std::fs::write(&cert, cert_pem).unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(&key, key_pem).unwrap_or_else(|e| panic!("{e}"));
        let mut child = Command::new("python3")
            .arg("-c")
            .arg(UPSTREAM_PY)
            .args([&cert, &key, &log])
            .args([key_id, secret, session, MINTED_KEY_ID])
            .env("PYTHONPATH", boto)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("python3 upstream: {e}"));
        let stdout = child.stdout.take().unwrap_or_else(|| panic!("no stdout"));
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        let Ok(port) = line.trim().parse() else {
            let _ = child.kill();
            panic!("the upstream did not start: {line:?}");
        };
        SigningUpstream {
            port,
            ca_pem,
            log,
            child,
            _dir: dir,
        }
    }

    /// What it received so far, one JSON object per request.
    pub fn requests(&self) -> Vec<serde_json::Value> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }
}

impl Drop for SigningUpstream {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A CA's PEM, and a leaf for `hosts` signed by it (certificate chain and
/// key, PEM).
fn certificates(hosts: &[&str]) -> (String, String, String) {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
    let fail = |e: rcgen::Error| -> ! { panic!("rcgen: {e}") };
    let ca_key = KeyPair::generate().unwrap_or_else(|e| fail(e));
    let mut ca_params = CertificateParams::default();
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "hermes test AWS CA");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_cert = ca_params.self_signed(&ca_key).unwrap_or_else(|e| fail(e));
    let issuer = Issuer::new(ca_params, ca_key);
    let leaf_key = KeyPair::generate().unwrap_or_else(|e| fail(e));
    let leaf = CertificateParams::new(hosts.iter().map(ToString::to_string).collect::<Vec<_>>())
        .and_then(|p| p.signed_by(&leaf_key, &issuer))
        .unwrap_or_else(|e| fail(e));
    (
        ca_cert.pem(),
        leaf.pem() + &ca_cert.pem(),
        leaf_key.serialize_pem(),
    )
}

/// A SigV4 request to `host:port` through the proxy's tunnel port on
/// 127.0.0.1 (the client is 127.0.0.1), whose body the caller sends at its
/// own pace, or not at all. Its `Authorization` names the placeholder
/// access key id (so the proxy reads the body to check it) with a
/// signature that never matches: the request is never sent on.
#[derive(Debug)]
pub struct PendingBody {
    tls: rustls::StreamOwned<rustls::ClientConnection, TcpStream>,
}

impl PendingBody {
    /// CONNECT, TLS trusting `proxy_ca` (PEM), and the request's head
    /// declaring a body of `declared` bytes.
    pub fn open(
        proxy_port: u16,
        proxy_ca: &str,
        host: &str,
        port: u16,
        key_id: &str,
        declared: usize,
    ) -> PendingBody {
        use rustls_pki_types::pem::PemObject;
        let fail = |what: &str, e: &dyn std::fmt::Display| -> ! { panic!("{what}: {e}") };
        let mut tcp = TcpStream::connect(("127.0.0.1", proxy_port))
            .unwrap_or_else(|e| fail("connecting to the proxy", &e));
        tcp.set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap_or_else(|e| fail("read timeout", &e));
        write!(
            tcp,
            "CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n"
        )
        .unwrap_or_else(|e| fail("CONNECT", &e));
        let mut head = Vec::new();
        while !head.ends_with(b"\r\n\r\n") && head.len() < 8192 {
            let mut byte = [0u8; 1];
            match tcp.read(&mut byte) {
                Ok(1) => head.push(byte[0]),
                other => panic!("CONNECT answer ended: {other:?} after {head:?}"),
            }
        }
        let head = String::from_utf8_lossy(&head);
        assert!(head.starts_with("HTTP/1.1 200"), "CONNECT: {head}");
        let mut roots = rustls::RootCertStore::empty();
        for cert in rustls_pki_types::CertificateDer::pem_slice_iter(proxy_ca.as_bytes()) {
            let cert = cert.unwrap_or_else(|e| fail("the proxy's CA", &e));
            roots
                .add(cert)
                .unwrap_or_else(|e| fail("the proxy's CA", &e));
        }
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap_or_else(|e| fail("TLS versions", &e))
        .with_root_certificates(roots)
        .with_no_client_auth();
        let name = rustls_pki_types::ServerName::try_from(host.to_string())
            .unwrap_or_else(|e| fail("server name", &e));
        let conn = rustls::ClientConnection::new(Arc::new(config), name)
            .unwrap_or_else(|e| fail("TLS", &e));
        let mut tls = rustls::StreamOwned::new(conn, tcp);
        let request = format!(
            "POST /model/m/invoke HTTP/1.1\r\nHost: {host}:{port}\r\n\
             Content-Type: application/json\r\nContent-Length: {declared}\r\n\
             X-Amz-Date: 20251201T000000Z\r\n\
             Authorization: AWS4-HMAC-SHA256 Credential={key_id}/20251201/us-east-1/bedrock/aws4_request, SignedHeaders=host;x-amz-date, Signature=00\r\n\r\n"
        );
        tls.write_all(request.as_bytes())
            .and_then(|()| tls.flush())
            .unwrap_or_else(|e| fail("the request's head", &e));
        PendingBody { tls }
    }

    /// `n` bytes of the body.
    pub fn send(&mut self, n: usize) -> std::io::Result<()> {
        let chunk = [b'x'; 16 * 1024];
        let mut left = n;
        // One write per 16 KiB: bounded by `n`.
        while left > 0 {
            let now = left.min(chunk.len());
            self.tls.write_all(&chunk[..now])?;
            left -= now;
        }
        self.tls.flush()
    }

    /// The response (head and body, as text) if one begins within `wait`;
    /// read until the proxy closes the connection (it closes after each
    /// refusal), at most 64 KiB.
    pub fn response(&mut self, wait: Duration) -> Option<String> {
        let _ = self.tls.sock.set_read_timeout(Some(wait));
        let mut out = Vec::new();
        let mut buf = [0u8; 4096];
        while out.len() < 64 * 1024 {
            match self.tls.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => out.extend_from_slice(&buf[..n]),
                Err(_) => break,
            }
        }
        (!out.is_empty()).then(|| String::from_utf8_lossy(&out).into_owned())
    }
}

/// The proxy's `/health` answer, from its management endpoint (the
/// address in `state.json`, the token in `config.json` of `proxy_dir`).
pub fn health(proxy_dir: &Path) -> serde_json::Value {
    let read = |name: &str| -> serde_json::Value {
        let text =
            std::fs::read_to_string(proxy_dir.join(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{name}: {e}"))
    };
    let mgmt = read("state.json")["mgmt"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let token = read("config.json")["mgmt_token"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let mut tcp = TcpStream::connect(&mgmt).unwrap_or_else(|e| panic!("health at {mgmt}: {e}"));
    let _ = tcp.set_read_timeout(Some(Duration::from_secs(10)));
    write!(
        tcp,
        "GET /health HTTP/1.1\r\nHost: {mgmt}\r\nAuthorization: Bearer {token}\r\nConnection: close\r\n\r\n"
    )
    .unwrap_or_else(|e| panic!("health: {e}"));
    let mut text = String::new();
    let _ = tcp.read_to_string(&mut text);
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    serde_json::from_str(body).unwrap_or_else(|e| panic!("health answer {text:?}: {e}"))
}

/// Polls `/health` until `ok` holds of it, for at most `within`; the last
/// answer either way.
pub fn health_until(
    proxy_dir: &Path,
    within: Duration,
    ok: impl Fn(&serde_json::Value) -> bool,
) -> (bool, serde_json::Value) {
    let deadline = Instant::now() + within;
    loop {
        let now = health(proxy_dir);
        if ok(&now) {
            return (true, now);
        }
        if Instant::now() >= deadline {
            return (false, now);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
