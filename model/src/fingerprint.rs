//! Short fingerprints of named fields (the spec hash, the egress
//! fingerprint): SHA-256 over each field's name and length-prefixed value,
//! in the order given, shown as the first 12 hex digits.

use sha2::{Digest, Sha256};

/// A fingerprint being built.
#[derive(Debug, Default)]
pub struct Fingerprint(Sha256);

impl Fingerprint {
    pub fn new() -> Fingerprint {
        Fingerprint(Sha256::new())
    }

    /// Adds one field. Lengths are part of the input, so `("a", "bc")` and
    /// `("ab", "c")` differ.
    pub fn field(&mut self, name: &str, value: &str) {
        self.0.update(name.as_bytes());
        self.0.update([0]);
        self.0.update((value.len() as u64).to_le_bytes());
        self.0.update(value.as_bytes());
    }

    /// The first 12 hex digits.
    pub fn finish(self) -> String {
        self.0.finalize()[..6]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn field_boundaries_count() {
        let of = |fields: &[(&str, &str)]| {
            let mut f = Fingerprint::new();
            for (n, v) in fields {
                f.field(n, v);
            }
            f.finish()
        };
        assert_eq!(of(&[("a", "bc")]).len(), 12);
        assert_ne!(of(&[("a", "bc")]), of(&[("ab", "c")]));
        assert_ne!(of(&[("x", "1"), ("y", "2")]), of(&[("y", "2"), ("x", "1")]));
        assert_eq!(of(&[("a", "b")]), of(&[("a", "b")]));
    }
}
