//! AWS Signature Version 4 re-signing. A sandbox holds a placeholder pair
//! (the `aws` proxy token as `AWS_ACCESS_KEY_ID`, the `aws-secret` one as
//! `AWS_SECRET_ACCESS_KEY`) and its SDK signs with it. For a host of the
//! SigV4 credential the proxy recomputes that signature with the
//! placeholder secret (the `aws-sigv4` crate, over the headers the client
//! signed and the payload hash recomputed over the body as received) and
//! compares it in constant time; then it signs the request again with the
//! real pair (and session token) at the same time, for the same region and
//! service, and sends it on. Nothing else in the request changes.
//!
//! Bodies: a signed payload is read whole to hash it, within the limits of
//! [`crate::signed_body`] (a share per client, a total, a minimum rate);
//! `UNSIGNED-PAYLOAD` streams through; chunk-signed bodies (`STREAMING-…`,
//! whose every chunk carries a signature chained to the placeholder's) and
//! presigned URLs are refused with a reason. A request that would hand out
//! credentials (STS, IAM, SSO, `GetSessionToken`, `AssumeRole…`,
//! `CreateAccessKey`, [`crate::minting`]) is refused before the real key
//! signs it.

use std::borrow::Cow;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use aws_sigv4::http_request::{
    PercentEncodingMode, SignableBody, SignableRequest, SigningSettings, UriPathNormalizationMode,
    sign,
};
use aws_smithy_runtime_api::client::identity::Identity;
use http::header::{AUTHORIZATION, HOST, HeaderMap, HeaderName, HeaderValue};
use http::{Request, StatusCode};
use hyper::body::Incoming;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::body::RequestBody;
use crate::policy::Host;
use crate::signed_body::Budget;
use crate::tokens::{Credential, SigV4Keys};

const ALGORITHM: &str = "AWS4-HMAC-SHA256";
const X_AMZ_DATE: &str = "x-amz-date";
/// How far a request's `x-amz-date` may be from the proxy's clock: AWS's
/// own window.
pub const MAX_SKEW: Duration = Duration::from_secs(15 * 60);
const X_AMZ_SECURITY_TOKEN: &str = "x-amz-security-token";
const X_AMZ_CONTENT_SHA256: &str = "x-amz-content-sha256";
const UNSIGNED_PAYLOAD: &str = "UNSIGNED-PAYLOAD";

/// Why a signed request is refused: the status, the reason word (the
/// refusal header and the access log), a sentence, and for some an error
/// body in AWS's own shape. No secret is ever part of it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{why}")]
pub struct Refusal {
    pub status: StatusCode,
    pub reason: &'static str,
    pub why: String,
    /// The body to answer with instead of the proxy's own JSON refusal.
    pub aws: Option<AwsError>,
}

/// An error body as an AWS service writes it, so that an SDK shows its
/// message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AwsError {
    pub content_type: &'static str,
    /// The `x-amzn-ErrorType` header, for the JSON protocols.
    pub error_type: Option<&'static str>,
    pub body: String,
}

pub(crate) fn refusal(status: StatusCode, reason: &'static str, why: impl Into<String>) -> Refusal {
    Refusal {
        status,
        reason,
        why: why.into(),
        aws: None,
    }
}

const SIGN_WITH: &str = "sign with the AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY the sandbox was given (the proxy's placeholders)";

/// The parts of an `Authorization: AWS4-HMAC-SHA256 …` header.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Authorization {
    key_id: String,
    date: String,
    region: String,
    service: String,
    signed_headers: Vec<String>,
    signature: String,
}

fn parse_authorization(value: &str) -> Result<Authorization, Refusal> {
    let malformed = |what: &str| {
        refusal(
            StatusCode::FORBIDDEN,
            "bad-signature",
            format!("the Authorization header is not an AWS SigV4 signature ({what}); {SIGN_WITH}"),
        )
    };
    let rest = value
        .strip_prefix(ALGORITHM)
        .filter(|r| r.starts_with(' '))
        .ok_or_else(|| malformed("it must start with AWS4-HMAC-SHA256"))?;
    let (mut credential, mut signed, mut signature) = (None, None, None);
    for part in rest.split(',') {
        let (name, v) = part
            .trim()
            .split_once('=')
            .ok_or_else(|| malformed("a part is not name=value"))?;
        let slot = match name {
            "Credential" => &mut credential,
            "SignedHeaders" => &mut signed,
            "Signature" => &mut signature,
            _ => return Err(malformed("an unknown part")),
        };
        if slot.replace(v.to_string()).is_some() {
            return Err(malformed("a part appears twice"));
        }
    }
    let (Some(credential), Some(signed), Some(signature)) = (credential, signed, signature) else {
        return Err(malformed(
            "Credential, SignedHeaders or Signature is missing",
        ));
    };
    let scope: Vec<&str> = credential.split('/').collect();
    let [key_id, date, region, service, "aws4_request"] = scope.as_slice() else {
        return Err(malformed(
            "the credential scope is not KEY/DATE/REGION/SERVICE/aws4_request",
        ));
    };
    let signed_headers: Vec<String> = signed.split(';').map(str::to_string).collect();
    if signed_headers.iter().any(String::is_empty) {
        return Err(malformed("an empty signed header name"));
    }
    Ok(Authorization {
        key_id: (*key_id).to_string(),
        date: (*date).to_string(),
        region: (*region).to_string(),
        service: (*service).to_string(),
        signed_headers,
        signature,
    })
}

/// `YYYYMMDDTHHMMSSZ` as a time.
fn parse_amz_date(text: &str) -> Option<SystemTime> {
    let b = text.as_bytes();
    if b.len() != 16 || b[8] != b'T' || b[15] != b'Z' {
        return None;
    }
    let num = |from: usize, to: usize| -> Option<u32> {
        let s = text.get(from..to)?;
        s.bytes()
            .all(|c| c.is_ascii_digit())
            .then(|| s.parse().ok())
            .flatten()
    };
    let year = i32::try_from(num(0, 4)?).ok()?;
    let month = time::Month::try_from(u8::try_from(num(4, 6)?).ok()?).ok()?;
    let day = u8::try_from(num(6, 8)?).ok()?;
    let (h, m, s) = (num(9, 11)?, num(11, 13)?, num(13, 15)?);
    let date = time::Date::from_calendar_date(year, month, day).ok()?;
    let clock = time::Time::from_hms(
        u8::try_from(h).ok()?,
        u8::try_from(m).ok()?,
        u8::try_from(s).ok()?,
    )
    .ok()?;
    Some(
        time::PrimitiveDateTime::new(date, clock)
            .assume_utc()
            .into(),
    )
}

/// The payload hash a request was signed over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Payload {
    /// The lowercase hex SHA-256 of the body.
    Hash(String),
    /// `UNSIGNED-PAYLOAD`.
    Unsigned,
}

impl Payload {
    fn signable(&self) -> SignableBody<'static> {
        match self {
            Payload::Hash(hex) => SignableBody::Precomputed(hex.clone()),
            Payload::Unsigned => SignableBody::UnsignedPayload,
        }
    }
}

/// How the body must be handled, from the `x-amz-content-sha256` header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BodyKind {
    /// Read whole and hashed; the header's value, when there is one, must
    /// be that hash.
    Signed(Option<String>),
    /// Streamed through.
    Unsigned,
}

/// What the `x-amz-content-sha256` header says of the body.
pub fn body_kind(headers: &HeaderMap) -> Result<BodyKind, Refusal> {
    let mut values = headers.get_all(X_AMZ_CONTENT_SHA256).iter();
    let Some(value) = values.next() else {
        return Ok(BodyKind::Signed(None));
    };
    if values.next().is_some() {
        return Err(refusal(
            StatusCode::FORBIDDEN,
            "ambiguous-credentials",
            "x-amz-content-sha256 appears more than once",
        ));
    }
    let text = value.to_str().unwrap_or_default();
    if text == UNSIGNED_PAYLOAD {
        Ok(BodyKind::Unsigned)
    } else if text.starts_with("STREAMING-") {
        Err(refusal(
            StatusCode::BAD_REQUEST,
            "sigv4-streaming-unsupported",
            format!(
                "chunk-signed bodies (x-amz-content-sha256: {text}) cannot be re-signed by the proxy: \
                 send the body in one piece (a signed payload hash or UNSIGNED-PAYLOAD)"
            ),
        ))
    } else if text.len() == 64 && text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        Ok(BodyKind::Signed(Some(text.to_string())))
    } else {
        Err(refusal(
            StatusCode::BAD_REQUEST,
            "bad-signature",
            "x-amz-content-sha256 is neither a SHA-256 in lowercase hex nor UNSIGNED-PAYLOAD",
        ))
    }
}

/// The payload of a body read whole: its hash, which must be the one the
/// client declared, if it declared one.
pub fn payload_of(body: &[u8], declared: Option<&str>) -> Result<Payload, Refusal> {
    let hash: String = Sha256::digest(body)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    if declared.is_some_and(|d| d != hash) {
        return Err(refusal(
            StatusCode::BAD_REQUEST,
            "payload-mismatch",
            "x-amz-content-sha256 is not the SHA-256 of the body received",
        ));
    }
    Ok(Payload::Hash(hash))
}

/// The one SigV4 `Authorization` of `headers`, made with `cred`'s
/// placeholder access key id (its signature not checked yet).
fn presented(cred: &Credential, headers: &HeaderMap) -> Result<Authorization, Refusal> {
    let mut auths = headers.get_all(AUTHORIZATION).iter();
    let Some(auth) = auths.next() else {
        return Err(refusal(
            StatusCode::FORBIDDEN,
            "no-token",
            format!("the request is not signed; {SIGN_WITH}"),
        ));
    };
    if auths.next().is_some() {
        return Err(refusal(
            StatusCode::FORBIDDEN,
            "ambiguous-credentials",
            "more than one Authorization header",
        ));
    }
    let auth = parse_authorization(auth.to_str().unwrap_or_default())?;
    if !bool::from(auth.key_id.as_bytes().ct_eq(cred.token.as_bytes())) {
        return Err(refusal(
            StatusCode::FORBIDDEN,
            "bad-token",
            format!("the request is signed with another access key id; {SIGN_WITH}"),
        ));
    }
    Ok(auth)
}

/// Checks that `headers` carry a signature made with `cred`'s placeholder
/// pair over this request (`method`, `path_and_query`, the headers it
/// names, `payload`), dated within [`MAX_SKEW`] of `now`, then replaces it
/// with one made with the real pair. On a refusal `headers` are unchanged.
pub fn verify_and_resign(
    cred: &Credential,
    method: &str,
    path_and_query: &str,
    headers: &mut HeaderMap,
    payload: &Payload,
    now: SystemTime,
) -> Result<(), Refusal> {
    let auth = presented(cred, headers)?;
    let Some(keys) = cred.sigv4.as_ref() else {
        return Err(refusal(
            StatusCode::FORBIDDEN,
            "no-key",
            "the proxy has no placeholder secret for aws: run `hermes egress setup`, then restart the proxy",
        ));
    };
    if auth
        .signed_headers
        .iter()
        .any(|h| h == X_AMZ_SECURITY_TOKEN || h == "authorization")
    {
        return Err(refusal(
            StatusCode::FORBIDDEN,
            "bad-token",
            "the request carries a session token the sandbox was never given; unset AWS_SESSION_TOKEN",
        ));
    }
    let date_text = headers
        .get(X_AMZ_DATE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let time = parse_amz_date(date_text)
        .filter(|_| date_text.starts_with(&auth.date))
        .ok_or_else(|| {
            refusal(
                StatusCode::FORBIDDEN,
                "bad-signature",
                "x-amz-date is missing, malformed, or not the day of the credential scope",
            )
        })?;
    // AWS refuses a request dated more than its window away from its
    // clock; the real key never signs one (a replay, a sandbox clock
    // gone wrong), and the client hears why.
    let skew = match now.duration_since(time) {
        Ok(ahead) => ahead,
        Err(behind) => behind.duration(),
    };
    if skew > MAX_SKEW {
        return Err(refusal(
            StatusCode::FORBIDDEN,
            "bad-signature",
            format!(
                "x-amz-date is {} s away from the proxy's clock; AWS allows {} s: check the sandbox's clock",
                skew.as_secs(),
                MAX_SKEW.as_secs()
            ),
        ));
    }
    // The headers the client signed, as received, less the ones the
    // signer makes itself.
    let mut signed: Vec<(String, String)> = Vec::new();
    for name in &auth.signed_headers {
        if name == X_AMZ_DATE {
            continue;
        }
        let mut found = false;
        for value in headers.get_all(name.as_str()) {
            let value = value.to_str().map_err(|_| {
                refusal(
                    StatusCode::FORBIDDEN,
                    "bad-signature",
                    format!("the signed header {name} is not text"),
                )
            })?;
            signed.push((name.clone(), value.to_string()));
            found = true;
        }
        if !found {
            return Err(refusal(
                StatusCode::FORBIDDEN,
                "bad-signature",
                format!("the signed header {name} is missing from the request"),
            ));
        }
    }
    let host = headers
        .get(HOST)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let uri = format!("https://{host}{path_and_query}");
    let placeholder = Identity::from(aws_credential_types::Credentials::new(
        cred.token.clone(),
        keys.placeholder_secret.expose(),
        None,
        None,
        "hermes-egress-placeholder",
    ));
    let (_, presented) = signature(&uri, method, &signed, payload, &placeholder, &auth, time)?;
    if !bool::from(presented.as_bytes().ct_eq(auth.signature.as_bytes())) {
        return Err(refusal(
            StatusCode::FORBIDDEN,
            "bad-signature",
            format!("the signature does not match the request; {SIGN_WITH}"),
        ));
    }
    // Whatever the caller checked: the real key never signs a request
    // that would hand out credentials.
    let named = crate::target::parse_authority(&host, Some(443)).ok();
    crate::minting::check_head(
        named.as_ref().map(|t| &t.host),
        &auth.service,
        path_and_query,
        headers,
    )?;
    let real = real_identity(cred, keys)?;
    let (instructions, _) = signature(&uri, method, &signed, payload, &real, &auth, time)?;
    headers.remove(AUTHORIZATION);
    headers.remove(X_AMZ_SECURITY_TOKEN);
    for (name, value) in instructions {
        let mut value = HeaderValue::from_str(&value).map_err(|_| {
            refusal(
                StatusCode::FORBIDDEN,
                "key-unusable",
                "the real AWS credentials cannot be carried in a header",
            )
        })?;
        let name = HeaderName::from_static(name);
        if name == AUTHORIZATION || name == X_AMZ_SECURITY_TOKEN {
            value.set_sensitive(true);
        }
        headers.insert(name, value);
    }
    Ok(())
}

/// The real pair (and session token) as a signing identity.
fn real_identity(cred: &Credential, keys: &SigV4Keys) -> Result<Identity, Refusal> {
    let (Some(key_id), Some(secret)) = (cred.key.as_ref(), keys.secret.as_ref()) else {
        return Err(refusal(
            StatusCode::FORBIDDEN,
            "no-key",
            "the host has no real AWS credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY \
             (and AWS_SESSION_TOKEN for temporary ones) in the environment of `hermes egress start` \
             or in the hermes home's .env, then restart the proxy",
        ));
    };
    Ok(Identity::from(aws_credential_types::Credentials::new(
        key_id.expose(),
        secret.expose(),
        keys.session_token.as_ref().map(|t| t.expose().to_string()),
        None,
        "hermes-egress",
    )))
}

/// Header names and values to set on a request.
type SigningHeaders = Vec<(&'static str, String)>;

/// The signing headers (`authorization`, `x-amz-date`, and
/// `x-amz-security-token` with a session token) and the signature of a
/// request, made by `aws-sigv4` with `identity` at `time` for the region
/// and service of `auth`'s scope.
fn signature(
    uri: &str,
    method: &str,
    headers: &[(String, String)],
    payload: &Payload,
    identity: &Identity,
    auth: &Authorization,
    time: SystemTime,
) -> Result<(SigningHeaders, String), Refusal> {
    let unsignable = |e: &dyn std::fmt::Display| {
        refusal(
            StatusCode::FORBIDDEN,
            "bad-signature",
            format!("the request cannot be signed: {e}"),
        )
    };
    let mut settings = SigningSettings::default();
    // Exactly the headers the client signed: none left out.
    settings.excluded_headers = Some(Vec::<Cow<'static, str>>::new());
    if auth.service == "s3" {
        settings.percent_encoding_mode = PercentEncodingMode::Single;
        settings.uri_path_normalization_mode = UriPathNormalizationMode::Disabled;
    }
    let params = aws_sigv4::sign::v4::SigningParams::builder()
        .identity(identity)
        .region(&auth.region)
        .name(&auth.service)
        .time(time)
        .settings(settings)
        .build()
        .map_err(|e| unsignable(&e))?
        .into();
    let request = SignableRequest::new(
        method,
        uri,
        headers.iter().map(|(k, v)| (k.as_str(), v.as_str())),
        payload.signable(),
    )
    .map_err(|e| unsignable(&e))?;
    let (instructions, signature) = sign(request, &params)
        .map_err(|e| unsignable(&e))?
        .into_parts();
    let (signing_headers, _) = instructions.into_parts();
    let headers = signing_headers
        .into_iter()
        .map(|h| (h.name(), h.value().to_string()))
        .collect();
    Ok((headers, signature))
}

/// Where a request to re-sign came from and what its body may hold: the
/// tunnel's host, the client's address, the signed bodies' budget.
#[derive(Debug, Clone, Copy)]
pub struct Origin<'a> {
    pub host: &'a Host,
    pub client: IpAddr,
    pub budget: &'a Arc<Budget>,
}

/// Checks and re-signs a request to a host of `cred` (a SigV4 credential):
/// its body is read whole when its payload hash is signed. Upgrades are
/// refused (an AWS API never asks for one), and so is a request that
/// would hand out credentials ([`crate::minting`]).
pub async fn resign(
    cred: &Credential,
    req: Request<Incoming>,
    upgrade: bool,
    origin: Origin<'_>,
) -> Result<Request<RequestBody>, Refusal> {
    if upgrade {
        return Err(refusal(
            StatusCode::BAD_REQUEST,
            "sigv4-upgrade-unsupported",
            "a signed AWS request cannot switch protocols through the proxy",
        ));
    }
    let path = req
        .uri()
        .path_and_query()
        .map_or("/", |pq| pq.as_str())
        .to_string();
    if path.contains("X-Amz-Signature=") || path.contains("X-Amz-Credential=") {
        return Err(refusal(
            StatusCode::BAD_REQUEST,
            "sigv4-presigned-unsupported",
            "presigned URLs cannot be re-signed by the proxy: sign the request in its headers",
        ));
    }
    let (mut parts, body) = req.into_parts();
    // Checked before the body is read: a request that cannot pass is not
    // waited for.
    let auth = presented(cred, &parts.headers)?;
    crate::minting::check_head(Some(origin.host), &auth.service, &path, &parts.headers)?;
    let kind = body_kind(&parts.headers)?;
    let (payload, body) = match kind {
        BodyKind::Unsigned => {
            crate::minting::check_unsigned(&auth.service, &parts.headers)?;
            (Payload::Unsigned, RequestBody::Stream(body))
        }
        BodyKind::Signed(declared) => {
            let (bytes, held) =
                crate::signed_body::read_whole(origin.budget, origin.client, &parts.headers, body)
                    .await?;
            crate::minting::check_body(&auth.service, &parts.headers, &bytes)?;
            (
                payload_of(&bytes, declared.as_deref())?,
                RequestBody::Full(Some(bytes), Some(held)),
            )
        }
    };
    verify_and_resign(
        cred,
        parts.method.as_str(),
        &path,
        &mut parts.headers,
        &payload,
        SystemTime::now(),
    )?;
    Ok(Request::from_parts(parts, body))
}

#[cfg(test)]
#[path = "sigv4_tests.rs"]
mod tests;
