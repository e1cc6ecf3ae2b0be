//! Where the next packets' payloads go: for the QP that last received part of a long message,
//! the packets that continue it, with the registered memory their payloads are for, so a
//! link can receive them there in place instead of into a buffer of its own
//! ([`crate::netdev::NetDev::receive_into`]). Two streams are known in advance: the READ
//! responses a requester waits for (each lands at the next MTU of its READ's SGE list), and
//! the middle and last packets of an RDMA WRITE the responder is receiving (each at the next
//! MTU of the WRITE's target). Anything else, and any packet with a pad, is not predicted.

use std::net::IpAddr;

use crate::verbs::device::Engine;
use crate::verbs::mr::MrTable;
use crate::verbs::qp::{QpCtx, WqeState};
use crate::verbs::{Access, Expected, QpState, QpType, SendOp, Sge};
use crate::wire::bth::{psn_add, psn_diff};
use crate::wire::opcode::{Operation, Position};
use crate::wire::Opcode;

/// Packets predicted at once: one coalesced (GRO) datagram's worth of 1 KiB packets.
const MAX_EXPECTED: usize = 64;
/// Payload bytes predicted at once: a coalesced datagram carries at most 64 KiB.
const MAX_EXPECTED_BYTES: usize = 65536;
/// Work requests looked at for the oldest READ.
const SCAN: u32 = 64;

impl Engine {
    /// The packets expected next (see the module documentation), and the peer they come
    /// from; `None` when nothing is.
    pub(crate) fn expect(&mut self) -> Option<(IpAddr, &[Expected])> {
        let qpn = self.rx_hint?;
        let mut out = std::mem::take(&mut self.expected);
        out.clear();
        let peer = self.qps.get(&qpn).and_then(|qp| {
            if qp.qp_type != QpType::Rc {
                return None;
            }
            expect_read_responses(&self.mrs, qp, &mut out);
            if out.is_empty() {
                expect_write(qp, &mut out);
            }
            Some(qp.av.dest)
        });
        self.expected = out;
        match peer {
            Some(p) if !self.expected.is_empty() => Some((p, &self.expected)),
            _ => {
                // Nothing more of a long message: ask again once the next one arrives.
                self.rx_hint = None;
                None
            }
        }
    }

    /// Notes the QP of a received packet that belongs to a long message, whose next packets
    /// [`Engine::expect`] then predicts.
    pub(crate) fn note_received(&mut self, qpn: u32, opcode: Opcode) {
        let Some(info) = opcode.info() else {
            return;
        };
        let long = match info.operation {
            Operation::RdmaReadResponse => true,
            Operation::RdmaWrite => matches!(info.position, Position::First | Position::Middle),
            _ => false,
        };
        if long {
            self.rx_hint = Some(qpn);
        }
    }
}

/// The READ responses `qp` waits for: those of its oldest READ not fully placed, provided
/// nothing before it waits for a response of its own (an atomic) and its request went out.
fn expect_read_responses(mrs: &MrTable, qp: &QpCtx, out: &mut Vec<Expected>) {
    if !matches!(qp.state, QpState::Rts | QpState::Sqd) {
        return;
    }
    let mtu = qp.mtu.bytes();
    // Unacknowledged SENDs and WRITEs may come first (a READ response acknowledges them).
    let Some(wqe) = (0..qp.sq.len().min(SCAN))
        .filter_map(|k| qp.sq.get(qp.sq.head().wrapping_add(k)))
        .find(|w| w.wr.op.is_read_or_atomic())
    else {
        return;
    };
    if !matches!(wqe.wr.op, SendOp::RdmaRead { .. })
        || !matches!(wqe.state, WqeState::Processing | WqeState::Pending)
        || wqe.placed >= wqe.total_len
    {
        return;
    }
    let offset = wqe.placed;
    let psn = psn_add(wqe.first_psn, (offset / mtu) as u32);
    if psn_diff(psn, qp.comp.psn) < 0 {
        return;
    }
    // The packets whose payloads lie in the SGE the next one starts in (one lookup).
    let want = (wqe.total_len - offset).min(MAX_EXPECTED_BYTES);
    let Some((base, span)) = sge_span(mrs, qp.pd, &wqe.wr.sg_list, offset, want) else {
        return;
    };
    let opcode = |first, last| match (first, last) {
        (true, true) => Opcode::RcRdmaReadResponseOnly,
        (true, false) => Opcode::RcRdmaReadResponseFirst,
        (false, true) => Opcode::RcRdmaReadResponseLast,
        (false, false) => Opcode::RcRdmaReadResponseMiddle,
    };
    // SAFETY: `expect_packets` asks only for `at + len <= span`, and `base` is valid for
    // `span` bytes (`sge_span`).
    let dst = |at, _| Some(unsafe { base.add(at) });
    let msg = Message {
        qpn: qp.qpn,
        mtu,
        psn,
        offset,
        total: wqe.total_len,
    };
    expect_packets(out, msg, span, opcode, dst);
}

/// The rest of the RDMA WRITE `qp`'s responder is receiving (its middle packets and a last
/// one without immediate data).
fn expect_write(qp: &QpCtx, out: &mut Vec<Expected>) {
    if !matches!(
        qp.state,
        QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe
    ) {
        return;
    }
    let in_write = qp.resp.last_op.and_then(Opcode::info).is_some_and(|i| {
        i.operation == Operation::RdmaWrite
            && matches!(i.position, Position::First | Position::Middle)
    });
    let Some((region, off, resid)) = qp.resp.write.as_ref().map(|(r, o, n)| (r, *o, *n)) else {
        return;
    };
    if !in_write {
        return;
    }
    let msg = Message {
        qpn: qp.qpn,
        mtu: qp.mtu.bytes(),
        psn: qp.resp.psn,
        offset: 0,
        total: resid,
    };
    let opcode = |_, last| {
        if last {
            Opcode::RcRdmaWriteLast
        } else {
            Opcode::RcRdmaWriteMiddle
        }
    };
    expect_packets(out, msg, MAX_EXPECTED_BYTES, opcode, |at, len| {
        region.place(off + at, len)
    });
}

/// The rest of a message as packets: from byte `offset` of its `total` bytes, the next
/// packet's PSN `psn`.
struct Message {
    qpn: u32,
    mtu: usize,
    psn: u32,
    offset: usize,
    total: usize,
}

/// Predicts the packets of the rest of `msg`, one MTU each, while their payloads stay within
/// `limit` bytes from `msg.offset` and `dst(at, len)` gives each (`at` bytes from
/// `msg.offset`) its place; stops at a packet with a pad. `opcode(first, last)` names each.
fn expect_packets(
    out: &mut Vec<Expected>,
    msg: Message,
    limit: usize,
    opcode: impl Fn(bool, bool) -> Opcode,
    mut dst: impl FnMut(usize, usize) -> Option<std::ptr::NonNull<u8>>,
) {
    let (mut offset, mut psn, mut at) = (msg.offset, msg.psn, 0);
    while offset < msg.total && out.len() < MAX_EXPECTED {
        let len = msg.mtu.min(msg.total - offset);
        if at + len > limit || !len.is_multiple_of(4) {
            return;
        }
        let Some(place) = dst(at, len) else {
            return;
        };
        let op = opcode(offset == 0, offset + len == msg.total);
        out.push(expected(op, msg.qpn, psn, place, len));
        at += len;
        offset += len;
        psn = psn_add(psn, 1);
    }
}

fn expected(
    opcode: Opcode,
    qpn: u32,
    psn: u32,
    dst: std::ptr::NonNull<u8>,
    len: usize,
) -> Expected {
    Expected {
        opcode: u8::from(opcode),
        qpn,
        psn,
        header_len: opcode.info().map_or(0, |i| i.header_len()),
        dst,
        len,
    }
}

/// Where the bytes at `offset` into an SGE list go, for up to `want` bytes within the one
/// SGE they start in, if the list may write them: the address and how many bytes.
fn sge_span(
    mrs: &MrTable,
    pd: u32,
    sges: &[Sge],
    offset: usize,
    want: usize,
) -> Option<(std::ptr::NonNull<u8>, usize)> {
    let piece = super::sge_pieces(sges, offset, want).next()?;
    let (region, at) = super::lookup_piece(mrs, pd, piece, Access::LOCAL_WRITE).ok()?;
    Some((region.place(at, piece.2)?, piece.2))
}
