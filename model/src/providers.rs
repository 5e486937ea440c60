//! The API providers whose keys the egress proxy stands in for: which
//! variables hold a real key, which hosts take it, and where in a request
//! it goes. Also the credentials it cannot stand in for. The proxy, the
//! sandbox wiring and the redactor all read this one table.

/// A provider the proxy knows how to serve.
#[derive(Debug, Clone, Copy)]
pub struct ProviderSpec {
    /// The token prefix and the name in logs.
    pub name: &'static str,
    /// The variables holding the real key (the first one set wins); the
    /// sandbox gets the token in each of them.
    pub env: &'static [&'static str],
    /// Hosts (exact or `*.domain`) whose requests carry this key.
    pub hosts: &'static [&'static str],
    /// `authorization: Bearer`, a header name, or `?param`.
    pub places: &'static [&'static str],
}

/// The built-in providers.
pub const PROVIDERS: &[ProviderSpec] = &[
    ProviderSpec {
        name: "openrouter",
        env: &["OPENROUTER_API_KEY"],
        hosts: &["openrouter.ai", "*.openrouter.ai"],
        places: &["authorization: Bearer"],
    },
    ProviderSpec {
        name: "openai",
        env: &["OPENAI_API_KEY"],
        hosts: &["api.openai.com"],
        places: &["authorization: Bearer"],
    },
    ProviderSpec {
        name: "anthropic",
        env: &["ANTHROPIC_API_KEY"],
        hosts: &["api.anthropic.com"],
        places: &["x-api-key", "authorization: Bearer"],
    },
    ProviderSpec {
        name: "google",
        env: &["GEMINI_API_KEY", "GOOGLE_API_KEY"],
        hosts: &["generativelanguage.googleapis.com"],
        places: &["x-goog-api-key", "?key"],
    },
    ProviderSpec {
        name: "azure",
        env: &["AZURE_OPENAI_API_KEY"],
        hosts: &[
            "*.openai.azure.com",
            "*.cognitiveservices.azure.com",
            "*.services.ai.azure.com",
        ],
        places: &["api-key", "authorization: Bearer"],
    },
    ProviderSpec {
        name: "xai",
        env: &["XAI_API_KEY"],
        hosts: &["api.x.ai"],
        places: &["authorization: Bearer"],
    },
    ProviderSpec {
        name: "mistral",
        env: &["MISTRAL_API_KEY"],
        hosts: &["api.mistral.ai"],
        places: &["authorization: Bearer"],
    },
    ProviderSpec {
        name: "groq",
        env: &["GROQ_API_KEY"],
        hosts: &["api.groq.com"],
        places: &["authorization: Bearer"],
    },
    ProviderSpec {
        name: "together",
        env: &["TOGETHER_API_KEY"],
        hosts: &["api.together.xyz"],
        places: &["authorization: Bearer"],
    },
    ProviderSpec {
        name: "deepseek",
        env: &["DEEPSEEK_API_KEY"],
        hosts: &["api.deepseek.com"],
        places: &["authorization: Bearer"],
    },
    ProviderSpec {
        name: "nous",
        env: &["NOUS_API_KEY"],
        hosts: &["inference.nousresearch.com"],
        places: &["authorization: Bearer"],
    },
    // Google OAuth (Vertex AI): the token stands in for an access token
    // that the proxy mints from the host's service account
    // (GOOGLE_APPLICATION_CREDENTIALS); a host's own access token in
    // GOOGLE_OAUTH_ACCESS_TOKEN is swapped in like a key when there is
    // no service account. The hosts: `proxy.google_oauth_hosts`.
    ProviderSpec {
        name: "gcp",
        env: &["GOOGLE_OAUTH_ACCESS_TOKEN"],
        hosts: GOOGLE_OAUTH_HOSTS,
        places: &["authorization: Bearer"],
    },
];

/// The hosts the minted Google access tokens go to, without
/// `proxy.google_oauth_hosts`: Vertex AI.
pub const GOOGLE_OAUTH_HOSTS: &[&str] =
    &["aiplatform.googleapis.com", "*-aiplatform.googleapis.com"];

/// The host's variable naming a Google service-account key file: read by
/// the proxy only, never handed to a sandbox.
pub const GOOGLE_SERVICE_ACCOUNT_VARIABLE: &str = "GOOGLE_APPLICATION_CREDENTIALS";

/// Credentials the proxy cannot stand in for: signed requests. `status`
/// warns when they are set; they are not passed on.
pub const UNCOVERED: &[(&str, &str)] = &[
    (
        "AWS_ACCESS_KEY_ID",
        "AWS SigV4 signs each request with the secret key",
    ),
    (
        "AWS_SECRET_ACCESS_KEY",
        "AWS SigV4 signs each request with the secret key",
    ),
    (
        "AWS_SESSION_TOKEN",
        "AWS SigV4 signs each request with the secret key",
    ),
];

/// Every variable that may hold a real provider key.
pub fn key_variables() -> impl Iterator<Item = &'static str> {
    PROVIDERS.iter().flat_map(|p| p.env.iter().copied())
}

/// Whether `name` holds a provider key or a credential the proxy cannot
/// cover: never handed to a sandbox behind the proxy.
pub fn is_credential_variable(name: &str) -> bool {
    key_variables().any(|v| v == name)
        || name == GOOGLE_SERVICE_ACCOUNT_VARIABLE
        || UNCOVERED.iter().any(|(v, _)| *v == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_names_each_variable_once() {
        let mut all: Vec<&str> = key_variables().collect();
        let n = all.len();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), n);
        assert!(is_credential_variable("OPENAI_API_KEY"));
        assert!(is_credential_variable("AWS_SECRET_ACCESS_KEY"));
        assert!(is_credential_variable("GOOGLE_APPLICATION_CREDENTIALS"));
        assert!(!is_credential_variable("PATH"));
    }
}
