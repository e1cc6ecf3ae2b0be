//! The configuration document.
//!
//! The layout follows LIO's configfs tree, which administrators already know: backstores,
//! then targets → portal groups → portals, LUNs and ACLs with mapped LUNs, plus CHAP and
//! iSCSI parameters. Unknown fields are errors, so a typo never silently falls back to a
//! default. [`Config::load`] reports the file, the path of the bad field and why.

use std::collections::HashSet;
use std::fmt;
use std::io::Write;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};

use crate::alua::{Alua, PortDecl, PortKey, TargetPort};
use crate::fields::{is_default, is_false, is_true, yes};
use crate::nvme::Nvme;
use rtgt_scsi::AluaConfig;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use utoipa::ToSchema;

/// A configuration that could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{file}: cannot read: {source}")]
    Read {
        file: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{file}: {path}: {message}")]
    Invalid {
        file: PathBuf,
        /// Path of the offending field, e.g. `targets[0].portal_groups[0].luns[1].backstore`.
        path: String,
        message: String,
    },
    #[error("{file}: cannot save: {source}")]
    Write {
        file: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// A byte count written as an integer or with a unit: `1GiB`, `512M`, `4096`, `4k`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct ByteSize(pub u64);

impl ByteSize {
    pub fn parse(s: &str) -> Result<ByteSize, String> {
        let s = s.trim();
        let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
        let (num, unit) = s.split_at(split);
        let n: u64 = num
            .parse()
            .map_err(|_| format!("invalid size {s:?}: expected a number with an optional unit"))?;
        let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
            "" | "b" => 1,
            "k" | "kb" | "kib" => 1 << 10,
            "m" | "mb" | "mib" => 1 << 20,
            "g" | "gb" | "gib" => 1 << 30,
            "t" | "tb" | "tib" => 1 << 40,
            other => return Err(format!("invalid size unit {other:?} in {s:?}")),
        };
        n.checked_mul(mult)
            .map(ByteSize)
            .ok_or_else(|| format!("size {s:?} is too large"))
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [(u64, &str); 4] = [
            (1 << 40, "TiB"),
            (1 << 30, "GiB"),
            (1 << 20, "MiB"),
            (1 << 10, "KiB"),
        ];
        for (m, u) in UNITS {
            if self.0 >= m && self.0.is_multiple_of(m) {
                return write!(f, "{}{}", self.0 / m, u);
            }
        }
        write!(f, "{}", self.0)
    }
}

impl Serialize for ByteSize {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl utoipa::PartialSchema for ByteSize {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::schema::{ObjectBuilder, OneOfBuilder, SchemaType, Type};
        OneOfBuilder::new()
            .item(
                ObjectBuilder::new()
                    .schema_type(SchemaType::Type(Type::Integer))
                    .minimum(Some(0)),
            )
            .item(
                ObjectBuilder::new()
                    .schema_type(SchemaType::Type(Type::String))
                    .pattern(Some(r"^\s*[0-9]+\s*([kKmMgGtT]([iI]?[bB])?|[bB])?\s*$")),
            )
            .description(Some(
                "A byte count: an integer, or a number with a unit (k, M, G, T, KiB, MiB, GiB, TiB)",
            ))
            .into()
    }
}

impl ToSchema for ByteSize {}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Int(u64),
            Str(String),
        }
        match Raw::deserialize(d)? {
            Raw::Int(n) => Ok(ByteSize(n)),
            Raw::Str(s) => ByteSize::parse(&s).map_err(serde::de::Error::custom),
        }
    }
}

/// Where a backstore keeps its blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum BackstoreKind {
    /// A regular file (created sparse when missing); relative paths are in the state directory.
    File,
    /// A block device.
    Block,
    /// Memory; contents are lost at exit.
    Ramdisk,
    /// Reads return zeroes, writes are discarded (benchmarks).
    Null,
    /// A Ceph RBD image (the `rbd` section says which), through librbd.
    Rbd,
}

fn default_block_size() -> u32 {
    512
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Backstore {
    pub name: String,
    #[serde(rename = "type")]
    pub kind: BackstoreKind,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>)]
    pub path: Option<PathBuf>,
    /// Required for file (when the file does not exist yet), ramdisk and null.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<ByteSize>,
    #[serde(default = "default_block_size")]
    pub block_size: u32,
    #[serde(default)]
    pub read_only: bool,
    /// NAA IEEE Registered Extended identifier as 32 hex digits; derived from the name when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wwn: Option<String>,
    /// Unit serial number (VPD 0x80); derived from the name when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serial: Option<String>,
    /// Thin provisioning: UNMAP and WRITE SAME with UNMAP deallocate.
    #[serde(default = "yes")]
    pub thin: bool,
    /// Volatile write cache (WCE): writes are durable after SYNCHRONIZE CACHE or FUA.
    #[serde(default = "yes")]
    pub write_cache: bool,
    /// File and block backstores: `true` moves aligned transfers with O_DIRECT, past the
    /// page cache (where the file system supports it); `false` serves through the page
    /// cache. Default: `false` for a file (cached reads are answered from memory, as tgt,
    /// LIO fileio and QEMU's `cache=writeback` do), `true` for a block device (its data is
    /// not cached twice, once by the initiator and once by rtgtd's host, as LIO iblock and
    /// SPDK do). Durability does not depend on it: see `write_cache`. Shown resolved.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub direct: Option<bool>,
    /// Physical block size reported to initiators (READ CAPACITY(16) logical blocks per
    /// physical block, Block Limits VPD granularities): a power of two from `block_size` to
    /// 64KiB. Default: for a file 4096 (the page and hole-punching granularity of Linux
    /// file systems), for a block device its physical block size, for ramdisk and null
    /// `block_size`; never less than `block_size`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub physical_block_size: Option<ByteSize>,
    /// Removable medium: START STOP UNIT with LOEJ ejects and loads it, PREVENT ALLOW
    /// MEDIUM REMOVAL keeps it in.
    #[serde(default, skip_serializing_if = "is_false")]
    pub removable: bool,
    /// Bytes per second a SANITIZE overwrite (or zero-fill erase) may write in the
    /// background; 0 is unlimited. Default 32MiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sanitize_rate: Option<ByteSize>,
    /// Other rtgtd processes export this file or block device too, as the same LUN
    /// (gateways with disjoint ALUA groups): a block device is opened without O_EXCL, and
    /// the persistent reservation state lives in the file they all name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shared: Option<Shared>,
    /// The image of an `rbd` backstore; its capacity is the image's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rbd: Option<RbdImage>,
}

fn default_pool() -> String {
    "rbd".into()
}

fn default_ceph_conf() -> PathBuf {
    PathBuf::from("/etc/ceph/ceph.conf")
}

fn default_client_id() -> String {
    "admin".into()
}

fn default_op_timeout() -> u32 {
    30
}

/// A Ceph RBD image and how to reach its cluster. Every rtgtd that names the same image
/// exports the same data: give them the same `wwn` and `serial` to make it one LUN.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RbdImage {
    /// Default `rbd`.
    #[serde(default = "default_pool")]
    pub pool: String,
    /// RADOS namespace within the pool; none when empty.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    pub image: String,
    /// The cluster's configuration file: relative to the state directory, or absolute, and
    /// then under /etc/ceph or a backstore root. Default /etc/ceph/ceph.conf.
    #[serde(default = "default_ceph_conf")]
    #[schema(value_type = String)]
    pub ceph_conf: PathBuf,
    /// The Ceph client name without `client.`. Default `admin`.
    #[serde(default = "default_client_id")]
    pub client_id: String,
    /// A keyring other than the one the configuration names; same places as `ceph_conf`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>)]
    pub keyring: Option<PathBuf>,
    /// Seconds a cluster operation may take: past it the command ends with NOT READY (a
    /// multipath host then uses another gateway) instead of waiting for the cluster. 1 to
    /// 600; default 30.
    #[serde(default = "default_op_timeout")]
    pub op_timeout_secs: u32,
}

/// What the rtgtd processes exporting one backstore share.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Shared {
    /// Persistent reservation state (registrations, reservation, generation), written under
    /// a lock and read again whenever another process has changed it: relative to the state
    /// directory, or absolute under a backstore root (a directory every process reaches).
    #[schema(value_type = String, example = "/srv/rtgt/disk0.pr")]
    pub pr_file: PathBuf,
}

impl Backstore {
    /// Whether aligned transfers bypass the page cache: `direct` as configured, else the
    /// default of the kind (a block device yes, a file no). Always false for ramdisk and null.
    pub fn direct(&self) -> bool {
        match self.kind {
            BackstoreKind::File | BackstoreKind::Block => {
                self.direct.unwrap_or(self.kind == BackstoreKind::Block)
            }
            BackstoreKind::Ramdisk | BackstoreKind::Null | BackstoreKind::Rbd => false,
        }
    }

    /// Writes out the defaults that depend on other fields (`direct` of a file or block
    /// backstore), so that exports and answers show the effective values and a definition
    /// that leaves them out compares equal to one that spells them.
    pub fn resolve_defaults(&mut self) {
        if matches!(self.kind, BackstoreKind::File | BackstoreKind::Block) {
            self.direct = Some(self.direct());
        }
    }
}

#[derive(Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Chap {
    pub user: String,
    /// Write-only: exports and answers show it as `********` unless secrets are asked for;
    /// a document applied with `********` keeps the current secret.
    #[serde(deserialize_with = "secret_string")]
    pub secret: String,
}

/// A secret as a string; anything else is refused without repeating the value, which an
/// error message would otherwise carry into logs (`secret: 123456789012` is a number).
fn secret_string<'de, D: serde::Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    struct V;
    impl serde::de::Visitor<'_> for V {
        type Value = String;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("the secret as a string")
        }
        fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<String, E> {
            Ok(v.to_string())
        }
        fn visit_string<E: serde::de::Error>(self, v: String) -> Result<String, E> {
            Ok(v)
        }
        fn visit_bool<E: serde::de::Error>(self, _: bool) -> Result<String, E> {
            Err(E::custom(NOT_A_STRING))
        }
        fn visit_i64<E: serde::de::Error>(self, _: i64) -> Result<String, E> {
            Err(E::custom(NOT_A_STRING))
        }
        fn visit_u64<E: serde::de::Error>(self, _: u64) -> Result<String, E> {
            Err(E::custom(NOT_A_STRING))
        }
        fn visit_f64<E: serde::de::Error>(self, _: f64) -> Result<String, E> {
            Err(E::custom(NOT_A_STRING))
        }
        fn visit_bytes<E: serde::de::Error>(self, _: &[u8]) -> Result<String, E> {
            Err(E::custom(NOT_A_STRING))
        }
    }
    const NOT_A_STRING: &str = "a CHAP secret must be a string (quote it)";
    // Not deserialize_string: for another type it would build its error from the value.
    d.deserialize_any(V)
}

/// Debug output never shows the secret (configurations end up in log lines).
impl fmt::Debug for Chap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Chap")
            .field("user", &self.user)
            .field("secret", &REDACTED)
            .finish()
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Auth {
    /// Credentials the initiator must present.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chap: Option<Chap>,
    /// Credentials the target answers with when the initiator asks for mutual CHAP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mutual_chap: Option<Chap>,
}

impl Auth {
    fn is_empty(&self) -> bool {
        self.chap.is_none() && self.mutual_chap.is_none()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Lun {
    pub lun: u64,
    pub backstore: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MappedLun {
    /// LUN number the initiator sees.
    pub lun: u64,
    /// LUN number of the portal group it maps to.
    pub tpg_lun: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Acl {
    pub initiator: String,
    #[serde(default, skip_serializing_if = "Auth::is_empty")]
    pub auth: Auth,
    /// LUNs this initiator sees; when empty, all of the portal group's LUNs under their own numbers.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mapped_luns: Vec<MappedLun>,
}

/// iSCSI operational parameters offered by a portal group (RFC 7143 §13). Names are the
/// RFC's keys; absent keys keep rtgt's defaults.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields, rename_all = "PascalCase")]
pub struct IscsiParams {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_recv_data_segment_length: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_burst_length: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_burst_length: Option<u32>,
    #[serde(
        default,
        rename = "InitialR2T",
        skip_serializing_if = "Option::is_none"
    )]
    pub initial_r2t: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub immediate_data: Option<bool>,
    #[serde(
        default,
        rename = "MaxOutstandingR2T",
        skip_serializing_if = "Option::is_none"
    )]
    pub max_outstanding_r2t: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_connections: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_time2_wait: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_time2_retain: Option<u16>,
    /// Offer CRC32C header digests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub header_digest: Option<bool>,
    /// Offer CRC32C data digests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_digest: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_recovery_level: Option<u8>,
    /// Commands in flight per session (the CmdSN window).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_depth: Option<u32>,
    /// Seconds between target-initiated NOP-In pings (0 disables them).
    #[serde(
        default,
        rename = "NopInInterval",
        skip_serializing_if = "Option::is_none"
    )]
    pub nopin_interval: Option<u32>,
    /// Seconds to wait for the answer to a NOP-In ping.
    #[serde(
        default,
        rename = "NopInTimeout",
        skip_serializing_if = "Option::is_none"
    )]
    pub nopin_timeout: Option<u32>,
    /// Microseconds a connection keeps polling its socket for the next command after
    /// answering the last one before it sleeps (0 turns polling off). Polling starts only on
    /// connections whose commands arrive within this time, so idle ones cost nothing; it
    /// saves the wake-up latency at low queue depths.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub busy_poll_micros: Option<u32>,
    /// Send reads of 64 KiB or more from file backstores on a memory file system (tmpfs)
    /// with `sendfile(2)`, straight from the page cache, instead of copying them through a
    /// buffer. Never with data digests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zero_copy_reads: Option<bool>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PortalGroup {
    pub tag: u16,
    #[schema(value_type = Vec<String>, example = json!(["0.0.0.0:3260"]))]
    pub portals: Vec<SocketAddr>,
    #[serde(default, skip_serializing_if = "Auth::is_empty")]
    pub auth: Auth,
    /// Admit any initiator (LIO's generate_node_acls); it sees all LUNs of the group.
    #[serde(default)]
    pub allow_any_initiator: bool,
    #[serde(default)]
    pub luns: Vec<Lun>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub acls: Vec<Acl>,
    #[serde(default, skip_serializing_if = "is_default")]
    pub params: IscsiParams,
    /// Also serve iSER on these portals (the CM listens on the same ip:port over the RDMA
    /// device, when the `rdma` section brings one up).
    #[serde(default = "yes", skip_serializing_if = "is_true")]
    pub iser: bool,
    /// Target port group (an `id` of the `alua` section); the default group 0 when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alua_group: Option<u16>,
    /// Relative target port identifier (VPD 0x83, the groups' port lists, persistent
    /// reservations made through this port). Default: the tag.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub relative_port: Option<u16>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Target {
    /// iSCSI qualified name (`iqn.` or `eui.` or `naa.`).
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alias: Option<String>,
    pub portal_groups: Vec<PortalGroup>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Discovery {
    #[serde(default, skip_serializing_if = "Auth::is_empty")]
    pub auth: Auth,
}

/// An initiator admitted to an SRP target port.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SrpAcl {
    /// Initiator port identifier: `0x` and 32 hex digits (Linux ib_srp: initiator_ext followed
    /// by the port GID's interface identifier).
    pub initiator: String,
    /// LUNs this initiator sees; when empty, all of the port's LUNs under their own numbers.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mapped_luns: Vec<MappedLun>,
}

fn default_srp_listen() -> Vec<SocketAddr> {
    vec![SocketAddr::from(([0, 0, 0, 0], 5555))]
}

/// An SRP target port reached through RDMA/CM (SRP r16a; Linux ib_srp with `dest=`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SrpPort {
    pub name: String,
    /// RDMA/CM listen addresses (port space RDMA_PS_TCP). Default: 0.0.0.0:5555.
    #[serde(default = "default_srp_listen")]
    #[schema(value_type = Vec<String>, example = json!(["0.0.0.0:5555"]))]
    pub listen: Vec<SocketAddr>,
    /// Identifier extension (16 hex digits, optional `0x`): the first half of the target
    /// port identifier. Derived from the host and the name when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id_ext: Option<String>,
    /// I/O controller GUID (16 hex digits): the second half. Derived like `id_ext`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ioc_guid: Option<String>,
    /// Admit any initiator; it sees all LUNs of the port.
    #[serde(default)]
    pub allow_any_initiator: bool,
    #[serde(default)]
    pub luns: Vec<Lun>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub acls: Vec<SrpAcl>,
    /// Target port group (an `id` of the `alua` section); the default group 0 when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alua_group: Option<u16>,
    /// Relative target port identifier (VPD 0x83, the groups' port lists, persistent
    /// reservations made through this port). Default: the lowest that no portal group or other SRP port has, in the document's order (set it when
    /// ports are added and removed and registrations must stay).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub relative_port: Option<u16>,
}

/// Parses 16 hex digits, with or without `0x`.
pub fn parse_hex64(s: &str) -> Option<u64> {
    let h = s.strip_prefix("0x").unwrap_or(s);
    (h.len() == 16 && h.chars().all(|c| c.is_ascii_hexdigit()))
        .then(|| u64::from_str_radix(h, 16).ok())
        .flatten()
}

/// An SRP port identifier as ACLs name it: `0x` and 32 hex digits.
pub fn valid_srp_port_name(s: &str) -> bool {
    s.strip_prefix("0x")
        .is_some_and(|h| h.len() == 32 && h.chars().all(|c| c.is_ascii_hexdigit()))
}

/// LUN numbers a port may have: 0 to 16383 (SAM's flat space addressing).
pub const LUN_LIMIT: u64 = 16384;

/// Why a LUN number cannot be in a port's list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LunFault {
    /// It is [`LUN_LIMIT`] or more.
    OutOfRange,
    /// An earlier entry has it.
    Twice,
}

/// A part of the document that the API reads and writes on its own (a port, an ACL).
pub trait Item:
    Clone + PartialEq + fmt::Debug + Serialize + DeserializeOwned + ToSchema + Send + Sync + 'static
{
}

impl<T> Item for T where
    T: Clone
        + PartialEq
        + fmt::Debug
        + Serialize
        + DeserializeOwned
        + ToSchema
        + Send
        + Sync
        + 'static
{
}

/// An initiator admitted to a [`Port`], whatever the fabric: an iSCSI ACL, an SRP ACL.
pub trait PortAcl {
    /// The initiator, as the fabric names it.
    fn initiator(&self) -> &str;

    /// Whether `name` names this ACL's initiator, compared as the fabric compares names.
    fn names(&self, name: &str) -> bool;

    /// LUNs the initiator sees; when empty, all of the port's under their own numbers.
    fn mapped_luns(&self) -> &[MappedLun];

    /// Checks the initiator's name; the error says why it is not one of the fabric.
    fn validate_initiator(&self) -> Result<(), String>;

    /// Checks what else the ACL holds; the error names the field below the ACL and why.
    fn validate_rest(&self) -> Result<(), (String, String)> {
        Ok(())
    }

    /// Replaces every secret it holds by [`REDACTED`].
    fn redact(&mut self) {}
}

/// What initiators reach LUNs through, whatever the fabric: an iSCSI portal group, an SRP
/// target port. Each has a list of LUNs (backstores under a number) and a list of ACLs
/// (initiators admitted, each with the LUNs it sees); both are validated, compared and
/// served alike. A fabric's own settings (portals, CHAP, listen addresses) stay with its type.
pub trait Port {
    /// The port's ACL.
    type Acl: PortAcl + Item;

    /// How validation messages name the kind: `portal group`, `SRP port`.
    const NOUN: &'static str;

    fn luns(&self) -> &[Lun];

    fn luns_mut(&mut self) -> &mut Vec<Lun>;

    fn acls(&self) -> &[Self::Acl];

    fn acls_mut(&mut self) -> &mut Vec<Self::Acl>;

    /// Whether any initiator is admitted, and sees all LUNs, without an ACL.
    fn allow_any_initiator(&self) -> bool;

    /// Its target port group, as configured.
    fn alua_group(&self) -> Option<u16>;

    /// Its relative target port identifier, as configured.
    fn relative_port(&self) -> Option<u16>;

    /// Replaces every secret it holds by [`REDACTED`].
    fn redact(&mut self) {
        self.acls_mut().iter_mut().for_each(PortAcl::redact);
    }

    /// A copy with every secret replaced by [`REDACTED`].
    fn redacted(mut self) -> Self
    where
        Self: Sized,
    {
        self.redact();
        self
    }

    /// Why LUN `lun` cannot be in the list.
    fn lun_fault(lun: u64, fault: LunFault) -> String {
        match fault {
            LunFault::OutOfRange => format!("LUN {lun} is out of range (0-16383)"),
            LunFault::Twice => format!("LUN {lun} is listed twice"),
        }
    }
}

/// The accessors of a [`Port`] whose fields are `luns`, `acls`, `allow_any_initiator`,
/// `alua_group` and `relative_port`.
macro_rules! port_lists {
    ($acl:ty) => {
        fn luns(&self) -> &[Lun] {
            &self.luns
        }

        fn luns_mut(&mut self) -> &mut Vec<Lun> {
            &mut self.luns
        }

        fn acls(&self) -> &[$acl] {
            &self.acls
        }

        fn acls_mut(&mut self) -> &mut Vec<$acl> {
            &mut self.acls
        }

        fn allow_any_initiator(&self) -> bool {
            self.allow_any_initiator
        }

        fn alua_group(&self) -> Option<u16> {
            self.alua_group
        }

        fn relative_port(&self) -> Option<u16> {
            self.relative_port
        }
    };
}

impl PortAcl for Acl {
    fn initiator(&self) -> &str {
        &self.initiator
    }

    fn names(&self, name: &str) -> bool {
        self.initiator == name
    }

    fn mapped_luns(&self) -> &[MappedLun] {
        &self.mapped_luns
    }

    fn validate_initiator(&self) -> Result<(), String> {
        validate_iscsi_name(&self.initiator)
    }

    fn validate_rest(&self) -> Result<(), (String, String)> {
        validate_auth(&self.auth).map_err(|(f, m)| (format!("auth.{f}"), m))
    }

    fn redact(&mut self) {
        self.auth.redact();
    }
}

impl Port for PortalGroup {
    type Acl = Acl;

    const NOUN: &'static str = "portal group";

    port_lists!(Acl);

    fn redact(&mut self) {
        self.auth.redact();
        self.acls.iter_mut().for_each(PortAcl::redact);
    }
}

impl PortAcl for SrpAcl {
    fn initiator(&self) -> &str {
        &self.initiator
    }

    /// SRP initiator port identifiers are hex: case does not matter.
    fn names(&self, name: &str) -> bool {
        self.initiator.eq_ignore_ascii_case(name)
    }

    fn mapped_luns(&self) -> &[MappedLun] {
        &self.mapped_luns
    }

    fn validate_initiator(&self) -> Result<(), String> {
        if valid_srp_port_name(&self.initiator) {
            return Ok(());
        }
        Err(format!(
            "{:?} is not an SRP initiator port identifier (0x and 32 hex digits)",
            self.initiator
        ))
    }
}

impl Port for SrpPort {
    type Acl = SrpAcl;

    const NOUN: &'static str = "SRP port";

    port_lists!(SrpAcl);

    fn lun_fault(lun: u64, _: LunFault) -> String {
        format!("LUN {lun} is out of range (0-16383) or listed twice")
    }
}

/// The most microseconds of busy polling a setting may ask for.
pub const MAX_BUSY_POLL_MICROS: u32 = 10_000;
/// The most engine threads `rdma.shards` may ask for.
pub const MAX_SHARDS: u32 = 64;

/// What runs the RDMA transport of iSER and SRP.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum RdmaProvider {
    /// rtgt's own RoCEv2 engine over a UDP socket (port 4791): no RDMA NIC needed.
    #[default]
    Soft,
    /// An RDMA NIC (or the kernel's rdma_rxe) through rdma-core's libibverbs and librdmacm,
    /// loaded at start; rtgtd then opens no UDP 4791 socket of its own.
    Verbs,
}

/// The RDMA devices that iSER and SRP are served on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Rdma {
    #[serde(default = "Rdma::default_enabled")]
    pub enabled: bool,
    /// `soft` (the default) or `verbs`.
    #[serde(default)]
    pub provider: RdmaProvider,
    /// Addresses served; empty means every address of the host (`soft`) or of the RDMA
    /// devices (`verbs`, where each listed address must belong to one).
    #[serde(default)]
    #[schema(value_type = Vec<String>, example = json!(["192.0.2.10"]))]
    pub addresses: Vec<IpAddr>,
    /// Ethernet MTU of the links; the RDMA path MTU follows from it (1024 at 1500).
    #[serde(default = "Rdma::default_eth_mtu")]
    pub eth_mtu: u32,
    /// Microseconds the device keeps polling its sockets after the last packet before it
    /// sleeps (0 = never): saves a wake-up per request while initiators are busy, costs
    /// nothing when they are idle. At most 10000.
    #[serde(default = "Rdma::default_busy_poll_micros")]
    pub busy_poll_micros: u32,
    /// Engine threads, each with a device of its own that owns a share of the RDMA
    /// connections (steered to it by QP number): a connection's packets, completions and
    /// commands are handled on its thread and never hop between cores. Unset (the default):
    /// one per CPU rtgtd may run on; 0 runs everything on rtgtd's shared worker threads.
    /// At most 64.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shards: Option<u32>,
}

impl Rdma {
    fn default_enabled() -> bool {
        true
    }

    fn default_eth_mtu() -> u32 {
        1500
    }

    fn default_busy_poll_micros() -> u32 {
        50
    }

    /// [`Rdma::shards`] as it applies on this machine.
    pub fn engine_threads(&self) -> u32 {
        self.shards.unwrap_or_else(|| {
            std::thread::available_parallelism()
                .map_or(1, |n| n.get() as u32)
                .min(MAX_SHARDS)
        })
    }

    fn validate(&self) -> Result<(), (String, String)> {
        // The smallest IB MTU (256) plus the RoCEv2 headers rxe reserves (80 bytes).
        if !(336..=65535).contains(&self.eth_mtu) {
            return Err((
                "eth_mtu".into(),
                format!("{} is outside 336..=65535", self.eth_mtu),
            ));
        }
        if self.busy_poll_micros > MAX_BUSY_POLL_MICROS {
            return Err((
                "busy_poll_micros".into(),
                format!(
                    "{} is more than {MAX_BUSY_POLL_MICROS}",
                    self.busy_poll_micros
                ),
            ));
        }
        if let Some(n) = self.shards.filter(|&n| n > MAX_SHARDS) {
            return Err(("shards".into(), format!("{n} is more than {MAX_SHARDS}")));
        }
        let mut seen = HashSet::new();
        for (i, a) in self.addresses.iter().enumerate() {
            if a.is_multicast() {
                return Err((
                    format!("addresses[{i}]"),
                    format!("{a} is a multicast address"),
                ));
            }
            if a.is_unspecified() && self.addresses.len() > 1 {
                return Err((
                    format!("addresses[{i}]"),
                    format!("{a} (every address) cannot be combined with other addresses"),
                ));
            }
            if !seen.insert(*a) {
                return Err((format!("addresses[{i}]"), format!("{a} is listed twice")));
            }
        }
        Ok(())
    }
}

impl Default for Rdma {
    fn default() -> Self {
        Rdma {
            enabled: true,
            provider: RdmaProvider::Soft,
            addresses: Vec::new(),
            eth_mtu: Rdma::default_eth_mtu(),
            busy_poll_micros: Rdma::default_busy_poll_micros(),
            shards: None,
        }
    }
}

/// The whole configuration document.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub backstores: Vec<Backstore>,
    #[serde(default)]
    pub targets: Vec<Target>,
    #[serde(default, skip_serializing_if = "is_default")]
    pub discovery: Discovery,
    /// SRP target ports.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub srp: Vec<SrpPort>,
    #[serde(default, skip_serializing_if = "is_default")]
    pub rdma: Rdma,
    #[serde(default, skip_serializing_if = "is_default")]
    pub api: ApiConfig,
    #[serde(default, skip_serializing_if = "is_default")]
    pub policy: Policy,
    /// Asymmetric logical unit access: target port groups and their access states.
    #[serde(default, skip_serializing_if = "is_default")]
    pub alua: Alua,
    /// NVMe over Fabrics subsystems and ports.
    #[serde(default, skip_serializing_if = "is_default")]
    pub nvme: Nvme,
}

/// The administration API's listeners and who may use them. Read at start: the API cannot
/// change this section (a changed file applies when rtgtd restarts).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ApiConfig {
    /// TCP listeners. Every request on them but the health check needs a bearer token.
    #[serde(default = "default_api_listen")]
    #[schema(value_type = Vec<String>, example = json!(["127.0.0.1:8080"]))]
    pub listen: Vec<SocketAddr>,
    /// Serve the API on a unix socket too (no token: only root, rtgtd's own user and the
    /// members of `socket_group` may connect).
    #[serde(default = "yes")]
    pub socket: bool,
    /// Where the socket is; default `rtgtd.sock` in `$RUNTIME_DIRECTORY` (under systemd,
    /// `/run/rtgt`), else in the state directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>)]
    pub socket_path: Option<PathBuf>,
    /// Group admitted to the socket besides root (mode 0660); default `rtgt`. Without such a
    /// group the socket is 0600.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub socket_group: Option<String>,
    /// File holding the admin bearer token; default `api-token` in the state directory,
    /// created with mode 0600 when missing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>)]
    pub token_file: Option<PathBuf>,
    /// File holding the read-only bearer token (status, configuration without secrets,
    /// sessions, metrics); default `api-token-read` in the state directory, created with
    /// mode 0600 when missing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>)]
    pub read_token_file: Option<PathBuf>,
    /// Serve every TCP listener over TLS with this certificate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<Tls>,
    /// Listeners that serve only `/metrics`, without a token (for Prometheus). None unless
    /// configured.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schema(value_type = Vec<String>, example = json!(["0.0.0.0:9283"]))]
    pub metrics_listen: Vec<SocketAddr>,
}

/// A TLS certificate and its private key, PEM files; relative paths are in the state
/// directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Tls {
    /// The certificate chain, leaf first.
    #[schema(value_type = String)]
    pub cert: PathBuf,
    /// The private key (PKCS#8, PKCS#1 or SEC1).
    #[schema(value_type = String)]
    pub key: PathBuf,
}

fn default_api_listen() -> Vec<SocketAddr> {
    vec![SocketAddr::from(([127, 0, 0, 1], 8080))]
}

impl Default for ApiConfig {
    fn default() -> Self {
        ApiConfig {
            listen: default_api_listen(),
            socket: true,
            socket_path: None,
            socket_group: None,
            token_file: None,
            read_token_file: None,
            tls: None,
            metrics_listen: Vec::new(),
        }
    }
}

impl ApiConfig {
    fn validate(&self) -> Result<(), (String, String)> {
        let mut seen = HashSet::new();
        for (i, a) in self.listen.iter().enumerate() {
            if !seen.insert(*a) {
                return Err((format!("listen[{i}]"), format!("{a} is listed twice")));
            }
        }
        for (i, a) in self.metrics_listen.iter().enumerate() {
            if !seen.insert(*a) {
                return Err((
                    format!("metrics_listen[{i}]"),
                    format!("{a} is already an API listener"),
                ));
            }
        }
        if let Some(g) = &self.socket_group {
            let ok = !g.is_empty()
                && g.len() <= 32
                && g.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
            if !ok {
                return Err(("socket_group".into(), format!("{g:?} is not a group name")));
            }
        }
        for (field, f) in [
            ("token_file", &self.token_file),
            ("read_token_file", &self.read_token_file),
        ] {
            if f.as_ref().is_some_and(|f| f.as_os_str().is_empty()) {
                return Err((field.into(), "empty path".into()));
            }
        }
        if self.token_file.is_some() && self.token_file == self.read_token_file {
            return Err((
                "read_token_file".into(),
                "the read-only token needs a file of its own".into(),
            ));
        }
        Ok(())
    }
}

/// What the API may make rtgtd open. Read at start: the API cannot change this section (a
/// changed file applies when rtgtd restarts).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Policy {
    /// Directories file backstores may live in, besides the state directory (always one):
    /// a file backstore's path must resolve inside one of them without a symlink or `..`
    /// leading out.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schema(value_type = Vec<String>, example = json!(["/var/lib/rtgt/backstores"]))]
    pub backstore_roots: Vec<PathBuf>,
}

impl Policy {
    fn validate(&self) -> Result<(), (String, String)> {
        for (i, r) in self.backstore_roots.iter().enumerate() {
            if !r.is_absolute() {
                return Err((
                    format!("backstore_roots[{i}]"),
                    format!("{} is not an absolute path", r.display()),
                ));
            }
            // The service's generator writes the roots into a unit drop-in, where
            // whitespace, quotes, backslashes and `%` would mean something else.
            let text = r.to_str().unwrap_or("\u{0}");
            if text
                .chars()
                .any(|c| c.is_whitespace() || c.is_control() || "\"'\\%".contains(c))
            {
                return Err((
                    format!("backstore_roots[{i}]"),
                    format!(
                        "{} has whitespace, quotes, a backslash, `%` or is not UTF-8",
                        r.display()
                    ),
                ));
            }
            if r.components()
                .any(|c| matches!(c, std::path::Component::ParentDir))
            {
                return Err((
                    format!("backstore_roots[{i}]"),
                    format!("{} contains `..`", r.display()),
                ));
            }
        }
        Ok(())
    }
}

/// Largest ramdisk: its memory is allocated as written, but its index is not.
pub const MAX_RAMDISK: u64 = 1 << 40;

/// What exports show in place of a CHAP secret.
pub const REDACTED: &str = "********";

impl Auth {
    fn chaps_mut(&mut self) -> impl Iterator<Item = &mut Chap> {
        self.chap.iter_mut().chain(self.mutual_chap.iter_mut())
    }

    fn redact(&mut self) {
        for c in self.chaps_mut() {
            c.secret = REDACTED.into();
        }
    }

    /// Replaces [`REDACTED`] secrets by the current ones of the same user.
    fn restore(&mut self, current: Option<&Auth>) {
        let find = |user: &str, mutual: bool| {
            current.and_then(|a| {
                let c = if mutual { &a.mutual_chap } else { &a.chap };
                c.as_ref()
                    .filter(|c| c.user == user)
                    .map(|c| c.secret.clone())
            })
        };
        if let Some(c) = self.chap.as_mut().filter(|c| c.secret == REDACTED) {
            if let Some(s) = find(&c.user, false) {
                c.secret = s;
            }
        }
        if let Some(c) = self.mutual_chap.as_mut().filter(|c| c.secret == REDACTED) {
            if let Some(s) = find(&c.user, true) {
                c.secret = s;
            }
        }
    }
}

/// The configuration rtgtd serves when started without `--config`: one target with LUN 0 on
/// a 1 GiB sparse file in the state directory, on every address, open to any initiator.
pub const EMBEDDED_DEFAULT: &str = include_str!("default.yaml");

impl Config {
    /// Parses and validates a YAML document; `file` names it in error messages.
    pub fn from_yaml(text: &str, file: &Path) -> Result<Config, ConfigError> {
        let de = serde_norway::Deserializer::from_str(text);
        let mut config: Config = serde_path_to_error::deserialize(de).map_err(|e| {
            let path = e.path().to_string();
            let inner = e.into_inner();
            // The YAML error already names the location; drop its own copy of the path.
            let text = inner.to_string();
            let message = text
                .strip_prefix(&format!("{path}: "))
                .unwrap_or(&text)
                .to_string();
            ConfigError::Invalid {
                file: file.to_path_buf(),
                path: if path == "." {
                    "(document)".into()
                } else {
                    path
                },
                message,
            }
        })?;
        config
            .validate()
            .map_err(|(path, message)| ConfigError::Invalid {
                file: file.to_path_buf(),
                path,
                message,
            })?;
        config.resolve_defaults();
        Ok(config)
    }

    /// Reads, parses and validates a configuration file.
    pub fn load(file: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(file).map_err(|source| ConfigError::Read {
            file: file.to_path_buf(),
            source,
        })?;
        Config::from_yaml(&text, file)
    }

    /// The embedded default configuration.
    pub fn embedded_default() -> Config {
        Config::from_yaml(EMBEDDED_DEFAULT, Path::new("<embedded default>"))
            .expect("the embedded default configuration is valid")
    }

    pub fn to_yaml(&self) -> String {
        serde_norway::to_string(self).expect("the configuration model always serializes")
    }

    /// Writes the configuration so that a crash at any point leaves either the old or the new
    /// file: temporary file, fsync, rename, fsync of the directory.
    pub fn save(&self, file: &Path) -> Result<(), ConfigError> {
        let err = |source| ConfigError::Write {
            file: file.to_path_buf(),
            source,
        };
        let dir = match file.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let name = file
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "config.yaml".into());
        let tmp = dir.join(format!(".{name}.tmp"));
        // It holds CHAP secrets: keep the file's mode, or 0600 for a new one.
        let mode = {
            use std::os::unix::fs::PermissionsExt;
            std::fs::metadata(file).map_or(0o600, |m| m.permissions().mode() & 0o7777)
        };
        let mut f = {
            use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
            let f = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(mode)
                .open(&tmp)
                .map_err(err)?;
            f.set_permissions(std::fs::Permissions::from_mode(mode))
                .map_err(err)?;
            f
        };
        f.write_all(self.to_yaml().as_bytes()).map_err(err)?;
        f.sync_all().map_err(err)?;
        drop(f);
        std::fs::rename(&tmp, file).map_err(err)?;
        std::fs::File::open(&dir)
            .and_then(|d| d.sync_all())
            .map_err(err)?;
        Ok(())
    }

    /// [`Backstore::resolve_defaults`] for every backstore.
    pub fn resolve_defaults(&mut self) {
        self.backstores
            .iter_mut()
            .for_each(Backstore::resolve_defaults);
    }

    /// A copy with every CHAP secret replaced by [`REDACTED`].
    pub fn redacted(&self) -> Config {
        let mut c = self.clone();
        c.discovery.auth.redact();
        for t in &mut c.targets {
            t.portal_groups.iter_mut().for_each(Port::redact);
        }
        c.srp.iter_mut().for_each(Port::redact);
        c
    }

    /// Puts back the secrets of `current` where this document says [`REDACTED`] for the
    /// same user at the same place, so an exported document can be applied again.
    pub fn restore_secrets(&mut self, current: &Config) {
        self.discovery.auth.restore(Some(&current.discovery.auth));
        for t in &mut self.targets {
            let ct = current.target(&t.name);
            for g in &mut t.portal_groups {
                let cg = ct.and_then(|ct| ct.portal_groups.iter().find(|x| x.tag == g.tag));
                g.auth.restore(cg.map(|cg| &cg.auth));
                for a in &mut g.acls {
                    let ca = cg.and_then(|cg| cg.acls.iter().find(|x| x.initiator == a.initiator));
                    a.auth.restore(ca.map(|ca| &ca.auth));
                }
            }
        }
    }

    pub fn target(&self, name: &str) -> Option<&Target> {
        self.targets.iter().find(|t| t.name == name)
    }

    pub fn backstore(&self, name: &str) -> Option<&Backstore> {
        self.backstores.iter().find(|b| b.name == name)
    }

    /// Every LUN of every port, in the document's order, with its port as messages name it
    /// (`iqn.2025-01.io.rtgt:t portal group 1`, `SRP target port p0`).
    pub fn port_luns(&self) -> impl Iterator<Item = (String, &Lun)> {
        let groups = self.targets.iter().flat_map(|t| {
            t.portal_groups.iter().flat_map(move |g| {
                let port = format!("{} portal group {}", t.name, g.tag);
                g.luns.iter().map(move |l| (port.clone(), l))
            })
        });
        let srp = self.srp.iter().flat_map(|p| {
            let port = format!("SRP target port {}", p.name);
            p.luns.iter().map(move |l| (port.clone(), l))
        });
        groups.chain(srp)
    }

    /// Every target port with its relative port and group ([`crate::alua::resolve`]):
    /// portal groups first, then SRP ports, in the document's order.
    pub fn target_ports(&self) -> Vec<TargetPort> {
        fn decl<P: Port>(
            p: &P,
            key: PortKey,
            at: String,
            name: String,
            default: Option<u16>,
        ) -> PortDecl {
            PortDecl {
                key,
                at,
                name,
                relative_port: p.relative_port(),
                default_port: default,
                alua_group: p.alua_group(),
                backstores: p.luns().iter().map(|l| l.backstore.clone()).collect(),
            }
        }
        let mut decls = Vec::new();
        for (ti, t) in self.targets.iter().enumerate() {
            for (gi, g) in t.portal_groups.iter().enumerate() {
                decls.push(decl(
                    g,
                    PortKey::PortalGroup(t.name.clone(), g.tag),
                    format!("targets[{ti}].portal_groups[{gi}]"),
                    format!("{} portal group {}", t.name, g.tag),
                    Some(g.tag),
                ));
            }
        }
        for (si, p) in self.srp.iter().enumerate() {
            decls.push(decl(
                p,
                PortKey::Srp(p.name.clone()),
                format!("srp[{si}]"),
                format!("SRP port {}", p.name),
                None,
            ));
        }
        crate::alua::resolve(decls, &self.alua)
    }

    /// Why this document cannot replace `old`, which is in force, though it is valid
    /// ([`Alua::conflict`]).
    pub fn conflict(&self, old: &Config) -> Option<String> {
        let ports = self.target_ports();
        self.alua.conflict(
            &old.alua,
            self.backstores
                .iter()
                .map(|b| (b.name.as_str(), self.lu_alua(&ports, &b.name))),
        )
    }

    /// The target port groups of `backstore`'s logical unit ([`Alua::lu_config`]), those of
    /// the NVMe ports included when a namespace is on it.
    pub fn lu_alua(&self, ports: &[TargetPort], backstore: &str) -> AluaConfig {
        let mut nvme: Vec<u16> = Vec::new();
        if self.nvme.exports(backstore) {
            nvme = self.nvme_port_groups().into_values().collect();
        }
        self.alua.lu_config(ports, backstore, &nvme)
    }

    /// The target port group of each NVMe port, by port ID: its `alua_group`, or the default
    /// group 0 (also when the `alua` section lists no groups).
    pub fn nvme_port_groups(&self) -> std::collections::BTreeMap<u16, u16> {
        self.nvme
            .ports
            .iter()
            .map(|p| (p.id, p.alua_group.unwrap_or(0)))
            .collect()
    }

    /// Checks what the types cannot: references, uniqueness, ranges. Returns the path of the
    /// bad field and why.
    pub fn validate(&self) -> Result<(), (String, String)> {
        let mut names = HashSet::new();
        for (i, b) in self.backstores.iter().enumerate() {
            let at = |f: &str| format!("backstores[{i}].{f}");
            validate_name(&b.name, "-_.").map_err(|m| (at("name"), m))?;
            if !names.insert(b.name.as_str()) {
                return Err((at("name"), format!("duplicate backstore name {:?}", b.name)));
            }
            if b.block_size != 512 && b.block_size != 4096 {
                return Err((
                    at("block_size"),
                    format!("{} is not supported: use 512 or 4096", b.block_size),
                ));
            }
            match b.kind {
                BackstoreKind::File | BackstoreKind::Block if b.path.is_none() => {
                    return Err((at("path"), "a file or block backstore needs a path".into()));
                }
                BackstoreKind::Ramdisk | BackstoreKind::Null if b.size.is_none() => {
                    return Err((
                        at("size"),
                        "a ramdisk or null backstore needs a size".into(),
                    ));
                }
                BackstoreKind::Ramdisk | BackstoreKind::Null if b.path.is_some() => {
                    return Err((at("path"), "a ramdisk or null backstore has no path".into()));
                }
                BackstoreKind::Ramdisk | BackstoreKind::Null if b.shared.is_some() => {
                    return Err((
                        at("shared"),
                        "only file and block backstores can be shared with another rtgtd".into(),
                    ));
                }
                BackstoreKind::Ramdisk | BackstoreKind::Null | BackstoreKind::Rbd
                    if b.direct.is_some() =>
                {
                    return Err((
                        at("direct"),
                        "only file and block backstores have a cache mode".into(),
                    ));
                }
                BackstoreKind::Rbd if b.rbd.is_none() => {
                    return Err((
                        at("rbd"),
                        "an rbd backstore needs an rbd section naming the image".into(),
                    ));
                }
                BackstoreKind::Rbd if b.path.is_some() || b.size.is_some() => {
                    let f = if b.path.is_some() { "path" } else { "size" };
                    return Err((
                        at(f),
                        format!("an rbd backstore has no {f}: the image is named in rbd, its size is the image's (resize it through the backstore once created)"),
                    ));
                }
                BackstoreKind::Rbd if b.shared.is_some() => {
                    return Err((
                        at("shared"),
                        "only file and block backstores can be shared with another rtgtd".into(),
                    ));
                }
                _ if b.kind != BackstoreKind::Rbd && b.rbd.is_some() => {
                    return Err((at("rbd"), "only an rbd backstore names an image".into()));
                }
                _ => {}
            }
            if let Some(r) = &b.rbd {
                validate_rbd(r).map_err(|(f, m)| (at(&format!("rbd.{f}")), m))?;
            }
            if let Some(pbs) = b.physical_block_size {
                if !pbs.0.is_power_of_two() || pbs.0 < u64::from(b.block_size) || pbs.0 > 65536 {
                    return Err((
                        at("physical_block_size"),
                        format!(
                            "{pbs} must be a power of two from the block size {} to 64KiB",
                            b.block_size
                        ),
                    ));
                }
            }
            if let Some(size) = b.size {
                if b.kind == BackstoreKind::Ramdisk && size.0 > MAX_RAMDISK {
                    return Err((
                        at("size"),
                        format!(
                            "{size} is more than a ramdisk may hold ({})",
                            ByteSize(MAX_RAMDISK)
                        ),
                    ));
                }
                if size.0 == 0 || !size.0.is_multiple_of(u64::from(b.block_size)) {
                    return Err((
                        at("size"),
                        format!(
                            "{size} is not a non-zero multiple of the block size {}",
                            b.block_size
                        ),
                    ));
                }
            }
            if let Some(wwn) = &b.wwn {
                if wwn.len() != 32
                    || !wwn.chars().all(|c| c.is_ascii_hexdigit())
                    || !wwn.starts_with('6')
                {
                    return Err((
                        at("wwn"),
                        format!("{wwn:?} is not an NAA 6 identifier of 32 hex digits"),
                    ));
                }
            }
            if let Some(serial) = &b.serial {
                if serial.is_empty()
                    || serial.len() > 64
                    || !serial.chars().all(|c| c.is_ascii_graphic())
                {
                    return Err((
                        at("serial"),
                        "the serial must be 1 to 64 printable ASCII characters".into(),
                    ));
                }
            }
        }
        let mut target_names = HashSet::new();
        let mut portals = HashSet::new();
        for (ti, t) in self.targets.iter().enumerate() {
            let tat = |f: &str| format!("targets[{ti}].{f}");
            validate_iscsi_name(&t.name).map_err(|m| (tat("name"), m))?;
            if !target_names.insert(t.name.to_ascii_lowercase()) {
                return Err((tat("name"), format!("duplicate target {:?}", t.name)));
            }
            if t.portal_groups.is_empty() {
                return Err((
                    tat("portal_groups"),
                    "a target needs at least one portal group".into(),
                ));
            }
            let mut tags = HashSet::new();
            for (gi, g) in t.portal_groups.iter().enumerate() {
                let gat = |f: &str| format!("targets[{ti}].portal_groups[{gi}].{f}");
                if g.tag == 0 || !tags.insert(g.tag) {
                    return Err((
                        gat("tag"),
                        format!(
                            "tag {} must be non-zero and unique within the target",
                            g.tag
                        ),
                    ));
                }
                if g.portals.is_empty() {
                    return Err((
                        gat("portals"),
                        "a portal group needs at least one portal".into(),
                    ));
                }
                for (pi, p) in g.portals.iter().enumerate() {
                    if !portals.insert((t.name.clone(), *p)) {
                        return Err((
                            gat(&format!("portals[{pi}]")),
                            format!("portal {p} is listed twice"),
                        ));
                    }
                }
                validate_auth(&g.auth).map_err(|(f, m)| (gat(&format!("auth.{f}")), m))?;
                self.validate_port(g, &gat)?;
                validate_params(&g.params).map_err(|(f, m)| (gat(&format!("params.{f}")), m))?;
            }
        }
        validate_auth(&self.discovery.auth).map_err(|(f, m)| (format!("discovery.auth.{f}"), m))?;
        self.rdma
            .validate()
            .map_err(|(f, m)| (format!("rdma.{f}"), m))?;
        self.api
            .validate()
            .map_err(|(f, m)| (format!("api.{f}"), m))?;
        self.policy
            .validate()
            .map_err(|(f, m)| (format!("policy.{f}"), m))?;
        self.validate_srp()?;
        self.validate_nvme()?;
        self.alua
            .validate(&self.target_ports(), |b| self.backstore(b).is_some())
    }

    fn validate_nvme(&self) -> Result<(), (String, String)> {
        let mut scsi = std::collections::HashMap::new();
        for (port, l) in self.port_luns() {
            scsi.entry(l.backstore.as_str()).or_insert(port);
        }
        let cx = crate::nvme::Context {
            backstore: &|b| self.backstore(b).is_some(),
            scsi,
            tcp_portals: self
                .targets
                .iter()
                .flat_map(|t| &t.portal_groups)
                .flat_map(|g| g.portals.iter().copied())
                .collect(),
            rdma_listeners: self.rdma_listeners(),
        };
        self.nvme
            .validate(&cx)
            .map_err(|(f, m)| (format!("nvme.{f}"), m))?;
        for (i, p) in self.nvme.ports.iter().enumerate() {
            if let Some(g) = p.alua_group.filter(|g| *g != 0) {
                if self.alua.group(g).is_none() {
                    return Err((
                        format!("nvme.ports[{i}].alua_group"),
                        format!("the alua section has no group {g}"),
                    ));
                }
            }
        }
        Ok(())
    }

    /// The RDMA/CM addresses iSER portals and SRP ports listen on, with what listens.
    fn rdma_listeners(&self) -> std::collections::HashMap<SocketAddr, String> {
        let mut out = std::collections::HashMap::new();
        for t in &self.targets {
            for g in t.portal_groups.iter().filter(|g| g.iser) {
                for a in &g.portals {
                    out.entry(*a)
                        .or_insert_with(|| format!("an iSER portal of {}", t.name));
                }
            }
        }
        for p in &self.srp {
            for a in &p.listen {
                out.entry(*a)
                    .or_insert_with(|| format!("SRP target port {}", p.name));
            }
        }
        out
    }

    fn validate_srp(&self) -> Result<(), (String, String)> {
        let mut names = HashSet::new();
        let mut ids = HashSet::new();
        for (si, p) in self.srp.iter().enumerate() {
            let at = |f: &str| format!("srp[{si}].{f}");
            validate_name(&p.name, "-_.:").map_err(|m| (at("name"), m))?;
            if !names.insert(p.name.as_str()) {
                return Err((at("name"), format!("duplicate SRP port {:?}", p.name)));
            }
            if p.listen.is_empty() {
                return Err((
                    at("listen"),
                    "an SRP port needs at least one listen address".into(),
                ));
            }
            for (field, v) in [("id_ext", &p.id_ext), ("ioc_guid", &p.ioc_guid)] {
                if let Some(v) = v {
                    if parse_hex64(v).is_none() {
                        return Err((at(field), format!("{v:?} is not 16 hex digits")));
                    }
                }
            }
            if let (Some(a), Some(b)) = (&p.id_ext, &p.ioc_guid) {
                if !ids.insert((parse_hex64(a), parse_hex64(b))) {
                    return Err((
                        at("id_ext"),
                        "another SRP port has the same id_ext and ioc_guid".into(),
                    ));
                }
            }
            self.validate_port(p, &at)?;
        }
        Ok(())
    }

    /// Checks a port's LUN and ACL lists, alike on every fabric: LUN numbers in range and
    /// listed once, on backstores that exist; initiators named as the fabric names them and
    /// admitted once; mapped LUNs in range, listed once and on the port. `at` makes the
    /// path of a field of the port.
    fn validate_port<P: Port>(
        &self,
        p: &P,
        at: &dyn Fn(&str) -> String,
    ) -> Result<(), (String, String)> {
        let mut luns = HashSet::new();
        for (li, l) in p.luns().iter().enumerate() {
            let fault = if l.lun >= LUN_LIMIT {
                Some(LunFault::OutOfRange)
            } else if !luns.insert(l.lun) {
                Some(LunFault::Twice)
            } else {
                None
            };
            if let Some(fault) = fault {
                return Err((at(&format!("luns[{li}].lun")), P::lun_fault(l.lun, fault)));
            }
            if self.backstore(&l.backstore).is_none() {
                return Err((
                    at(&format!("luns[{li}].backstore")),
                    format!("unknown backstore {:?}", l.backstore),
                ));
            }
        }
        let mut initiators = HashSet::new();
        for (ai, a) in p.acls().iter().enumerate() {
            let aat = |f: &str| at(&format!("acls[{ai}].{f}"));
            a.validate_initiator().map_err(|m| (aat("initiator"), m))?;
            if !initiators.insert(a.initiator().to_ascii_lowercase()) {
                return Err((
                    aat("initiator"),
                    format!("duplicate ACL for {:?}", a.initiator()),
                ));
            }
            a.validate_rest().map_err(|(f, m)| (aat(&f), m))?;
            let mut seen = HashSet::new();
            for (mi, m) in a.mapped_luns().iter().enumerate() {
                if m.lun >= LUN_LIMIT || !seen.insert(m.lun) {
                    return Err((
                        aat(&format!("mapped_luns[{mi}].lun")),
                        format!("LUN {} is out of range or listed twice", m.lun),
                    ));
                }
                if !luns.contains(&m.tpg_lun) {
                    return Err((
                        aat(&format!("mapped_luns[{mi}].tpg_lun")),
                        format!("the {} has no LUN {}", P::NOUN, m.tpg_lun),
                    ));
                }
            }
        }
        Ok(())
    }
}

/// Checks a name of ASCII letters, digits and the characters of `others`.
/// Names librados and librbd accept, and a timeout in range.
fn validate_rbd(r: &RbdImage) -> Result<(), (&'static str, String)> {
    for (field, value) in [("pool", &r.pool), ("image", &r.image)] {
        if value.is_empty() || value.len() > 255 {
            return Err((field, format!("{field} must be 1 to 255 characters")));
        }
        validate_name(value, "-_.").map_err(|m| (field, m))?;
    }
    if !r.namespace.is_empty() {
        validate_name(&r.namespace, "-_.").map_err(|m| ("namespace", m))?;
    }
    validate_name(&r.client_id, "-_.").map_err(|m| ("client_id", m))?;
    if !(1..=600).contains(&r.op_timeout_secs) {
        return Err((
            "op_timeout_secs",
            format!("{} is not from 1 to 600 seconds", r.op_timeout_secs),
        ));
    }
    Ok(())
}

fn validate_name(name: &str, others: &str) -> Result<(), String> {
    if !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || others.contains(c))
    {
        return Ok(());
    }
    let quoted: Vec<String> = others.chars().map(|c| format!("'{c}'")).collect();
    let allowed = match quoted.split_last() {
        Some((last, [])) => format!("letters, digits and {last}"),
        Some((last, rest)) => format!("letters, digits, {} and {last}", rest.join(", ")),
        None => "letters and digits".into(),
    };
    Err(format!("invalid name {name:?}: use {allowed}"))
}

/// RFC 7143 §4.2.7: iqn., eui. and naa. names.
fn validate_iscsi_name(name: &str) -> Result<(), String> {
    let lower = name.to_ascii_lowercase();
    let ok = if let Some(rest) = lower.strip_prefix("iqn.") {
        rest.len() > 8
            && rest.as_bytes()[..7].iter().enumerate().all(|(i, c)| {
                if i == 4 {
                    *c == b'-'
                } else {
                    c.is_ascii_digit()
                }
            })
    } else if let Some(hex) = lower.strip_prefix("eui.") {
        hex.len() == 16 && hex.chars().all(|c| c.is_ascii_hexdigit())
    } else if let Some(hex) = lower.strip_prefix("naa.") {
        (hex.len() == 16 || hex.len() == 32) && hex.chars().all(|c| c.is_ascii_hexdigit())
    } else {
        false
    };
    if !ok || name.len() > 223 || name.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!(
            "{name:?} is not a valid iSCSI name (iqn.YYYY-MM.reversed.domain[:id], eui.<16 hex>, naa.<16 or 32 hex>)"
        ));
    }
    Ok(())
}

fn validate_auth(auth: &Auth) -> Result<(), (String, String)> {
    for (field, chap) in [("chap", &auth.chap), ("mutual_chap", &auth.mutual_chap)] {
        if let Some(c) = chap {
            if c.user.is_empty() {
                return Err((
                    format!("{field}.user"),
                    "the CHAP user name must not be empty".into(),
                ));
            }
            // RFC 7143 §12.1.3: at least 12 bytes (96 bits) of secret.
            if c.secret.len() < 12 || c.secret.len() > 255 {
                return Err((
                    format!("{field}.secret"),
                    "the CHAP secret must be 12 to 255 characters".into(),
                ));
            }
        }
    }
    if auth.mutual_chap.is_some() && auth.chap.is_none() {
        return Err((
            "mutual_chap".into(),
            "mutual CHAP needs chap credentials for the initiator too".into(),
        ));
    }
    if let (Some(a), Some(b)) = (&auth.chap, &auth.mutual_chap) {
        if a.secret == b.secret {
            return Err((
                "mutual_chap.secret".into(),
                "the mutual secret must differ from the initiator's secret".into(),
            ));
        }
    }
    Ok(())
}

fn validate_params(p: &IscsiParams) -> Result<(), (String, String)> {
    let range = |name: &str, v: Option<u32>, lo: u32, hi: u32| match v {
        Some(v) if v < lo || v > hi => {
            Err((name.to_string(), format!("{v} is outside {lo}..={hi}")))
        }
        _ => Ok(()),
    };
    range(
        "MaxRecvDataSegmentLength",
        p.max_recv_data_segment_length,
        512,
        16_777_215,
    )?;
    range("MaxBurstLength", p.max_burst_length, 512, 16_777_215)?;
    range("FirstBurstLength", p.first_burst_length, 512, 16_777_215)?;
    range("MaxOutstandingR2T", p.max_outstanding_r2t, 1, 65_535)?;
    range("QueueDepth", p.queue_depth, 1, 4096)?;
    range("NopInTimeout", p.nopin_timeout, 1, 3600)?;
    range(
        "BusyPollMicros",
        p.busy_poll_micros,
        0,
        MAX_BUSY_POLL_MICROS,
    )?;
    if let (Some(f), Some(m)) = (p.first_burst_length, p.max_burst_length) {
        if f > m {
            return Err((
                "FirstBurstLength".into(),
                format!("{f} exceeds MaxBurstLength {m}"),
            ));
        }
    }
    // Offering what the target would then negotiate down silently would mislead: refuse.
    if let Some(e) = p.error_recovery_level.filter(|e| *e != 0) {
        return Err((
            "ErrorRecoveryLevel".into(),
            format!("{e} is not supported: rtgt implements ErrorRecoveryLevel 0 (session recovery by the initiator)"),
        ));
    }
    if let Some(c) = p.max_connections.filter(|c| *c != 1) {
        return Err((
            "MaxConnections".into(),
            format!("{c} is not supported: rtgt serves one connection per session (use multipath for more paths)"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err_of(yaml: &str) -> (String, String) {
        match Config::from_yaml(yaml, Path::new("t.yaml")) {
            Err(ConfigError::Invalid { path, message, .. }) => (path, message),
            other => panic!("expected an invalid-config error, got {other:?}"),
        }
    }

    #[test]
    fn nvme_rdma_ports_keep_off_iser_and_srp_addresses() {
        let base = "backstores: [{name: d, type: null, size: 1MiB}]
targets:
  - name: iqn.2025-01.io.rtgt:t
    portal_groups: [{tag: 1, portals: ['192.0.2.1:3260']}]
srp: [{name: s, listen: ['192.0.2.1:5555']}]
nvme:
  ports:
";
        let with = |ports: &str| format!("{base}{ports}");
        // TCP and RDMA/CM are apart: both on 4420, and RDMA on iSCSI's TCP portal.
        let ok = with(
            "    - {id: 1, transport: tcp, listen: '192.0.2.1:4420'}
    - {id: 2, transport: rdma, listen: '192.0.2.1:4420'}
",
        );
        let c = Config::from_yaml(&ok, Path::new("t.yaml")).unwrap();
        assert_eq!(c.nvme.ports[1].transport, crate::nvme::NvmeTransport::Rdma);
        let (path, msg) = err_of(&with(
            "    - {id: 1, transport: rdma, listen: '192.0.2.1:3260'}\n",
        ));
        assert_eq!(path, "nvme.ports[0].listen");
        assert!(msg.contains("iSER portal"), "{msg}");
        let (path, msg) = err_of(&with(
            "    - {id: 1, transport: rdma, listen: '192.0.2.1:5555'}\n",
        ));
        assert_eq!(path, "nvme.ports[0].listen");
        assert!(msg.contains("SRP target port s"), "{msg}");
        let (path, _) = err_of(&with(
            "    - {id: 1, transport: rdma, listen: '192.0.2.1:4420'}
    - {id: 2, transport: rdma, listen: '192.0.2.1:4420'}
",
        ));
        assert_eq!(path, "nvme.ports[1].listen");
    }

    #[test]
    fn nvme_ports_in_capsule_data_sizes() {
        let base = "backstores: [{name: d, type: null, size: 1MiB}]
nvme:
  ports:
";
        let with = |ports: &str| format!("{base}{ports}");
        let c = Config::from_yaml(
            &with(
                "    - {id: 1, transport: tcp, listen: '192.0.2.1:4420'}
    - {id: 2, transport: rdma, listen: '192.0.2.1:4420'}
    - {id: 3, transport: tcp, listen: '192.0.2.1:4421', in_capsule_data_size: 0}
    - {id: 4, transport: rdma, listen: '192.0.2.1:4421', in_capsule_data_size: 16384}
",
            ),
            Path::new("t.yaml"),
        )
        .unwrap();
        let sizes: Vec<u32> = c.nvme.ports.iter().map(|p| p.in_capsule()).collect();
        assert_eq!(sizes, [128 << 10, 8 << 10, 0, 16 << 10]);
        for (port, what) in [
            (
                "{id: 1, listen: '192.0.2.1:4420', in_capsule_data_size: 4100}",
                "multiple of 16",
            ),
            (
                "{id: 1, listen: '192.0.2.1:4420', in_capsule_data_size: 1048592}",
                "at most 1048576 on tcp",
            ),
            (
                "{id: 1, transport: rdma, listen: '192.0.2.1:4420', in_capsule_data_size: 32768}",
                "at most 16384 on rdma",
            ),
        ] {
            let (path, msg) = err_of(&with(&format!("    - {port}\n")));
            assert_eq!(path, "nvme.ports[0].in_capsule_data_size");
            assert!(msg.contains(what), "{msg}");
        }
    }

    #[test]
    fn packaged_config_is_the_default_with_a_backstore_root() {
        let packaged = Config::from_yaml(
            include_str!("../../deploy/rtgt.yaml"),
            Path::new("deploy/rtgt.yaml"),
        )
        .unwrap();
        let mut expected = Config::embedded_default();
        expected.policy.backstore_roots = vec!["/var/lib/rtgt/backstores".into()];
        assert_eq!(packaged, expected);
    }

    #[test]
    fn cache_mode_defaults_by_kind_and_is_shown_resolved() {
        let doc = |extra: &str| {
            format!(
                "backstores:\n  - {{name: f, type: file, path: f.img, size: 1MiB{extra}}}\n  - {{name: b, type: block, path: /dev/sdx{extra}}}\n  - {{name: r, type: ramdisk, size: 1MiB}}\n"
            )
        };
        let c = Config::from_yaml(&doc(""), Path::new("t.yaml")).unwrap();
        let direct: Vec<_> = c.backstores.iter().map(|b| b.direct).collect();
        assert_eq!(direct, [Some(false), Some(true), None]);
        assert!(c.backstores.iter().all(|b| b.write_cache));
        // The export spells the effective value; reading it back gives the same configuration.
        let yaml = c.to_yaml();
        assert_eq!(yaml.matches("direct: false").count(), 1, "{yaml}");
        assert_eq!(yaml.matches("direct: true").count(), 1, "{yaml}");
        assert_eq!(Config::from_yaml(&yaml, Path::new("t.yaml")).unwrap(), c);

        let c = Config::from_yaml(&doc(", direct: true"), Path::new("t.yaml")).unwrap();
        assert_eq!(c.backstores[0].direct, Some(true));
        let c = Config::from_yaml(&doc(", direct: false"), Path::new("t.yaml")).unwrap();
        assert_eq!(c.backstores[1].direct, Some(false));
        assert!(!c.backstores[1].direct());

        for bad in ["maybe", "1", "yes", "'true'"] {
            let (path, msg) = err_of(&doc(&format!(", direct: {bad}")));
            assert_eq!(path, "backstores[0].direct", "{bad}");
            assert!(msg.contains("expected a boolean"), "{bad}: {msg}");
        }
        let (path, msg) =
            err_of("backstores:\n  - {name: r, type: null, size: 1MiB, direct: true}\n");
        assert_eq!(path, "backstores[0].direct");
        assert!(msg.contains("file and block"), "{msg}");

        let c = Config::embedded_default();
        assert_eq!(c.backstores[0].kind, BackstoreKind::File);
        assert!(!c.backstores[0].direct() && c.backstores[0].write_cache);
    }

    #[test]
    fn backstore_roots_are_plain_absolute_paths() {
        for (root, why) in [
            ("srv/luns", "absolute"),
            ("/srv/../etc", "`..`"),
            ("/srv/my luns", "whitespace"),
            ("/srv/%n", "`%`"),
        ] {
            let (path, msg) = err_of(&format!("policy: {{backstore_roots: ['{root}']}}\n"));
            assert_eq!(path, "policy.backstore_roots[0]");
            assert!(msg.contains(why), "{root}: {msg}");
        }
        Config::from_yaml(
            "policy: {backstore_roots: [/srv/luns]}\n",
            Path::new("t.yaml"),
        )
        .unwrap();
    }

    #[test]
    fn unsupported_session_keys_are_refused() {
        let doc = |params: &str| {
            format!(
                "targets:\n  - name: iqn.2025-01.io.rtgt:t\n    portal_groups:\n      - tag: 1\n        portals: ['127.0.0.1:3260']\n        params: {{{params}}}\n"
            )
        };
        let (path, msg) = err_of(&doc("MaxConnections: 2"));
        assert!(path.ends_with("params.MaxConnections"), "{path}");
        assert!(msg.contains("one connection per session"), "{msg}");
        let (path, msg) = err_of(&doc("ErrorRecoveryLevel: 1"));
        assert!(path.ends_with("params.ErrorRecoveryLevel"), "{path}");
        assert!(msg.contains("ErrorRecoveryLevel 0"), "{msg}");
        Config::from_yaml(
            &doc("MaxConnections: 1, ErrorRecoveryLevel: 0"),
            Path::new("t.yaml"),
        )
        .unwrap();
    }

    #[test]
    fn a_secret_of_another_type_is_not_repeated() {
        let (path, msg) =
            err_of("discovery:\n  auth:\n    chap: {user: u, secret: 918273645546372819}\n");
        assert_eq!(path, "discovery.auth.chap.secret");
        assert!(!msg.contains("918273645"), "{msg}");
        assert!(msg.contains("must be a string"), "{msg}");
        for body in [
            r#"{"user":"u","secret":918273645546372819}"#,
            r#"{"user":"u","secret":9182736455.46372819}"#,
        ] {
            let e = serde_json::from_str::<Chap>(body).unwrap_err().to_string();
            assert!(!e.contains("918273645"), "{e}");
            assert!(e.contains("must be a string"), "{e}");
        }
    }

    #[test]
    fn portal_group_iser_switch() {
        let c = Config::embedded_default();
        assert!(c.targets[0].portal_groups[0].iser, "iSER is on by default");
        let y = c.to_yaml();
        assert!(!y.contains("iser"), "the default is not written out");
        let mut off = c.clone();
        off.targets[0].portal_groups[0].iser = false;
        let y = off.to_yaml();
        assert!(y.contains("iser: false"));
        let back = Config::from_yaml(&y, Path::new("t.yaml")).unwrap();
        assert!(!back.targets[0].portal_groups[0].iser);
    }

    #[test]
    fn rdma_section() {
        let c = Config::embedded_default();
        assert_eq!(c.rdma, Rdma::default());
        assert!(c.rdma.enabled);
        let c = Config::from_yaml(
            "rdma:\n  enabled: false\n  addresses: [192.0.2.1, 'fd00::1']\n  eth_mtu: 9000\n",
            Path::new("t.yaml"),
        )
        .unwrap();
        assert!(!c.rdma.enabled);
        assert_eq!(c.rdma.addresses.len(), 2);
        assert_eq!(c.rdma.eth_mtu, 9000);
        let c = Config::from_yaml("rdma: {}\n", Path::new("t.yaml")).unwrap();
        assert_eq!(c.rdma, Rdma::default());
        assert_eq!(
            err_of("rdma: {eth_mtu: 300}\n"),
            ("rdma.eth_mtu".into(), "300 is outside 336..=65535".into())
        );
        assert_eq!(c.rdma.busy_poll_micros, 50);
        assert_eq!(c.rdma.shards, None);
        assert!(c.rdma.engine_threads() >= 1);
        assert_eq!(
            err_of("rdma: {shards: 65}\n"),
            ("rdma.shards".into(), "65 is more than 64".into())
        );
        assert_eq!(
            err_of("rdma: {busy_poll_micros: 10001}\n"),
            (
                "rdma.busy_poll_micros".into(),
                "10001 is more than 10000".into()
            )
        );
        assert_eq!(
            err_of("rdma: {addresses: [192.0.2.1, 192.0.2.1]}\n").0,
            "rdma.addresses[1]"
        );
        assert_eq!(
            err_of("rdma: {addresses: [0.0.0.0, 192.0.2.1]}\n").0,
            "rdma.addresses[0]"
        );
        assert_eq!(
            err_of("rdma: {addresses: [224.0.0.1]}\n").0,
            "rdma.addresses[0]"
        );
        assert_eq!(err_of("rdma: {port: 1}\n").0, "rdma.port");
    }

    #[test]
    fn embedded_default_is_valid() {
        let c = Config::embedded_default();
        assert_eq!(c.backstores.len(), 1);
        assert_eq!(c.backstores[0].size, Some(ByteSize(1 << 30)));
        let g = &c.targets[0].portal_groups[0];
        assert!(g.allow_any_initiator);
        assert_eq!(g.luns[0].lun, 0);
    }

    #[test]
    fn sizes() {
        assert_eq!(ByteSize::parse("1GiB"), Ok(ByteSize(1 << 30)));
        assert_eq!(ByteSize::parse("512M"), Ok(ByteSize(512 << 20)));
        assert_eq!(ByteSize::parse("4096"), Ok(ByteSize(4096)));
        assert!(ByteSize::parse("1XB").is_err());
        assert!(ByteSize::parse("99999999999999T").is_err());
        assert_eq!(ByteSize(3 << 30).to_string(), "3GiB");
        assert_eq!(ByteSize(1000).to_string(), "1000");
    }

    #[test]
    fn round_trip() {
        let c = Config::embedded_default();
        let again = Config::from_yaml(&c.to_yaml(), Path::new("x")).unwrap();
        assert_eq!(c, again);
    }

    #[test]
    fn unknown_field_names_its_path() {
        let (path, msg) =
            err_of("backstores:\n  - name: a\n    type: null\n    size: 1M\n    sise: 2\n");
        assert_eq!(path, "backstores[0].sise");
        assert!(msg.contains("sise"), "{msg}");
    }

    #[test]
    fn bad_type_names_its_path() {
        let (path, msg) = err_of("backstores:\n  - name: a\n    type: tape\n");
        assert_eq!(path, "backstores[0].type");
        assert!(msg.contains("tape"), "{msg}");
    }

    #[test]
    fn unknown_backstore_reference() {
        let (path, msg) = err_of(
            "targets:\n  - name: iqn.2025-01.io.rtgt:t\n    portal_groups:\n      - tag: 1\n        portals: ['0.0.0.0:3260']\n        luns: [{lun: 0, backstore: nope}]\n",
        );
        assert_eq!(path, "targets[0].portal_groups[0].luns[0].backstore");
        assert!(msg.contains("nope"));
    }

    #[test]
    fn bad_block_size_and_size() {
        let (path, _) =
            err_of("backstores:\n  - {name: a, type: null, size: 1M, block_size: 1024}\n");
        assert_eq!(path, "backstores[0].block_size");
        let (path, _) = err_of("backstores:\n  - {name: a, type: ramdisk, size: 1000}\n");
        assert_eq!(path, "backstores[0].size");
        let (path, _) = err_of("backstores:\n  - {name: a, type: file}\n");
        assert_eq!(path, "backstores[0].path");
    }

    #[test]
    fn physical_block_size_removable_and_sanitize_rate() {
        for bad in ["256", "1000", "128k"] {
            let (path, _) = err_of(&format!(
                "backstores:\n  - {{name: a, type: null, size: 1M, physical_block_size: {bad}}}\n"
            ));
            assert_eq!(path, "backstores[0].physical_block_size");
        }
        let (path, _) = err_of(
            "backstores:\n  - {name: a, type: null, size: 1M, block_size: 4096, physical_block_size: 512}\n",
        );
        assert_eq!(path, "backstores[0].physical_block_size");
        let c = Config::from_yaml(
            "backstores:\n  - {name: a, type: null, size: 1M, physical_block_size: 4k, removable: true, sanitize_rate: 64MiB}\n",
            Path::new("t.yaml"),
        )
        .unwrap();
        let b = &c.backstores[0];
        assert_eq!(b.physical_block_size, Some(ByteSize(4096)));
        assert!(b.removable);
        assert_eq!(b.sanitize_rate, Some(ByteSize(64 << 20)));
        let c = Config::from_yaml(
            "backstores:\n  - {name: a, type: null, size: 1M}\n",
            Path::new("t.yaml"),
        )
        .unwrap();
        let b = &c.backstores[0];
        assert_eq!(
            (b.physical_block_size, b.removable, b.sanitize_rate),
            (None, false, None)
        );
        assert!(!c.to_yaml().contains("removable"));
    }

    #[test]
    fn bad_names_and_chap() {
        let (path, _) = err_of("targets:\n  - name: target1\n    portal_groups: []\n");
        assert_eq!(path, "targets[0].name");
        let (path, _) = err_of("discovery:\n  auth:\n    chap: {user: u, secret: short}\n");
        assert_eq!(path, "discovery.auth.chap.secret");
        let (path, _) = err_of(
            "targets:\n  - name: iqn.2025-01.io.rtgt:t\n    portal_groups:\n      - tag: 1\n        portals: ['0.0.0.0:3260']\n        params: {FirstBurstLength: 9000, MaxBurstLength: 4096}\n",
        );
        assert_eq!(path, "targets[0].portal_groups[0].params.FirstBurstLength");
        let pg = "targets:\n  - name: iqn.2025-01.io.rtgt:t\n    portal_groups:\n      - tag: 1\n        portals: ['0.0.0.0:3260']\n        params: ";
        let (path, message) = err_of(&format!("{pg}{{BusyPollMicros: 20000}}\n"));
        assert_eq!(
            (path.as_str(), message.as_str()),
            (
                "targets[0].portal_groups[0].params.BusyPollMicros",
                "20000 is outside 0..=10000"
            )
        );
        let c = Config::from_yaml(
            &format!("{pg}{{BusyPollMicros: 0, ZeroCopyReads: false}}\n"),
            Path::new("t.yaml"),
        )
        .unwrap();
        let p = &c.targets[0].portal_groups[0].params;
        assert_eq!(
            (p.busy_poll_micros, p.zero_copy_reads),
            (Some(0), Some(false))
        );
    }

    #[test]
    fn acl_mapped_lun_must_exist() {
        let (path, _) = err_of(
            "backstores: [{name: a, type: null, size: 1M}]\ntargets:\n  - name: iqn.2025-01.io.rtgt:t\n    portal_groups:\n      - tag: 1\n        portals: ['0.0.0.0:3260']\n        luns: [{lun: 0, backstore: a}]\n        acls:\n          - initiator: iqn.1994-05.com.redhat:h\n            mapped_luns: [{lun: 0, tpg_lun: 3}]\n",
        );
        assert_eq!(
            path,
            "targets[0].portal_groups[0].acls[0].mapped_luns[0].tpg_lun"
        );
    }

    #[test]
    fn lun_and_acl_lists_are_checked_alike_with_each_fabric_wording() {
        let base = "backstores: [{name: a, type: null, size: 1M}]\n";
        let tpg = |body: &str| {
            format!("{base}targets:\n  - name: iqn.2025-01.io.rtgt:t\n    portal_groups:\n      - {{tag: 1, portals: ['0.0.0.0:3260'], {body}}}\n")
        };
        let srp = |body: &str| format!("{base}srp:\n  - {{name: p, {body}}}\n");
        let g = "targets[0].portal_groups[0]";
        let iscsi = "iqn.1994-05.com.redhat:h";
        let port = "'0x0000000000000000505400fffe123403'";
        for (doc, path, message) in [
            (
                tpg("luns: [{lun: 16384, backstore: a}]"),
                format!("{g}.luns[0].lun"),
                "LUN 16384 is out of range (0-16383)",
            ),
            (
                tpg("luns: [{lun: 1, backstore: a}, {lun: 1, backstore: a}]"),
                format!("{g}.luns[1].lun"),
                "LUN 1 is listed twice",
            ),
            (
                srp("luns: [{lun: 16384, backstore: a}]"),
                "srp[0].luns[0].lun".into(),
                "LUN 16384 is out of range (0-16383) or listed twice",
            ),
            (
                srp("luns: [{lun: 1, backstore: a}, {lun: 1, backstore: a}]"),
                "srp[0].luns[1].lun".into(),
                "LUN 1 is out of range (0-16383) or listed twice",
            ),
            (
                tpg("luns: [{lun: 0, backstore: b}]"),
                format!("{g}.luns[0].backstore"),
                "unknown backstore \"b\"",
            ),
            (
                tpg(&format!("acls: [{{initiator: {iscsi}}}, {{initiator: {}}}]", iscsi.to_uppercase())),
                format!("{g}.acls[1].initiator"),
                "duplicate ACL for \"IQN.1994-05.COM.REDHAT:H\"",
            ),
            (
                srp(&format!("acls: [{{initiator: {port}}}, {{initiator: {}}}]", port.to_uppercase().replace("0X", "0x"))),
                "srp[0].acls[1].initiator".into(),
                "duplicate ACL for \"0x0000000000000000505400FFFE123403\"",
            ),
            (
                tpg(&format!("acls: [{{initiator: {iscsi}, auth: {{chap: {{user: u, secret: short}}}}}}]")),
                format!("{g}.acls[0].auth.chap.secret"),
                "the CHAP secret must be 12 to 255 characters",
            ),
            (
                tpg(&format!("luns: [{{lun: 0, backstore: a}}], acls: [{{initiator: {iscsi}, mapped_luns: [{{lun: 0, tpg_lun: 0}}, {{lun: 0, tpg_lun: 0}}]}}]")),
                format!("{g}.acls[0].mapped_luns[1].lun"),
                "LUN 0 is out of range or listed twice",
            ),
            (
                tpg(&format!("acls: [{{initiator: {iscsi}, mapped_luns: [{{lun: 0, tpg_lun: 2}}]}}]")),
                format!("{g}.acls[0].mapped_luns[0].tpg_lun"),
                "the portal group has no LUN 2",
            ),
            (
                srp(&format!("acls: [{{initiator: {port}, mapped_luns: [{{lun: 0, tpg_lun: 2}}]}}]")),
                "srp[0].acls[0].mapped_luns[0].tpg_lun".into(),
                "the SRP port has no LUN 2",
            ),
            (
                srp("acls: [{initiator: '0x12'}]"),
                "srp[0].acls[0].initiator".into(),
                "\"0x12\" is not an SRP initiator port identifier (0x and 32 hex digits)",
            ),
        ] {
            assert_eq!(err_of(&doc), (path, message.to_string()), "{doc}");
        }
    }

    #[test]
    fn names_say_what_they_may_hold() {
        assert_eq!(
            err_of("backstores: [{name: 'a b', type: null, size: 1M}]\n"),
            (
                "backstores[0].name".into(),
                "invalid name \"a b\": use letters, digits, '-', '_' and '.'".into()
            )
        );
        assert_eq!(
            err_of("srp: [{name: ''}]\n"),
            (
                "srp[0].name".into(),
                "invalid name \"\": use letters, digits, '-', '_', '.' and ':'".into()
            )
        );
        assert_eq!(validate_name("a", ""), Ok(()));
        assert_eq!(
            validate_name("a.", "_"),
            Err("invalid name \"a.\": use letters, digits and '_'".into())
        );
    }

    #[test]
    fn luns_of_every_port() {
        let c = Config::from_yaml(
            "backstores: [{name: a, type: null, size: 1M}]\ntargets:\n  - name: iqn.2025-01.io.rtgt:t\n    portal_groups:\n      - {tag: 2, portals: ['0.0.0.0:3260'], luns: [{lun: 0, backstore: a}, {lun: 1, backstore: a}]}\nsrp: [{name: p0, luns: [{lun: 7, backstore: a}]}]\n",
            Path::new("t.yaml"),
        )
        .unwrap();
        let luns: Vec<_> = c.port_luns().map(|(port, l)| (port, l.lun)).collect();
        assert_eq!(
            luns,
            [
                ("iqn.2025-01.io.rtgt:t portal group 2".to_string(), 0),
                ("iqn.2025-01.io.rtgt:t portal group 2".to_string(), 1),
                ("SRP target port p0".to_string(), 7),
            ]
        );
    }

    #[test]
    fn secrets_redacted_and_restored() {
        let text = "discovery:\n  auth:\n    chap: {user: d, secret: discovery-secret}\n";
        let c = Config::from_yaml(text, Path::new("t.yaml")).unwrap();
        assert!(!format!("{c:?}").contains("discovery-secret"));
        let mut r = c.redacted();
        assert_eq!(r.discovery.auth.chap.as_ref().unwrap().secret, REDACTED);
        assert!(!r.to_yaml().contains("discovery-secret"));
        r.restore_secrets(&c);
        assert_eq!(r, c);
        // Another user does not inherit the secret.
        let mut other = c.redacted();
        other.discovery.auth.chap.as_mut().unwrap().user = "e".into();
        other.restore_secrets(&c);
        assert_eq!(other.discovery.auth.chap.as_ref().unwrap().secret, REDACTED);
        assert!(other.validate().is_err());
    }

    #[test]
    fn api_section_and_ramdisk_limit() {
        let c = Config::from_yaml(
            "api: {listen: ['0.0.0.0:9000'], socket: false}\n",
            Path::new("t.yaml"),
        )
        .unwrap();
        assert_eq!(c.api.listen[0].port(), 9000);
        assert!(!c.api.socket);
        assert_eq!(
            Config::default().api.listen[0].to_string(),
            "127.0.0.1:8080"
        );
        assert!(!Config::default().to_yaml().contains("api"));
        let (path, _) = err_of("backstores:\n  - {name: a, type: ramdisk, size: 2TiB}\n");
        assert_eq!(path, "backstores[0].size");
    }

    #[test]
    fn save_is_atomic_and_loadable() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("rtgt.yaml");
        let c = Config::embedded_default();
        c.save(&file).unwrap();
        assert_eq!(Config::load(&file).unwrap(), c);
        assert!(!dir.path().join(".rtgt.yaml.tmp").exists());
        use std::os::unix::fs::PermissionsExt;
        let mode = |f: &Path| std::fs::metadata(f).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&file), 0o600, "a new file holding secrets is private");
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o640)).unwrap();
        c.save(&file).unwrap();
        assert_eq!(mode(&file), 0o640, "an existing file keeps its mode");
    }

    #[test]
    fn srp_ports() {
        let c = Config::embedded_default();
        assert_eq!(c.srp.len(), 1);
        assert_eq!(
            c.srp[0].listen,
            vec![SocketAddr::from(([0, 0, 0, 0], 5555))]
        );
        assert!(c.srp[0].allow_any_initiator);
        assert_eq!(c.srp[0].luns[0].backstore, "disk0");
        let base = "backstores: [{name: a, type: null, size: 1M}]\nsrp:\n";
        let ok = Config::from_yaml(
            &format!("{base}  - name: p\n    id_ext: '0x0002c90300001111'\n    ioc_guid: 0002c90300002222\n    luns: [{{lun: 0, backstore: a}}]\n    acls:\n      - initiator: '0x0000000000000000505400fffe123403'\n        mapped_luns: [{{lun: 1, tpg_lun: 0}}]\n"),
            Path::new("t.yaml"),
        )
        .unwrap();
        assert_eq!(
            parse_hex64(ok.srp[0].id_ext.as_deref().unwrap()),
            Some(0x0002_c903_0000_1111)
        );
        assert_eq!(ok.srp[0].listen[0].port(), 5555, "default listen address");
        for (yaml, path) in [
            ("  - {name: p, id_ext: '12345'}\n", "srp[0].id_ext"),
            ("  - {name: p, ioc_guid: '0xzz02c90300002222'}\n", "srp[0].ioc_guid"),
            ("  - {name: p, listen: []}\n", "srp[0].listen"),
            ("  - {name: 'p q'}\n", "srp[0].name"),
            ("  - {name: p}\n  - {name: p}\n", "srp[1].name"),
            ("  - {name: p, luns: [{lun: 0, backstore: b}]}\n", "srp[0].luns[0].backstore"),
            ("  - {name: p, acls: [{initiator: 'iqn.2025-01.x:y'}]}\n", "srp[0].acls[0].initiator"),
            (
                "  - {name: p, luns: [{lun: 0, backstore: a}], acls: [{initiator: '0x0000000000000000505400fffe123403', mapped_luns: [{lun: 0, tpg_lun: 4}]}]}\n",
                "srp[0].acls[0].mapped_luns[0].tpg_lun",
            ),
            ("  - {name: p, listn: []}\n", "srp[0].listn"),
        ] {
            assert_eq!(err_of(&format!("{base}{yaml}")).0, path, "{yaml}");
        }
    }

    #[test]
    fn alua_ports_groups_and_states() {
        use rtgt_scsi::core::PortIds;
        use rtgt_scsi::AccessState;
        // Without groups: every port a group of its own; SRP ports take the lowest free
        // relative ports after the portal groups' tags.
        let c = Config::embedded_default();
        let ports = c.target_ports();
        let ids: Vec<PortIds> = ports.iter().map(|p| p.ids).collect();
        assert_eq!(ids, [PortIds::alone(1), PortIds::alone(2)]);
        assert!(c.lu_alua(&ports, "disk0").groups.is_empty());

        let base = "backstores: [{name: a, type: null, size: 1M}, {name: b, type: null, size: 1M}]
targets:
  - name: iqn.2025-01.io.rtgt:t
    portal_groups:
      - {tag: 1, portals: ['127.0.0.1:3260'], alua_group: 1, luns: [{lun: 0, backstore: a}, {lun: 1, backstore: b}]}
      - {tag: 2, portals: ['127.0.0.2:3260'], alua_group: 2, luns: [{lun: 0, backstore: a}]}
srp:
  - {name: p0, luns: [{lun: 0, backstore: a}]}
  - {name: p1, relative_port: 40, alua_group: 2, luns: [{lun: 0, backstore: b}]}
";
        let groups = "alua:
  transition_secs: 5
  groups:
    - {id: 1, preferred: true}
    - {id: 2, state: standby, explicit: true, remote_ports: [3, 7], backstores: [{backstore: b, state: active_non_optimized}]}
";
        let c = Config::from_yaml(&format!("{base}{groups}"), Path::new("t.yaml")).unwrap();
        let ports = c.target_ports();
        let ids: Vec<(u16, u16)> = ports
            .iter()
            .map(|p| (p.ids.relative_port, p.ids.port_group))
            .collect();
        // p0 names no group: the default group 0; its relative port skips 1, 2 (tags),
        // 3 (remote) and 40 (p1's own).
        assert_eq!(ids, [(1, 1), (2, 2), (4, 0), (40, 2)]);
        let lu = c.lu_alua(&ports, "a");
        assert_eq!(lu.transition_secs, 5);
        let short: Vec<(u16, Vec<u16>, AccessState, bool, bool)> = lu
            .groups
            .iter()
            .map(|g| {
                (
                    g.id,
                    g.relative_ports.clone(),
                    g.state,
                    g.preferred,
                    g.explicit,
                )
            })
            .collect();
        assert_eq!(
            short,
            [
                (0, vec![4], AccessState::ActiveOptimized, false, false),
                (1, vec![1], AccessState::ActiveOptimized, true, false),
                (2, vec![2, 3, 7], AccessState::Standby, false, true),
            ]
        );
        let lu = c.lu_alua(&ports, "b");
        assert_eq!(lu.groups.len(), 2, "no port of the default group maps b");
        assert_eq!(lu.groups[1].relative_ports, [40, 3, 7]);
        assert_eq!(lu.groups[1].state, AccessState::ActiveNonOptimized);
        assert_eq!(c.conflict(&c), None);

        // 409s: no active group left for a; a group with explicit changes only moved.
        let mut none = c.clone();
        none.alua.groups[0].state = AccessState::Standby;
        none.targets[0].portal_groups.remove(0);
        none.srp.remove(0);
        let why = none.conflict(&c).unwrap();
        assert!(
            why.contains("backstore \"a\" would have no active"),
            "{why}"
        );
        assert!(why.contains("group 2 standby"), "{why}");
        let mut explicit_only = c.clone();
        explicit_only.alua.groups[1].implicit = false;
        let mut moved = explicit_only.clone();
        moved.alua.groups[1].state = AccessState::ActiveOptimized;
        assert!(moved
            .conflict(&explicit_only)
            .unwrap()
            .contains("only explicit"));

        // Bad sections and ports.
        for (yaml, path) in [
            ("alua: {groups: [{id: 1}, {id: 1}, {id: 2}]}\n", "alua.groups[1].id"),
            ("alua: {groups: [{id: 1, remote_ports: [0]}, {id: 2}]}\n", "alua.groups[0].remote_ports[0]"),
            ("alua: {groups: [{id: 1, remote_ports: [5]}, {id: 2, remote_ports: [5]}]}\n", "alua.groups[1].remote_ports[0]"),
            ("alua: {groups: [{id: 1, backstores: [{backstore: z, state: standby}]}, {id: 2}]}\n", "alua.groups[0].backstores[0].backstore"),
            ("alua: {groups: [{id: 1}]}\n", "targets[0].portal_groups[1].alua_group"),
            ("alua: {groups: [{id: 1, remote_ports: [40]}, {id: 2}]}\n", "srp[1].relative_port"),
            ("alua: {groups: [{id: 1, state: asleep}, {id: 2}]}\n", "alua.groups[0].state"),
        ] {
            assert_eq!(err_of(&format!("{base}{yaml}")).0, path, "{yaml}");
        }
        // Without groups a port may not name one.
        assert_eq!(err_of(base).0, "targets[0].portal_groups[0].alua_group");
        // Only files and block devices are shared with another rtgtd.
        assert_eq!(
            err_of("backstores: [{name: r, type: ramdisk, size: 1M, shared: {pr_file: r.pr}}]\n").0,
            "backstores[0].shared"
        );
        let c = Config::from_yaml(
            "backstores: [{name: f, type: file, path: f.img, size: 1M, shared: {pr_file: f.pr}}]\n",
            Path::new("t.yaml"),
        )
        .unwrap();
        assert_eq!(
            c.backstores[0].shared.as_ref().unwrap().pr_file,
            Path::new("f.pr")
        );
        // The fuzz seed: two targets with a portal group 1 each, one of them sharing a LUN
        // and so given its own relative port.
        let seed = include_str!("../../fuzz/seeds/config_yaml/alua.yaml");
        let c = Config::from_yaml(seed, Path::new("alua.yaml")).unwrap();
        let mut shared = c.clone();
        shared.targets[1].portal_groups[0].relative_port = None;
        assert_eq!(
            shared.validate().unwrap_err().0,
            "targets[1].portal_groups[0].relative_port"
        );
    }

    #[test]
    fn rbd_backstores() {
        let c = Config::from_yaml(
            include_str!("../../fuzz/seeds/config_yaml/rbd.yaml"),
            Path::new("rbd.yaml"),
        )
        .unwrap();
        let r = c.backstores[0].rbd.as_ref().unwrap();
        assert_eq!(
            (r.pool.as_str(), r.image.as_str(), r.client_id.as_str()),
            ("rbd", "disk0", "admin")
        );
        assert_eq!(r.ceph_conf, Path::new("/etc/ceph/ceph.conf"));
        assert_eq!((r.op_timeout_secs, r.keyring.as_ref()), (30, None));
        let full = &c.backstores[1].rbd.as_ref().unwrap();
        assert_eq!(
            (
                full.pool.as_str(),
                full.namespace.as_str(),
                full.client_id.as_str()
            ),
            ("vms", "tenant1", "rtgt")
        );
        assert!(!c.backstores[0].direct());
        // What an rbd backstore must have, and must not.
        let bad = [
            ("{name: a, type: rbd}", "backstores[0].rbd"),
            (
                "{name: a, type: rbd, size: 1M, rbd: {image: i}}",
                "backstores[0].size",
            ),
            (
                "{name: a, type: rbd, path: x, rbd: {image: i}}",
                "backstores[0].path",
            ),
            (
                "{name: a, type: rbd, direct: true, rbd: {image: i}}",
                "backstores[0].direct",
            ),
            (
                "{name: a, type: rbd, rbd: {image: i}, shared: {pr_file: p}}",
                "backstores[0].shared",
            ),
            (
                "{name: a, type: null, size: 1M, rbd: {image: i}}",
                "backstores[0].rbd",
            ),
            (
                "{name: a, type: rbd, rbd: {image: 'a/b'}}",
                "backstores[0].rbd.image",
            ),
            (
                "{name: a, type: rbd, rbd: {image: ''}}",
                "backstores[0].rbd.image",
            ),
            (
                "{name: a, type: rbd, rbd: {pool: 'p@', image: i}}",
                "backstores[0].rbd.pool",
            ),
            (
                "{name: a, type: rbd, rbd: {image: i, namespace: 'x y'}}",
                "backstores[0].rbd.namespace",
            ),
            (
                "{name: a, type: rbd, rbd: {image: i, client_id: 'a b'}}",
                "backstores[0].rbd.client_id",
            ),
            (
                "{name: a, type: rbd, rbd: {image: i, op_timeout_secs: 0}}",
                "backstores[0].rbd.op_timeout_secs",
            ),
            (
                "{name: a, type: rbd, rbd: {image: i, op_timeout_secs: 601}}",
                "backstores[0].rbd.op_timeout_secs",
            ),
        ];
        for (b, path) in bad {
            assert_eq!(err_of(&format!("backstores: [{b}]\n")).0, path, "{b}");
        }
        // Unknown fields are refused.
        let (path, msg) =
            err_of("backstores: [{name: a, type: rbd, rbd: {image: i, monitors: x}}]\n");
        assert!(path.starts_with("backstores[0]"), "{path}: {msg}");
    }
}
