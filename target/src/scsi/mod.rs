//! The SCSI engine (SPC-4 / SBC-4). It knows nothing of fabrics: a fabric hands it a
//! [`Command`] for an I_T nexus and a LUN and gets a [`Response`] back.

use std::collections::BTreeMap;
use std::sync::Arc;

use rtgt_backstore::{Backstore, IoBuf};

/// SCSI status codes (SAM-5 5.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Status {
    Good = 0x00,
    CheckCondition = 0x02,
    ConditionMet = 0x04,
    Busy = 0x08,
    ReservationConflict = 0x18,
    TaskSetFull = 0x28,
    AcaActive = 0x30,
    TaskAborted = 0x40,
}

/// Task attribute from the fabric (SAM-5 8.9).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TaskAttr {
    #[default]
    Simple,
    Ordered,
    HeadOfQueue,
    Aca,
}

/// One I_T nexus as the SCSI engine sees it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Nexus {
    /// Unique for the lifetime of the process.
    pub id: u64,
    /// Initiator port name, e.g. `iqn.1994-05.com.redhat:host,i,0x23d000000001` for iSCSI.
    pub initiator_port: String,
    /// SPC-4 TransportID of the initiator port (7.6.4), used by persistent reservations.
    pub transport_id: Vec<u8>,
    /// Target port name, e.g. `iqn.2025-01.io.rtgt:disk,t,0x0001`.
    pub target_port: String,
    /// Relative target port identifier (VPD 0x83).
    pub relative_port: u16,
    /// Target port group (VPD 0x83, REPORT TARGET PORT GROUPS).
    pub port_group: u16,
}

/// A SCSI command as delivered by a fabric.
#[derive(Debug)]
pub struct Command {
    pub cdb: Vec<u8>,
    /// Data-out received for the command (length = what the fabric received, at most EDTL).
    pub data_out: Option<IoBuf>,
    /// Expected data transfer length the initiator announced, for the data-in direction.
    pub expected_in_len: u32,
    pub attr: TaskAttr,
    /// Fabric task tag, for tracing only.
    pub tag: u64,
}

/// The engine's answer.
#[derive(Debug)]
pub struct Response {
    pub status: Status,
    /// Fixed-format sense data (SPC-4 4.5.3), when status is CHECK CONDITION.
    pub sense: Option<Vec<u8>>,
    /// Data-in, at most `expected_in_len` bytes.
    pub data_in: Option<IoBuf>,
    /// Bytes the command wanted to transfer according to its CDB; the fabric derives
    /// overflow / underflow residuals from this and the expected length.
    pub transfer_len: u32,
}

/// A logical unit: a backstore plus SCSI state (mode pages, reservations, unit attentions).
pub struct Device {
    _backstore: Arc<dyn Backstore>,
}

/// The LUNs one nexus can see, with REPORT LUNS and answers for unmapped LUNs.
#[derive(Default, Clone)]
pub struct LunMap {
    pub luns: BTreeMap<u64, Arc<Device>>,
}
