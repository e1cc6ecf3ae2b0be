#![no_main]
//! See `rtgt_fuzz::iscsi_bhs`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| rtgt_fuzz::iscsi_bhs(data));
