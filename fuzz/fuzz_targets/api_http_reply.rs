#![no_main]
//! See `rtgt_fuzz::api_http_reply`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| rtgt_fuzz::api_http_reply(data));
