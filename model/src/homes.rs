//! Which hermes home a container belongs to.
//!
//! Two homes on one host (two users, or tests) may use the same profile
//! name: labels alone (`hermes-profile`, `hermes-task-id`) cannot tell
//! their sandboxes apart. Every container and network hermes makes carries
//! [`LABEL_HOME`], a short hash of the home's canonical path ([`home_id`]);
//! a home sees and touches only what carries its own.
//!
//! A container made before the label existed has none: it is this home's
//! when one of its bind mounts comes from inside this home (every sandbox
//! hermes made binds its workspace, its runner's directory or the proxy's
//! CA from there), and it is adopted as it is: the label is not part of the
//! spec hash, so no recreate happens just for it, and the next recreate
//! adds it. Any other container without the label is foreign and left
//! alone.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// `hermes-home=<16 hex>`: the home a container or network belongs to.
pub const LABEL_HOME: &str = "hermes-home";

/// The home's identity: the first 16 hex digits of SHA-256 over its
/// canonical path (the caller resolves symlinks; this stays pure).
pub fn home_id(canonical_home: &Path) -> String {
    let digest = Sha256::digest(canonical_home.as_os_str().as_encoded_bytes());
    digest[..8].iter().map(|b| format!("{b:02x}")).collect()
}

/// One home, as observation needs it: its id, and the directories a bind
/// source of one of its unlabelled containers would start with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HomeScope {
    pub id: String,
    /// The home's path, canonical first, then as given when it differs.
    pub dirs: Vec<PathBuf>,
}

impl HomeScope {
    /// The scope of the home at `canonical` (symlinks resolved), also known
    /// as `given`.
    pub fn new(canonical: &Path, given: &Path) -> HomeScope {
        let mut dirs = vec![canonical.to_path_buf()];
        if given != canonical {
            dirs.push(given.to_path_buf());
        }
        HomeScope {
            id: home_id(canonical),
            dirs,
        }
    }

    /// Whether a container with these labels and bind sources is this
    /// home's; `Err` says whose it is instead.
    pub fn owns<'a>(
        &self,
        labels: &BTreeMap<String, String>,
        bind_sources: impl IntoIterator<Item = &'a str>,
    ) -> Result<(), String> {
        match labels.get(LABEL_HOME) {
            Some(id) if *id == self.id => Ok(()),
            Some(id) => Err(format!(
                "it belongs to another hermes home ({LABEL_HOME}={id}, this home is {})",
                self.id
            )),
            None => {
                let sources: Vec<&str> = bind_sources.into_iter().collect();
                let inside = |s: &&str| {
                    let s = Path::new(s);
                    s.is_absolute() && self.dirs.iter().any(|d| s.starts_with(d))
                };
                if sources.iter().any(inside) {
                    return Ok(());
                }
                Err(match sources.first() {
                    Some(first) => format!(
                        "it has no {LABEL_HOME} label and its bind mounts ({first}…) are not in this home ({})",
                        self.dirs[0].display()
                    ),
                    None => format!(
                        "it has no {LABEL_HOME} label and no bind mount in this home ({})",
                        self.dirs[0].display()
                    ),
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::desired::{Desired, HostEnv};

    fn labels(home: Option<&str>) -> BTreeMap<String, String> {
        let mut l = BTreeMap::from([("hermes-agent".to_string(), "1".to_string())]);
        if let Some(h) = home {
            l.insert(LABEL_HOME.to_string(), h.to_string());
        }
        l
    }

    #[test]
    fn the_id_is_16_hex_digits_of_the_path() {
        let a = home_id(Path::new("/home/a/.hermes"));
        assert_eq!(a.len(), 16);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, home_id(Path::new("/home/b/.hermes")));
        assert_eq!(a, home_id(Path::new("/home/a/.hermes")));
    }

    #[test]
    fn a_label_decides_and_binds_decide_without_one() {
        let scope = HomeScope::new(Path::new("/data/a"), Path::new("/home/a/.hermes"));
        let ours = scope.id.clone();
        assert_eq!(scope.owns(&labels(Some(&ours)), ["/elsewhere"]), Ok(()));
        let other = scope
            .owns(&labels(Some("0123456789abcdef")), ["/data/a/x"])
            .unwrap_err();
        assert!(other.contains("hermes-home=0123456789abcdef"), "{other}");
        // No label: the binds say, in either spelling of the home.
        let legacy = labels(None);
        assert_eq!(
            scope.owns(
                &legacy,
                ["/srv/x", "/data/a/sandboxes/docker/p/t/workspace"]
            ),
            Ok(())
        );
        assert_eq!(
            scope.owns(&legacy, ["/home/a/.hermes/run/sandboxes/n"]),
            Ok(())
        );
        assert!(scope.owns(&legacy, ["/data/ab/x"]).is_err());
        assert!(scope.owns(&legacy, ["/data"]).is_err());
        assert!(scope.owns(&legacy, ["named-volume"]).is_err());
        assert!(scope.owns(&legacy, []).is_err());
    }

    #[test]
    fn every_sandbox_carries_the_label_and_its_hash_does_not() {
        let config = crate::config::load("terminal:\n  backend: docker\n")
            .unwrap()
            .config;
        let mut d = Desired::build(config, "p", Path::new("/h"), &HostEnv::default()).unwrap();
        let before = d.sandboxes[0].hash().to_string();
        d.set_home_id("00112233aabbccdd".to_string());
        let warm = &d.sandboxes[0];
        assert_eq!(warm.labels[LABEL_HOME], "00112233aabbccdd");
        assert_eq!(warm.hash(), before);
        assert_eq!(warm.compute_hash(), before);
        let session = d.exec_sandbox("t", Some("s"));
        assert_eq!(session.labels[LABEL_HOME], "00112233aabbccdd");
    }
}
