//! Timing one run of a program, from before its spawn to after its exit.

use std::ffi::{OsStr, OsString};
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::Context;

/// How long one measured run may take before the bench gives up.
const RUN_TIMEOUT: Duration = Duration::from_secs(120);

/// A program and its arguments, spawned afresh for each run.
#[derive(Debug, Clone)]
pub struct Cmd {
    program: PathBuf,
    args: Vec<OsString>,
    /// What the program reads on its standard input (nothing by default).
    input: Option<Vec<u8>>,
}

/// How a run ended.
#[derive(Debug)]
pub struct Ran {
    pub elapsed: Duration,
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl Cmd {
    pub fn new(program: impl Into<PathBuf>) -> Cmd {
        Cmd {
            program: program.into(),
            args: Vec::new(),
            input: None,
        }
    }

    /// Gives the program `input` on its standard input.
    pub fn input(mut self, input: impl Into<Vec<u8>>) -> Cmd {
        self.input = Some(input.into());
        self
    }

    pub fn arg(mut self, arg: impl AsRef<OsStr>) -> Cmd {
        self.args.push(arg.as_ref().to_os_string());
        self
    }

    pub fn args<I, S>(mut self, args: I) -> Cmd
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.args
            .extend(args.into_iter().map(|a| a.as_ref().to_os_string()));
        self
    }

    /// The command line, for messages.
    pub fn display(&self) -> String {
        let mut out = self.program.display().to_string();
        for a in &self.args {
            out.push(' ');
            out.push_str(&a.to_string_lossy());
        }
        out
    }

    fn command(&self, capture_stdout: bool) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new(&self.program);
        cmd.args(&self.args)
            // What hermes reads from its environment is given by flags.
            .env_remove("HERMES_HOME")
            .env_remove("HERMES_PROFILE")
            .env_remove("RUST_LOG")
            .stdin(if self.input.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(if capture_stdout {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        cmd
    }

    /// Runs once, keeping stdout, whatever the exit code.
    pub async fn output(&self) -> anyhow::Result<Ran> {
        self.go(true).await
    }

    /// Runs once with stdout to /dev/null and returns the wall time from
    /// before the spawn to after the exit. A non-zero exit is an error
    /// quoting stderr: a failed run is not a measurement.
    pub async fn time(&self) -> anyhow::Result<Duration> {
        let ran = self.go(false).await?;
        if ran.code != Some(0) {
            anyhow::bail!(
                "`{}` exited with {:?}: {}",
                self.display(),
                ran.code,
                ran.stderr.trim()
            );
        }
        Ok(ran.elapsed)
    }

    async fn go(&self, capture_stdout: bool) -> anyhow::Result<Ran> {
        let started = Instant::now();
        let mut child = self
            .command(capture_stdout)
            .spawn()
            .with_context(|| format!("cannot run {}", self.program.display()))?;
        if let (Some(input), Some(mut stdin)) = (self.input.clone(), child.stdin.take()) {
            // Written beside the wait, so a large input cannot block it;
            // dropping the pipe at the end is the program's end of input.
            tokio::spawn(async move {
                use tokio::io::AsyncWriteExt;
                let _ = stdin.write_all(&input).await;
            });
        }
        let out = tokio::time::timeout(RUN_TIMEOUT, child.wait_with_output())
            .await
            .with_context(|| {
                format!(
                    "`{}` did not finish in {}s",
                    self.display(),
                    RUN_TIMEOUT.as_secs()
                )
            })?
            .with_context(|| format!("waiting for `{}`", self.display()))?;
        let elapsed = started.elapsed();
        Ok(Ran {
            elapsed,
            code: out.status.code(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        })
    }
}
