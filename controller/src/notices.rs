//! What a pass says on stderr besides its output: warnings (of config.yaml,
//! of the host), the config's errors that block only the Docker sandboxes,
//! and the error of an operation. A one-shot command prints
//! them as `warning: …`/`error: …` lines. The controller logs them instead
//! ([`to_log`]): each warning once while it stands (not once per pass: an
//! idle controller says nothing), as a log line of the chosen format, and
//! an operation's error not at all here (the daemon logs each failure with
//! its retry).

use std::collections::HashSet;
use std::fmt::Display;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

/// Whether notices go to the log (the controller) rather than stderr.
static TO_LOG: AtomicBool = AtomicBool::new(false);

/// The warnings said in this pass and the one before.
static SAID: Mutex<Said> = Mutex::new(Said {
    this_pass: None,
    last_pass: None,
});

struct Said {
    this_pass: Option<HashSet<String>>,
    last_pass: Option<HashSet<String>>,
}

/// From now on notices are log lines (the controller's).
pub fn to_log() {
    TO_LOG.store(true, Ordering::SeqCst);
}

/// A pass starts: a warning the last pass gave is not said again, one
/// that went away and comes back is.
pub fn begin_pass() {
    let mut said = SAID
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    said.last_pass = said.this_pass.take();
}

/// A warning: `warning: TEXT` on stderr, or a log line when it is new.
pub fn warning(text: impl Display) {
    let text = text.to_string();
    if !TO_LOG.load(Ordering::SeqCst) {
        eprintln!("warning: {text}");
        return;
    }
    if first_time(&text) {
        tracing::warn!("{text}");
    }
}

/// An error of the config that does not stop the pass (one that blocks
/// the Docker sandboxes only): `error: TEXT` on stderr, or, as a warning
/// is, a log line when it is new.
pub fn error(text: impl Display) {
    let text = text.to_string();
    crate::json::note_error(&text);
    if !TO_LOG.load(Ordering::SeqCst) {
        eprintln!("error: {text}");
        return;
    }
    if first_time(&text) {
        tracing::error!("{text}");
    }
}

/// Whether notices go to the log (the controller's).
pub fn logging() -> bool {
    TO_LOG.load(Ordering::SeqCst)
}

/// What an operation is doing that takes a while (a wait): `hermes: TEXT`
/// on stderr, or an info line in the controller's log.
pub fn progress(text: impl Display) {
    if TO_LOG.load(Ordering::SeqCst) {
        tracing::info!("{text}");
    } else {
        eprintln!("hermes: {text}");
    }
}

/// An operation's error: `error: TEXT` on stderr; in the controller, the
/// daemon's own line says it.
pub fn op_error(text: impl Display) {
    crate::json::note_error(&text.to_string());
    if !TO_LOG.load(Ordering::SeqCst) {
        eprintln!("error: {text}");
    }
}

/// Records `text` as said in this pass; whether it was not said in the
/// last one (nor already in this one).
fn first_time(text: &str) -> bool {
    let mut said = SAID
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let Said {
        this_pass,
        last_pass,
    } = &mut *said;
    let new_here = this_pass
        .get_or_insert_with(HashSet::new)
        .insert(text.to_string());
    new_here && !last_pass.as_ref().is_some_and(|last| last.contains(text))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_warning_is_new_once_while_it_stands_and_again_when_it_comes_back() {
        // Only this test touches the log mode's record.
        begin_pass();
        assert!(first_time("w1"));
        assert!(!first_time("w1"), "twice in one pass");
        begin_pass();
        assert!(!first_time("w1"), "still standing");
        begin_pass();
        // w1 went away for a pass.
        assert!(first_time("w2"));
        begin_pass();
        assert!(first_time("w1"), "back again");
        assert!(!first_time("w2"));
    }
}
