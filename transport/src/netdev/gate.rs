//! A gate around a netdev, for tests (feature `test-gate`): while closed, transmitted RoCE
//! datagrams whose BTH opcode the gate's filter selects are held back — queued, not dropped —
//! and every other datagram passes. Opening the gate sends what it held, in order, before
//! anything transmitted after it.
//!
//! One [`Gate`] handle may control several [`Gated`] netdevs (both ends of a link): a test
//! closes it on, say, RDMA READ responses to stall a data-out transfer, watches
//! [`Gate::held`], and opens it again. Each netdev holds at most [`MAX_HELD`] datagrams;
//! beyond that the link behaves as a full wire and drops them (the transport retransmits).

use std::collections::VecDeque;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use super::{AsyncNetDev, NetDev};
use crate::wire::datagram::Datagram;
use crate::wire::opcode::Opcode;

/// Datagrams one gated netdev holds at most.
pub const MAX_HELD: usize = 1024;

/// Which datagrams a closed gate holds.
pub type Filter = fn(Opcode) -> bool;

/// RDMA READ responses (FIRST, MIDDLE, LAST, ONLY): a closed gate stalls data-out fetched by
/// RDMA READ.
pub fn rdma_read_responses(op: Opcode) -> bool {
    matches!(
        op,
        Opcode::RcRdmaReadResponseFirst
            | Opcode::RcRdmaReadResponseMiddle
            | Opcode::RcRdmaReadResponseLast
            | Opcode::RcRdmaReadResponseOnly
    )
}

/// RDMA WRITEs (every position, with or without immediate): a closed gate stalls data-in.
pub fn rdma_writes(op: Opcode) -> bool {
    matches!(
        op,
        Opcode::RcRdmaWriteFirst
            | Opcode::RcRdmaWriteMiddle
            | Opcode::RcRdmaWriteLast
            | Opcode::RcRdmaWriteLastWithImmediate
            | Opcode::RcRdmaWriteOnly
            | Opcode::RcRdmaWriteOnlyWithImmediate
    )
}

#[derive(Debug, Default)]
struct Shared {
    closed: AtomicBool,
    filter: Mutex<Option<Filter>>,
    /// Datagrams held now, over every gated netdev.
    held: AtomicUsize,
    /// Datagrams the filter selected while closed (held or, past the cap, dropped).
    matched: AtomicU64,
    dropped: AtomicU64,
    opened: tokio::sync::Notify,
}

/// The control of one or more [`Gated`] netdevs; open when made.
#[derive(Debug, Clone, Default)]
pub struct Gate(Arc<Shared>);

impl Gate {
    pub fn new() -> Gate {
        Gate::default()
    }

    /// Holds, from now on, the datagrams `filter` selects.
    pub fn close(&self, filter: Filter) {
        *self.0.filter.lock().unwrap_or_else(|e| e.into_inner()) = Some(filter);
        self.0.closed.store(true, Ordering::SeqCst);
    }

    /// Lets everything through again; each gated netdev sends what it held at its next turn.
    pub fn open(&self) {
        self.0.closed.store(false, Ordering::SeqCst);
        *self.0.filter.lock().unwrap_or_else(|e| e.into_inner()) = None;
        self.0.opened.notify_waiters();
    }

    pub fn is_closed(&self) -> bool {
        self.0.closed.load(Ordering::SeqCst)
    }

    /// Datagrams held now.
    pub fn held(&self) -> usize {
        self.0.held.load(Ordering::SeqCst)
    }

    /// Datagrams selected while closed, retransmissions included.
    pub fn matched(&self) -> u64 {
        self.0.matched.load(Ordering::SeqCst)
    }

    /// Selected datagrams dropped because a netdev already held [`MAX_HELD`].
    pub fn dropped(&self) -> u64 {
        self.0.dropped.load(Ordering::SeqCst)
    }

    fn filter(&self) -> Option<Filter> {
        if !self.is_closed() {
            return None;
        }
        *self.0.filter.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A netdev behind a [`Gate`].
#[derive(Debug)]
pub struct Gated<D> {
    inner: D,
    gate: Gate,
    held: VecDeque<Vec<u8>>,
}

impl<D: NetDev> Gated<D> {
    pub fn new(inner: D, gate: Gate) -> Gated<D> {
        Gated {
            inner,
            gate,
            held: VecDeque::new(),
        }
    }

    pub fn inner(&self) -> &D {
        &self.inner
    }

    /// Sends what the gate held, once it is open.
    fn release(&mut self) -> io::Result<()> {
        if self.held.is_empty() || self.gate.is_closed() {
            return Ok(());
        }
        while let Some(d) = self.held.pop_front() {
            self.gate.0.held.fetch_sub(1, Ordering::SeqCst);
            self.inner.transmit(&d)?;
        }
        Ok(())
    }
}

fn opcode(datagram: &[u8]) -> Option<Opcode> {
    let d = Datagram::split(datagram).ok()?;
    d.roce.first().map(|&b| Opcode::from(b))
}

impl<D: NetDev> NetDev for Gated<D> {
    fn transmit(&mut self, datagram: &[u8]) -> io::Result<()> {
        if let Some(filter) = self.gate.filter() {
            if opcode(datagram).is_some_and(filter) {
                self.gate.0.matched.fetch_add(1, Ordering::SeqCst);
                if self.held.len() < MAX_HELD {
                    self.held.push_back(datagram.to_vec());
                    self.gate.0.held.fetch_add(1, Ordering::SeqCst);
                } else {
                    self.gate.0.dropped.fetch_add(1, Ordering::SeqCst);
                }
                return Ok(());
            }
            return self.inner.transmit(datagram);
        }
        self.release()?;
        self.inner.transmit(datagram)
    }

    fn receive(&mut self) -> io::Result<Option<Vec<u8>>> {
        self.release()?;
        self.inner.receive()
    }

    fn tx_ports(&self) -> Option<(u16, u16)> {
        self.inner.tx_ports()
    }
}

impl<D: AsyncNetDev> AsyncNetDev for Gated<D> {
    fn readable(&self) -> impl std::future::Future<Output = io::Result<()>> + Send + '_ {
        let holding = !self.held.is_empty();
        let gate = self.gate.clone();
        let inner = self.inner.readable();
        async move {
            if !holding {
                return inner.await;
            }
            // Held datagrams wait for the gate to open: wake the runner then, to send them.
            let opened = gate.0.opened.notified();
            tokio::pin!(opened);
            opened.as_mut().enable();
            if !gate.is_closed() {
                return Ok(());
            }
            tokio::select! {
                r = inner => r,
                _ = opened => Ok(()),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::netdev::loopback::pair;

    /// A minimal RoCEv2 datagram with `op` and a one-byte tag in the payload.
    fn datagram(op: Opcode, tag: u8) -> Vec<u8> {
        let mut roce = vec![0u8; 12 + 1 + 4];
        roce[0] = u8::from(op);
        roce[12] = tag;
        let udp_len = 8 + roce.len();
        let total = 20 + udp_len;
        let mut d = vec![0u8; total];
        d[0] = 0x45;
        d[2..4].copy_from_slice(&(total as u16).to_be_bytes());
        d[8] = 64;
        d[9] = 17;
        d[22..24].copy_from_slice(&4791u16.to_be_bytes());
        d[24..26].copy_from_slice(&(udp_len as u16).to_be_bytes());
        d[28..].copy_from_slice(&roce);
        d
    }

    fn tags(b: &mut crate::netdev::loopback::Loopback) -> Vec<u8> {
        let mut out = Vec::new();
        while let Some(d) = b.receive().unwrap() {
            out.push(d[28 + 12]);
        }
        out
    }

    #[test]
    fn holds_selected_datagrams_until_opened() {
        let (a, mut b) = pair(4096);
        let gate = Gate::new();
        let mut g = Gated::new(a, gate.clone());
        g.transmit(&datagram(Opcode::RcRdmaReadResponseOnly, 1))
            .unwrap();
        gate.close(rdma_read_responses);
        g.transmit(&datagram(Opcode::RcRdmaReadResponseFirst, 2))
            .unwrap();
        g.transmit(&datagram(Opcode::RcSendOnly, 3)).unwrap();
        g.transmit(&datagram(Opcode::RcRdmaReadResponseLast, 4))
            .unwrap();
        g.transmit(&datagram(Opcode::RcAcknowledge, 5)).unwrap();
        g.transmit(&datagram(Opcode::RcRdmaWriteOnly, 6)).unwrap();
        assert_eq!(tags(&mut b), vec![1, 3, 5, 6]);
        assert_eq!((gate.held(), gate.matched()), (2, 2));
        // Closed, receiving lets nothing out.
        assert!(g.receive().unwrap().is_none());
        assert!(tags(&mut b).is_empty());
        gate.open();
        g.transmit(&datagram(Opcode::RcSendOnly, 7)).unwrap();
        assert_eq!(tags(&mut b), vec![2, 4, 7]);
        assert_eq!(gate.held(), 0);
    }

    #[test]
    fn bounded_and_released_on_receive() {
        let (a, mut b) = pair(4 * MAX_HELD);
        let gate = Gate::new();
        let mut g = Gated::new(a, gate.clone());
        gate.close(rdma_writes);
        for i in 0..MAX_HELD + 10 {
            g.transmit(&datagram(Opcode::RcRdmaWriteMiddle, i as u8))
                .unwrap();
        }
        assert_eq!(gate.held(), MAX_HELD);
        assert_eq!(gate.dropped(), 10);
        assert_eq!(gate.matched(), (MAX_HELD + 10) as u64);
        gate.open();
        // An idle link sends what it held at its next receive.
        assert!(g.receive().unwrap().is_none());
        assert_eq!(tags(&mut b).len(), MAX_HELD);
        assert_eq!(gate.held(), 0);
    }

    #[tokio::test]
    async fn opening_wakes_the_runner() {
        let (a, _b) = pair(16);
        let gate = Gate::new();
        let mut g = Gated::new(a, gate.clone());
        gate.close(rdma_writes);
        g.transmit(&datagram(Opcode::RcRdmaWriteOnly, 1)).unwrap();
        let opener = gate.clone();
        let t = tokio::spawn(async move {
            tokio::task::yield_now().await;
            opener.open();
        });
        tokio::time::timeout(std::time::Duration::from_secs(5), g.readable())
            .await
            .expect("woken by the gate opening")
            .unwrap();
        t.await.unwrap();
    }
}
