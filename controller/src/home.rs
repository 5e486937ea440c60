//! Where hermes keeps its files: `$HERMES_HOME` (default `~/.hermes`,
//! `--home DIR` overrides both), switched to a profile's home by
//! `--profile NAME` as Hermes Agent's `-p NAME` switches it
//! ([`hermes_model::profiles`]).

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

    /// The home of profile `name` (`--profile`, `$HERMES_PROFILE`), or,
    /// with none given, of the root's `active_profile` unless this home
    /// names a profile itself: Hermes Agent's rule for `-p NAME`. A
    /// profile other than `default` must exist, as the agent requires.
    pub fn select_profile(self, name: Option<(&str, &str)>) -> anyhow::Result<Home> {
        use hermes_model::profiles;
        let given = match name {
            Some((name, origin)) => Some((name.to_string(), origin)),
            None if profiles::names_a_profile(&self.root) => None,
            None => {
                let root = profiles::root_of(&canonical(&self.root), &native_home());
                let file = root.join(profiles::ACTIVE_PROFILE_FILE);
                std::fs::read_to_string(&file)
                    .ok()
                    .map(|text| text.trim().to_string())
                    .filter(|n| !n.is_empty() && n != profiles::DEFAULT)
                    .map(|n| (n, "the active_profile file"))
            }
        };
        let Some((name, origin)) = given else {
            return Ok(self);
        };
        if name != profiles::DEFAULT && !profiles::is_profile_id(&name) {
            anyhow::bail!(
                "profile `{}` (from {origin}) is not a profile name: 1 to 64 lowercase \
                 letters, digits, `_` and `-`, starting with a letter or a digit",
                name.escape_debug()
            );
        }
        let root = profiles::root_of(&canonical(&self.root), &native_home());
        let home = profiles::profile_home(&root, &name);
        if name != profiles::DEFAULT && !home.is_dir() {
            anyhow::bail!(
                "profile {name} (from {origin}) does not exist: no directory {}; make it with \
                 Hermes Agent's `hermes profile create {name}`, or `mkdir -p {}`",
                home.display(),
                home.display()
            );
        }
        Ok(Home { root: home })
    }

    /// The root this home's profile is under (the home itself unless it
    /// is `<root>/profiles/NAME`, or inside `~/.hermes`).
    pub fn profiles_root(&self) -> PathBuf {
        hermes_model::profiles::root_of(&canonical(&self.root), &native_home())
    }

    /// The profile this home is, by Hermes Agent's rule: `default` for a
    /// root, `NAME` for `<root>/profiles/NAME`, `custom` otherwise.
    pub fn profile(&self) -> String {
        hermes_model::profiles::profile_of(&canonical(&self.root), &native_home())
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

/// The user's `~/.hermes`, symlinks resolved: the root of every home
/// inside it. Without `$HOME`, a path no home is in.
fn native_home() -> PathBuf {
    match std::env::var_os("HOME") {
        Some(home) if !home.is_empty() => canonical(&PathBuf::from(home).join(".hermes")),
        _ => PathBuf::from("/nonexistent/.hermes"),
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

    #[test]
    fn a_profile_is_a_home_under_the_root_as_the_agent_has_it() {
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        let home = || Home::resolve(Some(root.clone())).unwrap();
        assert_eq!(home().profile(), "default");
        // A profile that does not exist is refused, with the way to make it.
        let err = home()
            .select_profile(Some(("coder", "--profile")))
            .unwrap_err()
            .to_string();
        assert!(err.contains("does not exist"), "{err}");
        assert!(err.contains("profiles/coder"), "{err}");
        std::fs::create_dir_all(root.join("profiles/coder")).unwrap();
        let coder = home().select_profile(Some(("coder", "--profile"))).unwrap();
        assert_eq!(coder.root(), root.join("profiles/coder"));
        assert_eq!(coder.profile(), "coder");
        // From a profile's home, `default` is the root again.
        let back = coder
            .select_profile(Some(("default", "--profile")))
            .unwrap();
        assert_eq!(back.root(), root);
        // Not a profile id of the agent's: refused.
        let bad = home()
            .select_profile(Some(("Coder", "--profile")))
            .unwrap_err()
            .to_string();
        assert!(bad.contains("not a profile name"), "{bad}");
        let bad = home()
            .select_profile(Some(("../x", "--profile")))
            .unwrap_err()
            .to_string();
        assert!(bad.contains("not a profile name"), "{bad}");
    }

    #[test]
    fn the_active_profile_file_applies_to_the_root_only() {
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        std::fs::create_dir_all(root.join("profiles/ops")).unwrap();
        std::fs::create_dir_all(root.join("profiles/dev")).unwrap();
        std::fs::write(root.join("active_profile"), "ops\n").unwrap();
        let home = Home::resolve(Some(root.clone())).unwrap();
        assert_eq!(home.select_profile(None).unwrap().profile(), "ops");
        // A home that names a profile keeps it.
        let dev = Home::resolve(Some(root.join("profiles/dev"))).unwrap();
        assert_eq!(dev.select_profile(None).unwrap().profile(), "dev");
        // A flag wins over the file.
        let home = Home::resolve(Some(root.clone())).unwrap();
        assert_eq!(
            home.select_profile(Some(("dev", "--profile")))
                .unwrap()
                .profile(),
            "dev"
        );
        std::fs::write(root.join("active_profile"), "default").unwrap();
        let home = Home::resolve(Some(root.clone())).unwrap();
        assert_eq!(home.select_profile(None).unwrap().root(), root);
    }
}
