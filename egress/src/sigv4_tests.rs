#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, SystemTime};

use aws_sigv4::http_request::{SignableBody, SignableRequest, SigningSettings, sign};
use aws_smithy_runtime_api::client::identity::Identity;
use http::header::{HeaderMap, HeaderValue};

use super::*;
use crate::tokens::{Place, Secret};

const HOST: &str = "bedrock-runtime.us-east-1.amazonaws.com";
const PATH: &str = "/model/anthropic.claude-3-haiku-20240307-v1%3A0/invoke";
const KEY_ID: &str = "aws-0123456789abcdef0123456789abcdef";
const PLACEHOLDER: &str = "aws-secret-fedcba9876543210fedcba9876543210";
const REAL_ID: &str = "AKIAREALREALREAL0001";
const REAL_SECRET: &str = "real/secret+KEY0000000000000000000000001";
const SESSION: &str = "FwoGZXIvYXdzEREAL-SESSION-TOKEN";
const BODY: &[u8] = br#"{"messages":[{"role":"user","content":"hi"}]}"#;

fn credential(session: Option<&str>, real: bool) -> Credential {
    Credential::new(
        "aws",
        KEY_ID,
        real.then(|| Secret::new(REAL_ID.to_string())),
        vec![Place::SigV4],
        &[HOST],
    )
    .with_sigv4(SigV4Keys {
        placeholder_secret: Secret::new(PLACEHOLDER.to_string()),
        secret: real.then(|| Secret::new(REAL_SECRET.to_string())),
        session_token: session.map(|s| Secret::new(s.to_string())),
    })
}

fn identity(id: &str, secret: &str, session: Option<&str>) -> Identity {
    Identity::from(aws_credential_types::Credentials::new(
        id,
        secret,
        session.map(str::to_string),
        None,
        "test",
    ))
}

fn time() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_764_600_000)
}

/// The headers of a request as an SDK sends it, signed by `aws-sigv4`
/// with `id`/`secret` over `body`.
fn signed_headers(
    id: &str,
    secret: &str,
    body: SignableBody<'_>,
    extra: &[(&str, &str)],
) -> HeaderMap {
    signed_for(HOST, "bedrock", PATH, id, secret, body, extra)
}

/// [`signed_headers`] for `service` at `host`, over `path`.
fn signed_for(
    host: &str,
    service: &str,
    path: &str,
    id: &str,
    secret: &str,
    body: SignableBody<'_>,
    extra: &[(&str, &str)],
) -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert("host", HeaderValue::from_str(host).unwrap());
    headers.insert("content-type", HeaderValue::from_static("application/json"));
    headers.insert("accept", HeaderValue::from_static("application/json"));
    for (k, v) in extra {
        headers.insert(
            HeaderName::from_bytes(k.as_bytes()).unwrap(),
            HeaderValue::from_str(v).unwrap(),
        );
    }
    let who = identity(id, secret, None);
    let params = aws_sigv4::sign::v4::SigningParams::builder()
        .identity(&who)
        .region("us-east-1")
        .name(service)
        .time(time())
        .settings(SigningSettings::default())
        .build()
        .unwrap()
        .into();
    let pairs: Vec<(String, String)> = headers
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_str().unwrap().to_string()))
        .collect();
    let request = SignableRequest::new(
        "POST",
        format!("https://{host}{path}"),
        pairs.iter().map(|(k, v)| (k.as_str(), v.as_str())),
        body,
    )
    .unwrap();
    let (instructions, _) = sign(request, &params).unwrap().into_parts();
    for (name, value) in instructions.headers() {
        headers.insert(
            HeaderName::from_bytes(name.as_bytes()).unwrap(),
            HeaderValue::from_str(value).unwrap(),
        );
    }
    headers
}

fn hash(body: &[u8]) -> Payload {
    payload_of(body, None).unwrap()
}

/// What the real AWS would compute: the signature of the request with the
/// real pair, over the headers `headers` says were signed.
fn real_signature(headers: &HeaderMap, payload: &Payload, session: Option<&str>) -> String {
    let auth = parse_authorization(headers["authorization"].to_str().unwrap()).unwrap();
    let signed: Vec<(String, String)> = auth
        .signed_headers
        .iter()
        .filter(|h| *h != "x-amz-date" && *h != "x-amz-security-token")
        .map(|h| (h.clone(), headers[h.as_str()].to_str().unwrap().to_string()))
        .collect();
    let time = parse_amz_date(headers["x-amz-date"].to_str().unwrap()).unwrap();
    let real = identity(REAL_ID, REAL_SECRET, session);
    signature(
        &format!("https://{HOST}{PATH}"),
        "POST",
        &signed,
        payload,
        &real,
        &auth,
        time,
    )
    .unwrap()
    .1
}

#[test]
fn a_placeholder_signature_is_checked_and_replaced_by_the_real_one() {
    let mut headers = signed_headers(KEY_ID, PLACEHOLDER, SignableBody::Bytes(BODY), &[]);
    let before = headers.clone();
    verify_and_resign(
        &credential(None, true),
        "POST",
        PATH,
        &mut headers,
        &hash(BODY),
        time(),
    )
    .unwrap();
    let auth = parse_authorization(headers["authorization"].to_str().unwrap()).unwrap();
    assert_eq!(auth.key_id, REAL_ID);
    assert_eq!(
        (auth.region.as_str(), auth.service.as_str()),
        ("us-east-1", "bedrock")
    );
    assert_eq!(auth.signature, real_signature(&headers, &hash(BODY), None));
    assert_ne!(headers["authorization"], before["authorization"]);
    // The time, the other headers and their signing stay.
    assert_eq!(headers["x-amz-date"], before["x-amz-date"]);
    assert_eq!(headers["content-type"], "application/json");
    let was = parse_authorization(before["authorization"].to_str().unwrap()).unwrap();
    assert_eq!(auth.signed_headers, was.signed_headers);
    assert!(headers.get("x-amz-security-token").is_none());
    assert!(headers["authorization"].is_sensitive());
    let all = format!("{headers:?}");
    assert!(!all.contains(REAL_SECRET) && !all.contains(PLACEHOLDER));
}

#[test]
fn a_wrong_secret_or_key_id_or_a_changed_request_is_refused_and_nothing_changes() {
    let cred = credential(None, true);
    let wrong_secret = "aws-secret-00000000000000000000000000000000";
    let mut headers = signed_headers(KEY_ID, wrong_secret, SignableBody::Bytes(BODY), &[]);
    let before = headers.clone();
    let r = verify_and_resign(&cred, "POST", PATH, &mut headers, &hash(BODY), time()).unwrap_err();
    assert_eq!(
        (r.status, r.reason),
        (StatusCode::FORBIDDEN, "bad-signature")
    );
    assert!(r.why.contains("signature does not match"), "{}", r.why);
    assert_eq!(headers, before);

    // The real pair itself is not the placeholder: a sandbox that somehow
    // holds it gets nothing from the proxy.
    let mut headers = signed_headers(REAL_ID, REAL_SECRET, SignableBody::Bytes(BODY), &[]);
    let r = verify_and_resign(&cred, "POST", PATH, &mut headers, &hash(BODY), time()).unwrap_err();
    assert_eq!(r.reason, "bad-token");
    assert!(!r.why.contains(REAL_ID) && !r.why.contains(REAL_SECRET));

    // Signed over one body, sent with another; signed for one path, sent
    // to another; a signed header changed on the way.
    let mut headers = signed_headers(KEY_ID, PLACEHOLDER, SignableBody::Bytes(BODY), &[]);
    let r = verify_and_resign(&cred, "POST", PATH, &mut headers, &hash(b"{}"), time()).unwrap_err();
    assert_eq!(r.reason, "bad-signature");
    let r = verify_and_resign(
        &cred,
        "POST",
        "/model/x/invoke",
        &mut headers,
        &hash(BODY),
        time(),
    )
    .unwrap_err();
    assert_eq!(r.reason, "bad-signature");
    headers.insert("content-type", HeaderValue::from_static("text/plain"));
    let r = verify_and_resign(&cred, "POST", PATH, &mut headers, &hash(BODY), time()).unwrap_err();
    assert_eq!(r.reason, "bad-signature");

    // Not signed at all.
    let mut bare = HeaderMap::new();
    bare.insert("host", HeaderValue::from_static(HOST));
    let r = verify_and_resign(&cred, "POST", PATH, &mut bare, &hash(BODY), time()).unwrap_err();
    assert_eq!(r.reason, "no-token");
}

#[test]
fn the_session_token_is_added_and_signed() {
    let mut headers = signed_headers(KEY_ID, PLACEHOLDER, SignableBody::Bytes(BODY), &[]);
    verify_and_resign(
        &credential(Some(SESSION), true),
        "POST",
        PATH,
        &mut headers,
        &hash(BODY),
        time(),
    )
    .unwrap();
    assert_eq!(headers["x-amz-security-token"], SESSION);
    assert!(headers["x-amz-security-token"].is_sensitive());
    let auth = parse_authorization(headers["authorization"].to_str().unwrap()).unwrap();
    assert!(
        auth.signed_headers
            .contains(&"x-amz-security-token".to_string())
    );
    assert_eq!(
        auth.signature,
        real_signature(&headers, &hash(BODY), Some(SESSION))
    );

    // A sandbox that sends a session token of its own is refused.
    let mut headers = signed_headers(
        KEY_ID,
        PLACEHOLDER,
        SignableBody::Bytes(BODY),
        &[("x-amz-security-token", "made-up")],
    );
    let r = verify_and_resign(
        &credential(None, true),
        "POST",
        PATH,
        &mut headers,
        &hash(BODY),
        time(),
    )
    .unwrap_err();
    assert_eq!(r.reason, "bad-token");
}

#[test]
fn an_unsigned_payload_is_resigned_unsigned() {
    let extra = [("x-amz-content-sha256", "UNSIGNED-PAYLOAD")];
    let mut headers = signed_headers(KEY_ID, PLACEHOLDER, SignableBody::UnsignedPayload, &extra);
    assert_eq!(body_kind(&headers).unwrap(), BodyKind::Unsigned);
    verify_and_resign(
        &credential(None, true),
        "POST",
        PATH,
        &mut headers,
        &Payload::Unsigned,
        time(),
    )
    .unwrap();
    assert_eq!(headers["x-amz-content-sha256"], "UNSIGNED-PAYLOAD");
    let auth = parse_authorization(headers["authorization"].to_str().unwrap()).unwrap();
    assert_eq!(
        auth.signature,
        real_signature(&headers, &Payload::Unsigned, None)
    );
}

#[test]
fn a_declared_payload_hash_must_be_the_bodys() {
    let Payload::Hash(good) = hash(BODY) else {
        unreachable!()
    };
    let mut headers = HeaderMap::new();
    headers.insert(
        "x-amz-content-sha256",
        HeaderValue::from_str(&good).unwrap(),
    );
    assert_eq!(
        body_kind(&headers).unwrap(),
        BodyKind::Signed(Some(good.clone()))
    );
    assert_eq!(payload_of(BODY, Some(&good)).unwrap(), Payload::Hash(good));
    let r = payload_of(b"other", Some(&"0".repeat(64))).unwrap_err();
    assert_eq!(
        (r.status, r.reason),
        (StatusCode::BAD_REQUEST, "payload-mismatch")
    );
    assert_eq!(
        body_kind(&HeaderMap::new()).unwrap(),
        BodyKind::Signed(None)
    );
}

#[test]
fn chunk_signed_bodies_are_refused_with_the_reason() {
    for kind in [
        "STREAMING-AWS4-HMAC-SHA256-PAYLOAD",
        "STREAMING-UNSIGNED-PAYLOAD-TRAILER",
    ] {
        let mut headers = HeaderMap::new();
        headers.insert("x-amz-content-sha256", HeaderValue::from_static(kind));
        let r = body_kind(&headers).unwrap_err();
        assert_eq!(
            (r.status, r.reason),
            (StatusCode::BAD_REQUEST, "sigv4-streaming-unsupported")
        );
        assert!(
            r.why.contains("chunk-signed") && r.why.contains(kind),
            "{}",
            r.why
        );
    }
}

#[test]
fn without_the_real_credentials_a_good_request_is_refused_no_key() {
    let mut headers = signed_headers(KEY_ID, PLACEHOLDER, SignableBody::Bytes(BODY), &[]);
    let before = headers.clone();
    let r = verify_and_resign(
        &credential(None, false),
        "POST",
        PATH,
        &mut headers,
        &hash(BODY),
        time(),
    )
    .unwrap_err();
    assert_eq!(r.reason, "no-key");
    assert!(r.why.contains("AWS_SECRET_ACCESS_KEY"), "{}", r.why);
    assert_eq!(headers, before);
}

#[test]
fn malformed_authorizations_are_refused() {
    for bad in [
        "Bearer x",
        "AWS4-HMAC-SHA256 Credential=a/b/c/d/aws4_request, SignedHeaders=host",
        "AWS4-HMAC-SHA256 Credential=a/b/c/aws4_request, SignedHeaders=host, Signature=00",
        "AWS4-HMAC-SHA256 Credential=a/b/c/d/aws4_request, SignedHeaders=host;;x, Signature=00",
        "AWS4-HMAC-SHA256 Credential=a/b/c/d/aws4_request, Credential=a/b/c/d/aws4_request, SignedHeaders=host, Signature=00",
    ] {
        assert_eq!(
            parse_authorization(bad).unwrap_err().reason,
            "bad-signature",
            "{bad}"
        );
    }
    assert_eq!(
        parse_amz_date("20251201T143000Z").map(|t| t > time() - Duration::from_secs(86400 * 365)),
        Some(true)
    );
    assert!(parse_amz_date("2025-12-01T14:30:00Z").is_none());
    assert!(parse_amz_date("20251341T143000Z").is_none());
}

#[test]
fn a_request_dated_outside_awss_window_is_refused_before_any_real_key_is_used() {
    let cred = credential(None, true);
    for (skew, passes) in [
        (14 * 60, true),
        (-14 * 60, true),
        (16 * 60, false),
        (-16 * 60, false),
    ] {
        let mut headers = signed_headers(KEY_ID, PLACEHOLDER, SignableBody::Bytes(BODY), &[]);
        let before = headers.clone();
        let now = if skew >= 0 {
            time() + Duration::from_secs(skew as u64)
        } else {
            time() - Duration::from_secs((-skew) as u64)
        };
        let r = verify_and_resign(&cred, "POST", PATH, &mut headers, &hash(BODY), now);
        match r {
            Ok(()) => assert!(passes, "{skew} s off passed"),
            Err(r) => {
                assert!(!passes, "{skew} s off refused: {r:?}");
                assert_eq!(r.reason, "bad-signature");
                assert!(r.why.contains("x-amz-date"), "{}", r.why);
                assert_eq!(headers, before);
            }
        }
    }
}

#[test]
fn a_placeholder_signed_request_for_a_credential_service_is_never_signed_with_the_real_key() {
    let cred = credential(Some(SESSION), true);
    let form = "Action=GetSessionToken&Version=2011-06-15";
    for (host, service, path) in [
        // STS by its host and its service name.
        ("sts.amazonaws.com", "sts", "/"),
        // Signed for STS, sent to the Bedrock host.
        (HOST, "sts", "/"),
        // Bedrock's host and name, STS's action in the query.
        (
            HOST,
            "bedrock",
            "/?Action=GetSessionToken&Version=2011-06-15",
        ),
    ] {
        let mut headers = signed_for(
            host,
            service,
            path,
            KEY_ID,
            PLACEHOLDER,
            SignableBody::Bytes(form.as_bytes()),
            &[("content-type", "application/x-www-form-urlencoded")],
        );
        let before = headers.clone();
        let r = verify_and_resign(
            &cred,
            "POST",
            path,
            &mut headers,
            &hash(form.as_bytes()),
            time(),
        )
        .unwrap_err();
        assert_eq!(r.status, StatusCode::FORBIDDEN, "{host} {service} {path}");
        assert_eq!(r.reason, "sigv4-credentials-refused");
        assert!(r.why.contains("hand out AWS credentials"), "{}", r.why);
        assert!(r.aws.is_some());
        assert_eq!(headers, before, "{host} {service} {path}");
        let all = format!("{r:?}");
        assert!(!all.contains(REAL_ID) && !all.contains(REAL_SECRET) && !all.contains(SESSION));
    }
}
