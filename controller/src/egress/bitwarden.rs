//! Bitwarden Secrets Manager as the source of the real keys
//! (`proxy.credential_source: bitwarden`): `bws secret list [PROJECT]
//! --output json` run with the machine account's `BWS_ACCESS_TOKEN` (and
//! `BWS_SERVER_URL`, when set) from the environment or `.env`, its JSON
//! array of secrets (`key` the variable name, `value` the key) read from a
//! pipe into memory only, never written anywhere. Read by `egress setup`
//! (which fails with the reason) and by the proxy when it starts and on
//! each reload (a failed read keeps the keys it holds).

use std::collections::BTreeMap;
use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use hermes_model::desired::HostEnv;
use serde::Deserialize;
use zeroize::Zeroizing;

/// The value of `proxy.credential_source` that selects this source.
pub const SOURCE: &str = "bitwarden";

/// How long `bws` may take.
const TIMEOUT: Duration = Duration::from_secs(30);
/// The most of `bws`'s output read.
const MAX_OUTPUT: u64 = 4 * 1024 * 1024;

/// The variable holding the machine account's access token.
pub const TOKEN_VARIABLE: &str = "BWS_ACCESS_TOKEN";

/// Why the keys could not be read from Bitwarden.
#[derive(Debug, thiserror::Error)]
pub enum BitwardenError {
    #[error(
        "proxy.credential_source is bitwarden, but the `bws` command (Bitwarden Secrets Manager's CLI) is not on PATH"
    )]
    NoBws,
    #[error(
        "proxy.credential_source is bitwarden, but {TOKEN_VARIABLE} is not set (in the environment or the hermes home's .env): bws needs a machine account's access token"
    )]
    NoToken,
    #[error("cannot run bws: {0}")]
    Spawn(std::io::Error),
    #[error("bws secret list did not answer within {} s", TIMEOUT.as_secs())]
    Timeout,
    #[error("bws secret list failed ({status}): {stderr}")]
    Failed { status: String, stderr: String },
    #[error("bws secret list printed no JSON list of secrets: {0}")]
    Json(String),
    #[error("bws secret list returned two different secrets named {0}")]
    Duplicate(String),
}

/// What stops `bws` from being asked, found without asking it (for
/// `config check`): no access token, or no `bws` on `PATH`.
pub fn not_ready(env: &HostEnv) -> Option<String> {
    if env.lookup(TOKEN_VARIABLE).is_none_or(str::is_empty) {
        return Some(BitwardenError::NoToken.to_string());
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    let found = std::env::split_paths(&path).any(|dir| {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(dir.join("bws"))
            .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    });
    (!found).then(|| BitwardenError::NoBws.to_string())
}

/// One secret of `bws secret list`'s JSON (the fields hermes reads).
#[derive(Deserialize)]
struct Secret {
    key: String,
    value: String,
}

/// The secrets of the project (`key` → value), read with `bws` found on
/// `PATH`.
pub fn fetch(
    env: &HostEnv,
    project: Option<&str>,
) -> Result<BTreeMap<String, Zeroizing<String>>, BitwardenError> {
    let token = env
        .lookup(TOKEN_VARIABLE)
        .filter(|t| !t.is_empty())
        .ok_or(BitwardenError::NoToken)?;
    let mut cmd = Command::new("bws");
    cmd.args(["secret", "list"]);
    if let Some(project) = project {
        cmd.arg(project);
    }
    cmd.args(["--output", "json"])
        .env(TOKEN_VARIABLE, token)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(url) = env.lookup("BWS_SERVER_URL") {
        cmd.env("BWS_SERVER_URL", url);
    }
    let mut child = cmd.spawn().map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => BitwardenError::NoBws,
        _ => BitwardenError::Spawn(e),
    })?;
    let (Some(stdout), Some(stderr)) = (child.stdout.take(), child.stderr.take()) else {
        // Both were asked for as pipes just above.
        let _ = child.kill();
        let _ = child.wait();
        return Err(BitwardenError::Spawn(std::io::Error::other("no pipes")));
    };
    let out = std::thread::spawn(move || {
        let mut buf = Zeroizing::new(Vec::new());
        let _ = stdout.take(MAX_OUTPUT).read_to_end(&mut buf);
        buf
    });
    let err = std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = stderr.take(64 * 1024).read_to_end(&mut buf);
        buf
    });
    let deadline = Instant::now() + TIMEOUT;
    let status = loop {
        match child.try_wait().map_err(BitwardenError::Spawn)? {
            Some(status) => break status,
            None if Instant::now() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(BitwardenError::Timeout);
            }
            None => std::thread::sleep(Duration::from_millis(20)),
        }
    };
    let stdout = out.join().unwrap_or_default();
    let stderr = err.join().unwrap_or_default();
    if !status.success() {
        let text = String::from_utf8_lossy(&stderr);
        // Never the access token, whatever bws prints.
        let text = text.replace(token, "[redacted]");
        let mut text = text.trim().to_string();
        if text.len() > 500 {
            let mut cut = 500;
            while !text.is_char_boundary(cut) {
                cut -= 1;
            }
            text.truncate(cut);
            text.push('…');
        }
        return Err(BitwardenError::Failed {
            status: status.to_string(),
            stderr: text,
        });
    }
    parse(&stdout)
}

/// `bws secret list`'s JSON: an array of secrets.
fn parse(json: &[u8]) -> Result<BTreeMap<String, Zeroizing<String>>, BitwardenError> {
    // serde's message names a position, never the text around it.
    let secrets: Vec<Secret> =
        serde_json::from_slice(json).map_err(|e| BitwardenError::Json(e.to_string()))?;
    let mut keys: BTreeMap<String, Zeroizing<String>> = BTreeMap::new();
    for secret in secrets {
        let value = Zeroizing::new(secret.value);
        match keys.get(&secret.key) {
            Some(seen) if *seen != value => return Err(BitwardenError::Duplicate(secret.key)),
            Some(_) => {}
            None => {
                keys.insert(secret.key, value);
            }
        }
    }
    Ok(keys)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// The shape Bitwarden documents for `bws secret list`.
    const LISTED: &str = r#"[
      {
        "object": "secret",
        "id": "be8e0ad8-d545-4017-a55a-b02f014d4158",
        "organizationId": "10e8cbfa-7bd2-4361-bd6f-b02e013f9c41",
        "projectId": "e325ea69-a3ab-4dff-836f-b02e013fe530",
        "key": "OPENAI_API_KEY",
        "value": "sk-from-bitwarden",
        "note": "",
        "creationDate": "2023-06-28T20:13:20.643567Z",
        "revisionDate": "2023-06-28T20:13:20.643567Z"
      }
    ]"#;

    #[test]
    fn the_published_list_reads_as_names_and_values() {
        let keys = parse(LISTED.as_bytes()).unwrap();
        assert_eq!(keys.len(), 1);
        assert_eq!(keys["OPENAI_API_KEY"].as_str(), "sk-from-bitwarden");
    }

    #[test]
    fn a_bad_list_is_an_error_that_quotes_no_value() {
        let e = parse(br#"{"key": "OPENAI_API_KEY", "value": "sk-x"}"#).unwrap_err();
        assert!(matches!(e, BitwardenError::Json(_)), "{e}");
        assert!(!e.to_string().contains("sk-x"), "{e}");
        let twice = r#"[{"key":"K","value":"a"},{"key":"K","value":"b"}]"#;
        assert!(matches!(
            parse(twice.as_bytes()),
            Err(BitwardenError::Duplicate(k)) if k == "K"
        ));
    }
}
