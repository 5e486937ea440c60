//! The host side of sharing a host with Hermes Agent: finding a task's data
//! still in hermes's earlier layout and moving it ([`DataMove`]), and the
//! records of the agent's containers hermes adopted as they were.
//!
//! A move is renames only, each refused rather than done when it would
//! cross file systems, follow a symbolic link or meet files: the data is
//! in one place or the other at every step, never in both, never lost.
//! Records live in `$HERMES_HOME/run/adopted/<container id>` (the spec
//! hash), written by the adopt operation and read by every observation.

use std::io;
use std::path::{Path, PathBuf};

use hermes_model::desired::Desired;
use hermes_model::migration::{DataMove, LegacyData};
use hermes_model::observed::ObservedContainer;

use crate::home::Home;

/// Why a move of a task's data was not carried out.
#[derive(Debug, thiserror::Error)]
pub enum MoveError {
    #[error("{} holds files already: the two layouts are never merged", path.display())]
    Occupied { path: PathBuf },
    #[error("{} is a symbolic link: nothing is moved through one", path.display())]
    Link { path: PathBuf },
    #[error(
        "{} and {} are on different file systems: a move would be a copy; move it by hand",
        from.display(),
        to.display()
    )]
    CrossDevice { from: PathBuf, to: PathBuf },
    #[error("cannot move {} to {}: {source}", from.display(), to.display())]
    Rename {
        from: PathBuf,
        to: PathBuf,
        source: io::Error,
    },
    #[error("cannot unmount the disk image from {}: {why}", path.display())]
    Unmount { path: PathBuf, why: String },
}

/// The wanted persistent sandboxes' data found in the earlier layout.
pub fn observe_legacy(home: &Home, desired: &Desired) -> Vec<LegacyData> {
    let root = home.profiles_root();
    desired
        .sandboxes
        .iter()
        .filter(|s| s.key.session.is_none())
        .filter_map(|spec| legacy_of(&root, spec))
        .collect()
}

/// The legacy data of `spec`'s task under `root`, if there is any.
pub fn legacy_of(root: &Path, spec: &hermes_model::sandbox::SandboxSpec) -> Option<LegacyData> {
    let data = DataMove::of(root, &spec.sandbox_dir, &spec.key.profile, &spec.key.task)?;
    let is_dir = |p: &Path| std::fs::symlink_metadata(p).is_ok_and(|m| m.is_dir());
    let has_image = std::fs::symlink_metadata(&data.image.0).is_ok_and(|m| m.is_file());
    let has_data = data.renames.iter().any(|(from, _)| is_dir(from))
        && (is_dir(&data.from.join("workspace")) || is_dir(&data.from.join("home")));
    if !has_data && !has_image {
        return None;
    }
    let new_has_files = ["workspace", "home"]
        .iter()
        .any(|d| holds_files(&data.to.join(d)));
    Some(LegacyData {
        data,
        new_has_files,
        has_image,
    })
}

/// Whether `dir` has anything in it (a directory that is not there, or
/// is empty, has not).
fn holds_files(dir: &Path) -> bool {
    std::fs::read_dir(dir).is_ok_and(|mut d| d.next().is_some())
}

/// Carries out `m`, the old container stopped (or gone): the earlier
/// layout's disk image unmounted, the directories and the image renamed,
/// the emptied directory removed. Empty directories at the new place (a
/// create made them) give way; anything else there refuses the move.
pub fn move_data(m: &DataMove) -> Result<(), MoveError> {
    if crate::disk::is_mount_point(&m.from) {
        let out = std::process::Command::new("umount")
            .arg(&m.from)
            .output()
            .map_err(|e| MoveError::Unmount {
                path: m.from.clone(),
                why: e.to_string(),
            })?;
        if !out.status.success() {
            return Err(MoveError::Unmount {
                path: m.from.clone(),
                why: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            });
        }
    }
    for (from, to) in &m.renames {
        rename_into(from, to)?;
    }
    if std::fs::symlink_metadata(&m.image.0).is_ok() {
        rename_into(&m.image.0, &m.image.1)?;
    }
    if let Some(dir) = &m.emptied {
        // Left when something else is in it: nothing of the task's.
        if let Err(e) = std::fs::remove_dir(dir)
            && e.kind() != io::ErrorKind::NotFound
        {
            tracing::info!(dir = %dir.display(), error = %e, "the earlier layout's directory stays");
        }
    }
    Ok(())
}

/// Renames `from` to `to` when `from` is there: `to` may be missing or an
/// empty directory (or hold only empty `workspace` and `home`).
fn rename_into(from: &Path, to: &Path) -> Result<(), MoveError> {
    let Ok(meta) = std::fs::symlink_metadata(from) else {
        return Ok(());
    };
    if meta.file_type().is_symlink() {
        return Err(MoveError::Link {
            path: from.to_path_buf(),
        });
    }
    if let Ok(target) = std::fs::symlink_metadata(to) {
        if target.file_type().is_symlink() {
            return Err(MoveError::Link {
                path: to.to_path_buf(),
            });
        }
        if target.is_dir() {
            for sub in ["workspace", "home"] {
                let inner = to.join(sub);
                if std::fs::symlink_metadata(&inner).is_ok_and(|m| m.is_dir())
                    && !holds_files(&inner)
                {
                    let _ = std::fs::remove_dir(&inner);
                }
            }
            if holds_files(to) {
                return Err(MoveError::Occupied {
                    path: to.to_path_buf(),
                });
            }
            let _ = std::fs::remove_dir(to);
        } else {
            return Err(MoveError::Occupied {
                path: to.to_path_buf(),
            });
        }
    }
    if let Some(parent) = to.parent() {
        std::fs::create_dir_all(parent).map_err(|source| MoveError::Rename {
            from: from.to_path_buf(),
            to: to.to_path_buf(),
            source,
        })?;
    }
    std::fs::rename(from, to).map_err(|source| {
        if source.raw_os_error() == Some(nix::libc::EXDEV) {
            MoveError::CrossDevice {
                from: from.to_path_buf(),
                to: to.to_path_buf(),
            }
        } else {
            MoveError::Rename {
                from: from.to_path_buf(),
                to: to.to_path_buf(),
                source,
            }
        }
    })
}

/// The directory of the adoption records.
fn records_dir(home: &Path) -> PathBuf {
    home.join("run").join("adopted")
}

/// Records that hermes adopted container `id` as of spec hash `hash`.
pub fn record_adoption(home: &Path, id: &str, hash: &str) -> io::Result<()> {
    let dir = records_dir(home);
    crate::fsio::ensure_dir(&dir, 0o700)?;
    crate::fsio::write_atomic(&dir.join(id), hash.as_bytes(), 0o600, true)
}

/// Forgets the record of container `id`, if any.
pub fn forget_adoption(home: &Path, id: &str) {
    let _ = std::fs::remove_file(records_dir(home).join(id));
}

/// Fills in the adopted containers' recorded spec hashes. A record is
/// trusted only for a container without a spec hash label of its own.
pub fn read_adoptions(home: &Path, containers: &mut [ObservedContainer]) {
    let dir = records_dir(home);
    for c in containers.iter_mut() {
        if c.label(hermes_model::sandbox::LABEL_SPEC_HASH).is_some()
            || !c.id.chars().all(|ch| ch.is_ascii_hexdigit())
        {
            continue;
        }
        if let Ok(bytes) = crate::fsio::read_bounded(&dir.join(&c.id), 64)
            && let Some(bytes) = bytes
            && let Ok(hash) = String::from_utf8(bytes)
        {
            c.adopted_hash = Some(hash.trim().to_string());
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn plain(root: &Path, profile: &str, task: &str) -> DataMove {
        DataMove::of(root, &root.join("sandboxes"), profile, task).unwrap()
    }

    #[test]
    fn a_task_s_files_move_by_rename_and_a_second_move_finds_nothing_to_do() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let m = plain(root, "ops", "t1");
        std::fs::create_dir_all(m.from.join("workspace")).unwrap();
        std::fs::write(m.from.join("workspace/f"), "kept").unwrap();
        // What a create already made at the new place: empty, it gives way.
        std::fs::create_dir_all(m.to.join("workspace")).unwrap();
        move_data(&m).unwrap();
        assert_eq!(
            std::fs::read_to_string(m.to.join("workspace/f")).unwrap(),
            "kept"
        );
        assert!(!m.from.exists());
        move_data(&m).unwrap();
        assert_eq!(
            std::fs::read_to_string(m.to.join("workspace/f")).unwrap(),
            "kept"
        );
    }

    #[test]
    fn where_the_layouts_nest_the_default_task_moves_up_and_others_stay() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let m = plain(root, "default", "default");
        std::fs::create_dir_all(m.from.join("home")).unwrap();
        std::fs::write(m.from.join("home/.bashrc"), "x").unwrap();
        let other = root.join("sandboxes/docker/default/t2/workspace");
        std::fs::create_dir_all(&other).unwrap();
        move_data(&m).unwrap();
        assert_eq!(
            std::fs::read_to_string(m.to.join("home/.bashrc")).unwrap(),
            "x"
        );
        assert!(!m.from.exists());
        assert!(other.is_dir());
    }

    #[test]
    fn files_at_both_places_or_a_link_refuse_the_move_and_move_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let m = plain(root, "ops", "t1");
        std::fs::create_dir_all(m.from.join("workspace")).unwrap();
        std::fs::write(m.from.join("workspace/a"), "old").unwrap();
        std::fs::create_dir_all(m.to.join("workspace")).unwrap();
        std::fs::write(m.to.join("workspace/b"), "new").unwrap();
        assert!(matches!(move_data(&m), Err(MoveError::Occupied { .. })));
        assert_eq!(
            std::fs::read_to_string(m.from.join("workspace/a")).unwrap(),
            "old"
        );
        assert_eq!(
            std::fs::read_to_string(m.to.join("workspace/b")).unwrap(),
            "new"
        );

        let l = plain(root, "ops", "t2");
        std::fs::create_dir_all(l.from.parent().unwrap()).unwrap();
        std::os::unix::fs::symlink("/etc", &l.from).unwrap();
        assert!(matches!(move_data(&l), Err(MoveError::Link { .. })));
        assert!(
            std::fs::symlink_metadata(&l.from)
                .unwrap()
                .file_type()
                .is_symlink()
        );
    }

    #[test]
    fn an_adoption_record_gives_a_container_without_a_label_its_hash() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = ObservedContainer {
            id: "abc123".to_string(),
            name: "hermes-0a1b2c3d".to_string(),
            labels: Default::default(),
            state: hermes_model::observed::ContainerState::Running,
            created: 0,
            started_at: None,
            finished_at: None,
            processes: None,
            made_by_agent: None,
            adopted_hash: None,
        };
        record_adoption(dir.path(), "abc123", "0123456789ab").unwrap();
        let mut all = [c.clone()];
        read_adoptions(dir.path(), &mut all);
        assert_eq!(all[0].spec_hash(), Some("0123456789ab"));
        forget_adoption(dir.path(), "abc123");
        c.adopted_hash = None;
        let mut all = [c];
        read_adoptions(dir.path(), &mut all);
        assert_eq!(all[0].spec_hash(), None);
    }
}
