//! When a loop polls before it sleeps (adaptive busy polling).
//!
//! Waking a sleeping thread costs more than the rest of a small I/O, so a loop that just did
//! work keeps trying for a while before it sleeps: the next request of a busy peer then costs
//! no wake-up. Polling pays only when that next request comes within the window; for peers
//! slower than that (a host with a few outstanding commands, an emulated guest) every window
//! is CPU burnt for nothing. So a loop stops polling after a number of windows in a row ran
//! out with nothing found, and polls again as soon as, after a sleep, work resumed within the
//! window.

use std::time::Duration;

/// The polling state of one loop.
#[derive(Debug, Clone)]
pub struct PollBudget {
    window: Duration,
    /// Fruitless windows in a row that stop polling.
    tolerance: u8,
    misses: u8,
}

impl PollBudget {
    /// Polls for up to `window` after the last work (never when zero) until `tolerance`
    /// windows in a row found nothing (at least one).
    pub fn new(window: Duration, tolerance: u8) -> PollBudget {
        PollBudget {
            window,
            tolerance: tolerance.max(1),
            misses: 0,
        }
    }

    /// Whether the loop polls before it sleeps.
    pub fn armed(&self) -> bool {
        !self.window.is_zero() && self.misses < self.tolerance
    }

    /// How long the loop polls after its last work now: the window when armed, else zero.
    pub fn window(&self) -> Duration {
        if self.armed() {
            self.window
        } else {
            Duration::ZERO
        }
    }

    /// Polling found work within the window.
    pub fn hit(&mut self) {
        self.misses = 0;
    }

    /// A window ran out with nothing found.
    pub fn expired(&mut self) {
        self.misses = self.misses.saturating_add(1);
    }

    /// Work resumed `idle` after the last work, the loop having slept: within the window,
    /// polling would have found it.
    pub fn resumed_after(&mut self, idle: Duration) {
        if idle <= self.window {
            self.hit();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn polling_stops_after_fruitless_windows_and_resumes_for_a_fast_peer() {
        let us = Duration::from_micros;
        let mut p = PollBudget::new(us(50), 3);
        assert!(p.armed());
        assert_eq!(p.window(), us(50));
        // Late requests in a busy stream do not stop polling.
        p.expired();
        p.expired();
        p.hit();
        p.expired();
        p.expired();
        assert!(p.armed());
        // Three in a row do.
        p.expired();
        assert!(!p.armed());
        assert_eq!(p.window(), Duration::ZERO);
        // A slow peer keeps it off, a fast one turns it back on.
        p.resumed_after(us(300));
        assert!(!p.armed());
        p.resumed_after(us(50));
        assert!(p.armed());
        // A zero window never polls.
        let mut off = PollBudget::new(Duration::ZERO, 1);
        assert!(!off.armed());
        off.resumed_after(Duration::ZERO);
        assert!(!off.armed());
    }
}
