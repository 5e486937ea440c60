//! Ctrl-C (SIGINT, or SIGTERM) during a one-shot command that changes the
//! host (`hermes reconcile`): the first signal asks the command to stop
//! after the operation in flight, and a replacement still waiting for the
//! commands running in its sandbox gives up at once, having changed
//! nothing; the second signal exits at once. The command then says what
//! was not carried out and exits 130. The controller has its own handler
//! (`daemon`), which stops its loop the same way.

use std::sync::atomic::{AtomicBool, Ordering};

/// The exit code of a command stopped by a signal (128 + SIGINT).
pub const EXIT_CODE: u8 = 130;

static REQUESTED: AtomicBool = AtomicBool::new(false);

/// The flag [`crate::apply::ApplyOptions::stop`] checks before each
/// operation.
pub fn flag() -> &'static AtomicBool {
    &REQUESTED
}

/// Whether a stop was asked for.
pub fn requested() -> bool {
    REQUESTED.load(Ordering::SeqCst)
}

/// Handles SIGINT and SIGTERM from now on, in this process's runtime:
/// the first asks the command to stop ([`requested`]).
pub fn install() -> std::io::Result<()> {
    on_signals(|| {
        eprintln!(
            "hermes: interrupted: finishing the operation in flight, then stopping (again to exit at once)"
        );
        REQUESTED.store(true, Ordering::SeqCst);
    })
}

/// From now on, the first SIGINT or SIGTERM calls `first`, and the second
/// exits at once with [`EXIT_CODE`] (the controller's stop uses this too).
pub fn on_signals(first: impl FnOnce() + Send + 'static) -> std::io::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::spawn(async move {
        let mut first = Some(first);
        loop {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
            match first.take() {
                Some(first) => first(),
                None => {
                    eprintln!("hermes: a second signal: exiting now");
                    std::process::exit(i32::from(EXIT_CODE));
                }
            }
        }
    });
    Ok(())
}
