//! NVMe over Fabrics in the daemon: the `nvme` section of the configuration made into
//! subsystems, namespaces and ports of one [`Targets`], and the listeners of its ports
//! (NVMe/TCP, and NVMe/RDMA through RDMA/CM on the daemon's RDMA provider) and discovery
//! addresses. An apply binds new listeners first (that can fail), then
//! [`NvmeService::sync`] changes the rest, which cannot.
//!
//! Asymmetric namespace access follows ALUA: a namespace's ANA state through a port is the
//! access state of its logical unit's target port group that the port is in (`alua_group`),
//! and every change of those states (the configuration, the API, SET TARGET PORT GROUPS,
//! another gateway) is an ANA change event for the controllers of its subsystems.

use std::collections::{BTreeMap, HashSet};
use std::hash::{Hash, Hasher};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, Weak};

use rtgt_api::config::Config;
use rtgt_api::nvme::{Nvme, NvmeSubsystem, NvmeTransport};
use rtgt_api::{ControlError, QueueView, SessionView};
use rtgt_backstore::{Backstore, BufPool};
use rtgt_nvme::admin::{ana, trtype};
use rtgt_nvme::ctrl::{Controller, Kind};
use rtgt_nvme::queue::Scope;
use rtgt_nvme::subsys::{Access, Limits, Namespace, Port, Subsystem, Targets};
use rtgt_rdma_channel::cm::Provider;
use rtgt_scsi::{AccessState, Device};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};
use tracing::{info, warn};

/// Connections one listener serves at most; more wait in the kernel's backlog.
const MAX_CONNECTIONS: usize = 1024;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A listening address and what it serves.
struct Listener {
    scope: Scope,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

/// Where a listener listens: a transport and an address.
type Key = (NvmeTransport, SocketAddr);

fn fabric(t: NvmeTransport) -> &'static str {
    match t {
        NvmeTransport::Tcp => "NVMe/TCP",
        NvmeTransport::Rdma => "NVMe/RDMA",
    }
}

/// A listening socket or RDMA/CM listener.
enum Socket {
    Tcp(TcpListener),
    Rdma(rtgt_rdma_channel::cm::Listener),
}

/// A listener bound by an apply, not serving yet.
pub struct Bound {
    key: Key,
    scope: Scope,
    socket: Socket,
}

/// NVMe over Fabrics subsystems, their controllers and the NVMe/TCP and NVMe/RDMA
/// listeners.
pub struct NvmeService {
    targets: Arc<Targets>,
    rdma: Option<Provider>,
    listeners: Mutex<BTreeMap<Key, Listener>>,
    /// The logical units whose target port group states the namespaces follow, each with
    /// the task that turns their changes into ANA change events.
    followed: Mutex<Vec<(Weak<Device>, tokio::task::AbortHandle)>>,
}

/// A namespace's access states: its logical unit's target port groups.
struct LuAccess(Arc<Device>);

impl Access for LuAccess {
    fn state(&self, group: u16) -> u8 {
        match self.0.access_state(group) {
            AccessState::ActiveOptimized => ana::OPTIMIZED,
            AccessState::ActiveNonOptimized => ana::NON_OPTIMIZED,
            AccessState::Standby | AccessState::Unavailable => ana::INACCESSIBLE,
            AccessState::Offline => ana::PERSISTENT_LOSS,
            AccessState::Transitioning => ana::CHANGE,
        }
    }
}

/// Tells the controllers of the subsystems with a namespace on `store` of every change of
/// its logical unit's target port group states (an ANA change) and of every resize made
/// outside rtgtd (another gateway, the cluster's tools: a namespace change, Identify then
/// reports the new size); ends with the logical unit.
async fn follow_lu(
    targets: Weak<Targets>,
    store: Weak<dyn Backstore>,
    mut alua: watch::Receiver<u64>,
    mut sizes: Option<watch::Receiver<u64>>,
) {
    let on_store = |ns: &Namespace| std::ptr::addr_eq(Arc::as_ptr(&ns.backstore), store.as_ptr());
    loop {
        let resized = async {
            match sizes.as_mut() {
                Some(s) => s.changed().await.is_ok(),
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            r = alua.changed() => {
                let (Ok(()), Some(t)) = (r, targets.upgrade()) else {
                    return;
                };
                t.ana_changed(on_store);
            }
            more = resized => {
                if !more {
                    sizes = None;
                    continue;
                }
                let Some(t) = targets.upgrade() else {
                    return;
                };
                for s in t.subsystems() {
                    for nsid in s.nsids() {
                        if s.namespace(nsid).is_some_and(|ns| on_store(&ns)) {
                            t.namespace_changed(&s.nqn, nsid);
                        }
                    }
                }
            }
        }
    }
}

/// A serial number for a subsystem that has none configured: stable across restarts,
/// different on every host.
fn derived_serial(nqn: &str) -> String {
    let host = std::fs::read_to_string("/etc/machine-id").unwrap_or_default();
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (host.trim(), nqn).hash(&mut h);
    format!("{:016x}", h.finish())
}

/// A namespace's identifiers from its logical unit's: the NGUID is the NAA designator's 16
/// bytes (one identity for the backstore whichever protocol reaches it), the UUID a
/// version 4 layout of a hash of it. No EUI-64 (it needs an IEEE OUI). Write protected when
/// the backstore is configured `read_only`, as its logical unit is.
fn namespace(nsid: u32, store: &Arc<dyn Backstore>, dev: Option<&Arc<Device>>) -> Namespace {
    let wwn = dev.map_or(0, |d| d.config().wwn);
    let read_only = dev.is_some_and(|d| d.config().read_only);
    let mut uuid = [0u8; 16];
    for (i, chunk) in uuid.chunks_mut(8).enumerate() {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        ("nvme-uuid", i, wwn).hash(&mut h);
        chunk.copy_from_slice(&h.finish().to_be_bytes());
    }
    uuid[6] = (uuid[6] & 0x0f) | 0x40;
    uuid[8] = (uuid[8] & 0x3f) | 0x80;
    Namespace {
        nsid,
        backstore: store.clone(),
        nguid: wwn.to_be_bytes(),
        eui64: [0; 8],
        uuid,
        read_only,
        access: dev.map(|d| Arc::new(LuAccess(d.clone())) as Arc<dyn Access>),
    }
}

impl NvmeService {
    /// The service; its RDMA ports listen on `rdma` (without one they are not served).
    pub fn new(pool: Arc<BufPool>, rdma: Option<Provider>) -> NvmeService {
        NvmeService {
            targets: Targets::new(pool, Limits::default()),
            rdma,
            listeners: Mutex::new(BTreeMap::new()),
            followed: Mutex::new(Vec::new()),
        }
    }

    /// What each listener of the section serves: its ports (RDMA ones when there is an RDMA
    /// provider) and discovery addresses.
    fn wanted(&self, nvme: &Nvme) -> BTreeMap<Key, Scope> {
        let ports = nvme
            .ports
            .iter()
            .filter(|p| p.transport == NvmeTransport::Tcp || self.rdma.is_some())
            .map(|p| ((p.transport, p.listen), Scope::Port(p.id)));
        let discovery = nvme
            .discovery_listen
            .iter()
            .map(|a| ((NvmeTransport::Tcp, *a), Scope::Discovery));
        ports.chain(discovery).collect()
    }

    /// Listens on `key`.
    async fn listen(&self, (transport, addr): Key) -> Result<Socket, String> {
        match transport {
            NvmeTransport::Tcp => TcpListener::bind(addr)
                .await
                .map(Socket::Tcp)
                .map_err(|e| e.to_string()),
            NvmeTransport::Rdma => {
                let rdma = self.rdma.as_ref().ok_or("no RDMA provider")?;
                rdma.listen(addr)
                    .map(Socket::Rdma)
                    .map_err(|e| e.to_string())
            }
        }
    }

    /// Binds the listeners `nvme` asks for that are not served yet (or serve another
    /// scope), before anything changes. The error names the field.
    pub async fn bind(&self, nvme: &Nvme) -> Result<Vec<Bound>, ControlError> {
        let running: BTreeMap<Key, Scope> = lock(&self.listeners)
            .iter()
            .map(|(k, l)| (*k, l.scope))
            .collect();
        let mut out = Vec::new();
        for (key, scope) in self.wanted(nvme) {
            if running.get(&key) == Some(&scope) {
                continue;
            }
            if running.contains_key(&key) {
                // Same address, other scope: rebound in `sync` once the old one stops.
                continue;
            }
            let socket = self.listen(key).await.map_err(|e| ControlError::Conflict {
                field: "nvme".into(),
                message: format!("{} listener {}: cannot listen: {e}", fabric(key.0), key.1),
            })?;
            out.push(Bound { key, scope, socket });
        }
        Ok(out)
    }

    fn serve(&self, b: Bound) {
        let (stop, stop_rx) = watch::channel(false);
        let targets = self.targets.clone();
        let Bound { key, scope, socket } = b;
        let task = match (socket, &self.rdma) {
            (Socket::Tcp(l), _) => tokio::spawn(serve_tcp(l, key.1, targets, scope, stop_rx)),
            // On the device's engine thread (if it has one), as the queues it accepts.
            (Socket::Rdma(l), Some(rdma)) => rdma.spawn(serve_rdma(l, targets, scope, stop_rx)),
            (Socket::Rdma(_), None) => unreachable!("an RDMA listener needs the provider"),
        };
        let what = match scope {
            Scope::Port(_) => "port listening",
            Scope::Discovery => "discovery listening",
        };
        info!(listener = %key.1, "{} {what}", fabric(key.0));
        lock(&self.listeners).insert(key, Listener { scope, stop, task });
    }

    /// Makes the subsystems, namespaces and ports match the `nvme` section of `config`
    /// (and the ports' target port groups its `alua` section), starts the listeners `bound`
    /// and stops those no longer wanted. `changed` are backstores opened anew or resized by
    /// this change (their namespaces take the new store; hosts hear of it).
    pub async fn sync(
        &self,
        config: &Config,
        stores: &BTreeMap<String, Arc<dyn Backstore>>,
        devices: &BTreeMap<String, Arc<Device>>,
        bound: Vec<Bound>,
        changed: &HashSet<String>,
    ) {
        let nvme = &config.nvme;
        let t = &self.targets;
        for old in t.subsystems() {
            let keep = nvme.subsystems.iter().find(|s| s.nqn == old.nqn);
            let serial = keep.map(|s| s.serial.clone().unwrap_or_else(|| derived_serial(&s.nqn)));
            if serial.as_deref() != Some(old.serial.as_str()) {
                t.remove_subsystem(&old.nqn);
                info!(subsystem = %old.nqn, "NVMe subsystem removed");
            }
        }
        for s in &nvme.subsystems {
            let sub = match t.subsystem(&s.nqn) {
                Some(sub) => {
                    for c in t.set_hosts(&sub, hosts(s)) {
                        info!(subsystem = %s.nqn, host = %c.host_nqn, cntlid = c.cntlid,
                            "host no longer admitted: controller closed");
                    }
                    sub
                }
                None => {
                    let serial = s.serial.clone().unwrap_or_else(|| derived_serial(&s.nqn));
                    info!(subsystem = %s.nqn, "NVMe subsystem added");
                    t.add_subsystem(Subsystem::new(&s.nqn, &serial, hosts(s)))
                }
            };
            for nsid in sub.nsids() {
                if !s.namespaces.iter().any(|n| n.nsid == nsid) && sub.remove_namespace(nsid) {
                    t.namespace_changed(&s.nqn, nsid);
                }
            }
            for n in &s.namespaces {
                let Some(store) = stores.get(&n.backstore) else {
                    continue;
                };
                let same = sub.namespace(n.nsid).is_some_and(|ns| {
                    Arc::ptr_eq(&ns.backstore, store) && !changed.contains(&n.backstore)
                });
                if same {
                    continue;
                }
                let existed = sub.namespace(n.nsid).is_some();
                sub.add_namespace(namespace(n.nsid, store, devices.get(&n.backstore)));
                if existed || !t.controllers_of(&s.nqn).is_empty() {
                    t.namespace_changed(&s.nqn, n.nsid);
                }
            }
        }
        self.follow(nvme, stores, devices);
        t.set_port_groups(config.nvme_port_groups(), config.alua.transition_secs);
        if self.rdma.is_none() {
            for p in nvme
                .ports
                .iter()
                .filter(|p| p.transport == NvmeTransport::Rdma)
            {
                warn!(port = p.id, listen = %p.listen, "NVMe/RDMA port not served: RDMA is off (the rdma section)");
            }
        }
        t.set_ports(
            nvme.ports
                .iter()
                .filter(|p| p.transport == NvmeTransport::Tcp || self.rdma.is_some())
                .map(|p| Port {
                    id: p.id,
                    trtype: match p.transport {
                        NvmeTransport::Tcp => trtype::TCP,
                        NvmeTransport::Rdma => trtype::RDMA,
                    },
                    adrfam: if p.listen.is_ipv4() {
                        trtype::ADRFAM_IPV4
                    } else {
                        trtype::ADRFAM_IPV6
                    },
                    traddr: p.listen.ip().to_string(),
                    trsvcid: p.listen.port().to_string(),
                    in_capsule: p.in_capsule(),
                })
                .collect(),
        );
        // Listeners: stop those not wanted (or wanted with another scope), then serve.
        let want = self.wanted(nvme);
        let stopped: Vec<(Key, Listener)> = {
            let mut ls = lock(&self.listeners);
            let gone: Vec<Key> = ls
                .iter()
                .filter(|(a, l)| want.get(a) != Some(&l.scope))
                .map(|(a, _)| *a)
                .collect();
            gone.into_iter()
                .filter_map(|a| ls.remove(&a).map(|l| (a, l)))
                .collect()
        };
        for (key, l) in stopped {
            let _ = l.stop.send(true);
            let _ = l.task.await;
            info!(listener = %key.1, "{} listener stopped", fabric(key.0));
        }
        for b in bound {
            self.serve(b);
        }
        // An address that changed scope: bound now that its old listener is gone.
        let missing: Vec<(Key, Scope)> = {
            let ls = lock(&self.listeners);
            want.into_iter()
                .filter(|(k, _)| !ls.contains_key(k))
                .collect()
        };
        for (key, scope) in missing {
            match self.listen(key).await {
                Ok(socket) => self.serve(Bound { key, scope, socket }),
                Err(e) => {
                    warn!(listener = %key.1, error = %e, "{} listener could not start", fabric(key.0))
                }
            }
        }
    }

    /// Follows the target port group states and outside resizes of every logical unit a
    /// namespace is on.
    fn follow(
        &self,
        nvme: &Nvme,
        stores: &BTreeMap<String, Arc<dyn Backstore>>,
        devices: &BTreeMap<String, Arc<Device>>,
    ) {
        let mut followed = lock(&self.followed);
        followed.retain(|(d, task)| d.strong_count() > 0 && !task.is_finished());
        let names: HashSet<&str> = nvme
            .subsystems
            .iter()
            .flat_map(|s| &s.namespaces)
            .map(|n| n.backstore.as_str())
            .collect();
        for name in names {
            let (Some(dev), Some(store)) = (devices.get(name), stores.get(name)) else {
                continue;
            };
            if followed
                .iter()
                .any(|(d, _)| std::ptr::eq(d.as_ptr(), Arc::as_ptr(dev)))
            {
                continue;
            }
            let task = tokio::spawn(follow_lu(
                Arc::downgrade(&self.targets),
                Arc::downgrade(store),
                dev.alua_changes(),
                store.capacity_changes(),
            ));
            followed.push((Arc::downgrade(dev), task.abort_handle()));
        }
    }

    /// Stops every listener; every connection ends and every controller closes.
    pub async fn shutdown(&self) {
        let ls = std::mem::take(&mut *lock(&self.listeners));
        for (_, l) in ls {
            let _ = l.stop.send(true);
            let _ = l.task.await;
        }
        for c in self.targets.controllers() {
            c.close();
        }
    }

    /// The live controllers as the API shows sessions: `nvme-<cntlid>`.
    pub fn sessions(&self) -> Vec<SessionView> {
        self.targets
            .controllers()
            .iter()
            .filter(|c| !c.is_closed())
            .map(|c| session(c, self.targets.limits))
            .collect()
    }

    /// Whether every listener `nvme` asks for is serving.
    pub fn ready(&self, nvme: &Nvme) -> bool {
        let ls = lock(&self.listeners);
        self.wanted(nvme)
            .keys()
            .all(|k| ls.get(k).is_some_and(|l| !l.task.is_finished()))
    }

    /// Prometheus series of the subsystems and their controllers, written at scrape time
    /// so that a controller's series end with it.
    pub fn metrics(&self) -> String {
        use std::fmt::Write;
        use std::sync::atomic::Ordering::Relaxed;
        let subsystems = self.targets.subsystems();
        if subsystems.is_empty() {
            return String::new();
        }
        let mut out = String::new();
        let label = |s: &str| s.replace(['\\', '"', '\n'], "_");
        let _ = writeln!(out, "# TYPE rtgt_nvme_namespaces gauge");
        for s in &subsystems {
            let _ = writeln!(
                out,
                "rtgt_nvme_namespaces{{subsystem=\"{}\"}} {}",
                label(&s.nqn),
                s.nsids().len()
            );
        }
        let _ = writeln!(out, "# TYPE rtgt_nvme_controllers gauge");
        let ctrls: Vec<_> = self
            .targets
            .controllers()
            .into_iter()
            .filter(|c| !c.is_closed())
            .collect();
        for s in &subsystems {
            let n = ctrls.iter().filter(|c| c.subsys_nqn() == s.nqn).count();
            let _ = writeln!(
                out,
                "rtgt_nvme_controllers{{subsystem=\"{}\"}} {n}",
                label(&s.nqn)
            );
        }
        type Series = (
            &'static str,
            &'static str,
            fn(&rtgt_nvme::ctrl::Stats) -> u64,
        );
        let series: [Series; 5] = [
            ("rtgt_nvme_queues", "gauge", |s| s.queues.into()),
            ("rtgt_nvme_outstanding_commands", "gauge", |s| {
                s.outstanding.into()
            }),
            ("rtgt_nvme_commands_total", "counter", |s| s.commands),
            ("rtgt_nvme_written_bytes_total", "counter", |s| s.bytes_in),
            ("rtgt_nvme_read_bytes_total", "counter", |s| s.bytes_out),
        ];
        let io: Vec<_> = ctrls
            .iter()
            .filter(|c| matches!(c.kind, Kind::Io(_)))
            .collect();
        if io.is_empty() {
            return out;
        }
        let stats: Vec<_> = io.iter().map(|c| c.stats()).collect();
        for (name, kind, value) in series {
            let _ = writeln!(out, "# TYPE {name} {kind}");
            for (c, st) in io.iter().zip(&stats) {
                let _ = writeln!(
                    out,
                    "{name}{{session=\"nvme-{}\",subsystem=\"{}\",host=\"{}\"}} {}",
                    c.cntlid,
                    label(c.subsys_nqn()),
                    label(&c.host_nqn),
                    value(st)
                );
            }
        }
        // Each queue's own counters.
        type QueueSeries = (
            &'static str,
            &'static str,
            fn(&rtgt_nvme::ctrl::QueueStats) -> u64,
        );
        let per_queue: [QueueSeries; 4] = [
            ("rtgt_nvme_queue_outstanding_commands", "gauge", |q| {
                q.outstanding.load(Relaxed).into()
            }),
            ("rtgt_nvme_queue_commands_total", "counter", |q| {
                q.commands.load(Relaxed)
            }),
            ("rtgt_nvme_queue_written_bytes_total", "counter", |q| {
                q.bytes_in.load(Relaxed)
            }),
            ("rtgt_nvme_queue_read_bytes_total", "counter", |q| {
                q.bytes_out.load(Relaxed)
            }),
        ];
        let queues: Vec<_> = io.iter().map(|c| c.queue_stats()).collect();
        for (name, kind, value) in per_queue {
            let _ = writeln!(out, "# TYPE {name} {kind}");
            for (c, qs) in io.iter().zip(&queues) {
                for (qid, q) in qs {
                    let _ = writeln!(
                        out,
                        "{name}{{session=\"nvme-{}\",subsystem=\"{}\",qid=\"{qid}\"}} {}",
                        c.cntlid,
                        label(c.subsys_nqn()),
                        value(q)
                    );
                }
            }
        }
        out
    }

    /// Closes controller `id` (`nvme-<cntlid>`): its queues' connections end.
    pub fn close(&self, id: &str) -> bool {
        let Some(cntlid) = id.strip_prefix("nvme-").and_then(|n| n.parse::<u16>().ok()) else {
            return false;
        };
        let found = self
            .targets
            .controllers()
            .into_iter()
            .find(|c| c.cntlid == cntlid && !c.is_closed());
        found.inspect(|c| c.close()).is_some()
    }
}

/// Serves the NVMe/TCP connections of `listener` until told to stop, then ends them.
async fn serve_tcp(
    listener: TcpListener,
    addr: SocketAddr,
    targets: Arc<Targets>,
    scope: Scope,
    mut stop_rx: watch::Receiver<bool>,
) {
    let mut conns = JoinSet::new();
    loop {
        while conns.try_join_next().is_some() {}
        tokio::select! {
            r = listener.accept(), if conns.len() < MAX_CONNECTIONS => match r {
                Ok((stream, _)) => {
                    conns.spawn(rtgt_nvme::tcp_queue::serve(targets.clone(), stream, scope));
                }
                Err(e) => {
                    warn!(listener = %addr, error = %e, "NVMe/TCP accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
            },
            _ = conns.join_next(), if conns.len() >= MAX_CONNECTIONS => {}
            r = stop_rx.changed() => if r.is_err() || *stop_rx.borrow() {
                break;
            },
        }
    }
    // Dropping a connection's task ends its queue (and an admin queue's controller).
    conns.shutdown().await;
}

/// Serves the NVMe/RDMA connection requests of `listener` until told to stop, then ends
/// their queues. Each queue runs where the device that owns its queue pair runs.
async fn serve_rdma(
    mut listener: rtgt_rdma_channel::cm::Listener,
    targets: Arc<Targets>,
    scope: Scope,
    mut stop_rx: watch::Receiver<bool>,
) {
    let mut conns = JoinSet::new();
    loop {
        while conns.try_join_next().is_some() {}
        tokio::select! {
            r = listener.accept(), if conns.len() < MAX_CONNECTIONS => match r {
                Some(req) => {
                    let rt = req.runtime();
                    conns.spawn_on(rtgt_nvme::rdma_queue::serve(targets.clone(), req, scope), &rt);
                }
                None => break,
            },
            _ = conns.join_next(), if conns.len() >= MAX_CONNECTIONS => {}
            r = stop_rx.changed() => if r.is_err() || *stop_rx.borrow() {
                break;
            },
        }
    }
    drop(listener);
    conns.shutdown().await;
}

fn hosts(s: &NvmeSubsystem) -> Option<Vec<String>> {
    (!s.allow_any_host).then(|| s.hosts.clone())
}

fn session(c: &Controller, limits: Limits) -> SessionView {
    let st = c.stats();
    let addrs = c.addrs();
    let queues = st.queues;
    use std::sync::atomic::Ordering::Relaxed;
    let queue_list = c
        .queue_stats()
        .iter()
        .map(|(qid, q)| QueueView {
            qid: *qid,
            size: q.size,
            peer: q.peer.map(|p| p.to_string()).unwrap_or_default(),
            outstanding: q.outstanding.load(Relaxed),
            commands: q.commands.load(Relaxed),
            bytes_in: q.bytes_in.load(Relaxed),
            bytes_out: q.bytes_out.load(Relaxed),
        })
        .collect();
    SessionView {
        id: format!("nvme-{}", c.cntlid),
        initiator: c.host_nqn.clone(),
        target: c.subsys_nqn().to_string(),
        transport: c.transport().name().into(),
        session_type: match c.kind {
            Kind::Io(_) => "normal".into(),
            Kind::Discovery => "discovery".into(),
        },
        isid: None,
        queues: Some(queues),
        queue_list,
        peer: addrs.map(|a| a.0.to_string()).unwrap_or_default(),
        local: addrs.map(|a| a.1.to_string()).unwrap_or_default(),
        queue_depth: queues.saturating_sub(1) * u32::from(limits.queue_size),
        outstanding: st.outstanding,
        commands: st.commands,
        bytes_in: st.bytes_in,
        bytes_out: st.bytes_out,
        tasks_aborted: 0,
        task_management: 0,
        uptime_seconds: c.created.elapsed().as_secs(),
    }
}
