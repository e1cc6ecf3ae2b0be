//! Runtime objects from the configuration: backstores opened under the path policy, logical
//! units and targets. The daemon builds its first state here and the control plane every
//! later one.

use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rtgt_api::alua::{ids_of, PortKey, TargetPort};
use rtgt_api::config::{self, BackstoreKind, Config};
use rtgt_backstore::policy::{BackstoreRoots, FileRequest, PolicyError};
use rtgt_backstore::{
    Backstore, BufPool, FileBackstore, FileOptions, NullBackstore, RamBackstore, SharedFile,
    SharedState,
};
use rtgt_ceph::{ClusterSpec, RadosState, RbdBackstore, RbdOptions};
use rtgt_rdma_channel::cm::Provider;
use rtgt_transport::hca::{Hca, HcaConfig};
use tracing::{info, warn};

use rtgt_scsi::core::{self, PortIds, Registry};
use rtgt_scsi::{Device, DeviceConfig, DeviceRegistry, LunMap};

/// Memory for data buffers in flight, shared by every session (back-pressure beyond it).
const BUFFER_BUDGET: usize = 256 << 20;

#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error(transparent)]
    Config(#[from] rtgt_api::ConfigError),
    #[error("state directory {dir}: {source}")]
    StateDir {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("backstore {name}: {message}")]
    Backstore { name: String, message: String },
    #[error("alua: {0}")]
    Alua(String),
    /// The backstore path policy refused the path, or the file could not be opened.
    #[error("backstore {name}: {source}")]
    Policy {
        name: String,
        #[source]
        source: PolicyError,
    },
    #[error("portal {addr}: cannot listen: {source}")]
    Listen {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Portal(rtgt_api::ControlError),
    /// The RDMA provider asked for could not start.
    #[error("rdma: {0}")]
    Rdma(String),
    /// The administration API could not start.
    #[error(transparent)]
    Api(Box<dyn std::error::Error + Send + Sync>),
}

/// An error with its sources, for log lines an operator can act on.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(src) = cur {
        let text = src.to_string();
        if !s.ends_with(&text) {
            s.push_str(": ");
            s.push_str(&text);
        }
        cur = src.source();
    }
    s
}

/// What rtgtd was asked to serve.
pub struct Options {
    pub config: Option<PathBuf>,
    pub state_dir: PathBuf,
}

/// The running target built from a configuration.
pub struct Running {
    pub registry: Arc<Registry>,
    pub devices: BTreeMap<String, Arc<Device>>,
    pub backstores: BTreeMap<String, Arc<dyn Backstore>>,
    pub portals: Vec<SocketAddr>,
    /// Portals of the groups that also serve iSER (`iser: true`).
    pub iser_portals: Vec<SocketAddr>,
    pub pool: Arc<BufPool>,
    /// The RDMA provider iSER and SRP run on (the soft-RoCE device on UDP 4791 and its
    /// connection manager, or rdma-core's devices), when enabled and up.
    pub rdma: Option<Provider>,
    pub device_registry: Arc<DeviceRegistry>,
}

/// Brings up the RDMA provider of `config.rdma`. The soft engine failing to start (port 4791
/// taken, e.g. by the rdma_rxe module, or no permission) is not fatal: rtgtd serves iSCSI
/// over TCP without it. `verbs` was asked for by name, so rdma-core missing or an address
/// no RDMA device has is a startup error that names it.
fn start_rdma(rdma: &config::Rdma, pool: &Arc<BufPool>) -> Result<Option<Provider>, DaemonError> {
    if !rdma.enabled {
        info!("RDMA disabled by the configuration");
        return Ok(None);
    }
    if rdma.provider == config::RdmaProvider::Verbs {
        let p = Provider::verbs(
            pool,
            &rdma.addresses,
            std::time::Duration::from_micros(rdma.busy_poll_micros.into()),
        )
        .map_err(|e| DaemonError::Rdma(e.to_string()))?;
        let addrs: Vec<String> = p
            .devices_by_addr()
            .iter()
            .map(|(a, d)| format!("{a} ({d})"))
            .collect();
        info!(addresses = %addrs.join(" "), "RDMA through rdma-core (provider verbs)");
        return Ok(Some(p));
    }
    let Some(hca) = start_soft(rdma) else {
        return Ok(None);
    };
    match Provider::soft(hca.clone(), pool) {
        Ok(p) => Ok(Some(p)),
        Err(e) => {
            warn!(error = %e, "RDMA unavailable (iSER and SRP will not be served)");
            hca.shutdown();
            Ok(None)
        }
    }
}

fn start_soft(rdma: &config::Rdma) -> Option<Arc<Hca>> {
    let mut cfg = HcaConfig::new(rdma.addresses.clone());
    cfg.eth_mtu = rdma.eth_mtu as usize;
    cfg.busy_poll = std::time::Duration::from_micros(rdma.busy_poll_micros.into());
    cfg.shards = rdma.engine_threads() as usize;
    match Hca::open(&cfg) {
        Ok(hca) => {
            for (addr, why) in hca.skipped() {
                warn!(%addr, error = %why, "RDMA: address not served");
            }
            let addrs: Vec<String> = hca.addrs().iter().map(|a| a.to_string()).collect();
            info!(
                addresses = %addrs.join(" "),
                path_mtu = hca.device().port_mtu().bytes(),
                engine_threads = if hca.on_shard() { hca.count() } else { 0 },
                "RDMA device ready on UDP 4791 (provider soft)"
            );
            Some(Arc::new(hca))
        }
        Err(e) => {
            warn!(
                error = %error_chain(&e),
                "RDMA unavailable (iSER and SRP will not be served); serving TCP only"
            );
            None
        }
    }
}

/// A stable NAA IEEE Registered Extended designator (SPC-4 7.7.3.6.5) for a backstore that
/// has none configured: derived from the host and the backstore name so two appliances
/// never collide and a restart keeps the identity.
fn derived_wwn(name: &str) -> u128 {
    let host = std::fs::read_to_string("/etc/machine-id").unwrap_or_default();
    let mut out = [0u8; 16];
    for (i, chunk) in out.chunks_mut(8).enumerate() {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (i, host.trim(), name).hash(&mut h);
        chunk.copy_from_slice(&h.finish().to_be_bytes());
    }
    // NAA 6, IEEE company ID 0x0014FF (locally assigned range), vendor-specific rest.
    out[0] = 0x60;
    out[1] = 0x01;
    out[2] = 0x4f;
    out[3] = (out[3] & 0x0f) | 0xf0;
    u128::from_be_bytes(out)
}

/// Validated by the configuration: 32 hex digits starting with 6.
fn parse_wwn(hex: &str) -> u128 {
    u128::from_str_radix(hex, 16).unwrap_or(0)
}

fn derived_serial(wwn: u128) -> String {
    format!("{:016x}", wwn as u64)
}

/// Opens a backstore as the policy of `roots` allows. Returns it with the physical block size
/// of its block device, when it is one and sysfs tells.
/// An open backstore: the store, the physical block size of a block device, and the
/// reservation state its other exporters share (an rbd image's RADOS object).
struct Opened {
    store: Arc<dyn Backstore>,
    device_pbs: Option<u32>,
    shared: Option<Arc<dyn SharedState>>,
}

async fn open_backstore(
    b: &config::Backstore,
    roots: &BackstoreRoots,
) -> Result<Opened, DaemonError> {
    let plain = |(store, device_pbs): (Arc<dyn Backstore>, Option<u32>)| Opened {
        store,
        device_pbs,
        shared: None,
    };
    let fail = |message: String| DaemonError::Backstore {
        name: b.name.clone(),
        message,
    };
    let refused = |source: PolicyError| DaemonError::Policy {
        name: b.name.clone(),
        source,
    };
    let size = b.size.map(|s| s.0);
    Ok(match b.kind {
        BackstoreKind::File | BackstoreKind::Block => {
            let path = b
                .path
                .as_ref()
                .expect("validated: file backstores have a path");
            let file = b.kind == BackstoreKind::File;
            let opened = if file {
                let req = FileRequest {
                    size,
                    read_only: b.read_only,
                };
                roots.open_file(path, req)
            } else {
                roots.open_block(path, b.read_only, b.shared.is_some())
            }
            .map_err(refused)?;
            let pbs = opened.device.and_then(block_device_physical_block_size);
            let opts = FileOptions {
                size: if file { size } else { None },
                block_size: b.block_size,
                read_only: b.read_only,
                write_cache: b.write_cache,
                direct: b.direct(),
                thin: b.thin,
                create: false,
            };
            let store = FileBackstore::from_file(opened.file, path, opts)
                .map_err(|e| fail(format!("{}: {}", path.display(), error_chain(&e))))?;
            plain((Arc::new(store), pbs))
        }
        BackstoreKind::Ramdisk => plain((
            Arc::new(RamBackstore::new(
                size.expect("validated: ramdisk has a size"),
                b.block_size,
            )),
            None,
        )),
        BackstoreKind::Null => plain((
            Arc::new(NullBackstore::new(
                size.expect("validated: null has a size"),
                b.block_size,
            )),
            None,
        )),
        BackstoreKind::Rbd => {
            let r = b.rbd.as_ref().expect("validated: rbd has its section");
            let opts = RbdOptions {
                cluster: ClusterSpec {
                    conf: roots.ceph_file(&r.ceph_conf).map_err(refused)?,
                    client_id: r.client_id.clone(),
                    keyring: r
                        .keyring
                        .as_ref()
                        .map(|k| roots.ceph_file(k))
                        .transpose()
                        .map_err(refused)?,
                    op_timeout: Duration::from_secs(r.op_timeout_secs.into()),
                },
                pool: r.pool.clone(),
                namespace: r.namespace.clone(),
                image: r.image.clone(),
                block_size: b.block_size,
                read_only: b.read_only,
                write_cache: b.write_cache,
                thin: b.thin,
            };
            // Connecting and opening wait on the cluster. Reservations live beside the image,
            // shared by every gateway that exports it, named by the image's id (which a
            // rename keeps).
            let (store, shared) = tokio::task::spawn_blocking(move || {
                let store = RbdBackstore::open(&opts)?;
                let object = format!("rtgt.pr.{}", store.id()?);
                let shared = RadosState::open(&opts.cluster, &opts.pool, &opts.namespace, &object)?;
                Ok::<_, rtgt_ceph::CephError>((store, shared))
            })
            .await
            .map_err(|e| fail(e.to_string()))?
            .map_err(|e| fail(e.to_string()))?;
            Opened {
                store,
                device_pbs: None,
                shared: Some(Arc::new(shared)),
            }
        }
    })
}

/// The physical block size of a backstore without one configured: 4096 for a file (the
/// page and hole-punching granularity of Linux file systems), the device's own physical
/// block size for a block device (`device_pbs`, 4096 when it could not be read), the logical
/// block size for ramdisk and null; never less than the logical block size.
fn default_physical_block_size(b: &config::Backstore, device_pbs: Option<u32>) -> u32 {
    let pbs = match b.kind {
        BackstoreKind::File => 4096,
        BackstoreKind::Block => device_pbs.unwrap_or(4096),
        BackstoreKind::Ramdisk | BackstoreKind::Null => b.block_size,
        // RADOS objects are megabytes; 4096 keeps initiators' writes page-aligned.
        BackstoreKind::Rbd => 4096,
    };
    pbs.max(b.block_size)
}

/// `queue/physical_block_size` of a block device (major, minor) in sysfs, when it is a power
/// of two of at most 64 KiB.
fn block_device_physical_block_size((major, minor): (u32, u32)) -> Option<u32> {
    let text = std::fs::read_to_string(format!(
        "/sys/dev/block/{major}:{minor}/queue/physical_block_size"
    ))
    .ok()?;
    let pbs: u32 = text.trim().parse().ok()?;
    (pbs.is_power_of_two() && pbs <= 65536).then_some(pbs)
}

/// Opens one backstore and the logical unit over it.
pub(crate) async fn open_device(
    b: &config::Backstore,
    state_dir: &Path,
    roots: &BackstoreRoots,
    pool: &Arc<BufPool>,
    device_registry: &Arc<DeviceRegistry>,
) -> Result<(Arc<dyn Backstore>, Arc<Device>), DaemonError> {
    let Opened {
        store,
        device_pbs,
        shared,
    } = open_backstore(b, roots).await?;
    let pr_shared: Option<Arc<dyn SharedState>> = match &b.shared {
        Some(s) => {
            let path = roots
                .side_file(&s.pr_file)
                .map_err(|source| DaemonError::Policy {
                    name: b.name.clone(),
                    source,
                })?;
            Some(Arc::new(SharedFile::new(path)))
        }
        None => shared,
    };
    let pr_file = state_dir.join("pr").join(format!("{}.pr", b.name));
    let wwn = b
        .wwn
        .as_deref()
        .map(parse_wwn)
        .unwrap_or_else(|| derived_wwn(&b.name));
    let dc = DeviceConfig {
        name: b.name.clone(),
        serial: b.serial.clone().unwrap_or_else(|| derived_serial(wwn)),
        wwn,
        write_cache: b.write_cache,
        read_only: b.read_only,
        thin: b.thin,
        physical_block_size: Some(
            b.physical_block_size
                .and_then(|p| u32::try_from(p.0).ok())
                .unwrap_or_else(|| default_physical_block_size(b, device_pbs)),
        ),
        removable: b.removable,
        sanitize_rate: b
            .sanitize_rate
            .map_or(rtgt_scsi::DEFAULT_SANITIZE_RATE, |r| r.0),
        pr_file: Some(pr_file),
        pr_shared,
        registry: Some(device_registry.clone()),
        ..DeviceConfig::default()
    };
    let dev = Device::new(store.clone(), pool.clone(), dc).map_err(|e| DaemonError::Backstore {
        name: b.name.clone(),
        message: error_chain(&e),
    })?;
    if let Some(mut sizes) = store.capacity_changes() {
        // Resized elsewhere (another gateway, the cluster's tools): tell the initiators.
        let weak = Arc::downgrade(&dev);
        tokio::spawn(async move {
            while sizes.changed().await.is_ok() {
                let Some(dev) = weak.upgrade() else { return };
                if dev.num_blocks() != *sizes.borrow_and_update() {
                    dev.capacity_changed();
                }
            }
        });
    }
    info!(backstore = %b.name, kind = ?b.kind, "backstore ready");
    Ok((store, dev))
}

/// Opens every backstore, as the policy of `roots` allows, and builds the target registry.
pub async fn build(
    config: &Config,
    state_dir: &Path,
    roots: &BackstoreRoots,
) -> Result<Running, DaemonError> {
    let pool = BufPool::new(BUFFER_BUDGET);
    let pr_dir = state_dir.join("pr");
    std::fs::create_dir_all(&pr_dir).map_err(|source| DaemonError::StateDir {
        dir: pr_dir.clone(),
        source,
    })?;
    let device_registry = DeviceRegistry::new();
    let mut devices = BTreeMap::new();
    let mut backstores = BTreeMap::new();
    for b in &config.backstores {
        let (store, dev) = open_device(b, state_dir, roots, &pool, &device_registry).await?;
        devices.insert(b.name.clone(), dev);
        backstores.insert(b.name.clone(), store);
    }

    let ports = config.target_ports();
    set_alua(config, &ports, &devices);
    let registry = Registry::new();
    let mut portals = Vec::new();
    let mut iser_portals = Vec::new();
    for t in &config.targets {
        for g in &t.portal_groups {
            for p in &g.portals {
                if !portals.contains(p) {
                    portals.push(*p);
                }
                if g.iser && !iser_portals.contains(p) {
                    iser_portals.push(*p);
                }
            }
        }
        registry.set_target(build_target(t, &devices, &ports));
    }
    registry.set_discovery_auth(auth(&config.discovery.auth));
    register_srp_ports(config, &devices, &ports, &registry);
    let rdma = start_rdma(&config.rdma, &pool)?;
    Ok(Running {
        registry,
        devices,
        backstores,
        portals,
        iser_portals,
        pool,
        rdma,
        device_registry,
    })
}

/// Gives every logical unit its target port groups and their states, as `config` and its
/// resolved `ports` say.
pub(crate) fn set_alua(
    config: &Config,
    ports: &[TargetPort],
    devices: &BTreeMap<String, Arc<Device>>,
) {
    for (name, dev) in devices {
        if let Err(e) = dev.set_alua(&config.lu_alua(ports, name)) {
            warn!(backstore = %name, error = %e, "target port groups not changed");
        }
    }
}

/// The runtime target for a configured one; `devices` holds every backstore it uses,
/// `ports` the resolved target ports.
pub(crate) fn build_target(
    t: &config::Target,
    devices: &BTreeMap<String, Arc<Device>>,
    ports: &[TargetPort],
) -> core::Target {
    let mut groups = Vec::new();
    for g in &t.portal_groups {
        let mut luns = LunMap::default();
        for l in &g.luns {
            luns.luns.insert(l.lun, devices[&l.backstore].clone());
        }
        let mut acls = HashMap::new();
        for a in &g.acls {
            let mapped = if a.mapped_luns.is_empty() {
                luns.clone()
            } else {
                let mut m = LunMap::default();
                for ml in &a.mapped_luns {
                    m.luns.insert(ml.lun, luns.luns[&ml.tpg_lun].clone());
                }
                m
            };
            acls.insert(
                a.initiator.clone(),
                core::Acl {
                    initiator: a.initiator.clone(),
                    auth: auth(&a.auth),
                    luns: mapped,
                },
            );
        }
        if g.allow_any_initiator && g.auth.chap.is_none() {
            warn!(
                target = %t.name,
                tpg = g.tag,
                "portal group admits any initiator without authentication"
            );
        }
        groups.push(core::PortalGroup {
            tag: g.tag,
            ids: ids_of(ports, &PortKey::PortalGroup(t.name.clone(), g.tag))
                .unwrap_or(PortIds::alone(g.tag)),
            portals: g.portals.clone(),
            auth: auth(&g.auth),
            acls,
            allow_any_initiator: g.allow_any_initiator,
            luns,
            params: params(&g.params),
            iser: g.iser,
        });
    }
    core::Target {
        name: t.name.clone(),
        alias: t.alias.clone(),
        portal_groups: groups,
    }
}

fn chap(c: &Option<config::Chap>) -> Option<core::ChapCredentials> {
    c.as_ref().map(|c| core::ChapCredentials {
        user: c.user.clone(),
        secret: c.secret.clone(),
    })
}

pub(crate) fn auth(a: &config::Auth) -> core::Auth {
    core::Auth {
        chap: chap(&a.chap),
        mutual: chap(&a.mutual_chap),
    }
}

fn params(p: &config::IscsiParams) -> core::IscsiParams {
    let d = core::IscsiParams::default();
    core::IscsiParams {
        max_recv_data_segment_length: p
            .max_recv_data_segment_length
            .unwrap_or(d.max_recv_data_segment_length),
        max_burst_length: p.max_burst_length.unwrap_or(d.max_burst_length),
        first_burst_length: p.first_burst_length.unwrap_or(d.first_burst_length),
        initial_r2t: p.initial_r2t.unwrap_or(d.initial_r2t),
        immediate_data: p.immediate_data.unwrap_or(d.immediate_data),
        max_outstanding_r2t: p.max_outstanding_r2t.unwrap_or(d.max_outstanding_r2t),
        max_connections: p.max_connections.unwrap_or(d.max_connections),
        default_time2wait: p.default_time2_wait.unwrap_or(d.default_time2wait),
        default_time2retain: p.default_time2_retain.unwrap_or(d.default_time2retain),
        header_digest: p.header_digest.unwrap_or(d.header_digest),
        data_digest: p.data_digest.unwrap_or(d.data_digest),
        error_recovery_level: p.error_recovery_level.unwrap_or(d.error_recovery_level),
        queue_depth: p.queue_depth.unwrap_or(d.queue_depth),
        nopin_interval: p.nopin_interval.unwrap_or(d.nopin_interval),
        nopin_timeout: p.nopin_timeout.unwrap_or(d.nopin_timeout),
        busy_poll_micros: p.busy_poll_micros.unwrap_or(d.busy_poll_micros),
        zero_copy_reads: p.zero_copy_reads.unwrap_or(d.zero_copy_reads),
    }
}

/// Name of the configuration file in the state directory when rtgtd runs without
/// `--config`.
pub const STATE_CONFIG: &str = "rtgtd.yaml";

/// The target port of `p` with the LUNs and ACLs resolved against `devices` and its IDs
/// among `ports`.
pub fn srp_target_port(
    p: &config::SrpPort,
    devices: &BTreeMap<String, Arc<Device>>,
    ports: &[TargetPort],
) -> core::SrpTargetPort {
    let mut luns = LunMap::default();
    for l in &p.luns {
        luns.luns.insert(l.lun, devices[&l.backstore].clone());
    }
    let mut acls = HashMap::new();
    for a in &p.acls {
        let mapped = if a.mapped_luns.is_empty() {
            luns.clone()
        } else {
            let mut m = LunMap::default();
            for ml in &a.mapped_luns {
                m.luns.insert(ml.lun, luns.luns[&ml.tpg_lun].clone());
            }
            m
        };
        let name = a.initiator.to_ascii_lowercase();
        acls.insert(
            name.clone(),
            core::Acl {
                initiator: name,
                auth: Default::default(),
                luns: mapped,
            },
        );
    }
    core::SrpTargetPort {
        name: p.name.clone(),
        ids: ids_of(ports, &PortKey::Srp(p.name.clone())).unwrap_or(PortIds::alone(1)),
        id_ext: p
            .id_ext
            .as_deref()
            .and_then(config::parse_hex64)
            .unwrap_or_else(|| rtgt_srp::service::derived_id(&p.name, "id_ext")),
        ioc_guid: p
            .ioc_guid
            .as_deref()
            .and_then(config::parse_hex64)
            .unwrap_or_else(|| rtgt_srp::service::derived_id(&p.name, "ioc_guid")),
        listen: p.listen.clone(),
        acls,
        allow_any_initiator: p.allow_any_initiator,
        luns,
    }
}

/// Registers every SRP target port of `config`.
pub fn register_srp_ports(
    config: &Config,
    devices: &BTreeMap<String, Arc<Device>>,
    ports: &[TargetPort],
    registry: &Registry,
) {
    for p in &config.srp {
        let port = srp_target_port(p, devices, ports);
        if port.allow_any_initiator {
            warn!(port = %port.name, "SRP target port admits any initiator");
        }
        registry.set_srp_port(port);
    }
}

/// Where API changes are saved: the configuration file, or `rtgtd.yaml` in the state
/// directory when rtgtd serves the embedded default.
pub fn config_file(opts: &Options) -> PathBuf {
    opts.config
        .clone()
        .unwrap_or_else(|| opts.state_dir.join(STATE_CONFIG))
}

/// The configuration in `file`, refused when it leaves a LUN with no active target port
/// group (what the API refuses with 409).
fn loaded(file: &Path) -> Result<Config, DaemonError> {
    let c = Config::load(file)?;
    match c.conflict(&c) {
        Some(why) => Err(DaemonError::Alua(format!("{}: {why}", file.display()))),
        None => Ok(c),
    }
}

/// Loads the configuration named by `opts`, or the one saved in the state directory, or
/// the embedded default.
pub fn load_config(opts: &Options) -> Result<Config, DaemonError> {
    match &opts.config {
        Some(file) => loaded(file),
        None if config_file(opts).exists() => {
            let file = config_file(opts);
            info!(file = %file.display(), "serving the configuration saved in the state directory");
            loaded(&file)
        }
        None => {
            warn!(
                state_dir = %opts.state_dir.display(),
                "no --config given: serving the embedded default (LUN 0 on a 1 GiB file, every address, \
                 no authentication, any initiator allowed)"
            );
            Ok(Config::embedded_default())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn backstore(yaml: &str) -> config::Backstore {
        let c = Config::from_yaml(&format!("backstores:\n  - {yaml}\n"), Path::new("t.yaml"))
            .expect("valid configuration");
        c.backstores[0].clone()
    }

    #[tokio::test]
    async fn the_default_serves_files_through_the_page_cache() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = Config::embedded_default();
        c.rdma.enabled = false;
        c.backstores.push(backstore(
            "{name: d, type: file, path: d.img, size: 1MiB, direct: true, write_cache: false}",
        ));
        let roots = BackstoreRoots::new(dir.path(), &[]);
        let r = build(&c, dir.path(), &roots).await.unwrap();
        let (default, direct) = (&r.devices["disk0"], &r.devices["d"]);
        assert!(!default.is_direct() && default.write_cache());
        // O_DIRECT where the file system has it (tmpfs only emulates it: not used there).
        let tmpfs = {
            let path = std::ffi::CString::new(dir.path().as_os_str().as_encoded_bytes()).unwrap();
            // SAFETY: statfs fills the zeroed struct it is given; the path is NUL-terminated.
            unsafe {
                let mut st: libc::statfs = std::mem::zeroed();
                libc::statfs(path.as_ptr(), &mut st) == 0 && st.f_type == libc::TMPFS_MAGIC
            }
        };
        assert_eq!(direct.is_direct(), !tmpfs);
        assert!(!direct.write_cache());
    }

    #[tokio::test]
    async fn soft_rdma_bring_up_is_never_fatal() {
        let pool = BufPool::new(BUFFER_BUDGET);
        let off = config::Rdma {
            enabled: false,
            ..config::Rdma::default()
        };
        assert!(start_rdma(&off, &pool).unwrap().is_none());
        let lo = config::Rdma {
            addresses: vec![std::net::Ipv4Addr::LOCALHOST.into()],
            ..config::Rdma::default()
        };
        // The first may find the port taken (rdma_rxe loaded here); the second always does.
        let first = start_rdma(&lo, &pool).unwrap();
        let second = start_rdma(&lo, &pool).unwrap();
        assert!(second.is_none());
        if let Some(p) = first {
            assert_eq!(p.kind(), rtgt_rdma_channel::Kind::Soft);
            let hca = p.hca().unwrap();
            assert_eq!(hca.addrs(), &[std::net::IpAddr::from([127, 0, 0, 1])]);
            assert!(hca.is_running());
            // The default runs the device on an engine thread of its own.
            assert!(hca.on_shard());
            hca.shutdown();
        }
    }

    #[tokio::test]
    async fn verbs_rdma_names_what_is_missing() {
        // An address no RDMA device has (documentation range): whether rdma-core is
        // installed or not, start fails and says why.
        let pool = BufPool::new(BUFFER_BUDGET);
        let v = config::Rdma {
            provider: config::RdmaProvider::Verbs,
            addresses: vec![std::net::IpAddr::from([192, 0, 2, 77])],
            ..config::Rdma::default()
        };
        let e = start_rdma(&v, &pool)
            .err()
            .expect("verbs on an address without a device");
        let text = e.to_string();
        if rtgt_transport::rdmacore::RdmaCore::load().is_ok() {
            assert!(
                text.contains("no RDMA device has the address 192.0.2.77"),
                "{text}"
            );
        } else {
            assert!(text.contains("libibverbs"), "{text}");
        }
    }

    #[test]
    fn saved_configuration_replaces_the_embedded_default() {
        let dir = tempfile::tempdir().unwrap();
        let opts = Options {
            config: None,
            state_dir: dir.path().to_path_buf(),
        };
        assert_eq!(config_file(&opts), dir.path().join("rtgtd.yaml"));
        assert_eq!(load_config(&opts).unwrap(), Config::embedded_default());
        let mut c = Config::embedded_default();
        c.backstores[0].size = Some(config::ByteSize(2 << 30));
        c.save(&config_file(&opts)).unwrap();
        assert_eq!(load_config(&opts).unwrap(), c);
        let explicit = Options {
            config: Some(dir.path().join("other.yaml")),
            state_dir: dir.path().to_path_buf(),
        };
        assert_eq!(config_file(&explicit), dir.path().join("other.yaml"));
    }

    #[test]
    fn default_physical_block_sizes() {
        let pbs = |yaml: &str| default_physical_block_size(&backstore(yaml), None);
        assert_eq!(pbs("{name: a, type: file, path: a.img, size: 1M}"), 4096);
        assert_eq!(
            pbs("{name: a, type: file, path: a.img, size: 1M, block_size: 4096}"),
            4096
        );
        assert_eq!(pbs("{name: a, type: block, path: /dev/nonexistent}"), 4096);
        let block = backstore("{name: a, type: block, path: /dev/sda}");
        assert_eq!(default_physical_block_size(&block, Some(512)), 512);
        assert_eq!(default_physical_block_size(&block, Some(8192)), 8192);
        let block4k = backstore("{name: a, type: block, path: /dev/sda, block_size: 4096}");
        assert_eq!(default_physical_block_size(&block4k, Some(512)), 4096);
        assert_eq!(pbs("{name: a, type: ramdisk, size: 1M}"), 512);
        assert_eq!(
            pbs("{name: a, type: null, size: 1M, block_size: 4096}"),
            4096
        );
        assert_eq!(pbs("{name: a, type: rbd, rbd: {image: i}}"), 4096);
    }

    #[test]
    fn identifiers_and_add_target() {
        let c = Config::from_yaml(
            "srp:\n  - {name: a, id_ext: '0x0002c90300001111', ioc_guid: 0002c90300002222, listen: ['0.0.0.0:5555', '192.0.2.9:5556']}\n  - {name: b}\n",
            Path::new("t.yaml"),
        )
        .unwrap();
        let ports = c.target_ports();
        let a = srp_target_port(&c.srp[0], &BTreeMap::new(), &ports);
        let b = srp_target_port(&c.srp[1], &BTreeMap::new(), &ports);
        assert_eq!((a.ids, b.ids), (PortIds::alone(1), PortIds::alone(2)));
        assert_eq!(a.id_ext, 0x0002_c903_0000_1111);
        assert_ne!(b.id_ext, b.ioc_guid);
        assert_eq!(
            b.id_ext,
            rtgt_srp::service::derived_id("b", "id_ext"),
            "stable across calls"
        );
        assert_ne!(b.id_ext, rtgt_srp::service::derived_id("c", "id_ext"));
        let local: Vec<std::net::IpAddr> = vec![
            "127.0.0.1".parse().unwrap(),
            "10.1.2.3".parse().unwrap(),
            "fe80::1".parse().unwrap(),
        ];
        assert_eq!(
            rtgt_srp::service::add_target_strings(&a, &local),
            vec![
                "id_ext=0002c90300001111,ioc_guid=0002c90300002222,dest=10.1.2.3:5555",
                "id_ext=0002c90300001111,ioc_guid=0002c90300002222,dest=127.0.0.1:5555",
                "id_ext=0002c90300001111,ioc_guid=0002c90300002222,dest=192.0.2.9:5556",
            ]
        );
    }
}
