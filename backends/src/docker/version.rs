//! The engine's API version, read the way the Docker CLI reads it: from the
//! `Api-Version` header of one `HEAD /_ping`.
//!
//! bollard's `negotiate_version` asks `GET /version` instead, which the
//! engine answers by gathering the versions of its components (Debian's
//! 20.10 runs `runc --version` and `docker-init --version` for it): several
//! milliseconds on every command, against well under one for the ping.

use std::time::Duration;

use bollard::ClientVersion;
use bollard::errors::Error as BollardError;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// How long the ping may take.
const PING_TIMEOUT: Duration = Duration::from_secs(30);

/// The most of the answer that is read: the status line and headers of a
/// ping are a few hundred bytes.
const MAX_HEAD: usize = 16 * 1024;

/// Pings the engine on the Unix socket `path` and returns the API version
/// it names; `None` when its answer has no `Api-Version` header.
pub(crate) async fn ping_unix(path: &str) -> Result<Option<ClientVersion>, BollardError> {
    let ping = async {
        let mut stream = tokio::net::UnixStream::connect(path).await?;
        stream
            .write_all(b"HEAD /_ping HTTP/1.1\r\nHost: docker\r\nConnection: close\r\n\r\n")
            .await?;
        let mut head = Vec::with_capacity(1024);
        let mut chunk = [0u8; 1024];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < MAX_HEAD {
            let n = stream.read(&mut chunk).await?;
            if n == 0 {
                break;
            }
            head.extend_from_slice(&chunk[..n]);
        }
        parse_ping(&head)
    };
    tokio::time::timeout(PING_TIMEOUT, ping)
        .await
        .map_err(|_| BollardError::RequestTimeoutError)?
}

/// Reads the status line and the `Api-Version` header of a ping's answer.
fn parse_ping(head: &[u8]) -> Result<Option<ClientVersion>, BollardError> {
    let text = String::from_utf8_lossy(head);
    let mut lines = text.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status = status_line
        .strip_prefix("HTTP/1.")
        .and_then(|rest| rest.get(2..5))
        .and_then(|code| code.parse::<u16>().ok());
    match status {
        Some(200) => {}
        Some(status_code) => {
            return Err(BollardError::DockerResponseServerError {
                status_code,
                message: format!("ping answered {status_line:?}"),
            });
        }
        None => {
            return Err(BollardError::DockerResponseServerError {
                status_code: 0,
                message: format!("ping answered {status_line:?}, not HTTP"),
            });
        }
    }
    for line in lines.take_while(|l| !l.is_empty()) {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        if name.trim().eq_ignore_ascii_case("api-version") {
            return parse_version(value.trim())
                .map(Some)
                .ok_or(BollardError::APIVersionParseError {});
        }
    }
    Ok(None)
}

/// `1.41` → 1.41.
fn parse_version(text: &str) -> Option<ClientVersion> {
    let (major, minor) = text.split_once('.')?;
    Some(ClientVersion {
        major_version: major.parse().ok()?,
        minor_version: minor.parse().ok()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn version(v: Option<ClientVersion>) -> Option<(usize, usize)> {
        v.map(|v| (v.major_version, v.minor_version))
    }

    #[test]
    fn the_api_version_comes_from_the_header() {
        let answer = b"HTTP/1.1 200 OK\r\nApi-Version: 1.41\r\nContent-Length: 2\r\nServer: Docker/20.10.24+dfsg1 (linux)\r\n\r\n";
        assert_eq!(version(parse_ping(answer).ok().flatten()), Some((1, 41)));
        let lower = b"HTTP/1.0 200 OK\r\napi-version:1.53\r\n\r\n";
        assert_eq!(version(parse_ping(lower).ok().flatten()), Some((1, 53)));
    }

    #[test]
    fn no_header_is_none_and_errors_are_errors() {
        assert!(matches!(parse_ping(b"HTTP/1.1 200 OK\r\n\r\n"), Ok(None)));
        assert!(matches!(
            parse_ping(b"HTTP/1.1 500 Internal Server Error\r\nApi-Version: 1.41\r\n\r\n"),
            Err(BollardError::DockerResponseServerError {
                status_code: 500,
                ..
            })
        ));
        assert!(matches!(
            parse_ping(b"SSH-2.0-OpenSSH\r\n"),
            Err(BollardError::DockerResponseServerError { .. })
        ));
        assert!(matches!(
            parse_ping(b"HTTP/1.1 200 OK\r\nApi-Version: one\r\n\r\n"),
            Err(BollardError::APIVersionParseError {})
        ));
        // The header must be in the head, not in a body.
        assert!(matches!(
            parse_ping(b"HTTP/1.1 200 OK\r\n\r\nApi-Version: 1.41\r\n"),
            Ok(None)
        ));
    }
}
