//! Prometheus metrics: a recorder owned by the daemon (not the process-global one, so two
//! targets in one process keep separate counters) and its text exposition.
//!
//! Hot paths hold registered `metrics::Counter`/`Histogram` handles, so recording a
//! command is a few atomic operations with no lookup and no lock.

use std::sync::Arc;

use metrics::{Counter, Gauge, Histogram, Key, Label, Metadata, Recorder};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle, PrometheusRecorder};

/// Latency histogram buckets, in seconds: 10 µs to 10 s.
pub const LATENCY_BUCKETS: [f64; 13] = [
    0.000_01, 0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.01, 0.05, 0.25,
    1.0, 10.0,
];

/// The daemon's metric registry.
#[derive(Clone)]
pub struct Metrics {
    recorder: Arc<PrometheusRecorder>,
    handle: PrometheusHandle,
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
        let recorder = PrometheusBuilder::new()
            .set_buckets(&LATENCY_BUCKETS)
            .expect("the bucket list is not empty")
            .build_recorder();
        let handle = recorder.handle();
        Metrics {
            recorder: Arc::new(recorder),
            handle,
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

    pub fn histogram(&self, name: &'static str, labels: &[(&'static str, String)]) -> Histogram {
        self.recorder
            .register_histogram(&Self::key(name, labels), &METADATA)
    }

    /// Describes a metric (its `# HELP` line).
    pub fn describe(&self, name: &'static str, help: &'static str) {
        self.recorder
            .describe_counter(name.into(), None, help.into());
    }

    /// The Prometheus text exposition format (version 0.0.4).
    pub fn render(&self) -> String {
        self.handle.run_upkeep();
        self.handle.render()
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
            text.contains("rtgt_test_latency_seconds_count{class=\"read\"} 2"),
            "{text}"
        );
        // Two registries do not share counters.
        assert!(!Metrics::new().render().contains("rtgt_test_commands_total"));
    }
}
