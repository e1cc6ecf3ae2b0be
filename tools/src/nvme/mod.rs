//! An NVMe over Fabrics host: one [`Queue`] per connection (admin or I/O), as Linux sets
//! them up. Over TCP ([`Queue::connect`], as nvme-tcp): ICReq, Connect with its data in the
//! capsule, then commands; writes send their data in the capsule when it fits, else in
//! H2CData PDUs after the controller's R2T; reads take C2HData PDUs. Over RDMA
//! ([`Queue::connect_rdma`], as nvme-rdma, on the soft-RoCE stack): see [`rdma`]. Used by
//! the loopback tests and the benchmark.

pub mod rdma;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::{Arc, Mutex};

use bytes::{Buf, Bytes};
use rtgt_nvme::admin::{self, IdController, IdNamespace};
use rtgt_nvme::ctrl::property;
use rtgt_nvme::fabrics::{ConnectData, FabricsCmd};
use rtgt_nvme::nvm::{self, Rw};
use rtgt_nvme::sqe::{Cqe, Sgl, Sqe, Status, PSDT_SGL, SQE_LEN};
use rtgt_nvme::subsys::CNTLID_DYNAMIC;
use rtgt_nvme::tcp::{self, Digests, Header};
use rtgt_nvme::tcp_queue;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::{oneshot, Mutex as AsyncMutex};

/// Why a command or the connection failed.
#[derive(Debug, thiserror::Error)]
pub enum NvmeError {
    #[error("I/O: {0}")]
    Io(#[from] std::io::Error),
    #[error("RDMA: {0}")]
    Rdma(String),
    #[error("the controller rejected the RDMA connection: status {0:#x}")]
    Rejected(u16),
    #[error("protocol: {0}")]
    Protocol(String),
    #[error("the controller terminated the connection: status {fes:#x}, field {fei}")]
    Terminated { fes: u16, fei: u32 },
    #[error("command failed: {0:?}")]
    Status(Status),
}

/// What a completed command returned.
#[derive(Debug, Clone, Default)]
pub struct Completion {
    pub cqe: Cqe,
    /// What the controller returned: over RDMA, the buffer it wrote into (no copy).
    pub data: Bytes,
}

/// A command in flight: its data to send (if the controller asks), what it received.
struct InFlight {
    /// Data the controller asks for with R2T (shared, not copied, by the reader).
    out: Option<Arc<Vec<u8>>>,
    data: Vec<u8>,
    done: oneshot::Sender<Result<Completion, NvmeError>>,
}

/// The commands in flight; `None` once the connection is gone.
type Flights = Arc<Mutex<Option<HashMap<u16, InFlight>>>>;

/// One queue.
pub struct Queue {
    wire: Wire,
    next_cid: AtomicU16,
    /// In-capsule data this queue sends (0: none).
    in_capsule: usize,
    pub qid: u16,
    pub cntlid: u16,
}

/// The transport under a queue.
enum Wire {
    Tcp(TcpWire),
    Rdma(Arc<rdma::RdmaWire>),
}

impl Drop for Wire {
    fn drop(&mut self) {
        // The completion task holds the RDMA wire too: closing it ends that task.
        if let Wire::Rdma(r) = self {
            r.close();
        }
    }
}

/// An NVMe/TCP connection.
struct TcpWire {
    wr: Arc<AsyncMutex<OwnedWriteHalf>>,
    flights: Flights,
    digests: Digests,
    reader: tokio::task::JoinHandle<()>,
}

impl Drop for TcpWire {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

fn protocol(m: impl Into<String>) -> NvmeError {
    NvmeError::Protocol(m.into())
}

/// Most data a PDU from the controller may carry.
const MAX_PDU_DATA: usize = 16 << 20;

/// A PDU (or its head) read: a common header that breaks the protocol is a protocol error.
fn read(r: std::io::Result<Result<(), tcp::PduError>>) -> Result<(), NvmeError> {
    r?.map_err(|e| protocol(format!("{e:?}")))
}

async fn read_pdu<R: AsyncRead + Unpin>(rd: &mut R) -> Result<Vec<u8>, NvmeError> {
    let mut b = Vec::new();
    read(tcp_queue::read_pdu(rd, MAX_PDU_DATA, &mut b).await)?;
    Ok(b)
}

/// Connection parameters.
#[derive(Debug, Clone)]
pub struct HostConfig {
    pub host_nqn: String,
    pub host_id: [u8; 16],
    pub digests: Digests,
    /// Keep alive timeout asked for on the admin queue, in milliseconds.
    pub kato: u32,
    /// Disable SQ flow control (Connect CATTR bit 2): the controller may then end a read
    /// with a C2HData PDU whose SUCCESS flag replaces the response capsule.
    pub disable_sqflow: bool,
    /// NVMe/RDMA: keyed SGLs ask the controller to invalidate their key with the
    /// completion (SEND with Invalidate), as Linux's nvme-rdma does.
    pub invalidate: bool,
    /// NVMe/RDMA: the controller ID a queue's connection request names, when not the one
    /// its Connect names (tests of hosts that leave it out or name another).
    pub cm_cntlid: Option<u16>,
}

impl Default for HostConfig {
    fn default() -> HostConfig {
        HostConfig {
            host_nqn: "nqn.2014-08.org.nvmexpress:uuid:7b1c0d4e-2a6f-4c3b-9e8d-5f6a7b8c9d0e".into(),
            host_id: [0x7b; 16],
            digests: Digests::default(),
            kato: 0,
            disable_sqflow: false,
            invalidate: true,
            cm_cntlid: None,
        }
    }
}

impl Queue {
    /// Opens NVMe/TCP queue `qid` of subsystem `subnqn` at `addr`: admin (`qid` 0, a new
    /// controller) or I/O (of controller `cntlid`), `size` entries.
    pub async fn connect(
        addr: SocketAddr,
        cfg: &HostConfig,
        subnqn: &str,
        qid: u16,
        cntlid: u16,
        size: u16,
    ) -> Result<Queue, NvmeError> {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        let (mut rd, mut wr) = stream.into_split();
        let icreq = Header::IcReq {
            pfv: 0,
            hpda: 0,
            digests: cfg.digests,
            maxr2t: 0,
        }
        .to_pdu(cfg.digests, &[], 0);
        wr.write_all(&icreq).await?;
        let b = read_pdu(&mut rd).await?;
        let (digests, maxh2c) = match tcp::parse(&b, Digests::default()) {
            Ok((
                Header::IcResp {
                    digests,
                    maxh2cdata,
                    ..
                },
                _,
            )) => (digests, maxh2cdata.max(4096) as usize),
            Ok((Header::TermReq { fes, fei, .. }, _)) => {
                return Err(NvmeError::Terminated { fes, fei })
            }
            other => return Err(protocol(format!("expected ICResp: {other:?}"))),
        };
        let flights: Flights = Arc::new(Mutex::new(Some(HashMap::new())));
        let wr = Arc::new(AsyncMutex::new(wr));
        let reader = tokio::spawn(read_loop(rd, wr.clone(), flights.clone(), digests, maxh2c));
        let wire = Wire::Tcp(TcpWire {
            wr,
            flights,
            digests,
            reader,
        });
        // Admin queues carry what the transport fixes; I/O queues what IOCCSZ says.
        let admin = rtgt_nvme::subsys::ADMIN_IN_CAPSULE as usize;
        Queue::open(wire, admin, cfg, subnqn, qid, cntlid, size).await
    }

    /// Sends the Connect of queue `qid` on `wire`; the queue, with the controller's ID, once
    /// it succeeded.
    #[allow(clippy::too_many_arguments)]
    async fn open(
        wire: Wire,
        in_capsule: usize,
        cfg: &HostConfig,
        subnqn: &str,
        qid: u16,
        cntlid: u16,
        size: u16,
    ) -> Result<Queue, NvmeError> {
        let mut q = Queue {
            wire,
            next_cid: AtomicU16::new(1),
            in_capsule,
            qid,
            cntlid: 0,
        };
        let data = ConnectData {
            host_id: cfg.host_id,
            cntlid: if qid == 0 { CNTLID_DYNAMIC } else { cntlid },
            subsys_nqn: subnqn.into(),
            host_nqn: cfg.host_nqn.clone(),
        };
        let cmd = FabricsCmd::Connect {
            recfmt: 0,
            qid,
            sqsize: size - 1,
            cattr: if cfg.disable_sqflow { 1 << 2 } else { 0 },
            kato: if qid == 0 { cfg.kato } else { 0 },
        };
        let c = q
            .submit(cmd.to_sqe(0, [0; 16]), Some(data.to_bytes().to_vec()), 0)
            .await?;
        q.cntlid = c.cqe.dw0 as u16;
        Ok(q)
    }

    /// Opens NVMe/RDMA queue `qid` through the connection manager `cm` (the soft-RoCE
    /// stack), as [`Queue::connect`] over TCP. Like Linux's nvme-rdma, the admin queue
    /// sends no data in capsules (Connect's data too goes by keyed SGL, which the controller
    /// reads by RDMA READ); I/O queues send up to 8 KiB in the capsule.
    pub async fn connect_rdma(
        cm: &rtgt_transport::cm::Cm,
        addr: SocketAddr,
        cfg: &HostConfig,
        subnqn: &str,
        qid: u16,
        cntlid: u16,
        size: u16,
    ) -> Result<Queue, NvmeError> {
        let wire = rdma::RdmaWire::connect(cm, addr, cfg, qid, cntlid, size).await?;
        let in_capsule = if qid == 0 { 0 } else { rdma::IN_CAPSULE_MAX };
        Queue::open(Wire::Rdma(wire), in_capsule, cfg, subnqn, qid, cntlid, size).await
    }

    /// Sends write data of up to what the controller's Identify reports (IOCCSZ, 16-byte
    /// units of a whole capsule) in capsules, as Linux's hosts do on I/O queues; over RDMA
    /// no more than this host's send buffers hold.
    pub fn use_ioccsz(&mut self, ioccsz: u32) {
        let bytes = (ioccsz as usize * 16).saturating_sub(SQE_LEN);
        self.in_capsule = match self.wire {
            Wire::Tcp(_) => bytes,
            Wire::Rdma(_) => bytes.min(rdma::IN_CAPSULE_MAX),
        };
    }

    /// Sends a command (its `dptr` is filled in here) with `out` to write, expecting up to
    /// `in_len` bytes back; waits for its completion.
    pub async fn submit(
        &self,
        mut sqe: Sqe,
        out: Option<Vec<u8>>,
        in_len: u32,
    ) -> Result<Completion, NvmeError> {
        sqe.cid = self.next_cid.fetch_add(1, Ordering::Relaxed);
        sqe.flags |= PSDT_SGL;
        let c = match &self.wire {
            Wire::Tcp(t) => t.submit(sqe, out, in_len, self.in_capsule).await?,
            Wire::Rdma(r) => r.submit(sqe, out, in_len, self.in_capsule).await?,
        };
        if !c.cqe.status.is_success() {
            return Err(NvmeError::Status(c.cqe.status));
        }
        Ok(c)
    }

    /// Sends `sqe` as it is (its SGL too) with `data` in its capsule and waits for its
    /// completion, whatever its status (tests of bad commands).
    pub async fn submit_as_is(&self, mut sqe: Sqe, data: &[u8]) -> Result<Cqe, NvmeError> {
        sqe.cid = self.next_cid.fetch_add(1, Ordering::Relaxed);
        match &self.wire {
            Wire::Tcp(t) => t.send_capsule(sqe, data).await,
            Wire::Rdma(r) => r.send_capsule(sqe, data).await,
        }
    }

    /// Sends raw bytes: a PDU over TCP, a capsule over RDMA (tests of malformed input).
    pub async fn send_raw(&self, b: &[u8]) -> Result<(), NvmeError> {
        match &self.wire {
            Wire::Tcp(t) => {
                t.wr.lock().await.write_all(b).await?;
                Ok(())
            }
            Wire::Rdma(r) => r.send_raw(b).await,
        }
    }
}

impl TcpWire {
    async fn submit(
        &self,
        mut sqe: Sqe,
        out: Option<Vec<u8>>,
        in_len: u32,
        in_capsule_max: usize,
    ) -> Result<Completion, NvmeError> {
        let cid = sqe.cid;
        let (tx, rx) = oneshot::channel();
        let in_capsule = out.as_ref().is_some_and(|d| d.len() <= in_capsule_max);
        sqe.dptr = match &out {
            Some(d) if in_capsule => Sgl::DataBlock {
                addr: 0,
                len: d.len() as u32,
                offset: true,
            },
            Some(d) => Sgl::Transport {
                len: d.len() as u32,
            },
            None => Sgl::Transport { len: in_len },
        }
        .to_bytes();
        let pdu = Header::Cmd(sqe).to_pdu(
            self.digests,
            out.as_deref().filter(|_| in_capsule).unwrap_or(&[]),
            0,
        );
        self.flights
            .lock()
            .unwrap()
            .as_mut()
            .ok_or_else(|| protocol("connection closed"))?
            .insert(
                cid,
                InFlight {
                    out: if in_capsule { None } else { out.map(Arc::new) },
                    data: Vec::new(),
                    done: tx,
                },
            );
        self.wr.lock().await.write_all(&pdu).await?;
        rx.await.map_err(|_| protocol("connection closed"))?
    }

    async fn send_capsule(&self, sqe: Sqe, data: &[u8]) -> Result<Cqe, NvmeError> {
        let (tx, rx) = oneshot::channel();
        self.flights
            .lock()
            .unwrap()
            .as_mut()
            .ok_or_else(|| protocol("connection closed"))?
            .insert(
                sqe.cid,
                InFlight {
                    out: None,
                    data: Vec::new(),
                    done: tx,
                },
            );
        let pdu = Header::Cmd(sqe).to_pdu(self.digests, data, 0);
        self.wr.lock().await.write_all(&pdu).await?;
        Ok(rx.await.map_err(|_| protocol("connection closed"))??.cqe)
    }
}

impl Queue {
    pub async fn property_get(&self, offset: u32, eight: bool) -> Result<u64, NvmeError> {
        let c = self
            .submit(
                FabricsCmd::PropertyGet { eight, offset }.to_sqe(0, [0; 16]),
                None,
                0,
            )
            .await?;
        Ok(u64::from(c.cqe.dw0) | u64::from(c.cqe.dw1) << 32)
    }

    pub async fn property_set(&self, offset: u32, value: u64) -> Result<(), NvmeError> {
        self.submit(
            FabricsCmd::PropertySet {
                eight: false,
                offset,
                value,
            }
            .to_sqe(0, [0; 16]),
            None,
            0,
        )
        .await
        .map(|_| ())
    }

    /// An admin or I/O command with dwords 10 to 15.
    pub fn command(opcode: u8, nsid: u32, cdw: [u32; 6]) -> Sqe {
        Sqe {
            opcode,
            flags: PSDT_SGL,
            cid: 0,
            nsid,
            cdw2: 0,
            cdw3: 0,
            mptr: 0,
            dptr: [0; 16],
            cdw,
        }
    }

    pub async fn identify_controller(&self) -> Result<IdController, NvmeError> {
        let c = self
            .submit(
                Self::command(admin::opcode::IDENTIFY, 0, [1, 0, 0, 0, 0, 0]),
                None,
                4096,
            )
            .await?;
        IdController::parse(&c.data).ok_or_else(|| protocol("short Identify data"))
    }

    pub async fn identify_namespace(&self, nsid: u32) -> Result<IdNamespace, NvmeError> {
        let c = self
            .submit(
                Self::command(admin::opcode::IDENTIFY, nsid, [0; 6]),
                None,
                4096,
            )
            .await?;
        IdNamespace::parse(&c.data).ok_or_else(|| protocol("short Identify data"))
    }

    /// The active namespace IDs (Identify CNS 02h), in order.
    pub async fn active_namespaces(&self) -> Result<Vec<u32>, NvmeError> {
        let c = self
            .submit(
                Self::command(
                    admin::opcode::IDENTIFY,
                    0,
                    [u32::from(admin::cns::ACTIVE_NAMESPACES), 0, 0, 0, 0, 0],
                ),
                None,
                4096,
            )
            .await?;
        Ok(c.data
            .chunks_exact(4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .take_while(|&n| n != 0)
            .collect())
    }

    /// The discovery log's entries (a discovery controller's admin queue).
    pub async fn discovery_log(&self) -> Result<Vec<admin::DiscoveryEntry>, NvmeError> {
        let (c10, c11) = admin::GetLogPage::cdw(admin::log::DISCOVERY, 4096);
        let c = self
            .submit(
                Self::command(admin::opcode::GET_LOG_PAGE, 0, [c10, c11, 0, 0, 0, 0]),
                None,
                4096,
            )
            .await?;
        admin::parse_discovery_log(&c.data)
            .map(|(_, e)| e)
            .ok_or_else(|| protocol("bad discovery log"))
    }

    /// The ANA log page: change count and groups (with their namespaces).
    pub async fn ana_log(&self) -> Result<(u64, Vec<admin::AnaGroup>), NvmeError> {
        let (c10, c11) = admin::GetLogPage::cdw(admin::log::ANA, 4096);
        let c = self
            .submit(
                Self::command(
                    admin::opcode::GET_LOG_PAGE,
                    0xffff_ffff,
                    [c10, c11, 0, 0, 0, 0],
                ),
                None,
                4096,
            )
            .await?;
        admin::parse_ana_log(&c.data).ok_or_else(|| protocol("bad ANA log"))
    }

    /// Set Features Asynchronous Event Configuration: the notices to hear of.
    pub async fn async_event_config(&self, notices: u32) -> Result<(), NvmeError> {
        let fid = u32::from(admin::feature::ASYNC_EVENT_CONFIG);
        self.submit(
            Self::command(admin::opcode::SET_FEATURES, 0, [fid, notices, 0, 0, 0, 0]),
            None,
            0,
        )
        .await?;
        Ok(())
    }

    /// An Asynchronous Event Request: completes with the event (DW0) when one comes.
    pub async fn async_event(&self) -> Result<u32, NvmeError> {
        let c = self
            .submit(
                Self::command(admin::opcode::ASYNC_EVENT_REQUEST, 0, [0; 6]),
                None,
                0,
            )
            .await?;
        Ok(c.cqe.dw0)
    }

    /// Enables the controller (CC.EN) and asks for `io_queues` I/O queues; returns how many
    /// it allocated.
    pub async fn enable(&self, io_queues: u16) -> Result<u16, NvmeError> {
        self.property_set(property::CC, 0x0046_0001).await?;
        if self.property_get(property::CSTS, false).await? & 1 == 0 {
            return Err(protocol("CSTS.RDY stays 0"));
        }
        if io_queues == 0 {
            return Ok(0);
        }
        let n = u32::from(io_queues - 1);
        let c = self
            .submit(
                Self::command(admin::opcode::SET_FEATURES, 0, [7, n | n << 16, 0, 0, 0, 0]),
                None,
                0,
            )
            .await?;
        Ok((c.cqe.dw0 & 0xffff) as u16 + 1)
    }

    pub async fn read(
        &self,
        nsid: u32,
        slba: u64,
        blocks: u32,
        bs: u32,
    ) -> Result<Bytes, NvmeError> {
        let [a, b, c] = rw(slba, blocks, false);
        let r = self
            .submit(
                Self::command(nvm::opcode::READ, nsid, [a, b, c, 0, 0, 0]),
                None,
                blocks * bs,
            )
            .await?;
        Ok(r.data)
    }

    pub async fn write(
        &self,
        nsid: u32,
        slba: u64,
        data: Vec<u8>,
        bs: u32,
        fua: bool,
    ) -> Result<(), NvmeError> {
        let blocks = (data.len() / bs as usize) as u32;
        let [a, b, c] = rw(slba, blocks, fua);
        self.submit(
            Self::command(nvm::opcode::WRITE, nsid, [a, b, c, 0, 0, 0]),
            Some(data),
            0,
        )
        .await
        .map(|_| ())
    }
}

fn rw(slba: u64, blocks: u32, fua: bool) -> [u32; 3] {
    Rw {
        slba,
        blocks,
        fua,
        lr: false,
        deac: false,
    }
    .cdw()
}

async fn read_loop(
    rd: OwnedReadHalf,
    wr: Arc<AsyncMutex<OwnedWriteHalf>>,
    flights: Flights,
    digests: Digests,
    maxh2c: usize,
) {
    let fail_all = |flights: &Flights, e: &dyn Fn() -> NvmeError| {
        for (_, f) in flights.lock().unwrap().take().into_iter().flatten() {
            let _ = f.done.send(Err(e()));
        }
    };
    // Many small PDUs (responses) per read from the socket.
    let mut rd = BufReader::with_capacity(64 << 10, rd);
    let mut head = Vec::with_capacity(128);
    let mut rest = Vec::new();
    loop {
        // The head of each PDU, then its data straight into the command's buffer.
        let r = tcp_queue::read_head(&mut rd, MAX_PDU_DATA, digests, &mut head).await;
        let parsed = match read(r) {
            Ok(()) => tcp::parse_head(&head, digests),
            Err(_) => {
                fail_all(&flights, &|| protocol("connection closed"));
                return;
            }
        };
        if let Ok((
            Header::Data {
                c2h: true,
                cccid,
                offset,
                last,
                success,
                ..
            },
            l,
        )) = parsed
        {
            let taken = flights
                .lock()
                .unwrap()
                .as_mut()
                .and_then(|m| m.get_mut(&cccid))
                .map(|f| std::mem::take(&mut f.data));
            let mut data = taken.unwrap_or_default();
            let end = offset as usize + l.data;
            // In order (as controllers send them), appended without zeroing first.
            let read = if offset as usize == data.len() {
                tcp_queue::read_data_appending(&mut rd, &l, digests, &mut data).await
            } else {
                if data.len() < end {
                    data.resize(end, 0);
                }
                tcp_queue::read_data(&mut rd, &l, digests, &mut data[offset as usize..end]).await
            };
            match read {
                Ok(true) => {}
                Ok(false) | Err(_) => {
                    fail_all(&flights, &|| protocol("C2HData lost or failed its digest"));
                    return;
                }
            }
            let mut flights = flights.lock().unwrap();
            let Some(m) = flights.as_mut() else { continue };
            if let Some(f) = m.get_mut(&cccid) {
                f.data = data;
            }
            // SUCCESS (on the last PDU): the command completed, no response follows.
            if success && last {
                if let Some(f) = m.remove(&cccid) {
                    let cqe = Cqe {
                        cid: cccid,
                        status: Status::SUCCESS,
                        ..Cqe::default()
                    };
                    let _ = f.done.send(Ok(Completion {
                        cqe,
                        data: f.data.into(),
                    }));
                }
            }
            continue;
        }
        // Anything else: the rest of the PDU (a termination request's header) is not needed.
        if let Ok((_, l)) = &parsed {
            rest.resize(l.pad + l.data + l.ddgst, 0);
            if rd.read_exact(&mut rest).await.is_err() {
                fail_all(&flights, &|| protocol("connection closed"));
                return;
            }
        }
        match parsed {
            Ok((Header::Resp(cqe), _)) => {
                let f = flights
                    .lock()
                    .unwrap()
                    .as_mut()
                    .and_then(|m| m.remove(&cqe.cid));
                if let Some(f) = f {
                    let _ = f.done.send(Ok(Completion {
                        cqe,
                        data: f.data.into(),
                    }));
                }
            }
            Ok((
                Header::R2t {
                    cccid,
                    ttag,
                    offset,
                    length,
                },
                _,
            )) => {
                let out = flights
                    .lock()
                    .unwrap()
                    .as_mut()
                    .and_then(|m| m.get_mut(&cccid))
                    .and_then(|f| f.out.clone());
                let Some(out) = out else { continue };
                let (offset, length) = (offset as usize, length as usize);
                let mut at = offset;
                let mut w = wr.lock().await;
                while at < offset + length {
                    let n = (offset + length - at).min(maxh2c);
                    let h = Header::Data {
                        c2h: false,
                        cccid,
                        ttag,
                        offset: at as u32,
                        length: n as u32,
                        last: at + n == offset + length,
                        success: false,
                    };
                    // Header, data (not copied) and digest in one vectored write.
                    let data = &out[at..at + n];
                    let (head, trailer) = h.encode(digests, data, 0);
                    let trailer = trailer.as_ref().map_or(&[][..], |t| &t[..]);
                    let mut pdu = Buf::chain(Buf::chain(&head[..], data), trailer);
                    if w.write_all_buf(&mut pdu).await.is_err() {
                        break;
                    }
                    at += n;
                }
            }
            Ok((Header::TermReq { fes, fei, .. }, _)) => {
                fail_all(&flights, &|| NvmeError::Terminated { fes, fei });
                return;
            }
            Ok(_) | Err(_) => {
                fail_all(&flights, &|| protocol("unexpected PDU"));
                return;
            }
        }
    }
}
