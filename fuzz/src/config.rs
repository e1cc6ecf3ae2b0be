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
}
