//! The TCP transmit path shared by iSCSI/TCP and NVMe/TCP.
//!
//! An [`Outbox`] is a connection's bounded queue of PDUs on their way to the socket and the
//! transmit state of whichever task currently writes. There is no dedicated sender in the
//! common case: the task that queues a PDU writes it right away with a non-blocking vectored
//! write — usually the connection's reader, which runs most commands to completion itself and
//! sends the answers to one batch of requests in one call ([`Outbox::begin_batch`]) — so an
//! answer needs no hand-off to another task or thread. Only while the socket is full does the
//! connection's writer task ([`Outbox::run_writer`]) wait for room and write.
//!
//! Whoever wins `writing` owns the transmit state; the others set `dirty` and leave, and the
//! owner looks at `dirty` again after giving up the role, so no queued PDU is left behind.
//!
//! A fabric says how its PDUs become bytes with a [`Framer`]: PDUs leave the queue in order
//! and are framed then, so a fabric can stamp sequence numbers in wire order (iSCSI's
//! StatSN). Data goes out from where it is ([`TxData`]): memory, a command's pool buffer, or
//! a range of a backstore's file, sent with `sendfile(2)` straight from the page cache.
//!
//! Bounds: a PDU takes one of the queue's slots from being queued until it is written in
//! full; a sender finding none waits, which is the fabric's back-pressure.

use std::collections::VecDeque;
use std::future::Future;
use std::io::{self, IoSlice};
use std::ops::Range;
use std::os::fd::{AsRawFd, RawFd};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use rtgt_backstore::{FileSpan, IoBuf, Latch};
use tokio::io::Interest;
use tokio::sync::{Notify, Semaphore};

/// While the reader handles a batch of requests, answers collect until this many are
/// queued (or [`BATCH_BYTES`] of data), then go out together. Sending part of a large batch
/// early lets the initiator work on those answers while the rest are prepared.
pub const BATCH_FLUSH: usize = 16;
/// Data bytes that end a batch early (see [`BATCH_FLUSH`]).
pub const BATCH_BYTES: usize = 2 << 20;
/// Most pieces (headers, data, trailers) handed to one vectored write.
const MAX_IOV: usize = 128;
/// Longest head of a [`Wire`]: an iSCSI BHS with its digest, an NVMe/TCP header with its
/// digest and padding.
pub const HEAD_MAX: usize = 64;
/// Longest tail of a [`Wire`]: padding and a data digest.
pub const TAIL_MAX: usize = 8;

/// The data of a PDU to send.
#[derive(Debug, Default)]
pub enum TxData {
    #[default]
    Empty,
    Bytes(Bytes),
    /// A range of a command's data buffer, shared by the PDUs that carry it.
    Buf(Arc<IoBuf>, Range<usize>),
    /// The first `n` bytes of a buffer one PDU carries whole (back to its pool once
    /// written).
    Owned(IoBuf, usize),
    /// `len` bytes of a file range, `start` bytes into it, sent with `sendfile(2)`; the
    /// range is released when the last PDU holding it has been written. No digest can
    /// cover it (the bytes are never in user space).
    File {
        range: Arc<dyn FileSpan>,
        start: u64,
        len: usize,
    },
}

impl TxData {
    /// The bytes in memory: none for [`TxData::File`].
    pub fn as_slice(&self) -> &[u8] {
        match self {
            TxData::Empty | TxData::File { .. } => &[],
            TxData::Bytes(b) => b,
            TxData::Buf(b, r) => &b.as_slice()[r.clone()],
            TxData::Owned(b, n) => &b.as_slice()[..*n],
        }
    }

    pub fn len(&self) -> usize {
        match self {
            TxData::File { len, .. } => *len,
            _ => self.as_slice().len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A PDU as it goes on the wire: head (header, header digest, padding), data, tail
/// (padding, data digest).
#[derive(Debug)]
pub struct Wire {
    head: [u8; HEAD_MAX],
    head_len: u8,
    data: TxData,
    tail: [u8; TAIL_MAX],
    tail_len: u8,
}

impl Wire {
    /// `head` holds at most [`HEAD_MAX`] bytes and `tail` at most [`TAIL_MAX`]: the framing
    /// of the fabrics, never the peer's choice.
    pub fn new(head: &[u8], data: TxData, tail: &[u8]) -> Wire {
        assert!(head.len() <= HEAD_MAX && tail.len() <= TAIL_MAX);
        let mut w = Wire {
            head: [0; HEAD_MAX],
            head_len: head.len() as u8,
            data,
            tail: [0; TAIL_MAX],
            tail_len: tail.len() as u8,
        };
        w.head[..head.len()].copy_from_slice(head);
        w.tail[..tail.len()].copy_from_slice(tail);
        w
    }

    pub fn len(&self) -> usize {
        usize::from(self.head_len) + self.data.len() + usize::from(self.tail_len)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The data's length.
    pub fn data_len(&self) -> usize {
        self.data.len()
    }

    /// Adds the unwritten pieces (after `skip` bytes) to `iov` up to the first piece that
    /// lives in a file.
    fn slices<'a>(&'a self, mut skip: usize, iov: &mut [IoSlice<'a>], n: &mut usize) -> Fill {
        let file = match &self.data {
            TxData::File { range, start, len } => Some((range, *start, *len)),
            _ => None,
        };
        for (i, part) in [
            &self.head[..usize::from(self.head_len)],
            self.data.as_slice(),
            &self.tail[..usize::from(self.tail_len)],
        ]
        .into_iter()
        .enumerate()
        {
            if let (1, Some((range, start, len))) = (i, file) {
                if skip >= len {
                    skip -= len;
                    continue;
                }
                if *n > 0 {
                    return Fill::FileNext;
                }
                return Fill::File {
                    fd: range.fd(),
                    offset: range.offset() + start + skip as u64,
                    len: len - skip,
                };
            }
            if skip >= part.len() {
                skip -= part.len();
                continue;
            }
            if *n == iov.len() {
                return Fill::Full;
            }
            iov[*n] = IoSlice::new(&part[skip..]);
            *n += 1;
            skip = 0;
        }
        Fill::More
    }
}

/// How far [`Wire::slices`] got.
enum Fill {
    /// The wire is in `iov`; more may follow.
    More,
    /// `iov` is full.
    Full,
    /// `iov` holds what precedes data in a file: write it (with more to come), then the file.
    FileNext,
    /// Nothing is in `iov`; the next bytes to send are `len` bytes of `fd` at `offset`.
    File { fd: RawFd, offset: u64, len: usize },
}

/// How a fabric's PDUs become [`Wire`]s.
pub trait Framer: Send + Sync + 'static {
    /// What senders queue.
    type Pdu: Send;
    /// What framing carries from one PDU to the next (iSCSI's StatSN).
    type Seq: Send;

    /// Bytes of data `pdu` carries (for the batch limit).
    fn data_len(pdu: &Self::Pdu) -> usize;

    /// Frames the PDUs taken from the queue, in queue order, onto `wires`. Called by the one
    /// task that writes, so sequence numbers assigned here increase in wire order.
    fn frame(&self, seq: &mut Self::Seq, pdus: &mut Vec<Self::Pdu>, wires: &mut VecDeque<Wire>);

    /// `pdus` PDUs were written in full.
    fn sent(&self, pdus: usize) {
        let _ = pdus;
    }

    /// Writing failed; the outbox closes.
    fn failed(&self, e: &io::Error) {
        tracing::debug!(error = %e, "send failed");
    }
}

/// A connected stream socket the outbox writes to without blocking.
pub trait Socket: Send + Sync + 'static {
    fn fd(&self) -> RawFd;
    /// Runs `write` — a non-blocking write on [`Socket::fd`] — when the socket may have
    /// room; `WouldBlock` from it clears the socket's readiness.
    fn try_write(&self, write: &mut dyn FnMut() -> io::Result<usize>) -> io::Result<usize>;
    /// Waits until the socket may have room.
    fn writable(&self) -> Pin<Box<dyn Future<Output = io::Result<()>> + Send + '_>>;
}

macro_rules! socket {
    ($half:ty, $stream:ty) => {
        impl Socket for $half {
            fn fd(&self) -> RawFd {
                AsRef::<$stream>::as_ref(self).as_raw_fd()
            }

            fn try_write(&self, write: &mut dyn FnMut() -> io::Result<usize>) -> io::Result<usize> {
                AsRef::<$stream>::as_ref(self).try_io(Interest::WRITABLE, write)
            }

            fn writable(&self) -> Pin<Box<dyn Future<Output = io::Result<()>> + Send + '_>> {
                Box::pin(AsRef::<$stream>::as_ref(self).writable())
            }
        }
    };
}

socket!(tokio::net::tcp::OwnedWriteHalf, tokio::net::TcpStream);
socket!(tokio::net::unix::OwnedWriteHalf, tokio::net::UnixStream);

/// The outbox is closed: nothing more is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Closed;

/// A connection's PDUs on their way to the socket (see the module's documentation).
pub struct Outbox<F: Framer> {
    framer: F,
    queue: Mutex<VecDeque<F::Pdu>>,
    /// One permit per PDU that may be queued or in transmission.
    slots: Semaphore,
    tx: Mutex<TxState<F>>,
    sock: Box<dyn Socket>,
    writing: AtomicBool,
    /// PDUs were queued since the writing task last looked.
    dirty: AtomicBool,
    /// Data bytes queued since the last flush.
    unflushed: AtomicUsize,
    /// The reader is handling a batch and flushes when it is done.
    batching: AtomicBool,
    /// The socket is full; the writer task writes once it has room.
    blocked: AtomicBool,
    /// Asks the writer task to wait for room in the socket.
    want_room: Notify,
    closing: Latch,
}

struct TxState<F: Framer> {
    seq: F::Seq,
    /// PDUs taken from the queue and not yet fully written.
    wires: VecDeque<Wire>,
    /// Bytes of the first wire already written.
    sent: usize,
    /// Scratch space for moving PDUs out of the queue.
    taken: Vec<F::Pdu>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl<F: Framer> Outbox<F> {
    /// An outbox writing to `sock`, framing with `framer` from `seq` on, holding at most
    /// `slots` PDUs queued or in transmission.
    pub fn new(framer: F, sock: impl Socket, seq: F::Seq, slots: usize) -> Outbox<F> {
        Outbox {
            framer,
            // Grows up to `slots` only when that many are queued at once.
            queue: Mutex::new(VecDeque::with_capacity(slots.min(256))),
            slots: Semaphore::new(slots),
            tx: Mutex::new(TxState {
                seq,
                wires: VecDeque::new(),
                sent: 0,
                taken: Vec::new(),
            }),
            sock: Box::new(sock),
            writing: AtomicBool::new(false),
            dirty: AtomicBool::new(false),
            unflushed: AtomicUsize::new(0),
            batching: AtomicBool::new(false),
            blocked: AtomicBool::new(false),
            want_room: Notify::new(),
            closing: Latch::default(),
        }
    }

    pub fn framer(&self) -> &F {
        &self.framer
    }

    /// Queues `pdu` and writes unless the reader's batch will; waits for a slot when all are
    /// taken.
    pub async fn send(&self, pdu: F::Pdu) -> Result<(), Closed> {
        if self.is_closing() {
            return Err(Closed);
        }
        match self.slots.try_acquire() {
            Ok(p) => p.forget(),
            Err(_) => {
                // Full: write what is queued, then wait for the socket to take it.
                self.flush();
                tokio::select! {
                    p = self.slots.acquire() => p.map_err(|_| Closed)?.forget(),
                    _ = self.closed() => return Err(Closed),
                }
            }
        }
        let bytes = F::data_len(&pdu);
        let queued = {
            let mut q = lock(&self.queue);
            q.push_back(pdu);
            q.len()
        };
        let unflushed = self.unflushed.fetch_add(bytes, Ordering::Relaxed) + bytes;
        self.dirty.store(true, Ordering::SeqCst);
        if self.batching.load(Ordering::SeqCst) && queued < BATCH_FLUSH && unflushed < BATCH_BYTES {
            return Ok(());
        }
        match self.try_flush() {
            Ok(()) => Ok(()),
            Err(e) => {
                self.fail(&e);
                Err(Closed)
            }
        }
    }

    /// PDUs queued from now on wait for [`Outbox::end_batch`] (or for a full batch).
    pub fn begin_batch(&self) {
        self.batching.store(true, Ordering::SeqCst);
    }

    /// Sends what the batch queued.
    pub fn end_batch(&self) {
        self.batching.store(false, Ordering::SeqCst);
        self.flush();
    }

    /// Writes what is queued as far as the socket takes it without blocking; a failure
    /// closes the outbox.
    pub fn flush(&self) {
        if let Err(e) = self.try_flush() {
            self.fail(&e);
        }
    }

    fn fail(&self, e: &io::Error) {
        self.framer.failed(e);
        self.close();
    }

    /// Whether nothing is queued or partly written.
    pub fn is_idle(&self) -> bool {
        // One lock at a time: writers take `tx` before `queue`.
        let queued = !lock(&self.queue).is_empty();
        !queued && lock(&self.tx).wires.is_empty()
    }

    pub fn is_closing(&self) -> bool {
        self.closing.is_set()
    }

    /// Stops taking PDUs; the writer task sends what is queued and shuts the socket's
    /// sending side down.
    pub fn close(&self) {
        self.closing.set();
    }

    /// Returns once the outbox is closed.
    pub async fn closed(&self) {
        self.closing.wait().await
    }

    /// Writes unless another task is writing (it will see `dirty`) or the writer task waits
    /// for room. Returns an error when the connection failed.
    fn try_flush(&self) -> io::Result<()> {
        loop {
            if self.blocked.load(Ordering::SeqCst) || self.writing.swap(true, Ordering::SeqCst) {
                return Ok(());
            }
            self.dirty.store(false, Ordering::SeqCst);
            self.unflushed.store(0, Ordering::Relaxed);
            let r = self.write_some(&mut lock(&self.tx));
            if let Ok(false) = r {
                self.blocked.store(true, Ordering::SeqCst);
                self.want_room.notify_one();
            }
            self.writing.store(false, Ordering::SeqCst);
            r?;
            if !self.dirty.load(Ordering::SeqCst) {
                return Ok(());
            }
        }
    }

    /// Writes until everything queued is out (true) or the socket is full (false).
    fn write_some(&self, st: &mut TxState<F>) -> io::Result<bool> {
        loop {
            if st.wires.len() < MAX_IOV / 2 {
                self.take_queued(st);
            }
            if st.wires.is_empty() {
                return Ok(true);
            }
            let mut iov = [IoSlice::new(&[]); MAX_IOV];
            let mut n = 0;
            let mut skip = st.sent;
            let mut stop = Fill::More;
            for w in &st.wires {
                stop = w.slices(skip, &mut iov, &mut n);
                if !matches!(stop, Fill::More) {
                    break;
                }
                skip = 0;
            }
            let r = match stop {
                Fill::File { fd, offset, len } => self.send_file(fd, offset, len),
                Fill::FileNext => self.send_msg(&iov[..n], libc::MSG_MORE),
                Fill::More | Fill::Full => self.send_msg(&iov[..n], 0),
            };
            let mut written = match r {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(k) => k,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            let mut done = 0;
            while let Some(w) = st.wires.front() {
                let left = w.len() - st.sent;
                if written < left {
                    st.sent += written;
                    break;
                }
                written -= left;
                st.sent = 0;
                st.wires.pop_front();
                done += 1;
            }
            if done > 0 {
                self.slots.add_permits(done);
                self.framer.sent(done);
            }
        }
    }

    /// `sendfile(2)` of up to `len` bytes of `fd` at `offset` into the socket, without
    /// blocking. The file's pages go to the socket without a copy in user space.
    fn send_file(&self, fd: RawFd, offset: u64, len: usize) -> io::Result<usize> {
        let sock = self.sock.fd();
        let n = self.sock.try_write(&mut || {
            let mut off = libc::off_t::try_from(offset)
                .map_err(|_| io::Error::from_raw_os_error(libc::EOVERFLOW))?;
            // SAFETY: both descriptors are open (the socket is owned by `self.sock`, the file
            // by the backstore the wire's file range keeps alive) and `off` is a valid local
            // the kernel updates.
            let r = unsafe { libc::sendfile(sock, fd, &mut off, len) };
            if r < 0 {
                Err(io::Error::last_os_error())
            } else {
                Ok(r as usize)
            }
        })?;
        if n == 0 {
            // The file ended before the range: the data cannot be sent in full.
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "file range beyond the end of the file",
            ));
        }
        Ok(n)
    }

    /// A vectored write; with MSG_MORE when file data follows, so the kernel need not send a
    /// segment with the headers alone.
    fn send_msg(&self, iov: &[IoSlice<'_>], flags: libc::c_int) -> io::Result<usize> {
        let sock = self.sock.fd();
        self.sock.try_write(&mut || {
            // SAFETY: zeroed msghdr is valid (no name, no control data).
            let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
            // IoSlice is ABI compatible with iovec on Unix; the kernel only reads it.
            msg.msg_iov = iov.as_ptr() as *mut libc::iovec;
            msg.msg_iovlen = iov.len() as _;
            // SAFETY: `msg` points at `iov`, which outlives the call; the socket is open.
            let r = unsafe { libc::sendmsg(sock, &msg, flags | libc::MSG_NOSIGNAL) };
            if r < 0 {
                Err(io::Error::last_os_error())
            } else {
                Ok(r as usize)
            }
        })
    }

    /// Moves queued PDUs into the transmit state, framed in queue order.
    fn take_queued(&self, st: &mut TxState<F>) {
        {
            let mut q = lock(&self.queue);
            if q.is_empty() {
                return;
            }
            let n = q.len().min(MAX_IOV);
            st.taken.extend(q.drain(..n));
        }
        let TxState {
            seq, wires, taken, ..
        } = st;
        self.framer.frame(seq, taken, wires);
        taken.clear();
    }

    /// The writer task: writes for the others while the socket is full, and once the outbox
    /// is closed sends what is queued and shuts the socket's sending side down.
    pub async fn run_writer(self: Arc<Self>) {
        loop {
            tokio::select! {
                biased;
                _ = self.want_room.notified() => {}
                _ = self.closed() => break,
            }
            if let Err(e) = self.sock.writable().await {
                self.fail(&e);
                break;
            }
            self.blocked.store(false, Ordering::SeqCst);
            self.flush();
        }
        // Closing: what is already queued still goes out.
        while !self.is_idle() {
            self.blocked.store(false, Ordering::SeqCst);
            if self.try_flush().is_err() {
                break;
            }
            if self.blocked.load(Ordering::SeqCst) {
                if self.sock.writable().await.is_err() {
                    break;
                }
            } else {
                // Another task is writing; let it finish.
                tokio::task::yield_now().await;
            }
        }
        // SAFETY: shutdown takes no pointers; the descriptor stays open, owned by the socket.
        unsafe { libc::shutdown(self.sock.fd(), libc::SHUT_WR) };
    }
}

#[cfg(test)]
mod tests;
