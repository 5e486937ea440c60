//! Masking secrets in what hermes prints: the output of `hermes exec` and
//! its own log lines (`security.redact_secrets`, on by default).
//!
//! Two kinds of secret are masked: the real key values hermes knows (the
//! provider variables of its environment and `.env`), and strings shaped
//! like keys (`sk-…`, `sk-ant-…`, `AIza…`, `gsk_…`, `xai-…`, the token of a
//! `Bearer` header). A mask keeps a short prefix so that a person can tell
//! which key it was: `sk-ant-ap…[redacted]`.
//!
//! [`StreamRedactor`] does the same over a byte stream cut into arbitrary
//! chunks: it never emits part of a secret split between two chunks. It
//! emits up to the last line break at once, and holds back only an
//! unfinished last line, bounded in size, until more output or the end.

use std::borrow::Cow;
use std::sync::Arc;

use regex::bytes::Regex;

/// Known values shorter than this are not treated as secrets (they would
/// mask ordinary words).
pub const MIN_SECRET_LEN: usize = 8;

/// The longest unfinished line held back before it is emitted anyway (with
/// a tail kept back where a secret may still be growing).
const MAX_HOLD: usize = 4096;

/// The longest known value treated as a secret, and so the longest the
/// stream guards across a cut: a value starting before the last this many
/// bytes is whole in what is held, and found.
const MAX_SECRET_LEN: usize = 512;

/// The most a stream ever holds back.
const MAX_CARRY: usize = 64 * 1024;

/// The mask's visible prefix beyond a key's well-known start.
const SHOWN: usize = 2;

/// Masks secrets in text.
#[derive(Debug, Clone)]
pub struct Redactor {
    /// Known values, longest first, so a value containing another is
    /// masked whole.
    known: Vec<Vec<u8>>,
    shapes: Regex,
    /// Key-shaped values that are not secrets (the proxy's own tokens,
    /// which the sandbox holds anyway): left as they are.
    exempt: Vec<Vec<u8>>,
    /// The shape of the egress proxy's tokens (`<provider>-<32 hex>`),
    /// masked only where asked ([`Redactor::with_proxy_tokens`]).
    tokens: Option<Regex>,
}

/// The key shapes: the first group is the part kept visible at the start
/// (before [`SHOWN`] more characters), the secret is the whole match.
const SHAPES: &str = r"(?x)
    (?-u:\b)(sk-ant-)[A-Za-z0-9_\-]{16,}
  | (?-u:\b)(sk-(?:proj-|or-v1-)?)[A-Za-z0-9_\-]{16,}
  | (?-u:\b)(AIza)[0-9A-Za-z_\-]{30,}
  | (?-u:\b)(gsk_)[A-Za-z0-9]{20,}
  | (?-u:\b)(xai-)[A-Za-z0-9]{20,}
  | (?i:bearer)[\ \t]+()[A-Za-z0-9._~+/\-]{16,}=*
";

impl Redactor {
    /// A redactor of the key shapes and of `known` values (values shorter
    /// than [`MIN_SECRET_LEN`], longer than 512 bytes or holding a line
    /// break are ignored).
    pub fn new<I, S>(known: I) -> Redactor
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let mut known: Vec<Vec<u8>> = known
            .into_iter()
            .map(|s| s.as_ref().as_bytes().to_vec())
            .filter(|v| {
                (MIN_SECRET_LEN..=MAX_SECRET_LEN).contains(&v.len())
                    && !v.contains(&b'\n')
                    && !v.contains(&b'\r')
            })
            .collect();
        known.sort_by_key(|v| std::cmp::Reverse(v.len()));
        known.dedup();
        // The pattern is a constant, checked by the tests.
        #[allow(clippy::expect_used)]
        let shapes = Regex::new(SHAPES).expect("the key shapes compile");
        Redactor {
            known,
            shapes,
            exempt: Vec::new(),
            tokens: None,
        }
    }

    /// Masks the egress proxy's tokens too, whatever their value (tokens
    /// rotate under a running process): for hermes's own log lines, where
    /// a sandbox's create body carries them. A command's output keeps
    /// them: they are the sandbox's own values.
    #[must_use]
    pub fn with_proxy_tokens(mut self) -> Redactor {
        // The AWS placeholder secret has a token's shape under its own
        // name; longest names first, so `aws-secret` is not read as `aws`.
        let mut names: Vec<String> = crate::providers::PROVIDERS
            .iter()
            .map(|p| p.name)
            .chain([crate::providers::AWS_SECRET_TOKEN])
            .map(regex::escape)
            .collect();
        names.sort_by_key(|n| std::cmp::Reverse(n.len()));
        let pattern = format!(r"(?-u:\b)({})-[0-9a-f]{{32}}(?-u:\b)", names.join("|"));
        // Built from the provider table's plain names, escaped.
        #[allow(clippy::expect_used)]
        let tokens = Regex::new(&pattern).expect("the token shape compiles");
        self.tokens = Some(tokens);
        self
    }

    /// Leaves `values` alone even where they look like keys.
    #[must_use]
    pub fn exempt<I, S>(mut self, values: I) -> Redactor
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        self.exempt
            .extend(values.into_iter().map(|v| v.as_ref().as_bytes().to_vec()));
        self
    }

    /// Masks every secret in `text`.
    pub fn redact_str<'a>(&self, text: &'a str) -> Cow<'a, str> {
        match self.redact(text.as_bytes()) {
            Cow::Borrowed(_) => Cow::Borrowed(text),
            Cow::Owned(bytes) => Cow::Owned(String::from_utf8_lossy(&bytes).into_owned()),
        }
    }

    /// Masks every secret in `bytes`.
    pub fn redact<'a>(&self, bytes: &'a [u8]) -> Cow<'a, [u8]> {
        let spans = self.spans(bytes);
        if spans.is_empty() {
            return Cow::Borrowed(bytes);
        }
        let mut out = Vec::with_capacity(bytes.len());
        let mut at = 0;
        for (start, end, keep) in spans {
            out.extend_from_slice(&bytes[at..start]);
            out.extend_from_slice(&bytes[start..(start + keep).min(end)]);
            out.extend_from_slice("…[redacted]".as_bytes());
            at = end;
        }
        out.extend_from_slice(&bytes[at..]);
        Cow::Owned(out)
    }

    /// The secrets in `bytes`: `(start, end, visible prefix length)`,
    /// sorted and not overlapping.
    fn spans(&self, bytes: &[u8]) -> Vec<(usize, usize, usize)> {
        let mut spans = Vec::new();
        for value in &self.known {
            let mut from = 0;
            while let Some(i) = find(&bytes[from..], value) {
                let start = from + i;
                spans.push((start, start + value.len(), 4.min(value.len() / 4)));
                from = start + value.len();
            }
        }
        for caps in self.shapes.captures_iter(bytes) {
            let Some(whole) = caps.get(0) else { continue };
            if self.exempt.iter().any(|e| e.as_slice() == whole.as_bytes()) {
                continue;
            }
            // The visible part: the group that matched, plus a little.
            let prefix = (1..caps.len())
                .filter_map(|i| caps.get(i))
                .next()
                .map_or(whole.start(), |g| g.end());
            let keep = prefix - whole.start() + SHOWN;
            spans.push((whole.start(), whole.end(), keep));
        }
        if let Some(tokens) = &self.tokens {
            for caps in tokens.captures_iter(bytes) {
                let (Some(whole), Some(provider)) = (caps.get(0), caps.get(1)) else {
                    continue;
                };
                let keep = provider.end() - whole.start() + 1 + SHOWN;
                spans.push((whole.start(), whole.end(), keep));
            }
        }
        spans.sort();
        // Merge overlaps, keeping the first span's visible prefix.
        let mut merged: Vec<(usize, usize, usize)> = Vec::with_capacity(spans.len());
        for span in spans {
            match merged.last_mut() {
                Some(last) if span.0 < last.1 => last.1 = last.1.max(span.1),
                _ => merged.push(span),
            }
        }
        merged
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() || haystack.len() < needle.len() {
        return None;
    }
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// [`Redactor`] over a stream of chunks.
#[derive(Debug)]
pub struct StreamRedactor {
    redactor: Arc<Redactor>,
    carry: Vec<u8>,
}

impl StreamRedactor {
    pub fn new(redactor: Arc<Redactor>) -> StreamRedactor {
        StreamRedactor {
            redactor,
            carry: Vec::new(),
        }
    }

    /// Takes a chunk; returns what can be emitted now, redacted.
    pub fn push(&mut self, chunk: &[u8]) -> Vec<u8> {
        self.carry.extend_from_slice(chunk);
        let cut = self.safe_cut();
        if cut == 0 {
            return Vec::new();
        }
        let rest = self.carry.split_off(cut);
        let ready = std::mem::replace(&mut self.carry, rest);
        self.redactor.redact(&ready).into_owned()
    }

    /// Everything still held, redacted: call at the end of the stream.
    pub fn finish(&mut self) -> Vec<u8> {
        let rest = std::mem::take(&mut self.carry);
        self.redactor.redact(&rest).into_owned()
    }

    /// Where the held bytes can be cut without splitting a secret: after
    /// the last line break (no secret spans one); for a long unfinished
    /// line, before its last [`MAX_SECRET_LEN`] bytes, moved back to the
    /// start of any secret crossing that point.
    fn safe_cut(&self) -> usize {
        let bytes = &self.carry;
        if let Some(i) = bytes.iter().rposition(|b| *b == b'\n' || *b == b'\r') {
            if bytes.len() - (i + 1) <= MAX_HOLD {
                return i + 1;
            }
        }
        if bytes.len() <= MAX_HOLD {
            return 0;
        }
        let mut cut = bytes.len() - MAX_SECRET_LEN;
        for (start, end, _) in self.redactor.spans(bytes) {
            if start < cut && end > cut {
                cut = start;
            }
        }
        // A key-shaped run that never ends is not held forever: past the
        // limit it goes out masked as far as it came.
        if cut == 0 && bytes.len() > MAX_CARRY {
            return bytes.len();
        }
        cut
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    const ANTHROPIC: &str = "sk-ant-api03-AbCdEfGhIjKlMnOpQrStUvWxYz0123456789";
    const OPENROUTER: &str = "sk-or-v1-0123456789abcdef0123456789abcdef";
    const GEMINI: &str = "AIzaSyA1234567890abcdefghijklmnopqrstuv";

    #[test]
    fn key_shapes_are_masked_keeping_a_prefix() {
        let r = Redactor::new(Vec::<String>::new());
        assert_eq!(
            r.redact_str(&format!("key={ANTHROPIC} next")),
            "key=sk-ant-ap…[redacted] next"
        );
        assert_eq!(r.redact_str(OPENROUTER), "sk-or-v1-01…[redacted]");
        assert_eq!(r.redact_str(GEMINI), "AIzaSy…[redacted]");
        assert_eq!(
            r.redact_str("gsk_abcdefghijklmnopqrstuvwxyz"),
            "gsk_ab…[redacted]"
        );
        assert_eq!(
            r.redact_str("Authorization: Bearer abcdefghijklmnopqrstuvwxyz123456"),
            "Authorization: Bearer ab…[redacted]"
        );
        assert_eq!(r.redact_str("sk-short and words"), "sk-short and words");
        assert!(matches!(r.redact_str("nothing here"), Cow::Borrowed(_)));
    }

    #[test]
    fn proxy_tokens_are_masked_only_where_asked() {
        let token = "openai-0123456789abcdef0123456789abcdef";
        let line = format!("\"Env\":[\"OPENAI_API_KEY={token}\"]");
        let plain = Redactor::new(Vec::<String>::new());
        assert_eq!(plain.redact_str(&line), line);
        let logs = Redactor::new(Vec::<String>::new()).with_proxy_tokens();
        assert_eq!(
            logs.redact_str(&line),
            "\"Env\":[\"OPENAI_API_KEY=openai-01…[redacted]\"]"
        );
        // Not a token: another prefix, or too few digits.
        for other in ["nobody-0123456789abcdef0123456789abcdef", "openai-0123"] {
            assert_eq!(logs.redact_str(other), other);
        }
    }

    #[test]
    fn exempt_values_are_left_alone_though_key_shaped() {
        let token = "xai-0123456789abcdef0123456789abcdef";
        let r = Redactor::new(Vec::<String>::new()).exempt([token]);
        assert_eq!(r.redact_str(token), token);
        assert_eq!(
            r.redact_str("xai-ffffffffffffffffffffffffffffffff"),
            "xai-ff…[redacted]"
        );
    }

    #[test]
    fn known_values_are_masked_wherever_they_stand() {
        let r = Redactor::new(["plainsecretvalue99", "short"]);
        assert_eq!(
            r.redact_str("a=plainsecretvalue99;b=plainsecretvalue99"),
            "a=plai…[redacted];b=plai…[redacted]"
        );
        // Too short to be a secret: left alone.
        assert_eq!(r.redact_str("short"), "short");
    }

    #[test]
    fn a_stream_never_leaks_a_secret_split_across_chunks() {
        let r = Arc::new(Redactor::new(["plainsecretvalue99"]));
        let text = format!(
            "line one\nthe key {ANTHROPIC} and plainsecretvalue99 here\n{}\nend {OPENROUTER}",
            "x".repeat(9000)
        );
        for size in [1, 2, 3, 7, 13, 64, 1000, 5000] {
            let mut s = StreamRedactor::new(Arc::clone(&r));
            let mut out = Vec::new();
            for chunk in text.as_bytes().chunks(size) {
                out.extend(s.push(chunk));
            }
            out.extend(s.finish());
            let out = String::from_utf8(out).unwrap();
            assert_eq!(out, r.redact_str(&text), "chunks of {size}");
            assert!(!out.contains("AbCdEfGhIj"), "chunks of {size}");
            assert!(!out.contains("secretvalue"), "chunks of {size}");
        }
    }

    #[test]
    fn whole_lines_are_emitted_at_once() {
        let r = Arc::new(Redactor::new(Vec::<String>::new()));
        let mut s = StreamRedactor::new(r);
        assert_eq!(s.push(b"ready\npartial"), b"ready\n");
        assert_eq!(s.push(b" line\n"), b"partial line\n");
        assert_eq!(s.finish(), b"");
    }

    #[test]
    fn a_long_unfinished_line_is_emitted_but_its_tail() {
        let r = Arc::new(Redactor::new(Vec::<String>::new()));
        let mut s = StreamRedactor::new(r);
        let out = s.push(&[b'a'; 10_000]);
        assert_eq!(out.len(), 10_000 - MAX_SECRET_LEN);
        let mut all = out;
        all.extend(s.push(&b" word".repeat(2000)));
        all.extend(s.finish());
        assert_eq!(all.len(), 20_000);
    }

    #[test]
    fn an_endless_key_shaped_run_is_not_held_forever() {
        let r = Arc::new(Redactor::new(Vec::<String>::new()));
        let mut s = StreamRedactor::new(r);
        let mut out = s.push(b"sk-");
        for _ in 0..100 {
            out.extend(s.push(&[b'k'; 1000]));
        }
        assert!(!out.is_empty());
        assert!(out.starts_with("sk-kk…[redacted]".as_bytes()));
        assert!(s.carry.len() <= MAX_CARRY + 1000);
    }
}
