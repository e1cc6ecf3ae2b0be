//! The target's controllers driven as a transport drives them: Connect, properties, admin
//! commands and NVM I/O against a RAM namespace.

use std::sync::Arc;
use std::time::Duration;

use rtgt_backstore::{BufPool, IoBuf, RamBackstore};

use crate::admin::{self, cns, feature, log, IdController, IdNamespace};
use crate::ctrl::{property, Controller, Reply};
use crate::fabrics::{status as fstatus, ConnectData, FabricsCmd};
use crate::nvm::{self, DsmRange, Rw};
use crate::sqe::{sc, sct, Sgl, Sqe, Status, PSDT_SGL};
use crate::subsys::{Limits, Namespace, Port, Subsystem, Targets, CNTLID_DYNAMIC, DISCOVERY_NQN};

const SUB: &str = "nqn.2025-01.io.rtgt:test";
const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-00000000000a";
const OTHER: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-00000000000b";

fn targets() -> Arc<Targets> {
    let t = Targets::new(BufPool::new(8 << 20), Limits::default());
    let s = t.add_subsystem(Subsystem::new(SUB, "rtgt0001", Some(vec![HOST.into()])));
    s.add_namespace(Namespace {
        nsid: 1,
        backstore: Arc::new(RamBackstore::new(1 << 20, 512)),
        nguid: [0x60; 16],
        eui64: [0; 8],
        uuid: [0x11; 16],
        read_only: false,
        access: None,
    });
    t.add_port(Port {
        id: 1,
        trtype: admin::trtype::TCP,
        adrfam: admin::trtype::ADRFAM_IPV4,
        traddr: "127.0.0.1".into(),
        trsvcid: "4420".into(),
        in_capsule: 16384,
    });
    t
}

fn data(host: &str, sub: &str, cntlid: u16) -> ConnectData {
    ConnectData {
        host_id: [7; 16],
        cntlid,
        subsys_nqn: sub.into(),
        host_nqn: host.into(),
    }
}

fn sqe(opcode: u8, nsid: u32, len: u32, cdw: [u32; 6]) -> Sqe {
    Sqe {
        opcode,
        flags: PSDT_SGL,
        cid: 1,
        nsid,
        cdw2: 0,
        cdw3: 0,
        mptr: 0,
        dptr: Sgl::Transport { len }.to_bytes(),
        cdw,
    }
}

async fn run(c: &Controller, qid: u16, s: &Sqe, data: Option<&[u8]>) -> Reply {
    c.execute(qid, s, data.map(IoBuf::from_slice)).await
}

fn good(r: &Reply) {
    assert!(r.status.is_success(), "{r:?}");
}

fn status(r: &Reply) -> (u8, u8) {
    (r.status.sct, r.status.sc)
}

fn out(r: &Reply) -> Vec<u8> {
    good(r);
    match (&r.data, &r.buf) {
        (Some(d), _) => d.clone(),
        (_, Some(b)) => b.as_slice().to_vec(),
        _ => Vec::new(),
    }
}

async fn enable(c: &Controller) {
    let set = FabricsCmd::PropertySet {
        eight: false,
        offset: property::CC,
        value: 0x0046_0001,
    };
    good(&run(c, 0, &set.to_sqe(1, [0; 16]), None).await);
}

fn rw(op: u8, slba: u64, blocks: u32) -> Sqe {
    let [a, b, c] = Rw {
        slba,
        blocks,
        fua: false,
        lr: false,
        deac: false,
    }
    .cdw();
    sqe(op, 1, blocks * 512, [a, b, c, 0, 0, 0])
}

#[tokio::test]
async fn connect_admits_only_what_the_subsystem_allows() {
    let t = targets();
    let invalid = |r: Result<Arc<Controller>, crate::subsys::ConnectRefused>| {
        let e = r.expect_err("refused");
        assert_eq!(
            (e.status.sct, e.status.sc),
            (sct::COMMAND_SPECIFIC, fstatus::CONNECT_INVALID_PARAMETERS)
        );
        e.dw0
    };
    let e = t
        .connect(0, 31, 0, &data(OTHER, SUB, CNTLID_DYNAMIC), Some(1))
        .expect_err("not on the list");
    assert_eq!(e.status.sc, fstatus::CONNECT_INVALID_HOST);
    assert_eq!(
        invalid(t.connect(0, 31, 0, &data(HOST, "nqn.x:none", CNTLID_DYNAMIC), Some(1))),
        256
    );
    assert_eq!(
        invalid(t.connect(0, 0, 0, &data(HOST, SUB, CNTLID_DYNAMIC), Some(1))),
        44 | 1 << 16
    );
    assert_eq!(
        invalid(t.connect(0, 31, 0, &data(HOST, SUB, 3), Some(1))),
        16
    );
    let a = t
        .connect(0, 31, 0, &data(HOST, SUB, CNTLID_DYNAMIC), Some(1))
        .unwrap();
    let b = t
        .connect(0, 31, 0, &data(HOST, SUB, CNTLID_DYNAMIC), Some(1))
        .unwrap();
    assert_eq!((a.cntlid, b.cntlid), (1, 2));
    // I/O queues: only those Set Features allocated, only for the same host.
    assert_eq!(
        invalid(t.connect(1, 127, 0, &data(HOST, SUB, a.cntlid), Some(1))),
        42 | 1 << 16
    );
    enable(&a).await;
    let nq = sqe(
        admin::opcode::SET_FEATURES,
        0,
        0,
        [7, 3 | 3 << 16, 0, 0, 0, 0],
    );
    let r = run(&a, 0, &nq, None).await;
    assert_eq!(r.dw0, 3 | 3 << 16);
    let io = t
        .connect(4, 127, 0, &data(HOST, SUB, a.cntlid), Some(1))
        .unwrap();
    assert!(Arc::ptr_eq(&io, &a));
    assert_eq!(
        invalid(t.connect(5, 127, 0, &data(HOST, SUB, a.cntlid), Some(1))),
        42 | 1 << 16
    );
    assert_eq!(
        invalid(t.connect(1, 127, 0, &data(HOST, SUB, 9), Some(1))),
        16
    );
    // A closed controller takes no more queues; its ID is free again once it is gone.
    a.close();
    assert_eq!(
        invalid(t.connect(1, 127, 0, &data(HOST, SUB, 1), Some(1))),
        16
    );
    drop((a, io));
    let c = t
        .connect(0, 31, 0, &data(HOST, SUB, CNTLID_DYNAMIC), Some(1))
        .unwrap();
    assert_eq!(c.cntlid, 1);
    assert_eq!(t.controllers().len(), 2);
}

#[tokio::test]
async fn properties_identify_and_features() {
    let t = targets();
    let c = t
        .connect(0, 31, 0, &data(HOST, SUB, CNTLID_DYNAMIC), Some(1))
        .unwrap();
    let get = |offset, eight| FabricsCmd::PropertyGet { eight, offset }.to_sqe(2, [0; 16]);
    // Nothing but fabrics commands before CC.EN.
    let id = sqe(
        admin::opcode::IDENTIFY,
        0,
        4096,
        [cns::CONTROLLER as u32, 0, 0, 0, 0, 0],
    );
    assert_eq!(
        status(&run(&c, 0, &id, None).await),
        (sct::GENERIC, sc::COMMAND_SEQUENCE_ERROR)
    );
    let cap = run(&c, 0, &get(property::CAP, true), None).await;
    assert_eq!(
        (cap.dw0 & 0xffff, cap.dw0 >> 24, cap.dw1 >> 5 & 1),
        (127, 15, 1)
    );
    assert_eq!(
        run(&c, 0, &get(property::VS, false), None).await.dw0,
        0x0001_0400
    );
    assert_eq!(run(&c, 0, &get(property::CSTS, false), None).await.dw0, 0);
    assert_eq!(
        status(&run(&c, 0, &get(0x40, false), None).await),
        (sct::GENERIC, sc::INVALID_FIELD)
    );
    enable(&c).await;
    assert_eq!(run(&c, 0, &get(property::CSTS, false), None).await.dw0, 1);

    let ctrl = IdController::parse(&out(&run(&c, 0, &id, None).await)).unwrap();
    assert_eq!(
        (
            ctrl.cntlid,
            ctrl.subnqn.as_str(),
            ctrl.serial.as_str(),
            ctrl.cntrltype
        ),
        (c.cntlid, SUB, "rtgt0001", 1)
    );
    assert_eq!(
        (ctrl.mdts, ctrl.ioccsz, ctrl.nn, ctrl.oncs),
        (8, (64 + 16384) / 16, 1024, 0x0d)
    );
    let ns = sqe(admin::opcode::IDENTIFY, 1, 4096, [0; 6]);
    let n = IdNamespace::parse(&out(&run(&c, 0, &ns, None).await)).unwrap();
    assert_eq!(
        (n.nsze, n.lbads, n.nguid, n.dlfeat),
        (2048, 9, [0x60; 16], 0x09)
    );
    let inactive = sqe(admin::opcode::IDENTIFY, 7, 4096, [0; 6]);
    assert_eq!(out(&run(&c, 0, &inactive, None).await), vec![0; 4096]);
    let list = sqe(admin::opcode::IDENTIFY, 0, 4096, [2, 0, 0, 0, 0, 0]);
    assert_eq!(
        &out(&run(&c, 0, &list, None).await)[..8],
        &[1, 0, 0, 0, 0, 0, 0, 0]
    );
    let desc = sqe(admin::opcode::IDENTIFY, 1, 4096, [3, 0, 0, 0, 0, 0]);
    let ids = admin::parse_ns_descriptors(&out(&run(&c, 0, &desc, None).await));
    assert_eq!(ids[0], (admin::nidt::NGUID, vec![0x60; 16]));
    assert_eq!(ids[1], (admin::nidt::UUID, vec![0x11; 16]));
    assert_eq!(ids[2], (admin::nidt::CSI, vec![0]));
    let bad = sqe(admin::opcode::IDENTIFY, 0, 4096, [0x1f, 0, 0, 0, 0, 0]);
    assert_eq!(
        status(&run(&c, 0, &bad, None).await),
        (sct::GENERIC, sc::INVALID_FIELD)
    );

    // Features.
    let set = |fid: u8, v: u32| {
        sqe(
            admin::opcode::SET_FEATURES,
            0,
            0,
            [u32::from(fid), v, 0, 0, 0, 0],
        )
    };
    let getf = |fid: u8| {
        sqe(
            admin::opcode::GET_FEATURES,
            0,
            0,
            [u32::from(fid), 0, 0, 0, 0, 0],
        )
    };
    let r = run(&c, 0, &set(feature::NUMBER_OF_QUEUES, 63 | 63 << 16), None).await;
    assert_eq!(r.dw0, 15 | 15 << 16, "limited to 16");
    good(&run(&c, 0, &set(feature::KEEP_ALIVE_TIMER, 120_000), None).await);
    assert_eq!(
        run(&c, 0, &getf(feature::KEEP_ALIVE_TIMER), None).await.dw0,
        120_000
    );
    let save = sqe(
        admin::opcode::SET_FEATURES,
        0,
        0,
        [7 | 1 << 31, 0, 0, 0, 0, 0],
    );
    assert_eq!(
        status(&run(&c, 0, &save, None).await),
        (sct::COMMAND_SPECIFIC, sc::FEATURE_NOT_SAVEABLE)
    );
    assert_eq!(
        run(&c, 0, &getf(feature::HOST_ID), None).await.data,
        Some(vec![7; 16])
    );
    good(&run(&c, 0, &sqe(admin::opcode::KEEP_ALIVE, 0, 0, [0; 6]), None).await);
    // Log pages: SMART, an unknown one, an offset past the end.
    let (c10, c11) = admin::GetLogPage::cdw(log::SMART, 512);
    let smart = sqe(
        admin::opcode::GET_LOG_PAGE,
        u32::MAX,
        512,
        [c10, c11, 0, 0, 0, 0],
    );
    assert_eq!(out(&run(&c, 0, &smart, None).await)[3], 100);
    let (c10, c11) = admin::GetLogPage::cdw(0x42, 512);
    let unknown = sqe(admin::opcode::GET_LOG_PAGE, 0, 512, [c10, c11, 0, 0, 0, 0]);
    assert_eq!(
        status(&run(&c, 0, &unknown, None).await),
        (sct::COMMAND_SPECIFIC, sc::INVALID_LOG_PAGE)
    );
    let (c10, c11) = admin::GetLogPage::cdw(log::SMART, 4);
    let past = sqe(admin::opcode::GET_LOG_PAGE, 0, 4, [c10, c11, 1024, 0, 0, 0]);
    assert_eq!(
        status(&run(&c, 0, &past, None).await),
        (sct::GENERIC, sc::INVALID_FIELD)
    );
}

#[tokio::test]
async fn nvm_io_against_the_namespace() {
    let t = targets();
    let c = t
        .connect(0, 31, 0, &data(HOST, SUB, CNTLID_DYNAMIC), Some(1))
        .unwrap();
    enable(&c).await;
    let block: Vec<u8> = (0..4096u32).map(|i| (i % 251) as u8).collect();
    good(&run(&c, 1, &rw(nvm::opcode::WRITE, 10, 8), Some(&block)).await);
    assert_eq!(
        out(&run(&c, 1, &rw(nvm::opcode::READ, 10, 8), None).await),
        block
    );
    good(&run(&c, 1, &rw(nvm::opcode::COMPARE, 10, 8), Some(&block)).await);
    let mut other = block.clone();
    other[4095] ^= 1;
    assert_eq!(
        status(&run(&c, 1, &rw(nvm::opcode::COMPARE, 10, 8), Some(&other)).await),
        (sct::MEDIA, sc::COMPARE_FAILURE)
    );
    // Out of range, a wrong SGL length, data missing, an unknown namespace or opcode.
    assert_eq!(
        status(&run(&c, 1, &rw(nvm::opcode::READ, 2047, 2), None).await),
        (sct::GENERIC, sc::LBA_OUT_OF_RANGE)
    );
    assert_eq!(
        status(&run(&c, 1, &rw(nvm::opcode::READ, u64::MAX, 1), None).await),
        (sct::GENERIC, sc::LBA_OUT_OF_RANGE)
    );
    let mut short = rw(nvm::opcode::READ, 0, 8);
    short.dptr = Sgl::Transport { len: 512 }.to_bytes();
    assert_eq!(
        status(&run(&c, 1, &short, None).await),
        (sct::GENERIC, sc::SGL_INVALID_DATA_LENGTH)
    );
    assert_eq!(
        status(&run(&c, 1, &rw(nvm::opcode::WRITE, 0, 8), Some(&block[..512])).await),
        (sct::GENERIC, sc::DATA_TRANSFER_ERROR)
    );
    let mut ns9 = rw(nvm::opcode::READ, 0, 1);
    ns9.nsid = 9;
    assert_eq!(
        status(&run(&c, 1, &ns9, None).await),
        (sct::GENERIC, sc::INVALID_NAMESPACE)
    );
    assert_eq!(
        status(&run(&c, 1, &sqe(0x7e, 1, 0, [0; 6]), None).await),
        (sct::GENERIC, sc::INVALID_OPCODE)
    );
    let mut prp = rw(nvm::opcode::READ, 0, 1);
    prp.flags = 0;
    assert_eq!(
        status(&run(&c, 1, &prp, None).await),
        (sct::GENERIC, sc::INVALID_FIELD)
    );
    // Write Zeroes, Dataset Management (deallocate), Flush.
    let [a, b, z] = Rw {
        slba: 10,
        blocks: 4,
        fua: false,
        lr: false,
        deac: true,
    }
    .cdw();
    good(
        &run(
            &c,
            1,
            &sqe(nvm::opcode::WRITE_ZEROES, 1, 0, [a, b, z, 0, 0, 0]),
            None,
        )
        .await,
    );
    let back = out(&run(&c, 1, &rw(nvm::opcode::READ, 10, 8), None).await);
    assert!(back[..2048].iter().all(|&x| x == 0));
    assert_eq!(&back[2048..], &block[2048..]);
    let range = DsmRange {
        cattr: 0,
        blocks: 4,
        slba: 14,
    }
    .to_bytes();
    let dsm = sqe(
        nvm::opcode::DATASET_MANAGEMENT,
        1,
        16,
        [0, nvm::DSM_DEALLOCATE, 0, 0, 0, 0],
    );
    good(&run(&c, 1, &dsm, Some(&range)).await);
    let back = out(&run(&c, 1, &rw(nvm::opcode::READ, 10, 8), None).await);
    assert!(back.iter().all(|&x| x == 0));
    let far = DsmRange {
        cattr: 0,
        blocks: 1,
        slba: 1 << 40,
    }
    .to_bytes();
    assert_eq!(
        status(&run(&c, 1, &dsm, Some(&far)).await),
        (sct::GENERIC, sc::LBA_OUT_OF_RANGE)
    );
    good(&run(&c, 1, &sqe(nvm::opcode::FLUSH, 1, 0, [0; 6]), None).await);
    // Which way data goes, as a transport asks.
    assert_eq!(
        Controller::data_out_len(&rw(nvm::opcode::WRITE, 0, 8)),
        4096
    );
    assert_eq!(Controller::data_out_len(&rw(nvm::opcode::READ, 0, 8)), 0);
    let connect = FabricsCmd::Connect {
        recfmt: 0,
        qid: 0,
        sqsize: 31,
        cattr: 0,
        kato: 0,
    }
    .to_sqe(
        1,
        Sgl::DataBlock {
            addr: 0,
            len: 1024,
            offset: true,
        }
        .to_bytes(),
    );
    assert_eq!(Controller::data_out_len(&connect), 1024);
}

#[tokio::test]
async fn asynchronous_events_and_keep_alive() {
    let t = targets();
    let c = t
        .connect(0, 31, 0, &data(HOST, SUB, CNTLID_DYNAMIC), Some(1))
        .unwrap();
    enable(&c).await;
    let aec = sqe(
        admin::opcode::SET_FEATURES,
        0,
        0,
        [0x0b, 1 << 8, 0, 0, 0, 0],
    );
    good(&run(&c, 0, &aec, None).await);
    let aer = sqe(admin::opcode::ASYNC_EVENT_REQUEST, 0, 0, [0; 6]);
    let pending = {
        let (c, aer) = (c.clone(), aer.clone());
        tokio::spawn(async move { c.execute(0, &aer, None).await })
    };
    tokio::task::yield_now().await;
    assert!(!pending.is_finished());
    c.namespace_changed(1);
    let r = tokio::time::timeout(Duration::from_secs(10), pending)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(r.dw0, 2 | u32::from(log::CHANGED_NAMESPACES) << 16);
    let (c10, c11) = admin::GetLogPage::cdw(log::CHANGED_NAMESPACES, 4096);
    let changed = sqe(admin::opcode::GET_LOG_PAGE, 0, 4096, [c10, c11, 0, 0, 0, 0]);
    assert_eq!(
        &out(&run(&c, 0, &changed, None).await)[..8],
        &[1, 0, 0, 0, 0, 0, 0, 0]
    );
    assert_eq!(
        &out(&run(&c, 0, &changed, None).await)[..4],
        &[0, 0, 0, 0],
        "cleared"
    );
    // Four requests at most.
    let held: Vec<_> = (0..4)
        .map(|_| {
            let (c, aer) = (c.clone(), aer.clone());
            tokio::spawn(async move { c.execute(0, &aer, None).await })
        })
        .collect();
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    assert_eq!(
        status(&run(&c, 0, &aer, None).await),
        (sct::COMMAND_SPECIFIC, sc::ASYNC_EVENT_LIMIT_EXCEEDED)
    );
    // Keep alive: 100 ms (checked at a granularity of a second); nothing comes, the
    // controller closes and its outstanding requests end.
    let kato = sqe(admin::opcode::SET_FEATURES, 0, 0, [0x0f, 100, 0, 0, 0, 0]);
    good(&run(&c, 0, &kato, None).await);
    tokio::time::timeout(Duration::from_secs(30), c.closed())
        .await
        .expect("keep alive expires");
    for h in held {
        let r = h.await.unwrap();
        assert_eq!(status(&r), (sct::GENERIC, sc::ABORTED_SQ_DELETION));
    }
    let r = run(&c, 1, &rw(nvm::opcode::READ, 0, 1), None).await;
    assert_eq!((r.status.sct, r.status.dnr), (sct::PATH, false));
}

#[tokio::test]
async fn the_discovery_controller_lists_what_the_host_may_use() {
    let t = targets();
    t.add_subsystem(Subsystem::new("nqn.2025-01.io.rtgt:open", "rtgt0002", None));
    let page = |host: &str| {
        let t = t.clone();
        let host = host.to_string();
        async move {
            let c = t
                .connect(
                    0,
                    31,
                    0,
                    &data(&host, DISCOVERY_NQN, CNTLID_DYNAMIC),
                    Some(1),
                )
                .unwrap();
            enable(&c).await;
            let id = sqe(admin::opcode::IDENTIFY, 0, 4096, [1, 0, 0, 0, 0, 0]);
            assert_eq!(
                IdController::parse(&out(&run(&c, 0, &id, None).await))
                    .unwrap()
                    .cntrltype,
                2
            );
            let (c10, c11) = admin::GetLogPage::cdw(log::DISCOVERY, 4096);
            let g = sqe(admin::opcode::GET_LOG_PAGE, 0, 4096, [c10, c11, 0, 0, 0, 0]);
            let (_, entries) =
                admin::parse_discovery_log(&out(&run(&c, 0, &g, None).await)).unwrap();
            // No I/O through a discovery controller.
            assert_eq!(
                status(&run(&c, 1, &rw(nvm::opcode::READ, 0, 1), None).await),
                (sct::GENERIC, sc::INVALID_OPCODE)
            );
            entries
                .into_iter()
                .map(|e| (e.subnqn, e.trsvcid))
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(
        page(HOST).await,
        [
            ("nqn.2025-01.io.rtgt:open".to_string(), "4420".to_string()),
            (SUB.to_string(), "4420".to_string())
        ]
    );
    assert_eq!(
        page(OTHER).await,
        [("nqn.2025-01.io.rtgt:open".to_string(), "4420".to_string())]
    );
    // Statuses a transport may build for itself.
    assert!(!Status::error(sct::GENERIC, sc::INTERNAL_ERROR).is_success());
}

/// Access states per target port group, as a test sets them.
struct Groups(std::sync::Mutex<std::collections::BTreeMap<u16, u8>>);

impl crate::subsys::Access for Groups {
    fn state(&self, group: u16) -> u8 {
        self.0
            .lock()
            .unwrap()
            .get(&group)
            .copied()
            .unwrap_or(admin::ana::INACCESSIBLE)
    }
}

#[tokio::test]
async fn asymmetric_namespace_access_per_port_group() {
    use admin::ana;
    let t = targets();
    let s = t.subsystem(SUB).unwrap();
    let groups = Arc::new(Groups(std::sync::Mutex::new(
        [(1, ana::OPTIMIZED), (2, ana::INACCESSIBLE)].into(),
    )));
    s.add_namespace(Namespace {
        nsid: 2,
        backstore: Arc::new(RamBackstore::new(1 << 20, 512)),
        nguid: [0x61; 16],
        eui64: [0; 8],
        uuid: [0x12; 16],
        read_only: false,
        access: Some(groups.clone()),
    });
    // Port 1 in group 1, port 2 in group 2, port 3 in none (group 0).
    t.set_port_groups([(1, 1), (2, 2)].into(), 15);
    let connect = |port| {
        let c = t
            .connect(0, 31, 0, &data(HOST, SUB, CNTLID_DYNAMIC), Some(port))
            .unwrap();
        async move {
            enable(&c).await;
            let nq = sqe(admin::opcode::SET_FEATURES, 0, 0, [0x07, 0, 0, 0, 0, 0]);
            good(&run(&c, 0, &nq, None).await);
            c
        }
    };
    let (a, b, z) = (connect(1).await, connect(2).await, connect(3).await);

    let id = sqe(admin::opcode::IDENTIFY, 0, 4096, [1, 0, 0, 0, 0, 0]);
    let ic = IdController::parse(&out(&run(&a, 0, &id, None).await)).unwrap();
    assert_eq!(ic.cmic & 0x08, 0x08, "ANA reporting");
    assert_eq!(ic.oaes & 1 << 11, 1 << 11, "ANA change notices");
    assert_eq!((ic.anatt, ic.anacap), (15, ana::ANACAP));
    assert!(ic.anagrpmax >= 2 && ic.nanagrpid >= 2);
    assert!(
        ic.mnan >= 2 && ic.mnan <= ic.nn,
        "Linux wants 1..=NN with ANA"
    );
    let idns = sqe(admin::opcode::IDENTIFY, 2, 4096, [0, 0, 0, 0, 0, 0]);
    let ns = IdNamespace::parse(&out(&run(&a, 0, &idns, None).await)).unwrap();
    assert_eq!((ns.anagrpid, ns.nmic), (2, 1));

    let (c10, c11) = admin::GetLogPage::cdw(log::ANA, 4096);
    let log_of = |c: Arc<Controller>, lsp: u32| async move {
        let page = sqe(
            admin::opcode::GET_LOG_PAGE,
            0xffff_ffff,
            4096,
            [c10 | lsp << 8, c11, 0, 0, 0, 0],
        );
        admin::parse_ana_log(&out(&run(&c, 0, &page, None).await)).unwrap()
    };
    let states = |g: &[admin::AnaGroup]| -> Vec<(u32, u8, Vec<u32>)> {
        g.iter()
            .map(|g| (g.grpid, g.state, g.nsids.clone()))
            .collect()
    };
    // Namespace 1 has no access states: optimized everywhere.
    let (_, g) = log_of(a.clone(), 0).await;
    assert_eq!(
        states(&g),
        [(1, ana::OPTIMIZED, vec![1]), (2, ana::OPTIMIZED, vec![2])]
    );
    let (_, g) = log_of(b.clone(), 0).await;
    assert_eq!(
        states(&g),
        [
            (1, ana::OPTIMIZED, vec![1]),
            (2, ana::INACCESSIBLE, vec![2])
        ]
    );
    let (_, g) = log_of(z.clone(), ana::RGO.into()).await;
    assert_eq!(
        states(&g),
        [(1, ana::OPTIMIZED, vec![]), (2, ana::INACCESSIBLE, vec![])],
        "groups only"
    );

    // I/O: through port 1 it works; through port 2 a path error without DNR.
    let write = |nsid| {
        let mut w = rw(nvm::opcode::WRITE, 0, 1);
        w.nsid = nsid;
        w
    };
    good(&run(&a, 1, &write(2), Some(&[5; 512])).await);
    let r = run(&b, 1, &write(2), Some(&[5; 512])).await;
    assert_eq!(
        (r.status.sct, r.status.sc, r.status.dnr),
        (sct::PATH, sc::ANA_INACCESSIBLE, false)
    );
    good(&run(&b, 1, &write(1), Some(&[5; 512])).await);

    // A failover: the host that asked to hear of ANA changes gets one event, masked until
    // it reads the log; the change count grows.
    let aec = sqe(
        admin::opcode::SET_FEATURES,
        0,
        0,
        [0x0b, 1 << 11, 0, 0, 0, 0],
    );
    good(&run(&b, 0, &aec, None).await);
    let aer = sqe(admin::opcode::ASYNC_EVENT_REQUEST, 0, 0, [0; 6]);
    let pending = {
        let (b, aer) = (b.clone(), aer.clone());
        tokio::spawn(async move { b.execute(0, &aer, None).await })
    };
    let (before, _) = log_of(b.clone(), 0).await;
    *groups.0.lock().unwrap() = [(1, ana::INACCESSIBLE), (2, ana::OPTIMIZED)].into();
    t.ana_changed(|n| n.nsid == 2);
    let r = tokio::time::timeout(Duration::from_secs(10), pending)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        r.dw0,
        u32::from(admin::event::NOTICE)
            | u32::from(admin::event::ANA_CHANGE) << 8
            | u32::from(log::ANA) << 16
    );
    // Masked: a second change posts nothing until the log is read.
    t.ana_changed(|n| n.nsid == 2);
    let second = {
        let (b, aer) = (b.clone(), aer.clone());
        tokio::spawn(async move { b.execute(0, &aer, None).await })
    };
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    assert!(!second.is_finished(), "masked until the log is read");
    let (after, g) = log_of(b.clone(), 0).await;
    assert_eq!(after, before + 2);
    assert_eq!(states(&g)[1], (2, ana::OPTIMIZED, vec![2]));
    good(&run(&b, 1, &write(2), Some(&[6; 512])).await);
    let r = run(&a, 1, &write(2), Some(&[6; 512])).await;
    assert_eq!(status(&r), (sct::PATH, sc::ANA_INACCESSIBLE));
    // Read: unmasked; the next change is posted.
    t.ana_changed(|n| n.nsid == 2);
    tokio::time::timeout(Duration::from_secs(10), second)
        .await
        .expect("the next change is posted")
        .unwrap();
    // A port moved to another group is an ANA change for the controllers on it.
    let third = {
        let (b, aer) = (b.clone(), aer.clone());
        tokio::spawn(async move { b.execute(0, &aer, None).await })
    };
    let _ = log_of(b.clone(), 0).await;
    t.set_port_groups([(1, 1), (2, 1)].into(), 15);
    tokio::time::timeout(Duration::from_secs(10), third)
        .await
        .expect("the port's group changed")
        .unwrap();
    let (_, g) = log_of(b.clone(), 0).await;
    assert_eq!(states(&g)[1], (2, ana::INACCESSIBLE, vec![2]));
    // Namespace 1's controllers of a subsystem without access states hear nothing.
    let (za, _) = log_of(z.clone(), 0).await;
    t.ana_changed(|n| n.nsid == 7);
    assert_eq!(log_of(z.clone(), 0).await.0, za);
}
