//! DREP, reply to request for communication release (IBA 12.6.11 Table 113;
//! `ibta_vol1_c12.h` `CM_DREP_*`): local comm ID @0,
//! remote comm ID @4, private data @8 (224 bytes), the layout of [`super::comm_ids`].

pub use super::comm_ids::{Packet, Repr, PRIVATE_DATA_LEN};
