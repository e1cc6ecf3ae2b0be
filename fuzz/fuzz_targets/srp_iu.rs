#![no_main]
//! See `rtgt_fuzz::srp_iu`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| rtgt_fuzz::srp_iu(data));
