//! Packet I/O for the RDMA engine: whole IP datagrams (IP header, UDP header, BTH ... ICRC), so
//! the ICRC, which covers the IP header, can be computed on send and checked on receive.
//!
//! * [`loopback`]: an in-memory pair of links connecting two devices in one process;
//! * [`fault`]: a deterministic fault injector (loss, duplication, reordering, corruption,
//!   delay) wrapped around any netdev, after smoltcp's `FaultInjector`;
//! * [`gate`] (feature `test-gate`): holds chosen packets (RDMA READ responses, RDMA WRITEs)
//!   until a test lets them go;
//! * [`udp`]: a kernel UDP socket on port 4791;
//! * [`multi`]: several UDP sockets (one per local address) as one netdev.

pub mod fault;
#[cfg(feature = "test-gate")]
pub mod gate;
pub mod loopback;
pub mod multi;
pub mod udp;

use std::future::Future;
use std::io;
use std::time::Duration;

use crate::poll::PollBudget;
use crate::verbs::Device;
pub use crate::verbs::{Expected, Outgoing, RxSink};

/// A link that carries whole IP datagrams.
pub trait NetDev: Send {
    /// Queues one datagram (starting at the IP header) for transmission. A full link may drop
    /// it, as a wire would; the transport retransmits.
    fn transmit(&mut self, datagram: &[u8]) -> io::Result<()>;

    /// The next received datagram, if one is waiting (never blocks).
    fn receive(&mut self) -> io::Result<Option<Vec<u8>>>;

    /// Transmits several datagrams (one system call where the link supports it). A link
    /// that sends from memory sends a datagram's pieces as they are; this one puts each
    /// together first.
    fn transmit_batch(&mut self, datagrams: &[Outgoing]) -> io::Result<()> {
        for d in datagrams {
            match d.payload {
                None => self.transmit(&d.bytes)?,
                Some(_) => self.transmit(&d.to_vec())?,
            }
        }
        Ok(())
    }

    /// The UDP source and destination ports this link puts on the wire, when it replaces the
    /// datagram's own (a UDP socket sends from its bound port). The device then builds its
    /// datagrams with these ports, so that they go out as built, ICRC included.
    fn tx_ports(&self) -> Option<(u16, u16)> {
        None
    }

    /// Takes back datagrams [`NetDev::receive_batch`] returned, once they are consumed, so a
    /// netdev can receive into them again; `bufs` is left empty.
    fn recycle(&mut self, bufs: &mut Vec<Vec<u8>>) {
        bufs.clear();
    }

    /// Hands up to `max` waiting datagrams to `f`, each as `(head, rest)`: the datagram whole
    /// in `head` (`rest` empty), or its IP and UDP headers in `head` and its UDP payload in
    /// `rest`, where the link received it (no copy into a datagram buffer of its own); returns
    /// how many. The default takes them from [`NetDev::receive_batch`].
    fn receive_each(&mut self, max: usize, f: &mut dyn FnMut(&[u8], &[u8])) -> io::Result<usize> {
        let mut got = Vec::new();
        let n = self.receive_batch(&mut got, max)?;
        for d in &got {
            f(d, &[]);
        }
        self.recycle(&mut got);
        Ok(n)
    }

    /// [`NetDev::receive_each`] into `sink`. A link that can receive straight into memory
    /// first asks the sink where the payloads of the datagrams it expects next go
    /// ([`RxSink::expect`]) and receives them there; a datagram that turns out to be another
    /// is handed over whole, as without placing, and the memory it passed through zeroed.
    /// The default places nothing.
    fn receive_into(&mut self, max: usize, sink: &mut dyn RxSink) -> io::Result<usize> {
        self.receive_each(max, &mut |head, rest| sink.datagram(head, rest, &[]))
    }

    /// Appends up to `max` waiting datagrams to `out`; returns how many. A link that receives
    /// datagrams coalesced (UDP GRO) may return up to one system call's worth more.
    fn receive_batch(&mut self, out: &mut Vec<Vec<u8>>, max: usize) -> io::Result<usize> {
        let mut n = 0;
        while n < max {
            match self.receive()? {
                Some(d) => out.push(d),
                None => break,
            }
            n += 1;
        }
        Ok(n)
    }
}

/// The engine as a receiving link sees it: where payloads are expected, and where
/// datagrams go.
struct EngineRx<'a> {
    eng: &'a mut crate::verbs::device::Engine,
    now: Duration,
}

impl RxSink for EngineRx<'_> {
    fn expect(&mut self) -> Option<(std::net::IpAddr, &[Expected])> {
        self.eng.expect()
    }

    fn datagram(&mut self, head: &[u8], rest: &[u8], placed: &[u8]) {
        self.eng.receive(head, rest, placed, self.now);
    }
}

// Defined with the links rather than in the verbs layer, which knows none.
impl Device {
    /// Receive from `netdev`, run the engine and transmit, once. Returns the number of
    /// datagrams moved in either direction.
    pub fn drive(&self, netdev: &mut dyn NetDev, now: Duration) -> usize {
        let mut eng = self.engine();
        eng.tx.ports = netdev.tx_ports();
        let passed = eng.receive_passed(now);
        // Receive errors are transient for a datagram link; the transport retransmits.
        let received = netdev
            .receive_into(1024, &mut EngineRx { eng: &mut eng, now })
            .unwrap_or(0);
        eng.flush_acks();
        eng.poll(now);
        let mut tx = std::mem::take(&mut eng.tx_scratch);
        tx.clear();
        tx.extend(eng.tx.queue.drain(..));
        drop(eng);
        // A full or failing link drops packets, as a NIC's wire would; the transport recovers
        // by retransmission.
        let _ = netdev.transmit_batch(&tx);
        let moved = passed + received + tx.len();
        // Sent buffers go back to the engine, for reuse.
        let mut eng = self.engine();
        eng.tx.recycle(&mut tx);
        eng.tx_scratch = tx;
        moved
    }
}

/// Fruitless polling windows in a row after which [`run`] sleeps at once: a peer late a few
/// times in a busy stream keeps the engine polling, a peer that is always slower than the
/// window (an emulated guest, a host at queue depth 1 far away) does not.
pub const POLL_TOLERANCE: u8 = 8;

/// A netdev that can wait for received datagrams, so an async runner can sleep.
pub trait AsyncNetDev: NetDev {
    /// Resolves when [`NetDev::receive`] may return a datagram (spurious wake-ups allowed).
    fn readable(&self) -> impl Future<Output = io::Result<()>> + Send + '_;
}

/// Drives `dev` over `netdev` until an I/O error: receives on readiness, runs timers at their
/// deadlines and sends what posted work produces. Completion work stays with the consumers,
/// who await their CQs ([`crate::verbs::Cq::wait_nonempty`]).
///
/// With a [`crate::verbs::DeviceConfig::busy_poll`] time the runner keeps trying the link
/// for that long after the last datagram moved (yielding to the runtime's other tasks
/// between tries) before it sleeps: the next request of a busy peer then costs no wake-up.
/// An idle device sleeps as without it, and so does one whose peers keep it waiting longer
/// than the window: after [`POLL_TOLERANCE`] fruitless windows in a row it sleeps at once
/// until, after a sleep, datagrams again move within the window ([`PollBudget`]).
pub async fn run<N: AsyncNetDev>(dev: Device, mut netdev: N) -> io::Result<()> {
    let epoch = tokio::time::Instant::now();
    let mut budget = PollBudget::new(dev.busy_poll(), POLL_TOLERANCE);
    let mut last_moved = std::time::Duration::ZERO;
    // Whether the runner tried the link in vain since the last datagram moved, and whether it
    // slept since.
    let (mut polled, mut slept) = (false, false);
    loop {
        let now = epoch.elapsed();
        // Keep going while datagrams move; otherwise sleep until a datagram arrives, work is
        // posted or a timer is due (a QP blocked on its window waits for ACKs, not the CPU).
        if dev.drive(&mut netdev, now) > 0 {
            if std::mem::take(&mut slept) {
                budget.resumed_after(now.saturating_sub(last_moved));
            } else if polled {
                budget.hit();
            }
            polled = false;
            last_moved = now;
            tokio::task::yield_now().await;
            continue;
        }
        if now.saturating_sub(last_moved) < budget.window() {
            polled = true;
            tokio::task::yield_now().await;
            continue;
        }
        if std::mem::take(&mut polled) {
            budget.expired();
        }
        slept = true;
        let sleep = match dev.next_deadline() {
            Some(d) => d.saturating_sub(now),
            None => std::time::Duration::from_secs(3600),
        };
        tokio::select! {
            r = netdev.readable() => r?,
            _ = dev.kicked() => {}
            _ = tokio::time::sleep(sleep) => {}
        }
    }
}
