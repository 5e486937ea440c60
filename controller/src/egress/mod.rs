//! The egress credential proxy as this binary manages it: its files under
//! `$HERMES_HOME/proxy/`, its daemon, its health endpoint, its state file,
//! the proxy-only network, and what a pass makes of all of them. The
//! `hermes egress` commands ([`crate::commands::egress`]) only parse and
//! print; the proxy itself is the `hermes-egress` crate.
//!
//! - [`bitwarden`]: the real keys from Bitwarden Secrets Manager
//!   (`proxy.credential_source: bitwarden`), through `bws`.
//! - [`files`]: the proxy's files (`Paths`, the CA, tokens, mappings,
//!   `config.json`) and what `hermes egress setup` writes.
//! - [`state`]: `state.json`, the typed and versioned record of where the
//!   running daemon listens and which settings it loaded.
//! - [`daemon`]: the pid file, `start`, `stop`, `serve` and the token
//!   reload.
//! - [`health`]: the asynchronous probe of the management endpoint.
//! - [`network`]: the proxy-only network and its firewall
//!   (`proxy.enforce_network`), and the addresses the proxy listens on.
//! - [`pass`]: the desired egress and the observed daemon, as a pass
//!   plans with them.
//! - [`status`]: the `hermes egress status` report.

pub mod bitwarden;
pub mod cluster;
pub mod daemon;
pub mod files;
pub mod health;
pub mod network;
pub mod pass;
pub mod state;
pub mod status;
