//! The bodies of the fuzz targets, here so that the fuzzer (`egress/fuzz`,
//! nightly, `cargo fuzz run`) and the stable test suite (which replays the
//! corpus and thousands of generated inputs) drive the very same code.
//! Each function panics when an invariant breaks; any input is fair.

use http::HeaderMap;
use http::header::{HeaderName, HeaderValue};

use crate::policy::Host;
use crate::rewrite::{Refusal, inject, path_without_query_values};
use crate::target::{host_header_matches, parse_absolute, parse_authority, parse_connect};
use crate::tokens::{Credential, Place, Secret};

/// The request-line and CONNECT parser: a request line
/// (`METHOD TARGET HTTP/1.1`) or a bare target, through every parser a
/// client's words reach. A target that parses prints back to itself, and
/// names no host a resolver would read differently.
pub fn request_target(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let target_text = match text.split(' ').collect::<Vec<_>>().as_slice() {
        [_method, target, _version] => *target,
        _ => text,
    };
    if let Ok(target) = parse_connect(target_text) {
        assert_ne!(target.port, 0);
        let again = parse_connect(&target.to_string());
        assert_eq!(again.as_ref(), Ok(&target), "{target} does not re-parse");
        assert!(host_header_matches(&target.to_string(), &target));
        if let Host::Name(name) = &target.host {
            assert!(!name.is_empty() && name.len() <= 253);
            assert!(crate::policy::parse_ipv4_loose(name).is_none());
            assert!(
                name.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
            );
        }
    }
    if let Ok(target) = parse_authority(target_text, Some(443)) {
        assert_ne!(target.port, 0);
    }
    if let Ok(uri) = target_text.parse::<http::Uri>()
        && let Ok((target, path)) = parse_absolute(&uri)
    {
        assert!(path.starts_with('/'));
        assert_ne!(target.port, 0);
    }
}

const TOKEN: &str = "google-0123456789abcdef0123456789abcdef";
const KEY: &str = "AIza-fuzz-key+/=";

/// The credential rewriter: the input is a path and query, then header
/// lines (`name: value`). When the rewriter accepts, no key place holds
/// the token any more, the key is in, and everything else is unchanged;
/// when it refuses, it says why.
pub fn credential_rewrite(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let mut lines = text.split('\n');
    let path = lines.next().unwrap_or("/");
    let mut headers = HeaderMap::new();
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name.trim().as_bytes()),
            HeaderValue::from_str(value.trim()),
        ) else {
            continue;
        };
        headers.append(name, value);
    }
    let cred = Credential::new(
        "google",
        TOKEN,
        Some(Secret::new(KEY.to_string())),
        vec![
            Place::Header("x-goog-api-key".into()),
            Place::Bearer,
            Place::Query("key".into()),
        ],
        &["generativelanguage.googleapis.com"],
    );
    let before = headers.clone();
    let mut after = headers;
    match inject(&cred, &mut after, path) {
        Ok(new_path) => {
            for name in ["x-goog-api-key", "authorization"] {
                for value in after.get_all(name) {
                    let value = value.to_str().unwrap_or_default();
                    assert!(!value.contains(TOKEN), "{name} still holds the token");
                    assert!(value.ends_with(KEY), "{name} lacks the key");
                }
            }
            for name in before.keys() {
                if name != "x-goog-api-key" && name != "authorization" {
                    let was: Vec<_> = before.get_all(name).iter().collect();
                    let is: Vec<_> = after.get_all(name).iter().collect();
                    assert_eq!(was, is, "{name} changed");
                }
            }
            if let Some(new_path) = &new_path {
                // The token may stand in other parameters (it is no secret);
                // the key parameter holds the key.
                let query = new_path.split_once('?').map_or("", |(_, q)| q);
                for pair in query.split('&') {
                    if let Some(value) = pair.strip_prefix("key=") {
                        assert_eq!(value, "AIza-fuzz-key%2B%2F%3D");
                    }
                }
                assert_eq!(
                    new_path.split('?').next(),
                    path.split('?').next(),
                    "the path changed"
                );
                assert_eq!(
                    path_without_query_values(new_path),
                    path_without_query_values(path),
                    "query parameters were reordered"
                );
            }
        }
        Err(refusal) => {
            assert!(!refusal.reason().is_empty());
            if refusal == Refusal::NoToken {
                assert!(!before.contains_key("x-goog-api-key"));
            }
        }
    }
}
