//! The HTTP plumbing the REST cloud drivers (Daytona, Vercel) share: the
//! base URL rule (https, or plain http to a loopback host only), one
//! rustls client with timeouts, the retry loop of [`crate::cloud`]'s rule,
//! and credentials that never print.

use std::fmt;
use std::net::IpAddr;
use std::time::Duration;

use reqwest::header::{HeaderMap, RETRY_AFTER};
use reqwest::{Client, RequestBuilder, Response, Url};

use crate::cloud::{RETRY_ATTEMPTS, retry_delay, retryable_status};

/// The bound on one ordinary request, connection to last byte.
pub(crate) const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// The bound on opening a connection (TCP and TLS).
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);

/// How much of an error answer is kept for the error message.
const ERROR_BODY_LIMIT: usize = 512;

/// A credential read from the environment. Its `Debug` shows no byte of
/// it; only [`Secret::bearer`] holds it, in a header.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Secret(String);

impl Secret {
    pub(crate) fn new(value: String) -> Secret {
        Secret(value)
    }

    /// `Authorization: Bearer <secret>`, marked sensitive so that no
    /// debug output of the request shows it.
    pub(crate) fn bearer(&self) -> reqwest::header::HeaderValue {
        let mut auth = reqwest::header::HeaderValue::from_str(&format!("Bearer {}", self.0))
            .unwrap_or_else(|_| reqwest::header::HeaderValue::from_static("Bearer invalid"));
        auth.set_sensitive(true);
        auth
    }

    /// `text` with every occurrence of the secret masked, for a service's
    /// answer that might echo it.
    pub(crate) fn scrub(&self, text: &str) -> String {
        if self.0.is_empty() {
            return text.to_owned();
        }
        text.replace(&self.0, "***")
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(***)")
    }
}

/// Why a base URL was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BaseUrlError {
    #[error("{url:?} is not a URL: {reason}")]
    Invalid { url: String, reason: String },
    #[error("{url:?}: only https is allowed (plain http only to a loopback host)")]
    Insecure { url: String },
}

/// Checks a service's base URL and returns it without a trailing slash:
/// https anywhere, http only to `localhost` or a loopback address (the
/// tests' fakes).
pub(crate) fn base_url(raw: &str) -> Result<String, BaseUrlError> {
    let url = Url::parse(raw.trim()).map_err(|e| BaseUrlError::Invalid {
        url: raw.to_owned(),
        reason: e.to_string(),
    })?;
    if url.query().is_some() || url.fragment().is_some() || !url.username().is_empty() {
        return Err(BaseUrlError::Invalid {
            url: raw.to_owned(),
            reason: "no query, fragment or user part allowed".to_owned(),
        });
    }
    match url.scheme() {
        "https" => {}
        "http" if is_loopback(&url) => {}
        "http" => {
            return Err(BaseUrlError::Insecure {
                url: raw.to_owned(),
            });
        }
        other => {
            return Err(BaseUrlError::Invalid {
                url: raw.to_owned(),
                reason: format!("unsupported scheme {other}"),
            });
        }
    }
    if url.host_str().is_none() {
        return Err(BaseUrlError::Invalid {
            url: raw.to_owned(),
            reason: "no host".to_owned(),
        });
    }
    Ok(url.as_str().trim_end_matches('/').to_owned())
}

fn is_loopback(url: &Url) -> bool {
    let Some(host) = url.host_str() else {
        return false;
    };
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    match bare.parse::<IpAddr>() {
        Ok(ip) => ip.is_loopback(),
        Err(_) => host.eq_ignore_ascii_case("localhost"),
    }
}

/// The HTTP client both drivers use: rustls with the system's roots,
/// HTTP/1.1 (the Daytona log follow upgrades the connection), bounded
/// connects, no redirects followed (a redirect would carry the bearer
/// token elsewhere).
pub(crate) fn client() -> Result<Client, reqwest::Error> {
    Client::builder()
        .use_rustls_tls()
        .https_only(false)
        .connect_timeout(CONNECT_TIMEOUT)
        .redirect(reqwest::redirect::Policy::none())
        .user_agent(concat!("hermes/", env!("CARGO_PKG_VERSION")))
        .build()
}

/// Whether a call may be sent again after a failure that may have reached
/// the service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Retry {
    /// Safe to repeat: every retryable status and every transport error.
    Idempotent,
    /// Not safe to repeat: only 429 (refused before any work) and a
    /// connection that never opened.
    Once,
}

impl Retry {
    fn status(self, status: u16) -> bool {
        match self {
            Retry::Idempotent => retryable_status(status),
            Retry::Once => status == 429,
        }
    }

    fn transport(self, error: &reqwest::Error) -> bool {
        match self {
            Retry::Idempotent => error.is_connect() || error.is_timeout() || error.is_request(),
            Retry::Once => error.is_connect(),
        }
    }
}

/// Sends the request `build` makes, again after a retryable failure, at
/// most [`RETRY_ATTEMPTS`] times in all, waiting [`retry_delay`] between
/// (the service's `Retry-After` when it gave one). The last answer is
/// returned whatever its status: the caller maps it.
pub(crate) async fn send(
    what: &str,
    retry: Retry,
    build: &(dyn Fn() -> RequestBuilder + Send + Sync),
) -> Result<Response, reqwest::Error> {
    let mut attempt = 1;
    loop {
        match build().send().await {
            Ok(response) => {
                let status = response.status().as_u16();
                if attempt < RETRY_ATTEMPTS && retry.status(status) {
                    let delay = retry_delay(attempt, retry_after(response.headers()));
                    tracing::debug!(call = what, status, attempt, ?delay, "retrying");
                    drop(response);
                    tokio::time::sleep(delay).await;
                    attempt += 1;
                    continue;
                }
                return Ok(response);
            }
            Err(error) => {
                if attempt < RETRY_ATTEMPTS && retry.transport(&error) {
                    let delay = retry_delay(attempt, None);
                    tracing::debug!(call = what, error = %error, attempt, ?delay, "retrying");
                    tokio::time::sleep(delay).await;
                    attempt += 1;
                    continue;
                }
                return Err(error);
            }
        }
    }
}

/// Why a JSON answer could not be read.
#[derive(Debug)]
pub(crate) enum BodyError {
    /// The body did not arrive whole.
    Transport(reqwest::Error),
    /// It arrived but is not the JSON expected.
    Json(serde_json::Error),
}

/// An answer's body, read whole and parsed as JSON.
pub(crate) async fn read_json<T: serde::de::DeserializeOwned>(
    response: Response,
) -> Result<T, BodyError> {
    let bytes = response.bytes().await.map_err(BodyError::Transport)?;
    serde_json::from_slice(&bytes).map_err(BodyError::Json)
}

/// An id as one path segment: anything but `[A-Za-z0-9_-]` percent-encoded
/// (dots too, so that `..` stays a name).
pub(crate) fn path_segment(id: &str) -> String {
    let mut out = String::with_capacity(id.len());
    for b in id.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// `Retry-After` in seconds (the HTTP-date form is not honoured: the
/// doubling delay applies).
pub(crate) fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let value = headers.get(RETRY_AFTER)?.to_str().ok()?.trim();
    let secs: f64 = value.parse().ok()?;
    (secs.is_finite() && secs >= 0.0).then(|| Duration::from_secs_f64(secs))
}

/// The start of an error answer's body, as text, with the credential
/// masked should the service echo it.
pub(crate) async fn error_text(response: Response, secret: &Secret) -> String {
    let bytes = response.bytes().await.unwrap_or_default();
    let cut = &bytes[..bytes.len().min(ERROR_BODY_LIMIT)];
    let text = String::from_utf8_lossy(cut);
    let text = secret.scrub(text.trim());
    if text.is_empty() {
        "(no details)".to_owned()
    } else {
        text
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn https_anywhere_http_only_to_loopback() {
        assert_eq!(
            base_url("https://app.daytona.io/api/").as_deref(),
            Ok("https://app.daytona.io/api")
        );
        assert!(base_url("http://127.0.0.1:8080").is_ok());
        assert!(base_url("http://[::1]:8080/x").is_ok());
        assert!(base_url("http://localhost:1").is_ok());
        assert_eq!(
            base_url("http://api.vercel.com"),
            Err(BaseUrlError::Insecure {
                url: "http://api.vercel.com".to_owned()
            })
        );
        assert!(base_url("http://127.0.0.1.example.com").is_err());
        assert!(base_url("ftp://x").is_err());
        assert!(base_url("not a url").is_err());
        assert!(base_url("https://user:pw@host").is_err());
    }

    #[test]
    fn secrets_never_print() {
        let s = Secret::new("sk-very-secret".to_owned());
        assert!(!format!("{s:?}").contains("very-secret"));
        assert_eq!(s.scrub("echo sk-very-secret!"), "echo ***!");
    }

    #[test]
    fn retry_after_in_seconds() {
        let mut h = HeaderMap::new();
        assert_eq!(retry_after(&h), None);
        h.insert(RETRY_AFTER, "2".parse().unwrap());
        assert_eq!(retry_after(&h), Some(Duration::from_secs(2)));
        h.insert(
            RETRY_AFTER,
            "Wed, 21 Oct 2015 07:28:00 GMT".parse().unwrap(),
        );
        assert_eq!(retry_after(&h), None);
    }

    #[test]
    fn which_failures_are_retried() {
        assert!(Retry::Idempotent.status(503));
        assert!(Retry::Idempotent.status(429));
        assert!(!Retry::Idempotent.status(400));
        assert!(Retry::Once.status(429));
        assert!(!Retry::Once.status(503));
    }
}
