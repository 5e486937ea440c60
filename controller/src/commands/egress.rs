//! `hermes egress …`: parses nothing further and decides nothing itself;
//! each subcommand calls [`crate::egress`] and prints. `setup` writes the
//! proxy's files and network and restarts or reloads a running proxy that
//! must see them; `start`, `stop` and `serve` are the daemon's; `status`
//! prints the report as text or JSON.

use std::process::ExitCode;

use anyhow::Context;
use hermes_egress::ca::{self, Ca};

use crate::cli::{EgressCommand, Output};
use crate::egress::daemon;
use crate::egress::files::{self, CaChange, Paths};
use crate::egress::status::EgressStatus;
use crate::home::Home;

pub fn run(home: &Home, command: EgressCommand) -> anyhow::Result<ExitCode> {
    let paths = Paths::new(home);
    match command {
        EgressCommand::Install => install(),
        EgressCommand::Setup { rotate_tokens } => setup(home, &paths, rotate_tokens),
        EgressCommand::Start => {
            warn_if_undone(home, Verb::Start);
            daemon::start(home, &paths)
        }
        EgressCommand::Stop => {
            warn_if_undone(home, Verb::Stop);
            daemon::stop(&paths)
        }
        EgressCommand::Status {
            show_tokens,
            all,
            output,
        } => status(home, show_tokens, all, output),
        EgressCommand::Serve { in_cluster: None } => daemon::serve(home, &paths),
        EgressCommand::Serve {
            in_cluster: Some(dir),
        } => crate::egress::cluster::serve(&dir),
    }
}

/// `egress start` or `egress stop`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verb {
    Start,
    Stop,
}

/// Says on stderr when the next pass (`hermes reconcile`, a running
/// controller) will undo what `egress start`/`stop` does: a start
/// while `proxy.enabled` is false, a stop while it is true. Silent when
/// the file cannot be read (start and stop report their own errors).
fn warn_if_undone(home: &Home, verb: Verb) {
    let enabled = crate::host::read_config_text(home)
        .ok()
        .flatten()
        .and_then(|text| hermes_model::config::load(&text).ok())
        .map(|loaded| loaded.config.proxy.enabled);
    if let Some(warning) = enabled.and_then(|enabled| undone_warning(home, verb, enabled)) {
        eprintln!("warning: {warning}");
    }
}

/// The warning of [`warn_if_undone`], if any.
pub fn undone_warning(home: &Home, verb: Verb, enabled: bool) -> Option<String> {
    let file = home.config().display().to_string();
    match (verb, enabled) {
        (Verb::Start, false) => Some(format!(
            "proxy.enabled is false in {file}: the next pass (`hermes reconcile` or a running \
             controller) stops the proxy again; set proxy.enabled: true to keep it running"
        )),
        (Verb::Stop, true) => Some(format!(
            "proxy.enabled is true in {file}: the next pass (`hermes reconcile` or a running \
             controller) starts the proxy again; set proxy.enabled: false to keep it stopped"
        )),
        _ => None,
    }
}

fn install() -> anyhow::Result<ExitCode> {
    let exe = std::env::current_exe().context("cannot find this binary")?;
    println!("Binary:         {}", exe.display());
    println!("Binary version: {}", env!("CARGO_PKG_VERSION"));
    // Everything the proxy needs at run time: a CA, a leaf, a TLS server.
    let new = ca::generate().context("this binary cannot generate a CA")?;
    let ca = Ca::load(&new.cert_pem, &new.key_pem).context("this binary cannot load a CA")?;
    let leaf = hermes_egress::policy::Host::Name("api.openai.com".into());
    ca.mint(&leaf)
        .context("this binary cannot mint a certificate")?;
    println!("The egress proxy is built into this binary: nothing to install.");
    println!("Next: `hermes egress setup`, then `hermes egress start`.");
    Ok(ExitCode::SUCCESS)
}

fn setup(home: &Home, paths: &Paths, rotate: bool) -> anyhow::Result<ExitCode> {
    let config = crate::load::load_config(home)?;
    let written = files::write_setup(home, paths, &config, rotate)?;
    for warning in &written.warnings {
        eprintln!("warning: {warning}");
    }
    println!("CA:       {} ({})", paths.ca_cert().display(), written.ca);
    println!(
        "Tokens:   {} ({} providers, {})",
        paths.tokens().display(),
        written.providers,
        written.tokens
    );
    println!("Mappings: {}", paths.mappings().display());
    println!("Config:   {}", paths.config().display());
    let network = crate::egress::network::setup(home, &config)?;
    let shown = network.to_string();
    if !shown.is_empty() {
        println!("{shown}");
    }
    // Bitwarden is read now: a missing bws or a failed read stops here,
    // before a running proxy is told to read it (it keeps its keys).
    let bitwarden = daemon::check_source(home, paths)?;
    if let Some(names) = &bitwarden {
        let names = if names.is_empty() {
            "no provider key".to_string()
        } else {
            names.join(", ")
        };
        println!("Keys:     from Bitwarden Secrets Manager ({names})");
    }
    if let Some(pid) = daemon::running_pid(paths)? {
        if written.config_changed || network.changed() || written.ca == CaChange::Created {
            println!("The running proxy is restarted to load the new configuration.");
            daemon::stop(paths)?;
            return daemon::start(home, paths);
        }
        if bitwarden.is_some() {
            // Keys rotated in Bitwarden reach the proxy.
            daemon::reload(paths, pid)?;
            println!(
                "The running proxy reloaded its tokens and its keys from Bitwarden (pid {pid})."
            );
        } else if written.tokens_changed {
            daemon::reload(paths, pid)?;
            println!("The running proxy reloaded its tokens (pid {pid}).");
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The report, gathered on a current-thread runtime made for the command
/// (the health probe is async).
fn status(home: &Home, show_tokens: bool, all: bool, output: Output) -> anyhow::Result<ExitCode> {
    let config = crate::load::load_config(home)?;
    let env = crate::host::host_env(home)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let mut report = runtime.block_on(EgressStatus::gather(home, &config, &env, show_tokens))?;
    report.all = all;
    match output {
        Output::Json => crate::json::print(&report)?,
        Output::Text => print!("{report}"),
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn only_an_action_the_next_pass_undoes_is_warned_about() {
        let home = Home::resolve(Some("/h".into())).unwrap();
        assert!(undone_warning(&home, Verb::Start, true).is_none());
        assert!(undone_warning(&home, Verb::Stop, false).is_none());
        let start = undone_warning(&home, Verb::Start, false).unwrap();
        assert!(start.contains("stops the proxy again"), "{start}");
        let stop = undone_warning(&home, Verb::Stop, true).unwrap();
        assert!(stop.contains("starts the proxy again"), "{stop}");
    }
}
