//! The singularity backend: Apptainer (else SingularityCE) run as a
//! program on this host.
//!
//! - [`Runtime::find`]: `apptainer`, else `singularity`, on the PATH.
//! - [`Runtime::ensure_image`]: the image built once into a cached SIF
//!   (`build <tmp> docker://…`, then a rename, so a reader never sees half
//!   an image).
//! - [`Runtime::start`] / [`Runtime::stop`]: `instance start` (contained,
//!   no home, an overlay directory or a writable tmpfs, binds, limits),
//!   recording the spec hash beside the instance; `instance stop`.
//! - [`Runtime::observe`]: `instance list --json`, with the recorded hashes.
//! - [`Instance`]: an [`Executor`](crate::exec::Executor): `exec
//!   instance://<name> bash -c …`, output streamed, the exit code the
//!   command's, a timeout killing the whole tree inside (124).
//!
//! Every child runs with a cleared environment (the few variables the
//! runtime itself needs, and the values for the command as
//! `APPTAINERENV_*`), so nothing of hermes's own environment — a real key
//! among it — reaches a container, and no value is on a command line.

pub mod argv;
mod exec;

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use hermes_model::singularity::{
    HASH_FILE, InstanceSpec, ObservedInstance, SingularityObserved, is_remote_source,
};

pub use argv::Flavor;
pub use exec::Instance;

/// What can go wrong on the singularity backend. No error carries an
/// environment value.
#[derive(Debug, thiserror::Error)]
pub enum SingularityError {
    #[error("neither apptainer nor singularity is on the PATH")]
    NotInstalled,
    #[error("cannot run {program}: {source}")]
    Spawn {
        program: String,
        #[source]
        source: std::io::Error,
    },
    /// The runtime ran and refused: what was asked, its exit status and
    /// the end of what it printed on stderr.
    #[error("{program} {what} failed ({status}): {stderr}")]
    Failed {
        program: String,
        what: String,
        status: String,
        stderr: String,
    },
    #[error("{program} instance list --json printed something else than a list: {reason}")]
    BadList { program: String, reason: String },
    #[error("the image {path} does not exist (terminal.singularity_image names a SIF file)")]
    NoImage { path: PathBuf },
    #[error("{what} {path}: {source}")]
    Files {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Writing the command's output here failed.
    #[error("writing the command's output: {0}")]
    Output(#[source] std::io::Error),
}

/// The variables of hermes's environment a runtime child keeps: what the
/// runtime needs to find itself, its cache and the user's session.
const KEPT_ENV: &[&str] = &[
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "LANG",
    "LC_ALL",
    "TMPDIR",
    "XDG_RUNTIME_DIR",
    "DBUS_SESSION_BUS_ADDRESS",
    "APPTAINER_CACHEDIR",
    "APPTAINER_TMPDIR",
    "SINGULARITY_CACHEDIR",
    "SINGULARITY_TMPDIR",
];

/// The runtime binary found on the PATH.
#[derive(Debug, Clone)]
pub struct Runtime {
    program: PathBuf,
    flavor: Flavor,
}

impl Runtime {
    /// `apptainer`, else `singularity`, in the directories of `path` (the
    /// PATH's value).
    pub fn find(path: Option<&std::ffi::OsStr>) -> Result<Runtime, SingularityError> {
        let dirs: Vec<PathBuf> = path
            .map(|p| std::env::split_paths(p).collect())
            .unwrap_or_default();
        for flavor in [Flavor::Apptainer, Flavor::Singularity] {
            for dir in &dirs {
                let candidate = dir.join(flavor.program());
                if is_executable(&candidate) {
                    return Ok(Runtime {
                        program: candidate,
                        flavor,
                    });
                }
            }
        }
        Err(SingularityError::NotInstalled)
    }

    /// The runtime of this process's PATH.
    pub fn from_env() -> Result<Runtime, SingularityError> {
        Runtime::find(std::env::var_os("PATH").as_deref())
    }

    pub fn flavor(&self) -> Flavor {
        self.flavor
    }

    pub fn program(&self) -> &Path {
        &self.program
    }

    /// A child of the runtime with `args`, a cleared environment but for
    /// [`KEPT_ENV`], and `values` passed as prefixed variables.
    pub(crate) fn command(
        &self,
        args: &[String],
        values: &[(String, String)],
    ) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new(&self.program);
        cmd.args(args).env_clear();
        for name in KEPT_ENV {
            if let Some(value) = std::env::var_os(name) {
                cmd.env(name, value);
            }
        }
        for (k, v) in argv::env(self.flavor, values) {
            cmd.env(k, v);
        }
        cmd.stdin(Stdio::null()).kill_on_drop(true);
        cmd
    }

    /// Runs the runtime to its end; its stdout when it succeeds.
    async fn run(&self, args: &[String], what: &str) -> Result<Vec<u8>, SingularityError> {
        tracing::debug!(program = %self.program.display(), ?args, "running");
        let out =
            self.command(args, &[])
                .output()
                .await
                .map_err(|source| SingularityError::Spawn {
                    program: self.program.display().to_string(),
                    source,
                })?;
        if out.status.success() {
            return Ok(out.stdout);
        }
        Err(SingularityError::Failed {
            program: self.flavor.program().to_string(),
            what: what.to_string(),
            status: out.status.to_string(),
            stderr: tail(&out.stderr),
        })
    }

    /// Builds the instance's image into its cached SIF unless it is there;
    /// whether it built one.
    pub async fn ensure_image(&self, spec: &InstanceSpec) -> Result<bool, SingularityError> {
        if spec.sif.is_file() {
            return Ok(false);
        }
        if !is_remote_source(&spec.source) {
            return Err(SingularityError::NoImage {
                path: spec.sif.clone(),
            });
        }
        let dir = spec.sif.parent().unwrap_or(Path::new("."));
        make_dir(dir)?;
        let mut tmp = spec.sif.as_os_str().to_owned();
        tmp.push(format!(".tmp-{}", std::process::id()));
        let tmp = PathBuf::from(tmp);
        let result = self
            .run(
                &argv::build(&tmp.display().to_string(), &spec.source),
                &format!("build of {}", spec.source),
            )
            .await;
        if let Err(e) = result {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
        std::fs::rename(&tmp, &spec.sif).map_err(|source| SingularityError::Files {
            what: "cannot move the built image to",
            path: spec.sif.clone(),
            source,
        })?;
        tracing::info!(image = %spec.source, sif = %spec.sif.display(), "image built");
        Ok(true)
    }

    /// Starts the instance (its image built first when needed) and records
    /// its spec hash beside it.
    pub async fn start(&self, spec: &InstanceSpec) -> Result<(), SingularityError> {
        for dir in std::iter::once(&spec.dir).chain(&spec.overlay) {
            crate::host_dir::make_below(&spec.home, dir).map_err(|e| SingularityError::Files {
                what: "refused to make",
                path: dir.clone(),
                source: std::io::Error::other(e),
            })?;
        }
        self.ensure_image(spec).await?;
        self.run(
            &argv::instance_start(spec),
            &format!("instance start of {}", spec.name),
        )
        .await?;
        write_hash(&spec.dir, &spec.hash)
    }

    /// Stops an instance; one that is not running counts as stopped.
    pub async fn stop(&self, name: &str) -> Result<(), SingularityError> {
        match self
            .run(
                &argv::instance_stop(name),
                &format!("instance stop of {name}"),
            )
            .await
        {
            Err(SingularityError::Failed { stderr, .. })
                if stderr.contains("no instance found") || stderr.contains("not found") =>
            {
                Ok(())
            }
            other => other.map(drop),
        }
    }

    /// Stops the instance and starts it with `spec`; the overlay stays.
    pub async fn restart(&self, spec: &InstanceSpec) -> Result<(), SingularityError> {
        // Build first: a failed build must not cost the running instance.
        self.ensure_image(spec).await?;
        self.stop(&spec.name).await?;
        self.start(spec).await
    }

    /// The running instances, each with the hash recorded when hermes
    /// started it (for the specs in `wanted`), and which wanted images are
    /// cached.
    pub async fn observe(
        &self,
        wanted: &[InstanceSpec],
    ) -> Result<SingularityObserved, SingularityError> {
        let out = self.run(&argv::instance_list(), "instance list").await?;
        let listed = parse_list(&out).map_err(|reason| SingularityError::BadList {
            program: self.flavor.program().to_string(),
            reason,
        })?;
        let instances = listed
            .into_iter()
            .map(|(name, pid, image)| {
                let spec_hash = wanted
                    .iter()
                    .find(|s| s.name == name)
                    .and_then(|s| read_hash(&s.dir));
                ObservedInstance {
                    name,
                    pid,
                    image,
                    spec_hash,
                }
            })
            .collect();
        let cached = wanted
            .iter()
            .filter(|s| s.sif.is_file())
            .map(|s| s.sif.clone())
            .collect();
        Ok(SingularityObserved::Seen { instances, cached })
    }
}

/// What a pass sees of the singularity backend: the instances, or why
/// there are none to see.
pub async fn observe(wanted: &[InstanceSpec]) -> SingularityObserved {
    let runtime = match Runtime::from_env() {
        Ok(r) => r,
        Err(e) => {
            return SingularityObserved::Unavailable {
                reason: e.to_string(),
            };
        }
    };
    match runtime.observe(wanted).await {
        Ok(seen) => seen,
        Err(e) => SingularityObserved::Unavailable {
            reason: e.to_string(),
        },
    }
}

/// `(name, pid, image)` of each instance in `instance list --json`.
pub fn parse_list(out: &[u8]) -> Result<Vec<(String, u32, String)>, String> {
    let value: serde_json::Value = serde_json::from_slice(out).map_err(|e| e.to_string())?;
    let Some(list) = value.get("instances").and_then(|l| l.as_array()) else {
        // An empty list may come as `null`.
        return match value.get("instances") {
            Some(serde_json::Value::Null) => Ok(Vec::new()),
            _ => Err("no `instances` list".to_string()),
        };
    };
    list.iter()
        .map(|item| {
            let name = item
                .get("instance")
                .and_then(|n| n.as_str())
                .ok_or("an instance without a name")?;
            let pid = item
                .get("pid")
                .and_then(serde_json::Value::as_u64)
                .and_then(|p| u32::try_from(p).ok())
                .unwrap_or(0);
            let image = item.get("img").and_then(|i| i.as_str()).unwrap_or_default();
            Ok((name.to_string(), pid, image.to_string()))
        })
        .collect()
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

fn make_dir(dir: &Path) -> Result<(), SingularityError> {
    use std::os::unix::fs::DirBuilderExt;
    if dir.is_dir() {
        return Ok(());
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|source| SingularityError::Files {
            what: "cannot make",
            path: dir.to_path_buf(),
            source,
        })
}

fn read_hash(dir: &Path) -> Option<String> {
    let text = std::fs::read_to_string(dir.join(HASH_FILE)).ok()?;
    let hash = text.trim();
    (!hash.is_empty() && hash.len() <= 64).then(|| hash.to_string())
}

/// Records the hash an instance was started with (a temporary file, then
/// a rename).
fn write_hash(dir: &Path, hash: &str) -> Result<(), SingularityError> {
    let path = dir.join(HASH_FILE);
    let mut tmp: OsString = path.as_os_str().to_owned();
    tmp.push(format!(".tmp-{}", std::process::id()));
    let files = |source| SingularityError::Files {
        what: "cannot record the spec hash in",
        path: path.clone(),
        source,
    };
    std::fs::write(&tmp, format!("{hash}\n")).map_err(files)?;
    std::fs::rename(&tmp, &path).map_err(files)
}

/// The last line or so of a runtime's stderr, for an error message.
fn tail(stderr: &[u8]) -> String {
    let text = String::from_utf8_lossy(stderr);
    let text = text.trim();
    let start = text.char_indices().rev().nth(400).map_or(0, |(i, _)| i);
    let tail = &text[start..];
    if tail.is_empty() {
        "(no message)".to_string()
    } else {
        tail.replace('\n', " | ")
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn apptainer_is_preferred_to_singularity_on_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a");
        let b = dir.path().join("b");
        std::fs::create_dir_all(&a).unwrap();
        std::fs::create_dir_all(&b).unwrap();
        let put = |dir: &Path, name: &str| {
            let p = dir.join(name);
            std::fs::write(&p, "#!/bin/sh\n").unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        };
        let path = std::env::join_paths([&a, &b]).unwrap();
        assert!(matches!(
            Runtime::find(Some(&path)),
            Err(SingularityError::NotInstalled)
        ));
        put(&a, "singularity");
        let r = Runtime::find(Some(&path)).unwrap();
        assert_eq!(r.flavor(), Flavor::Singularity);
        put(&b, "apptainer");
        let r = Runtime::find(Some(&path)).unwrap();
        assert_eq!(r.flavor(), Flavor::Apptainer);
        assert_eq!(r.program(), b.join("apptainer"));
        // A file that cannot be run is not a runtime.
        let c = dir.path().join("c");
        std::fs::create_dir_all(&c).unwrap();
        std::fs::write(c.join("apptainer"), "").unwrap();
        assert!(Runtime::find(Some(c.as_os_str())).is_err());
    }

    #[test]
    fn the_instance_list_is_read_by_name_pid_and_image() {
        let out = br#"{"instances":[{"instance":"hermes-default-default","pid":4242,"img":"/h/cache/singularity/x.sif","ip":"","logErrPath":"/e","logOutPath":"/o"}]}"#;
        assert_eq!(
            parse_list(out).unwrap(),
            [(
                "hermes-default-default".to_string(),
                4242,
                "/h/cache/singularity/x.sif".to_string()
            )]
        );
        assert_eq!(parse_list(br#"{"instances":[]}"#).unwrap(), []);
        assert_eq!(parse_list(br#"{"instances":null}"#).unwrap(), []);
        assert!(parse_list(b"not json").is_err());
        assert!(parse_list(br#"{"other":1}"#).is_err());
    }

    #[test]
    fn the_spec_hash_is_recorded_beside_the_instance() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read_hash(dir.path()), None);
        write_hash(dir.path(), "0123456789ab").unwrap();
        assert_eq!(read_hash(dir.path()).as_deref(), Some("0123456789ab"));
    }

    #[test]
    fn stderr_tails_are_one_line_and_bounded() {
        assert_eq!(tail(b"FATAL: a\nFATAL: b\n"), "FATAL: a | FATAL: b");
        assert_eq!(tail(b""), "(no message)");
        assert!(tail(&[b'x'; 5000]).len() <= 401);
    }
}
