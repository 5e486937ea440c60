//! The API providers whose keys the egress proxy stands in for: which
//! variables hold a real key, which hosts take it, and where in a request
//! it goes (a header, a query parameter, or an AWS SigV4 signature the
//! proxy makes again). Also the credentials it cannot stand in for. The proxy, the
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
    // The sandbox signs with a placeholder pair (this token as the access
    // key id, [`AWS_SECRET_TOKEN`]'s as the secret); the proxy checks that
    // signature and signs again with the real pair. The hosts are
    // `proxy.aws_hosts`, written into the mappings at setup.
    ProviderSpec {
        name: AWS,
        env: &["AWS_ACCESS_KEY_ID"],
        hosts: &["bedrock-runtime.us-east-1.amazonaws.com"],
        places: &[AWS_SIGV4_PLACE],
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

/// The provider whose requests are signed (AWS Signature Version 4).
pub const AWS: &str = "aws";
/// The key place of a provider whose requests are re-signed.
pub const AWS_SIGV4_PLACE: &str = "aws sigv4";
/// The entry of `tokens.json` holding the placeholder secret access key.
pub const AWS_SECRET_TOKEN: &str = "aws-secret";
/// The variables of the real AWS secret and session token: never handed
/// to a sandbox (it gets the placeholder secret in the first, nothing in
/// the second).
pub const AWS_SECRET_VARIABLES: &[&str] = &["AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"];

/// The hosts the minted Google access tokens go to, without
/// `proxy.google_oauth_hosts`: Vertex AI.
pub const GOOGLE_OAUTH_HOSTS: &[&str] =
    &["aiplatform.googleapis.com", "*-aiplatform.googleapis.com"];

/// The host's variable naming a Google service-account key file: read by
/// the proxy only, never handed to a sandbox.
pub const GOOGLE_SERVICE_ACCOUNT_VARIABLE: &str = "GOOGLE_APPLICATION_CREDENTIALS";

/// The Bedrock runtime endpoint of `region`: the default of
/// `proxy.aws_hosts`.
pub fn bedrock_runtime_host(region: &str) -> String {
    format!("bedrock-runtime.{region}.amazonaws.com")
}

/// Credentials the proxy cannot stand in for, with why: none left (AWS
/// requests are signed again, Google access tokens minted). `status` warns
/// of any listed here when set; they are not passed on.
pub const UNCOVERED: &[(&str, &str)] = &[];

/// Every variable that may hold a real provider key (the AWS secret and
/// session token included).
pub fn key_variables() -> impl Iterator<Item = &'static str> {
    PROVIDERS
        .iter()
        .flat_map(|p| p.env.iter().copied())
        .chain(AWS_SECRET_VARIABLES.iter().copied())
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
        assert!(is_credential_variable("AWS_SESSION_TOKEN"));
        assert!(is_credential_variable("AWS_ACCESS_KEY_ID"));
        assert!(!UNCOVERED.iter().any(|(v, _)| v.starts_with("AWS_")));
        assert!(is_credential_variable("GOOGLE_APPLICATION_CREDENTIALS"));
        assert!(!is_credential_variable("PATH"));
    }
}
