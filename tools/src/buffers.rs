//! Read buffers the RDMA initiators keep between commands: a command takes a zeroed buffer
//! of its length and gives it back when done, so a run of reads allocates (and faults in)
//! its memory once instead of per command.

use std::sync::{Arc, Mutex};

use rtgt_transport::verbs::Region;

/// Buffers kept per initiator.
const KEPT: usize = 256;

#[derive(Default)]
pub struct ReadBuffers(Mutex<Vec<Arc<Region>>>);

impl ReadBuffers {
    /// A zeroed buffer of exactly `len` bytes (zeroed again when reused, so stale data of an
    /// earlier command never looks like what the target wrote).
    pub fn take(&self, len: usize) -> Arc<Region> {
        let kept = {
            let mut b = self.0.lock().unwrap_or_else(|e| e.into_inner());
            let i = b.iter().position(|r| r.len() == len);
            i.map(|i| b.swap_remove(i))
        };
        match kept {
            Some(r) => {
                r.fill(0, len, 0);
                r
            }
            None => Arc::new(Region::zeroed(len)),
        }
    }

    /// Takes `region` back once nothing else (an MR, a work request) refers to it.
    pub fn give(&self, region: Arc<Region>) {
        if Arc::strong_count(&region) == 1 {
            let mut b = self.0.lock().unwrap_or_else(|e| e.into_inner());
            if b.len() < KEPT {
                b.push(region);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reused_buffers_are_zeroed_and_shared_ones_are_not_kept() {
        let keep = ReadBuffers::default();
        let a = keep.take(4096);
        a.fill(0, 4096, 0xab);
        let addr = a.addr();
        keep.give(a);
        let b = keep.take(4096);
        assert_eq!(b.addr(), addr, "the buffer was reused");
        assert!(b.to_vec().iter().all(|&x| x == 0), "and zeroed again");
        let held = b.clone();
        keep.give(b);
        let c = keep.take(4096);
        assert_ne!(
            c.addr(),
            held.addr(),
            "a buffer still referred to is not handed out"
        );
        assert_ne!(keep.take(512).len(), 4096);
    }
}
