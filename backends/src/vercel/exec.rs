//! One command in a Vercel sandbox: started with its environment in the
//! request body, its NDJSON log followed (stdout and stderr lines apart)
//! as it comes, then its exit code. On timeout the command is killed
//! through the kill endpoint, then every process carrying the exec's
//! marker is killed by a second command; the outcome is exit 124,
//! `timed_out`.

use futures_util::StreamExt as _;
use reqwest::Method;
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::time::Instant;

use super::{VercelDriver, VercelError, api, path_segment};
use crate::cloud_http::Retry;
use crate::exec::{
    EXEC_ID_ENV, ExecIo, ExecOutcome, ExecRequest, KILL_SCRIPT, TIMEOUT_EXIT_CODE, new_exec_id,
};

/// How long the kill after a timeout may take.
const KILL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// SIGKILL.
const SIGKILL: i32 = 9;

type Out<'a> = &'a mut (dyn AsyncWrite + Unpin + Send);

pub(super) async fn run(
    d: &VercelDriver,
    id: &str,
    req: &ExecRequest,
    io: ExecIo<'_>,
) -> Result<ExecOutcome, VercelError> {
    let Some((program, args)) = req.cmd.split_first() else {
        return Err(VercelError::EmptyCommand);
    };
    let deadline = Instant::now() + req.timeout;
    let marker = new_exec_id();
    let mut env: std::collections::BTreeMap<String, String> = req.env.iter().cloned().collect();
    env.insert(EXEC_ID_ENV.to_owned(), marker.clone());
    let body = api::RunCommand {
        command: program.clone(),
        args: args.to_vec(),
        cwd: req.cwd.clone(),
        env,
        sudo: false,
    };
    let cmd_id = start(d, id, &body).await?;
    let ExecIo { stdout, stderr, .. } = io;
    let work = async {
        follow(d, id, &cmd_id, req.timeout, stdout, stderr).await?;
        exit_code(d, id, &cmd_id, req.timeout).await
    };
    match tokio::time::timeout_at(deadline, work).await {
        Ok(result) => result.map(|exit_code| ExecOutcome {
            exit_code,
            timed_out: false,
        }),
        Err(_) => {
            tracing::info!(sandbox = id, timeout = ?req.timeout, "the command timed out; killing it");
            let kill = async {
                kill(d, id, &cmd_id).await;
                kill_marked(d, id, &marker).await;
            };
            if tokio::time::timeout(KILL_TIMEOUT, kill).await.is_err() {
                tracing::warn!(sandbox = id, "killing the timed-out command took too long");
            }
            Ok(ExecOutcome {
                exit_code: TIMEOUT_EXIT_CODE,
                timed_out: true,
            })
        }
    }
}

async fn start(d: &VercelDriver, id: &str, body: &api::RunCommand) -> Result<String, VercelError> {
    let url = d.url(&format!("/v1/sandboxes/{}/cmd", path_segment(id)));
    let response = d
        .call("run the command", Retry::Once, &|| {
            d.request(Method::POST, &url).json(body)
        })
        .await?;
    let started: api::CommandResponse = VercelDriver::json("run the command", response).await?;
    Ok(started.command.id)
}

/// Streams the command's log until the service ends it (the command
/// ended).
async fn follow(
    d: &VercelDriver,
    id: &str,
    cmd_id: &str,
    timeout: std::time::Duration,
    stdout: Out<'_>,
    stderr: Out<'_>,
) -> Result<(), VercelError> {
    const WHAT: &str = "follow the command's log";
    let url = d.url(&format!(
        "/v1/sandboxes/{}/cmd/{}/logs",
        path_segment(id),
        path_segment(cmd_id)
    ));
    let response = d
        .call(WHAT, Retry::Idempotent, &|| {
            // The log lasts as long as the command may.
            d.request(Method::GET, &url).timeout(timeout + KILL_TIMEOUT)
        })
        .await?;
    let content_type = response
        .headers()
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    if !content_type.starts_with("application/x-ndjson") {
        return Err(VercelError::Protocol {
            what: WHAT.to_owned(),
            detail: format!("expected application/x-ndjson, got {content_type:?}"),
        });
    }
    let mut lines = api::Lines::default();
    let mut body = response.bytes_stream();
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(|source| VercelError::Transport {
            what: WHAT.to_owned(),
            source,
        })?;
        for line in lines.push(&chunk) {
            write_line(&line, stdout, stderr).await?;
        }
    }
    if let Some(line) = lines.finish() {
        write_line(&line, stdout, stderr).await?;
    }
    Ok(())
}

async fn write_line(line: &[u8], stdout: Out<'_>, stderr: Out<'_>) -> Result<(), VercelError> {
    let parsed: api::LogLine = serde_json::from_slice(line).map_err(|e| VercelError::Protocol {
        what: "follow the command's log".to_owned(),
        detail: e.to_string(),
    })?;
    let (out, data): (&mut (dyn AsyncWrite + Unpin + Send), String) = match parsed {
        api::LogLine::Stdout(data) => (&mut *stdout, data),
        api::LogLine::Stderr(data) => (&mut *stderr, data),
        api::LogLine::Error { code, message } => {
            return Err(VercelError::Stream { code, message });
        }
    };
    out.write_all(data.as_bytes())
        .await
        .map_err(VercelError::Output)?;
    out.flush().await.map_err(VercelError::Output)
}

async fn exit_code(
    d: &VercelDriver,
    id: &str,
    cmd_id: &str,
    timeout: std::time::Duration,
) -> Result<i64, VercelError> {
    const WHAT: &str = "get the exit code";
    let url = d.url(&format!(
        "/v1/sandboxes/{}/cmd/{}",
        path_segment(id),
        path_segment(cmd_id)
    ));
    let response = d
        .call(WHAT, Retry::Idempotent, &|| {
            d.request(Method::GET, &url)
                .query(&[("wait", "true")])
                .timeout(timeout + KILL_TIMEOUT)
        })
        .await?;
    let done: api::CommandResponse = VercelDriver::json(WHAT, response).await?;
    done.command.exit_code.ok_or_else(|| VercelError::Protocol {
        what: WHAT.to_owned(),
        detail: "no exitCode after waiting".to_owned(),
    })
}

async fn kill(d: &VercelDriver, id: &str, cmd_id: &str) {
    let url = d.url(&format!(
        "/v1/sandboxes/{}/{}/kill",
        path_segment(id),
        path_segment(cmd_id)
    ));
    let body = serde_json::json!({ "signal": SIGKILL });
    if let Err(e) = d
        .call("kill the command", Retry::Idempotent, &|| {
            d.request(Method::POST, &url).json(&body)
        })
        .await
    {
        tracing::warn!(error = %e, "killing the timed-out command failed");
    }
}

/// Kills what the command left behind (its descendants), by the marker.
async fn kill_marked(d: &VercelDriver, id: &str, marker: &str) {
    let marker: String = marker.chars().filter(char::is_ascii_hexdigit).collect();
    let body = api::RunCommand {
        command: "/bin/sh".to_owned(),
        args: vec![
            "-c".to_owned(),
            KILL_SCRIPT.to_owned(),
            "hermes-kill".to_owned(),
            marker,
        ],
        cwd: None,
        env: std::collections::BTreeMap::new(),
        sudo: false,
    };
    let result = async {
        let cmd_id = start(d, id, &body).await?;
        exit_code(d, id, &cmd_id, KILL_TIMEOUT).await
    }
    .await;
    if let Err(e) = result {
        tracing::warn!(error = %e, "killing the marked processes failed");
    }
}
