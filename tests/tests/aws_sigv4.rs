//! AWS SigV4 through the egress proxy, end to end: the official AWS SDK
//! for Python (`boto3` from PyPI) inside a container of the test image,
//! holding only the placeholder pair the proxy minted, calls a local TLS
//! upstream standing in for AWS endpoints (the Bedrock runtime, STS, IAM;
//! reached through `proxy.resolve`); the upstream checks every signature
//! with botocore's own signer and the real secret and session token, which
//! only the proxy holds (from the home's `.env`). Also what one client
//! cannot take from the others (the signed bodies' memory), and what no
//! client gets signed (requests that hand out credentials).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use hermes_tests::aws::{MINTED_KEY_ID, PendingBody, SigningUpstream, health, health_until};
use hermes_tests::egress::{Proxy, Sections, in_container_with};
use hermes_tests::python::pip_target;

const HOST: &str = "bedrock-runtime.us-east-1.amazonaws.com";
const REAL_ID: &str = "AKIAE2EREALKEY000001";
const REAL_SECRET: &str = "e2e/REAL+secret0000000000000000000000001";
const REAL_SESSION: &str = "IQoJb3JpZ2luX2VjEE2E-REAL-SESSION-0001";
const BOTO: &str = "/opt/boto";

/// The SDK calls: a plain invoke, a streamed one (each chunk's arrival
/// time), and the same invoke signed with a wrong secret.
const CLIENT_PY: &str = r#"
import json, os, sys, time
import boto3, botocore
from botocore.config import Config
port = sys.argv[1]
url = "https://bedrock-runtime.us-east-1.amazonaws.com:%s" % port
config = Config(retries={"max_attempts": 1, "mode": "standard"}, read_timeout=20, connect_timeout=10)
def client(**kw):
    return boto3.client("bedrock-runtime", endpoint_url=url, config=config, **kw)
out = {}
r = client().invoke_model(modelId="anthropic.claude-3-haiku-20240307-v1:0", body=json.dumps({"prompt": "hi"}), contentType="application/json")
out["invoke"] = json.loads(r["body"].read())
r = client().invoke_model_with_response_stream(modelId="anthropic.claude-3-haiku-20240307-v1:0", body=b'{"stream": 1}')
start, chunks = time.monotonic(), []
for ev in r["body"]:
    chunks.append({"at": time.monotonic() - start, "chunk": json.loads(ev["chunk"]["bytes"])})
out["stream"] = chunks
try:
    client(aws_access_key_id=os.environ["AWS_ACCESS_KEY_ID"], aws_secret_access_key="aws-secret-00000000000000000000000000000000").invoke_model(modelId="m", body=b"{}")
    out["wrong"] = "accepted"
except botocore.exceptions.ClientError as e:
    meta = e.response["ResponseMetadata"]
    out["wrong"] = {"status": meta["HTTPStatusCode"], "refused": meta["HTTPHeaders"].get("x-hermes-egress-refused")}
print("== sdk")
print(json.dumps(out))
"#;

#[test]
fn boto3_in_a_container_signs_with_the_placeholder_and_the_upstream_sees_the_real_signature() {
    let Some(boto) = pip_target(
        Path::new(env!("CARGO_TARGET_TMPDIR")),
        "boto3-pure",
        &["boto3"],
    ) else {
        return;
    };
    let upstream = SigningUpstream::start(&boto, &[HOST], REAL_ID, REAL_SECRET, REAL_SESSION);
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("upstream-ca.pem");
    std::fs::write(&ca, &upstream.ca_pem).unwrap();
    let mut proxy = Proxy::setup(&format!(
        "  upstream_deny_cidrs: [169.254.0.0/16, 10.0.0.0/8]\n  upstream_ca_file: {}\n  resolve:\n    {HOST}: 127.0.0.1\n",
        ca.display()
    ));
    std::fs::write(
        proxy.home.path().join(".env"),
        format!(
            "AWS_ACCESS_KEY_ID={REAL_ID}\nAWS_SECRET_ACCESS_KEY={REAL_SECRET}\nAWS_SESSION_TOKEN={REAL_SESSION}\n"
        ),
    )
    .unwrap();
    proxy.start(&[]);
    let key_id = proxy.token("aws");
    let secret = proxy.token("aws-secret");
    assert!(key_id.starts_with("aws-") && secret.starts_with("aws-secret-"));
    let port = upstream.port;
    let script = format!(
        r#"
python3 /t/client.py {port}
echo "== streaming-body"
curl -sS --max-time 20 -w '\n%{{http_code}}\n' "https://{HOST}:{port}/model/m/invoke" \
  -H "Authorization: AWS4-HMAC-SHA256 Credential=$AWS_ACCESS_KEY_ID/20251201/us-east-1/bedrock/aws4_request, SignedHeaders=host;x-amz-date, Signature=00" \
  -H 'x-amz-date: 20251201T000000Z' -H 'x-amz-content-sha256: STREAMING-AWS4-HMAC-SHA256-PAYLOAD' -d 'x'
echo "== env"
env | grep '^AWS_' | sort
"#
    );
    let ca_in = hermes_tests::egress::CA_IN_CONTAINER.to_string();
    let out = in_container_with(
        &proxy,
        &[
            ("AWS_ACCESS_KEY_ID", key_id.clone()),
            ("AWS_SECRET_ACCESS_KEY", secret.clone()),
            ("AWS_REGION", "us-east-1".into()),
            ("AWS_DEFAULT_REGION", "us-east-1".into()),
            ("AWS_CA_BUNDLE", ca_in),
            ("PYTHONPATH", BOTO.into()),
        ],
        &[("client.py", CLIENT_PY)],
        &[(boto.as_path(), BOTO)],
        &script,
    );
    let context = format!("{out:?}\nproxy log:\n{}", proxy.log());
    let sdk: serde_json::Value = serde_json::from_str(&out.section("sdk"))
        .unwrap_or_else(|e| panic!("sdk output: {e}\n{context}"));

    // The upstream checked botocore's signature with the real secret.
    assert_eq!(sdk["invoke"]["checked"], "ok", "{context}");
    assert_eq!(sdk["invoke"]["body"]["prompt"], "hi", "{context}");
    // The stream came through chunk by chunk, not gathered at the end.
    let chunks = sdk["stream"].as_array().expect("stream");
    assert_eq!(chunks.len(), 3, "{context}");
    for (i, c) in chunks.iter().enumerate() {
        assert_eq!(c["chunk"]["n"], i, "{context}");
    }
    let spread = chunks[2]["at"].as_f64().unwrap() - chunks[0]["at"].as_f64().unwrap();
    assert!(spread > 0.5, "chunks arrived together: {context}");
    // A signature made with another secret never reaches the upstream.
    assert_eq!(sdk["wrong"]["status"], 403, "{context}");
    assert_eq!(sdk["wrong"]["refused"], "bad-signature", "{context}");

    // A chunk-signed body is refused with the reason, in the JSON shape
    // of the proxy's refusals.
    let streaming = out.section("streaming-body");
    assert!(streaming.ends_with("400"), "{context}");
    assert!(
        streaming.contains("\"code\":\"sigv4-streaming-unsupported\""),
        "{context}"
    );
    assert!(streaming.contains("chunk-signed"), "{context}");

    // What the upstream received: two requests (the refused ones never
    // reached it), each signed with the real key id and session token,
    // never carrying a placeholder.
    let got = upstream.requests();
    assert_eq!(got.len(), 2, "{got:?}\n{context}");
    for r in &got {
        assert_eq!(r["verdict"], "ok", "{r}");
        let text = r.to_string();
        assert!(text.contains(&format!("Credential={REAL_ID}/")), "{r}");
        assert_eq!(r["headers"]["x-amz-security-token"], REAL_SESSION, "{r}");
        assert!(!text.contains(&key_id) && !text.contains(&secret), "{r}");
    }
    // No real secret inside the container or in the proxy's log.
    let env = out.section("env");
    assert!(
        env.contains(&format!("AWS_ACCESS_KEY_ID={key_id}")),
        "{env}"
    );
    for real in [REAL_ID, REAL_SECRET, REAL_SESSION] {
        assert!(
            !out.stdout.contains(real) && !out.stderr.contains(real),
            "{context}"
        );
        assert!(!proxy.log().contains(real), "{context}");
    }
}

const KIB: usize = 1024;
const MIB: usize = 1024 * 1024;

/// boto3 for the containers, or `None` (offline: the test says so and
/// skips).
fn boto() -> Option<PathBuf> {
    pip_target(
        Path::new(env!("CARGO_TARGET_TMPDIR")),
        "boto3-pure",
        &["boto3"],
    )
}

/// A home whose proxy re-signs for `upstream` (every host of `hosts`
/// resolved to it) with the real pair in `.env`, `proxy_yaml` added and
/// `limits` set by hand in `config.json`; started.
fn aws_proxy(
    upstream: &SigningUpstream,
    hosts: &[&str],
    proxy_yaml: &str,
    limits: Option<serde_json::Value>,
) -> (Proxy, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("upstream-ca.pem");
    std::fs::write(&ca, &upstream.ca_pem).unwrap();
    let resolve: String = hosts
        .iter()
        .map(|h| format!("    {h}: 127.0.0.1\n"))
        .collect();
    let mut proxy = Proxy::setup(&format!(
        "  upstream_deny_cidrs: [169.254.0.0/16, 10.0.0.0/8]\n  upstream_ca_file: {}\n  resolve:\n{resolve}{proxy_yaml}",
        ca.display()
    ));
    std::fs::write(
        proxy.home.path().join(".env"),
        format!(
            "AWS_ACCESS_KEY_ID={REAL_ID}\nAWS_SECRET_ACCESS_KEY={REAL_SECRET}\nAWS_SESSION_TOKEN={REAL_SESSION}\n"
        ),
    )
    .unwrap();
    if let Some(limits) = limits {
        // Set by hand in config.json, as an operator would.
        let config = proxy.dir().join("config.json");
        let mut json: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&config).unwrap()).unwrap();
        json["limits"] = limits;
        std::fs::write(&config, serde_json::to_vec_pretty(&json).unwrap()).unwrap();
    }
    proxy.start(&[]);
    (proxy, dir)
}

/// Runs `script` (Python, with boto3) in a container as a sandbox of
/// `proxy`, with the placeholder pair; its stdout's `== sdk` section is JSON.
fn sandbox_python(
    proxy: &Proxy,
    boto: &Path,
    script: &str,
    port: u16,
) -> (serde_json::Value, Sections) {
    let out = in_container_with(
        proxy,
        &[
            ("AWS_ACCESS_KEY_ID", proxy.token("aws")),
            ("AWS_SECRET_ACCESS_KEY", proxy.token("aws-secret")),
            ("AWS_REGION", "us-east-1".into()),
            ("AWS_DEFAULT_REGION", "us-east-1".into()),
            (
                "AWS_CA_BUNDLE",
                hermes_tests::egress::CA_IN_CONTAINER.to_string(),
            ),
            ("PYTHONPATH", BOTO.into()),
        ],
        &[("client.py", script)],
        &[(boto, BOTO)],
        &format!("python3 /t/client.py {port}\n"),
    );
    let sdk = serde_json::from_str(&out.section("sdk"))
        .unwrap_or_else(|e| panic!("sdk output: {e}\n{out:?}\nproxy log:\n{}", proxy.log()));
    (sdk, out)
}

/// The access lines of the proxy's log with `reason` and `status`.
fn logged(proxy: &Proxy, reason: &str, status: u64) -> usize {
    proxy
        .log()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|l| l["reason"] == reason && l["status"] == status)
        .count()
}

/// [`logged`] once it reaches `want` (or after 10 s): see
/// [`Proxy::log_when`].
fn logged_at_least(proxy: &Proxy, reason: &str, status: u64, want: usize) -> usize {
    proxy.log_when(|_| logged(proxy, reason, status) >= want);
    logged(proxy, reason, status)
}

fn held(health: &serde_json::Value) -> u64 {
    health["signed_bodies"]["held"].as_u64().unwrap_or(u64::MAX)
}

/// One invoke of the Bedrock runtime.
const INVOKE_PY: &str = r#"
import json, sys
import boto3
from botocore.config import Config
port = sys.argv[1]
config = Config(retries={"max_attempts": 1, "mode": "standard"}, read_timeout=20, connect_timeout=10)
c = boto3.client("bedrock-runtime", endpoint_url="https://bedrock-runtime.us-east-1.amazonaws.com:%s" % port, config=config)
out = {}
try:
    r = c.invoke_model(modelId="m", body=json.dumps({"prompt": "from the other sandbox"}), contentType="application/json")
    out["invoke"] = json.loads(r["body"].read())
except Exception as e:
    out["invoke"] = {"error": repr(e)}
print("== sdk")
print(json.dumps(out))
"#;

#[test]
fn one_client_holding_many_large_declared_bodies_leaves_signing_to_another_sandbox() {
    let Some(boto) = boto() else {
        return;
    };
    let upstream = SigningUpstream::start(&boto, &[HOST], REAL_ID, REAL_SECRET, REAL_SESSION);
    // Small limits, so the test holds little: 4 MiB of signed bodies in
    // all, 1 MiB per client; no body cut for slowness while it runs.
    let (proxy, _dir) = aws_proxy(
        &upstream,
        &[HOST],
        "",
        Some(serde_json::json!({
            "signed_body_bytes": 4 * MIB,
            "signed_body_bytes_per_client": MIB,
            "signed_body_grace_seconds": 60,
        })),
    );
    let ca = std::fs::read_to_string(proxy.ca_path()).unwrap();
    let key_id = proxy.token("aws");
    let port = upstream.port;
    let dir = proxy.dir();
    // One client (127.0.0.1) opens eight requests declaring 1 MiB each:
    // twice what all clients together may hold. Four send nothing.
    let mut flood: Vec<PendingBody> = (0..8)
        .map(|_| PendingBody::open(proxy.port, &ca, HOST, port, &key_id, MIB))
        .collect();
    // The other four send 384 KiB each, one after the other: the first
    // two are held (768 KiB), each further one would take the client over
    // its 1 MiB and is refused (429), what it held given back. (A step
    // that does not come is said after the other sandbox's request.)
    let mut flooded = Ok(());
    for (i, body) in flood[4..].iter_mut().enumerate() {
        let _ = body.send(384 * KIB);
        let refused = i.saturating_sub(1);
        let expect = (i.min(1) + 1) as u64 * 384 * KIB as u64;
        let (ok, last) = health_until(&dir, Duration::from_secs(20), |h| {
            held(h) == expect && logged(&proxy, "sigv4-busy", 429) == refused
        });
        if !ok {
            flooded = Err(format!(
                "after body {i}: held {} (expected {expect}), {} refusals (expected {refused}): {last:#}\nlog:\n{}",
                held(&last),
                logged(&proxy, "sigv4-busy", 429),
                proxy.log()
            ));
            break;
        }
    }

    // While it holds all that: another sandbox's signed request is read,
    // signed and answered.
    let (sdk, out) = sandbox_python(&proxy, &boto, INVOKE_PY, port);
    let context = format!("{out:?}\nproxy log:\n{}", proxy.log());
    assert_eq!(sdk["invoke"]["checked"], "ok", "{context}");
    flooded.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        health(&dir)["signed_bodies"]["bytes_per_client"],
        MIB as u64
    );
    assert_eq!(
        sdk["invoke"]["body"]["prompt"], "from the other sandbox",
        "{context}"
    );
    assert_eq!(logged(&proxy, "sigv4-busy", 503), 0, "{context}");
    // The flood still holds its bodies, and only them.
    assert_eq!(held(&health(&dir)), 768 * KIB as u64, "{context}");

    // The client goes away: everything it held is given back.
    drop(flood);
    let (ok, last) = health_until(&dir, Duration::from_secs(20), |h| held(h) == 0);
    assert!(ok, "still held after the client left: {last:#}");
    assert_eq!(upstream.requests().len(), 1, "{context}");
}

#[test]
fn a_signed_body_arriving_below_the_minimum_rate_is_cut_with_the_reason_and_gives_back_what_it_held()
 {
    let Some(boto) = boto() else {
        return;
    };
    let upstream = SigningUpstream::start(&boto, &[HOST], REAL_ID, REAL_SECRET, REAL_SESSION);
    // 2 s of grace, and a second more for every 64 KiB.
    let (proxy, _dir) = aws_proxy(
        &upstream,
        &[HOST],
        "",
        Some(serde_json::json!({
            "signed_body_grace_seconds": 2,
            "signed_body_min_bytes_per_second": 64 * KIB,
        })),
    );
    let ca = std::fs::read_to_string(proxy.ca_path()).unwrap();
    let dir = proxy.dir();
    let started = Instant::now();
    let mut body = PendingBody::open(
        proxy.port,
        &ca,
        HOST,
        upstream.port,
        &proxy.token("aws"),
        512 * KIB,
    );
    // 64 KiB at once earns a second beyond the grace: due 3 s after the
    // head. Then a byte every half second, waiting for an answer between
    // bytes (so none is in flight when it comes).
    body.send(64 * KIB).unwrap();
    let (ok, last) = health_until(&dir, Duration::from_secs(20), |h| {
        held(h) == 64 * KIB as u64
    });
    assert!(ok, "the first 64 KiB were not held: {last:#}");
    let mut answer = None;
    for _ in 0..60 {
        if let Some(text) = body.response(Duration::from_millis(500)) {
            answer = Some(text);
            break;
        }
        if body.send(1).is_err() {
            answer = body.response(Duration::from_secs(5));
            break;
        }
    }
    let took = started.elapsed();
    let answer = answer.unwrap_or_else(|| panic!("no answer in 30 s\nlog:\n{}", proxy.log()));
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(
        answer.contains("x-hermes-egress-refused: body-too-slow"),
        "{answer}"
    );
    assert!(
        answer.contains("the signed request body arrived too slowly"),
        "{answer}"
    );
    assert!(
        answer.contains("a body gets 2 s, and one more for every 64 KiB that arrives"),
        "{answer}"
    );
    // Not before its due time.
    assert!(took >= Duration::from_secs(3), "cut after {took:?}");
    // Given back by the time the answer came.
    assert_eq!(held(&health(&dir)), 0);
    assert_eq!(
        logged_at_least(&proxy, "body-too-slow", 408, 1),
        1,
        "{}",
        proxy.log()
    );
    assert!(upstream.requests().is_empty());
}

/// Requests that would hand out credentials, through the SDK and by
/// hand, and one that would not.
const MINTING_PY: &str = r#"
import json, os, sys
import boto3, botocore
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.config import Config
from botocore.credentials import Credentials
from botocore.httpsession import URLLib3Session
port = sys.argv[1]
config = Config(retries={"max_attempts": 1, "mode": "standard"}, read_timeout=20, connect_timeout=10)
def client(service, host):
    return boto3.client(service, endpoint_url="https://%s:%s" % (host, port), config=config)
out = {}
def attempt(name, call):
    try:
        out[name] = {"accepted": repr(call())}
    except botocore.exceptions.ClientError as e:
        meta = e.response["ResponseMetadata"]
        out[name] = {"status": meta["HTTPStatusCode"], "code": e.response["Error"].get("Code"), "message": e.response["Error"].get("Message"), "refused": meta["HTTPHeaders"].get("x-hermes-egress-refused")}
    except Exception as e:
        out[name] = {"error": repr(e)}
attempt("session_token", lambda: client("sts", "sts.amazonaws.com").get_session_token())
attempt("assume_role", lambda: client("sts", "sts.us-east-1.amazonaws.com").assume_role(RoleArn="arn:aws:iam::123456789012:role/r", RoleSessionName="sandbox"))
attempt("access_key", lambda: client("iam", "iam.amazonaws.com").create_access_key(UserName="u"))
# By hand: signed for Bedrock, to Bedrock's host, naming a minting action.
creds = Credentials(os.environ["AWS_ACCESS_KEY_ID"], os.environ["AWS_SECRET_ACCESS_KEY"])
session = URLLib3Session(proxies={"https": os.environ["HTTPS_PROXY"]}, verify=os.environ["AWS_CA_BUNDLE"])
def raw(name, body, headers):
    req = AWSRequest(method="POST", url="https://bedrock-runtime.us-east-1.amazonaws.com:%s/" % port, data=body, headers=headers)
    SigV4Auth(creds, "bedrock", "us-east-1").add_auth(req)
    r = session.send(req.prepare())
    out[name] = {"status": r.status_code, "refused": r.headers.get("x-hermes-egress-refused"), "type": r.headers.get("x-amzn-errortype"), "body": r.text}
raw("form_action", b"Action=GetSessionToken&Version=2011-06-15", {"Content-Type": "application/x-www-form-urlencoded; charset=utf-8"})
raw("target", b"{}", {"Content-Type": "application/x-amz-json-1.1", "X-Amz-Target": "AWSCognitoIdentityService.GetCredentialsForIdentity"})
r = client("bedrock-runtime", "bedrock-runtime.us-east-1.amazonaws.com").invoke_model(modelId="m", body=json.dumps({"prompt": "hi"}), contentType="application/json")
out["invoke"] = json.loads(r["body"].read())
print("== sdk")
print(json.dumps(out))
"#;

#[test]
fn requests_that_would_hand_out_credentials_are_refused_with_an_aws_error_and_never_signed() {
    let Some(boto) = boto() else {
        return;
    };
    let hosts = [
        HOST,
        "sts.amazonaws.com",
        "sts.us-east-1.amazonaws.com",
        "iam.amazonaws.com",
    ];
    let upstream = SigningUpstream::start(&boto, &hosts, REAL_ID, REAL_SECRET, REAL_SESSION);
    // The whole partition: STS and IAM are under it.
    let (proxy, _dir) = aws_proxy(
        &upstream,
        &hosts,
        "  aws_hosts: ['*.amazonaws.com']\n",
        None,
    );
    let check = proxy.hermes(&["config", "check"], &[]);
    assert!(
        check.stderr.contains("the proxy refuses those services")
            || check.stdout.contains("the proxy refuses those services"),
        "{check:?}"
    );
    let (sdk, out) = sandbox_python(&proxy, &boto, MINTING_PY, upstream.port);
    let context = format!("{sdk:#}\n{out:?}\nproxy log:\n{}", proxy.log());

    // Through the SDK: an AWS error the SDK reads, naming why.
    for (name, what) in [
        ("session_token", "sts.amazonaws.com is a host of STS"),
        (
            "assume_role",
            "sts.us-east-1.amazonaws.com is a host of STS",
        ),
        ("access_key", "iam.amazonaws.com is a host of IAM"),
    ] {
        let r = &sdk[name];
        assert_eq!(r["status"], 403, "{name}: {context}");
        assert_eq!(r["code"], "AccessDenied", "{name}: {context}");
        assert_eq!(
            r["refused"], "sigv4-credentials-refused",
            "{name}: {context}"
        );
        let message = r["message"].as_str().unwrap_or_default();
        assert!(
            message.starts_with("hermes egress refused: "),
            "{name}: {context}"
        );
        assert!(message.contains(what), "{name}: {context}");
        assert!(
            message.contains("never signs requests that hand out AWS credentials"),
            "{name}: {context}"
        );
    }
    // By hand, to an allowed host and service: the action decides.
    let form = &sdk["form_action"];
    assert_eq!(form["status"], 403, "{context}");
    assert_eq!(form["refused"], "sigv4-credentials-refused", "{context}");
    let body = form["body"].as_str().unwrap_or_default();
    assert!(body.contains("<Code>AccessDenied</Code>"), "{context}");
    assert!(
        body.contains("the form body's Action `GetSessionToken`"),
        "{context}"
    );
    let target = &sdk["target"];
    assert_eq!(target["status"], 403, "{context}");
    assert_eq!(target["type"], "AccessDeniedException", "{context}");
    let json: serde_json::Value =
        serde_json::from_str(target["body"].as_str().unwrap_or_default()).unwrap();
    assert!(
        json["message"]
            .as_str()
            .unwrap_or_default()
            .contains("GetCredentialsForIdentity"),
        "{context}"
    );
    // What the agent needs still works under the same pattern.
    assert_eq!(sdk["invoke"]["checked"], "ok", "{context}");

    // Only that one reached the upstream: the real key signed nothing else,
    // and no minted credential came back.
    let got = upstream.requests();
    assert_eq!(got.len(), 1, "{got:?}\n{context}");
    assert!(
        got[0]["path"].as_str().unwrap().contains("/invoke"),
        "{got:?}"
    );
    assert!(!out.stdout.contains(MINTED_KEY_ID), "{context}");
    assert_eq!(
        logged_at_least(&proxy, "sigv4-credentials-refused", 403, 5),
        5,
        "{context}"
    );
}
