//! LBA range lock: COMPARE AND WRITE, ORWRITE and WRITE ATOMIC take their range exclusively
//! (SBC-4 4.29 atomicity); ordinary writes take it shared so they never interleave with
//! an atomic operation on overlapping blocks. Writers do not exclude each other.
//!
//! A waiting exclusive request blocks later shared requests on overlapping ranges, so a
//! stream of writes cannot starve a COMPARE AND WRITE.

use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Shared,
    Exclusive,
}

#[derive(Debug)]
struct Entry {
    id: u64,
    start: u64,
    end: u64,
    mode: Mode,
    granted: bool,
}

impl Entry {
    fn overlaps(&self, start: u64, end: u64) -> bool {
        self.start < end && start < self.end
    }
}

#[derive(Debug, Default)]
struct Inner {
    next_id: u64,
    entries: Vec<Entry>,
}

#[derive(Debug, Default)]
pub struct RangeLock {
    inner: Mutex<Inner>,
    notify: Notify,
    /// Exclusive ranges are widened to multiples of this many blocks (0 or 1: not at all),
    /// so an atomic write may rewrite whole pages ([`rtgt_backstore::Backstore::write_replacing`]).
    exclusive_align: u64,
}

/// Held range; released on drop (also when the owning future is cancelled while waiting).
#[derive(Debug)]
pub struct RangeGuard<'a> {
    lock: &'a RangeLock,
    id: u64,
}

impl Drop for RangeGuard<'_> {
    fn drop(&mut self) {
        self.lock.release(self.id);
    }
}

/// A [`RangeGuard`] that owns a reference to its lock, for a range held beyond the command
/// handler (data-in sent straight from the file by the fabric).
#[derive(Debug)]
pub struct OwnedRangeGuard {
    lock: Arc<RangeLock>,
    id: u64,
}

impl Drop for OwnedRangeGuard {
    fn drop(&mut self) {
        self.lock.release(self.id);
    }
}

impl RangeLock {
    #[cfg(test)]
    pub fn new() -> Arc<RangeLock> {
        Arc::new(RangeLock::default())
    }

    /// A lock whose exclusive ranges cover whole groups of `align` blocks.
    pub fn with_exclusive_align(align: u64) -> RangeLock {
        RangeLock {
            exclusive_align: align,
            ..RangeLock::default()
        }
    }

    /// Locks blocks `[start, start + len)`. A zero-length range locks nothing but still
    /// returns a guard.
    pub async fn lock(&self, start: u64, len: u64, mode: Mode) -> RangeGuard<'_> {
        let id = self.enqueue(start, len, mode);
        // From here on the guard removes the entry if this future is dropped.
        let guard = RangeGuard { lock: self, id };
        self.granted(id).await;
        guard
    }

    /// Like [`RangeLock::lock`], with a guard that keeps the lock alive.
    pub async fn lock_owned(self: &Arc<Self>, start: u64, len: u64, mode: Mode) -> OwnedRangeGuard {
        let id = self.enqueue(start, len, mode);
        let guard = OwnedRangeGuard {
            lock: Arc::clone(self),
            id,
        };
        self.granted(id).await;
        guard
    }

    fn enqueue(&self, start: u64, len: u64, mode: Mode) -> u64 {
        let mut end = start.saturating_add(len);
        let mut start = start;
        let a = self.exclusive_align;
        if mode == Mode::Exclusive && a > 1 && len > 0 {
            start = start / a * a;
            end = end.div_ceil(a).saturating_mul(a);
        }
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let id = inner.next_id;
        inner.next_id += 1;
        inner.entries.push(Entry {
            id,
            start,
            end,
            mode,
            granted: false,
        });
        id
    }

    async fn granted(&self, id: u64) {
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.try_grant(id) {
                return;
            }
            notified.await;
        }
    }

    fn release(&self, id: u64) {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner.entries.retain(|e| e.id != id);
        drop(inner);
        self.notify.notify_waiters();
    }

    fn try_grant(&self, id: u64) -> bool {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let Some(pos) = inner.entries.iter().position(|e| e.id == id) else {
            return false;
        };
        let (start, end, mode) = {
            let e = &inner.entries[pos];
            (e.start, e.end, e.mode)
        };
        let blocked = start < end
            && inner.entries.iter().any(|o| {
                if o.id == id || !o.overlaps(start, end) {
                    return false;
                }
                match (mode, o.mode) {
                    // Shared waits for holders and for earlier exclusive waiters.
                    (Mode::Shared, Mode::Exclusive) => o.granted || o.id < id,
                    (Mode::Shared, Mode::Shared) => false,
                    // Exclusive waits for every holder and earlier exclusive waiter.
                    (Mode::Exclusive, Mode::Shared) => o.granted,
                    (Mode::Exclusive, Mode::Exclusive) => o.granted || o.id < id,
                }
            });
        if !blocked {
            inner.entries[pos].granted = true;
        }
        !blocked
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn shared_do_not_block() {
        let l = RangeLock::new();
        let a = l.lock(0, 10, Mode::Shared).await;
        let b = l.lock(5, 10, Mode::Shared).await;
        drop((a, b));
    }

    #[tokio::test]
    async fn exclusive_waits_for_shared() {
        let l = RangeLock::new();
        let a = l.lock(0, 10, Mode::Shared).await;
        let l2 = l.clone();
        let t = tokio::spawn(async move {
            let _g = l2.lock(9, 1, Mode::Exclusive).await;
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!t.is_finished());
        // Non-overlapping ranges are independent.
        let _c = l.lock(10, 5, Mode::Exclusive).await;
        drop(a);
        t.await.unwrap();
    }

    #[tokio::test]
    async fn waiting_exclusive_blocks_new_shared() {
        let l = RangeLock::new();
        let a = l.lock(0, 10, Mode::Shared).await;
        let l2 = l.clone();
        let ex = tokio::spawn(async move {
            let _g = l2.lock(0, 10, Mode::Exclusive).await;
            tokio::time::sleep(Duration::from_millis(10)).await;
        });
        tokio::time::sleep(Duration::from_millis(10)).await;
        let l3 = l.clone();
        let sh = tokio::spawn(async move {
            let _g = l3.lock(0, 1, Mode::Shared).await;
        });
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(!sh.is_finished());
        drop(a);
        ex.await.unwrap();
        sh.await.unwrap();
    }

    #[tokio::test]
    async fn cancelled_waiter_releases() {
        let l = RangeLock::new();
        let a = l.lock(0, 10, Mode::Exclusive).await;
        let r =
            tokio::time::timeout(Duration::from_millis(10), l.lock(0, 10, Mode::Exclusive)).await;
        assert!(r.is_err());
        drop(a);
        let _b = l.lock(0, 10, Mode::Shared).await;
    }
}
