//! Fuzzes the request-line and CONNECT target parsers.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    hermes_egress::fuzz_targets::request_target(data);
});
