//! Google OAuth access tokens minted on the host. With a service-account
//! key file on the host (`GOOGLE_APPLICATION_CREDENTIALS`), a sandbox holds
//! only the `gcp` proxy token, which its Google client sends as its bearer
//! token (`GOOGLE_OAUTH_ACCESS_TOKEN` in the sandbox). For the allowlisted
//! Google hosts (Vertex AI by default, `proxy.google_oauth_hosts`) the
//! proxy checks that token (constant time) and puts a real access token in
//! its place: one it minted itself with the JWT bearer grant (RFC 7523,
//! RS256, signed with the service account's private key, exchanged at the
//! key file's `token_uri` through the proxy's own upstream client, so the
//! deny rules hold), cached and minted again before it expires, one
//! exchange at a time. The private key never leaves this process: no
//! sandbox, log line or error holds it.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use bytes::Bytes;
use http::header::{AUTHORIZATION, HeaderMap, HeaderValue};
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::rt::TokioIo;
use ring::rand::SystemRandom;
use ring::signature::{RSA_PKCS1_SHA256, RsaKeyPair};
use rustls_pki_types::PrivatePkcs8KeyDer;
use rustls_pki_types::pem::PemObject;
use serde::Deserialize;
use subtle::ConstantTimeEq;
use zeroize::Zeroizing;

use crate::policy::DenyList;
use crate::rewrite::Refusal;
use crate::target::{Target, parse_authority};
use crate::tokens::{Credentials, Secret};
use crate::upstream::UpstreamTls;

/// The provider name of Google OAuth (the token prefix, the log name).
pub const PROVIDER: &str = "gcp";
/// The host's variable naming the service-account key file (or, from a
/// credential source, holding its JSON).
pub const KEY_FILE_VARIABLE: &str = "GOOGLE_APPLICATION_CREDENTIALS";
/// The scope of the minted tokens.
pub const SCOPE: &str = "https://www.googleapis.com/auth/cloud-platform";
/// How long a minted token is asked to live (Google's maximum).
const LIFETIME: Duration = Duration::from_secs(3600);
/// A cached token is replaced this long before it expires.
const REFRESH_MARGIN: Duration = Duration::from_secs(300);
/// How long one exchange at the token endpoint may take.
const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(15);
/// The largest key file or token response read.
const MAX_BYTES: usize = 64 * 1024;
const GRANT_TYPE: &str = "urn:ietf:params:oauth:grant-type:jwt-bearer";

/// What went wrong with the key file or the token exchange. No variant
/// holds the private key, an assertion or an access token.
#[derive(Debug, thiserror::Error)]
pub enum GoogleError {
    #[error("the service-account key {origin}: {what}")]
    KeyFile { origin: String, what: String },
    #[error("the token endpoint {uri}: {what}")]
    Exchange { uri: String, what: String },
}

/// A service account's identity and private key.
pub struct ServiceAccount {
    email: String,
    token_uri: String,
    key_id: Option<String>,
    key: RsaKeyPair,
}

impl std::fmt::Debug for ServiceAccount {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceAccount")
            .field("email", &self.email)
            .field("token_uri", &self.token_uri)
            .finish_non_exhaustive()
    }
}

#[derive(Deserialize)]
struct KeyFile {
    #[serde(rename = "type")]
    kind: Option<String>,
    client_email: Option<String>,
    private_key: Option<String>,
    private_key_id: Option<String>,
    token_uri: Option<String>,
}

impl ServiceAccount {
    /// From the value of [`KEY_FILE_VARIABLE`]: a path to the key file,
    /// or the key file's JSON itself (as a credential source holds it).
    pub fn from_variable(value: &str) -> Result<ServiceAccount, GoogleError> {
        if value.trim_start().starts_with('{') {
            return ServiceAccount::from_json(value.as_bytes(), KEY_FILE_VARIABLE);
        }
        ServiceAccount::load(Path::new(value.trim()))
    }

    /// Reads a key file (at most 64 KiB).
    pub fn load(path: &Path) -> Result<ServiceAccount, GoogleError> {
        use std::io::Read;
        let origin = format!("file {}", path.display());
        let fail = |what: String| GoogleError::KeyFile {
            origin: origin.clone(),
            what,
        };
        let file = std::fs::File::open(path).map_err(|e| fail(e.to_string()))?;
        let mut bytes = Zeroizing::new(Vec::new());
        file.take(MAX_BYTES as u64 + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| fail(e.to_string()))?;
        if bytes.len() > MAX_BYTES {
            return Err(fail("larger than 64 KiB".into()));
        }
        ServiceAccount::from_json(&bytes, &origin)
    }

    /// From a key file's JSON; `origin` names it in errors.
    pub fn from_json(bytes: &[u8], origin: &str) -> Result<ServiceAccount, GoogleError> {
        let fail = |what: &str| GoogleError::KeyFile {
            origin: origin.to_string(),
            what: what.to_string(),
        };
        // Only where the error is: serde's message may quote a value.
        let file: KeyFile = serde_json::from_slice(bytes).map_err(|e| GoogleError::KeyFile {
            origin: origin.to_string(),
            what: format!(
                "not JSON of a key file (line {}, column {})",
                e.line(),
                e.column()
            ),
        })?;
        if file.kind.as_deref() != Some("service_account") {
            return Err(fail(
                "`type` is not `service_account` (only service-account keys can be minted for)",
            ));
        }
        let email = file
            .client_email
            .filter(|e| !e.is_empty())
            .ok_or_else(|| fail("`client_email` is missing"))?;
        let token_uri = file
            .token_uri
            .filter(|u| !u.is_empty())
            .ok_or_else(|| fail("`token_uri` is missing"))?;
        endpoint(&token_uri).map_err(|what| fail(&format!("`token_uri`: {what}")))?;
        let pem = Zeroizing::new(
            file.private_key
                .ok_or_else(|| fail("`private_key` is missing"))?,
        );
        let der = PrivatePkcs8KeyDer::from_pem_slice(pem.as_bytes())
            .map_err(|_| fail("`private_key` is not a PEM PKCS#8 private key"))?;
        let key = RsaKeyPair::from_pkcs8(der.secret_pkcs8_der())
            .map_err(|e| fail(&format!("`private_key` is not a usable RSA key ({e})")))?;
        Ok(ServiceAccount {
            email,
            token_uri,
            key_id: file.private_key_id.filter(|k| !k.is_empty()),
            key,
        })
    }

    pub fn email(&self) -> &str {
        &self.email
    }

    pub fn token_uri(&self) -> &str {
        &self.token_uri
    }

    /// The signed JWT of the bearer grant, issued at `now` (seconds since
    /// the epoch).
    pub fn assertion(&self, now: u64) -> Result<Zeroizing<String>, GoogleError> {
        let mut header = serde_json::json!({"alg": "RS256", "typ": "JWT"});
        if let Some(kid) = &self.key_id {
            header["kid"] = kid.clone().into();
        }
        let claims = serde_json::json!({
            "iss": self.email,
            "scope": SCOPE,
            "aud": self.token_uri,
            "iat": now,
            "exp": now + LIFETIME.as_secs(),
        });
        let signed = format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(header.to_string()),
            URL_SAFE_NO_PAD.encode(claims.to_string())
        );
        let mut signature = vec![0u8; self.key.public().modulus_len()];
        self.key
            .sign(
                &RSA_PKCS1_SHA256,
                &SystemRandom::new(),
                signed.as_bytes(),
                &mut signature,
            )
            .map_err(|_| GoogleError::KeyFile {
                origin: self.email.clone(),
                what: "signing the grant failed".into(),
            })?;
        Ok(Zeroizing::new(format!(
            "{signed}.{}",
            URL_SAFE_NO_PAD.encode(signature)
        )))
    }
}

/// The target and path of an `https://` token endpoint.
fn endpoint(uri: &str) -> Result<(Target, String), String> {
    let parsed: http::Uri = uri.parse().map_err(|_| "not a URL".to_string())?;
    if !parsed
        .scheme_str()
        .is_some_and(|s| s.eq_ignore_ascii_case("https"))
    {
        return Err("must be an https:// URL".into());
    }
    let authority = parsed.authority().ok_or("names no host")?;
    let target = parse_authority(authority.as_str(), Some(443)).map_err(|e| e.to_string())?;
    let path = parsed
        .path_and_query()
        .map_or_else(|| "/".to_string(), |pq| pq.as_str().to_string());
    Ok((target, path))
}

/// Posts a form to a token endpoint: the response body of a 2xx, else a
/// sentence saying what went wrong (never the request body).
#[async_trait::async_trait]
pub trait Exchange: Send + Sync {
    async fn post_form(&self, uri: &str, form: &str) -> Result<Bytes, String>;
}

/// The proxy's own upstream client: addresses checked against the deny
/// list, TLS verified against the proxy's roots.
#[derive(Debug)]
pub struct Upstream<'a> {
    pub tls: &'a UpstreamTls,
    pub deny: &'a DenyList,
    pub resolve: &'a BTreeMap<String, IpAddr>,
}

#[async_trait::async_trait]
impl Exchange for Upstream<'_> {
    async fn post_form(&self, uri: &str, form: &str) -> Result<Bytes, String> {
        let (target, path) = endpoint(uri)?;
        let addrs = crate::dial::resolve(&target, self.resolve, self.deny)
            .await
            .map_err(|e| e.to_string())?;
        let tls = self
            .tls
            .connect_stream(&target, &addrs, self.deny)
            .await
            .map_err(|e| e.to_string())?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .map_err(|e| e.to_string())?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        let request = Request::post(path)
            .header(http::header::HOST, target.to_string())
            .header(
                http::header::CONTENT_TYPE,
                "application/x-www-form-urlencoded",
            )
            .header(http::header::ACCEPT, "application/json")
            .body(Full::new(Bytes::copy_from_slice(form.as_bytes())))
            .map_err(|e| e.to_string())?;
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| e.to_string())?;
        let status = response.status();
        let body = Limited::new(response.into_body(), MAX_BYTES)
            .collect()
            .await
            .map_err(|e| format!("reading the response: {e}"))?
            .to_bytes();
        if !status.is_success() {
            return Err(format!("answered {status}{}", oauth_error(&body)));
        }
        Ok(body)
    }
}

/// `: <error>` from an OAuth error response (RFC 6749's `error` code, a
/// short word), or nothing.
fn oauth_error(body: &[u8]) -> String {
    #[derive(Deserialize)]
    struct Error {
        error: String,
    }
    serde_json::from_slice::<Error>(body)
        .ok()
        .filter(|e| {
            e.error.len() <= 64
                && e.error
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_')
        })
        .map(|e| format!(" ({})", e.error))
        .unwrap_or_default()
}

struct Cached {
    token: Secret,
    /// When it is to be replaced: [`REFRESH_MARGIN`] before it expires.
    replace_at: Instant,
}

/// The minted-token cache of one service account, behind its placeholder.
pub struct Minter {
    placeholder: String,
    account: ServiceAccount,
    /// Held across an exchange: concurrent requests wait for its token
    /// rather than each minting one.
    cache: tokio::sync::Mutex<Option<Cached>>,
}

impl std::fmt::Debug for Minter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Minter")
            .field("account", &self.account)
            .finish_non_exhaustive()
    }
}

#[derive(Deserialize)]
struct TokenResponse {
    access_token: String,
    expires_in: Option<u64>,
}

impl Minter {
    pub fn new(placeholder: &str, account: ServiceAccount) -> Minter {
        Minter {
            placeholder: placeholder.to_string(),
            account,
            cache: tokio::sync::Mutex::new(None),
        }
    }

    pub fn account(&self) -> &ServiceAccount {
        &self.account
    }

    /// A current access token: the cached one, or a new one minted now.
    pub async fn access_token(&self, exchange: &dyn Exchange) -> Result<Secret, GoogleError> {
        let mut cache = self.cache.lock().await;
        if let Some(cached) = cache.as_ref().filter(|c| Instant::now() < c.replace_at) {
            return Ok(cached.token.clone());
        }
        let fail = |what: String| GoogleError::Exchange {
            uri: self.account.token_uri.clone(),
            what,
        };
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_err(|_| fail("the clock is before 1970".into()))?
            .as_secs();
        let assertion = self.account.assertion(now)?;
        let form = Zeroizing::new(format!(
            "grant_type={}&assertion={}",
            form_encode(GRANT_TYPE),
            assertion.as_str()
        ));
        let asked = Instant::now();
        let body = tokio::time::timeout(
            EXCHANGE_TIMEOUT,
            exchange.post_form(&self.account.token_uri, &form),
        )
        .await
        .map_err(|_| fail(format!("no answer within {} s", EXCHANGE_TIMEOUT.as_secs())))?
        .map_err(fail)?;
        let response: TokenResponse = serde_json::from_slice(&body)
            .map_err(|_| fail("the answer holds no access_token".into()))?;
        let token = Secret::new(response.access_token);
        if token.expose().is_empty() || HeaderValue::from_str(token.expose()).is_err() {
            return Err(fail(
                "the access token cannot be carried in a header".into(),
            ));
        }
        // Never trusted for longer than asked for.
        let lifetime = Duration::from_secs(
            response
                .expires_in
                .unwrap_or(LIFETIME.as_secs())
                .min(LIFETIME.as_secs()),
        );
        // A token living less than twice the margin is used for half its life.
        let keep = lifetime
            .checked_sub(REFRESH_MARGIN)
            .filter(|k| *k >= REFRESH_MARGIN)
            .unwrap_or(lifetime / 2);
        *cache = Some(Cached {
            token: token.clone(),
            replace_at: asked + keep,
        });
        tracing::info!(account = %self.account.email, lifetime_s = lifetime.as_secs(), "minted a Google access token");
        Ok(token)
    }

    /// Checks that `headers` carry the placeholder as their one bearer
    /// token, and puts a minted access token in its place.
    pub async fn authorize(
        &self,
        headers: &mut HeaderMap,
        exchange: &dyn Exchange,
    ) -> Result<(), Denied> {
        let mut values = headers.get_all(AUTHORIZATION).iter();
        let value = values.next().ok_or(Denied::Refused(Refusal::NoToken))?;
        if values.next().is_some() {
            return Err(Denied::Refused(Refusal::Ambiguous));
        }
        let presented = bearer(value.as_bytes()).ok_or(Denied::Refused(Refusal::BadToken))?;
        if !bool::from(presented.ct_eq(self.placeholder.as_bytes())) {
            return Err(Denied::Refused(Refusal::BadToken));
        }
        let token = self.access_token(exchange).await.map_err(Denied::Mint)?;
        let mut value = HeaderValue::from_str(&format!("Bearer {}", token.expose()))
            .map_err(|_| Denied::Refused(Refusal::KeyUnusable))?;
        value.set_sensitive(true);
        headers.insert(AUTHORIZATION, value);
        Ok(())
    }

    /// [`Minter::authorize`] in the proxy's terms: the path and provider
    /// name, or the status, reason word and sentence of the refusal.
    pub async fn swap(
        &self,
        exchange: &dyn Exchange,
        headers: &mut HeaderMap,
        path: String,
        host: &crate::policy::Host,
    ) -> Result<(String, Option<String>), (StatusCode, &'static str, String)> {
        match self.authorize(headers, exchange).await {
            Ok(()) => Ok((path, Some(PROVIDER.to_string()))),
            Err(Denied::Mint(e)) => {
                tracing::warn!(error = %e, "minting a Google access token failed");
                Err((StatusCode::BAD_GATEWAY, "oauth-mint-failed", e.to_string()))
            }
            Err(Denied::Refused(r)) => Err((
                StatusCode::FORBIDDEN,
                r.reason(),
                format!(
                    "requests to {host} must carry the {PROVIDER} proxy token as their bearer token (GOOGLE_OAUTH_ACCESS_TOKEN)"
                ),
            )),
        }
    }
}

/// Why [`Minter::authorize`] did not authorize a request.
#[derive(Debug)]
pub enum Denied {
    Refused(Refusal),
    Mint(GoogleError),
}

/// The minter serving `host`, if its credential has one.
pub fn minter_for(credentials: &Credentials, host: &crate::policy::Host) -> Option<Arc<Minter>> {
    credentials.for_host(host).and_then(|c| c.oauth.clone())
}

fn bearer(value: &[u8]) -> Option<&[u8]> {
    let (scheme, rest) = value.split_at_checked(7)?;
    scheme
        .eq_ignore_ascii_case(b"bearer ")
        .then(|| rest.trim_ascii())
}

fn form_encode(text: &str) -> String {
    text.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

#[cfg(test)]
#[path = "google_tests.rs"]
mod tests;
