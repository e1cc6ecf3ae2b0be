//! The iSER listener: connect requests from the CM (RDMA_PS_TCP, the same ip:port as the TCP
//! portals), answered as ib_isert does (docs/WIRE.md §6, and its REPs in
//! `transport/tests/fixtures/lio-iser-srp.pcap`: REP private data 0x80 | 0x40 when the
//! initiator ruled out send with invalidate, initiator depth up to the REQ's responder
//! resources, responder resources 0, retry 7, RNR retry 7), each served by
//! [`super::conn::serve_until`] on a QP sized from the portal group's queue depth.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rtgt_rdma_channel::cm::{ConnectError, Listener, Provider, Request};
use rtgt_transport::cm::ConnParams;
use tokio::sync::watch;
use tokio::task::JoinSet;

use super::conn::{serve_until, IserStats, Peer, Sizing};
use super::header::CmHeader;
use crate::login::LOGIN_MAX_DATA;
use crate::params::ISER_MAX_RECV_DATA;
use crate::shared::ServerShared;

/// The most RDMA READs one connection keeps in flight (rxe's max_qp_rd_atom).
pub const MAX_READ_DEPTH: u8 = 128;
/// Queue depth used when no portal group matches the address connected to.
const DEFAULT_QUEUE_DEPTH: u32 = 128;

/// Serves iSER on the RDMA provider's devices, sharing sessions with the TCP server.
#[derive(Clone)]
pub struct IserServer {
    shared: Arc<ServerShared>,
    rdma: Provider,
    stats: Arc<IserStats>,
    conns: Arc<Mutex<JoinSet<()>>>,
}

impl IserServer {
    /// Serves on `rdma` (whose devices have the buffer pool registered, so data moves
    /// without copies).
    pub fn new(shared: Arc<ServerShared>, rdma: Provider) -> IserServer {
        IserServer {
            shared,
            rdma,
            stats: Arc::new(IserStats::default()),
            conns: Arc::new(Mutex::new(JoinSet::new())),
        }
    }

    pub fn stats(&self) -> Arc<IserStats> {
        self.stats.clone()
    }

    /// Live iSCSI sessions (TCP and iSER).
    pub fn session_count(&self) -> usize {
        self.shared.sessions.len()
    }

    /// Live RDMA connections of the provider.
    pub fn live_qps(&self) -> usize {
        self.rdma.live_qps()
    }

    /// Listens on `portal` until `shutdown` turns true.
    pub async fn serve(
        &self,
        portal: SocketAddr,
        shutdown: watch::Receiver<bool>,
    ) -> Result<(), ConnectError> {
        let listener = self.listen(portal)?;
        self.serve_on(listener, shutdown).await;
        Ok(())
    }

    /// Starts listening on `portal` (connect requests wait for [`IserServer::serve_on`]).
    pub fn listen(&self, portal: SocketAddr) -> Result<Listener, ConnectError> {
        self.rdma.listen(portal)
    }

    /// Serves the connect requests of `listener` until `shutdown` turns true.
    /// [`IserServer::serve_on`] as a task where the device runs (its engine thread, if it has
    /// one): the connections it accepts run there too.
    pub fn spawn_serve(
        &self,
        listener: Listener,
        shutdown: watch::Receiver<bool>,
    ) -> tokio::task::JoinHandle<()> {
        let me = self.clone();
        self.rdma
            .spawn(async move { me.serve_on(listener, shutdown).await })
    }

    pub async fn serve_on(&self, mut listener: Listener, mut shutdown: watch::Receiver<bool>) {
        loop {
            tokio::select! {
                r = listener.accept() => {
                    let Some(req) = r else { return };
                    if self.shared.is_stopping() {
                        req.reject(&CmHeader::answer(&CmHeader::parse(&[])).to_bytes());
                        continue;
                    }
                    // The connection runs where the device that owns its QP runs.
                    let me = self.clone();
                    let rt = req.runtime();
                    let mut set = self.conns.lock().unwrap_or_else(|e| e.into_inner());
                    while set.try_join_next().is_some() {}
                    set.spawn_on(async move { me.connection(req).await }, &rt);
                }
                r = shutdown.changed() => {
                    if r.is_err() || *shutdown.borrow() {
                        return;
                    }
                }
            }
        }
    }

    /// The queue depth of the portal group serving `local` (the largest if several do).
    fn queue_depth(&self, local: SocketAddr) -> u32 {
        let mut best = None;
        for t in self.shared.registry.targets() {
            if let Some(g) = crate::login::choose_portal_group(&t, local) {
                let d = g.params.queue_depth.max(1);
                best = Some(best.map_or(d, |b: u32| b.max(d)));
            }
        }
        best.unwrap_or(DEFAULT_QUEUE_DEPTH)
    }

    /// Receive buffers hold a login PDU (8 KiB) and the largest data segment the login can
    /// agree to ([`ISER_MAX_RECV_DATA`]).
    fn max_recv_data(&self) -> u32 {
        (LOGIN_MAX_DATA as u32).max(ISER_MAX_RECV_DATA)
    }

    async fn connection(self, req: Request) {
        let peer = req.peer();
        let local = req.local();
        let hdr = CmHeader::parse(req.private_data());
        let read_depth = req.responder_resources().clamp(1, MAX_READ_DEPTH);
        let sizing = Sizing::new(
            self.queue_depth(local),
            self.max_recv_data(),
            read_depth as u32,
        );
        let ep = match req.endpoint(sizing) {
            Ok(ep) => ep,
            Err(e) => {
                tracing::warn!(%peer, error = %e, "iSER: no resources for a connection");
                req.reject(&CmHeader::answer(&hdr).to_bytes());
                return;
            }
        };
        if let Err(e) = ep.post_receives() {
            tracing::warn!(%peer, error = %e, "iSER: preparing the QP");
            req.reject(&CmHeader::answer(&hdr).to_bytes());
            return;
        }
        let params = ConnParams {
            private_data: CmHeader::answer(&hdr).to_bytes().to_vec(),
            responder_resources: 0,
            initiator_depth: read_depth,
            retry_count: 7,
            rnr_retry_count: 7,
            ..ConnParams::default()
        };
        let pool_mrs = req.pool_mrs();
        let device = req.device().name.clone();
        let conn = match req.accept(&ep.qp, params).await {
            Ok(c) => Arc::new(c),
            Err(e) => {
                tracing::info!(%peer, error = %e, "iSER connection not established");
                return;
            }
        };
        tracing::debug!(%peer, %local, %device, send_with_invalidate = !hdr.send_w_inv_not_supported, "iSER connection established");
        let c = conn.clone();
        serve_until(
            self.shared.clone(),
            ep,
            Peer {
                local,
                peer,
                send_with_invalidate: !hdr.send_w_inv_not_supported,
            },
            pool_mrs,
            self.stats.clone(),
            Box::pin(async move { c.disconnected().await }),
        )
        .await;
        conn.disconnect();
        tracing::info!(
            %peer,
            connections = self.stats.connections.load(Ordering::Acquire),
            qps = self.live_qps(),
            sessions = self.shared.sessions.len(),
            "iSER connection closed"
        );
    }

    /// Waits (at most `limit`) for every connection to end.
    pub async fn drain(&self, limit: Duration) {
        let mut set = std::mem::take(&mut *self.conns.lock().unwrap_or_else(|e| e.into_inner()));
        let all = async { while set.join_next().await.is_some() {} };
        if tokio::time::timeout(limit, all).await.is_err() {
            tracing::warn!("iSER connections did not finish in time");
        }
    }
}
