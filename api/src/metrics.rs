//! Prometheus metrics: a recorder owned by the daemon (not the process-global one, so two
//! targets in one process keep separate counters) and its text exposition.
//!
//! Hot paths hold registered `metrics::Counter` handles and [`Histogram`]s, so recording a
//! command is a few atomic operations with no lookup, no lock and no allocation. Histograms
//! are fixed buckets of atomic counters rather than the exporter's own (which keep every
//! sample until the next scrape: unbounded memory when nobody scrapes).

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use metrics::{Counter, Gauge, Key, Label, Metadata, Recorder};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle, PrometheusRecorder};

/// Latency histogram buckets, in seconds: 10 µs to 10 s.
pub const LATENCY_BUCKETS: [f64; 13] = [
    0.000_01, 0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.01, 0.05, 0.25,
    1.0, 10.0,
];

/// A latency histogram over [`LATENCY_BUCKETS`]: bounded memory, lock-free recording.
pub struct Histogram {
    buckets: [AtomicU64; LATENCY_BUCKETS.len()],
    count: AtomicU64,
    sum_ns: AtomicU64,
}

impl Histogram {
    fn new() -> Histogram {
        Histogram {
            buckets: Default::default(),
            count: AtomicU64::new(0),
            sum_ns: AtomicU64::new(0),
        }
    }

    pub fn record(&self, seconds: f64) {
        if let Some(i) = LATENCY_BUCKETS.iter().position(|b| seconds <= *b) {
            self.buckets[i].fetch_add(1, Ordering::Relaxed);
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_ns
            .fetch_add((seconds * 1e9) as u64, Ordering::Relaxed);
    }
}

struct HistogramEntry {
    name: &'static str,
    labels: Vec<(&'static str, String)>,
    histogram: Arc<Histogram>,
}

/// The daemon's metric registry.
#[derive(Clone)]
pub struct Metrics {
    recorder: Arc<PrometheusRecorder>,
    handle: PrometheusHandle,
    histograms: Arc<Mutex<Vec<HistogramEntry>>>,
}

/// A label value in the text format (backslash, quote and newline escaped).
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

static METADATA: Metadata<'static> =
    Metadata::new(module_path!(), metrics::Level::INFO, Some(module_path!()));

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let recorder = PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        Metrics {
            recorder: Arc::new(recorder),
            handle,
            histograms: Arc::new(Mutex::new(Vec::new())),
        }
    }

    fn key(name: &'static str, labels: &[(&'static str, String)]) -> Key {
        let labels: Vec<Label> = labels
            .iter()
            .map(|(k, v)| Label::new(*k, v.clone()))
            .collect();
        Key::from_parts(name, labels)
    }

    pub fn counter(&self, name: &'static str, labels: &[(&'static str, String)]) -> Counter {
        self.recorder
            .register_counter(&Self::key(name, labels), &METADATA)
    }

    pub fn gauge(&self, name: &'static str, labels: &[(&'static str, String)]) -> Gauge {
        self.recorder
            .register_gauge(&Self::key(name, labels), &METADATA)
    }

    /// The histogram `name` with `labels`, created at the first call.
    pub fn histogram(
        &self,
        name: &'static str,
        labels: &[(&'static str, String)],
    ) -> Arc<Histogram> {
        let mut all = self.histograms.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(e) = all.iter().find(|e| e.name == name && e.labels == labels) {
            return e.histogram.clone();
        }
        let histogram = Arc::new(Histogram::new());
        all.push(HistogramEntry {
            name,
            labels: labels.to_vec(),
            histogram: histogram.clone(),
        });
        histogram
    }

    /// Describes a metric (its `# HELP` line).
    pub fn describe(&self, name: &'static str, help: &'static str) {
        self.recorder
            .describe_counter(name.into(), None, help.into());
    }

    /// The Prometheus text exposition format (version 0.0.4).
    pub fn render(&self) -> String {
        self.handle.run_upkeep();
        let mut out = self.handle.render();
        let all = self.histograms.lock().unwrap_or_else(|e| e.into_inner());
        let mut names: Vec<&'static str> = all.iter().map(|e| e.name).collect();
        names.dedup();
        names.sort_unstable();
        names.dedup();
        for name in names {
            let _ = writeln!(out, "# TYPE {name} histogram");
            for e in all.iter().filter(|e| e.name == name) {
                let labels: String = e
                    .labels
                    .iter()
                    .map(|(k, v)| format!("{k}=\"{}\",", escape(v)))
                    .collect();
                let h = &e.histogram;
                let mut cumulative = 0;
                for (b, n) in LATENCY_BUCKETS.iter().zip(h.buckets.iter()) {
                    cumulative += n.load(Ordering::Relaxed);
                    let _ = writeln!(out, "{name}_bucket{{{labels}le=\"{b}\"}} {cumulative}");
                }
                let count = h.count.load(Ordering::Relaxed);
                let _ = writeln!(out, "{name}_bucket{{{labels}le=\"+Inf\"}} {count}");
                let bare = labels.trim_end_matches(',');
                let sum = h.sum_ns.load(Ordering::Relaxed) as f64 / 1e9;
                let _ = writeln!(out, "{name}_sum{{{bare}}} {sum}");
                let _ = writeln!(out, "{name}_count{{{bare}}} {count}");
            }
            out.push('\n');
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_counters_and_histograms() {
        let m = Metrics::new();
        m.describe("rtgt_test_commands_total", "Commands.");
        let c = m.counter("rtgt_test_commands_total", &[("lun", "0".into())]);
        c.increment(3);
        let h = m.histogram("rtgt_test_latency_seconds", &[("class", "read".into())]);
        h.record(0.0002);
        h.record(0.02);
        let text = m.render();
        assert!(
            text.contains("rtgt_test_commands_total{lun=\"0\"} 3"),
            "{text}"
        );
        assert!(
            text.contains("rtgt_test_latency_seconds_bucket{class=\"read\",le=\"0.00025\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("rtgt_test_latency_seconds_bucket{class=\"read\",le=\"+Inf\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("rtgt_test_latency_seconds_count{class=\"read\"} 2"),
            "{text}"
        );
        assert!(text.contains("# TYPE rtgt_test_latency_seconds histogram"));
        // The same name and labels give the same histogram.
        m.histogram("rtgt_test_latency_seconds", &[("class", "read".into())])
            .record(1.0);
        assert!(m
            .render()
            .contains("rtgt_test_latency_seconds_count{class=\"read\"} 3"));
        assert_eq!(escape("a\"b\\c"), "a\\\"b\\\\c");
        // Two registries do not share counters.
        assert!(!Metrics::new().render().contains("rtgt_test_commands_total"));
    }
}
