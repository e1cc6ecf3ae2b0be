//! The NVMe/TCP and NVMe/RDMA codecs against the kernel's own target (nvmet) and hosts
//! (nvme-tcp, and nvme-rdma over rdma_rxe) talking to each other; `tests/fixtures/README.md`
//! says how the captures were made. Every PDU and capsule of both directions is parsed and
//! re-emitted byte for byte, and every command is followed to its end: one completion each,
//! R2Ts answered by H2CData, keyed SGLs reached by RDMA READ and WRITE with the command's key,
//! SEND with Invalidate of that key, and what was written read back.

#[path = "../../../transport/tests/common/mod.rs"]
mod common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::IpAddr;

use common::{fixture, Pcap, LINKTYPE_ETHERNET};
use rtgt_nvme::admin::{self, IdController, IdNamespace};
use rtgt_nvme::fabrics::{ConnectData, FabricsCmd};
use rtgt_nvme::nvm::{self, Rw};
use rtgt_nvme::rdma::{cm_rep, CmReq, CM_REP_LEN, CM_REQ_LEN};
use rtgt_nvme::sqe::{Cqe, Sgl, Sqe, Status, CQE_LEN, FABRICS_OPCODE, SQE_LEN};
use rtgt_nvme::tcp::{self, CommonHeader, Digests, Header};
use rtgt_transport::wire::cm::{self, CmMessage};
use rtgt_transport::wire::{cma, icrc, roce, Datagram, Opcode, RoceRepr};

const SUBNQN: &str = "nqn.2024-01.org.rtgt.lab:nvmet-capture";
const DISCOVERY_NQN: &str = "nqn.2014-08.org.nvmexpress.discovery";
const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:5f1c6a3e-2b7d-4c1a-9e0f-3a6b8d9c0e21";
const NS_UUID: [u8; 16] = [
    0x4c, 0x9a, 0x2c, 0x1e, 0x5a, 0x4e, 0x4f, 0x0b, 0x9a, 0x52, 0x0d, 0x0c, 0x8f, 0x6b, 0x7a, 0x11,
];
/// The namespace: a 64 MiB file.
const NS_BYTES: u64 = 64 << 20;
const ETHERTYPE_IPV4: u16 = 0x0800;
const NVME_PORT: u16 = 4420;

fn load(name: &str) -> Pcap {
    let pcap = Pcap::parse(std::fs::read(fixture(name)).expect("capture fixture"));
    assert_eq!(pcap.link_type, LINKTYPE_ETHERNET);
    pcap
}

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(b[at..at + 4].try_into().unwrap())
}

/// What a transport saw of a command, in capture order: `time` is the frame that completed it,
/// `conn` the queue's connection (in the order they opened).
struct Event {
    time: usize,
    conn: usize,
    what: What,
}

enum What {
    /// A command capsule and its in-capsule data.
    Cmd(Sqe, Vec<u8>),
    /// Data to the controller (H2CData, RDMA READ responses) at an offset of the command's.
    DataOut(u16, u32, Vec<u8>),
    /// Data to the host (C2HData, RDMA WRITE).
    DataIn(u16, u32, Vec<u8>),
    Done(Cqe),
}

/// One command, assembled from its events.
struct Command {
    sqe: Sqe,
    out: BTreeMap<u32, Vec<u8>>,
    inp: BTreeMap<u32, Vec<u8>>,
}

/// The bytes of one direction, which must cover `0..n` with no gap or overlap.
fn joined(parts: &BTreeMap<u32, Vec<u8>>, what: &str) -> Vec<u8> {
    let mut out = Vec::new();
    for (&offset, part) in parts {
        assert_eq!(offset as usize, out.len(), "{what}: a gap or overlap");
        out.extend_from_slice(part);
    }
    out
}

/// What the commands of a conversation said, checked as they end.
#[derive(Default)]
struct Facts {
    /// (qid, Connect data) of every queue.
    connects: Vec<(u16, ConnectData)>,
    /// Commands by (admin queue, opcode).
    opcodes: BTreeMap<(bool, u8), usize>,
    lba_bytes: Option<u64>,
    discovered: Vec<String>,
    /// The last data written to each LBA; reads that found all of theirs intact.
    disk: HashMap<u64, Vec<u8>>,
    writes: usize,
    reads_checked: usize,
    /// (opcode, CDW10's low byte, status) of the commands that failed.
    failed: Vec<(u8, u8, Status)>,
}

/// Follows every command of `events` (any order; sorted here by time) to its completion.
fn follow(mut events: Vec<Event>) -> Facts {
    events.sort_by_key(|e| (e.time, e.conn));
    let mut facts = Facts::default();
    let mut qids: HashMap<usize, u16> = HashMap::new();
    let mut open: HashMap<(usize, u16), Command> = HashMap::new();
    for e in events {
        match e.what {
            What::Cmd(sqe, data) => {
                if let Some(FabricsCmd::Connect { qid, .. }) = (sqe.opcode == FABRICS_OPCODE)
                    .then(|| FabricsCmd::parse(&sqe))
                    .flatten()
                {
                    assert!(qids.insert(e.conn, qid).is_none(), "a second Connect");
                }
                let mut c = Command {
                    sqe,
                    out: BTreeMap::new(),
                    inp: BTreeMap::new(),
                };
                if !data.is_empty() {
                    c.out.insert(0, data);
                }
                let cid = c.sqe.cid;
                assert!(
                    open.insert((e.conn, cid), c).is_none(),
                    "CID {cid} reused before its completion"
                );
            }
            What::DataOut(cid, offset, data) | What::DataIn(cid, offset, data)
                if !open.contains_key(&(e.conn, cid)) =>
            {
                panic!(
                    "data for CID {cid} at {offset} ({} bytes): no such command",
                    data.len()
                )
            }
            What::DataOut(cid, offset, data) => {
                let c = open.get_mut(&(e.conn, cid)).unwrap();
                assert!(c.out.insert(offset, data).is_none());
            }
            What::DataIn(cid, offset, data) => {
                let c = open.get_mut(&(e.conn, cid)).unwrap();
                assert!(c.inp.insert(offset, data).is_none());
            }
            What::Done(cqe) => {
                let c = open
                    .remove(&(e.conn, cqe.cid))
                    .unwrap_or_else(|| panic!("a completion of CID {}: no such command", cqe.cid));
                let qid = *qids.get(&e.conn).expect("Connect first");
                facts.command(qid, &c, &cqe);
            }
        }
    }
    // Only Asynchronous Event Requests stay outstanding when a controller goes away.
    for c in open.values() {
        assert_eq!(
            c.sqe.opcode,
            admin::opcode::ASYNC_EVENT_REQUEST,
            "{:?}",
            c.sqe
        );
    }
    facts
}

impl Facts {
    fn command(&mut self, qid: u16, c: &Command, cqe: &Cqe) {
        let sqe = &c.sqe;
        let admin = qid == 0;
        *self.opcodes.entry((admin, sqe.opcode)).or_default() += 1;
        let out = joined(&c.out, "data to the controller");
        let inp = joined(&c.inp, "data to the host");
        let sgl_len = sqe.sgl().data_len().expect("a known SGL") as usize;
        assert!(out.is_empty() || inp.is_empty());
        assert!(out.len().max(inp.len()) <= sgl_len, "{sqe:?}");
        if !cqe.status.is_success() {
            self.failed.push((sqe.opcode, sqe.cdw[0] as u8, cqe.status));
            return;
        }
        if sqe.opcode == FABRICS_OPCODE {
            if let Some(FabricsCmd::Connect { qid: q, .. }) = FabricsCmd::parse(sqe) {
                assert_eq!(q, qid);
                let data = ConnectData::parse(&out).unwrap();
                assert_eq!(data.host_nqn, HOSTNQN);
                self.connects.push((q, data));
            }
            return;
        }
        match (admin, sqe.opcode) {
            (true, admin::opcode::IDENTIFY) => {
                assert_eq!(inp.len(), admin::IDENTIFY_LEN);
                match admin::Identify::from_cdw(sqe.cdw[0], sqe.cdw[1]).cns {
                    admin::cns::CONTROLLER => {
                        let id = IdController::parse(&inp).unwrap();
                        assert!(id.subnqn == SUBNQN || id.subnqn == DISCOVERY_NQN);
                    }
                    admin::cns::NAMESPACE => {
                        let id = IdNamespace::parse(&inp).unwrap();
                        let lba = 1u64 << id.lbads;
                        assert_eq!(id.nsze * lba, NS_BYTES);
                        self.lba_bytes = Some(lba);
                    }
                    admin::cns::NAMESPACE_DESCRIPTORS => {
                        let ids = admin::parse_ns_descriptors(&inp);
                        assert!(ids.contains(&(admin::nidt::UUID, NS_UUID.to_vec())));
                    }
                    _ => {}
                }
            }
            (true, admin::opcode::GET_LOG_PAGE) => {
                let glp =
                    admin::GetLogPage::from_cdw(sqe.cdw[0], sqe.cdw[1], sqe.cdw[2], sqe.cdw[3]);
                assert_eq!(inp.len() as u64, glp.len);
                if glp.lid == admin::log::DISCOVERY && glp.offset == 0 && inp.len() >= 2048 {
                    let (_, entries) = admin::parse_discovery_log(&inp).unwrap();
                    self.discovered = entries.into_iter().map(|e| e.subnqn).collect();
                }
            }
            (false, nvm::opcode::WRITE) => {
                let rw = Rw::parse(sqe);
                let lba = self.lba_bytes.expect("Identify Namespace first") as usize;
                assert_eq!(out.len(), rw.blocks as usize * lba);
                for (i, block) in out.chunks(lba).enumerate() {
                    self.disk.insert(rw.slba + i as u64, block.to_vec());
                }
                self.writes += 1;
            }
            (false, nvm::opcode::READ) => {
                let rw = Rw::parse(sqe);
                let lba = self.lba_bytes.expect("Identify Namespace first") as usize;
                assert_eq!(inp.len(), rw.blocks as usize * lba);
                let mut known = 0;
                for (i, block) in inp.chunks(lba).enumerate() {
                    let at = rw.slba + i as u64;
                    if let Some(w) = self.disk.get(&at) {
                        assert_eq!(w, block, "LBA {at} read back differs");
                        known += 1;
                    }
                }
                if known == rw.blocks {
                    self.reads_checked += 1;
                }
            }
            (false, nvm::opcode::DATASET_MANAGEMENT) => {
                let (count, attrs) = nvm::dsm_fields(sqe);
                assert_ne!(attrs & nvm::DSM_DEALLOCATE, 0);
                let ranges = nvm::dsm_ranges(&out, count);
                assert_eq!(ranges.len(), count);
                for r in ranges {
                    assert_eq!(&r.to_bytes()[..], &out[..nvm::DSM_RANGE_LEN]);
                }
            }
            _ => {}
        }
    }

    /// What both captures hold: the script of `tests/fixtures/README.md`.
    fn check_script(&self, conversations: usize) {
        let admin_queues = self.connects.iter().filter(|(q, _)| *q == 0).count();
        let subsystem = self
            .connects
            .iter()
            .filter(|(_, d)| d.subsys_nqn == SUBNQN)
            .count();
        let discovery = self
            .connects
            .iter()
            .filter(|(_, d)| d.subsys_nqn == DISCOVERY_NQN)
            .count();
        assert_eq!(discovery, conversations, "a discovery controller each");
        assert_eq!(
            subsystem,
            2 * conversations,
            "an admin and an I/O queue each"
        );
        assert_eq!(admin_queues, discovery + conversations);
        assert_eq!(self.discovered, [DISCOVERY_NQN, SUBNQN]);
        // 4 KiB and 128 KiB written and read back whole, each time.
        assert!(self.writes >= 2 * conversations, "{} writes", self.writes);
        assert!(
            self.reads_checked >= 2 * conversations,
            "{} reads",
            self.reads_checked
        );
        for op in [
            (true, admin::opcode::IDENTIFY),
            (true, admin::opcode::GET_LOG_PAGE),
            (true, admin::opcode::GET_FEATURES),
            (true, admin::opcode::SET_FEATURES),
            (true, FABRICS_OPCODE),
            (false, nvm::opcode::FLUSH),
            (false, nvm::opcode::DATASET_MANAGEMENT),
            (false, nvm::opcode::WRITE_ZEROES),
        ] {
            assert!(self.opcodes.contains_key(&op), "no {op:?}");
        }
        // What fails, as nvmet answers: Identify of the I/O command set's namespace data
        // (CNS 05h, which nvmet does not serve) with Invalid Field; Write Zeroes of more blocks
        // than the file backend takes with Command Size Limit Exceeded; the outstanding
        // Asynchronous Event Requests of a controller going away with Internal Error.
        // Each with DNR.
        for &(opcode, cdw10, status) in &self.failed {
            let what = (opcode, status.sct, status.sc, status.dnr);
            match opcode {
                admin::opcode::IDENTIFY => {
                    assert_eq!((cdw10, what), (5, (opcode, 0, 2, true)))
                }
                nvm::opcode::WRITE_ZEROES => assert_eq!(what, (opcode, 1, 0x83, true)),
                admin::opcode::ASYNC_EVENT_REQUEST => assert_eq!(what, (opcode, 0, 6, true)),
                other => panic!("command {other:#x} failed: {status:?}"),
            }
        }
        let failed = |op| self.failed.iter().filter(|f| f.0 == op).count();
        assert_eq!(failed(nvm::opcode::WRITE_ZEROES), conversations);
        assert_eq!(failed(admin::opcode::IDENTIFY), conversations);
    }
}

// --- NVMe/TCP -------------------------------------------------------------------------------

/// One direction of a TCP connection, reassembled, with the frame that brought each byte range.
#[derive(Default)]
struct Stream {
    isn: Option<u32>,
    bytes: Vec<u8>,
    /// (end of the stream after a frame, the frame).
    frames: Vec<(usize, usize)>,
}

impl Stream {
    fn segment(&mut self, frame: usize, seq: u32, syn: bool, payload: &[u8]) {
        if syn {
            self.isn = Some(seq);
            return;
        }
        if payload.is_empty() {
            return;
        }
        let isn = self.isn.expect("data before the SYN");
        let at = seq.wrapping_sub(isn.wrapping_add(1)) as usize;
        assert!(at <= self.bytes.len(), "frame {frame}: a gap in the stream");
        // A retransmission carries what was already there.
        let have = self.bytes.len().min(at + payload.len()) - at;
        assert_eq!(
            &self.bytes[at..at + have],
            &payload[..have],
            "frame {frame}"
        );
        if have < payload.len() {
            self.bytes.extend_from_slice(&payload[have..]);
            self.frames.push((self.bytes.len(), frame));
        }
    }

    /// The frame that brought the byte before `end`.
    fn frame_of(&self, end: usize) -> usize {
        let i = self.frames.partition_point(|&(e, _)| e < end);
        self.frames[i].1
    }

    /// The PDUs, each with its data, its bytes and the frame that completed it; PDUs after the
    /// first (ICReq or ICResp, which carry none) with `digests`.
    fn pdus(&self, digests: Digests) -> Vec<(Header, Vec<u8>, &[u8], usize)> {
        let mut out = Vec::new();
        let mut at = 0;
        while at < self.bytes.len() {
            let ch = CommonHeader::parse(&self.bytes[at..]).expect("a common header");
            let len = tcp::pdu_len(&ch, 1 << 20).expect("a PDU length");
            let raw = &self.bytes[at..at + len];
            let d = if out.is_empty() {
                Digests::default()
            } else {
                digests
            };
            let (header, data) = tcp::parse(raw, d).expect("a PDU");
            out.push((header, data.to_vec(), raw, self.frame_of(at + len)));
            at += len;
        }
        out
    }
}

/// The TCP connections to the NVMe port in the order they opened: (host to controller,
/// controller to host).
fn tcp_streams(pcap: &Pcap) -> Vec<(Stream, Stream)> {
    let mut order = Vec::new();
    let mut conns: HashMap<u16, (Stream, Stream)> = HashMap::new();
    for record in pcap.records() {
        let Some((ETHERTYPE_IPV4, ip)) = pcap.network_layer(record.data) else {
            continue;
        };
        assert_eq!(ip[9], 6, "frame {}: not TCP", record.number);
        let ihl = usize::from(ip[0] & 0x0f) * 4;
        let t = &ip[ihl..usize::from(be16(ip, 2))];
        let (sport, dport) = (be16(t, 0), be16(t, 2));
        let syn = t[13] & 0x02 != 0;
        let payload = &t[usize::from(t[12] >> 4) * 4..];
        let (host_port, to_ctrl) = if dport == NVME_PORT {
            (sport, true)
        } else {
            assert_eq!(sport, NVME_PORT);
            (dport, false)
        };
        if syn && to_ctrl {
            assert!(!conns.contains_key(&host_port), "a host port used twice");
            order.push(host_port);
        }
        let c = conns.entry(host_port).or_default();
        let s = if to_ctrl { &mut c.0 } else { &mut c.1 };
        s.segment(record.number, be32(t, 4), syn, payload);
    }
    order
        .into_iter()
        .map(|p| conns.remove(&p).expect("connection"))
        .collect()
}

#[test]
fn nvme_tcp_pdus_of_linux_parse_re_emit_and_follow_their_commands() {
    let pcap = load("nvme-tcp.pcap");
    let streams = tcp_streams(&pcap);
    let mut census: BTreeMap<u8, usize> = BTreeMap::new();
    let mut digested = 0;
    let mut events = Vec::new();
    for (conn, (to_ctrl, to_host)) in streams.iter().enumerate() {
        // The ICResp settles the digests of both directions.
        let ic = tcp::parse(&to_host.bytes[..tcp::IC_LEN], Digests::default()).unwrap();
        let Header::IcResp { digests, cpda, .. } = ic.0 else {
            panic!("the controller's first PDU is not ICResp: {:?}", ic.0)
        };
        assert_eq!(cpda, 0);
        let host = to_ctrl.pdus(digests);
        let ctrl = to_host.pdus(digests);
        let Header::IcReq {
            pfv,
            hpda,
            digests: asked,
            ..
        } = host[0].0
        else {
            panic!("the host's first PDU is not ICReq")
        };
        assert_eq!((pfv, hpda, asked), (0, 0, digests));
        if digests.header && digests.data {
            digested += 1;
        }
        // Byte for byte what the encoder makes of the parsed header and data.
        for (i, (header, data, raw, _)) in host.iter().chain(&ctrl).enumerate() {
            let d = if i == 0 || i == host.len() {
                Digests::default()
            } else {
                digests
            };
            assert_eq!(&header.to_pdu(d, data, 0)[..], *raw, "{header:?}");
            *census.entry(raw[0]).or_default() += 1;
        }

        // In capture order: R2Ts answered by H2CData covering each exactly, once.
        let mut merged: Vec<_> = host[1..]
            .iter()
            .map(|p| (p.3, false, p))
            .chain(ctrl[1..].iter().map(|p| (p.3, true, p)))
            .collect();
        merged.sort_by_key(|&(time, from_ctrl, _)| (time, from_ctrl));
        let mut r2ts: HashMap<u16, (u16, u32, u32, u32)> = HashMap::new();
        for (time, _, (header, data, _, _)) in merged {
            let what = match header.clone() {
                Header::Cmd(sqe) => What::Cmd(sqe, data.clone()),
                Header::Resp(cqe) => What::Done(cqe),
                Header::R2t {
                    cccid,
                    ttag,
                    offset,
                    length,
                } => {
                    assert!(r2ts.insert(ttag, (cccid, offset, length, 0)).is_none());
                    continue;
                }
                Header::Data {
                    c2h: false,
                    cccid,
                    ttag,
                    offset,
                    length,
                    last,
                    ..
                } => {
                    let r2t = r2ts.get_mut(&ttag).expect("H2CData for an R2T");
                    assert_eq!(r2t.0, cccid);
                    assert_eq!(offset, r2t.1 + r2t.3, "H2CData in order");
                    assert_eq!(length as usize, data.len());
                    r2t.3 += length;
                    assert_eq!(last, r2t.3 == r2t.2);
                    if last {
                        r2ts.remove(&ttag);
                    }
                    What::DataOut(cccid, offset, data.clone())
                }
                Header::Data {
                    c2h: true,
                    cccid,
                    offset,
                    length,
                    success,
                    ..
                } => {
                    assert_eq!(length as usize, data.len());
                    events.push(Event {
                        time,
                        conn,
                        what: What::DataIn(cccid, offset, data.clone()),
                    });
                    if !success {
                        continue;
                    }
                    What::Done(Cqe {
                        dw0: 0,
                        dw1: 0,
                        sq_head: 0,
                        sq_id: 0,
                        cid: cccid,
                        status: Status::SUCCESS,
                        phase: false,
                    })
                }
                other => panic!("unexpected {other:?}"),
            };
            events.push(Event { time, conn, what });
        }
        assert!(r2ts.is_empty(), "R2Ts left unanswered");
    }
    let facts = follow(events);
    facts.check_script(2);
    assert_eq!(
        digested, 3,
        "the digest run's discovery, admin and I/O queues"
    );

    // Every PDU type of a host and controller but the termination requests.
    use tcp::pdu_type as t;
    for ty in [
        t::IC_REQ,
        t::IC_RESP,
        t::CAPSULE_CMD,
        t::CAPSULE_RESP,
        t::H2C_DATA,
        t::C2H_DATA,
        t::R2T,
    ] {
        assert!(
            census.contains_key(&ty),
            "no PDU of type {ty:#x}: {census:?}"
        );
    }
    assert_eq!(census[&t::IC_REQ], streams.len());
}

// --- NVMe/RDMA ------------------------------------------------------------------------------

/// The RoCEv2 datagrams of the capture, each checked against its ICRC, by frame number.
fn roce_datagrams(pcap: &Pcap) -> Vec<(usize, Vec<u8>)> {
    let mut out = Vec::new();
    for record in pcap.records() {
        let Some((ETHERTYPE_IPV4, ip)) = pcap.network_layer(record.data) else {
            continue;
        };
        let d = Datagram::split(ip).expect("a RoCEv2 datagram");
        assert_eq!(d.udp_repr().dst_port, roce::UDP_PORT);
        let len = d.ip_header.len() + d.udp_header.len() + d.roce.len();
        let dg = ip[..len].to_vec();
        assert_eq!(icrc::check(&dg), Ok(true), "frame {}", record.number);
        out.push((record.number, dg));
    }
    out
}

/// A QP: its device's address and its number.
type Qp = (IpAddr, u32);

/// A keyed SGL of an outstanding command: where its data is on the host.
#[derive(Clone, Copy)]
struct Keyed {
    conn: usize,
    cid: u16,
    addr: u64,
    len: u32,
    invalidate: bool,
}

#[test]
fn nvme_rdma_capsules_of_linux_parse_re_emit_and_follow_their_commands() {
    let pcap = load("nvme-rdma.pcap");
    let datagrams = roce_datagrams(&pcap);
    let mut census: BTreeMap<u8, usize> = BTreeMap::new();
    // QP -> (connection, whether it is the controller's).
    let mut qps: HashMap<Qp, (usize, bool)> = HashMap::new();
    let mut reqs: HashMap<u32, usize> = HashMap::new();
    let mut conns = 0;
    let mut seen = HashSet::new();
    // Messages being assembled, by destination QP.
    let mut sends: HashMap<Qp, Vec<u8>> = HashMap::new();
    // RDMA WRITEs being assembled, by destination QP: (command, offset, bytes).
    let mut writes: HashMap<Qp, (Keyed, u32, Vec<u8>)> = HashMap::new();
    // RDMA READs asked for, answered in order, by the QP that answers: (command, offset,
    // length), and the response being assembled.
    let mut reads: HashMap<Qp, Vec<(Keyed, u32, u32)>> = HashMap::new();
    let mut read_data: HashMap<Qp, Vec<u8>> = HashMap::new();
    let mut keys: HashMap<u32, Keyed> = HashMap::new();
    let mut invalidated = 0;
    let mut events = Vec::new();
    for (frame, dg) in &datagrams {
        let d = Datagram::split(dg).unwrap();
        let packet = d.roce_packet().unwrap();
        let r = RoceRepr::parse(&packet).unwrap();
        let op = r.bth.opcode;
        // rxe retransmits when it has to; a packet seen before adds nothing.
        // QP numbers are per device: a QP is its device's address and number.
        let ip = d.ip_repr().unwrap();
        let qp = (ip.dst_addr(), r.bth.dest_qp);
        if !seen.insert((qp, r.bth.psn, u8::from(op))) {
            continue;
        }
        *census.entry(u8::from(op)).or_default() += 1;
        let payload = packet.payload();
        if op == Opcode::UdSendOnly {
            let mad = cm::Mad::parse(payload).unwrap();
            match mad.message {
                CmMessage::Req(req) => {
                    let pd = &req.private_data[cma::HEADER_LEN..cma::HEADER_LEN + CM_REQ_LEN];
                    let nvme = CmReq::parse(pd).unwrap();
                    assert_eq!(&nvme.to_bytes()[..], pd, "frame {frame}");
                    assert!(nvme.hrqsize > 0 && nvme.hsqsize > 0);
                    let (_, port) = cma::parse_service_id(req.service_id).unwrap();
                    assert_eq!(port, NVME_PORT);
                    qps.insert((ip.src_addr(), req.local_qpn), (conns, false));
                    reqs.insert(req.local_comm_id, conns);
                    conns += 1;
                }
                CmMessage::Rep(rep) => {
                    let conn = reqs[&rep.remote_comm_id];
                    let crqsize = u16::from_le_bytes([rep.private_data[2], rep.private_data[3]]);
                    assert!(crqsize > 0);
                    assert_eq!(
                        rep.private_data[..CM_REP_LEN],
                        cm_rep(crqsize),
                        "frame {frame}"
                    );
                    qps.insert((ip.src_addr(), rep.local_qpn), (conn, true));
                }
                _ => {}
            }
            continue;
        }
        let Some(&(conn, to_ctrl)) = qps.get(&qp) else {
            panic!("frame {frame}: QP {qp:?} of no connection")
        };
        let time = *frame;
        match op {
            Opcode::RcSendFirst | Opcode::RcSendMiddle => {
                sends.entry(qp).or_default().extend_from_slice(payload);
            }
            Opcode::RcSendLast
            | Opcode::RcSendOnly
            | Opcode::RcSendLastWithInvalidate
            | Opcode::RcSendOnlyWithInvalidate => {
                let mut msg = sends.remove(&qp).unwrap_or_default();
                msg.extend_from_slice(payload);
                if to_ctrl {
                    // A command capsule: the entry, then any in-capsule data.
                    let sqe = Sqe::parse(&msg).expect("a capsule");
                    assert_eq!(sqe.to_bytes(), msg[..SQE_LEN], "frame {frame}");
                    let sgl = sqe.sgl();
                    assert_eq!(Sgl::parse(&sqe.dptr).to_bytes(), sqe.dptr);
                    let data = msg[SQE_LEN..].to_vec();
                    match sgl {
                        Sgl::Keyed {
                            addr,
                            len,
                            key,
                            invalidate,
                        } => {
                            assert!(data.is_empty());
                            if len > 0 {
                                let k = Keyed {
                                    conn,
                                    cid: sqe.cid,
                                    addr,
                                    len,
                                    invalidate,
                                };
                                assert!(keys.insert(key, k).is_none(), "key {key:#x} in use");
                            }
                        }
                        Sgl::DataBlock {
                            addr: 0,
                            len,
                            offset: true,
                        } => assert_eq!(len as usize, data.len()),
                        other => panic!("frame {frame}: SGL {other:?}"),
                    }
                    events.push(Event {
                        time,
                        conn,
                        what: What::Cmd(sqe, data),
                    });
                } else {
                    // A response capsule: one completion entry.
                    assert_eq!(msg.len(), CQE_LEN, "frame {frame}");
                    let cqe = Cqe::parse(&msg).unwrap();
                    assert_eq!(cqe.to_bytes(), msg[..], "frame {frame}");
                    if let Some(ieth) = r.ieth {
                        let k = keys.remove(&ieth.rkey).expect("invalidate a command's key");
                        assert!(k.invalidate && k.cid == cqe.cid && k.conn == conn);
                        invalidated += 1;
                    } else {
                        keys.retain(|_, k| !(k.conn == conn && k.cid == cqe.cid));
                    }
                    events.push(Event {
                        time,
                        conn,
                        what: What::Done(cqe),
                    });
                }
            }
            Opcode::RcRdmaWriteFirst
            | Opcode::RcRdmaWriteMiddle
            | Opcode::RcRdmaWriteLast
            | Opcode::RcRdmaWriteOnly => {
                assert!(!to_ctrl, "frame {frame}: RDMA WRITE by the host");
                if let Some(reth) = r.reth {
                    let k = keys[&reth.rkey];
                    assert!(reth.va >= k.addr);
                    let offset = (reth.va - k.addr) as u32;
                    assert!(offset + reth.dma_len <= k.len);
                    writes.insert(qp, (k, offset, Vec::new()));
                }
                let w = writes.get_mut(&qp).expect("an RDMA WRITE under way");
                w.2.extend_from_slice(payload);
                if matches!(op, Opcode::RcRdmaWriteLast | Opcode::RcRdmaWriteOnly) {
                    let (k, offset, data) = writes.remove(&qp).unwrap();
                    events.push(Event {
                        time,
                        conn,
                        what: What::DataIn(k.cid, offset, data),
                    });
                }
            }
            Opcode::RcRdmaReadRequest => {
                assert!(!to_ctrl, "frame {frame}: RDMA READ by the host");
                let reth = r.reth.unwrap();
                let k = keys[&reth.rkey];
                let offset = (reth.va - k.addr) as u32;
                assert!(offset + reth.dma_len <= k.len);
                // Its responses come to the controller's QP.
                let ctrl_qp = qps
                    .iter()
                    .find(|(_, &(c, is_ctrl))| c == conn && is_ctrl)
                    .map(|(&q, _)| q)
                    .unwrap();
                reads
                    .entry(ctrl_qp)
                    .or_default()
                    .push((k, offset, reth.dma_len));
            }
            Opcode::RcRdmaReadResponseFirst
            | Opcode::RcRdmaReadResponseMiddle
            | Opcode::RcRdmaReadResponseLast
            | Opcode::RcRdmaReadResponseOnly => {
                assert!(to_ctrl);
                let buf = read_data.entry(qp).or_default();
                buf.extend_from_slice(payload);
                if matches!(
                    op,
                    Opcode::RcRdmaReadResponseLast | Opcode::RcRdmaReadResponseOnly
                ) {
                    let data = read_data.remove(&qp).unwrap();
                    let (k, offset, len) = reads.get_mut(&qp).unwrap().remove(0);
                    assert_eq!(data.len(), len as usize);
                    events.push(Event {
                        time,
                        conn,
                        what: What::DataOut(k.cid, offset, data),
                    });
                }
            }
            Opcode::RcAcknowledge => {}
            other => panic!("frame {frame}: {other:?}"),
        }
    }
    assert!(sends.is_empty() && writes.is_empty() && read_data.is_empty());
    assert!(reads.values().all(Vec::is_empty));
    let facts = follow(events);
    facts.check_script(1);
    assert!(invalidated > 0, "no SEND with Invalidate");
    for op in [
        Opcode::RcSendOnly,
        Opcode::RcSendOnlyWithInvalidate,
        Opcode::RcRdmaWriteOnly,
        Opcode::RcRdmaWriteFirst,
        Opcode::RcRdmaReadRequest,
        Opcode::RcRdmaReadResponseFirst,
        Opcode::RcAcknowledge,
        Opcode::UdSendOnly,
    ] {
        assert!(census.contains_key(&u8::from(op)), "no {op:?}: {census:?}");
    }
}
