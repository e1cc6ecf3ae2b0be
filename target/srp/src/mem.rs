//! Data buffers lent to the RDMA engine. All `unsafe` of the SRP front-end lives here.
//!
//! Ownership model: a backstore buffer ([`IoBuf`]) becomes an RDMA [`Region`] without a copy.
//! * Data-in ([`region_owning`]): the region owns the buffer and frees it when the engine and
//!   the memory region drop their last reference.
//! * Data-out ([`Lent`]): the region only borrows the buffer's memory, so that the buffer can
//!   go to the SCSI engine once the RDMA READs are done. [`Lent::into_buf`] hands the buffer
//!   back only when the region has no other reference left (the memory region was dropped and
//!   the engine holds nothing); otherwise the buffer is leaked rather than freed under an
//!   engine that might still write into it.

use std::ptr::NonNull;
use std::sync::Arc;

use rtgt_backstore::IoBuf;
use rtgt_transport::verbs::Region;

/// A region that owns `buf` (its first `buf.len()` bytes).
pub fn region_owning(mut buf: IoBuf) -> Arc<Region> {
    let len = buf.len();
    let ptr = NonNull::new(buf.as_mut_ptr()).unwrap_or(NonNull::dangling());
    // SAFETY: the bytes live in the buffer's own allocation, which does not move when the
    // IoBuf value moves into the owner box, and stay allocated until the owner (dropped with
    // the region) frees them; nothing else holds a reference to them from here on.
    Arc::new(unsafe { Region::from_raw(ptr, len, Some(Box::new(buf))) })
}

/// A buffer lent to the engine as a region for RDMA READs into it.
pub struct Lent {
    region: Option<Arc<Region>>,
    buf: Option<IoBuf>,
}

impl Lent {
    pub fn new(mut buf: IoBuf) -> Lent {
        let len = buf.len();
        let ptr = NonNull::new(buf.as_mut_ptr()).unwrap_or(NonNull::dangling());
        // SAFETY: the memory belongs to `buf`, which this value keeps alive and untouched
        // (no references to its bytes are created) until the region is gone: `into_buf` only
        // returns it when the region's reference count shows no other holder, and `Drop`
        // leaks it otherwise.
        let region = unsafe { Region::from_raw(ptr, len, None) };
        Lent {
            region: Some(Arc::new(region)),
            buf: Some(buf),
        }
    }

    pub fn region(&self) -> &Arc<Region> {
        self.region.as_ref().expect("present until into_buf")
    }

    /// The buffer back, once every memory region over it is dropped; `None` (and the buffer
    /// leaked) if the engine still holds the region.
    pub fn into_buf(mut self) -> Option<IoBuf> {
        let region = self.region.take().expect("present until into_buf");
        match Arc::try_unwrap(region) {
            Ok(r) => {
                drop(r);
                self.buf.take()
            }
            Err(shared) => {
                tracing::warn!("SRP data buffer still referenced by the RDMA engine: leaked");
                std::mem::forget(shared);
                std::mem::forget(self.buf.take());
                None
            }
        }
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        if let Some(region) = self.region.take() {
            if let Err(shared) = Arc::try_unwrap(region) {
                // The engine may still write into the memory: never free it.
                std::mem::forget(shared);
                std::mem::forget(self.buf.take());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lent_round_trip() {
        let mut b = IoBuf::zeroed(4096);
        b.as_mut_slice()[0] = 7;
        let l = Lent::new(b);
        assert!(l.region().write(1, &[9, 9]));
        let b = l.into_buf().unwrap();
        assert_eq!(&b.as_slice()[..3], &[7, 9, 9]);
        let r = region_owning(IoBuf::from_slice(b"abc"));
        let mut out = [0u8; 3];
        assert!(r.read(0, &mut out));
        assert_eq!(&out, b"abc");
    }

    #[test]
    fn shared_region_is_leaked_not_freed() {
        let l = Lent::new(IoBuf::zeroed(512));
        let extra = l.region().clone();
        assert!(l.into_buf().is_none());
        // The memory is still valid for the remaining holder.
        assert!(extra.write(0, &[1; 512]));
    }
}
