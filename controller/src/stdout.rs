//! Standard output that ends quietly when its reader goes away.
//!
//! `hermes sandbox list | head -1` closes the pipe before hermes is done:
//! std's `println!` panics on that (exit 101 with a message). Every
//! `println!` and `print!` of this crate is this module's instead (the
//! crate root shadows the std macros), so a closed stdout is the end of the
//! output and nothing else: the command runs to its end, prints nothing
//! more, and exits with its usual code. Another write error (a full disk
//! under a redirection) is reported once on stderr and makes the exit code
//! 1.

use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

/// 0: open; 1: the reader went away; 2: another write error.
static STATE: AtomicU8 = AtomicU8::new(OPEN);
/// Whether anything was written (`--output json`'s one document).
static WROTE: AtomicBool = AtomicBool::new(false);
const OPEN: u8 = 0;
const CLOSED: u8 = 1;
const FAILED: u8 = 2;

/// Writes `args` (and a newline) to stdout, unless it was closed; flushes
/// at each newline, as std's line-buffered stdout does.
pub fn write(args: std::fmt::Arguments<'_>, newline: bool) {
    WROTE.store(true, Ordering::Relaxed);
    if STATE.load(Ordering::Relaxed) != OPEN {
        return;
    }
    let mut out = std::io::stdout().lock();
    let result = out.write_fmt(args).and_then(|()| {
        if newline {
            out.write_all(b"\n")?;
            out.flush()
        } else {
            Ok(())
        }
    });
    if let Err(e) = result {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            STATE.store(CLOSED, Ordering::Relaxed);
        } else if STATE.swap(FAILED, Ordering::Relaxed) == OPEN {
            eprintln!("error: cannot write the output: {e}");
        }
    }
}

/// Flushes what `print!` left without a newline; a closed pipe is not an
/// error here either.
pub fn flush() {
    if STATE.load(Ordering::Relaxed) != OPEN {
        return;
    }
    if let Err(e) = std::io::stdout().lock().flush() {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            STATE.store(CLOSED, Ordering::Relaxed);
        } else if STATE.swap(FAILED, Ordering::Relaxed) == OPEN {
            eprintln!("error: cannot write the output: {e}");
        }
    }
}

/// Whether a write failed for another reason than a closed reader.
pub fn failed() -> bool {
    STATE.load(Ordering::Relaxed) == FAILED
}

/// Whether a command wrote (or tried to write) anything on stdout.
pub fn wrote() -> bool {
    WROTE.load(Ordering::Relaxed)
}
