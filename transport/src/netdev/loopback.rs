//! An in-memory link between two endpoints: what one transmits, the other receives. Each
//! direction is a bounded queue; transmitting into a full queue drops the datagram.

use std::collections::VecDeque;
use std::io;
use std::sync::{Arc, Mutex};

use super::NetDev;

type Queue = Arc<(Mutex<VecDeque<Vec<u8>>>, tokio::sync::Notify)>;

/// One end of a loopback link.
#[derive(Debug)]
pub struct Loopback {
    tx: Queue,
    rx: Queue,
    limit: usize,
    /// Datagrams dropped because the peer's queue was full.
    pub dropped: u64,
}

/// Two connected ends, each queue holding at most `limit` datagrams.
pub fn pair(limit: usize) -> (Loopback, Loopback) {
    let a: Queue = Arc::default();
    let b: Queue = Arc::default();
    (
        Loopback {
            tx: a.clone(),
            rx: b.clone(),
            limit,
            dropped: 0,
        },
        Loopback {
            tx: b,
            rx: a,
            limit,
            dropped: 0,
        },
    )
}

impl Loopback {
    /// Datagrams waiting for this end.
    pub fn pending(&self) -> usize {
        self.rx.0.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

impl NetDev for Loopback {
    fn transmit(&mut self, datagram: &[u8]) -> io::Result<()> {
        let mut q = self.tx.0.lock().unwrap_or_else(|e| e.into_inner());
        if q.len() >= self.limit {
            self.dropped += 1;
            return Ok(());
        }
        q.push_back(datagram.to_vec());
        drop(q);
        self.tx.1.notify_one();
        Ok(())
    }

    fn receive(&mut self) -> io::Result<Option<Vec<u8>>> {
        Ok(self
            .rx
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop_front())
    }
}

impl super::AsyncNetDev for Loopback {
    async fn readable(&self) -> io::Result<()> {
        // Notify keeps one permit, so a datagram queued before this wait is not missed.
        if self.pending() == 0 {
            self.rx.1.notified().await;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_directions_and_limit() {
        let (mut a, mut b) = pair(2);
        a.transmit(b"one").unwrap();
        a.transmit(b"two").unwrap();
        a.transmit(b"three").unwrap();
        assert_eq!(a.dropped, 1);
        assert_eq!(b.receive().unwrap().unwrap(), b"one");
        b.transmit(b"back").unwrap();
        assert_eq!(a.receive().unwrap().unwrap(), b"back");
        assert_eq!(b.pending(), 1);
    }
}
