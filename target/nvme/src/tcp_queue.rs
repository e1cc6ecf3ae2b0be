//! NVMe/TCP: one TCP connection is one queue of one controller ([`serve`]).
//!
//! The connection starts with ICReq/ICResp (digests as the host asks), then its first command
//! must be Connect, which creates the controller (admin queue) or joins it (I/O queue). Each
//! command then runs as a task of its own while the reader goes on: data a command brings
//! comes in its capsule, or the reader asks for it with one R2T and gathers the H2CData PDUs;
//! either way the reader takes a PDU's head first and reads its data straight into the
//! command's pool buffer before the command runs; data for the host leaves as one
//! C2HData PDU, then the response capsule. They leave through the TCP transmit path iSCSI/TCP
//! uses too ([`Outbox`]): written by the task that answers, the answers to the PDUs one read
//! brought in one vectored write, the data straight from the command's buffer — or, for
//! large reads of a namespace whose data lives in a file, from the page cache with
//! `sendfile(2)` (without a data digest).
//!
//! Bounds: a command beyond the queue's entries (Connect's SQSIZE + 1, each freed before the
//! host can see its response) ends the connection, the outbox holds a few PDUs per entry,
//! and a PDU is never larger than the in-capsule size or MAXH2CDATA allow. A header that breaks the protocol
//! ends the connection with a C2HTermReq naming the field; closing the admin queue (or a
//! keep alive timeout) closes the controller and so every queue of it.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use bytes::Bytes;
use rtgt_backstore::{run_inline, IoBuf};
use rtgt_tcp_channel::{Framer, Outbox, Socket, TxData, Wire, HEAD_MAX};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::sync::Semaphore;

use crate::ctrl::{Controller, Payload, QueueStats, Reply};
pub use crate::queue::Scope;
use crate::queue::{ConnectCmd, SqHead, Transport};
use crate::sqe::{sc, sct, Cqe, Sgl, Sqe, Status};
use crate::subsys::{Targets, ADMIN_IN_CAPSULE};
use crate::tcp::{self, fes, CommonHeader, Digests, Header, PduError, CH_LEN};

/// Most data in one H2CData PDU (MAXH2CDATA).
pub const MAX_H2C_DATA: u32 = 128 << 10;

/// NVMe/TCP PDUs are framed when queued: nothing in them depends on their place on the
/// wire.
struct Frames;

impl Framer for Frames {
    type Pdu = Wire;
    type Seq = ();

    fn data_len(pdu: &Wire) -> usize {
        pdu.data_len()
    }

    fn frame(&self, _: &mut (), pdus: &mut Vec<Wire>, wires: &mut VecDeque<Wire>) {
        wires.extend(pdus.drain(..));
    }
}

/// A command waiting for its data (R2T sent).
struct Gathering {
    sqe: Sqe,
    buf: IoBuf,
    received: usize,
    permit: tokio::sync::OwnedSemaphorePermit,
}

/// The state one queue's commands share.
struct Queue {
    targets: Arc<Targets>,
    ctrl: Arc<Controller>,
    qid: u16,
    digests: Digests,
    out: Arc<Outbox<Frames>>,
    sq: SqHead,
    /// The host disabled SQ flow control (Connect CATTR bit 2): a read that succeeds ends
    /// with a C2HData PDU whose SUCCESS flag stands for its response capsule.
    sqhd_disabled: bool,
    /// The queue's counters (once attached).
    stats: Arc<QueueStats>,
}

impl Queue {
    /// Sends a command's data for the host (if any) and its response.
    async fn respond(&self, sqe: &Sqe, mut reply: Reply) {
        let payload = reply.take_payload(sqe.sgl().data_len().unwrap_or(0) as usize);
        let len = payload.len();
        if len > 0 && reply.status.is_success() {
            // No response capsule needed: nothing in it the host would not know.
            let success = self.sqhd_disabled && reply.dw0 == 0 && reply.dw1 == 0;
            let h = Header::Data {
                c2h: true,
                cccid: sqe.cid,
                ttag: 0,
                offset: 0,
                length: len as u32,
                last: true,
                success,
            };
            let data = match payload {
                Payload::None => TxData::Empty,
                Payload::Vec(v, n) => TxData::Bytes(Bytes::from(v).slice(..n)),
                Payload::Buf(b, n) => TxData::Owned(b, n),
                Payload::File(f) => TxData::File {
                    range: Arc::new(f),
                    start: 0,
                    len,
                },
            };
            self.send(h, data).await;
            if success {
                return;
            }
        }
        self.complete(sqe.cid, reply.status, reply.dw0, reply.dw1)
            .await;
    }

    async fn complete(&self, cid: u16, status: Status, dw0: u32, dw1: u32) {
        let cqe = self.sq.cqe(self.qid, cid, status, dw0, dw1);
        self.send_header(Header::Resp(cqe)).await;
    }

    /// Sends a PDU without data.
    async fn send_header(&self, h: Header) {
        self.send(h, TxData::Empty).await;
    }

    /// Sends a PDU with `data`, which is in a file only on a queue without data digests
    /// ([`Queue::file_ranges`]).
    async fn send(&self, h: Header, data: TxData) {
        let mut head = [0u8; HEAD_MAX];
        let n = h.encode_head(self.digests, data.len(), 0, &mut head);
        let ddgst = h.data_digest(self.digests, data.as_slice());
        let tail = ddgst.as_ref().map_or(&[][..], |d| &d[..]);
        let _ = self.out.send(Wire::new(&head[..n], data, tail)).await;
    }

    /// Whether reads may answer with a range of their namespace's file: only where no data
    /// digest has to cover the data.
    fn file_ranges(&self) -> bool {
        !self.digests.data
    }

    /// Completes command `cid` with a generic error.
    async fn fail(&self, cid: u16, code: u8) {
        self.complete(cid, Status::error(sct::GENERIC, code), 0, 0)
            .await;
    }

    fn fetched(&self) {
        self.sq.fetched();
    }
}

/// Why the connection ends.
#[derive(Debug)]
enum End {
    /// The peer closed it, or it failed.
    Closed,
    /// A termination request is owed: status, field, the offending header.
    Fatal(u16, u32, Vec<u8>),
}

impl From<std::io::Error> for End {
    fn from(_: std::io::Error) -> End {
        End::Closed
    }
}

/// Reads the head of a PDU into `b` (reused from PDU to PDU): its common header, then
/// (checked by [`tcp::pdu_len`] against `max_data`) up to its data ([`tcp::head_len`]); the
/// data is then read by [`read_data`] to where it belongs. The inner error is a common header
/// that breaks the protocol (`b` then holds that header).
pub async fn read_head<R: AsyncRead + Unpin>(
    rd: &mut R,
    max_data: usize,
    digests: Digests,
    b: &mut Vec<u8>,
) -> std::io::Result<Result<(), PduError>> {
    b.clear();
    b.resize(CH_LEN, 0);
    rd.read_exact(b).await?;
    let c = CommonHeader::parse(b).expect("a common header's length");
    let len = match tcp::pdu_len(&c, max_data) {
        Ok(n) => n,
        Err(e) => return Ok(Err(e)),
    };
    b.resize(tcp::head_len(&c, digests).min(len), 0);
    rd.read_exact(&mut b[CH_LEN..]).await?;
    Ok(Ok(()))
}

/// Reads the rest of a PDU whose head said `l`: the padding, the data into `dst` (of
/// `l.data` bytes) and its digest. Returns whether the data matches the digest.
pub async fn read_data<R: AsyncRead + Unpin>(
    rd: &mut R,
    l: &tcp::Layout,
    digests: Digests,
    dst: &mut [u8],
) -> std::io::Result<bool> {
    let mut pad = [0u8; 256];
    rd.read_exact(&mut pad[..l.pad]).await?;
    rd.read_exact(dst).await?;
    let mut ddgst = [0u8; tcp::DIGEST_LEN];
    rd.read_exact(&mut ddgst[..l.ddgst]).await?;
    Ok(tcp::check_data(dst, &ddgst[..l.ddgst], digests))
}

/// As [`read_data`], the data appended to `dst` (read into its spare capacity, not zeroed
/// first): a host gathering a read's C2HData PDUs in order.
pub async fn read_data_appending<R: AsyncRead + Unpin>(
    rd: &mut R,
    l: &tcp::Layout,
    digests: Digests,
    dst: &mut Vec<u8>,
) -> std::io::Result<bool> {
    let mut pad = [0u8; 256];
    rd.read_exact(&mut pad[..l.pad]).await?;
    let start = dst.len();
    dst.reserve_exact(l.data);
    let got = rd.take(l.data as u64).read_to_end(dst).await?;
    if got < l.data {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    let mut ddgst = [0u8; tcp::DIGEST_LEN];
    rd.read_exact(&mut ddgst[..l.ddgst]).await?;
    Ok(tcp::check_data(&dst[start..], &ddgst[..l.ddgst], digests))
}

/// Reads one whole PDU into `b` (reused from PDU to PDU), as [`read_head`] checks it.
pub async fn read_pdu<R: AsyncRead + Unpin>(
    rd: &mut R,
    max_data: usize,
    b: &mut Vec<u8>,
) -> std::io::Result<Result<(), PduError>> {
    if let Err(e) = read_head(rd, max_data, Digests::default(), b).await? {
        return Ok(Err(e));
    }
    let have = b.len();
    let plen = CommonHeader::parse(b).expect("a common header").plen as usize;
    b.resize(plen, 0);
    rd.read_exact(&mut b[have..]).await?;
    Ok(Ok(()))
}

/// A PDU read by [`read_head`] or [`read_pdu`] as the connection's end, if it is one: the
/// connection closed, or a termination request owed for the common header in `b`.
fn ended(r: std::io::Result<Result<(), PduError>>, b: &[u8]) -> Result<(), End> {
    match r {
        Ok(Ok(())) => Ok(()),
        Ok(Err(PduError::Fatal { fes, fei })) => Err(End::Fatal(fes, fei, b[..CH_LEN].to_vec())),
        Ok(Err(PduError::DataDigest(_))) | Err(_) => Err(End::Closed),
    }
}

/// Serves one NVMe/TCP connection until it ends.
pub async fn serve(targets: Arc<Targets>, stream: TcpStream, scope: Scope) {
    let addrs = stream.peer_addr().ok().zip(stream.local_addr().ok());
    let _ = stream.set_nodelay(true);
    let (rd, wr) = stream.into_split();
    serve_stream(targets, rd, wr, addrs, scope).await;
}

/// Serves one NVMe/TCP connection on the two halves of a stream socket (TCP, or a test's
/// Unix socket pair); `addrs` are its peer and local addresses when it has them.
pub async fn serve_stream<R, W>(
    targets: Arc<Targets>,
    rd: R,
    mut wr: W,
    addrs: Option<(std::net::SocketAddr, std::net::SocketAddr)>,
    scope: Scope,
) where
    R: AsyncRead + Send + Unpin + 'static,
    W: AsyncWrite + Socket + Unpin,
{
    let mut rd = BufReader::with_capacity(64 << 10, rd);
    // Until Connect: an admin queue's capsules.
    let max_data = ADMIN_IN_CAPSULE.max(MAX_H2C_DATA) as usize;

    // Connection initialization.
    let mut ic = Vec::new();
    let r = read_pdu(&mut rd, 0, &mut ic).await;
    match ended(r, &ic) {
        Ok(()) => {}
        Err(End::Fatal(fes, fei, h)) => {
            let _ = terminate(&mut wr, fes, fei, &h).await;
            return;
        }
        Err(End::Closed) => return,
    };
    let digests = match tcp::parse(&ic, Digests::default()) {
        Ok((
            Header::IcReq {
                pfv: 0,
                hpda,
                digests,
                ..
            },
            _,
        )) if hpda <= 31 => digests,
        Ok((Header::IcReq { pfv: 0, .. }, _)) => {
            let _ = terminate(&mut wr, fes::UNSUPPORTED_PARAMETER, 10, &ic[..CH_LEN]).await;
            return;
        }
        Ok((Header::IcReq { .. }, _)) => {
            let _ = terminate(&mut wr, fes::UNSUPPORTED_PARAMETER, 8, &ic[..CH_LEN]).await;
            return;
        }
        Ok(_) => {
            let _ = terminate(&mut wr, fes::PDU_SEQUENCE_ERROR, 0, &ic[..CH_LEN]).await;
            return;
        }
        Err(PduError::Fatal { fes, fei }) => {
            let _ = terminate(&mut wr, fes, fei, &ic[..CH_LEN]).await;
            return;
        }
        Err(PduError::DataDigest(_)) => return,
    };
    let resp = Header::IcResp {
        pfv: 0,
        cpda: 0,
        digests,
        maxh2cdata: MAX_H2C_DATA,
    }
    .to_pdu(digests, &[], 0);
    if wr.write_all(&resp).await.is_err() {
        return;
    }

    // The first command: Connect.
    let Some(c) = connect(&targets, &mut rd, &mut wr, digests, max_data, scope).await else {
        return;
    };
    // Each entry's data and response, R2Ts, and a termination request.
    let slots = usize::from(c.size) * 3 + 2;
    let out = Arc::new(Outbox::new(Frames, wr, (), slots));
    let attached = c.ctrl.attach(c.qid, c.size, addrs, Transport::Tcp);
    let ctrl = c.ctrl.clone();
    let queue = Arc::new(Queue {
        targets: targets.clone(),
        ctrl: c.ctrl,
        qid: c.qid,
        digests,
        out: out.clone(),
        sq: SqHead::new(c.size),
        sqhd_disabled: c.sqhd_disabled,
        stats: attached.stats(),
    });
    let permits = Arc::new(Semaphore::new(usize::from(c.size)));
    let peer = addrs.map(|a| a.0);
    tracing::info!(peer = ?peer, cntlid = ctrl.cntlid, qid = queue.qid,
        host = %ctrl.host_nqn, "NVMe/TCP queue connected");
    let writer = tokio::spawn(out.clone().run_writer());
    let end = read_loop(&queue, &mut rd, &permits).await;
    queue.out.end_batch();
    match end {
        End::Fatal(fes, fei, h) => {
            let t = Header::TermReq {
                c2h: true,
                fes,
                fei,
            };
            let h = &h[..h.len().min(128)];
            queue
                .send(t, TxData::Bytes(Bytes::copy_from_slice(h)))
                .await;
        }
        End::Closed => {
            // The commands under way still answer, unless the controller or the socket
            // goes first.
            tokio::select! {
                _ = permits.acquire_many(u32::from(c.size)) => {}
                _ = ctrl.closed() => {}
                _ = out.closed() => {}
            }
        }
    }
    out.close();
    drop(attached);
    drop(queue);
    let _ = writer.await;
    tracing::info!(peer = ?peer, cntlid = ctrl.cntlid, "NVMe/TCP queue closed");
}

/// Sends a termination request on a connection with no writer yet, and ends it.
async fn terminate<W: AsyncWrite + Unpin>(
    wr: &mut W,
    fes: u16,
    fei: u32,
    offending: &[u8],
) -> std::io::Result<()> {
    let t = Header::TermReq {
        c2h: true,
        fes,
        fei,
    }
    .to_pdu(
        Digests::default(),
        &offending[..offending.len().min(128)],
        0,
    );
    wr.write_all(&t).await?;
    wr.shutdown().await
}

/// What a Connect made of a connection.
struct Connected {
    ctrl: Arc<Controller>,
    qid: u16,
    /// Entries of the queue.
    size: u16,
    sqhd_disabled: bool,
}

/// Takes the first capsule, which must be a Connect with its data in the capsule; answers
/// it. Returns the queue, or `None` when the connection is to end.
async fn connect<R: AsyncRead + Unpin, W: AsyncWrite + Unpin>(
    targets: &Arc<Targets>,
    rd: &mut R,
    wr: &mut W,
    digests: Digests,
    max_data: usize,
    scope: Scope,
) -> Option<Connected> {
    let mut b = Vec::new();
    loop {
        let r = read_pdu(rd, max_data, &mut b).await;
        match ended(r, &b) {
            Ok(()) => {}
            Err(End::Fatal(fes, fei, h)) => {
                let _ = terminate(wr, fes, fei, &h).await;
                return None;
            }
            Err(End::Closed) => return None,
        };
        let (sqe, data) = match tcp::parse(&b, digests) {
            Ok((Header::Cmd(sqe), data)) => (sqe, data),
            Ok((Header::TermReq { .. }, _)) => return None,
            Ok(_) => {
                let _ = terminate(wr, fes::PDU_SEQUENCE_ERROR, 0, &b[..CH_LEN]).await;
                return None;
            }
            Err(PduError::Fatal { fes, fei }) => {
                let _ = terminate(wr, fes, fei, &b[..b.len().min(128)]).await;
                return None;
            }
            Err(PduError::DataDigest(h)) => {
                if let Header::Cmd(sqe) = *h {
                    let status = Status::error(sct::GENERIC, sc::DATA_TRANSFER_ERROR);
                    let r = response(digests, sqe.cid, status, 0);
                    wr.write_all(&r).await.ok()?;
                }
                continue;
            }
        };
        let reply = |status: Status, dw0: u32| response(digests, sqe.cid, status, dw0);
        let cmd = match ConnectCmd::parse(&sqe) {
            Ok(c) => c,
            Err(status) => {
                wr.write_all(&reply(status, 0)).await.ok()?;
                continue;
            }
        };
        // Connect's data comes in the capsule.
        if !matches!(sqe.sgl(), Sgl::DataBlock { offset: true, len, .. } if len as usize == data.len())
        {
            let r = reply(Status::error(sct::GENERIC, sc::SGL_INVALID_DATA_LENGTH), 0);
            wr.write_all(&r).await.ok()?;
            continue;
        }
        match cmd.admit(targets, scope, data, Transport::Tcp) {
            Ok(ctrl) => {
                let r = reply(Status::SUCCESS, u32::from(ctrl.cntlid));
                wr.write_all(&r).await.ok()?;
                return Some(Connected {
                    ctrl,
                    qid: cmd.qid,
                    size: cmd.sqsize + 1,
                    sqhd_disabled: cmd.sqflow_disabled(),
                });
            }
            Err(refused) => {
                let r = reply(refused.status, refused.dw0);
                wr.write_all(&r).await.ok()?;
            }
        }
    }
}

/// A response capsule on a queue not connected yet (queue 0, head 0).
fn response(digests: Digests, cid: u16, status: Status, dw0: u32) -> Vec<u8> {
    Header::Resp(Cqe {
        dw0,
        cid,
        status,
        ..Cqe::default()
    })
    .to_pdu(digests, &[], 0)
}

async fn read_loop<R: AsyncRead + Unpin>(
    queue: &Arc<Queue>,
    rd: &mut BufReader<R>,
    permits: &Arc<Semaphore>,
) -> End {
    let mut gathering: HashMap<u16, Gathering> = HashMap::new();
    let mut next_ttag: u16 = 0;
    // What the controller told the host (IOCCSZ), or the transport's for the admin queue.
    let in_capsule = match queue.qid {
        0 => ADMIN_IN_CAPSULE,
        _ => queue.ctrl.in_capsule(),
    };
    let max_data = in_capsule.max(MAX_H2C_DATA) as usize;
    let in_capsule = in_capsule as usize;
    let digests = queue.digests;
    let mut b = Vec::with_capacity(256);
    // Data read where it has no place of its own (a termination request's, data the command
    // does not take).
    let mut scratch = Vec::new();
    loop {
        batch(rd, &queue.out, HEAD_MOST);
        tokio::select! {
            r = read_head(rd, max_data, digests, &mut b) => if let Err(e) = ended(r, &b) {
                return e;
            },
            _ = queue.ctrl.closed() => return End::Closed,
        }
        let (header, l) = match tcp::parse_head(&b, digests) {
            Ok(x) => x,
            Err(PduError::Fatal { fes, fei }) => {
                return End::Fatal(fes, fei, b[..b.len().min(128)].to_vec())
            }
            Err(PduError::DataDigest(_)) => return End::Closed,
        };
        match header {
            Header::Cmd(sqe) => {
                // An entry is freed before the host can see its response, so a host that
                // keeps to the queue's size always finds one.
                let Ok(permit) = permits.clone().try_acquire_owned() else {
                    return End::Fatal(fes::PDU_SEQUENCE_ERROR, 0, b[..CH_LEN].to_vec());
                };
                queue.fetched();
                let out_len = Controller::data_out_len(&sqe);
                // In-capsule data goes straight into the command's pool buffer.
                let in_capsule_ok = matches!(sqe.sgl(), Sgl::DataBlock { offset: true, addr: 0, len }
                    if len as usize == l.data && l.data <= in_capsule);
                if l.data > 0 && (out_len == 0 || !in_capsule_ok) {
                    scratch.resize(l.data, 0);
                    batch(rd, &queue.out, l.rest());
                    match read_data(rd, &l, digests, &mut scratch).await {
                        Ok(true) => {}
                        Ok(false) => {
                            queue.fail(sqe.cid, sc::DATA_TRANSFER_ERROR).await;
                            continue;
                        }
                        Err(_) => return End::Closed,
                    }
                }
                if out_len == 0 {
                    spawn(queue, sqe, None, permit);
                    continue;
                }
                match sqe.sgl() {
                    Sgl::DataBlock { offset: true, .. } => {
                        if !in_capsule_ok {
                            queue.fail(sqe.cid, sc::SGL_INVALID_DATA_LENGTH).await;
                            continue;
                        }
                        let mut buf = queue.targets.pool.get(l.data).await;
                        batch(rd, &queue.out, l.rest());
                        match read_data(rd, &l, digests, buf.as_mut_slice()).await {
                            Ok(true) => spawn(queue, sqe, Some(buf), permit),
                            Ok(false) => queue.fail(sqe.cid, sc::DATA_TRANSFER_ERROR).await,
                            Err(_) => return End::Closed,
                        }
                    }
                    Sgl::Transport { len } => {
                        let max = queue.targets.limits.max_transfer();
                        if l.data > 0 || len as usize > max {
                            queue.fail(sqe.cid, sc::INVALID_FIELD).await;
                            continue;
                        }
                        let buf = queue.targets.pool.get(len as usize).await;
                        while gathering.contains_key(&next_ttag) {
                            next_ttag = next_ttag.wrapping_add(1);
                        }
                        let ttag = next_ttag;
                        next_ttag = next_ttag.wrapping_add(1);
                        let r2t = Header::R2t {
                            cccid: sqe.cid,
                            ttag,
                            offset: 0,
                            length: len,
                        };
                        gathering.insert(
                            ttag,
                            Gathering {
                                sqe,
                                buf,
                                received: 0,
                                permit,
                            },
                        );
                        queue.send_header(r2t).await;
                    }
                    _ => {
                        queue.fail(sqe.cid, sc::SGL_INVALID_TYPE).await;
                    }
                }
            }
            Header::Data {
                c2h: false,
                cccid,
                ttag,
                offset,
                length,
                last,
                ..
            } => {
                let Some(g) = gathering.get_mut(&ttag) else {
                    return End::Fatal(fes::INVALID_PDU_HEADER, 10, b[..24].to_vec());
                };
                let (offset, length) = (offset as usize, length as usize);
                if g.sqe.cid != cccid {
                    return End::Fatal(fes::INVALID_PDU_HEADER, 8, b[..24].to_vec());
                }
                if offset != g.received || offset + length > g.buf.len() {
                    return End::Fatal(fes::DATA_OUT_OF_RANGE, 12, b[..24].to_vec());
                }
                if length > MAX_H2C_DATA as usize {
                    return End::Fatal(fes::DATA_LIMIT_EXCEEDED, 16, b[..24].to_vec());
                }
                // Straight into the command's buffer.
                let dst = &mut g.buf.as_mut_slice()[offset..offset + length];
                batch(rd, &queue.out, l.rest());
                match read_data(rd, &l, digests, dst).await {
                    Ok(true) => {}
                    Ok(false) => {
                        let g = gathering.remove(&ttag).expect("present");
                        queue.fail(g.sqe.cid, sc::DATA_TRANSFER_ERROR).await;
                        continue;
                    }
                    Err(_) => return End::Closed,
                }
                g.received += length;
                if g.received == g.buf.len() {
                    let g = gathering.remove(&ttag).expect("present");
                    spawn(queue, g.sqe, Some(g.buf), g.permit);
                } else if last {
                    return End::Fatal(fes::INVALID_PDU_HEADER, 1, b[..24].to_vec());
                }
            }
            Header::TermReq {
                c2h: false,
                fes,
                fei,
            } => {
                tracing::warn!(fes, fei, "the host terminated the NVMe/TCP connection");
                return End::Closed;
            }
            _ => return End::Fatal(fes::PDU_SEQUENCE_ERROR, 0, b[..CH_LEN].to_vec()),
        }
    }
}

/// Most bytes of a PDU's head after Connect (a command capsule's, with its digest).
const HEAD_MOST: usize = 128;

/// The answers to what the reader handles go out together while the next `need` bytes are
/// already read; before the reader waits for the socket, whatever is queued goes out (an R2T
/// among it, which the host waits for).
fn batch<R: AsyncRead>(rd: &BufReader<R>, out: &Outbox<Frames>, need: usize) {
    if rd.buffer().len() < need {
        out.end_batch();
    } else {
        out.begin_batch();
    }
}

/// Runs a command and answers it, in the receive loop as far as it goes without waiting and
/// in a task of its own from there ([`run_inline`]); the entry is free once answered.
fn spawn(
    queue: &Arc<Queue>,
    sqe: Sqe,
    data: Option<IoBuf>,
    permit: tokio::sync::OwnedSemaphorePermit,
) {
    let q = queue.clone();
    run_inline(async move {
        let reply = q
            .ctrl
            .execute_on(&q.stats, q.qid, &sqe, data, q.file_ranges())
            .await;
        q.respond(&sqe, reply).await;
        drop(permit);
    });
}
