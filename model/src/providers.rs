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

/// An AWS service that hands out credentials of its own (temporary keys,
/// access keys, passwords, tokens): a request to it signed with the real
/// AWS credentials would give a sandbox credentials that work without the
/// proxy. The proxy never signs one, and `config check` refuses a
/// `proxy.aws_hosts` entry naming one.
#[derive(Debug, Clone, Copy)]
pub struct AwsCredentialService {
    /// What it is, for the refusal's sentence.
    pub what: &'static str,
    /// The service names its requests are signed for (the SigV4
    /// credential scope's fourth part).
    pub signing_names: &'static [&'static str],
    /// The host labels that name it: a host with a label that is one of
    /// these, or one of these followed by `-` (`sts-fips`), is its.
    pub host_labels: &'static [&'static str],
}

/// The credential services of [`AwsCredentialService`].
pub const AWS_CREDENTIAL_SERVICES: &[AwsCredentialService] = &[
    AwsCredentialService {
        what: "STS, which issues temporary credentials (GetSessionToken, AssumeRole, GetFederationToken)",
        signing_names: &["sts"],
        host_labels: &["sts"],
    },
    AwsCredentialService {
        what: "IAM, which creates users, access keys, passwords and service credentials",
        signing_names: &["iam"],
        host_labels: &["iam"],
    },
    AwsCredentialService {
        what: "IAM Identity Center (SSO), whose portal hands out role credentials (GetRoleCredentials)",
        signing_names: &["sso", "awsssoportal"],
        host_labels: &["sso"],
    },
    AwsCredentialService {
        what: "IAM Identity Center's OIDC service, which issues access tokens (CreateToken)",
        signing_names: &["sso-oauth", "sso-oidc"],
        host_labels: &["oidc"],
    },
    AwsCredentialService {
        what: "the Identity Store of IAM Identity Center, which manages the users credentials are issued to",
        signing_names: &["identitystore"],
        host_labels: &["identitystore"],
    },
    AwsCredentialService {
        what: "Cognito identity pools, which issue AWS credentials and OpenID tokens (GetCredentialsForIdentity, GetOpenIdToken)",
        signing_names: &["cognito-identity"],
        host_labels: &["cognito-identity"],
    },
    AwsCredentialService {
        what: "AWS Sign-In, which issues console and CLI sessions",
        signing_names: &["signin"],
        host_labels: &["signin"],
    },
    AwsCredentialService {
        what: "S3 Express One Zone, whose CreateSession hands out session credentials",
        signing_names: &["s3express"],
        host_labels: &["s3express"],
    },
];

/// Actions, in any AWS service, that hand out credentials: refused by
/// the proxy wherever they are named (a query's or form body's `Action`,
/// an `X-Amz-Target`, an RPC operation path). `AssumeRole` stands for
/// every action it begins (`AssumeRoleWithSAML`, `AssumeRoleWithWebIdentity`).
pub const AWS_CREDENTIAL_ACTIONS: &[&str] = &[
    // STS.
    "AssumeRole",
    "AssumeRoot",
    "GetSessionToken",
    "GetFederationToken",
    "GetWebIdentityToken",
    // IAM.
    "CreateAccessKey",
    "UpdateAccessKey",
    "CreateLoginProfile",
    "UpdateLoginProfile",
    "CreateServiceSpecificCredential",
    "ResetServiceSpecificCredential",
    "UploadSSHPublicKey",
    "UploadSigningCertificate",
    // IAM Identity Center.
    "GetRoleCredentials",
    "CreateToken",
    "CreateTokenWithIAM",
    "RegisterClient",
    "StartDeviceAuthorization",
    // Cognito.
    "GetCredentialsForIdentity",
    "GetOpenIdToken",
    "GetOpenIdTokenForDeveloperIdentity",
    "AdminInitiateAuth",
    // Registry and database credentials (ECR, CodeArtifact, Redshift,
    // Lightsail).
    "GetAuthorizationToken",
    "GetClusterCredentials",
    "GetClusterCredentialsWithIAM",
    "CreateBucketAccessKey",
    "GetInstanceAccessDetails",
];

/// REST paths (no `Action` anywhere) that hand out credentials: the SSO
/// portal's GetRoleCredentials, CodeArtifact's GetAuthorizationToken.
pub const AWS_CREDENTIAL_PATHS: &[&str] = &["/federation/credentials", "/v1/authorization-token"];

/// The credential service whose requests are signed for `name` (a
/// credential scope's service), if any.
pub fn aws_credential_service_signed_as(name: &str) -> Option<&'static AwsCredentialService> {
    AWS_CREDENTIAL_SERVICES
        .iter()
        .find(|s| s.signing_names.iter().any(|n| n.eq_ignore_ascii_case(name)))
}

/// The credential service a host name (or the fixed part of a host
/// pattern) names by one of its labels, if any.
pub fn aws_credential_service_of_host(host: &str) -> Option<&'static AwsCredentialService> {
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    host.split('.').find_map(|label| {
        AWS_CREDENTIAL_SERVICES.iter().find(|s| {
            s.host_labels.iter().any(|l| {
                label == *l
                    || label
                        .strip_prefix(l)
                        .is_some_and(|rest| rest.starts_with('-'))
            })
        })
    })
}

/// The listed action `action` is (compared without case), if any.
pub fn aws_credential_action(action: &str) -> Option<&'static str> {
    let action = action.trim();
    AWS_CREDENTIAL_ACTIONS.iter().copied().find(|a| {
        a.eq_ignore_ascii_case(action)
            || (*a == "AssumeRole"
                && action
                    .get(..a.len())
                    .is_some_and(|head| head.eq_ignore_ascii_case(a)))
    })
}

/// The domains of the AWS partitions, under which every service's hosts
/// are named (`sts.amazonaws.com`, `sts.us-east-1.api.aws`).
pub const AWS_DOMAINS: &[&str] = &[
    "amazonaws.com",
    "amazonaws.com.cn",
    "api.aws",
    "api.amazonwebservices.com.cn",
    "amazonaws.eu",
    "c2s.ic.gov",
    "sc2s.sgov.gov",
];

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

    #[test]
    fn credential_services_are_found_by_signing_name_host_label_and_action() {
        assert!(aws_credential_service_signed_as("sts").is_some_and(|s| s.what.starts_with("STS")));
        assert!(aws_credential_service_signed_as("STS").is_some());
        assert!(aws_credential_service_signed_as("bedrock").is_none());
        assert!(aws_credential_service_signed_as("s3").is_none());
        for host in [
            "sts.amazonaws.com",
            "sts.us-east-1.amazonaws.com",
            "STS-FIPS.us-east-1.amazonaws.com.",
            "sts.us-east-1.api.aws",
            "iam.amazonaws.com",
            "portal.sso.us-east-1.amazonaws.com",
            "oidc.eu-west-1.amazonaws.com",
            "cognito-identity.us-east-1.amazonaws.com",
            "vpce-0abc.sts.us-east-1.vpce.amazonaws.com",
        ] {
            assert!(aws_credential_service_of_host(host).is_some(), "{host}");
        }
        for host in [
            "bedrock-runtime.us-east-1.amazonaws.com",
            "s3.us-east-1.amazonaws.com",
            "mybucket.s3.amazonaws.com",
            "ststore.amazonaws.com",
            "cognito-idp.us-east-1.amazonaws.com",
        ] {
            assert!(aws_credential_service_of_host(host).is_none(), "{host}");
        }
        assert_eq!(
            aws_credential_action("getsessiontoken"),
            Some("GetSessionToken")
        );
        assert_eq!(
            aws_credential_action("AssumeRoleWithWebIdentity"),
            Some("AssumeRole")
        );
        assert_eq!(
            aws_credential_action("CreateAccessKey"),
            Some("CreateAccessKey")
        );
        assert_eq!(aws_credential_action("InvokeModel"), None);
        assert_eq!(aws_credential_action("Assume"), None);
    }
}
