//! Python packages from PyPI, installed once and kept under the target
//! directory (`CARGO_TARGET_TMPDIR` of the test that asks), for tests that
//! drive a provider's real SDK: a virtual environment on this host, or a
//! `pip --target` directory a container mounts and puts on `PYTHONPATH`.

use std::path::{Path, PathBuf};
use std::process::Command;

/// What pip says when it cannot reach the package index.
const OFFLINE: &[&str] = &[
    "Failed to establish a new connection",
    "Temporary failure in name resolution",
    "Network is unreachable",
    "No matching distribution found",
    "Could not fetch URL",
    "ConnectTimeoutError",
    "ReadTimeoutError",
];

/// The Python of a venv at `DIR/NAME` holding `packages`, made on the
/// first call ([`made_once`]). `None` when pip cannot reach the package
/// index (offline), with the reason on stderr: the caller skips, saying so.
///
/// # Panics
///
/// When `python3 -m venv` fails, or pip fails for another reason than
/// being offline.
pub fn venv(dir: &Path, name: &str, packages: &[&str]) -> Option<PathBuf> {
    let home = made_once(dir, name, "bin/python", packages, |making| {
        let (ok, text) = output_of(
            Command::new("python3").args(["-m", "venv"]).arg(making),
            "python3 -m venv",
        );
        assert!(ok, "python3 -m venv {}: {text}", making.display());
        output_of(
            Command::new(making.join("bin").join("python"))
                .args([
                    "-m",
                    "pip",
                    "install",
                    "--quiet",
                    "--disable-pip-version-check",
                    "--timeout",
                    "30",
                ])
                .args(packages),
            "pip install",
        )
    })?;
    let python = home.join("bin").join("python");
    assert!(python.exists(), "no {}", python.display());
    Some(python)
}

/// A directory holding `packages` (pure Python wheels, for a container
/// to put on `PYTHONPATH`) at `DIR/NAME`, made on the first call
/// ([`made_once`]) with `pip install --target`. `None` when pip cannot
/// reach the package index, with the reason on stderr: the caller skips,
/// saying so.
///
/// # Panics
///
/// When pip fails for another reason than being offline.
pub fn pip_target(dir: &Path, name: &str, packages: &[&str]) -> Option<PathBuf> {
    // The pip of a venv of its own: a Debian python3 has none without
    // python3-pip, and ensurepip gives every venv one.
    let pip = made_once(dir, "pip-tool", "bin/python", &["pip"], |making| {
        output_of(
            Command::new("python3").args(["-m", "venv"]).arg(making),
            "python3 -m venv",
        )
    })?
    .join("bin")
    .join("python");
    made_once(dir, name, ".complete", packages, |making| {
        let done = output_of(
            Command::new(&pip)
                .args([
                    "-m",
                    "pip",
                    "install",
                    "--quiet",
                    "--disable-pip-version-check",
                    "--no-compile",
                    "--only-binary=:all:",
                    "--timeout",
                    "30",
                    "--target",
                ])
                .arg(making)
                .args(packages),
            "pip install",
        );
        if done.0 {
            std::fs::write(making.join(".complete"), "").unwrap_or_else(|e| panic!("{e}"));
        }
        done
    })
}

/// `DIR/NAME`, made by `make` (success, and what it printed) when
/// `DIR/NAME/COMPLETE` is not there yet: in a temporary directory renamed
/// into place, so that tests running at once, in one process or several,
/// never see a half-made one (when two make it, the first in place
/// stands). A failure that reads as pip being offline is `None`, said on
/// stderr; any other panics.
fn made_once(
    dir: &Path,
    name: &str,
    complete: &str,
    packages: &[&str],
    make: impl FnOnce(&Path) -> (bool, String),
) -> Option<PathBuf> {
    let home = dir.join(name);
    if home.join(complete).exists() {
        return Some(home);
    }
    std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    // Unique per call: tests of one binary run at once in one process.
    static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let making = dir.join(format!("{name}.making-{}-{call}", std::process::id()));
    let _ = std::fs::remove_dir_all(&making);
    let (ok, text) = make(&making);
    if !ok {
        let _ = std::fs::remove_dir_all(&making);
        if OFFLINE.iter().any(|sign| text.contains(sign)) {
            eprintln!("SKIPPED: pip cannot install {packages:?} from PyPI (offline?):\n{text}");
            return None;
        }
        panic!("pip install {packages:?}: {text}");
    }
    if std::fs::rename(&making, &home).is_err() {
        let _ = std::fs::remove_dir_all(&making);
    }
    Some(home)
}

/// Runs `cmd`: whether it succeeded, and its stdout and stderr.
fn output_of(cmd: &mut Command, what: &str) -> (bool, String) {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot run: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}
