#![no_main]
//! The configuration parser and validator never panic, whatever the document.
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = rtgt_api::Config::from_yaml(text, std::path::Path::new("fuzz.yaml"));
    }
});
