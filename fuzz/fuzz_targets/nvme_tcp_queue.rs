#![no_main]
//! See `rtgt_fuzz::nvme_tcp_queue`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| rtgt_fuzz::nvme_tcp_queue(data));
