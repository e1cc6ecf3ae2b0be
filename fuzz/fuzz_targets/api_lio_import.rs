#![no_main]
//! See `rtgt_fuzz::api_lio_import`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| rtgt_fuzz::api_lio_import(data));
