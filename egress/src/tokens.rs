//! Proxy tokens and where the real keys go: the tokens file
//! (`<provider>-<32 hex>`, opaque, kept across set-ups), the mappings file
//! (provider → key variables, hosts, header and query places, written from
//! the model's provider table, which the sandbox wiring and the redactor
//! read too), and the real keys themselves, held in memory only and
//! zeroized when dropped.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};
use zeroize::Zeroizing;

pub use hermes_model::providers::{AWS_SECRET_TOKEN, PROVIDERS, ProviderSpec, UNCOVERED};

use crate::policy::{Allowlist, Host};

/// Where a provider's clients carry the key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum Place {
    /// `Authorization: Bearer <key>`.
    Bearer,
    /// A header holding the key alone (`x-api-key`, lowercase).
    Header(String),
    /// A query parameter holding the key (`?key=`).
    Query(String),
    /// An AWS Signature Version 4 made with the placeholder pair, which
    /// the proxy checks and makes again with the real pair
    /// ([`crate::sigv4`]).
    SigV4,
}

impl fmt::Display for Place {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Place::Bearer => f.write_str("authorization: Bearer"),
            Place::Header(name) => f.write_str(name),
            Place::Query(name) => write!(f, "?{name}"),
            Place::SigV4 => f.write_str(hermes_model::providers::AWS_SIGV4_PLACE),
        }
    }
}

impl From<Place> for String {
    fn from(place: Place) -> String {
        place.to_string()
    }
}

impl TryFrom<String> for Place {
    type Error = String;
    fn try_from(text: String) -> Result<Place, String> {
        let lower = text.trim().to_ascii_lowercase();
        if lower == "authorization: bearer" {
            return Ok(Place::Bearer);
        }
        if lower == hermes_model::providers::AWS_SIGV4_PLACE {
            return Ok(Place::SigV4);
        }
        let ok_name = |name: &str| {
            !name.is_empty()
                && name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        };
        match lower.strip_prefix('?') {
            Some(name) if ok_name(name) => Ok(Place::Query(name.to_string())),
            None if ok_name(&lower) && lower != "authorization" => Ok(Place::Header(lower)),
            _ => Err(format!(
                "`{text}` is not a key place (`authorization: Bearer`, a header name, `?param`, or `aws sigv4`)"
            )),
        }
    }
}

/// Errors reading the proxy's files.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error("{file}: {source}")]
    Json {
        file: &'static str,
        source: serde_json::Error,
    },
    #[error("{file}: unsupported version {version}")]
    Version { file: &'static str, version: u32 },
    #[error("{file}: {what}")]
    Invalid { file: &'static str, what: String },
}

/// `tokens.json`: provider → proxy token.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokensFile {
    pub version: u32,
    pub tokens: BTreeMap<String, String>,
}

pub const TOKENS_FILE: &str = "tokens.json";
pub const MAPPINGS_FILE: &str = "mappings.json";

impl TokensFile {
    pub fn parse(bytes: &[u8]) -> Result<TokensFile, FileError> {
        let file: TokensFile = serde_json::from_slice(bytes).map_err(|source| FileError::Json {
            file: TOKENS_FILE,
            source,
        })?;
        if file.version != 1 {
            return Err(FileError::Version {
                file: TOKENS_FILE,
                version: file.version,
            });
        }
        for (provider, token) in &file.tokens {
            if !is_token_of(provider, token) {
                return Err(FileError::Invalid {
                    file: TOKENS_FILE,
                    what: format!("the token of `{provider}` is not `{provider}-<32 hex>`"),
                });
            }
        }
        Ok(file)
    }

    /// A token for every built-in provider: the ones in `existing` kept
    /// unless `rotate`, new ones minted for the rest.
    pub fn updated(
        existing: Option<&TokensFile>,
        rotate: bool,
    ) -> Result<TokensFile, getrandom::Error> {
        let mut tokens = BTreeMap::new();
        for spec in PROVIDERS {
            let kept = existing
                .filter(|_| !rotate)
                .and_then(|f| f.tokens.get(spec.name))
                .filter(|t| is_token_of(spec.name, t));
            let token = match kept {
                Some(t) => t.clone(),
                None => new_token(spec.name)?,
            };
            tokens.insert(spec.name.to_string(), token);
        }
        // The placeholder secret access key that goes with the AWS token.
        let kept = existing
            .filter(|_| !rotate)
            .and_then(|f| f.tokens.get(AWS_SECRET_TOKEN))
            .filter(|t| is_token_of(AWS_SECRET_TOKEN, t));
        let secret = match kept {
            Some(t) => t.clone(),
            None => new_token(AWS_SECRET_TOKEN)?,
        };
        tokens.insert(AWS_SECRET_TOKEN.to_string(), secret);
        Ok(TokensFile { version: 1, tokens })
    }

    pub fn render(&self) -> String {
        let mut text = serde_json::to_string_pretty(self).unwrap_or_default();
        text.push('\n');
        text
    }
}

/// A fresh `<provider>-<32 hex>` token from the system's random source.
pub fn new_token(provider: &str) -> Result<String, getrandom::Error> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes)?;
    Ok(format!("{provider}-{}", hex(&bytes)))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Whether `token` has the form of a token of `provider`.
pub fn is_token_of(provider: &str, token: &str) -> bool {
    token
        .strip_prefix(provider)
        .and_then(|rest| rest.strip_prefix('-'))
        .is_some_and(|h| h.len() == 32 && h.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')))
}

/// `tokens` with all but a recognisable prefix masked: `openai-1a2b…`.
pub fn mask(token: &str) -> String {
    match token.rsplit_once('-') {
        Some((provider, rest)) if rest.len() > 4 => format!("{provider}-{}…", &rest[..4]),
        _ => "…".to_string(),
    }
}

/// One provider's entry in `mappings.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mapping {
    pub provider: String,
    pub env: Vec<String>,
    pub hosts: Vec<String>,
    pub places: Vec<Place>,
}

/// `mappings.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MappingsFile {
    pub version: u32,
    pub mappings: Vec<Mapping>,
}

impl MappingsFile {
    /// The built-in table as a mappings file, the SigV4 provider's hosts
    /// replaced by `aws_hosts` (`proxy.aws_hosts`).
    pub fn with_aws_hosts(aws_hosts: &[String]) -> MappingsFile {
        let mut file = MappingsFile::builtin();
        for m in &mut file.mappings {
            if m.places.contains(&Place::SigV4) {
                m.hosts = aws_hosts.to_vec();
            }
        }
        file
    }

    /// The built-in table as a mappings file.
    pub fn builtin() -> MappingsFile {
        MappingsFile {
            version: 1,
            mappings: PROVIDERS
                .iter()
                .map(|spec| Mapping {
                    provider: spec.name.to_string(),
                    env: spec.env.iter().map(ToString::to_string).collect(),
                    hosts: spec.hosts.iter().map(ToString::to_string).collect(),
                    places: spec
                        .places
                        .iter()
                        .filter_map(|p| Place::try_from((*p).to_string()).ok())
                        .collect(),
                })
                .collect(),
        }
    }

    pub fn parse(bytes: &[u8]) -> Result<MappingsFile, FileError> {
        let file: MappingsFile =
            serde_json::from_slice(bytes).map_err(|source| FileError::Json {
                file: MAPPINGS_FILE,
                source,
            })?;
        if file.version != 1 {
            return Err(FileError::Version {
                file: MAPPINGS_FILE,
                version: file.version,
            });
        }
        Ok(file)
    }

    pub fn render(&self) -> String {
        let mut text = serde_json::to_string_pretty(self).unwrap_or_default();
        text.push('\n');
        text
    }
}

/// A real key: in memory only, zeroized when dropped, never printed.
#[derive(Clone)]
pub struct Secret(Zeroizing<String>);

impl Secret {
    pub fn new(value: String) -> Secret {
        Secret(Zeroizing::new(value))
    }

    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(…)")
    }
}

/// What the proxy holds for one provider at run time.
#[derive(Debug)]
pub struct Credential {
    pub provider: String,
    /// The first of the mapping's variables that held a key.
    pub key_env: Option<String>,
    pub token: String,
    pub key: Option<Secret>,
    pub places: Vec<Place>,
    /// With [`Place::SigV4`]: the placeholder secret and the real ones.
    pub sigv4: Option<SigV4Keys>,
    /// Google OAuth: access tokens minted from a service account take the
    /// place of the token (see [`crate::google`]).
    pub oauth: Option<std::sync::Arc<crate::google::Minter>>,
    hosts: Allowlist,
}

/// The secrets of a SigV4 credential besides the access key ids (the
/// placeholder's is [`Credential::token`], the real one
/// [`Credential::key`]).
#[derive(Debug, Clone)]
pub struct SigV4Keys {
    /// The placeholder secret access key the sandbox signs with.
    pub placeholder_secret: Secret,
    /// `AWS_SECRET_ACCESS_KEY`.
    pub secret: Option<Secret>,
    /// `AWS_SESSION_TOKEN`, when the real credentials are temporary.
    pub session_token: Option<Secret>,
}

impl Credential {
    pub fn new<S: AsRef<str>>(
        provider: &str,
        token: &str,
        key: Option<Secret>,
        places: Vec<Place>,
        hosts: &[S],
    ) -> Credential {
        Credential {
            provider: provider.to_string(),
            key_env: None,
            token: token.to_string(),
            key,
            places,
            sigv4: None,
            oauth: None,
            hosts: Allowlist::exactly(hosts),
        }
    }

    /// This credential, re-signing with `keys` (tests and benchmarks).
    #[must_use]
    pub fn with_sigv4(mut self, keys: SigV4Keys) -> Credential {
        self.sigv4 = Some(keys);
        self
    }

    /// Whether the real key is loaded: for SigV4, the secret access key
    /// too.
    pub fn has_key(&self) -> bool {
        self.key.is_some()
            && (!self.is_sigv4() || self.sigv4.as_ref().is_some_and(|k| k.secret.is_some()))
    }

    /// Whether the requests of this credential are signed (SigV4).
    pub fn is_sigv4(&self) -> bool {
        self.places.contains(&Place::SigV4)
    }

    /// Every host pattern this credential serves.
    pub fn host_patterns(&self) -> Vec<String> {
        self.hosts.patterns()
    }

    pub fn serves(&self, host: &Host) -> bool {
        self.hosts.allows(host)
    }
}

/// A short digest of a real key, keyed with the management token (which
/// only hermes and the proxy hold): what `/health` says of a key, so that
/// hermes can tell the key a running proxy holds from the one in `.env`
/// without either ever leaving its process.
pub fn key_digest(mgmt_token: &str, key: &str) -> String {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    h.update(b"hermes-egress key digest\0");
    h.update(mgmt_token.as_bytes());
    h.update(b"\0");
    h.update(key.as_bytes());
    h.finalize()[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Every provider's credential.
#[derive(Debug, Default)]
pub struct Credentials {
    list: Vec<Credential>,
}

impl Credentials {
    /// Joins mappings with tokens and the real keys `lookup` finds (the
    /// process environment, then `.env`). A mapping without a token is
    /// left out; a missing key leaves the provider refusing its requests.
    pub fn build(
        mappings: &MappingsFile,
        tokens: &TokensFile,
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Credentials {
        let mut list = Vec::new();
        for m in &mappings.mappings {
            let Some(token) = tokens.tokens.get(&m.provider) else {
                continue;
            };
            let found = m
                .env
                .iter()
                .find_map(|name| lookup(name).filter(|v| !v.is_empty()).map(|v| (name, v)));
            let (key_env, key) = match found {
                Some((name, value)) => (Some(name.clone()), Some(Secret::new(value))),
                None => (None, None),
            };
            let secret = |name: &str| lookup(name).filter(|v| !v.is_empty()).map(Secret::new);
            let sigv4 = if m.places.contains(&Place::SigV4) {
                tokens
                    .tokens
                    .get(AWS_SECRET_TOKEN)
                    .map(|placeholder| SigV4Keys {
                        placeholder_secret: Secret::new(placeholder.clone()),
                        secret: secret("AWS_SECRET_ACCESS_KEY"),
                        session_token: secret("AWS_SESSION_TOKEN"),
                    })
            } else {
                None
            };
            list.push(Credential {
                provider: m.provider.clone(),
                key_env,
                token: token.clone(),
                key,
                places: m.places.clone(),
                sigv4,
                oauth: None,
                hosts: Allowlist::exactly(&m.hosts),
            });
        }
        Credentials { list }
    }

    /// Google OAuth: the `gcp` credential serves `hosts` (when given) and,
    /// with a service account, mints its access tokens.
    pub fn configure_google<S: AsRef<str>>(
        &mut self,
        hosts: Option<&[S]>,
        account: Option<crate::google::ServiceAccount>,
    ) {
        let Some(cred) = self
            .list
            .iter_mut()
            .find(|c| c.provider == crate::google::PROVIDER)
        else {
            return;
        };
        if let Some(hosts) = hosts {
            cred.hosts = Allowlist::exactly(hosts);
        }
        cred.oauth = account
            .map(|account| std::sync::Arc::new(crate::google::Minter::new(&cred.token, account)));
    }

    /// The credential whose hosts include `host`.
    pub fn for_host(&self, host: &Host) -> Option<&Credential> {
        self.list.iter().find(|c| c.serves(host))
    }

    pub fn iter(&self) -> impl Iterator<Item = &Credential> {
        self.list.iter()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn tokens_are_kept_across_setups_unless_rotated() {
        let first = TokensFile::updated(None, false).unwrap();
        assert_eq!(first.tokens.len(), PROVIDERS.len() + 1);
        assert!(is_token_of(
            AWS_SECRET_TOKEN,
            &first.tokens[AWS_SECRET_TOKEN]
        ));
        assert!(first.tokens.iter().all(|(p, t)| is_token_of(p, t)));
        let again = TokensFile::updated(Some(&first), false).unwrap();
        assert_eq!(again, first);
        let rotated = TokensFile::updated(Some(&first), true).unwrap();
        assert!(first.tokens.iter().all(|(p, t)| rotated.tokens[p] != *t));
        let parsed = TokensFile::parse(first.render().as_bytes()).unwrap();
        assert_eq!(parsed, first);
    }

    #[test]
    fn a_malformed_token_in_the_file_is_refused_and_replaced_on_setup() {
        let text = r#"{"version":1,"tokens":{"openai":"sk-real-looking"}}"#;
        let err = TokensFile::parse(text.as_bytes()).unwrap_err().to_string();
        assert!(err.contains("not `openai-<32 hex>`"), "{err}");
        assert!(!err.contains("sk-real-looking"));
        let file = TokensFile {
            version: 1,
            tokens: [("openai".to_string(), "sk-real-looking".to_string())].into(),
        };
        let next = TokensFile::updated(Some(&file), false).unwrap();
        assert!(is_token_of("openai", &next.tokens["openai"]));
    }

    #[test]
    fn the_builtin_mappings_round_trip_through_their_file() {
        let builtin = MappingsFile::builtin();
        assert!(builtin.mappings.iter().all(|m| {
            m.places.len()
                == PROVIDERS
                    .iter()
                    .find(|p| p.name == m.provider)
                    .unwrap()
                    .places
                    .len()
        }));
        assert_eq!(
            MappingsFile::parse(builtin.render().as_bytes()).unwrap(),
            builtin
        );
        assert!(builtin.render().contains("\"authorization: Bearer\""));
        assert!(builtin.render().contains("\"?key\""));
    }

    #[test]
    fn keys_come_from_the_first_variable_set_and_are_never_printed() {
        let tokens = TokensFile::updated(None, false).unwrap();
        let creds = Credentials::build(&MappingsFile::builtin(), &tokens, |name| {
            (name == "GOOGLE_API_KEY").then(|| "AIza-real".to_string())
        });
        let google = creds
            .for_host(&Host::Name("generativelanguage.googleapis.com".into()))
            .unwrap();
        assert_eq!(google.key.as_ref().unwrap().expose(), "AIza-real");
        assert_eq!(google.key_env.as_deref(), Some("GOOGLE_API_KEY"));
        assert!(!format!("{creds:?}").contains("AIza-real"));
        let azure = creds
            .for_host(&Host::Name("my.openai.azure.com".into()))
            .unwrap();
        assert_eq!(azure.provider, "azure");
        assert!(azure.key.is_none());
        assert!(
            creds
                .for_host(&Host::Name("openai.azure.com".into()))
                .is_none()
        );
    }

    #[test]
    fn the_aws_credential_holds_the_placeholder_secret_and_the_real_ones() {
        let tokens = TokensFile::updated(None, false).unwrap();
        let hosts = vec!["bedrock-runtime.eu-west-1.amazonaws.com".to_string()];
        let real = |name: &str| match name {
            "AWS_ACCESS_KEY_ID" => Some("AKIAREAL".to_string()),
            "AWS_SECRET_ACCESS_KEY" => Some("real-secret".to_string()),
            "AWS_SESSION_TOKEN" => Some("real-session".to_string()),
            _ => None,
        };
        let creds = Credentials::build(&MappingsFile::with_aws_hosts(&hosts), &tokens, real);
        let aws = creds
            .for_host(&Host::Name(hosts[0].clone()))
            .expect("the configured host");
        assert!(aws.is_sigv4() && aws.has_key());
        assert_eq!(aws.token, tokens.tokens["aws"]);
        let keys = aws.sigv4.as_ref().unwrap();
        assert_eq!(
            keys.placeholder_secret.expose(),
            tokens.tokens[AWS_SECRET_TOKEN]
        );
        assert_eq!(
            keys.session_token.as_ref().unwrap().expose(),
            "real-session"
        );
        assert!(!format!("{creds:?}").contains("real-secret"));
        // The default host is not served once the list is configured.
        let default = Host::Name("bedrock-runtime.us-east-1.amazonaws.com".into());
        assert!(creds.for_host(&default).is_none());
        // Without the secret, the key counts as not loaded.
        let creds = Credentials::build(&MappingsFile::with_aws_hosts(&hosts), &tokens, |n| {
            (n == "AWS_ACCESS_KEY_ID").then(|| "AKIAREAL".to_string())
        });
        assert!(!creds.iter().find(|c| c.is_sigv4()).unwrap().has_key());
    }

    #[test]
    fn masks_keep_only_the_provider_and_four_characters() {
        assert_eq!(
            mask("openai-0123456789abcdef0123456789abcdef"),
            "openai-0123…"
        );
        assert_eq!(mask("x"), "…");
    }

    #[test]
    fn places_parse_from_their_file_form() {
        assert_eq!(
            Place::try_from("Authorization: Bearer".to_string()),
            Ok(Place::Bearer)
        );
        assert_eq!(
            Place::try_from("X-Api-Key".to_string()),
            Ok(Place::Header("x-api-key".into()))
        );
        assert_eq!(
            Place::try_from("?key".to_string()),
            Ok(Place::Query("key".into()))
        );
        assert!(Place::try_from("authorization".to_string()).is_err());
        assert!(Place::try_from("?".to_string()).is_err());
        assert!(Place::try_from("bad header".to_string()).is_err());
    }
}
