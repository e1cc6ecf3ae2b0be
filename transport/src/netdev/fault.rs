//! A deterministic fault injector around a netdev (after smoltcp's `FaultInjector`): on
//! transmit it drops, duplicates, corrupts, reorders or delays datagrams with given
//! probabilities, drawn from a seeded xorshift generator so a failing run can be replayed.
//!
//! Reordering holds a datagram back and sends it after the next one; delay holds it back for a
//! number of later transmissions (or until [`FaultInjector::flush`]). Held datagrams are bounded.

use std::collections::VecDeque;
use std::io;

use super::NetDev;

/// Fault probabilities in parts per million.
#[derive(Debug, Clone, Copy, Default)]
pub struct FaultConfig {
    pub drop_ppm: u32,
    pub duplicate_ppm: u32,
    pub corrupt_ppm: u32,
    pub reorder_ppm: u32,
    pub delay_ppm: u32,
    /// How many later transmissions a delayed datagram waits for.
    pub delay_packets: u32,
}

impl FaultConfig {
    /// The same probability (in percent) for every fault.
    pub fn uniform(percent: f64) -> FaultConfig {
        let ppm = (percent * 10_000.0) as u32;
        FaultConfig {
            drop_ppm: ppm,
            duplicate_ppm: ppm,
            corrupt_ppm: ppm,
            reorder_ppm: ppm,
            delay_ppm: ppm,
            delay_packets: 8,
        }
    }
}

/// Counters of injected faults.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FaultStats {
    pub dropped: u64,
    pub duplicated: u64,
    pub corrupted: u64,
    pub reordered: u64,
    pub delayed: u64,
}

/// Wraps a netdev and injects faults on transmit.
#[derive(Debug)]
pub struct FaultInjector<D> {
    inner: D,
    config: FaultConfig,
    rng: u64,
    held: VecDeque<(u32, Vec<u8>)>,
    pub stats: FaultStats,
}

const MAX_HELD: usize = 64;

impl<D: NetDev> FaultInjector<D> {
    pub fn new(inner: D, config: FaultConfig, seed: u64) -> FaultInjector<D> {
        FaultInjector {
            inner,
            config,
            rng: seed | 1,
            held: VecDeque::new(),
            stats: FaultStats::default(),
        }
    }

    pub fn inner(&self) -> &D {
        &self.inner
    }

    fn next(&mut self) -> u64 {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng
    }

    fn chance(&mut self, ppm: u32) -> bool {
        ppm > 0 && (self.next() % 1_000_000) < u64::from(ppm)
    }

    /// Sends every held datagram now.
    pub fn flush(&mut self) -> io::Result<()> {
        while let Some((_, d)) = self.held.pop_front() {
            self.inner.transmit(&d)?;
        }
        Ok(())
    }

    fn release(&mut self) -> io::Result<()> {
        let mut i = 0;
        while i < self.held.len() {
            if self.held[i].0 == 0 {
                if let Some((_, d)) = self.held.remove(i) {
                    self.inner.transmit(&d)?;
                }
            } else {
                self.held[i].0 -= 1;
                i += 1;
            }
        }
        Ok(())
    }
}

impl<D: NetDev> NetDev for FaultInjector<D> {
    fn transmit(&mut self, datagram: &[u8]) -> io::Result<()> {
        let c = self.config;
        if self.chance(c.drop_ppm) {
            self.stats.dropped += 1;
            return self.release();
        }
        let mut data = datagram.to_vec();
        if self.chance(c.corrupt_ppm) && !data.is_empty() {
            let at = (self.next() as usize) % data.len();
            let bit = 1u8 << (self.next() % 8);
            data[at] ^= bit;
            self.stats.corrupted += 1;
        }
        let copies = if self.chance(c.duplicate_ppm) {
            self.stats.duplicated += 1;
            2
        } else {
            1
        };
        if self.held.len() < MAX_HELD {
            if self.chance(c.reorder_ppm) {
                self.stats.reordered += 1;
                self.held.push_back((1, data));
                return Ok(());
            }
            if self.chance(c.delay_ppm) {
                self.stats.delayed += 1;
                self.held.push_back((c.delay_packets.max(1), data));
                return Ok(());
            }
        }
        for _ in 0..copies {
            self.inner.transmit(&data)?;
        }
        self.release()
    }

    fn receive(&mut self) -> io::Result<Option<Vec<u8>>> {
        let got = self.inner.receive()?;
        if got.is_none() && !self.held.is_empty() {
            // Nothing else is moving: let held datagrams out so the link never stalls.
            self.flush()?;
        }
        Ok(got)
    }

    fn tx_ports(&self) -> Option<(u16, u16)> {
        self.inner.tx_ports()
    }
}

impl<D: super::AsyncNetDev> super::AsyncNetDev for FaultInjector<D> {
    fn readable(&self) -> impl std::future::Future<Output = io::Result<()>> + Send + '_ {
        self.inner.readable()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::netdev::loopback::pair;

    #[test]
    fn deterministic_faults() {
        let run = |seed| {
            let (a, mut b) = pair(10_000);
            let mut f = FaultInjector::new(a, FaultConfig::uniform(10.0), seed);
            for i in 0..1000u32 {
                f.transmit(&i.to_be_bytes()).unwrap();
            }
            f.flush().unwrap();
            let mut got = Vec::new();
            while let Some(d) = b.receive().unwrap() {
                got.push(d);
            }
            (got, f.stats)
        };
        let (g1, s1) = run(7);
        let (g2, s2) = run(7);
        assert_eq!(g1, g2);
        assert_eq!(s1, s2);
        assert!(s1.dropped > 50 && s1.duplicated > 50 && s1.corrupted > 50);
        assert!(s1.reordered > 20 && s1.delayed > 20);
    }
}
