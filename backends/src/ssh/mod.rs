//! A remote host over SSH, through russh.
//!
//! - [`connection`]: one connection: host key checked against hermes's own
//!   OpenSSH-format `known_hosts` ([`known_hosts`], accept-new; a changed
//!   key is refused with both fingerprints), login with a key file or the
//!   agent's keys, commands on channels with live output and the remote
//!   process tree killed on timeout, remote port forwards.
//! - [`script`]: the remote bootstrap that gives a command its environment,
//!   directory and arguments without any of them on a command line.
//! - [`holder`]: the background holder that keeps one connection per
//!   host/user/port open for every hermes process and multiplexes their
//!   commands over it; [`client`]: the hermes side of it, which starts a
//!   holder when none answers; [`wire`]: their protocol.

mod client;
mod connection;
mod error;
mod holder;
pub mod known_hosts;
mod script;
mod wire;

use std::fmt;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

pub use client::{HolderClient, SpawnHolder, SshHost};
pub use connection::{ConnectOptions, Connection, Running};
pub use error::SshError;
pub use holder::{HolderOptions, serve};
pub use wire::Forward;

/// Where to log in.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Destination {
    pub host: String,
    pub port: u16,
    pub user: String,
}

impl fmt::Display for Destination {
    /// `user@host`, or `user@host:port` off port 22.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.port == 22 {
            write!(f, "{}@{}", self.user, self.host)
        } else {
            write!(f, "{}@{}:{}", self.user, self.host, self.port)
        }
    }
}

impl Destination {
    /// A short name for this destination's holder files, the same in every
    /// hermes process: 16 hex digits of a SHA-256 of user, host and port.
    pub fn holder_id(&self) -> String {
        let digest = Sha256::digest(format!("{}\0{}\0{}", self.user, self.host, self.port));
        digest.iter().take(8).map(|b| format!("{b:02x}")).collect()
    }
}

/// What the remote side of an exec needs besides the request.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteExec {
    /// The directory used (and made) when the request names none, relative
    /// to the remote home.
    pub default_cwd: String,
    /// Trust a host seen for the first time, if this exec is the one that
    /// connects.
    pub learn: bool,
    /// Remote port forwards the connection must have before the command
    /// runs.
    pub forwards: Vec<Forward>,
    /// Environment values that are paths relative to the remote home: the
    /// command gets them made absolute (`$HOME/…`).
    pub home_env: Vec<(String, String)>,
    /// Files written (atomically, when their content differs) before the
    /// command runs.
    pub files: Vec<RemoteFile>,
}

/// A text file on the remote host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteFile {
    /// Relative to the remote home; its directory is made if missing.
    pub path: String,
    pub content: String,
}

/// What to log in with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Identity {
    /// A private key file (OpenSSH or PEM; not passphrase-protected).
    KeyFile(PathBuf),
    /// The keys the agent at `SSH_AUTH_SOCK` offers.
    Agent,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn destinations_print_like_ssh_and_name_their_holder_stably() {
        let d = Destination {
            host: "h.example".into(),
            port: 22,
            user: "u".into(),
        };
        assert_eq!(d.to_string(), "u@h.example");
        let other = Destination {
            port: 2222,
            ..d.clone()
        };
        assert_eq!(other.to_string(), "u@h.example:2222");
        assert_eq!(d.holder_id().len(), 16);
        assert_eq!(d.holder_id(), d.clone().holder_id());
        assert_ne!(d.holder_id(), other.holder_id());
    }
}
