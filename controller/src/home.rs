//! Where hermes keeps its files: `$HERMES_HOME` (default `~/.hermes`,
//! `--home DIR` overrides both).

use std::path::{Path, PathBuf};

use hermes_model::homes::HomeScope;

/// The hermes home directory (always an absolute path) and the paths
/// inside it.
#[derive(Debug, Clone)]
pub struct Home {
    root: PathBuf,
}

impl Home {
    /// `--home`, else `$HERMES_HOME`, else `~/.hermes`.
    pub fn resolve(flag: Option<PathBuf>) -> anyhow::Result<Home> {
        let root = match flag {
            Some(dir) => dir,
            None => match std::env::var_os("HERMES_HOME") {
                Some(dir) if !dir.is_empty() => PathBuf::from(dir),
                _ => match std::env::var_os("HOME") {
                    Some(home) if !home.is_empty() => PathBuf::from(home).join(".hermes"),
                    _ => anyhow::bail!(
                        "cannot find the hermes home: set HERMES_HOME or HOME, or pass --home DIR"
                    ),
                },
            },
        };
        // Bind mounts need absolute paths, and a daemon may change its
        // working directory: anchor a relative home once, here.
        let root = std::path::absolute(&root).map_err(|e| {
            anyhow::anyhow!(
                "cannot make the hermes home {} absolute: {e}",
                root.display()
            )
        })?;
        Ok(Home { root })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// This home's identity ([`hermes_model::homes`]): its path with
    /// symlinks resolved (those of the part that exists, for a home not
    /// made yet) hashed, and the directories its sandboxes bind from.
    pub fn scope(&self) -> HomeScope {
        HomeScope::new(&canonical(&self.root), &self.root)
    }

    pub fn config(&self) -> PathBuf {
        self.root.join("config.yaml")
    }

    pub fn env_file(&self) -> PathBuf {
        self.root.join(".env")
    }

    /// A warning when other users can enter the home (group or world
    /// bits on its directory): config.yaml may hold `docker_env` values,
    /// and the sandboxes' files live here. hermes makes the home 0700;
    /// one made otherwise is reported, never changed behind its owner.
    pub fn exposure_warning(&self) -> Option<String> {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&self.root).ok()?.permissions().mode() & 0o777;
        (mode & 0o077 != 0).then(|| {
            format!(
                "the hermes home {root} is open to other users (mode {mode:o}): they can read \
                 config.yaml and the sandboxes' files; run `chmod 700 {root}`",
                root = self.root.display()
            )
        })
    }
}

/// `path` with symlinks resolved: the longest part that exists,
/// canonicalized, with the rest appended, so that the answer is the same
/// before and after the home is made.
fn canonical(path: &Path) -> PathBuf {
    let mut rest = Vec::new();
    let mut base = path;
    loop {
        if let Ok(mut resolved) = std::fs::canonicalize(base) {
            resolved.extend(rest.iter().rev());
            return resolved;
        }
        match (base.parent(), base.file_name()) {
            (Some(parent), Some(name)) => {
                rest.push(name.to_os_string());
                base = parent;
            }
            _ => return path.to_path_buf(),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn a_home_open_to_others_is_reported() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let home = Home::resolve(Some(dir.path().to_path_buf())).unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        assert_eq!(home.exposure_warning(), None);
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let warning = home.exposure_warning().unwrap();
        assert!(warning.contains("mode 755"), "{warning}");
        assert!(warning.contains("chmod 700"), "{warning}");
    }

    #[test]
    fn a_relative_home_is_made_absolute() {
        let home = Home::resolve(Some(PathBuf::from("rel/home"))).unwrap();
        assert!(home.root().is_absolute(), "{}", home.root().display());
        assert!(home.root().ends_with("rel/home"));
    }

    #[test]
    fn the_scope_is_the_same_before_and_after_the_home_is_made() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("real");
        std::fs::create_dir(&real).unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        let home = Home::resolve(Some(link.join("hermes"))).unwrap();
        let before = home.scope();
        std::fs::create_dir(real.join("hermes")).unwrap();
        let after = home.scope();
        assert_eq!(before, after);
        assert!(after.dirs[0].starts_with(std::fs::canonicalize(&real).unwrap()));
        assert_eq!(after.dirs[1], home.root());
    }
}
