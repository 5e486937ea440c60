//! Google OAuth minted by the egress proxy, end to end: a service-account
//! key made by the test (openssl) on the host, named by
//! `GOOGLE_APPLICATION_CREDENTIALS` in the proxy's environment; a token
//! endpoint of the test's own (TLS, the key file's `token_uri`) that
//! verifies each JWT bearer grant with the key's public half before it
//! answers an access token; the test's TLS upstream standing in for
//! Vertex AI. Inside a container of the test image, `google-auth` (from
//! PyPI) sends the `gcp` proxy token as its bearer token; Vertex receives
//! the minted access token. The container never sees the key file.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::convert::Infallible;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use ring::signature::{KeyPair, RSA_PKCS1_2048_8192_SHA256, RsaKeyPair, UnparsedPublicKey};
use rustls_pki_types::PrivatePkcs8KeyDer;
use rustls_pki_types::pem::PemObject;

use hermes_tests::egress::{Proxy, in_container_with};
use hermes_tests::upstream::{Upstream, certificates};

const VERTEX: &str = "us-central1-aiplatform.googleapis.com";
const TOKEN_HOST: &str = "oauth2.hermes-test.example";
const EMAIL: &str = "e2e@hermes-test.iam.gserviceaccount.com";

/// A token endpoint: each POST whose form is a JWT bearer grant signed by
/// the key of `public` (PKCS#1 DER), issued by [`EMAIL`] for `aud`, gets
/// `ya29.e2e-minted-N`; anything else a 400 `invalid_grant`.
struct TokenEndpoint {
    ca_pem: String,
    minted: Arc<AtomicUsize>,
    refused: Arc<AtomicUsize>,
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl TokenEndpoint {
    /// Listens on loopback `port` (free a moment ago: the key file names
    /// the endpoint's URL before it starts).
    fn start(public: Vec<u8>, aud: String, port: u16) -> TokenEndpoint {
        let (ca_pem, chain, key) = certificates(&[TOKEN_HOST]);
        let std_listener = std::net::TcpListener::bind(("127.0.0.1", port)).unwrap();
        std_listener.set_nonblocking(true).unwrap();
        let minted = Arc::new(AtomicUsize::new(0));
        let refused = Arc::new(AtomicUsize::new(0));
        let (stop, stopped) = tokio::sync::oneshot::channel();
        let (m, r) = (minted.clone(), refused.clone());
        let public = Arc::new(public);
        let aud = Arc::new(aud);
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(std_listener).unwrap();
                let config = rustls::ServerConfig::builder_with_provider(Arc::new(
                    rustls::crypto::ring::default_provider(),
                ))
                .with_safe_default_protocol_versions()
                .and_then(|b| b.with_no_client_auth().with_single_cert(chain, key))
                .unwrap();
                let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
                let serve = async {
                    loop {
                        let Ok((tcp, _)) = listener.accept().await else {
                            continue;
                        };
                        let acceptor = acceptor.clone();
                        let (m, r, public, aud) =
                            (m.clone(), r.clone(), public.clone(), aud.clone());
                        tokio::spawn(async move {
                            let Ok(tls) = acceptor.accept(tcp).await else {
                                return;
                            };
                            let service = hyper::service::service_fn(move |req| {
                                let (m, r, public, aud) =
                                    (m.clone(), r.clone(), public.clone(), aud.clone());
                                async move {
                                    Ok::<_, Infallible>(grant(req, &public, &aud, &m, &r).await)
                                }
                            });
                            let _ = hyper::server::conn::http1::Builder::new()
                                .serve_connection(TokioIo::new(tls), service)
                                .await;
                        });
                    }
                };
                tokio::select! {
                    () = serve => {}
                    _ = stopped => {}
                }
            });
        });
        TokenEndpoint {
            ca_pem,
            minted,
            refused,
            _stop: stop,
        }
    }
}

async fn grant(
    req: Request<hyper::body::Incoming>,
    public: &[u8],
    aud: &str,
    minted: &AtomicUsize,
    refused: &AtomicUsize,
) -> Response<Full<Bytes>> {
    let post = req.method() == hyper::Method::POST && req.uri().path() == "/token";
    let body = req.into_body().collect().await.unwrap().to_bytes();
    let form = String::from_utf8_lossy(&body).into_owned();
    let verified = post && verify(&form, public, aud).is_ok();
    let (status, json) = if verified {
        let n = minted.fetch_add(1, Ordering::SeqCst) + 1;
        (
            StatusCode::OK,
            serde_json::json!({
                "access_token": format!("ya29.e2e-minted-{n}"),
                "expires_in": 3599,
                "token_type": "Bearer",
            }),
        )
    } else {
        refused.fetch_add(1, Ordering::SeqCst);
        (
            StatusCode::BAD_REQUEST,
            serde_json::json!({"error": "invalid_grant"}),
        )
    };
    let mut response = Response::new(Full::new(Bytes::from(json.to_string())));
    *response.status_mut() = status;
    response
}

/// Google's checks of a JWT bearer grant: the grant type, the RS256
/// signature under the service account's key, the issuer, audience,
/// scope and lifetime.
/// curl on the host calls Vertex's `/echo` on `port` through the proxy
/// with the `gcp` token: the body, then a line with the status code.
fn vertex_echo_from_the_host(proxy: &Proxy, port: u16) -> String {
    let out = std::process::Command::new("curl")
        .args(["-sS", "--max-time", "30", "-o", "-", "-w", "\n%{http_code}"])
        .arg("--proxy")
        .arg(format!("http://127.0.0.1:{}", proxy.port))
        .arg("--cacert")
        .arg(proxy.ca_path())
        .arg("-H")
        .arg(format!("Authorization: Bearer {}", proxy.token("gcp")))
        .arg(format!("https://{VERTEX}:{port}/echo"))
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn verify(form: &str, public: &[u8], aud: &str) -> Result<(), String> {
    let fields: std::collections::HashMap<&str, &str> = form
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .collect();
    if fields.get("grant_type") != Some(&"urn%3Aietf%3Aparams%3Aoauth%3Agrant-type%3Ajwt-bearer") {
        return Err("grant_type".into());
    }
    let jwt = fields.get("assertion").ok_or("no assertion")?;
    let (signed, signature) = jwt.rsplit_once('.').ok_or("no signature")?;
    let signature = URL_SAFE_NO_PAD
        .decode(signature)
        .map_err(|e| e.to_string())?;
    UnparsedPublicKey::new(&RSA_PKCS1_2048_8192_SHA256, public)
        .verify(signed.as_bytes(), &signature)
        .map_err(|_| "bad signature")?;
    let (header, claims) = signed.split_once('.').ok_or("no claims")?;
    let header: serde_json::Value =
        serde_json::from_slice(&URL_SAFE_NO_PAD.decode(header).map_err(|e| e.to_string())?)
            .map_err(|e| e.to_string())?;
    let claims: serde_json::Value =
        serde_json::from_slice(&URL_SAFE_NO_PAD.decode(claims).map_err(|e| e.to_string())?)
            .map_err(|e| e.to_string())?;
    let lifetime = claims["exp"].as_u64().unwrap_or(0) - claims["iat"].as_u64().unwrap_or(0);
    let ok = header["alg"] == "RS256"
        && claims["iss"] == EMAIL
        && claims["aud"] == aud
        && claims["scope"] == "https://www.googleapis.com/auth/cloud-platform"
        && lifetime > 0
        && lifetime <= 3600;
    if ok {
        Ok(())
    } else {
        Err(format!("claims {claims}"))
    }
}

/// A fresh service-account key file in `dir` whose `token_uri` is
/// `token_uri`: its path, its PEM private key, and the DER of its public
/// half.
fn service_account(dir: &Path, token_uri: &str) -> (std::path::PathBuf, String, Vec<u8>) {
    let out = std::process::Command::new("openssl")
        .args([
            "genpkey",
            "-algorithm",
            "RSA",
            "-pkeyopt",
            "rsa_keygen_bits:2048",
        ])
        .output()
        .expect("openssl");
    assert!(out.status.success(), "openssl genpkey failed");
    let pem = String::from_utf8(out.stdout).unwrap();
    let der = PrivatePkcs8KeyDer::from_pem_slice(pem.as_bytes()).unwrap();
    let public = RsaKeyPair::from_pkcs8(der.secret_pkcs8_der())
        .unwrap()
        .public_key()
        .as_ref()
        .to_vec();
    let json = serde_json::json!({
        "type": "service_account",
        "project_id": "hermes-test",
        "private_key_id": "e2e-key-1",
        "private_key": pem,
        "client_email": EMAIL,
        "client_id": "1",
        "token_uri": token_uri,
    });
    let path = dir.join("service-account.json");
    std::fs::write(&path, json.to_string()).unwrap();
    (path, pem, public)
}

const SCRIPT: &str = r#"
import json, os, sys
import google.auth
import google.oauth2.credentials
from google.auth.transport.requests import AuthorizedSession
url = sys.argv[1]
def call(creds):
    r = AuthorizedSession(creds).post(url, json={"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}, timeout=30)
    return {"status": r.status_code, "refused": r.headers.get("x-hermes-egress-refused"), "body": r.json()}
token = google.oauth2.credentials.Credentials(os.environ["GOOGLE_OAUTH_ACCESS_TOKEN"])
wrong = google.oauth2.credentials.Credentials("gcp-ffffffffffffffffffffffffffffffff")
# Application default credentials: an authorized_user file holding the
# token, with an expiry far ahead, so google-auth never refreshes it.
adc, _ = google.auth.default()
print(json.dumps({
    "first": call(token),
    "second": call(token),
    "adc": call(adc),
    "wrong": call(wrong),
    "env": sorted(k for k in os.environ if k.startswith("GOOGLE")),
}))
"#;

/// The site-packages of a host venv holding google-auth (PyPI), made
/// once and mounted into containers, whose Python is the same 3.11;
/// `None` (the test skips, saying why) when PyPI cannot be reached.
fn google_auth_site() -> Option<std::path::PathBuf> {
    let python = hermes_tests::python::venv(
        Path::new(env!("CARGO_TARGET_TMPDIR")),
        "google-auth-venv",
        &["google-auth", "requests"],
    )?;
    let site = python
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .join("lib/python3.11/site-packages");
    assert!(site.is_dir(), "no {}", site.display());
    Some(site)
}

/// google-auth in a sandbox sends the gcp token; the Vertex stand-in
/// receives the access token the proxy minted with a grant the token
/// endpoint verified against the service account's key; one grant serves
/// every request (cached); a wrong token is refused and nothing is
/// minted for it; neither the key nor the minted token reaches the
/// container or the proxy's log.
#[test]
fn google_auth_in_a_sandbox_gets_vertex_a_token_minted_from_the_hosts_service_account() {
    let Some(site) = google_auth_site() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let port_probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let token_port = port_probe.local_addr().unwrap().port();
    drop(port_probe);
    let token_uri = format!("https://{TOKEN_HOST}:{token_port}/token");
    let (key_file, pem, public) = service_account(dir.path(), &token_uri);
    let endpoint = TokenEndpoint::start(public, token_uri.clone(), token_port);
    let vertex = Upstream::start("127.0.0.1:0".parse().unwrap(), &[VERTEX]);
    let roots = dir.path().join("upstream-ca.pem");
    std::fs::write(&roots, format!("{}{}", vertex.ca_pem, endpoint.ca_pem)).unwrap();
    let mut proxy = Proxy::setup(&format!(
        "  upstream_deny_cidrs: [169.254.0.0/16, 10.0.0.0/8]\n  upstream_ca_file: {}\n  resolve:\n    {VERTEX}: 127.0.0.1\n    {TOKEN_HOST}: 127.0.0.1\n",
        roots.display()
    ));
    proxy.start(&[("GOOGLE_APPLICATION_CREDENTIALS", key_file.to_str().unwrap())]);
    let token = proxy.token("gcp");
    let adc = serde_json::json!({
        "type": "authorized_user",
        "client_id": "hermes-egress",
        "client_secret": "hermes-egress",
        "refresh_token": token,
        "token": token,
        "expiry": "2999-01-01T00:00:00Z",
    })
    .to_string();
    let url = format!(
        "https://{VERTEX}:{}/v1/projects/p/locations/us-central1/publishers/google/models/gemini-test:generateContent",
        vertex.addr.port()
    );
    let script = SCRIPT.replace("sys.argv[1]", &format!("{url:?}"));
    let out = in_container_with(
        &proxy,
        &[
            ("GOOGLE_OAUTH_ACCESS_TOKEN", token.clone()),
            ("GOOGLE_APPLICATION_CREDENTIALS", "/t/adc.json".to_string()),
            ("PYTHONPATH", "/pylib".to_string()),
        ],
        &[("adc.json", &adc), ("client.py", &script)],
        &[(&site, "/pylib")],
        "python3 /t/client.py",
    );
    assert_eq!(out.code, 0, "{out:?}\nproxy log:\n{}", proxy.log());
    let result: serde_json::Value = serde_json::from_str(out.stdout.trim()).unwrap();
    for name in ["first", "second", "adc"] {
        let call = &result[name];
        assert_eq!(call["status"], 200, "{name}: {call}");
        assert_eq!(
            call["body"]["headers"]["authorization"], "Bearer ya29.e2e-minted-1",
            "{name}: {call}"
        );
        assert!(
            call["body"]["path"]
                .as_str()
                .unwrap()
                .ends_with(":generateContent")
        );
    }
    let wrong = &result["wrong"];
    assert_eq!(wrong["status"], 403, "{wrong}");
    assert_eq!(wrong["refused"], "bad-token", "{wrong}");
    assert_eq!(
        endpoint.minted.load(Ordering::SeqCst),
        1,
        "one grant, cached"
    );
    assert_eq!(endpoint.refused.load(Ordering::SeqCst), 0);
    // The container knew only the token and its own placeholder file.
    assert_eq!(
        result["env"],
        serde_json::json!([
            "GOOGLE_APPLICATION_CREDENTIALS",
            "GOOGLE_OAUTH_ACCESS_TOKEN"
        ])
    );
    let key_body: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
    for text in [&out.stdout, &out.stderr, &proxy.log()] {
        assert!(!text.contains(&key_body[..64]), "the private key leaked");
        assert!(!text.contains("PRIVATE KEY"));
    }
    assert!(!proxy.log().contains("ya29.e2e-minted"), "{}", proxy.log());
    // The status says how the service account is covered.
    let status = proxy.hermes(
        &["egress", "status"],
        &[("GOOGLE_APPLICATION_CREDENTIALS", key_file.to_str().unwrap())],
    );
    let line = status
        .stdout
        .lines()
        .find(|l| l.starts_with("GOOGLE_APPLICATION_CREDENTIALS"))
        .unwrap_or_else(|| panic!("{status:?}"))
        .to_string();
    assert!(
        line.contains("OAuth minting") && line.contains("(set on this host)"),
        "{line}"
    );
}

/// A key file the token endpoint does not know (another key, same
/// account): the grant is refused, the request fails with the proxy's
/// reason, and nothing reaches Vertex.
#[test]
fn a_grant_the_token_endpoint_refuses_fails_the_request_with_a_reason() {
    let dir = tempfile::tempdir().unwrap();
    let port_probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let token_port = port_probe.local_addr().unwrap().port();
    drop(port_probe);
    let token_uri = format!("https://{TOKEN_HOST}:{token_port}/token");
    let (key_file, _, _) = service_account(dir.path(), &token_uri);
    let other = tempfile::tempdir().unwrap();
    let (_, _, other_public) = service_account(other.path(), &token_uri);
    let endpoint = TokenEndpoint::start(other_public, token_uri, token_port);
    let vertex = Upstream::start("127.0.0.1:0".parse().unwrap(), &[VERTEX]);
    let roots = dir.path().join("upstream-ca.pem");
    std::fs::write(&roots, format!("{}{}", vertex.ca_pem, endpoint.ca_pem)).unwrap();
    let mut proxy = Proxy::setup(&format!(
        "  upstream_deny_cidrs: [169.254.0.0/16, 10.0.0.0/8]\n  upstream_ca_file: {}\n  resolve:\n    {VERTEX}: 127.0.0.1\n    {TOKEN_HOST}: 127.0.0.1\n",
        roots.display()
    ));
    proxy.start(&[("GOOGLE_APPLICATION_CREDENTIALS", key_file.to_str().unwrap())]);
    let text = vertex_echo_from_the_host(&proxy, vertex.addr.port());
    assert!(text.ends_with("\n502"), "{text}");
    assert!(
        text.contains("oauth-mint-failed") && text.contains("invalid_grant"),
        "{text}"
    );
    assert_eq!(endpoint.refused.load(Ordering::SeqCst), 1);
    assert_eq!(
        vertex.accepted_before_a_probe(),
        0,
        "a request without a token reached Vertex"
    );
}

/// A real Docker sandbox wired by `hermes reconcile`: it gets the `gcp`
/// token and the placeholder credentials file, so `google.auth.default()`
/// (as the Vertex SDKs call it) works unchanged, and Vertex receives the
/// minted token; the key file's path and key appear nowhere inside.
#[test]
fn application_default_credentials_in_a_wired_sandbox_reach_vertex_with_a_minted_token() {
    use hermes_tests::cli::TestHome;
    use hermes_tests::docker_cli::ProfileCleanup;
    use hermes_tests::egress::{bridge_gateway, free_port_pair};

    let Some(site) = google_auth_site() else {
        return;
    };
    let keys = tempfile::tempdir().unwrap();
    let port_probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let token_port = port_probe.local_addr().unwrap().port();
    drop(port_probe);
    let token_uri = format!("https://{TOKEN_HOST}:{token_port}/token");
    let (key_file, pem, public) = service_account(keys.path(), &token_uri);
    let endpoint = TokenEndpoint::start(public, token_uri, token_port);
    let vertex = Upstream::start("127.0.0.1:0".parse().unwrap(), &[VERTEX]);

    let profile = format!("gadc{}", std::process::id());
    let home = TestHome::with_profile(&profile);
    let roots = home.path().join("upstream-ca.pem");
    std::fs::write(&roots, format!("{}{}", vertex.ca_pem, endpoint.ca_pem)).unwrap();
    let port = free_port_pair(Some(bridge_gateway()));
    home.write_config(format!(
        "terminal:\n  backend: docker\n  docker_image: {}\nsecurity:\n  redact_secrets: false\nproxy:\n  enabled: true\n  tunnel_port: {port}\n  upstream_deny_cidrs: [169.254.0.0/16, 10.0.0.0/8]\n  upstream_ca_file: {}\n  resolve:\n    {VERTEX}: 127.0.0.1\n    {TOKEN_HOST}: 127.0.0.1\n",
        hermes_tests::test_image(),
        roots.display()
    ));
    let _cleanup = ProfileCleanup(profile.clone());
    struct Stop<'a>(&'a TestHome);
    impl Drop for Stop<'_> {
        fn drop(&mut self) {
            let _ = self.0.run(["egress", "stop"]);
        }
    }
    let _stop = Stop(&home);
    let hermes = |args: &[&str]| -> hermes_tests::cli::Run {
        let mut all = vec!["--profile", profile.as_str()];
        all.extend_from_slice(args);
        home.command(all)
            .env("GOOGLE_APPLICATION_CREDENTIALS", &key_file)
            .output()
            .unwrap()
            .into()
    };
    let apply = hermes(&["reconcile"]);
    assert_eq!(apply.code, 0, "{apply:?}");
    let workspace = home.path().join("sandboxes/docker/default/workspace");
    let copied = std::process::Command::new("cp")
        .arg("-r")
        .arg(&site)
        .arg(workspace.join("pylib"))
        .status()
        .unwrap();
    assert!(copied.success());
    let url = format!(
        "https://{VERTEX}:{}/v1/projects/p/locations/us-central1/publishers/google/models/gemini-test:generateContent",
        vertex.addr.port()
    );
    let client = format!(
        r#"
import json, os
import google.auth
from google.auth.transport.requests import AuthorizedSession
creds, _ = google.auth.default(scopes=["https://www.googleapis.com/auth/cloud-platform"])
r = AuthorizedSession(creds).post({url:?}, json={{}}, timeout=30)
print(json.dumps({{"status": r.status_code, "body": r.json(), "adc": os.environ["GOOGLE_APPLICATION_CREDENTIALS"], "token": os.environ["GOOGLE_OAUTH_ACCESS_TOKEN"]}}))
"#
    );
    std::fs::write(workspace.join("client.py"), client).unwrap();
    let key_body: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
    let needle = &key_body[..48];
    let run = hermes(&[
        "exec",
        "--",
        "sh",
        "-c",
        "PYTHONPATH=/workspace/pylib python3 /workspace/client.py",
    ]);
    assert_eq!(run.code, 0, "{run:?}");
    let result: serde_json::Value =
        serde_json::from_str(run.stdout.lines().last().unwrap_or_default()).unwrap();
    assert_eq!(result["status"], 200, "{result}");
    assert_eq!(
        result["body"]["headers"]["authorization"],
        "Bearer ya29.e2e-minted-1"
    );
    assert_eq!(result["adc"], "/etc/hermes-egress/gcp-credentials.json");
    assert!(
        result["token"].as_str().unwrap().starts_with("gcp-"),
        "{result}"
    );
    assert_eq!(endpoint.minted.load(Ordering::SeqCst), 1);
    // Neither the key nor the key file's path is in the sandbox.
    let search = hermes(&[
        "exec",
        "--",
        "sh",
        "-c",
        &format!(
            "grep -rlsF -e {needle} -e {} / --exclude-dir=proc --exclude-dir=sys --exclude-dir=dev --exclude-dir=workspace; \
             cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n' | grep -cF -e {needle} -e {}; true",
            key_file.display(),
            key_file.display()
        ),
    ]);
    assert_eq!(search.stdout.trim(), "0", "{search:?}");
}

/// Without a service account, a request with the gcp token is refused
/// with a reason naming the variable; a key file that cannot be used
/// stops `egress start` with the reason, never quoting the key.
#[test]
fn a_missing_or_broken_service_account_is_a_clear_refusal_or_error() {
    let dir = tempfile::tempdir().unwrap();
    let vertex = Upstream::start("127.0.0.1:0".parse().unwrap(), &[VERTEX]);
    let roots = dir.path().join("upstream-ca.pem");
    std::fs::write(&roots, &vertex.ca_pem).unwrap();
    let mut proxy = Proxy::setup(&format!(
        "  upstream_deny_cidrs: [169.254.0.0/16, 10.0.0.0/8]\n  upstream_ca_file: {}\n  resolve:\n    {VERTEX}: 127.0.0.1\n",
        roots.display()
    ));
    let (key_file, pem, _) =
        service_account(dir.path(), "https://oauth2.hermes-test.example/token");
    let broken = std::fs::read_to_string(&key_file)
        .unwrap()
        .replace("service_account", "authorized_user");
    std::fs::write(&key_file, broken).unwrap();
    let run = proxy.start_run(&[("GOOGLE_APPLICATION_CREDENTIALS", key_file.to_str().unwrap())]);
    assert_ne!(run.code, 0, "{run:?}");
    assert!(
        run.stderr.contains("GOOGLE_APPLICATION_CREDENTIALS") && run.stderr.contains("`type`"),
        "{run:?}"
    );
    let key_body: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
    assert!(!run.stderr.contains(&key_body[..48]) && !run.stdout.contains(&key_body[..48]));
    let missing = proxy.start_run(&[("GOOGLE_APPLICATION_CREDENTIALS", "/nonexistent/sa.json")]);
    assert_ne!(missing.code, 0, "{missing:?}");
    assert!(
        missing.stderr.contains("/nonexistent/sa.json"),
        "{missing:?}"
    );
    proxy.start(&[]);
    let text = vertex_echo_from_the_host(&proxy, vertex.addr.port());
    assert!(text.ends_with("\n403"), "{text}");
    assert!(
        text.contains("no-key")
            && text.contains("no Google service account (GOOGLE_APPLICATION_CREDENTIALS)"),
        "{text}"
    );
    assert_eq!(vertex.accepted_before_a_probe(), 0);
}
