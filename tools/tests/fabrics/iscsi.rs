//! Loopback tests: the target on 127.0.0.1 over a RAM disk, driven by the in-repo initiator.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use rtgt_backstore::{BufPool, RamBackstore};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use rtgt_scsi::core::{Acl, Auth, ChapCredentials, IscsiParams, PortalGroup, Registry, Target};
use rtgt_scsi::{Device, DeviceConfig, LunMap};

use rtgt_iscsi::pdu::{self, tmf, Bhs, BhsRepr, NopOut, ScsiCommand, RESERVED_TAG};
use rtgt_iscsi::{IscsiError, IscsiServer};
use rtgt_tools::iscsi::{discover, LoginConfig, Session, SubmitOptions};

pub(crate) const TARGET: &str = "iqn.2025-01.io.rtgt:loop";
const BLOCK: usize = 512;

pub(crate) struct Lab {
    pub(crate) addr: SocketAddr,
    pub(crate) server: IscsiServer,
    registry: Arc<Registry>,
    serving: tokio::task::JoinHandle<()>,
}

fn device(pool: &Arc<BufPool>, size: u64) -> Arc<Device> {
    Device::new(
        Arc::new(RamBackstore::new(size, BLOCK as u32)),
        pool.clone(),
        DeviceConfig::default(),
    )
    .unwrap()
}

async fn lab_with(params: IscsiParams, auth: Auth, any: bool, acls: HashMap<String, Acl>) -> Lab {
    let pool = BufPool::new(128 << 20);
    let dev = device(&pool, 32 << 20);
    lab_on(params, auth, any, acls, pool, dev).await
}

/// A target whose LUN 0 is `dev`.
pub(crate) async fn lab_on(
    params: IscsiParams,
    auth: Auth,
    any: bool,
    acls: HashMap<String, Acl>,
    pool: Arc<BufPool>,
    dev: Arc<Device>,
) -> Lab {
    let mut luns = BTreeMap::new();
    luns.insert(0, dev);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let registry = Registry::new();
    registry.set_target(Target {
        name: TARGET.into(),
        alias: Some("loop".into()),
        portal_groups: vec![PortalGroup {
            tag: 1,
            ids: rtgt_scsi::core::PortIds::alone(1),
            portals: vec![addr],
            auth,
            acls,
            allow_any_initiator: any,
            luns: LunMap { luns },
            params,
            iser: true,
        }],
    });
    let server = IscsiServer::new(registry.clone(), pool);
    let s = server.clone();
    let (tx, rx) = tokio::sync::watch::channel(false);
    let serving = tokio::spawn(async move {
        let _keep = tx;
        s.serve(listener, rx).await.unwrap();
    });
    Lab {
        addr,
        server,
        registry,
        serving,
    }
}

async fn lab() -> Lab {
    lab_with(
        IscsiParams::default(),
        Auth::default(),
        true,
        HashMap::new(),
    )
    .await
}

pub(crate) fn cfg() -> LoginConfig {
    LoginConfig {
        target_name: Some(TARGET.into()),
        ..LoginConfig::default()
    }
}

pub(crate) fn rw10(op: u8, lba: u32, blocks: u16) -> [u8; 10] {
    let mut c = [0u8; 10];
    c[0] = op;
    c[2..6].copy_from_slice(&lba.to_be_bytes());
    c[7..9].copy_from_slice(&blocks.to_be_bytes());
    c
}

fn pattern(len: usize, seed: u8) -> Bytes {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect::<Vec<u8>>()
        .into()
}

async fn write(s: &Session, lba: u32, data: Bytes) {
    let r = s
        .command(
            0,
            &rw10(0x2a, lba, (data.len() / BLOCK) as u16),
            Some(data),
            0,
        )
        .await
        .unwrap();
    assert!(r.is_good(), "write: {r:?}");
}

async fn read(s: &Session, lba: u32, len: usize) -> Vec<u8> {
    let r = s
        .command(0, &rw10(0x28, lba, (len / BLOCK) as u16), None, len as u32)
        .await
        .unwrap();
    assert!(r.is_good(), "read: status {} sense {:?}", r.status, r.sense);
    r.data.into()
}

async fn patterns(s: &Session) {
    for (i, len) in [
        512usize,
        4096,
        8192,
        65536,
        65536 + 512,
        262_144,
        1 << 20,
        4 << 20,
    ]
    .into_iter()
    .enumerate()
    {
        let data = pattern(len, i as u8);
        write(s, 0, data.clone()).await;
        assert_eq!(read(s, 0, len).await, data.to_vec(), "len {len}");
    }
}

mod zero_copy;

#[tokio::test]
async fn login_none_io_patterns() {
    let lab = lab().await;
    let s = connect(lab.addr, cfg()).await;
    assert!(!s.params().initial_r2t && s.params().immediate_data);
    patterns(&s).await;
    let info = lab.server.sessions();
    assert_eq!(info.len(), 1);
    assert_eq!(info[0].transport, "tcp");
    assert_eq!(info[0].target, TARGET);
    assert!(info[0].bytes_in > 5 << 20);
    assert_eq!(s.logout().await.unwrap(), 0);
    wait_for(|| lab.server.sessions().is_empty()).await;
}

#[tokio::test]
async fn r2t_only_and_many_outstanding_r2ts() {
    let params = IscsiParams {
        initial_r2t: true,
        immediate_data: false,
        max_burst_length: 65_536,
        max_outstanding_r2t: 4,
        max_recv_data_segment_length: 8192,
        ..IscsiParams::default()
    };
    let lab = lab_with(params, Auth::default(), true, HashMap::new()).await;
    let c = LoginConfig {
        max_outstanding_r2t: 8,
        max_recv_data_segment_length: 16384,
        ..cfg()
    };
    let s = connect(lab.addr, c).await;
    let p = s.params();
    assert!(p.initial_r2t && !p.immediate_data);
    assert_eq!((p.max_outstanding_r2t, p.max_burst_length), (4, 65_536));
    assert_eq!(p.max_xmit_data_segment_length, 8192);
    patterns(&s).await;
}

#[tokio::test]
async fn unsolicited_without_immediate() {
    let params = IscsiParams {
        immediate_data: false,
        first_burst_length: 16384,
        ..IscsiParams::default()
    };
    let lab = lab_with(params, Auth::default(), true, HashMap::new()).await;
    let c = LoginConfig {
        max_recv_data_segment_length: 4096,
        ..cfg()
    };
    let s = connect(lab.addr, c).await;
    assert!(!s.params().initial_r2t && !s.params().immediate_data);
    patterns(&s).await;
}

#[tokio::test]
async fn digests_on() {
    let lab = lab().await;
    let c = LoginConfig {
        header_digest: true,
        data_digest: true,
        ..cfg()
    };
    let s = connect(lab.addr, c).await;
    assert!(s.params().header_digest && s.params().data_digest);
    patterns(&s).await;
    assert_eq!(
        s.nop(b"digest").await.unwrap(),
        Bytes::from_static(b"digest")
    );
}

#[tokio::test]
async fn queue_depth_32() {
    let lab = lab().await;
    let s = connect(lab.addr, cfg()).await;
    let mut tasks = Vec::new();
    for i in 0..64u32 {
        let s = s.clone();
        tasks.push(tokio::spawn(async move {
            let data = pattern(16 * 1024, i as u8);
            write(&s, i * 64, data.clone()).await;
            assert_eq!(read(&s, i * 64, data.len()).await, data.to_vec());
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let (cmd_sn, exp, max) = s.window();
    assert_eq!(cmd_sn, exp);
    assert!(max.wrapping_sub(exp) < 128);
}

/// Many large reads at once, with and without digests: their Data-In outgrows both the
/// transmit queue and the socket buffer, so senders wait for queue slots and the writer task
/// waits for room in the socket; every byte still arrives, in order and intact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_reads_outgrow_queue_and_socket() {
    let lab = lab().await;
    for digests in [false, true] {
        // 4 KiB Data-In PDUs: a 1 MiB read alone is as many PDUs as the transmit queue holds.
        let c = LoginConfig {
            header_digest: digests,
            data_digest: digests,
            max_recv_data_segment_length: 4096,
            ..cfg()
        };
        let s = connect(lab.addr, c).await;
        let data = pattern(8 << 20, 7);
        write(&s, 0, data.clone()).await;
        let mut tasks = Vec::new();
        for i in 0..48usize {
            let s = s.clone();
            let data = data.clone();
            tasks.push(tokio::spawn(async move {
                let off = (i % 8) << 20;
                let got = read(&s, (off / BLOCK) as u32, 1 << 20).await;
                assert!(got[..] == data[off..off + (1 << 20)], "read {i}");
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        let (cmd_sn, exp, _) = s.window();
        assert_eq!(cmd_sn, exp);
    }
}

fn creds(u: &str, s: &str) -> ChapCredentials {
    ChapCredentials {
        user: u.into(),
        secret: s.into(),
    }
}

fn chap_auth() -> Auth {
    Auth {
        chap: Some(creds("alice", "alice-secret-1")),
        mutual: Some(creds("loop", "target-secret-2")),
    }
}

fn login_status(r: Result<Session, IscsiError>) -> u16 {
    match r {
        Err(IscsiError::LoginFailed(s)) => s,
        Err(e) => panic!("unexpected error {e}"),
        Ok(_) => panic!("login succeeded"),
    }
}

#[tokio::test]
async fn chap_logins() {
    let lab = lab_with(IscsiParams::default(), chap_auth(), true, HashMap::new()).await;
    let one_way = LoginConfig {
        chap: Some(creds("alice", "alice-secret-1")),
        ..cfg()
    };
    let s = connect(lab.addr, one_way.clone()).await;
    write(&s, 8, pattern(4096, 1)).await;
    s.logout().await.unwrap();
    let mutual = LoginConfig {
        mutual: Some(creds("loop", "target-secret-2")),
        ..one_way.clone()
    };
    let s = connect(lab.addr, mutual).await;
    assert_eq!(read(&s, 8, 4096).await, pattern(4096, 1).to_vec());
    s.logout().await.unwrap();
    let bad_target = LoginConfig {
        mutual: Some(creds("loop", "not-the-secret")),
        ..one_way.clone()
    };
    assert!(matches!(
        Session::connect(lab.addr, bad_target).await,
        Err(IscsiError::Authentication(_))
    ));
    let wrong = LoginConfig {
        chap: Some(creds("alice", "wrong-secret")),
        ..cfg()
    };
    assert_eq!(
        login_status(Session::connect(lab.addr, wrong).await),
        0x0201
    );
    assert_eq!(
        login_status(Session::connect(lab.addr, cfg()).await),
        0x0201
    );
}

#[tokio::test]
async fn refused_logins() {
    let mut acls = HashMap::new();
    acls.insert(
        "iqn.allowed".to_string(),
        Acl {
            initiator: "iqn.allowed".into(),
            auth: Auth::default(),
            luns: LunMap::default(),
        },
    );
    let lab = lab_with(IscsiParams::default(), Auth::default(), false, acls).await;
    let unknown = LoginConfig {
        target_name: Some("iqn.2025-01.io.rtgt:none".into()),
        ..cfg()
    };
    assert_eq!(
        login_status(Session::connect(lab.addr, unknown).await),
        0x0203
    );
    assert_eq!(
        login_status(Session::connect(lab.addr, cfg()).await),
        0x0202
    );
    let allowed = LoginConfig {
        initiator_name: "iqn.allowed".into(),
        ..cfg()
    };
    let s = connect(lab.addr, allowed).await;
    // The ACL maps no LUN: LUN 0 is not there.
    let r = s.command(0, &rw10(0x28, 0, 1), None, 512).await.unwrap();
    assert_eq!(r.status, 2);
}

#[tokio::test]
async fn discovery_and_send_targets() {
    let lab = lab().await;
    let t = discover(lab.addr, cfg()).await.unwrap();
    assert_eq!(t.len(), 1);
    assert_eq!(t[0].name, TARGET);
    assert_eq!(t[0].addresses, vec![format!("{},1", lab.addr)]);
    // Discovery with CHAP.
    lab.registry.set_discovery_auth(Auth {
        chap: Some(creds("disc", "discovery-pw-1")),
        mutual: None,
    });
    assert!(discover(lab.addr, cfg()).await.is_err());
    let c = LoginConfig {
        chap: Some(creds("disc", "discovery-pw-1")),
        ..cfg()
    };
    assert_eq!(discover(lab.addr, c).await.unwrap().len(), 1);
    // SendTargets in a normal session lists the session's target.
    let s = connect(lab.addr, cfg()).await;
    let t = s.send_targets("").await.unwrap();
    assert_eq!(t[0].name, TARGET);
}

#[tokio::test]
async fn nop_and_text_not_understood() {
    let lab = lab().await;
    let s = connect(lab.addr, cfg()).await;
    assert_eq!(s.nop(b"").await.unwrap().len(), 0);
    assert_eq!(&s.nop(b"ping-data").await.unwrap()[..], b"ping-data");
    let mut k = rtgt_iscsi::text::TextPairs::new();
    k.push("X-com.example.key", "1");
    let r = s.text(&k).await.unwrap();
    assert_eq!(r.get("X-com.example.key"), Some("NotUnderstood"));
}

#[tokio::test]
async fn task_management() {
    let params = IscsiParams {
        initial_r2t: true,
        immediate_data: false,
        ..IscsiParams::default()
    };
    let lab = lab_with(params, Auth::default(), true, HashMap::new()).await;
    let s = connect(lab.addr, cfg()).await;
    // A write whose R2T is never answered stays in the task set until aborted.
    let stuck = s
        .submit_with(
            0,
            &rw10(0x2a, 0, 8),
            Some(pattern(4096, 3)),
            0,
            SubmitOptions {
                withhold_data: true,
                ..SubmitOptions::default()
            },
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(s.abort(0, &stuck).await.unwrap(), tmf::FUNCTION_COMPLETE);
    // Its response is never sent.
    assert!(matches!(
        tokio::time::timeout(Duration::from_millis(200), stuck.wait()).await,
        Err(_) | Ok(Err(IscsiError::Timeout))
    ));
    assert_eq!(
        s.task_management(tmf::ABORT_TASK, 0, 0x7777, 0)
            .await
            .unwrap(),
        tmf::TASK_DOES_NOT_EXIST
    );
    assert_eq!(
        s.task_management(tmf::ABORT_TASK_SET, 0, 0, 0)
            .await
            .unwrap(),
        tmf::FUNCTION_COMPLETE
    );
    assert_eq!(
        s.task_management(tmf::CLEAR_TASK_SET, 0, 0, 0)
            .await
            .unwrap(),
        tmf::FUNCTION_COMPLETE
    );
    assert_eq!(
        s.task_management(tmf::LOGICAL_UNIT_RESET, 0, 0, 0)
            .await
            .unwrap(),
        tmf::FUNCTION_COMPLETE
    );
    assert_eq!(
        s.task_management(tmf::LOGICAL_UNIT_RESET, 9, 0, 0)
            .await
            .unwrap(),
        tmf::LUN_DOES_NOT_EXIST
    );
    assert_eq!(
        s.task_management(tmf::CLEAR_ACA, 0, 0, 0).await.unwrap(),
        tmf::NOT_SUPPORTED
    );
    assert_eq!(
        s.task_management(tmf::TASK_REASSIGN, 0, 0, 0)
            .await
            .unwrap(),
        tmf::REASSIGNMENT_NOT_SUPPORTED
    );
    assert_eq!(
        s.task_management(tmf::TARGET_WARM_RESET, 0, 0, 0)
            .await
            .unwrap(),
        tmf::FUNCTION_COMPLETE
    );
    assert_eq!(
        s.task_management(0x55, 0, 0, 0).await.unwrap(),
        tmf::FUNCTION_REJECTED
    );
    // Unit attentions after the resets, then normal I/O.
    for _ in 0..4 {
        if s.command(0, &[0u8; 6], None, 0).await.unwrap().is_good() {
            break;
        }
    }
    write(&s, 0, pattern(8192, 9)).await;
    assert_eq!(
        s.task_management(tmf::TARGET_COLD_RESET, 0, 0, 0)
            .await
            .unwrap(),
        tmf::FUNCTION_COMPLETE
    );
    wait_for(|| s.is_closed()).await;
}

#[tokio::test]
async fn session_reinstatement() {
    let lab = lab().await;
    let a = connect(lab.addr, cfg()).await;
    let b = connect(lab.addr, cfg()).await;
    wait_for(|| a.is_closed()).await;
    assert_ne!(a.tsih(), b.tsih());
    assert_eq!(lab.server.sessions().len(), 1);
    write(&b, 0, pattern(512, 1)).await;
    // Another ISID is another session.
    let c = connect(
        lab.addr,
        LoginConfig {
            isid: [0x80, 0, 0, 0, 0, 9],
            ..cfg()
        },
    )
    .await;
    assert_eq!(lab.server.sessions().len(), 2);
    assert!(lab.server.force_logout(c.tsih()));
    assert!(!lab.server.force_logout(0xfff0));
    wait_for(|| c.is_closed()).await;
    assert!(c.async_events().iter().all(|e| e.event == 3));
}

#[tokio::test]
async fn malformed_bhs_is_rejected() {
    let lab = lab().await;
    let s = connect(lab.addr, cfg()).await;
    let mut bhs = [0u8; 48];
    bhs[0] = 0x1c; // not an opcode
    bhs[16..20].copy_from_slice(&0x4242u32.to_be_bytes());
    s.send_raw(&bhs).await.unwrap();
    // A SNACK at ErrorRecoveryLevel 0, and a target opcode from the initiator.
    let mut snack = BhsRepr::Snack(pdu::Snack {
        kind: 0,
        itt: 5,
        ..Default::default()
    })
    .to_bytes();
    s.send_raw(&snack).await.unwrap();
    snack[0] = 0x21;
    s.send_raw(&snack).await.unwrap();
    wait_for(|| s.rejects().len() >= 3).await;
    assert_eq!(
        s.rejects(),
        vec![
            pdu::reject_reason::COMMAND_NOT_SUPPORTED,
            pdu::reject_reason::SNACK_REJECT,
            pdu::reject_reason::COMMAND_NOT_SUPPORTED
        ]
    );
    write(&s, 0, pattern(1024, 2)).await;
    // Garbage before login closes that connection only.
    let mut raw = tokio::net::TcpStream::connect(lab.addr).await.unwrap();
    raw.write_all(&[0xff; 48]).await.unwrap();
    let mut b = [0u8; 64];
    let n = tokio::time::timeout(Duration::from_secs(5), raw.read(&mut b))
        .await
        .unwrap()
        .unwrap_or(0);
    assert_eq!(n, 0);
    assert_eq!(read(&s, 0, 1024).await, pattern(1024, 2).to_vec());
    let again = connect(
        lab.addr,
        LoginConfig {
            isid: [0x80, 0, 0, 0, 1, 1],
            ..cfg()
        },
    )
    .await;
    again.nop(b"x").await.unwrap();
}

#[tokio::test]
async fn oversized_segment_closes_connection() {
    let lab = lab_with(
        IscsiParams {
            max_recv_data_segment_length: 4096,
            ..IscsiParams::default()
        },
        Auth::default(),
        true,
        HashMap::new(),
    )
    .await;
    let s = connect(lab.addr, cfg()).await;
    let (cmd_sn, _, _) = s.window();
    let mut bhs = BhsRepr::NopOut(NopOut {
        immediate: true,
        itt: 77,
        ttt: RESERVED_TAG,
        cmd_sn,
        ..Default::default()
    })
    .to_bytes();
    Bhs::new_unchecked(&mut bhs[..]).set_data_segment_len(1 << 20);
    s.send_raw(&bhs).await.unwrap();
    wait_for(|| s.is_closed()).await;
    assert_eq!(s.rejects(), vec![pdu::reject_reason::PROTOCOL_ERROR]);
    let s2 = connect(lab.addr, cfg()).await;
    write(&s2, 0, pattern(4096, 5)).await;
}

#[tokio::test]
async fn cmd_sn_outside_window_is_dropped() {
    let lab = lab().await;
    let s = connect(lab.addr, cfg()).await;
    let (_, _, max) = s.window();
    let c = ScsiCommand {
        final_: true,
        attr: 1,
        itt: 0x5151,
        cmd_sn: max.wrapping_add(1),
        ..Default::default()
    };
    s.send_pdu(&BhsRepr::ScsiCommand(c.clone()).to_bytes(), &[])
        .await
        .unwrap();
    let low = ScsiCommand {
        itt: 0x5152,
        cmd_sn: s.window().1.wrapping_sub(1),
        ..c
    };
    s.send_pdu(&BhsRepr::ScsiCommand(low).to_bytes(), &[])
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(s.rejects().is_empty());
    // The session goes on.
    write(&s, 0, pattern(512, 7)).await;
    assert_eq!(read(&s, 0, 512).await, pattern(512, 7).to_vec());
}

#[tokio::test]
async fn graceful_shutdown_requests_logout() {
    let lab = lab().await;
    let s = connect(lab.addr, cfg()).await;
    let server = lab.server.clone();
    let stop = tokio::spawn(async move { server.shutdown(Duration::from_secs(5)).await });
    wait_for(|| !s.async_events().is_empty()).await;
    let e = s.async_events()[0];
    assert_eq!((e.event, e.param3), (1, 5));
    assert_eq!(s.logout().await.unwrap(), 0);
    stop.await.unwrap();
    assert!(lab.server.sessions().is_empty());
    // The accept loop has returned.
    tokio::time::timeout(Duration::from_secs(1), lab.serving)
        .await
        .unwrap()
        .unwrap();
    assert!(Session::connect(lab.addr, cfg()).await.is_err());
}

#[tokio::test]
async fn target_ping_and_timeout() {
    let params = IscsiParams {
        nopin_interval: 1,
        nopin_timeout: 1,
        ..IscsiParams::default()
    };
    let lab = lab_with(params, Auth::default(), true, HashMap::new()).await;
    let s = connect(lab.addr, cfg()).await;
    // The initiator answers pings: the session survives idle periods.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert!(!s.is_closed());
    write(&s, 0, pattern(512, 1)).await;
    // A peer that does not answer is dropped.
    let RawConn { sock: mut raw, .. } = RawConn::login(lab.addr, [0x80, 0, 0, 0, 2, 2]).await;
    let mut sink = vec![0u8; 4096];
    let closed = tokio::time::timeout(Duration::from_secs(6), async {
        loop {
            match raw.read(&mut sink).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await;
    assert!(closed.is_ok(), "unanswered pings must drop the connection");
}

/// A logged-in connection driven PDU by PDU, for what the initiator library would not do.
struct RawConn {
    sock: tokio::net::TcpStream,
    reader: rtgt_iscsi::conn_tcp::PduReader,
    buf: bytes::BytesMut,
    cmd_sn: u32,
    exp_stat_sn: u32,
}

impl RawConn {
    /// Logs in to [`TARGET`] with `isid` (no digests), on a socket with a large receive
    /// buffer so that the target can write much before the test reads.
    async fn login(addr: SocketAddr, isid: [u8; 6]) -> RawConn {
        let sock = tokio::net::TcpSocket::new_v4().unwrap();
        sock.set_recv_buffer_size(4 << 20).unwrap();
        let mut sock = sock.connect(addr).await.unwrap();
        let c = LoginConfig {
            isid,
            header_digest: false,
            data_digest: false,
            ..cfg()
        };
        let mut login = rtgt_tools::iscsi::login::InitiatorLogin::new(c, 1);
        let mut step = login.start();
        let mut reader = rtgt_iscsi::conn_tcp::PduReader::new(1 << 20, false, false);
        let mut buf = bytes::BytesMut::new();
        let mut exp_stat_sn = 0;
        while let rtgt_tools::iscsi::LoginProgress::Send(req, data) = step {
            let mut out = Vec::new();
            rtgt_iscsi::conn_tcp::encode_pdu(
                &mut out,
                &BhsRepr::LoginRequest(req).to_bytes(),
                &[],
                &data,
                false,
                false,
            );
            sock.write_all(&out).await.unwrap();
            let p = rtgt_iscsi::conn_tcp::read_pdu(&mut sock, &mut reader, &mut buf)
                .await
                .unwrap();
            let Ok(BhsRepr::LoginResponse(r)) = BhsRepr::parse(&p.header()) else {
                panic!("not a login response")
            };
            exp_stat_sn = r.stat_sn.wrapping_add(1);
            step = login.on_response(&r, &p.data).unwrap();
        }
        RawConn {
            sock,
            reader,
            buf,
            cmd_sn: 1,
            exp_stat_sn,
        }
    }

    /// Sends a final SCSI Command for LUN 0 with `data` as immediate data.
    async fn command(&mut self, itt: u32, attr: u8, cdb: &[u8], read_len: u32, data: &[u8]) {
        let mut c = ScsiCommand {
            final_: true,
            read: read_len > 0,
            write: !data.is_empty(),
            attr,
            itt,
            edtl: read_len.max(data.len() as u32),
            cmd_sn: self.cmd_sn,
            exp_stat_sn: self.exp_stat_sn,
            data_len: data.len() as u32,
            ..Default::default()
        };
        c.cdb[..cdb.len()].copy_from_slice(cdb);
        self.cmd_sn = self.cmd_sn.wrapping_add(1);
        let mut out = Vec::new();
        rtgt_iscsi::conn_tcp::encode_pdu(
            &mut out,
            &BhsRepr::ScsiCommand(c).to_bytes(),
            &[],
            data,
            false,
            false,
        );
        self.sock.write_all(&out).await.unwrap();
    }

    /// The next PDU from the target.
    async fn next(&mut self) -> rtgt_iscsi::conn::RxPdu {
        let p = tokio::time::timeout(
            Duration::from_secs(10),
            rtgt_iscsi::conn_tcp::read_pdu(&mut self.sock, &mut self.reader, &mut self.buf),
        )
        .await
        .expect("no PDU from the target")
        .unwrap();
        if let Ok(BhsRepr::ScsiResponse(r)) = BhsRepr::parse(&p.header()) {
            self.exp_stat_sn = r.stat_sn.wrapping_add(1);
        }
        p
    }
}

/// Logs in and consumes the power-on unit attention.
pub(crate) async fn connect(addr: SocketAddr, c: LoginConfig) -> Session {
    let s = Session::connect(addr, c).await.unwrap();
    for _ in 0..4 {
        if s.command(0, &[0u8; 6], None, 0).await.unwrap().is_good() {
            break;
        }
    }
    s
}

async fn wait_for(mut cond: impl FnMut() -> bool) {
    for _ in 0..500 {
        if cond() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("condition not reached");
}
