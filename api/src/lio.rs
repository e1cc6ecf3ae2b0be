//! Conversion of a targetcli/rtslib `saveconfig.json` into an rtgt configuration.
//!
//! Backstores (fileio, block, ramdisk), iSCSI targets with their portal groups, portals,
//! LUNs, node ACLs with mapped LUNs, CHAP credentials, the iSCSI parameters rtgt knows and
//! discovery authentication carry over; what rtgt has no equivalent for (other fabrics,
//! user and pscsi backstores, LIO-only attributes) is listed in the warnings.

use std::path::PathBuf;

use serde_json::Value;

use crate::config::{
    Acl, Auth, Backstore, BackstoreKind, ByteSize, Chap, Config, IscsiParams, Lun, MappedLun,
    PortalGroup, Target,
};

/// A converted configuration and what did not carry over.
#[derive(Debug)]
pub struct Import {
    pub config: Config,
    pub warnings: Vec<String>,
}

fn s<'a>(v: &'a Value, k: &str) -> Option<&'a str> {
    v.get(k).and_then(Value::as_str).filter(|s| !s.is_empty())
}

fn u(v: &Value, k: &str) -> Option<u64> {
    v.get(k).and_then(|x| {
        x.as_u64()
            .or_else(|| x.as_str().and_then(|s| s.trim().parse().ok()))
    })
}

fn chap(v: &Value, user: &str, secret: &str) -> Option<Chap> {
    Some(Chap {
        user: s(v, user)?.to_string(),
        secret: s(v, secret)?.to_string(),
    })
}

fn auth(v: &Value, prefix: &str) -> Auth {
    Auth {
        chap: chap(v, &format!("{prefix}userid"), &format!("{prefix}password")),
        mutual_chap: chap(
            v,
            &format!("{prefix}mutual_userid"),
            &format!("{prefix}mutual_password"),
        ),
    }
}

fn yes(v: &str) -> bool {
    v.eq_ignore_ascii_case("yes")
}

fn params(p: &Value, attributes: &Value) -> IscsiParams {
    let num = |k: &str| u(p, k);
    let digest = |k: &str| s(p, k).map(|v| v.to_ascii_uppercase().starts_with("CRC32C"));
    IscsiParams {
        max_recv_data_segment_length: num("MaxRecvDataSegmentLength").map(|v| v as u32),
        max_burst_length: num("MaxBurstLength").map(|v| v as u32),
        first_burst_length: num("FirstBurstLength").map(|v| v as u32),
        initial_r2t: s(p, "InitialR2T").map(yes),
        immediate_data: s(p, "ImmediateData").map(yes),
        max_outstanding_r2t: num("MaxOutstandingR2T").map(|v| v as u32),
        max_connections: num("MaxConnections").map(|v| v as u16),
        default_time2_wait: num("DefaultTime2Wait").map(|v| v as u16),
        default_time2_retain: num("DefaultTime2Retain").map(|v| v as u16),
        header_digest: digest("HeaderDigest"),
        data_digest: digest("DataDigest"),
        error_recovery_level: num("ErrorRecoveryLevel").map(|v| v as u8),
        queue_depth: u(attributes, "default_cmdsn_depth").map(|v| v as u32),
        nopin_interval: None,
        nopin_timeout: None,
        busy_poll_micros: None,
        zero_copy_reads: None,
    }
}

/// Converts the text of a `saveconfig.json`.
pub fn convert(json: &str) -> Result<Import, String> {
    let root: Value = serde_json::from_str(json).map_err(|e| format!("not JSON: {e}"))?;
    let mut warnings = Vec::new();
    let mut config = Config::default();

    let empty = Vec::new();
    for so in root
        .get("storage_objects")
        .and_then(Value::as_array)
        .unwrap_or(&empty)
    {
        let name = s(so, "name").unwrap_or("").to_string();
        let plugin = s(so, "plugin").unwrap_or("");
        let kind = match plugin {
            "fileio" => BackstoreKind::File,
            "block" => BackstoreKind::Block,
            "ramdisk" if so.get("nullio").and_then(Value::as_bool) == Some(true) => {
                BackstoreKind::Null
            }
            "ramdisk" => BackstoreKind::Ramdisk,
            other => {
                warnings.push(format!(
                    "storage object {name:?}: {other} backstores are not supported; skipped"
                ));
                continue;
            }
        };
        let attrs = so.get("attributes").cloned().unwrap_or(Value::Null);
        let block_size = u(&attrs, "block_size").unwrap_or(512) as u32;
        config.backstores.push(Backstore {
            name: name.clone(),
            kind,
            path: matches!(kind, BackstoreKind::File | BackstoreKind::Block)
                .then(|| s(so, "dev").map(PathBuf::from))
                .flatten(),
            size: match kind {
                BackstoreKind::Block => None,
                _ => u(so, "size").map(ByteSize),
            },
            block_size,
            read_only: so.get("readonly").and_then(Value::as_bool).unwrap_or(false),
            wwn: None,
            // LIO's unit serial is the storage object's UUID (VPD 0x80): keep it so
            // initiators see the same device.
            serial: s(so, "wwn").map(str::to_string),
            thin: u(&attrs, "emulate_tpu").map(|v| v != 0).unwrap_or(true),
            write_cache: so
                .get("write_back")
                .and_then(Value::as_bool)
                .or_else(|| u(&attrs, "emulate_write_cache").map(|v| v != 0))
                .unwrap_or(true),
            // fileio goes through the page cache (O_DSYNC without write_back); iblock
            // submits bios to the device, past it.
            direct: matches!(kind, BackstoreKind::File | BackstoreKind::Block)
                .then_some(kind == BackstoreKind::Block),
            physical_block_size: None,
            removable: false,
            sanitize_rate: None,
            shared: None,
            rbd: None,
        });
    }

    for fm in root
        .get("fabric_modules")
        .and_then(Value::as_array)
        .unwrap_or(&empty)
    {
        if s(fm, "name") == Some("iscsi")
            && fm.get("discovery_enable_auth").and_then(Value::as_bool) == Some(true)
        {
            config.discovery.auth = auth(fm, "discovery_");
        }
    }

    for t in root
        .get("targets")
        .and_then(Value::as_array)
        .unwrap_or(&empty)
    {
        let name = s(t, "wwn").unwrap_or("").to_string();
        if s(t, "fabric") != Some("iscsi") {
            warnings.push(format!(
                "target {name:?}: fabric {:?} is not converted (iSER/SRP endpoints are configured separately)",
                s(t, "fabric").unwrap_or("")
            ));
            continue;
        }
        let mut groups = Vec::new();
        for g in t.get("tpgs").and_then(Value::as_array).unwrap_or(&empty) {
            let tag = u(g, "tag").unwrap_or(1) as u16;
            if g.get("enable").and_then(Value::as_bool) == Some(false) {
                warnings.push(format!("{name} tpg {tag}: disabled in LIO; skipped"));
                continue;
            }
            let attrs = g.get("attributes").cloned().unwrap_or(Value::Null);
            let mut portals = Vec::new();
            let (mut iser_on, mut iser_off) = (0usize, 0usize);
            for p in g.get("portals").and_then(Value::as_array).unwrap_or(&empty) {
                let ip = s(p, "ip_address").unwrap_or("0.0.0.0");
                let port = u(p, "port").unwrap_or(3260);
                let text = if ip.contains(':') && !ip.starts_with('[') {
                    format!("[{ip}]:{port}")
                } else {
                    format!("{ip}:{port}")
                };
                match text.parse() {
                    Ok(a) => portals.push(a),
                    Err(_) => warnings.push(format!("{name} tpg {tag}: portal {text:?} skipped")),
                }
                if p.get("iser").and_then(Value::as_bool) == Some(true) {
                    iser_on += 1;
                } else {
                    iser_off += 1;
                }
            }
            // rtgt serves iSER per portal group, on every portal of the group.
            if iser_on > 0 && iser_off > 0 {
                warnings.push(format!(
                    "{name} tpg {tag}: iSER was enabled on {iser_on} of {} portals; rtgt serves it on all of them",
                    iser_on + iser_off
                ));
            }
            let mut luns = Vec::new();
            for l in g.get("luns").and_then(Value::as_array).unwrap_or(&empty) {
                let so = s(l, "storage_object").unwrap_or("");
                let backstore = so.rsplit('/').next().unwrap_or("").to_string();
                if !config.backstores.iter().any(|b| b.name == backstore) {
                    warnings.push(format!(
                        "{name} tpg {tag}: LUN {} on {so:?} skipped (backstore not converted)",
                        u(l, "index").unwrap_or(0)
                    ));
                    continue;
                }
                luns.push(Lun {
                    lun: u(l, "index").unwrap_or(0),
                    backstore,
                });
            }
            let mut acls = Vec::new();
            for a in g
                .get("node_acls")
                .and_then(Value::as_array)
                .unwrap_or(&empty)
            {
                let mapped_luns = a
                    .get("mapped_luns")
                    .and_then(Value::as_array)
                    .unwrap_or(&empty)
                    .iter()
                    .filter(|m| luns.iter().any(|l| Some(l.lun) == u(m, "tpg_lun")))
                    .map(|m| MappedLun {
                        lun: u(m, "index").unwrap_or(0),
                        tpg_lun: u(m, "tpg_lun").unwrap_or(0),
                    })
                    .collect::<Vec<_>>();
                if a.get("mapped_luns")
                    .and_then(Value::as_array)
                    .is_some_and(|m| {
                        m.iter()
                            .any(|m| m.get("write_protect") == Some(&Value::Bool(true)))
                    })
                {
                    warnings.push(format!(
                        "{name} tpg {tag}: ACL {}: write-protected mapped LUNs become writable (use a read-only backstore)",
                        s(a, "node_wwn").unwrap_or("")
                    ));
                }
                acls.push(Acl {
                    initiator: s(a, "node_wwn").unwrap_or("").to_string(),
                    auth: auth(a, "chap_"),
                    mapped_luns,
                });
            }
            let any = u(&attrs, "generate_node_acls").is_some_and(|v| v != 0);
            let mut tpg_auth = auth(g, "chap_");
            if u(&attrs, "authentication") == Some(0) {
                tpg_auth = Auth::default();
                for a in &mut acls {
                    if a.auth.chap.is_some() {
                        warnings.push(format!(
                            "{name} tpg {tag}: ACL {}: CHAP credentials kept although LIO had authentication off",
                            a.initiator
                        ));
                    }
                }
            }
            groups.push(PortalGroup {
                tag,
                portals,
                auth: tpg_auth,
                allow_any_initiator: any,
                luns,
                acls,
                params: params(g.get("parameters").unwrap_or(&Value::Null), &attrs),
                iser: iser_on > 0,
                alua_group: None,
                relative_port: None,
            });
        }
        if groups.is_empty() {
            warnings.push(format!("target {name:?}: no enabled portal group; skipped"));
            continue;
        }
        config.targets.push(Target {
            name,
            alias: None,
            portal_groups: groups,
        });
    }
    config.validate().map_err(|(path, msg)| {
        format!("the converted configuration is not valid: {path}: {msg}")
    })?;
    Ok(Import { config, warnings })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAVECONFIG: &str = r#"{
  "fabric_modules": [{"name": "iscsi", "discovery_enable_auth": true,
     "discovery_userid": "disc", "discovery_password": "discovery-secret"}],
  "storage_objects": [
    {"name": "disk1", "plugin": "fileio", "dev": "/var/lib/disk1.img", "size": 1073741824,
     "write_back": false, "wwn": "043a5a3a-b788-4dce-80df-74399f76a519",
     "attributes": {"block_size": 512, "emulate_tpu": 0}},
    {"name": "blk", "plugin": "block", "dev": "/dev/vg/lv01", "readonly": true,
     "attributes": {"block_size": 4096}},
    {"name": "ram0", "plugin": "ramdisk", "size": 67108864, "nullio": false},
    {"name": "user0", "plugin": "user", "config": "rbd/pool/img"}
  ],
  "targets": [
    {"fabric": "iscsi", "wwn": "iqn.2003-01.org.linux-iscsi.host:sn.1234",
     "tpgs": [{"tag": 1, "enable": true,
       "attributes": {"authentication": 1, "generate_node_acls": 0, "default_cmdsn_depth": 64},
       "parameters": {"HeaderDigest": "CRC32C,None", "DataDigest": "None", "InitialR2T": "Yes",
                      "MaxRecvDataSegmentLength": "8192", "ErrorRecoveryLevel": "0"},
       "portals": [{"ip_address": "0.0.0.0", "port": 3260, "iser": false},
                   {"ip_address": "::1", "port": 3261}],
       "luns": [{"index": 0, "storage_object": "/backstores/fileio/disk1"},
                {"index": 1, "storage_object": "/backstores/block/blk"},
                {"index": 2, "storage_object": "/backstores/user/user0"}],
       "node_acls": [{"node_wwn": "iqn.1994-05.com.redhat:client",
          "chap_userid": "client", "chap_password": "client-secret-12",
          "chap_mutual_userid": "target", "chap_mutual_password": "target-secret-12",
          "mapped_luns": [{"index": 0, "tpg_lun": 1, "write_protect": false}]}]}]},
    {"fabric": "srpt", "wwn": "fe80:0000:0000:0000:0002:c903:000e:8acd", "tpgs": []}
  ]
}"#;

    #[test]
    fn converts_a_saveconfig() {
        let Import { config, warnings } = convert(SAVECONFIG).unwrap();
        assert_eq!(config.backstores.len(), 3);
        let d = &config.backstores[0];
        assert_eq!(d.kind, BackstoreKind::File);
        assert_eq!(d.size, Some(ByteSize(1 << 30)));
        assert!(!d.write_cache && !d.thin);
        // fileio serves through the page cache, iblock past it.
        assert_eq!(d.direct, Some(false));
        assert_eq!(config.backstores[1].direct, Some(true));
        assert_eq!(config.backstores[2].direct, None);
        assert_eq!(
            d.serial.as_deref(),
            Some("043a5a3a-b788-4dce-80df-74399f76a519")
        );
        assert!(config.backstores[1].read_only);
        assert_eq!(config.backstores[1].block_size, 4096);
        let t = &config.targets[0];
        let g = &t.portal_groups[0];
        assert_eq!(g.portals.len(), 2);
        assert_eq!(g.portals[1].to_string(), "[::1]:3261");
        assert_eq!(g.luns.len(), 2);
        assert!(!g.allow_any_initiator);
        assert_eq!(g.params.header_digest, Some(true));
        assert_eq!(g.params.data_digest, Some(false));
        assert_eq!(g.params.initial_r2t, Some(true));
        assert_eq!(g.params.queue_depth, Some(64));
        let a = &g.acls[0];
        assert_eq!(a.auth.chap.as_ref().unwrap().user, "client");
        assert_eq!(a.auth.mutual_chap.as_ref().unwrap().user, "target");
        assert_eq!(a.mapped_luns, vec![MappedLun { lun: 0, tpg_lun: 1 }]);
        assert_eq!(config.discovery.auth.chap.as_ref().unwrap().user, "disc");
        assert!(warnings.iter().any(|w| w.contains("user0")));
        assert!(warnings.iter().any(|w| w.contains("srpt")));
        // The result round-trips through YAML.
        let again = Config::from_yaml(&config.to_yaml(), std::path::Path::new("x")).unwrap();
        assert_eq!(again, config);
    }

    #[test]
    fn bad_input() {
        assert!(convert("not json").is_err());
        // A CHAP secret LIO accepted but rtgt finds too short is named.
        let e = convert(r#"{"fabric_modules": [{"name": "iscsi", "discovery_enable_auth": true, "discovery_userid": "u", "discovery_password": "short"}]}"#)
            .unwrap_err();
        assert!(e.contains("discovery.auth.chap.secret"), "{e}");
        assert!(convert("{}").unwrap().config.targets.is_empty());
    }
}
