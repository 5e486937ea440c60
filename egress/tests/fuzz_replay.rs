//! The fuzz targets on stable: every corpus file in `egress/fuzz/corpus/`,
//! then a few thousand inputs made from them by a seeded generator (bit
//! flips, byte insertions, deletions, splices, interesting tokens). The
//! real fuzzer runs the same functions: `cargo +nightly fuzz run
//! request_target` in `egress/`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use hermes_egress::fuzz_targets;

/// Deterministic xorshift, so a failure replays.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

const TOKENS: &[&[u8]] = &[
    b":",
    b"[",
    b"]",
    b"@",
    b"%",
    b"?",
    b"&",
    b"=",
    b"\n",
    b" ",
    b".",
    b"0x",
    b"0",
    b"::ffff:",
    b"key=",
    b"Bearer ",
    b"authorization: ",
    b"x-goog-api-key: ",
    b"google-0123456789abcdef0123456789abcdef",
    b"65535",
    b"65536",
    b"4294967295",
    b"\xff",
    b"%2D",
];

fn mutate(rng: &mut Rng, corpus: &[Vec<u8>]) -> Vec<u8> {
    let mut data = corpus[rng.below(corpus.len())].clone();
    for _ in 0..=rng.below(4) {
        match rng.below(5) {
            0 if !data.is_empty() => {
                let i = rng.below(data.len());
                data[i] ^= 1 << rng.below(8);
            }
            1 => {
                let i = rng.below(data.len() + 1);
                data.insert(i, rng.next() as u8);
            }
            2 if !data.is_empty() => {
                let i = rng.below(data.len());
                let n = rng.below(data.len() - i + 1);
                data.drain(i..i + n);
            }
            3 => {
                let other = &corpus[rng.below(corpus.len())];
                let i = rng.below(data.len() + 1);
                let j = rng.below(other.len() + 1);
                data.truncate(i);
                data.extend_from_slice(&other[j..]);
            }
            _ => {
                let i = rng.below(data.len() + 1);
                let token = TOKENS[rng.below(TOKENS.len())];
                data.splice(i..i, token.iter().copied());
            }
        }
    }
    data
}

fn replay(target: &str, run: fn(&[u8]), generated: usize) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(target);
    let mut corpus: Vec<Vec<u8>> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| std::fs::read(entry.unwrap().path()).unwrap())
        .collect();
    assert!(corpus.len() >= 5, "{target}: the corpus is too small");
    for input in &corpus {
        run(input);
    }
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for _ in 0..generated {
        let input = mutate(&mut rng, &corpus);
        run(&input);
        if corpus.len() < 512 && rng.below(8) == 0 {
            corpus.push(input);
        }
    }
}

#[test]
fn the_request_target_parsers_hold_their_invariants_on_the_corpus_and_mutations() {
    replay("request_target", fuzz_targets::request_target, 5000);
}

#[test]
fn the_credential_rewriter_holds_its_invariants_on_the_corpus_and_mutations() {
    replay("credential_rewrite", fuzz_targets::credential_rewrite, 5000);
}
