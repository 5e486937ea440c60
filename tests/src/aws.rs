//! AWS stand-ins for the SigV4 tests (the official SDK for Python, boto3,
//! comes from [`crate::python::pip_target`]): a local TLS upstream standing in
//! for the Bedrock runtime endpoint that checks each request's signature
//! with `botocore`'s own signer and the real secret, refusing any other.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// The upstream: HTTPS on 127.0.0.1 with a certificate for `HOST`. Every
/// request's `Authorization` is recomputed with botocore's `SigV4Auth` and
/// the real credentials (argv) over the headers it names, the body and the
/// request's own `x-amz-date`; a mismatch, or another access key id, gets
/// 403 (`SignatureDoesNotMatch`). `/model/<id>/invoke` answers JSON naming
/// what it checked; `/model/<id>/invoke-with-response-stream` answers
/// three event-stream `chunk` events 400 ms apart. Each request appends a
/// JSON line (its headers, body and verdict) to the log file.
const UPSTREAM_PY: &str = r#"
import base64, json, ssl, struct, sys, time, zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

cert, key, log, key_id, secret, session = sys.argv[1:7]

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
        out = json.dumps({"checked": verdict, "body": json.loads(body or b"null")}).encode()
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
    /// Starts the upstream for `host`, checking signatures against the
    /// real `key_id`, `secret` and `session` token, with `botocore` from
    /// `boto`.
    pub fn start(boto: &Path, host: &str, key_id: &str, secret: &str, session: &str) -> Self {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
        let (ca_pem, cert_pem, key_pem) = certificates(host);
        let cert = dir.path().join("cert.pem");
        let key = dir.path().join("key.pem");
        let log = dir.path().join("requests.jsonl");
        std::fs::write(&cert, cert_pem).unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(&key, key_pem).unwrap_or_else(|e| panic!("{e}"));
        let mut child = Command::new("python3")
            .arg("-c")
            .arg(UPSTREAM_PY)
            .args([&cert, &key, &log])
            .args([key_id, secret, session])
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

/// A CA's PEM, and a leaf for `host` signed by it (certificate chain and
/// key, PEM).
fn certificates(host: &str) -> (String, String, String) {
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
    let leaf = CertificateParams::new(vec![host.to_string()])
        .and_then(|p| p.signed_by(&leaf_key, &issuer))
        .unwrap_or_else(|e| fail(e));
    (
        ca_cert.pem(),
        leaf.pem() + &ca_cert.pem(),
        leaf_key.serialize_pem(),
    )
}
