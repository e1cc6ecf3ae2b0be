//! Listening and accepting by IP address on either provider: the soft engine's connection
//! manager, or librdmacm. A fabric listens on a [`Provider`], takes [`Request`]s, builds its
//! [`Endpoint`] on the request (on the device the request came in on, with that device's
//! protection domain and registered buffer pool), then accepts or rejects; the resulting
//! [`Connection`] says when the peer is gone.
//!
//! Per device, the provider keeps one protection domain and the buffer pool registered in it
//! ([`OnDevice`]), shared by every fabric and connection on that device: memory is
//! registered once, never per connection or per command.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rtgt_backstore::BufPool;
use rtgt_transport::cm::{self as softcm, CmError, ConnParams};
use rtgt_transport::hca::{Hca, Placement};
use rtgt_transport::rdmacore::cm::{CmEventKind, CmId, EventChannel};
use rtgt_transport::rdmacore::{res, RdmaCore, RdmaCoreError};

use crate::mem::PoolMrs;
use crate::provider::{Kind, Pd, ProviderError, Qp};
use crate::{lock, Endpoint, Rings};

/// How long an accepted connection may take to be established.
const ESTABLISH_TIMEOUT: Duration = Duration::from_secs(10);
/// Connection requests librdmacm queues on a listener.
const BACKLOG: i32 = 128;

/// Why listening or accepting failed.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error(transparent)]
    Cm(#[from] CmError),
    #[error(transparent)]
    Provider(#[from] ProviderError),
    #[error("{0}")]
    Failed(String),
}

impl From<RdmaCoreError> for ConnectError {
    fn from(e: RdmaCoreError) -> ConnectError {
        ConnectError::Provider(e.into())
    }
}

/// One device's protection domain and the buffer pool registered in it.
pub struct OnDevice {
    pub name: String,
    pub pd: Pd,
    /// None when the pool could not be registered: data then moves through regions made per
    /// command.
    pub pool_mrs: Option<Arc<PoolMrs>>,
}

impl OnDevice {
    fn new(name: String, pd: Pd, pool: &Arc<BufPool>) -> OnDevice {
        let pool_mrs = match PoolMrs::register(&pd, pool) {
            Ok(m) => Some(Arc::new(m)),
            Err(e) => {
                tracing::warn!(device = %name, error = %e, "RDMA: buffer pool not registered; data is registered per command");
                None
            }
        };
        OnDevice { name, pd, pool_mrs }
    }
}

/// The RDMA devices the fabrics are served on.
#[derive(Clone)]
pub enum Provider {
    Soft(Arc<SoftProvider>),
    Verbs(Arc<VerbsProvider>),
}

/// The soft engine: an [`Hca`] (one device per engine thread).
pub struct SoftProvider {
    hca: Arc<Hca>,
    devices: Vec<Arc<OnDevice>>,
}

/// rdma-core: the devices librdmacm picks by address, each opened on first use.
pub struct VerbsProvider {
    lib: &'static RdmaCore,
    pool: Arc<BufPool>,
    /// By device context (librdmacm keeps one per device for the life of the process).
    devices: Mutex<HashMap<usize, Arc<OnDevice>>>,
    /// The addresses served and their devices.
    addrs: Vec<(IpAddr, String)>,
    /// How long a connection's CQs poll before sleeping.
    busy_poll: Duration,
    connections: Arc<AtomicUsize>,
}

impl Provider {
    /// The soft engine's devices, each with a protection domain and `pool` registered in it.
    pub fn soft(hca: Arc<Hca>, pool: &Arc<BufPool>) -> Result<Provider, ProviderError> {
        let mut devices = Vec::new();
        for dev in hca.devices() {
            let pd = Pd::Soft(dev.alloc_pd()?);
            devices.push(Arc::new(OnDevice::new(dev.name().to_string(), pd, pool)));
        }
        Ok(Provider::Soft(Arc::new(SoftProvider { hca, devices })))
    }

    /// rdma-core's devices, loaded now: a missing library is an error that says what to
    /// install, and each of `addresses` must belong to an RDMA device (librdmacm's choice,
    /// as for the kernel's targets), or the error names it. With no addresses, those of every
    /// device's GID table are the ones advertised.
    /// Each connection's completion queues poll for up to `busy_poll` before they sleep,
    /// while that keeps finding work.
    pub fn verbs(
        pool: &Arc<BufPool>,
        addresses: &[IpAddr],
        busy_poll: Duration,
    ) -> Result<Provider, ConnectError> {
        let lib = RdmaCore::load()?;
        let mut addrs = Vec::new();
        if addresses.is_empty() {
            for d in lib.devices()? {
                for p in &d.ports {
                    for g in &p.gids {
                        let ip = g.ip();
                        if !addrs.iter().any(|(a, _)| *a == ip) && !ip.is_unspecified() {
                            addrs.push((ip, d.name.clone()));
                        }
                    }
                }
            }
        }
        for &a in addresses {
            let device = device_of_addr(lib, a)?;
            tracing::info!(address = %a, %device, "RDMA address served through rdma-core");
            addrs.push((a, device));
        }
        Ok(Provider::Verbs(Arc::new(VerbsProvider {
            lib,
            pool: pool.clone(),
            devices: Mutex::new(HashMap::new()),
            addrs,
            busy_poll,
            connections: Arc::new(AtomicUsize::new(0)),
        })))
    }

    /// The device each advertised address belongs to (`soft` for the engine's).
    pub fn devices_by_addr(&self) -> Vec<(IpAddr, String)> {
        match self {
            Provider::Soft(s) => {
                let name = s.hca.device().name().to_string();
                s.hca.addrs().iter().map(|a| (*a, name.clone())).collect()
            }
            Provider::Verbs(v) => v.addrs.clone(),
        }
    }

    pub fn kind(&self) -> Kind {
        match self {
            Provider::Soft(_) => Kind::Soft,
            Provider::Verbs(_) => Kind::Verbs,
        }
    }

    /// The soft engine's HCA, when that is the provider.
    pub fn hca(&self) -> Option<&Arc<Hca>> {
        match self {
            Provider::Soft(s) => Some(&s.hca),
            Provider::Verbs(_) => None,
        }
    }

    /// The addresses RDMA is served on (for a wildcard listener, the ones to advertise).
    pub fn addrs(&self) -> Vec<IpAddr> {
        match self {
            Provider::Soft(s) => s.hca.addrs().to_vec(),
            Provider::Verbs(v) => v.addrs.iter().map(|(a, _)| *a).collect(),
        }
    }

    /// Live RC connections.
    pub fn live_qps(&self) -> usize {
        match self {
            // The CM's QP1 is not a connection.
            Provider::Soft(s) => s.hca.live_qps().saturating_sub(1),
            Provider::Verbs(v) => v.connections.load(Ordering::Acquire),
        }
    }

    /// Spawns a listener's task: where the soft engine's CM runs, or on the current runtime.
    pub fn spawn<F>(&self, fut: F) -> tokio::task::JoinHandle<F::Output>
    where
        F: std::future::Future + Send + 'static,
        F::Output: Send + 'static,
    {
        match self {
            Provider::Soft(s) => s.hca.spawn(fut),
            Provider::Verbs(_) => tokio::spawn(fut),
        }
    }

    /// Listens on `addr`. With `verbs`, an address no RDMA device has is an error naming it.
    pub fn listen(&self, addr: SocketAddr) -> Result<Listener, ConnectError> {
        match self {
            Provider::Soft(s) => Ok(Listener {
                inner: ListenInner::Soft(s.hca.cm().listen(addr)?, s.clone()),
                addr,
                device: None,
            }),
            Provider::Verbs(v) => {
                let fail = |e: RdmaCoreError| {
                    ConnectError::Failed(format!(
                        "no RDMA device serves {addr} through rdma-core: {e}"
                    ))
                };
                let ch = EventChannel::create(v.lib).map_err(fail)?;
                let id = CmId::create(&ch).map_err(fail)?;
                id.bind(addr).map_err(fail)?;
                id.listen(BACKLOG).map_err(fail)?;
                let device = id.context().map(|c| c.name().to_string());
                if device.is_none() && !addr.ip().is_unspecified() {
                    return Err(ConnectError::Failed(format!(
                        "no RDMA device has the address {}",
                        addr.ip()
                    )));
                }
                Ok(Listener {
                    inner: ListenInner::Verbs {
                        id,
                        prov: v.clone(),
                    },
                    addr,
                    device,
                })
            }
        }
    }
}

/// The RDMA device librdmacm binds `addr` to.
fn device_of_addr(lib: &'static RdmaCore, addr: IpAddr) -> Result<String, ConnectError> {
    let fail = |e: RdmaCoreError| {
        ConnectError::Failed(format!("no RDMA device has the address {addr}: {e}"))
    };
    let ch = EventChannel::create(lib).map_err(fail)?;
    let id = CmId::create(&ch).map_err(fail)?;
    id.bind(SocketAddr::new(addr, 0)).map_err(fail)?;
    id.context()
        .map(|c| c.name().to_string())
        .ok_or_else(|| ConnectError::Failed(format!("no RDMA device has the address {addr}")))
}

impl VerbsProvider {
    /// The protection domain and registered pool of the device `id` came in on.
    fn device_of(&self, id: &CmId) -> Result<Arc<OnDevice>, ConnectError> {
        let ctx = id
            .context()
            .ok_or_else(|| ConnectError::Failed("connection request without a device".into()))?;
        let key = ctx.as_ptr() as usize;
        let mut devs = lock(&self.devices);
        if let Some(d) = devs.get(&key) {
            return Ok(d.clone());
        }
        let pd = Pd::Verbs(res::Pd::alloc(&ctx)?);
        let d = Arc::new(OnDevice::new(ctx.name().to_string(), pd, &self.pool));
        tracing::info!(device = %d.name, pool_registered = d.pool_mrs.is_some(), "RDMA device opened (rdma-core)");
        devs.insert(key, d.clone());
        Ok(d)
    }
}

enum ListenInner {
    Soft(softcm::CmListener, Arc<SoftProvider>),
    Verbs { id: CmId, prov: Arc<VerbsProvider> },
}

/// A listening address.
pub struct Listener {
    inner: ListenInner,
    addr: SocketAddr,
    device: Option<String>,
}

impl Listener {
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The device serving the address (None for the soft engine's and for a wildcard).
    pub fn device(&self) -> Option<&str> {
        self.device.as_deref()
    }

    /// The next connection request; None once the listener can take no more.
    pub async fn accept(&mut self) -> Option<Request> {
        match &mut self.inner {
            ListenInner::Soft(l, prov) => {
                let req = l.accept().await?;
                let at = prov.hca.place();
                let dev = prov.devices[at.index()].clone();
                Some(Request {
                    peer: req.peer(),
                    local: req.local(),
                    private_data: req.private_data().to_vec(),
                    responder_resources: req.responder_resources(),
                    initiator_depth: req.initiator_depth(),
                    dev,
                    inner: ReqInner::Soft {
                        req,
                        at,
                        hca: prov.hca.clone(),
                    },
                })
            }
            ListenInner::Verbs { id, prov } => loop {
                let ev = match id.channel().next().await {
                    Ok(ev) => ev,
                    Err(e) => {
                        tracing::error!(addr = %self.addr, error = %e, "RDMA listener failed");
                        return None;
                    }
                };
                match ev.kind {
                    CmEventKind::ConnectRequest => {}
                    CmEventKind::DeviceRemoval => {
                        tracing::error!(addr = %self.addr, "RDMA device removed under a listener");
                        return None;
                    }
                    k => {
                        tracing::debug!(addr = %self.addr, event = ?k, "RDMA listener event");
                        continue;
                    }
                }
                // SAFETY: the id of a connection request read from this listener's channel,
                // adopted once.
                let mut child = unsafe { CmId::adopt(id.channel(), ev.id) };
                match prov.prepare(&mut child) {
                    Ok(dev) => {
                        let (local, peer) = child.addrs();
                        let any = SocketAddr::from(([0, 0, 0, 0], 0));
                        return Some(Request {
                            peer: peer.unwrap_or(any),
                            local: local.unwrap_or(any),
                            private_data: ev.private_data,
                            // The kernel's CM gives the passive side the REQ's depths from
                            // its own point of view (its responder resources are the
                            // initiator's depth); a Request carries them as the REQ does.
                            responder_resources: ev.initiator_depth,
                            initiator_depth: ev.responder_resources,
                            dev,
                            inner: ReqInner::Verbs {
                                id: Arc::new(child),
                                prov: prov.clone(),
                            },
                        });
                    }
                    Err(e) => {
                        tracing::warn!(addr = %self.addr, error = %e, "RDMA connection request refused");
                        let _ = child.reject(&[]);
                    }
                }
            },
        }
    }
}

impl VerbsProvider {
    /// Moves a request's id to a channel of its own (so its events reach the connection that
    /// owns it) and finds its device.
    fn prepare(&self, child: &mut CmId) -> Result<Arc<OnDevice>, ConnectError> {
        let dev = self.device_of(child)?;
        child.migrate(&EventChannel::create(self.lib)?)?;
        Ok(dev)
    }
}

enum ReqInner {
    Soft {
        req: softcm::ConnectRequest,
        at: Placement,
        hca: Arc<Hca>,
    },
    Verbs {
        id: Arc<CmId>,
        prov: Arc<VerbsProvider>,
    },
}

/// RDMA READs a target serves for a host at once, at most.
pub const TARGET_RESPONDER_RESOURCES: u8 = 4;
/// RDMA READs a target keeps in flight towards a host, at most.
pub const TARGET_INITIATOR_DEPTH: u8 = 16;

/// A connection request, placed on the device that will own its QP.
pub struct Request {
    peer: SocketAddr,
    local: SocketAddr,
    private_data: Vec<u8>,
    responder_resources: u8,
    initiator_depth: u8,
    dev: Arc<OnDevice>,
    inner: ReqInner,
}

impl Request {
    /// The peer's address.
    pub fn peer(&self) -> SocketAddr {
        self.peer
    }

    /// The address and port the peer connected to.
    pub fn local(&self) -> SocketAddr {
        self.local
    }

    /// The consumer's bytes of the REQ after the cma header.
    pub fn private_data(&self) -> &[u8] {
        &self.private_data
    }

    /// The RDMA READs the peer accepts in flight (the REQ's responder resources).
    pub fn responder_resources(&self) -> u8 {
        self.responder_resources
    }

    /// The RDMA READs the peer issues in flight (the REQ's initiator depth).
    pub fn initiator_depth(&self) -> u8 {
        self.initiator_depth
    }

    /// What a target that RDMA READs the host's data answers in its REP: (responder
    /// resources, initiator depth). The READs it serves are bounded by the REQ's initiator
    /// depth and [`TARGET_RESPONDER_RESOURCES`] (hosts of SRP and NVMe/RDMA issue none), the
    /// READs it issues by the REQ's responder resources and [`TARGET_INITIATOR_DEPTH`].
    pub fn target_read_depths(&self) -> (u8, u8) {
        (
            self.initiator_depth.min(TARGET_RESPONDER_RESOURCES),
            self.responder_resources.min(TARGET_INITIATOR_DEPTH),
        )
    }

    /// The device the connection will run on.
    pub fn device(&self) -> &Arc<OnDevice> {
        &self.dev
    }

    /// The buffer pool as registered on that device.
    pub fn pool_mrs(&self) -> Option<Arc<PoolMrs>> {
        self.dev.pool_mrs.clone()
    }

    /// The runtime the connection should run on: the engine thread of its device, or the
    /// current runtime.
    pub fn runtime(&self) -> tokio::runtime::Handle {
        match &self.inner {
            ReqInner::Soft { at, hca, .. } => hca.runtime_at(at.index()),
            ReqInner::Verbs { .. } => tokio::runtime::Handle::current(),
        }
    }

    /// The connection's endpoint with `rings`, its QP ready for receives (INIT).
    pub fn endpoint(&self, rings: impl Into<Rings>) -> Result<Endpoint, ConnectError> {
        match (&self.inner, &self.dev.pd) {
            (ReqInner::Soft { .. }, Pd::Soft(pd)) => {
                let ep = Endpoint::new(pd, rings)?;
                if let Some(qp) = ep.qp.soft() {
                    softcm::prepare_qp(qp)?;
                }
                Ok(ep)
            }
            (ReqInner::Verbs { id, prov }, Pd::Verbs(pd)) => {
                let ep = Endpoint::on_cm_id(pd, id.clone(), rings)?;
                ep.set_busy_poll(prov.busy_poll);
                Ok(ep)
            }
            _ => Err(ConnectError::Failed(
                "a device of the other provider".to_string(),
            )),
        }
    }

    /// Rejects the request with `private_data` in the REJ.
    pub fn reject(self, private_data: &[u8]) {
        match self.inner {
            ReqInner::Soft { req, .. } => req.reject(private_data),
            ReqInner::Verbs { id, .. } => {
                if let Err(e) = id.reject(private_data) {
                    tracing::debug!(peer = %self.peer, error = %e, "rejecting an RDMA connection");
                }
            }
        }
    }

    /// Accepts with `params` on `qp` (of the endpoint [`Request::endpoint`] made) and
    /// waits until the connection is established.
    pub async fn accept(self, qp: &Qp, params: ConnParams) -> Result<Connection, ConnectError> {
        match self.inner {
            ReqInner::Soft { req, at, .. } => {
                let qp = qp
                    .soft()
                    .ok_or_else(|| ConnectError::Failed("not a soft QP".to_string()))?;
                let conn = req.accept(qp, params).await?;
                Ok(Connection {
                    inner: ConnInner::Soft(conn, at),
                })
            }
            ReqInner::Verbs { id, prov } => {
                id.accept(&params)?;
                let established = async {
                    loop {
                        let ev = id.channel().next().await?;
                        match ev.kind {
                            CmEventKind::Established => return Ok(()),
                            CmEventKind::ConnectError
                            | CmEventKind::Unreachable
                            | CmEventKind::Rejected
                            | CmEventKind::Disconnected
                            | CmEventKind::DeviceRemoval => {
                                return Err(ConnectError::Failed(format!(
                                    "connection not established: {:?} (status {})",
                                    ev.kind, ev.status
                                )))
                            }
                            _ => {}
                        }
                    }
                };
                match tokio::time::timeout(ESTABLISH_TIMEOUT, established).await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => return Err(e),
                    Err(_) => {
                        return Err(ConnectError::Failed(
                            "connection not established in time".to_string(),
                        ))
                    }
                }
                prov.connections.fetch_add(1, Ordering::AcqRel);
                Ok(Connection {
                    inner: ConnInner::Verbs {
                        id,
                        gone: AtomicBool::new(false),
                        count: prov.connections.clone(),
                    },
                })
            }
        }
    }
}

enum ConnInner {
    Soft(softcm::CmConn, #[allow(dead_code)] Placement),
    Verbs {
        id: Arc<CmId>,
        gone: AtomicBool,
        count: Arc<AtomicUsize>,
    },
}

/// An established connection.
pub struct Connection {
    inner: ConnInner,
}

impl Connection {
    /// Resolves when the connection is over (the peer disconnected, our own disconnect, or
    /// the device went away).
    pub async fn disconnected(&self) {
        match &self.inner {
            ConnInner::Soft(c, _) => c.disconnected().await,
            ConnInner::Verbs { id, gone, .. } => {
                while !gone.load(Ordering::Acquire) {
                    match id.channel().next().await {
                        Ok(ev)
                            if !matches!(
                                ev.kind,
                                CmEventKind::Disconnected
                                    | CmEventKind::DeviceRemoval
                                    | CmEventKind::TimewaitExit
                            ) => {}
                        Ok(_) => gone.store(true, Ordering::Release),
                        Err(e) => {
                            tracing::warn!(error = %e, "RDMA connection events");
                            gone.store(true, Ordering::Release);
                        }
                    }
                }
            }
        }
    }

    /// Disconnects (DREQ); the QP goes to the error state.
    pub fn disconnect(&self) {
        match &self.inner {
            ConnInner::Soft(c, _) => c.disconnect(),
            ConnInner::Verbs { id, .. } => {
                if let Err(e) = id.disconnect() {
                    tracing::debug!(error = %e, "rdma_disconnect");
                }
            }
        }
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        if let ConnInner::Verbs { count, .. } = &self.inner {
            count.fetch_sub(1, Ordering::AcqRel);
        }
    }
}
