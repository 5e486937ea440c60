#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::*;

const COMMENTED: &str = "\
# hermes config — hand-edited
terminal:
  # which backend runs commands
  backend: local   # change me

  timeout: 180
  docker_env:
    A: \"1\"
    B: two  # second

# egress
proxy:
  enabled: false
";

fn s(v: &str) -> Value {
    Value::Str(v.into())
}

#[test]
fn setting_a_scalar_keeps_comments_blank_lines_and_order() {
    let out = set(COMMENTED, "terminal.backend", &s("docker"), false).unwrap();
    assert_eq!(
        out,
        COMMENTED.replace(
            "backend: local   # change me",
            "backend: docker   # change me"
        )
    );
}

#[test]
fn setting_a_new_key_goes_at_the_end_of_its_section() {
    let out = set(COMMENTED, "terminal.docker_image", &s("debian:12"), false).unwrap();
    assert_eq!(
        out,
        COMMENTED.replace(
            "    B: two  # second\n",
            "    B: two  # second\n  docker_image: debian:12\n"
        )
    );
}

#[test]
fn setting_a_new_section_appends_it_after_the_last_key() {
    let out = set(
        COMMENTED,
        "security.redact_secrets",
        &Value::Bool(false),
        false,
    )
    .unwrap();
    assert_eq!(
        out,
        format!("{COMMENTED}security:\n  redact_secrets: false\n")
    );
}

#[test]
fn setting_a_list_replaces_the_whole_value_as_block_lines() {
    let list = Value::Seq(vec![s("/srv:/srv:ro"), s("/data:/data")]);
    let out = set(COMMENTED, "terminal.docker_volumes", &list, false).unwrap();
    assert!(
        out.contains("  docker_volumes:\n    - /srv:/srv:ro\n    - /data:/data\n"),
        "{out}"
    );
    let map = Value::Map(vec![("C".into(), s("3"))]);
    let out = set(COMMENTED, "terminal.docker_env", &map, false).unwrap();
    assert_eq!(
        out,
        COMMENTED.replace("    A: \"1\"\n    B: two  # second\n", "    C: \"3\"\n")
    );
}

#[test]
fn setting_into_an_empty_file_writes_the_nested_key() {
    assert_eq!(
        set("", "terminal.backend", &s("docker"), false).unwrap(),
        "terminal:\n  backend: docker\n"
    );
    assert_eq!(
        set("# only a comment", "terminal.backend", &s("docker"), false).unwrap(),
        "# only a comment\nterminal:\n  backend: docker\n"
    );
}

#[test]
fn setting_under_an_empty_section_fills_it() {
    assert_eq!(
        set(
            "terminal:\nproxy:\n  enabled: true\n",
            "terminal.backend",
            &s("docker"),
            false
        )
        .unwrap(),
        "terminal:\n  backend: docker\nproxy:\n  enabled: true\n"
    );
    assert_eq!(
        set(
            "terminal:  # mine\n",
            "terminal.timeout",
            &Value::Int(5),
            false
        )
        .unwrap(),
        "terminal:\n  timeout: 5\n"
    );
}

#[test]
fn a_value_on_a_key_with_only_a_comment_keeps_the_comment() {
    assert_eq!(
        set(
            "terminal:\n  backend:   # pick one\n",
            "terminal.backend",
            &s("ssh"),
            false
        )
        .unwrap(),
        "terminal:\n  backend: ssh # pick one\n"
    );
}

#[test]
fn a_file_without_a_final_newline_stays_well_formed() {
    assert_eq!(
        set(
            "terminal:\n  backend: local",
            "terminal.timeout",
            &Value::Int(9),
            false
        )
        .unwrap(),
        "terminal:\n  backend: local\n  timeout: 9\n"
    );
    assert_eq!(
        set(
            "terminal:\n  backend: local",
            "terminal.backend",
            &s("docker"),
            false
        )
        .unwrap(),
        "terminal:\n  backend: docker"
    );
}

#[test]
fn quoted_values_and_multibyte_text_are_replaced_exactly() {
    let text = "terminal:\n  cwd: \"/home/ü ser\"  # x\n";
    assert_eq!(
        set(text, "terminal.cwd", &s("/tmp/é"), false).unwrap(),
        "terminal:\n  cwd: /tmp/é  # x\n"
    );
}

#[test]
fn strings_that_look_like_other_types_are_quoted() {
    let out = set("", "terminal.cwd", &s("true"), false).unwrap();
    assert_eq!(out, "terminal:\n  cwd: \"true\"\n");
}

#[test]
fn replacing_a_section_with_a_scalar_needs_force() {
    let e = set(COMMENTED, "terminal", &s("docker"), false).unwrap_err();
    assert_eq!(
        e,
        EditError::ReplacesSection {
            key: "terminal".into(),
            line: 2
        }
    );
    let out = set(COMMENTED, "terminal", &s("docker"), true).unwrap();
    assert!(
        out.starts_with("# hermes config — hand-edited\nterminal: docker\n\n# egress\n"),
        "{out}"
    );
}

#[test]
fn descending_through_a_scalar_needs_force() {
    let e = set("terminal: x\n", "terminal.backend", &s("docker"), false).unwrap_err();
    assert!(matches!(e, EditError::NotAMapping { line: 1, .. }), "{e}");
    assert_eq!(
        set("terminal: x\n", "terminal.backend", &s("docker"), true).unwrap(),
        "terminal:\n  backend: docker\n"
    );
}

#[test]
fn flow_style_sections_are_refused_not_mangled() {
    let e = set(
        "terminal: {backend: local}\n",
        "terminal.backend",
        &s("docker"),
        false,
    )
    .unwrap_err();
    assert!(matches!(e, EditError::FlowStyle { line: 1, .. }), "{e}");
}

#[test]
fn unset_removes_the_key_and_its_block_only() {
    let out = unset(COMMENTED, "terminal.docker_env").unwrap().unwrap();
    assert_eq!(
        out,
        COMMENTED.replace("  docker_env:\n    A: \"1\"\n    B: two  # second\n", "")
    );
    let out = unset(COMMENTED, "terminal.backend").unwrap().unwrap();
    assert_eq!(
        out,
        COMMENTED.replace("  backend: local   # change me\n", "")
    );
    assert_eq!(unset(COMMENTED, "terminal.nope").unwrap(), None);
    assert_eq!(unset("", "terminal.backend").unwrap(), None);
}

#[test]
fn unset_of_a_section_s_last_key_removes_the_emptied_sections_up_to_the_top() {
    let text =
        "# mine\nterminal:\n  backend: docker\nproxy:\n  resolve:\n    a.example: 10.0.0.1\n";
    assert_eq!(
        unset(text, "terminal.backend").unwrap().unwrap(),
        "# mine\nproxy:\n  resolve:\n    a.example: 10.0.0.1\n"
    );
    assert_eq!(
        unset(text, "proxy.resolve.\"a.example\"").unwrap().unwrap(),
        "# mine\nterminal:\n  backend: docker\n"
    );
    // A section with other keys stays.
    let two = "terminal:\n  backend: docker\n  timeout: 5\n";
    assert_eq!(
        unset(two, "terminal.backend").unwrap().unwrap(),
        "terminal:\n  timeout: 5\n"
    );
}

#[test]
fn unset_of_a_block_scalar_removes_all_its_lines() {
    let text = "a: |\n  one\n  two\nb: 1\n";
    assert_eq!(unset(text, "a").unwrap().unwrap(), "b: 1\n");
}

#[test]
fn set_then_unset_round_trips_to_the_original() {
    let with = set(COMMENTED, "proxy.tunnel_port", &Value::Int(9191), false).unwrap();
    assert_eq!(
        unset(&with, "proxy.tunnel_port").unwrap().unwrap(),
        COMMENTED
    );
}

#[test]
fn set_values_are_coerced_by_the_key_type() {
    use crate::schema::lookup;
    let ty = |k: &str| lookup(k).map(|s| s.ty);
    assert_eq!(
        coerce("docker", ty("terminal.backend")).unwrap(),
        s("docker")
    );
    assert_eq!(
        coerce("123", ty("terminal.docker_image")).unwrap(),
        s("123")
    );
    assert_eq!(
        coerce("yes", ty("terminal.docker_network")).unwrap(),
        Value::Bool(true)
    );
    assert_eq!(coerce("Off", None).unwrap(), Value::Bool(false));
    assert_eq!(
        coerce("none", ty("terminal.ssh_host")).unwrap(),
        Value::Null
    );
    assert_eq!(
        coerce("box.local", ty("terminal.ssh_host")).unwrap(),
        s("box.local")
    );
    assert_eq!(
        coerce("300", ty("terminal.timeout")).unwrap(),
        Value::Int(300)
    );
    assert_eq!(
        coerce("1.5", ty("terminal.container_cpu")).unwrap(),
        Value::Float(1.5)
    );
    assert_eq!(coerce("2.0", None).unwrap(), Value::Float(2.0));
    assert_eq!(
        coerce("0.10000000000000000001", None).unwrap(),
        s("0.10000000000000000001")
    );
    assert_eq!(
        coerce("[/a:/b, /c:/d]", ty("terminal.docker_volumes")).unwrap(),
        Value::Seq(vec![s("/a:/b"), s("/c:/d")])
    );
    assert_eq!(
        coerce("{A: 1}", ty("terminal.docker_env")).unwrap(),
        Value::Map(vec![("A".into(), Value::Int(1))])
    );
    assert!(coerce("[unclosed", None).is_err());
}

#[test]
fn keys_holding_dots_are_quoted_in_the_path_and_round_trip() {
    let path = "proxy.resolve.\"api.openai.com\"";
    let out = set(COMMENTED, path, &s("127.0.0.1"), false).unwrap();
    assert!(
        out.ends_with("proxy:\n  enabled: false\n  resolve:\n    api.openai.com: 127.0.0.1\n"),
        "{out}"
    );
    let root = yaml::parse(&out).unwrap().unwrap().to_value();
    assert_eq!(root.get_path(path), Some(&s("127.0.0.1")));
    // A second host lands beside the first; the first is changed in place.
    let two = set(&out, "proxy.resolve.\"b.example\"", &s("10.0.0.2"), false).unwrap();
    let two = set(&two, path, &s("10.0.0.1"), false).unwrap();
    assert!(
        two.ends_with("  resolve:\n    api.openai.com: 10.0.0.1\n    b.example: 10.0.0.2\n"),
        "{two}"
    );
    let back = unset(&two, "proxy.resolve.\"b.example\"").unwrap().unwrap();
    let back = unset(&back, path).unwrap().unwrap();
    // The emptied `resolve:` goes with its last host.
    assert_eq!(back, COMMENTED);
    // Unquoted, the dots are separators: another key, not this one.
    assert_eq!(unset(&out, "proxy.resolve.api.openai.com").unwrap(), None);
    assert!(matches!(
        set(COMMENTED, "proxy.resolve.\"api", &s("x"), false),
        Err(EditError::Path(_))
    ));
}
