//! The SRP target against the in-repo initiator over two soft-RoCE devices on an in-memory
//! link (optionally through a fault injector), QPs connected by hand.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use rtgt_backstore::{
    Backstore, BackstoreError, BufPool, BufResult, DeviceInfo, IoBuf, RamBackstore,
};
use rtgt_transport::netdev::fault::{FaultConfig, FaultInjector};
use rtgt_transport::netdev::gate::{Gate, Gated};
use rtgt_transport::netdev::{self, loopback};
use rtgt_transport::verbs::*;

use rtgt_rdma_channel::cm::Provider;
use rtgt_rdma_channel::mem::PoolMrs;
use rtgt_scsi::core::SrpTargetPort;
use rtgt_scsi::{Device as ScsiDevice, DeviceConfig as ScsiConfig, LunMap};
use rtgt_srp::channel::{Channel, CloseReason};
use rtgt_srp::iu::{self, rej_reason, req_flags, tmf, tmf_status, LoginReq, IMM_DATA_OFFSET};
use rtgt_srp::login::Limits;
use rtgt_srp::port::SrpPort;
use rtgt_tools::srp::{DescMode, Initiator, InitiatorError};

pub(crate) const BS: u32 = 512;
const BLOCKS: u64 = 65536;
const ID_EXT: u64 = 0x0002_c903_0000_1111;
const IOC_GUID: u64 = 0x0002_c903_0000_2222;

/// A RAM backstore whose reads wait while the gate is closed.
pub(crate) struct GatedStore {
    inner: RamBackstore,
    closed: AtomicBool,
    open: tokio::sync::Notify,
    /// Reads waiting at the closed gate.
    parked: AtomicUsize,
}

impl GatedStore {
    pub(crate) fn new(blocks: u64, block_size: u32) -> Arc<GatedStore> {
        Arc::new(GatedStore {
            inner: RamBackstore::new(blocks * u64::from(block_size), block_size),
            closed: AtomicBool::new(false),
            open: tokio::sync::Notify::new(),
            parked: AtomicUsize::new(0),
        })
    }

    /// Reads waiting at the closed gate.
    pub(crate) fn parked(&self) -> usize {
        self.parked.load(Ordering::SeqCst)
    }

    pub(crate) fn set(&self, closed: bool) {
        self.closed.store(closed, Ordering::SeqCst);
        if !closed {
            self.open.notify_waiters();
        }
    }
}

#[async_trait]
impl Backstore for GatedStore {
    fn info(&self) -> DeviceInfo {
        self.inner.info()
    }
    async fn read(&self, offset: u64, buf: IoBuf) -> BufResult<()> {
        struct Parked<'a>(&'a AtomicUsize);
        impl Drop for Parked<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::SeqCst);
            }
        }
        self.parked.fetch_add(1, Ordering::SeqCst);
        let parked = Parked(&self.parked);
        loop {
            let n = self.open.notified();
            if !self.closed.load(Ordering::SeqCst) {
                break;
            }
            n.await;
        }
        drop(parked);
        self.inner.read(offset, buf).await
    }
    async fn write(&self, offset: u64, buf: IoBuf, fua: bool) -> BufResult<()> {
        self.inner.write(offset, buf, fua).await
    }
    async fn flush(&self) -> Result<(), BackstoreError> {
        self.inner.flush().await
    }
    async fn unmap(&self, offset: u64, len: u64) -> Result<(), BackstoreError> {
        self.inner.unmap(offset, len).await
    }
    async fn lba_status(&self, offset: u64, len: u64) -> Result<(bool, u64), BackstoreError> {
        self.inner.lba_status(offset, len).await
    }
    async fn resize(&self, num_blocks: u64) -> Result<(), BackstoreError> {
        self.inner.resize(num_blocks).await
    }
}

fn ip(last: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(10, 9, 0, last))
}

struct Host {
    dev: Device,
    pd: Pd,
}

pub(crate) struct Rig {
    port: Arc<SrpPort>,
    pub(crate) store: Arc<GatedStore>,
    /// Holds chosen packets of both ends (open unless a test closes it).
    pub(crate) gate: Gate,
    target: Host,
    init: Host,
    runners: Vec<tokio::task::JoinHandle<std::io::Result<()>>>,
}

impl Drop for Rig {
    fn drop(&mut self) {
        for r in &self.runners {
            r.abort();
        }
    }
}

fn host(name: &str, addr: IpAddr) -> Host {
    let dev = Device::new(DeviceConfig::new(name, vec![addr])).unwrap();
    let pd = dev.alloc_pd().unwrap();
    Host { dev, pd }
}

fn rig_with(faults: Option<FaultConfig>, allow_any: bool, acl: Option<[u8; 16]>) -> Rig {
    let target = host("t", ip(1));
    let init = host("i", ip(2));
    let (la, lb) = loopback::pair(1 << 16);
    let gate = Gate::new();
    let runners = match faults {
        Some(cfg) => vec![
            tokio::spawn(netdev::run(
                target.dev.clone(),
                Gated::new(FaultInjector::new(la, cfg, 7), gate.clone()),
            )),
            tokio::spawn(netdev::run(
                init.dev.clone(),
                Gated::new(FaultInjector::new(lb, cfg, 1234), gate.clone()),
            )),
        ],
        None => vec![
            tokio::spawn(netdev::run(
                target.dev.clone(),
                Gated::new(la, gate.clone()),
            )),
            tokio::spawn(netdev::run(init.dev.clone(), Gated::new(lb, gate.clone()))),
        ],
    };
    let pool = BufPool::new(64 << 20);
    let store = GatedStore::new(BLOCKS, BS);
    let dev = ScsiDevice::new(
        store.clone(),
        pool.clone(),
        ScsiConfig {
            name: "srp0".into(),
            serial: "srp0".into(),
            wwn: 0x6001_4050_0000_0000_0000_0000_0000_0001,
            ..ScsiConfig::default()
        },
    )
    .unwrap();
    let mut luns = LunMap::default();
    luns.luns.insert(0, dev);
    let mut acls = HashMap::new();
    if let Some(id) = acl {
        let name = rtgt_scsi::core::srp_port_name(&id);
        acls.insert(
            name.clone(),
            rtgt_scsi::core::Acl {
                initiator: name,
                auth: Default::default(),
                luns: luns.clone(),
            },
        );
    }
    let cfg = SrpTargetPort {
        name: "srp-test".into(),
        ids: rtgt_scsi::core::PortIds::alone(1),
        id_ext: ID_EXT,
        ioc_guid: IOC_GUID,
        listen: Vec::new(),
        acls,
        allow_any_initiator: allow_any,
        luns,
    };
    let port = SrpPort::new(Arc::new(cfg), Limits::default(), pool);
    Rig {
        port,
        store,
        gate,
        target,
        init,
        runners,
    }
}

pub(crate) fn rig() -> Rig {
    rig_with(None, true, None)
}

pub(crate) fn login_req(initiator: u8, multi: bool) -> LoginReq {
    let mut target_port_id = [0u8; 16];
    target_port_id[..8].copy_from_slice(&ID_EXT.to_be_bytes());
    target_port_id[8..].copy_from_slice(&IOC_GUID.to_be_bytes());
    LoginReq {
        tag: 0x1000 + u64::from(initiator),
        req_it_iu_len: 8260,
        req_buf_fmt: iu::buf_fmt::DIRECT | iu::buf_fmt::INDIRECT,
        req_flags: req_flags::IMMED_REQUESTED
            | if multi {
                req_flags::MULTICHAN_MULTI
            } else {
                req_flags::MULTICHAN_SINGLE
            },
        imm_data_offset: IMM_DATA_OFFSET as u16,
        initiator_port_id: [initiator; 16],
        target_port_id,
    }
}

fn to_rtr_rts(qp: &Qp, remote: IpAddr, dest_qpn: u32, sq_psn: u32, rq_psn: u32) {
    qp.to_rts(&RcPath {
        timeout: 8,
        max_rd_atomic: 4,
        ..RcPath::new(remote, dest_qpn, rq_psn, sq_psn)
    })
    .unwrap();
}

/// Logs in with `req` and connects a channel by hand; the login must be accepted.
pub(crate) fn connect(r: &Rig, req: &LoginReq) -> (Arc<Channel>, Arc<Initiator>) {
    let login = r.port.login(req).expect("login accepted");
    let rsp = login.rsp;
    let ep = Channel::endpoint(&r.target.pd, &login.params).unwrap();
    let icq = r.init.dev.create_cq(4096).unwrap();
    let mut init = QpInitAttr::new(QpType::Rc, &icq, &icq);
    init.cap.max_send_wr = 512;
    init.cap.max_recv_wr = 256;
    init.cap.max_inline_data = 256;
    let iqp = r.init.pd.create_qp(init).unwrap();
    to_init(ep.qp.soft().unwrap());
    to_init(&iqp);
    let peer = std::net::SocketAddr::new(ip(2), 0);
    let pool_mrs = PoolMrs::register(&ep.pd, &r.port.pool).unwrap();
    let ch = r
        .port
        .start_channel(ep, login, peer, Some(Arc::new(pool_mrs)))
        .unwrap();
    let ini = Initiator::start(
        r.init.pd.clone(),
        icq,
        Arc::new(iqp),
        rsp,
        req.req_it_iu_len,
        req.req_flags & req_flags::IMMED_REQUESTED != 0,
    )
    .unwrap();
    let cq = ch.qp().soft().unwrap();
    to_rtr_rts(cq, ip(2), ini.qp().qpn(), 0x100, 0x900);
    to_rtr_rts(ini.qp(), ip(1), cq.qpn(), 0x900, 0x100);
    (ch, ini)
}

fn to_init(qp: &Qp) {
    qp.to_init(Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ)
        .unwrap();
}

fn pattern(len: usize, seed: u32) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect()
}

pub(crate) async fn settle(ini: &Initiator) {
    // The first command of a nexus gets POWER ON OCCURRED: take it.
    let (n, bs) = ini.read_capacity(0).await.unwrap();
    assert_eq!((n, bs), (BLOCKS, BS));
}

const MODES: [DescMode; 6] = [
    DescMode::Direct,
    DescMode::Indirect { pieces: 3 },
    DescMode::Indirect { pieces: 12 },
    DescMode::External {
        pieces: 40,
        inline: 0,
    },
    DescMode::External {
        pieces: 17,
        inline: 12,
    },
    DescMode::Immediate,
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_descriptor_format() {
    let r = rig();
    let (_ch, ini) = connect(&r, &login_req(1, false));
    settle(&ini).await;
    let mut seed = 0;
    for (wi, wmode) in MODES.iter().enumerate() {
        for len in [512usize, 4096, 8192, 65536, 1 << 20] {
            seed += 1;
            let data = pattern(len, seed);
            let lba = (wi as u64) * 4096 + (len as u64 / 512) % 7;
            ini.write(0, lba, &data, BS, *wmode).await.unwrap();
            for rmode in MODES {
                let got = ini
                    .read(0, lba, (len / 512) as u32, BS, rmode)
                    .await
                    .unwrap();
                assert!(
                    got == data,
                    "write {wmode:?} / read {rmode:?} of {len} bytes differ"
                );
            }
        }
    }
    assert_eq!(ini.credits(), Limits::default().req_lim as usize - 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn immediate_data_needs_the_login_grant() {
    let r = rig();
    let mut req = login_req(2, false);
    req.req_flags &= !req_flags::IMMED_REQUESTED;
    let (_ch, ini) = connect(&r, &req);
    settle(&ini).await;
    // Without the grant the initiator falls back to a direct descriptor.
    let data = pattern(4096, 9);
    ini.write(0, 8, &data, BS, DescMode::Immediate)
        .await
        .unwrap();
    assert_eq!(ini.read(0, 8, 8, BS, DescMode::Direct).await.unwrap(), data);
    // Forcing immediate data on a channel without it is answered with CHECK CONDITION.
    let cmd = iu::Cmd {
        sol_not: 0,
        tag: 0x77,
        lun: [0; 8],
        task_attr: 0,
        cdb: {
            let mut c = vec![0u8; 16];
            c[0] = 0x8a;
            c[13] = 1;
            c.into()
        },
        data_out: iu::DataDesc::Immediate { len: 512 },
        data_in: iu::DataDesc::None,
    };
    let mut b = vec![0u8; IMM_DATA_OFFSET + 512];
    cmd.emit(&mut b);
    let rsp = ini.send_raw(b).await.unwrap().await.unwrap();
    assert_eq!(rsp.status, 2);
    assert_eq!(
        (rsp.sense[2] & 0xf, rsp.sense[12], rsp.sense[13]),
        (5, 0x0e, 0x03)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn residuals_and_bad_descriptors() {
    let r = rig();
    let (_ch, ini) = connect(&r, &login_req(3, false));
    settle(&ini).await;
    // READ(16) of 1 block with 4096 bytes of buffer: DIUNDER 3584.
    let mut cdb = [0u8; 16];
    cdb[0] = 0x88;
    cdb[13] = 1;
    let rep = ini
        .command(0, &cdb, None, 4096, DescMode::Direct)
        .await
        .unwrap();
    assert_eq!(rep.rsp.status, 0);
    assert_eq!(rep.rsp.flags & iu::rsp_flag::DIUNDER, iu::rsp_flag::DIUNDER);
    assert_eq!(rep.rsp.data_in_res_cnt, 3584);
    assert_eq!(rep.data.len(), 512);
    // 8 blocks into 1024 bytes: DIOVER 3072.
    cdb[13] = 8;
    let rep = ini
        .command(0, &cdb, None, 1024, DescMode::Indirect { pieces: 2 })
        .await
        .unwrap();
    assert_eq!(rep.rsp.flags & iu::rsp_flag::DIOVER, iu::rsp_flag::DIOVER);
    assert_eq!(rep.rsp.data_in_res_cnt, 3072);
    // WRITE(16) of 1 block with 1024 bytes of data: DOOVER... the target consumes 512.
    let mut w = [0u8; 16];
    w[0] = 0x8a;
    w[13] = 1;
    let rep = ini
        .command(0, &w, Some(&pattern(1024, 1)), 0, DescMode::Direct)
        .await
        .unwrap();
    assert_eq!(rep.rsp.status, 0);
    assert_eq!(rep.rsp.flags & iu::rsp_flag::DOUNDER, iu::rsp_flag::DOUNDER);
    assert_eq!(rep.rsp.data_out_res_cnt, 512);
    // An indirect descriptor whose buffers cover less than its total length.
    let cmd = iu::Cmd {
        sol_not: 0,
        tag: 0x99,
        lun: [0; 8],
        task_attr: 0,
        cdb: cdb.into(),
        data_out: iu::DataDesc::None,
        data_in: iu::DataDesc::Indirect {
            table: iu::DirectBuf {
                va: 0,
                key: 0,
                len: 16,
            },
            total_len: 4096,
            inline: vec![iu::DirectBuf {
                va: 0x1000,
                key: 1,
                len: 512,
            }],
        },
    };
    let mut b = vec![0u8; cmd.buffer_len()];
    cmd.emit(&mut b);
    let rsp = ini.send_raw(b).await.unwrap().await.unwrap();
    assert_eq!(rsp.status, 2);
    assert_eq!((rsp.sense[12], rsp.sense[13]), (0x0e, 0x03));
    // A LUN that is not mapped.
    let e = ini.read(5, 0, 1, BS, DescMode::Direct).await.unwrap_err();
    match e {
        InitiatorError::Status { status: 2, sense } => assert_eq!(sense[12], 0x25),
        e => panic!("{e}"),
    }
    assert_eq!(ini.credits(), Limits::default().req_lim as usize - 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn task_management() {
    let r = rig();
    let (ch, ini) = connect(&r, &login_req(4, false));
    settle(&ini).await;
    assert_eq!(
        ini.task_mgmt(0, tmf::ABORT_TASK, 0xdead).await.unwrap(),
        tmf_status::COMPLETE
    );
    assert_eq!(
        ini.task_mgmt(0, tmf::CLEAR_ACA, 0).await.unwrap(),
        tmf_status::NOT_SUPPORTED
    );
    assert_eq!(
        ini.task_mgmt(0, 0x77, 0).await.unwrap(),
        tmf_status::NOT_SUPPORTED
    );
    assert_eq!(
        ini.task_mgmt(3, tmf::LUN_RESET, 0).await.unwrap(),
        tmf_status::FAILED
    );
    // ABORT TASK of a read held in the backstore: no response for it, its credit comes back
    // with the task management response.
    r.store.set(true);
    let tag = ini.peek_tag();
    let i2 = ini.clone();
    let held = tokio::spawn(async move { i2.read(0, 0, 8, BS, DescMode::Direct).await });
    while ch.outstanding() == 0 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let i3 = ini.clone();
    let abort = tokio::spawn(async move { i3.task_mgmt(0, tmf::ABORT_TASK, tag).await });
    while ch.aborting() == 0 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    r.store.set(false);
    assert_eq!(abort.await.unwrap().unwrap(), tmf_status::COMPLETE);
    assert!(!held.is_finished());
    held.abort();
    assert_eq!(ch.outstanding(), 0);
    assert_eq!(ini.credits(), Limits::default().req_lim as usize - 1);
    // ABORT TASK SET and CLEAR TASK SET over a held read.
    for f in [tmf::ABORT_TASK_SET, tmf::CLEAR_TASK_SET] {
        r.store.set(true);
        let i2 = ini.clone();
        let held = tokio::spawn(async move { i2.read(0, 0, 8, BS, DescMode::Direct).await });
        while ch.outstanding() == 0 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let i3 = ini.clone();
        let abort = tokio::spawn(async move { i3.task_mgmt(0, f, 0).await });
        while ch.aborting() == 0 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        r.store.set(false);
        assert_eq!(abort.await.unwrap().unwrap(), tmf_status::COMPLETE);
        held.abort();
    }
    // LOGICAL UNIT RESET: the next command reports BUS DEVICE RESET FUNCTION OCCURRED.
    assert_eq!(
        ini.task_mgmt(0, tmf::LUN_RESET, 0).await.unwrap(),
        tmf_status::COMPLETE
    );
    match ini.read(0, 0, 1, BS, DescMode::Direct).await.unwrap_err() {
        InitiatorError::Status { status: 2, sense } => {
            assert_eq!((sense[2] & 0xf, sense[12], sense[13]), (6, 0x29, 0x03))
        }
        e => panic!("{e}"),
    }
    assert_eq!(ini.credits(), Limits::default().req_lim as usize - 1);
}

/// SAM-5 8.9 task attributes: with a SIMPLE read held in the backstore, an ORDERED command
/// and the SIMPLE one after it wait, a HEAD OF QUEUE one does not; an ABORT TASK of a
/// waiting command is answered without waiting for the held read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn task_attributes_order_commands() {
    let r = rig();
    let (ch, ini) = connect(&r, &login_req(12, false));
    settle(&ini).await;
    let tur = |tag: u64, task_attr: u8| {
        let cmd = iu::Cmd {
            sol_not: 0,
            tag,
            lun: [0; 8],
            task_attr,
            cdb: [0u8; 16][..].into(),
            data_out: iu::DataDesc::None,
            data_in: iu::DataDesc::None,
        };
        let mut b = vec![0u8; cmd.buffer_len()];
        cmd.emit(&mut b);
        b
    };
    r.store.set(true);
    let i2 = ini.clone();
    let held = tokio::spawn(async move { i2.read(0, 0, 8, BS, DescMode::Direct).await });
    while ch.outstanding() == 0 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let mut ordered = ini.send_raw(tur(0x501, 2)).await.unwrap();
    let mut simple = ini.send_raw(tur(0x502, 0)).await.unwrap();
    let mut doomed = ini.send_raw(tur(0x503, 0)).await.unwrap();
    let hoq = ini.send_raw(tur(0x504, 1)).await.unwrap();
    assert_eq!(
        hoq.await.unwrap().status,
        0,
        "HEAD OF QUEUE waits for nobody"
    );
    // Aborting a waiting SIMPLE command does not wait for the read it waits behind.
    assert_eq!(
        ini.task_mgmt(0, tmf::ABORT_TASK, 0x503).await.unwrap(),
        tmf_status::COMPLETE
    );
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(ordered.try_recv().is_err(), "ORDERED ran before the read");
    assert!(
        simple.try_recv().is_err(),
        "SIMPLE ran before the ORDERED one"
    );
    assert_eq!(ch.outstanding(), 3);
    r.store.set(false);
    assert!(held.await.unwrap().is_ok());
    assert_eq!(ordered.await.unwrap().status, 0);
    assert_eq!(simple.await.unwrap().status, 0);
    assert!(
        doomed.try_recv().is_err(),
        "an aborted command has no response"
    );
    assert_eq!(ch.outstanding(), 0);
    assert_eq!(ini.credits(), Limits::default().req_lim as usize - 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_percent_loss_keeps_data_intact() {
    let r = rig_with(Some(FaultConfig::uniform(1.0)), true, None);
    let (_ch, ini) = connect(&r, &login_req(5, false));
    settle(&ini).await;
    let mut jobs = Vec::new();
    for i in 0..24u32 {
        let ini = ini.clone();
        jobs.push(tokio::spawn(async move {
            let mode = MODES[i as usize % MODES.len()];
            let len = [4096usize, 8192, 65536, 262_144][i as usize % 4];
            let data = pattern(len, 100 + i);
            let lba = u64::from(i) * 1024;
            ini.write(0, lba, &data, BS, mode).await.unwrap();
            let got = ini
                .read(
                    0,
                    lba,
                    (len / 512) as u32,
                    BS,
                    MODES[(i as usize + 2) % MODES.len()],
                )
                .await
                .unwrap();
            assert!(got == data, "job {i}: data differs");
        }));
    }
    for j in jobs {
        j.await.unwrap();
    }
    assert!(r.target.dev.stats().retransmits + r.init.dev.stats().retransmits > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logins_channels_and_logout() {
    let r = rig_with(None, false, Some([6; 16]));
    // Wrong target port identifier.
    let mut bad = login_req(6, false);
    bad.target_port_id[0] ^= 0xff;
    let rej = r.port.login(&bad).err().unwrap();
    assert_eq!(rej.reason, rej_reason::UNABLE_ASSOCIATE_CHANNEL);
    assert_eq!(rej.tag, bad.tag);
    // No ACL.
    assert_eq!(
        r.port.login(&login_req(7, false)).err().unwrap().reason,
        rej_reason::UNABLE_ESTABLISH_CHANNEL
    );
    // First channel, then a second one with MULTI: both live, one session.
    let (ch1, ini1) = connect(&r, &login_req(6, false));
    settle(&ini1).await;
    let (ch2, ini2) = connect(&r, &login_req(6, true));
    assert_eq!(ini2.login.rsp_flags & 0x3, iu::rsp_flags::MAINTAINED);
    ini2.write(0, 0, &pattern(512, 1), BS, DescMode::Direct)
        .await
        .unwrap();
    assert_eq!(r.port.sessions().len(), 1);
    assert_eq!(r.port.sessions()[0].channels().len(), 2);
    // A single-channel login terminates both.
    let (ch3, ini3) = connect(&r, &login_req(6, false));
    assert_eq!(ini3.login.rsp_flags & 0x3, iu::rsp_flags::TERMINATED);
    assert_eq!(ch1.closed().await, CloseReason::Relogin);
    assert_eq!(ch2.closed().await, CloseReason::Relogin);
    ch1.finished().await;
    ch2.finished().await;
    // The nexus may have been lost in between (both old channels gone before the new one
    // joined the session): take the unit attention that reports it.
    ini3.read_capacity(0).await.unwrap();
    assert_eq!(
        ini3.read(0, 0, 1, BS, DescMode::Direct).await.unwrap(),
        pattern(512, 1)
    );
    // I_LOGOUT ends the channel and, with it, the session.
    ini3.logout().unwrap();
    assert_eq!(ch3.closed().await, CloseReason::Logout);
    ch3.finished().await;
    assert!(r.port.sessions().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_iu_and_shutdown_send_t_logout() {
    let r = rig();
    let (ch, ini) = connect(&r, &login_req(8, false));
    settle(&ini).await;
    drop(ini.send_raw(vec![0x77; 64]).await.unwrap());
    ini.closed().await;
    assert_eq!(ini.stats.t_logouts.load(Ordering::Relaxed), 1);
    assert_eq!(ch.closed().await, CloseReason::Protocol);
    let (_ch, ini) = connect(&r, &login_req(9, false));
    settle(&ini).await;
    r.port.shutdown().await;
    ini.closed().await;
    assert_eq!(ini.stats.t_logouts.load(Ordering::Relaxed), 1);
    assert!(r.port.sessions().is_empty());
}

/// The SRP service behind the RDMA/CM connection manager: two HCAs on a loopback link.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn login_through_the_connection_manager() {
    use rtgt_tools::srp::ConnectOptions;
    use rtgt_transport::cm::CmLimits;
    use rtgt_transport::hca::Hca;

    let r = rig();
    // Reuse the rig's target port configuration in a registry for the service.
    let registry = rtgt_scsi::core::Registry::new();
    registry.set_srp_port(SrpTargetPort {
        listen: vec![std::net::SocketAddr::new(ip(11), 5555)],
        ..(*r.port.config()).clone()
    });
    let (la, lb) = loopback::pair(1 << 14);
    let dt = Device::new(DeviceConfig::new("t", vec![ip(11)])).unwrap();
    let di = Device::new(DeviceConfig::new("i", vec![ip(12)])).unwrap();
    let ht = Arc::new(Hca::with_netdev(dt, la, CmLimits::default()).unwrap());
    let hi = Hca::with_netdev(di, lb, CmLimits::default()).unwrap();
    let svc = srp_service(&ht, &registry);
    let dst = std::net::SocketAddr::new(ip(11), 5555);

    let mut opts = ConnectOptions::new([0x21; 16], ID_EXT, IOC_GUID ^ 1);
    match Initiator::connect(hi.cm(), dst, &opts).await {
        Err(InitiatorError::Rejected(reason)) => {
            assert_eq!(reason, rej_reason::UNABLE_ASSOCIATE_CHANNEL)
        }
        other => panic!("expected a LOGIN_REJ, got {:?}", other.map(|_| ())),
    }
    opts = ConnectOptions::new([0x21; 16], ID_EXT, IOC_GUID);
    opts.it_iu_len = 70_000_000;
    assert!(matches!(
        Initiator::connect(hi.cm(), dst, &opts).await,
        Err(InitiatorError::Rejected(rej_reason::IT_IU_LENGTH_TOO_LARGE))
    ));
    opts.it_iu_len = 8260;
    // Private data that is no login request: a LOGIN_REJ all the same.
    {
        use rtgt_transport::cm::{CmError, ConnParams};
        let pd = hi.device().alloc_pd().unwrap();
        let cq = hi.device().create_cq(16).unwrap();
        let qp = pd.create_qp(QpInitAttr::new(QpType::Rc, &cq, &cq)).unwrap();
        let params = ConnParams {
            private_data: vec![0x5a; 56],
            ..ConnParams::default()
        };
        match hi.cm().connect(&qp, dst, params).await {
            Err(CmError::Rejected { private_data, .. }) => assert_eq!(
                iu::LoginRej::parse(&private_data).unwrap().reason,
                rej_reason::UNABLE_ESTABLISH_CHANNEL
            ),
            other => panic!("expected a REJ, got {:?}", other.map(|_| ())),
        }
    }
    let (ini, conn) = Initiator::connect(hi.cm(), dst, &opts).await.unwrap();
    settle(&ini).await;
    let data = pattern(256 << 10, 77);
    for mode in MODES {
        ini.write(0, 100, &data, BS, mode).await.unwrap();
        assert_eq!(ini.read(0, 100, 512, BS, mode).await.unwrap(), data);
    }
    let ports = svc.ports();
    let port = &ports[0];
    assert_eq!(port.channels().len(), 1);
    // The initiator disconnects: the channel and the session go.
    drop(conn);
    let ch = port.channels();
    if let Some(ch) = ch.first() {
        ch.finished().await;
    }
    while !port.sessions().is_empty() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // A second login, then the target shuts down: SRP_T_LOGOUT and a disconnect.
    let (ini, conn) = Initiator::connect(hi.cm(), dst, &opts).await.unwrap();
    settle(&ini).await;
    svc.shutdown(Duration::from_secs(5)).await;
    ini.closed().await;
    assert_eq!(ini.stats.t_logouts.load(Ordering::Relaxed), 1);
    conn.disconnected().await;
}

/// A tag is free again as soon as its response is out: Linux ib_srp reuses it at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tags_are_reusable_after_the_response() {
    let r = rig();
    let (_ch, ini) = connect(&r, &login_req(10, false));
    settle(&ini).await;
    let buf = Arc::new(Region::zeroed(4096));
    let mr = r
        .init
        .pd
        .reg_mr(buf.clone(), Access::LOCAL_WRITE | Access::REMOTE_WRITE)
        .unwrap();
    let mut cdb = vec![0u8; 16];
    cdb[0] = 0x88;
    cdb[13] = 8;
    let cmd = iu::Cmd {
        sol_not: 0,
        tag: 0x42,
        lun: [0; 8],
        task_attr: 0,
        cdb: cdb.into(),
        data_out: iu::DataDesc::None,
        data_in: iu::DataDesc::Direct(iu::DirectBuf {
            va: mr.iova(),
            key: mr.rkey(),
            len: 4096,
        }),
    };
    let mut b = vec![0u8; cmd.buffer_len()];
    cmd.emit(&mut b);
    for _ in 0..200 {
        let rsp = ini.send_raw(b.clone()).await.unwrap().await.unwrap();
        assert_eq!((rsp.status, rsp.tag), (0, 0x42), "{rsp:?}");
    }
}

/// The whole path — connection manager, login, channel, data — with 1% of the datagrams
/// lost, duplicated, corrupted, reordered or delayed in each direction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_manager_and_data_under_one_percent_faults() {
    use rtgt_tools::srp::ConnectOptions;
    use rtgt_transport::cm::CmLimits;
    use rtgt_transport::hca::Hca;

    let r = rig();
    let registry = rtgt_scsi::core::Registry::new();
    registry.set_srp_port(SrpTargetPort {
        listen: vec![std::net::SocketAddr::new(ip(21), 5555)],
        ..(*r.port.config()).clone()
    });
    let (la, lb) = loopback::pair(1 << 14);
    let cfg = FaultConfig::uniform(1.0);
    let dt = Device::new(DeviceConfig::new("t", vec![ip(21)])).unwrap();
    let di = Device::new(DeviceConfig::new("i", vec![ip(22)])).unwrap();
    let ht = Arc::new(
        Hca::with_netdev(dt, FaultInjector::new(la, cfg, 11), CmLimits::default()).unwrap(),
    );
    let hi = Hca::with_netdev(di, FaultInjector::new(lb, cfg, 29), CmLimits::default()).unwrap();
    let _svc = srp_service(&ht, &registry);
    let opts = ConnectOptions::new([0x31; 16], ID_EXT, IOC_GUID);
    let dst = std::net::SocketAddr::new(ip(21), 5555);
    let (ini, _conn) = Initiator::connect(hi.cm(), dst, &opts).await.unwrap();
    settle(&ini).await;
    let mut jobs = Vec::new();
    for i in 0..12u32 {
        let ini = ini.clone();
        jobs.push(tokio::spawn(async move {
            let len = [4096usize, 65536, 262_144][i as usize % 3];
            let data = pattern(len, 500 + i);
            let lba = 20_000 + u64::from(i) * 1024;
            ini.write(0, lba, &data, BS, MODES[i as usize % MODES.len()])
                .await
                .unwrap();
            let got = ini
                .read(
                    0,
                    lba,
                    (len / 512) as u32,
                    BS,
                    MODES[(i as usize + 3) % MODES.len()],
                )
                .await
                .unwrap();
            assert!(got == data, "job {i}: data differs");
        }));
    }
    for j in jobs {
        j.await.unwrap();
    }
}

/// The service follows the registry's target ports while it runs: a port added later
/// listens, a new LUN reaches the live session with REPORTED LUNS DATA HAS CHANGED, an ACL
/// removed logs out only that initiator, a session is logged out by id, and a removed port
/// stops listening.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn service_follows_live_changes() {
    use rtgt_srp::service::PortChange;
    use rtgt_tools::srp::ConnectOptions;
    use rtgt_transport::cm::CmLimits;
    use rtgt_transport::hca::Hca;

    let r = rig();
    let registry = rtgt_scsi::core::Registry::new();
    let (la, lb) = loopback::pair(1 << 14);
    let dt = Device::new(DeviceConfig::new("t", vec![ip(31)])).unwrap();
    let di = Device::new(DeviceConfig::new("i", vec![ip(32)])).unwrap();
    let ht = Arc::new(Hca::with_netdev(dt, la, CmLimits::default()).unwrap());
    let hi = Hca::with_netdev(di, lb, CmLimits::default()).unwrap();
    let svc = srp_service(&ht, &registry);
    assert!(svc.ports().is_empty() && svc.listening().is_empty());

    let dst = std::net::SocketAddr::new(ip(31), 5555);
    let (ini_a, ini_b) = ([0x41u8; 16], [0x42u8; 16]);
    let base = (*r.port.config()).clone();
    let acl = |id: &[u8; 16], luns: &LunMap| {
        let name = rtgt_scsi::core::srp_port_name(id);
        (
            name.clone(),
            rtgt_scsi::core::Acl {
                initiator: name,
                auth: Default::default(),
                luns: luns.clone(),
            },
        )
    };
    let with = |luns: &LunMap, ids: &[[u8; 16]]| SrpTargetPort {
        listen: vec![dst],
        allow_any_initiator: false,
        acls: ids.iter().map(|id| acl(id, luns)).collect(),
        luns: luns.clone(),
        ..base.clone()
    };
    let one = base.luns.clone();
    registry.set_srp_port(with(&one, &[ini_a, ini_b]));
    assert_eq!(svc.sync(), vec![PortChange::Added(base.name.clone())]);
    assert_eq!(svc.listening(), vec![dst]);

    let opts = |id| ConnectOptions::new(id, ID_EXT, IOC_GUID);
    let (a, _ca) = Initiator::connect(hi.cm(), dst, &opts(ini_a))
        .await
        .unwrap();
    let (b, _cb) = Initiator::connect(hi.cm(), dst, &opts(ini_b))
        .await
        .unwrap();
    settle(&a).await;
    settle(&b).await;

    // LUN 1: the same device under a second number.
    let mut two = one.clone();
    two.luns.insert(1, one.luns[&0].clone());
    registry.set_srp_port(with(&two, &[ini_a, ini_b]));
    assert!(svc.sync().is_empty());
    let changed = svc.update_sessions();
    assert_eq!(changed.len(), 2, "{changed:?}");
    assert!(changed
        .iter()
        .all(|(id, ended)| id.starts_with("srp-") && !ended));
    let tur = [0u8; 6];
    let rsp = a
        .command(0, &tur, None, 0, DescMode::Direct)
        .await
        .unwrap()
        .rsp;
    assert_eq!(rsp.status, 2);
    assert_eq!(
        (rsp.sense[2] & 0x0f, rsp.sense[12], rsp.sense[13]),
        (6, 0x3f, 0x0e)
    );
    let (n, _) = a.read_capacity(1).await.unwrap();
    assert_eq!(n, BLOCKS);
    assert!(svc.update_sessions().is_empty(), "nothing changed");

    // B's ACL goes: B gets SRP_T_LOGOUT, A keeps working.
    registry.set_srp_port(with(&two, &[ini_a]));
    svc.sync();
    let ended: Vec<_> = svc.update_sessions().into_iter().filter(|e| e.1).collect();
    assert_eq!(ended.len(), 1);
    b.closed().await;
    assert_eq!(b.stats.t_logouts.load(Ordering::Relaxed), 1);
    assert!(!a.is_closed());
    a.read_capacity(0).await.unwrap();

    // A logged out by its session id.
    let ports = svc.ports();
    let sessions = ports[0].sessions();
    let id = sessions
        .iter()
        .find(|s| s.nexus.initiator_port == rtgt_scsi::core::srp_port_name(&ini_a))
        .unwrap()
        .id();
    assert!(svc.logout_session(&id));
    a.closed().await;
    assert_eq!(a.stats.t_logouts.load(Ordering::Relaxed), 1);
    assert!(!svc.logout_session("srp-0"));

    // The port goes: its listener stops and a login is refused by the CM.
    registry.remove_srp_port(&base.name);
    assert_eq!(svc.sync(), vec![PortChange::Removed(base.name.clone())]);
    svc.stopped().await;
    assert!(svc.listening().is_empty());
    assert!(Initiator::connect(hi.cm(), dst, &opts(ini_a))
        .await
        .is_err());
}

/// The SRP service on the soft engine's `hca`.
fn srp_service(
    hca: &Arc<rtgt_transport::hca::Hca>,
    registry: &Arc<rtgt_scsi::core::Registry>,
) -> rtgt_srp::service::SrpService {
    let pool = BufPool::new(64 << 20);
    let rdma = Provider::soft(hca.clone(), &pool).unwrap();
    rtgt_srp::service::SrpService::start(&rdma, registry, pool)
}
