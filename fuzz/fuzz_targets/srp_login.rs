#![no_main]
//! See `rtgt_fuzz::srp_login`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| rtgt_fuzz::srp_login(data));
