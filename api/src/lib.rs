//! rtgt's administration surface: the configuration model (YAML, laid out like LIO's configfs
//! tree), its validation and its atomic persistence; the REST API over a [`Control`] handle
//! that the daemon implements; Prometheus metrics; the client `rtgtctl` uses.

pub mod alua;
pub mod auth;
pub mod client;
pub mod config;
pub mod control;
pub mod diff;
mod fields;
pub mod lio;
pub mod metrics;
pub mod nvme;
pub mod resource;
pub mod server;
pub mod tls;
pub mod token;

pub use config::{Config, ConfigError};
pub use control::{
    AluaView, Change, ChangeReport, Control, ControlError, QueueView, RdmaDeviceView,
    RdmaListenerView, RdmaView, SessionView,
};
