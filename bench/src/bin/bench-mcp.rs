//! `bench-mcp`: the round trip of the `terminal` tool with `true` through
//! `hermes mcp` over stdio (one server, a `tools/call` and its answer),
//! against `hermes exec -- true` (a process per command), side by side in
//! one run, on the same warm Docker sandbox; target: the MCP path faster
//! (p50 ratio < 1.0).
//!
//! The client speaks newline-delimited JSON-RPC on the server's standard
//! input and output, as every MCP client of the stdio transport does;
//! the two sides run interleaved after a warm-up. Run it from the
//! workspace root with both binaries built in release:
//!
//! ```sh
//! cargo build --release --bin hermes --bin bench-mcp && target/release/bench-mcp
//! ```
//!
//! It needs the Docker engine and the test image (`bash scripts/test`).
//! Everything it makes lives in a temporary `HERMES_HOME` and a profile of
//! its own, removed at the end. Exit code: 0 when the target is met, 2
//! when it is missed, 1 on error.

use std::path::PathBuf;
use std::process::{ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Parser;
use hermes_bench::harness::{self, Check};
use hermes_bench::run::Cmd;
use hermes_bench::stats::{Samples, header, ratio, row};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

/// The MCP round trip's p50 over `hermes exec`'s.
const TARGET: f64 = 1.0;

/// How long one answer may take.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(120);

#[derive(Debug, Parser)]
#[command(
    name = "bench-mcp",
    about = "terminal `true` through hermes mcp (stdio) against hermes exec -- true"
)]
struct Args {
    /// Measured runs of each side (interleaved).
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..=1000))]
    runs: u32,
    /// Unmeasured runs of each side first.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(0..=100))]
    warmup: u32,
    /// The hermes binary (default: `hermes` beside this one).
    #[arg(long, value_name = "PATH")]
    hermes: Option<PathBuf>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    harness::main(|| bench(args))
}

async fn bench(args: Args) -> anyhow::Result<Vec<Check>> {
    let hermes = harness::hermes_binary(args.hermes.as_deref())?;
    let engine = harness::connect("bench-mcp").await?;
    let image = harness::test_image(&engine).await?;
    let profile = harness::unique_profile();
    let (home, _) = harness::temp_home(
        &profile,
        &format!("terminal:\n  backend: docker\n  docker_image: {image}\n"),
    )?;
    let prefix = format!("hermes-{profile}");
    let work = measure(&args, &hermes, home.path(), &profile);
    let (mcp, exec) = harness::with_cleanup(&engine, &prefix, 4, work).await?;

    println!();
    println!(
        "terminal `true` over MCP stdio against hermes exec -- true, {} runs each, interleaved",
        mcp.len()
    );
    println!("{}", header());
    println!("{}", row("hermes mcp: tools/call terminal `true`", &mcp));
    println!("{}", row("hermes exec -- true", &exec));
    let r = ratio(mcp.p50(), exec.p50());
    println!("  ratio (mcp / exec, p50) {r:.3}");
    Ok(vec![Check::new(
        format!("MCP round trip / hermes exec (p50) < {TARGET}"),
        format!("{r:.3}"),
        r < TARGET,
    )])
}

/// One MCP server over stdio, spoken to in JSON lines.
struct Server {
    child: tokio::process::Child,
    stdin: tokio::process::ChildStdin,
    stdout: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
    next_id: u64,
}

impl Server {
    async fn start(
        hermes: &std::path::Path,
        home: &std::path::Path,
        profile: &str,
    ) -> anyhow::Result<Server> {
        let mut child = tokio::process::Command::new(hermes)
            .arg("--home")
            .arg(home)
            .args(["--profile", profile, "mcp"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .context("starting hermes mcp")?;
        let stdin = child.stdin.take().context("its stdin")?;
        let stdout = BufReader::new(child.stdout.take().context("its stdout")?).lines();
        let mut server = Server {
            child,
            stdin,
            stdout,
            next_id: 1,
        };
        server
            .request(
                "initialize",
                json!({
                    "protocolVersion": "2025-06-18",
                    "capabilities": {},
                    "clientInfo": { "name": "bench-mcp", "version": "1" }
                }),
            )
            .await?;
        server
            .send(&json!({ "jsonrpc": "2.0", "method": "notifications/initialized" }))
            .await?;
        Ok(server)
    }

    async fn send(&mut self, message: &Value) -> anyhow::Result<()> {
        let mut line = message.to_string();
        line.push('\n');
        self.stdin.write_all(line.as_bytes()).await?;
        self.stdin.flush().await?;
        Ok(())
    }

    /// Sends a request and waits for its answer (notifications skipped).
    async fn request(&mut self, method: &str, params: Value) -> anyhow::Result<Value> {
        let id = self.next_id;
        self.next_id += 1;
        self.send(&json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params }))
            .await?;
        let answer = async {
            while let Some(line) = self.stdout.next_line().await? {
                let message: Value = serde_json::from_str(&line)
                    .with_context(|| format!("not JSON from the server: {line}"))?;
                if message["id"] == json!(id) {
                    if let Some(error) = message.get("error") {
                        anyhow::bail!("{method}: {error}");
                    }
                    return Ok(message["result"].clone());
                }
            }
            anyhow::bail!("the server closed its output")
        };
        tokio::time::timeout(ANSWER_TIMEOUT, answer)
            .await
            .with_context(|| format!("{method}: no answer in {ANSWER_TIMEOUT:?}"))?
    }

    /// `terminal` with `true`: its round trip, checked.
    async fn terminal_true(&mut self) -> anyhow::Result<Duration> {
        let started = Instant::now();
        let result = self
            .request(
                "tools/call",
                json!({ "name": "terminal", "arguments": { "command": "true" } }),
            )
            .await?;
        let elapsed = started.elapsed();
        let text = result["content"][0]["text"].as_str().unwrap_or_default();
        anyhow::ensure!(
            result["isError"] != json!(true) && text.contains("\"exit_code\":0"),
            "terminal `true` failed: {result}"
        );
        Ok(elapsed)
    }
}

async fn measure(
    args: &Args,
    hermes: &std::path::Path,
    home: &std::path::Path,
    profile: &str,
) -> anyhow::Result<(Samples, Samples)> {
    let exec =
        Cmd::new(hermes)
            .arg("--home")
            .arg(home)
            .args(["--profile", profile, "exec", "--", "true"]);
    // The first exec makes the sandbox; both sides then find it warm.
    exec.time().await.context("making the sandbox")?;
    let mut server = Server::start(hermes, home, profile).await?;
    for _ in 0..args.warmup.max(1) {
        server.terminal_true().await?;
        exec.time().await?;
    }
    let runs = args.runs as usize;
    let (mut mcp, mut direct) = (Samples::with_capacity(runs), Samples::with_capacity(runs));
    for _ in 0..runs {
        mcp.push(server.terminal_true().await?);
        direct.push(exec.time().await?);
    }
    drop(server.stdin);
    let _ = tokio::time::timeout(Duration::from_secs(10), server.child.wait()).await;
    Ok((mcp, direct))
}
