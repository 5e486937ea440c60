//! The egress proxy's data plane: the local CA (rcgen), proxy tokens and
//! their mapping to real keys, the policy (allowlist, deny ranges checked on
//! the dialled address), the TLS-intercepting forward proxy (hyper + rustls)
//! and credential rewriting. Real keys live only in this process's memory.
//!
//! - [`policy`]: hosts, IP literal spellings, the allowlist and deny ranges.

pub mod policy;
