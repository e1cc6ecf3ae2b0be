//! The NVMe/RDMA side of the host, as Linux's nvme-rdma: one RC queue pair per queue,
//! connected through RDMA/CM with the queue's ID and sizes in the REQ's private data; a
//! command is a SEND of its capsule (with in-capsule data when it fits), its data buffer is
//! a memory region named by a keyed SGL (the controller reads write data by RDMA READ and
//! writes read data by RDMA WRITE), and its completion a SEND into one of the queue's
//! receive buffers. Commands are bounded by the queue's entries.
//!
//! With [`HostConfig::invalidate`] (Linux's default), a command's buffer is fast-registered
//! (IB_WR_REG_MR) with a new key and its SGL asks the controller to invalidate that key with
//! the completion; a completion that does not (or invalidates another key) fails the
//! command, as nvme-rdma treats it.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use rtgt_nvme::rdma::{CmReq, CM_REJ_LEN};
use rtgt_nvme::sqe::{Cqe, Sgl, Sqe, CQE_LEN, SQE_LEN};
use rtgt_transport::cm::{Cm, CmConn, CmError, ConnParams};
use rtgt_transport::verbs::{
    Access, Cq, FastReg, Mr, Pd, Qp, QpInitAttr, QpType, RecvWr, Region, SendFlags, SendOp, SendWr,
    SgList, WcFlags, WcOpcode, WcStatus,
};
use tokio::sync::{oneshot, Semaphore};

use super::{Completion, HostConfig, NvmeError};
use crate::buffers::{FrDesc, FrPool};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn rdma_err(e: impl std::fmt::Display) -> NvmeError {
    NvmeError::Rdma(e.to_string())
}

/// Bytes of a SEND posted inline.
const INLINE: usize = 256;
/// The most in-capsule data this host sends (what its I/O queues use).
pub(super) const IN_CAPSULE_MAX: usize = 8192;
/// Work request IDs of SENDs from a send slot: the slot in the low bits.
const SLOT_WR: u64 = 1 << 62;

/// A command in flight: its data region (kept registered until the completion) and, for a
/// read, how much to take from it.
struct InFlight {
    mr: Option<Exposed>,
    /// The key the completion must invalidate.
    invalidate: Option<u32>,
    read: Option<(Arc<Region>, usize)>,
    done: oneshot::Sender<Result<Completion, NvmeError>>,
}

/// A command's buffer as the controller reaches it: an MR registered for it alone, or a
/// fast-registration MR of the queue's pool.
enum Exposed {
    /// Registered until the command is done.
    Own {
        _mr: Mr,
    },
    Fr(FrDesc<Mr>),
}

/// One NVMe/RDMA queue's connection.
pub struct RdmaWire {
    pd: Pd,
    qp: Arc<Qp>,
    cq: Cq,
    recv_region: Arc<Region>,
    recv_mr: Mr,
    /// Commands in flight by command ID; `None` once the queue is gone.
    flights: Mutex<Option<HashMap<u16, InFlight>>>,
    /// The queue's entries.
    entries: Semaphore,
    /// Memory regions of SENDs too large to go inline, until their completion.
    send_mrs: Mutex<HashMap<u64, Mr>>,
    /// Registered send slots, one per queue entry, for capsules too large to go inline.
    slots: Arc<Region>,
    slots_mr: Mr,
    slot_len: usize,
    free_slots: Mutex<Vec<u32>>,
    next_wr: AtomicU64,
    /// The variant (low byte) of the next fast-registered key.
    variant: std::sync::atomic::AtomicU8,
    /// Ask for SEND with Invalidate (keyed SGLs with the invalidate subtype).
    invalidate: bool,
    closed: AtomicBool,
    conn: Mutex<Option<CmConn>>,
    buffers: crate::buffers::ReadBuffers,
    /// Fast-registration MRs of finished commands, for the next ones.
    mrs: FrPool<Mr>,
}

impl RdmaWire {
    /// Connects queue `qid` of `size` entries to the controller at `addr`.
    pub(super) async fn connect(
        cm: &Cm,
        addr: SocketAddr,
        cfg: &HostConfig,
        qid: u16,
        cntlid: u16,
        size: u16,
    ) -> Result<Arc<RdmaWire>, NvmeError> {
        let dev = cm.device();
        let pd = dev.alloc_pd().map_err(rdma_err)?;
        let slots = u32::from(size);
        // A command's SEND, its fast registration and, rarely, a local invalidation before it.
        let cq = dev.create_cq(slots * 4 + 16).map_err(rdma_err)?;
        let mut init = QpInitAttr::new(QpType::Rc, &cq, &cq);
        init.cap.max_send_wr = slots * 3 + 8;
        init.cap.max_recv_wr = slots;
        init.cap.max_send_sge = 1;
        init.cap.max_recv_sge = 1;
        init.cap.max_inline_data = (INLINE as u32).min(dev.attr().max_inline_data);
        let qp = Arc::new(pd.create_qp(init).map_err(rdma_err)?);
        let recv_region = Arc::new(Region::zeroed(slots as usize * CQE_LEN));
        let recv_mr = pd
            .reg_mr(recv_region.clone(), Access::LOCAL_WRITE)
            .map_err(rdma_err)?;
        let slot_len = SQE_LEN + IN_CAPSULE_MAX;
        let send_slots = Arc::new(Region::zeroed(slots as usize * slot_len));
        let slots_mr = pd
            .reg_mr(send_slots.clone(), Access::LOCAL_WRITE)
            .map_err(rdma_err)?;
        rtgt_transport::cm::prepare_qp(&qp).map_err(rdma_err)?;
        let wire = Arc::new(RdmaWire {
            pd,
            qp: qp.clone(),
            cq,
            recv_region,
            recv_mr,
            flights: Mutex::new(Some(HashMap::new())),
            entries: Semaphore::new(usize::from(size)),
            send_mrs: Mutex::new(HashMap::new()),
            slots: send_slots,
            slots_mr,
            slot_len,
            free_slots: Mutex::new((0..slots).collect()),
            next_wr: AtomicU64::new(1 << 32),
            variant: std::sync::atomic::AtomicU8::new(1),
            invalidate: cfg.invalidate,
            closed: AtomicBool::new(false),
            conn: Mutex::new(None),
            buffers: Default::default(),
            mrs: FrPool::default(),
        });
        for slot in 0..slots {
            wire.repost(slot)?;
        }
        // As nvme_rdma_route_resolved: the admin queue and I/O queues alike say their size.
        let req = CmReq {
            recfmt: 0,
            qid,
            hrqsize: size,
            hsqsize: size - 1,
            cntlid,
        };
        let params = ConnParams {
            private_data: req.to_bytes().to_vec(),
            // The controller reads write data from us; we read nothing from it.
            responder_resources: 4,
            initiator_depth: 0,
            retry_count: 7,
            rnr_retry_count: 7,
            flow_control: true,
            ..ConnParams::default()
        };
        tokio::spawn(wire.clone().completions());
        let conn = match cm.connect(&qp, addr, params).await {
            Ok(c) => c,
            Err(e) => {
                wire.close();
                return Err(match e {
                    CmError::Rejected { private_data, .. } if private_data.len() >= CM_REJ_LEN => {
                        NvmeError::Rejected(u16::from_le_bytes([private_data[2], private_data[3]]))
                    }
                    e => rdma_err(e),
                });
            }
        };
        *lock(&wire.conn) = Some(conn);
        Ok(wire)
    }

    fn repost(&self, slot: u32) -> Result<(), NvmeError> {
        self.qp
            .post_recv(RecvWr {
                wr_id: u64::from(slot),
                sg_list: self
                    .recv_mr
                    .sge(slot as usize * CQE_LEN, CQE_LEN as u32)
                    .into(),
            })
            .map_err(rdma_err)
    }

    /// Disconnects; commands in flight fail.
    pub(super) fn close(&self) {
        self.closed.store(true, Ordering::Release);
        let gone = lock(&self.flights).take();
        for (_, f) in gone.into_iter().flatten() {
            let _ = f
                .done
                .send(Err(NvmeError::Protocol("connection closed".into())));
        }
        self.entries.close();
        if let Some(c) = lock(&self.conn).take() {
            c.disconnect();
        }
    }

    /// Takes completions until the queue pair fails or the queue closes.
    async fn completions(self: Arc<Self>) {
        let mut wcs = Vec::with_capacity(64);
        while !self.closed.load(Ordering::Acquire) {
            self.cq.wait_nonempty().await;
            wcs.clear();
            self.cq.poll_into(&mut wcs, 64);
            for wc in wcs.drain(..) {
                if wc.status != WcStatus::Success {
                    tracing::debug!(status = ?wc.status, opcode = ?wc.opcode, "NVMe/RDMA host: work request failed");
                    self.close();
                    return;
                }
                if wc.opcode == WcOpcode::Recv {
                    let mut b = [0u8; CQE_LEN];
                    self.recv_region
                        .read(wc.wr_id as usize * CQE_LEN, &mut b[..]);
                    let _ = self.repost(wc.wr_id as u32);
                    let Some(cqe) = Cqe::parse(&b[..(wc.byte_len as usize).min(CQE_LEN)]) else {
                        self.close();
                        return;
                    };
                    let f = lock(&self.flights)
                        .as_mut()
                        .and_then(|m| m.remove(&cqe.cid));
                    if let Some(mut f) = f {
                        let invalidated = wc
                            .flags
                            .contains(WcFlags::WITH_INVALIDATE)
                            .then_some(wc.imm_or_inv);
                        // The MR back to the pool, free unless its key is still valid.
                        if let Some(Exposed::Fr(mut d)) = f.mr.take() {
                            if let Some(key) = invalidated {
                                d.invalidated(key);
                            }
                            self.mrs.give(d);
                        }
                        if invalidated != f.invalidate {
                            let _ = f.done.send(Err(NvmeError::Protocol(format!(
                                "completion invalidated {invalidated:x?}, the command's key is {:x?}",
                                f.invalidate
                            ))));
                            self.entries.add_permits(1);
                            continue;
                        }
                        let data = match f.read {
                            Some((region, len)) => {
                                let mut d = vec![0u8; len];
                                region.read(0, &mut d);
                                drop(f.mr);
                                self.buffers.give(region);
                                d
                            }
                            None => Vec::new(),
                        };
                        let _ = f.done.send(Ok(Completion { cqe, data }));
                        self.entries.add_permits(1);
                    }
                } else if wc.wr_id & SLOT_WR != 0 {
                    lock(&self.free_slots).push((wc.wr_id & !SLOT_WR) as u32);
                } else {
                    lock(&self.send_mrs).remove(&wc.wr_id);
                }
            }
        }
    }

    /// Sends `capsule` as one SEND (inline when small).
    fn send(&self, capsule: Vec<u8>) -> Result<(), NvmeError> {
        if self.closed.load(Ordering::Acquire) {
            return Err(NvmeError::Protocol("connection closed".into()));
        }
        let id = self.next_wr.fetch_add(1, Ordering::Relaxed);
        let slot = (capsule.len() > INLINE && capsule.len() <= self.slot_len)
            .then(|| lock(&self.free_slots).pop())
            .flatten();
        let wr = if capsule.len() <= INLINE {
            let mut wr = SendWr::new(id, SendOp::Send, Vec::new());
            wr.flags = SendFlags::SIGNALED | SendFlags::INLINE;
            wr.inline_data = capsule;
            wr
        } else if let Some(slot) = slot {
            // A registered slot: its SEND's completion gives it back.
            let at = slot as usize * self.slot_len;
            self.slots.write(at, &capsule);
            let sge = self.slots_mr.sge(at, capsule.len() as u32);
            let mut wr = SendWr::new(SLOT_WR | u64::from(slot), SendOp::Send, sge);
            wr.flags = SendFlags::SIGNALED;
            wr
        } else {
            let len = capsule.len() as u32;
            let mr = self
                .pd
                .reg_mr(Arc::new(Region::from_vec(capsule)), Access::LOCAL_WRITE)
                .map_err(rdma_err)?;
            let mut wr = SendWr::new(id, SendOp::Send, mr.sge(0, len));
            wr.flags = SendFlags::SIGNALED;
            lock(&self.send_mrs).insert(id, mr);
            wr
        };
        self.qp.post_send(wr).map_err(|e| {
            lock(&self.send_mrs).remove(&id);
            if let Some(slot) = slot {
                lock(&self.free_slots).push(slot);
            }
            rdma_err(e)
        })
    }

    pub(super) fn send_raw(&self, b: Vec<u8>) -> Result<(), NvmeError> {
        self.send(b)
    }

    /// Makes `region` reachable by the controller with `access`: a memory region and the
    /// keyed SGL naming it. With invalidation, a fast-registered one (posted here, before
    /// the command that names its key) whose key the completion must invalidate.
    fn expose(&self, region: Arc<Region>, access: Access) -> Result<(Exposed, Sgl), NvmeError> {
        let len = region.len();
        let access = access | Access::LOCAL_WRITE;
        if !self.invalidate {
            let mr = self.pd.reg_mr(region, access).map_err(rdma_err)?;
            let sgl = Sgl::Keyed {
                addr: mr.iova(),
                len: len as u32,
                key: mr.rkey(),
                invalidate: false,
            };
            return Ok((Exposed::Own { _mr: mr }, sgl));
        }
        // The limit of a fast registration, not memory: any command's buffer fits.
        let mut desc = self
            .mrs
            .take(|| self.pd.alloc_mr(u32::MAX as usize))
            .map_err(rdma_err)?;
        if let Some(stale) = desc.stale_key() {
            let id = self.next_wr.fetch_add(1, Ordering::Relaxed);
            let mut wr = SendWr::new(id, SendOp::LocalInv { key: stale }, SgList::new());
            wr.flags = SendFlags::SIGNALED;
            self.qp.post_send(wr).map_err(rdma_err)?;
        }
        let key = desc
            .mr
            .key_with_variant(self.variant.fetch_add(1, Ordering::Relaxed));
        let iova = region.addr();
        let id = self.next_wr.fetch_add(1, Ordering::Relaxed);
        let mut wr = SendWr::new(
            id,
            SendOp::FastReg(FastReg {
                key,
                iova,
                offset: 0,
                length: len.max(1),
                region,
                access,
            }),
            SgList::new(),
        );
        wr.flags = SendFlags::SIGNALED;
        self.qp.post_send(wr).map_err(rdma_err)?;
        let sgl = Sgl::Keyed {
            addr: iova,
            len: len as u32,
            key,
            invalidate: true,
        };
        desc.registered(key);
        Ok((Exposed::Fr(desc), sgl))
    }

    /// Sends a command with its data (in the capsule when it fits in `in_capsule`, else by
    /// keyed SGL), or a buffer for `in_len` bytes back; waits for its completion.
    pub(super) async fn submit(
        &self,
        mut sqe: Sqe,
        out: Option<Vec<u8>>,
        in_len: u32,
        in_capsule: usize,
    ) -> Result<Completion, NvmeError> {
        let mut capsule_data = Vec::new();
        let (sgl, mr, read) = match out {
            Some(d) if d.len() <= in_capsule => {
                let sgl = Sgl::DataBlock {
                    addr: 0,
                    len: d.len() as u32,
                    offset: true,
                };
                capsule_data = d;
                (sgl, None, None)
            }
            Some(d) => {
                let (mr, sgl) = self.expose(Arc::new(Region::from_vec(d)), Access::REMOTE_READ)?;
                (sgl, Some(mr), None)
            }
            None if in_len > 0 => {
                let region = self.buffers.take(in_len as usize);
                let (mr, sgl) = self.expose(region.clone(), Access::REMOTE_WRITE)?;
                (sgl, Some(mr), Some((region, in_len as usize)))
            }
            // As nvme_rdma_set_sg_null: a keyed SGL of nothing.
            None => (
                Sgl::Keyed {
                    addr: 0,
                    len: 0,
                    key: 0,
                    invalidate: false,
                },
                None,
                None,
            ),
        };
        sqe.dptr = sgl.to_bytes();
        self.issue(sqe, &capsule_data, mr, read).await
    }

    /// Sends `sqe` with `data` in its capsule as they are.
    pub(super) async fn send_capsule(&self, sqe: Sqe, data: &[u8]) -> Result<Cqe, NvmeError> {
        Ok(self.issue(sqe, data, None, None).await?.cqe)
    }

    async fn issue(
        &self,
        sqe: Sqe,
        data: &[u8],
        mr: Option<Exposed>,
        read: Option<(Arc<Region>, usize)>,
    ) -> Result<Completion, NvmeError> {
        self.entries
            .acquire()
            .await
            .map_err(|_| NvmeError::Protocol("connection closed".into()))?
            .forget();
        let (tx, rx) = oneshot::channel();
        let invalidate = sqe.sgl().invalidate_key();
        lock(&self.flights)
            .as_mut()
            .ok_or_else(|| NvmeError::Protocol("connection closed".into()))?
            .insert(
                sqe.cid,
                InFlight {
                    mr,
                    invalidate,
                    read,
                    done: tx,
                },
            );
        let mut capsule = Vec::with_capacity(SQE_LEN + data.len());
        capsule.extend_from_slice(&sqe.to_bytes());
        capsule.extend_from_slice(data);
        if let Err(e) = self.send(capsule) {
            lock(&self.flights).as_mut().map(|m| m.remove(&sqe.cid));
            return Err(e);
        }
        rx.await
            .map_err(|_| NvmeError::Protocol("connection closed".into()))?
    }
}
