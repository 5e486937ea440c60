//! A command's output as the model reads it: captured with bounded memory
//! (the first and the last bytes kept, everything between counted), then
//! truncated the way the reference's terminal tool does it (40 % head,
//! 60 % tail, a marker saying how much was cut), with terminal escapes
//! removed. The capture also keeps what arrived since the last progress
//! notification, bounded too.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};

/// The most output the model reads from one command, in bytes: the
/// reference's 50 000 characters.
pub const MAX_OUTPUT: usize = 50_000;

/// The head's share of [`MAX_OUTPUT`] (error messages often come early);
/// the tail has the rest (the latest output).
pub const HEAD: usize = MAX_OUTPUT * 2 / 5;

/// The most new output one progress notification carries.
pub const PROGRESS_CHUNK: usize = 2_000;

/// What a command wrote, both streams in the order they arrived.
#[derive(Debug, Default)]
pub struct Captured {
    head: Vec<u8>,
    tail: VecDeque<u8>,
    head_max: usize,
    tail_max: usize,
    total: u64,
    /// Output since the last [`Captured::take_new`], its last bytes only.
    new: VecDeque<u8>,
    /// How many bytes arrived since the last [`Captured::take_new`].
    new_total: u64,
}

impl Captured {
    /// Keeps at most `head_max` bytes from the start and `tail_max` from
    /// the end.
    pub fn new(head_max: usize, tail_max: usize) -> Captured {
        Captured {
            head_max,
            tail_max,
            ..Captured::default()
        }
    }

    /// The terminal tool's capture: [`HEAD`] and the rest of
    /// [`MAX_OUTPUT`].
    pub fn terminal() -> Captured {
        Captured::new(HEAD, MAX_OUTPUT - HEAD)
    }

    fn push(&mut self, mut bytes: &[u8]) {
        self.total += bytes.len() as u64;
        self.new_total += bytes.len() as u64;
        push_bounded(&mut self.new, bytes, PROGRESS_CHUNK);
        let room = self.head_max - self.head.len();
        if room > 0 {
            let n = room.min(bytes.len());
            self.head.extend_from_slice(&bytes[..n]);
            bytes = &bytes[n..];
        }
        push_bounded(&mut self.tail, bytes, self.tail_max);
    }

    /// How many bytes arrived in all.
    #[cfg(test)]
    pub fn total(&self) -> u64 {
        self.total
    }

    /// What arrived since the last call (its last [`PROGRESS_CHUNK`]
    /// bytes, cleaned), or `None` if nothing did.
    pub fn take_new(&mut self) -> Option<String> {
        if self.new_total == 0 {
            return None;
        }
        let skipped = self.new_total - self.new.len() as u64;
        self.new_total = 0;
        let bytes: Vec<u8> = self.new.drain(..).collect();
        let text = clean(&String::from_utf8_lossy(&bytes));
        Some(if skipped > 0 {
            format!("[{skipped} bytes not shown]\n{text}")
        } else {
            text
        })
    }

    /// Removes the last line that starts with `marker` (and the newline
    /// put before it) and returns the rest of that line. Looked for in the
    /// tail, where a marker printed at the end is.
    pub fn take_marker(&mut self, marker: &str) -> Option<String> {
        let marker = marker.as_bytes();
        if self.tail.is_empty() {
            let before = self.head.len();
            let found = take_marker_line(&mut self.head, marker)?;
            self.total -= (before - self.head.len()) as u64;
            return Some(found);
        }
        let mut tail: Vec<u8> = self.tail.iter().copied().collect();
        let before = tail.len();
        let found = take_marker_line(&mut tail, marker)?;
        self.total -= (before - tail.len()) as u64;
        self.tail = tail.into();
        Some(found)
    }

    /// The output as the model reads it: everything if it fit, else the
    /// head, a marker saying how much was cut, and the tail; terminal
    /// escapes and control characters removed.
    pub fn text(&self) -> String {
        let kept = (self.head.len() + self.tail.len()) as u64;
        let mut bytes = self.head.clone();
        let omitted = self.total.saturating_sub(kept);
        let marker = (omitted > 0).then(|| {
            format!(
                "\n\n... [OUTPUT TRUNCATED - {omitted} bytes omitted out of {} total] ...\n\n",
                self.total
            )
        });
        if marker.is_none() {
            bytes.extend(self.tail.iter());
            return clean(&String::from_utf8_lossy(&bytes));
        }
        let tail: Vec<u8> = self.tail.iter().copied().collect();
        let mut text = clean(&String::from_utf8_lossy(&bytes));
        text.push_str(marker.as_deref().unwrap_or_default());
        text.push_str(&clean(&String::from_utf8_lossy(&tail)));
        text
    }

    /// The raw bytes kept (head and tail, as one), for callers that parse
    /// what a helper script printed.
    pub fn bytes(&self) -> Vec<u8> {
        let mut bytes = self.head.clone();
        bytes.extend(self.tail.iter());
        bytes
    }

    /// Whether bytes were dropped between the head and the tail.
    pub fn truncated(&self) -> bool {
        self.total > (self.head.len() + self.tail.len()) as u64
    }
}

fn push_bounded(buf: &mut VecDeque<u8>, bytes: &[u8], max: usize) {
    if max == 0 {
        return;
    }
    let bytes = &bytes[bytes.len().saturating_sub(max)..];
    let over = (buf.len() + bytes.len()).saturating_sub(max);
    buf.drain(..over);
    buf.extend(bytes);
}

/// Removes from `buf` the last `\n` + `marker` + rest-of-line + `\n` (or
/// to the end) and returns the rest of that line.
fn take_marker_line(buf: &mut Vec<u8>, marker: &[u8]) -> Option<String> {
    let at = buf
        .windows(marker.len())
        .rposition(|w| w == marker)
        .filter(|_| !marker.is_empty())?;
    let value_start = at + marker.len();
    let end = buf[value_start..]
        .iter()
        .position(|&b| b == b'\n')
        .map_or(buf.len(), |p| value_start + p);
    let value = String::from_utf8_lossy(&buf[value_start..end]).into_owned();
    let start = if at > 0 && buf[at - 1] == b'\n' {
        at - 1
    } else {
        at
    };
    let stop = (end + 1).min(buf.len());
    buf.drain(start..stop);
    Some(value)
}

/// Removes terminal escape sequences (CSI and OSC) and the control
/// characters other than newline and tab; a carriage return before a
/// newline goes too.
pub fn clean(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\u{1b}' => match chars.peek() {
                Some('[') => {
                    chars.next();
                    // Parameters and intermediates, then one final byte.
                    for c in chars.by_ref() {
                        if ('\u{40}'..='\u{7e}').contains(&c) {
                            break;
                        }
                    }
                }
                Some(']') => {
                    chars.next();
                    // Up to BEL or ST (ESC \).
                    while let Some(c) = chars.next() {
                        if c == '\u{7}' {
                            break;
                        }
                        if c == '\u{1b}' && chars.peek() == Some(&'\\') {
                            chars.next();
                            break;
                        }
                    }
                }
                _ => {
                    chars.next();
                }
            },
            '\r' if chars.peek() == Some(&'\n') => {}
            '\n' | '\t' => out.push(c),
            c if c.is_control() => {}
            c => out.push(c),
        }
    }
    out
}

/// A handle on a capture shared by a command's two output streams and
/// whoever reports its progress.
#[derive(Debug, Clone)]
pub struct Shared(Arc<Mutex<Captured>>);

impl Shared {
    pub fn new(captured: Captured) -> Shared {
        Shared(Arc::new(Mutex::new(captured)))
    }

    pub fn lock(&self) -> MutexGuard<'_, Captured> {
        // A panic while holding the lock leaves a capture that is still
        // consistent enough to read: take it anyway.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A writer into the capture (one per stream).
    pub fn writer(&self) -> Writer {
        Writer(self.clone())
    }
}

/// One stream's writer into a [`Shared`] capture; never blocks, never
/// fails.
#[derive(Debug)]
pub struct Writer(Shared);

impl tokio::io::AsyncWrite for Writer {
    fn poll_write(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.0.lock().push(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn captured(chunks: &[&[u8]]) -> Captured {
        let mut c = Captured::terminal();
        for chunk in chunks {
            c.push(chunk);
        }
        c
    }

    #[test]
    fn short_output_is_kept_whole() {
        let c = captured(&[b"hello ", b"world\n"]);
        assert_eq!(c.text(), "hello world\n");
        assert!(!c.truncated());
    }

    #[test]
    fn long_output_keeps_head_and_tail_with_a_marker() {
        let mut data = vec![b'a'; HEAD];
        data.extend(vec![b'b'; 100_000]);
        data.extend(vec![b'c'; MAX_OUTPUT - HEAD]);
        // In odd chunks, so that the head fills across a write.
        let chunks: Vec<&[u8]> = data.chunks(7_777).collect();
        let c = captured(&chunks);
        let text = c.text();
        assert!(c.truncated());
        let marker = format!(
            "\n\n... [OUTPUT TRUNCATED - 100000 bytes omitted out of {} total] ...\n\n",
            data.len()
        );
        assert_eq!(
            text,
            format!(
                "{}{marker}{}",
                "a".repeat(HEAD),
                "c".repeat(MAX_OUTPUT - HEAD)
            )
        );
    }

    #[test]
    fn escapes_and_controls_are_removed() {
        assert_eq!(
            clean("\u{1b}[31mred\u{1b}[0m\r\n\u{1b}]0;title\u{7}x\u{0}y\tz"),
            "red\nxy\tz"
        );
    }

    #[test]
    fn the_marker_line_is_taken_out() {
        let mut c = captured(&[b"out\n", b"\n@@M@@/tmp/x\n", b"err\n"]);
        assert_eq!(c.take_marker("@@M@@").as_deref(), Some("/tmp/x"));
        assert_eq!(c.text(), "out\nerr\n");
        assert_eq!(c.total(), 8);
        // In the tail of a long output too.
        let mut long = vec![b'x'; MAX_OUTPUT * 2];
        long.extend(b"\n@@M@@/w\n");
        let mut c = captured(&[&long]);
        assert_eq!(c.take_marker("@@M@@").as_deref(), Some("/w"));
        assert!(!c.text().contains("@@M@@"));
        assert_eq!(c.total(), (MAX_OUTPUT * 2) as u64);
    }

    #[test]
    fn progress_takes_only_what_is_new_and_bounded() {
        let mut c = captured(&[b"one\n"]);
        assert_eq!(c.take_new().as_deref(), Some("one\n"));
        assert_eq!(c.take_new(), None);
        c.push(&vec![b'z'; PROGRESS_CHUNK + 10]);
        let new = c.take_new().unwrap_or_default();
        assert!(new.starts_with("[10 bytes not shown]\n"), "{new}");
    }
}
