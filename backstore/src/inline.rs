//! Running a command's future where its data already is.

use std::future::Future;
use std::task::{Context, Waker};

/// Runs a command in the caller's task as far as it goes without waiting, and gives it a
/// task of its own only when it has to wait (for data-out, the device, an ORDERED task, a
/// send credit). Most commands finish at once — reads served from memory, writes whose data
/// came with the command — and then their responses join the batch the fabric's receive loop
/// sends next, with no task spawned and no wake-up. The first poll uses a no-op waker; the
/// spawned task polls again at once with its own, so no wake-up is lost.
pub fn run_inline(command: impl Future<Output = ()> + Send + 'static) {
    let mut command = Box::pin(command);
    if command
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
        .is_pending()
    {
        tokio::spawn(command);
    }
}

/// A one-way flag tasks can wait for: a connection's "closing", set once and never cleared.
#[derive(Debug, Default)]
pub struct Latch {
    set: std::sync::atomic::AtomicBool,
    notify: tokio::sync::Notify,
}

impl Latch {
    /// Sets the latch and wakes its waiters; true for the call that set it.
    pub fn set(&self) -> bool {
        let first = !self.set.swap(true, std::sync::atomic::Ordering::AcqRel);
        if first {
            self.notify.notify_waiters();
        }
        first
    }

    pub fn is_set(&self) -> bool {
        self.set.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Returns once the latch is set.
    pub async fn wait(&self) {
        loop {
            let n = self.notify.notified();
            tokio::pin!(n);
            // Registered before the check, so a set between the two is not missed.
            n.as_mut().enable();
            if self.is_set() {
                return;
            }
            n.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[tokio::test]
    async fn a_latch_wakes_who_waits_and_is_set_once() {
        let l = Arc::new(Latch::default());
        let w = tokio::spawn({
            let l = l.clone();
            async move { l.wait().await }
        });
        tokio::task::yield_now().await;
        assert!(!w.is_finished() && !l.is_set());
        assert!(l.set(), "the first set");
        assert!(!l.set(), "set already");
        tokio::time::timeout(std::time::Duration::from_secs(5), w)
            .await
            .expect("the waiter woke")
            .unwrap();
        // Set before waiting: at once.
        l.wait().await;
    }
}
