//! SRP in the daemon: target ports from the configuration, their identifiers, and the string
//! an administrator writes into Linux ib_srp's `add_target` to reach each of them.

use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use rtgt_api::config::{self, Config};

use crate::core::{Acl, Registry, SrpTargetPort};
use crate::scsi::{Device, LunMap};

/// A stable 64-bit identifier derived from the host (`/etc/machine-id`), the port name and
/// `what`, so two appliances never collide and a restart keeps the identity. The top byte is
/// cleared so the value never looks like an IEEE-assigned GUID of real hardware.
pub fn derived_id(name: &str, what: &str) -> u64 {
    let host = std::fs::read_to_string("/etc/machine-id").unwrap_or_default();
    let mut h = std::collections::hash_map::DefaultHasher::new();
    ("rtgt-srp", host.trim(), name, what).hash(&mut h);
    h.finish() & 0x00ff_ffff_ffff_ffff
}

/// The target port of `p` with the LUNs and ACLs resolved against `devices`.
pub fn target_port(p: &config::SrpPort, devices: &BTreeMap<String, Arc<Device>>) -> SrpTargetPort {
    let mut luns = LunMap::default();
    for l in &p.luns {
        luns.luns.insert(l.lun, devices[&l.backstore].clone());
    }
    let mut acls = HashMap::new();
    for a in &p.acls {
        let mapped = if a.mapped_luns.is_empty() {
            luns.clone()
        } else {
            let mut m = LunMap::default();
            for ml in &a.mapped_luns {
                m.luns.insert(ml.lun, luns.luns[&ml.tpg_lun].clone());
            }
            m
        };
        let name = a.initiator.to_ascii_lowercase();
        acls.insert(
            name.clone(),
            Acl {
                initiator: name,
                auth: Default::default(),
                luns: mapped,
            },
        );
    }
    SrpTargetPort {
        name: p.name.clone(),
        id_ext: p
            .id_ext
            .as_deref()
            .and_then(config::parse_hex64)
            .unwrap_or_else(|| derived_id(&p.name, "id_ext")),
        ioc_guid: p
            .ioc_guid
            .as_deref()
            .and_then(config::parse_hex64)
            .unwrap_or_else(|| derived_id(&p.name, "ioc_guid")),
        listen: p.listen.clone(),
        acls,
        allow_any_initiator: p.allow_any_initiator,
        luns,
    }
}

/// Registers every SRP target port of `config`.
pub fn register_ports(
    config: &Config,
    devices: &BTreeMap<String, Arc<Device>>,
    registry: &Registry,
) {
    for p in &config.srp {
        let port = target_port(p, devices);
        if port.allow_any_initiator {
            tracing::warn!(port = %port.name, "SRP target port admits any initiator");
        }
        registry.set_srp_port(port);
    }
}

/// The `add_target` strings of `port` (Linux ib_srp over RDMA/CM): one per listen address,
/// and for a wildcard listen address one per address in `local` of its family.
pub fn add_target_strings(port: &SrpTargetPort, local: &[IpAddr]) -> Vec<String> {
    let mut out = Vec::new();
    let mut push = |a: SocketAddr| {
        let dest = match a {
            SocketAddr::V4(v4) => format!("{}:{}", v4.ip(), v4.port()),
            SocketAddr::V6(v6) => format!("[{}]:{}", v6.ip(), v6.port()),
        };
        let s = format!(
            "id_ext={:016x},ioc_guid={:016x},dest={dest}",
            port.id_ext, port.ioc_guid
        );
        if !out.contains(&s) {
            out.push(s);
        }
    };
    for l in &port.listen {
        if l.ip().is_unspecified() {
            let mut addrs: Vec<IpAddr> = local
                .iter()
                .copied()
                .filter(|a| a.is_ipv4() == l.is_ipv4() && !a.is_unspecified())
                .collect();
            // Loopback last: a remote initiator cannot use it.
            addrs.sort_by_key(|a| a.is_loopback());
            for a in addrs {
                push(SocketAddr::new(a, l.port()));
            }
        } else {
            push(*l);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn identifiers_and_add_target() {
        let c = Config::from_yaml(
            "srp:\n  - {name: a, id_ext: '0x0002c90300001111', ioc_guid: 0002c90300002222, listen: ['0.0.0.0:5555', '192.0.2.9:5556']}\n  - {name: b}\n",
            Path::new("t.yaml"),
        )
        .unwrap();
        let a = target_port(&c.srp[0], &BTreeMap::new());
        let b = target_port(&c.srp[1], &BTreeMap::new());
        assert_eq!(a.id_ext, 0x0002_c903_0000_1111);
        assert_ne!(b.id_ext, b.ioc_guid);
        assert_eq!(b.id_ext, derived_id("b", "id_ext"), "stable across calls");
        assert_ne!(b.id_ext, derived_id("c", "id_ext"));
        let local: Vec<IpAddr> = vec![
            "127.0.0.1".parse().unwrap(),
            "10.1.2.3".parse().unwrap(),
            "fe80::1".parse().unwrap(),
        ];
        assert_eq!(
            add_target_strings(&a, &local),
            vec![
                "id_ext=0002c90300001111,ioc_guid=0002c90300002222,dest=10.1.2.3:5555",
                "id_ext=0002c90300001111,ioc_guid=0002c90300002222,dest=127.0.0.1:5555",
                "id_ext=0002c90300001111,ioc_guid=0002c90300002222,dest=192.0.2.9:5556",
            ]
        );
    }
}
