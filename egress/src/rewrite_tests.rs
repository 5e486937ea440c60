//! The credential rewriter: what is swapped, what is refused, what is kept.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::*;
use crate::tokens::Secret;

const TOKEN: &str = "google-0123456789abcdef0123456789abcdef";
const OTHER: &str = "google-ffffffffffffffffffffffffffffffff";
const KEY: &str = "AIza+real/key=";

fn google(key: Option<&str>) -> Credential {
    Credential::new(
        "google",
        TOKEN,
        key.map(|k| Secret::new(k.to_string())),
        vec![
            Place::Header("x-goog-api-key".into()),
            Place::Query("key".into()),
        ],
        &["generativelanguage.googleapis.com"],
    )
}

fn bearer(token: &str) -> Credential {
    Credential::new(
        "openai",
        token,
        Some(Secret::new("sk-real".into())),
        vec![Place::Bearer],
        &["api.openai.com"],
    )
}

fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for (k, v) in pairs {
        map.append(
            HeaderName::from_bytes(k.as_bytes()).unwrap(),
            HeaderValue::from_str(v).unwrap(),
        );
    }
    map
}

#[test]
fn a_bearer_token_becomes_the_real_key_and_other_headers_stay() {
    let tok = "openai-0123456789abcdef0123456789abcdef";
    let mut h = headers(&[
        ("authorization", &format!("bearer {tok}")),
        ("x-other", "1"),
    ]);
    assert_eq!(inject(&bearer(tok), &mut h, "/v1/chat").unwrap(), None);
    assert_eq!(h["authorization"], "Bearer sk-real");
    assert!(h["authorization"].is_sensitive());
    assert_eq!(h["x-other"], "1");
}

#[test]
fn a_query_key_is_swapped_without_reordering_other_parameters() {
    let mut h = HeaderMap::new();
    let path = format!("/v1/models?alt=sse&key={TOKEN}&b=%20x&c");
    let new = inject(&google(Some(KEY)), &mut h, &path).unwrap().unwrap();
    assert_eq!(new, "/v1/models?alt=sse&key=AIza%2Breal%2Fkey%3D&b=%20x&c");
}

#[test]
fn header_and_query_are_both_swapped_when_both_hold_the_token() {
    let mut h = headers(&[("x-goog-api-key", TOKEN)]);
    let new = inject(&google(Some(KEY)), &mut h, &format!("/v1?key={TOKEN}")).unwrap();
    assert_eq!(h["x-goog-api-key"], KEY);
    assert_eq!(new.unwrap(), "/v1?key=AIza%2Breal%2Fkey%3D");
}

#[test]
fn requests_without_a_valid_token_are_refused() {
    let cred = google(Some(KEY));
    type Case<'a> = (&'a [(&'a str, &'a str)], &'a str, Refusal);
    let cases: &[Case] = &[
        (&[], "/v1", Refusal::NoToken),
        (&[], "/v1?alt=sse", Refusal::NoToken),
        (&[("x-goog-api-key", OTHER)], "/v1", Refusal::BadToken),
        (
            &[("x-goog-api-key", "AIza-a-real-key")],
            "/v1",
            Refusal::BadToken,
        ),
        (
            &[("x-goog-api-key", TOKEN)],
            "/v1?key=wrong",
            Refusal::BadToken,
        ),
        (
            &[("x-goog-api-key", &TOKEN[..TOKEN.len() - 1])],
            "/v1",
            Refusal::BadToken,
        ),
        (
            &[("x-goog-api-key", TOKEN), ("x-goog-api-key", TOKEN)],
            "/v1",
            Refusal::Ambiguous,
        ),
        (
            &[],
            &format!("/v1?key={TOKEN}&key={TOKEN}"),
            Refusal::Ambiguous,
        ),
    ];
    for (pairs, path, want) in cases {
        let mut h = headers(pairs);
        assert_eq!(inject(&cred, &mut h, path), Err(*want), "{pairs:?} {path}");
    }
    let tok = "openai-0123456789abcdef0123456789abcdef";
    for value in ["Basic abc", "Bearer", "Bearer other", tok] {
        let mut h = headers(&[("authorization", value)]);
        assert_eq!(
            inject(&bearer(tok), &mut h, "/"),
            Err(Refusal::BadToken),
            "{value}"
        );
    }
}

#[test]
fn a_valid_token_without_a_real_key_is_refused_as_such() {
    let mut h = headers(&[("x-goog-api-key", TOKEN)]);
    assert_eq!(inject(&google(None), &mut h, "/"), Err(Refusal::NoKey));
}

#[test]
fn a_key_that_cannot_be_a_header_value_is_refused_without_showing_it() {
    let mut h = headers(&[("x-goog-api-key", TOKEN)]);
    assert_eq!(
        inject(&google(Some("bad\nkey")), &mut h, "/"),
        Err(Refusal::KeyUnusable)
    );
}

#[test]
fn percent_encoded_tokens_in_the_query_are_recognised() {
    let encoded = TOKEN.replace('-', "%2D");
    let mut h = HeaderMap::new();
    let new = inject(&google(Some("k")), &mut h, &format!("/?key={encoded}")).unwrap();
    assert_eq!(new.unwrap(), "/?key=k");
}

#[test]
fn logs_see_query_names_but_no_values() {
    assert_eq!(path_without_query_values("/v1"), "/v1");
    assert_eq!(
        path_without_query_values("/v1/x?key=secret&alt=sse&flag"),
        "/v1/x?key=&alt=&flag="
    );
}
