#![no_main]
//! See `rtgt_fuzz::iscsi_login`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| rtgt_fuzz::iscsi_login(data));
