//! Where hermes keeps its files: `$HERMES_HOME` (default `~/.hermes`,
//! `--home DIR` overrides both).

use std::path::{Path, PathBuf};

/// The hermes home directory and the paths inside it.
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
