//! What an NVMe over Fabrics target serves: subsystems (an NQN, its namespaces over
//! backstores and the hosts it admits), the ports hosts reach them through (for the
//! discovery log), and the controllers hosts create with Connect ([`Targets::connect`]).
//!
//! Controllers are dynamic: an admin queue's Connect (controller ID 0xffff) creates one with
//! the next free ID, and an I/O queue's Connect names it, from the same host, for the same
//! subsystem. The well-known discovery subsystem answers every host with the subsystems that
//! host may use, on every port.
//!
//! Asymmetric namespace access: every namespace is an ANA group of its own (its group ID is
//! its namespace ID), and its state through a controller is what its [`Access`] says of the
//! target port group of the port the controller's admin queue came through; a namespace
//! without one is optimized everywhere.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, RwLock, Weak};

use rtgt_backstore::{Backstore, BufPool};

use crate::admin::{trtype, DiscoveryEntry};
use crate::ctrl::{Controller, Kind};
use crate::fabrics::{status as fstatus, ConnectData};
use crate::sqe::{sct, Status};

/// The discovery subsystem's NQN.
pub const DISCOVERY_NQN: &str = "nqn.2014-08.org.nvmexpress.discovery";
/// The controller ID an admin queue's Connect asks with: any (dynamic model).
pub const CNTLID_DYNAMIC: u16 = 0xffff;
/// The largest controller ID.
pub const CNTLID_MAX: u16 = 0xffef;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Where a namespace's asymmetric access state comes from: the access state of its
/// logical unit's target port groups (the ALUA groups SCSI ports share).
pub trait Access: Send + Sync {
    /// The ANA state ([`crate::admin::ana`]) of the namespace through a port of target port
    /// group `group`.
    fn state(&self, group: u16) -> u8;
}

/// A namespace: a backstore with the identifiers hosts know it by.
pub struct Namespace {
    pub nsid: u32,
    pub backstore: Arc<dyn Backstore>,
    pub nguid: [u8; 16],
    pub eui64: [u8; 8],
    pub uuid: [u8; 16],
    /// Write protected whatever the backstore allows (NSATTR bit 0; writes fail with
    /// Namespace Is Write Protected).
    pub read_only: bool,
    /// Its access state per target port group; `None`: optimized through every port.
    pub access: Option<Arc<dyn Access>>,
}

impl Namespace {
    /// Its ANA group's ID (every namespace is a group of its own).
    pub fn ana_group(&self) -> u32 {
        self.nsid
    }

    /// Its ANA state through a port of target port group `group`.
    pub fn ana_state(&self, group: u16) -> u8 {
        self.access
            .as_ref()
            .map_or(crate::admin::ana::OPTIMIZED, |a| a.state(group))
    }
}

impl std::fmt::Debug for Namespace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Namespace")
            .field("nsid", &self.nsid)
            .finish_non_exhaustive()
    }
}

/// An NVM subsystem.
#[derive(Debug)]
pub struct Subsystem {
    pub nqn: String,
    /// Serial number of its controllers (Identify Controller, at most 20 characters).
    pub serial: String,
    pub model: String,
    /// The host NQNs it admits; `None`: any host.
    hosts: RwLock<Option<Vec<String>>>,
    namespaces: RwLock<BTreeMap<u32, Arc<Namespace>>>,
}

impl Subsystem {
    pub fn new(nqn: &str, serial: &str, hosts: Option<Vec<String>>) -> Subsystem {
        Subsystem {
            nqn: nqn.into(),
            serial: serial.into(),
            model: "rtgt".into(),
            hosts: RwLock::new(hosts),
            namespaces: RwLock::new(BTreeMap::new()),
        }
    }

    /// Adds (or replaces) a namespace.
    pub fn add_namespace(&self, ns: Namespace) {
        self.namespaces
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(ns.nsid, Arc::new(ns));
    }

    pub fn namespace(&self, nsid: u32) -> Option<Arc<Namespace>> {
        self.namespaces
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&nsid)
            .cloned()
    }

    /// The namespace IDs, in order.
    pub fn nsids(&self) -> Vec<u32> {
        self.namespaces
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .keys()
            .copied()
            .collect()
    }

    /// Removes a namespace; returns whether it was there.
    pub fn remove_namespace(&self, nsid: u32) -> bool {
        self.namespaces
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&nsid)
            .is_some()
    }

    pub fn admits(&self, host_nqn: &str) -> bool {
        self.hosts
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .is_none_or(|h| h.iter().any(|n| n == host_nqn))
    }
}

/// A port hosts reach the subsystems through, as the discovery log lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Port {
    pub id: u16,
    /// [`trtype::TCP`] or [`trtype::RDMA`].
    pub trtype: u8,
    pub adrfam: u8,
    pub traddr: String,
    pub trsvcid: String,
    /// Data an I/O command may carry in its capsule through the port, in bytes (Identify
    /// Controller's IOCCSZ for controllers created through it): writes up to it need no
    /// R2T (TCP) or RDMA READ (RDMA).
    pub in_capsule: u32,
}

/// In-capsule data every NVMe/TCP admin queue takes (the transport's fixed 8 KiB), and
/// what controllers not created through a port report.
pub const ADMIN_IN_CAPSULE: u32 = 8192;

/// Limits every controller has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// I/O queues a controller may have.
    pub io_queues: u16,
    /// Entries of each queue (its most commands outstanding).
    pub queue_size: u16,
    /// Largest transfer of one command, as a power of two of 4 KiB (MDTS).
    pub mdts: u8,
}

impl Limits {
    /// The largest transfer of one command in bytes (MDTS); a longer one is Invalid Field.
    pub fn max_transfer(&self) -> usize {
        4096 << self.mdts
    }
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            io_queues: 16,
            queue_size: 128,
            mdts: 8,
        }
    }
}

/// Offsets of Connect's fields a refusal names: QID and SQSIZE in the command, CNTLID in
/// the data.
pub mod connect_offset {
    pub const QID: u16 = 42;
    pub const SQSIZE: u16 = 44;
    pub const CNTLID: u16 = 16;
}

/// Why a Connect is refused: its status and, for invalid parameters, where (completion
/// DW0: the offset of the parameter, bit 16 set when it is in the command rather than the
/// data).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectRefused {
    pub status: Status,
    pub dw0: u32,
}

impl ConnectRefused {
    /// Invalid parameter at byte `offset` of the command (`in_command`) or of its data.
    pub fn invalid(in_command: bool, offset: u16) -> ConnectRefused {
        ConnectRefused {
            status: Status::error(sct::COMMAND_SPECIFIC, fstatus::CONNECT_INVALID_PARAMETERS),
            dw0: u32::from(offset) | u32::from(in_command) << 16,
        }
    }

    /// No such subsystem (here): invalid SUBNQN in the data.
    pub fn unknown_subsystem() -> ConnectRefused {
        ConnectRefused::invalid(false, 256)
    }

    fn host() -> ConnectRefused {
        ConnectRefused {
            status: Status::error(sct::COMMAND_SPECIFIC, fstatus::CONNECT_INVALID_HOST),
            dw0: 0,
        }
    }
}

/// The subsystems, ports and live controllers of one target.
#[derive(Debug)]
pub struct Targets {
    me: Weak<Targets>,
    subsystems: RwLock<BTreeMap<String, Arc<Subsystem>>>,
    ports: RwLock<Vec<Port>>,
    /// The target port group of each port (by port ID); a port not listed is in group 0.
    port_groups: RwLock<BTreeMap<u16, u16>>,
    /// ANA transition time, in seconds (Identify Controller ANATT).
    ana_transition_secs: std::sync::atomic::AtomicU8,
    controllers: Mutex<BTreeMap<u16, Weak<Controller>>>,
    pub limits: Limits,
    pub pool: Arc<BufPool>,
    /// Discovery log generation: changes with the subsystems and ports.
    genctr: std::sync::atomic::AtomicU64,
}

impl Targets {
    pub fn new(pool: Arc<BufPool>, limits: Limits) -> Arc<Targets> {
        Arc::new_cyclic(|me| Targets {
            me: me.clone(),
            subsystems: RwLock::new(BTreeMap::new()),
            ports: RwLock::new(Vec::new()),
            port_groups: RwLock::new(BTreeMap::new()),
            ana_transition_secs: std::sync::atomic::AtomicU8::new(0),
            controllers: Mutex::new(BTreeMap::new()),
            limits,
            pool,
            genctr: std::sync::atomic::AtomicU64::new(0),
        })
    }

    fn changed(&self) {
        self.genctr
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    pub fn add_subsystem(&self, s: Subsystem) -> Arc<Subsystem> {
        let s = Arc::new(s);
        self.subsystems
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(s.nqn.clone(), s.clone());
        self.changed();
        s
    }

    pub fn subsystem(&self, nqn: &str) -> Option<Arc<Subsystem>> {
        self.subsystems
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(nqn)
            .cloned()
    }

    pub fn add_port(&self, p: Port) {
        self.ports
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .push(p);
        self.changed();
    }

    /// Replaces the ports the discovery log lists.
    pub fn set_ports(&self, ports: Vec<Port>) {
        let mut cur = self.ports.write().unwrap_or_else(|e| e.into_inner());
        if *cur != ports {
            *cur = ports;
            drop(cur);
            self.changed();
        }
    }

    /// The in-capsule data size of port `id` (the admin queue's when there is no such port).
    pub fn in_capsule(&self, id: u16) -> u32 {
        self.ports
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .find(|p| p.id == id)
            .map_or(ADMIN_IN_CAPSULE, |p| p.in_capsule)
    }

    /// Sets each port's target port group (by port ID) and the ANA transition time; the
    /// controllers on a port that changed group hear of an ANA change.
    pub fn set_port_groups(&self, groups: BTreeMap<u16, u16>, transition_secs: u8) {
        use std::sync::atomic::Ordering::Relaxed;
        self.ana_transition_secs.store(transition_secs, Relaxed);
        let moved: Vec<u16> = {
            let mut cur = self.port_groups.write().unwrap_or_else(|e| e.into_inner());
            let moved = cur
                .keys()
                .chain(groups.keys())
                .filter(|p| cur.get(p).copied().unwrap_or(0) != groups.get(p).copied().unwrap_or(0))
                .copied()
                .collect();
            *cur = groups;
            moved
        };
        for c in self.controllers() {
            if let Some(p) = c.port().filter(|p| moved.contains(p)) {
                c.set_port_group(self.port_group(p));
                c.ana_changed();
            }
        }
    }

    /// The target port group of port `port`.
    pub fn port_group(&self, port: u16) -> u16 {
        self.port_groups
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&port)
            .copied()
            .unwrap_or(0)
    }

    pub fn ana_transition_secs(&self) -> u8 {
        self.ana_transition_secs
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Tells the I/O controllers of every subsystem with a namespace `which` picks that its
    /// access state may have changed (an ANA change event).
    pub fn ana_changed(&self, which: impl Fn(&Namespace) -> bool) {
        for s in self.subsystems() {
            let hit = s
                .namespaces
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .values()
                .any(|n| which(n));
            if hit {
                for c in self.controllers_of(&s.nqn) {
                    c.ana_changed();
                }
            }
        }
    }

    /// The subsystems, by NQN.
    pub fn subsystems(&self) -> Vec<Arc<Subsystem>> {
        self.subsystems
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .cloned()
            .collect()
    }

    /// Removes a subsystem; its controllers close (their queues' connections end).
    pub fn remove_subsystem(&self, nqn: &str) {
        let gone = self
            .subsystems
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(nqn);
        if gone.is_some() {
            self.changed();
            for c in self.controllers_of(nqn) {
                c.close();
            }
        }
    }

    /// Changes the hosts a subsystem admits (`None`: any); the controllers of hosts no
    /// longer admitted close. Returns those controllers.
    pub fn set_hosts(&self, s: &Subsystem, hosts: Option<Vec<String>>) -> Vec<Arc<Controller>> {
        {
            let mut cur = s.hosts.write().unwrap_or_else(|e| e.into_inner());
            if *cur == hosts {
                return Vec::new();
            }
            *cur = hosts;
        }
        self.changed();
        let refused: Vec<_> = self
            .controllers_of(&s.nqn)
            .into_iter()
            .filter(|c| !s.admits(&c.host_nqn))
            .collect();
        for c in &refused {
            c.close();
        }
        refused
    }

    /// Tells the controllers of subsystem `nqn` that namespace `nsid` was added, removed or
    /// changed (a Changed Namespace List event).
    pub fn namespace_changed(&self, nqn: &str, nsid: u32) {
        for c in self.controllers_of(nqn) {
            c.namespace_changed(nsid);
        }
    }

    /// The live controllers.
    pub fn controllers(&self) -> Vec<Arc<Controller>> {
        lock(&self.controllers)
            .values()
            .filter_map(Weak::upgrade)
            .collect()
    }

    /// The live controller `cntlid`, if any.
    pub fn controller(&self, cntlid: u16) -> Option<Arc<Controller>> {
        lock(&self.controllers)
            .get(&cntlid)
            .and_then(Weak::upgrade)
            .filter(|c| !c.is_closed())
    }

    /// The live controllers of subsystem `nqn`.
    pub fn controllers_of(&self, nqn: &str) -> Vec<Arc<Controller>> {
        let mut all = self.controllers();
        all.retain(|c| c.subsys_nqn() == nqn && !c.is_closed());
        all
    }

    /// The discovery log for `host_nqn`: every subsystem it may use, on every port. A port
    /// listening on a wildcard address is listed with `local`, the address the host reached
    /// the discovery controller at, when it is of the same family.
    pub fn discovery_log(&self, host_nqn: &str, local: Option<std::net::IpAddr>) -> Vec<u8> {
        let ports = self.ports.read().unwrap_or_else(|e| e.into_inner());
        let subsystems = self.subsystems.read().unwrap_or_else(|e| e.into_inner());
        let mut entries = Vec::new();
        for s in subsystems.values().filter(|s| s.admits(host_nqn)) {
            for p in ports.iter() {
                let traddr = match (p.traddr.parse::<std::net::IpAddr>(), local) {
                    (Ok(a), Some(l)) if a.is_unspecified() && a.is_ipv4() == l.is_ipv4() => {
                        l.to_string()
                    }
                    _ => p.traddr.clone(),
                };
                entries.push(DiscoveryEntry {
                    trtype: p.trtype,
                    adrfam: p.adrfam,
                    subtype: trtype::SUBTYPE_NVME,
                    treq: trtype::TREQ_NOT_REQUIRED,
                    portid: p.id,
                    cntlid: CNTLID_DYNAMIC,
                    asqsz: 32,
                    eflags: 0,
                    trsvcid: p.trsvcid.clone(),
                    subnqn: s.nqn.clone(),
                    traddr,
                    // RDMA: reliable connected, no provider named, RDMA/CM.
                    tsas: if p.trtype == trtype::RDMA {
                        [1, 1, 1]
                    } else {
                        [0; 3]
                    },
                });
            }
        }
        crate::admin::discovery_log(
            self.genctr.load(std::sync::atomic::Ordering::Relaxed),
            &entries,
        )
    }

    /// A queue's Connect: for the admin queue (`qid` 0) a new controller; for an I/O queue
    /// the controller `data.cntlid` names, which must be this host's on this subsystem.
    /// `sqsize` is zero based; `kato` in milliseconds (admin queue); `port` the port the
    /// queue came through (`None`: a discovery-only listener).
    pub fn connect(
        &self,
        qid: u16,
        sqsize: u16,
        kato: u32,
        data: &ConnectData,
        port: Option<u16>,
    ) -> Result<Arc<Controller>, ConnectRefused> {
        use connect_offset::{CNTLID, QID, SQSIZE};
        if sqsize == 0 || sqsize >= self.limits.queue_size {
            return Err(ConnectRefused::invalid(true, SQSIZE));
        }
        let discovery = data.subsys_nqn == DISCOVERY_NQN;
        let subsystem = if discovery {
            None
        } else {
            let s = self
                .subsystem(&data.subsys_nqn)
                .ok_or(ConnectRefused::unknown_subsystem())?;
            if !s.admits(&data.host_nqn) {
                return Err(ConnectRefused::host());
            }
            Some(s)
        };
        if qid != 0 {
            let ctrl = self
                .controller(data.cntlid)
                .ok_or(ConnectRefused::invalid(false, CNTLID))?;
            if ctrl.host_nqn != data.host_nqn || ctrl.subsys_nqn() != data.subsys_nqn {
                return Err(ConnectRefused::invalid(false, CNTLID));
            }
            if discovery || qid > ctrl.io_queues() {
                return Err(ConnectRefused::invalid(true, QID));
            }
            return Ok(ctrl);
        }
        if data.cntlid != CNTLID_DYNAMIC {
            return Err(ConnectRefused::invalid(false, CNTLID));
        }
        let mut ctrls = lock(&self.controllers);
        ctrls.retain(|_, c| c.strong_count() > 0);
        let cntlid = (1..=CNTLID_MAX)
            .find(|id| !ctrls.contains_key(id))
            .ok_or(ConnectRefused {
                status: Status::error(sct::COMMAND_SPECIFIC, fstatus::CONTROLLER_BUSY),
                dw0: 0,
            })?;
        let kind = match subsystem {
            Some(s) => Kind::Io(s),
            None => Kind::Discovery,
        };
        let ctrl = Controller::new(
            cntlid,
            kind,
            data.host_nqn.clone(),
            data.host_id,
            kato,
            port,
            self.me.clone(),
        );
        // Under the controllers' lock, as [`Targets::set_port_groups`] updates them.
        if let Some(p) = port {
            ctrl.set_port_group(self.port_group(p));
        }
        ctrls.insert(cntlid, Arc::downgrade(&ctrl));
        Ok(ctrl)
    }
}
