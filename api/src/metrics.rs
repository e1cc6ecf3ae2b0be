//! Prometheus metrics: a recorder owned by the daemon (not the process-global one, so two
//! targets in one process keep separate counters) and its text exposition.
//!
//! Gauges and occasional counters go through the `metrics` facade and
//! `metrics-exporter-prometheus`. The per-command statistics ([`IoStats`], defined with the
//! target core in `rtgt_scsi::stats`) are plain atomic counters and fixed-bucket histograms
//! that the registry holds weakly: recording a command is a few relaxed atomic additions
//! with no lookup, no lock and no allocation, memory stays bounded whether or not anyone
//! scrapes, and the series of a session disappear with it.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex, Weak};

use metrics::{Counter, Gauge, Key, Label, Metadata, Recorder};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle, PrometheusRecorder};

pub use rtgt_scsi::stats::{IoStats, StatsSink, CLASSES, ERROR_LABELS, LATENCY_BUCKETS};

/// Appends the series of `stats` to `out`.
fn collect(stats: &IoStats, out: &mut Families) {
    let p = stats.prefix();
    let l: String = stats
        .labels()
        .iter()
        .map(|(k, v)| format!("{k}=\"{}\",", escape(v)))
        .collect();
    let snap = stats.snapshot();
    for (c, h) in CLASSES.iter().zip(snap.latency.iter()) {
        let mut cumulative = 0;
        let mut lines = Vec::new();
        for (i, n) in h.buckets.iter().enumerate() {
            cumulative += n;
            let le = LATENCY_BUCKETS
                .get(i)
                .map_or("+Inf".to_string(), |b| b.to_string());
            lines.push(format!(
                "{p}_latency_seconds_bucket{{{l}class=\"{c}\",le=\"{le}\"}} {cumulative}"
            ));
        }
        let sum = h.sum_ns as f64 / 1e9;
        lines.push(format!("{p}_latency_seconds_sum{{{l}class=\"{c}\"}} {sum}"));
        lines.push(format!(
            "{p}_latency_seconds_count{{{l}class=\"{c}\"}} {cumulative}"
        ));
        out.add(format!("{p}_latency_seconds"), "histogram", lines);
        out.add(
            format!("{p}_commands_total"),
            "counter",
            vec![format!(
                "{p}_commands_total{{{l}class=\"{c}\"}} {cumulative}"
            )],
        );
    }
    let bare = l.trim_end_matches(',');
    for (name, v) in [
        ("read_bytes_total", snap.read_bytes),
        ("written_bytes_total", snap.written_bytes),
    ] {
        out.add(
            format!("{p}_{name}"),
            "counter",
            vec![format!("{p}_{name}{{{bare}}} {v}")],
        );
    }
    let errors: Vec<String> = ERROR_LABELS
        .iter()
        .zip(snap.errors.iter())
        .filter(|(_, v)| **v > 0)
        .map(|(k, v)| format!("{p}_errors_total{{{l}sense_key=\"{k}\"}} {v}"))
        .collect();
    out.add(format!("{p}_errors_total"), "counter", errors);
}

/// Samples grouped by metric family, for one `# TYPE` line per family.
#[derive(Default)]
struct Families(BTreeMap<String, (&'static str, Vec<String>)>);

impl Families {
    fn add(&mut self, name: String, kind: &'static str, lines: Vec<String>) {
        self.0
            .entry(name)
            .or_insert_with(|| (kind, Vec::new()))
            .1
            .extend(lines);
    }
}

/// The daemon's metric registry.
#[derive(Clone)]
pub struct Metrics {
    recorder: Arc<PrometheusRecorder>,
    handle: PrometheusHandle,
    io: Arc<Mutex<Vec<Weak<IoStats>>>>,
}

static METADATA: Metadata<'static> =
    Metadata::new(module_path!(), metrics::Level::INFO, Some(module_path!()));

/// A label value in the text format (backslash, quote and newline escaped).
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

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
            io: Arc::new(Mutex::new(Vec::new())),
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

    /// New command statistics named `<prefix>_commands_total`, `<prefix>_latency_seconds`,
    /// `<prefix>_read_bytes_total`, `<prefix>_written_bytes_total` and
    /// `<prefix>_errors_total`, exported while the returned handle lives.
    pub fn io_stats(
        &self,
        prefix: &'static str,
        labels: &[(&'static str, String)],
    ) -> Arc<IoStats> {
        let stats = Arc::new(IoStats::new(prefix, labels));
        let mut io = self.io.lock().unwrap_or_else(|e| e.into_inner());
        io.retain(|w| w.strong_count() > 0);
        io.push(Arc::downgrade(&stats));
        stats
    }

    /// The Prometheus text exposition format (version 0.0.4).
    pub fn render(&self) -> String {
        self.handle.run_upkeep();
        let mut out = self.handle.render();
        let mut families = Families::default();
        {
            let mut io = self.io.lock().unwrap_or_else(|e| e.into_inner());
            io.retain(|w| match w.upgrade() {
                Some(s) => {
                    collect(&s, &mut families);
                    true
                }
                None => false,
            });
        }
        for (name, (kind, lines)) in families.0 {
            if lines.is_empty() {
                continue;
            }
            let _ = writeln!(out, "# TYPE {name} {kind}");
            for l in lines {
                out.push_str(&l);
                out.push('\n');
            }
            out.push('\n');
        }
        out
    }
}

impl StatsSink for Metrics {
    fn io_stats(&self, prefix: &'static str, labels: &[(&'static str, String)]) -> Arc<IoStats> {
        Metrics::io_stats(self, prefix, labels)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_counters_gauges_and_io_stats() {
        let m = Metrics::new();
        m.counter("rtgt_test_total", &[("a", "1".into())])
            .increment(3);
        m.gauge("rtgt_test_gauge", &[]).set(2.0);
        let s = m.io_stats("rtgt_lun", &[("backstore", "d\"0".into())]);
        s.record(0, 0.0002, 0, 4096, None);
        s.record(0, 0.02, 0, 4096, Some(6));
        s.record(1, 100.0, 512, 0, None);
        let text = m.render();
        for want in [
            "rtgt_test_total{a=\"1\"} 3",
            "rtgt_test_gauge 2",
            "# TYPE rtgt_lun_latency_seconds histogram",
            "rtgt_lun_latency_seconds_bucket{backstore=\"d\\\"0\",class=\"read\",le=\"0.00025\"} 1",
            "rtgt_lun_latency_seconds_bucket{backstore=\"d\\\"0\",class=\"read\",le=\"+Inf\"} 2",
            "rtgt_lun_latency_seconds_count{backstore=\"d\\\"0\",class=\"write\"} 1",
            "rtgt_lun_latency_seconds_bucket{backstore=\"d\\\"0\",class=\"write\",le=\"10\"} 0",
            "rtgt_lun_commands_total{backstore=\"d\\\"0\",class=\"read\"} 2",
            "rtgt_lun_read_bytes_total{backstore=\"d\\\"0\"} 8192",
            "rtgt_lun_written_bytes_total{backstore=\"d\\\"0\"} 512",
            "rtgt_lun_errors_total{backstore=\"d\\\"0\",sense_key=\"unit_attention\"} 1",
        ] {
            assert!(text.contains(want), "{want} missing from\n{text}");
        }
        assert_eq!(text.matches("# TYPE rtgt_lun_commands_total").count(), 1);
        // Dropped statistics leave the exposition; other registries never had them.
        drop(s);
        assert!(!m.render().contains("rtgt_lun_"));
        assert!(!Metrics::new().render().contains("rtgt_test_total"));
    }
}
