#![no_main]
//! See `rtgt_fuzz::nvme_structures`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| rtgt_fuzz::nvme_structures(data));
