//! The device's queue of asynchronous events (IBA 11.6.3): CQ errors, fatal QP errors, SQ
//! drained, last WQE reached, SRQ limit reached. CQs post to it, so it lives apart from the
//! device that owns it.

use std::collections::VecDeque;
use std::sync::Mutex;

use super::types::AsyncEvent;

/// Bounded queue of asynchronous events.
#[derive(Debug)]
pub struct EventQueue {
    q: Mutex<VecDeque<AsyncEvent>>,
    cap: usize,
}

impl EventQueue {
    pub(crate) fn new(cap: usize) -> EventQueue {
        EventQueue {
            q: Mutex::new(VecDeque::new()),
            cap,
        }
    }

    pub(crate) fn push(&self, ev: AsyncEvent) {
        let mut q = self.q.lock().unwrap_or_else(|e| e.into_inner());
        if q.len() < self.cap {
            q.push_back(ev);
        }
    }

    /// The oldest pending event.
    pub fn poll(&self) -> Option<AsyncEvent> {
        self.q.lock().unwrap_or_else(|e| e.into_inner()).pop_front()
    }
}
