//! Where a client asks to go: the authority of a CONNECT request
//! (`host:port`), the absolute URL of a plain-HTTP proxy request, and the
//! Host header inside a tunnel, all parsed with [`crate::policy::parse_host`]
//! so that every spelling of an address is seen for what it is.

use std::fmt;

use crate::policy::{Host, HostError, parse_host};

/// A host and port to connect to.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Target {
    pub host: Host,
    pub port: u16,
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.host {
            Host::Ip(std::net::IpAddr::V6(ip)) => write!(f, "[{ip}]:{}", self.port),
            host => write!(f, "{host}:{}", self.port),
        }
    }
}

impl Target {
    /// The authority as clients write it in a `Host` header over TLS: the
    /// port left out when it is 443. An HTTP/2 request upstream carries
    /// it as `:authority`, so that a server that reads the host from there
    /// sees what the client saw (and signed, with AWS SigV4).
    pub fn https_authority(&self) -> String {
        match (&self.host, self.port) {
            (Host::Ip(std::net::IpAddr::V6(ip)), 443) => format!("[{ip}]"),
            (host, 443) => host.to_string(),
            _ => self.to_string(),
        }
    }
}

/// Why a request target was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TargetError {
    #[error("the target is not host:port")]
    Form,
    #[error("the port is missing or not 1-65535")]
    Port,
    #[error("user information in the target is not allowed")]
    UserInfo,
    #[error("only http:// URLs go through the plain port; https goes through CONNECT")]
    Scheme,
    #[error("bad host: {0}")]
    Host(#[from] HostError),
}

/// Parses `host:port`, `[v6]:port`, or `host` alone when `default_port`
/// is given. Nothing else may stand in an authority: no user information,
/// no path, no spaces.
pub fn parse_authority(text: &str, default_port: Option<u16>) -> Result<Target, TargetError> {
    if text.contains('@') {
        return Err(TargetError::UserInfo);
    }
    if text.is_empty()
        || text.bytes().any(|b| {
            b.is_ascii_whitespace()
                || b.is_ascii_control()
                || matches!(b, b'/' | b'?' | b'#' | b'\\' | b'%')
        })
    {
        return Err(TargetError::Form);
    }
    let (host, port) = if text.starts_with('[') {
        let end = text.find(']').ok_or(TargetError::Form)?;
        let (host, rest) = text.split_at(end + 1);
        match rest {
            "" => (host, None),
            _ => (host, Some(rest.strip_prefix(':').ok_or(TargetError::Form)?)),
        }
    } else {
        match text.rsplit_once(':') {
            Some((host, _)) if host.contains(':') => return Err(TargetError::Form),
            Some((host, port)) => (host, Some(port)),
            None => (text, None),
        }
    };
    let port = match port {
        Some(p) => parse_port(p)?,
        None => default_port.ok_or(TargetError::Port)?,
    };
    Ok(Target {
        host: parse_host(host)?,
        port,
    })
}

fn parse_port(text: &str) -> Result<u16, TargetError> {
    if text.is_empty() || text.len() > 5 || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(TargetError::Port);
    }
    match text.parse::<u16>() {
        Ok(0) | Err(_) => Err(TargetError::Port),
        Ok(port) => Ok(port),
    }
}

/// The target of a CONNECT request: `host:port`, the port required.
pub fn parse_connect(authority: &str) -> Result<Target, TargetError> {
    parse_authority(authority, None)
}

/// The target of an absolute-form request on the plain port
/// (`http://host[:port]/path`): the target and the origin-form path.
pub fn parse_absolute(uri: &http::Uri) -> Result<(Target, String), TargetError> {
    match uri.scheme_str() {
        Some(s) if s.eq_ignore_ascii_case("http") => {}
        _ => return Err(TargetError::Scheme),
    }
    let authority = uri.authority().ok_or(TargetError::Form)?;
    let target = parse_authority(authority.as_str(), Some(80))?;
    let path = uri
        .path_and_query()
        .map_or_else(|| "/".to_string(), |pq| pq.as_str().to_string());
    let path = if path.starts_with('/') {
        path
    } else {
        format!("/{path}")
    };
    Ok((target, path))
}

/// Whether a Host header (or an absolute URL's authority) inside a tunnel
/// names the tunnel's own target; a missing port means the tunnel's port
/// (the client spoke of its default, which the tunnel already fixed).
pub fn host_header_matches(value: &str, tunnel: &Target) -> bool {
    parse_authority(value, Some(tunnel.port)).is_ok_and(|t| t == *tunnel)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use std::net::{IpAddr, Ipv4Addr};

    #[test]
    fn the_https_authority_leaves_out_port_443_only() {
        let t = |a: &str| parse_connect(a).unwrap().https_authority();
        assert_eq!(
            t("bedrock-runtime.us-east-1.amazonaws.com:443"),
            "bedrock-runtime.us-east-1.amazonaws.com"
        );
        assert_eq!(t("api.openai.com:8443"), "api.openai.com:8443");
        assert_eq!(t("[::1]:443"), "[::1]");
        assert_eq!(t("[::1]:8443"), "[::1]:8443");
    }

    #[test]
    fn connect_targets_need_a_host_and_a_port() {
        let t = parse_connect("API.openai.com:443").unwrap();
        assert_eq!(t.host, Host::Name("api.openai.com".into()));
        assert_eq!(t.port, 443);
        assert_eq!(t.to_string(), "api.openai.com:443");
        let v6 = parse_connect("[::1]:8443").unwrap();
        assert_eq!(v6.to_string(), "[::1]:8443");
        assert_eq!(
            parse_connect("0x7f.1:80").unwrap().host,
            Host::Ip(IpAddr::V4(Ipv4Addr::LOCALHOST))
        );
        for bad in [
            "api.openai.com",
            "api.openai.com:",
            "api.openai.com:0",
            "api.openai.com:65536",
            "api.openai.com:+443",
            "api.openai.com:443/x",
            "user@api.openai.com:443",
            "::1:443",
            "[::1]443",
            "[::1",
            ":443",
            "a b:443",
            "api.openai.com%00:443",
        ] {
            assert!(parse_connect(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn absolute_urls_go_to_http_only_and_keep_their_path() {
        let uri: http::Uri = "http://example.com/a/b?c=d".parse().unwrap();
        let (t, path) = parse_absolute(&uri).unwrap();
        assert_eq!(t.to_string(), "example.com:80");
        assert_eq!(path, "/a/b?c=d");
        let https: http::Uri = "https://example.com/".parse().unwrap();
        assert_eq!(parse_absolute(&https).unwrap_err(), TargetError::Scheme);
        let origin: http::Uri = "/only/a/path".parse().unwrap();
        assert!(parse_absolute(&origin).is_err());
    }

    #[test]
    fn the_host_header_must_name_the_tunnel() {
        let tunnel = parse_connect("api.openai.com:443").unwrap();
        assert!(host_header_matches("api.openai.com", &tunnel));
        assert!(host_header_matches("API.OPENAI.COM:443", &tunnel));
        assert!(!host_header_matches("api.openai.com:444", &tunnel));
        assert!(!host_header_matches("evil.test", &tunnel));
        assert!(!host_header_matches("", &tunnel));
    }
}
