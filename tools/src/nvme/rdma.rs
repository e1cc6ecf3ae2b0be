//! The NVMe/RDMA side of the host, as Linux's nvme-rdma: one RC queue pair per queue,
//! connected through RDMA/CM with the queue's ID and sizes in the REQ's private data; a
//! command is a SEND of its capsule (with in-capsule data when it fits), its data buffer is
//! a memory region named by a keyed SGL (the controller reads write data by RDMA READ and
//! writes read data by RDMA WRITE), and its completion a SEND into one of the queue's
//! receive buffers. Commands are bounded by the queue's entries. The queue pair, its send
//! slots and receive ring are the RDMA channel layer's, as the target's and the iSER host's
//! are.
//!
//! With [`HostConfig::invalidate`] (Linux's default), a command's buffer is fast-registered
//! (IB_WR_REG_MR) with a new key and its SGL asks the controller to invalidate that key with
//! the completion; a completion that does not (or invalidates another key) fails the
//! command, as nvme-rdma treats it.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use rtgt_nvme::rdma::{CmReq, CM_REJ_LEN};
use rtgt_nvme::sqe::{Cqe, Sgl, Sqe, CQE_LEN, SQE_LEN};
use rtgt_rdma_channel::{poll_send, Endpoint, Link, LinkError, Mr, Receiver, Rings, RxEvent};
use rtgt_transport::cm::{prepare_qp, Cm, CmConn, CmError, ConnParams};
use rtgt_transport::verbs::{Access, Pd, Region};
use tokio::sync::{oneshot, Semaphore};

use super::{Completion, HostConfig, NvmeError};
use crate::buffers::{FastRegistrar, FrDesc, ReadBuffers};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn rdma_err(e: impl std::fmt::Display) -> NvmeError {
    NvmeError::Rdma(e.to_string())
}

fn closed() -> NvmeError {
    NvmeError::Protocol("connection closed".into())
}

fn link_err(e: LinkError) -> NvmeError {
    match e {
        LinkError::Closed => closed(),
        e => rdma_err(e),
    }
}

/// The most in-capsule data this host sends (what its I/O queues use).
pub(super) const IN_CAPSULE_MAX: usize = 8192;

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
        _mr: rtgt_transport::verbs::Mr,
    },
    Fr(FrDesc<Arc<Mr>>),
}

/// One NVMe/RDMA queue's connection.
pub struct RdmaWire {
    link: Arc<Link>,
    pd: Pd,
    /// Commands in flight by command ID; `None` once the queue is gone.
    flights: Mutex<Option<HashMap<u16, InFlight>>>,
    /// The queue's entries.
    entries: Semaphore,
    /// Ask for SEND with Invalidate (keyed SGLs with the invalidate subtype).
    invalidate: bool,
    conn: Mutex<Option<CmConn>>,
    buffers: ReadBuffers,
    /// Fast-registration MRs of finished commands, for the next ones.
    mrs: FastRegistrar,
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
        let pd = cm.device().alloc_pd().map_err(rdma_err)?;
        let slots = u32::from(size);
        let rings = Rings {
            recv_slots: slots,
            recv_slot_len: CQE_LEN,
            send_slots: slots,
            send_slot_len: SQE_LEN + IN_CAPSULE_MAX,
            // A command's SEND, its fast registration and, rarely, a local invalidation
            // before it.
            send_queue: slots * 3 + 8,
            // The controller reads write data from us; we read nothing from it.
            rdma_read_depth: 0,
        };
        let ep = Endpoint::new(&pd, rings).map_err(rdma_err)?;
        let qp = ep
            .qp
            .soft()
            .cloned()
            .ok_or_else(|| rdma_err("no soft QP"))?;
        prepare_qp(&qp).map_err(rdma_err)?;
        // Posted before the REQ: the controller may answer as soon as it is connected.
        ep.post_receives().map_err(rdma_err)?;
        let link = Arc::new(Link::new(&ep, addr, None).map_err(rdma_err)?);
        // Both end once the link closes.
        tokio::spawn(poll_send(link.clone(), ep.send_cq().clone()));
        let wire = Arc::new(RdmaWire {
            link,
            mrs: FastRegistrar::new(pd.clone()),
            pd,
            flights: Mutex::new(Some(HashMap::new())),
            entries: Semaphore::new(usize::from(size)),
            invalidate: cfg.invalidate,
            conn: Mutex::new(None),
            buffers: ReadBuffers::default(),
        });
        tokio::spawn(wire.clone().completions(Receiver::new(ep)));
        // As nvme_rdma_route_resolved: the admin queue and I/O queues alike say their size.
        let req = CmReq {
            recfmt: 0,
            qid,
            hrqsize: size,
            hsqsize: size - 1,
            cntlid: cfg.cm_cntlid.unwrap_or(cntlid),
        };
        let params = ConnParams {
            private_data: req.to_bytes().to_vec(),
            responder_resources: 4,
            initiator_depth: 0,
            retry_count: 7,
            rnr_retry_count: 7,
            flow_control: true,
            ..ConnParams::default()
        };
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

    /// Disconnects; commands in flight fail.
    pub(super) fn close(&self) {
        let gone = lock(&self.flights).take();
        for (_, f) in gone.into_iter().flatten() {
            let _ = f.done.send(Err(closed()));
        }
        self.entries.close();
        self.link.close();
        if let Some(c) = lock(&self.conn).take() {
            c.disconnect();
        }
    }

    /// Takes completions until the queue pair fails or the queue closes.
    async fn completions(self: Arc<Self>, mut rx: Receiver) {
        let mut events = Vec::new();
        loop {
            rx.take(&mut events);
            for ev in events.drain(..) {
                let done = match ev {
                    RxEvent::Msg(msg, invalidated) => self.completed(&msg, invalidated),
                    RxEvent::Failed(status) => {
                        tracing::debug!(?status, "NVMe/RDMA host: the queue pair failed");
                        false
                    }
                };
                if !done {
                    self.close();
                    return;
                }
            }
            tokio::select! {
                _ = rx.wait() => {}
                _ = self.link.closed() => {
                    self.close();
                    return;
                }
            }
        }
    }

    /// Completes the command a response capsule names; false if it is no completion entry.
    fn completed(&self, msg: &[u8], invalidated: Option<u32>) -> bool {
        let Some(cqe) = Cqe::parse(&msg[..msg.len().min(CQE_LEN)]) else {
            return false;
        };
        let f = lock(&self.flights)
            .as_mut()
            .and_then(|m| m.remove(&cqe.cid));
        let Some(mut f) = f else {
            return true;
        };
        // The MR back to the pool, free unless its key is still valid.
        if let Some(Exposed::Fr(mut d)) = f.mr.take() {
            if let Some(key) = invalidated {
                d.invalidated(key);
            }
            self.mrs.give(d);
        }
        let result = if invalidated != f.invalidate {
            Err(NvmeError::Protocol(format!(
                "completion invalidated {invalidated:x?}, the command's key is {:x?}",
                f.invalidate
            )))
        } else {
            // The MR (taken above) no longer names the buffer: its key was invalidated, or
            // the MR registered for the command alone is gone.
            let data = match f.read {
                Some((region, len)) => self.buffers.landed(region, len, false),
                None => Bytes::new(),
            };
            Ok(Completion { cqe, data })
        };
        let _ = f.done.send(result);
        self.entries.add_permits(1);
        true
    }

    /// Sends the concatenation of `parts` (a capsule: its entry, then any data) as one SEND
    /// from a send slot.
    async fn send(&self, parts: &[&[u8]]) -> Result<(), NvmeError> {
        self.link.send(parts, None).await.map_err(link_err)
    }

    pub(super) async fn send_raw(&self, b: &[u8]) -> Result<(), NvmeError> {
        self.send(&[b]).await
    }

    /// Makes `region` reachable by the controller with `access`: a memory region and the
    /// keyed SGL naming it. With invalidation, a fast-registered one (posted here, before
    /// the command that names its key) whose key the completion must invalidate.
    async fn expose(
        &self,
        region: Arc<Region>,
        access: Access,
    ) -> Result<(Exposed, Sgl), NvmeError> {
        let len = region.len() as u32;
        let addr = region.addr();
        if !self.invalidate {
            let mr = self
                .pd
                .reg_mr(region, access | Access::LOCAL_WRITE)
                .map_err(rdma_err)?;
            let sgl = Sgl::Keyed {
                addr: mr.iova(),
                len,
                key: mr.rkey(),
                invalidate: false,
            };
            return Ok((Exposed::Own { _mr: mr }, sgl));
        }
        let desc = self
            .mrs
            .register(&self.link, region, access)
            .await
            .map_err(link_err)?;
        let sgl = Sgl::Keyed {
            addr,
            len,
            key: desc.key().unwrap_or_default(),
            invalidate: true,
        };
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
                let (mr, sgl) = self
                    .expose(Arc::new(Region::from_vec(d)), Access::REMOTE_READ)
                    .await?;
                (sgl, Some(mr), None)
            }
            None if in_len > 0 => {
                let region = self.buffers.take(in_len as usize);
                let (mr, sgl) = self.expose(region.clone(), Access::REMOTE_WRITE).await?;
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
        self.entries.acquire().await.map_err(|_| closed())?.forget();
        let (tx, rx) = oneshot::channel();
        let invalidate = sqe.sgl().invalidate_key();
        lock(&self.flights).as_mut().ok_or_else(closed)?.insert(
            sqe.cid,
            InFlight {
                mr,
                invalidate,
                read,
                done: tx,
            },
        );
        if let Err(e) = self.send(&[&sqe.to_bytes(), data]).await {
            lock(&self.flights).as_mut().map(|m| m.remove(&sqe.cid));
            return Err(e);
        }
        rx.await.map_err(|_| closed())?
    }
}
