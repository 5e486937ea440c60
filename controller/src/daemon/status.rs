//! What a running controller tells `hermes status`: a small JSON file,
//! `run/controller.json`, rewritten atomically after every pass. The lock
//! (not this file) says whether a controller is running.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::home::Home;

/// The controller's state after its last pass.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ControllerStatus {
    pub pid: u32,
    /// Unix seconds.
    pub started_at: i64,
    pub passes: u64,
    pub last_pass_at: Option<i64>,
    pub last_pass_ms: Option<u64>,
    /// The last pass's errors (engine, operations), if any.
    pub last_error: Option<String>,
    /// Since when config.yaml cannot be used (the last good config stands).
    pub config_invalid_since: Option<i64>,
    pub config_error: Option<String>,
    /// Since when the engine does not answer.
    pub engine_unreachable_since: Option<i64>,
    /// `target: cause` of every blocked operation.
    pub blocked: Vec<String>,
    /// Operations carried out, by `verb/result` (`create/ok`, `remove/error`).
    pub operations: BTreeMap<String, u64>,
    /// reconcile.resync_seconds as the last pass read it.
    pub resync_seconds: Option<u64>,
}

pub fn path(home: &Home) -> PathBuf {
    run_dir(home).join("controller.json")
}

pub fn run_dir(home: &Home) -> PathBuf {
    home.root().join("run")
}

impl ControllerStatus {
    /// Writes the status atomically (0600 in the 0700 run directory).
    pub fn save(&self, path: &Path) -> std::io::Result<()> {
        let json = serde_json::to_vec_pretty(self).map_err(std::io::Error::other)?;
        crate::fsio::write_atomic(path, &json, 0o600, true)
    }

    /// The last saved status, if any.
    pub fn load(path: &Path) -> std::io::Result<Option<ControllerStatus>> {
        let Some(bytes) = crate::fsio::read_bounded(path, 1 << 20)? else {
            return Ok(None);
        };
        serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(std::io::Error::other)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn a_saved_status_reads_back_and_is_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("controller.json");
        assert_eq!(ControllerStatus::load(&path).unwrap(), None);
        let mut status = ControllerStatus {
            pid: 42,
            passes: 3,
            blocked: vec!["sandbox p/t: no".into()],
            ..ControllerStatus::default()
        };
        status.operations.insert("create/ok".into(), 1);
        status.save(&path).unwrap();
        assert_eq!(ControllerStatus::load(&path).unwrap(), Some(status));
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
    }
}
