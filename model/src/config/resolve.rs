//! A `proxy.resolve` entry whose address the proxy refuses to dial: one in
//! the upstream deny list (`proxy.upstream_deny_cidrs`, or
//! [`DEFAULT_UPSTREAM_DENY`] when it is not set), or no unicast address at
//! all. Every request to that host would be refused, so the config loads
//! with a warning naming the entry and the range.
//!
//! Pure: the list is the config's own or the built-in one.

use std::net::IpAddr;

use ipnet::IpNet;

use crate::config::{Config, Issue};
use crate::yaml::Node;

/// The ranges the egress proxy refuses when `proxy.upstream_deny_cidrs` is
/// not set (the proxy's `hermes_egress::policy::DEFAULT_DENY` is this list).
pub const DEFAULT_UPSTREAM_DENY: &[&str] = &[
    "0.0.0.0/8",
    "10.0.0.0/8",
    "100.64.0.0/10",
    "127.0.0.0/8",
    "169.254.0.0/16",
    "172.16.0.0/12",
    "192.168.0.0/16",
    "198.18.0.0/15",
    "224.0.0.0/4",
    "240.0.0.0/4",
    "::/128",
    "::1/128",
    "::ffff:0:0/96",
    "64:ff9b::/96",
    "64:ff9b:1::/48",
    "2001::/32",
    "2002::/16",
    "fc00::/7",
    "fe80::/10",
    "ff00::/8",
];

/// Adds a warning for each `proxy.resolve` entry the proxy would refuse.
pub fn check(root: &Node, config: &Config, warnings: &mut Vec<Issue>) {
    let Some(entries) = root
        .get("proxy")
        .and_then(|p| p.value.get("resolve"))
        .and_then(|r| r.value.entries())
    else {
        return;
    };
    let default: Vec<IpNet> = DEFAULT_UPSTREAM_DENY
        .iter()
        .filter_map(|n| n.parse().ok())
        .collect();
    let (deny, which) = match &config.proxy.upstream_deny_cidrs {
        Some(nets) => (
            nets.as_slice(),
            crate::schema_key!("proxy.upstream_deny_cidrs").path,
        ),
        None => (default.as_slice(), "the built-in upstream deny list"),
    };
    for entry in entries {
        let Some(addr) = config
            .proxy
            .resolve
            .iter()
            .find(|(host, _)| *host == entry.key.to_ascii_lowercase())
            .map(|(_, addr)| *addr)
        else {
            continue;
        };
        let Some(why) = refused(addr, deny, which) else {
            continue;
        };
        warnings.push(Issue {
            path: crate::keypath::join(crate::schema_key!("proxy.resolve").path, &entry.key),
            pos: Some(entry.value.start),
            message: format!(
                "{addr} {why}: every request to {} would be refused",
                entry.key
            ),
        });
    }
}

/// Why the proxy would not dial `addr`, if it would not.
fn refused(addr: IpAddr, deny: &[IpNet], which: &str) -> Option<String> {
    let canonical = addr.to_canonical();
    let unicast = match canonical {
        IpAddr::V4(v4) => !(v4.is_unspecified() || v4.is_multicast() || v4.is_broadcast()),
        IpAddr::V6(v6) => !(v6.is_unspecified() || v6.is_multicast()),
    };
    if !unicast {
        return Some("is not a unicast address".to_string());
    }
    deny.iter()
        .find(|net| net.contains(&addr) || net.contains(&canonical))
        .map(|net| format!("lies in {net} of {which}"))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use crate::config::load;

    fn warnings(text: &str) -> Vec<String> {
        load(text)
            .unwrap()
            .warnings
            .iter()
            .map(|w| w.render("config.yaml"))
            .collect()
    }

    #[test]
    fn an_entry_into_the_builtin_deny_list_is_warned_about_with_its_line() {
        let w = warnings(
            "proxy:\n  resolve:\n    api.openai.com: 10.1.2.3\n    ok.example.com: 93.184.216.34\n",
        );
        assert_eq!(
            w,
            vec![
                "config.yaml:3:21: proxy.resolve.\"api.openai.com\": 10.1.2.3 lies in 10.0.0.0/8 \
                 of the built-in upstream deny list: every request to api.openai.com would be refused"
            ]
        );
    }

    #[test]
    fn the_configured_list_replaces_the_builtin_one() {
        let text = "proxy:\n  upstream_deny_cidrs: [203.0.113.0/24]\n  resolve:\n    a.example: 10.1.2.3\n    b.example: 203.0.113.9\n";
        let w = warnings(text);
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(
            w[0].contains("203.0.113.9 lies in 203.0.113.0/24 of proxy.upstream_deny_cidrs"),
            "{w:?}"
        );
    }

    #[test]
    fn mapped_and_non_unicast_addresses_are_caught() {
        let w = warnings("proxy:\n  resolve:\n    a.example: \"::ffff:127.0.0.1\"\n");
        assert_eq!(w.len(), 1, "{w:?}");
        let w = warnings(
            "proxy:\n  upstream_deny_cidrs: []\n  resolve:\n    a.example: 255.255.255.255\n",
        );
        assert!(w[0].contains("is not a unicast address"), "{w:?}");
    }
}
