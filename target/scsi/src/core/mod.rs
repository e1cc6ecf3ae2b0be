//! The target core: targets, portal groups, LUN maps, ACLs and the session registry.
//!
//! These are the runtime objects built from the configuration; fabrics look targets up
//! here and never see the configuration file.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, OnceLock, RwLock};

use crate::stats::StatsSink;
use crate::LunMap;

pub mod live;

pub use live::{IoMetrics, LiveLuns, LunView};

/// CHAP credentials (RFC 7143 §12.1.3). `mutual` holds the target's own name and secret
/// for mutual authentication.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct ChapCredentials {
    pub user: String,
    pub secret: String,
}

impl std::fmt::Debug for ChapCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChapCredentials")
            .field("user", &self.user)
            .field("secret", &"<hidden>")
            .finish()
    }
}

/// Authentication required on a portal group, an ACL or discovery.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Auth {
    /// Credentials the initiator must present; `None` means AuthMethod=None is accepted.
    pub chap: Option<ChapCredentials>,
    /// Credentials the target presents when the initiator asks for mutual CHAP.
    pub mutual: Option<ChapCredentials>,
}

/// iSCSI operational parameters the target offers (RFC 7143 §13). Defaults follow the RFC
/// except where noted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IscsiParams {
    pub max_recv_data_segment_length: u32,
    pub max_burst_length: u32,
    pub first_burst_length: u32,
    pub initial_r2t: bool,
    pub immediate_data: bool,
    pub max_outstanding_r2t: u32,
    pub max_connections: u16,
    pub default_time2wait: u16,
    pub default_time2retain: u16,
    pub header_digest: bool,
    pub data_digest: bool,
    pub error_recovery_level: u8,
    /// Commands the target accepts per session beyond ExpCmdSN (MaxCmdSN − ExpCmdSN + 1).
    pub queue_depth: u32,
    /// Seconds between target-initiated NOP-In pings on an idle connection (0 = off).
    pub nopin_interval: u32,
    /// Seconds to wait for the NOP-Out answering a ping before dropping the connection.
    pub nopin_timeout: u32,
    /// Microseconds a TCP connection polls for the next command before it sleeps (0 = off).
    pub busy_poll_micros: u32,
    /// Large reads from file backstores on tmpfs go out with `sendfile(2)`.
    pub zero_copy_reads: bool,
}

impl Default for IscsiParams {
    fn default() -> Self {
        IscsiParams {
            max_recv_data_segment_length: 262_144,
            max_burst_length: 1_048_576,
            first_burst_length: 65_536,
            initial_r2t: false,
            immediate_data: true,
            max_outstanding_r2t: 1,
            max_connections: 1,
            default_time2wait: 2,
            default_time2retain: 20,
            header_digest: true,
            data_digest: true,
            error_recovery_level: 0,
            queue_depth: 128,
            nopin_interval: 15,
            nopin_timeout: 30,
            busy_poll_micros: 50,
            zero_copy_reads: true,
        }
    }
}

/// One initiator allowed into a portal group, with the LUNs it sees.
#[derive(Clone)]
pub struct Acl {
    /// Initiator node name (iSCSI name, or SRP initiator port ID).
    pub initiator: String,
    pub auth: Auth,
    pub luns: LunMap,
}

/// Where a target port sits: its relative target port identifier and its target port
/// group (VPD 0x83, REPORT TARGET PORT GROUPS, the groups' access states).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortIds {
    pub relative_port: u16,
    pub port_group: u16,
}

impl PortIds {
    /// Relative port `id` alone in group `id` (a port of its own when no groups are
    /// configured).
    pub fn alone(id: u16) -> PortIds {
        PortIds {
            relative_port: id,
            port_group: id,
        }
    }
}

/// A target portal group: the unit of access control (LIO's TPG).
#[derive(Clone)]
pub struct PortalGroup {
    pub tag: u16,
    /// The target port the group is (all its portals, iSCSI and iSER).
    pub ids: PortIds,
    pub portals: Vec<SocketAddr>,
    /// Authentication for initiators that match no ACL-specific settings.
    pub auth: Auth,
    /// Explicit ACLs by initiator name.
    pub acls: HashMap<String, Acl>,
    /// When set, any initiator is admitted and sees `luns` (LIO's generate_node_acls).
    pub allow_any_initiator: bool,
    /// LUNs seen by initiators admitted without an explicit ACL.
    pub luns: LunMap,
    pub params: IscsiParams,
    /// The portals also serve iSER (SendTargets over iSER lists only such groups).
    pub iser: bool,
}

impl PortalGroup {
    /// The LUN map and authentication for an initiator, or `None` when it is not allowed.
    pub fn admit(&self, initiator: &str) -> Option<(LunMap, Auth)> {
        if let Some(acl) = self.acls.get(initiator) {
            let auth = if acl.auth.chap.is_some() {
                acl.auth.clone()
            } else {
                self.auth.clone()
            };
            return Some((acl.luns.clone(), auth));
        }
        self.allow_any_initiator
            .then(|| (self.luns.clone(), self.auth.clone()))
    }
}

/// A SCSI target (an iSCSI target node).
#[derive(Clone)]
pub struct Target {
    /// iSCSI qualified name.
    pub name: String,
    pub alias: Option<String>,
    pub portal_groups: Vec<PortalGroup>,
}

/// An SRP target port (SRP r16a §5.2): its identifier, the initiators it admits and the
/// LUNs they see. ACLs are keyed by initiator port identifier written as `0x` and 32 lowercase
/// hex digits, as LIO's ib_srpt names them.
#[derive(Clone)]
pub struct SrpTargetPort {
    pub name: String,
    pub ids: PortIds,
    /// Identifier extension: the first half of the target port identifier.
    pub id_ext: u64,
    /// I/O controller GUID: the second half.
    pub ioc_guid: u64,
    /// RDMA/CM listen addresses (RDMA_PS_TCP).
    pub listen: Vec<SocketAddr>,
    pub acls: HashMap<String, Acl>,
    /// Any initiator is admitted and sees `luns`.
    pub allow_any_initiator: bool,
    /// LUNs seen by initiators admitted without an explicit ACL.
    pub luns: LunMap,
}

impl SrpTargetPort {
    /// The 16-byte target port identifier (`id_ext` ‖ `ioc_guid`).
    pub fn port_id(&self) -> [u8; 16] {
        let mut id = [0u8; 16];
        id[..8].copy_from_slice(&self.id_ext.to_be_bytes());
        id[8..].copy_from_slice(&self.ioc_guid.to_be_bytes());
        id
    }

    /// The LUN map of an initiator port, or `None` when it is not admitted.
    pub fn admit(&self, initiator: &str) -> Option<LunMap> {
        if let Some(acl) = self.acls.get(initiator) {
            return Some(acl.luns.clone());
        }
        self.allow_any_initiator.then(|| self.luns.clone())
    }
}

/// An SRP initiator or target port identifier as ACLs name it: `0x` and 32 hex digits.
pub fn srp_port_name(id: &[u8; 16]) -> String {
    let mut s = String::from("0x");
    for b in id {
        s.push_str(&format!("{b:02x}"));
    }
    s
}

/// All targets of the running daemon. Fabrics take a snapshot per login so a live
/// reconfiguration never changes a target under a command in flight.
#[derive(Default)]
pub struct Registry {
    targets: RwLock<HashMap<String, Arc<Target>>>,
    /// Authentication for SendTargets discovery sessions.
    discovery_auth: RwLock<Auth>,
    /// SRP target ports by name.
    srp_ports: RwLock<HashMap<String, Arc<SrpTargetPort>>>,
    /// Where command statistics are exported, when the daemon exports metrics.
    metrics: OnceLock<Arc<dyn StatsSink>>,
    /// Per logical unit metrics, by backstore name.
    lun_metrics: RwLock<HashMap<String, Arc<IoMetrics>>>,
}

impl Registry {
    pub fn new() -> Arc<Registry> {
        Arc::new(Registry::default())
    }

    pub fn target(&self, name: &str) -> Option<Arc<Target>> {
        self.targets
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(name)
            .cloned()
    }

    pub fn targets(&self) -> Vec<Arc<Target>> {
        let mut v: Vec<_> = self
            .targets
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .cloned()
            .collect();
        v.sort_by(|a, b| a.name.cmp(&b.name));
        v
    }

    pub fn set_target(&self, target: Target) {
        self.targets
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(target.name.clone(), Arc::new(target));
    }

    pub fn remove_target(&self, name: &str) -> Option<Arc<Target>> {
        self.targets
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(name)
    }

    pub fn discovery_auth(&self) -> Auth {
        self.discovery_auth
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Records command metrics of every session created from now on in `metrics`.
    pub fn set_metrics(&self, metrics: Arc<dyn StatsSink>) {
        let _ = self.metrics.set(metrics);
    }

    pub fn metrics(&self) -> Option<Arc<dyn StatsSink>> {
        self.metrics.get().cloned()
    }

    /// The metrics of the logical unit over backstore `name`.
    pub fn lun_metrics(&self, name: &str) -> Option<Arc<IoMetrics>> {
        let m = self.metrics.get()?;
        if let Some(x) = self
            .lun_metrics
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(name)
        {
            return Some(x.clone());
        }
        let mut map = self.lun_metrics.write().unwrap_or_else(|e| e.into_inner());
        Some(
            map.entry(name.to_string())
                .or_insert_with(|| m.io_stats("rtgt_lun", &[("backstore", name.to_string())]))
                .clone(),
        )
    }

    pub fn set_discovery_auth(&self, auth: Auth) {
        *self
            .discovery_auth
            .write()
            .unwrap_or_else(|e| e.into_inner()) = auth;
    }

    /// The SRP target port named `name`.
    pub fn srp_port(&self, name: &str) -> Option<Arc<SrpTargetPort>> {
        self.srp_ports
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(name)
            .cloned()
    }

    /// Every SRP target port, by name.
    pub fn srp_ports(&self) -> Vec<Arc<SrpTargetPort>> {
        let mut v: Vec<_> = self
            .srp_ports
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .cloned()
            .collect();
        v.sort_by(|a, b| a.name.cmp(&b.name));
        v
    }

    pub fn set_srp_port(&self, port: SrpTargetPort) {
        self.srp_ports
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(port.name.clone(), Arc::new(port));
    }

    pub fn remove_srp_port(&self, name: &str) -> Option<Arc<SrpTargetPort>> {
        self.srp_ports
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(name)
    }
}
