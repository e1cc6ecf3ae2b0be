//! The initiator's end of an iSER connection, for the in-repo initiator
//! ([`crate::iscsi::Session::connect_iser`]): control PDUs as SENDs with their iSER
//! header, received PDUs from the receive ring, and memory registration of command buffers
//! (read buffers the target RDMA-writes, write buffers it RDMA-reads).

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use rtgt_rdma_channel::Mr;
use rtgt_transport::cm::{prepare_qp, Cm, CmConn, CmError, ConnParams, Reason};
use rtgt_transport::verbs::{Access, Pd, Region};

use rtgt_iscsi::conn::RxPdu;
use rtgt_iscsi::iser::conn::{
    next_event, poll_send, Endpoint, IserLink, Link, Received, Receiver, RxEvent, Stags,
};
use rtgt_iscsi::iser::header::{CmHeader, Repr, HEADER_LEN};
use rtgt_iscsi::iser::Sizing;
use rtgt_iscsi::pdu::BHS_LEN;
use rtgt_iscsi::IscsiError;

use crate::buffers::{self, FastRegistrar, ReadBuffers};

/// One iSER connection as the initiator drives it.
pub struct IserTransport {
    link: Arc<Link>,
    pd: Pd,
    rx: tokio::sync::Mutex<(Receiver, Vec<RxEvent>)>,
    poller: std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// The CM connection, when the CM made it; dropped (disconnected) with the transport.
    cm: std::sync::Mutex<Option<Arc<CmConn>>>,
    /// Read buffers of finished commands, for the next ones.
    buffers: ReadBuffers,
    /// Fast-registration MRs of finished commands, for the next ones.
    mrs: FastRegistrar,
}

/// An MR of the connection's pool.
pub type FrDesc = buffers::FrDesc<Arc<Mr>>;

impl IserTransport {
    /// Starts on a connected endpoint (its receive ring posted, the QP in RTS).
    pub fn start(ep: Endpoint, peer: SocketAddr) -> Result<Arc<IserTransport>, IscsiError> {
        let link = Arc::new(Link::new(&ep, peer, None).map_err(|e| {
            tracing::debug!(error = %e, "iSER initiator link");
            IscsiError::Protocol("iSER link setup")
        })?);
        let pd = ep
            .pd
            .soft()
            .cloned()
            .ok_or(IscsiError::Protocol("iSER initiator needs the soft engine"))?;
        let poller = tokio::spawn(poll_send(link.clone(), ep.send_cq().clone()));
        Ok(Arc::new(IserTransport {
            link,
            rx: tokio::sync::Mutex::new((Receiver::new(ep), Vec::new())),
            poller: std::sync::Mutex::new(Some(poller)),
            cm: std::sync::Mutex::new(None),
            buffers: ReadBuffers::default(),
            mrs: FastRegistrar::new(pd.clone()),
            pd,
        }))
    }

    /// Keeps the CM connection with the transport: a DREQ or a vanished peer closes it.
    pub fn attach(&self, conn: CmConn) {
        let conn = Arc::new(conn);
        let c = conn.clone();
        let link = self.link.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = c.disconnected() => link.close(),
                _ = link.closed() => {}
            }
        });
        *self.cm.lock().unwrap_or_else(|e| e.into_inner()) = Some(conn);
    }

    /// Sends one PDU behind `iser` (a control header with the command's STags, or a plain one).
    pub async fn send(
        &self,
        iser: &[u8; HEADER_LEN],
        bhs: &[u8; BHS_LEN],
        ahs: &[u8],
        data: &[u8],
    ) -> Result<(), IscsiError> {
        let slot = self.link.reserve().await?;
        self.link.post_message(slot, iser, bhs, ahs, data, None)
    }

    /// Sends `bytes` as one message, as given (tests of malformed input).
    pub async fn send_raw(&self, bytes: &[u8]) -> Result<(), IscsiError> {
        Ok(self.link.send(&[bytes], None).await?)
    }

    /// The next PDU from the target, with the STags of its iSER header.
    pub async fn recv(&self) -> Result<(Stags, RxPdu), IscsiError> {
        let mut g = self.rx.lock().await;
        let (rx, queue) = &mut *g;
        match next_event(&self.link, rx, queue).await? {
            RxEvent::Msg(Received::Pdu(s, p)) => Ok((s, p)),
            RxEvent::Msg(Received::Hello) => {
                Err(IscsiError::Protocol("iSER Hello from the target"))
            }
            RxEvent::Msg(Received::Bad(why)) => Err(IscsiError::Protocol(why)),
            RxEvent::Failed(_) => Err(IscsiError::Closed),
        }
    }

    /// Registers `region` for the target's RDMA access.
    pub fn register(&self, region: Arc<Region>, access: Access) -> Result<Mr, IscsiError> {
        self.pd
            .reg_mr(region, access | Access::LOCAL_WRITE)
            .map(Mr::Soft)
            .map_err(|_| IscsiError::Protocol("memory registration"))
    }

    /// Fast-registers `region` (IB_WR_REG_MR, as ib_iser does) with an MR of the pool and
    /// returns it with the key it now answers to.
    pub async fn fast_register(
        &self,
        region: Arc<Region>,
        access: Access,
    ) -> Result<FrDesc, IscsiError> {
        Ok(self.mrs.register(&self.link, region, access).await?)
    }

    /// Takes `desc` back for later commands.
    fn give_mr(&self, desc: FrDesc) {
        self.mrs.give(desc);
    }

    pub fn is_closed(&self) -> bool {
        self.link.is_closing()
    }

    /// Moves the QP to error; what is in flight is flushed.
    pub fn close(&self) {
        self.link.close();
    }

    /// Closes and waits until every posted operation has completed.
    pub async fn shutdown(&self) {
        self.close();
        let cm = self.cm.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(c) = cm {
            c.disconnect();
        }
        let p = self.poller.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(p) = p {
            let _ = p.await;
        }
    }
}

impl Drop for IserTransport {
    fn drop(&mut self) {
        self.link.close();
    }
}

/// Connects to an iSER portal through the CM as ib_iser does (REQ private data 0x80: no
/// zero-based addressing, send with invalidate welcome; one RDMA READ of our own in
/// flight, up to 16 served). Returns the endpoint, its receive ring posted, and the
/// connection.
pub async fn connect(
    cm: &Cm,
    pd: &Pd,
    dst: SocketAddr,
    sizing: Sizing,
) -> Result<(Endpoint, CmConn), IscsiError> {
    let hdr = CmHeader {
        zbva_not_supported: true,
        send_w_inv_not_supported: false,
    };
    let mut attempt = 0;
    loop {
        attempt += 1;
        let ep = Endpoint::new(pd, sizing).map_err(|_| IscsiError::Protocol("iSER endpoint"))?;
        let qp = ep.qp.soft().ok_or(IscsiError::Protocol("iSER QP"))?.clone();
        prepare_qp(&qp).map_err(|_| IscsiError::Protocol("iSER QP"))?;
        ep.post_receives()
            .map_err(|_| IscsiError::Protocol("iSER receives"))?;
        let params = ConnParams {
            private_data: hdr.to_bytes().to_vec(),
            responder_resources: 16,
            initiator_depth: 1,
            retry_count: 7,
            rnr_retry_count: 6,
            ..ConnParams::default()
        };
        match cm.connect(&qp, dst, params).await {
            Ok(c) => return Ok((ep, c)),
            // The target still holds a connection of an earlier process with the same IDs in
            // its timewait: try again once that has passed.
            Err(CmError::Rejected {
                reason: Reason::StaleConn,
                ..
            }) if attempt < 4 => {
                tracing::debug!(%dst, attempt, "iSER connect: stale connection, retrying");
                tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
            }
            Err(CmError::Rejected { reason, .. }) => {
                tracing::debug!(?reason, %dst, "iSER connect rejected");
                return Err(IscsiError::Closed);
            }
            Err(CmError::Timeout) => return Err(IscsiError::Timeout),
            Err(e) => {
                tracing::debug!(error = %e, %dst, "iSER connect failed");
                return Err(IscsiError::Closed);
            }
        }
    }
}

/// The memory of one SCSI command on an iSER initiator: the registered read and write
/// buffers and the iSER header that advertises them. The buffers and MRs go back to the
/// transport when the command is done with them.
pub struct CommandMemory {
    pub header: [u8; HEADER_LEN],
    read: Option<(Arc<Region>, FrDesc)>,
    write: Option<FrDesc>,
    transport: Arc<IserTransport>,
}

impl CommandMemory {
    /// Registers `in_len` bytes to receive read data and `data_out` for the target to read
    /// from offset `unsolicited` on (the Write VA points there, as ib_iser sends it). Both
    /// are fast-registered MRs, so a SCSI Response may invalidate them remotely.
    /// `corrupt_stag` advertises wrong keys (tests of the target's error handling).
    pub async fn new(
        t: &Arc<IserTransport>,
        in_len: u32,
        data_out: Option<&[u8]>,
        unsolicited: usize,
        corrupt_stag: bool,
    ) -> Result<CommandMemory, IscsiError> {
        let garble = |k: u32| if corrupt_stag { k ^ 0x00a5_5a00 } else { k };
        let stag = |d: &FrDesc, va: u64| rtgt_iscsi::iser::header::Stag {
            stag: garble(d.key().unwrap_or_default()),
            va,
        };
        let mut mem = CommandMemory {
            header: [0; HEADER_LEN],
            read: None,
            write: None,
            transport: t.clone(),
        };
        let mut read_stag = None;
        if in_len > 0 {
            let region = t.buffers.take(in_len as usize);
            let desc = t
                .fast_register(region.clone(), Access::REMOTE_WRITE)
                .await?;
            read_stag = Some(stag(&desc, region.addr()));
            mem.read = Some((region, desc));
        }
        let mut write_stag = None;
        if let Some(d) = data_out {
            if d.len() > unsolicited {
                let region = Arc::new(Region::from_vec(d.to_vec()));
                let va = region.addr() + unsolicited as u64;
                let desc = t.fast_register(region, Access::REMOTE_READ).await?;
                write_stag = Some(stag(&desc, va));
                mem.write = Some(desc);
            }
        }
        mem.header = Repr::Control {
            write: write_stag,
            read: read_stag,
        }
        .to_bytes();
        Ok(mem)
    }

    /// The target's SCSI Response came with Invalidate of `key`.
    pub fn invalidated(&mut self, key: u32) {
        let read = self.read.as_mut().map(|(_, d)| d);
        for d in read.into_iter().chain(self.write.as_mut()) {
            d.invalidated(key);
        }
    }

    /// The length of the read buffer (0 without one).
    pub fn read_len(&self) -> usize {
        self.read.as_ref().map_or(0, |(r, _)| r.len())
    }

    /// The first `n` bytes the target wrote into the read buffer, without a copy when its
    /// key is gone (the buffer goes back to the transport once they are dropped); the MRs go
    /// back now.
    pub fn into_read_data(mut self, n: usize) -> Bytes {
        match self.read.take() {
            Some((region, desc)) => {
                // A key the target did not invalidate still reaches the buffer.
                let reachable = desc.key().is_some();
                self.transport.give_mr(desc);
                self.transport.buffers.landed(region, n, reachable)
            }
            None => Bytes::new(),
        }
    }
}

impl Drop for CommandMemory {
    fn drop(&mut self) {
        let t = &self.transport;
        if let Some((region, desc)) = self.read.take() {
            // An MR the target did not invalidate still refers to the region (until its next
            // registration invalidates it): that buffer is not reused.
            t.give_mr(desc);
            t.buffers.give(region);
        }
        if let Some(desc) = self.write.take() {
            t.give_mr(desc);
        }
    }
}
