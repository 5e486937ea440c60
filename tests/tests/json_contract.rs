//! The JSON contract (docs/json.md), through the real binary: every
//! command that takes `--output json` prints exactly one JSON document on
//! stdout, versioned, errors included, and each document validates
//! against its JSON Schema in docs/schema/ — on the local backend, on the
//! Docker backend with a sandbox, a session and an applied plan, and for
//! the errors (a usage error, an invalid config, an engine that does not
//! answer).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use hermes_tests::cli::{Run, TestHome};
use hermes_tests::docker_cli::docker_home;
use hermes_tests::json_schema::document;

#[test]
fn every_document_of_a_local_home_validates_against_its_schema() {
    let home = TestHome::new();
    home.write_config("terminal:\n  backend: local\n");
    let json = |args: &[&str]| {
        let mut all = args.to_vec();
        all.extend(["--output", "json"]);
        home.run(all)
    };
    for (args, schema_name, code) in [
        (&["status"][..], "status", 0),
        (&["sandbox", "list"], "sandbox-list", 0),
        (&["session", "list"], "session-list", 0),
        (&["egress", "status"], "egress-status", 0),
        (&["config", "check"], "config-check", 0),
        (&["reconcile", "--dry-run"], "reconcile", 0),
        (&["reconcile"], "reconcile", 0),
    ] {
        let run = json(args);
        assert_eq!(run.code, code, "{args:?}: {run:?}");
        let doc = document(&run, schema_name);
        assert!(doc.get("error").is_none(), "{args:?}: {doc}");
    }
    let applied = document(&json(&["reconcile"]), "reconcile");
    assert_eq!(applied["dry_run"], false);
    assert_eq!(applied["results"], serde_json::json!([]));
    assert_eq!(applied["converged"], true);
    let status = document(&json(&["status"]), "status");
    // No proxy/ yet: not set up, whatever the config says.
    assert_eq!(status["proxy"]["set_up"], false, "{status}");
    assert!(status["container_disk"]["enforced"].is_boolean());
    let egress = document(&json(&["egress", "status"]), "egress-status");
    assert_eq!(
        egress["process"],
        serde_json::json!({"state": "not_running", "pid": null})
    );
    assert_eq!(egress["listening"], serde_json::json!([]));
    // A background process, listed and killed; an unknown one, an error.
    let started = home.run(["exec", "--background", "--", "sleep 300"]);
    assert_eq!(started.code, 0, "{started:?}");
    let id = started.stdout.trim_end();
    let list = document(&json(&["process", "list"]), "process-list");
    assert_eq!(list["running"], true, "{list}");
    assert_eq!(list["processes"][0]["id"], id, "{list}");
    assert_eq!(list["processes"][0]["state"], "running", "{list}");
    assert!(list["processes"][0]["pid"].is_u64(), "{list}");
    let killed = document(&json(&["process", "kill", id]), "process-kill");
    assert_eq!(killed["result"], "killed", "{killed}");
    let unknown = json(&["process", "kill", "0badc0de"]);
    assert_eq!(unknown.code, 1, "{unknown:?}");
    document(&unknown, "error");
}

#[test]
fn errors_are_documents_with_the_command_s_exit_code() {
    let home = TestHome::new();
    home.write_config("terminal:\n  backend: local\n  timeout: -5\n");
    // An invalid config: config check lists the error with its place.
    let check = home.run(["config", "check", "--output", "json"]);
    assert_eq!(check.code, 1, "{check:?}");
    let doc = document(&check, "config-check");
    assert_eq!(doc["valid"], false);
    assert_eq!(doc["errors"][0]["path"], "terminal.timeout");
    assert_eq!(doc["errors"][0]["line"], 3);
    // A dry run stops at it: an error document, exit 1.
    let dry = home.run(["reconcile", "--dry-run", "--output", "json"]);
    assert_eq!(dry.code, 1, "{dry:?}");
    let doc = document(&dry, "reconcile");
    assert!(
        doc["error"]["message"]
            .as_str()
            .unwrap()
            .contains("terminal.timeout"),
        "{doc}"
    );
    // A usage error: exit 64, and still one document.
    for args in [
        &["reconcile", "--output", "json", "--no-such-flag"][..],
        &["sandbox", "list", "--output=json", "extra"],
    ] {
        let run = home.run(args);
        assert_eq!(run.code, 64, "{args:?}: {run:?}");
        let doc = document(&run, "error");
        assert!(doc["error"]["message"].is_string(), "{doc}");
    }
    // A key that is not set.
    home.write_config("terminal:\n  backend: local\n");
    let get = home.run(["config", "get", "terminal.nothing", "--output", "json"]);
    assert_eq!(get.code, 1, "{get:?}");
    let doc = document(&get, "error");
    assert!(
        doc["error"]["message"]
            .as_str()
            .unwrap()
            .contains("terminal.nothing"),
        "{doc}"
    );
    // The Docker backend with no engine answering.
    home.write_config("terminal:\n  backend: docker\n");
    for (args, schema_name) in [
        (&["sandbox", "list"][..], "sandbox-list"),
        (&["session", "list"], "session-list"),
        (&["reconcile", "--dry-run"], "reconcile"),
    ] {
        let mut all = args.to_vec();
        all.extend(["--output", "json"]);
        let run: Run = home
            .command(all)
            .env("DOCKER_HOST", "unix:///nonexistent/hermes-json-test.sock")
            .output()
            .unwrap()
            .into();
        assert_ne!(run.code, 0, "{args:?}: {run:?}");
        let doc = document(&run, schema_name);
        assert!(doc.get("error").is_some(), "{args:?}: {doc}");
    }
}

#[test]
fn the_docker_documents_carry_typed_fields_and_an_apply_its_results() {
    let (home, profile, _cleanup) = docker_home("json", "");
    let hermes = |args: &[&str]| {
        let mut all = vec!["--profile", profile.as_str()];
        all.extend_from_slice(args);
        all.extend(["--output", "json"]);
        home.run(all)
    };
    let dry = document(&hermes(&["reconcile", "--dry-run"]), "reconcile");
    assert_eq!(
        (dry["dry_run"].clone(), dry["converged"].clone()),
        (true.into(), false.into())
    );
    let applied = hermes(&["reconcile"]);
    assert_eq!(applied.code, 0, "{applied:?}");
    let applied = document(&applied, "reconcile");
    assert_eq!(applied["converged"], true, "{applied}");
    let results = applied["results"].as_array().unwrap();
    assert_eq!(results.len(), 1, "{applied}");
    assert_eq!(results[0]["action"], "create");
    assert_eq!(results[0]["result"], "done");
    assert_eq!(applied["remaining"]["operations"], serde_json::json!([]));

    let session = home.run([
        "--profile",
        profile.as_str(),
        "exec",
        "--session",
        "js1",
        "--",
        "true",
    ]);
    assert_eq!(session.code, 0, "{session:?}");
    let list = document(&hermes(&["sandbox", "list"]), "sandbox-list");
    assert_eq!(list["backend"], "docker");
    let rows = list["sandboxes"].as_array().unwrap();
    let task = rows
        .iter()
        .find(|r| r["session"].is_null())
        .unwrap_or_else(|| panic!("{list}"));
    assert_eq!(task["spec_matches"], true, "{list}");
    assert_eq!(task["managed"], true, "{list}");
    let in_session = rows
        .iter()
        .find(|r| r["session"] == "js1")
        .unwrap_or_else(|| panic!("{list}"));
    // Not the profile's persistent sandbox: no spec to match.
    assert!(in_session["spec_matches"].is_null(), "{list}");
    let sessions = document(&hermes(&["session", "list"]), "session-list");
    let row = &sessions["sessions"][0];
    assert_eq!(row["session"], "js1", "{sessions}");
    assert!(
        row["idle_seconds"].is_i64() || row["idle_seconds"].is_null(),
        "{sessions}"
    );
    let status = document(&hermes(&["status"]), "status");
    assert_eq!(status["sandboxes"][0]["spec_matches"], true, "{status}");
}
