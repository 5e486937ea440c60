//! The snapshot records of the cloud backends:
//! `$HERMES_HOME/<backend>_snapshots.json`, the reference's file, one JSON
//! object of task → snapshot id (`profile/task` for profiles other than
//! `default`; see [`hermes_model::cloud::snapshot_key`]), and beside it the
//! id of the sandbox hermes left running for the task, which is how
//! [`hermes_backends::cloud::CloudDriver::find`] finds a sandbox the service
//! cannot name (Vercel). Older files, snapshot ids only, read as they are.
//!
//! Written atomically (a temporary file in the home, renamed over the old
//! one), 0600 in a 0700 home. A file that cannot be read as records is
//! not fatal: it reads as no record, with a warning, and the first write
//! over it keeps the old bytes beside it (`…json.corrupt-<unix seconds>`)
//! rather than losing them. Reading never writes, so a dry run leaves the
//! file as it is.

use std::io;
use std::path::{Path, PathBuf};

use hermes_model::cloud::{self, Snapshots, TaskRecord};
use hermes_model::config::Backend;

use crate::fsio;

/// The largest records file read (a record is a few dozen bytes).
const MAX_BYTES: usize = 4 << 20;

/// One backend's records.
#[derive(Debug, Clone)]
pub struct SnapshotBook {
    path: PathBuf,
}

/// What reading the file found.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Read {
    Records(Snapshots),
    /// Present but not records: why.
    Corrupt(String),
}

impl SnapshotBook {
    pub fn new(home: &Path, backend: Backend) -> SnapshotBook {
        SnapshotBook {
            path: home.join(cloud::snapshots_file_name(backend)),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Every record; a corrupt file reads as none, with a warning.
    pub fn read(&self) -> io::Result<Snapshots> {
        Ok(match self.read_file()? {
            Read::Records(records) => records,
            Read::Corrupt(why) => {
                tracing::warn!(
                    path = %self.path.display(),
                    problem = %why,
                    "the snapshot records cannot be read; treated as none (the file is kept until the next write, which saves a copy)"
                );
                Snapshots::new()
            }
        })
    }

    /// What is recorded for a task of a profile (nothing: empty).
    pub fn entry(&self, profile: &str, task: &str) -> io::Result<TaskRecord> {
        Ok(self
            .read()?
            .remove(&cloud::snapshot_key(profile, task))
            .unwrap_or_default())
    }

    /// Drops the task's snapshot (one that failed to restore); no record
    /// is no change.
    pub fn forget(&self, profile: &str, task: &str) -> io::Result<()> {
        self.change(profile, task, |r| r.snapshot = None)
    }

    /// Records `id` as the sandbox serving the task (created or resumed,
    /// running).
    pub fn record_sandbox(&self, profile: &str, task: &str, id: &str) -> io::Result<()> {
        self.change(profile, task, |r| r.sandbox = Some(id.to_string()))
    }

    /// Drops the task's sandbox (destroyed, or no longer there).
    pub fn forget_sandbox(&self, profile: &str, task: &str) -> io::Result<()> {
        self.change(profile, task, |r| r.sandbox = None)
    }

    /// A session's end, in one write: the sandbox is no longer live, and
    /// `snapshot` is what the next one restores from (`None`: nothing, the
    /// stopped sandbox itself comes back, so an older snapshot is stale).
    pub fn suspended(&self, profile: &str, task: &str, snapshot: Option<&str>) -> io::Result<()> {
        self.change(profile, task, |r| {
            r.snapshot = snapshot.map(str::to_string);
            r.sandbox = None;
        })
    }

    fn change(
        &self,
        profile: &str,
        task: &str,
        edit: impl FnOnce(&mut TaskRecord),
    ) -> io::Result<()> {
        let key = cloud::snapshot_key(profile, task);
        self.update(|records| {
            let mut record = records.remove(&key).unwrap_or_default();
            edit(&mut record);
            if !record.is_empty() {
                records.insert(key, record);
            }
        })
    }

    fn update(&self, change: impl FnOnce(&mut Snapshots)) -> io::Result<()> {
        let mut corrupt = false;
        let mut records = match self.read_file()? {
            Read::Records(records) => records,
            Read::Corrupt(why) => {
                corrupt = true;
                let copy = self.keep_copy()?;
                tracing::warn!(
                    path = %self.path.display(),
                    copy = %copy.display(),
                    problem = %why,
                    "the snapshot records could not be read; a copy is kept and they start afresh"
                );
                Snapshots::new()
            }
        };
        let before = records.clone();
        change(&mut records);
        if records == before && !corrupt {
            return Ok(());
        }
        if let Some(dir) = self.path.parent() {
            fsio::ensure_dir(dir, 0o700)?;
        }
        fsio::write_atomic(
            &self.path,
            cloud::render_snapshots(&records).as_bytes(),
            0o600,
            true,
        )
    }

    fn read_file(&self) -> io::Result<Read> {
        let Some(bytes) = fsio::read_bounded(&self.path, MAX_BYTES)? else {
            return Ok(Read::Records(Snapshots::new()));
        };
        if bytes.len() > MAX_BYTES {
            return Ok(Read::Corrupt(format!("larger than {MAX_BYTES} bytes")));
        }
        let Ok(text) = String::from_utf8(bytes) else {
            return Ok(Read::Corrupt("not UTF-8 text".to_string()));
        };
        Ok(match cloud::parse_snapshots(&text) {
            Ok(records) => Read::Records(records),
            Err(e) => Read::Corrupt(e.to_string()),
        })
    }

    /// Copies the file beside itself before it is replaced.
    fn keep_copy(&self) -> io::Result<PathBuf> {
        let seconds = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let mut name = self.path.as_os_str().to_owned();
        name.push(format!(".corrupt-{seconds}"));
        let copy = PathBuf::from(name);
        let bytes = fsio::read_bounded(&self.path, MAX_BYTES)?.unwrap_or_default();
        fsio::write_atomic(&copy, &bytes, 0o600, true)?;
        Ok(copy)
    }
}

/// Shorthands the tests read and set records with.
#[cfg(test)]
impl SnapshotBook {
    /// The snapshot recorded for a task of a profile.
    pub fn get(&self, profile: &str, task: &str) -> io::Result<Option<String>> {
        Ok(self.entry(profile, task)?.snapshot)
    }

    /// The sandbox recorded as serving a task of a profile.
    pub fn sandbox(&self, profile: &str, task: &str) -> io::Result<Option<String>> {
        Ok(self.entry(profile, task)?.sandbox)
    }

    /// Records `id` as the task's snapshot (replacing an older one).
    pub fn record(&self, profile: &str, task: &str, id: &str) -> io::Result<()> {
        self.change(profile, task, |r| r.snapshot = Some(id.to_string()))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn records_are_kept_per_task_in_the_reference_format_0600_in_a_0700_home() {
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().join("home");
        let book = SnapshotBook::new(&home, Backend::Modal);
        assert_eq!(book.get("default", "default").unwrap(), None);
        book.record("default", "default", "im-1").unwrap();
        book.record("work", "default", "im-2").unwrap();
        book.record("default", "default", "im-3").unwrap();
        assert_eq!(book.path(), home.join("modal_snapshots.json"));
        assert_eq!(
            std::fs::read_to_string(book.path()).unwrap(),
            "{\n  \"default\": \"im-3\",\n  \"work/default\": \"im-2\"\n}\n"
        );
        assert_eq!(mode(book.path()), 0o600);
        assert_eq!(mode(&home), 0o700);
        assert_eq!(
            book.get("work", "default").unwrap().as_deref(),
            Some("im-2")
        );
        book.forget("default", "default").unwrap();
        assert_eq!(book.get("default", "default").unwrap(), None);
        assert_eq!(
            book.get("work", "default").unwrap().as_deref(),
            Some("im-2")
        );
        // No temporary file is left behind.
        let names: Vec<_> = std::fs::read_dir(&home).unwrap().collect();
        assert_eq!(names.len(), 1);
    }

    #[test]
    fn a_corrupt_file_reads_as_no_record_and_is_copied_before_it_is_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let book = SnapshotBook::new(dir.path(), Backend::Daytona);
        std::fs::write(book.path(), "{\"default\": ").unwrap();
        assert!(book.read().unwrap().is_empty());
        // Reading changes nothing.
        assert_eq!(
            std::fs::read_to_string(book.path()).unwrap(),
            "{\"default\": "
        );
        book.record("default", "t", "sb-1").unwrap();
        assert_eq!(book.get("default", "t").unwrap().as_deref(), Some("sb-1"));
        let copies: Vec<PathBuf> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.to_string_lossy().contains(".corrupt-"))
            .collect();
        assert_eq!(copies.len(), 1, "{copies:?}");
        assert_eq!(
            std::fs::read_to_string(&copies[0]).unwrap(),
            "{\"default\": "
        );
        assert_eq!(mode(&copies[0]), 0o600);
    }

    #[test]
    fn the_live_sandbox_is_kept_beside_the_snapshot_and_cleared_at_a_sessions_end() {
        let dir = tempfile::tempdir().unwrap();
        let book = SnapshotBook::new(dir.path(), Backend::VercelSandbox);
        // An older file: snapshot ids only.
        std::fs::write(book.path(), "{\"default\": \"snap_0\"}").unwrap();
        book.record_sandbox("default", "default", "sbx_1").unwrap();
        assert_eq!(
            book.entry("default", "default").unwrap(),
            TaskRecord {
                snapshot: Some("snap_0".into()),
                sandbox: Some("sbx_1".into())
            }
        );
        assert_eq!(mode(book.path()), 0o600);
        book.suspended("default", "default", Some("snap_2"))
            .unwrap();
        // Back to the reference's format.
        assert_eq!(
            std::fs::read_to_string(book.path()).unwrap(),
            "{\n  \"default\": \"snap_2\"\n}\n"
        );
        book.record_sandbox("default", "default", "sbx_3").unwrap();
        book.forget("default", "default").unwrap();
        assert_eq!(
            book.sandbox("default", "default").unwrap().as_deref(),
            Some("sbx_3")
        );
        book.forget_sandbox("default", "default").unwrap();
        assert_eq!(std::fs::read_to_string(book.path()).unwrap(), "{}\n");
    }

    #[test]
    fn forgetting_what_is_not_there_writes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let book = SnapshotBook::new(dir.path(), Backend::VercelSandbox);
        book.forget("default", "t").unwrap();
        book.forget_sandbox("default", "t").unwrap();
        assert!(!book.path().exists());
    }
}
