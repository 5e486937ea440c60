//! Running the real `hermes` binary against a home directory of the test's
//! own.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The `hermes` binary under test: `HERMES_BIN` (set by `scripts/test`),
/// else `target/<profile>/hermes` beside this test executable.
///
/// # Panics
///
/// When the binary has not been built, or (without `HERMES_BIN`) is older
/// than a source it is built from: the tests must not pass on it.
pub fn hermes_bin() -> PathBuf {
    if let Some(bin) = std::env::var_os("HERMES_BIN").filter(|b| !b.is_empty()) {
        return PathBuf::from(bin);
    }
    let exe = std::env::current_exe().unwrap_or_else(|e| panic!("current_exe: {e}"));
    // target/debug/deps/<test> → target/debug/hermes
    let bin = exe
        .parent()
        .and_then(Path::parent)
        .map(|dir| dir.join("hermes"))
        .unwrap_or_else(|| panic!("no target directory above {}", exe.display()));
    assert!(
        bin.exists(),
        "{} is missing: build it with `cargo build --bin hermes` (scripts/test does)",
        bin.display()
    );
    // `cargo test -p hermes-tests` does not rebuild another package's
    // binary: refuse to test an old one rather than report on it.
    static FRESH: std::sync::OnceLock<Option<PathBuf>> = std::sync::OnceLock::new();
    if let Some(newer) = FRESH.get_or_init(|| newer_source(&bin)) {
        panic!(
            "{} is older than {}: rebuild it with `cargo build --bin hermes` (scripts/test does)",
            bin.display(),
            newer.display()
        );
    }
    bin
}

/// The same binary under its other name, `hermesctl`: beside
/// [`hermes_bin`] (`cargo build -p hermes-controller --bins` makes both;
/// `scripts/test` does).
///
/// # Panics
///
/// When it has not been built, or (without `HERMES_BIN`) is older than a
/// source it is built from.
pub fn hermesctl_bin() -> PathBuf {
    let bin = hermes_bin().with_file_name("hermesctl");
    assert!(
        bin.exists(),
        "{} is missing: build it with `cargo build -p hermes-controller --bins` (scripts/test does)",
        bin.display()
    );
    let chosen = std::env::var_os("HERMES_BIN").is_some_and(|b| !b.is_empty());
    if let Some(newer) = newer_source(&bin).filter(|_| !chosen) {
        panic!(
            "{} is older than {}: rebuild it with `cargo build -p hermes-controller --bins` \
             (scripts/test does)",
            bin.display(),
            newer.display()
        );
    }
    bin
}

/// A file the binary is built from (as cargo's dep-info beside it,
/// `hermes.d`, lists them) that changed after it was built, if any.
fn newer_source(bin: &Path) -> Option<PathBuf> {
    let built = std::fs::metadata(bin).and_then(|m| m.modified()).ok()?;
    let deps = std::fs::read_to_string(bin.with_extension("d")).ok()?;
    let (_, sources) = deps.lines().next()?.split_once(": ")?;
    sources.split_whitespace().map(PathBuf::from).find(|path| {
        std::fs::metadata(path)
            .and_then(|m| m.modified())
            .is_ok_and(|m| m > built)
    })
}

/// The variables the cloud backends read their credentials from.
pub const CLOUD_CREDENTIALS: &[&str] = &[
    "MODAL_TOKEN_ID",
    "MODAL_TOKEN_SECRET",
    "DAYTONA_API_KEY",
    "VERCEL_OIDC_TOKEN",
    "VERCEL_TOKEN",
    "VERCEL_PROJECT_ID",
    "VERCEL_TEAM_ID",
];

/// A `$HERMES_HOME` in a temporary directory, removed when dropped: the
/// directory itself, or the home of a profile below it
/// ([`TestHome::with_profile`]).
#[derive(Debug)]
pub struct TestHome {
    dir: tempfile::TempDir,
    home: PathBuf,
}

/// What a run of `hermes` printed and how it exited.
#[derive(Debug)]
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl From<Output> for Run {
    fn from(out: Output) -> Run {
        Run {
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }
}

impl Run {
    /// The rows of the plan it printed that are not reports' (`+`, `~`,
    /// `-`), `(target, action)`, in order: what it said it would do.
    pub fn planned(&self) -> Vec<(String, String)> {
        row_pairs(&self.stdout, |l| {
            ["+ ", "~ ", "- "].iter().any(|p| l.starts_with(p)) && !l.contains(" done (")
        })
    }

    /// The operations it printed as done (`+ TARGET   VERB done (1.0s)`),
    /// `(target, action)`, in order: what it did.
    pub fn done(&self) -> Vec<(String, String)> {
        row_pairs(&self.stdout, |l| l.contains(" done ("))
    }
}

/// `(target, verb)` of the lines of `text` that `keep` keeps, each
/// `S TARGET   VERB ...`.
fn row_pairs(text: &str, keep: impl Fn(&str) -> bool) -> Vec<(String, String)> {
    text.lines()
        .filter(|l| keep(l))
        .filter_map(|l| {
            let (left, right) = l.split_once("   ")?;
            let verb = right.split_whitespace().next()?;
            Some((left.get(2..)?.to_string(), verb.to_string()))
        })
        .collect()
}

impl TestHome {
    /// A new home, 0700 as hermes makes one (hermes warns about a home
    /// open to other users).
    pub fn new() -> TestHome {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700))
            .unwrap_or_else(|e| panic!("chmod 700 {}: {e}", dir.path().display()));
        let home = dir.path().to_path_buf();
        TestHome { dir, home }
    }

    /// The home of profile `name` under a new root: `<root>/profiles/NAME`,
    /// where `hermes --profile NAME` (and Hermes Agent's `-p NAME`) points
    /// from the root. Commands run with `--home` set to it, and their
    /// containers carry `hermes-profile=NAME`.
    pub fn with_profile(name: &str) -> TestHome {
        use std::os::unix::fs::DirBuilderExt;
        let mut t = TestHome::new();
        t.home = t.dir.path().join("profiles").join(name);
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&t.home)
            .unwrap_or_else(|e| panic!("mkdir {}: {e}", t.home.display()));
        t
    }

    /// The home hermes runs with.
    pub fn path(&self) -> &Path {
        &self.home
    }

    /// The root the home is in (the home itself unless it is a profile's).
    pub fn root(&self) -> &Path {
        self.dir.path()
    }

    pub fn config_path(&self) -> PathBuf {
        self.path().join("config.yaml")
    }

    /// Writes config.yaml.
    pub fn write_config(&self, text: impl AsRef<[u8]>) {
        std::fs::write(self.config_path(), text).unwrap_or_else(|e| panic!("write config: {e}"));
    }

    pub fn read_config(&self) -> String {
        std::fs::read_to_string(self.config_path()).unwrap_or_else(|e| panic!("read config: {e}"))
    }

    /// A `hermes` command with `--home` set and a clean environment for the
    /// variables hermes reads.
    pub fn command<I, S>(&self, args: I) -> Command
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut cmd = Command::new(hermes_bin());
        cmd.arg("--home")
            .arg(self.path())
            .args(args)
            .env_remove("HERMES_HOME")
            .env_remove("HERMES_PROFILE")
            .env_remove("RUST_LOG");
        // The cloud services' credentials: a test that wants one sets it.
        for name in CLOUD_CREDENTIALS {
            cmd.env_remove(name);
        }
        // Hermes Agent's `TERMINAL_*` variables lay values over the file.
        for (name, _) in std::env::vars_os() {
            if name.to_string_lossy().starts_with("TERMINAL_") {
                cmd.env_remove(name);
            }
        }
        cmd
    }

    /// Runs `hermes --home <this> ARGS…` to completion.
    pub fn run<I, S>(&self, args: I) -> Run
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.command(args)
            .output()
            .unwrap_or_else(|e| panic!("running hermes: {e}"))
            .into()
    }
}

impl Drop for TestHome {
    /// Unmounts what hermes mounted below the home (the sandboxes' disk
    /// images) before the directory is removed, deepest first, lazily: a
    /// container still holding one lets go when it is removed.
    fn drop(&mut self) {
        let Ok(mountinfo) = std::fs::read_to_string("/proc/self/mountinfo") else {
            return;
        };
        let mut below: Vec<&str> = mountinfo
            .lines()
            .filter_map(|line| line.split(' ').nth(4))
            .filter(|point| Path::new(point).starts_with(self.dir.path()))
            .collect();
        below.sort_by_key(|p| std::cmp::Reverse(p.len()));
        for point in below {
            let _ = Command::new("umount").arg("-l").arg(point).output();
        }
    }
}

impl Default for TestHome {
    fn default() -> Self {
        TestHome::new()
    }
}
