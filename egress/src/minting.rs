//! The AWS requests the re-signing path never signs: those that would
//! hand a sandbox credentials of its own (temporary keys, access keys,
//! passwords, tokens) that work without the proxy. A request is refused
//! when any of these names a credential service or action of the model's
//! table ([`hermes_model::providers::AWS_CREDENTIAL_SERVICES`],
//! [`hermes_model::providers::AWS_CREDENTIAL_ACTIONS`]):
//!
//! - its host (a label: `sts.amazonaws.com`, `portal.sso.<region>…`),
//! - the service of its SigV4 credential scope (`…/us-east-1/sts/aws4_request`),
//! - its action: a query's `Action=`, a form body's `Action=`, the
//!   `X-Amz-Target` of the JSON protocols, the operation of an RPC path
//!   (`/service/<S>/operation/<Op>`), or a REST path listed there.
//!
//! A form-encoded body is read for its `Action`, so it must be signed
//! (not `UNSIGNED-PAYLOAD`). The refusal is a 403 whose body is an AWS
//! error (`AccessDenied`, XML for the Query and REST-XML protocols, JSON
//! otherwise), so an SDK shows its message.

use hermes_model::providers::{
    AWS_CREDENTIAL_PATHS, aws_credential_action, aws_credential_service_of_host,
    aws_credential_service_signed_as,
};
use http::StatusCode;
use http::header::{CONTENT_TYPE, HeaderMap};

use crate::policy::Host;
use crate::sigv4::{AwsError, Refusal};

/// The reason word of these refusals (the refusal header, the log).
pub const REASON: &str = "sigv4-credentials-refused";

const X_AMZ_TARGET: &str = "x-amz-target";
const WHY: &str = "the proxy never signs requests that hand out AWS credentials with the real ones (the sandbox would hold credentials that work without the proxy)";

/// What a refused request looks like, for the shape of its error body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Protocol {
    /// Query and REST-XML: an `<ErrorResponse>`.
    Xml,
    /// The JSON protocols: `{"__type": …, "message": …}`.
    Json,
}

fn protocol(service: &str, query: Option<&str>, headers: &HeaderMap) -> Protocol {
    let form = is_form(headers);
    let action_in_query = query.is_some_and(|q| !actions(q).is_empty());
    let json = headers.contains_key(X_AMZ_TARGET)
        || headers.get_all(CONTENT_TYPE).iter().any(|v| {
            v.to_str()
                .is_ok_and(|t| t.to_ascii_lowercase().contains("json"))
        });
    // A request with no body and no Query action (a REST-JSON GET, the
    // SSO portal's) gets JSON too: botocore reads JSON for those.
    if form || action_in_query || (!json && matches!(service, "s3" | "s3express")) {
        Protocol::Xml
    } else {
        Protocol::Json
    }
}

/// The refusal of a request naming `what`.
fn refused(protocol: Protocol, what: &str) -> Refusal {
    let why = format!("{what}: {WHY}");
    let message = format!("hermes egress refused: {why}");
    let aws = match protocol {
        Protocol::Xml => AwsError {
            content_type: "text/xml",
            error_type: None,
            body: format!(
                "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<ErrorResponse><Error><Type>Sender</Type><Code>AccessDenied</Code><Message>{}</Message></Error><RequestId>hermes-egress</RequestId></ErrorResponse>\n",
                xml_escape(&message)
            ),
        },
        Protocol::Json => AwsError {
            content_type: "application/x-amz-json-1.1",
            error_type: Some("AccessDeniedException"),
            body: format!(
                "{}\n",
                serde_json::json!({"__type": "AccessDeniedException", "message": message})
            ),
        },
    };
    Refusal {
        status: StatusCode::FORBIDDEN,
        reason: REASON,
        why,
        aws: Some(aws),
    }
}

fn xml_escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Checks what a request shows before its body: its host, its credential
/// scope's `service`, its query's `Action`, its `X-Amz-Target`, its path.
pub fn check_head(
    host: Option<&Host>,
    service: &str,
    path_and_query: &str,
    headers: &HeaderMap,
) -> Result<(), Refusal> {
    let (path, query) = match path_and_query.split_once('?') {
        Some((path, query)) => (path, Some(query)),
        None => (path_and_query, None),
    };
    let protocol = protocol(service, query, headers);
    if let Some(Host::Name(name)) = host
        && let Some(s) = aws_credential_service_of_host(name)
    {
        return Err(refused(
            protocol,
            &format!("{name} is a host of {}", s.what),
        ));
    }
    if let Some(s) = aws_credential_service_signed_as(service) {
        return Err(refused(
            protocol,
            &format!(
                "the request is signed for the service `{service}`, {}",
                s.what
            ),
        ));
    }
    for action in query.map(actions).unwrap_or_default() {
        if let Some(listed) = aws_credential_action(&action) {
            return Err(refused(
                protocol,
                &format!("the query's Action `{action}` is {}", kind(listed)),
            ));
        }
    }
    for target in headers.get_all(X_AMZ_TARGET) {
        let target = String::from_utf8_lossy(target.as_bytes());
        let operation = target.rsplit('.').next().unwrap_or_default();
        if let Some(listed) = aws_credential_action(operation) {
            return Err(refused(
                protocol,
                &format!("the X-Amz-Target `{target}` is {}", kind(listed)),
            ));
        }
    }
    let path = percent_decode(path, false).to_ascii_lowercase();
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    if let ["service", _, "operation", operation, ..] = segments.as_slice()
        && let Some(listed) = aws_credential_action(operation)
    {
        return Err(refused(
            protocol,
            &format!("the operation `{operation}` is {}", kind(listed)),
        ));
    }
    if let Some(listed) = AWS_CREDENTIAL_PATHS.iter().find(|p| {
        path.strip_prefix(*p)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
    }) {
        return Err(refused(
            protocol,
            &format!("the path {listed} hands out credentials"),
        ));
    }
    Ok(())
}

/// Checks a form-encoded body's `Action` (the Query protocol's body).
pub fn check_body(service: &str, headers: &HeaderMap, body: &[u8]) -> Result<(), Refusal> {
    if !is_form(headers) {
        return Ok(());
    }
    let text = String::from_utf8_lossy(body);
    for action in actions(&text) {
        if let Some(listed) = aws_credential_action(&action) {
            return Err(refused(
                protocol(service, None, headers),
                &format!("the form body's Action `{action}` is {}", kind(listed)),
            ));
        }
    }
    Ok(())
}

/// The refusal of a form-encoded body the proxy would not read (sent
/// with `UNSIGNED-PAYLOAD`): its `Action` could not be checked.
pub fn check_unsigned(service: &str, headers: &HeaderMap) -> Result<(), Refusal> {
    if !is_form(headers) {
        return Ok(());
    }
    let mut refusal = refused(
        protocol(service, None, headers),
        "a form-encoded body (the Query protocol, which names its Action in the body) sent with UNSIGNED-PAYLOAD cannot be checked; sign its payload hash",
    );
    refusal.reason = "sigv4-unsigned-form";
    Err(refusal)
}

fn kind(listed: &str) -> String {
    if listed == "AssumeRole" {
        "one of STS's AssumeRole actions, which issue temporary credentials".to_string()
    } else {
        format!("{listed}, an action that hands out credentials")
    }
}

/// Whether the body is form-encoded (any `Content-Type` saying so).
pub fn is_form(headers: &HeaderMap) -> bool {
    headers.get_all(CONTENT_TYPE).iter().any(|v| {
        String::from_utf8_lossy(v.as_bytes())
            .trim()
            .to_ascii_lowercase()
            .starts_with("application/x-www-form-urlencoded")
    })
}

/// The values of every `Action` parameter (its name without case) of a
/// query or form body, percent-decoded.
fn actions(text: &str) -> Vec<String> {
    text.split('&')
        .filter_map(|pair| {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            percent_decode(name, true)
                .eq_ignore_ascii_case("action")
                .then(|| percent_decode(value, true))
        })
        .collect()
}

/// `%XX` decoded (and `+` as a space, with `plus`); a malformed escape is
/// kept as it is.
fn percent_decode(text: &str, plus: bool) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| char::from(b).to_digit(16);
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                match (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                    (Some(h), Some(l)) => {
                        // Two hex digits: at most 255.
                        out.push(u8::try_from(h * 16 + l).unwrap_or(b'%'));
                        i += 3;
                        continue;
                    }
                    _ => out.push(b'%'),
                }
            }
            b'+' if plus => out.push(b' '),
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
#[path = "minting_tests.rs"]
mod tests;
