//! Fuzzes the credential rewriter.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    hermes_egress::fuzz_targets::credential_rewrite(data);
});
