#![allow(clippy::unwrap_used, clippy::expect_used)]

use http::HeaderValue;

use super::*;

fn host(name: &str) -> Host {
    Host::Name(name.to_string())
}

fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, v) in pairs {
        h.append(
            http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
            HeaderValue::from_str(v).unwrap(),
        );
    }
    h
}

const BEDROCK: &str = "bedrock-runtime.us-east-1.amazonaws.com";
const FORM: (&str, &str) = (
    "content-type",
    "application/x-www-form-urlencoded; charset=utf-8",
);

#[test]
fn a_bedrock_request_passes() {
    let h = headers(&[("content-type", "application/json")]);
    check_head(Some(&host(BEDROCK)), "bedrock", "/model/m/invoke", &h).unwrap();
    check_body("bedrock", &h, br#"{"Action":"GetSessionToken"}"#).unwrap();
    check_unsigned("s3", &headers(&[])).unwrap();
}

#[test]
fn a_credential_service_is_refused_by_its_host_or_its_signing_name_with_an_aws_error() {
    let h = headers(&[FORM]);
    let r = check_head(Some(&host("sts.amazonaws.com")), "sts", "/", &h).unwrap_err();
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    assert_eq!(r.reason, REASON);
    assert!(
        r.why.starts_with("sts.amazonaws.com is a host of STS"),
        "{}",
        r.why
    );
    let aws = r.aws.unwrap();
    assert_eq!(aws.content_type, "text/xml");
    assert!(
        aws.body.contains("<Code>AccessDenied</Code>"),
        "{}",
        aws.body
    );
    assert!(
        aws.body
            .contains("hermes egress refused: sts.amazonaws.com is a host of STS")
    );
    // Signed for IAM towards a host of another name.
    let r = check_head(Some(&host(BEDROCK)), "iam", "/", &h).unwrap_err();
    assert!(r.why.contains("signed for the service `iam`"), "{}", r.why);
    // The SSO portal's REST-JSON GET gets a JSON error.
    let r = check_head(
        Some(&host("portal.sso.us-east-1.amazonaws.com")),
        "awsssoportal",
        "/federation/credentials?account_id=1&role_name=r",
        &headers(&[]),
    )
    .unwrap_err();
    let aws = r.aws.unwrap();
    assert_eq!(aws.error_type, Some("AccessDeniedException"));
    let json: serde_json::Value = serde_json::from_str(&aws.body).unwrap();
    assert_eq!(json["__type"], "AccessDeniedException");
    assert!(
        json["message"]
            .as_str()
            .unwrap()
            .contains("IAM Identity Center")
    );
}

#[test]
fn a_credential_action_is_refused_wherever_it_is_named() {
    let bedrock = host(BEDROCK);
    let none = headers(&[]);
    // The query, in any case and percent-encoded.
    for query in [
        "/?Action=GetSessionToken&Version=2011-06-15",
        "/?version=1&action=assumerolewithwebidentity",
        "/?Action=GetSession%54oken",
    ] {
        let r = check_head(Some(&bedrock), "bedrock", query, &none).unwrap_err();
        assert!(r.why.contains("the query's Action"), "{query}: {}", r.why);
        assert!(r.aws.unwrap().body.starts_with("<?xml"), "{query}");
    }
    // The form body.
    let form = headers(&[FORM]);
    let r = check_body(
        "bedrock",
        &form,
        b"Version=2010-05-08&Action=CreateAccessKey&UserName=u",
    )
    .unwrap_err();
    assert!(
        r.why
            .contains("the form body's Action `CreateAccessKey` is CreateAccessKey"),
        "{}",
        r.why
    );
    let r = check_body("bedrock", &form, b"Action=Assume%52ole&RoleArn=x").unwrap_err();
    assert!(r.why.contains("AssumeRole actions"), "{}", r.why);
    // A form body the proxy would not read.
    let r = check_unsigned("bedrock", &form).unwrap_err();
    assert_eq!(r.reason, "sigv4-unsigned-form");
    // The JSON protocols' target.
    let target = headers(&[
        (
            "x-amz-target",
            "AWSCognitoIdentityService.GetCredentialsForIdentity",
        ),
        ("content-type", "application/x-amz-json-1.1"),
    ]);
    let r = check_head(Some(&bedrock), "bedrock", "/", &target).unwrap_err();
    assert!(r.why.contains("X-Amz-Target"), "{}", r.why);
    assert_eq!(r.aws.unwrap().error_type, Some("AccessDeniedException"));
    let ecr = headers(&[(
        "x-amz-target",
        "AmazonEC2ContainerRegistry_V20150921.GetAuthorizationToken",
    )]);
    assert!(check_head(Some(&bedrock), "ecr", "/", &ecr).is_err());
    // An RPC operation path, and a REST path.
    assert!(
        check_head(
            Some(&bedrock),
            "bedrock",
            "/service/S/operation/GetSessionToken",
            &none
        )
        .is_err()
    );
    assert!(
        check_head(
            Some(&bedrock),
            "codeartifact",
            "/v1/authorization-token?domain=d",
            &none
        )
        .is_err()
    );
    // The names alone, not as a part of another.
    check_head(
        Some(&bedrock),
        "bedrock",
        "/model/GetSessionToken/invoke",
        &none,
    )
    .unwrap();
    check_head(
        Some(&bedrock),
        "bedrock",
        "/?NotAction=GetSessionToken",
        &none,
    )
    .unwrap();
}

#[test]
fn the_message_is_escaped_in_xml() {
    let r = refused(Protocol::Xml, "a <b> & \"c\"");
    let body = r.aws.unwrap().body;
    assert!(body.contains("a &lt;b&gt; &amp; &quot;c&quot;"), "{body}");
}
