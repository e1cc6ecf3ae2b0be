//! The `nvme` section of the configuration: NVMe over Fabrics subsystems (an NQN, the hosts
//! it admits, its namespaces on backstores) and the ports hosts reach them through, laid out
//! like the kernel's nvmet configfs tree (subsystems, namespaces, allowed hosts, ports).
//!
//! Every port serves every subsystem and the discovery subsystem; `discovery_listen`
//! adds listeners that serve discovery only (NVMe/TCP hosts look for it on port 8009).

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::fields::is_false;

/// The NQN of the discovery subsystem: no I/O subsystem may have it.
pub const DISCOVERY_NQN: &str = "nqn.2014-08.org.nvmexpress.discovery";
/// The longest NQN (NVMe Base Specification: 223 bytes).
pub const NQN_MAX: usize = 223;

/// NVMe over Fabrics: subsystems and ports.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Nvme {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub subsystems: Vec<NvmeSubsystem>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<NvmePort>,
    /// Listeners that serve only the discovery subsystem (TCP), e.g. `0.0.0.0:8009`, where
    /// `nvme discover -t tcp` looks by default.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schema(value_type = Vec<String>, example = json!(["0.0.0.0:8009"]))]
    pub discovery_listen: Vec<SocketAddr>,
}

/// An NVM subsystem.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NvmeSubsystem {
    /// NVMe Qualified Name: `nqn.YYYY-MM.reversed.domain:name`, at most 223 bytes.
    pub nqn: String,
    /// Serial number of its controllers (1 to 20 printable ASCII characters); derived from
    /// the NQN when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serial: Option<String>,
    /// Admit any host; `hosts` must then be empty.
    #[serde(default, skip_serializing_if = "is_false")]
    pub allow_any_host: bool,
    /// Host NQNs admitted (`nvme connect --hostnqn`, /etc/nvme/hostnqn).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hosts: Vec<String>,
    #[serde(default)]
    pub namespaces: Vec<NvmeNamespace>,
}

/// A namespace: a backstore under a namespace ID.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NvmeNamespace {
    /// 1 to 4294967294.
    pub nsid: u32,
    pub backstore: String,
    /// Serve a backstore that is also a SCSI LUN. Each protocol then sees writes of the
    /// other, but SCSI reservations and ALUA states do not hold for NVMe hosts.
    #[serde(default, skip_serializing_if = "is_false")]
    pub share_with_scsi: bool,
}

/// The transport of a port.
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    ToSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum NvmeTransport {
    /// NVMe/TCP.
    #[default]
    Tcp,
    /// NVMe/RDMA through RDMA/CM (port space TCP, as iSER and SRP) on the daemon's RDMA
    /// provider.
    Rdma,
}

/// A port: one listen address of one transport, listed in the discovery log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NvmePort {
    /// Port ID (the discovery log's PORTID), unique.
    pub id: u16,
    #[serde(default)]
    pub transport: NvmeTransport,
    /// Address and port, e.g. `0.0.0.0:4420`. A wildcard address is listed in the
    /// discovery log as the address the host asked through.
    #[schema(value_type = String, example = "0.0.0.0:4420")]
    pub listen: SocketAddr,
    /// The target port group (of the `alua` section) the port is in: a namespace's
    /// asymmetric access (ANA) state through it is the group's access state for the
    /// namespace's backstore. When the section lists groups, a port that names none is in
    /// the default group 0; without groups every namespace is optimized on every port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alua_group: Option<u16>,
    /// Data an I/O command may carry in its capsule, in bytes (a multiple of 16; Identify
    /// Controller's IOCCSZ): a write up to it goes without an R2T (TCP) or RDMA READ
    /// (RDMA). TCP: 0 to 1 MiB, 128 KiB when absent — a write's data takes a pool buffer
    /// as it arrives either way, so a capsule saves the round trip and costs no memory.
    /// RDMA: 0 to 16 KiB, 8 KiB when absent — every queue entry has a receive buffer that
    /// large posted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_capsule_data_size: Option<u32>,
}

impl NvmeTransport {
    /// As the configuration names it.
    pub fn name(self) -> &'static str {
        match self {
            NvmeTransport::Tcp => "tcp",
            NvmeTransport::Rdma => "rdma",
        }
    }

    /// In-capsule data a port of the transport takes when it names no size.
    pub fn default_in_capsule(self) -> u32 {
        match self {
            NvmeTransport::Tcp => 128 << 10,
            NvmeTransport::Rdma => 8 << 10,
        }
    }

    /// The most in-capsule data a port of the transport may take.
    pub fn max_in_capsule(self) -> u32 {
        match self {
            NvmeTransport::Tcp => 1 << 20,
            NvmeTransport::Rdma => 16 << 10,
        }
    }
}

impl NvmePort {
    /// Its in-capsule data size, in bytes.
    pub fn in_capsule(&self) -> u32 {
        self.in_capsule_data_size
            .unwrap_or(self.transport.default_in_capsule())
    }
}

/// Checks an NQN: `nqn.` and a date (`YYYY-MM.`) then a name, at most 223 bytes, no
/// whitespace or control characters.
pub fn validate_nqn(nqn: &str) -> Result<(), String> {
    let dated = nqn.strip_prefix("nqn.").is_some_and(|rest| {
        let b = rest.as_bytes();
        b.len() > 8
            && b[..7].iter().enumerate().all(|(i, c)| {
                if i == 4 {
                    *c == b'-'
                } else {
                    c.is_ascii_digit()
                }
            })
            && b[7] == b'.'
    });
    if !dated || nqn.len() > NQN_MAX || nqn.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!(
            "{nqn:?} is not an NVMe qualified name (nqn.YYYY-MM.reversed.domain:name, at most {NQN_MAX} bytes)"
        ));
    }
    Ok(())
}

/// What [`Nvme::validate`] checks against the rest of the document.
pub struct Context<'a> {
    /// Whether a backstore of that name exists.
    pub backstore: &'a dyn Fn(&str) -> bool,
    /// Backstores that are SCSI LUNs, with the port that maps each (for messages).
    pub scsi: HashMap<&'a str, String>,
    /// TCP addresses iSCSI portals listen on.
    pub tcp_portals: HashSet<SocketAddr>,
    /// RDMA/CM addresses iSER portals and SRP target ports listen on, with what listens.
    pub rdma_listeners: HashMap<SocketAddr, String>,
}

impl Nvme {
    /// Checks the section; returns the path of the bad field below `nvme` and why.
    pub fn validate(&self, cx: &Context<'_>) -> Result<(), (String, String)> {
        let mut nqns = HashSet::new();
        let mut exported: HashMap<&str, String> = HashMap::new();
        for (si, s) in self.subsystems.iter().enumerate() {
            let at = |f: &str| format!("subsystems[{si}].{f}");
            validate_nqn(&s.nqn).map_err(|m| (at("nqn"), m))?;
            if s.nqn == DISCOVERY_NQN {
                return Err((at("nqn"), "that is the discovery subsystem's NQN".into()));
            }
            if !nqns.insert(s.nqn.as_str()) {
                return Err((at("nqn"), format!("duplicate subsystem {:?}", s.nqn)));
            }
            if let Some(serial) = &s.serial {
                if serial.is_empty()
                    || serial.len() > 20
                    || !serial.chars().all(|c| c.is_ascii_graphic() || c == ' ')
                {
                    return Err((
                        at("serial"),
                        "the serial must be 1 to 20 printable ASCII characters".into(),
                    ));
                }
            }
            if s.allow_any_host && !s.hosts.is_empty() {
                return Err((
                    at("hosts"),
                    "allow_any_host admits every host: list hosts or allow any, not both".into(),
                ));
            }
            let mut hosts = HashSet::new();
            for (hi, h) in s.hosts.iter().enumerate() {
                validate_nqn(h).map_err(|m| (at(&format!("hosts[{hi}]")), m))?;
                if !hosts.insert(h.as_str()) {
                    return Err((
                        at(&format!("hosts[{hi}]")),
                        format!("host {h:?} is listed twice"),
                    ));
                }
            }
            let mut nsids = HashSet::new();
            for (ni, n) in s.namespaces.iter().enumerate() {
                let nat = |f: &str| at(&format!("namespaces[{ni}].{f}"));
                if n.nsid == 0 || n.nsid == u32::MAX {
                    return Err((nat("nsid"), "a namespace ID is 1 to 4294967294".into()));
                }
                if !nsids.insert(n.nsid) {
                    return Err((nat("nsid"), format!("namespace {} is listed twice", n.nsid)));
                }
                if !(cx.backstore)(&n.backstore) {
                    return Err((
                        nat("backstore"),
                        format!("unknown backstore {:?}", n.backstore),
                    ));
                }
                let here = format!("namespace {} of {}", n.nsid, s.nqn);
                if let Some(other) = exported.insert(&n.backstore, here) {
                    return Err((
                        nat("backstore"),
                        format!("backstore {:?} is already {other}", n.backstore),
                    ));
                }
                if let Some(port) = cx.scsi.get(n.backstore.as_str()) {
                    if !n.share_with_scsi {
                        return Err((
                            nat("share_with_scsi"),
                            format!(
                                "backstore {:?} is a LUN of {port}: set share_with_scsi: true to serve it over NVMe too (SCSI reservations and ALUA states do not hold for NVMe hosts)",
                                n.backstore
                            ),
                        ));
                    }
                }
            }
        }
        let mut ids = HashSet::new();
        let mut listen = HashSet::new();
        let listeners = self
            .ports
            .iter()
            .enumerate()
            .map(|(i, p)| (format!("ports[{i}].listen"), p.transport, p.listen))
            .chain(
                self.discovery_listen
                    .iter()
                    .enumerate()
                    .map(|(i, a)| (format!("discovery_listen[{i}]"), NvmeTransport::Tcp, *a)),
            );
        for (i, p) in self.ports.iter().enumerate() {
            if !ids.insert(p.id) {
                return Err((
                    format!("ports[{i}].id"),
                    format!("port {} is listed twice", p.id),
                ));
            }
            let max = p.transport.max_in_capsule();
            if let Some(n) = p.in_capsule_data_size.filter(|n| n % 16 != 0 || *n > max) {
                return Err((
                    format!("ports[{i}].in_capsule_data_size"),
                    format!(
                        "{n}: in-capsule data is a multiple of 16 bytes, at most {max} on {}",
                        p.transport.name()
                    ),
                ));
            }
        }
        for (at, transport, a) in listeners {
            if a.port() == 0 {
                return Err((at, format!("{a}: a listener needs a port number")));
            }
            // TCP and RDMA/CM ports are apart: both may listen on 4420.
            if !listen.insert((transport, a)) {
                return Err((at, format!("{a} is listed twice")));
            }
            match transport {
                NvmeTransport::Tcp if cx.tcp_portals.contains(&a) => {
                    return Err((at, format!("{a} is an iSCSI portal")));
                }
                NvmeTransport::Rdma => {
                    if let Some(who) = cx.rdma_listeners.get(&a) {
                        return Err((at, format!("{a} is the RDMA/CM address of {who}")));
                    }
                }
                NvmeTransport::Tcp => {}
            }
        }
        Ok(())
    }

    /// Whether a namespace is on the backstore.
    pub fn exports(&self, backstore: &str) -> bool {
        self.subsystems
            .iter()
            .flat_map(|s| &s.namespaces)
            .any(|n| n.backstore == backstore)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nqns_are_checked() {
        for ok in [
            "nqn.2025-01.io.rtgt:disk0",
            "nqn.2014-08.org.nvmexpress:uuid:1b4e28ba-2fa1-11d2-883f-0016d3ccabcd",
        ] {
            assert_eq!(validate_nqn(ok), Ok(()), "{ok}");
        }
        let long = format!("nqn.2025-01.io.rtgt:{}", "x".repeat(NQN_MAX));
        for bad in [
            "",
            "iqn.2025-01.io.rtgt:x",
            "nqn.25-01.io.rtgt",
            "nqn.2025-01",
            "nqn.2025-01.io rtgt",
            long.as_str(),
        ] {
            assert!(validate_nqn(bad).is_err(), "{bad}");
        }
    }
}
