//! The operations the last `hermes reconcile` could not carry out, kept in
//! `state/failed-operations.json` (0600) so that `hermes status` can show
//! a failed create with its reason after the command that saw it has
//! ended. Each pass rewrites the file (a clean pass empties it); status
//! shows a failure only while the plan still wants its target changed.

use std::path::PathBuf;

use hermes_model::plan::Target;
use serde::{Deserialize, Serialize};

use crate::home::Home;

/// One operation that failed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Failed {
    /// The plan's target as it prints (`sandbox p/default`).
    pub target: String,
    pub error: String,
    /// Unix seconds.
    pub at: i64,
}

fn path(home: &Home) -> PathBuf {
    home.root().join("state").join("failed-operations.json")
}

/// Replaces the record with this pass's failures.
pub fn record<E: std::fmt::Display>(home: &Home, failures: &[(Target, E)], at: i64) {
    let list: Vec<Failed> = failures
        .iter()
        .map(|(target, error)| Failed {
            target: target.to_string(),
            error: error.to_string(),
            at,
        })
        .collect();
    let file = path(home);
    if list.is_empty() && !file.exists() {
        return;
    }
    let saved = serde_json::to_vec_pretty(&list)
        .map_err(std::io::Error::other)
        .and_then(|json| {
            file.parent()
                .map_or(Ok(()), |dir| crate::fsio::ensure_dir(dir, 0o700))
                .and_then(|()| crate::fsio::write_atomic(&file, &json, 0o600, true))
        });
    if let Err(e) = saved {
        tracing::warn!(path = %file.display(), error = %e, "cannot record the failed operations");
    }
}

/// The failures of the last pass; none when the record is missing or
/// unreadable.
pub fn read(home: &Home) -> Vec<Failed> {
    crate::fsio::read_bounded(&path(home), 1 << 20)
        .ok()
        .flatten()
        .and_then(|bytes| serde_json::from_slice(&bytes).ok())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn a_record_reads_back_is_private_and_a_clean_pass_empties_it() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let home = Home::resolve(Some(dir.path().to_path_buf())).unwrap();
        assert!(read(&home).is_empty());
        let target = Target::Proxy;
        record(&home, &[(target, "boom")], 7);
        assert_eq!(
            read(&home),
            vec![Failed {
                target: "proxy".into(),
                error: "boom".into(),
                at: 7
            }]
        );
        let mode = std::fs::metadata(path(&home)).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        record::<String>(&home, &[], 8);
        assert!(read(&home).is_empty());
    }
}
