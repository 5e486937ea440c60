//! What can go wrong on the SSH backend, each error naming the host it is
//! about. Errors travel from the holder to the hermes process that asked,
//! so every field is plain data (they serialize) and the causes are kept as
//! their messages.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// An error of the SSH backend. None of them carries a secret: keys are
/// named by path or fingerprint, environment values never appear.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum SshError {
    /// No TCP connection (refused, no route, name not found, timed out).
    #[error("cannot reach {dest}: {reason}")]
    Unreachable { dest: String, reason: String },

    /// The server's host key is not the one `known_hosts` holds for it.
    #[error(
        "the host key of {host} has changed: {known_hosts}:{line} holds {old}, the server now offers {new}. \
         Someone could be intercepting the connection, so hermes does not connect. \
         If the change is expected, remove the old key with \
         `ssh-keygen -R '{host}' -f {known_hosts}` and connect again to trust the new one"
    )]
    HostKeyChanged {
        /// The host as `known_hosts` names it (`host` or `[host]:port`).
        host: String,
        known_hosts: PathBuf,
        /// The line (from 1) of the recorded key.
        line: usize,
        /// `SHA256:…` fingerprints.
        old: String,
        new: String,
    },

    /// First contact, in a pass that must not trust a new key (a dry run).
    #[error("{host} is not in {known_hosts} yet; its key {fingerprint} is trusted on first use")]
    HostKeyUnknown {
        host: String,
        known_hosts: PathBuf,
        fingerprint: String,
    },

    /// `known_hosts` could not be read or written.
    #[error("{}: {reason}", path.display())]
    KnownHosts { path: PathBuf, reason: String },

    /// `terminal.ssh_key` could not be loaded.
    #[error("cannot use the key {}: {reason}", path.display())]
    Key { path: PathBuf, reason: String },

    /// Neither `terminal.ssh_key` nor an agent (`SSH_AUTH_SOCK`) to log in with.
    #[error(
        "no key to log in to {dest} with: set terminal.ssh_key to a private key file, or run an ssh-agent (SSH_AUTH_SOCK)"
    )]
    NoIdentity { dest: String },

    /// The agent could not be asked.
    #[error("the ssh-agent at SSH_AUTH_SOCK: {reason}")]
    Agent { reason: String },

    /// The server refused every key offered.
    #[error("{dest} refused the login: {tried}")]
    AuthFailed { dest: String, tried: String },

    /// The SSH conversation failed (key exchange, a channel, the transport).
    #[error("ssh {dest}: {reason}")]
    Protocol { dest: String, reason: String },

    /// The connection dropped while a command ran: it may have run in part.
    #[error("the connection to {dest} was lost while the command ran: {reason}")]
    Lost { dest: String, reason: String },

    /// Writing the command's output here failed.
    #[error("writing the command's output: {reason}")]
    Output { reason: String },

    /// The connection holder could not be started or spoken to.
    #[error("the ssh connection holder ({}): {reason}", socket.display())]
    Holder { socket: PathBuf, reason: String },
}

impl SshError {
    /// Whether the error came before any command ran, from a connection
    /// that broke (so opening a new one and trying once more is safe).
    pub fn is_stale_connection(&self) -> bool {
        matches!(self, SshError::Protocol { .. })
    }
}
