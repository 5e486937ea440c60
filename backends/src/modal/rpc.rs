//! One gRPC channel to Modal and the rules every call follows: the auth
//! and client metadata the official client sends, a deadline on every
//! call, and retries ([`crate::cloud::RETRY_ATTEMPTS`], spaced by
//! [`crate::cloud::retry_delay`]) on UNAVAILABLE, RESOURCE_EXHAUSTED and
//! DEADLINE_EXCEEDED for the calls that are safe to repeat.

use std::fmt;
use std::future::Future;
use std::sync::OnceLock;
use std::time::Duration;

use tonic::metadata::{AsciiMetadataValue, MetadataValue};
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};

use super::config::Settings;
use super::error::ModalError;
use super::pb::modal_client_client::ModalClientClient;
use crate::cloud::{RETRY_ATTEMPTS, retry_delay};

/// `x-modal-client-type`: `CLIENT_TYPE_CLIENT`, what the Python client
/// sends from a user's machine.
const CLIENT_TYPE: &str = "1";

/// `x-modal-client-version`: the client release the proto subset was
/// checked against; the service refuses clients it considers too old.
pub(crate) const CLIENT_VERSION: &str = "1.6.4";

/// The deadline of a plain request/response call.
pub(crate) const UNARY_DEADLINE: Duration = Duration::from_secs(30);

/// How long the service may hold a long poll (`timeout` in the request).
pub(crate) const POLL_SECS: f32 = 50.0;

/// The deadline of a long-poll call: the poll plus room for the network.
pub(crate) const POLL_DEADLINE: Duration = Duration::from_secs(60);

/// Whether a call may be sent again after a transient failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Retry {
    /// Repeating it does no harm (reads, get-or-create, terminate,
    /// indexed input).
    Yes,
    /// It must not run twice (starting a command).
    No,
}

/// The codes worth another try of an idempotent call.
pub(crate) fn retryable(code: tonic::Code) -> bool {
    matches!(
        code,
        tonic::Code::Unavailable | tonic::Code::ResourceExhausted | tonic::Code::DeadlineExceeded
    )
}

/// The channel and the metadata every request carries.
pub(crate) struct Rpc {
    endpoint: Endpoint,
    channel: OnceLock<Channel>,
    token_id: AsciiMetadataValue,
    token_secret: AsciiMetadataValue,
    pub(crate) server_url: String,
    pub(crate) environment: String,
}

impl fmt::Debug for Rpc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Rpc")
            .field("server_url", &self.server_url)
            .field("environment", &self.environment)
            .finish_non_exhaustive()
    }
}

impl Rpc {
    /// Prepares the endpoint; nothing connects until the first call.
    pub(crate) fn new(settings: Settings) -> Result<Rpc, ModalError> {
        let secret_value = |value: &str, what: &str| -> Result<AsciiMetadataValue, ModalError> {
            let mut v: AsciiMetadataValue = MetadataValue::try_from(value).map_err(|_| {
                ModalError::Config(format!("the {what} holds characters a header cannot carry"))
            })?;
            v.set_sensitive(true);
            Ok(v)
        };
        let token_id = secret_value(&settings.token_id, "token id")?;
        let token_secret = secret_value(&settings.token_secret, "token secret")?;
        let bad_url = |_| ModalError::Config(format!("server URL {:?}", settings.server_url));
        let mut endpoint = Endpoint::from_shared(settings.server_url.clone())
            .map_err(bad_url)?
            .connect_timeout(Duration::from_secs(10))
            .tcp_nodelay(true)
            .http2_keep_alive_interval(Duration::from_secs(30))
            .keep_alive_timeout(Duration::from_secs(20))
            .keep_alive_while_idle(true)
            .user_agent(format!("hermes/{}", env!("CARGO_PKG_VERSION")))
            .map_err(|_| ModalError::Config("user agent".to_string()))?;
        if settings.server_url.starts_with("https://") {
            endpoint = endpoint
                .tls_config(ClientTlsConfig::new().with_native_roots())
                .map_err(|e| ModalError::Config(format!("TLS: {e}")))?;
        }
        Ok(Rpc {
            endpoint,
            channel: OnceLock::new(),
            token_id,
            token_secret,
            server_url: settings.server_url,
            environment: settings.environment,
        })
    }

    /// A client on the shared channel (made on first use, inside the
    /// runtime, reconnecting on its own after a failure).
    pub(crate) fn client(&self) -> ModalClientClient<Channel> {
        let channel = self
            .channel
            .get_or_init(|| self.endpoint.connect_lazy())
            .clone();
        ModalClientClient::new(channel)
            .max_decoding_message_size(64 << 20)
            .max_encoding_message_size(16 << 20)
    }

    /// `msg` with the metadata and the deadline the service expects.
    pub(crate) fn request<T>(&self, msg: T, deadline: Duration) -> tonic::Request<T> {
        let mut req = tonic::Request::new(msg);
        req.set_timeout(deadline);
        let md = req.metadata_mut();
        md.insert(
            "x-modal-client-type",
            AsciiMetadataValue::from_static(CLIENT_TYPE),
        );
        md.insert(
            "x-modal-client-version",
            AsciiMetadataValue::from_static(CLIENT_VERSION),
        );
        md.insert("x-modal-token-id", self.token_id.clone());
        md.insert("x-modal-token-secret", self.token_secret.clone());
        req
    }

    /// Sends one call, `retry` permitting again after a transient failure,
    /// each attempt bounded by `deadline` on our side too.
    pub(crate) async fn call<Req, Resp, F, Fut>(
        &self,
        name: &'static str,
        retry: Retry,
        deadline: Duration,
        msg: Req,
        send: F,
    ) -> Result<Resp, ModalError>
    where
        Req: Clone,
        F: Fn(ModalClientClient<Channel>, tonic::Request<Req>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<Resp>, tonic::Status>>,
    {
        let mut attempt = 1;
        loop {
            let req = self.request(msg.clone(), deadline);
            let error = match tokio::time::timeout(deadline, send(self.client(), req)).await {
                Ok(Ok(resp)) => return Ok(resp.into_inner()),
                Ok(Err(status)) => {
                    if retry == Retry::No || !retryable(status.code()) {
                        return Err(ModalError::from_status(name, &status));
                    }
                    ModalError::from_status(name, &status)
                }
                Err(_) => {
                    let error = ModalError::Deadline {
                        call: name,
                        after: deadline,
                    };
                    if retry == Retry::No {
                        return Err(error);
                    }
                    error
                }
            };
            if attempt >= RETRY_ATTEMPTS {
                return Err(error);
            }
            let wait = retry_delay(attempt, None);
            tracing::debug!(call = name, attempt, ?wait, %error, "modal call failed; retrying");
            tokio::time::sleep(wait).await;
            attempt += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_transient_codes_are_retried() {
        for code in [
            tonic::Code::Unavailable,
            tonic::Code::ResourceExhausted,
            tonic::Code::DeadlineExceeded,
        ] {
            assert!(retryable(code), "{code:?}");
        }
        for code in [
            tonic::Code::Ok,
            tonic::Code::NotFound,
            tonic::Code::AlreadyExists,
            tonic::Code::Unauthenticated,
            tonic::Code::PermissionDenied,
            tonic::Code::InvalidArgument,
            tonic::Code::FailedPrecondition,
            tonic::Code::Internal,
        ] {
            assert!(!retryable(code), "{code:?}");
        }
    }
}
