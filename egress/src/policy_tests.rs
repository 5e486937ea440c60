//! The address classification corpus: every default deny range at its
//! edges, IPv4 embedded in IPv6, the spellings resolvers accept, and the
//! allowlist.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::*;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Want {
    /// Parses and may be dialled.
    Allow,
    /// Parses and lies in a deny range (or is no unicast destination).
    Deny,
    /// Is not a host at all.
    Invalid,
}
use Want::{Allow, Deny, Invalid};

/// (host as a client would write it, expected verdict under the default list)
const CORPUS: &[(&str, Want)] = &[
    // 0.0.0.0/8 and the unspecified address
    ("0.0.0.0", Deny),
    ("0", Deny),
    ("0.255.255.255", Deny),
    ("1.0.0.0", Allow),
    // 10/8 at both edges and just outside
    ("9.255.255.255", Allow),
    ("10.0.0.0", Deny),
    ("10.255.255.255", Deny),
    ("11.0.0.0", Allow),
    // 100.64/10 (CGNAT)
    ("100.63.255.255", Allow),
    ("100.64.0.0", Deny),
    ("100.127.255.255", Deny),
    ("100.128.0.0", Allow),
    // 127/8
    ("126.255.255.255", Allow),
    ("127.0.0.0", Deny),
    ("127.0.0.1", Deny),
    ("127.255.255.255", Deny),
    ("128.0.0.0", Allow),
    // 169.254/16, cloud metadata
    ("169.253.255.255", Allow),
    ("169.254.0.0", Deny),
    ("169.254.169.254", Deny),
    ("169.254.255.255", Deny),
    ("169.255.0.0", Allow),
    // 172.16/12
    ("172.15.255.255", Allow),
    ("172.16.0.0", Deny),
    ("172.31.255.255", Deny),
    ("172.32.0.0", Allow),
    // 192.168/16
    ("192.167.255.255", Allow),
    ("192.168.0.0", Deny),
    ("192.168.255.255", Deny),
    ("192.169.0.0", Allow),
    // 198.18/15 (benchmarking)
    ("198.17.255.255", Allow),
    ("198.18.0.0", Deny),
    ("198.19.255.255", Deny),
    ("198.20.0.0", Allow),
    // multicast, reserved, broadcast
    ("223.255.255.255", Allow),
    ("224.0.0.0", Deny),
    ("239.255.255.255", Deny),
    ("240.0.0.0", Deny),
    ("255.255.255.255", Deny),
    // public addresses
    ("8.8.8.8", Allow),
    ("104.18.2.115", Allow),
    // the spellings resolvers accept
    ("127.1", Deny),
    ("127.0.1", Deny),
    ("0177.0.0.1", Deny),
    ("0x7f.0.0.1", Deny),
    ("0x7f000001", Deny),
    ("2130706433", Deny),
    ("017700000001", Deny),
    ("0xA9.0xFE.0xA9.0xFE", Deny),
    ("169.254.43518", Deny),
    ("2852039166", Deny),
    ("10.1", Deny),
    ("0x08080808", Allow),
    ("134744072", Allow),
    ("127.0.0.1.", Deny),
    // not addresses, not names
    ("1.2.3.256", Invalid),
    ("256.0.0.1", Invalid),
    ("4294967296", Invalid),
    ("0x1g.0.0.1", Invalid),
    ("08.0.0.1", Invalid),
    ("1.2.3.4.5", Invalid),
    ("", Invalid),
    ("[::1", Invalid),
    ("fe80::1%eth0", Invalid),
    ("bad_host!.com", Invalid),
    ("-leading.example.com", Invalid),
    // IPv6 ranges at their edges
    ("::", Deny),
    ("[::]", Deny),
    ("::1", Deny),
    ("[::1]", Deny),
    ("::2", Deny), // IPv4-compatible 0.0.0.2
    ("fbff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", Allow),
    ("fc00::", Deny),
    ("fdff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", Deny),
    ("fe00::", Allow),
    ("fe7f:ffff:ffff:ffff:ffff:ffff:ffff:ffff", Allow),
    ("fe80::", Deny),
    ("febf:ffff:ffff:ffff:ffff:ffff:ffff:ffff", Deny),
    ("fec0::", Allow),
    ("ff02::1", Deny),
    ("2606:4700::6810:273", Allow),
    // IPv4-mapped and -compatible
    ("::ffff:127.0.0.1", Deny),
    ("[::ffff:169.254.169.254]", Deny),
    ("::ffff:a9fe:a9fe", Deny),
    ("::ffff:10.0.0.1", Deny),
    ("::ffff:8.8.8.8", Deny),
    ("::127.0.0.1", Deny),
    // NAT64, 6to4, Teredo
    ("64:ff9b::a9fe:a9fe", Deny),
    ("64:ff9b::808:808", Deny),
    ("64:ff9b:1::7f00:1", Deny),
    ("2002:7f00:1::", Deny),
    ("2002:808:808::", Deny),
    ("2001:0:4136:e378:8000:63bf:3fff:fdd2", Deny),
    ("2001:db8::1", Allow),
    // names (classified by their resolved addresses, tested below)
    ("api.openai.com", Allow),
    ("API.OpenAI.com.", Allow),
];

fn verdict(list: &DenyList, text: &str) -> Want {
    match parse_host(text) {
        Err(_) => Invalid,
        Ok(Host::Name(_)) => Allow,
        Ok(Host::Ip(ip)) => match list.check(ip) {
            Ok(()) => Allow,
            Err(_) => Deny,
        },
    }
}

#[test]
fn the_classification_corpus_holds_under_the_default_list() {
    assert!(CORPUS.len() >= 60, "{} cases", CORPUS.len());
    let list = DenyList::default();
    let wrong: Vec<String> = CORPUS
        .iter()
        .filter(|(text, want)| verdict(&list, text) != *want)
        .map(|(text, want)| format!("{text:?}: want {want:?}, got {:?}", verdict(&list, text)))
        .collect();
    assert!(wrong.is_empty(), "misclassified:\n{}", wrong.join("\n"));
}

#[test]
fn every_default_range_parses() {
    assert_eq!(DenyList::default().nets().len(), DEFAULT_DENY.len());
}

#[test]
fn spellings_of_loopback_all_parse_to_one_address() {
    for text in [
        "127.0.0.1",
        "127.1",
        "0177.1",
        "0x7f.0.0.1",
        "2130706433",
        "0x7F000001",
    ] {
        assert_eq!(
            parse_host(text).unwrap(),
            Host::Ip(IpAddr::V4(Ipv4Addr::LOCALHOST)),
            "{text}"
        );
    }
}

#[test]
fn a_replaced_list_still_refuses_embedded_and_non_unicast_addresses() {
    let list = DenyList::new(vec!["169.254.0.0/16".parse().unwrap()]);
    assert_eq!(verdict(&list, "127.0.0.1"), Allow);
    assert_eq!(verdict(&list, "::ffff:169.254.169.254"), Deny);
    assert_eq!(verdict(&list, "64:ff9b::a9fe:a9fe"), Deny);
    assert_eq!(verdict(&list, "2002:a9fe:a9fe::"), Deny);
    assert_eq!(verdict(&list, "0.0.0.0"), Deny);
    assert_eq!(verdict(&list, "::"), Deny);
    assert_eq!(verdict(&list, "224.0.0.1"), Deny);
    assert_eq!(verdict(&list, "255.255.255.255"), Deny);
    assert_eq!(verdict(&list, "10.0.0.1"), Allow);
}

#[test]
fn a_denial_names_the_range() {
    let err = DenyList::default()
        .check("169.254.169.254".parse().unwrap())
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "169.254.169.254 lies in the denied range 169.254.0.0/16"
    );
}

#[test]
fn names_are_lowercased_and_lose_one_trailing_dot() {
    assert_eq!(
        parse_host("API.OpenAI.com.").unwrap(),
        Host::Name("api.openai.com".into())
    );
    assert_eq!(parse_host("a..b").unwrap_err(), HostError::BadName);
    assert_eq!(
        parse_host(&"a".repeat(254)).unwrap_err(),
        HostError::TooLong
    );
}

#[test]
fn the_allowlist_matches_exact_names_and_wildcards_below_a_domain() {
    let list = Allowlist::with_defaults(&["*.example.com", "Other.Test", "10.1.2.3"]);
    let allows = |text: &str| list.allows(&parse_host(text).unwrap());
    assert!(allows("api.openai.com"));
    assert!(allows("openrouter.ai"));
    assert!(allows("eu.openrouter.ai"));
    assert!(allows("a.b.example.com"));
    assert!(allows("other.test"));
    assert!(allows("10.1.2.3"));
    assert!(
        allows("012.1.2.3"),
        "the octal spelling of an allowed literal"
    );
    assert!(!allows("example.com"), "a wildcard does not match its apex");
    assert!(!allows("evilexample.com"));
    assert!(!allows("api.openai.com.evil.test"));
    assert!(!allows("openai.com"));
    assert!(!allows("127.0.0.1"));
    assert!(!allows("::1"));
    assert!(!Allowlist::with_defaults::<&str>(&[]).allows(&parse_host("example.com").unwrap()));
}

#[test]
fn a_dash_wildcard_matches_one_first_label_ending_in_its_rest() {
    let list = Allowlist::exactly(&["*-aiplatform.googleapis.com"]);
    let allows = |text: &str| list.allows(&parse_host(text).unwrap());
    assert!(allows("us-central1-aiplatform.googleapis.com"));
    assert!(!allows("aiplatform.googleapis.com"));
    assert!(!allows("a.b-aiplatform.googleapis.com"));
    assert!(!allows("evil-aiplatform.googleapis.com.evil.test"));
    assert_eq!(list.patterns(), ["*-aiplatform.googleapis.com"]);
}
