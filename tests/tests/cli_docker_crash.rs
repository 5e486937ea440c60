//! `kill -9` of `hermes reconcile` at random moments: whatever the pass was
//! doing (creating, stopping, starting, removing, renaming), no two
//! sandboxes of one task run at once, the next pass converges to exactly
//! one sandbox and the workspace survives.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use hermes_tests::cli::TestHome;
use hermes_tests::docker_cli::{ProfileCleanup, containers_of};

const ITERATIONS: u32 = 20;
/// Kill moments are drawn from 0 to this many milliseconds after spawn; a
/// recreating pass takes about 0.3 s here, so most kills land inside it
/// (start-up, remove, create, start) and some after it.
const MAX_DELAY_MS: u64 = 450;

/// A small deterministic generator: the seed is printed, so a failing run
/// can be replayed with `HERMES_CRASH_SEED`.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        self.0 >> 33
    }
}

fn config(generation: u32) -> String {
    // Each generation changes the spec, so every pass has a recreate to do.
    format!(
        "terminal:\n  backend: docker\n  docker_image: {}\n  docker_env:\n    GENERATION: \"{generation}\"\n",
        hermes_tests::test_image()
    )
}

#[test]
fn kill_9_at_random_moments_never_leaves_two_sandboxes_or_loses_the_workspace() {
    let profile = format!("e2k{}", std::process::id());
    let _cleanup = ProfileCleanup(profile.clone());
    let home = TestHome::with_profile(&profile);
    let seed = std::env::var("HERMES_CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| u64::from(std::process::id()));
    eprintln!("HERMES_CRASH_SEED={seed}");
    let mut rng = Lcg(seed);

    home.write_config(config(0));
    let write = home.run([
        "--profile",
        &profile,
        "exec",
        "--",
        "sh",
        "-c",
        "echo survived > /workspace/marker",
    ]);
    assert_eq!(write.code, 0, "{write:?}");

    let started = Instant::now();
    for generation in 1..=ITERATIONS {
        home.write_config(config(generation));
        let mut child = home
            .command(["--profile", &profile, "reconcile"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let delay = Duration::from_millis(rng.next() % MAX_DELAY_MS);
        std::thread::sleep(delay);
        child.kill().unwrap(); // SIGKILL; a no-op error if it already exited
        child.wait().unwrap();
        // A recreate creates before it removes: a stopped or created
        // temporary container may be left, never two running.
        let now = containers_of(&profile);
        assert!(
            now.iter().filter(|(_, state)| state == "running").count() <= 1,
            "generation {generation}, killed after {delay:?}: {now:?}"
        );
    }
    assert!(started.elapsed() < Duration::from_secs(120));

    let finish = home.run(["--profile", &profile, "reconcile"]);
    assert_eq!(finish.code, 0, "{finish:?}");
    assert_eq!(
        containers_of(&profile),
        [(format!("hermes-{profile}-default"), "running".to_string())]
    );
    let again = home.run(["--profile", &profile, "reconcile", "--dry-run"]);
    assert_eq!(again.code, 0, "{again:?}");
    let read = home.run([
        "--profile",
        &profile,
        "exec",
        "--",
        "sh",
        "-c",
        "cat /workspace/marker; echo $GENERATION",
    ]);
    assert_eq!(
        (read.code, read.stdout.as_str()),
        (0, format!("survived\n{ITERATIONS}\n").as_str())
    );
}
