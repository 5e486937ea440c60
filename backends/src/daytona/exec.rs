//! One command in a Daytona sandbox, through a session of its own.
//!
//! The environment (with the exec marker) goes up as a file through the
//! toolbox's upload (a request body), never into the command string; the
//! session's command is a fixed `/bin/sh` script that sources the file,
//! deletes it, enters the directory and execs the arguments with no input.
//! The command runs asynchronously and its log is followed over the
//! toolbox's WebSocket, split back into stdout and stderr as it comes. On
//! timeout the session is deleted (the daemon kills its processes) and the
//! marked process tree is killed through `process/execute`; the outcome is
//! then exit 124, `timed_out`.

use base64::Engine as _;
use futures_util::StreamExt as _;
use reqwest::StatusCode;
use reqwest::header::{CONNECTION, SEC_WEBSOCKET_ACCEPT, SEC_WEBSOCKET_KEY, UPGRADE};
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::time::Instant;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::Role;

use super::demux::{Demux, Stream};
use super::{DaytonaDriver, DaytonaError, api, path_segment};
use crate::cloud_http::Retry;
use crate::exec::{
    EXEC_ID_ENV, ExecIo, ExecOutcome, ExecRequest, KILL_SCRIPT, TIMEOUT_EXIT_CODE, new_exec_id,
};
use hermes_model::config::is_env_name;

/// How long the kill after a timeout may take.
const KILL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

type Out<'a> = &'a mut (dyn AsyncWrite + Unpin + Send);

pub(super) async fn run(
    d: &DaytonaDriver,
    id: &str,
    req: &ExecRequest,
    io: ExecIo<'_>,
) -> Result<ExecOutcome, DaytonaError> {
    if req.cmd.is_empty() {
        return Err(DaytonaError::EmptyCommand);
    }
    if let Some((bad, _)) = req.env.iter().find(|(k, _)| !is_env_name(k)) {
        return Err(DaytonaError::BadEnvName(bad.clone()));
    }
    let deadline = Instant::now() + req.timeout;
    let toolbox = d.toolbox_base(id).await?;
    let marker = new_exec_id();
    let session = format!("hermes-{marker}");
    // In a folder of its own that only its owner can enter: the values
    // are never readable by another user of the sandbox, even for the
    // moment before the script removes them.
    let env_path = format!("/tmp/.hermes-{marker}/env");
    let mut env = req.env.clone();
    env.push((EXEC_ID_ENV.to_owned(), marker.clone()));
    d.upload(&toolbox, &env_path, api::env_file(&env).as_bytes(), "700")
        .await?;

    let url = format!("{toolbox}/process/session");
    let body = serde_json::json!({ "sessionId": session });
    d.call("create a session", Retry::Once, &|| {
        d.request(reqwest::Method::POST, &url).json(&body)
    })
    .await?;

    let result = run_in_session(d, &toolbox, &session, &env_path, req, io, deadline).await;
    match result {
        Ok(Some(exit_code)) => {
            delete_session(d, &toolbox, &session).await;
            Ok(ExecOutcome {
                exit_code,
                timed_out: false,
            })
        }
        Ok(None) => {
            tracing::info!(sandbox = id, timeout = ?req.timeout, "the command timed out; killing it");
            let kill = async {
                delete_session(d, &toolbox, &session).await;
                kill_marked(d, &toolbox, &marker).await;
            };
            if tokio::time::timeout(KILL_TIMEOUT, kill).await.is_err() {
                tracing::warn!(sandbox = id, "killing the timed-out command took too long");
            }
            Ok(ExecOutcome {
                exit_code: TIMEOUT_EXIT_CODE,
                timed_out: true,
            })
        }
        Err(e) => {
            delete_session(d, &toolbox, &session).await;
            Err(e)
        }
    }
}

/// Starts the command and follows it to its end: `Some(exit code)`, or
/// `None` when `deadline` came first.
async fn run_in_session(
    d: &DaytonaDriver,
    toolbox: &str,
    session: &str,
    env_path: &str,
    req: &ExecRequest,
    io: ExecIo<'_>,
    deadline: Instant,
) -> Result<Option<i64>, DaytonaError> {
    let command = api::session_command(env_path, req.cwd.as_deref(), &req.cmd);
    let body = api::SessionExecute {
        command,
        run_async: true,
        async_: true,
    };
    let url = format!("{toolbox}/process/session/{}/exec", path_segment(session));
    let response = d
        .call("run the command", Retry::Once, &|| {
            d.request(reqwest::Method::POST, &url).json(&body)
        })
        .await?;
    let started: api::SessionCommand = DaytonaDriver::json("run the command", response).await?;
    let Some(cmd_id) = started.cmd_id else {
        return Err(DaytonaError::Protocol {
            what: "run the command".to_owned(),
            detail: "no cmdId in the answer".to_owned(),
        });
    };
    let ExecIo { stdout, stderr, .. } = io;
    let work = async {
        follow(d, toolbox, session, &cmd_id, req.timeout, stdout, stderr).await?;
        exit_code(d, toolbox, session, &cmd_id).await
    };
    match tokio::time::timeout_at(deadline, work).await {
        Ok(result) => result.map(Some),
        Err(_) => Ok(None),
    }
}

/// Streams the command's log until the daemon closes it (the command
/// ended).
async fn follow(
    d: &DaytonaDriver,
    toolbox: &str,
    session: &str,
    cmd_id: &str,
    timeout: std::time::Duration,
    stdout: Out<'_>,
    stderr: Out<'_>,
) -> Result<(), DaytonaError> {
    const WHAT: &str = "follow the command's log";
    let url = format!(
        "{toolbox}/process/session/{}/command/{}/logs",
        path_segment(session),
        path_segment(cmd_id)
    );
    let key = base64::engine::general_purpose::STANDARD.encode(hex_bytes(&new_exec_id()));
    let response = d
        .send(WHAT, Retry::Idempotent, &|| {
            d.request(reqwest::Method::GET, &url)
                .query(&[("follow", "true")])
                .header(CONNECTION, "Upgrade")
                .header(UPGRADE, "websocket")
                .header("Sec-WebSocket-Version", "13")
                .header(SEC_WEBSOCKET_KEY, &key)
                // The log lasts as long as the command may.
                .timeout(timeout + KILL_TIMEOUT)
        })
        .await?;
    let mut demux = Demux::default();
    if response.status().is_success() {
        // No upgrade: the whole log so far, as a plain answer.
        let bytes = response
            .bytes()
            .await
            .map_err(|source| DaytonaError::Transport {
                what: WHAT.to_owned(),
                source,
            })?;
        let chunks = demux.push(&bytes);
        write_chunks(chunks, demux.finish(), stdout, stderr).await?;
        return Ok(());
    }
    if response.status() != StatusCode::SWITCHING_PROTOCOLS {
        return Err(d.refused(WHAT, response).await);
    }
    let expected = derive_accept_key(key.as_bytes());
    let accepted = response
        .headers()
        .get(SEC_WEBSOCKET_ACCEPT)
        .and_then(|v| v.to_str().ok());
    if accepted != Some(expected.as_str()) {
        return Err(DaytonaError::Protocol {
            what: WHAT.to_owned(),
            detail: "wrong Sec-WebSocket-Accept".to_owned(),
        });
    }
    let upgraded = response
        .upgrade()
        .await
        .map_err(|source| DaytonaError::Transport {
            what: WHAT.to_owned(),
            source,
        })?;
    let mut ws = WebSocketStream::from_raw_socket(upgraded, Role::Client, None).await;
    while let Some(message) = ws.next().await {
        let bytes = match message {
            Ok(Message::Binary(b)) => b.to_vec(),
            Ok(Message::Text(t)) => t.as_bytes().to_vec(),
            Ok(Message::Close(_)) => break,
            Ok(_) => continue,
            Err(e) => {
                return Err(DaytonaError::Protocol {
                    what: WHAT.to_owned(),
                    detail: e.to_string(),
                });
            }
        };
        write_chunks(demux.push(&bytes), None, stdout, stderr).await?;
    }
    write_chunks(Vec::new(), demux.finish(), stdout, stderr).await
}

async fn write_chunks(
    chunks: Vec<(Stream, Vec<u8>)>,
    last: Option<(Stream, Vec<u8>)>,
    stdout: Out<'_>,
    stderr: Out<'_>,
) -> Result<(), DaytonaError> {
    for (stream, bytes) in chunks.into_iter().chain(last) {
        let out: &mut (dyn AsyncWrite + Unpin + Send) = match stream {
            Stream::Stdout => &mut *stdout,
            Stream::Stderr => &mut *stderr,
        };
        out.write_all(&bytes).await.map_err(DaytonaError::Output)?;
        out.flush().await.map_err(DaytonaError::Output)?;
    }
    Ok(())
}

/// The exit code of an ended command (polled briefly: the daemon writes it
/// right after the log ends).
async fn exit_code(
    d: &DaytonaDriver,
    toolbox: &str,
    session: &str,
    cmd_id: &str,
) -> Result<i64, DaytonaError> {
    let url = format!(
        "{toolbox}/process/session/{}/command/{}",
        path_segment(session),
        path_segment(cmd_id)
    );
    let mut wait = std::time::Duration::from_millis(20);
    loop {
        let response = d
            .call("get the exit code", Retry::Idempotent, &|| {
                d.request(reqwest::Method::GET, &url)
            })
            .await?;
        let command: api::SessionCommand =
            DaytonaDriver::json("get the exit code", response).await?;
        if let Some(code) = command.exit_code {
            return Ok(code);
        }
        tokio::time::sleep(wait).await;
        wait = (wait * 2).min(d.poll);
    }
}

async fn delete_session(d: &DaytonaDriver, toolbox: &str, session: &str) {
    let url = format!("{toolbox}/process/session/{}", path_segment(session));
    let result = d
        .send("delete the session", Retry::Idempotent, &|| {
            d.request(reqwest::Method::DELETE, &url)
        })
        .await;
    match result {
        Ok(r) if r.status().is_success() || r.status() == StatusCode::NOT_FOUND => {}
        Ok(r) => tracing::warn!(status = r.status().as_u16(), "deleting the session failed"),
        Err(e) => tracing::warn!(error = %e, "deleting the session failed"),
    }
}

/// Kills every process carrying the exec's marker, and their descendants.
async fn kill_marked(d: &DaytonaDriver, toolbox: &str, marker: &str) {
    let marker: String = marker.chars().filter(char::is_ascii_hexdigit).collect();
    let body = api::Execute {
        command: format!("/bin/sh -c '{KILL_SCRIPT}' hermes-kill {marker}"),
        timeout: KILL_TIMEOUT.as_secs(),
    };
    let url = format!("{toolbox}/process/execute");
    let result = d
        .call("kill the command", Retry::Idempotent, &|| {
            d.request(reqwest::Method::POST, &url).json(&body)
        })
        .await;
    if let Err(e) = result {
        tracing::warn!(error = %e, "killing the timed-out command failed");
    }
}

fn hex_bytes(hex: &str) -> Vec<u8> {
    hex.as_bytes()
        .chunks(2)
        .filter_map(|pair| std::str::from_utf8(pair).ok())
        .filter_map(|pair| u8::from_str_radix(pair, 16).ok())
        .take(16)
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn websocket_keys_are_16_bytes() {
        assert_eq!(hex_bytes(&new_exec_id()).len(), 16);
    }
}
