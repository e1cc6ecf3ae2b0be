//! Loopback tests: the iSER target and the in-repo initiator on two soft-RoCE devices joined
//! by an in-memory link (optionally dropping packets), their RC QPs connected by hand.

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use rtgt_backstore::{BufPool, RamBackstore};
use rtgt_transport::netdev::fault::{FaultConfig, FaultInjector};
use rtgt_transport::netdev::gate::{Gate, Gated};
use rtgt_transport::netdev::{self, loopback};
use rtgt_transport::verbs::{Access, Device as Hca, DeviceConfig as HcaConfig, Pd, Qp, RcPath};

use rtgt_iscsi::login::status;
use rtgt_iscsi::pdu::{reject_reason, tmf, Bhs, BhsRepr, LoginRequest, NopOut, RESERVED_TAG};
use rtgt_iscsi::shared::ServerShared;
use rtgt_iscsi::text::TextPairs;
use rtgt_iscsi::{IscsiError, IscsiServer};
use rtgt_scsi::core::{Auth, ChapCredentials, IscsiParams, PortalGroup, Registry, Target};
use rtgt_scsi::{Device, DeviceConfig, LunMap};
use rtgt_tools::iscsi::{LoginConfig, Session, SubmitOptions};

use rtgt_iscsi::iser::header::Repr;
use rtgt_iscsi::iser::{serve, Endpoint, IserStats, Peer, PoolMrs, Sizing};
use rtgt_rdma_channel::cm::Provider;
use rtgt_tools::iser::IserTransport;

const TARGET: &str = "iqn.2025-01.io.rtgt:iser";
const BLOCK: usize = 512;
const PORT: u16 = 3260;

fn ip(last: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(10, 0, 0, last))
}

pub(crate) struct Fab {
    target_hca: Hca,
    target_pd: Pd,
    init_pd: Pd,
    pub(crate) shared: Arc<ServerShared>,
    /// Holds chosen packets of both ends (open unless a test closes it).
    pub(crate) gate: Gate,
    pool_mrs: Arc<PoolMrs>,
    stats: Arc<IserStats>,
    runners: Vec<tokio::task::JoinHandle<std::io::Result<()>>>,
    psn: u32,
}

impl Drop for Fab {
    fn drop(&mut self) {
        for r in &self.runners {
            r.abort();
        }
    }
}

async fn fab(drop_ppm: u32, auth: Auth) -> Fab {
    let pool = BufPool::new(128 << 20);
    let dev = Device::new(
        Arc::new(RamBackstore::new(64 << 20, BLOCK as u32)),
        pool.clone(),
        DeviceConfig {
            thin: true,
            ..DeviceConfig::default()
        },
    )
    .unwrap();
    fab_on(drop_ppm, auth, pool, dev).await
}

/// A fabric whose LUN 0 is `dev`, with buffers from `pool`.
pub(crate) async fn fab_on(drop_ppm: u32, auth: Auth, pool: Arc<BufPool>, dev: Arc<Device>) -> Fab {
    let _ = tracing_subscriber::fmt()
        .with_test_writer()
        .with_max_level(tracing::Level::DEBUG)
        .try_init();
    let target_hca = Hca::new(HcaConfig::new("tgt", vec![ip(1)])).unwrap();
    let init_hca = Hca::new(HcaConfig::new("ini", vec![ip(2)])).unwrap();
    let (la, lb) = loopback::pair(1 << 16);
    let faults = FaultConfig {
        drop_ppm,
        ..FaultConfig::default()
    };
    let gate = Gate::new();
    let runners = vec![
        tokio::spawn(netdev::run(
            target_hca.clone(),
            Gated::new(FaultInjector::new(la, faults, 7), gate.clone()),
        )),
        tokio::spawn(netdev::run(
            init_hca.clone(),
            Gated::new(FaultInjector::new(lb, faults, 11), gate.clone()),
        )),
    ];
    let mut luns = BTreeMap::new();
    luns.insert(0, dev);
    let registry = Registry::new();
    registry.set_target(Target {
        name: TARGET.into(),
        alias: None,
        portal_groups: vec![PortalGroup {
            tag: 1,
            ids: rtgt_scsi::core::PortIds::alone(1),
            portals: vec![SocketAddr::new(ip(1), PORT)],
            auth,
            acls: HashMap::new(),
            allow_any_initiator: true,
            luns: LunMap { luns },
            params: IscsiParams::default(),
            iser: true,
        }],
    });
    let server = IscsiServer::new(registry, pool.clone());
    let target_pd = target_hca.alloc_pd().unwrap();
    let pool_mrs = Arc::new(PoolMrs::register(&target_pd.clone().into(), &pool).unwrap());
    Fab {
        init_pd: init_hca.alloc_pd().unwrap(),
        target_hca,
        target_pd,
        shared: server.shared(),
        gate,
        pool_mrs,
        stats: Arc::new(IserStats::default()),
        runners,
        psn: 0x1234,
    }
}

fn to_init(qp: &Qp) {
    qp.to_init(Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ)
        .unwrap();
}

/// RTR and RTS towards `remote` (what the CM does after REQ/REP).
fn to_rts(qp: &Qp, remote: IpAddr, dest_qpn: u32, rq_psn: u32, sq_psn: u32) {
    qp.to_rts(&RcPath {
        timeout: 12,
        ..RcPath::new(remote, dest_qpn, rq_psn, sq_psn)
    })
    .unwrap();
}

impl Fab {
    /// A connected pair of endpoints; the target's is being served.
    fn endpoints(&mut self, send_inv: bool) -> Endpoint {
        let t = Endpoint::new(&self.target_pd, Sizing::new(128, 8192, 16)).unwrap();
        let i = Endpoint::new(&self.init_pd, Sizing::new(128, 8192, 16)).unwrap();
        let (tq, iq) = (t.qp.soft().unwrap(), i.qp.soft().unwrap());
        to_init(tq);
        to_init(iq);
        t.post_receives().unwrap();
        i.post_receives().unwrap();
        self.psn = self.psn.wrapping_mul(2654435761).wrapping_add(17) & 0xff_ffff;
        let (pt, pi) = (self.psn, self.psn ^ 0x5a5a5a);
        to_rts(tq, ip(2), iq.qpn(), pi, pt);
        to_rts(iq, ip(1), tq.qpn(), pt, pi);
        let peer = Peer {
            local: SocketAddr::new(ip(1), PORT),
            peer: SocketAddr::new(ip(2), 40000),
            send_with_invalidate: send_inv,
        };
        tokio::spawn(serve(
            self.shared.clone(),
            t,
            peer,
            Some(self.pool_mrs.clone()),
            self.stats.clone(),
        ));
        i
    }

    /// Logs in; a normal session also takes the power-on unit attention.
    pub(crate) async fn connect(&mut self, cfg: LoginConfig) -> Result<Session, IscsiError> {
        self.connect_with(true, cfg).await
    }

    /// [`Fab::connect`], the target answering with SEND with Invalidate or not (`send_inv`).
    async fn connect_with(
        &mut self,
        send_inv: bool,
        cfg: LoginConfig,
    ) -> Result<Session, IscsiError> {
        let ep = self.endpoints(send_inv);
        let normal = cfg.target_name.is_some();
        let s = Session::connect_iser(ep, SocketAddr::new(ip(1), PORT), cfg).await?;
        if normal {
            let r = s.command(0, &[0u8; 6], None, 0).await?;
            if !r.is_good() {
                assert_eq!(
                    r.sense_key().map(|k| k.0),
                    Some(0x06),
                    "TEST UNIT READY: {r:?}"
                );
            }
        }
        Ok(s)
    }

    /// Waits until the target released every connection, QP and session.
    async fn settled(&self) {
        for _ in 0..2000 {
            if self.stats.connections.load(Ordering::Acquire) == 0
                && self.target_hca.live_qps() == 0
                && self.shared.sessions.is_empty()
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        panic!(
            "target kept {} connections, {} QPs, {} sessions",
            self.stats.connections.load(Ordering::Acquire),
            self.target_hca.live_qps(),
            self.shared.sessions.len()
        );
    }
}

pub(crate) fn cfg() -> LoginConfig {
    LoginConfig {
        target_name: Some(TARGET.into()),
        ..LoginConfig::default()
    }
}

fn cdb16(op: u8, lba: u64, blocks: u32, flags: u8) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = op;
    c[1] = flags;
    c[2..10].copy_from_slice(&lba.to_be_bytes());
    c[10..14].copy_from_slice(&blocks.to_be_bytes());
    c
}

fn pattern(len: usize, seed: u8) -> Bytes {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 9) as u8)
        .collect::<Vec<u8>>()
        .into()
}

async fn write(s: &Session, lba: u64, data: Bytes, fua: bool) {
    let flags = if fua { 0x08 } else { 0 };
    let c = cdb16(0x8a, lba, (data.len() / BLOCK) as u32, flags);
    let r = s.command(0, &c, Some(data), 0).await.unwrap();
    assert!(r.is_good(), "write: {r:?}");
}

async fn read(s: &Session, lba: u64, len: usize) -> Vec<u8> {
    let c = cdb16(0x88, lba, (len / BLOCK) as u32, 0);
    let r = s.command(0, &c, None, len as u32).await.unwrap();
    assert!(r.is_good(), "read: status {} sense {:?}", r.status, r.sense);
    r.data.into()
}

/// The commands Linux sends to a disk, with data checked end to end.
async fn command_set(s: &Session) {
    // Sizes below, at and above the immediate data limit and the RDMA chunk.
    let sizes = [512usize, 4096, 8192, 8704, 65536, 262_144, 1 << 20, 3 << 20];
    let mut lba = 0u64;
    for (i, len) in sizes.into_iter().enumerate() {
        let data = pattern(len, i as u8);
        write(s, lba, data.clone(), i % 2 == 1).await;
        assert!(
            read(s, lba, len).await == data[..],
            "{len} bytes read back differ"
        );
        lba += (len / BLOCK) as u64 + 3;
    }
    // Many commands in flight at once.
    let mut pending = Vec::new();
    for i in 0..64u64 {
        let data = pattern(16384, 100 + i as u8);
        let c = cdb16(0x8a, 20_000 + i * 32, 32, 0);
        pending.push((i, s.submit(0, &c, Some(data), 0).await.unwrap()));
    }
    for (i, p) in pending {
        assert!(p.wait().await.unwrap().is_good(), "write {i}");
    }
    let mut reads = Vec::new();
    for i in 0..64u64 {
        let c = cdb16(0x88, 20_000 + i * 32, 32, 0);
        reads.push((i, s.submit(0, &c, None, 16384).await.unwrap()));
    }
    for (i, p) in reads {
        let r = p.wait().await.unwrap();
        assert!(r.is_good());
        assert!(
            r.data == pattern(16384, 100 + i as u8)[..],
            "read {i} differs"
        );
    }
    // SYNCHRONIZE CACHE(10).
    let r = s
        .command(0, &[0x35, 0, 0, 0, 0, 0, 0, 0, 0, 0], None, 0)
        .await
        .unwrap();
    assert!(r.is_good(), "sync cache: {r:?}");
    // UNMAP of 8 blocks at 0, then they read as zeros.
    let mut list = vec![0u8; 24];
    list[0..2].copy_from_slice(&22u16.to_be_bytes());
    list[2..4].copy_from_slice(&16u16.to_be_bytes());
    list[8..16].copy_from_slice(&0u64.to_be_bytes());
    list[16..20].copy_from_slice(&8u32.to_be_bytes());
    let r = s
        .command(0, &[0x42, 0, 0, 0, 0, 0, 0, 0, 24, 0], Some(list.into()), 0)
        .await
        .unwrap();
    assert!(r.is_good(), "unmap: {r:?}");
    assert!(read(s, 0, 4096).await.iter().all(|b| *b == 0));
    // Persistent reservations: register a key, reserve, read it back.
    let mut po = vec![0u8; 24];
    po[8..16].copy_from_slice(&0xabcdu64.to_be_bytes());
    let r = s
        .command(
            0,
            &[0x5f, 0x00, 0, 0, 0, 0, 0, 0, 24, 0],
            Some(po.into()),
            0,
        )
        .await
        .unwrap();
    assert!(r.is_good(), "PR register: {r:?}");
    let mut po = vec![0u8; 24];
    po[0..8].copy_from_slice(&0xabcdu64.to_be_bytes());
    let r = s
        .command(
            0,
            &[0x5f, 0x01, 0x03, 0, 0, 0, 0, 0, 24, 0],
            Some(po.into()),
            0,
        )
        .await
        .unwrap();
    assert!(r.is_good(), "PR reserve: {r:?}");
    let r = s
        .command(0, &[0x5e, 0x01, 0, 0, 0, 0, 0, 0, 64, 0], None, 64)
        .await
        .unwrap();
    assert!(r.is_good());
    assert_eq!(&r.data[8..16], &0xabcdu64.to_be_bytes());
    // A read past the end: CHECK CONDITION with its sense, within ib_iser's 128 bytes.
    let r = s
        .command(0, &cdb16(0x88, 1 << 40, 1, 0), None, 512)
        .await
        .unwrap();
    assert_eq!(r.status, 2);
    assert_eq!(r.sense_key(), Some((0x05, 0x21, 0x00)));
    // Task management and a NOP.
    assert_eq!(
        s.task_management(tmf::LOGICAL_UNIT_RESET, 0, 0, 0)
            .await
            .unwrap(),
        tmf::FUNCTION_COMPLETE
    );
    assert_eq!(
        s.task_management(tmf::ABORT_TASK, 0, 0x7777, 0)
            .await
            .unwrap(),
        tmf::TASK_DOES_NOT_EXIST
    );
    assert_eq!(&s.nop(b"ping").await.unwrap()[..], b"ping");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn login_command_set_logout() {
    let mut f = fab(0, Auth::default()).await;
    let s = f.connect(cfg()).await.unwrap();
    assert!(s.params().rdma_extensions);
    command_set(&s).await;
    assert_eq!(s.logout().await.unwrap(), 0);
    f.settled().await;
    // Re-login: the data is still there.
    let s = f.connect(cfg()).await.unwrap();
    assert!(read(&s, 20_000, 16384).await == pattern(16384, 100)[..]);
    assert_eq!(s.logout().await.unwrap(), 0);
    f.settled().await;
}

/// The initiator keeps its fast-registration MRs, as ib_iser's pool: a run of reads and
/// writes reuses the same few, with the target's SEND with Invalidate freeing them or, without
/// it (and for commands that fail before data moves, whose keys stay valid), a local
/// invalidation before each next registration; the data is right either way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fast_registration_mrs_are_kept_and_reused() {
    for send_inv in [true, false] {
        let mut f = fab(0, Auth::default()).await;
        let s = f.connect_with(send_inv, cfg()).await.unwrap();
        let before = f.init_pd.device().live_mrs();
        for i in 0..60u64 {
            let len = [512usize, 65536, 4096][i as usize % 3];
            let data = pattern(len, i as u8);
            write(&s, i * 256, data.clone(), false).await;
            assert!(
                read(&s, i * 256, len).await == data[..],
                "{len} bytes at {} (send with invalidate {send_inv})",
                i * 256
            );
            if i % 7 == 0 {
                // Out of range: CHECK CONDITION before any data moves.
                let c = cdb16(0x88, u64::MAX - 8, 1, 0);
                let r = s.command(0, &c, None, 512).await.unwrap();
                assert_eq!(r.sense_key().map(|k| k.0), Some(0x05), "{r:?}");
            }
        }
        let grown = f.init_pd.device().live_mrs() - before;
        assert!(
            (1..=2).contains(&grown),
            "{grown} MRs more after 129 commands one at a time (send with invalidate {send_inv})"
        );
        assert_eq!(s.logout().await.unwrap(), 0);
        drop(s);
        f.settled().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn command_set_with_one_percent_loss() {
    let mut f = fab(10_000, Auth::default()).await;
    let s = f.connect(cfg()).await.unwrap();
    command_set(&s).await;
    assert_eq!(s.logout().await.unwrap(), 0);
    f.settled().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovery_over_iser() {
    let mut f = fab(0, Auth::default()).await;
    let s = f
        .connect(LoginConfig {
            target_name: None,
            ..LoginConfig::default()
        })
        .await
        .unwrap();
    let t = s.send_targets("All").await.unwrap();
    assert_eq!(t.len(), 1);
    assert_eq!(t[0].name, TARGET);
    assert!(
        t[0].addresses
            .iter()
            .any(|a| a.starts_with("10.0.0.1:3260")),
        "{t:?}"
    );
    assert_eq!(s.logout().await.unwrap(), 0);
    f.settled().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chap_over_iser() {
    let cred = ChapCredentials {
        user: "host".into(),
        secret: "twelve-chars-at-least".into(),
    };
    let mut f = fab(
        0,
        Auth {
            chap: Some(cred.clone()),
            mutual: None,
        },
    )
    .await;
    let bad = f
        .connect(LoginConfig {
            chap: Some(ChapCredentials {
                secret: "wrong-secret-here".into(),
                ..cred.clone()
            }),
            ..cfg()
        })
        .await;
    assert!(
        matches!(
            bad,
            Err(IscsiError::LoginFailed(status::AUTHENTICATION_FAILURE))
        ),
        "{:?}",
        bad.err()
    );
    let s = f
        .connect(LoginConfig {
            chap: Some(cred),
            ..cfg()
        })
        .await
        .unwrap();
    write(&s, 8, pattern(4096, 9), false).await;
    assert_eq!(s.logout().await.unwrap(), 0);
    f.settled().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reinstatement_with_the_same_isid() {
    let mut f = fab(0, Auth::default()).await;
    let a = f.connect(cfg()).await.unwrap();
    let b = f.connect(cfg()).await.unwrap();
    assert_ne!(a.tsih(), b.tsih());
    // The first session was closed by the reinstatement.
    assert!(f.shared.sessions.get(a.tsih()).is_none());
    a.disconnect().await;
    write(&b, 0, pattern(8192, 3), false).await;
    assert_eq!(b.logout().await.unwrap(), 0);
    f.settled().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn initiator_vanishing_frees_everything() {
    let mut f = fab(0, Auth::default()).await;
    let s = f.connect(cfg()).await.unwrap();
    // A write in flight, then the initiator's QP goes away without a logout.
    let p = s
        .submit(0, &cdb16(0x8a, 0, 2048, 0), Some(pattern(1 << 20, 1)), 0)
        .await
        .unwrap();
    s.disconnect().await;
    let _ = p.wait().await;
    // Closing the session from the target side (as its NOP-In timeout would).
    for sess in f.shared.sessions.all() {
        sess.request_close(rtgt_iscsi::session::CloseReason::Forced);
    }
    f.settled().await;
    let s = f.connect(cfg()).await.unwrap();
    write(&s, 0, pattern(4096, 2), false).await;
    assert_eq!(s.logout().await.unwrap(), 0);
    f.settled().await;
}

/// Login without RDMAExtensions=Yes on an iSER connection ends with a login status.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn login_without_rdma_extensions_is_refused() {
    let mut f = fab(0, Auth::default()).await;
    let ep = f.endpoints(true);
    let t = IserTransport::start(ep, SocketAddr::new(ip(1), PORT)).unwrap();
    let ctl = Repr::control().to_bytes();
    let login = |csg: u8, nsg: u8, keys: &[(&str, &str)]| {
        let mut p = TextPairs::new();
        for (k, v) in keys {
            p.push(k, *v);
        }
        let data = p.encode();
        let bhs = BhsRepr::LoginRequest(LoginRequest {
            transit: true,
            csg,
            nsg,
            isid: [0x80, 0, 0, 0, 0, 9],
            cmd_sn: 1,
            data_len: data.len() as u32,
            ..Default::default()
        })
        .to_bytes();
        (bhs, data)
    };
    let (b, d) = login(
        0,
        1,
        &[
            ("InitiatorName", "iqn.2025-01.io.rtgt:bare"),
            ("TargetName", TARGET),
            ("SessionType", "Normal"),
            ("AuthMethod", "None"),
        ],
    );
    t.send(&ctl, &b, &[], &d).await.unwrap();
    let (_, r) = t.recv().await.unwrap();
    let Ok(BhsRepr::LoginResponse(r)) = BhsRepr::parse(&r.header()) else {
        panic!("not a login response")
    };
    assert_eq!(r.status(), 0);
    let (b, d) = login(1, 3, &[("HeaderDigest", "None"), ("ImmediateData", "Yes")]);
    t.send(&ctl, &b, &[], &d).await.unwrap();
    let (_, r) = t.recv().await.unwrap();
    let Ok(BhsRepr::LoginResponse(r)) = BhsRepr::parse(&r.header()) else {
        panic!("not a login response")
    };
    assert_eq!(r.status(), status::MISSING_PARAMETER);
    t.shutdown().await;
    f.settled().await;
    // The target still serves.
    let s = f.connect(cfg()).await.unwrap();
    assert_eq!(s.logout().await.unwrap(), 0);
    f.settled().await;
}

/// An unknown iSER opcode ends the connection; the target keeps serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_iser_opcode_closes_the_connection() {
    let mut f = fab(0, Auth::default()).await;
    let s = f.connect(cfg()).await.unwrap();
    let mut msg = vec![0u8; 28 + 48];
    msg[0] = 0x50;
    s.send_raw(&msg).await.unwrap();
    // The target ended the connection and its session (without a CM, the initiator's QP
    // only learns it from its own timeouts).
    f.settled().await;
    s.disconnect().await;
    let s = f.connect(cfg()).await.unwrap();
    write(&s, 0, pattern(4096, 5), false).await;
    assert_eq!(s.logout().await.unwrap(), 0);
    f.settled().await;
}

/// A write whose DataSegmentLength announces immediate data the SEND does not hold, with the
/// Write STag/VA at the first byte of the write (docs/WIRE.md §6): the target reads it all by
/// RDMA READ, the connection goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn immediate_data_left_out_of_the_send_is_read_by_rdma() {
    let mut f = fab(0, Auth::default()).await;
    let s = f.connect(cfg()).await.unwrap();
    assert!(
        s.params().immediate_data,
        "the test needs ImmediateData=Yes"
    );
    let opts = SubmitOptions {
        immediate_by_rdma: true,
        ..SubmitOptions::default()
    };
    let mut lba = 0u64;
    for (i, len) in [512usize, 4096, 8192, 65536].into_iter().enumerate() {
        let data = pattern(len, 40 + i as u8);
        let c = cdb16(0x8a, lba, (len / BLOCK) as u32, 0);
        let p = s
            .submit_with(0, &c, Some(data.clone()), 0, opts)
            .await
            .unwrap();
        let r = p.wait().await.unwrap();
        assert!(r.is_good(), "write of {len}: {r:?}");
        assert!(
            read(&s, lba, len).await == data[..],
            "{len} bytes read back differ"
        );
        lba += (len / BLOCK) as u64 + 1;
    }
    assert!(s.rejects().is_empty());
    assert_eq!(s.logout().await.unwrap(), 0);
    f.settled().await;
}

/// A PDU whose data segment is missing from its SEND, with nowhere to fetch it from, is
/// rejected with reason Protocol Error (RFC 7143 §11.17.1); the connection goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_segment_missing_from_the_send_is_rejected() {
    let mut f = fab(0, Auth::default()).await;
    let s = f.connect(cfg()).await.unwrap();
    let (cmd_sn, _, _) = s.window();
    let mut bhs = BhsRepr::NopOut(NopOut {
        immediate: true,
        itt: 0x7777,
        ttt: RESERVED_TAG,
        cmd_sn,
        ..Default::default()
    })
    .to_bytes();
    Bhs::new_unchecked(&mut bhs[..]).set_data_segment_len(100);
    let mut msg = Repr::control().to_bytes().to_vec();
    msg.extend_from_slice(&bhs);
    msg.extend_from_slice(b"only part");
    s.send_raw(&msg).await.unwrap();
    for _ in 0..500 {
        if !s.rejects().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(s.rejects(), vec![reject_reason::PROTOCOL_ERROR]);
    write(&s, 0, pattern(8704, 9), false).await;
    assert!(read(&s, 0, 8704).await == pattern(8704, 9)[..]);
    assert_eq!(s.logout().await.unwrap(), 0);
    f.settled().await;
}

/// STags the initiator never registered: the target's RDMA WRITE / READ meets a remote
/// access error, the connection ends, the target keeps serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_stag_is_a_remote_access_error() {
    let mut f = fab(0, Auth::default()).await;
    for write_cmd in [false, true] {
        let s = f.connect(cfg()).await.unwrap();
        let opts = SubmitOptions {
            corrupt_stag: true,
            ..SubmitOptions::default()
        };
        let p = if write_cmd {
            s.submit_with(0, &cdb16(0x8a, 0, 64, 0), Some(pattern(32768, 1)), 0, opts)
                .await
                .unwrap()
        } else {
            s.submit_with(0, &cdb16(0x88, 0, 64, 0), None, 32768, opts)
                .await
                .unwrap()
        };
        assert!(p.wait().await.is_err());
        f.settled().await;
        s.disconnect().await;
    }
    let s = f.connect(cfg()).await.unwrap();
    write(&s, 0, pattern(4096, 5), false).await;
    assert_eq!(s.logout().await.unwrap(), 0);
    f.settled().await;
}

/// Both ends on HCAs with their CMs: the listener accepts as ib_isert does, the initiator
/// connects as ib_iser does.
struct CmFab {
    _target: Arc<rtgt_transport::hca::Hca>,
    init: rtgt_transport::hca::Hca,
    init_pd: Pd,
    server: rtgt_iscsi::iser::IserServer,
    shared: Arc<ServerShared>,
    _stop: tokio::sync::watch::Sender<bool>,
}

async fn cm_fab(drop_ppm: u32) -> CmFab {
    use rtgt_transport::cm::CmLimits;
    use rtgt_transport::hca::Hca as SoftHca;
    let f = fab(0, Auth::default()).await;
    let (la, lb) = loopback::pair(1 << 16);
    let faults = FaultConfig {
        drop_ppm,
        ..FaultConfig::default()
    };
    let mut tc = HcaConfig::new("tgt-cm", vec![ip(1)]);
    tc.eth_mtu = 1500;
    let mut ic = HcaConfig::new("ini-cm", vec![ip(2)]);
    ic.eth_mtu = 1500;
    let target = Arc::new(
        SoftHca::with_netdev(
            Hca::new(tc).unwrap(),
            FaultInjector::new(la, faults, 3),
            CmLimits::default(),
        )
        .unwrap(),
    );
    let init = SoftHca::with_netdev(
        Hca::new(ic).unwrap(),
        FaultInjector::new(lb, faults, 5),
        CmLimits::default(),
    )
    .unwrap();
    let rdma = Provider::soft(target.clone(), &f.shared.pool).unwrap();
    let server = rtgt_iscsi::iser::IserServer::new(f.shared.clone(), rdma);
    let (tx, rx) = tokio::sync::watch::channel(false);
    let s = server.clone();
    tokio::spawn(async move {
        s.serve(SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), PORT), rx)
            .await
            .unwrap();
    });
    CmFab {
        init_pd: init.device().alloc_pd().unwrap(),
        _target: target,
        init,
        server,
        shared: f.shared.clone(),
        _stop: tx,
    }
}

impl CmFab {
    async fn connect(&self) -> Session {
        let dst = SocketAddr::new(ip(1), PORT);
        let mut last = None;
        // The listener task may not have started yet.
        for _ in 0..50 {
            match Session::connect_iser_cm(self.init.cm(), &self.init_pd, dst, cfg()).await {
                Ok(s) => {
                    let r = s.command(0, &[0u8; 6], None, 0).await.unwrap();
                    assert!(r.is_good() || r.sense_key().map(|k| k.0) == Some(0x06));
                    return s;
                }
                Err(e) => last = Some(e),
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("no iSER connection: {last:?}");
    }

    async fn settled(&self) {
        for _ in 0..2000 {
            if self.server.stats().connections.load(Ordering::Acquire) == 0
                && self.server.live_qps() == 0
                && self.shared.sessions.is_empty()
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        panic!(
            "target kept {} connections, {} QPs, {} sessions",
            self.server.stats().connections.load(Ordering::Acquire),
            self.server.live_qps(),
            self.shared.sessions.len()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_the_cm() {
    let f = cm_fab(0).await;
    let s = f.connect().await;
    command_set(&s).await;
    assert_eq!(s.logout().await.unwrap(), 0);
    f.settled().await;
    // A vanished initiator (DREQ without logout) is cleaned up too.
    let s = f.connect().await;
    write(&s, 0, pattern(65536, 4), false).await;
    s.disconnect().await;
    f.settled().await;
    assert!(f.server.stats().accepted.load(Ordering::Relaxed) >= 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_the_cm_with_one_percent_loss() {
    let f = cm_fab(10_000).await;
    let s = f.connect().await;
    command_set(&s).await;
    assert_eq!(s.logout().await.unwrap(), 0);
    f.settled().await;
}
