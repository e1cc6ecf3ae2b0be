//! What the commands of an SRP session run against, shared by the session's channels: the
//! I_T nexus and its live LUN map.

use std::time::Instant;

use rtgt_scsi::core::LiveLuns;
use rtgt_scsi::Nexus;

/// One initiator port logged in to a target port, as its channels see it.
pub struct SessionNexus {
    pub nexus: Nexus,
    /// The LUN map, replaced live when the port's LUNs or the initiator's ACL change.
    pub luns: LiveLuns,
    pub initiator_port_id: [u8; 16],
    pub created: Instant,
}
