//! Commands and files in a Modal sandbox.
//!
//! A command runs through `ContainerExec` as `/bin/sh -c <bootstrap>
//! hermes-exec <cmd…>`: the bootstrap reads the environment from the
//! command's standard input (`ContainerExecPutInput`, indexed so a resent
//! message is applied once), exports it together with the exec marker
//! ([`EXEC_ID_ENV`]), and `exec`s the command, which then reads the rest of
//! the input. So no value is ever on a command line. Standard output and
//! error arrive as two streams (`ContainerExecGetOutput`, raw bytes, resumed
//! from the last batch seen), written to the caller as they come; the last
//! batch carries the exit code.
//!
//! On timeout a second exec runs the kill script ([`KILL_SCRIPT`]) with the
//! marker, which stops and kills every process of the command inside the
//! sandbox, and the outcome is [`TIMEOUT_EXIT_CODE`] with `timed_out`. The
//! service's own `timeout_secs` is set a little later, as a backstop should
//! hermes die first.
//!
//! Files go through exec too: `write_file` pipes the bytes into `cat` (the
//! parents made with `mkdir -p`), `read_file` reads them from `cat`'s output.

use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::error::ModalError;
use super::pb;
use super::rpc::{POLL_DEADLINE, POLL_SECS, Retry, Rpc, UNARY_DEADLINE, retryable};
use crate::cloud::{RETRY_ATTEMPTS, retry_delay};
use crate::env_header;
use crate::exec::{ExecIo, ExecOutcome, ExecRequest, KILL_SCRIPT, TIMEOUT_EXIT_CODE, new_exec_id};

/// Writes its standard input to `$1`, making the parent directories.
const WRITE_SCRIPT: &str = r#"case $1 in */*) mkdir -p -- "${1%/*}" || exit 1 ;; esac
cat > "$1""#;

/// How long after the command's timeout the service kills it on its own.
const BACKSTOP: Duration = Duration::from_secs(30);

/// The largest piece of input sent in one message.
const INPUT_CHUNK: usize = 256 * 1024;

/// How long file transfers may take.
const FILE_TIMEOUT: Duration = Duration::from_secs(300);

/// Runs `req` in the sandbox's task `task`, streaming its output to `io`.
pub(crate) async fn run(
    rpc: &Rpc,
    task: &str,
    req: &ExecRequest,
    io: ExecIo<'_>,
) -> Result<ExecOutcome, ModalError> {
    if req.cmd.is_empty() {
        return Err(ModalError::BadRequest("no command given".to_string()));
    }
    let marker = new_exec_id();
    let header = header(&req.env, &marker)?;
    let mut command = vec![
        "/bin/sh".to_string(),
        "-c".to_string(),
        env_header::BOOTSTRAP.to_string(),
        "hermes-exec".to_string(),
    ];
    command.extend(req.cmd.iter().cloned());
    let backstop = req.timeout.saturating_add(BACKSTOP).as_secs().max(1);
    let msg = pb::ContainerExecRequest {
        task_id: task.to_string(),
        command,
        stdout_output: pb::ExecOutputOption::Pipe as i32,
        stderr_output: pb::ExecOutputOption::Pipe as i32,
        timeout_secs: u32::try_from(backstop).unwrap_or(u32::MAX),
        workdir: req.cwd.clone(),
        secret_ids: Vec::new(),
    };
    // Starting a command is not repeated: it could run twice.
    let exec_id = rpc
        .call(
            "ContainerExec",
            Retry::No,
            UNARY_DEADLINE,
            msg,
            |mut c, r| async move { c.container_exec(r).await },
        )
        .await?
        .exec_id;
    tracing::debug!(task, exec = %exec_id, "modal exec started");

    let ExecIo {
        stdin,
        stdout,
        stderr,
    } = io;
    let streamed = async {
        let outputs = async {
            tokio::try_join!(
                output(rpc, &exec_id, pb::FileDescriptor::Stdout, stdout),
                output(rpc, &exec_id, pb::FileDescriptor::Stderr, stderr),
            )
        };
        let input = send_input(rpc, &exec_id, header, stdin);
        tokio::pin!(outputs, input);
        let mut input_done = false;
        loop {
            tokio::select! {
                codes = &mut outputs => break codes,
                sent = &mut input, if !input_done => {
                    input_done = true;
                    if let Err(error) = sent {
                        // The outputs tell what became of the command.
                        tracing::warn!(exec = %exec_id, %error, "modal exec input failed");
                    }
                }
            }
        }
    };
    match tokio::time::timeout(req.timeout, streamed).await {
        Ok(codes) => {
            let (out_code, err_code) = codes?;
            let exit_code = match out_code.or(err_code) {
                Some(code) => code,
                None => wait(rpc, &exec_id).await?,
            };
            Ok(ExecOutcome {
                exit_code: i64::from(exit_code),
                timed_out: false,
            })
        }
        Err(_) => {
            tracing::info!(exec = %exec_id, timeout = ?req.timeout, "modal exec timed out; killing it");
            kill(rpc, task, &marker).await?;
            Ok(ExecOutcome {
                exit_code: TIMEOUT_EXIT_CODE,
                timed_out: true,
            })
        }
    }
}

/// Writes `contents` to `path` in the sandbox, parents made.
pub(crate) async fn write_file(
    rpc: &Rpc,
    id: &str,
    task: &str,
    path: &str,
    contents: &[u8],
) -> Result<(), ModalError> {
    let req = file_request(["/bin/sh", "-c", WRITE_SCRIPT, "hermes-write", path], path)?;
    let mut input: &[u8] = contents;
    let mut sink = tokio::io::sink();
    let mut err = Vec::new();
    let io = ExecIo {
        stdin: Some(&mut input),
        stdout: &mut sink,
        stderr: &mut err,
    };
    let outcome = run(rpc, task, &req, io).await?;
    check_file("write", id, path, outcome, &err)
}

/// Reads `path` from the sandbox.
pub(crate) async fn read_file(
    rpc: &Rpc,
    id: &str,
    task: &str,
    path: &str,
) -> Result<Vec<u8>, ModalError> {
    let req = file_request(["cat", "--", path], path)?;
    let mut out = Vec::new();
    let mut err = Vec::new();
    let io = ExecIo {
        stdin: None,
        stdout: &mut out,
        stderr: &mut err,
    };
    let outcome = run(rpc, task, &req, io).await?;
    check_file("read", id, path, outcome, &err)?;
    Ok(out)
}

fn file_request<const N: usize>(cmd: [&str; N], path: &str) -> Result<ExecRequest, ModalError> {
    if path.is_empty() || path.contains('\0') {
        return Err(ModalError::BadRequest(format!("file path {path:?}")));
    }
    Ok(ExecRequest {
        cmd: cmd.iter().map(|s| s.to_string()).collect(),
        env: Vec::new(),
        cwd: None,
        timeout: FILE_TIMEOUT,
    })
}

fn check_file(
    op: &'static str,
    id: &str,
    path: &str,
    outcome: ExecOutcome,
    stderr: &[u8],
) -> Result<(), ModalError> {
    if outcome.exit_code == 0 && !outcome.timed_out {
        return Ok(());
    }
    Err(ModalError::File {
        op,
        id: id.to_string(),
        path: path.to_string(),
        exit_code: outcome.exit_code,
        stderr: String::from_utf8_lossy(stderr).trim().to_string(),
    })
}

/// The bootstrap's header ([`env_header::header`]).
fn header(env: &[(String, String)], marker: &str) -> Result<Vec<u8>, ModalError> {
    env_header::header(env, marker).map_err(ModalError::BadRequest)
}

/// Sends the header, then the caller's input, then end of input.
async fn send_input(
    rpc: &Rpc,
    exec_id: &str,
    header: Vec<u8>,
    stdin: Option<&mut (dyn AsyncRead + Unpin + Send)>,
) -> Result<(), ModalError> {
    let mut index = 1u64;
    put_input(rpc, exec_id, index, header, stdin.is_none()).await?;
    let Some(stdin) = stdin else {
        return Ok(());
    };
    let mut buf = vec![0u8; INPUT_CHUNK];
    loop {
        let n = stdin.read(&mut buf).await?;
        index += 1;
        if n == 0 {
            return put_input(rpc, exec_id, index, Vec::new(), true).await;
        }
        put_input(rpc, exec_id, index, buf[..n].to_vec(), false).await?;
    }
}

async fn put_input(
    rpc: &Rpc,
    exec_id: &str,
    index: u64,
    message: Vec<u8>,
    eof: bool,
) -> Result<(), ModalError> {
    let msg = pb::ContainerExecPutInputRequest {
        exec_id: exec_id.to_string(),
        input: Some(pb::RuntimeInputMessage {
            message,
            message_index: index,
            eof,
        }),
    };
    // Indexed: the service applies a resent message once.
    rpc.call(
        "ContainerExecPutInput",
        Retry::Yes,
        UNARY_DEADLINE,
        msg,
        |mut c, r| async move { c.container_exec_put_input(r).await },
    )
    .await
}

/// Copies one output stream to `sink` until the batch with the exit code,
/// polling again from the last batch seen when a poll ends or breaks.
async fn output(
    rpc: &Rpc,
    exec_id: &str,
    fd: pb::FileDescriptor,
    sink: &mut (dyn AsyncWrite + Unpin + Send),
) -> Result<Option<i32>, ModalError> {
    let mut last_batch_index = 0u64;
    let mut failures = 0u32;
    loop {
        let msg = pb::ContainerExecGetOutputRequest {
            exec_id: exec_id.to_string(),
            timeout: POLL_SECS,
            last_batch_index,
            file_descriptor: fd as i32,
            get_raw_bytes: true,
        };
        let mut stream = rpc
            .call(
                "ContainerExecGetOutput",
                Retry::Yes,
                POLL_DEADLINE,
                msg,
                |mut c, r| async move { c.container_exec_get_output(r).await },
            )
            .await?;
        loop {
            match tokio::time::timeout(POLL_DEADLINE, stream.message()).await {
                Ok(Ok(Some(batch))) => {
                    failures = 0;
                    for item in &batch.items {
                        let bytes = if item.message_bytes.is_empty() {
                            item.message.as_bytes()
                        } else {
                            &item.message_bytes
                        };
                        sink.write_all(bytes).await?;
                    }
                    sink.flush().await?;
                    last_batch_index = last_batch_index.max(batch.batch_index);
                    if let Some(code) = batch.exit_code {
                        return Ok(Some(code));
                    }
                }
                // The poll ended: ask again from where we are.
                Ok(Ok(None)) => break,
                Ok(Err(status)) if retryable(status.code()) && failures + 1 < RETRY_ATTEMPTS => {
                    failures += 1;
                    tokio::time::sleep(retry_delay(failures, None)).await;
                    break;
                }
                Ok(Err(status)) => {
                    return Err(ModalError::from_status("ContainerExecGetOutput", &status));
                }
                Err(_) if failures + 1 < RETRY_ATTEMPTS => {
                    failures += 1;
                    break;
                }
                Err(_) => {
                    return Err(ModalError::Deadline {
                        call: "ContainerExecGetOutput",
                        after: POLL_DEADLINE,
                    });
                }
            }
        }
    }
}

/// The exit code of a finished exec, from `ContainerExecWait`.
async fn wait(rpc: &Rpc, exec_id: &str) -> Result<i32, ModalError> {
    for _ in 0..3 {
        let msg = pb::ContainerExecWaitRequest {
            exec_id: exec_id.to_string(),
            timeout: 20.0,
        };
        let resp = rpc
            .call(
                "ContainerExecWait",
                Retry::Yes,
                POLL_DEADLINE,
                msg,
                |mut c, r| async move { c.container_exec_wait(r).await },
            )
            .await?;
        if resp.completed {
            return Ok(resp.exit_code.unwrap_or(-1));
        }
    }
    Err(ModalError::Failed {
        call: "ContainerExecWait",
        message: format!("exec {exec_id}: output ended but the command did not finish"),
    })
}

/// Kills every process marked `marker` in the task, and waits for the
/// kill script to finish.
async fn kill(rpc: &Rpc, task: &str, marker: &str) -> Result<(), ModalError> {
    let msg = pb::ContainerExecRequest {
        task_id: task.to_string(),
        command: vec![
            "/bin/sh".to_string(),
            "-c".to_string(),
            KILL_SCRIPT.to_string(),
            "hermes-kill".to_string(),
            marker.to_string(),
        ],
        stdout_output: pb::ExecOutputOption::Devnull as i32,
        stderr_output: pb::ExecOutputOption::Devnull as i32,
        timeout_secs: 60,
        workdir: None,
        secret_ids: Vec::new(),
    };
    // Killing twice is harmless: this one may be repeated.
    let exec_id = rpc
        .call(
            "ContainerExec",
            Retry::Yes,
            UNARY_DEADLINE,
            msg,
            |mut c, r| async move { c.container_exec(r).await },
        )
        .await?
        .exec_id;
    wait(rpc, &exec_id).await.map(drop)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::exec::EXEC_ID_ENV;

    #[test]
    fn the_scripts_carry_no_value() {
        assert!(!env_header::BOOTSTRAP.contains(EXEC_ID_ENV));
        assert!(WRITE_SCRIPT.contains("mkdir -p"));
    }
}
