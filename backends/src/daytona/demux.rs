//! Splitting a session command's log back into stdout and stderr.
//!
//! The Daytona daemon writes both streams of a session command into one
//! log, each chunk behind a three-byte marker: `01 01 01` for stdout,
//! `02 02 02` for stderr. Logs from daemons older than the markers are all
//! stdout. A marker can be cut across two WebSocket messages, so the tail
//! that might be the start of one is held back until the next message.

const STDOUT_MARK: [u8; 3] = [1, 1, 1];
const STDERR_MARK: [u8; 3] = [2, 2, 2];

/// Which stream a chunk belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

/// The demultiplexer of one log.
#[derive(Debug)]
pub struct Demux {
    current: Stream,
    held: Vec<u8>,
}

impl Default for Demux {
    fn default() -> Self {
        Demux {
            current: Stream::Stdout,
            held: Vec::new(),
        }
    }
}

impl Demux {
    /// The chunks `bytes` completes, in order.
    pub fn push(&mut self, bytes: &[u8]) -> Vec<(Stream, Vec<u8>)> {
        let mut buf = std::mem::take(&mut self.held);
        buf.extend_from_slice(bytes);
        let mut out = Vec::new();
        let mut start = 0;
        let mut i = 0;
        while i < buf.len() {
            let rest = &buf[i..];
            let mark = if rest.starts_with(&STDOUT_MARK) {
                Some(Stream::Stdout)
            } else if rest.starts_with(&STDERR_MARK) {
                Some(Stream::Stderr)
            } else {
                None
            };
            if let Some(next) = mark {
                self.emit(&mut out, &buf[start..i]);
                self.current = next;
                i += 3;
                start = i;
                continue;
            }
            if rest.len() < 3 && (STDOUT_MARK.starts_with(rest) || STDERR_MARK.starts_with(rest)) {
                // Maybe the start of a marker: wait for more.
                break;
            }
            i += 1;
        }
        self.emit(&mut out, &buf[start..i]);
        self.held = buf[i..].to_vec();
        out
    }

    /// What is left once the log ended.
    pub fn finish(&mut self) -> Option<(Stream, Vec<u8>)> {
        let held = std::mem::take(&mut self.held);
        (!held.is_empty()).then_some((self.current, held))
    }

    fn emit(&self, out: &mut Vec<(Stream, Vec<u8>)>, bytes: &[u8]) {
        if bytes.is_empty() {
            return;
        }
        match out.last_mut() {
            Some((stream, chunk)) if *stream == self.current => chunk.extend_from_slice(bytes),
            _ => out.push((self.current, bytes.to_vec())),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn collect(parts: &[&[u8]]) -> (Vec<u8>, Vec<u8>) {
        let mut d = Demux::default();
        let (mut o, mut e) = (Vec::new(), Vec::new());
        let mut chunks = Vec::new();
        for p in parts {
            chunks.extend(d.push(p));
        }
        chunks.extend(d.finish());
        for (s, c) in chunks {
            match s {
                Stream::Stdout => o.extend(c),
                Stream::Stderr => e.extend(c),
            }
        }
        (o, e)
    }

    #[test]
    fn splits_marked_chunks() {
        let (o, e) = collect(&[b"\x01\x01\x01out1\n\x02\x02\x02err\n\x01\x01\x01out2\n"]);
        assert_eq!(o, b"out1\nout2\n");
        assert_eq!(e, b"err\n");
    }

    #[test]
    fn a_marker_cut_across_messages() {
        let (o, e) = collect(&[b"\x01\x01\x01a\x02", b"\x02", b"\x02b\x01\x01", b"\x01c"]);
        assert_eq!(o, b"ac");
        assert_eq!(e, b"b");
    }

    #[test]
    fn unmarked_logs_are_stdout_and_lone_control_bytes_pass() {
        let (o, e) = collect(&[b"plain\x01x", b"\x02"]);
        assert_eq!(o, b"plain\x01x\x02");
        assert!(e.is_empty());
    }

    #[test]
    fn output_is_not_held_back_needlessly() {
        let mut d = Demux::default();
        assert_eq!(d.push(b"hello"), vec![(Stream::Stdout, b"hello".to_vec())]);
    }
}
