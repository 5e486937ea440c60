//! AWS SigV4 through the egress proxy, end to end: the official AWS SDK
//! for Python (`boto3` from PyPI) inside a container of the test image,
//! holding only the placeholder pair the proxy minted, calls a local TLS
//! upstream standing in for the Bedrock runtime endpoint (reached through
//! `proxy.resolve`); the upstream checks every signature with botocore's
//! own signer and the real secret and session token, which only the proxy
//! holds (from the home's `.env`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use hermes_tests::aws::SigningUpstream;
use hermes_tests::egress::{Proxy, in_container_with};
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
    let upstream = SigningUpstream::start(&boto, HOST, REAL_ID, REAL_SECRET, REAL_SESSION);
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
