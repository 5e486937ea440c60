//! The Docker CLI as the tests' independent witness: what the engine holds
//! is read back with `docker`, not through the code under test.

use std::process::Command;

/// `docker ARGS…`, its stdout on success.
///
/// # Panics
///
/// When the CLI cannot run or the command fails.
pub fn docker(args: &[&str]) -> String {
    let out = Command::new("docker")
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running docker {args:?}: {e}"));
    assert!(
        out.status.success(),
        "docker {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `(name, state)` of every container hermes labelled for `profile`,
/// sorted by name.
pub fn containers_of(profile: &str) -> Vec<(String, String)> {
    let filter = format!("label=hermes-profile={profile}");
    let mut rows: Vec<(String, String)> = docker(&[
        "ps",
        "-a",
        "--filter",
        "label=hermes-agent=1",
        "--filter",
        &filter,
        "--format",
        "{{.Names}} {{.State}}",
    ])
    .lines()
    .filter_map(|line| {
        let (name, state) = line.split_once(' ')?;
        Some((name.to_string(), state.to_string()))
    })
    .collect();
    rows.sort();
    rows
}

/// Removes every container of a test's profile however the test ends.
#[derive(Debug)]
pub struct ProfileCleanup(pub String);

impl Drop for ProfileCleanup {
    fn drop(&mut self) {
        let filter = format!("label=hermes-profile={}", self.0);
        let Ok(out) = Command::new("docker")
            .args(["ps", "-aq", "--filter", &filter])
            .output()
        else {
            return;
        };
        let ids: Vec<String> = String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .map(str::to_string)
            .collect();
        if !ids.is_empty() {
            let _ = Command::new("docker")
                .args(["rm", "-f"])
                .args(&ids)
                .output();
        }
    }
}

/// A new home of profile `<tag><pid>` on the Docker backend with the test
/// image and `extra` config lines (indented, under `terminal:`), its
/// profile's name, and the guard that removes its containers.
pub fn docker_home(tag: &str, extra: &str) -> (crate::cli::TestHome, String, ProfileCleanup) {
    let profile = format!("{tag}{}", std::process::id());
    let home = crate::cli::TestHome::with_profile(&profile);
    home.write_config(format!(
        "terminal:\n  backend: docker\n  docker_image: {}\n{extra}",
        crate::test_image()
    ));
    let cleanup = ProfileCleanup(profile.clone());
    (home, profile, cleanup)
}
