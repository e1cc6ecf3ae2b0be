//! What the processes exporting one logical unit share ([`rtgt_backstore::SharedState`]):
//! its persistent reservations and, when its target port groups are configured, their
//! access states, so that every gateway reports the same states and a change through one
//! (SET TARGET PORT GROUPS, the API) reaches the initiators of all.
//!
//! One text document: the reservation state as [`pr::encode`] writes it, then one line per
//! target port group, `tpg <id> <state name> <status code>`. A document without `tpg` lines
//! has no shared states yet: the first process with configured groups writes its own.

use std::fmt::Write;

use crate::alua::{AccessState, Changed, GroupState};
use crate::pr::{self, PrState};

/// The shared state of one logical unit.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct SharedDoc {
    pub(crate) pr: PrState,
    /// Empty: not shared yet.
    pub(crate) groups: Vec<GroupState>,
}

/// The document's bytes.
pub(crate) fn encode(doc: &SharedDoc) -> Vec<u8> {
    let mut s = pr::encode(&doc.pr);
    for g in &doc.groups {
        let _ = writeln!(s, "tpg {} {} {}", g.id, g.state.name(), g.changed as u8);
    }
    s.into_bytes()
}

/// Parses [`encode`]'s output; empty bytes are an empty state (never written).
pub(crate) fn decode(bytes: &[u8]) -> Result<SharedDoc, String> {
    if bytes.is_empty() {
        return Ok(SharedDoc::default());
    }
    let text = std::str::from_utf8(bytes).map_err(|_| "not UTF-8".to_string())?;
    let mut rest = String::with_capacity(text.len());
    let mut groups: Vec<GroupState> = Vec::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.first() != Some(&"tpg") {
            rest.push_str(line);
            rest.push('\n');
            continue;
        }
        let bad = || format!("target port group line {line:?}");
        let [_, id, state, changed] = f.as_slice() else {
            return Err(bad());
        };
        let g = GroupState {
            id: id.parse().map_err(|_| bad())?,
            state: AccessState::from_name(state).ok_or_else(bad)?,
            changed: changed
                .parse()
                .ok()
                .and_then(Changed::from_code)
                .ok_or_else(bad)?,
        };
        if groups.iter().any(|o| o.id == g.id) {
            return Err(format!("target port group {} listed twice", g.id));
        }
        groups.push(g);
    }
    Ok(SharedDoc {
        pr: pr::decode(&rest)?,
        groups,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documents_round_trip_and_bad_group_lines_are_refused() {
        assert_eq!(decode(b""), Ok(SharedDoc::default()));
        let doc = SharedDoc {
            pr: PrState {
                generation: 7,
                ..PrState::default()
            },
            groups: vec![
                GroupState {
                    id: 1,
                    state: AccessState::Standby,
                    changed: Changed::Implicitly,
                },
                GroupState {
                    id: 2,
                    state: AccessState::ActiveOptimized,
                    changed: Changed::Explicitly,
                },
            ],
        };
        let bytes = encode(&doc);
        assert!(String::from_utf8_lossy(&bytes).contains("tpg 2 active_optimized 1\n"));
        assert_eq!(decode(&bytes), Ok(doc.clone()));
        // Reservation-only documents (no groups) still parse.
        let pr_only = pr::encode(&doc.pr);
        assert_eq!(decode(pr_only.as_bytes()).unwrap().groups, vec![]);
        for bad in [
            "tpg 1 active_optimized",
            "tpg x standby 0",
            "tpg 1 active 0",
            "tpg 1 standby 3",
            "tpg 70000 standby 0",
        ] {
            let text = format!("{pr_only}{bad}\n");
            assert!(decode(text.as_bytes()).is_err(), "{bad}");
        }
        let twice = format!("{pr_only}tpg 1 standby 0\ntpg 1 standby 0\n");
        assert!(decode(twice.as_bytes()).unwrap_err().contains("twice"));
    }
}
