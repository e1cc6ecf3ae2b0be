#![no_main]
//! See `rtgt_fuzz::iser_header`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| rtgt_fuzz::iser_header(data));
