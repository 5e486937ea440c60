//! What can go wrong talking to Modal. No variant holds a credential: the
//! token id and secret live only in the driver's request metadata, which is
//! marked sensitive and never formatted.

use std::time::Duration;

/// An error of the Modal driver.
#[derive(Debug, thiserror::Error)]
pub enum ModalError {
    /// Neither the environment, `$HERMES_HOME/.env` nor `.modal.toml` gave
    /// both halves of a token.
    #[error(
        "Modal credentials missing: set MODAL_TOKEN_ID and MODAL_TOKEN_SECRET \
         (in the environment or $HERMES_HOME/.env), or `modal token set` them in ~/.modal.toml \
         (profile {profile:?})"
    )]
    MissingCredentials { profile: String },

    /// The settings cannot be used (a broken `.modal.toml`, a server URL
    /// that is not https, a token that is not a valid header value).
    #[error("Modal configuration: {0}")]
    Config(String),

    /// The service refused the token.
    #[error(
        "Modal {call}: the token was refused ({message}): check MODAL_TOKEN_ID and MODAL_TOKEN_SECRET (or ~/.modal.toml)"
    )]
    Unauthenticated { call: &'static str, message: String },

    /// A call failed with a gRPC status (after the retries it was worth).
    #[error("Modal {call}: {code:?}: {message}")]
    Rpc {
        call: &'static str,
        code: tonic::Code,
        message: String,
    },

    /// A call got no answer within its deadline (after the retries).
    #[error("Modal {call}: no answer within {after:?}")]
    Deadline { call: &'static str, after: Duration },

    /// The service answered, and said the operation failed.
    #[error("Modal {call} failed: {message}")]
    Failed { call: &'static str, message: String },

    /// The sandbox has ended: commands cannot run in it any more.
    #[error("Modal sandbox {id} is not running ({state})")]
    SandboxGone { id: String, state: String },

    /// A request hermes refuses to send (no command, a bad variable name).
    #[error("bad request: {0}")]
    BadRequest(String),

    /// Reading a file from the sandbox failed there.
    #[error("Modal {op} {path:?} in sandbox {id} failed (exit {exit_code}): {stderr}")]
    File {
        op: &'static str,
        id: String,
        path: String,
        exit_code: i64,
        stderr: String,
    },

    /// Our side of a command's input or output failed.
    #[error("exec I/O: {0}")]
    Io(#[from] std::io::Error),
}

impl ModalError {
    /// Whether the service said the thing does not exist.
    pub fn is_not_found(&self) -> bool {
        matches!(
            self,
            ModalError::Rpc {
                code: tonic::Code::NotFound,
                ..
            }
        )
    }

    pub(crate) fn from_status(call: &'static str, status: &tonic::Status) -> ModalError {
        if matches!(
            status.code(),
            tonic::Code::Unauthenticated | tonic::Code::PermissionDenied
        ) {
            return ModalError::Unauthenticated {
                call,
                message: status.message().to_string(),
            };
        }
        ModalError::Rpc {
            call,
            code: status.code(),
            message: status.message().to_string(),
        }
    }
}
