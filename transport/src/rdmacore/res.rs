//! rdma-core resources with owners: a device context, protection domains, memory regions over
//! rtgt's [`Region`]s, completion queues with their completion channel (waited on through tokio)
//! and RC queue pairs. Each holds what it was made from, so a context outlives its PDs, a PD
//! its MRs and QPs, and a CQ its QPs; dropping one destroys it in rdma-core.
//!
//! rdma-core's objects may be used from any thread (its providers lock what they share), so
//! these are `Send` and `Sync`; posting to one QP from two threads at once is the caller's to
//! avoid, as with any verbs consumer.

use std::ffi::{c_int, c_uint, c_void};
use std::os::fd::RawFd;
use std::sync::Arc;

use smallvec::SmallVec;
use tokio::io::unix::AsyncFd;

use super::sys::*;
use super::{errno, DeviceInfo, DeviceList, GidInfo, GidKind, PortInfo, RdmaCore, RdmaCoreError};
use crate::verbs::Region;

fn failed(what: &'static str, rc: c_int) -> RdmaCoreError {
    // Verbs calls return the error number itself, or -1 with errno set.
    let errno = if rc > 0 { rc } else { errno() };
    RdmaCoreError::Call { what, errno }
}

/// An open RDMA device.
pub struct Context {
    pub lib: &'static RdmaCore,
    ctx: *mut ibv_context,
    name: String,
    /// Opened here (closed on drop), or librdmacm's (left open).
    owned: bool,
}

// SAFETY: rdma-core's contexts are thread-safe (the library and providers lock internally).
unsafe impl Send for Context {}
// SAFETY: as above.
unsafe impl Sync for Context {}

impl Context {
    /// Opens the device called `name`.
    pub fn open(lib: &'static RdmaCore, name: &str) -> Result<Arc<Context>, RdmaCoreError> {
        let list = DeviceList::get(lib)?;
        let dev = list.iter().find(|(n, _)| n == name).map(|(_, d)| d);
        // SAFETY: a device of the live list.
        let ctx = dev.map_or(std::ptr::null_mut(), |d| unsafe {
            (lib.verbs.ibv_open_device)(d)
        });
        if ctx.is_null() {
            return Err(RdmaCoreError::NoDevice {
                name: name.to_string(),
                errno: if dev.is_some() { errno() } else { libc::ENODEV },
            });
        }
        Ok(Arc::new(Context {
            lib,
            ctx,
            name: name.to_string(),
            owned: true,
        }))
    }

    /// A context someone else opened and keeps open (librdmacm's, from an id's `verbs`).
    ///
    /// # Safety
    /// `ctx` must be an open context that stays open as long as the result and everything
    /// made on it live.
    pub unsafe fn borrowed(lib: &'static RdmaCore, ctx: *mut ibv_context) -> Arc<Context> {
        // SAFETY: an open context's device has a name (caller's promise above).
        let name =
            unsafe { std::ffi::CStr::from_ptr((lib.verbs.ibv_get_device_name)((*ctx).device)) }
                .to_string_lossy()
                .into_owned();
        Arc::new(Context {
            lib,
            ctx,
            name,
            owned: false,
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn as_ptr(&self) -> *mut ibv_context {
        self.ctx
    }

    /// The device's attributes.
    pub fn query(&self) -> Result<ibv_device_attr, RdmaCoreError> {
        // SAFETY: plain data, all zeroes valid.
        let mut attr: ibv_device_attr = unsafe { std::mem::zeroed() };
        // SAFETY: open context, valid out-pointer.
        let rc = unsafe { (self.lib.verbs.ibv_query_device)(self.ctx, &mut attr) };
        if rc != 0 {
            return Err(failed("ibv_query_device", rc));
        }
        Ok(attr)
    }

    /// A port's attributes.
    pub fn query_port(&self, port: u8) -> Result<ibv_port_attr, RdmaCoreError> {
        let mut pa = ibv_port_attr::default();
        // SAFETY: open context, valid out-pointer (the compatible leading part is filled).
        let rc = unsafe { (self.lib.verbs.ibv_query_port)(self.ctx, port, &mut pa) };
        if rc != 0 {
            return Err(failed("ibv_query_port", rc));
        }
        Ok(pa)
    }

    /// The device's attributes, ports and GID tables.
    pub fn info(&self) -> Result<DeviceInfo, RdmaCoreError> {
        let attr = self.query()?;
        let mut ports = Vec::new();
        for port in 1..=attr.phys_port_cnt {
            let pa = self.query_port(port)?;
            ports.push(PortInfo {
                port,
                active: pa.state == IBV_PORT_ACTIVE,
                active_mtu: 128 << pa.active_mtu.clamp(1, 5),
                ethernet: pa.link_layer == IBV_LINK_LAYER_ETHERNET,
                gids: Vec::new(),
            });
        }
        let slots: usize = (attr.phys_port_cnt as usize).max(1) * 256;
        let mut entries = vec![ibv_gid_entry::default(); slots];
        // SAFETY: open context; `entries` has room for `slots` entries of the size passed.
        let got = unsafe {
            (self.lib.verbs._ibv_query_gid_table)(
                self.ctx,
                entries.as_mut_ptr(),
                slots,
                0,
                std::mem::size_of::<ibv_gid_entry>(),
            )
        };
        if got < 0 {
            return Err(failed("ibv_query_gid_table", (-got) as c_int));
        }
        for e in &entries[..got as usize] {
            if let Some(p) = ports.iter_mut().find(|p| u32::from(p.port) == e.port_num) {
                p.gids.push(GidInfo {
                    index: e.gid_index,
                    gid: e.gid.raw,
                    kind: match e.gid_type {
                        IBV_GID_TYPE_IB => GidKind::Ib,
                        IBV_GID_TYPE_ROCE_V1 => GidKind::RoceV1,
                        _ => GidKind::RoceV2,
                    },
                    netdev: if_name(e.ndev_ifindex),
                });
            }
        }
        let fw: Vec<u8> = attr
            .fw_ver
            .iter()
            .take_while(|&&c| c != 0)
            .map(|&c| c as u8)
            .collect();
        Ok(DeviceInfo {
            name: self.name.clone(),
            fw_ver: String::from_utf8_lossy(&fw).into_owned(),
            max_qp: attr.max_qp.max(0) as u32,
            max_qp_wr: attr.max_qp_wr.max(0) as u32,
            max_sge: attr.max_sge.max(0) as u32,
            max_cqe: attr.max_cqe.max(0) as u32,
            max_mr_size: attr.max_mr_size,
            max_qp_rd_atom: attr.max_qp_rd_atom.max(0) as u32,
            ports,
        })
    }

    fn ops(&self) -> &ibv_context_ops {
        // SAFETY: the context is open; its operation table is filled by the provider and
        // never changes.
        unsafe { &(*self.ctx).ops }
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        if self.owned {
            // SAFETY: every object made on it holds an Arc to it, so none is left.
            unsafe { (self.lib.verbs.ibv_close_device)(self.ctx) };
        }
    }
}

/// A protection domain.
pub struct Pd {
    ctx: Arc<Context>,
    pd: *mut ibv_pd,
}

// SAFETY: see Context.
unsafe impl Send for Pd {}
// SAFETY: see Context.
unsafe impl Sync for Pd {}

impl Pd {
    pub fn alloc(ctx: &Arc<Context>) -> Result<Arc<Pd>, RdmaCoreError> {
        // SAFETY: open context.
        let pd = unsafe { (ctx.lib.verbs.ibv_alloc_pd)(ctx.ctx) };
        if pd.is_null() {
            return Err(failed("ibv_alloc_pd", -1));
        }
        Ok(Arc::new(Pd {
            ctx: ctx.clone(),
            pd,
        }))
    }

    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    pub fn as_ptr(&self) -> *mut ibv_pd {
        self.pd
    }

    /// Registers all of `region` with `access` (IBV_ACCESS_* bits).
    pub fn reg_mr(
        self: &Arc<Pd>,
        region: Arc<Region>,
        access: c_uint,
    ) -> Result<Mr, RdmaCoreError> {
        // SAFETY: the region's memory stays allocated (and in place) as long as the Mr holds
        // the Arc; the device may read and write it under `access`.
        let mr = unsafe {
            (self.ctx.lib.verbs.ibv_reg_mr)(
                self.pd,
                region.addr() as *mut c_void,
                region.len(),
                access as c_int,
            )
        };
        if mr.is_null() {
            return Err(failed("ibv_reg_mr", -1));
        }
        Ok(Mr {
            pd: self.clone(),
            mr,
            region,
        })
    }
}

impl Drop for Pd {
    fn drop(&mut self) {
        // SAFETY: MRs and QPs hold an Arc to the PD, so none is left.
        unsafe { (self.ctx.lib.verbs.ibv_dealloc_pd)(self.pd) };
    }
}

/// A registered memory region over a [`Region`].
pub struct Mr {
    pd: Arc<Pd>,
    mr: *mut ibv_mr,
    region: Arc<Region>,
}

// SAFETY: see Context.
unsafe impl Send for Mr {}
// SAFETY: see Context.
unsafe impl Sync for Mr {}

impl Mr {
    pub fn lkey(&self) -> u32 {
        // SAFETY: the MR is registered until drop.
        unsafe { (*self.mr).lkey }
    }

    pub fn rkey(&self) -> u32 {
        // SAFETY: as above.
        unsafe { (*self.mr).rkey }
    }

    pub fn region(&self) -> &Arc<Region> {
        &self.region
    }

    /// The scatter/gather element of `len` bytes from `offset`.
    pub fn sge(&self, offset: usize, len: u32) -> ibv_sge {
        debug_assert!(offset + len as usize <= self.region.len());
        ibv_sge {
            addr: self.region.addr() + offset as u64,
            length: len,
            lkey: self.lkey(),
        }
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        // SAFETY: registered by this Mr; the region is released after.
        unsafe { (self.pd.ctx.lib.verbs.ibv_dereg_mr)(self.mr) };
    }
}

/// A completion queue with a completion channel of its own, armed and waited on through
/// tokio (the channel's file descriptor is non-blocking and registered with the runtime).
pub struct Cq {
    ctx: Arc<Context>,
    channel: *mut ibv_comp_channel,
    cq: *mut ibv_cq,
    /// The channel's descriptor as the runtime watches it; deregistered before the channel
    /// closes it.
    fd: Option<AsyncFd<RawFd>>,
}

// SAFETY: see Context.
unsafe impl Send for Cq {}
// SAFETY: see Context.
unsafe impl Sync for Cq {}

impl Cq {
    /// A CQ of at least `cqe` entries; needs a tokio runtime.
    pub fn create(ctx: &Arc<Context>, cqe: u32) -> Result<Arc<Cq>, RdmaCoreError> {
        let v = &ctx.lib.verbs;
        // SAFETY: open context.
        let channel = unsafe { (v.ibv_create_comp_channel)(ctx.ctx) };
        if channel.is_null() {
            return Err(failed("ibv_create_comp_channel", -1));
        }
        // SAFETY: open context and channel.
        let cq =
            unsafe { (v.ibv_create_cq)(ctx.ctx, cqe as c_int, std::ptr::null_mut(), channel, 0) };
        if cq.is_null() {
            let e = failed("ibv_create_cq", -1);
            // SAFETY: created above, unused.
            unsafe { (v.ibv_destroy_comp_channel)(channel) };
            return Err(e);
        }
        // SAFETY: the channel is live; its fd belongs to it.
        let raw = unsafe { (*channel).fd };
        // SAFETY: the descriptor stays open until Cq::drop deregisters it and only then
        // destroys the channel.
        let fd = unsafe { watch(raw, "completion channel") };
        let fd = match fd {
            Ok(fd) => fd,
            Err(e) => {
                // SAFETY: created above, unused.
                unsafe {
                    (v.ibv_destroy_cq)(cq);
                    (v.ibv_destroy_comp_channel)(channel);
                }
                return Err(e);
            }
        };
        Ok(Arc::new(Cq {
            ctx: ctx.clone(),
            channel,
            cq,
            fd: Some(fd),
        }))
    }

    pub fn as_ptr(&self) -> *mut ibv_cq {
        self.cq
    }

    /// Takes up to `max` completions into `out`; returns how many.
    pub fn poll(&self, out: &mut Vec<ibv_wc>, max: usize) -> Result<usize, RdmaCoreError> {
        let start = out.len();
        out.resize(start + max, ibv_wc::default());
        let poll = self
            .ctx
            .ops()
            .poll_cq
            .ok_or(RdmaCoreError::Unsupported("poll_cq"))?;
        // SAFETY: the CQ is live and `out` has room for `max` entries from `start`.
        let n = unsafe { poll(self.cq, max as c_int, out.as_mut_ptr().add(start)) };
        if n < 0 {
            out.truncate(start);
            return Err(failed("ibv_poll_cq", n));
        }
        out.truncate(start + n as usize);
        Ok(n as usize)
    }

    /// Takes up to `max` completions into `out` in the engine's terms; returns how many.
    pub fn poll_wc(
        &self,
        out: &mut Vec<crate::verbs::WorkCompletion>,
        max: usize,
    ) -> Result<usize, RdmaCoreError> {
        let mut raw: SmallVec<[ibv_wc; 64]> = SmallVec::from_elem(ibv_wc::default(), max);
        let poll = self
            .ctx
            .ops()
            .poll_cq
            .ok_or(RdmaCoreError::Unsupported("poll_cq"))?;
        // SAFETY: the CQ is live and `raw` has room for `max` entries.
        let n = unsafe { poll(self.cq, max as c_int, raw.as_mut_ptr()) };
        if n < 0 {
            return Err(failed("ibv_poll_cq", n));
        }
        out.extend(raw[..n as usize].iter().map(super::wr::completion));
        Ok(n as usize)
    }

    /// Asks for an event at the next completion.
    pub fn arm(&self) -> Result<(), RdmaCoreError> {
        let notify = self
            .ctx
            .ops()
            .req_notify_cq
            .ok_or(RdmaCoreError::Unsupported("req_notify_cq"))?;
        // SAFETY: live CQ.
        let rc = unsafe { notify(self.cq, 0) };
        if rc != 0 {
            return Err(failed("ibv_req_notify_cq", rc));
        }
        Ok(())
    }

    /// Waits for the event an [`Cq::arm`] asked for, and acknowledges it. Poll the CQ after
    /// arming, before waiting: a completion that came in between raises no new event.
    pub async fn wait(&self) -> Result<(), RdmaCoreError> {
        let fd = self
            .fd
            .as_ref()
            .ok_or(RdmaCoreError::Unsupported("completion channel"))?;
        loop {
            let mut guard = fd.readable().await.map_err(|e| RdmaCoreError::Call {
                what: "completion channel",
                errno: e.raw_os_error().unwrap_or(libc::EIO),
            })?;
            let mut cq = std::ptr::null_mut();
            let mut cq_ctx = std::ptr::null_mut();
            // SAFETY: live channel; non-blocking, so this returns at once.
            let rc = unsafe {
                (self.ctx.lib.verbs.ibv_get_cq_event)(self.channel, &mut cq, &mut cq_ctx)
            };
            if rc != 0 {
                if errno() == libc::EAGAIN {
                    guard.clear_ready();
                    continue;
                }
                return Err(failed("ibv_get_cq_event", rc));
            }
            // SAFETY: the event is of this CQ (the channel is its own).
            unsafe { (self.ctx.lib.verbs.ibv_ack_cq_events)(cq, 1) };
            return Ok(());
        }
    }
}

impl Drop for Cq {
    fn drop(&mut self) {
        drop(self.fd.take());
        let v = &self.ctx.lib.verbs;
        // SAFETY: QPs hold an Arc to their CQs, so none is left; every event was acknowledged
        // in wait().
        unsafe {
            (v.ibv_destroy_cq)(self.cq);
            (v.ibv_destroy_comp_channel)(self.channel);
        }
    }
}

/// `fd` non-blocking and watched by the tokio runtime for reading.
///
/// # Safety
/// `fd` must stay open until the result is dropped.
pub(crate) unsafe fn watch(fd: RawFd, what: &'static str) -> Result<AsyncFd<RawFd>, RdmaCoreError> {
    let io_err = |e: std::io::Error| RdmaCoreError::Call {
        what,
        errno: e.raw_os_error().unwrap_or(libc::EIO),
    };
    // SAFETY: fcntl on an open descriptor (caller's promise); only O_NONBLOCK changes.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    // SAFETY: as above.
    if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(io_err(std::io::Error::last_os_error()));
    }
    // SAFETY: open while the AsyncFd lives (caller's promise); a RawFd is always the same
    // descriptor.
    unsafe { AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) }
        .map_err(|e| io_err(std::io::Error::other(e.to_string())))
}

/// An RC queue pair.
pub struct Qp {
    pd: Arc<Pd>,
    _cqs: (Arc<Cq>, Arc<Cq>),
    qp: *mut ibv_qp,
}

// SAFETY: see Context.
unsafe impl Send for Qp {}
// SAFETY: see Context.
unsafe impl Sync for Qp {}

impl Qp {
    /// An RC QP on `send_cq` and `recv_cq` with `cap` (its actual capabilities in
    /// [`Qp::cap`] are at least these).
    pub fn create_rc(
        pd: &Arc<Pd>,
        send_cq: &Arc<Cq>,
        recv_cq: &Arc<Cq>,
        cap: ibv_qp_cap,
    ) -> Result<Qp, RdmaCoreError> {
        let mut init = ibv_qp_init_attr {
            qp_context: std::ptr::null_mut(),
            send_cq: send_cq.cq,
            recv_cq: recv_cq.cq,
            srq: std::ptr::null_mut(),
            cap,
            qp_type: IBV_QPT_RC,
            sq_sig_all: 0,
        };
        // SAFETY: live PD and CQs of the same context; `init` is a valid attribute block.
        let qp = unsafe { (pd.ctx.lib.verbs.ibv_create_qp)(pd.pd, &mut init) };
        if qp.is_null() {
            return Err(failed("ibv_create_qp", -1));
        }
        Ok(Qp {
            pd: pd.clone(),
            _cqs: (send_cq.clone(), recv_cq.clone()),
            qp,
        })
    }

    pub fn qpn(&self) -> u32 {
        // SAFETY: live QP.
        unsafe { (*self.qp).qp_num }
    }

    /// `ibv_modify_qp`.
    pub fn modify(&self, attr: &ibv_qp_attr, mask: c_int) -> Result<(), RdmaCoreError> {
        let mut a = *attr;
        // SAFETY: live QP; `a` is a valid attribute block.
        let rc = unsafe { (self.pd.ctx.lib.verbs.ibv_modify_qp)(self.qp, &mut a, mask) };
        if rc != 0 {
            return Err(failed("ibv_modify_qp", rc));
        }
        Ok(())
    }

    /// Posts a chain of send work requests. The memory their SGEs name must stay registered
    /// and in place until they complete.
    pub fn post_send(&self, wr: &mut ibv_send_wr) -> Result<(), RdmaCoreError> {
        post_send(&self.pd.ctx, self.qp, wr).map_err(|(_, e)| e)
    }

    /// Posts a chain of receive work requests (same rules as [`Qp::post_send`]).
    pub fn post_recv(&self, wr: &mut ibv_recv_wr) -> Result<(), RdmaCoreError> {
        post_recv(&self.pd.ctx, self.qp, wr)
    }

    /// Moves the QP to the error state: everything posted completes, flushed.
    pub fn set_error(&self) -> Result<(), RdmaCoreError> {
        set_error(&self.pd.ctx, self.qp)
    }
}

/// `ibv_post_send` on `qp` of `ctx`, through the provider's operation table. On failure, the
/// request the provider stopped at (those before it were posted).
pub(crate) fn post_send(
    ctx: &Context,
    qp: *mut ibv_qp,
    wr: &mut ibv_send_wr,
) -> Result<(), (*mut ibv_send_wr, RdmaCoreError)> {
    let post = ctx.ops().post_send.ok_or((
        wr as *mut ibv_send_wr,
        RdmaCoreError::Unsupported("post_send"),
    ))?;
    let mut bad = std::ptr::null_mut();
    // SAFETY: a live QP of `ctx`; the chain and its SGE lists are valid for the call (the
    // provider copies them into its queue).
    let rc = unsafe { post(qp, wr, &mut bad) };
    if rc != 0 {
        return Err((bad, failed("ibv_post_send", rc)));
    }
    Ok(())
}

/// `ibv_modify_qp` of `qp` of `ctx` to the error state.
pub(crate) fn set_error(ctx: &Context, qp: *mut ibv_qp) -> Result<(), RdmaCoreError> {
    let mut a = ibv_qp_attr {
        qp_state: IBV_QPS_ERR,
        ..Default::default()
    };
    // SAFETY: a live QP of `ctx`; `a` is a valid attribute block.
    let rc = unsafe { (ctx.lib.verbs.ibv_modify_qp)(qp, &mut a, IBV_QP_STATE) };
    if rc != 0 {
        return Err(failed("ibv_modify_qp", rc));
    }
    Ok(())
}

/// `ibv_post_recv` on `qp` of `ctx`.
pub(crate) fn post_recv(
    ctx: &Context,
    qp: *mut ibv_qp,
    wr: &mut ibv_recv_wr,
) -> Result<(), RdmaCoreError> {
    let post = ctx
        .ops()
        .post_recv
        .ok_or(RdmaCoreError::Unsupported("post_recv"))?;
    let mut bad = std::ptr::null_mut();
    // SAFETY: as post_send.
    let rc = unsafe { post(qp, wr, &mut bad) };
    if rc != 0 {
        return Err(failed("ibv_post_recv", rc));
    }
    Ok(())
}

impl Drop for Qp {
    fn drop(&mut self) {
        // SAFETY: live QP; its PD and CQs are dropped after it.
        unsafe { (self.pd.ctx.lib.verbs.ibv_destroy_qp)(self.qp) };
    }
}

fn if_name(index: u32) -> Option<String> {
    if index == 0 {
        return None;
    }
    let mut buf = [0 as std::ffi::c_char; libc::IF_NAMESIZE];
    // SAFETY: `buf` has IF_NAMESIZE bytes, as if_indextoname requires.
    let p = unsafe { libc::if_indextoname(index, buf.as_mut_ptr()) };
    if p.is_null() {
        return None;
    }
    // SAFETY: on success `buf` holds a NUL-terminated name.
    Some(
        unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .into_owned(),
    )
}
