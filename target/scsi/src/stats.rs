//! Per-command statistics of a logical unit or a session: plain atomic counters and
//! fixed-bucket latency histograms. Recording a command is a few relaxed atomic additions
//! with no lookup, no lock and no allocation.
//!
//! Whoever exports the statistics implements [`StatsSink`]: it hands out [`IoStats`] and
//! reads them back through [`IoStats::snapshot`] (the daemon's Prometheus exposition does).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Latency histogram buckets, in seconds: 10 µs to 10 s.
pub const LATENCY_BUCKETS: [f64; 13] = [
    0.000_01, 0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.01, 0.05, 0.25,
    1.0, 10.0,
];

/// Command classes of [`IoStats`].
pub const CLASSES: [&str; 3] = ["read", "write", "other"];

/// Error labels of [`IoStats::record`]: the 16 SPC-4 sense keys (Table 49), then `none` for
/// a non-GOOD status without sense data (RESERVATION CONFLICT, BUSY, TASK SET FULL).
pub const ERROR_LABELS: [&str; 17] = [
    "no_sense",
    "recovered_error",
    "not_ready",
    "medium_error",
    "hardware_error",
    "illegal_request",
    "unit_attention",
    "data_protect",
    "blank_check",
    "vendor_specific",
    "copy_aborted",
    "aborted_command",
    "reserved",
    "volume_overflow",
    "miscompare",
    "completed",
    "none",
];

/// Where command statistics are created and exported: the target core asks it for the
/// statistics of each logical unit and session.
pub trait StatsSink: Send + Sync {
    /// New command statistics named after `prefix` with `labels`, exported while the
    /// returned handle lives.
    fn io_stats(&self, prefix: &'static str, labels: &[(&'static str, String)]) -> Arc<IoStats>;
}

/// A latency histogram over [`LATENCY_BUCKETS`]; the last bucket counts what is above them.
#[derive(Default)]
struct Histogram {
    buckets: [AtomicU64; LATENCY_BUCKETS.len() + 1],
    sum_ns: AtomicU64,
}

impl Histogram {
    fn record(&self, seconds: f64) {
        let i = LATENCY_BUCKETS
            .iter()
            .position(|b| seconds <= *b)
            .unwrap_or(LATENCY_BUCKETS.len());
        self.buckets[i].fetch_add(1, Ordering::Relaxed);
        self.sum_ns
            .fetch_add((seconds * 1e9) as u64, Ordering::Relaxed);
    }

    fn snapshot(&self) -> HistogramSnapshot {
        HistogramSnapshot {
            buckets: std::array::from_fn(|i| self.buckets[i].load(Ordering::Relaxed)),
            sum_ns: self.sum_ns.load(Ordering::Relaxed),
        }
    }
}

/// Command statistics of one logical unit or one session: commands and latency by class,
/// bytes each way, errors by sense key.
pub struct IoStats {
    prefix: &'static str,
    labels: Vec<(&'static str, String)>,
    latency: [Histogram; 3],
    read_bytes: AtomicU64,
    written_bytes: AtomicU64,
    errors: [AtomicU64; ERROR_LABELS.len()],
}

/// The counts of one latency histogram: per bucket of [`LATENCY_BUCKETS`] (not cumulative),
/// then the count above the last bucket; and the sum of the latencies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HistogramSnapshot {
    pub buckets: [u64; LATENCY_BUCKETS.len() + 1],
    pub sum_ns: u64,
}

/// The counters of an [`IoStats`] at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IoSnapshot {
    /// Latency by class, indexed like [`CLASSES`].
    pub latency: [HistogramSnapshot; 3],
    pub read_bytes: u64,
    pub written_bytes: u64,
    /// Errors, indexed like [`ERROR_LABELS`].
    pub errors: [u64; ERROR_LABELS.len()],
}

impl IoStats {
    /// Statistics with no command recorded, named after `prefix` and `labels`.
    pub fn new(prefix: &'static str, labels: &[(&'static str, String)]) -> IoStats {
        IoStats {
            prefix,
            labels: labels.to_vec(),
            latency: Default::default(),
            read_bytes: AtomicU64::new(0),
            written_bytes: AtomicU64::new(0),
            errors: Default::default(),
        }
    }

    /// The name prefix of the exported series.
    pub fn prefix(&self) -> &'static str {
        self.prefix
    }

    /// The labels of the exported series.
    pub fn labels(&self) -> &[(&'static str, String)] {
        &self.labels
    }

    /// Records one command: its class (index in [`CLASSES`]), latency, bytes moved and
    /// error (index in [`ERROR_LABELS`]).
    pub fn record(
        &self,
        class: usize,
        seconds: f64,
        written: u64,
        read: u64,
        error: Option<usize>,
    ) {
        self.latency[class % CLASSES.len()].record(seconds);
        if written > 0 {
            self.written_bytes.fetch_add(written, Ordering::Relaxed);
        }
        if read > 0 {
            self.read_bytes.fetch_add(read, Ordering::Relaxed);
        }
        if let Some(e) = error {
            self.errors[e % ERROR_LABELS.len()].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The counters now.
    pub fn snapshot(&self) -> IoSnapshot {
        IoSnapshot {
            latency: std::array::from_fn(|c| self.latency[c].snapshot()),
            read_bytes: self.read_bytes.load(Ordering::Relaxed),
            written_bytes: self.written_bytes.load(Ordering::Relaxed),
            errors: std::array::from_fn(|e| self.errors[e].load(Ordering::Relaxed)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_and_snapshot() {
        let s = IoStats::new("rtgt_lun", &[("backstore", "d0".into())]);
        s.record(0, 0.0002, 0, 4096, None);
        s.record(0, 0.02, 0, 4096, Some(6));
        s.record(1, 100.0, 512, 0, None);
        let snap = s.snapshot();
        assert_eq!(snap.latency[0].buckets.iter().sum::<u64>(), 2);
        assert_eq!(snap.latency[0].buckets[4], 1);
        assert_eq!(snap.latency[1].buckets[LATENCY_BUCKETS.len()], 1);
        assert_eq!((snap.read_bytes, snap.written_bytes), (8192, 512));
        assert_eq!(snap.errors[6], 1);
        assert_eq!(ERROR_LABELS[6], "unit_attention");
        assert_eq!(s.labels(), &[("backstore", "d0".to_string())]);
    }
}
