//! The egress proxy's data plane: the local CA (rcgen), proxy tokens and
//! their mapping to real keys, the policy (allowlist, deny ranges checked on
//! the dialled address), the TLS-intercepting forward proxy (hyper + rustls)
//! and credential rewriting. Real keys live only in this process's memory.
//!
//! - [`policy`]: hosts, IP literal spellings, the allowlist and deny ranges.
//! - [`ca`]: the local CA and the leaves it mints, cached per name.
//! - [`tokens`]: providers, proxy tokens, mappings and the real keys.
//! - [`target`]: CONNECT targets, absolute URLs and Host headers.
//! - [`rewrite`]: the token-for-key swap in headers and query.

pub mod ca;
pub mod policy;
pub mod rewrite;
pub mod target;
pub mod tokens;
