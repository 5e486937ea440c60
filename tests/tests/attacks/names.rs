//! Names that would walk a path (`--task ..`, `HERMES_PROFILE=..`, …) and
//! bind sources that pass through a symbolic link a sandbox planted: the
//! way one sandbox's `/workspace` became `$HERMES_HOME` (issue 14, finding
//! 1). See the crate doc in `main.rs`.

use std::path::Path;

use hermes_tests::cli::{Run, TestHome};
use hermes_tests::docker_cli::{ProfileCleanup, containers_of, docker};

/// The home of `profile` on the Docker backend, with a real-looking key
/// in `.env`.
fn home_with_key(profile: &str, key: &str) -> TestHome {
    let home = TestHome::with_profile(profile);
    home.write_config(format!(
        "terminal:\n  backend: docker\n  docker_image: {}\n",
        hermes_tests::test_image()
    ));
    std::fs::write(home.path().join(".env"), format!("OPENAI_API_KEY={key}\n")).unwrap();
    home
}

/// Every entry below `dir`, relative, sorted (empty when it is missing).
fn tree(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            out.push(p.strip_prefix(dir).unwrap().display().to_string());
            if e.file_type().unwrap().is_dir() {
                stack.push(p);
            }
        }
    }
    out.sort();
    out
}

/// Every container whose name starts with `prefix`.
fn containers_named(prefix: &str) -> Vec<String> {
    docker(&["ps", "-a", "--format", "{{.Names}}"])
        .lines()
        .filter(|n| n.starts_with(prefix))
        .map(str::to_string)
        .collect()
}

#[test]
fn names_that_walk_a_path_are_refused_at_the_edge_and_nothing_is_made() {
    let profile = format!("atk-names-{}", std::process::id());
    let _cleanup = ProfileCleanup(profile.clone());
    let _cleanup_dots = [ProfileCleanup("..".into()), ProfileCleanup("_.".into())];
    let home = home_with_key(&profile, "sk-names-not-a-real-key");
    let long = "x".repeat(64);
    let exec = |extra: &[&str]| {
        let mut args = vec!["--profile", profile.as_str(), "exec"];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["--", "true"]);
        args.into_iter().map(str::to_string).collect::<Vec<_>>()
    };
    // (arguments, environment, what the error must name, the value shown)
    type Case<'a> = (Vec<String>, Option<(&'a str, &'a str)>, &'a str, &'a str);
    let cases: Vec<Case> = vec![
        (exec(&["--task", "."]), None, "--task", "`.`"),
        (exec(&["--task", ".."]), None, "--task", "`..`"),
        (exec(&["--task", "a/b"]), None, "--task", "`a/b`"),
        (exec(&["--task", &long]), None, "--task", "64 bytes"),
        (exec(&["--task=-rf"]), None, "--task", "`-rf`"),
        (exec(&["--session", ".."]), None, "--session", "`..`"),
        (
            exec(&[]),
            Some(("HERMES_SESSION_ID", "..")),
            "HERMES_SESSION_ID",
            "`..`",
        ),
        (
            vec!["exec".into(), "--".into(), "true".into()],
            Some(("HERMES_PROFILE", "..")),
            "HERMES_PROFILE",
            "`..`",
        ),
        (
            vec![
                "--profile".into(),
                "../x".into(),
                "exec".into(),
                "--".into(),
                "true".into(),
            ],
            None,
            "--profile",
            "`../x`",
        ),
        (
            vec![
                "--profile".into(),
                profile.clone(),
                "session".into(),
                "end".into(),
                "..".into(),
            ],
            None,
            "session id",
            "`..`",
        ),
    ];
    for (args, env, names, shown) in cases {
        let mut cmd = home.command(&args);
        if let Some((k, v)) = env {
            cmd.env(k, v);
        }
        let run: Run = cmd.output().unwrap().into();
        assert_ne!(run.code, 0, "{args:?} {env:?} was accepted: {run:?}");
        assert!(
            run.stderr.contains(names) && run.stderr.contains(shown),
            "{args:?} {env:?}: the error must name {names} and show {shown}: {}",
            run.stderr
        );
        assert!(
            run.stderr.contains("starting with a letter or a digit"),
            "the rule: {}",
            run.stderr
        );
    }
    // Nothing was made: no container, no directory.
    assert_eq!(containers_of(&profile), []);
    assert_eq!(containers_of(".."), []);
    assert_eq!(containers_of("_."), []);
    assert_eq!(
        containers_named(&format!("hermes-{profile}-")),
        [] as [String; 0]
    );
    assert_eq!(containers_named("hermes-..-"), [] as [String; 0]);
    assert_eq!(tree(&home.path().join("sandboxes")), [] as [String; 0]);
    assert_eq!(tree(&home.path().join("run")), [] as [String; 0]);
}

#[test]
fn a_bind_source_through_a_planted_link_is_refused_and_the_env_never_shows() {
    let profile = format!("atk-link-{}", std::process::id());
    let _cleanup = ProfileCleanup(profile.clone());
    let key = format!("sk-link-{}-not-a-real-key", std::process::id());
    let home = home_with_key(&profile, &key);
    let hermes = |args: &[&str]| {
        let mut all = vec!["--profile", profile.as_str()];
        all.extend_from_slice(args);
        home.run(all)
    };

    // Sandbox `a` plants, in its own workspace, a link that climbs (on the
    // host) from `<home>/sandboxes/docker/a/workspace/x` to the home.
    let plant = hermes(&[
        "exec",
        "--task",
        "a",
        "--",
        "sh",
        "-c",
        "mkdir -p /workspace/x && ln -s ../../../../.. /workspace/x/workspace",
    ]);
    assert_eq!(plant.code, 0, "{plant:?}");
    let data_dir = home.path().join("sandboxes/docker");
    let climbs = data_dir.join("a/workspace/x/workspace");
    assert!(
        climbs.join(".env").exists(),
        "the planted link reaches the home"
    );

    // Task `b`'s data directory passes through `a`'s workspace: what a
    // name such as `.` made of the layout before names were checked, and
    // what any leftover of that still does.
    std::os::unix::fs::symlink(data_dir.join("a/workspace/x"), data_dir.join("b")).unwrap();
    // Sandbox `c`'s runner directory is itself a link to the home.
    let runner_c = home
        .path()
        .join("run/sandboxes")
        .join(format!("hermes-{profile}-c"));
    std::os::unix::fs::symlink(home.path(), &runner_c).unwrap();

    for (task, read) in [
        ("b", "cat /workspace/.env; ls -a /workspace"),
        ("c", "cat /run/hermes/.env; ls -a /run/hermes"),
    ] {
        let run = hermes(&["exec", "--task", task, "--", "sh", "-c", read]);
        assert_ne!(run.code, 0, "task {task} ran: {run:?}");
        assert!(
            !run.stdout.contains(&key) && !run.stderr.contains(&key),
            "task {task} saw the home's .env: {run:?}"
        );
        assert!(
            run.stderr.contains("symbolic link"),
            "task {task}: the error says why: {}",
            run.stderr
        );
        assert!(
            containers_named(&format!("hermes-{profile}-{task}")).is_empty(),
            "no sandbox is made for task {task}"
        );
    }
    // Nothing was made through the links.
    assert!(!home.path().join("workspace").exists());
    assert!(!home.path().join("home").exists());
    // Inside `a`, its link climbs only inside the container.
    let inside = hermes(&[
        "exec",
        "--task",
        "a",
        "--",
        "sh",
        "-c",
        "cat /workspace/x/workspace/.env 2>&1; true",
    ]);
    assert_eq!(inside.code, 0, "{inside:?}");
    assert!(!inside.stdout.contains(&key), "{inside:?}");
}
