//! One module per top-level subcommand, and what the printing of several
//! of them shares (a plan's text, the question before a change). Nothing
//! below this layer imports it: a pass is [`crate::pass`], loading
//! config.yaml [`crate::load`], observing [`crate::observe`].

pub mod config;
pub mod describe;
pub mod down;
pub mod egress;
pub mod exec;
pub mod manual;
pub mod mcp;
pub mod process;
pub mod reconcile;
pub mod sandbox;
pub mod session;
pub mod status;

/// The width of the terminal stdout is, if it is one: a plan printed
/// there wraps its long causes to it.
pub(crate) fn terminal_columns() -> Option<usize> {
    terminal_size::terminal_size().map(|(terminal_size::Width(w), _)| usize::from(w))
}

/// `plan` as text: wrapped to the terminal's width on a terminal, one
/// line per operation elsewhere.
pub(crate) fn plan_text(plan: &impl std::fmt::Display) -> String {
    match terminal_columns() {
        Some(columns) => format!("{plan:columns$}"),
        None => plan.to_string(),
    }
}

/// On a terminal (stdin and stderr both): says `what`, asks `Carry it
/// out? [y/N]` and reads the answer (yes only for `y`/`yes`). Without a
/// terminal it never asks: yes.
pub(crate) fn ask(what: &str) -> bool {
    use std::io::{BufRead, IsTerminal, Write};
    if !(std::io::stdin().is_terminal() && std::io::stderr().is_terminal()) {
        return true;
    }
    let mut err = std::io::stderr().lock();
    let _ = writeln!(err, "{what}");
    let _ = write!(err, "Carry it out? [y/N] ");
    let _ = err.flush();
    drop(err);
    let mut answer = String::new();
    if std::io::stdin().lock().read_line(&mut answer).is_err() {
        return false;
    }
    matches!(answer.trim().to_ascii_lowercase().as_str(), "y" | "yes")
}
