#![no_main]
//! See `rtgt_fuzz::transport_responder`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| rtgt_fuzz::transport_responder(data));
