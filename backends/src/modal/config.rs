//! Where the driver's settings come from, as the official client reads
//! them: the token from `MODAL_TOKEN_ID` / `MODAL_TOKEN_SECRET` (the host
//! environment, then `$HERMES_HOME/.env`, through the caller's lookup), else
//! from the active profile of `.modal.toml` (`MODAL_PROFILE`, else the
//! profile marked `active = true`, else `default`; the file is
//! `MODAL_CONFIG_PATH` or `~/.modal.toml`). The server is
//! `MODAL_SERVER_URL`, the profile's `server_url`, or
//! `https://api.modal.com`; plain `http://` only to a loopback address.

use std::fmt;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use zeroize::Zeroizing;

use super::error::ModalError;

/// The service hermes talks to unless told otherwise.
pub const DEFAULT_SERVER_URL: &str = "https://api.modal.com";

/// The environment variables the driver reads.
pub const ENV_TOKEN_ID: &str = "MODAL_TOKEN_ID";
pub const ENV_TOKEN_SECRET: &str = "MODAL_TOKEN_SECRET";
pub const ENV_SERVER_URL: &str = "MODAL_SERVER_URL";
pub const ENV_PROFILE: &str = "MODAL_PROFILE";
pub const ENV_CONFIG_PATH: &str = "MODAL_CONFIG_PATH";
pub const ENV_ENVIRONMENT: &str = "MODAL_ENVIRONMENT";

/// Everything the driver needs to reach the service.
pub(crate) struct Settings {
    pub(crate) token_id: Zeroizing<String>,
    pub(crate) token_secret: Zeroizing<String>,
    pub(crate) server_url: String,
    /// The Modal environment (`MODAL_ENVIRONMENT` or the profile's
    /// `environment`); empty: the workspace's default.
    pub(crate) environment: String,
}

impl fmt::Debug for Settings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Settings")
            .field("token_id", &"<redacted>")
            .field("token_secret", &"<redacted>")
            .field("server_url", &self.server_url)
            .field("environment", &self.environment)
            .finish()
    }
}

/// Reads the settings: each value from the lookup first, then from the
/// active profile of `.modal.toml` (read only when the lookup lacks one).
pub(crate) fn resolve(
    lookup: &dyn Fn(&str) -> Option<String>,
    home: Option<&Path>,
) -> Result<Settings, ModalError> {
    let get = |name: &str| lookup(name).filter(|v| !v.trim().is_empty());
    let token_id = get(ENV_TOKEN_ID).map(Zeroizing::new);
    let token_secret = get(ENV_TOKEN_SECRET).map(Zeroizing::new);
    let server_url = get(ENV_SERVER_URL);
    let environment = get(ENV_ENVIRONMENT);
    let profile_env = get(ENV_PROFILE);

    let complete = token_id.is_some()
        && token_secret.is_some()
        && server_url.is_some()
        && environment.is_some();
    let config_path = get(ENV_CONFIG_PATH)
        .map(PathBuf::from)
        .or_else(|| home.map(|h| h.join(".modal.toml")));
    let file = match (&config_path, complete) {
        (Some(path), false) => read_config(path)?,
        _ => None,
    };
    let (profile_name, profile) = match &file {
        Some(table) => {
            let name = profile_env.clone().unwrap_or_else(|| active_profile(table));
            let profile = table.get(&name).and_then(|v| v.as_table()).cloned();
            (name, profile)
        }
        None => (
            profile_env.clone().unwrap_or_else(|| "default".to_string()),
            None,
        ),
    };
    let from_profile = |key: &str| -> Option<String> {
        profile
            .as_ref()
            .and_then(|p| p.get(key))
            .and_then(|v| v.as_str())
            .filter(|v| !v.trim().is_empty())
            .map(str::to_string)
    };

    let token_id = token_id.or_else(|| from_profile("token_id").map(Zeroizing::new));
    let token_secret = token_secret.or_else(|| from_profile("token_secret").map(Zeroizing::new));
    let (Some(token_id), Some(token_secret)) = (token_id, token_secret) else {
        return Err(ModalError::MissingCredentials {
            profile: profile_name,
        });
    };
    let server_url = server_url
        .or_else(|| from_profile("server_url"))
        .unwrap_or_else(|| DEFAULT_SERVER_URL.to_string());
    check_server_url(&server_url)?;
    let environment = environment
        .or_else(|| from_profile("environment"))
        .unwrap_or_default();
    Ok(Settings {
        token_id,
        token_secret,
        server_url,
        environment,
    })
}

/// The parsed `.modal.toml`, `None` when there is none. A broken file is
/// an error that names the file and the line, never its text (it holds the
/// token secret).
fn read_config(path: &Path) -> Result<Option<toml::Table>, ModalError> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => Zeroizing::new(text),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(ModalError::Config(format!(
                "cannot read {}: {}",
                path.display(),
                e.kind()
            )));
        }
    };
    match toml::from_str::<toml::Table>(&text) {
        Ok(table) => Ok(Some(table)),
        Err(e) => {
            let line = e
                .span()
                .map(|span| text[..span.start.min(text.len())].matches('\n').count() + 1);
            Err(ModalError::Config(match line {
                Some(line) => format!("{} is not valid TOML (line {line})", path.display()),
                None => format!("{} is not valid TOML", path.display()),
            }))
        }
    }
}

/// The profile marked `active = true`, else `default`, as the official
/// client picks it.
fn active_profile(table: &toml::Table) -> String {
    table
        .iter()
        .find(|(_, v)| {
            v.as_table()
                .and_then(|t| t.get("active"))
                .and_then(toml::Value::as_bool)
                == Some(true)
        })
        .map_or_else(|| "default".to_string(), |(k, _)| k.clone())
}

/// `https://` anywhere; `http://` only to a loopback address (a local test
/// server), never in the clear over a network.
pub(crate) fn check_server_url(url: &str) -> Result<(), ModalError> {
    let uri: http::Uri = url
        .parse()
        .map_err(|_| ModalError::Config(format!("server URL {url:?} is not a URL")))?;
    let host = uri.host().unwrap_or_default();
    match uri.scheme_str() {
        Some("https") if !host.is_empty() => Ok(()),
        Some("http") if is_loopback(host) => Ok(()),
        Some("http") => Err(ModalError::Config(format!(
            "server URL {url:?}: plain http is only allowed to a loopback address; use https"
        ))),
        _ => Err(ModalError::Config(format!(
            "server URL {url:?} must be https://host[:port]"
        ))),
    }
}

fn is_loopback(host: &str) -> bool {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || bare.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::collections::HashMap;

    use super::*;

    fn lookup_from(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> + use<> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |name| map.get(name).cloned()
    }

    #[test]
    fn the_environment_gives_the_token_and_the_default_server() {
        let lookup = lookup_from(&[(ENV_TOKEN_ID, "ak-1"), (ENV_TOKEN_SECRET, "as-2")]);
        let s = resolve(&lookup, None).unwrap();
        assert_eq!(s.token_id.as_str(), "ak-1");
        assert_eq!(s.token_secret.as_str(), "as-2");
        assert_eq!(s.server_url, DEFAULT_SERVER_URL);
        assert_eq!(s.environment, "");
    }

    #[test]
    fn a_missing_token_names_the_variables_and_no_value() {
        let lookup = lookup_from(&[(ENV_TOKEN_ID, "ak-only-the-id")]);
        let err = resolve(&lookup, None).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("MODAL_TOKEN_ID"), "{text}");
        assert!(text.contains("MODAL_TOKEN_SECRET"), "{text}");
        assert!(!text.contains("ak-only-the-id"), "{text}");
        assert!(!format!("{err:?}").contains("ak-only-the-id"));
    }

    #[test]
    fn the_active_profile_of_modal_toml_is_used() {
        let home = tempfile::tempdir().unwrap();
        std::fs::write(
            home.path().join(".modal.toml"),
            "[default]\ntoken_id = \"ak-def\"\ntoken_secret = \"as-def\"\n\n\
             [work]\ntoken_id = \"ak-work\"\ntoken_secret = \"as-work\"\nactive = true\n\
             server_url = \"http://127.0.0.1:9\"\nenvironment = \"dev\"\n",
        )
        .unwrap();
        let s = resolve(&lookup_from(&[]), Some(home.path())).unwrap();
        assert_eq!(s.token_id.as_str(), "ak-work");
        assert_eq!(s.token_secret.as_str(), "as-work");
        assert_eq!(s.server_url, "http://127.0.0.1:9");
        assert_eq!(s.environment, "dev");

        let s = resolve(&lookup_from(&[(ENV_PROFILE, "default")]), Some(home.path())).unwrap();
        assert_eq!(s.token_id.as_str(), "ak-def");
        assert_eq!(s.server_url, DEFAULT_SERVER_URL);
    }

    #[test]
    fn the_environment_wins_over_the_file() {
        let home = tempfile::tempdir().unwrap();
        std::fs::write(
            home.path().join(".modal.toml"),
            "[default]\ntoken_id = \"ak-file\"\ntoken_secret = \"as-file\"\n",
        )
        .unwrap();
        let lookup = lookup_from(&[(ENV_TOKEN_SECRET, "as-env")]);
        let s = resolve(&lookup, Some(home.path())).unwrap();
        assert_eq!(s.token_id.as_str(), "ak-file");
        assert_eq!(s.token_secret.as_str(), "as-env");
    }

    #[test]
    fn a_broken_modal_toml_is_named_without_its_text() {
        let home = tempfile::tempdir().unwrap();
        std::fs::write(
            home.path().join(".modal.toml"),
            "[default]\ntoken_id = \"ak-x\"\ntoken_secret = \"as-very-secret\n",
        )
        .unwrap();
        let err = resolve(&lookup_from(&[]), Some(home.path())).unwrap_err();
        let text = err.to_string();
        assert!(text.contains(".modal.toml"), "{text}");
        assert!(text.contains("line 3"), "{text}");
        assert!(!text.contains("as-very-secret"), "{text}");
    }

    #[test]
    fn no_file_and_no_variables_is_missing_credentials() {
        let home = tempfile::tempdir().unwrap();
        let err = resolve(&lookup_from(&[]), Some(home.path())).unwrap_err();
        assert!(
            matches!(err, ModalError::MissingCredentials { .. }),
            "{err}"
        );
    }

    #[test]
    fn plain_http_only_to_loopback() {
        for ok in [
            "https://api.modal.com",
            "https://api.modal.com:443",
            "http://127.0.0.1:4000",
            "http://localhost:4000",
            "http://[::1]:4000",
        ] {
            assert!(check_server_url(ok).is_ok(), "{ok}");
        }
        for bad in [
            "http://api.modal.com",
            "http://10.0.0.1:80",
            "ftp://api.modal.com",
            "api.modal.com",
            "not a url",
        ] {
            assert!(check_server_url(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn settings_debug_hides_the_token() {
        let lookup = lookup_from(&[(ENV_TOKEN_ID, "ak-hidden"), (ENV_TOKEN_SECRET, "as-hidden")]);
        let s = resolve(&lookup, None).unwrap();
        let text = format!("{s:?}");
        assert!(
            !text.contains("ak-hidden") && !text.contains("as-hidden"),
            "{text}"
        );
    }
}
