#![no_main]
//! See `rtgt_fuzz::scsi_pr_state`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| rtgt_fuzz::scsi_pr_state(data));
