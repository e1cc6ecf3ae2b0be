//! Completion queues: a bounded power-of-two ring of work completions, armed notification
//! (next / solicited, `ib_req_notify_cq`) and an async wait for tokio consumers.
//!
//! The engine pushes; consumers poll. Overflow puts the CQ in error (IBA 11.4.2.1: "CQ
//! overrun" is an affiliated asynchronous error) and raises [`AsyncEvent::CqError`].

use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Notify;

use super::event::EventQueue;
use super::types::{AsyncEvent, WorkCompletion};
use crate::ring::Ring;

/// Which completions wake a waiter after [`Cq::req_notify`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotifyKind {
    /// The next completion of any kind.
    Next,
    /// The next solicited receive completion or any error completion.
    Solicited,
}

#[derive(Debug)]
struct CqState {
    ring: Ring<WorkCompletion>,
    depth: u32,
    armed: Option<NotifyKind>,
    overflowed: bool,
    events: u64,
}

#[derive(Debug)]
pub(crate) struct CqShared {
    pub(crate) id: u32,
    state: Mutex<CqState>,
    notify: Notify,
    pub(crate) async_events: Arc<EventQueue>,
    live: Arc<std::sync::atomic::AtomicU32>,
}

impl Drop for CqShared {
    fn drop(&mut self) {
        self.live.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }
}

/// A completion queue handle (cheap to clone).
#[derive(Debug, Clone)]
pub struct Cq {
    pub(crate) shared: Arc<CqShared>,
}

impl Cq {
    pub(crate) fn new(
        id: u32,
        depth: u32,
        events: Arc<EventQueue>,
        live: Arc<std::sync::atomic::AtomicU32>,
    ) -> Cq {
        Cq {
            shared: Arc::new(CqShared {
                id,
                state: Mutex::new(CqState {
                    ring: Ring::new(depth),
                    depth,
                    armed: None,
                    overflowed: false,
                    events: 0,
                }),
                notify: Notify::new(),
                async_events: events,
                live,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, CqState> {
        self.shared.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn id(&self) -> u32 {
        self.shared.id
    }

    /// The number of entries the CQ was created with.
    pub fn depth(&self) -> u32 {
        self.lock().depth
    }

    /// Takes up to `max` completions, oldest first.
    pub fn poll(&self, max: usize) -> Vec<WorkCompletion> {
        let mut st = self.lock();
        let n = max.min(st.ring.len() as usize);
        (0..n).filter_map(|_| st.ring.pop()).collect()
    }

    /// Takes completions into `out` (appending), returns how many.
    pub fn poll_into(&self, out: &mut Vec<WorkCompletion>, max: usize) -> usize {
        let mut st = self.lock();
        let n = max.min(st.ring.len() as usize);
        out.extend((0..n).filter_map(|_| st.ring.pop()));
        n
    }

    pub fn len(&self) -> usize {
        self.lock().ring.len() as usize
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// True once a completion was lost to overflow; the CQ is then unusable.
    pub fn is_error(&self) -> bool {
        self.lock().overflowed
    }

    /// Arms the CQ: the next matching completion wakes [`Cq::wait`] once. Returns true if
    /// completions are already queued (`IB_CQ_REPORT_MISSED_EVENTS`).
    pub fn req_notify(&self, kind: NotifyKind) -> bool {
        let mut st = self.lock();
        st.armed = Some(kind);
        !st.ring.is_empty()
    }

    /// Number of notifications delivered so far.
    pub fn event_count(&self) -> u64 {
        self.lock().events
    }

    /// Waits for a notification (arm with [`Cq::req_notify`] first, then poll until empty).
    pub async fn wait(&self) {
        self.shared.notify.notified().await;
    }

    /// Waits until the CQ holds at least one completion: arms, re-checks, then waits.
    pub async fn wait_nonempty(&self) {
        loop {
            let notified = self.shared.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.req_notify(NotifyKind::Next) {
                return;
            }
            notified.await;
            if !self.is_empty() {
                return;
            }
        }
    }

    /// Engine side: queue a completion. `solicited` marks a receive of a solicited message.
    pub(crate) fn push(&self, wc: WorkCompletion, solicited: bool) {
        let mut st = self.lock();
        if st.overflowed {
            return;
        }
        // The ring may be larger than requested (power of two); honour the requested depth.
        if st.ring.len() >= st.depth.max(1) || st.ring.is_full() {
            st.overflowed = true;
            drop(st);
            self.shared
                .async_events
                .push(AsyncEvent::CqError { cq: self.shared.id });
            self.shared.notify.notify_one();
            return;
        }
        let error = wc.status != super::types::WcStatus::Success;
        let _ = st.ring.push(wc);
        let fire = match st.armed {
            Some(NotifyKind::Next) => true,
            Some(NotifyKind::Solicited) => solicited || error,
            None => false,
        };
        if fire {
            st.armed = None;
            st.events += 1;
            drop(st);
            self.shared.notify.notify_one();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verbs::types::{WcOpcode, WcStatus};

    fn wc(id: u64) -> WorkCompletion {
        WorkCompletion::new(id, WcStatus::Success, WcOpcode::Send, 1)
    }

    #[test]
    fn poll_and_overflow() {
        let ev = Arc::new(EventQueue::new(8));
        let cq = Cq::new(1, 3, ev.clone(), Arc::new(1.into()));
        for i in 0..3 {
            cq.push(wc(i), false);
        }
        assert!(!cq.is_error());
        cq.push(wc(9), false);
        assert!(cq.is_error());
        assert_eq!(ev.poll(), Some(AsyncEvent::CqError { cq: 1 }));
        let got = cq.poll(2);
        assert_eq!(got.iter().map(|w| w.wr_id).collect::<Vec<_>>(), vec![0, 1]);
    }

    #[test]
    fn notify_solicited_only() {
        let ev = Arc::new(EventQueue::new(8));
        let cq = Cq::new(1, 8, ev, Arc::new(1.into()));
        assert!(!cq.req_notify(NotifyKind::Solicited));
        cq.push(wc(1), false);
        assert_eq!(cq.event_count(), 0);
        cq.push(wc(2), true);
        assert_eq!(cq.event_count(), 1);
        cq.push(wc(3), true);
        assert_eq!(cq.event_count(), 1, "one-shot");
    }

    #[tokio::test]
    async fn async_wait() {
        let ev = Arc::new(EventQueue::new(8));
        let cq = Cq::new(1, 8, ev, Arc::new(1.into()));
        let c2 = cq.clone();
        let h = tokio::spawn(async move {
            c2.wait_nonempty().await;
            c2.poll(1)
        });
        tokio::task::yield_now().await;
        cq.push(wc(7), false);
        assert_eq!(h.await.unwrap()[0].wr_id, 7);
    }
}
