//! What the RDMA initiators keep between commands: read buffers (a command takes a zeroed
//! buffer of its length and gives it back when done, so a run of reads allocates and faults
//! in its memory once instead of per command) and fast-registration MRs (allocated once,
//! given a new key for every command that uses one).

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

/// Fast-registration MRs an initiator's connection keeps, as ib_iser's descriptor pool:
/// each is allocated once and given a new key (IB_WR_REG_MR) for every command that uses it,
/// after a local invalidation unless the target's SEND with Invalidate already freed it.
pub struct FrPool<M>(Mutex<Vec<FrDesc<M>>>);

impl<M> Default for FrPool<M> {
    fn default() -> FrPool<M> {
        FrPool(Mutex::new(Vec::new()))
    }
}

/// One MR of a pool.
pub struct FrDesc<M> {
    pub mr: M,
    /// The key the MR answers to while it may still be valid (registered and not
    /// invalidated by the target): it must be invalidated locally before the next
    /// registration.
    valid: Option<u32>,
}

impl<M> FrDesc<M> {
    /// The key the MR was last registered with, while it may still be valid.
    pub fn key(&self) -> Option<u32> {
        self.valid
    }

    /// Before a new registration: the key to invalidate locally first, if any.
    pub fn stale_key(&mut self) -> Option<u32> {
        self.valid.take()
    }

    /// The MR now answers to `key`.
    pub fn registered(&mut self, key: u32) {
        self.valid = Some(key);
    }

    /// The target's SEND with Invalidate invalidated `key`: the MR is free again if it was
    /// its key.
    pub fn invalidated(&mut self, key: u32) {
        if self.valid == Some(key) {
            self.valid = None;
        }
    }
}

impl<M> FrPool<M> {
    /// A kept MR, else a new one from `alloc`.
    pub fn take<E>(&self, alloc: impl FnOnce() -> Result<M, E>) -> Result<FrDesc<M>, E> {
        let kept = self.0.lock().unwrap_or_else(|e| e.into_inner()).pop();
        match kept {
            Some(d) => Ok(d),
            None => Ok(FrDesc {
                mr: alloc()?,
                valid: None,
            }),
        }
    }

    /// Takes `desc` back for later commands.
    pub fn give(&self, desc: FrDesc<M>) {
        let mut kept = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if kept.len() < KEPT {
            kept.push(desc);
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

    #[test]
    fn fast_registration_mrs_are_kept_with_the_key_still_valid() {
        let pool: FrPool<u32> = FrPool::default();
        let mut allocs = 0;
        let mut a = pool
            .take(|| {
                allocs += 1;
                Ok::<_, ()>(7)
            })
            .unwrap();
        assert_eq!(a.stale_key(), None, "a new MR has no key to invalidate");
        a.registered(0x1234);
        a.invalidated(0x9999);
        assert_eq!(
            a.key(),
            Some(0x1234),
            "another key's invalidation leaves it valid"
        );
        pool.give(a);
        let mut b = pool
            .take(|| {
                allocs += 1;
                Ok::<_, ()>(8)
            })
            .unwrap();
        assert_eq!((b.mr, allocs), (7, 1), "the MR was reused");
        assert_eq!(
            b.stale_key(),
            Some(0x1234),
            "its old key to invalidate first"
        );
        assert_eq!(b.stale_key(), None);
        b.registered(0x1235);
        b.invalidated(0x1235);
        assert_eq!(b.key(), None, "the target invalidated it");
        for _ in 0..KEPT + 5 {
            pool.give(FrDesc { mr: 1, valid: None });
        }
        assert_eq!(pool.0.lock().unwrap().len(), KEPT, "the pool is bounded");
    }
}
