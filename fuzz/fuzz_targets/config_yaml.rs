#![no_main]
//! See `rtgt_fuzz::config_yaml`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| rtgt_fuzz::config_yaml(data));
