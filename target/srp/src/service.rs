//! SRP in the daemon: the identifiers of target ports, the string an administrator writes into Linux ib_srp's `add_target` to reach each of them, and the
//! RDMA/CM listeners (port space RDMA_PS_TCP) that turn connect requests into channels.
//!
//! A connect request carries the login request in its private data (`srp_login_req_rdma`
//! after the cma header). The target port is chosen by the target port identifier among the
//! ports listening on the address; the LOGIN_RSP goes back in the REP's private data, a
//! LOGIN_REJ in the REJ's (reason 28, consumer defined), as Linux ib_srpt answers.

use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rtgt_backstore::BufPool;
use rtgt_rdma_channel::cm::{Listener, Provider, Request};
use rtgt_transport::cm::ConnParams;

use super::channel::{Channel, CloseReason};
use super::iu::{buf_fmt, rej_reason, LoginRej, LoginReq};
use super::login::Limits;
use super::port::SrpPort;
use rtgt_scsi::core::{Registry, SrpTargetPort};

/// A stable 64-bit identifier derived from the host (`/etc/machine-id`), the port name and
/// `what`, so two appliances never collide and a restart keeps the identity. The top byte is
/// cleared so the value never looks like an IEEE-assigned GUID of real hardware.
pub fn derived_id(name: &str, what: &str) -> u64 {
    let host = std::fs::read_to_string("/etc/machine-id").unwrap_or_default();
    let mut h = std::collections::hash_map::DefaultHasher::new();
    ("rtgt-srp", host.trim(), name, what).hash(&mut h);
    h.finish() & 0x00ff_ffff_ffff_ffff
}

/// The `add_target` strings of `port` (Linux ib_srp over RDMA/CM): one per listen address,
/// and for a wildcard listen address one per address in `local` of its family.
pub fn add_target_strings(port: &SrpTargetPort, local: &[IpAddr]) -> Vec<String> {
    let mut out = Vec::new();
    let mut push = |a: SocketAddr| {
        let dest = match a {
            SocketAddr::V4(v4) => format!("{}:{}", v4.ip(), v4.port()),
            SocketAddr::V6(v6) => format!("[{}]:{}", v6.ip(), v6.port()),
        };
        let s = format!(
            "id_ext={:016x},ioc_guid={:016x},dest={dest}",
            port.id_ext, port.ioc_guid
        );
        if !out.contains(&s) {
            out.push(s);
        }
    };
    for l in &port.listen {
        if l.ip().is_unspecified() {
            let mut addrs: Vec<IpAddr> = local
                .iter()
                .copied()
                .filter(|a| a.is_ipv4() == l.is_ipv4() && !a.is_unspecified())
                .collect();
            // Loopback last: a remote initiator cannot use it.
            addrs.sort_by_key(|a| a.is_loopback());
            for a in addrs {
                push(SocketAddr::new(a, l.port()));
            }
        } else {
            push(*l);
        }
    }
    out
}

/// The SRP front-end of the running daemon: its target ports and their RDMA/CM listeners,
/// which follow the registry's SRP target ports ([`SrpService::sync`]).
pub struct SrpService {
    rdma: Provider,
    registry: Arc<Registry>,
    pool: Arc<BufPool>,
    state: Mutex<State>,
    conns: Arc<Mutex<Vec<tokio::task::JoinHandle<()>>>>,
}

/// The ports served on one listen address; the accept loop reads it per connect request.
type PortList = Arc<std::sync::RwLock<Vec<Arc<SrpPort>>>>;

struct Listening {
    ports: PortList,
    task: tokio::task::JoinHandle<()>,
}

#[derive(Default)]
struct State {
    ports: BTreeMap<String, Arc<SrpPort>>,
    listeners: BTreeMap<SocketAddr, Listening>,
    /// Listeners being stopped (see [`SrpService::stopped`]).
    stopping: Vec<tokio::task::JoinHandle<()>>,
}

/// What [`SrpService::sync`] did to one target port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PortChange {
    Added(String),
    Removed(String),
    /// Its identifier, relative port, target port group or listen addresses changed: its
    /// channels were logged out.
    Restarted(String),
}

impl SrpService {
    /// Starts a listener per distinct listen address of the registry's SRP target ports on
    /// `rdma`, and logs each port's `add_target` strings.
    pub fn start(rdma: &Provider, registry: &Arc<Registry>, pool: Arc<BufPool>) -> SrpService {
        let svc = SrpService {
            rdma: rdma.clone(),
            registry: registry.clone(),
            pool,
            state: Mutex::new(State::default()),
            conns: Arc::new(Mutex::new(Vec::new())),
        };
        svc.sync();
        svc
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Makes the served ports match the registry's: new ports start (and their listen
    /// addresses with them), removed ones log their channels out, changed LUNs and ACLs
    /// take effect for new logins (see [`SrpService::update_sessions`] for live ones). A
    /// port whose identifier, relative port, target port group or listen addresses changed
    /// starts again.
    pub fn sync(&self) -> Vec<PortChange> {
        let wanted = self.registry.srp_ports();
        let mut st = self.state();
        let mut changes = Vec::new();
        let names: Vec<String> = st.ports.keys().cloned().collect();
        for name in names {
            let keep = wanted.iter().find(|w| w.name == name).filter(|w| {
                let cur = st.ports[&name].config();
                cur.port_id() == w.port_id() && cur.listen == w.listen && cur.ids == w.ids
            });
            match keep {
                Some(w) => st.ports[&name].set_config(w.clone()),
                None => {
                    let p = st.ports.remove(&name).expect("listed");
                    super::port::logout_all(p.channels());
                    if wanted.iter().any(|w| w.name == name) {
                        changes.push(PortChange::Restarted(name));
                    } else {
                        tracing::info!(port = %name, "SRP target port removed");
                        changes.push(PortChange::Removed(name));
                    }
                }
            }
        }
        for cfg in &wanted {
            if st.ports.contains_key(&cfg.name) {
                continue;
            }
            let port = SrpPort::with_registry(
                cfg.clone(),
                Limits::default(),
                self.pool.clone(),
                Some(self.registry.clone()),
            );
            for s in add_target_strings(cfg, &self.rdma.addrs()) {
                tracing::info!(
                    port = %cfg.name,
                    "SRP target port: echo {s} > /sys/class/infiniband_srp/srp-<device>-<port>/add_target"
                );
            }
            if !changes.contains(&PortChange::Restarted(cfg.name.clone())) {
                changes.push(PortChange::Added(cfg.name.clone()));
            }
            st.ports.insert(cfg.name.clone(), port);
        }
        let mut by_addr: BTreeMap<SocketAddr, Vec<Arc<SrpPort>>> = BTreeMap::new();
        for p in st.ports.values() {
            for a in &p.config().listen {
                by_addr.entry(*a).or_default().push(p.clone());
            }
        }
        let gone: Vec<SocketAddr> = st
            .listeners
            .keys()
            .filter(|a| !by_addr.contains_key(a))
            .copied()
            .collect();
        for a in gone {
            if let Some(l) = st.listeners.remove(&a) {
                // Dropping the listener stops listening: later requests are rejected.
                l.task.abort();
                st.stopping.push(l.task);
                tracing::info!(addr = %a, "SRP listener stopped");
            }
        }
        for (addr, ps) in by_addr {
            if let Some(l) = st.listeners.get(&addr) {
                *l.ports.write().unwrap_or_else(|e| e.into_inner()) = ps;
                continue;
            }
            match self.rdma.listen(addr) {
                Ok(l) => {
                    tracing::info!(%addr, ports = ps.len(), provider = self.rdma.kind().name(), device = l.device().unwrap_or("-"), "SRP listening (RDMA/CM)");
                    let ports: PortList = Arc::new(std::sync::RwLock::new(ps));
                    // On the device's engine thread (if it has one), as the channels it
                    // accepts.
                    let task = self
                        .rdma
                        .spawn(accept_loop(l, ports.clone(), self.conns.clone()));
                    st.listeners.insert(addr, Listening { ports, task });
                }
                Err(e) => tracing::error!(%addr, error = %e, "SRP: cannot listen"),
            }
        }
        changes
    }

    /// Resolves once the listeners a [`SrpService::sync`] stopped are gone.
    pub async fn stopped(&self) {
        let tasks = std::mem::take(&mut self.state().stopping);
        for t in tasks {
            let _ = t.await;
        }
    }

    /// The served target ports, by name.
    pub fn ports(&self) -> Vec<Arc<SrpPort>> {
        self.state().ports.values().cloned().collect()
    }

    /// The addresses listened on.
    pub fn listening(&self) -> Vec<SocketAddr> {
        self.state().listeners.keys().copied().collect()
    }

    /// Gives every live session the LUN map its port now grants (see
    /// [`SrpPort::update_sessions`]).
    pub fn update_sessions(&self) -> Vec<(String, bool)> {
        self.ports()
            .iter()
            .flat_map(|p| p.update_sessions())
            .collect()
    }

    /// Logs out the session `id` (`srp-N`). Returns whether it exists.
    pub fn logout_session(&self, id: &str) -> bool {
        self.ports().iter().any(|p| p.logout_session(id))
    }

    /// Stops listening, sends SRP_T_LOGOUT on every channel and disconnects it.
    pub async fn shutdown(&self, grace: Duration) {
        let ports = {
            let mut st = self.state();
            for (_, l) in std::mem::take(&mut st.listeners) {
                l.task.abort();
            }
            st.ports.values().cloned().collect::<Vec<_>>()
        };
        let logouts = async {
            for p in &ports {
                p.shutdown().await;
            }
        };
        if tokio::time::timeout(grace, logouts).await.is_err() {
            tracing::warn!("SRP channels did not close in time");
        }
        let conns: Vec<_> = self
            .conns
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
            .collect();
        for c in conns {
            if tokio::time::timeout(grace, c).await.is_err() {
                tracing::warn!("SRP connection did not close in time");
            }
        }
    }
}

async fn accept_loop(
    mut l: Listener,
    ports: PortList,
    conns: Arc<Mutex<Vec<tokio::task::JoinHandle<()>>>>,
) {
    while let Some(cr) = l.accept().await {
        let ports = ports.read().unwrap_or_else(|e| e.into_inner()).clone();
        // The channel runs where the device that owns its QP runs.
        let h = cr.runtime().spawn(connection(cr, ports));
        let mut v = conns.lock().unwrap_or_else(|e| e.into_inner());
        v.retain(|h| !h.is_finished());
        v.push(h);
    }
}

/// The port a login addresses: the one whose identifier matches (either half order), else
/// the first, whose validation then rejects it.
fn pick_port<'a>(ports: &'a [Arc<SrpPort>], req: &LoginReq) -> Option<&'a Arc<SrpPort>> {
    ports
        .iter()
        .find(|p| {
            let id = p.config().port_id();
            let mut swapped = [0u8; 16];
            swapped[..8].copy_from_slice(&id[8..]);
            swapped[8..].copy_from_slice(&id[..8]);
            req.target_port_id == id || req.target_port_id == swapped
        })
        .or(ports.first())
}

/// One connect request: login, accept or reject, then the channel until either side ends it.
async fn connection(cr: Request, ports: Vec<Arc<SrpPort>>) {
    let peer = cr.peer();
    let cr_local = cr.local();
    let req = match LoginReq::parse_rdma(cr.private_data()) {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(%peer, error = %e, "SRP connect request without a valid login request");
            let rej = LoginRej {
                reason: rej_reason::UNABLE_ESTABLISH_CHANNEL,
                tag: 0,
                buf_fmt: buf_fmt::DIRECT | buf_fmt::INDIRECT,
            };
            cr.reject(&rej.to_bytes());
            return;
        }
    };
    let Some(port) = pick_port(&ports, &req).cloned() else {
        cr.reject(&[]);
        return;
    };
    let login = match port.login(&req) {
        Ok(l) => l,
        Err(rej) => {
            cr.reject(&rej.to_bytes());
            return;
        }
    };
    // The QP goes to INIT and the receive ring is posted before the REP: the initiator may
    // send as soon as it has sent its RTU.
    let built = cr.endpoint(Channel::rings(&login.params));
    let started = built.map_err(|e| e.to_string()).and_then(|ep| {
        let qp = ep.qp.clone();
        let ch = port
            .start_channel(ep, login, peer, cr.pool_mrs())
            .map_err(|e| e.to_string())?;
        Ok((qp, ch))
    });
    let (qp, ch) = match started {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(%peer, error = %e, "SRP: no resources for a channel");
            let rej = LoginRej {
                reason: rej_reason::INSUFFICIENT_RESOURCES,
                tag: req.tag,
                buf_fmt: buf_fmt::DIRECT | buf_fmt::INDIRECT,
            };
            cr.reject(&rej.to_bytes());
            return;
        }
    };
    let (responder_resources, initiator_depth) = cr.target_read_depths();
    let params = ConnParams {
        private_data: ch.login_rsp().to_bytes(),
        responder_resources,
        initiator_depth,
        rnr_retry_count: 7,
        flow_control: true,
        ..ConnParams::default()
    };
    let conn = match cr.accept(&qp, params).await {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(%peer, error = %e, "SRP: connection not established");
            ch.close(CloseReason::Disconnected);
            ch.finished().await;
            return;
        }
    };
    ch.set_addrs(peer, cr_local);
    tracing::info!(
        %peer, channel = ch.id, qpn = ch.qp().qpn(), initiator = %ch.session.nexus.initiator_port,
        "SRP channel established"
    );
    tokio::select! {
        _ = conn.disconnected() => ch.close(CloseReason::Disconnected),
        _ = ch.closed() => conn.disconnect(),
    }
    ch.finished().await;
    drop(conn);
}
