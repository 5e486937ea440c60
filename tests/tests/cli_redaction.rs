//! `security.redact_secrets`: the output of `hermes exec` masks real keys
//! and key-shaped strings, on the local and the Docker backend; `false`
//! shows them, with a warning.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use hermes_tests::cli::TestHome;
use hermes_tests::docker_cli::ProfileCleanup;

/// Key-shaped, but no real key of anyone.
const FAKE_ANTHROPIC: &str = "sk-ant-api03-hermesTESTvalueNOTaKEY0123456789abcdef";
/// A value with no key shape: masked only because the host holds it.
const PLAIN_SECRET: &str = "correct-horse-battery-staple-42";

#[test]
fn local_exec_output_masks_the_hosts_keys_and_key_shapes() {
    let home = TestHome::new();
    std::fs::write(
        home.path().join(".env"),
        format!("OPENROUTER_API_KEY={PLAIN_SECRET}\n"),
    )
    .unwrap();
    let out = home
        .command([
            "exec",
            "--",
            "sh",
            "-c",
            &format!("echo key={PLAIN_SECRET}; echo shaped={FAKE_ANTHROPIC} >&2"),
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert_eq!(stdout, "key=corr…[redacted]\n");
    assert_eq!(stderr, "shaped=sk-ant-ap…[redacted]\n");
}

#[test]
fn docker_exec_masks_a_key_placed_in_the_sandbox_unless_redaction_is_off() {
    let profile = format!("xr{}", std::process::id());
    let _cleanup = ProfileCleanup(profile.clone());
    let home = TestHome::with_profile(&profile);
    let config = |redact: bool| {
        format!(
            "terminal:\n  backend: docker\n  docker_image: {}\n  docker_env:\n    ANTHROPIC_API_KEY: {FAKE_ANTHROPIC}\nsecurity:\n  redact_secrets: {redact}\n",
            hermes_tests::test_image()
        )
    };
    home.write_config(config(true));
    let run = home.run([
        "--profile",
        &profile,
        "exec",
        "--",
        "printenv",
        "ANTHROPIC_API_KEY",
    ]);
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(run.stdout, "sk-ant-ap…[redacted]\n");

    home.write_config(config(false));
    let run = home.run([
        "--profile",
        &profile,
        "exec",
        "--",
        "printenv",
        "ANTHROPIC_API_KEY",
    ]);
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(run.stdout, format!("{FAKE_ANTHROPIC}\n"));
    assert!(
        run.stderr.contains("security.redact_secrets is false"),
        "{}",
        run.stderr
    );
}
