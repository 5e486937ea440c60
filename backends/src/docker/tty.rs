//! A command on a terminal of the engine's (`hermes exec -t`): an engine
//! exec with `tty`, the user's keys on its input, its one output stream
//! written as it comes, resized as the user's terminal is.
//!
//! The same guarantees as [`Engine::exec_io`]: a marker in its
//! environment and a watch beside it, so a timeout, a failed write or the
//! death of hermes kills everything it started. The runner is not used:
//! it has no terminal to give.

use bollard::container::LogOutput;
use bollard::exec::{StartExecOptions, StartExecResults};
use bollard::query_parameters::ResizeExecOptionsBuilder;
use futures_util::StreamExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::Instant;

use super::Engine;
use super::error::{DockerError, exec_error};
use super::exec::{Attach, RunError};
use crate::exec::{ExecOutcome, ExecRequest, TIMEOUT_EXIT_CODE, TtyIo, TtySize, new_exec_id};

impl Engine {
    /// Runs `req` in `container` on a terminal of its own sized as
    /// `io.size` says.
    pub async fn exec_tty(
        &self,
        container: &str,
        req: &ExecRequest,
        io: TtyIo<'_>,
    ) -> Result<ExecOutcome, DockerError> {
        let TtyIo {
            stdin,
            output: shown,
            mut size,
        } = io;
        let deadline = Instant::now() + req.timeout;
        let marker = new_exec_id();
        // The engine sizes its terminal only once the exec started (an
        // engine before API 1.42 takes no size at creation): a command
        // that asks for its size at once would see 0×0. The command is
        // given its size from inside first; later changes are resizes.
        let first = *size.borrow_and_update();
        let mut sized = req.clone();
        sized.cmd = sized_argv(first, &req.cmd);
        let (exec_id, watch) = tokio::join!(
            self.create_marked_exec(container, &sized, Attach::Terminal, &marker),
            self.watch(container, &marker)
        );
        let exec_id = exec_id?;
        let start = StartExecOptions {
            detach: false,
            tty: true,
            output_capacity: Some(64 * 1024),
        };
        let started = self
            .docker
            .start_exec(&exec_id, Some(start))
            .await
            .map_err(|e| exec_error(container, "start exec in", e))?;
        let StartExecResults::Attached {
            mut output,
            mut input,
        } = started
        else {
            return Err(DockerError::Interrupted {
                container: container.to_string(),
                reason: "the engine started the exec detached".to_string(),
            });
        };
        self.resize(&exec_id, first).await;
        let mut keys = vec![0u8; 8 * 1024];
        let mut input_open = true;
        let result = loop {
            tokio::select! {
                item = output.next() => match item {
                    Some(Ok(LogOutput::Console { message } | LogOutput::StdOut { message } | LogOutput::StdErr { message })) => {
                        let wrote = async {
                            shown.write_all(&message).await?;
                            shown.flush().await
                        };
                        if let Err(e) = wrote.await {
                            break Err(RunError::Output(e));
                        }
                    }
                    Some(Ok(LogOutput::StdIn { .. })) => {}
                    Some(Err(e)) => break Err(RunError::Stream(e.to_string())),
                    None => break self.wait_exit(&exec_id).await,
                },
                read = stdin.read(&mut keys), if input_open => match read {
                    Ok(0) | Err(_) => input_open = false,
                    Ok(n) => {
                        if input.write_all(&keys[..n]).await.is_err() {
                            input_open = false;
                        }
                    }
                },
                changed = size.changed() => {
                    if changed.is_ok() {
                        let now = *size.borrow_and_update();
                        self.resize(&exec_id, now).await;
                    }
                },
                () = tokio::time::sleep_until(deadline) => {
                    drop(output);
                    self.kill_marked(container, &marker).await;
                    return Ok(ExecOutcome {
                        exit_code: TIMEOUT_EXIT_CODE,
                        timed_out: true,
                    });
                }
            }
        };
        drop(output);
        match result {
            Ok(exit_code) => {
                if let Some(watch) = watch {
                    watch.release().await;
                }
                Ok(ExecOutcome {
                    exit_code,
                    timed_out: false,
                })
            }
            Err(RunError::Output(source)) => {
                self.kill_marked(container, &marker).await;
                Err(DockerError::Output {
                    container: container.to_string(),
                    source,
                })
            }
            Err(RunError::Stream(reason)) => {
                self.kill_marked(container, &marker).await;
                Err(DockerError::Interrupted {
                    container: container.to_string(),
                    reason,
                })
            }
            Err(RunError::Lost) => Err(DockerError::Interrupted {
                container: container.to_string(),
                reason: "the engine no longer knows the exec (container removed?)".to_string(),
            }),
            Err(RunError::Engine(e)) => Err(DockerError::engine("inspect exec in", container, e)),
        }
    }

    /// Gives the exec's terminal `size`; a failure only makes it keep its
    /// size, said in the debug log.
    async fn resize(&self, exec_id: &str, size: TtySize) {
        let options = ResizeExecOptionsBuilder::new()
            .h(i32::from(size.rows))
            .w(i32::from(size.cols))
            .build();
        if let Err(e) = self.docker.resize_exec(exec_id, options).await {
            tracing::debug!(error = %e, "cannot resize the exec's terminal");
        }
    }
}

/// `cmd` behind a `sh` that sets its terminal to `size` first (`stty`,
/// where the sandbox has it) and then becomes it.
fn sized_argv(size: TtySize, cmd: &[String]) -> Vec<String> {
    let mut argv = vec![
        "/bin/sh".to_string(),
        "-c".to_string(),
        r#"stty rows "$1" cols "$2" 2>/dev/null; shift 2; exec "$@""#.to_string(),
        "sh".to_string(),
        size.rows.to_string(),
        size.cols.to_string(),
    ];
    argv.extend(cmd.iter().cloned());
    argv
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn the_command_is_sized_from_inside_then_run_as_it_was() {
        let cmd: Vec<String> = ["printf", "%s|", "a b", "c"].map(String::from).to_vec();
        let argv = sized_argv(
            TtySize {
                rows: 33,
                cols: 101,
            },
            &cmd,
        );
        // No terminal here: stty fails quietly and the argv runs intact.
        let out = std::process::Command::new(&argv[0])
            .args(&argv[1..])
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout), "a b|c|");
        assert_eq!(String::from_utf8_lossy(&out.stderr), "");
    }
}
