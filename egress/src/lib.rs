//! The egress proxy's data plane: the local CA (rcgen), proxy tokens and
//! their mapping to real keys, the policy (allowlist, deny ranges checked on
//! the dialled address), the TLS-intercepting forward proxy (hyper + rustls)
//! and credential rewriting. Real keys live only in this process's memory.
//!
//! - [`policy`]: hosts, IP literal spellings, the allowlist and deny ranges.
//! - [`target`]: CONNECT targets, absolute URLs and Host headers.
//! - [`dial`]: resolution and connects that only reach checked addresses.
//! - [`dns`]: the name server of the proxy-only network (allowlist only).
//! - [`ca`]: the local CA and the leaves it mints, cached per name.
//! - [`tokens`]: providers, proxy tokens, mappings and the real keys.
//! - [`rewrite`]: the token-for-key swap in headers and query.
//! - [`sigv4`]: AWS SigV4 requests checked and signed again.
//! - [`signed_body`]: the bodies of signed AWS requests, read whole within
//!   a share per client, a total and a minimum rate.
//! - [`minting`]: the AWS requests never signed again: those that would
//!   hand out credentials.
//! - [`google`]: Google OAuth access tokens minted from a service account.
//! - [`settings`]: the proxy's config file and its run-time settings.
//! - [`server`]: the listeners, CONNECT, the tunnels, forwarding.
//! - [`upstream`]: verified TLS (h2 or HTTP/1.1) or plain connections out.
//! - [`pool`]: upstream connections reused across tunnels.
//! - [`body`]: streamed response bodies that write the access line.
//! - [`access`]: the JSON access log and the counters.
//! - [`logfile`]: `proxy.log`, rotated by size.
//! - [`limits`]: how many connections a client, and the whole data plane,
//!   may hold open.
//! - `mgmt`: the management endpoint.
//! - [`fuzz_targets`]: what the fuzzers (and their stable replay) drive.

pub mod access;
pub mod body;
pub mod ca;
pub mod dial;
pub mod dns;
#[doc(hidden)]
pub mod fuzz_targets;
pub mod google;
pub mod limits;
pub mod logfile;
mod mgmt;
pub mod minting;
pub mod policy;
pub mod pool;
pub mod rewrite;
pub mod rules;
pub mod server;
pub mod settings;
pub mod signed_body;
pub mod sigv4;
pub mod target;
#[cfg(test)]
mod test_upstream;
pub mod tokens;
pub mod upstream;
