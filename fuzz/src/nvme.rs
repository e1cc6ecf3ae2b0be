//! NVMe over Fabrics (`rtgt-nvme`): NVMe/TCP PDUs, submission entries, SGLs, fabrics commands
//! and the Connect data.

use rtgt_nvme::admin::{
    ana_log, discovery_log, ns_descriptors, parse_ana_log, parse_discovery_log,
    parse_ns_descriptors, GetLogPage, IdController, IdNamespace,
};
use rtgt_nvme::fabrics::{ConnectData, FabricsCmd, CONNECT_DATA_LEN};
use rtgt_nvme::nvm::{dsm_ranges, Rw};
use rtgt_nvme::rdma::CmReq;
use rtgt_nvme::sqe::{Sgl, Sqe};
use rtgt_nvme::tcp::{self, CommonHeader, Digests, Header, PduError, CH_LEN};

/// The data a command capsule or data PDU may carry here.
const MAX_DATA: usize = 128 << 10;

/// A byte stream of NVMe/TCP PDUs as a controller reads it: the common header, the length it
/// announces checked by [`tcp::pdu_len`] before anything more is read, then the whole PDU
/// through [`tcp::parse`], and its head alone through [`tcp::parse_head`], which must agree.
/// Nothing panics; a PDU that parses is emitted again and parses to
/// the same header and data; a command's SGL and fabrics command survive a round trip, and
/// a Connect's data parses or names a field.
///
/// Input: one byte whose two low bits are the connection's digests (header, data), then the
/// stream.
pub fn nvme_tcp_pdu(data: &[u8]) {
    let Some((&d, mut stream)) = data.split_first() else {
        return;
    };
    let digests = Digests {
        header: d & 1 != 0,
        data: d & 2 != 0,
    };
    while let Some(ch) = CommonHeader::parse(stream) {
        let Ok(len) = tcp::pdu_len(&ch, MAX_DATA) else {
            return;
        };
        assert!(len >= CH_LEN);
        let Some(pdu) = stream.get(..len) else {
            return;
        };
        stream = &stream[len..];
        // Its head alone (what a reader takes before it reads the data to where it belongs)
        // answers as the whole PDU does, up to the data digest.
        let head = tcp::parse_head(&pdu[..tcp::head_len(&ch, digests).min(len)], digests);
        let whole = tcp::parse(pdu, digests);
        match (&head, &whole) {
            (Ok((h, l)), Ok((h2, p))) => {
                assert_eq!(h, h2);
                assert_eq!(l.data, p.len());
                assert_eq!(tcp::head_len(&ch, digests) + l.pad + l.data + l.ddgst, len);
            }
            (Ok((h, _)), Err(PduError::DataDigest(h2))) => assert_eq!(h, &**h2),
            (Err(e), Err(e2)) => assert_eq!(e, e2),
            (a, b) => panic!("head {a:?}, whole {b:?}"),
        }
        let Ok((header, payload)) = whole else {
            continue;
        };
        let again = header.to_pdu(digests, payload, 0);
        let (h2, p2) = tcp::parse(&again, digests).expect("an emitted PDU parses");
        assert_eq!((&h2, p2), (&header, payload));
        if let Header::Cmd(sqe) = &header {
            command(sqe, payload);
        }
    }
}

fn command(sqe: &Sqe, payload: &[u8]) {
    assert_eq!(Sqe::parse(&sqe.to_bytes()).as_ref(), Some(sqe));
    let sgl = sqe.sgl();
    assert_eq!(Sgl::parse(&sgl.to_bytes()), sgl);
    let Some(cmd) = FabricsCmd::parse(sqe) else {
        return;
    };
    assert_eq!(
        FabricsCmd::parse(&cmd.to_sqe(sqe.cid, sqe.dptr)),
        Some(cmd),
        "{cmd:?}"
    );
    if let FabricsCmd::Connect { .. } = cmd {
        match ConnectData::parse(payload) {
            Ok(c) => assert_eq!(ConnectData::parse(&c.to_bytes()), Ok(c)),
            Err(bad) => assert!(usize::from(bad.0) <= CONNECT_DATA_LEN),
        }
    }
}

/// The data structures an initiator reads from a controller, and the NVMe/RDMA private data a
/// controller reads from a host, through every parser: nothing panics, and what parses is
/// emitted again and parses to the same value. The NVM command fields of a submission entry
/// round-trip too.
///
/// Input: the bytes of one structure (the first 64 are also taken as a submission entry).
pub fn nvme_structures(data: &[u8]) {
    if let Some(c) = IdController::parse(data) {
        assert_eq!(IdController::parse(&c.to_bytes()), Some(c));
    }
    if let Some(n) = IdNamespace::parse(data) {
        let again = IdNamespace::parse(&n.to_bytes()).expect("4096 bytes");
        assert_eq!(again, n);
    }
    let ids = parse_ns_descriptors(data);
    let refs: Vec<(u8, &[u8])> = ids.iter().map(|(t, v)| (*t, &v[..])).collect();
    let page = ns_descriptors(&refs);
    if page.len() >= ids.iter().map(|(_, v)| 4 + v.len()).sum::<usize>() {
        assert_eq!(parse_ns_descriptors(&page), ids);
    }
    if let Some((gen, entries)) = parse_discovery_log(data) {
        assert_eq!(
            parse_discovery_log(&discovery_log(gen, &entries)),
            Some((gen, entries))
        );
    }
    if let Some((chgcnt, groups)) = parse_ana_log(data) {
        assert_eq!(
            parse_ana_log(&ana_log(chgcnt, &groups, false)),
            Some((chgcnt, groups))
        );
    }
    if let Ok(req) = CmReq::parse(data) {
        assert_eq!(CmReq::parse(&req.to_bytes()), Ok(req));
    }
    let ranges = dsm_ranges(data, 256);
    let bytes: Vec<u8> = ranges.iter().flat_map(|r| r.to_bytes()).collect();
    assert_eq!(dsm_ranges(&bytes, 256), ranges);
    if let Some(sqe) = Sqe::parse(data) {
        let rw = Rw::parse(&sqe);
        let [a, b, c] = rw.cdw();
        let mut again = sqe.clone();
        again.cdw[..3].copy_from_slice(&[a, b, c]);
        assert_eq!(Rw::parse(&again), rw);
        let g = GetLogPage::from_cdw(sqe.cdw[0], sqe.cdw[1], sqe.cdw[2], sqe.cdw[3]);
        assert!(g.len >= 4 && g.len.is_multiple_of(4));
    }
}

/// A host's byte stream into an NVMe/TCP queue of a target with one RAM namespace (any host
/// admitted): whatever comes — ICReq, Connect, capsules, H2CData, garbage — the queue answers
/// or terminates, and ends when the stream does; it never panics or hangs.
///
/// Input: the stream. Controller 1 exists for I/O queues to join (the seeds' host, four I/O
/// queues).
pub fn nvme_tcp_queue(data: &[u8]) {
    use std::sync::Arc;

    use rtgt_backstore::{BufPool, RamBackstore};
    use rtgt_nvme::subsys::{Limits, Namespace, Subsystem, Targets};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let t = Targets::new(BufPool::new(4 << 20), Limits::default());
        let s = t.add_subsystem(Subsystem::new(
            "nqn.2025-01.io.rtgt:default",
            "FUZZ0001",
            None,
        ));
        s.add_namespace(Namespace {
            nsid: 1,
            backstore: Arc::new(RamBackstore::new(1 << 20, 512)),
            nguid: [1; 16],
            eui64: [0; 8],
            uuid: [2; 16],
            read_only: false,
            access: None,
        });
        // Controller 1 of the seeds' host, enabled with four I/O queues, for streams that
        // connect an I/O queue.
        let host_nqn = "nqn.2014-08.org.nvmexpress:uuid:0c2b3ad4-5e5f-4f5c-9d1b-3c6a6f6f0e01";
        let cd = ConnectData {
            host_id: [0; 16],
            cntlid: 0xffff,
            subsys_nqn: "nqn.2025-01.io.rtgt:default".into(),
            host_nqn: host_nqn.into(),
        };
        let ctrl = t.connect(0, 31, 0, &cd, Some(1)).expect("controller 1");
        let set = |c: FabricsCmd| c.to_sqe(1, [0; 16]);
        let cc = set(FabricsCmd::PropertySet {
            eight: false,
            offset: 0x14,
            value: 1,
        });
        assert!(ctrl.execute(0, &cc, None).await.status.is_success());
        let mut nq = cc.clone();
        nq.opcode = 0x09;
        nq.nsid = 0;
        nq.cdw = [7, 3 | 3 << 16, 0, 0, 0, 0];
        assert!(ctrl.execute(0, &nq, None).await.status.is_success());
        let (host, target) = tokio::net::UnixStream::pair().expect("a socket pair");
        let (target_rd, target_wr) = target.into_split();
        let served = tokio::spawn(rtgt_nvme::tcp_queue::serve_stream(
            t.clone(),
            target_rd,
            target_wr,
            None,
            rtgt_nvme::tcp_queue::Scope::Port(1),
        ));
        let (mut rd, mut wr) = host.into_split();
        let input = data.to_vec();
        let writer = tokio::spawn(async move {
            let _ = wr.write_all(&input).await;
            let _ = wr.shutdown().await;
        });
        let mut sink = Vec::new();
        let _ = rd.read_to_end(&mut sink).await;
        let _ = writer.await;
        tokio::time::timeout(std::time::Duration::from_secs(10), served)
            .await
            .expect("the queue ends with its stream")
            .expect("no panic");
        drop(ctrl);
    });
}
