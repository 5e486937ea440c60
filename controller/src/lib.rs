//! The command-line edge of `hermes` (also installed as `hermesctl`, a
//! name no other program takes): parses arguments, sets up logging,
//! resolves `$HERMES_HOME` and the profile, runs one command and turns its
//! result into an exit code. Both binaries are [`main`] and nothing else.
//! Everything that decides lives in the library crates; this one only does
//! IO and wiring.

// Every `println!`/`print!` below goes through [`stdout`]: a closed pipe
// ends the output quietly instead of panicking. Defined before the modules
// so that their textual scope shadows std's macros in all of them.
macro_rules! println {
    () => {
        $crate::stdout::write(format_args!(""), true)
    };
    ($($arg:tt)*) => {
        $crate::stdout::write(format_args!($($arg)*), true)
    };
}
macro_rules! print {
    ($($arg:tt)*) => {
        $crate::stdout::write(format_args!($($arg)*), false)
    };
}

mod activity;
mod apply;
mod backend;
mod chain;
mod cli;
mod commands;
mod daemon;
mod disk;
mod egress;
mod exec_target;
mod failures;
mod fsio;
mod home;
mod host;
mod interrupt;
mod json;
mod listing;
mod load;
mod metrics;
mod migrate;
mod notices;
mod observe;
mod pass;
mod pool;
mod proxy_ops;
mod redacting;
mod sandbox_locks;
mod seam;
mod snapshots;
mod stdout;
mod terminal;

use std::process::ExitCode;

use crate::cli::{Cli, Command, LogFormat};
use crate::home::Home;

/// Exit code of a usage error (a bad flag or argument), EX_USAGE of
/// sysexits.h: clap's default 2 would read as "changes pending" after
/// `reconcile --dry-run`.
const USAGE_ERROR: u8 = 64;

/// Runs the command line of this process (`std::env::args_os`) and
/// returns its exit code. Usage, help and `--version` name the binary as
/// it was invoked.
pub fn main() -> ExitCode {
    // A bwrap sandbox's first process (`terminal.local_sandbox: bwrap`):
    // not a command of the CLI, and nothing of it runs before it.
    let raw: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if raw.get(1).is_some_and(|a| a == "sandbox-init") {
        let code = hermes_backends::local::init::run(&raw[2..]);
        return ExitCode::from(u8::try_from(code).unwrap_or(1));
    }
    // Lossy: a word that is not UTF-8 (an exec's file name) must not
    // panic here; these words only decide JSON and the usage hint.
    let args: Vec<String> = std::env::args_os()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    if json::asked_in(&args) {
        json::request();
    }
    let cli = match parse_args() {
        Ok(cli) => cli,
        Err(e) => {
            // Help and version go to stdout with exit 0; a closed stdout
            // is no error here either.
            let _ = e.print();
            let hint = exec_hint(e.kind(), &args);
            if let Some(hint) = &hint {
                eprintln!("{hint}");
            }
            if e.use_stderr() && json::requested() {
                let text = e.render().to_string();
                let message = text
                    .lines()
                    .next()
                    .unwrap_or_default()
                    .trim_start_matches("error: ");
                let causes: Vec<String> = hint.into_iter().collect();
                json::print_error(message, &causes, USAGE_ERROR);
            }
            return if e.use_stderr() {
                ExitCode::from(USAGE_ERROR)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    // The profile is a home, as Hermes Agent has it: `--profile` (or
    // `$HERMES_PROFILE`) switches to `<root>/profiles/NAME`.
    let home = Home::resolve(cli.home.clone()).and_then(|home| {
        let flag = profile_flag(cli.profile.as_deref())?;
        home.select_profile(flag.as_ref().map(|(n, o)| (n.as_str(), *o)))
    });
    let default_level = match cli.command {
        // The controller says what it does: one line per change, error and
        // recovery (nothing while idle).
        Command::Controller(_) => "warn,hermes=info",
        _ => "warn",
    };
    init_tracing(cli.log_format, default_level, home.as_ref().ok());
    let code = match run(cli, home) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {}", chain::Chain(&e));
            if json::requested() {
                let causes: Vec<String> = e.chain().skip(1).map(ToString::to_string).collect();
                json::print_error(&e.to_string(), &causes, 1);
            }
            ExitCode::from(1)
        }
    };
    // One document, errors included: a command that failed after saying
    // why on stderr, without a document, gets its error's.
    if json::requested() && !stdout::wrote() && code != ExitCode::SUCCESS {
        let message = json::noted_error()
            .unwrap_or_else(|| "the command failed; see its standard error".to_string());
        json::print_error(&message, &[], exit_number(code));
    }
    stdout::flush();
    if stdout::failed() {
        return ExitCode::from(1);
    }
    code
}

/// The number of an exit code (ExitCode hides it): 1 where it is none of
/// the codes this binary returns without a document.
fn exit_number(code: ExitCode) -> u8 {
    [2u8, 3, 64, 124, 126, 127, 130, 141]
        .into_iter()
        .find(|n| ExitCode::from(*n) == code)
        .unwrap_or(1)
}

/// The command line's definition, under the name the binary was invoked
/// as (`hermes`, `hermesctl`).
pub(crate) fn command_line() -> clap::Command {
    use clap::CommandFactory;
    let name = invoked_name(std::env::args_os().next());
    Cli::command().name(name.clone()).bin_name(name)
}

/// The command line, parsed under the name the binary was invoked as.
fn parse_args() -> Result<Cli, clap::Error> {
    use clap::FromArgMatches;
    let mut command = command_line();
    let matches = command.try_get_matches_from_mut(std::env::args_os())?;
    Cli::from_arg_matches(&matches).map_err(|e| e.format(&mut command))
}

/// For `hermes exec ls /` (a command without `--` before it, which clap
/// rejects as unknown arguments or as a missing command): the line to
/// write instead.
fn exec_hint(kind: clap::error::ErrorKind, args: &[String]) -> Option<String> {
    use clap::error::ErrorKind;
    if !matches!(
        kind,
        ErrorKind::UnknownArgument | ErrorKind::MissingRequiredArgument
    ) {
        return None;
    }
    // The options that take a value, global and exec's own: their values
    // are neither the subcommand nor the command.
    const VALUED: &[&str] = &[
        "--home",
        "--profile",
        "-p",
        "--log-format",
        "--task",
        "--session",
        "--timeout",
        "--cwd",
        "--env",
        "-e",
    ];
    let mut words = args.iter().skip(1).map(String::as_str);
    let mut before = Vec::new();
    let mut seen_exec = false;
    let mut command = Vec::new();
    while let Some(word) = words.next() {
        if word == "--" {
            return None;
        }
        if !command.is_empty() {
            // The command's own flags are the command's.
            command.push(word);
        } else if VALUED.contains(&word) {
            let value = words.next().unwrap_or_default();
            before.extend([word, value]);
        } else if word.starts_with('-') {
            before.push(word);
        } else if !seen_exec {
            if word != "exec" {
                return None;
            }
            seen_exec = true;
            before.push(word);
        } else {
            command.push(word);
        }
    }
    if !seen_exec || command.is_empty() {
        return None;
    }
    let quoted: Vec<String> = command.iter().map(|w| shell_word(w)).collect();
    Some(format!(
        "hint: put the command after `--`: hermes {} -- {}",
        before.join(" "),
        quoted.join(" ")
    ))
}

/// `word` as a shell would need it written (single-quoted unless plain).
fn shell_word(word: &str) -> String {
    let plain = !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c));
    if plain {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

/// The file name of `argv0` (`hermesctl` for `/usr/local/bin/hermesctl`),
/// or `hermes` when it has none in UTF-8.
fn invoked_name(argv0: Option<std::ffi::OsString>) -> String {
    argv0
        .as_deref()
        .map(std::path::Path::new)
        .and_then(std::path::Path::file_name)
        .and_then(std::ffi::OsStr::to_str)
        .filter(|name| !name.is_empty())
        .unwrap_or("hermes")
        .to_string()
}

/// The profile asked for and where from: `--profile`, else
/// `$HERMES_PROFILE`; none when neither is set.
fn profile_flag(flag: Option<&str>) -> anyhow::Result<Option<(String, &'static str)>> {
    if let Some(name) = flag {
        return Ok(Some((name.to_string(), "--profile")));
    }
    match std::env::var("HERMES_PROFILE") {
        Ok(p) if !p.is_empty() => Ok(Some((p, "HERMES_PROFILE"))),
        Err(std::env::VarError::NotUnicode(_)) => {
            anyhow::bail!("HERMES_PROFILE is not UTF-8")
        }
        _ => Ok(None),
    }
}

fn run(cli: Cli, home: anyhow::Result<Home>) -> anyhow::Result<ExitCode> {
    // Made from the command line's definition alone: no home needed.
    match &cli.command {
        Command::Completions { shell } => return commands::manual::completions(*shell),
        Command::Man { dir } => return commands::manual::man(dir.as_deref()),
        _ => {}
    }
    let home = home?;
    let profile = home.profile();
    match cli.command {
        Command::Config(command) => commands::config::run(&home, command),
        Command::Reconcile(args) => {
            runtime()?.block_on(commands::reconcile::run(&home, &profile, &args))
        }
        Command::Exec(args) => runtime()?.block_on(commands::exec::run(&home, &profile, args)),
        Command::Process(command) => {
            runtime()?.block_on(commands::process::run(&home, &profile, command))
        }
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
        Command::Status {
            output,
            watch,
            interval,
            count,
        } => {
            let watch = watch.then(|| commands::status::Watch {
                interval: std::time::Duration::from_secs(interval),
                count,
            });
            runtime()?.block_on(commands::status::run(&home, &profile, output, watch))
        }
        Command::Egress(command) => commands::egress::run(&home, command),
        Command::Mcp(args) => runtime()?.block_on(commands::mcp::run(&home, &profile, args)),
        Command::SshHolder(args) => runtime()?.block_on(backend::ssh::run_holder(&home, args)),
        Command::Down(args) => runtime()?.block_on(commands::down::run(&home, &profile, &args)),
        Command::Completions { .. } | Command::Man { .. } => Ok(ExitCode::SUCCESS),
    }
}

/// A small runtime for the commands that talk to an engine: one thread is
/// plenty for a command-line pass and starts fastest.
fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?)
}

/// Logs on stderr at `RUST_LOG`'s level (default `default_level`), every
/// line through the redactor unless `security.redact_secrets` is false;
/// colours only on a terminal.
fn init_tracing(format: LogFormat, default_level: &str, home: Option<&Home>) {
    use std::io::IsTerminal;
    use tracing_subscriber::EnvFilter;
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_level));
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
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(redacting::RedactingLogs::new(redactor).one_line(format == LogFormat::Text));
    match format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.init(),
    }
}

/// Whether config.yaml turns redaction off. A config that cannot be read
/// keeps it on.
fn redaction_off(home: &Home) -> bool {
    host::read_config_text(home)
        .ok()
        .flatten()
        .and_then(|text| hermes_model::config::load(&text).ok())
        .is_some_and(|loaded| !loaded.config.security.redact_secrets)
}
