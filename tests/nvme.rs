//! rtgtd serving NVMe/TCP from its configuration, driven by the in-repo NVMe/TCP host and
//! the admin API: discovery (on a port and on a discovery-only listener, with wildcard
//! addresses replaced), a namespace shared with a SCSI LUN seeing the same data over iSCSI,
//! controllers as sessions and metrics, live changes (a namespace added, a host removed, a
//! controller closed through the API, a port removed) and validation answers.

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::{free_port, Rtgtd};
use rtgt_api::client::{Client, ClientError};
use rtgt_api::config::Config;
use rtgt_api::{ChangeReport, SessionView};
use rtgt_nvme::admin::trtype;
use rtgt_nvme::fabrics::status as fstatus;
use rtgt_nvme::sqe::{sc, sct};
use rtgt_nvme::subsys::DISCOVERY_NQN;
use rtgt_tools::iscsi::{LoginConfig, Session};
use rtgt_tools::nvme::{HostConfig, NvmeError, Queue};

const SUB: &str = "nqn.2025-01.io.rtgt:nvme-test";
const TARGET: &str = "iqn.2025-01.io.rtgt:nvme-test";
const BS: u32 = 512;

fn config(iscsi: u16, port: u16, disc: u16, host: &str) -> String {
    format!(
        "\
backstores:
  - {{name: d0, type: file, path: d0.img, size: 16MiB}}
  - {{name: r1, type: ramdisk, size: 8MiB, block_size: 4096}}
  - {{name: ro, type: ramdisk, size: 1MiB, read_only: true}}
targets:
  - name: {TARGET}
    portal_groups:
      - tag: 1
        portals: ['127.0.0.1:{iscsi}']
        allow_any_initiator: true
        luns: [{{lun: 0, backstore: d0}}]
nvme:
  subsystems:
    - nqn: {SUB}
      hosts: ['{host}']
      namespaces:
        - {{nsid: 1, backstore: d0, share_with_scsi: true}}
  ports:
    - {{id: 1, transport: tcp, listen: '0.0.0.0:{port}'}}
  discovery_listen: ['127.0.0.1:{disc}']
api: {{listen: []}}
"
    )
}

fn client(d: &Rtgtd) -> Client {
    Client::unix(d.dir.join("rtgtd.sock"))
}

fn get_config(c: &Client) -> Config {
    c.get("/api/v1/config").unwrap()
}

fn apply(c: &Client, cfg: &Config) -> Result<ChangeReport, ClientError> {
    c.apply_yaml(&cfg.to_yaml())
}

fn nvme_sessions(c: &Client) -> Vec<SessionView> {
    let all: Vec<SessionView> = c.get("/api/v1/sessions").unwrap();
    all.into_iter()
        .filter(|s| s.transport == "nvme-tcp")
        .collect()
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(13).wrapping_add(seed))
        .collect()
}

fn invalid_host(e: &NvmeError) -> bool {
    matches!(e, NvmeError::Status(s) if (s.sct, s.sc) == (sct::COMMAND_SPECIFIC, fstatus::CONNECT_INVALID_HOST))
}

fn invalid_parameters(e: &NvmeError) -> bool {
    matches!(e, NvmeError::Status(s) if (s.sct, s.sc) == (sct::COMMAND_SPECIFIC, fstatus::CONNECT_INVALID_PARAMETERS))
}

async fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rtgtd_serves_nvme_tcp_from_its_configuration_and_the_api() {
    let (iscsi, port, disc) = (free_port(), free_port(), free_port());
    let host = HostConfig::default();
    let d = Rtgtd::start("nvme", &config(iscsi, port, disc, &host.host_nqn), port);
    let c = client(&d);
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let disc_addr: SocketAddr = ([127, 0, 0, 1], disc).into();

    // Discovery, on the discovery-only listener and on the port: the subsystem on port 1,
    // its wildcard address listed as the address the host asked through.
    for a in [disc_addr, addr] {
        let q = Queue::connect(a, &host, DISCOVERY_NQN, 0, 0, 32)
            .await
            .unwrap();
        q.enable(0).await.unwrap();
        let entries = q.discovery_log().await.unwrap();
        assert_eq!(entries.len(), 1, "{entries:?}");
        let e = &entries[0];
        assert_eq!(
            (
                e.subnqn.as_str(),
                e.trtype,
                e.portid,
                e.traddr.as_str(),
                e.trsvcid.as_str()
            ),
            (SUB, trtype::TCP, 1, "127.0.0.1", port.to_string().as_str())
        );
    }
    // The discovery-only listener serves no I/O subsystem.
    let e = Queue::connect(disc_addr, &host, SUB, 0, 0, 32)
        .await
        .err()
        .expect("refused");
    assert!(invalid_parameters(&e), "{e:?}");
    // A host not on the list is refused, and does not see the subsystem in discovery.
    let stranger = HostConfig {
        host_nqn: "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-00000000beef".into(),
        ..HostConfig::default()
    };
    let e = Queue::connect(addr, &stranger, SUB, 0, 0, 32)
        .await
        .err()
        .expect("refused");
    assert!(invalid_host(&e), "{e:?}");
    let q = Queue::connect(disc_addr, &stranger, DISCOVERY_NQN, 0, 0, 32)
        .await
        .unwrap();
    q.enable(0).await.unwrap();
    assert!(q.discovery_log().await.unwrap().is_empty());
    drop(q);

    // I/O through namespace 1; the same blocks read back over iSCSI (LUN 0 on d0).
    let admin = Queue::connect(addr, &host, SUB, 0, 0, 32).await.unwrap();
    assert_eq!(admin.enable(2).await.unwrap(), 2);
    let id = admin.identify_controller().await.unwrap();
    assert_eq!(id.subnqn, SUB);
    let ns = admin.identify_namespace(1).await.unwrap();
    assert_eq!((ns.nsze, ns.lbads), ((16 << 20) / 512, 9));
    assert_ne!(ns.nguid, [0; 16]);
    assert_eq!(admin.active_namespaces().await.unwrap(), vec![1]);
    let io = Queue::connect(addr, &host, SUB, 1, admin.cntlid, 64)
        .await
        .unwrap();
    let data = pattern(64 << 10, 7);
    io.write(1, 2048, data.clone(), BS, false).await.unwrap();
    assert_eq!(io.read(1, 2048, 128, BS).await.unwrap(), data);
    let s = Session::connect(
        ([127, 0, 0, 1], iscsi).into(),
        LoginConfig {
            initiator_name: "iqn.2025-01.io.rtgt:nvme-reader".into(),
            target_name: Some(TARGET.into()),
            ..LoginConfig::default()
        },
    )
    .await
    .unwrap();
    let mut uas = Vec::new();
    let read10 = [0x28, 0, 0, 0, 0x08, 0, 0, 0, 128, 0];
    let r = common::run(&s, 0, &read10, None, 64 << 10, &mut uas).await;
    assert_eq!(r.status, 0);
    assert_eq!(&r.data[..], &data[..], "iSCSI reads what NVMe wrote");

    // The controller as a session, in metrics too.
    let sessions = nvme_sessions(&c);
    let mine = sessions
        .iter()
        .find(|s| s.id == format!("nvme-{}", admin.cntlid))
        .expect("the controller is listed");
    assert_eq!(
        (
            mine.initiator.as_str(),
            mine.target.as_str(),
            mine.session_type.as_str(),
            mine.queues
        ),
        (host.host_nqn.as_str(), SUB, "normal", Some(2))
    );
    assert!(mine.commands >= 2 && mine.bytes_in >= 64 << 10 && mine.bytes_out >= 64 << 10);
    let metrics = c.get_text("/metrics").unwrap();
    assert!(
        metrics.contains(&format!("rtgt_nvme_controllers{{subsystem=\"{SUB}\"}} 1")),
        "{metrics}"
    );
    assert!(
        metrics.contains(&format!(
            "rtgt_nvme_queues{{session=\"nvme-{}\",subsystem=\"{SUB}\"",
            admin.cntlid
        )),
        "{metrics}"
    );
    // Each queue's own counters: the I/O queue wrote and read 64 KiB at least, the admin
    // queue moved no namespace data.
    let queue_value = |name: &str, qid: u16| -> u64 {
        let key = format!(
            "{name}{{session=\"nvme-{}\",subsystem=\"{SUB}\",qid=\"{qid}\"}} ",
            admin.cntlid
        );
        let line = metrics
            .lines()
            .find(|l| l.starts_with(&key))
            .unwrap_or_else(|| panic!("no {key}in {metrics}"));
        line[key.len()..].parse().unwrap()
    };
    assert!(queue_value("rtgt_nvme_queue_written_bytes_total", 1) >= 64 << 10);
    assert!(queue_value("rtgt_nvme_queue_read_bytes_total", 1) >= 64 << 10);
    assert_eq!(queue_value("rtgt_nvme_queue_written_bytes_total", 0), 0);
    assert!(queue_value("rtgt_nvme_queue_commands_total", 0) >= 2);
    // And through the API, the controller with each queue.
    let one: SessionView = c
        .get(&format!("/api/v1/sessions/nvme-{}", admin.cntlid))
        .unwrap();
    let qs = &one.queue_list;
    assert_eq!(
        qs.iter().map(|q| (q.qid, q.size)).collect::<Vec<_>>(),
        [(0, 32), (1, 64)]
    );
    assert!(qs.iter().all(|q| q.peer.starts_with("127.0.0.1:")));
    assert_ne!(qs[0].peer, qs[1].peer, "each queue its own connection");
    assert!(qs[1].bytes_in >= 64 << 10 && qs[1].bytes_out >= 64 << 10);
    assert_eq!(
        (qs[0].bytes_in, qs[0].bytes_out),
        (0, 0),
        "no namespace data"
    );
    assert!(qs[0].commands >= 2 && qs[1].commands >= 2);
    let e = c
        .get::<SessionView>("/api/v1/sessions/nvme-65000")
        .unwrap_err();
    assert!(e.to_string().contains("404"), "{e}");

    // A namespace added live: the host sees it.
    let mut cfg = get_config(&c);
    cfg.nvme.subsystems[0]
        .namespaces
        .push(serde_json::from_value(serde_json::json!({"nsid": 2, "backstore": "r1"})).unwrap());
    cfg.nvme.subsystems[0]
        .namespaces
        .push(serde_json::from_value(serde_json::json!({"nsid": 3, "backstore": "ro"})).unwrap());
    let report = apply(&c, &cfg).unwrap();
    assert!(
        report.changes.iter().any(
            |ch| (ch.action.as_str(), ch.object.as_str(), ch.name.as_str())
                == ("added", "nvme_namespace", &format!("{SUB}/2"))
        ),
        "{report:?}"
    );
    assert_eq!(admin.active_namespaces().await.unwrap(), vec![1, 2, 3]);
    // A read-only backstore is a write-protected namespace.
    let e = io.write(3, 0, vec![1; 512], BS, false).await.unwrap_err();
    assert!(
        matches!(e, NvmeError::Status(s) if (s.sct, s.sc) == (sct::GENERIC, sc::NAMESPACE_WRITE_PROTECTED)),
        "{e:?}"
    );
    assert_eq!(io.read(3, 0, 1, BS).await.unwrap(), vec![0; 512]);
    let ns2 = admin.identify_namespace(2).await.unwrap();
    assert_eq!((ns2.nsze, ns2.lbads), ((8 << 20) / 4096, 12));
    let block = pattern(4096, 9);
    io.write(2, 5, block.clone(), 4096, false).await.unwrap();
    assert_eq!(io.read(2, 5, 1, 4096).await.unwrap(), block);

    // Validation: a SCSI LUN's backstore needs share_with_scsi; an unknown backstore; a
    // listener on an iSCSI portal.
    let mut bad = cfg.clone();
    bad.nvme.subsystems[0].namespaces[0].share_with_scsi = false;
    match apply(&c, &bad) {
        Err(ClientError::Http {
            status,
            field,
            message,
        }) => {
            assert_eq!((status, field.as_deref()), (422, Some("share_with_scsi")));
            assert!(message.contains("LUN of"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    let mut bad = cfg.clone();
    bad.nvme.subsystems[0].namespaces[1].backstore = "nope".into();
    assert!(matches!(
        apply(&c, &bad),
        Err(ClientError::Http { status: 422, .. })
    ));
    let mut bad = cfg.clone();
    bad.nvme.discovery_listen = vec![([127, 0, 0, 1], iscsi).into()];
    assert!(matches!(
        apply(&c, &bad),
        Err(ClientError::Http { status: 422, .. })
    ));

    // The host removed from the list: its controller closes, it cannot come back.
    let mut cfg = get_config(&c);
    cfg.nvme.subsystems[0].hosts = vec![stranger.host_nqn.clone()];
    apply(&c, &cfg).unwrap();
    // A command that reaches the queue before it ends is answered with a path error the
    // host may retry elsewhere (no DNR), never with data; then the queue ends.
    let mut path_errors = 0;
    let e = loop {
        match io
            .read(1, 0, 1, BS)
            .await
            .expect_err("no data after the host is removed")
        {
            NvmeError::Status(s)
                if (s.sct, s.sc, s.dnr) == (sct::PATH, sc::INTERNAL_PATH_ERROR, false) =>
            {
                path_errors += 1;
                assert!(path_errors < 1000, "the queue does not end");
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            e => break e,
        }
    };
    assert!(!matches!(e, NvmeError::Status(_)), "{e:?}");
    wait_for("the controller to go", || {
        !nvme_sessions(&c)
            .iter()
            .any(|s| s.initiator == host.host_nqn)
    })
    .await;
    let e = Queue::connect(addr, &host, SUB, 0, 0, 32)
        .await
        .err()
        .expect("refused");
    assert!(invalid_host(&e), "{e:?}");

    // The other host connects; closing its controller through the API ends its queue.
    let admin = Queue::connect(addr, &stranger, SUB, 0, 0, 32)
        .await
        .unwrap();
    admin.enable(1).await.unwrap();
    let id = format!("nvme-{}", admin.cntlid);
    c.delete(&format!("/api/v1/sessions/{id}")).unwrap();
    assert!(admin.identify_controller().await.is_err());
    wait_for("the closed controller to go", || {
        !nvme_sessions(&c).iter().any(|s| s.id == id)
    })
    .await;

    // The port removed: nothing listens there any more; discovery lists nothing.
    let mut cfg = get_config(&c);
    cfg.nvme.ports.clear();
    apply(&c, &cfg).unwrap();
    assert!(tokio::net::TcpStream::connect(addr).await.is_err());
    let q = Queue::connect(disc_addr, &stranger, DISCOVERY_NQN, 0, 0, 32)
        .await
        .unwrap();
    q.enable(0).await.unwrap();
    assert!(q.discovery_log().await.unwrap().is_empty());
}

/// The ANA state of namespace `nsid` as the controller of `q` reports it.
async fn ana_state(q: &Queue, nsid: u32) -> u8 {
    let (_, groups) = q.ana_log().await.unwrap();
    let g = groups
        .iter()
        .find(|g| g.nsids == [nsid])
        .unwrap_or_else(|| panic!("no ANA group holds namespace {nsid}: {groups:?}"));
    assert_eq!(g.grpid, nsid);
    g.state
}

fn ana_inaccessible(e: &NvmeError) -> bool {
    matches!(e, NvmeError::Status(s) if (s.sct, s.sc, s.dnr) == (sct::PATH, sc::ANA_INACCESSIBLE, false))
}

/// Two NVMe/TCP ports in two ALUA target port groups over one namespace (a LUN too): the
/// ANA log and I/O follow the groups' states, a failover through the API is an ANA change
/// event, a port moved to another group changes what its controllers see, and a port may
/// only name a group the alua section has.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rtgtd_reports_alua_groups_as_asymmetric_namespace_access() {
    use rtgt_nvme::admin::{ana, event, log};
    let (iscsi, p1, p2) = (free_port(), free_port(), free_port());
    let yaml = format!(
        "\
backstores:
  - {{name: d0, type: file, path: d0.img, size: 8MiB}}
targets:
  - name: {TARGET}
    portal_groups:
      - {{tag: 1, portals: ['127.0.0.1:{iscsi}'], alua_group: 1, allow_any_initiator: true, luns: [{{lun: 0, backstore: d0}}]}}
alua:
  transition_secs: 7
  groups:
    - {{id: 1}}
    - {{id: 2, state: standby}}
nvme:
  subsystems:
    - nqn: {SUB}
      allow_any_host: true
      namespaces: [{{nsid: 1, backstore: d0, share_with_scsi: true}}]
  ports:
    - {{id: 1, transport: tcp, listen: '127.0.0.1:{p1}', alua_group: 1}}
    - {{id: 2, transport: tcp, listen: '127.0.0.1:{p2}', alua_group: 2}}
api: {{listen: []}}
"
    );
    let d = Rtgtd::start("nvme-ana", &yaml, p2);
    let c = client(&d);
    let host = HostConfig::default();
    let open = |port: u16| {
        let host = host.clone();
        async move {
            let addr: SocketAddr = ([127, 0, 0, 1], port).into();
            let admin = Queue::connect(addr, &host, SUB, 0, 0, 32).await.unwrap();
            admin.enable(1).await.unwrap();
            let io = Queue::connect(addr, &host, SUB, 1, admin.cntlid, 32)
                .await
                .unwrap();
            (std::sync::Arc::new(admin), io)
        }
    };
    let (a, a_io) = open(p1).await;
    let (b, b_io) = open(p2).await;

    let id = a.identify_controller().await.unwrap();
    assert_eq!(id.cmic & 0x08, 0x08, "ANA reporting");
    assert_eq!((id.anatt, id.anacap), (7, ana::ANACAP));
    assert_eq!(a.identify_namespace(1).await.unwrap().anagrpid, 1);
    assert_eq!(ana_state(&a, 1).await, ana::OPTIMIZED);
    assert_eq!(ana_state(&b, 1).await, ana::INACCESSIBLE);
    a_io.write(1, 0, pattern(4096, 1), BS, false).await.unwrap();
    let e = b_io.read(1, 0, 8, BS).await.expect_err("standby path");
    assert!(ana_inaccessible(&e), "{e:?}");

    // Failover through the API: group 2 active, then group 1 standby. The host that asked
    // for ANA change notices hears of it; data written through one path reads back on the
    // other.
    b.async_event_config(1 << 11).await.unwrap();
    let aer = {
        let b = b.clone();
        tokio::spawn(async move { b.async_event().await })
    };
    let put = |group: u16, state: &str| {
        let _: serde_json::Value = c
            .send(
                "PUT",
                &format!("/api/v1/alua/groups/{group}/state"),
                &serde_json::json!({ "state": state }),
            )
            .unwrap();
    };
    put(2, "active_optimized");
    let dw0 = tokio::time::timeout(Duration::from_secs(10), aer)
        .await
        .expect("an ANA change event")
        .unwrap()
        .unwrap();
    assert_eq!(
        dw0,
        u32::from(event::NOTICE) | u32::from(event::ANA_CHANGE) << 8 | u32::from(log::ANA) << 16
    );
    assert_eq!(ana_state(&b, 1).await, ana::OPTIMIZED);
    assert_eq!(b_io.read(1, 0, 8, BS).await.unwrap(), pattern(4096, 1));
    put(1, "standby");
    assert_eq!(ana_state(&a, 1).await, ana::INACCESSIBLE);
    let e = a_io
        .write(1, 8, pattern(512, 2), BS, false)
        .await
        .expect_err("standby path");
    assert!(ana_inaccessible(&e), "{e:?}");
    b_io.write(1, 8, pattern(512, 2), BS, false).await.unwrap();

    // Port 1 moved into group 2: its controller sees group 2's state.
    let mut cfg = get_config(&c);
    cfg.nvme.ports[0].alua_group = Some(2);
    apply(&c, &cfg).unwrap();
    assert_eq!(ana_state(&a, 1).await, ana::OPTIMIZED);
    assert_eq!(a_io.read(1, 8, 1, BS).await.unwrap(), pattern(512, 2));

    // A group the section does not have: 422 naming the field.
    let mut bad = get_config(&c);
    bad.nvme.ports[1].alua_group = Some(9);
    match apply(&c, &bad) {
        Err(ClientError::Http {
            status,
            field,
            message,
        }) => {
            assert_eq!((status, field.as_deref()), (422, Some("alua_group")));
            assert!(message.contains("no group 9"), "{message}");
        }
        other => panic!("{other:?}"),
    }
}

/// Subsystems, namespaces, hosts and ports made through rtgtctl (and so the REST API's
/// `/api/v1/nvme` resources), each live for a host at once; bad requests get the API's
/// answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rtgtctl_manages_nvme_subsystems_and_ports() {
    const NQN: &str = "nqn.2025-01.io.rtgt:ctl";
    let (iscsi, port, disc) = (free_port(), free_port(), free_port());
    let host = HostConfig::default();
    let d = Rtgtd::start("nvme-ctl", &config(iscsi, port, disc, &host.host_nqn), port);
    let sock = d.dir.join("rtgtd.sock");
    let ctl = |args: &[&str]| {
        let (ok, out, err) = common::rtgtctl(&sock, args);
        assert!(ok, "rtgtctl {args:?}: {err}");
        out
    };
    let fails = |args: &[&str]| {
        let (ok, _, err) = common::rtgtctl(&sock, args);
        assert!(!ok, "rtgtctl {args:?} succeeded");
        err
    };
    let port2 = free_port();
    let listen = format!("127.0.0.1:{port2}");
    ctl(&["nvme", "create", NQN, "--host", &host.host_nqn]);
    ctl(&["nvme", "add-namespace", NQN, "1", "r1"]);
    ctl(&[
        "nvme",
        "add-port",
        "7",
        &listen,
        "--in-capsule-data-size",
        "4096",
    ]);
    let out = ctl(&["nvme", "list"]);
    assert!(
        out.contains(NQN) && out.contains("1=r1") && out.contains(&listen),
        "{out}"
    );

    // Live: a host connects through the new port and uses the new namespace.
    let addr: SocketAddr = listen.parse().unwrap();
    let admin = Queue::connect(addr, &host, NQN, 0, 0, 32).await.unwrap();
    admin.enable(1).await.unwrap();
    assert_eq!(admin.active_namespaces().await.unwrap(), [1]);
    // The port's in-capsule data size is what its controllers report.
    let id = admin.identify_controller().await.unwrap();
    assert_eq!(id.ioccsz, (64 + 4096) / 16);
    let io = Queue::connect(addr, &host, NQN, 1, admin.cntlid, 32)
        .await
        .unwrap();
    io.write(1, 0, pattern(4096, 9), 4096, false).await.unwrap();
    assert_eq!(io.read(1, 0, 1, 4096).await.unwrap(), pattern(4096, 9));
    // The controller and its queues: one row each, the I/O queue's bytes.
    let out = ctl(&["sessions", "show", &format!("nvme-{}", admin.cntlid)]);
    let rows: Vec<Vec<&str>> = out
        .lines()
        .skip_while(|l| !l.starts_with("QID"))
        .skip(1)
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(rows.len(), 2, "{out}");
    assert_eq!(
        (rows[0][0], rows[0][1], rows[1][0]),
        ("0", "32", "1"),
        "{out}"
    );
    assert_eq!((rows[1][5], rows[1][6]), ("4096", "4096"), "{out}");

    // A second namespace, then removed again; the subsystem's JSON shows what is there.
    ctl(&["nvme", "add-namespace", NQN, "2", "ro"]);
    assert_eq!(admin.active_namespaces().await.unwrap(), [1, 2]);
    ctl(&["nvme", "remove-namespace", NQN, "2"]);
    assert_eq!(admin.active_namespaces().await.unwrap(), [1]);
    let s: serde_json::Value =
        serde_json::from_str(&ctl(&["--json", "nvme", "show", NQN])).unwrap();
    assert_eq!(s["hosts"][0], host.host_nqn.as_str());
    assert_eq!(s["namespaces"].as_array().unwrap().len(), 1);

    // Bad requests: a namespace ID taken, an unknown backstore, a port ID taken, an unknown
    // subsystem, a malformed NQN.
    assert!(fails(&["nvme", "add-namespace", NQN, "1", "r1"]).contains("409"));
    assert!(fails(&["nvme", "add-namespace", NQN, "3", "nope"]).contains("422"));
    assert!(fails(&["nvme", "add-port", "7", "127.0.0.1:1"]).contains("409"));
    let odd = [
        "nvme",
        "add-port",
        "8",
        "127.0.0.1:1",
        "--in-capsule-data-size",
        "100",
    ];
    assert!(fails(&odd).contains("multiple of 16"));
    assert!(fails(&["nvme", "show", "nqn.2025-01.io.rtgt:none"]).contains("404"));
    assert!(fails(&["nvme", "create", "iqn.2025-01.io.rtgt:x"]).contains("422"));

    // The host removed: its controller closes and it cannot come back; the port removed:
    // nothing listens there; the subsystem deleted.
    ctl(&[
        "nvme",
        "add-host",
        NQN,
        "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-0000000000cc",
    ]);
    ctl(&["nvme", "remove-host", NQN, &host.host_nqn]);
    wait_for("the controller to close", || {
        !nvme_sessions(&client(&d))
            .iter()
            .any(|s| s.initiator == host.host_nqn && s.target == NQN)
    })
    .await;
    let e = Queue::connect(addr, &host, NQN, 0, 0, 32)
        .await
        .err()
        .expect("refused");
    assert!(invalid_host(&e), "{e:?}");
    ctl(&["nvme", "remove-port", "7"]);
    assert!(tokio::net::TcpStream::connect(addr).await.is_err());
    ctl(&["nvme", "delete", NQN]);
    assert!(!ctl(&["nvme", "list"]).contains(NQN));
    drop(io);
}
