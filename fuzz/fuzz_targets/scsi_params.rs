#![no_main]
//! See `rtgt_fuzz::scsi_params`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| rtgt_fuzz::scsi_params(data));
