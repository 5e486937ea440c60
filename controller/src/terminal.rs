//! The user's terminal under `hermes exec -t`: put in raw mode while the
//! command runs (every key goes to the command, Ctrl-C included) and
//! restored when the guard drops, and its size followed (SIGWINCH) for the
//! command's own terminal.

use hermes_backends::exec::TtySize;
use nix::sys::termios::{SetArg, Termios, cfmakeraw, tcgetattr, tcsetattr};

/// The size a terminal that cannot say its own gets.
const FALLBACK: TtySize = TtySize { rows: 24, cols: 80 };

/// Raw mode on this process's standard input, until dropped.
#[derive(Debug)]
pub struct Raw {
    saved: Termios,
}

impl Raw {
    /// Puts standard input (a terminal) in raw mode.
    pub fn enter() -> nix::Result<Raw> {
        let stdin = std::io::stdin();
        let saved = tcgetattr(&stdin)?;
        let mut raw = saved.clone();
        cfmakeraw(&mut raw);
        tcsetattr(&stdin, SetArg::TCSANOW, &raw)?;
        Ok(Raw { saved })
    }
}

impl Drop for Raw {
    fn drop(&mut self) {
        // Output already written is let out first (TCSADRAIN).
        let _ = tcsetattr(std::io::stdin(), SetArg::TCSADRAIN, &self.saved);
    }
}

/// The size of the terminal on standard input (else on stdout).
pub fn size() -> TtySize {
    terminal_size::terminal_size_of(std::io::stdin())
        .or_else(|| terminal_size::terminal_size_of(std::io::stdout()))
        .map_or(FALLBACK, |(w, h)| TtySize {
            rows: h.0,
            cols: w.0,
        })
}

/// The terminal's size now and at every change, until the runtime ends.
pub fn follow_size() -> tokio::sync::watch::Receiver<TtySize> {
    let (tx, rx) = tokio::sync::watch::channel(size());
    let Ok(mut changes) =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::window_change())
    else {
        tracing::debug!("cannot follow the terminal's size (no SIGWINCH handler)");
        return rx;
    };
    tokio::spawn(async move {
        while changes.recv().await.is_some() {
            if tx.send(size()).is_err() {
                break;
            }
        }
    });
    rx
}
