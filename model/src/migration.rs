//! Moving a sandbox's data from the layout hermes used before it shared
//! Hermes Agent's (`<root>/sandboxes/docker/<profile>/<task>`) to the
//! shared one (`<sandbox_dir>/docker/<task>`).
//!
//! A move is renames only: the data is never copied, so it is never
//! copied twice and a move cut short leaves every file in one of the two
//! places, where the next pass finds it. A rename that would cross file
//! systems, or meet files already at the new place, is refused by the
//! code that carries the move out, and the sandbox is left as it was.
//!
//! Profile `default` of a home whose sandbox directory is the default one
//! is the one case where the two layouts nest: its old profile directory
//! `docker/default` is the new data directory of task `default`. Task
//! `default`'s `workspace` and `home` then move up one level, into it.

use std::path::{Path, PathBuf};

use crate::sandbox::{data_dir, legacy_data_dir, sanitize};

/// The moves that bring one task's data to the shared layout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataMove {
    pub task: String,
    /// The data directory of the earlier layout.
    pub from: PathBuf,
    /// The data directory of the shared layout.
    pub to: PathBuf,
    /// The renames, in order: a whole directory, or (where the layouts
    /// nest) its `workspace` and `home`.
    pub renames: Vec<(PathBuf, PathBuf)>,
    /// The task's disk image (`.<task>.disk` beside its data directory),
    /// moved with it when there is one: (from, to).
    pub image: (PathBuf, PathBuf),
    /// Left empty by the renames, removed last (where the layouts nest).
    pub emptied: Option<PathBuf>,
}

/// A task's data found in the earlier layout by a pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LegacyData {
    pub data: DataMove,
    /// Whether the shared layout's directory holds files already (then
    /// nothing is moved: the two are never merged).
    pub new_has_files: bool,
    /// Whether the task's disk image (`container_disk`) is in the earlier
    /// layout too.
    pub has_image: bool,
}

impl DataMove {
    /// The move of `task`'s data of `profile`, kept under `root` before,
    /// into `sandbox_dir`; none when the two places are one.
    pub fn of(root: &Path, sandbox_dir: &Path, profile: &str, task: &str) -> Option<DataMove> {
        let from = legacy_data_dir(root, profile, task);
        let to = data_dir(sandbox_dir, task);
        if from == to {
            return None;
        }
        let image_name = format!(".{}.disk", sanitize(task));
        let image = (
            from.parent()?.join(&image_name),
            to.parent()?.join(&image_name),
        );
        let (renames, emptied) = if from.starts_with(&to) {
            let renames = ["workspace", "home"]
                .iter()
                .map(|d| (from.join(d), to.join(d)))
                .collect();
            (renames, Some(from.clone()))
        } else {
            (vec![(from.clone(), to.clone())], None)
        };
        Some(DataMove {
            task: task.to_string(),
            from,
            to,
            renames,
            image,
            emptied,
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn a_task_s_directory_moves_whole_out_of_its_profile_s() {
        let m = DataMove::of(Path::new("/r"), Path::new("/r/sandboxes"), "ops", "t1").unwrap();
        assert_eq!(m.from, Path::new("/r/sandboxes/docker/ops/t1"));
        assert_eq!(m.to, Path::new("/r/sandboxes/docker/t1"));
        assert_eq!(m.renames, vec![(m.from.clone(), m.to.clone())]);
        assert_eq!(
            m.image,
            (
                PathBuf::from("/r/sandboxes/docker/ops/.t1.disk"),
                PathBuf::from("/r/sandboxes/docker/.t1.disk")
            )
        );
        assert_eq!(m.emptied, None);
    }

    #[test]
    fn where_the_layouts_nest_the_default_task_s_files_move_up_one_level() {
        let m = DataMove::of(
            Path::new("/r"),
            Path::new("/r/sandboxes"),
            "default",
            "default",
        )
        .unwrap();
        assert_eq!(m.from, Path::new("/r/sandboxes/docker/default/default"));
        assert_eq!(m.to, Path::new("/r/sandboxes/docker/default"));
        assert_eq!(
            m.renames,
            vec![
                (
                    PathBuf::from("/r/sandboxes/docker/default/default/workspace"),
                    PathBuf::from("/r/sandboxes/docker/default/workspace")
                ),
                (
                    PathBuf::from("/r/sandboxes/docker/default/default/home"),
                    PathBuf::from("/r/sandboxes/docker/default/home")
                ),
            ]
        );
        assert_eq!(m.emptied, Some(m.from.clone()));
        // Another task of profile default moves whole.
        let t = DataMove::of(Path::new("/r"), Path::new("/r/sandboxes"), "default", "t").unwrap();
        assert_eq!(t.renames, vec![(t.from.clone(), t.to.clone())]);
    }

    #[test]
    fn a_sandbox_directory_elsewhere_takes_the_data_there() {
        let m = DataMove::of(Path::new("/r"), Path::new("/data/sb"), "default", "default").unwrap();
        assert_eq!(m.to, Path::new("/data/sb/docker/default"));
        assert_eq!(m.renames, vec![(m.from.clone(), m.to.clone())]);
    }
}
