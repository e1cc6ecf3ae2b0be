//! The NVMe/RDMA target against the in-repo host over two soft-RoCE devices on an in-memory
//! link, through the connection manager: Connect with its data read by RDMA READ (admin
//! queue) and in the capsule (I/O queues), Identify and reads by RDMA WRITE, writes in the
//! capsule and by RDMA READ, SEND with Invalidate, concurrent commands, refused connection
//! requests (CM REJ statuses), refused hosts, bad SGLs answered with their status, a capsule
//! shorter than a command ending the queue, and no queue pair left behind.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use rtgt_backstore::{BufPool, RamBackstore};
use rtgt_nvme::admin::trtype;
use rtgt_nvme::fabrics::status as fstatus;
use rtgt_nvme::nvm;
use rtgt_nvme::queue::Scope;
use rtgt_nvme::rdma::cm_status;
use rtgt_nvme::sqe::{sc, sct, Sgl};
use rtgt_nvme::subsys::{Limits, Namespace, Port, Subsystem, Targets};
use rtgt_rdma_channel::cm::Provider;
use rtgt_tools::nvme::{HostConfig, NvmeError, Queue};
use rtgt_transport::cm::CmLimits;
use rtgt_transport::hca::Hca;
use rtgt_transport::netdev::loopback;
use rtgt_transport::verbs::{Device, DeviceConfig};

const SUB: &str = "nqn.2025-01.io.rtgt:rdma-loop";
const BS: u32 = 512;
const PORT: u16 = 4420;

fn ip(last: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(10, 44, 0, last))
}

struct Rig {
    targets: Arc<Targets>,
    /// The queues' tasks, as a listener keeps them.
    tasks: Arc<std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>>,
    rdma: Provider,
    _target: Arc<Hca>,
    host: Hca,
    dst: SocketAddr,
}

async fn rig() -> Rig {
    rig_with(0).await
}

/// A target and a host whose link has `fault_ppm` of every fault each way (0: none).
async fn rig_with(fault_ppm: u32) -> Rig {
    use rtgt_transport::netdev::fault::{FaultConfig, FaultInjector};
    let faults = if fault_ppm > 0 {
        FaultConfig::uniform(f64::from(fault_ppm) / 10_000.0)
    } else {
        FaultConfig::default()
    };
    let pool = BufPool::new(32 << 20);
    let targets = Targets::new(pool.clone(), Limits::default());
    let host_nqn = HostConfig::default().host_nqn;
    let s = targets.add_subsystem(Subsystem::new(SUB, "rtgtrdma01", Some(vec![host_nqn])));
    s.add_namespace(Namespace {
        nsid: 1,
        backstore: Arc::new(RamBackstore::new(16 << 20, BS)),
        nguid: [0x61; 16],
        eui64: [0; 8],
        uuid: [0x23; 16],
        read_only: false,
        access: None,
    });
    let dst = SocketAddr::new(ip(1), PORT);
    targets.add_port(Port {
        id: 1,
        trtype: trtype::RDMA,
        adrfam: trtype::ADRFAM_IPV4,
        traddr: ip(1).to_string(),
        trsvcid: PORT.to_string(),
        in_capsule: 8192,
    });
    let (la, lb) = loopback::pair(1 << 16);
    let dt = Device::new(DeviceConfig::new("nvt", vec![ip(1)])).unwrap();
    let di = Device::new(DeviceConfig::new("nvi", vec![ip(2)])).unwrap();
    let target = Arc::new(
        Hca::with_netdev(dt, FaultInjector::new(la, faults, 7), CmLimits::default()).unwrap(),
    );
    let host =
        Hca::with_netdev(di, FaultInjector::new(lb, faults, 13), CmLimits::default()).unwrap();
    let rdma = Provider::soft(target.clone(), &pool).unwrap();
    let mut listener = rdma.listen(dst).unwrap();
    let served = targets.clone();
    let tasks = Arc::new(std::sync::Mutex::new(Vec::new()));
    let kept = tasks.clone();
    rdma.spawn(async move {
        while let Some(req) = listener.accept().await {
            let rt = req.runtime();
            let t = rt.spawn(rtgt_nvme::rdma_queue::serve(
                served.clone(),
                req,
                Scope::Port(1),
            ));
            kept.lock().unwrap().push(t);
        }
    });
    Rig {
        targets,
        tasks,
        rdma,
        _target: target,
        host,
        dst,
    }
}

impl Rig {
    async fn queue(&self, cfg: &HostConfig, qid: u16, cntlid: u16, size: u16) -> Queue {
        Queue::connect_rdma(self.host.cm(), self.dst, cfg, SUB, qid, cntlid, size)
            .await
            .unwrap()
    }

    /// Waits until the target holds no queue pair.
    async fn settled(&self) {
        for _ in 0..1000 {
            if self.rdma.live_qps() == 0 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        panic!("the target kept {} queue pairs", self.rdma.live_qps());
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(37).wrapping_add(seed))
        .collect()
}

fn status_is(e: &NvmeError, sct_: u8, sc_: u8) -> bool {
    matches!(e, NvmeError::Status(s) if (s.sct, s.sc) == (sct_, sc_))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nvme_rdma_admin_and_io_queues_move_data() {
    let r = rig().await;
    for invalidate in [true, false] {
        let cfg = HostConfig {
            invalidate,
            ..HostConfig::default()
        };
        // The admin queue's Connect data goes by keyed SGL: the target reads it.
        let admin = r.queue(&cfg, 0, 0, 32).await;
        assert_eq!(admin.enable(2).await.unwrap(), 2);
        let id = admin.identify_controller().await.unwrap();
        assert_eq!((id.subnqn.as_str(), id.cntlid), (SUB, admin.cntlid));
        // Keyed SGLs and offsets for in-capsule data; the port's 8 KiB of it.
        assert_eq!(id.sgls & 0x0010_0004, 0x0010_0004);
        assert_eq!(id.ioccsz, (64 + 8192) / 16);
        let ns = admin.identify_namespace(1).await.unwrap();
        assert_eq!((ns.nsze, ns.lbads), (32768, 9));
        assert_eq!(r.targets.controllers().len(), 1);

        let io = Arc::new(r.queue(&cfg, 1, admin.cntlid, 128).await);
        let io2 = Arc::new(r.queue(&cfg, 2, admin.cntlid, 128).await);
        // In the capsule (4 KiB, 8 KiB), by RDMA READ (64 KiB, 1 MiB); read back by RDMA WRITE.
        for (lba, len) in [(0u64, 4096usize), (40, 8192), (100, 65536), (1000, 1 << 20)] {
            let data = pattern(len, lba as u8);
            io.write(1, lba, data.clone(), BS, lba == 100)
                .await
                .unwrap();
            assert_eq!(
                io2.read(1, lba, (len / 512) as u32, BS).await.unwrap(),
                data,
                "{len} bytes at {lba}"
            );
        }
        // 96 commands at once over two queues of 128 entries.
        let mut tasks = Vec::new();
        for i in 0..96u64 {
            let io = if i % 2 == 0 { io.clone() } else { io2.clone() };
            tasks.push(tokio::spawn(async move {
                let data = pattern(16384, i as u8);
                io.write(1, 4096 + i * 32, data.clone(), BS, false)
                    .await
                    .unwrap();
                assert_eq!(io.read(1, 4096 + i * 32, 32, BS).await.unwrap(), data);
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        let e = io.read(1, 32768, 1, BS).await.unwrap_err();
        assert!(status_is(&e, sct::GENERIC, sc::LBA_OUT_OF_RANGE), "{e:?}");
        drop((io, io2, admin));
        r.settled().await;
        for _ in 0..200 {
            if r.targets.controllers().is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(
            r.targets.controllers().is_empty(),
            "the admin queue's end closes the controller"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nvme_rdma_io_queues_take_their_controllers_capsule_size() {
    let r = rig().await;
    let port = |in_capsule| Port {
        id: 1,
        trtype: trtype::RDMA,
        adrfam: trtype::ADRFAM_IPV4,
        traddr: ip(1).to_string(),
        trsvcid: PORT.to_string(),
        in_capsule,
    };
    let cfg = HostConfig::default();
    // A controller made while its port took 16 KiB of in-capsule data...
    r.targets.set_ports(vec![port(16384)]);
    let admin = r.queue(&cfg, 0, 0, 32).await;
    assert_eq!(admin.enable(2).await.unwrap(), 2);
    let id = admin.identify_controller().await.unwrap();
    assert_eq!(id.ioccsz, (64 + 16384) / 16);
    // ... keeps that after the port's shrinks to 4 KiB: its I/O queue's connection request
    // names it, so 8 KiB (all this host puts in a capsule) still goes in one.
    r.targets.set_ports(vec![port(4096)]);
    let mut io = r.queue(&cfg, 1, admin.cntlid, 32).await;
    io.use_ioccsz(id.ioccsz);
    let data = pattern(8192, 3);
    io.write(1, 0, data.clone(), BS, false).await.unwrap();
    assert_eq!(io.read(1, 0, 16, BS).await.unwrap(), data);
    // A request that names no controller gets the port's 4 KiB receive slots: its Connect
    // to the controller of 16 KiB is refused, rather than the queue failing on the first
    // capsule larger than the slots.
    let anonymous = HostConfig {
        cm_cntlid: Some(0xffff),
        ..HostConfig::default()
    };
    let e = Queue::connect_rdma(r.host.cm(), r.dst, &anonymous, SUB, 2, admin.cntlid, 32)
        .await
        .err()
        .expect("refused");
    assert!(
        status_is(
            &e,
            sct::COMMAND_SPECIFIC,
            fstatus::CONNECT_INVALID_PARAMETERS
        ),
        "{e:?}"
    );
    // A new controller takes the port's size now.
    let other = r.queue(&cfg, 0, 0, 32).await;
    assert_eq!(other.enable(1).await.unwrap(), 1);
    let id = other.identify_controller().await.unwrap();
    assert_eq!(id.ioccsz, (64 + 4096) / 16);
    let mut io2 = r.queue(&cfg, 1, other.cntlid, 32).await;
    io2.use_ioccsz(id.ioccsz);
    io2.write(1, 16, data.clone(), BS, false).await.unwrap();
    assert_eq!(io2.read(1, 16, 16, BS).await.unwrap(), data);
    assert_eq!(
        io.read(1, 0, 16, BS).await.unwrap(),
        data,
        "the first still serves"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nvme_rdma_refuses_bad_requests_hosts_and_sgls() {
    let r = rig().await;
    let cfg = HostConfig::default();
    let cm = r.host.cm();
    // Connection requests the target cannot take: REJ with the specification's status.
    let rejected = |res: Result<Queue, NvmeError>| match res {
        Err(NvmeError::Rejected(s)) => s,
        Err(e) => panic!("not a REJ: {e:?}"),
        Ok(_) => panic!("connected"),
    };
    let too_many = Limits::default().io_queues + 1;
    let res = Queue::connect_rdma(cm, r.dst, &cfg, SUB, too_many, 1, 32).await;
    assert_eq!(rejected(res), cm_status::INVALID_QID);
    let res = Queue::connect_rdma(cm, r.dst, &cfg, SUB, 0, 0, 1).await;
    assert_eq!(rejected(res), cm_status::INVALID_HSQSIZE);
    let res = Queue::connect_rdma(cm, r.dst, &cfg, SUB, 1, 0, 1024).await;
    assert_eq!(rejected(res), cm_status::INVALID_HSQSIZE);

    // A host not on the list: Connect fails with Invalid Host.
    let stranger = HostConfig {
        host_nqn: "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-00000000bad1".into(),
        ..HostConfig::default()
    };
    let e = Queue::connect_rdma(cm, r.dst, &stranger, SUB, 0, 0, 32)
        .await
        .err()
        .expect("refused");
    assert!(
        status_is(&e, sct::COMMAND_SPECIFIC, fstatus::CONNECT_INVALID_HOST),
        "{e:?}"
    );
    // An I/O queue of a controller that does not exist.
    let e = Queue::connect_rdma(cm, r.dst, &cfg, SUB, 1, 77, 32)
        .await
        .err()
        .expect("refused");
    assert!(
        status_is(
            &e,
            sct::COMMAND_SPECIFIC,
            fstatus::CONNECT_INVALID_PARAMETERS
        ),
        "{e:?}"
    );

    let admin = r.queue(&cfg, 0, 0, 32).await;
    admin.enable(1).await.unwrap();
    let io = r.queue(&cfg, 1, admin.cntlid, 32).await;
    let write = |sgl: Sgl| {
        let mut sqe = Queue::command(nvm::opcode::WRITE, 1, [0, 0, 7, 0, 0, 0]);
        sqe.dptr = sgl.to_bytes();
        sqe
    };
    // NVMe/TCP's transport data block is no SGL for RDMA.
    let c = io
        .submit_as_is(write(Sgl::Transport { len: 4096 }), &[])
        .await
        .unwrap();
    assert_eq!(
        (c.status.sct, c.status.sc),
        (sct::GENERIC, sc::SGL_INVALID_TYPE)
    );
    // In-capsule data the capsule does not hold.
    let in_capsule = |addr, len| Sgl::DataBlock {
        addr,
        len,
        offset: true,
    };
    let c = io
        .submit_as_is(write(in_capsule(0, 4096)), &[0u8; 1024])
        .await
        .unwrap();
    assert_eq!(
        (c.status.sct, c.status.sc),
        (sct::GENERIC, sc::SGL_INVALID_DATA_LENGTH)
    );
    let c = io
        .submit_as_is(write(in_capsule(1 << 20, 4096)), &[])
        .await
        .unwrap();
    assert_eq!(
        (c.status.sct, c.status.sc),
        (sct::GENERIC, sc::SGL_INVALID_OFFSET)
    );
    // A keyed SGL longer than MDTS.
    let c = io
        .submit_as_is(
            write(Sgl::Keyed {
                addr: 0x1000,
                len: 2 << 20,
                key: 1,
                invalidate: false,
            }),
            &[],
        )
        .await
        .unwrap();
    assert_eq!(
        (c.status.sct, c.status.sc),
        (sct::GENERIC, sc::INVALID_FIELD)
    );
    // The queue still works, with the right write.
    let data = pattern(4096, 9);
    io.write(1, 0, data.clone(), BS, false).await.unwrap();
    assert_eq!(io.read(1, 0, 8, BS).await.unwrap(), data);

    // A capsule shorter than a command ends the queue.
    io.send_raw(&[0u8; 20]).await.unwrap();
    let mut ended = false;
    for _ in 0..200 {
        if io.read(1, 0, 8, BS).await.is_err() {
            ended = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(ended, "the queue went on after a short capsule");
    // A second Connect on a connected queue is a command sequence error.
    let again = rtgt_nvme::fabrics::FabricsCmd::Connect {
        recfmt: 0,
        qid: 0,
        sqsize: 31,
        cattr: 0,
        kato: 0,
    }
    .to_sqe(0, [0; 16]);
    let mut again = again;
    again.dptr = in_capsule(0, 1024).to_bytes();
    let c = admin.submit_as_is(again, &[0u8; 1024]).await.unwrap();
    assert_eq!(
        (c.status.sct, c.status.sc),
        (sct::GENERIC, sc::COMMAND_SEQUENCE_ERROR)
    );
    drop((io, admin));
    r.settled().await;
}

/// Every datagram both ways has a 1% chance each of being dropped, duplicated, corrupted,
/// reordered or delayed: writes by RDMA READ and reads by RDMA WRITE on two queues still move
/// every byte, through the queue pairs' retransmissions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nvme_rdma_data_survives_a_lossy_link() {
    let r = rig_with(10_000).await;
    let cfg = HostConfig::default();
    let admin = r.queue(&cfg, 0, 0, 32).await;
    admin.enable(2).await.unwrap();
    let queues = [
        Arc::new(r.queue(&cfg, 1, admin.cntlid, 128).await),
        Arc::new(r.queue(&cfg, 2, admin.cntlid, 128).await),
    ];
    let mut tasks = Vec::new();
    for i in 0..16u64 {
        let io = queues[i as usize % 2].clone();
        tasks.push(tokio::spawn(async move {
            for k in 0..8u64 {
                let lba = i * 1024 + k * 128;
                let data = pattern(65536, (i * 8 + k) as u8);
                io.write(1, lba, data.clone(), BS, false).await.unwrap();
                assert_eq!(io.read(1, lba, 128, BS).await.unwrap(), data);
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
}

/// A queue whose task is stopped (as a listener stopping drops its queues) closes its queue
/// pair and disconnects: the host sees its queue end and the target keeps no queue pair.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nvme_rdma_queues_end_with_their_tasks() {
    let r = rig().await;
    let cfg = HostConfig::default();
    let admin = r.queue(&cfg, 0, 0, 32).await;
    admin.enable(1).await.unwrap();
    let io = r.queue(&cfg, 1, admin.cntlid, 32).await;
    let data = pattern(65536, 3);
    io.write(1, 0, data.clone(), BS, false).await.unwrap();
    assert_eq!(io.read(1, 0, 128, BS).await.unwrap(), data);
    let tasks: Vec<_> = r.tasks.lock().unwrap().drain(..).collect();
    for t in tasks {
        t.abort();
    }
    r.settled().await;
    let mut ended = false;
    for _ in 0..200 {
        if io.read(1, 0, 8, BS).await.is_err() {
            ended = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(
        ended,
        "the host's queue went on after the target stopped it"
    );
    assert!(r.targets.controllers().is_empty());
}
