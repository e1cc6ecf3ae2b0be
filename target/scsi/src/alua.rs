//! Asymmetric logical unit access (SPC-4 5.16): the target port groups a logical unit is
//! reached through, the access state of each, REPORT TARGET PORT GROUPS (6.37), SET TARGET
//! PORT GROUPS (6.46), and which commands each state processes.
//!
//! A logical unit either has its groups configured ([`AluaConfig::groups`]: every port of
//! every process that exports it, so that two processes report the same groups), or learns
//! them: each I_T nexus brings its target port group and relative target port, in the
//! active/optimized state, with implicit and explicit changes allowed (as Linux's target does
//! for its default group).

use super::cdb::{be, field, put_be32};
use super::sense::{asc, key, Sense};
use super::table::{CmdDesc, Op};
use super::{CmdResult, Ctx, Done, Nexus};

/// A target port asymmetric access state (SPC-4 5.16.2.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AccessState {
    ActiveOptimized,
    ActiveNonOptimized,
    Standby,
    Unavailable,
    Offline,
    Transitioning,
}

impl AccessState {
    pub const ALL: [AccessState; 6] = [
        AccessState::ActiveOptimized,
        AccessState::ActiveNonOptimized,
        AccessState::Standby,
        AccessState::Unavailable,
        AccessState::Offline,
        AccessState::Transitioning,
    ];

    /// The ASYMMETRIC ACCESS STATE code.
    pub fn code(self) -> u8 {
        match self {
            AccessState::ActiveOptimized => 0x0,
            AccessState::ActiveNonOptimized => 0x1,
            AccessState::Standby => 0x2,
            AccessState::Unavailable => 0x3,
            AccessState::Offline => 0xe,
            AccessState::Transitioning => 0xf,
        }
    }

    pub fn from_code(code: u8) -> Option<AccessState> {
        AccessState::ALL.into_iter().find(|s| s.code() == code)
    }

    /// The name the configuration and the API use.
    pub fn name(self) -> &'static str {
        match self {
            AccessState::ActiveOptimized => "active_optimized",
            AccessState::ActiveNonOptimized => "active_non_optimized",
            AccessState::Standby => "standby",
            AccessState::Unavailable => "unavailable",
            AccessState::Offline => "offline",
            AccessState::Transitioning => "transitioning",
        }
    }

    pub fn from_name(name: &str) -> Option<AccessState> {
        AccessState::ALL.into_iter().find(|s| s.name() == name)
    }

    /// The sense a command this state does not process ends with, or `None` when it is
    /// processed. Standby also answers READ CAPACITY, as Linux's target does, so that a host
    /// sizes the disk on a standby path.
    pub fn refuses(self, desc: &CmdDesc) -> Option<Sense> {
        let op = desc.op;
        let always = matches!(
            op,
            Op::Inquiry | Op::ReportLuns | Op::RequestSense | Op::ReportTargetPortGroups
        );
        let (allowed, code) = match self {
            AccessState::ActiveOptimized | AccessState::ActiveNonOptimized => return None,
            AccessState::Standby => (
                always
                    || matches!(
                        op,
                        Op::ModeSense
                            | Op::ModeSelect
                            | Op::SetTargetPortGroups
                            | Op::PrIn
                            | Op::PrOut
                            | Op::ReadCapacity10
                            | Op::ReadCapacity16
                    ),
                asc::ALUA_STANDBY,
            ),
            AccessState::Unavailable => (
                always || op == Op::SetTargetPortGroups,
                asc::ALUA_UNAVAILABLE,
            ),
            AccessState::Offline => (always, asc::LU_OFFLINE),
            AccessState::Transitioning => (always, asc::ALUA_TRANSITION),
        };
        (!allowed).then(|| Sense::new(key::NOT_READY, code))
    }

    /// Whether it processes reads and writes.
    pub fn is_active(self) -> bool {
        matches!(
            self,
            AccessState::ActiveOptimized | AccessState::ActiveNonOptimized
        )
    }

    /// Its bit among the supported states of a target port group descriptor (byte 1).
    fn sup_bit(self) -> u8 {
        match self {
            AccessState::ActiveOptimized => 0x01,
            AccessState::ActiveNonOptimized => 0x02,
            AccessState::Standby => 0x04,
            AccessState::Unavailable => 0x08,
            AccessState::Offline => 0x40,
            AccessState::Transitioning => 0x80,
        }
    }
}

/// One target port group of a logical unit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortGroup {
    pub id: u16,
    /// Relative target port identifiers of its ports, those other processes serve included.
    pub relative_ports: Vec<u16>,
    pub state: AccessState,
    /// PREF: the preferred group for this logical unit.
    pub preferred: bool,
    /// The state may change without SET TARGET PORT GROUPS (the API, a cluster manager).
    pub implicit: bool,
    /// SET TARGET PORT GROUPS may change the state.
    pub explicit: bool,
}

impl PortGroup {
    /// A group learned from an I_T nexus: active/optimized, both kinds of change allowed.
    fn learned(id: u16, port: u16) -> PortGroup {
        PortGroup {
            id,
            relative_ports: vec![port],
            state: AccessState::ActiveOptimized,
            preferred: false,
            implicit: true,
            explicit: true,
        }
    }
}

/// The target port groups of a logical unit.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AluaConfig {
    /// Empty: learned from the I_T nexuses (see the module documentation).
    pub groups: Vec<PortGroup>,
    /// IMPLICIT TRANSITION TIME reported by REPORT TARGET PORT GROUPS, in seconds.
    pub transition_secs: u8,
}

impl AluaConfig {
    /// The TPGS field of standard INQUIRY data (bits 5:4 of byte 5).
    pub fn tpgs(&self) -> u8 {
        if self.groups.is_empty() {
            return 0x30;
        }
        let implicit = self.groups.iter().any(|g| g.implicit);
        let explicit = self.groups.iter().any(|g| g.explicit);
        (u8::from(implicit) << 4) | (u8::from(explicit) << 5)
    }

    /// Checks group IDs and relative port IDs for duplicates.
    pub fn validate(&self) -> Result<(), String> {
        let mut ids = std::collections::HashSet::new();
        let mut ports = std::collections::HashSet::new();
        for g in &self.groups {
            if !ids.insert(g.id) {
                return Err(format!("target port group {} is listed twice", g.id));
            }
            for p in &g.relative_ports {
                if *p == 0 || !ports.insert(*p) {
                    return Err(format!(
                        "relative target port {p} is zero or in more than one group"
                    ));
                }
            }
        }
        Ok(())
    }
}

/// Why a group's state last changed (STATUS CODE of its descriptor).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Changed {
    Not = 0,
    Explicitly = 1,
    Implicitly = 2,
}

impl Changed {
    pub(crate) fn from_code(code: u8) -> Option<Changed> {
        [Changed::Not, Changed::Explicitly, Changed::Implicitly]
            .into_iter()
            .find(|c| *c as u8 == code)
    }
}

/// The access state of one group, as the processes exporting a logical unit share it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct GroupState {
    pub(crate) id: u16,
    pub(crate) state: AccessState,
    pub(crate) changed: Changed,
}

/// Gives the groups of `groups` listed in `wanted` their new states, a change of kind `how`.
/// With `one_optimized`, a group made active/optimized takes the place of the one that was
/// (unless `wanted` names that one too), which becomes active/non-optimized if the new one
/// was, and standby otherwise. Returns whether any state changed.
pub(crate) fn set_states(
    groups: &mut [GroupState],
    wanted: &[(u16, AccessState)],
    how: Changed,
    one_optimized: bool,
) -> bool {
    let mut moved = false;
    for &(id, state) in wanted {
        let Some(before) = groups.iter().find(|g| g.id == id).map(|g| g.state) else {
            continue;
        };
        if before == state {
            continue;
        }
        if one_optimized && state == AccessState::ActiveOptimized {
            let demoted = if before == AccessState::ActiveNonOptimized {
                before
            } else {
                AccessState::Standby
            };
            for g in groups.iter_mut() {
                let named = wanted.iter().any(|(w, _)| *w == g.id);
                if g.id != id && g.state == AccessState::ActiveOptimized && !named {
                    g.state = demoted;
                    g.changed = Changed::Implicitly;
                }
            }
        }
        if let Some(g) = groups.iter_mut().find(|g| g.id == id) {
            g.state = state;
            g.changed = how;
        }
        moved = true;
    }
    moved
}

/// The live target port groups of a logical unit.
#[derive(Debug)]
pub(crate) struct Alua {
    groups: Vec<(PortGroup, Changed)>,
    /// The groups as last configured (empty: learned).
    configured: Vec<PortGroup>,
    transition_secs: u8,
}

impl Alua {
    pub(crate) fn new(config: &AluaConfig) -> Alua {
        Alua {
            groups: config
                .groups
                .iter()
                .map(|g| (g.clone(), Changed::Not))
                .collect(),
            configured: config.groups.clone(),
            transition_secs: config.transition_secs,
        }
    }

    pub(crate) fn learns(&self) -> bool {
        self.configured.is_empty()
    }

    /// Every group's state, learned ones included.
    pub(crate) fn states(&self) -> Vec<GroupState> {
        self.groups
            .iter()
            .map(|(g, changed)| GroupState {
                id: g.id,
                state: g.state,
                changed: *changed,
            })
            .collect()
    }

    /// Takes in the states of configured groups (another process's changes); groups this
    /// one does not have are left out, and learned groups are never shared. Returns whether
    /// any state changed.
    pub(crate) fn take_states(&mut self, states: &[GroupState]) -> bool {
        if self.learns() {
            return false;
        }
        let mut moved = false;
        for s in states {
            if let Some((g, changed)) = self.groups.iter_mut().find(|(g, _)| g.id == s.id) {
                moved |= g.state != s.state;
                g.state = s.state;
                *changed = s.changed;
            }
        }
        moved
    }

    /// [`set_states`] on the live groups.
    pub(crate) fn set(
        &mut self,
        wanted: &[(u16, AccessState)],
        how: Changed,
        one_optimized: bool,
    ) -> bool {
        let mut states = self.states();
        if !set_states(&mut states, wanted, how, one_optimized) {
            return false;
        }
        for (s, (g, changed)) in states.iter().zip(self.groups.iter_mut()) {
            g.state = s.state;
            *changed = s.changed;
        }
        true
    }

    /// The TPGS field of standard INQUIRY data, as the groups are now.
    pub(crate) fn tpgs(&self) -> u8 {
        AluaConfig {
            groups: self.configured.clone(),
            transition_secs: 0,
        }
        .tpgs()
    }

    /// The groups as they are now, learned ones included.
    pub(crate) fn groups(&self) -> Vec<PortGroup> {
        self.groups.iter().map(|(g, _)| g.clone()).collect()
    }

    /// Adds the group and port of a new I_T nexus when the groups are learned.
    pub(crate) fn learn(&mut self, port_group: u16, port: u16) {
        if !self.learns() {
            return;
        }
        match self.groups.iter_mut().find(|(g, _)| g.id == port_group) {
            Some((g, _)) => {
                if !g.relative_ports.contains(&port) {
                    g.relative_ports.push(port);
                }
            }
            None => self
                .groups
                .push((PortGroup::learned(port_group, port), Changed::Not)),
        }
    }

    /// Takes a new configuration (already validated), as an implicit change: a group whose
    /// state, preference and allowed changes are as last configured keeps its live state
    /// (SET TARGET PORT GROUPS may have moved it) and takes the new port list; any other
    /// takes the configured state. With no groups configured they are learned again from
    /// `nexuses` (target port group, relative port). Returns whether the state of any port
    /// changed, which every I_T nexus is to hear of, and the groups whose configured state
    /// changed (none on the first configuration), for processes that share the states.
    pub(crate) fn reconfigure(
        &mut self,
        config: &AluaConfig,
        nexuses: impl Iterator<Item = (u16, u16)>,
    ) -> (bool, Vec<(u16, AccessState)>) {
        let ordered = config
            .groups
            .iter()
            .filter(|g| {
                self.configured
                    .iter()
                    .any(|c| c.id == g.id && c.state != g.state)
            })
            .map(|g| (g.id, g.state))
            .collect();
        let old = self.port_states();
        let same = |a: &PortGroup, b: &PortGroup| {
            (a.state, a.preferred, a.implicit, a.explicit)
                == (b.state, b.preferred, b.implicit, b.explicit)
        };
        let groups = config
            .groups
            .iter()
            .map(|g| {
                let kept = self.configured.iter().any(|c| c.id == g.id && same(c, g));
                match self.groups.iter().find(|(l, _)| l.id == g.id) {
                    Some((live, changed)) if kept => (
                        PortGroup {
                            relative_ports: g.relative_ports.clone(),
                            ..live.clone()
                        },
                        *changed,
                    ),
                    Some((live, changed)) if live.state == g.state => (g.clone(), *changed),
                    Some(_) => (g.clone(), Changed::Implicitly),
                    None => (g.clone(), Changed::Not),
                }
            })
            .collect();
        self.groups = groups;
        self.configured = config.groups.clone();
        self.transition_secs = config.transition_secs;
        for (group, port) in nexuses {
            self.learn(group, port);
        }
        let new = self.port_states();
        let moved = old
            .iter()
            .chain(new.iter())
            .any(|(p, _)| self.port_state(&old, *p) != self.port_state(&new, *p));
        (moved, ordered)
    }

    /// Every relative port in a group, with the group's state.
    fn port_states(&self) -> Vec<(u16, AccessState)> {
        self.groups
            .iter()
            .flat_map(|(g, _)| g.relative_ports.iter().map(|p| (*p, g.state)))
            .collect()
    }

    /// The state of relative port `port` among `states`: a port in no group is
    /// active/optimized while the groups are learned, unavailable when they are configured.
    fn port_state(&self, states: &[(u16, AccessState)], port: u16) -> AccessState {
        states
            .iter()
            .find(|(p, _)| *p == port)
            .map_or(self.outside(), |(_, s)| *s)
    }

    fn outside(&self) -> AccessState {
        if self.learns() {
            AccessState::ActiveOptimized
        } else {
            AccessState::Unavailable
        }
    }

    /// The state of the group `nexus` reaches the logical unit through: a port in no
    /// group of a configured set is unavailable.
    pub(crate) fn state_of(&self, nexus: &Nexus) -> AccessState {
        self.group_state(nexus.port_group)
    }

    /// The state of group `group`; a group not in a configured set is unavailable.
    pub(crate) fn group_state(&self, group: u16) -> AccessState {
        self.groups
            .iter()
            .find(|(g, _)| g.id == group)
            .map_or(self.outside(), |(g, _)| g.state)
    }

    /// REPORT TARGET PORT GROUPS parameter data, in the extended format or with the
    /// length-only header.
    fn report(&self, extended: bool) -> Vec<u8> {
        let mut b = vec![0u8; if extended { 8 } else { 4 }];
        if extended {
            b[4] = 0x10; // FORMAT TYPE 001b
            b[5] = self.transition_secs;
        }
        let sup = AccessState::ALL.iter().fold(0u8, |m, s| m | s.sup_bit());
        for (g, changed) in &self.groups {
            let ports = &g.relative_ports[..g.relative_ports.len().min(255)];
            b.push(u8::from(g.preferred) << 7 | g.state.code());
            b.push(sup);
            b.extend_from_slice(&g.id.to_be_bytes());
            b.extend_from_slice(&[0, *changed as u8, 0, ports.len() as u8]);
            for p in ports {
                b.extend_from_slice(&[0, 0]);
                b.extend_from_slice(&p.to_be_bytes());
            }
        }
        let len = (b.len() - 4) as u32;
        put_be32(&mut b[0..4], len);
        b
    }
}

/// REPORT TARGET PORT GROUPS (SPC-4 6.37).
pub(crate) fn report_target_port_groups(ctx: &mut Ctx<'_>) -> CmdResult {
    let cdb = ctx.cdb();
    let format = cdb.byte(1) >> 5;
    if format > 1 {
        return Err(Sense::invalid_cdb(1, Some(7)).into());
    }
    let alloc = cdb.be(field::ALLOC12) as u32;
    let b = ctx.dev.lock().alua.report(format == 1);
    Ok(Done::data(&b, alloc))
}

/// SET TARGET PORT GROUPS (SPC-4 6.46): every descriptor is checked before any state
/// changes; every other I_T nexus then gets ASYMMETRIC ACCESS STATE CHANGED (on every
/// process that shares the states, see [`crate::Device::set_group_states`]).
pub(crate) async fn set_target_port_groups(ctx: &mut Ctx<'_>) -> CmdResult {
    let len = ctx.cdb().be(field::ALLOC12) as usize;
    if len == 0 {
        return Ok(Done::good());
    }
    let data = ctx.data_out();
    if len < 4 || !(len - 4).is_multiple_of(4) || data.len() < len {
        return Err(Sense::param_list_length().into());
    }
    let mut wanted = Vec::with_capacity((len - 4) / 4);
    {
        let st = ctx.dev.lock();
        for (i, d) in data[4..len].chunks_exact(4).enumerate() {
            let at = 4 + 4 * i;
            let state = AccessState::from_code(d[0] & 0x0f)
                .filter(|s| *s != AccessState::Transitioning)
                .ok_or_else(|| Sense::invalid_param(at, Some(3)))?;
            let id = be(&d[2..4]) as u16;
            match st.alua.groups.iter().find(|(g, _)| g.id == id) {
                Some((g, _)) if g.explicit => wanted.push((id, state)),
                _ => return Err(Sense::invalid_param(at + 2, None).into()),
            }
        }
    }
    if ctx
        .dev
        .set_group_states(&wanted, Changed::Explicitly, Some(ctx.nexus.id))
        .await?
    {
        tracing::info!(device = %ctx.dev.config.name, nexus = ctx.nexus.id,
            "target port group states set (SET TARGET PORT GROUPS)");
    }
    Ok(Done::good())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn group(id: u16, ports: &[u16], state: AccessState) -> PortGroup {
        PortGroup {
            id,
            relative_ports: ports.to_vec(),
            state,
            preferred: id == 1,
            implicit: true,
            explicit: id != 3,
        }
    }

    #[test]
    fn codes_and_names_round_trip() {
        for s in AccessState::ALL {
            assert_eq!(AccessState::from_code(s.code()), Some(s));
            assert_eq!(AccessState::from_name(s.name()), Some(s));
        }
        assert_eq!(AccessState::from_code(4), None);
        assert_eq!(AccessState::from_name("active"), None);
    }

    #[test]
    fn report_lays_out_groups_and_ports() {
        let cfg = AluaConfig {
            groups: vec![
                group(1, &[1, 2], AccessState::ActiveOptimized),
                group(2, &[3], AccessState::Standby),
            ],
            transition_secs: 10,
        };
        assert_eq!(cfg.validate(), Ok(()));
        assert_eq!(cfg.tpgs(), 0x30);
        let a = Alua::new(&cfg);
        let ext = a.report(true);
        assert_eq!(be(&ext[0..4]) as usize, ext.len() - 4);
        assert_eq!(&ext[4..8], &[0x10, 10, 0, 0]);
        let g1 = &ext[8..8 + 16];
        assert_eq!(g1[0], 0x80); // PREF, active/optimized
        assert_eq!(g1[1], 0xcf);
        assert_eq!(&g1[2..4], &[0, 1]);
        assert_eq!(g1[7], 2);
        assert_eq!(&g1[8..16], &[0, 0, 0, 1, 0, 0, 0, 2]);
        let g2 = &ext[24..36];
        assert_eq!((g2[0], &g2[2..4], g2[7]), (0x02, &[0u8, 2][..], 1));
        assert_eq!(&g2[8..12], &[0, 0, 0, 3]);
        let short = a.report(false);
        assert_eq!(&short[4..], &ext[8..]);
    }

    #[test]
    fn one_group_at_a_time_is_active_optimized_when_asked() {
        let states = |s: &[AccessState]| -> Vec<GroupState> {
            s.iter()
                .enumerate()
                .map(|(i, &state)| GroupState {
                    id: i as u16 + 1,
                    state,
                    changed: Changed::Not,
                })
                .collect()
        };
        let of = |g: &[GroupState]| g.iter().map(|g| g.state).collect::<Vec<_>>();
        use AccessState::{ActiveNonOptimized as Ano, ActiveOptimized as Ao, Standby as Sb};
        let mut g = states(&[Ao, Ano, Sb]);
        // Without the rule, two groups may be active/optimized.
        let mut free = g.clone();
        assert!(set_states(
            &mut free,
            &[(2, Ao)],
            Changed::Explicitly,
            false
        ));
        assert_eq!(of(&free), [Ao, Ao, Sb]);
        // With it, the new one takes the old one's place: the old one takes its former state.
        assert!(set_states(&mut g, &[(2, Ao)], Changed::Explicitly, true));
        assert_eq!(of(&g), [Ano, Ao, Sb]);
        assert_eq!(g[0].changed, Changed::Implicitly);
        assert_eq!(g[1].changed, Changed::Explicitly);
        assert!(set_states(&mut g, &[(3, Ao)], Changed::Implicitly, true));
        assert_eq!(of(&g), [Ano, Sb, Ao]);
        // A group the list names itself keeps the state the list gives it.
        assert!(set_states(
            &mut g,
            &[(1, Ao), (3, Ano)],
            Changed::Explicitly,
            true
        ));
        assert_eq!(of(&g), [Ao, Sb, Ano]);
        // Nothing to change, or an unknown group: no change.
        assert!(!set_states(
            &mut g,
            &[(1, Ao), (9, Sb)],
            Changed::Explicitly,
            true
        ));
        assert_eq!(of(&g), [Ao, Sb, Ano]);
    }

    #[test]
    fn configuration_errors_are_named() {
        let dup = AluaConfig {
            groups: vec![
                group(1, &[1], AccessState::ActiveOptimized),
                group(1, &[2], AccessState::Standby),
            ],
            transition_secs: 0,
        };
        assert!(dup.validate().unwrap_err().contains("group 1"));
        let shared = AluaConfig {
            groups: vec![
                group(1, &[1, 2], AccessState::ActiveOptimized),
                group(2, &[2], AccessState::Standby),
            ],
            transition_secs: 0,
        };
        assert!(shared.validate().unwrap_err().contains("port 2"));
        let only_implicit = AluaConfig {
            groups: vec![group(3, &[1], AccessState::ActiveOptimized)],
            transition_secs: 0,
        };
        assert_eq!(only_implicit.tpgs(), 0x10);
    }
}
