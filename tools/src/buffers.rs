//! What the RDMA initiators keep between commands: read buffers (a command takes a zeroed
//! buffer of its length and gives it back when done, so a run of reads allocates and faults
//! in its memory once instead of per command; what the target wrote there reaches the caller
//! without a copy, [`ReadBuffers::landed`]) and fast-registration MRs (allocated once, given a
//! new key for every command that uses one).

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use rtgt_rdma_channel::{Hold, Link, LinkError, Mr};
use rtgt_transport::verbs::{Access, FastReg, Pd, Region, SendOp, SgList};

/// Buffers kept per initiator.
const KEPT: usize = 256;

/// An initiator's read buffers; clones share them.
#[derive(Default, Clone)]
pub struct ReadBuffers(Arc<Mutex<Vec<Arc<Region>>>>);

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

    /// The first `len` bytes of `region`, which the target has written, as the caller's
    /// data. When the target can no longer reach the region (the command is complete, its
    /// key invalidated or its MR gone), without a copy, as a kernel initiator's reads land
    /// in the pages they are for: the region comes back here once the last reference to the
    /// data is dropped. A region still `reachable` through a valid key is copied from (and
    /// not reused until that key is gone).
    pub fn landed(&self, region: Arc<Region>, len: usize, reachable: bool) -> Bytes {
        let len = len.min(region.len());
        if reachable {
            let data = Bytes::copy_from_slice(region.slice(0, len).unwrap_or_default());
            self.give(region);
            return data;
        }
        Bytes::from_owner(Landed {
            region: Some(region),
            len,
            home: self.clone(),
        })
    }
}

/// Read data in a buffer of [`ReadBuffers`], which it goes back to when dropped.
struct Landed {
    region: Option<Arc<Region>>,
    len: usize,
    home: ReadBuffers,
}

impl AsRef<[u8]> for Landed {
    fn as_ref(&self) -> &[u8] {
        self.region
            .as_ref()
            .and_then(|r| r.slice(0, self.len))
            .unwrap_or_default()
    }
}

impl Drop for Landed {
    fn drop(&mut self) {
        if let Some(r) = self.region.take() {
            self.home.give(r);
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

/// Fast registration on a connection of the RDMA channel layer, as ib_iser and nvme-rdma
/// register a command's buffer: an MR of the connection's pool gets a new key (its variant
/// byte stepped) naming the buffer, after a local invalidation of its old key when the
/// target did not invalidate that one.
pub struct FastRegistrar {
    pd: Pd,
    mrs: FrPool<Arc<Mr>>,
    /// The variant (low byte) of the next key.
    variant: AtomicU8,
}

impl FastRegistrar {
    pub fn new(pd: Pd) -> FastRegistrar {
        FastRegistrar {
            pd,
            mrs: FrPool::default(),
            variant: AtomicU8::new(1),
        }
    }

    /// Registers `region` with `access` (local write added) and returns the MR with the key
    /// it now answers to. The registration (and the invalidation before it) is posted, not
    /// awaited: the send queue runs it before anything posted after it (the command that
    /// names the key), and a failure fails the connection. The work requests hold the MR
    /// until they complete.
    pub async fn register(
        &self,
        link: &Link,
        region: Arc<Region>,
        access: Access,
    ) -> Result<FrDesc<Arc<Mr>>, LinkError> {
        // The limit of a fast registration, not memory: any command's buffer fits.
        let mut desc = self.mrs.take(|| {
            self.pd
                .alloc_mr(u32::MAX as usize)
                .map(|mr| Arc::new(Mr::Soft(mr)))
                .map_err(|_| LinkError::Registration)
        })?;
        if let Some(key) = desc.stale_key() {
            link.sq_credit().await?;
            link.post_op(
                SendOp::LocalInv { key },
                SgList::new(),
                Hold::Mr(desc.mr.clone()),
                false,
            )?;
        }
        let variant = self.variant.fetch_add(1, Ordering::Relaxed);
        let key = desc
            .mr
            .soft()
            .ok_or(LinkError::Registration)?
            .key_with_variant(variant);
        link.sq_credit().await?;
        link.post_op(
            SendOp::FastReg(FastReg {
                key,
                iova: region.addr(),
                offset: 0,
                length: region.len().max(1),
                region,
                access: access | Access::LOCAL_WRITE,
            }),
            SgList::new(),
            Hold::Mr(desc.mr.clone()),
            false,
        )?;
        desc.registered(key);
        Ok(desc)
    }

    /// Takes `desc` back for later commands.
    pub fn give(&self, desc: FrDesc<Arc<Mr>>) {
        self.mrs.give(desc);
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
    fn landed_data_is_the_buffer_itself_and_returns_it_when_dropped() {
        let keep = ReadBuffers::default();
        let a = keep.take(8192);
        a.fill(0, 8192, 0x5c);
        let addr = a.addr();
        let data = keep.landed(a, 4096, false);
        assert_eq!(data.as_ptr() as u64, addr, "no copy");
        assert_eq!(data.len(), 4096, "only what the target wrote");
        let part = data.slice(1024..2048);
        drop(data);
        assert_ne!(
            keep.take(8192).addr(),
            addr,
            "kept while a slice of it lives"
        );
        assert!(part.iter().all(|&x| x == 0x5c));
        drop(part);
        assert_eq!(
            keep.take(8192).addr(),
            addr,
            "back once the last one is gone"
        );

        // Still reachable through a key: copied out, and not reused while referred to.
        let b = keep.take(8192);
        b.fill(0, 8192, 0x77);
        let (addr, mr) = (b.addr(), b.clone());
        let data = keep.landed(b, 100_000, true);
        assert_ne!(data.as_ptr() as u64, addr, "a copy");
        assert_eq!(data.len(), 8192, "at most the buffer");
        assert!(data.iter().all(|&x| x == 0x77));
        assert_ne!(keep.take(8192).addr(), addr);
        drop(mr);
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
