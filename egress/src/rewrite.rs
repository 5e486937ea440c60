//! Credential rewriting: the proxy token in a request's key places becomes
//! the real key. Every place the provider uses that is present must hold
//! exactly this provider's token (compared in constant time), at least one
//! must be present, and nothing else in the request changes: other headers
//! keep their values, other query parameters keep their bytes and order.

use http::HeaderMap;
use http::header::{AUTHORIZATION, HeaderName, HeaderValue};
use subtle::ConstantTimeEq;

use crate::tokens::{Credential, Place};

/// Why a request to a provider's host is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// No key place holds anything: the request would go out bare.
    NoToken,
    /// A key place holds something other than this provider's token.
    BadToken,
    /// A key place appears more than once.
    Ambiguous,
    /// The token is right, but the proxy has no real key for the provider.
    NoKey,
    /// The real key cannot be carried in a header.
    KeyUnusable,
}

impl Refusal {
    /// The word in the refusal header and the access log.
    pub fn reason(self) -> &'static str {
        match self {
            Refusal::NoToken => "no-token",
            Refusal::BadToken => "bad-token",
            Refusal::Ambiguous => "ambiguous-credentials",
            Refusal::NoKey => "no-key",
            Refusal::KeyUnusable => "key-unusable",
        }
    }
}

/// Swaps `cred`'s token for its real key in `headers` and in the query of
/// `path_and_query`. Returns the new path and query when the query
/// changed. On a refusal `headers` may be half rewritten: the request must
/// then be dropped, never sent.
pub fn inject(
    cred: &Credential,
    headers: &mut HeaderMap,
    path_and_query: &str,
) -> Result<Option<String>, Refusal> {
    let mut found = 0usize;
    let mut new_path = None;
    let token = cred.token.as_bytes();
    let key = cred.key.as_ref();
    for place in &cred.places {
        match place {
            Place::Bearer | Place::Header(_) => {
                let name = match place {
                    Place::Bearer => AUTHORIZATION,
                    Place::Header(n) => {
                        HeaderName::from_bytes(n.as_bytes()).map_err(|_| Refusal::BadToken)?
                    }
                    Place::Query(_) | Place::SigV4 => continue,
                };
                let mut values = headers.get_all(&name).iter();
                let Some(value) = values.next() else { continue };
                if values.next().is_some() {
                    return Err(Refusal::Ambiguous);
                }
                let bearer = matches!(place, Place::Bearer);
                let presented = if bearer {
                    bearer_credential(value.as_bytes()).ok_or(Refusal::BadToken)?
                } else {
                    value.as_bytes()
                };
                if !bool::from(presented.ct_eq(token)) {
                    return Err(Refusal::BadToken);
                }
                found += 1;
                let key = key.ok_or(Refusal::NoKey)?.expose();
                let text = if bearer {
                    format!("Bearer {key}")
                } else {
                    key.to_string()
                };
                let mut value = HeaderValue::from_str(&text).map_err(|_| Refusal::KeyUnusable)?;
                value.set_sensitive(true);
                headers.insert(name, value);
            }
            // Signed requests are re-signed by `crate::sigv4`, never here.
            Place::SigV4 => {}
            Place::Query(param) => {
                let (path, query) = match new_path
                    .as_deref()
                    .unwrap_or(path_and_query)
                    .split_once('?')
                {
                    Some((p, q)) => (p.to_string(), q.to_string()),
                    None => continue,
                };
                let mut hits = 0usize;
                let mut pairs = Vec::new();
                for pair in query.split('&') {
                    let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
                    if percent_decode(name.as_bytes()) != param.as_bytes() {
                        pairs.push(pair.to_string());
                        continue;
                    }
                    hits += 1;
                    if !bool::from(percent_decode(value.as_bytes()).as_slice().ct_eq(token)) {
                        return Err(Refusal::BadToken);
                    }
                    let key = key.ok_or(Refusal::NoKey)?.expose();
                    pairs.push(format!("{name}={}", percent_encode(key)));
                }
                match hits {
                    0 => continue,
                    1 => {}
                    _ => return Err(Refusal::Ambiguous),
                }
                found += 1;
                new_path = Some(format!("{path}?{}", pairs.join("&")));
            }
        }
    }
    if found == 0 {
        return Err(Refusal::NoToken);
    }
    Ok(new_path)
}

/// The credential of `Bearer <credential>`, the scheme in any case.
fn bearer_credential(value: &[u8]) -> Option<&[u8]> {
    let (scheme, rest) = value.split_at_checked(7)?;
    if !scheme.eq_ignore_ascii_case(b"bearer ") {
        return None;
    }
    Some(rest.trim_ascii())
}

fn percent_decode(text: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len());
    let mut i = 0;
    while i < text.len() {
        let b = text[i];
        if b == b'%' && i + 2 < text.len() {
            let hex = |c: u8| (c as char).to_digit(16);
            if let (Some(h), Some(l)) = (hex(text[i + 1]), hex(text[i + 2])) {
                out.push((h * 16 + l) as u8);
                i += 3;
                continue;
            }
        }
        out.push(if b == b'+' { b' ' } else { b });
        i += 1;
    }
    out
}

fn percent_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The path with each query value dropped (`/v1?key=&alt=`), for logs.
pub fn path_without_query_values(path_and_query: &str) -> String {
    match path_and_query.split_once('?') {
        None => path_and_query.to_string(),
        Some((path, query)) => {
            let names: Vec<&str> = query
                .split('&')
                .map(|pair| pair.split_once('=').map_or(pair, |(n, _)| n))
                .collect();
            format!("{path}?{}", names.join("=&") + "=")
        }
    }
}

#[cfg(test)]
#[path = "rewrite_tests.rs"]
mod tests;
