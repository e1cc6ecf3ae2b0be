#![no_main]
//! See `rtgt_fuzz::transport_cm_state`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| rtgt_fuzz::transport_cm_state(data));
