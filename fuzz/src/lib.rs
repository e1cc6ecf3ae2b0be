//! rtgt's fuzz targets: one function per parser, taking arbitrary bytes.
//!
//! Each function is the body of the libFuzzer binary of the same name in `fuzz_targets/`
//! (built by `cargo fuzz` with the `libfuzzer` feature) and is run by `tests/smoke.rs` over
//! the seed corpus in `seeds/NAME/` and deterministic mutations of it. A function panics only
//! when the code under test panics or breaks a property the function checks; rejecting the
//! input is not a failure.

mod cm_state;
mod config;
mod iscsi;
mod iser;
mod nvme;
mod responder;
mod scsi;
mod srp;
mod transport;

pub use cm_state::transport_cm_state;
pub use config::{api_http_reply, api_lio_import, config_yaml};
pub use iscsi::{iscsi_bhs, iscsi_login, iscsi_text};
pub use iser::iser_header;
pub use nvme::{nvme_structures, nvme_tcp_pdu, nvme_tcp_queue};
pub use responder::transport_responder;
pub use scsi::{scsi_cdb, scsi_params, scsi_pr_state};
pub use srp::{srp_iu, srp_login};
pub use transport::{transport_cm, transport_packet};

/// The body of a fuzz target: any bytes are a valid argument.
pub type Body = fn(&[u8]);

/// Every target by name (the name of its binary and of its seed directory).
pub const TARGETS: &[(&str, Body)] = &[
    ("api_http_reply", api_http_reply),
    ("api_lio_import", api_lio_import),
    ("config_yaml", config_yaml),
    ("iscsi_bhs", iscsi_bhs),
    ("iscsi_login", iscsi_login),
    ("iscsi_text", iscsi_text),
    ("iser_header", iser_header),
    ("nvme_structures", nvme_structures),
    ("nvme_tcp_pdu", nvme_tcp_pdu),
    ("nvme_tcp_queue", nvme_tcp_queue),
    ("scsi_cdb", scsi_cdb),
    ("scsi_params", scsi_params),
    ("scsi_pr_state", scsi_pr_state),
    ("srp_iu", srp_iu),
    ("srp_login", srp_login),
    ("transport_cm", transport_cm),
    ("transport_cm_state", transport_cm_state),
    ("transport_packet", transport_packet),
    ("transport_responder", transport_responder),
];
