//! The handle the REST API acts through. The daemon implements it over the running target;
//! this crate knows nothing of fabrics, sessions or devices beyond what is here.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::config::Config;

/// One change that an apply made to the running target.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Change {
    /// `added`, `removed`, `changed` or `resized`.
    pub action: String,
    /// `backstore`, `target`, `portal_group`, `portal`, `lun`, `acl`, `auth`, `params`,
    /// `discovery`, `srp_port`, `session`, `rdma`, `api` or `policy`.
    pub object: String,
    /// The object's path, e.g. `iqn.2025-01.io.rtgt:t/tpg1/lun/0` or `srp/p0/acl/0x…`.
    pub name: String,
    /// Sessions affected (unit attentions sent or sessions ended), when any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// What an apply changed, in the order it changed it; empty when the document equals the
/// running configuration.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ChangeReport {
    pub changes: Vec<Change>,
}

impl ChangeReport {
    pub fn push(&mut self, action: &str, object: &str, name: impl Into<String>) {
        self.changes.push(Change {
            action: action.into(),
            object: object.into(),
            name: name.into(),
            detail: None,
        });
    }

    pub fn push_detail(
        &mut self,
        action: &str,
        object: &str,
        name: impl Into<String>,
        detail: impl Into<String>,
    ) {
        self.changes.push(Change {
            action: action.into(),
            object: object.into(),
            name: name.into(),
            detail: Some(detail.into()),
        });
    }
}

/// The RDMA provider and where each RDMA listener runs, as the API shows them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct RdmaView {
    /// `soft` (rtgt's own RoCEv2 engine), `verbs` (an RDMA NIC through rdma-core), or `none`
    /// when RDMA is disabled or could not start.
    pub provider: String,
    /// The addresses RDMA is served on and the device of each.
    pub devices: Vec<RdmaDeviceView>,
    /// The iSER portals and SRP listen addresses being served.
    pub listeners: Vec<RdmaListenerView>,
}

/// An address RDMA is served on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct RdmaDeviceView {
    pub address: String,
    /// The device (`rxe0`, `mlx5_0`, ...; the soft engine's own name with `soft`).
    pub device: String,
}

/// An RDMA listener.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct RdmaListenerView {
    /// `iser` or `srp`.
    pub fabric: String,
    pub address: String,
    /// The device serving it; `*` for a wildcard address (every device).
    pub device: String,
}

/// A target port group of one logical unit as it is now: the configuration's state, or
/// what SET TARGET PORT GROUPS made it since.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct AluaView {
    pub backstore: String,
    pub group: u16,
    /// active_optimized, active_non_optimized, standby, unavailable, offline or
    /// transitioning.
    pub state: String,
    pub preferred: bool,
    /// Relative target port identifiers of its ports (other processes' included).
    pub relative_ports: Vec<u16>,
    pub implicit: bool,
    pub explicit: bool,
}

/// One queue of an NVMe controller.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct QueueView {
    /// 0: the admin queue.
    pub qid: u16,
    /// Submission queue entries.
    pub size: u16,
    /// The host's address of the queue's connection.
    pub peer: String,
    /// Commands in flight now.
    pub outstanding: u32,
    pub commands: u64,
    pub bytes_in: u64,
    pub bytes_out: u64,
}

/// A live session as the API shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct SessionView {
    /// Identifier for `DELETE /api/v1/sessions/{id}`, e.g. `iscsi-3`, `srp-1099511627777`
    /// or `nvme-1` (an NVMe controller).
    pub id: String,
    /// iSCSI initiator name, SRP initiator port identifier (`0x` and 32 hex digits), or
    /// NVMe host NQN.
    pub initiator: String,
    /// iSCSI target name, SRP target port name, or NVMe subsystem NQN.
    pub target: String,
    /// `tcp`, `iser`, `srp` or `nvme-tcp`.
    pub transport: String,
    /// `normal` or `discovery`.
    pub session_type: String,
    /// iSCSI ISID as 12 hex digits (iSCSI sessions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub isid: Option<String>,
    /// Queues connected, admin and I/O (NVMe controllers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queues: Option<u32>,
    /// Each queue connected, by queue ID (NVMe controllers; 0 is the admin queue).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub queue_list: Vec<QueueView>,
    pub peer: String,
    pub local: String,
    /// Commands the session may have in flight (SRP: the request limits of its channels).
    pub queue_depth: u32,
    /// Commands in flight now.
    pub outstanding: u32,
    pub commands: u64,
    pub bytes_in: u64,
    pub bytes_out: u64,
    /// Commands aborted by task management, a lost connection or a protocol error.
    #[serde(default)]
    pub tasks_aborted: u64,
    /// Task management functions received.
    #[serde(default)]
    pub task_management: u64,
    pub uptime_seconds: u64,
}

/// Why the running target refused a configuration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ControlError {
    /// The document cannot be served as written (HTTP 422): a backstore file that cannot
    /// be opened, a size a device cannot take.
    #[error("{field}: {message}")]
    Invalid { field: String, message: String },
    /// It conflicts with the running state (HTTP 409): a portal address in use, a change
    /// that needs a backstore out of use.
    #[error("{field}: {message}")]
    Conflict { field: String, message: String },
    /// Policy forbids it (HTTP 403): a backstore path outside every backstore root, a
    /// device in use. The message names the rule.
    #[error("{field}: {message}")]
    Forbidden { field: String, message: String },
    /// The target failed on its side (HTTP 500): the configuration file cannot be saved.
    #[error("{0}")]
    Internal(String),
}

/// The running target, as the API acts on it. Implementations serialize `apply` calls.
#[async_trait]
pub trait Control: Send + Sync + 'static {
    /// The configuration being served.
    fn config(&self) -> Config;
    /// Makes the running target match `config` (validated by the caller), changing only
    /// what differs, and saves it. On error nothing was saved and every change already
    /// made was undone as far as possible; the report lists what changed.
    async fn apply(&self, config: Config) -> Result<ChangeReport, ControlError>;
    /// The live sessions.
    fn sessions(&self) -> Vec<SessionView>;
    /// Ends a session at once. Returns whether it existed.
    fn force_logout(&self, id: &str) -> bool;
    /// The RDMA provider, its devices and listeners.
    fn rdma(&self) -> RdmaView;
    /// Whether every configured portal is listening.
    fn ready(&self) -> bool;
    /// The Prometheus text exposition of the target's metrics.
    fn metrics(&self) -> String;
    /// The target port groups of every logical unit, with their states now.
    async fn alua(&self) -> Vec<AluaView>;
    /// Puts target port group `group` in `state` now on `backstore`'s logical unit, or on
    /// every one whose configuration gives the group `state`, also where the configuration
    /// said so before (SET TARGET PORT GROUPS, or another gateway sharing the states, may
    /// have moved it since). Called after the configuration says `state`.
    async fn set_alua_state(
        &self,
        group: u16,
        backstore: Option<&str>,
        state: rtgt_scsi::AccessState,
    ) -> Result<(), ControlError>;
}
