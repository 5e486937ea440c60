#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use ring::signature::{KeyPair, RSA_PKCS1_2048_8192_SHA256, UnparsedPublicKey};

use super::*;

/// A fresh 2048-bit RSA key (PKCS#8 PEM) from the openssl command, and the
/// DER of its public half.
fn test_key() -> (String, Vec<u8>) {
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
    assert!(out.status.success());
    let pem = String::from_utf8(out.stdout).unwrap();
    let der = PrivatePkcs8KeyDer::from_pem_slice(pem.as_bytes()).unwrap();
    let public = RsaKeyPair::from_pkcs8(der.secret_pkcs8_der())
        .unwrap()
        .public_key()
        .as_ref()
        .to_vec();
    (pem, public)
}

const TOKEN_URI: &str = "https://oauth2.test/token";
const PLACEHOLDER: &str = "gcp-0123456789abcdef0123456789abcdef";

fn key_json(pem: &str) -> String {
    serde_json::json!({
        "type": "service_account",
        "project_id": "p",
        "private_key_id": "kid-1",
        "private_key": pem,
        "client_email": "sa@p.iam.gserviceaccount.com",
        "token_uri": TOKEN_URI,
    })
    .to_string()
}

/// Verifies a grant as Google's token endpoint would, and returns its
/// claims.
fn verify_grant(jwt: &str, public: &[u8]) -> Result<serde_json::Value, String> {
    let (signed, signature) = jwt.rsplit_once('.').ok_or("no signature")?;
    let signature = URL_SAFE_NO_PAD
        .decode(signature)
        .map_err(|e| e.to_string())?;
    UnparsedPublicKey::new(&RSA_PKCS1_2048_8192_SHA256, public)
        .verify(signed.as_bytes(), &signature)
        .map_err(|_| "bad signature".to_string())?;
    let (header, claims) = signed.split_once('.').ok_or("no claims")?;
    let header: serde_json::Value =
        serde_json::from_slice(&URL_SAFE_NO_PAD.decode(header).unwrap()).unwrap();
    if header["alg"] != "RS256" || header["kid"] != "kid-1" {
        return Err(format!("header {header}"));
    }
    Ok(serde_json::from_slice(&URL_SAFE_NO_PAD.decode(claims).unwrap()).unwrap())
}

/// The token endpoint: checks each grant's form and signature, answers a
/// numbered token living `expires_in` seconds, after `delay`.
struct FakeEndpoint {
    public: Vec<u8>,
    expires_in: u64,
    delay: Duration,
    calls: AtomicUsize,
    fail: bool,
    forms: Mutex<Vec<String>>,
}

impl FakeEndpoint {
    fn new(public: Vec<u8>, expires_in: u64) -> FakeEndpoint {
        FakeEndpoint {
            public,
            expires_in,
            delay: Duration::ZERO,
            calls: AtomicUsize::new(0),
            fail: false,
            forms: Mutex::new(Vec::new()),
        }
    }
}

#[async_trait::async_trait]
impl Exchange for FakeEndpoint {
    async fn post_form(&self, uri: &str, form: &str) -> Result<Bytes, String> {
        assert_eq!(uri, TOKEN_URI);
        let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        self.forms.lock().unwrap().push(form.to_string());
        tokio::time::sleep(self.delay).await;
        if self.fail {
            return Err("answered 400 Bad Request (invalid_grant)".into());
        }
        let assertion = form
            .strip_prefix(
                "grant_type=urn%3Aietf%3Aparams%3Aoauth%3Agrant-type%3Ajwt-bearer&assertion=",
            )
            .ok_or("not a JWT bearer grant")?;
        let claims = verify_grant(assertion, &self.public)?;
        assert_eq!(claims["iss"], "sa@p.iam.gserviceaccount.com");
        assert_eq!(claims["aud"], TOKEN_URI);
        assert_eq!(claims["scope"], SCOPE);
        assert_eq!(
            claims["exp"].as_u64().unwrap() - claims["iat"].as_u64().unwrap(),
            3600
        );
        let body = serde_json::json!({
            "access_token": format!("ya29.minted-{n}"),
            "expires_in": self.expires_in,
            "token_type": "Bearer",
        });
        Ok(Bytes::from(body.to_string()))
    }
}

fn headers_with(value: &str) -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert(AUTHORIZATION, HeaderValue::from_str(value).unwrap());
    headers
}

#[test]
fn the_grant_is_signed_by_the_service_account_and_names_it() {
    let (pem, public) = test_key();
    let account = ServiceAccount::from_json(key_json(&pem).as_bytes(), "test").unwrap();
    let jwt = account.assertion(1_700_000_000).unwrap();
    let claims = verify_grant(&jwt, &public).unwrap();
    assert_eq!(claims["iss"], "sa@p.iam.gserviceaccount.com");
    assert_eq!(claims["aud"], TOKEN_URI);
    assert_eq!(claims["iat"], 1_700_000_000);
    assert_eq!(claims["exp"], 1_700_003_600);
    // Another key's public half refuses it; so does a changed claim.
    let (_, other) = test_key();
    assert!(verify_grant(&jwt, &other).is_err());
    let mut parts: Vec<&str> = jwt.split('.').collect();
    let forged = URL_SAFE_NO_PAD.encode(r#"{"iss":"evil"}"#);
    parts[1] = &forged;
    assert!(verify_grant(&parts.join("."), &public).is_err());
    assert!(!format!("{account:?}").contains("PRIVATE"));
}

#[tokio::test]
async fn the_placeholder_becomes_a_minted_token_cached_until_near_its_expiry() {
    let (pem, public) = test_key();
    let account = ServiceAccount::from_json(key_json(&pem).as_bytes(), "test").unwrap();
    let minter = Minter::new(PLACEHOLDER, account);
    let endpoint = FakeEndpoint::new(public, 3600);
    for _ in 0..3 {
        let mut headers = headers_with(&format!("Bearer {PLACEHOLDER}"));
        minter.authorize(&mut headers, &endpoint).await.unwrap();
        assert_eq!(headers[AUTHORIZATION], "Bearer ya29.minted-1");
        assert!(headers[AUTHORIZATION].is_sensitive());
    }
    assert_eq!(endpoint.calls.load(Ordering::SeqCst), 1, "cached");
    // An answer claiming a lifetime beyond what was asked is capped.
    let (pem, public) = test_key();
    let account = ServiceAccount::from_json(key_json(&pem).as_bytes(), "test").unwrap();
    let minter = Minter::new(PLACEHOLDER, account);
    let endpoint = FakeEndpoint::new(public, u64::MAX);
    assert_eq!(
        minter.access_token(&endpoint).await.unwrap().expose(),
        "ya29.minted-1"
    );
    // A token living one second is used for half of it, then replaced.
    let (pem, public) = test_key();
    let account = ServiceAccount::from_json(key_json(&pem).as_bytes(), "test").unwrap();
    let minter = Minter::new(PLACEHOLDER, account);
    let endpoint = FakeEndpoint::new(public, 1);
    let first = minter.access_token(&endpoint).await.unwrap();
    assert_eq!(first.expose(), "ya29.minted-1");
    assert_eq!(
        minter.access_token(&endpoint).await.unwrap().expose(),
        "ya29.minted-1"
    );
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(
        minter.access_token(&endpoint).await.unwrap().expose(),
        "ya29.minted-2"
    );
    assert_eq!(endpoint.calls.load(Ordering::SeqCst), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_requests_share_one_exchange() {
    let (pem, public) = test_key();
    let account = ServiceAccount::from_json(key_json(&pem).as_bytes(), "test").unwrap();
    let minter = Arc::new(Minter::new(PLACEHOLDER, account));
    let mut endpoint = FakeEndpoint::new(public, 3600);
    endpoint.delay = Duration::from_millis(200);
    let endpoint = Arc::new(endpoint);
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let (minter, endpoint) = (minter.clone(), endpoint.clone());
        tasks.push(tokio::spawn(async move {
            minter.access_token(endpoint.as_ref()).await.unwrap()
        }));
    }
    for task in tasks {
        assert_eq!(task.await.unwrap().expose(), "ya29.minted-1");
    }
    assert_eq!(endpoint.calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_wrong_missing_or_doubled_placeholder_is_refused_without_minting() {
    let (pem, public) = test_key();
    let account = ServiceAccount::from_json(key_json(&pem).as_bytes(), "test").unwrap();
    let minter = Minter::new(PLACEHOLDER, account);
    let endpoint = FakeEndpoint::new(public, 3600);
    let wrong = "gcp-ffffffffffffffffffffffffffffffff";
    for (mut headers, want) in [
        (headers_with(&format!("Bearer {wrong}")), Refusal::BadToken),
        (headers_with(PLACEHOLDER), Refusal::BadToken),
        (HeaderMap::new(), Refusal::NoToken),
    ] {
        match minter.authorize(&mut headers, &endpoint).await {
            Err(Denied::Refused(r)) => assert_eq!(r, want),
            other => panic!("{other:?}"),
        }
    }
    let mut doubled = headers_with(&format!("Bearer {PLACEHOLDER}"));
    doubled.append(
        AUTHORIZATION,
        HeaderValue::from_str(&format!("Bearer {PLACEHOLDER}")).unwrap(),
    );
    assert!(matches!(
        minter.authorize(&mut doubled, &endpoint).await,
        Err(Denied::Refused(Refusal::Ambiguous))
    ));
    assert_eq!(endpoint.calls.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_failed_exchange_is_not_cached_and_its_error_holds_no_secret() {
    let (pem, public) = test_key();
    let account = ServiceAccount::from_json(key_json(&pem).as_bytes(), "test").unwrap();
    let minter = Minter::new(PLACEHOLDER, account);
    let mut endpoint = FakeEndpoint::new(public, 3600);
    endpoint.fail = true;
    for _ in 0..2 {
        let err = minter
            .access_token(&endpoint)
            .await
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(TOKEN_URI) && err.contains("invalid_grant"),
            "{err}"
        );
        let assertion = endpoint.forms.lock().unwrap()[0].clone();
        let assertion = assertion.rsplit('=').next().unwrap();
        assert!(!err.contains(assertion));
    }
    assert_eq!(endpoint.calls.load(Ordering::SeqCst), 2);
}

#[test]
fn a_bad_key_file_says_what_is_wrong_without_quoting_the_key() {
    let (pem, _) = test_key();
    let body = pem.lines().nth(3).unwrap().to_string();
    let broken = pem.replace(&body, "AAAA");
    for (json, want) in [
        (key_json(&broken), "`private_key`"),
        (
            key_json(&pem).replace("service_account", "authorized_user"),
            "`type`",
        ),
        (
            key_json(&pem).replace(TOKEN_URI, "http://oauth2.test/token"),
            "https://",
        ),
        (format!("{}x", key_json(&pem)), "not JSON"),
        (
            key_json(&pem).replace("\"client_email\":", "\"client_email\":[1],\"x\":"),
            "not JSON",
        ),
    ] {
        let err = ServiceAccount::from_json(json.as_bytes(), "file /k.json")
            .unwrap_err()
            .to_string();
        assert!(err.contains(want) && err.contains("/k.json"), "{err}");
        assert!(
            !err.contains(&body) && !err.contains("PRIVATE KEY"),
            "{err}"
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sa.json");
    std::fs::write(&path, key_json(&pem)).unwrap();
    let account = ServiceAccount::from_variable(path.to_str().unwrap()).unwrap();
    assert_eq!(account.email(), "sa@p.iam.gserviceaccount.com");
    let inline = ServiceAccount::from_variable(&key_json(&pem)).unwrap();
    assert_eq!(inline.token_uri(), TOKEN_URI);
}
