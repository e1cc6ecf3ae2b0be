//! RTU, ready to use (IBA 12.6.9 Table 111; `ibta_vol1_c12.h` `CM_RTU_*`): local comm ID @0,
//! remote comm ID @4, private data @8 (224 bytes), the layout of [`super::comm_ids`].

pub use super::comm_ids::{Packet, Repr, PRIVATE_DATA_LEN};
