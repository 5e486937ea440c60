//! Where hermes's output meets the redactor (`security.redact_secrets`):
//! the real key values it knows, a writer that masks a command's streamed
//! output, and a `MakeWriter` that masks every log line.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use hermes_model::redact::{Redactor, StreamRedactor};
use tokio::io::AsyncWrite;

use crate::home::Home;

/// The real key values this host holds: the provider variables of the
/// process's environment and of `$HERMES_HOME/.env`.
pub fn known_secrets(home: &Home) -> Vec<String> {
    let dotenv = crate::host::read_env_text(home)
        .map(|text| hermes_model::dotenv::parse(&text))
        .unwrap_or_default();
    let mut values = Vec::new();
    for name in hermes_model::providers::key_variables() {
        if let Ok(value) = std::env::var(name) {
            values.push(value);
        }
        if let Some(value) = hermes_model::dotenv::get(&dotenv, name) {
            values.push(value.to_string());
        }
    }
    values
}

/// An [`AsyncWrite`] that masks secrets in what passes through. Bytes are
/// accepted at once; an unfinished line may be held back until more comes
/// or [`RedactingWriter::finish`].
#[derive(Debug)]
pub struct RedactingWriter<W> {
    inner: W,
    stream: StreamRedactor,
    pending: Vec<u8>,
    written: usize,
    eager: bool,
}

impl<W: AsyncWrite + Unpin> RedactingWriter<W> {
    pub fn new(inner: W, redactor: Arc<Redactor>) -> RedactingWriter<W> {
        RedactingWriter {
            inner,
            stream: StreamRedactor::new(redactor),
            pending: Vec::new(),
            written: 0,
            eager: false,
        }
    }

    /// On a terminal: each flush writes out what was held back too, so a
    /// prompt that ends no line shows at once. Each chunk is still
    /// redacted whole; a secret a program writes in two pieces, each
    /// flushed, is redacted only where a piece holds enough of it.
    pub fn eager(mut self, on: bool) -> RedactingWriter<W> {
        self.eager = on;
        self
    }

    /// Writes out what was held back, and flushes.
    pub async fn finish(&mut self) -> io::Result<()> {
        use tokio::io::AsyncWriteExt;
        let rest = self.stream.finish();
        self.pending.extend(rest);
        self.flush().await
    }

    /// Writes the pending (already redacted) bytes to the inner writer.
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.written < self.pending.len() {
            let n =
                ready!(Pin::new(&mut self.inner).poll_write(cx, &self.pending[self.written..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.written += n;
        }
        self.pending.clear();
        self.written = 0;
        Poll::Ready(Ok(()))
    }
}

impl<W: AsyncWrite + Unpin> AsyncWrite for RedactingWriter<W> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        // Only take more once what was taken before is out.
        ready!(self.poll_drain(cx))?;
        let out = self.stream.push(buf);
        self.pending = out;
        // The bytes are ours now; a Pending drain finishes on the next call.
        let _ = self.poll_drain(cx)?;
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.poll_drain(cx))?;
        if self.eager {
            let rest = self.stream.finish();
            if !rest.is_empty() {
                self.pending = rest;
                ready!(self.poll_drain(cx))?;
            }
        }
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.pending.is_empty() {
            let rest = self.stream.finish();
            self.pending = rest;
        }
        ready!(self.poll_drain(cx))?;
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Log lines through the redactor: each formatted event is one `write`.
#[derive(Debug, Clone)]
pub struct RedactingLogs {
    redactor: Option<Arc<Redactor>>,
    one_line: bool,
}

impl RedactingLogs {
    /// `None`: logs go out as they are (`security.redact_secrets: false`).
    pub fn new(redactor: Option<Arc<Redactor>>) -> RedactingLogs {
        RedactingLogs {
            redactor,
            one_line: false,
        }
    }

    /// Each event on one line: a line break inside a message or a field
    /// (a config error's two lines) is written `\n` (the text format; JSON
    /// escapes its own).
    pub fn one_line(mut self, on: bool) -> RedactingLogs {
        self.one_line = on;
        self
    }
}

/// `event` with every line break but the final one written `\n`.
fn on_one_line(event: &[u8]) -> std::borrow::Cow<'_, [u8]> {
    let body = event.strip_suffix(b"\n").unwrap_or(event);
    if !body.contains(&b'\n') {
        return std::borrow::Cow::Borrowed(event);
    }
    let mut out = Vec::with_capacity(event.len() + 8);
    for &byte in body {
        match byte {
            b'\n' => out.extend_from_slice(b"\\n"),
            byte => out.push(byte),
        }
    }
    out.extend_from_slice(&event[body.len()..]);
    std::borrow::Cow::Owned(out)
}

/// One log event's writer.
#[derive(Debug)]
pub struct LogLine {
    redactor: Option<Arc<Redactor>>,
    one_line: bool,
}

impl io::Write for LogLine {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let mut err = io::stderr().lock();
        let event = match self.one_line {
            true => on_one_line(buf),
            false => std::borrow::Cow::Borrowed(buf),
        };
        match &self.redactor {
            Some(r) => err.write_all(&r.redact(&event))?,
            None => err.write_all(&event)?,
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        io::stderr().flush()
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for RedactingLogs {
    type Writer = LogLine;

    fn make_writer(&'a self) -> LogLine {
        LogLine {
            redactor: self.redactor.clone(),
            one_line: self.one_line,
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use tokio::io::AsyncWriteExt;

    use super::*;

    #[test]
    fn a_log_event_stays_on_one_line() {
        assert_eq!(
            &*on_one_line(b"ERROR bad: file.yaml:4: x\nconfig.yaml is invalid\n"),
            b"ERROR bad: file.yaml:4: x\\nconfig.yaml is invalid\n"
        );
        assert_eq!(&*on_one_line(b"INFO done\n"), b"INFO done\n");
        assert_eq!(&*on_one_line(b"no end"), b"no end");
    }

    #[tokio::test]
    async fn the_writer_masks_secrets_split_across_writes() {
        let redactor = Arc::new(Redactor::new(["my-real-secret-value"]));
        let mut out = Vec::new();
        {
            let mut w = RedactingWriter::new(&mut out, redactor);
            for chunk in "value: my-real-sec".as_bytes().chunks(3) {
                w.write_all(chunk).await.unwrap();
                w.flush().await.unwrap();
            }
            w.write_all(b"ret-value\nsecond line sk-ant-abcdefghijklmnopqrstuvwx")
                .await
                .unwrap();
            w.finish().await.unwrap();
        }
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "value: my-r…[redacted]\nsecond line sk-ant-ab…[redacted]"
        );
    }
}
