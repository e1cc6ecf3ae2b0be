//! The NVMe/TCP target against the in-repo host over TCP loopback: Connect of admin and I/O
//! queues, Identify, reads and writes with data in the capsule and through R2T (with and
//! without digests), concurrent commands, refused hosts and controllers, a malformed PDU
//! answered with a termination request, bad in-capsule data failing only its command, keep
//! alive expiry closing every queue, and reads of a file namespace sent from its pages.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use rtgt_backstore::{Backstore, BufPool, FileBackstore, FileOptions, RamBackstore};
use rtgt_nvme::admin::trtype;
use rtgt_nvme::ctrl::FILE_RANGE_MIN;
use rtgt_nvme::fabrics::status as fstatus;
use rtgt_nvme::sqe::{sc, sct};
use rtgt_nvme::subsys::{Limits, Namespace, Port, Subsystem, Targets};
use rtgt_nvme::tcp::{fes, Digests};
use rtgt_nvme::tcp_queue::Scope;
use rtgt_tools::nvme::{HostConfig, NvmeError, Queue};

const SUB: &str = "nqn.2025-01.io.rtgt:loop";
const BS: u32 = 512;
/// The in-capsule data size of the test port.
const IN_CAPSULE: u32 = 16 << 10;

async fn target() -> (SocketAddr, Arc<Targets>) {
    target_on(Arc::new(RamBackstore::new(16 << 20, BS))).await
}

/// A target whose subsystem [`SUB`] has `backstore` as namespace 1.
async fn target_on(backstore: Arc<dyn Backstore>) -> (SocketAddr, Arc<Targets>) {
    let t = Targets::new(BufPool::new(64 << 20), Limits::default());
    let host = HostConfig::default().host_nqn;
    let s = t.add_subsystem(Subsystem::new(SUB, "rtgtloop01", Some(vec![host])));
    s.add_namespace(Namespace {
        nsid: 1,
        backstore,
        nguid: [0x60; 16],
        eui64: [0; 8],
        uuid: [0x22; 16],
        read_only: false,
        access: None,
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    t.add_port(Port {
        id: 1,
        trtype: trtype::TCP,
        adrfam: trtype::ADRFAM_IPV4,
        traddr: "127.0.0.1".into(),
        trsvcid: addr.port().to_string(),
        in_capsule: IN_CAPSULE,
    });
    let served = t.clone();
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            tokio::spawn(rtgt_nvme::tcp_queue::serve(
                served.clone(),
                s,
                Scope::Port(1),
            ));
        }
    });
    (addr, t)
}

/// An enabled controller's admin queue and one I/O queue of `entries`.
async fn queues(addr: SocketAddr, digests: Digests, entries: u16) -> (Queue, Queue) {
    let cfg = HostConfig {
        digests,
        ..HostConfig::default()
    };
    let admin = Queue::connect(addr, &cfg, SUB, 0, 0, 32).await.unwrap();
    admin.enable(1).await.unwrap();
    let io = Queue::connect(addr, &cfg, SUB, 1, admin.cntlid, entries)
        .await
        .unwrap();
    (admin, io)
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[tokio::test]
async fn nvme_tcp_admin_and_io_queues_move_data() {
    let (addr, _t) = target().await;
    for digests in [
        Digests::default(),
        Digests {
            header: true,
            data: true,
        },
    ] {
        // With digests, SQ flow control disabled too: reads end with C2HData's SUCCESS flag.
        let cfg = HostConfig {
            digests,
            disable_sqflow: digests.data,
            ..HostConfig::default()
        };
        let admin = Queue::connect(addr, &cfg, SUB, 0, 0, 32).await.unwrap();
        assert_eq!(admin.enable(4).await.unwrap(), 4);
        let id = admin.identify_controller().await.unwrap();
        assert_eq!((id.subnqn.as_str(), id.cntlid), (SUB, admin.cntlid));
        // The port's in-capsule data in a whole capsule, in 16-byte units.
        assert_eq!((id.ioccsz, id.mdts), ((64 + IN_CAPSULE) / 16, 8));
        let ns = admin.identify_namespace(1).await.unwrap();
        assert_eq!((ns.nsze, ns.lbads), (32768, 9));

        let mut io = Queue::connect(addr, &cfg, SUB, 1, admin.cntlid, 128)
            .await
            .unwrap();
        io.use_ioccsz(id.ioccsz);
        let io = Arc::new(io);
        // In the capsule (4 KiB, and 16 KiB: as much as the port takes), through one R2T
        // (64 KiB), through several H2CData PDUs (1 MiB, the largest transfer).
        let most = IN_CAPSULE as usize;
        for (lba, len) in [(0u64, 4096usize), (40, most), (100, 65536), (1000, 1 << 20)] {
            let data = pattern(len, lba as u8);
            io.write(1, lba, data.clone(), BS, lba == 100)
                .await
                .unwrap();
            assert_eq!(io.read(1, lba, (len / 512) as u32, BS).await.unwrap(), data);
        }
        // 64 commands at once on a queue of 128 entries.
        let mut tasks = Vec::new();
        for i in 0..64u64 {
            let io = io.clone();
            tasks.push(tokio::spawn(async move {
                let data = pattern(8192, i as u8);
                io.write(1, 4096 + i * 16, data.clone(), BS, false)
                    .await
                    .unwrap();
                assert_eq!(io.read(1, 4096 + i * 16, 16, BS).await.unwrap(), data);
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        // Errors come back as statuses.
        let e = io.read(1, 32768, 1, BS).await.unwrap_err();
        assert!(
            matches!(e, NvmeError::Status(s) if (s.sct, s.sc) == (sct::GENERIC, sc::LBA_OUT_OF_RANGE)),
            "{e:?}"
        );
        let e = io.read(2, 0, 1, BS).await.unwrap_err();
        assert!(
            matches!(e, NvmeError::Status(s) if s.sc == sc::INVALID_NAMESPACE),
            "{e:?}"
        );
    }
}

#[tokio::test]
async fn nvme_tcp_refuses_hosts_controllers_and_bad_pdus() {
    let (addr, _t) = target().await;
    let stranger = HostConfig {
        host_nqn: "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-000000000bad".into(),
        ..HostConfig::default()
    };
    let e = Queue::connect(addr, &stranger, SUB, 0, 0, 32)
        .await
        .err()
        .expect("refused");
    assert!(
        matches!(e, NvmeError::Status(s) if (s.sct, s.sc) == (sct::COMMAND_SPECIFIC, fstatus::CONNECT_INVALID_HOST)),
        "{e:?}"
    );
    let cfg = HostConfig::default();
    let e = Queue::connect(addr, &cfg, SUB, 1, 77, 32)
        .await
        .err()
        .expect("no controller 77");
    assert!(
        matches!(e, NvmeError::Status(s) if s.sc == fstatus::CONNECT_INVALID_PARAMETERS),
        "{e:?}"
    );
    // A capsule whose header length is wrong: the controller terminates the connection,
    // naming HLEN (byte 2).
    let admin = Queue::connect(addr, &cfg, SUB, 0, 0, 32).await.unwrap();
    admin.enable(1).await.unwrap();
    let mut bad = vec![0x04u8, 0, 24, 0, 72, 0, 0, 0];
    bad.resize(72, 0);
    admin.send_raw(&bad).await.unwrap();
    let e = admin.identify_controller().await.unwrap_err();
    assert!(
        matches!(e, NvmeError::Terminated { fes: f, fei: 2 } if f == fes::INVALID_PDU_HEADER),
        "{e:?}"
    );
}

#[tokio::test]
async fn nvme_tcp_keep_alive_expiry_closes_every_queue() {
    let (addr, t) = target().await;
    let cfg = HostConfig {
        kato: 100,
        ..HostConfig::default()
    };
    let admin = Queue::connect(addr, &cfg, SUB, 0, 0, 32).await.unwrap();
    admin.enable(1).await.unwrap();
    let io = Queue::connect(addr, &cfg, SUB, 1, admin.cntlid, 32)
        .await
        .unwrap();
    io.write(1, 0, pattern(512, 1), BS, false).await.unwrap();
    // No keep alive comes: the controller goes, and its queues with it.
    let gone = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            if io.read(1, 0, 1, BS).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    assert!(
        gone.is_ok(),
        "the I/O queue outlived the keep alive timeout"
    );
    assert!(t.controllers().iter().all(|c| c.is_closed()));
}

/// Data read straight into a command's buffer is still checked: a capsule whose in-capsule data
/// fails its digest, or whose SGL length is not the data's, fails that command only (its data is
/// never written, the connection goes on); H2CData for a transfer nobody asked for ends the
/// connection with a termination request naming the TTAG.
#[tokio::test]
async fn nvme_tcp_bad_in_capsule_data_fails_the_command_only() {
    use rtgt_nvme::nvm::{self, Rw};
    use rtgt_nvme::sqe::{Sgl, PSDT_SGL};
    use rtgt_nvme::tcp::Header;
    let (addr, _t) = target().await;
    let digests = Digests {
        header: true,
        data: true,
    };
    let (_admin, io) = queues(addr, digests, 32).await;
    let good = pattern(4096, 1);
    io.write(1, 0, good.clone(), BS, false).await.unwrap();

    let capsule = |data: &[u8], sgl_len: u32| {
        let [a, b, c] = Rw {
            slba: 0,
            blocks: 8,
            fua: false,
            lr: false,
            deac: false,
        }
        .cdw();
        let mut sqe = Queue::command(nvm::opcode::WRITE, 1, [a, b, c, 0, 0, 0]);
        sqe.cid = 0xfff0;
        sqe.flags |= PSDT_SGL;
        sqe.dptr = Sgl::DataBlock {
            addr: 0,
            len: sgl_len,
            offset: true,
        }
        .to_bytes();
        Header::Cmd(sqe).to_pdu(digests, data, 0)
    };
    // More in the capsule than the port takes (its SGL right): that command fails.
    let over = IN_CAPSULE as usize + 512;
    let mut sqe = Queue::command(
        nvm::opcode::WRITE,
        1,
        [0, 0, (over / 512) as u32 - 1, 0, 0, 0],
    );
    sqe.flags |= PSDT_SGL;
    sqe.dptr = Sgl::DataBlock {
        addr: 0,
        len: over as u32,
        offset: true,
    }
    .to_bytes();
    let c = io.submit_as_is(sqe, &pattern(over, 3)).await.unwrap();
    assert_eq!(
        (c.status.sct, c.status.sc),
        (sct::GENERIC, sc::SGL_INVALID_DATA_LENGTH)
    );
    let other = pattern(4096, 2);
    let mut corrupt = capsule(&other, 4096);
    *corrupt.last_mut().unwrap() ^= 0xff;
    io.send_raw(&corrupt).await.unwrap();
    io.send_raw(&capsule(&other, 512)).await.unwrap();
    // Neither wrote; the connection still serves.
    assert_eq!(io.read(1, 0, 8, BS).await.unwrap(), good);
    io.write(1, 8, other.clone(), BS, false).await.unwrap();
    assert_eq!(io.read(1, 8, 8, BS).await.unwrap(), other);

    let h2c = Header::Data {
        c2h: false,
        cccid: 7,
        ttag: 0x4242,
        offset: 0,
        length: 512,
        last: true,
        success: false,
    };
    io.send_raw(&h2c.to_pdu(digests, &other[..512], 0))
        .await
        .unwrap();
    let e = io.read(1, 0, 1, BS).await.unwrap_err();
    assert!(
        matches!(e, NvmeError::Terminated { fes: f, fei: 10 } if f == fes::INVALID_PDU_HEADER),
        "{e:?}"
    );
}

/// Reads of a namespace in a file: on tmpfs those of at least [`FILE_RANGE_MIN`] bytes go
/// from the file's pages to the socket (`sendfile(2)`, no read into a buffer) unless a data
/// digest must cover them; everything else is read into a buffer. Either way the host gets
/// what was written, also with many reads at once filling the socket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nvme_tcp_file_reads_sent_from_the_page_cache() {
    for (dir, kind) in crate::file_dirs() {
        let file = Arc::new(
            FileBackstore::open(
                dir.path().join("ns.img"),
                FileOptions {
                    size: Some(16 << 20),
                    create: true,
                    ..FileOptions::default()
                },
            )
            .unwrap(),
        );
        let reads = || {
            let c = file.counters();
            c.direct + c.buffered + c.inline
        };
        let (addr, _t) = target_on(file.clone()).await;
        for digests in [
            Digests::default(),
            Digests {
                header: true,
                data: true,
            },
        ] {
            let (_admin, io) = queues(addr, digests, 128).await;
            let io = Arc::new(io);
            for (i, len) in [4096usize, 65536, 131_072, 1 << 20].into_iter().enumerate() {
                let lba = i as u64 * 4096;
                let data = pattern(len, i as u8 ^ u8::from(digests.data));
                io.write(1, lba, data.clone(), BS, false).await.unwrap();
                let before = reads();
                let got = io.read(1, lba, (len / 512) as u32, BS).await.unwrap();
                assert!(got == data, "{kind} {digests:?} {len}: data differs");
                let from_file = kind == "tmpfs" && !digests.data && len as u64 >= FILE_RANGE_MIN;
                assert_eq!(
                    reads() == before,
                    from_file,
                    "{kind} {digests:?} {len}: read into a buffer"
                );
            }
            // 32 reads of 128 KiB at once: more than the socket takes, so the rest goes out
            // as the host makes room.
            let mut tasks = Vec::new();
            for i in 0..32u64 {
                let io = io.clone();
                tasks.push(tokio::spawn(async move {
                    let data = pattern(131_072, i as u8);
                    io.write(1, 16384 + i * 256, data.clone(), BS, false)
                        .await
                        .unwrap();
                    for _ in 0..4 {
                        let got = io.read(1, 16384 + i * 256, 256, BS).await.unwrap();
                        assert!(got == data, "read {i} differs");
                    }
                }));
            }
            for t in tasks {
                t.await.unwrap();
            }
        }
    }
}
