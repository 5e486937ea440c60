//! The command line: every subcommand and flag of `hermes`.

use std::path::PathBuf;

use clap::builder::TypedValueParser;
use clap::error::ErrorKind;
use clap::{Args, Parser, Subcommand, ValueEnum};
use hermes_model::names::{self, NameKind};

/// The help heading of the options every command takes. In every
/// command's help the options come in one order: what to act on (a task, a
/// session), then the common options, then the rare ones, then `--output`;
/// the global options (home, profile, logging) follow under their own
/// heading. `tests::options_come_in_the_natural_order` holds it.
const GLOBAL: &str = "Global options";

#[derive(Debug, Parser)]
#[command(
    name = "hermes",
    version,
    about = "Keeps a host's AI-agent sandboxes and egress credential proxy where config.yaml says",
    after_help = "Exit codes: 0 success; 1 error; 2 changes pending (reconcile --dry-run); \
                  3 blocked, failing closed (exec); 64 usage error (a bad flag or argument); \
                  130 stopped by a signal (reconcile); \
                  exec: its command's own code otherwise (124 timed out, 126 could not start, \
                  141 its output's reader went away)."
)]
pub struct Cli {
    /// The hermes home (default: $HERMES_HOME, else ~/.hermes).
    #[arg(long, global = true, value_name = "DIR", help_heading = GLOBAL, display_order = 900)]
    pub home: Option<PathBuf>,

    /// The profile, as Hermes Agent's `-p NAME`: the home becomes
    /// `<root>/profiles/NAME` (`default`: the root itself). Default:
    /// $HERMES_PROFILE, else the root's `active_profile`, else the profile
    /// the home is.
    #[arg(
        short = 'p',
        long,
        global = true,
        value_name = "NAME",
        value_parser = NameParser(NameKind::Profile),
        help_heading = GLOBAL,
        display_order = 901
    )]
    pub profile: Option<String>,

    /// Log format on stderr; the level comes from RUST_LOG (default: warn;
    /// the controller's own lines: info).
    #[arg(
        long,
        global = true,
        value_enum,
        default_value_t = LogFormat::Text,
        help_heading = GLOBAL,
        display_order = 902
    )]
    pub log_format: LogFormat,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Lines for a person.
    Text,
    /// One JSON object per line.
    Json,
}

/// How a command prints its data (`--output`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// For a person.
    Text,
    /// One JSON document, for a program.
    Json,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Read and change config.yaml and .env.
    #[command(subcommand)]
    Config(ConfigCommand),
    /// Compare config.yaml with the host and converge (one pass).
    Reconcile(ReconcileArgs),
    /// Run a command in the sandbox of the configured backend.
    Exec(ExecArgs),
    /// The background processes `hermes exec --background` started:
    /// list them, read their output, stop them.
    #[command(subcommand)]
    Process(ProcessCommand),
    /// Inspect the sandboxes hermes manages.
    #[command(subcommand)]
    Sandbox(SandboxCommand),
    /// Session sandboxes: disposable, one per session id.
    #[command(subcommand)]
    Session(SessionCommand),
    /// Watch config.yaml and the engine and converge continuously, in the
    /// foreground (one controller per home).
    Controller(ControllerArgs),
    /// One screen for the host: config, backend, sandboxes, the egress
    /// proxy, what is blocked and why, and the running controller.
    Status {
        /// Report again every --interval seconds until Ctrl-C (on a
        /// terminal the screen is redrawn; JSON: one document per line).
        #[arg(long)]
        watch: bool,
        /// Seconds between two reports of --watch.
        #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..=3600), requires = "watch")]
        interval: u64,
        /// Stop --watch after this many reports (default: until Ctrl-C).
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..), requires = "watch")]
        count: Option<u64>,
        /// How to print the report.
        #[arg(long, value_enum, default_value_t = Output::Text)]
        output: Output,
    },
    /// The egress credential proxy: set-up, daemon, status.
    #[command(subcommand)]
    Egress(EgressCommand),
    /// Serve the sandbox to an agent over the Model Context Protocol:
    /// stdio (what an MCP client spawns), or streamable HTTP with --http.
    Mcp(McpArgs),
    /// Take down everything hermes runs for this home: every sandbox of
    /// the profile and its mounted disk image (singularity's instances
    /// stopped, a cloud sandbox suspended), then the proxy-only network
    /// and the proxy. Planned and printed first; files are kept.
    Down(DownArgs),
    /// Shell completions for this command line, on stdout (e.g. `hermes
    /// completions bash > /etc/bash_completion.d/hermes`).
    Completions {
        /// The shell to complete in.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// The manual page (roff), on stdout (`hermes man | man -l -`); with
    /// --dir, one page per command written there (hermes.1,
    /// hermes-reconcile.1, …).
    Man {
        /// Write every page into this directory instead.
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
    },
    /// Holds one SSH connection for every hermes process (started by
    /// `hermes exec` on the ssh backend; ends when idle).
    #[command(hide = true)]
    SshHolder(SshHolderArgs),
}

#[derive(Debug, Args)]
pub struct McpArgs {
    /// The task whose sandbox the tools use.
    #[arg(long, default_value = "default", value_parser = NameParser(NameKind::Task))]
    pub task: String,
    /// The session whose sandbox the tools use (as `hermes exec
    /// --session`). Default: the task's sandbox, or where
    /// terminal.container_persistent is false, one of each connection's
    /// own, removed when it ends.
    #[arg(long, value_name = "ID", value_parser = NameParser(NameKind::Session))]
    pub session: Option<String>,
    /// Serve the streamable HTTP transport at http://ADDR/mcp instead of
    /// stdio; a loopback address only. Every request needs
    /// `Authorization: Bearer` with the token in $HERMES_HOME/mcp/token
    /// (made on first use, 0600).
    #[arg(long, value_name = "ADDR")]
    pub http: Option<std::net::SocketAddr>,
}

#[derive(Debug, Args)]
pub struct SshHolderArgs {
    /// The remote host.
    #[arg(long)]
    pub host: String,
    /// Its SSH port.
    #[arg(long)]
    pub port: u16,
    /// The user to log in as.
    #[arg(long)]
    pub user: String,
    /// A private key file; without, the agent's keys.
    #[arg(long)]
    pub key: Option<PathBuf>,
    /// End after this many seconds with nothing running.
    #[arg(long)]
    pub persist_seconds: u64,
}

#[derive(Debug, Args)]
pub struct ControllerArgs {
    /// One pass, then exit.
    #[arg(long)]
    pub once: bool,
    /// Serve Prometheus metrics at http://ADDR/metrics (default address
    /// 127.0.0.1:9464 when the flag is given without one). Only a loopback
    /// address unless --metrics-expose is given: the metrics have no
    /// authentication.
    #[arg(long, value_name = "ADDR", num_args = 0..=1, default_missing_value = "127.0.0.1:9464")]
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// Allow --metrics-addr to be a non-loopback address (such as
    /// 0.0.0.0:9464), reachable by anything that reaches the host.
    #[arg(long, requires = "metrics_addr")]
    pub metrics_expose: bool,
}

#[derive(Debug, Subcommand)]
pub enum SessionCommand {
    /// The session sandboxes of the active profile.
    List {
        /// How to print the list.
        #[arg(long, value_enum, default_value_t = Output::Text)]
        output: Output,
    },
    /// Remove a session's sandboxes (of every task), with their files.
    End {
        /// The session id given to `hermes exec --session`.
        #[arg(value_parser = NameParser(NameKind::Session))]
        id: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum EgressCommand {
    /// Report the binary that runs the proxy and check that it can.
    Install,
    /// Create the CA, tokens, mappings and proxy config (idempotent).
    Setup {
        /// Replace every proxy token; the old ones stop working.
        #[arg(long)]
        rotate_tokens: bool,
    },
    /// Start the proxy as a daemon and wait until it listens.
    Start,
    /// Stop the daemon: SIGTERM, then SIGKILL after 5 s.
    Stop,
    /// Configuration, process, listening state and tokens.
    Status {
        /// Every provider and credential in the text, not only the ones
        /// set on this host or forwarded by config.yaml (JSON has all).
        #[arg(long)]
        all: bool,
        /// Print the tokens in full.
        #[arg(long)]
        show_tokens: bool,
        /// How to print the report.
        #[arg(long, value_enum, default_value_t = Output::Text)]
        output: Output,
    },
    /// Run the proxy in the foreground (what `start` runs).
    Serve {
        /// Serve from the proxy files and keys in DIR instead (the Secret
        /// the kubernetes backend's proxy Pod mounts; its command), on
        /// every address, writing nothing.
        #[arg(long, value_name = "DIR")]
        in_cluster: Option<std::path::PathBuf>,
    },
}

#[derive(Debug, Args)]
pub struct ExecArgs {
    /// The task whose sandbox runs the command.
    #[arg(long, default_value = "default", value_parser = NameParser(NameKind::Task))]
    pub task: String,
    /// Run in this session's own sandbox (tmpfs /workspace and /root,
    /// nothing carried over), shared by every exec that names it; removed
    /// by `hermes session end ID` or when idle for terminal.lifetime_seconds.
    #[arg(
        long,
        env = "HERMES_SESSION_ID",
        value_name = "ID",
        value_parser = NameParser(NameKind::Session)
    )]
    pub session: Option<String>,
    /// Seconds before the command is killed, with everything it started
    /// (default: terminal.timeout). Exit code 124 on timeout.
    #[arg(long)]
    pub timeout: Option<u64>,
    /// Working directory inside the sandbox for this command only, which
    /// leaves the task's carried directory as it was (default: where the
    /// task's last command line left it; at first /workspace, the remote
    /// workspace, or here on local).
    #[arg(long)]
    pub cwd: Option<String>,
    /// An environment variable for the command, NAME=value; repeatable.
    #[arg(long = "env", short = 'e', value_name = "NAME=VALUE")]
    pub env: Vec<String>,
    /// Give the command a terminal of its own (interactive shells, job
    /// control, full-screen programs), on the local, docker and
    /// singularity backends;
    /// stdin must be a terminal. stdout and stderr are one stream; no
    /// time limit unless --timeout.
    #[arg(long, short = 't', conflicts_with = "background")]
    pub tty: bool,
    /// Start the command in a session of its own and return at once, on
    /// every backend; it keeps the sandbox busy (never reaped as idle)
    /// while it runs. Its input is /dev/null; its output is kept in the
    /// sandbox. Prints the process's id on stdout, for `hermes process
    /// list|logs|kill`.
    #[arg(long, conflicts_with = "timeout")]
    pub background: bool,
    /// The command, after `--`: one argument is a shell command line
    /// (bash where the sandbox has it, else sh); several are an argv,
    /// delivered intact.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<String>,
}

#[derive(Debug, Subcommand)]
pub enum SandboxCommand {
    /// Every labelled container: profile, task, state, spec match, age, idle.
    List {
        /// How to print the list.
        #[arg(long, value_enum, default_value_t = Output::Text)]
        output: Output,
    },
    /// One Docker sandbox in full: state, spec and the settings that
    /// differ, mounts, egress wiring, the processes in it, its events.
    Describe {
        /// The task whose sandbox to describe.
        #[arg(long, default_value = "default", value_parser = NameParser(NameKind::Task))]
        task: String,
        /// The session's sandbox instead (as `hermes exec --session`).
        #[arg(long, value_name = "ID", value_parser = NameParser(NameKind::Session))]
        session: Option<String>,
        /// How to print it.
        #[arg(long, value_enum, default_value_t = Output::Text)]
        output: Output,
    },
}

/// The sandbox whose background processes a `hermes process` verb reads.
#[derive(Debug, Args)]
pub struct ProcessWhere {
    /// The task whose sandbox ran `hermes exec --background`.
    #[arg(long, default_value = "default", value_parser = NameParser(NameKind::Task))]
    pub task: String,
    /// The session's sandbox instead (as `hermes exec --session`).
    #[arg(
        long,
        env = "HERMES_SESSION_ID",
        value_name = "ID",
        value_parser = NameParser(NameKind::Session)
    )]
    pub session: Option<String>,
}

#[derive(Debug, Subcommand)]
pub enum ProcessCommand {
    /// The background processes of a sandbox: id, state (running, exited
    /// with its code, or killed), age, output size, command. A sandbox
    /// that is not running has none (nothing is started to look).
    List {
        #[command(flatten)]
        at: ProcessWhere,
        /// How to print the list.
        #[arg(long, value_enum, default_value_t = Output::Text)]
        output: Output,
    },
    /// A background process's output, stdout and stderr together, as the
    /// sandbox keeps it; its state on stderr at the end.
    Logs {
        /// The process's id, as `hermes exec --background` printed it.
        id: String,
        #[command(flatten)]
        at: ProcessWhere,
        /// Keep printing what it writes until it ends (or Ctrl-C).
        #[arg(long, short = 'f')]
        follow: bool,
        /// Only its last N lines (then what follows, with --follow).
        #[arg(long, value_name = "N")]
        tail: Option<u64>,
    },
    /// Stop a background process and everything it started: SIGTERM to
    /// its process group, SIGKILL after 2 s.
    Kill {
        /// The process's id, as `hermes exec --background` printed it.
        id: String,
        #[command(flatten)]
        at: ProcessWhere,
        /// How to print the result.
        #[arg(long, value_enum, default_value_t = Output::Text)]
        output: Output,
    },
}

/// How a key path is written, for the help of get, set and unset.
const KEY_HELP: &str = "A dotted key, such as terminal.backend. A key that holds a dot (a host \
    of proxy.resolve) goes in double quotes: proxy.resolve.\"api.openai.com\" (quote the whole \
    path for the shell: 'proxy.resolve.\"api.openai.com\"').";

#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Print the path of config.yaml.
    Path,
    /// Print the path of .env.
    EnvPath,
    /// Print one value of the merged config (defaults + file). A key that
    /// is not set: "Config key not set" on stderr and exit 1; with
    /// --output json, a key whose value is null prints null (exit 0).
    Get {
        #[arg(help = KEY_HELP)]
        key: String,
        /// How to print the value.
        #[arg(long, value_enum, default_value_t = Output::Text)]
        output: Output,
        /// The same as --output json.
        #[arg(long, conflicts_with = "output")]
        json: bool,
    },
    /// Set a value in config.yaml (comments and order kept), or a secret
    /// in .env (0600): provider keys, cloud and AWS credentials, and any
    /// name like *_API_KEY, *_TOKEN, *SECRET*, *_PASSWORD. A value that
    /// makes the file invalid is refused (exit 1) and the file left as it
    /// was.
    Set {
        #[arg(help = KEY_HELP)]
        key: String,
        /// The value; `-5` and other leading hyphens are taken as values.
        #[arg(allow_hyphen_values = true)]
        value: String,
        /// Replace a whole section with a single value, or a value with a
        /// section; save a key of a section neither hermes nor Hermes Agent
        /// knows, or one a typo away from a known key.
        #[arg(long)]
        force: bool,
    },
    /// Remove a key from config.yaml (or a secret from .env).
    Unset {
        #[arg(help = KEY_HELP)]
        key: String,
    },
    /// Print the merged config (defaults + file); null for a key not set.
    Show {
        /// How to print the config.
        #[arg(long, value_enum, default_value_t = Output::Text)]
        output: Output,
        /// The same as --output json.
        #[arg(long, conflicts_with = "output")]
        json: bool,
    },
    /// Validate config.yaml: errors with key, line and column; exit 1 if any.
    Check {
        /// How to print the result (JSON: every error and warning with its
        /// key, line and column).
        #[arg(long, value_enum, default_value_t = Output::Text)]
        output: Output,
    },
}

#[derive(Debug, Args)]
pub struct ReconcileArgs {
    /// Print the plan without carrying it out. Exit 0: nothing to do,
    /// 2: changes pending, 1: error.
    #[arg(long)]
    pub dry_run: bool,
    /// Carry out a plan that removes or recreates sandboxes, or stops the
    /// proxy, without asking first (on a terminal hermes asks; elsewhere
    /// it never does).
    #[arg(long, short = 'y')]
    pub yes: bool,
    /// With --dry-run: plan from FILE instead of config.yaml, against this
    /// home's sandboxes, proxy and engine (a pre-merge check); nothing is
    /// written.
    #[arg(long, value_name = "FILE", requires = "dry_run")]
    pub config: Option<std::path::PathBuf>,
    /// Also remove the sandboxes the config no longer wants (as
    /// reconcile.prune: true does).
    #[arg(long)]
    pub prune: bool,
    /// How to print the plan.
    #[arg(long, value_enum, default_value_t = Output::Text)]
    pub output: Output,
}

#[derive(Debug, Args)]
pub struct DownArgs {
    /// Print the plan without carrying it out. Exit 0: nothing is up, 2:
    /// something is.
    #[arg(long)]
    pub dry_run: bool,
    /// Do not ask first (on a terminal hermes asks; elsewhere it never
    /// does).
    #[arg(long, short = 'y')]
    pub yes: bool,
    /// How to print the plan and its results.
    #[arg(long, value_enum, default_value_t = Output::Text)]
    pub output: Output,
}

/// Checks a task, session or profile name where clap reads it
/// ([`hermes_model::names`]); the error names the flag (and the variable
/// the flag falls back to), the escaped value and the rule.
#[derive(Debug, Clone, Copy)]
pub struct NameParser(pub NameKind);

impl TypedValueParser for NameParser {
    type Value = String;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &std::ffi::OsStr,
    ) -> Result<String, clap::Error> {
        let origin = arg.map_or_else(
            || "a name".to_string(),
            |arg| {
                let flag = match arg.get_long() {
                    Some(long) => format!("--{long}"),
                    None => arg
                        .get_value_names()
                        .and_then(|names| names.first())
                        .map_or_else(|| arg.get_id().to_string(), |n| n.to_string()),
                };
                match arg.get_env() {
                    Some(env) => format!("{flag} (or ${})", env.to_string_lossy()),
                    None => flag,
                }
            },
        );
        let fail = |message: String| {
            let mut cmd = cmd.clone();
            cmd.error(ErrorKind::ValueValidation, message)
        };
        let Some(text) = value.to_str() else {
            return Err(fail(format!(
                "{origin}: {} {:?} is not UTF-8; a {} must be {}",
                self.0,
                value,
                self.0,
                names::RULE
            )));
        };
        names::validate(self.0, text).map_err(|e| fail(e.from_origin(origin).to_string()))?;
        Ok(text.to_string())
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    /// Every argument and option of every command, with the command's path.
    fn every_arg(cmd: &clap::Command, path: &str, out: &mut Vec<(String, clap::Arg)>) {
        for arg in cmd.get_arguments() {
            out.push((path.to_string(), arg.clone()));
        }
        for sub in cmd.get_subcommands() {
            every_arg(sub, &format!("{path} {}", sub.get_name()), out);
        }
    }

    #[test]
    fn every_argument_and_option_has_a_help_line() {
        let mut args = Vec::new();
        every_arg(&Cli::command(), "hermes", &mut args);
        assert!(args.len() > 20);
        for (path, arg) in args {
            assert!(
                arg.get_help().is_some() || arg.get_long_help().is_some(),
                "{path}: {} has no help",
                arg.get_id()
            );
        }
    }

    #[test]
    fn every_command_that_prints_data_takes_output() {
        let cli = Cli::command();
        for path in [
            &["status"][..],
            &["reconcile"],
            &["sandbox", "list"],
            &["session", "list"],
            &["egress", "status"],
            &["config", "get"],
            &["config", "show"],
        ] {
            let mut cmd = &cli;
            for name in path {
                cmd = cmd
                    .find_subcommand(name)
                    .unwrap_or_else(|| panic!("no command {path:?}"));
            }
            let output = cmd
                .get_arguments()
                .find(|a| a.get_long() == Some("output"))
                .unwrap_or_else(|| panic!("{path:?} has no --output"));
            let values: Vec<String> = output
                .get_possible_values()
                .iter()
                .map(|v| v.get_name().to_string())
                .collect();
            assert_eq!(values, ["text", "json"], "{path:?}");
        }
    }

    /// What an option is for, in the order a command's help lists them.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
    enum Place {
        /// What to act on: a task, a session.
        Target,
        Common,
        /// Asked for now and then.
        Rare,
        /// How to print (`--output`, and `--json`, its alias).
        Output,
        /// clap's own: `--help`, `--version`.
        Builtin,
    }

    fn place(long: &str) -> Place {
        match long {
            "task" | "session" => Place::Target,
            "background" | "config" | "prune" | "force" | "metrics-expose" | "show-tokens" => {
                Place::Rare
            }
            "output" | "json" => Place::Output,
            "help" | "version" => Place::Builtin,
            _ => Place::Common,
        }
    }

    /// The options of `cmd` as its help lists them, by heading: (heading,
    /// long names in order).
    fn options_by_heading(cmd: &clap::Command) -> Vec<(String, Vec<String>)> {
        let mut options: Vec<&clap::Arg> = cmd
            .get_arguments()
            .filter(|a| !a.is_positional() && !a.is_hide_set())
            .collect();
        // The help's own order: display order, then name.
        options.sort_by_key(|a| (a.get_display_order(), a.get_id().to_string()));
        // The untitled options come first, under "Options".
        let mut headings: Vec<(String, Vec<String>)> = vec![("Options".to_string(), Vec::new())];
        for arg in options {
            let heading = arg.get_help_heading().unwrap_or("Options").to_string();
            let long = arg.get_long().unwrap_or_default().to_string();
            match headings.iter_mut().find(|(h, _)| *h == heading) {
                Some((_, longs)) => longs.push(long),
                None => headings.push((heading, vec![long])),
            }
        }
        headings.retain(|(_, longs)| !longs.is_empty());
        headings
    }

    /// Every command (built, so that the global options are in each).
    fn every_command(cmd: &clap::Command, path: &str, out: &mut Vec<(String, clap::Command)>) {
        out.push((path.to_string(), cmd.clone()));
        // clap's own `help` subcommands take no options.
        for sub in cmd.get_subcommands().filter(|s| s.get_name() != "help") {
            every_command(sub, &format!("{path} {}", sub.get_name()), out);
        }
    }

    /// In every command's help: the command's own options (what to act on,
    /// common, rare, `--output`, then clap's `--help`), then the global
    /// options, the same three in the same order, logging last.
    #[test]
    fn options_come_in_the_natural_order() {
        let mut cli = Cli::command();
        cli.build();
        let mut commands = Vec::new();
        every_command(&cli, "hermes", &mut commands);
        assert!(commands.len() > 15, "{}", commands.len());
        for (path, cmd) in &commands {
            let headings = options_by_heading(cmd);
            let names: Vec<&str> = headings.iter().map(|(h, _)| h.as_str()).collect();
            assert_eq!(names, ["Options", GLOBAL], "{path}: {headings:?}");
            let own = &headings[0].1;
            let places: Vec<Place> = own.iter().map(|l| place(l)).collect();
            assert!(
                places.is_sorted(),
                "{path}: the options {own:?} are out of order ({places:?}): what to act on, \
                 common, rare, --output, then --help"
            );
            assert_eq!(
                headings[1].1,
                ["home", "profile", "log-format"],
                "{path}: the global options"
            );
        }
    }

    #[test]
    fn the_order_rule_catches_an_option_placed_wrongly() {
        #[derive(Debug, Parser)]
        struct Wrong {
            /// How to print.
            #[arg(long)]
            output: bool,
            /// A task.
            #[arg(long)]
            task: bool,
        }
        let headings = options_by_heading(&Wrong::command());
        let places: Vec<Place> = headings[0].1.iter().map(|l| place(l)).collect();
        assert!(!places.is_sorted(), "{headings:?}");
    }
}
