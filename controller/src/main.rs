//! `hermes`: the command-line edge. Parses arguments, sets up logging,
//! resolves `$HERMES_HOME` and the profile, runs one command and turns its
//! result into an exit code. Everything that decides lives in the library
//! crates; this binary only does IO and wiring.

mod activity;
mod apply;
mod cli;
mod cloud;
mod commands;
mod daemon;
mod disk;
mod egress_network;
mod egress_state;
mod fsio;
mod home;
mod metrics;
mod proxy_ops;
mod redacting;
mod singularity;
mod snapshots;
mod ssh;

use std::process::ExitCode;

use clap::Parser;

use crate::cli::{Cli, Command, LogFormat};
use crate::home::Home;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let home = Home::resolve(cli.home.clone());
    init_tracing(cli.log_format, home.as_ref().ok());
    match run(cli, home) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(1)
        }
    }
}

fn run(cli: Cli, home: anyhow::Result<Home>) -> anyhow::Result<ExitCode> {
    let home = home?;
    let profile = match cli.profile {
        Some(profile) => profile,
        None => match std::env::var("HERMES_PROFILE") {
            Ok(p) if !p.is_empty() => {
                hermes_model::names::validate(hermes_model::names::NameKind::Profile, &p)
                    .map_err(|e| e.from_origin("HERMES_PROFILE"))?;
                p
            }
            Err(std::env::VarError::NotUnicode(_)) => {
                anyhow::bail!(
                    "HERMES_PROFILE is not UTF-8; a profile name must be {}",
                    hermes_model::names::RULE
                )
            }
            _ => "default".to_string(),
        },
    };
    match cli.command {
        Command::Config(command) => commands::config::run(&home, command),
        Command::Reconcile(args) => {
            runtime()?.block_on(commands::reconcile::run(&home, &profile, &args))
        }
        Command::Exec(args) => runtime()?.block_on(commands::exec::run(&home, &profile, args)),
        Command::Sandbox(command) => {
            runtime()?.block_on(commands::sandbox::run(&home, &profile, command))
        }
        Command::Session(command) => {
            runtime()?.block_on(commands::session::run(&home, &profile, command))
        }
        Command::Controller(args) => {
            let options = daemon::Options {
                once: args.once,
                metrics_addr: args.metrics_addr,
                metrics_expose: args.metrics_expose,
            };
            runtime()?.block_on(daemon::run(&home, &profile, options))
        }
        Command::Status { output } => {
            runtime()?.block_on(commands::status::run(&home, &profile, output))
        }
        Command::Egress(command) => commands::egress::run(&home, command),
        Command::SshHolder(args) => runtime()?.block_on(ssh::run_holder(&home, args)),
    }
}

/// A small runtime for the commands that talk to an engine: one thread is
/// plenty for a command-line pass and starts fastest.
fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?)
}

/// Logs on stderr at `RUST_LOG`'s level (default warn), every line through
/// the redactor unless `security.redact_secrets` is false.
fn init_tracing(format: LogFormat, home: Option<&Home>) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn"));
    let redactor = match home {
        Some(home) if !redaction_off(home) => Some(std::sync::Arc::new(
            hermes_model::redact::Redactor::new(redacting::known_secrets(home)).with_proxy_tokens(),
        )),
        Some(_) => None,
        None => Some(std::sync::Arc::new(
            hermes_model::redact::Redactor::new(Vec::<String>::new()).with_proxy_tokens(),
        )),
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(redacting::RedactingLogs::new(redactor));
    match format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.init(),
    }
}

/// Whether config.yaml turns redaction off. A config that cannot be read
/// keeps it on.
fn redaction_off(home: &Home) -> bool {
    commands::config::read_config_text(home)
        .ok()
        .flatten()
        .and_then(|text| hermes_model::config::load(&text).ok())
        .is_some_and(|loaded| !loaded.config.security.redact_secrets)
}
