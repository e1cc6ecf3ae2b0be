//! The configuration document (`rtgt-api`).

use std::path::Path;

use rtgt_api::Config;

/// Arbitrary bytes as a YAML configuration: parsing and validation never panic, and a
/// configuration that is accepted survives what rtgtd's persistence does with it (serialize,
/// parse again) unchanged.
///
/// Input: the document (inputs that are not UTF-8 are skipped).
pub fn config_yaml(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(config) = Config::from_yaml(text, Path::new("fuzz.yaml")) else {
        return;
    };
    let saved = config.to_yaml();
    match Config::from_yaml(&saved, Path::new("saved.yaml")) {
        Ok(again) => assert_eq!(again, config, "saved configuration:\n{saved}"),
        Err(e) => panic!("a saved configuration does not load again: {e}\n{saved}"),
    }
    // A valid document gives every logical unit target port groups its engine takes.
    let ports = config.target_ports();
    for b in &config.backstores {
        let lu = config.lu_alua(&ports, &b.name);
        if let Err(e) = lu.validate() {
            panic!("backstore {}: {e}\n{saved}", b.name);
        }
    }
    let _ = config.conflict(&config);
}

/// A targetcli `saveconfig.json` through `rtgtctl import-lio`: never panics, and what it
/// converts is a valid configuration that survives saving.
///
/// Input: the JSON document (inputs that are not UTF-8 are skipped).
pub fn api_lio_import(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(import) = rtgt_api::lio::convert(text) else {
        return;
    };
    let saved = import.config.to_yaml();
    match Config::from_yaml(&saved, Path::new("imported.yaml")) {
        Ok(again) => assert_eq!(again, import.config, "imported configuration:\n{saved}"),
        Err(e) => panic!("an imported configuration does not load: {e}\n{saved}"),
    }
}

/// An HTTP response as `rtgtctl` reads it from the API: never panics, and a body is never
/// longer than what the response carried.
///
/// Input: the response bytes.
pub fn api_http_reply(data: &[u8]) {
    if let Ok(r) = rtgt_api::client::parse_reply(data) {
        assert!(r.body.len() <= data.len());
        let _ = r.error();
    }
}
