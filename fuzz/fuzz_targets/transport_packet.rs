#![no_main]
//! See `rtgt_fuzz::transport_packet`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| rtgt_fuzz::transport_packet(data));
