//! The daemon side of the administration API: [`rtgt_api::Control`] over the running
//! target — declarative apply with live changes, persistence, sessions and metrics.
//!
//! An apply first does everything that can fail without touching the running target
//! (opening new backstores, binding new portals), then resizes, then makes the
//! changes that cannot fail: targets in the registry, LUN maps of live sessions with
//! REPORTED LUNS DATA HAS CHANGED, sessions whose ACL went away ended, listeners started
//! and stopped. Last it saves the document atomically.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};

use async_trait::async_trait;
use rtgt_api::config::{self, Config};
use rtgt_api::diff::{backstore_change, BackstoreChange, LiveChange};
use rtgt_api::metrics::Metrics;
use rtgt_api::{
    AluaView, ChangeReport, Control, ControlError, RdmaDeviceView, RdmaListenerView, RdmaView,
    SessionView,
};
use rtgt_backstore::policy::BackstoreRoots;
use rtgt_backstore::{Backstore, BufPool};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{error, info, warn};

pub use crate::build::STATE_CONFIG;
use crate::build::{build_target, error_chain, open_device, DaemonError};
use crate::nvme::NvmeService;
use rtgt_api::alua::{ids_of, PortKey};
use rtgt_iscsi::iser::IserServer;
use rtgt_iscsi::{IscsiServer, SessionType};
use rtgt_rdma_channel::cm::Provider;
use rtgt_scsi::core::Registry;
use rtgt_scsi::{Device, DeviceRegistry};
use rtgt_srp::service::{PortChange, SrpService};

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A listening portal.
struct Portal {
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

/// A backstore opened by an apply: name, store, logical unit, and whether it replaces
/// one of the same name.
type Opened = (String, Arc<dyn Backstore>, Arc<Device>, bool);

/// The running objects an apply changes, under one lock.
struct Objects {
    devices: BTreeMap<String, Arc<Device>>,
    backstores: BTreeMap<String, Arc<dyn Backstore>>,
}

/// The running target as the API sees it.
pub struct DaemonControl {
    state_dir: PathBuf,
    /// Where file backstores may be: the policy rtgtd started with.
    roots: BackstoreRoots,
    /// Where every change is saved.
    file: PathBuf,
    registry: Arc<Registry>,
    server: IscsiServer,
    pool: Arc<BufPool>,
    device_registry: Arc<DeviceRegistry>,
    metrics: Metrics,
    config: RwLock<Config>,
    objects: tokio::sync::Mutex<Objects>,
    portals: Mutex<BTreeMap<SocketAddr, Portal>>,
    /// RDMA devices whose counters /metrics exports.
    rdma: Mutex<Vec<(String, RdmaSource)>>,
    /// The RDMA provider iSER and SRP are served on, when it is up.
    rdma_provider: Option<Provider>,
    /// iSER over `rdma_provider` and its listeners (the portals of the groups with `iser: true`).
    iser: Option<IserServer>,
    iser_portals: Mutex<BTreeMap<SocketAddr, Portal>>,
    /// iSER portals the RDMA device cannot listen on (logged once, tried again when the
    /// portal comes back after leaving the configuration).
    iser_unserved: Mutex<BTreeSet<SocketAddr>>,
    /// The SRP target ports over `rdma_provider`, from the first one configured.
    srp: Mutex<Option<Arc<SrpService>>>,
    /// NVMe over Fabrics subsystems and listeners.
    nvme: NvmeService,
}

/// Counters of one RDMA device as /metrics exports them (`rtgt_rdma_*_total{device=...}`).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct RdmaCounters {
    pub rx_packets: u64,
    pub tx_packets: u64,
    pub rx_dropped: u64,
    pub icrc_errors: u64,
    pub retransmits: u64,
    pub naks_sent: u64,
    pub rnr_naks_sent: u64,
    /// Datagrams an engine thread received for a QP of another and passed on.
    pub passed_on: u64,
    /// Received datagrams whose payload the link placed straight into registered memory.
    pub placed: u64,
    pub cm_events: u64,
}

/// Reads an RDMA device's counters at scrape time.
pub type RdmaSource = Box<dyn Fn() -> RdmaCounters + Send + Sync>;

/// The Prometheus text of the RDMA devices' counters.
/// Changes backstore `i` (`name`) in place: capacity, write cache, then cache mode.
async fn apply_live(
    i: usize,
    name: &str,
    change: &LiveChange,
    objects: &Objects,
) -> Result<(), ControlError> {
    let (store, dev) = (&objects.backstores[name], &objects.devices[name]);
    if let Some(size) = change.size {
        let bs = u64::from(store.info().block_size);
        store.resize(size / bs).await.map_err(|e| {
            invalid(
                format!("backstores[{i}].size"),
                format!("cannot resize {name:?}: {}", error_chain(&e)),
            )
        })?;
        dev.capacity_changed();
        info!(backstore = %name, size, "backstore resized");
    }
    if let Some(on) = change.write_cache {
        dev.set_write_cache(on).await.map_err(|e| {
            invalid(
                format!("backstores[{i}].write_cache"),
                format!(
                    "cannot switch the write cache of {name:?}: {}",
                    error_chain(&e)
                ),
            )
        })?;
    }
    if let Some(direct) = change.direct {
        dev.set_direct(direct);
    }
    Ok(())
}

fn render_rdma(devices: &[(String, RdmaCounters)]) -> String {
    let mut out = String::new();
    type Field = fn(&RdmaCounters) -> u64;
    let families: [(&str, Field); 10] = [
        ("rtgt_rdma_rx_packets_total", |c| c.rx_packets),
        ("rtgt_rdma_tx_packets_total", |c| c.tx_packets),
        ("rtgt_rdma_rx_dropped_total", |c| c.rx_dropped),
        ("rtgt_rdma_icrc_errors_total", |c| c.icrc_errors),
        ("rtgt_rdma_retransmits_total", |c| c.retransmits),
        ("rtgt_rdma_naks_sent_total", |c| c.naks_sent),
        ("rtgt_rdma_rnr_naks_sent_total", |c| c.rnr_naks_sent),
        ("rtgt_rdma_passed_on_total", |c| c.passed_on),
        ("rtgt_rdma_rx_placed_total", |c| c.placed),
        ("rtgt_rdma_cm_events_total", |c| c.cm_events),
    ];
    if devices.is_empty() {
        return out;
    }
    for (name, get) in families {
        out.push_str(&format!("# TYPE {name} counter\n"));
        for (dev, c) in devices {
            out.push_str(&format!("{name}{{device=\"{dev}\"}} {}\n", get(c)));
        }
        out.push('\n');
    }
    out
}

/// What [`DaemonControl::new`] takes over from the daemon.
pub struct ControlParts {
    pub state_dir: PathBuf,
    /// The backstore roots of the configuration rtgtd started with.
    pub roots: BackstoreRoots,
    pub file: PathBuf,
    pub config: Config,
    pub registry: Arc<Registry>,
    pub server: IscsiServer,
    pub pool: Arc<BufPool>,
    pub device_registry: Arc<DeviceRegistry>,
    pub devices: BTreeMap<String, Arc<Device>>,
    pub backstores: BTreeMap<String, Arc<dyn Backstore>>,
    pub metrics: Metrics,
    /// The RDMA provider, when the `rdma` section brought one up.
    pub rdma: Option<Provider>,
}

fn portals_of(c: &Config) -> BTreeSet<SocketAddr> {
    c.targets
        .iter()
        .flat_map(|t| t.portal_groups.iter())
        .flat_map(|g| g.portals.iter().copied())
        .collect()
}

/// The portals of the groups that also serve iSER.
fn iser_portals_of(c: &Config) -> BTreeSet<SocketAddr> {
    c.targets
        .iter()
        .flat_map(|t| t.portal_groups.iter())
        .filter(|g| g.iser)
        .flat_map(|g| g.portals.iter().copied())
        .collect()
}

fn invalid(field: String, message: String) -> ControlError {
    ControlError::Invalid { field, message }
}

/// Why backstore `i` of a document could not be opened: 403 for what the policy forbids,
/// 422 for the rest.
fn open_failed(i: usize, e: &DaemonError) -> ControlError {
    let message = error_chain(e);
    match e {
        DaemonError::Policy { source, .. } if source.is_size() => {
            invalid(format!("backstores[{i}].size"), message)
        }
        DaemonError::Policy { source, .. } if source.is_forbidden() => ControlError::Forbidden {
            field: format!("backstores[{i}].path"),
            message,
        },
        DaemonError::Policy { .. } => invalid(format!("backstores[{i}].path"), message),
        _ => invalid(format!("backstores[{i}]"), message),
    }
}

impl DaemonControl {
    pub fn new(p: ControlParts) -> Arc<DaemonControl> {
        let iser = p
            .rdma
            .as_ref()
            .map(|r| IserServer::new(p.server.shared(), r.clone()));
        let nvme = NvmeService::new(p.pool.clone(), p.rdma.clone());
        Arc::new(DaemonControl {
            rdma_provider: p.rdma,
            iser,
            iser_portals: Mutex::new(BTreeMap::new()),
            iser_unserved: Mutex::new(BTreeSet::new()),
            srp: Mutex::new(None),
            nvme,
            state_dir: p.state_dir,
            roots: p.roots,
            file: p.file,
            registry: p.registry,
            server: p.server,
            pool: p.pool,
            device_registry: p.device_registry,
            metrics: p.metrics,
            config: RwLock::new(p.config),
            objects: tokio::sync::Mutex::new(Objects {
                devices: p.devices,
                backstores: p.backstores,
            }),
            portals: Mutex::new(BTreeMap::new()),
            rdma: Mutex::new(Vec::new()),
        })
    }

    /// Exports the counters of an RDMA device (read by `source` at each scrape).
    pub fn add_rdma_device(&self, device: &str, source: RdmaSource) {
        lock(&self.rdma).push((device.to_string(), source));
    }

    /// The file changes are saved to.
    pub fn file(&self) -> &Path {
        &self.file
    }

    async fn bind(addr: SocketAddr) -> Result<TcpListener, ControlError> {
        TcpListener::bind(addr)
            .await
            .map_err(|e| ControlError::Conflict {
                field: "portals".into(),
                message: format!("portal {addr}: cannot listen: {e}"),
            })
    }

    fn serve_portal(&self, addr: SocketAddr, listener: TcpListener) {
        let (stop, stop_rx) = watch::channel(false);
        let server = self.server.clone();
        let task = tokio::spawn(async move {
            if let Err(e) = server.serve(listener, stop_rx).await {
                error!(portal = %addr, error = %e, "iSCSI portal failed");
            }
        });
        info!(portal = %addr, "iSCSI portal listening");
        lock(&self.portals).insert(addr, Portal { stop, task });
    }

    /// Starts the listeners of every portal of the configuration.
    pub async fn start_portals(&self) -> Result<(), ControlError> {
        let wanted = portals_of(&self.config());
        for addr in wanted {
            let l = Self::bind(addr).await?;
            self.serve_portal(addr, l);
        }
        Ok(())
    }

    /// Serves the `nvme` section of the configuration: subsystems and listeners.
    pub async fn start_nvme(&self) -> Result<(), ControlError> {
        let config = self.config();
        let bound = self.nvme.bind(&config.nvme).await?;
        let objects = self.objects.lock().await;
        self.nvme
            .sync(
                &config,
                &objects.backstores,
                &objects.devices,
                bound,
                &HashSet::new(),
            )
            .await;
        Ok(())
    }

    /// Closes the NVMe listeners and controllers (at shutdown).
    pub async fn stop_nvme(&self) {
        self.nvme.shutdown().await;
    }

    /// Waits for the portal listeners, TCP and iSER, to stop (after the server's shutdown).
    pub async fn stop_portals(&self) {
        let mut portals = std::mem::take(&mut *lock(&self.portals));
        portals.extend(std::mem::take(&mut *lock(&self.iser_portals)));
        for (_, p) in portals {
            let _ = p.stop.send(true);
            let _ = p.task.await;
        }
    }

    /// The iSER server, when the RDMA device is up.
    pub fn iser(&self) -> Option<&IserServer> {
        self.iser.as_ref()
    }

    /// The SRP service, once an SRP target port is served.
    pub fn srp(&self) -> Option<Arc<SrpService>> {
        lock(&self.srp).clone()
    }

    /// Starts the iSER listeners of the configuration and the SRP target ports.
    pub async fn start_rdma_services(&self) {
        let mut report = ChangeReport::default();
        self.sync_iser(&self.config()).await;
        self.sync_srp(&mut report).await;
    }

    /// Makes the iSER listeners match the portals of the groups with `iser: true`: new ones
    /// listen (the CM on the same ip:port over the RDMA device), removed ones stop; the
    /// sessions they carry are not touched. Returns once the removed ones stopped.
    async fn sync_iser(&self, config: &Config) {
        let Some(iser) = &self.iser else {
            return;
        };
        let wanted = iser_portals_of(config);
        let mut stopped = Vec::new();
        {
            let mut running = lock(&self.iser_portals);
            let gone: Vec<SocketAddr> = running
                .keys()
                .filter(|a| !wanted.contains(a))
                .copied()
                .collect();
            for addr in gone {
                if let Some(p) = running.remove(&addr) {
                    let _ = p.stop.send(true);
                    info!(portal = %addr, "iSER portal stopped");
                    stopped.push(p.task);
                }
            }
            self.start_iser_portals(iser, &wanted, &mut running);
        }
        for t in stopped {
            let _ = t.await;
        }
    }

    fn start_iser_portals(
        &self,
        iser: &IserServer,
        wanted: &BTreeSet<SocketAddr>,
        running: &mut BTreeMap<SocketAddr, Portal>,
    ) {
        let mut unserved = lock(&self.iser_unserved);
        unserved.retain(|a| wanted.contains(a));
        for &addr in wanted {
            if unserved.contains(&addr) || running.get(&addr).is_some_and(|p| !p.task.is_finished())
            {
                continue;
            }
            let listener = match iser.listen(addr) {
                Ok(l) => l,
                Err(e) => {
                    warn!(portal = %addr, error = %e, "iSER not served on this portal");
                    unserved.insert(addr);
                    continue;
                }
            };
            let (stop, stop_rx) = watch::channel(false);
            let iser = iser.clone();
            let task = iser.spawn_serve(listener, stop_rx);
            info!(portal = %addr, "iSER portal listening");
            running.insert(addr, Portal { stop, task });
        }
    }

    /// The addresses iSER listens on.
    pub fn iser_listening(&self) -> Vec<SocketAddr> {
        lock(&self.iser_portals)
            .iter()
            .filter(|(_, p)| !p.task.is_finished())
            .map(|(a, _)| *a)
            .collect()
    }

    /// Makes the SRP service serve the registry's SRP target ports, starting it with the
    /// first one. Returns once the listeners of removed addresses stopped.
    async fn sync_srp(&self, report: &mut ChangeReport) {
        let ports = self.registry.srp_ports();
        let Some(rdma) = &self.rdma_provider else {
            for p in &ports {
                warn!(port = %p.name, "SRP target port not served: no RDMA device");
            }
            return;
        };
        let svc = {
            let mut srp = lock(&self.srp);
            match &*srp {
                Some(svc) => svc.clone(),
                None if ports.is_empty() => return,
                None => {
                    let svc = Arc::new(SrpService::start(rdma, &self.registry, self.pool.clone()));
                    *srp = Some(svc);
                    return;
                }
            }
        };
        let changes = svc.sync();
        svc.stopped().await;
        for c in changes {
            if let PortChange::Restarted(name) = c {
                report.push_detail(
                    "changed",
                    "srp_port",
                    name,
                    "identifier, relative port, target port group or listen addresses changed: its channels were logged out",
                );
            }
        }
    }

    /// Checks that the RDMA device can listen on every SRP listen address not yet served
    /// (one it serves, not taken by an iSER portal), before anything changes.
    fn check_srp_listen(&self, new: &Config) -> Result<(), ControlError> {
        let Some(rdma) = &self.rdma_provider else {
            return Ok(());
        };
        let served: BTreeSet<SocketAddr> = self
            .srp()
            .map(|s| s.listening().into_iter().collect())
            .unwrap_or_default();
        for (i, p) in new.srp.iter().enumerate() {
            for (j, a) in p.listen.iter().enumerate() {
                if served.contains(a) {
                    continue;
                }
                // A listener taken and dropped at once: the address is free to serve.
                if let Err(e) = rdma.listen(*a) {
                    return Err(ControlError::Conflict {
                        field: format!("srp[{i}].listen[{j}]"),
                        message: format!("SRP target port {:?}: cannot listen on {a}: {e}", p.name),
                    });
                }
            }
        }
        Ok(())
    }

    /// SRP sessions whose LUN map or admission changed, in the report.
    fn update_srp_sessions(&self, report: &mut ChangeReport) {
        let Some(srp) = self.srp() else { return };
        for (id, ended) in srp.update_sessions() {
            if ended {
                report.push_detail(
                    "ended",
                    "session",
                    id,
                    "the initiator is no longer admitted: SRP_T_LOGOUT",
                );
            } else {
                report.push_detail(
                    "changed",
                    "session",
                    id,
                    "LUN map changed: REPORTED LUNS DATA HAS CHANGED",
                );
            }
        }
    }

    /// Flushes every backstore (at shutdown).
    pub async fn flush_all(&self) {
        let objects = self.objects.lock().await;
        for (name, store) in &objects.backstores {
            if let Err(e) = store.flush().await {
                error!(backstore = %name, error = %error_chain(&e), "flush at shutdown failed");
            }
        }
    }

    /// Gives every live session the LUN map its portal group now grants, with REPORTED
    /// LUNS DATA HAS CHANGED where it changed; ends the sessions no longer admitted.
    fn update_sessions(&self, report: &mut ChangeReport) {
        for s in self.server.shared().sessions.all() {
            if s.session_type != SessionType::Normal || s.has_ended() {
                continue;
            }
            let id = format!("iscsi-{}", s.tsih);
            let grant = self
                .registry
                .target(&s.params.target_name)
                .and_then(|t| {
                    t.portal_groups
                        .iter()
                        .find(|g| g.tag == s.params.target_portal_group_tag)
                        .cloned()
                })
                .and_then(|g| {
                    g.admit(&s.params.initiator_name)
                        .map(|(map, auth)| (map, auth, g.ids))
                });
            let Some((map, _, ids)) = grant else {
                info!(session = %id, initiator = %s.params.initiator_name, "session no longer admitted: ending it");
                self.server.force_logout(s.tsih);
                report.push_detail(
                    "ended",
                    "session",
                    id,
                    format!("{} is no longer admitted", s.params.initiator_name),
                );
                continue;
            };
            if (s.nexus.relative_port, s.nexus.port_group) != (ids.relative_port, ids.port_group) {
                info!(session = %id, "target port moved to another relative port or group: ending the session");
                self.server.force_logout(s.tsih);
                report.push_detail(
                    "ended",
                    "session",
                    id,
                    format!(
                        "its portal group is now relative port {} in target port group {} (the initiator logs in again)",
                        ids.relative_port, ids.port_group
                    ),
                );
                continue;
            }
            if !s.luns.remap(&s.nexus, map) {
                continue;
            }
            report.push_detail(
                "changed",
                "session",
                id,
                "LUN map changed: REPORTED LUNS DATA HAS CHANGED",
            );
        }
    }

    async fn apply_locked(
        &self,
        objects: &mut Objects,
        new: Config,
    ) -> Result<ChangeReport, ControlError> {
        let old = self.config();
        let mut report = ChangeReport::default();

        // 1. What can fail, without touching the running target.
        let mut opened: Vec<Opened> = Vec::new();
        let mut live: Vec<(usize, String, LiveChange)> = Vec::new();
        for (i, b) in new.backstores.iter().enumerate() {
            let replace = match old.backstore(&b.name) {
                None => false,
                Some(o) => match backstore_change(o, b, rtgt_api::diff::in_use(&old, &b.name)) {
                    BackstoreChange::Same => continue,
                    BackstoreChange::Live(change) => {
                        live.push((i, b.name.clone(), change));
                        continue;
                    }
                    BackstoreChange::Reopen => true,
                    BackstoreChange::InUse(message) => {
                        return Err(ControlError::Conflict {
                            field: format!("backstores[{i}]"),
                            message,
                        })
                    }
                },
            };
            let (store, dev) = open_device(
                b,
                &self.state_dir,
                &self.roots,
                &self.pool,
                &self.device_registry,
            )
            .await
            .map_err(|e| open_failed(i, &e))?;
            opened.push((b.name.clone(), store, dev, replace));
        }
        if let Some(message) = new.conflict(&old) {
            return Err(ControlError::Conflict {
                field: "alua".into(),
                message,
            });
        }
        self.check_srp_listen(&new)?;
        let running: BTreeSet<SocketAddr> = lock(&self.portals).keys().copied().collect();
        let wanted = portals_of(&new);
        let mut bound = Vec::new();
        for addr in wanted.difference(&running) {
            bound.push((*addr, Self::bind(*addr).await?));
        }
        let nvme_bound = self.nvme.bind(&new.nvme).await?;
        let mut nvme_changed = HashSet::new();
        for (i, name, change) in &live {
            apply_live(*i, name, change, objects).await?;
            change.report(&mut report, name);
            nvme_changed.insert(name.clone());
        }

        // 2. Changes that cannot fail.
        let mut reopened = HashSet::new();
        for (name, store, dev, replace) in opened {
            report.push(
                if replace { "changed" } else { "added" },
                "backstore",
                name.clone(),
            );
            if replace {
                reopened.insert(name.clone());
            }
            objects.devices.insert(name.clone(), dev);
            objects.backstores.insert(name, store);
        }
        let (old_ports, ports) = (old.target_ports(), new.target_ports());
        let moved = |key: PortKey| ids_of(&old_ports, &key) != ids_of(&ports, &key);
        crate::build::set_alua(&new, &ports, &objects.devices);
        for t in &new.targets {
            let before = old.target(&t.name);
            let touches_reopened = t
                .portal_groups
                .iter()
                .flat_map(|g| g.luns.iter())
                .any(|l| reopened.contains(&l.backstore));
            let ports_moved = t
                .portal_groups
                .iter()
                .any(|g| moved(PortKey::PortalGroup(t.name.clone(), g.tag)));
            if before == Some(t) && !touches_reopened && !ports_moved {
                continue;
            }
            self.registry
                .set_target(build_target(t, &objects.devices, &ports));
            match before {
                None => report.push("added", "target", t.name.clone()),
                Some(o) => rtgt_api::diff::target_diff(&mut report, o, t),
            }
        }
        for t in &old.targets {
            if new.target(&t.name).is_none() {
                self.registry.remove_target(&t.name);
                report.push("removed", "target", t.name.clone());
            }
        }
        for p in &new.srp {
            let before = old.srp.iter().find(|x| x.name == p.name);
            let touches_reopened = p.luns.iter().any(|l| reopened.contains(&l.backstore));
            if before == Some(p) && !touches_reopened && !moved(PortKey::Srp(p.name.clone())) {
                continue;
            }
            self.registry
                .set_srp_port(crate::build::srp_target_port(p, &objects.devices, &ports));
            match before {
                None => report.push("added", "srp_port", p.name.clone()),
                Some(o) => rtgt_api::diff::srp_diff(&mut report, o, p),
            }
        }
        for p in &old.srp {
            if !new.srp.iter().any(|x| x.name == p.name) {
                self.registry.remove_srp_port(&p.name);
                report.push_detail(
                    "removed",
                    "srp_port",
                    p.name.clone(),
                    "its channels were logged out",
                );
            }
        }
        if new.discovery != old.discovery {
            self.registry
                .set_discovery_auth(crate::build::auth(&new.discovery.auth));
            report.push("changed", "discovery", "discovery");
        }
        self.update_sessions(&mut report);
        self.sync_srp(&mut report).await;
        self.update_srp_sessions(&mut report);
        for (addr, l) in bound {
            self.serve_portal(addr, l);
        }
        for addr in running.difference(&wanted) {
            if let Some(p) = lock(&self.portals).remove(addr) {
                let _ = p.stop.send(true);
                info!(portal = %addr, "iSCSI portal stopped");
            }
        }
        self.sync_iser(&new).await;
        nvme_changed.extend(reopened.iter().cloned());
        self.nvme
            .sync(
                &new,
                &objects.backstores,
                &objects.devices,
                nvme_bound,
                &nvme_changed,
            )
            .await;
        rtgt_api::diff::nvme_diff(&mut report, &old.nvme, &new.nvme);
        for b in &old.backstores {
            if new.backstore(&b.name).is_none() {
                objects.devices.remove(&b.name);
                if let Some(store) = objects.backstores.remove(&b.name) {
                    if let Err(e) = store.flush().await {
                        warn!(backstore = %b.name, error = %error_chain(&e), "flush of a removed backstore failed");
                    }
                }
                report.push("removed", "backstore", b.name.clone());
            }
        }
        rtgt_api::diff::alua_diff(&mut report, &old, &new);
        rtgt_api::diff::restart_sections(&mut report, &old, &new);

        // 3. Persistence.
        if new != old {
            new.save(&self.file)
                .map_err(|e| ControlError::Internal(error_chain(&e)))?;
        }
        *self.config.write().unwrap_or_else(|e| e.into_inner()) = new;
        Ok(report)
    }
}

#[async_trait]
impl Control for DaemonControl {
    fn config(&self) -> Config {
        self.config
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    async fn apply(&self, config: Config) -> Result<ChangeReport, ControlError> {
        let mut objects = self.objects.lock().await;
        let report = self.apply_locked(&mut objects, config).await?;
        for c in &report.changes {
            info!(action = %c.action, object = %c.object, name = %c.name, "applied");
        }
        Ok(report)
    }

    fn sessions(&self) -> Vec<SessionView> {
        let mut out: Vec<SessionView> = self
            .server
            .sessions()
            .into_iter()
            .map(|s| SessionView {
                id: format!("iscsi-{}", s.tsih),
                initiator: s.initiator,
                target: s.target,
                transport: s.transport.to_string(),
                session_type: match s.session_type {
                    SessionType::Normal => "normal".into(),
                    SessionType::Discovery => "discovery".into(),
                },
                isid: Some(s.isid),
                queues: None,
                queue_list: Vec::new(),
                peer: s.peer.to_string(),
                local: s.local.to_string(),
                queue_depth: s.queue_depth,
                outstanding: s.outstanding,
                commands: s.commands,
                bytes_in: s.bytes_in,
                bytes_out: s.bytes_out,
                tasks_aborted: s.tasks_aborted,
                task_management: s.task_management,
                uptime_seconds: s.uptime.as_secs(),
            })
            .collect();
        if let Some(srp) = self.srp() {
            out.extend(srp.ports().iter().flat_map(|p| srp_sessions(p)));
        }
        out.extend(self.nvme.sessions());
        out
    }

    fn force_logout(&self, id: &str) -> bool {
        if id.starts_with("srp-") {
            return self.srp().is_some_and(|s| s.logout_session(id));
        }
        if id.starts_with("nvme-") {
            return self.nvme.close(id);
        }
        id.strip_prefix("iscsi-")
            .and_then(|t| t.parse::<u16>().ok())
            .is_some_and(|tsih| self.server.force_logout(tsih))
    }

    fn ready(&self) -> bool {
        let config = self.config();
        let wanted = portals_of(&config);
        let portals = lock(&self.portals);
        wanted
            .iter()
            .all(|a| portals.get(a).is_some_and(|p| !p.task.is_finished()))
            && self.nvme.ready(&config.nvme)
    }

    fn rdma(&self) -> RdmaView {
        let Some(p) = &self.rdma_provider else {
            return RdmaView {
                provider: "none".into(),
                ..RdmaView::default()
            };
        };
        let devices = p.devices_by_addr();
        let device_of = |a: SocketAddr| {
            if a.ip().is_unspecified() {
                return "*".to_string();
            }
            devices
                .iter()
                .find(|(ip, _)| *ip == a.ip())
                .map_or_else(|| "-".to_string(), |(_, d)| d.clone())
        };
        let mut listeners: Vec<RdmaListenerView> = self
            .iser_listening()
            .into_iter()
            .map(|a| RdmaListenerView {
                fabric: "iser".into(),
                address: a.to_string(),
                device: device_of(a),
            })
            .collect();
        if let Some(srp) = self.srp() {
            listeners.extend(srp.listening().into_iter().map(|a| RdmaListenerView {
                fabric: "srp".into(),
                address: a.to_string(),
                device: device_of(a),
            }));
        }
        RdmaView {
            provider: p.kind().name().into(),
            devices: devices
                .iter()
                .map(|(a, d)| RdmaDeviceView {
                    address: a.to_string(),
                    device: d.clone(),
                })
                .collect(),
            listeners,
        }
    }

    async fn alua(&self) -> Vec<AluaView> {
        let objects = self.objects.lock().await;
        let mut out = Vec::new();
        for (name, d) in &objects.devices {
            for g in d.port_groups() {
                out.push(AluaView {
                    backstore: name.clone(),
                    group: g.id,
                    state: g.state.name().into(),
                    preferred: g.preferred,
                    relative_ports: g.relative_ports,
                    implicit: g.implicit,
                    explicit: g.explicit,
                });
            }
        }
        out
    }

    async fn set_alua_state(
        &self,
        group: u16,
        backstore: Option<&str>,
        state: rtgt_scsi::AccessState,
    ) -> Result<(), ControlError> {
        let config = self.config();
        let Some(g) = config.alua.groups.iter().find(|g| g.id == group) else {
            return Err(ControlError::Invalid {
                field: "alua".into(),
                message: format!("no target port group {group}"),
            });
        };
        let objects = self.objects.lock().await;
        for (name, dev) in &objects.devices {
            // A backstore with a state of its own for the group keeps it.
            let own = g.backstores.iter().find(|o| o.backstore == *name);
            let configured = own.map_or(g.state, |o| o.state);
            let named = backstore.is_none_or(|b| b == name);
            if !named || configured != state || !dev.port_groups().iter().any(|p| p.id == group) {
                continue;
            }
            dev.set_group_state(group, state).await.map_err(|message| {
                ControlError::Internal(format!("backstore {name}: {message}"))
            })?;
        }
        Ok(())
    }

    fn metrics(&self) -> String {
        let m = &self.metrics;
        let sessions = self.sessions();
        let mut by_transport: BTreeMap<String, u64> = [
            ("tcp".to_string(), 0),
            ("iser".to_string(), 0),
            ("srp".to_string(), 0),
            ("nvme-tcp".to_string(), 0),
        ]
        .into();
        // Per-session gauges are written here rather than registered, so that a session's
        // series end with it.
        let series: [SessionSeries; 4] = [
            ("rtgt_session_queue_depth", "gauge", |s| {
                s.queue_depth.into()
            }),
            ("rtgt_session_outstanding_commands", "gauge", |s| {
                s.outstanding.into()
            }),
            ("rtgt_session_tasks_aborted_total", "counter", |s| {
                s.tasks_aborted
            }),
            ("rtgt_session_task_management_total", "counter", |s| {
                s.task_management
            }),
        ];
        let mut lines = [const { String::new() }; 4];
        for s in &sessions {
            *by_transport.entry(s.transport.clone()).or_default() += 1;
            if s.session_type != "normal" {
                continue;
            }
            let labels = format!(
                "session=\"{}\",initiator=\"{}\",transport=\"{}\"",
                s.id,
                s.initiator.replace(['\\', '"', '\n'], "_"),
                s.transport
            );
            for ((name, _, value), out) in series.iter().zip(&mut lines) {
                out.push_str(&format!("{name}{{{labels}}} {}\n", value(s)));
            }
        }
        for (t, n) in by_transport {
            m.gauge("rtgt_sessions", &[("transport", t)]).set(n as f64);
        }
        if let Ok(objects) = self.objects.try_lock() {
            for (name, d) in &objects.devices {
                m.gauge("rtgt_lun_capacity_bytes", &[("backstore", name.clone())])
                    .set((d.num_blocks() * u64::from(d.block_size())) as f64);
                // The cache modes in effect: O_DIRECT only where the file system has it,
                // WCE as the last MODE SELECT or configuration change left it.
                m.gauge("rtgt_lun_direct", &[("backstore", name.clone())])
                    .set(f64::from(u8::from(d.is_direct())));
                m.gauge("rtgt_lun_write_cache", &[("backstore", name.clone())])
                    .set(f64::from(u8::from(d.write_cache())));
                // Which gateway of an RBD image holds its exclusive lock.
                if let Some(held) = objects
                    .backstores
                    .get(name)
                    .and_then(|b| b.holds_write_lock())
                {
                    m.gauge("rtgt_lun_write_lock_held", &[("backstore", name.clone())])
                        .set(f64::from(u8::from(held)));
                }
                for g in d.port_groups() {
                    let labels = [("backstore", name.clone()), ("group", g.id.to_string())];
                    m.gauge("rtgt_alua_access_state", &labels)
                        .set(f64::from(g.state.code()));
                    m.gauge("rtgt_alua_preferred", &labels)
                        .set(f64::from(u8::from(g.preferred)));
                }
            }
        }
        m.gauge("rtgt_portals_listening", &[])
            .set(lock(&self.portals).len() as f64);

        let mut text = m.render();
        let rdma: Vec<(String, RdmaCounters)> = lock(&self.rdma)
            .iter()
            .map(|(name, read)| (name.clone(), read()))
            .collect();
        text.push_str(&render_rdma(&rdma));
        text.push_str(&self.nvme.metrics());
        // Written here, not registered: a listener's series ends with it.
        let view = self.rdma();
        if !view.listeners.is_empty() {
            text.push_str("# TYPE rtgt_rdma_listener_info gauge\n");
            for l in &view.listeners {
                text.push_str(&format!(
                    "rtgt_rdma_listener_info{{fabric=\"{}\",address=\"{}\",provider=\"{}\",device=\"{}\"}} 1\n",
                    l.fabric, l.address, view.provider, l.device
                ));
            }
        }
        if !lines[0].is_empty() {
            for (i, ((name, kind, _), out)) in series.iter().zip(&lines).enumerate() {
                let sep = if i == 0 { "" } else { "\n" };
                text.push_str(&format!("{sep}# TYPE {name} {kind}\n{out}"));
            }
        }
        text
    }
}

/// A per-session metric: name, Prometheus type, value.
type SessionSeries = (&'static str, &'static str, fn(&SessionView) -> u64);

/// The sessions of an SRP target port as the API shows them: one per initiator port (the
/// I_T nexus), its queue depth the request limits of its channels together.
fn srp_sessions(port: &rtgt_srp::SrpPort) -> Vec<SessionView> {
    use std::sync::atomic::Ordering;
    let name = port.config().name.clone();
    port.sessions()
        .iter()
        .map(|s| {
            let channels = s.channels();
            let sum = |f: fn(&rtgt_srp::Channel) -> u64| channels.iter().map(|c| f(c)).sum();
            let addrs = channels.iter().find_map(|c| c.addrs());
            SessionView {
                id: s.id(),
                initiator: s.nexus.initiator_port.clone(),
                target: name.clone(),
                transport: "srp".into(),
                session_type: "normal".into(),
                isid: None,
                queues: None,
                queue_list: Vec::new(),
                peer: addrs.map(|a| a.0.to_string()).unwrap_or_default(),
                local: addrs.map(|a| a.1.to_string()).unwrap_or_default(),
                queue_depth: sum(|c| u64::from(c.params.req_lim)) as u32,
                outstanding: sum(|c| c.outstanding() as u64) as u32,
                commands: sum(|c| c.stats.commands.load(Ordering::Relaxed)),
                bytes_in: sum(|c| c.stats.bytes_in.load(Ordering::Relaxed)),
                bytes_out: sum(|c| c.stats.bytes_out.load(Ordering::Relaxed)),
                tasks_aborted: sum(|c| c.task_counts().0),
                task_management: sum(|c| c.task_counts().1),
                uptime_seconds: s.created.elapsed().as_secs(),
            }
        })
        .collect()
}

/// Name of the API's unix socket (in `$RUNTIME_DIRECTORY` or the state directory).
pub const API_SOCKET: &str = "rtgtd.sock";
/// Default name of the admin token file in the state directory.
pub const TOKEN_FILE: &str = "api-token";
/// Default name of the read-only token file in the state directory.
pub const READ_TOKEN_FILE: &str = "api-token-read";
/// Default group admitted to the API socket.
pub const SOCKET_GROUP: &str = "rtgt";

/// Why the API could not start.
#[derive(Debug, thiserror::Error)]
pub enum ApiStartError {
    #[error("API listener {addr}: {source}")]
    Listen {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error("API token file {file}: {source}")]
    Token {
        file: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("API TLS: {0}")]
    Tls(String),
}

impl From<ApiStartError> for DaemonError {
    fn from(e: ApiStartError) -> DaemonError {
        DaemonError::Api(Box::new(e))
    }
}

/// `f` if absolute, else `f` (or `default`) in the state directory.
fn in_state_dir(state_dir: &Path, f: Option<&Path>, default: &str) -> PathBuf {
    match f {
        Some(f) if f.is_relative() => state_dir.join(f),
        Some(f) => f.to_path_buf(),
        None => state_dir.join(default),
    }
}

/// Where the API socket is: `api.socket_path`, else `rtgtd.sock` in the service's runtime
/// directory (`$RUNTIME_DIRECTORY`, which systemd sets), else in the state directory.
pub fn api_socket_path(api: &config::ApiConfig, state_dir: &Path) -> PathBuf {
    if let Some(p) = &api.socket_path {
        return in_state_dir(state_dir, Some(p), API_SOCKET);
    }
    match std::env::var_os("RUNTIME_DIRECTORY") {
        Some(d) if !d.is_empty() => {
            let first = d
                .to_string_lossy()
                .split(':')
                .next()
                .unwrap_or_default()
                .to_string();
            PathBuf::from(first).join(API_SOCKET)
        }
        _ => state_dir.join(API_SOCKET),
    }
}

/// Gives the socket to root (or rtgtd's user) and `group`, mode 0660, or 0600 without
/// the group.
fn restrict_socket(path: &Path, group: Option<u32>) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let shared = match group {
        Some(gid) => std::os::unix::fs::chown(path, None, Some(gid)).is_ok(),
        None => false,
    };
    let mode = if shared { 0o660 } else { 0o600 };
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
}

/// Starts the API listeners of `api`: TCP listeners that take the admin or the read-only
/// bearer token (over TLS when configured), metrics listeners without a token, and the
/// unix socket that admits root, rtgtd's user and the socket group. The listeners stop
/// when `stop` turns true. With the default listener (no `api` section), a port in use is
/// a warning: the socket still serves.
///
/// Returns the listener tasks and the API handle, whose [`rtgt_api::server::Api::apply`]
/// applies a whole document in turn with API requests.
pub async fn serve_api(
    control: Arc<DaemonControl>,
    api: &config::ApiConfig,
    explicit: bool,
    stop: watch::Receiver<bool>,
) -> Result<(Vec<JoinHandle<()>>, rtgt_api::server::Api), ApiStartError> {
    use rtgt_api::auth::{Guard, SocketPolicy, Tokens};
    let router_api = rtgt_api::server::Api::new(control.clone());
    let state_dir = control.state_dir.clone();
    let mut tasks = Vec::new();
    let tls = match &api.tls {
        Some(t) => Some(
            rtgt_api::tls::server_config(
                &in_state_dir(&state_dir, Some(&t.cert), ""),
                &in_state_dir(&state_dir, Some(&t.key), ""),
            )
            .map_err(ApiStartError::Tls)?,
        ),
        None => None,
    };
    let tokens = if api.listen.is_empty() {
        None
    } else {
        let load = |f: Option<&Path>, default: &str| {
            let file = in_state_dir(&state_dir, f, default);
            rtgt_api::token::load_or_create(&file)
                .map(Arc::<str>::from)
                .map_err(|source| ApiStartError::Token { file, source })
        };
        Some(Tokens {
            admin: load(api.token_file.as_deref(), TOKEN_FILE)?,
            read: load(api.read_token_file.as_deref(), READ_TOKEN_FILE)?,
        })
    };
    let wait = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let listeners = api
        .listen
        .iter()
        .map(|a| (a, false))
        .chain(api.metrics_listen.iter().map(|a| (a, true)));
    for (addr, metrics_only) in listeners {
        let listener = match TcpListener::bind(addr).await {
            Ok(l) => l,
            Err(source) if !explicit => {
                warn!(listener = %addr, error = %source, "API port unavailable: serving the API on the unix socket only");
                continue;
            }
            Err(source) => {
                return Err(ApiStartError::Listen {
                    addr: addr.to_string(),
                    source,
                })
            }
        };
        let guard = match (&tokens, metrics_only) {
            (Some(t), false) => Guard::Tokens(t.clone()),
            _ => Guard::Metrics,
        };
        let router = router_api.router(guard);
        let local = listener.local_addr().unwrap_or(*addr);
        if metrics_only {
            info!(listener = %local, tls = tls.is_some(), "metrics listening (no token)");
        } else {
            info!(listener = %local, tls = tls.is_some(), "API listening (bearer token)");
        }
        let stop = wait(stop.clone());
        let tls = tls.clone();
        tasks.push(tokio::spawn(async move {
            if let Err(e) = rtgt_api::server::serve_tcp(listener, tls, router, stop).await {
                error!(error = %e, "API listener failed");
            }
        }));
    }
    if api.socket {
        let path = api_socket_path(api, &state_dir);
        let _ = std::fs::remove_file(&path);
        let listen_err = |source| ApiStartError::Listen {
            addr: path.display().to_string(),
            source,
        };
        let listener = tokio::net::UnixListener::bind(&path).map_err(listen_err)?;
        let group = api.socket_group.as_deref().unwrap_or(SOCKET_GROUP);
        let policy = SocketPolicy::new(group);
        restrict_socket(&path, policy.group.as_ref().map(|g| g.1)).map_err(listen_err)?;
        info!(socket = %path.display(), group = policy.group.as_ref().map(|g| g.0.as_str()), "API listening (root, rtgtd's user and the socket group)");
        let router = router_api.router(Guard::Socket(policy));
        let stop = wait(stop.clone());
        tasks.push(tokio::spawn(async move {
            if let Err(e) = rtgt_api::server::serve_unix(listener, router, stop).await {
                error!(error = %e, "API socket failed");
            }
        }));
    }
    Ok((tasks, router_api))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rdma_counters() {
        assert_eq!(render_rdma(&[]), "");
        let c = RdmaCounters {
            rx_packets: 10,
            icrc_errors: 2,
            retransmits: 3,
            placed: 7,
            ..Default::default()
        };
        let text = render_rdma(&[("rtgt0".into(), c)]);
        assert!(text.contains("# TYPE rtgt_rdma_icrc_errors_total counter"));
        assert!(text.contains("rtgt_rdma_rx_packets_total{device=\"rtgt0\"} 10"));
        assert!(text.contains("rtgt_rdma_retransmits_total{device=\"rtgt0\"} 3"));
        assert!(text.contains("rtgt_rdma_rx_placed_total{device=\"rtgt0\"} 7"));
        assert!(text.contains("rtgt_rdma_rnr_naks_sent_total{device=\"rtgt0\"} 0"));
    }
}
