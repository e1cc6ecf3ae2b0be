//! SendTargets (RFC 7143 §13.3, Appendix C): the target list a discovery session (or a
//! normal session's Text request) returns, with one TargetAddress per portal.

use std::net::{IpAddr, SocketAddr};

use rtgt_scsi::core::{PortalGroup, Registry, Target};

use super::params::TransportKind;
use super::text::TextPairs;

/// Formats a portal as `ip:port,tag` (IPv6 in brackets, RFC 7143 §13.8), replacing a
/// wildcard address with the address the connection arrived on.
pub fn target_address(portal: SocketAddr, tag: u16, local: SocketAddr) -> String {
    let ip = if portal.ip().is_unspecified() {
        local.ip()
    } else {
        portal.ip()
    };
    let ip = match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        },
        v4 => v4,
    };
    match ip {
        IpAddr::V4(v4) => format!("{v4}:{},{tag}", portal.port()),
        IpAddr::V6(v6) => format!("[{v6}]:{},{tag}", portal.port()),
    }
}

/// Whether a wildcard portal of one address family can be reached from `local`.
fn reachable(portal: SocketAddr, local: SocketAddr) -> bool {
    if !portal.ip().is_unspecified() {
        return true;
    }
    // A v6 wildcard listener also accepts v4 connections (dual stack).
    portal.is_ipv6() || local.is_ipv4() || local.ip().to_canonical().is_ipv4()
}

/// Appends `TargetName` and its `TargetAddress`es for the portal groups that admit
/// `initiator`. Returns whether the target was listed.
fn append_target(
    out: &mut TextPairs,
    t: &Target,
    initiator: &str,
    local: SocketAddr,
    transport: TransportKind,
) -> bool {
    let groups: Vec<&PortalGroup> = t
        .portal_groups
        .iter()
        .filter(|g| g.admit(initiator).is_some())
        .filter(|g| transport == TransportKind::Tcp || g.iser)
        .collect();
    if groups.is_empty() {
        return false;
    }
    out.push("TargetName", t.name.clone());
    for g in groups {
        if g.portals.is_empty() {
            out.push("TargetAddress", target_address(local, g.tag, local));
        }
        for p in &g.portals {
            if reachable(*p, local) {
                out.push("TargetAddress", target_address(*p, g.tag, local));
            }
        }
    }
    true
}

/// Answers `SendTargets=<query>` (RFC 7143 §13.3): `All` lists every target the initiator
/// may log in to (only allowed in discovery sessions), a name lists that target, and the
/// empty value lists the session's own target (`session_target`, normal sessions only).
pub fn send_targets(
    registry: &Registry,
    initiator: &str,
    query: &str,
    local: SocketAddr,
    session_target: Option<&str>,
) -> TextPairs {
    send_targets_over(
        registry,
        initiator,
        query,
        local,
        session_target,
        TransportKind::Tcp,
    )
}

/// [`send_targets`] for a session on `transport`: over iSER only the portal groups that
/// serve iSER are listed.
pub fn send_targets_over(
    registry: &Registry,
    initiator: &str,
    query: &str,
    local: SocketAddr,
    session_target: Option<&str>,
    transport: TransportKind,
) -> TextPairs {
    let mut out = TextPairs::new();
    match query {
        "All" if session_target.is_none() => {
            for t in registry.targets() {
                append_target(&mut out, &t, initiator, local, transport);
            }
        }
        "All" => {
            // RFC 7143 §13.3: in a normal session "All" is limited to the session's target
            // as far as this target is concerned; list it.
            if let Some(t) = session_target.and_then(|n| registry.target(n)) {
                append_target(&mut out, &t, initiator, local, transport);
            }
        }
        "" => {
            if let Some(t) = session_target.and_then(|n| registry.target(n)) {
                append_target(&mut out, &t, initiator, local, transport);
            }
        }
        name => {
            if let Some(t) = registry.target(name) {
                append_target(&mut out, &t, initiator, local, transport);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use rtgt_scsi::core::{Auth, IscsiParams};
    use rtgt_scsi::LunMap;
    use std::collections::HashMap;

    fn pg(tag: u16, portals: &[&str], any: bool) -> PortalGroup {
        PortalGroup {
            tag,
            ids: rtgt_scsi::core::PortIds::alone(tag),
            portals: portals.iter().map(|p| p.parse().unwrap()).collect(),
            auth: Auth::default(),
            acls: HashMap::new(),
            allow_any_initiator: any,
            luns: LunMap::default(),
            params: IscsiParams::default(),
            iser: true,
        }
    }

    fn registry() -> std::sync::Arc<Registry> {
        let r = Registry::new();
        r.set_target(Target {
            name: "iqn.2025-01.io.rtgt:a".into(),
            alias: None,
            portal_groups: vec![
                pg(1, &["0.0.0.0:3260"], true),
                pg(2, &["192.0.2.7:3261", "[2001:db8::1]:3260"], true),
            ],
        });
        r.set_target(Target {
            name: "iqn.2025-01.io.rtgt:b".into(),
            alias: None,
            portal_groups: vec![pg(1, &["0.0.0.0:3260"], false)],
        });
        r
    }

    #[test]
    fn address_format() {
        let local: SocketAddr = "10.0.0.5:3260".parse().unwrap();
        assert_eq!(
            target_address("0.0.0.0:3260".parse().unwrap(), 1, local),
            "10.0.0.5:3260,1"
        );
        assert_eq!(
            target_address("[2001:db8::1]:3260".parse().unwrap(), 3, local),
            "[2001:db8::1]:3260,3"
        );
        let mapped: SocketAddr = "[::ffff:10.0.0.5]:3260".parse().unwrap();
        assert_eq!(
            target_address("[::]:3260".parse().unwrap(), 1, mapped),
            "10.0.0.5:3260,1"
        );
    }

    #[test]
    fn all_lists_admitted_targets() {
        let r = registry();
        let local: SocketAddr = "127.0.0.1:3260".parse().unwrap();
        let t = send_targets(&r, "iqn.init", "All", local, None);
        let v: Vec<_> = t.iter().collect();
        assert_eq!(
            v,
            vec![
                ("TargetName", "iqn.2025-01.io.rtgt:a"),
                ("TargetAddress", "127.0.0.1:3260,1"),
                ("TargetAddress", "192.0.2.7:3261,2"),
                ("TargetAddress", "[2001:db8::1]:3260,2"),
            ]
        );
    }

    #[test]
    fn iser_lists_iser_portal_groups_only() {
        let r = registry();
        let mut a = (*r.target("iqn.2025-01.io.rtgt:a").unwrap()).clone();
        a.portal_groups[1].iser = false;
        r.set_target(a);
        let local: SocketAddr = "127.0.0.1:3260".parse().unwrap();
        let tcp = send_targets_over(&r, "i", "All", local, None, TransportKind::Tcp);
        assert_eq!(tcp.iter().filter(|(k, _)| *k == "TargetAddress").count(), 3);
        let iser = send_targets_over(&r, "i", "All", local, None, TransportKind::Iser);
        let v: Vec<_> = iser.iter().collect();
        assert_eq!(
            v,
            vec![
                ("TargetName", "iqn.2025-01.io.rtgt:a"),
                ("TargetAddress", "127.0.0.1:3260,1"),
            ]
        );
    }

    #[test]
    fn by_name_and_session_target() {
        let r = registry();
        let local: SocketAddr = "127.0.0.1:3260".parse().unwrap();
        assert!(send_targets(&r, "i", "iqn.2025-01.io.rtgt:b", local, None).is_empty());
        assert!(send_targets(&r, "i", "iqn.nope", local, None).is_empty());
        let t = send_targets(&r, "i", "", local, Some("iqn.2025-01.io.rtgt:a"));
        assert_eq!(t.get("TargetName"), Some("iqn.2025-01.io.rtgt:a"));
        assert!(send_targets(&r, "i", "", local, None).is_empty());
    }
}
