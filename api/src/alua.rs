//! The `alua` section: asymmetric logical unit access. Target port groups, each with an
//! access state (per LUN when a gateway owns some LUNs and not others), the ports that
//! belong to them (an iSCSI portal group with its iSER portals, an SRP target port) by
//! their relative target port identifiers, and the ports other rtgtd processes serve. NVMe
//! ports name a group too (`nvme.ports[].alua_group`): namespaces report its state as their
//! ANA state through them.
//!
//! Without groups every port is a group of its own, active/optimized, and initiators may
//! change the states with SET TARGET PORT GROUPS. With groups, a port that names none is in
//! the default group, 0: active/optimized with implicit changes only unless the section
//! lists group 0 with other settings (Linux's target has such a default group too).

use std::collections::HashSet;

use rtgt_scsi::core::PortIds;
use rtgt_scsi::{AccessState, AluaConfig, PortGroup};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::fields::{is_default, is_false, is_true, yes};

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Alua {
    /// IMPLICIT TRANSITION TIME in seconds, as REPORT TARGET PORT GROUPS reports it: how
    /// long a host should allow for a state change it did not ask for (a failover). 0: not
    /// given.
    #[serde(default, skip_serializing_if = "is_default")]
    pub transition_secs: u8,
    /// The target port groups. When there are any, each portal group and SRP port is in
    /// the one its `alua_group` names, or in the default group 0.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<AluaGroup>,
}

/// One target port group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AluaGroup {
    /// Target port group identifier; 0 is the default group.
    pub id: u16,
    /// The access state of the LUNs reached through the group, unless `backstores` gives
    /// one: active_optimized (default), active_non_optimized, standby, unavailable,
    /// offline or transitioning.
    #[serde(default = "active_optimized", with = "state_name")]
    #[schema(value_type = String, example = "active_optimized")]
    pub state: AccessState,
    /// PREF: the group hosts should prefer.
    #[serde(default, skip_serializing_if = "is_false")]
    pub preferred: bool,
    /// The state may change without an initiator asking for it: through the API (a
    /// cluster manager). Default true.
    #[serde(default = "yes", skip_serializing_if = "is_true")]
    pub implicit: bool,
    /// Initiators may change the state with SET TARGET PORT GROUPS. Default false: Linux's
    /// scsi_dh_alua sends it when it activates a standby path, which would move the LUNs
    /// behind a cluster manager's back.
    #[serde(default, skip_serializing_if = "is_false")]
    pub explicit: bool,
    /// Relative target port identifiers of the group's ports that another rtgtd serves
    /// (gateways exporting the same LUNs list each other's ports, so that every one
    /// reports the same groups).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub remote_ports: Vec<u16>,
    /// States of single backstores that differ from the group's.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub backstores: Vec<AluaLuState>,
}

/// The state of one backstore's LUNs in a group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AluaLuState {
    pub backstore: String,
    #[serde(with = "state_name")]
    #[schema(value_type = String, example = "standby")]
    pub state: AccessState,
    /// PREF for this backstore; the group's when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preferred: Option<bool>,
}

fn active_optimized() -> AccessState {
    AccessState::ActiveOptimized
}

/// An access state by the name the configuration uses.
mod state_name {
    use rtgt_scsi::AccessState;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(s: &AccessState, ser: S) -> Result<S::Ok, S::Error> {
        ser.serialize_str(s.name())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(de: D) -> Result<AccessState, D::Error> {
        let name = String::deserialize(de)?;
        AccessState::from_name(&name).ok_or_else(|| {
            let names: Vec<&str> = AccessState::ALL.iter().map(|s| s.name()).collect();
            serde::de::Error::custom(format!(
                "{name:?} is not an access state ({})",
                names.join(", ")
            ))
        })
    }
}

/// Which port of the document a [`TargetPort`] is.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum PortKey {
    /// A target's portal group, by tag.
    PortalGroup(String, u16),
    /// An SRP target port, by name.
    Srp(String),
}

/// A target port as the document declares it.
#[derive(Debug, Clone)]
pub struct PortDecl {
    pub key: PortKey,
    /// The path of its fields (`targets[0].portal_groups[1]`).
    pub at: String,
    /// How messages name it (`iqn…:t portal group 1`, `SRP port p0`).
    pub name: String,
    pub relative_port: Option<u16>,
    /// The relative port it has when `relative_port` is absent (a portal group's tag);
    /// `None`: the lowest one no other port has.
    pub default_port: Option<u16>,
    pub alua_group: Option<u16>,
    /// The backstores its LUNs map.
    pub backstores: Vec<String>,
}

/// A target port with its relative port and group resolved.
#[derive(Debug, Clone)]
pub struct TargetPort {
    pub decl: PortDecl,
    pub ids: PortIds,
}

/// Gives every port its relative target port identifier (its own, its default, else the
/// lowest no other port and no remote port has, in the document's order) and its group
/// (its `alua_group`; without groups, a group of its own numbered like the port).
pub fn resolve(decls: Vec<PortDecl>, alua: &Alua) -> Vec<TargetPort> {
    let mut used: HashSet<u16> = decls
        .iter()
        .filter_map(|d| d.relative_port.or(d.default_port))
        .chain(
            alua.groups
                .iter()
                .flat_map(|g| g.remote_ports.iter().copied()),
        )
        .collect();
    decls
        .into_iter()
        .map(|decl| {
            let relative_port = decl.relative_port.or(decl.default_port).unwrap_or_else(|| {
                let r = (1..=u16::MAX)
                    .find(|r| !used.contains(r))
                    .unwrap_or(u16::MAX);
                used.insert(r);
                r
            });
            let port_group = match alua.groups.is_empty() {
                true => relative_port,
                false => decl.alua_group.unwrap_or(0),
            };
            TargetPort {
                decl,
                ids: PortIds {
                    relative_port,
                    port_group,
                },
            }
        })
        .collect()
}

/// The IDs of port `key` among `ports`.
pub fn ids_of(ports: &[TargetPort], key: &PortKey) -> Option<PortIds> {
    ports.iter().find(|p| p.decl.key == *key).map(|p| p.ids)
}

impl AluaGroup {
    /// Group 0 as it is when the section does not list it.
    fn default_group() -> AluaGroup {
        AluaGroup {
            id: 0,
            state: AccessState::ActiveOptimized,
            preferred: false,
            implicit: true,
            explicit: false,
            remote_ports: Vec::new(),
            backstores: Vec::new(),
        }
    }
}

impl Alua {
    pub fn group(&self, id: u16) -> Option<&AluaGroup> {
        self.groups.iter().find(|g| g.id == id)
    }

    /// The groups listed, and the default group when they do not list it; none without
    /// groups.
    fn effective(&self) -> Vec<AluaGroup> {
        let mut groups = self.groups.clone();
        if !groups.is_empty() && self.group(0).is_none() {
            groups.insert(0, AluaGroup::default_group());
        }
        groups
    }

    /// Checks group and port identifiers, the ports' groups and the backstores named;
    /// returns the path of the bad field (below the document) and why.
    pub fn validate(
        &self,
        ports: &[TargetPort],
        backstore_exists: impl Fn(&str) -> bool,
    ) -> Result<(), (String, String)> {
        let mut ids = HashSet::new();
        let mut remote = HashSet::new();
        for (gi, g) in self.groups.iter().enumerate() {
            let at = |f: &str| format!("alua.groups[{gi}].{f}");
            if !ids.insert(g.id) {
                return Err((at("id"), format!("group {} is listed twice", g.id)));
            }
            for (pi, p) in g.remote_ports.iter().enumerate() {
                if *p == 0 || !remote.insert(*p) {
                    return Err((
                        at(&format!("remote_ports[{pi}]")),
                        format!("relative port {p} must be non-zero and in one group once"),
                    ));
                }
            }
            let mut seen = HashSet::new();
            for (bi, b) in g.backstores.iter().enumerate() {
                if !backstore_exists(&b.backstore) || !seen.insert(b.backstore.as_str()) {
                    return Err((
                        at(&format!("backstores[{bi}].backstore")),
                        format!("{:?} is not a backstore or is listed twice", b.backstore),
                    ));
                }
            }
        }
        // Relative ports are unique among the ports of a logical unit (two targets may
        // both have a portal group 1 when they share no LUN) and apart from remote ports.
        let mut local = HashSet::new();
        for p in ports {
            let at = |f: &str| format!("{}.{f}", p.decl.at);
            if p.ids.relative_port == 0 {
                return Err((at("relative_port"), "relative port 0 is reserved".into()));
            }
            if let Some(g) = p.decl.alua_group.filter(|g| *g != 0) {
                if self.group(g).is_none() {
                    return Err((
                        at("alua_group"),
                        format!("the alua section has no group {g}"),
                    ));
                }
            }
            if self.groups.is_empty() {
                continue;
            }
            let r = p.ids.relative_port;
            let own: HashSet<&str> = p.decl.backstores.iter().map(String::as_str).collect();
            let taken = remote.contains(&r) || own.into_iter().any(|b| !local.insert((b, r)));
            if taken {
                return Err((
                    at("relative_port"),
                    format!(
                        "relative port {r} of the {} is also a remote port or another port of one of its LUNs (set relative_port)",
                        p.decl.name
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The target port groups of `backstore`'s logical unit: each group with the local
    /// ports whose LUNs map it and the group's remote ports, and each group in `fabric_groups`
    /// (the groups of NVMe ports when a namespace is on the backstore) even without SCSI
    /// ports, with the backstore's state. Without groups: none (the logical unit learns
    /// them).
    pub fn lu_config(
        &self,
        ports: &[TargetPort],
        backstore: &str,
        fabric_groups: &[u16],
    ) -> AluaConfig {
        let groups = self
            .effective()
            .iter()
            .filter_map(|g| {
                let mut relative_ports: Vec<u16> = ports
                    .iter()
                    .filter(|p| {
                        p.ids.port_group == g.id && p.decl.backstores.iter().any(|b| b == backstore)
                    })
                    .map(|p| p.ids.relative_port)
                    .collect();
                relative_ports.extend(&g.remote_ports);
                if relative_ports.is_empty() && !fabric_groups.contains(&g.id) {
                    return None;
                }
                let own = g.backstores.iter().find(|b| b.backstore == backstore);
                Some(PortGroup {
                    id: g.id,
                    relative_ports,
                    state: own.map_or(g.state, |o| o.state),
                    preferred: own.and_then(|o| o.preferred).unwrap_or(g.preferred),
                    implicit: g.implicit,
                    explicit: g.explicit,
                })
            })
            .collect();
        AluaConfig {
            groups,
            transition_secs: self.transition_secs,
        }
    }

    /// Why this section cannot replace `old`, which is in force (answered with 409): a
    /// backstore left with no active group, or a group that allows only explicit changes
    /// given another state.
    pub fn conflict<'a>(
        &self,
        old: &Alua,
        lus: impl Iterator<Item = (&'a str, AluaConfig)>,
    ) -> Option<String> {
        for g in &self.groups {
            if let Some(o) = old.group(g.id) {
                if !o.implicit && (o.state != g.state || o.backstores != g.backstores) {
                    return Some(format!(
                        "target port group {} allows only explicit changes (SET TARGET PORT GROUPS); set implicit: true before changing its state",
                        g.id
                    ));
                }
            }
        }
        for (b, lu) in lus {
            if lu.groups.is_empty() || lu.groups.iter().any(|g| g.state.is_active()) {
                continue;
            }
            let states: Vec<String> = lu
                .groups
                .iter()
                .map(|g| format!("group {} {}", g.id, g.state.name()))
                .collect();
            return Some(format!(
                "backstore {b:?} would have no active target port group ({}): keep one active_optimized or active_non_optimized",
                states.join(", ")
            ));
        }
        None
    }
}
