//! The LUN map of a live I_T nexus, which an administrator may change while commands run,
//! and the per-command metrics recorded on the way through.
//!
//! A command takes a snapshot of the map (one uncontended read lock and a reference count)
//! and runs against it, so a change never alters the map under a command in flight; the
//! next command sees the new map.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};
use std::time::Instant;

use crate::stats::IoStats;

use crate::sense::Sense;
use crate::{Command, LunMap, Nexus, Response, Status, UnitAttention};

/// Index in [`crate::stats::CLASSES`]: read, write or other.
fn class_of(opcode: u8) -> usize {
    match opcode {
        // READ(6/10/12/16).
        0x08 | 0x28 | 0xa8 | 0x88 => 0,
        // WRITE(6/10/12/16), WRITE AND VERIFY(10/12/16), WRITE SAME(10/16), COMPARE AND
        // WRITE, WRITE ATOMIC(16).
        0x0a | 0x2a | 0xaa | 0x8a | 0x2e | 0xae | 0x8e | 0x41 | 0x93 | 0x89 | 0x9c => 1,
        _ => 2,
    }
}

/// Index in [`crate::stats::ERROR_LABELS`] of a response's error: its sense key, or
/// `none` for a non-GOOD status without sense data.
fn error_of(resp: &Response) -> Option<usize> {
    match resp.status {
        Status::Good => None,
        Status::CheckCondition => Some(
            resp.sense
                .as_deref()
                .and_then(Sense::parse)
                .map_or(0, |(k, _, _)| usize::from(k & 0x0f)),
        ),
        _ => Some(16),
    }
}

/// Command statistics of one logical unit or one session.
pub type IoMetrics = IoStats;

fn record(m: &IoStats, class: usize, seconds: f64, written: u64, resp: &Response) {
    let read = resp.data_in_len();
    m.record(class, seconds, written, read, error_of(resp));
}

/// A LUN map with the metrics of its logical units.
pub struct LunView {
    pub map: LunMap,
    lun_metrics: BTreeMap<u64, Arc<IoMetrics>>,
}

/// The LUN map of one I_T nexus, replaceable while the nexus runs.
pub struct LiveLuns {
    current: RwLock<Arc<LunView>>,
    session: Option<Arc<IoMetrics>>,
    registry: Option<Arc<super::Registry>>,
}

impl LiveLuns {
    /// A map whose commands are counted in `registry`'s metrics (when it has any), per
    /// logical unit and, with `session_labels`, per session.
    pub fn new(
        map: LunMap,
        registry: Option<Arc<super::Registry>>,
        session_labels: Option<Vec<(&'static str, String)>>,
    ) -> LiveLuns {
        let metrics = registry.as_ref().and_then(|r| r.metrics());
        let session = match (&metrics, session_labels) {
            (Some(m), Some(labels)) => Some(m.io_stats("rtgt_session", &labels)),
            _ => None,
        };
        let view = Self::view(map, registry.as_deref());
        LiveLuns {
            current: RwLock::new(Arc::new(view)),
            session,
            registry,
        }
    }

    fn view(map: LunMap, registry: Option<&super::Registry>) -> LunView {
        let lun_metrics = match registry {
            Some(r) => map
                .luns
                .iter()
                .filter_map(|(l, d)| r.lun_metrics(&d.config().name).map(|m| (*l, m)))
                .collect(),
            None => BTreeMap::new(),
        };
        LunView { map, lun_metrics }
    }

    /// The map now in force.
    pub fn current(&self) -> Arc<LunView> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Replaces the map; returns the previous one.
    pub fn replace(&self, map: LunMap) -> Arc<LunView> {
        let view = Arc::new(Self::view(map, self.registry.as_deref()));
        std::mem::replace(
            &mut *self.current.write().unwrap_or_else(|e| e.into_inner()),
            view,
        )
    }

    /// Replaces the map of `nexus`'s session when `map` differs from the current one: logical
    /// units no longer mapped lose the nexus, the mapped ones get REPORTED LUNS DATA HAS
    /// CHANGED. Returns whether it changed.
    pub fn remap(&self, nexus: &Nexus, map: LunMap) -> bool {
        let old = self.current();
        let same = old.map.luns.len() == map.luns.len()
            && old
                .map
                .luns
                .iter()
                .zip(map.luns.iter())
                .all(|((la, da), (lb, db))| la == lb && Arc::ptr_eq(da, db));
        if same {
            return false;
        }
        let devices: Vec<_> = map.luns.values().cloned().collect();
        self.replace(map);
        for d in old.map.luns.values() {
            if !devices.iter().any(|n| Arc::ptr_eq(n, d)) {
                d.nexus_loss(nexus);
            }
        }
        for d in &devices {
            d.unit_attention(nexus, UnitAttention::ReportedLunsChanged);
        }
        true
    }

    /// Executes a command against the current map, recording its metrics.
    pub async fn execute(&self, nexus: &Nexus, lun: u64, cmd: Command) -> Response {
        self.execute_ranged(nexus, lun, cmd, false).await
    }

    /// Like [`LiveLuns::execute`]; with `range_ok` a READ may answer with a file range
    /// ([`crate::Device::execute_ranged`]).
    pub async fn execute_ranged(
        &self,
        nexus: &Nexus,
        lun: u64,
        cmd: Command,
        range_ok: bool,
    ) -> Response {
        let view = self.current();
        let lun_metrics = view.lun_metrics.get(&lun);
        if lun_metrics.is_none() && self.session.is_none() {
            return view.map.execute_ranged(nexus, lun, cmd, range_ok).await;
        }
        let class = class_of(cmd.cdb.first().copied().unwrap_or(0xff));
        let written = cmd.data_out.as_ref().map_or(0, |b| b.len() as u64);
        let start = Instant::now();
        let resp = view.map.execute_ranged(nexus, lun, cmd, range_ok).await;
        let seconds = start.elapsed().as_secs_f64();
        if let Some(m) = lun_metrics {
            record(m, class, seconds, written, &resp);
        }
        if let Some(m) = &self.session {
            record(m, class, seconds, written, &resp);
        }
        resp
    }
}

impl LunView {
    /// Whether `lun` is mapped.
    pub fn contains(&self, lun: u64) -> bool {
        self.map.luns.contains_key(&lun)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes() {
        use crate::stats::{CLASSES, ERROR_LABELS};
        assert_eq!(CLASSES[class_of(0x28)], "read");
        assert_eq!(CLASSES[class_of(0x8a)], "write");
        assert_eq!(CLASSES[class_of(0x12)], "other");
        let check = Response::check(&Sense::illegal((0x24, 0)));
        assert_eq!(
            error_of(&check).map(|e| ERROR_LABELS[e]),
            Some("illegal_request")
        );
    }
}
