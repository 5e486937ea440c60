//! Where hermes keeps its files: `$HERMES_HOME` (default `~/.hermes`,
//! `--home DIR` overrides both).

use std::path::{Path, PathBuf};

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

    pub fn config(&self) -> PathBuf {
        self.root.join("config.yaml")
    }

    pub fn env_file(&self) -> PathBuf {
        self.root.join(".env")
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn a_relative_home_is_made_absolute() {
        let home = Home::resolve(Some(PathBuf::from("rel/home"))).unwrap();
        assert!(home.root().is_absolute(), "{}", home.root().display());
        assert!(home.root().ends_with("rel/home"));
    }
}
