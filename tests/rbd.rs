//! rtgtd over Ceph: two gateways export one RBD image of a real one-node cluster
//! (`tests/ceph/cluster.sh`) as one LUN, each in its own ALUA group. Data written through
//! one is read through the other, COMPARE AND WRITE is atomic on the image (a stale compare
//! through the other gateway miscompares), WRITE SAME zeroes, persistent reservations hold
//! across the gateways (and a gateway restarted after a rename of the image), PREEMPT AND
//! ABORT through one ends the preempted nexus's commands on the other before it completes,
//! the target port group states are one for both (SET TARGET PORT GROUPS through one, a
//! failback through the other's API; an NVMe host of one hears of each as an ANA change), a
//! resize with the cluster's tools reaches initiators of both gateways as CAPACITY DATA HAS
//! CHANGED (and the NVMe host as a namespace change), and while the cluster is out of reach
//! commands end with NOT READY and service resumes after.

#[path = "ceph/mod.rs"]
mod ceph;
mod common;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use ceph::TestCluster;
use common::{free_port, skip_or_fail, Rtgtd, TEST_IQN};
use rtgt_api::client::Client;
use rtgt_iscsi::pdu::tmf;
use rtgt_nvme::admin::{ana, event, log};
use rtgt_tools::iscsi::{LoginConfig, ScsiResult, Session, SubmitOptions};
use rtgt_tools::nvme::{HostConfig, Queue};

const WWN: &str = "6001405aabbccdd0011223344556677c";
const NQN: &str = "nqn.2025-01.io.rtgt:rbd";

fn gateway(c: &TestCluster, group: u16, port: u16, nvme: u16) -> String {
    gateway_of(c, "lun", group, port, nvme)
}

/// Gateway `group` (1 or 2) of the image: both are configured alike, group 1
/// active/optimized and group 2 active/non-optimized, both allowing SET TARGET PORT GROUPS,
/// each with its own port and the other's as a remote port; the image is also namespace 1 of
/// an NVMe subsystem on NVMe/TCP port `nvme`, in the gateway's group.
fn gateway_of(c: &TestCluster, image: &str, group: u16, port: u16, nvme: u16) -> String {
    let remote = |g: u16| match g == group {
        true => String::new(),
        false => format!(", remote_ports: [{g}]"),
    };
    format!(
        "\
backstores:
  - name: d0
    type: rbd
    wwn: {WWN}
    serial: rbdlun0001
    rbd: {{image: {image}, ceph_conf: {conf}, op_timeout_secs: 3}}
targets:
  - name: {TEST_IQN}
    portal_groups:
      - {{tag: {group}, portals: ['127.0.0.1:{port}'], allow_any_initiator: true, alua_group: {group},
         luns: [{{lun: 0, backstore: d0}}], params: {{NopInInterval: 0}}}}
alua:
  groups:
    - {{id: 1, explicit: true{r1}}}
    - {{id: 2, state: active_non_optimized, explicit: true{r2}}}
nvme:
  subsystems:
    - nqn: {NQN}
      allow_any_host: true
      namespaces: [{{nsid: 1, backstore: d0, share_with_scsi: true}}]
  ports: [{{id: {group}, transport: tcp, listen: '127.0.0.1:{nvme}', alua_group: {group}}}]
policy: {{backstore_roots: ['{dir}']}}
",
        conf = c.conf().display(),
        dir = c.dir().display(),
        r1 = remote(1),
        r2 = remote(2),
    )
}

/// The ANA state of namespace 1 through the controller of `q`.
async fn ana_state(q: &Queue) -> u8 {
    let (_, groups) = q.ana_log().await.unwrap();
    assert_eq!(groups.len(), 1, "{groups:?}");
    assert_eq!(groups[0].nsids, [1]);
    groups[0].state
}

/// Waits for an asynchronous event notice of type `info` about log page `lid` (others that
/// come first are passed over).
async fn next_event(events: &mut tokio::sync::mpsc::UnboundedReceiver<u32>, info: u8, lid: u8) {
    let want = u32::from(event::NOTICE) | u32::from(info) << 8 | u32::from(lid) << 16;
    let wait = async {
        while let Some(e) = events.recv().await {
            if e == want {
                return;
            }
        }
        panic!("the admin queue ended");
    };
    tokio::time::timeout(Duration::from_secs(30), wait)
        .await
        .unwrap_or_else(|_| panic!("no event {want:#x}"));
}

async fn connect(port: u16, isid: u8) -> Session {
    connect_with(port, isid, |_| {}).await
}

async fn connect_with(port: u16, isid: u8, adjust: impl FnOnce(&mut LoginConfig)) -> Session {
    let addr = format!("127.0.0.1:{port}").parse().unwrap();
    let mut login = LoginConfig {
        initiator_name: format!("iqn.2025-01.io.rtgt:rbd-initiator{isid}"),
        isid: [0x80, 0, 0, 0, 0, isid],
        target_name: Some(TEST_IQN.into()),
        ..LoginConfig::default()
    };
    adjust(&mut login);
    Session::connect(addr, login).await.expect("login")
}

/// Runs a command; unit attentions are collected and the command repeated.
async fn run(
    s: &Session,
    cdb: &[u8],
    data: Option<&[u8]>,
    len: u32,
    uas: &mut Vec<(u8, u8)>,
) -> ScsiResult {
    common::run(s, 0, cdb, data.map(Bytes::copy_from_slice), len, uas).await
}

fn rw10(op: u8, lba: u32, blocks: u16) -> Vec<u8> {
    let mut c = vec![op, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    c[2..6].copy_from_slice(&lba.to_be_bytes());
    c[7..9].copy_from_slice(&blocks.to_be_bytes());
    c
}

/// Whether gateway `g` reports holding the image's exclusive lock (`rtgt_lun_write_lock_held`).
fn lock_held(g: &Rtgtd) -> Option<bool> {
    let m = Client::unix(g.dir.join("rtgtd.sock"))
        .get_text("/metrics")
        .ok()?;
    let line = m
        .lines()
        .find(|l| l.starts_with("rtgt_lun_write_lock_held{backstore=\"d0\"}"))?;
    Some(line.ends_with(" 1"))
}

/// Waits until gateway `g` reports `want` (the backstore polls librbd every 2 s).
async fn lock_is(g: &Rtgtd, want: bool) {
    for _ in 0..100 {
        if lock_held(g) == Some(want) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!(
        "gateway on port {}: lock held {:?}, not {want}",
        g.port,
        lock_held(g)
    );
}

const RTPG: [u8; 12] = [0xa3, 0x0a, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0];

/// REPORT TARGET PORT GROUPS: (group, state) of each group.
async fn groups(s: &Session, uas: &mut Vec<(u8, u8)>) -> Vec<(u16, u8)> {
    let r = run(s, &RTPG, None, 256, uas).await;
    assert!(r.is_good(), "{r:?}");
    let mut out = Vec::new();
    let mut at = 4;
    while at + 8 <= r.data.len() {
        let d = &r.data[at..];
        out.push((u16::from_be_bytes([d[2], d[3]]), d[0] & 0x0f));
        at += 8 + 4 * usize::from(d[7]);
    }
    out
}

/// SET TARGET PORT GROUPS making `group` active/optimized, as Linux's ALUA handler sends it.
fn stpg(group: u16) -> (Vec<u8>, Vec<u8>) {
    let mut p = vec![0u8, 0, 0, 0, 0, 0, 0, 0];
    p[6..8].copy_from_slice(&group.to_be_bytes());
    (vec![0xa4, 0x0a, 0, 0, 0, 0, 0, 0, 0, 8, 0, 0], p)
}

fn capacity(r: &ScsiResult) -> u64 {
    assert!(r.is_good(), "{r:?}");
    u64::from_be_bytes(r.data[0..8].try_into().unwrap()) + 1
}

const READ_CAPACITY16: [u8; 16] = [0x9e, 0x10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 32, 0, 0];

#[test]
fn two_gateways_serve_one_rbd_image() {
    let c = match TestCluster::start() {
        Ok(c) => c,
        Err(e) => return skip_or_fail(e),
    };
    c.create_image("lun", 32);
    let (p1, p2, n1, n2) = (free_port(), free_port(), free_port(), free_port());
    let _g1 = Rtgtd::start("rbd-gw1", &gateway(&c, 1, p1, n1), p1);
    let _g2 = Rtgtd::start("rbd-gw2", &gateway(&c, 2, p2, n2), p2);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let (a, b) = (connect(p1, 1).await, connect(p2, 2).await);
        // An NVMe host on A's NVMe port (group 1), hearing of ANA and namespace changes.
        let host = HostConfig::default();
        let nv_addr = ([127, 0, 0, 1], n1).into();
        let nv = Arc::new(Queue::connect(nv_addr, &host, NQN, 0, 0, 32).await.unwrap());
        nv.enable(1).await.unwrap();
        nv.async_event_config(1 << 8 | 1 << 11).await.unwrap();
        let mut events = {
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
            let nv = nv.clone();
            tokio::spawn(async move {
                while let Ok(e) = nv.async_event().await {
                    if tx.send(e).is_err() {
                        return;
                    }
                }
            });
            rx
        };
        assert_eq!(ana_state(&nv).await, ana::OPTIMIZED);
        let (mut ua_a, mut ua_b) = (Vec::new(), Vec::new());
        assert_eq!(
            capacity(&run(&a, &READ_CAPACITY16, None, 32, &mut ua_a).await),
            32 << 11
        );
        assert_eq!(
            capacity(&run(&b, &READ_CAPACITY16, None, 32, &mut ua_b).await),
            32 << 11
        );

        // Written through A, read through B and by the cluster's own tools.
        let data: Vec<u8> = (0..8192u32).map(|i| (i * 7 % 251) as u8).collect();
        let r = run(&a, &rw10(0x2a, 100, 16), Some(&data), 0, &mut ua_a).await;
        assert!(r.is_good(), "{r:?}");
        let r = run(&b, &rw10(0x28, 100, 16), None, 8192, &mut ua_b).await;
        assert!(r.is_good(), "{r:?}");
        assert_eq!(r.data, data);
        assert_eq!(&c.export("lun")[100 * 512..100 * 512 + 8192], &data[..]);
        // The writer holds the image's exclusive lock, and says so.
        lock_is(&_g1, true).await;
        lock_is(&_g2, false).await;

        // COMPARE AND WRITE through B against what A wrote; then A's stale compare fails.
        let caw = |lba: u64| {
            let mut cdb = vec![0x89, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0];
            cdb[2..10].copy_from_slice(&lba.to_be_bytes());
            cdb
        };
        let mut both = data[..512].to_vec();
        both.extend_from_slice(&[0x5a; 512]);
        let r = run(&b, &caw(100), Some(&both), 0, &mut ua_b).await;
        assert!(r.is_good(), "{r:?}");
        lock_is(&_g2, true).await;
        lock_is(&_g1, false).await;
        let r = run(&a, &caw(100), Some(&both), 0, &mut ua_a).await;
        assert_eq!(r.sense_key(), Some((0x0e, 0x1d, 0)), "{r:?}");
        // INFORMATION: the offset of the first differing byte (byte 0: 0x00 vs 0x5a).
        assert_eq!(&r.sense[3..7], &[0, 0, 0, 0]);
        let r = run(&a, &rw10(0x28, 100, 1), None, 512, &mut ua_a).await;
        assert_eq!(r.data, vec![0x5a; 512]);

        // WRITE SAME(10) of a zero block: zeroes through the image's own operation.
        let mut ws = rw10(0x41, 100, 16);
        ws[1] = 0;
        let r = run(&b, &ws, Some(&[0u8; 512]), 0, &mut ua_b).await;
        assert!(r.is_good(), "{r:?}");
        let r = run(&a, &rw10(0x28, 100, 16), None, 8192, &mut ua_a).await;
        assert!(r.data.iter().all(|&x| x == 0));

        // Persistent reservations hold across the gateways (kept in RADOS beside the image).
        let prout = |sa: u8, ty: u8, key: u64, sark: u64| {
            let mut p = vec![0u8; 24];
            p[0..8].copy_from_slice(&key.to_be_bytes());
            p[8..16].copy_from_slice(&sark.to_be_bytes());
            (vec![0x5f, sa, ty, 0, 0, 0, 0, 0, 24, 0], p)
        };
        let keys = |r: &ScsiResult| -> Vec<u64> {
            assert!(r.is_good(), "{r:?}");
            r.data[8..]
                .chunks(8)
                .map(|k| u64::from_be_bytes(k.try_into().unwrap()))
                .collect()
        };
        const READ_KEYS: [u8; 10] = [0x5e, 0, 0, 0, 0, 0, 0, 1, 0, 0];
        let (cdb, p) = prout(0, 0, 0, 0xa);
        assert!(run(&a, &cdb, Some(&p), 0, &mut ua_a).await.is_good());
        let (cdb, p) = prout(0, 0, 0, 0xb);
        assert!(run(&b, &cdb, Some(&p), 0, &mut ua_b).await.is_good());
        assert_eq!(
            keys(&run(&b, &READ_KEYS, None, 256, &mut ua_b).await),
            [0xa, 0xb]
        );
        assert_eq!(
            keys(&run(&a, &READ_KEYS, None, 256, &mut ua_a).await),
            [0xa, 0xb]
        );
        // A reserves (write exclusive): B's writes conflict, its reads do not.
        let (cdb, p) = prout(1, 1, 0xa, 0);
        assert!(run(&a, &cdb, Some(&p), 0, &mut ua_a).await.is_good());
        let r = run(&b, &rw10(0x2a, 0, 1), Some(&[3u8; 512]), 0, &mut ua_b).await;
        assert_eq!(r.status, 0x18, "RESERVATION CONFLICT: {r:?}");
        assert!(run(&b, &rw10(0x28, 0, 1), None, 512, &mut ua_b)
            .await
            .is_good());
        // B preempts A: A's initiator hears of it on its next command and is fenced.
        let (cdb, p) = prout(4, 1, 0xb, 0xa);
        assert!(run(&b, &cdb, Some(&p), 0, &mut ua_b).await.is_good());
        ua_a.clear();
        let r = run(&a, &rw10(0x2a, 0, 1), Some(&[4u8; 512]), 0, &mut ua_a).await;
        assert_eq!(r.status, 0x18, "{r:?}");
        assert!(
            ua_a.contains(&(0x2a, 0x05)),
            "REGISTRATIONS PREEMPTED: {ua_a:?}"
        );
        let r = run(&a, &[0x5e, 1, 0, 0, 0, 0, 0, 0, 64, 0], None, 64, &mut ua_a).await;
        assert_eq!(u64::from_be_bytes(r.data[8..16].try_into().unwrap()), 0xb);

        // PREEMPT AND ABORT through B ends the preempted nexus's commands on A before it
        // completes: a write on A whose data the initiator holds back stays in A's task set
        // until then.
        let stalled = connect_with(p1, 3, |c| {
            c.initial_r2t = true;
            c.immediate_data = false;
        })
        .await;
        let mut ua_s = Vec::new();
        let (cdb, p) = prout(0, 0, 0, 0xc);
        assert!(run(&stalled, &cdb, Some(&p), 0, &mut ua_s).await.is_good());
        let stuck = stalled
            .submit_with(
                0,
                &rw10(0x2a, 0, 8),
                Some(Bytes::from(vec![5u8; 4096])),
                0,
                SubmitOptions {
                    withhold_data: true,
                    ..SubmitOptions::default()
                },
            )
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
        let (cdb, p) = prout(5, 1, 0xb, 0xc);
        assert!(run(&b, &cdb, Some(&p), 0, &mut ua_b).await.is_good());
        // Already gone from A's task set when B answered.
        assert_eq!(
            stalled.abort(0, &stuck).await.unwrap(),
            tmf::TASK_DOES_NOT_EXIST,
            "the preempted nexus's write was still in A's task set"
        );
        ua_s.clear();
        let r = run(&stalled, &rw10(0x28, 0, 1), None, 512, &mut ua_s).await;
        assert!(r.is_good(), "{r:?}");
        assert!(
            ua_s.contains(&(0x2a, 0x05)),
            "REGISTRATIONS PREEMPTED: {ua_s:?}"
        );
        assert!(
            ua_s.contains(&(0x2f, 0x00)),
            "COMMANDS CLEARED BY ANOTHER INITIATOR: {ua_s:?}"
        );
        assert_eq!(
            keys(&run(&a, &READ_KEYS, None, 256, &mut ua_a).await),
            [0xb]
        );
        // One set of target port group states for both gateways, kept with the reservations:
        // a SET TARGET PORT GROUPS through B makes B's group the only active/optimized one
        // (the image's lock follows the writes, so one gateway at a time is asked to
        // write); A's initiator hears of it.
        const AO: u8 = 0;
        const ANO: u8 = 1;
        assert_eq!(groups(&b, &mut ua_b).await, [(1, AO), (2, ANO)]);
        let (cdb, p) = stpg(2);
        let r = run(&b, &cdb, Some(&p), 0, &mut ua_b).await;
        assert!(r.is_good(), "{r:?}");
        assert_eq!(groups(&b, &mut ua_b).await, [(1, ANO), (2, AO)]);
        ua_a.clear();
        assert_eq!(groups(&a, &mut ua_a).await, [(1, ANO), (2, AO)]);
        assert!(
            ua_a.contains(&(0x2a, 0x06)),
            "ASYMMETRIC ACCESS STATE CHANGED: {ua_a:?}"
        );
        // A's NVMe host hears of it as an ANA change: its path is non-optimized now.
        next_event(&mut events, event::ANA_CHANGE, log::ANA).await;
        assert_eq!(ana_state(&nv).await, ana::NON_OPTIMIZED);
        let r = run(&b, &rw10(0x2a, 200, 1), Some(&[6u8; 512]), 0, &mut ua_b).await;
        assert!(r.is_good(), "{r:?}");
        lock_is(&_g2, true).await;

        // A gateway restarted later reads the same state, kept by the image's id: the image
        // renamed meanwhile, the restarted gateway opens it by its new name. Its
        // configuration's group states only seed the shared ones: B's group stays
        // active/optimized.
        drop(_g2);
        c.rbd(&["rename", "rbd/lun", "rbd/renamed"]);
        let _g2 = Rtgtd::start("rbd-gw2b", &gateway_of(&c, "renamed", 2, p2, n2), p2);
        let b = connect(p2, 2).await;
        assert_eq!(
            keys(&run(&b, &READ_KEYS, None, 256, &mut ua_b).await),
            [0xb]
        );
        assert_eq!(groups(&b, &mut ua_b).await, [(1, ANO), (2, AO)]);
        // Failback through A's API alone (its configuration already says group 1
        // active/optimized): both gateways report it, B's initiator hears of it.
        let api_a = Client::unix(_g1.dir.join("rtgtd.sock"));
        api_a
            .send(
                "PUT",
                "/api/v1/alua/groups/1/state",
                &serde_json::json!({"state": "active_optimized"}),
            )
            .expect("failback through A");
        assert_eq!(groups(&a, &mut ua_a).await, [(1, AO), (2, ANO)]);
        ua_b.clear();
        assert_eq!(groups(&b, &mut ua_b).await, [(1, AO), (2, ANO)]);
        assert!(
            ua_b.contains(&(0x2a, 0x06)),
            "ASYMMETRIC ACCESS STATE CHANGED: {ua_b:?}"
        );
        next_event(&mut events, event::ANA_CHANGE, log::ANA).await;
        assert_eq!(ana_state(&nv).await, ana::OPTIMIZED);
        let (cdb, p) = prout(3, 0, 0xb, 0);
        assert!(
            run(&b, &cdb, Some(&p), 0, &mut ua_b).await.is_good(),
            "CLEAR"
        );
        assert!(keys(&run(&a, &READ_KEYS, None, 256, &mut ua_a).await).is_empty());

        // Resized by the cluster's tools: both gateways' initiators hear of it.
        c.rbd(&["resize", "--size", "48M", "rbd/renamed"]);
        let (mut seen_a, mut seen_b) = (false, false);
        for _ in 0..100 {
            ua_a.clear();
            ua_b.clear();
            let ca = capacity(&run(&a, &READ_CAPACITY16, None, 32, &mut ua_a).await);
            let cb = capacity(&run(&b, &READ_CAPACITY16, None, 32, &mut ua_b).await);
            seen_a |= ua_a.contains(&(0x2a, 0x09));
            seen_b |= ua_b.contains(&(0x2a, 0x09));
            if ca == 48 << 11 && cb == 48 << 11 && seen_a && seen_b {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(
            seen_a && seen_b,
            "CAPACITY DATA HAS CHANGED through both gateways"
        );
        // And A's NVMe host as a namespace change, with the new size.
        next_event(
            &mut events,
            event::NAMESPACE_CHANGED,
            log::CHANGED_NAMESPACES,
        )
        .await;
        assert_eq!(nv.identify_namespace(1).await.unwrap().nsze, 48 << 11);

        // The cluster out of reach: NOT READY after the configured 3 s, not a hang.
        c.pause(true);
        let r = tokio::time::timeout(
            Duration::from_secs(60),
            run(&a, &rw10(0x2a, 0, 1), Some(&[1u8; 512]), 0, &mut ua_a),
        )
        .await
        .expect("the write ends");
        assert_eq!(r.sense_key(), Some((0x02, 0x04, 0x00)), "{r:?}");
        c.pause(false);
        let r = run(&a, &rw10(0x2a, 0, 1), Some(&[2u8; 512]), 0, &mut ua_a).await;
        assert!(r.is_good(), "{r:?}");
        let r = run(&b, &rw10(0x28, 0, 1), None, 512, &mut ua_b).await;
        assert_eq!(r.data, vec![2u8; 512]);
    });
}
