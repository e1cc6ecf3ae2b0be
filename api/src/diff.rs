//! What applying a document would change: the differences between two configurations,
//! named as the report of a real apply names them (`iqn…:t/tpg1/lun/0`, `srp/p0/acl/0x…`).
//! `PUT /api/v1/config?dry_run=true` answers with it.

use crate::config::{Backstore, Config, Port, PortAcl, PortalGroup, SrpPort, Target};
use crate::control::ChangeReport;
use crate::nvme::Nvme;

/// How a backstore's new definition applies to the running one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BackstoreChange {
    Same,
    /// Only the size, the cache mode and the write cache differ: changed in place, under I/O.
    Live(LiveChange),
    /// No LUN maps it: it is opened again with the new definition.
    Reopen,
    /// A LUN maps it and more than what can change live differs: refused (409), naming the
    /// fields.
    InUse(String),
}

/// What changes in place on a running backstore; `None` stays as it is.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LiveChange {
    /// New capacity in bytes (initiators get CAPACITY DATA HAS CHANGED).
    pub size: Option<u64>,
    /// Transfers past the page cache or through it.
    pub direct: Option<bool>,
    /// The volatile write cache (initiators get MODE PARAMETERS CHANGED; turned off, what
    /// was cached is flushed first).
    pub write_cache: Option<bool>,
}

impl LiveChange {
    /// Its lines in a change report, as an apply and a dry run name them.
    pub fn report(&self, report: &mut ChangeReport, name: &str) {
        if self.size.is_some() {
            report.push_detail("resized", "backstore", name, "CAPACITY DATA HAS CHANGED");
        }
        let mut cache = Vec::new();
        if let Some(d) = self.direct {
            cache.push(if d {
                "direct: true (past the page cache)"
            } else {
                "direct: false (through the page cache)"
            });
        }
        if let Some(w) = self.write_cache {
            cache.push(if w {
                "write_cache: true (MODE PARAMETERS CHANGED)"
            } else {
                "write_cache: false (cached writes flushed; MODE PARAMETERS CHANGED)"
            });
        }
        if !cache.is_empty() {
            report.push_detail("changed", "backstore", name, cache.join(", "));
        }
    }
}

/// Classifies the change of backstore `old` into `new`; `in_use` says whether a LUN maps it.
pub fn backstore_change(old: &Backstore, new: &Backstore, in_use: bool) -> BackstoreChange {
    if old == new {
        return BackstoreChange::Same;
    }
    let mut rest = old.clone();
    rest.direct = new.direct;
    rest.write_cache = new.write_cache;
    if new.size.is_some() {
        rest.size = new.size;
    }
    if rest == *new {
        return BackstoreChange::Live(LiveChange {
            size: new.size.filter(|_| new.size != old.size).map(|s| s.0),
            direct: (new.direct() != old.direct()).then_some(new.direct()),
            write_cache: (new.write_cache != old.write_cache).then_some(new.write_cache),
        });
    }
    if !in_use {
        return BackstoreChange::Reopen;
    }
    let live = ["size", "direct", "write_cache"];
    let fields = changed_fields(old, new)
        .into_iter()
        .filter(|f| !live.contains(&f.as_str()))
        .collect::<Vec<_>>()
        .join(", ");
    BackstoreChange::InUse(format!(
        "backstore {:?} is in use: {fields} cannot change while a LUN or namespace maps it (size, direct and write_cache can); remove its LUNs and namespaces first",
        new.name
    ))
}

/// The fields (as the document names them) whose values differ.
fn changed_fields(old: &Backstore, new: &Backstore) -> Vec<String> {
    let fields = |b: &Backstore| match serde_json::to_value(b) {
        Ok(serde_json::Value::Object(m)) => m,
        _ => serde_json::Map::new(),
    };
    let (a, b) = (fields(old), fields(new));
    let mut names: Vec<String> = a.keys().chain(b.keys()).cloned().collect();
    names.sort();
    names.dedup();
    names.retain(|k| a.get(k) != b.get(k));
    names
}

/// The changes that make `old` into `new`, in the order an apply makes them: backstores
/// resized, added or changed; targets; SRP ports; discovery; backstores removed; then the
/// sections that apply when rtgtd restarts. Empty when the two are equal.
pub fn diff(old: &Config, new: &Config) -> ChangeReport {
    let mut report = ChangeReport::default();
    let mut others = Vec::new();
    let mut conflicts = Vec::new();
    for b in &new.backstores {
        match old.backstore(&b.name) {
            None => others.push(("added", b.name.clone())),
            Some(o) => match backstore_change(o, b, in_use(old, &b.name)) {
                BackstoreChange::Same => {}
                BackstoreChange::Live(live) => live.report(&mut report, &b.name),
                BackstoreChange::Reopen => others.push(("changed", b.name.clone())),
                BackstoreChange::InUse(why) => conflicts.push((b.name.clone(), why)),
            },
        }
    }
    for (action, name) in others {
        report.push(action, "backstore", name);
    }
    for (name, why) in conflicts {
        report.push_detail(
            "changed",
            "backstore",
            name,
            format!("{why}; an apply is refused (409)"),
        );
    }
    for t in &new.targets {
        match old.target(&t.name) {
            None => report.push("added", "target", t.name.clone()),
            Some(o) if o == t => {}
            Some(o) => target_diff(&mut report, o, t),
        }
    }
    for t in &old.targets {
        if new.target(&t.name).is_none() {
            report.push("removed", "target", t.name.clone());
        }
    }
    for p in &new.srp {
        match old.srp.iter().find(|x| x.name == p.name) {
            None => report.push("added", "srp_port", p.name.clone()),
            Some(o) if o == p => {}
            Some(o) => srp_diff(&mut report, o, p),
        }
    }
    for p in &old.srp {
        if !new.srp.iter().any(|x| x.name == p.name) {
            report.push_detail(
                "removed",
                "srp_port",
                p.name.clone(),
                "its channels are logged out",
            );
        }
    }
    if new.discovery != old.discovery {
        report.push("changed", "discovery", "discovery");
    }
    for b in &old.backstores {
        if new.backstore(&b.name).is_none() {
            report.push("removed", "backstore", b.name.clone());
        }
    }
    nvme_diff(&mut report, &old.nvme, &new.nvme);
    alua_diff(&mut report, old, new);
    restart_sections(&mut report, old, new);
    report
}

/// Reports the NVMe subsystems, namespaces and ports added, removed or changed.
pub fn nvme_diff(report: &mut ChangeReport, old: &Nvme, new: &Nvme) {
    for s in &new.subsystems {
        let Some(o) = old.subsystems.iter().find(|x| x.nqn == s.nqn) else {
            report.push("added", "nvme_subsystem", s.nqn.clone());
            continue;
        };
        for n in &s.namespaces {
            let name = format!("{}/{}", s.nqn, n.nsid);
            match o.namespaces.iter().find(|x| x.nsid == n.nsid) {
                None => report.push_detail(
                    "added",
                    "nvme_namespace",
                    name,
                    "hosts are told (changed namespace list)",
                ),
                Some(x) if x == n => {}
                Some(_) => report.push_detail(
                    "changed",
                    "nvme_namespace",
                    name,
                    "hosts are told (changed namespace list)",
                ),
            }
        }
        for n in &o.namespaces {
            if !s.namespaces.iter().any(|x| x.nsid == n.nsid) {
                report.push_detail(
                    "removed",
                    "nvme_namespace",
                    format!("{}/{}", s.nqn, n.nsid),
                    "hosts are told (changed namespace list)",
                );
            }
        }
        if (o.allow_any_host, &o.hosts) != (s.allow_any_host, &s.hosts) {
            report.push_detail(
                "changed",
                "nvme_subsystem",
                s.nqn.clone(),
                "allowed hosts: the controllers of hosts no longer admitted are closed",
            );
        } else if o.serial != s.serial {
            report.push_detail(
                "changed",
                "nvme_subsystem",
                s.nqn.clone(),
                "serial: its controllers are closed (hosts connect again)",
            );
        }
    }
    for o in &old.subsystems {
        if !new.subsystems.iter().any(|x| x.nqn == o.nqn) {
            report.push_detail(
                "removed",
                "nvme_subsystem",
                o.nqn.clone(),
                "its controllers are closed",
            );
        }
    }
    for p in &new.ports {
        match old.ports.iter().find(|x| x.id == p.id) {
            None => report.push("added", "nvme_port", p.id.to_string()),
            Some(o) if o == p => {}
            Some(_) => report.push_detail(
                "changed",
                "nvme_port",
                p.id.to_string(),
                "its connections are closed (hosts connect again)",
            ),
        }
    }
    for o in &old.ports {
        if !new.ports.iter().any(|x| x.id == o.id) {
            report.push_detail(
                "removed",
                "nvme_port",
                o.id.to_string(),
                "its connections are closed",
            );
        }
    }
    if old.discovery_listen != new.discovery_listen {
        report.push("changed", "nvme_discovery", "discovery_listen");
    }
}

/// Reports the target port groups added, removed or changed (a new state is an implicit
/// change every initiator hears of).
pub fn alua_diff(report: &mut ChangeReport, old: &Config, new: &Config) {
    let (o, n) = (&old.alua, &new.alua);
    for g in &n.groups {
        let name = g.id.to_string();
        match o.group(g.id) {
            None => report.push_detail("added", "alua_group", name, g.state.name()),
            Some(was) if was == g => {}
            Some(was) if was.state != g.state || was.backstores != g.backstores => report
                .push_detail(
                    "changed",
                    "alua_group",
                    name,
                    format!("{} (ASYMMETRIC ACCESS STATE CHANGED)", g.state.name()),
                ),
            Some(_) => report.push("changed", "alua_group", name),
        }
    }
    for g in &o.groups {
        if n.group(g.id).is_none() {
            report.push("removed", "alua_group", g.id.to_string());
        }
    }
    if o.transition_secs != n.transition_secs {
        report.push("changed", "alua", "transition_secs");
    }
}

/// Reports the sections read only when rtgtd starts (`rdma`, `api`, `policy`) that differ.
pub fn restart_sections(report: &mut ChangeReport, old: &Config, new: &Config) {
    for (differs, section, what) in [
        (new.rdma != old.rdma, "rdma", "the RDMA device changes"),
        (new.api != old.api, "api", "API listeners change"),
        (new.policy != old.policy, "policy", "backstore roots change"),
    ] {
        if differs {
            report.push_detail(
                "changed",
                section,
                section,
                format!("{what} when rtgtd restarts"),
            );
        }
    }
}

/// Whether a LUN or a namespace maps the backstore.
pub fn in_use(c: &Config, name: &str) -> bool {
    c.port_luns().any(|(_, l)| l.backstore == name) || c.nvme.exports(name)
}

/// Reports what differs between two versions of a target: portal groups, their portals,
/// LUNs, ACLs, auth and parameters.
pub fn target_diff(report: &mut ChangeReport, old: &Target, new: &Target) {
    for g in &new.portal_groups {
        let path = format!("{}/tpg{}", new.name, g.tag);
        match old.portal_groups.iter().find(|x| x.tag == g.tag) {
            None => report.push("added", "portal_group", path),
            Some(o) => portal_group_diff(report, &path, o, g),
        }
    }
    for o in &old.portal_groups {
        if !new.portal_groups.iter().any(|g| g.tag == o.tag) {
            report.push(
                "removed",
                "portal_group",
                format!("{}/tpg{}", new.name, o.tag),
            );
        }
    }
    if old.alias != new.alias {
        report.push("changed", "target", new.name.clone());
    }
}

fn portal_group_diff(report: &mut ChangeReport, path: &str, o: &PortalGroup, g: &PortalGroup) {
    for p in g.portals.iter().filter(|p| !o.portals.contains(p)) {
        report.push("added", "portal", format!("{path}/{p}"));
    }
    for p in o.portals.iter().filter(|p| !g.portals.contains(p)) {
        report.push("removed", "portal", format!("{path}/{p}"));
    }
    port_diff(report, path, o, g);
    if g.auth != o.auth {
        report.push("changed", "auth", path);
    }
    if g.allow_any_initiator != o.allow_any_initiator || g.params != o.params || g.iser != o.iser {
        report.push("changed", "params", path);
    }
}

/// Reports what differs between two versions of an SRP target port: its LUNs, ACLs and
/// settings.
pub fn srp_diff(report: &mut ChangeReport, old: &SrpPort, new: &SrpPort) {
    port_diff(report, &format!("srp/{}", new.name), old, new);
    if old.listen != new.listen
        || old.id_ext != new.id_ext
        || old.ioc_guid != new.ioc_guid
        || old.allow_any_initiator != new.allow_any_initiator
    {
        report.push("changed", "srp_port", new.name.clone());
    }
}

/// Reports the LUNs and ACLs that differ between two versions of a port, named
/// `{path}/lun/{lun}` and `{path}/acl/{initiator}` (initiators compared as the fabric
/// compares them).
fn port_diff<P: Port>(report: &mut ChangeReport, path: &str, old: &P, new: &P) {
    if (old.alua_group(), old.relative_port()) != (new.alua_group(), new.relative_port()) {
        report.push_detail(
            "changed",
            "target_port",
            path,
            "target port group or relative port: its sessions end and log in again",
        );
    }
    keyed_diff(
        report,
        "lun",
        path,
        old.luns(),
        new.luns(),
        |l| l.lun.to_string(),
        |a, b| a.lun == b.lun,
    );
    keyed_diff(
        report,
        "acl",
        path,
        old.acls(),
        new.acls(),
        |a| a.initiator().to_string(),
        |a, b| a.names(b.initiator()),
    );
}

/// Added, changed and removed members of a list whose members `same` identifies, named
/// `{path}/{object}/{key}`.
fn keyed_diff<T: PartialEq>(
    report: &mut ChangeReport,
    object: &str,
    path: &str,
    old: &[T],
    new: &[T],
    key: impl Fn(&T) -> String,
    same: impl Fn(&T, &T) -> bool,
) {
    for n in new {
        match old.iter().find(|o| same(o, n)) {
            None => report.push("added", object, format!("{path}/{object}/{}", key(n))),
            Some(o) if o != n => {
                report.push("changed", object, format!("{path}/{object}/{}", key(n)))
            }
            _ => {}
        }
    }
    for o in old.iter().filter(|o| !new.iter().any(|n| same(o, n))) {
        report.push("removed", object, format!("{path}/{object}/{}", key(o)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Acl, ByteSize, Chap, Lun, SrpAcl};
    use std::path::Path;

    const IQN: &str = "iqn.2025-01.io.rtgt:t";

    fn base() -> Config {
        Config::from_yaml(
            &format!(
                "\
backstores:
  - {{name: a, type: file, path: a.img, size: 1MiB}}
  - {{name: b, type: null, size: 1MiB}}
targets:
  - name: {IQN}
    portal_groups:
      - tag: 1
        portals: ['127.0.0.1:3260']
        luns: [{{lun: 0, backstore: a}}]
        acls:
          - initiator: iqn.2025-01.io.rtgt:h1
            auth: {{chap: {{user: u, secret: secret-number-one}}}}
srp:
  - name: p0
    luns: [{{lun: 0, backstore: a}}]
    acls: [{{initiator: '0x0000000000000000505400fffe123403'}}]
"
            ),
            Path::new("t.yaml"),
        )
        .unwrap()
    }

    fn lines(r: &ChangeReport) -> Vec<String> {
        r.changes
            .iter()
            .map(|c| format!("{} {} {}", c.action, c.object, c.name))
            .collect()
    }

    #[test]
    fn equal_documents_differ_in_nothing() {
        let c = base();
        assert!(diff(&c, &c).changes.is_empty());
        assert!(diff(&Config::default(), &Config::default())
            .changes
            .is_empty());
    }

    #[test]
    fn backstores_added_removed_changed_and_resized() {
        let old = base();
        let mut new = old.clone();
        new.backstores[0].size = Some(ByteSize(2 << 20));
        new.backstores[1].read_only = true;
        new.backstores.push(new.backstores[1].clone());
        new.backstores[2].name = "c".into();
        let r = diff(&old, &new);
        assert_eq!(
            lines(&r),
            [
                "resized backstore a",
                "changed backstore b",
                "added backstore c"
            ]
        );
        assert_eq!(
            r.changes[0].detail.as_deref(),
            Some("CAPACITY DATA HAS CHANGED")
        );
        assert_eq!(
            lines(&diff(&new, &old)),
            [
                "resized backstore a",
                "changed backstore b",
                "removed backstore c"
            ]
        );
        // A backstore a LUN maps changes its size and cache modes live, nothing else.
        let mut live = old.clone();
        live.backstores[0].write_cache = false;
        live.backstores[0].direct = Some(true);
        live.backstores[0].size = Some(ByteSize(1 << 30));
        let r = diff(&old, &live);
        assert_eq!(lines(&r), ["resized backstore a", "changed backstore a"]);
        let detail = r.changes[1].detail.as_deref().unwrap();
        assert!(detail.contains("direct: true"), "{detail}");
        assert!(detail.contains("write_cache: false"), "{detail}");
        let mut in_use = live.clone();
        in_use.backstores[0].block_size = 4096;
        in_use.backstores[0].thin = false;
        let r = diff(&old, &in_use);
        assert_eq!(lines(&r), ["changed backstore a"]);
        let detail = r.changes[0].detail.as_deref().unwrap();
        assert!(detail.contains("409"), "{detail}");
        assert!(
            detail.contains(": block_size, thin cannot change"),
            "{detail}"
        );
        // Spelling out the default is no change.
        let mut spelled = old.clone();
        spelled.backstores[0].direct = Some(spelled.backstores[0].direct());
        assert!(diff(&old, &spelled).changes.is_empty());
    }

    #[test]
    fn targets_and_what_is_inside_them() {
        let old = base();
        let mut new = old.clone();
        let g = &mut new.targets[0].portal_groups[0];
        g.portals = vec!["127.0.0.1:3261".parse().unwrap()];
        g.luns.push(Lun {
            lun: 1,
            backstore: "b".into(),
        });
        g.luns[0].backstore = "b".into();
        g.acls[0]
            .mapped_luns
            .push(crate::config::MappedLun { lun: 0, tpg_lun: 1 });
        g.acls.push(Acl {
            initiator: "iqn.2025-01.io.rtgt:h2".into(),
            auth: Default::default(),
            mapped_luns: Vec::new(),
        });
        g.auth.chap = Some(Chap {
            user: "g".into(),
            secret: "group-secret-1".into(),
        });
        g.params.queue_depth = Some(64);
        let mut tpg2 = g.clone();
        tpg2.tag = 2;
        tpg2.portals = vec!["127.0.0.1:3262".parse().unwrap()];
        new.targets[0].portal_groups.push(tpg2);
        new.targets[0].alias = Some("x".into());
        let mut t2 = new.targets[0].clone();
        t2.name = "iqn.2025-01.io.rtgt:u".into();
        new.targets.push(t2);
        let r = diff(&old, &new);
        let p = format!("{IQN}/tpg1");
        assert_eq!(
            lines(&r),
            [
                format!("added portal {p}/127.0.0.1:3261"),
                format!("removed portal {p}/127.0.0.1:3260"),
                format!("changed lun {p}/lun/0"),
                format!("added lun {p}/lun/1"),
                format!("changed acl {p}/acl/iqn.2025-01.io.rtgt:h1"),
                format!("added acl {p}/acl/iqn.2025-01.io.rtgt:h2"),
                format!("changed auth {p}"),
                format!("changed params {p}"),
                format!("added portal_group {IQN}/tpg2"),
                format!("changed target {IQN}"),
                "added target iqn.2025-01.io.rtgt:u".to_string(),
            ]
        );
        assert_eq!(
            lines(&diff(&new, &old)),
            [
                format!("added portal {p}/127.0.0.1:3260"),
                format!("removed portal {p}/127.0.0.1:3261"),
                format!("changed lun {p}/lun/0"),
                format!("removed lun {p}/lun/1"),
                format!("changed acl {p}/acl/iqn.2025-01.io.rtgt:h1"),
                format!("removed acl {p}/acl/iqn.2025-01.io.rtgt:h2"),
                format!("changed auth {p}"),
                format!("changed params {p}"),
                format!("removed portal_group {IQN}/tpg2"),
                format!("changed target {IQN}"),
                "removed target iqn.2025-01.io.rtgt:u".to_string(),
            ]
        );
    }

    #[test]
    fn a_secret_change_is_an_acl_change_and_is_never_named() {
        let old = base();
        let mut new = old.clone();
        new.targets[0].portal_groups[0].acls[0]
            .auth
            .chap
            .as_mut()
            .unwrap()
            .secret = "secret-number-two".into();
        new.discovery.auth.chap = Some(Chap {
            user: "d".into(),
            secret: "discovery-secret".into(),
        });
        let r = diff(&old, &new);
        assert_eq!(
            lines(&r),
            [
                format!("changed acl {IQN}/tpg1/acl/iqn.2025-01.io.rtgt:h1"),
                "changed discovery discovery".to_string(),
            ]
        );
        let json = serde_json::to_string(&r).unwrap();
        assert!(!json.contains("secret-number") && !json.contains("discovery-secret"));
    }

    #[test]
    fn srp_ports_luns_and_acls() {
        let old = base();
        let mut new = old.clone();
        let p = &mut new.srp[0];
        p.luns.push(Lun {
            lun: 1,
            backstore: "b".into(),
        });
        // The same initiator in other case is the same ACL.
        p.acls[0].initiator = p.acls[0].initiator.to_uppercase().replacen("0X", "0x", 1);
        p.acls.push(SrpAcl {
            initiator: format!("0x{}", "ab".repeat(16)),
            mapped_luns: Vec::new(),
        });
        p.allow_any_initiator = true;
        let mut p1 = p.clone();
        p1.name = "p1".into();
        new.srp.push(p1);
        let r = diff(&old, &new);
        assert_eq!(
            lines(&r),
            [
                "added lun srp/p0/lun/1".to_string(),
                "changed acl srp/p0/acl/0x0000000000000000505400FFFE123403".to_string(),
                format!("added acl srp/p0/acl/0x{}", "ab".repeat(16)),
                "changed srp_port p0".to_string(),
                "added srp_port p1".to_string(),
            ]
        );
        let r = diff(&new, &old);
        assert_eq!(r.changes.last().unwrap().name, "p1");
        assert_eq!(r.changes.last().unwrap().action, "removed");
        let mut none = old.clone();
        none.srp.clear();
        assert_eq!(lines(&diff(&old, &none)), ["removed srp_port p0"]);
    }

    #[test]
    fn sections_that_apply_at_restart() {
        let old = base();
        let mut new = old.clone();
        new.rdma.eth_mtu = 9000;
        new.api.listen.clear();
        new.policy.backstore_roots.push("/srv/luns".into());
        let r = diff(&old, &new);
        assert_eq!(
            lines(&r),
            [
                "changed rdma rdma",
                "changed api api",
                "changed policy policy"
            ]
        );
        assert!(r
            .changes
            .iter()
            .all(|c| c.detail.as_deref().is_some_and(|d| d.contains("restarts"))));
    }
}
