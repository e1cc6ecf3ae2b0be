//! rtgt's administration surface: the configuration model (YAML, laid out like LIO's configfs
//! tree), its validation and its atomic persistence.

pub mod config;

pub use config::{Config, ConfigError};
