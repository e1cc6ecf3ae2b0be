//! The software RoCEv2 device's receive path (`rtgt-transport::rc`, `rc::ud`): arbitrary
//! datagrams into a device with live QPs, driven on a virtual clock.

use std::collections::HashSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;
use std::time::Duration;

use rtgt_transport::verbs::{
    Access, AddressVector, Cq, Device, DeviceConfig, Mr, Qp, QpAttr, QpAttrMask, QpInitAttr,
    QpState, QpType, RecvWr, Region, SendOp, SendWr, WcOpcode, WcStatus,
};
use rtgt_transport::wire::{datagram, icrc, Datagram, IpRepr};

/// The device's addresses; a re-addressed datagram is sent to the one of its family.
const LOCAL_V4: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);
const LOCAL_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 2);
/// The RC QP's peer and its PSNs.
const PEER_V4: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
const PEER_QPN: u32 = 0x33;
const RQ_PSN: u32 = 0x00ab_cdef;
const SQ_PSN: u32 = 0x0012_3456;
const MR_LEN: usize = 64 << 10;
const RECV_LEN: u32 = 4096;
const RC_RECVS: u64 = 32;
const UD_RECVS: u64 = 16;
const CQ_DEPTH: u32 = 256;
/// Datagrams per input and rounds of timers at the end: enough to reach every path, small
/// enough to keep an execution short.
const MAX_RECORDS: usize = 64;
const DRAIN_ROUNDS: usize = 32;

struct Bed {
    dev: Device,
    cq: Cq,
    rc: Qp,
    ud: Qp,
    gsi: Qp,
    mr: Mr,
    _region: Arc<Region>,
    /// wr_ids posted and not completed yet.
    outstanding: HashSet<u64>,
    completed: usize,
}

fn to_rts(qp: &Qp, attr: &mut QpAttr, masks: [QpAttrMask; 3]) {
    for (state, mask) in [QpState::Init, QpState::Rtr, QpState::Rts]
        .into_iter()
        .zip(masks)
    {
        attr.qp_state = Some(state);
        qp.modify(attr, QpAttrMask::STATE | mask)
            .unwrap_or_else(|e| panic!("{state:?}: {e:?}"));
    }
}

impl Bed {
    fn new() -> Bed {
        use QpAttrMask as M;
        let mut config =
            DeviceConfig::new("fuzz", vec![IpAddr::V4(LOCAL_V4), IpAddr::V6(LOCAL_V6)]);
        config.eth_mtu = 1500;
        // As over a UDP socket: an IPv4 ICRC that differs is solved for the identification
        // and DF bits (`UnknownIpv4Fields`) before the datagram is dropped.
        config.ipv4_header_rebuilt = true;
        let dev = Device::new(config).expect("device");
        let pd = dev.alloc_pd().expect("pd");
        let cq = dev.create_cq(CQ_DEPTH).expect("cq");
        let rc = pd
            .create_qp(QpInitAttr::new(QpType::Rc, &cq, &cq))
            .expect("rc qp");
        let ud = pd
            .create_qp(QpInitAttr::new(QpType::Ud, &cq, &cq))
            .expect("ud qp");
        let gsi = pd
            .create_qp(QpInitAttr::new(QpType::Gsi, &cq, &cq))
            .expect("gsi qp");
        let access = Access::LOCAL_WRITE
            | Access::REMOTE_WRITE
            | Access::REMOTE_READ
            | Access::REMOTE_ATOMIC;
        let region = Arc::new(Region::zeroed(MR_LEN));
        let mr = pd.reg_mr(region.clone(), access).expect("mr");

        let mut a = QpAttr {
            qp_access_flags: Some(access),
            port_num: 1,
            av: AddressVector::new(IpAddr::V4(PEER_V4)),
            path_mtu: Some(rtgt_transport::verbs::Mtu::Mtu1024),
            dest_qp_num: PEER_QPN,
            rq_psn: RQ_PSN,
            sq_psn: SQ_PSN,
            max_dest_rd_atomic: 4,
            max_rd_atomic: 4,
            min_rnr_timer: 1,
            timeout: 8,
            retry_cnt: 3,
            rnr_retry: 3,
            ..Default::default()
        };
        to_rts(
            &rc,
            &mut a,
            [
                M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS,
                M::AV
                    | M::PATH_MTU
                    | M::DEST_QPN
                    | M::RQ_PSN
                    | M::MAX_DEST_RD_ATOMIC
                    | M::MIN_RNR_TIMER,
                M::SQ_PSN | M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::MAX_QP_RD_ATOMIC,
            ],
        );
        for (qp, qkey, init) in [
            (&ud, 0x1111_1111, M::PKEY_INDEX | M::PORT | M::QKEY),
            (&gsi, 0x8001_0000, M::PKEY_INDEX | M::QKEY),
        ] {
            let mut a = QpAttr {
                port_num: 1,
                qkey,
                ..Default::default()
            };
            to_rts(qp, &mut a, [init, M::empty(), M::SQ_PSN]);
        }

        let mut bed = Bed {
            dev,
            cq,
            rc,
            ud,
            gsi,
            mr,
            _region: region,
            outstanding: HashSet::new(),
            completed: 0,
        };
        // Receive buffers: wr_id = QP tag << 32 | index, each buffer its own slice of the MR.
        for i in 0..RC_RECVS {
            bed.post_recv(1, i);
        }
        for i in 0..UD_RECVS {
            bed.post_recv(2, i);
            bed.post_recv(3, i);
        }
        // Requests in flight, so that responses and ACKs have something to complete.
        let sge = |off: usize, len| bed.mr.sge(off, len);
        let rkey = 0x0bad_0000;
        let sends = [
            SendWr::new(0x4_0000_0001, SendOp::Send, vec![sge(0, 100)]),
            SendWr::new(
                0x4_0000_0002,
                SendOp::RdmaWrite {
                    remote_addr: 0x1000,
                    rkey,
                },
                vec![sge(4096, 3000)],
            ),
            SendWr::new(
                0x4_0000_0003,
                SendOp::RdmaRead {
                    remote_addr: 0x2000,
                    rkey,
                },
                vec![sge(8192, 2500)],
            ),
        ];
        for wr in sends {
            let id = wr.wr_id;
            if bed.rc.post_send(wr).is_ok() {
                bed.outstanding.insert(id);
            }
        }
        bed
    }

    fn post_recv(&mut self, tag: u64, i: u64) {
        let qp = match tag {
            1 => &self.rc,
            2 => &self.ud,
            _ => &self.gsi,
        };
        let slot = (tag - 1) * RC_RECVS + i;
        let off = (slot as usize * RECV_LEN as usize) % (MR_LEN - RECV_LEN as usize);
        let wr_id = tag << 32 | i;
        if qp
            .post_recv(RecvWr {
                wr_id,
                sg_list: self.mr.sge(off, RECV_LEN).into(),
            })
            .is_ok()
        {
            assert!(self.outstanding.insert(wr_id), "wr_id {wr_id:#x} reused");
        }
    }

    /// Runs timers and the send side, discards the output, and checks the completions.
    fn drive(&mut self, now: Duration) {
        self.dev.poll(now);
        let mut tx = Vec::new();
        self.dev.take_tx(&mut tx);
        assert!(tx.len() <= 4096, "{} datagrams queued", tx.len());
        for d in &tx {
            let d = Datagram::split(d).expect("the device emits well-formed datagrams");
            assert_eq!(d.computed_icrc(), d.wire_icrc(), "emitted ICRC");
        }
        assert!(self.cq.len() <= CQ_DEPTH as usize);
        let qpns = [self.rc.qpn(), self.ud.qpn(), self.gsi.qpn()];
        for wc in self.cq.poll(CQ_DEPTH as usize) {
            assert!(
                qpns.contains(&wc.qp_num),
                "completion for QP {:#x}",
                wc.qp_num
            );
            assert!(
                self.outstanding.remove(&wc.wr_id),
                "wr_id {:#x} completed twice or never posted: {wc:?}",
                wc.wr_id
            );
            self.completed += 1;
            let recv = matches!(wc.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm);
            if wc.status == WcStatus::Success {
                if recv {
                    assert!(wc.byte_len <= RECV_LEN + 40, "{wc:?}");
                }
            } else {
                assert_ne!(wc.status, WcStatus::GeneralErr, "{wc:?}");
            }
            // Keep the receive queues fed while the QP can use them.
            if recv && wc.status == WcStatus::Success && wc.wr_id >> 32 != 0 {
                let tag = wc.wr_id >> 32;
                let i = (wc.wr_id & 0xffff_ffff) + 1000 * (self.completed as u64);
                self.post_recv(tag, i);
            }
        }
        let stats = self.dev.stats();
        assert!(stats.rx_dropped <= stats.rx_packets);
        assert!(stats.rx_bad_icrc <= stats.rx_dropped);
        assert_eq!(self.dev.live_qps(), 3);
        for qp in [&self.rc, &self.ud, &self.gsi] {
            let (attr, cap) = qp.attr().expect("live QP");
            assert!(attr.rq_psn < 1 << 24 && attr.sq_psn < 1 << 24, "{attr:?}");
            assert!(cap.max_recv_wr >= 1);
        }
    }
}

/// Rewrites a datagram for the fuzz device (see [`transport_responder`]); `None` if it does not
/// split into IP, UDP and a RoCE packet.
fn readdress(bed: &Bed, ctrl: u8, bytes: &[u8]) -> Option<Vec<u8>> {
    let d = Datagram::split(bytes).ok()?;
    let mut ip = d.ip_repr().ok()?;
    match &mut ip {
        IpRepr::V4(r) => r.dst_addr = LOCAL_V4,
        IpRepr::V6(r) => r.dst_addr = LOCAL_V6,
    }
    let udp = d.udp_repr();
    let roce = d.roce;
    if roce.len() < 12 {
        return None;
    }
    let mut out = vec![0u8; bytes.len() + 64];
    let hl = datagram::emit_headers(&ip, udp.src_port, udp.dst_port, roce.len(), &mut out).ok()?;
    out.truncate(hl + roce.len());
    out[hl..].copy_from_slice(roce);
    let bth = &mut out[hl..];
    let opcode = bth[0];
    let qpn = match (ctrl >> 1) & 3 {
        0 => None,
        1 => Some(bed.rc.qpn()),
        2 => Some(bed.ud.qpn()),
        _ => Some(bed.gsi.qpn()),
    };
    if let Some(qpn) = qpn {
        bth[5..8].copy_from_slice(&qpn.to_be_bytes()[1..]);
    }
    if ctrl & 8 != 0 {
        let pick = usize::from(ctrl >> 6);
        // Responses carry the requester's PSNs, requests the responder's.
        let psn = if (0x0d..=0x12).contains(&opcode) {
            SQ_PSN + [0, 3, 4, 6][pick]
        } else {
            let expected = bed.rc.query().map_or(RQ_PSN, |q| q.4);
            expected.wrapping_add([0, 0, 0x00ff_ffff, 1][pick]) & 0x00ff_ffff
        };
        bth[9..12].copy_from_slice(&psn.to_be_bytes()[1..]);
    }
    // RETH (WRITE FIRST/ONLY, READ request) and AtomicETH start with VA and R_Key right after
    // the BTH of an RC packet.
    let has_va = matches!(opcode, 0x06 | 0x0a | 0x0b | 0x0c | 0x13 | 0x14);
    if ctrl & 16 != 0 && has_va && bth.len() >= 24 {
        let va = u64::from_be_bytes(bth[12..20].try_into().unwrap());
        let va = bed.mr.iova() + ((va % MR_LEN as u64) & !7);
        bth[12..20].copy_from_slice(&va.to_be_bytes());
        bth[20..24].copy_from_slice(&bed.mr.rkey().to_be_bytes());
    }
    icrc::generate(&mut out).ok()?;
    Some(out)
}

/// A device with an RC QP in RTS (connected to a peer that does not answer, a SEND, an RDMA
/// WRITE and an RDMA READ posted), a UD QP and the GSI QP, all with receive WQEs posted, and an
/// MR with remote read, write and atomic access, fed a sequence of IP datagrams; the clock
/// advances after each and the device's timers run to the end. Nothing may panic; every
/// completion belongs to a posted WR and comes once, successful receives fit their buffers,
/// the emitted datagrams split and carry a valid ICRC, and the QPs keep their PSNs in 24 bits.
///
/// Input: records of a control byte, a big-endian 16-bit length and that many bytes of an IP
/// datagram (IPv4 or IPv6, UDP, BTH through ICRC; the last record takes what is left). Control
/// bits: 0 re-addresses the datagram to the device and recomputes its ICRC, and only then do
/// the other bits apply: 1–2 set the destination QP (keep, RC, UD, GSI), 3 sets the PSN to the
/// one the RC QP expects plus 0, 0, −1 or +1 after
/// bits 6–7 (for a response: the PSN of the SEND, of the WRITE's last packet, of the READ's
/// first or last response after bits 6–7; the WRITE takes three packets, the READ three), 4 points a RETH or AtomicETH at the MR with its R_Key; bit 5 advances the clock by
/// 100 ms instead of 1 µs.
pub fn transport_responder(data: &[u8]) {
    let mut bed = Bed::new();
    let mut now = Duration::ZERO;
    let mut rest = data;
    for _ in 0..MAX_RECORDS {
        let [ctrl, h, l, tail @ ..] = rest else {
            break;
        };
        let len = usize::from(u16::from_be_bytes([*h, *l])).min(tail.len());
        let (bytes, next) = tail.split_at(len);
        rest = next;
        let fixed = if ctrl & 1 != 0 {
            readdress(&bed, *ctrl, bytes)
        } else {
            None
        };
        bed.dev.receive(fixed.as_deref().unwrap_or(bytes), now);
        now += if ctrl & 32 != 0 {
            Duration::from_millis(100)
        } else {
            Duration::from_micros(1)
        };
        bed.drive(now);
    }
    for _ in 0..DRAIN_ROUNDS {
        let Some(next) = bed.dev.next_deadline() else {
            break;
        };
        now = now.max(next);
        bed.drive(now);
    }
    bed.drive(now + Duration::from_secs(60));
}
