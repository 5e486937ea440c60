//! `state.json`: what the running daemon writes about itself (its pid,
//! where it listens, the fingerprint of the settings it loaded) for
//! `hermes egress start`, `status` and the proxy planner.
//!
//! The file carries a `version`; a reader refuses a version it does not
//! know, naming the file, rather than guessing at its fields. A file with
//! no `version` was written by an older hermes and is refused the same
//! way (the daemon that wrote it is restarted by the next pass, which
//! then writes a current one).

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

use super::files::{Paths, SECRET_MODE, read_file, write_file};

/// The version this binary writes and reads.
pub const STATE_VERSION: u32 = 1;

/// The content of `state.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProxyState {
    /// The layout's version: [`STATE_VERSION`].
    #[serde(rename = "version")]
    pub version: u32,
    /// The daemon's process id.
    #[serde(rename = "pid")]
    pub pid: u32,
    /// Where it accepts CONNECT.
    #[serde(rename = "tunnel")]
    pub tunnel: Vec<SocketAddr>,
    /// Where it accepts plain HTTP.
    #[serde(rename = "http")]
    pub http: Vec<SocketAddr>,
    /// Its management endpoint (`GET /health`).
    #[serde(rename = "mgmt")]
    pub mgmt: SocketAddr,
    /// The fingerprint of the files it loaded
    /// ([`super::files::settings_fingerprint`]); `None` when a file was
    /// missing.
    #[serde(rename = "settings")]
    pub settings: Option<String>,
}

/// Why `state.json` cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("cannot read {path}: {reason}")]
    Read { path: String, reason: String },
    #[error("{path} is not a proxy state file: {reason}")]
    Malformed { path: String, reason: String },
    #[error(
        "{path} has no version (written by an older hermes); this hermes reads version {STATE_VERSION}"
    )]
    NoVersion { path: String },
    #[error("{path} has version {found}; this hermes reads version {STATE_VERSION}")]
    UnknownVersion { path: String, found: u64 },
}

/// Just the version, read first so that another layout is named as such.
#[derive(Deserialize)]
struct Envelope {
    #[serde(rename = "version")]
    version: Option<serde_json::Value>,
}

impl ProxyState {
    /// Parses the bytes of the state file at `path` (named in errors).
    pub fn parse(bytes: &[u8], path: &str) -> Result<ProxyState, StateError> {
        let malformed = |e: serde_json::Error| StateError::Malformed {
            path: path.to_string(),
            reason: e.to_string(),
        };
        let envelope: Envelope = serde_json::from_slice(bytes).map_err(malformed)?;
        match envelope.version {
            None => Err(StateError::NoVersion {
                path: path.to_string(),
            }),
            Some(v) if v.as_u64() == Some(u64::from(STATE_VERSION)) => {
                serde_json::from_slice(bytes).map_err(malformed)
            }
            Some(v) => match v.as_u64() {
                Some(found) => Err(StateError::UnknownVersion {
                    path: path.to_string(),
                    found,
                }),
                None => Err(StateError::Malformed {
                    path: path.to_string(),
                    reason: format!("version is {v}, not a number"),
                }),
            },
        }
    }

    /// The file's text.
    pub fn render(&self) -> String {
        // A struct of strings and numbers always serializes.
        let text = serde_json::to_string_pretty(self).unwrap_or_default();
        format!("{text}\n")
    }

    /// Where it accepts CONNECT, joined for a person.
    pub fn tunnel_list(&self) -> String {
        join(&self.tunnel)
    }
}

/// `addrs` joined with `, `.
pub fn join(addrs: &[SocketAddr]) -> String {
    addrs
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// The state file, `Ok(None)` when there is none.
pub(crate) fn read(paths: &Paths) -> Result<Option<ProxyState>, StateError> {
    let path = paths.state();
    let shown = path.display().to_string();
    let bytes = read_file(&path).map_err(|e| StateError::Read {
        path: shown.clone(),
        reason: format!("{e:#}"),
    })?;
    bytes
        .map(|bytes| ProxyState::parse(&bytes, &shown))
        .transpose()
}

/// Writes the state file (0600).
pub(crate) fn write(paths: &Paths, state: &ProxyState) -> anyhow::Result<()> {
    write_file(&paths.state(), state.render().as_bytes(), SECRET_MODE)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn state() -> ProxyState {
        ProxyState {
            version: STATE_VERSION,
            pid: 42,
            tunnel: vec!["127.0.0.1:8080".parse().unwrap()],
            http: vec!["127.0.0.1:8081".parse().unwrap()],
            mgmt: "127.0.0.1:40000".parse().unwrap(),
            settings: Some("abc".into()),
        }
    }

    #[test]
    fn a_written_state_reads_back_with_its_field_names() {
        let text = state().render();
        let value: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(value["version"], 1);
        assert_eq!(value["pid"], 42);
        assert_eq!(value["tunnel"][0], "127.0.0.1:8080");
        assert_eq!(value["mgmt"], "127.0.0.1:40000");
        assert_eq!(value["settings"], "abc");
        assert_eq!(ProxyState::parse(text.as_bytes(), "s").unwrap(), state());
    }

    #[test]
    fn an_unknown_version_is_named() {
        let text = state().render().replace("\"version\": 1", "\"version\": 7");
        let err = ProxyState::parse(text.as_bytes(), "/h/proxy/state.json").unwrap_err();
        assert_eq!(
            err.to_string(),
            "/h/proxy/state.json has version 7; this hermes reads version 1"
        );
    }

    #[test]
    fn a_file_without_version_is_refused_as_older() {
        let old =
            r#"{"pid": 42, "tunnel": [], "http": [], "mgmt": "127.0.0.1:1", "settings": null}"#;
        let err = ProxyState::parse(old.as_bytes(), "state.json").unwrap_err();
        assert!(matches!(err, StateError::NoVersion { .. }), "{err}");
        assert!(err.to_string().contains("older hermes"), "{err}");
    }

    #[test]
    fn a_malformed_file_says_what_is_wrong() {
        let bad = r#"{"version": 1, "pid": "x"}"#;
        let err = ProxyState::parse(bad.as_bytes(), "state.json").unwrap_err();
        assert!(matches!(err, StateError::Malformed { .. }), "{err}");
        assert!(err.to_string().starts_with("state.json is not"), "{err}");
    }
}
