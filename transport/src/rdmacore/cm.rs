//! librdmacm: connections by IP address, as the kernel's targets make them. An
//! [`EventChannel`]'s descriptor is non-blocking and watched by tokio; each event is copied out
//! (private data included) and acknowledged at once, so no id waits on an unacknowledged event
//! when it is destroyed. A [`CmId`] owns its `rdma_cm_id` and the QP made on it.

use std::ffi::{c_int, c_void};
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::sync::{Arc, OnceLock};

use tokio::io::unix::AsyncFd;

use super::res::{post_recv, post_send, set_error, watch, Context, Cq, Pd};
use super::sys::*;
use super::wr::{post_recv_wr, post_send_wr, post_send_wrs};
use super::{errno, RdmaCore, RdmaCoreError};
use crate::cm::ConnParams;
use crate::sockaddr::{from_storage, to_storage};

fn failed(what: &'static str) -> RdmaCoreError {
    RdmaCoreError::Call {
        what,
        errno: errno(),
    }
}

/// The kind of a CM event (`enum rdma_cm_event_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CmEventKind {
    AddrResolved,
    AddrError,
    RouteResolved,
    RouteError,
    ConnectRequest,
    ConnectResponse,
    ConnectError,
    Unreachable,
    Rejected,
    Established,
    Disconnected,
    DeviceRemoval,
    TimewaitExit,
    Other(u32),
}

impl CmEventKind {
    fn from_raw(e: u32) -> CmEventKind {
        use CmEventKind::*;
        match e {
            0 => AddrResolved,
            1 => AddrError,
            2 => RouteResolved,
            3 => RouteError,
            4 => ConnectRequest,
            5 => ConnectResponse,
            6 => ConnectError,
            7 => Unreachable,
            8 => Rejected,
            9 => Established,
            10 => Disconnected,
            11 => DeviceRemoval,
            15 => TimewaitExit,
            o => Other(o),
        }
    }
}

/// A CM event, copied out before it was acknowledged.
#[derive(Debug)]
pub struct CmEvent {
    pub kind: CmEventKind,
    /// The id the event is for; for a connection request, a new id the receiver adopts with
    /// [`CmId::adopt`] (or rejects and destroys).
    pub id: *mut rdma_cm_id,
    pub listen_id: *mut rdma_cm_id,
    pub status: i32,
    /// The private data of a request, reply or reject (as the peer's CM carried it: a
    /// request's is zero-padded to the CM's field).
    pub private_data: Vec<u8>,
    /// As the kernel reports them to the receiver: on a connection request, from the
    /// receiver's point of view (the REQ's initiator depth is the receiver's responder
    /// resources, and the other way round).
    pub responder_resources: u8,
    pub initiator_depth: u8,
    pub rnr_retry_count: u8,
    pub qp_num: u32,
}

// SAFETY: the raw ids are only handles; whoever adopts one owns it.
unsafe impl Send for CmEvent {}

/// An event channel.
pub struct EventChannel {
    lib: &'static RdmaCore,
    ch: *mut rdma_event_channel,
    /// Deregistered before the channel is destroyed.
    fd: Option<AsyncFd<RawFd>>,
}

// SAFETY: librdmacm's channels and ids are thread-safe.
unsafe impl Send for EventChannel {}
// SAFETY: as above.
unsafe impl Sync for EventChannel {}

impl EventChannel {
    /// A channel; needs a tokio runtime.
    pub fn create(lib: &'static RdmaCore) -> Result<Arc<EventChannel>, RdmaCoreError> {
        // SAFETY: no arguments; the channel is destroyed on drop.
        let ch = unsafe { (lib.cm.rdma_create_event_channel)() };
        if ch.is_null() {
            return Err(failed("rdma_create_event_channel"));
        }
        // SAFETY: a live channel owns its fd.
        let raw = unsafe { (*ch).fd };
        // SAFETY: the descriptor stays open until drop deregisters it and then destroys the
        // channel.
        let fd = unsafe { watch(raw, "CM event channel") };
        match fd {
            Ok(fd) => Ok(Arc::new(EventChannel {
                lib,
                ch,
                fd: Some(fd),
            })),
            Err(e) => {
                // SAFETY: created above, no id on it.
                unsafe { (lib.cm.rdma_destroy_event_channel)(ch) };
                Err(e)
            }
        }
    }

    /// The next event of any id on this channel.
    pub async fn next(&self) -> Result<CmEvent, RdmaCoreError> {
        let fd = self
            .fd
            .as_ref()
            .ok_or(RdmaCoreError::Unsupported("CM event channel"))?;
        loop {
            let mut guard = fd.readable().await.map_err(|e| RdmaCoreError::Call {
                what: "CM event channel",
                errno: e.raw_os_error().unwrap_or(libc::EIO),
            })?;
            let mut ev = std::ptr::null_mut();
            // SAFETY: live channel, non-blocking: returns at once.
            let rc = unsafe { (self.lib.cm.rdma_get_cm_event)(self.ch, &mut ev) };
            if rc != 0 {
                if errno() == libc::EAGAIN {
                    guard.clear_ready();
                    continue;
                }
                return Err(failed("rdma_get_cm_event"));
            }
            // SAFETY: a live event until acknowledged below.
            let e = unsafe { &*ev };
            let kind = CmEventKind::from_raw(e.event);
            // SAFETY: every event's param is the `conn` member except UD ones, which rtgt
            // does not use; its private data is valid for `private_data_len` bytes.
            let conn = unsafe { e.param.conn };
            let private_data = if conn.private_data.is_null() || conn.private_data_len == 0 {
                Vec::new()
            } else {
                // SAFETY: as above.
                unsafe {
                    std::slice::from_raw_parts(
                        conn.private_data as *const u8,
                        conn.private_data_len as usize,
                    )
                }
                .to_vec()
            };
            let out = CmEvent {
                kind,
                id: e.id,
                listen_id: e.listen_id,
                status: e.status,
                private_data,
                responder_resources: conn.responder_resources,
                initiator_depth: conn.initiator_depth,
                rnr_retry_count: conn.rnr_retry_count,
                qp_num: conn.qp_num,
            };
            // SAFETY: the event came from rdma_get_cm_event and is not used after this.
            unsafe { (self.lib.cm.rdma_ack_cm_event)(ev) };
            return Ok(out);
        }
    }
}

impl Drop for EventChannel {
    fn drop(&mut self) {
        drop(self.fd.take());
        // SAFETY: every id holds an Arc to its channel, so none is left on it.
        unsafe { (self.lib.cm.rdma_destroy_event_channel)(self.ch) };
    }
}

/// What a QP made on a [`CmId`] keeps alive.
struct CmQp {
    ctx: Arc<Context>,
    _pd: Arc<Pd>,
    _cqs: (Arc<Cq>, Arc<Cq>),
}

/// An `rdma_cm_id` (port space TCP), with the QP made on it.
pub struct CmId {
    ch: Arc<EventChannel>,
    id: *mut rdma_cm_id,
    qp: OnceLock<CmQp>,
}

// SAFETY: see EventChannel.
unsafe impl Send for CmId {}
// SAFETY: see EventChannel.
unsafe impl Sync for CmId {}

impl CmId {
    pub fn create(ch: &Arc<EventChannel>) -> Result<CmId, RdmaCoreError> {
        let mut id = std::ptr::null_mut();
        // SAFETY: live channel; the id is destroyed on drop.
        let rc = unsafe {
            (ch.lib.cm.rdma_create_id)(ch.ch, &mut id, std::ptr::null_mut(), RDMA_PS_TCP)
        };
        if rc != 0 {
            return Err(failed("rdma_create_id"));
        }
        Ok(CmId {
            ch: ch.clone(),
            id,
            qp: OnceLock::new(),
        })
    }

    /// Takes ownership of the id of a connection request received on `ch`.
    ///
    /// # Safety
    /// `id` must be the `id` of a [`CmEventKind::ConnectRequest`] event of `ch`, adopted once.
    pub unsafe fn adopt(ch: &Arc<EventChannel>, id: *mut rdma_cm_id) -> CmId {
        CmId {
            ch: ch.clone(),
            id,
            qp: OnceLock::new(),
        }
    }

    /// Moves the id to `ch`: its later events arrive there (`rdma_migrate_id`). Waits for
    /// nothing, as every event read from the old channel was acknowledged at once.
    pub fn migrate(&mut self, ch: &Arc<EventChannel>) -> Result<(), RdmaCoreError> {
        // SAFETY: live id and channel.
        let rc = unsafe { (ch.lib.cm.rdma_migrate_id)(self.id, ch.ch) };
        self.check("rdma_migrate_id", rc)?;
        self.ch = ch.clone();
        Ok(())
    }

    /// The channel the id's events arrive on.
    pub fn channel(&self) -> &Arc<EventChannel> {
        &self.ch
    }

    /// The local and the peer's address of a connection (or the bound address).
    pub fn addrs(&self) -> (Option<SocketAddr>, Option<SocketAddr>) {
        // SAFETY: live id; librdmacm fills the route's addresses on bind, resolution and
        // connection requests, and they stay in place while the id lives.
        let a = unsafe { &(*self.id).route.addr };
        (from_storage(&a.src), from_storage(&a.dst))
    }

    pub fn raw(&self) -> *mut rdma_cm_id {
        self.id
    }

    fn check(&self, what: &'static str, rc: c_int) -> Result<(), RdmaCoreError> {
        if rc != 0 {
            return Err(failed(what));
        }
        Ok(())
    }

    pub fn bind(&self, addr: SocketAddr) -> Result<(), RdmaCoreError> {
        let (mut sa, _) = to_storage(addr);
        // SAFETY: live id; `sa` is a valid sockaddr of its family.
        let rc = unsafe {
            (self.ch.lib.cm.rdma_bind_addr)(self.id, &mut sa as *mut _ as *mut libc::sockaddr)
        };
        self.check("rdma_bind_addr", rc)
    }

    pub fn listen(&self, backlog: i32) -> Result<(), RdmaCoreError> {
        // SAFETY: live, bound id.
        let rc = unsafe { (self.ch.lib.cm.rdma_listen)(self.id, backlog) };
        self.check("rdma_listen", rc)
    }

    /// Starts resolving `dst` (then wait for AddrResolved).
    pub fn resolve_addr(&self, dst: SocketAddr, timeout_ms: i32) -> Result<(), RdmaCoreError> {
        let (mut sa, _) = to_storage(dst);
        // SAFETY: live id; `sa` is valid; no source address.
        let rc = unsafe {
            (self.ch.lib.cm.rdma_resolve_addr)(
                self.id,
                std::ptr::null_mut(),
                &mut sa as *mut _ as *mut libc::sockaddr,
                timeout_ms,
            )
        };
        self.check("rdma_resolve_addr", rc)
    }

    /// Starts resolving the route (then wait for RouteResolved).
    pub fn resolve_route(&self, timeout_ms: i32) -> Result<(), RdmaCoreError> {
        // SAFETY: live id with a resolved address.
        let rc = unsafe { (self.ch.lib.cm.rdma_resolve_route)(self.id, timeout_ms) };
        self.check("rdma_resolve_route", rc)
    }

    /// The device the id is bound to (after a bind to a device address, address resolution,
    /// or on a connection request); librdmacm keeps it open.
    pub fn context(&self) -> Option<Arc<Context>> {
        // SAFETY: live id.
        let verbs = unsafe { (*self.id).verbs };
        if verbs.is_null() {
            return None;
        }
        // SAFETY: librdmacm keeps its device contexts open for the life of the process.
        Some(unsafe { Context::borrowed(self.ch.lib, verbs) })
    }

    /// Makes the id's RC QP on `pd` (of the id's device): ready for receives at once; accept
    /// and connect move it on. Returns the QP's capabilities as the device granted them (at
    /// least `cap`).
    pub fn create_qp(
        &self,
        pd: &Arc<Pd>,
        send_cq: &Arc<Cq>,
        recv_cq: &Arc<Cq>,
        cap: ibv_qp_cap,
    ) -> Result<ibv_qp_cap, RdmaCoreError> {
        let mut init = ibv_qp_init_attr {
            qp_context: std::ptr::null_mut(),
            send_cq: send_cq.as_ptr(),
            recv_cq: recv_cq.as_ptr(),
            srq: std::ptr::null_mut(),
            cap,
            qp_type: IBV_QPT_RC,
            sq_sig_all: 0,
        };
        // SAFETY: live id; PD and CQs of the id's device (the provider checks), kept alive by
        // the id from here on.
        let rc = unsafe { (self.ch.lib.cm.rdma_create_qp)(self.id, pd.as_ptr(), &mut init) };
        self.check("rdma_create_qp", rc)?;
        let made = self.qp.set(CmQp {
            ctx: pd.context().clone(),
            _pd: pd.clone(),
            _cqs: (send_cq.clone(), recv_cq.clone()),
        });
        if made.is_err() {
            // rdma_create_qp refuses an id with a QP, so this cannot happen.
            return Err(RdmaCoreError::Unsupported("a second QP on one id"));
        }
        Ok(init.cap)
    }

    pub fn qpn(&self) -> Option<u32> {
        // SAFETY: live id; its QP lives while `self.qp` is set.
        self.qp.get().map(|_| unsafe { (*(*self.id).qp).qp_num })
    }

    fn qp_ptr(&self) -> Result<(&Context, *mut ibv_qp), RdmaCoreError> {
        let q = self
            .qp
            .get()
            .ok_or(RdmaCoreError::Unsupported("a QP on this id"))?;
        // SAFETY: live id with a QP.
        Ok((&q.ctx, unsafe { (*self.id).qp }))
    }

    /// Posts sends on the id's QP (as [`super::res::Qp::post_send`]).
    pub fn post_send(&self, wr: &mut ibv_send_wr) -> Result<(), RdmaCoreError> {
        let (ctx, qp) = self.qp_ptr()?;
        post_send(ctx, qp, wr).map_err(|(_, e)| e)
    }

    /// Posts receives on the id's QP.
    pub fn post_recv(&self, wr: &mut ibv_recv_wr) -> Result<(), RdmaCoreError> {
        let (ctx, qp) = self.qp_ptr()?;
        post_recv(ctx, qp, wr)
    }

    /// Posts one send work request in the engine's terms.
    pub fn post_send_wr(&self, wr: &crate::verbs::SendWr) -> Result<(), RdmaCoreError> {
        let (ctx, qp) = self.qp_ptr()?;
        post_send_wr(ctx, qp, wr)
    }

    /// Posts `wrs` chained, in order; on failure, how many went out before the one that
    /// failed, and why.
    pub fn post_send_wrs(
        &self,
        wrs: &[crate::verbs::SendWr],
    ) -> Result<(), (usize, RdmaCoreError)> {
        let (ctx, qp) = self.qp_ptr().map_err(|e| (0, e))?;
        post_send_wrs(ctx, qp, wrs)
    }

    /// Posts one receive work request in the engine's terms.
    pub fn post_recv_wr(&self, wr: &crate::verbs::RecvWr) -> Result<(), RdmaCoreError> {
        let (ctx, qp) = self.qp_ptr()?;
        post_recv_wr(ctx, qp, wr)
    }

    /// Moves the id's QP to the error state: everything posted completes, flushed.
    pub fn set_error(&self) -> Result<(), RdmaCoreError> {
        let (ctx, qp) = self.qp_ptr()?;
        set_error(ctx, qp)
    }

    /// Accepts the request the id came from, with `private_data` in the reply.
    pub fn accept(&self, p: &ConnParams) -> Result<(), RdmaCoreError> {
        let mut c = conn_param(p);
        // SAFETY: live id of a request; `c` and its private data live for the call.
        let rc = unsafe { (self.ch.lib.cm.rdma_accept)(self.id, &mut c) };
        self.check("rdma_accept", rc)
    }

    /// Connects (after the route resolved).
    pub fn connect(&self, p: &ConnParams) -> Result<(), RdmaCoreError> {
        let mut c = conn_param(p);
        // SAFETY: live id with a resolved route and a QP; `c` lives for the call.
        let rc = unsafe { (self.ch.lib.cm.rdma_connect)(self.id, &mut c) };
        self.check("rdma_connect", rc)
    }

    /// Rejects the request the id came from, with `private_data` in the REJ.
    pub fn reject(&self, private_data: &[u8]) -> Result<(), RdmaCoreError> {
        let len = private_data.len().min(u8::MAX as usize) as u8;
        // SAFETY: live id of a request; the data lives for the call.
        let rc = unsafe {
            (self.ch.lib.cm.rdma_reject)(self.id, private_data.as_ptr() as *const c_void, len)
        };
        self.check("rdma_reject", rc)
    }

    pub fn disconnect(&self) -> Result<(), RdmaCoreError> {
        // SAFETY: live id.
        let rc = unsafe { (self.ch.lib.cm.rdma_disconnect)(self.id) };
        self.check("rdma_disconnect", rc)
    }
}

impl Drop for CmId {
    fn drop(&mut self) {
        let cm = &self.ch.lib.cm;
        // SAFETY: live id; its events were all acknowledged when read. The QP goes first,
        // then what it used (`self.qp`), then the id.
        unsafe {
            if self.qp.get().is_some() {
                (cm.rdma_destroy_qp)(self.id);
            }
            (cm.rdma_destroy_id)(self.id);
        }
    }
}

/// `p` as librdmacm takes it (its private data borrowed from `p`).
fn conn_param(p: &ConnParams) -> rdma_conn_param {
    rdma_conn_param {
        private_data: if p.private_data.is_empty() {
            std::ptr::null()
        } else {
            p.private_data.as_ptr() as *const c_void
        },
        private_data_len: p.private_data.len().min(u8::MAX as usize) as u8,
        responder_resources: p.responder_resources,
        initiator_depth: p.initiator_depth,
        flow_control: u8::from(p.flow_control),
        retry_count: p.retry_count,
        rnr_retry_count: p.rnr_retry_count,
        srq: u8::from(p.srq),
        qp_num: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_kinds_as_in_rdma_cma_h() {
        assert_eq!(
            CmEventKind::from_raw(RDMA_CM_EVENT_CONNECT_REQUEST),
            CmEventKind::ConnectRequest
        );
        assert_eq!(
            CmEventKind::from_raw(RDMA_CM_EVENT_ESTABLISHED),
            CmEventKind::Established
        );
        assert_eq!(
            CmEventKind::from_raw(RDMA_CM_EVENT_DISCONNECTED),
            CmEventKind::Disconnected
        );
        assert_eq!(
            CmEventKind::from_raw(RDMA_CM_EVENT_TIMEWAIT_EXIT),
            CmEventKind::TimewaitExit
        );
        assert_eq!(CmEventKind::from_raw(12), CmEventKind::Other(12));
    }
}
