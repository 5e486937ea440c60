//! When each sandbox was last used, recorded outside the container so that
//! it survives restarts of hermes and of the sandbox: one empty file per
//! container under `$HERMES_HOME/state/activity/`, whose modification time
//! is the moment an exec last started or finished. Touching it is a single
//! metadata update, cheap enough for every exec.

use std::collections::BTreeMap;
use std::fs::{self, OpenOptions};
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::time::SystemTime;

use crate::fsio::ensure_dir;
use crate::home::Home;

/// The activity records of one home.
#[derive(Debug, Clone)]
pub struct Activity {
    dir: PathBuf,
    home: PathBuf,
}

impl Activity {
    pub fn new(home: &Home) -> Activity {
        Activity {
            dir: home.root().join("state").join("activity"),
            home: home.root().to_path_buf(),
        }
    }

    /// Records that `container` is in use now.
    pub fn touch(&self, container: &str) -> io::Result<()> {
        self.record(container, SystemTime::now())
    }

    /// Records that `container` was in use at `at` (Unix seconds), unless
    /// its record is later already (the engine's events come late, and a
    /// replay brings old ones).
    pub fn touch_at(&self, container: &str, at: i64) -> io::Result<()> {
        let at = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(at.max(0).unsigned_abs());
        if let Ok(meta) = fs::symlink_metadata(self.dir.join(container))
            && meta.modified().is_ok_and(|m| m >= at)
        {
            return Ok(());
        }
        self.record(container, at)
    }

    fn record(&self, container: &str, at: SystemTime) -> io::Result<()> {
        if !is_plain_name(container) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("`{container}` is not a container name"),
            ));
        }
        ensure_dir(&self.dir, 0o700)?;
        let file = OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(false)
            .mode(0o600)
            // Never through a symlink planted in the directory.
            .custom_flags(nix::libc::O_NOFOLLOW)
            .open(self.dir.join(container))?;
        file.set_modified(at)
    }

    /// Unix seconds of the last recorded use of every container that has a
    /// record. A missing directory is no records.
    pub fn read_all(&self) -> io::Result<BTreeMap<String, i64>> {
        let entries = match fs::read_dir(&self.dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(BTreeMap::new()),
            Err(e) => return Err(e),
        };
        let mut records = BTreeMap::new();
        for entry in entries {
            let entry = entry?;
            let Ok(name) = entry.file_name().into_string() else {
                continue;
            };
            if !is_plain_name(&name) {
                continue;
            }
            let Ok(meta) = entry.metadata() else {
                continue; // removed in between
            };
            if let Ok(modified) = meta.modified() {
                records.insert(name, hermes_reconcilers::unix_seconds(modified));
            }
        }
        Ok(records)
    }

    /// Drops the record of a container that no longer exists, its
    /// runner's directory (`run/sandboxes/<name>`, which the container could
    /// write: removed without following any link in it) and its own
    /// `resolv.conf` (gVisor's, `run/resolv/<name>`).
    pub fn forget(&self, container: &str) -> io::Result<()> {
        if !is_plain_name(container) {
            return Ok(());
        }
        self.forget_run_state(container);
        self.forget_record(container)
    }

    /// Drops the activity record of `container` alone.
    pub fn forget_record(&self, container: &str) -> io::Result<()> {
        if !is_plain_name(container) {
            return Ok(());
        }
        match fs::remove_file(self.dir.join(container)) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }

    /// Drops what lives under `run/` by the name `container` was made
    /// with: its runner's directories, its `resolv.conf`, a warm-pool
    /// member's ready record. (A claimed pool member is named another way
    /// now; its activity record is by that name.)
    pub fn forget_run_state(&self, container: &str) {
        if !is_plain_name(container) {
            return;
        }
        crate::pool::forget(&self.home, container);
        let runner = hermes_model::sandbox::runner_dir(&self.home, container);
        let host_side = hermes_backends::docker::runner_host_dir(&runner);
        let resolv = hermes_model::sandbox::resolv_dir(&self.home, container);
        for dir in std::iter::once(runner)
            .chain(host_side)
            .chain(std::iter::once(resolv))
        {
            match fs::remove_dir_all(&dir) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => {
                    tracing::debug!(dir = %dir.display(), error = %e, "cannot remove a runner's directory");
                }
                _ => {}
            }
        }
    }
}

/// Container names as hermes makes them: `[A-Za-z0-9_.-]`, no dot first.
fn is_plain_name(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with('.')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn a_touch_is_read_back_and_forgotten() {
        let dir = tempfile::tempdir().unwrap();
        let home = Home::resolve(Some(dir.path().to_path_buf())).unwrap();
        let activity = Activity::new(&home);
        assert!(activity.read_all().unwrap().is_empty());
        let before = hermes_reconcilers::unix_seconds(SystemTime::now());
        activity.touch("hermes-default-default").unwrap();
        let records = activity.read_all().unwrap();
        let at = records["hermes-default-default"];
        assert!(at >= before && at <= before + 5, "{at} vs {before}");
        activity.forget("hermes-default-default").unwrap();
        activity.forget("hermes-default-default").unwrap();
        assert!(activity.read_all().unwrap().is_empty());
    }

    #[test]
    fn an_engine_s_event_moves_a_record_forward_never_back() {
        let dir = tempfile::tempdir().unwrap();
        let home = Home::resolve(Some(dir.path().to_path_buf())).unwrap();
        let activity = Activity::new(&home);
        activity.touch_at("hermes-1a2b3c4d", 1_000).unwrap();
        assert_eq!(activity.read_all().unwrap()["hermes-1a2b3c4d"], 1_000);
        activity.touch_at("hermes-1a2b3c4d", 2_000).unwrap();
        activity.touch_at("hermes-1a2b3c4d", 1_500).unwrap();
        assert_eq!(activity.read_all().unwrap()["hermes-1a2b3c4d"], 2_000);
        assert!(activity.touch_at("../escape", 3_000).is_err());
    }

    #[test]
    fn forgetting_a_container_removes_its_runner_directory_and_nothing_it_links_to() {
        let dir = tempfile::tempdir().unwrap();
        let home = Home::resolve(Some(dir.path().to_path_buf())).unwrap();
        let activity = Activity::new(&home);
        let runner = dir.path().join("run/sandboxes/hermes-p-t");
        std::fs::create_dir_all(runner.join("x.1.ab")).unwrap();
        let kept = dir.path().join("kept");
        std::fs::create_dir(&kept).unwrap();
        std::fs::write(kept.join("file"), "keep").unwrap();
        std::os::unix::fs::symlink(&kept, runner.join("link")).unwrap();
        std::os::unix::fs::symlink(&kept, runner.join("x.1.ab/link")).unwrap();
        let host_side = dir.path().join("run/runner-host/hermes-p-t");
        std::fs::create_dir_all(&host_side).unwrap();
        activity.forget("hermes-p-t").unwrap();
        assert!(!runner.exists());
        assert!(!host_side.exists());
        assert_eq!(std::fs::read_to_string(kept.join("file")).unwrap(), "keep");
        let other = dir.path().join("run/sandboxes/hermes-p-u");
        std::fs::create_dir_all(&other).unwrap();
        activity.forget("hermes-p-t").unwrap();
        assert!(other.exists());
    }

    #[test]
    fn names_that_could_escape_the_directory_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let home = Home::resolve(Some(dir.path().to_path_buf())).unwrap();
        let activity = Activity::new(&home);
        assert!(activity.touch("../escape").is_err());
        assert!(activity.touch(".hidden").is_err());
        assert!(!dir.path().join("state/escape").exists());
    }

    #[test]
    fn a_symlink_in_place_of_a_record_is_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let home = Home::resolve(Some(dir.path().to_path_buf())).unwrap();
        let activity = Activity::new(&home);
        activity.touch("a").unwrap();
        let target = dir.path().join("target");
        std::fs::write(&target, "keep").unwrap();
        let link = dir.path().join("state/activity/b");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        assert!(activity.touch("b").is_err());
    }
}
