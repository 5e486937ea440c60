//! A Python virtual environment with packages from PyPI, made once and
//! kept under the target directory (`CARGO_TARGET_TMPDIR` of the test that
//! asks), for tests that drive a provider's real SDK.

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
/// first call (in a temporary directory renamed into place, so that tests
/// running at once never see a half-made one). `None` when pip cannot
/// reach the package index (offline), with the reason on stderr: the
/// caller skips, saying so.
///
/// # Panics
///
/// When `python3 -m venv` fails, or pip fails for another reason than
/// being offline.
pub fn venv(dir: &Path, name: &str, packages: &[&str]) -> Option<PathBuf> {
    let home = dir.join(name);
    let python = home.join("bin").join("python");
    if python.exists() {
        return Some(python);
    }
    std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    // Unique per call: tests of one binary run at once in one process.
    static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let making = dir.join(format!("{name}.making-{}-{call}", std::process::id()));
    let _ = std::fs::remove_dir_all(&making);
    let run = |cmd: &mut Command, what: &str| -> (bool, String) {
        let out = cmd
            .output()
            .unwrap_or_else(|e| panic!("{what}: cannot run: {e}"));
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), text)
    };
    let (ok, text) = run(
        Command::new("python3").args(["-m", "venv"]).arg(&making),
        "python3 -m venv",
    );
    assert!(ok, "python3 -m venv {}: {text}", making.display());
    let (ok, text) = run(
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
    );
    if !ok {
        let _ = std::fs::remove_dir_all(&making);
        if OFFLINE.iter().any(|sign| text.contains(sign)) {
            eprintln!("SKIPPED: pip cannot install {packages:?} from PyPI (offline?):\n{text}");
            return None;
        }
        panic!("pip install {packages:?}: {text}");
    }
    // Another test may have made it meanwhile: theirs stands.
    if std::fs::rename(&making, &home).is_err() {
        let _ = std::fs::remove_dir_all(&making);
    }
    assert!(python.exists(), "no {}", python.display());
    Some(python)
}
