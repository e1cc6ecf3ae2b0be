//! A deterministic in-process fabric for tests and benchmarks: devices joined by loopback
//! links (optionally through fault injectors), driven on a virtual clock that jumps to the next
//! timer whenever nothing moves.

use std::time::Duration;

use crate::netdev::NetDev;
use crate::verbs::Device;

/// Devices, each with its netdev, and a virtual clock.
pub struct Fabric {
    pub nodes: Vec<(Device, Box<dyn NetDev>)>,
    pub now: Duration,
    /// Virtual time added per busy round (models wire time so timers still fire under load).
    pub tick: Duration,
}

impl Fabric {
    pub fn new() -> Fabric {
        Fabric {
            nodes: Vec::new(),
            now: Duration::ZERO,
            tick: Duration::from_nanos(100),
        }
    }

    pub fn add(&mut self, dev: Device, netdev: Box<dyn NetDev>) {
        self.nodes.push((dev, netdev));
    }

    /// One round over every device; returns the datagrams moved.
    pub fn step(&mut self) -> usize {
        let now = self.now;
        let moved: usize = self
            .nodes
            .iter_mut()
            .map(|(d, n)| d.drive(n.as_mut(), now))
            .sum();
        if moved > 0 {
            self.now += self.tick;
        } else if let Some(next) = self
            .nodes
            .iter()
            .filter_map(|(d, _)| d.next_deadline())
            .min()
        {
            self.now = self.now.max(next);
        }
        moved
    }

    /// Steps until `done` holds or `max_rounds` pass; returns whether `done` held.
    pub fn run_until(&mut self, max_rounds: usize, mut done: impl FnMut() -> bool) -> bool {
        for _ in 0..max_rounds {
            if done() {
                return true;
            }
            let moved = self.step();
            let idle = moved == 0
                && self.nodes.iter().all(|(d, _)| !d.has_work())
                && self.nodes.iter().all(|(d, _)| d.next_deadline().is_none());
            if idle && !done() {
                // Nothing in flight and no timer: one more round cannot change anything.
                self.step();
                return done();
            }
        }
        done()
    }
}

impl Default for Fabric {
    fn default() -> Self {
        Fabric::new()
    }
}
