//! Host keys, trusted on first use, in an OpenSSH `known_hosts` file of
//! hermes's own (`$HERMES_HOME/known_hosts`), as OpenSSH's
//! `StrictHostKeyChecking=accept-new` does: a host never seen is recorded,
//! a host whose key matches is trusted, and a host that offers a key other
//! than the recorded one is refused with both fingerprints — never a
//! silent reconnect. The file is OpenSSH's format, so `ssh-keygen -R` and
//! `ssh -o UserKnownHostsFile=` work on it; it is written 0600.

use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use russh::keys::{HashAlg, PublicKey};

use super::error::SshError;

/// What `known_hosts` says about a server's key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The key is recorded for this host.
    Known,
    /// Nothing is recorded for this host.
    Unknown,
    /// Another key is recorded for this host, on `line` (from 1).
    Changed { line: usize, old: Box<PublicKey> },
}

/// The name `known_hosts` gives a host: `host` on port 22, `[host]:port`
/// elsewhere.
pub fn host_name(host: &str, port: u16) -> String {
    if port == 22 {
        host.to_string()
    } else {
        format!("[{host}]:{port}")
    }
}

/// The `SHA256:…` fingerprint OpenSSH prints for a key.
pub fn fingerprint(key: &PublicKey) -> String {
    key.fingerprint(HashAlg::Sha256).to_string()
}

/// Looks the host's key up. Plain and hashed (`|1|…`) entries are read.
/// A host with recorded keys none of which is this one has changed its
/// key, whatever the algorithms: hermes always negotiates the same way, so
/// a server that suddenly offers another kind of key is treated as a
/// changed one.
pub fn check(path: &Path, host: &str, port: u16, key: &PublicKey) -> Result<Verdict, SshError> {
    if !path.exists() {
        return Ok(Verdict::Unknown);
    }
    let recorded =
        russh::keys::known_hosts::known_host_keys_path(host, port, path).map_err(|e| {
            SshError::KnownHosts {
                path: path.to_path_buf(),
                reason: e.to_string(),
            }
        })?;
    if recorded.iter().any(|(_, k)| k.key_data() == key.key_data()) {
        return Ok(Verdict::Known);
    }
    Ok(match recorded.into_iter().next() {
        None => Verdict::Unknown,
        Some((line, old)) => Verdict::Changed {
            line,
            old: Box::new(old),
        },
    })
}

/// Records `key` for the host at the end of the file, creating it 0600
/// (its directory must exist).
pub fn learn(path: &Path, host: &str, port: u16, key: &PublicKey) -> Result<(), SshError> {
    let err = |reason: String| SshError::KnownHosts {
        path: path.to_path_buf(),
        reason,
    };
    let encoded = key
        .to_openssh()
        .map_err(|e| err(format!("cannot encode the host key: {e}")))?;
    // `to_openssh` ends with the comment, if any; keep algorithm and key.
    let mut fields = encoded.split_whitespace();
    let (Some(algorithm), Some(data)) = (fields.next(), fields.next()) else {
        return Err(err("the host key encodes to nothing".to_string()));
    };
    let line = format!("{} {algorithm} {data}\n", host_name(host, port));
    let mut file = OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| err(e.to_string()))?;
    // One write of one line: appends by two processes do not interleave.
    file.write_all(line.as_bytes())
        .and_then(|()| file.sync_all())
        .map_err(|e| err(e.to_string()))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    const A: &str =
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIO8sxPSNNX9L4BAioVGYrjFagifdNqLUStUBF7NanBa7";
    const B: &str =
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHNRnGphSWpQTxOg7jnuXUSHa4G8MNzBaTlf2WN1Mpt2";

    fn key(text: &str) -> PublicKey {
        PublicKey::from_openssh(text).unwrap()
    }

    #[test]
    fn a_new_host_is_learned_then_known_and_a_new_key_is_a_change() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("known_hosts");
        assert_eq!(check(&path, "h", 2222, &key(A)).unwrap(), Verdict::Unknown);
        learn(&path, "h", 2222, &key(A)).unwrap();
        learn(&path, "other", 22, &key(B)).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.starts_with("[h]:2222 ssh-ed25519 AAAA"), "{text}");
        assert!(text.contains("\nother ssh-ed25519 "), "{text}");
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);

        assert_eq!(check(&path, "h", 2222, &key(A)).unwrap(), Verdict::Known);
        // The same host on another port is another host.
        assert_eq!(check(&path, "h", 22, &key(A)).unwrap(), Verdict::Unknown);
        match check(&path, "h", 2222, &key(B)).unwrap() {
            Verdict::Changed { line, old } => {
                assert_eq!(line, 1);
                assert_eq!(fingerprint(&old), fingerprint(&key(A)));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn fingerprints_are_openssh_sha256() {
        let f = fingerprint(&key(A));
        assert!(f.starts_with("SHA256:"), "{f}");
        assert_eq!(f.len(), "SHA256:".len() + 43, "{f}");
    }
}
