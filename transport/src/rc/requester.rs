//! The requester (rxe_req.c): turns send WQEs into request packets. Segmentation at the path
//! MTU (FIRST/MIDDLE exactly MTU, LAST 1..MTU, ONLY ≤ MTU), PSN assignment with 24-bit wrap,
//! AckReq on the last packet of each message and every [`super::MAX_PKT_PER_ACK`] packets,
//! READs consuming ceil(len/MTU) PSNs, the max_rd_atomic and unacked-PSN window
//! ([`super::window`]) limits, fences,
//! and the local operations (fast-register, local invalidate) executed in queue order.

use std::time::Duration;

use super::{ack_timeout, emit, gather, MAX_PKT_PER_ACK};
use crate::verbs::device::Engine;
use crate::verbs::qp::{QpCtx, WqeState};
use crate::verbs::{QpState, QpType, SendFlags, SendOp, WcStatus, GSI_QKEY};
use crate::wire::bth::{psn_add, psn_diff, DEFAULT_PKEY};
use crate::wire::{
    AtomicEthRepr, BthRepr, DethRepr, IethRepr, ImmDtRepr, Opcode, RethRepr, RoceRepr,
};

/// Requester states; each function returns the next one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReqState {
    /// Find the WQE to work on.
    GetWqe,
    /// Execute a local operation at this SQ index.
    Local(u32),
    /// Check fence, rd_atomic, window and transmit-queue limits.
    CheckLimits(u32),
    /// Build and queue the next packet of this WQE.
    SendPacket(u32),
    /// Nothing more to do now.
    Exit,
}

/// Runs the requester until it blocks or `budget` packets were sent.
pub(crate) fn run(eng: &mut Engine, qp: &mut QpCtx, now: Duration, mut budget: usize) {
    let mut state = ReqState::GetWqe;
    loop {
        state = match state {
            ReqState::GetWqe => get_wqe(qp),
            ReqState::Local(i) => local(eng, qp, i),
            ReqState::CheckLimits(i) => check_limits(eng, qp, i, budget),
            ReqState::SendPacket(i) => {
                budget = budget.saturating_sub(1);
                send_packet(eng, qp, i, now)
            }
            ReqState::Exit => return,
        };
    }
}

fn get_wqe(qp: &mut QpCtx) -> ReqState {
    if qp.req.rnr_deadline.is_some() {
        return ReqState::Exit;
    }
    let idx = qp.req.wqe_index;
    let Some(wqe) = qp.sq.get(idx) else {
        return ReqState::Exit;
    };
    match qp.state {
        QpState::Rts => {}
        // SQD: finish the message in progress, start nothing new (IBA 10.3.1.5).
        QpState::Sqd if wqe.state == WqeState::Processing => {}
        _ => return ReqState::Exit,
    }
    if matches!(wqe.state, WqeState::Done(_)) {
        qp.req.wqe_index = idx.wrapping_add(1);
        return ReqState::GetWqe;
    }
    if wqe.wr.op.is_local() {
        ReqState::Local(idx)
    } else {
        ReqState::CheckLimits(idx)
    }
}

fn local(eng: &mut Engine, qp: &mut QpCtx, idx: u32) -> ReqState {
    let Some(wqe) = qp.sq.get_mut(idx) else {
        return ReqState::Exit;
    };
    let result = match &wqe.wr.op {
        SendOp::FastReg(fr) => eng.mrs.fast_reg(qp.pd, fr),
        SendOp::LocalInv { key } => eng.mrs.invalidate(qp.pd, *key),
        _ => Ok(()),
    };
    wqe.state = WqeState::Done(if result.is_ok() {
        WcStatus::Success
    } else {
        WcStatus::LocQpOpErr
    });
    qp.req.wqe_index = idx.wrapping_add(1);
    ReqState::GetWqe
}

fn check_limits(eng: &Engine, qp: &QpCtx, idx: u32, budget: usize) -> ReqState {
    if budget == 0 || !eng.tx.has_room() {
        return ReqState::Exit;
    }
    let Some(wqe) = qp.sq.get(idx) else {
        return ReqState::Exit;
    };
    if qp.qp_type != QpType::Rc {
        return ReqState::SendPacket(idx);
    }
    if wqe.state == WqeState::Posted {
        if wqe.wr.flags.contains(SendFlags::FENCE) && qp.req.rd_atomic_inflight > 0 {
            return ReqState::Exit;
        }
        if wqe.wr.op.is_read_or_atomic()
            && qp.req.rd_atomic_inflight >= u32::from(qp.max_rd_atomic.max(1))
        {
            return ReqState::Exit;
        }
    }
    if psn_diff(qp.req.psn, qp.comp.psn) >= qp.req.window as i32 {
        return ReqState::Exit;
    }
    ReqState::SendPacket(idx)
}

fn bth(opcode: Opcode, dest_qp: u32, psn: u32) -> BthRepr {
    BthRepr {
        opcode,
        solicited: false,
        mig_req: false,
        pad_count: 0,
        pkey: DEFAULT_PKEY,
        fecn: false,
        becn: false,
        dest_qp,
        ack_req: false,
        psn,
    }
}

/// Number of PSNs a message of `len` bytes uses at `mtu` (at least one).
pub fn psns_for(len: usize, mtu: usize) -> u32 {
    len.div_ceil(mtu).max(1) as u32
}

fn send_packet(eng: &mut Engine, qp: &mut QpCtx, idx: u32, now: Duration) -> ReqState {
    if qp.qp_type != QpType::Rc {
        return send_ud(eng, qp, idx);
    }
    let mtu = qp.mtu.bytes();
    let dest = qp.dest_qpn;
    let (av, sport, pd) = (qp.av, qp.sport, qp.pd);
    // After a rewind, responses that were already in flight may have completed the WQEs in
    // front of this one: never reuse PSNs below the completer's.
    let req_psn = if psn_diff(qp.req.psn, qp.comp.psn) < 0 {
        qp.comp.psn
    } else {
        qp.req.psn
    };
    let Some(wqe) = qp.sq.get_mut(idx) else {
        return ReqState::Exit;
    };
    if wqe.state == WqeState::Posted {
        wqe.first_psn = req_psn;
        wqe.last_psn = psn_add(req_psn, psns_for(wqe.total_len, mtu) - 1);
        if wqe.wr.op.is_atomic() {
            wqe.last_psn = req_psn;
        }
        wqe.offset = 0;
        wqe.next_psn = req_psn;
        wqe.placed = 0;
        wqe.state = WqeState::Processing;
    }
    let total = wqe.total_len;
    let offset = wqe.offset;
    let psn = wqe.next_psn;
    let mut repr = RoceRepr::new(bth(Opcode::RcSendOnly, dest, psn));
    let (sent_len, done, next_psn) = match wqe.wr.op.clone() {
        SendOp::RdmaRead { remote_addr, rkey } => {
            repr.bth.opcode = Opcode::RcRdmaReadRequest;
            repr.bth.ack_req = true;
            repr.reth = Some(RethRepr {
                va: remote_addr.wrapping_add(offset as u64),
                rkey,
                dma_len: (total - offset) as u32,
            });
            qp.req.rd_atomic_inflight += 1;
            (0, true, psn_add(wqe.last_psn, 1))
        }
        SendOp::CompareSwap {
            remote_addr,
            rkey,
            compare,
            swap,
        } => {
            repr.bth.opcode = Opcode::RcCompareSwap;
            repr.bth.ack_req = true;
            repr.atomic_eth = Some(AtomicEthRepr {
                va: remote_addr,
                rkey,
                swap_add: swap,
                compare,
            });
            qp.req.rd_atomic_inflight += 1;
            (0, true, psn_add(psn, 1))
        }
        SendOp::FetchAdd {
            remote_addr,
            rkey,
            add,
        } => {
            repr.bth.opcode = Opcode::RcFetchAdd;
            repr.bth.ack_req = true;
            repr.atomic_eth = Some(AtomicEthRepr {
                va: remote_addr,
                rkey,
                swap_add: add,
                compare: 0,
            });
            qp.req.rd_atomic_inflight += 1;
            (0, true, psn_add(psn, 1))
        }
        op => {
            let remaining = total - offset;
            let len = remaining.min(mtu);
            let first = offset == 0;
            let last = remaining <= mtu;
            let write = matches!(
                op,
                SendOp::RdmaWrite { .. } | SendOp::RdmaWriteWithImm { .. }
            );
            use Opcode::*;
            repr.bth.opcode = match (&op, first, last) {
                (SendOp::Send, true, true) => RcSendOnly,
                (SendOp::SendWithImm(_), true, true) => RcSendOnlyWithImmediate,
                (SendOp::SendWithInv(_), true, true) => RcSendOnlyWithInvalidate,
                (SendOp::Send, false, true) => RcSendLast,
                (SendOp::SendWithImm(_), false, true) => RcSendLastWithImmediate,
                (SendOp::SendWithInv(_), false, true) => RcSendLastWithInvalidate,
                (SendOp::RdmaWrite { .. }, true, true) => RcRdmaWriteOnly,
                (SendOp::RdmaWriteWithImm { .. }, true, true) => RcRdmaWriteOnlyWithImmediate,
                (SendOp::RdmaWrite { .. }, false, true) => RcRdmaWriteLast,
                (SendOp::RdmaWriteWithImm { .. }, false, true) => RcRdmaWriteLastWithImmediate,
                (_, true, false) if write => RcRdmaWriteFirst,
                (_, false, false) if write => RcRdmaWriteMiddle,
                (_, true, false) => RcSendFirst,
                _ => RcSendMiddle,
            };
            if first && write {
                let (remote_addr, rkey) = match op {
                    SendOp::RdmaWrite { remote_addr, rkey }
                    | SendOp::RdmaWriteWithImm {
                        remote_addr, rkey, ..
                    } => (remote_addr, rkey),
                    _ => (0, 0),
                };
                repr.reth = Some(RethRepr {
                    va: remote_addr,
                    rkey,
                    dma_len: total as u32,
                });
            }
            if last {
                match op {
                    SendOp::SendWithImm(imm) | SendOp::RdmaWriteWithImm { imm, .. } => {
                        repr.immdt = Some(ImmDtRepr { imm })
                    }
                    SendOp::SendWithInv(rkey) => repr.ieth = Some(IethRepr { rkey }),
                    _ => {}
                }
                repr.bth.solicited = wqe.wr.flags.contains(SendFlags::SOLICITED);
            }
            qp.req.noack_pkts += 1;
            repr.bth.ack_req = last || qp.req.noack_pkts >= MAX_PKT_PER_ACK;
            repr.payload_len = len;
            (len, last, psn_add(psn, 1))
        }
    };
    if repr.bth.ack_req {
        qp.req.noack_pkts = 0;
    }
    let inline = wqe.wr.flags.contains(SendFlags::INLINE);
    repr.payload_len = sent_len;
    let mut fill_status = WcStatus::Success;
    let Engine { gids, tx, mrs, .. } = eng;
    // Data in one SGE goes out straight from its region; the rest is gathered.
    let from = match (inline || sent_len == 0, &wqe.wr.sg_list) {
        (false, sges) => super::single_region(mrs, pd, sges, offset, sent_len),
        _ => None,
    };
    let sent = match from {
        Some(Ok((region, at))) => super::emit_from_region(gids, tx, &av, sport, &repr, &region, at),
        Some(Err(_)) => {
            fill_status = WcStatus::LocProtErr;
            false
        }
        None => super::emit_to(gids, tx, &av, sport, &repr, |out| {
            let ok = if out.is_empty() {
                true
            } else if inline {
                match wqe.wr.inline_data.get(offset..offset + out.len()) {
                    Some(src) => {
                        out.copy_from_slice(src);
                        true
                    }
                    None => false,
                }
            } else {
                gather(mrs, pd, &wqe.wr.sg_list, offset, out).is_ok()
            };
            if !ok {
                fill_status = WcStatus::LocProtErr;
            }
            ok
        }),
    };
    if !sent {
        if fill_status == WcStatus::Success {
            fill_status = WcStatus::LocQpOpErr;
        }
        wqe.state = WqeState::Done(fill_status);
        qp.req.wqe_index = idx.wrapping_add(1);
        return ReqState::Exit;
    }
    wqe.offset = offset + sent_len;
    wqe.next_psn = next_psn;
    qp.req.psn = next_psn;
    if done {
        wqe.state = WqeState::Pending;
        qp.req.wqe_index = idx.wrapping_add(1);
    }
    if qp.comp.deadline.is_none() {
        qp.comp.deadline = ack_timeout(qp.timeout).map(|t| now + t);
    }
    ReqState::GetWqe
}

fn send_ud(eng: &mut Engine, qp: &mut QpCtx, idx: u32) -> ReqState {
    let (pd, qpn, sport, own_qkey, gsi) =
        (qp.pd, qp.qpn, qp.sport, qp.qkey, qp.qp_type == QpType::Gsi);
    let psn = qp.req.psn;
    let Some(wqe) = qp.sq.get_mut(idx) else {
        return ReqState::Exit;
    };
    let Some(dest) = wqe.wr.ud.clone() else {
        wqe.state = WqeState::Done(WcStatus::LocQpOpErr);
        qp.req.wqe_index = idx.wrapping_add(1);
        return ReqState::GetWqe;
    };
    let mut payload = vec![0u8; wqe.total_len];
    let ok = if wqe.wr.flags.contains(SendFlags::INLINE) {
        payload.copy_from_slice(&wqe.wr.inline_data);
        true
    } else {
        gather(&eng.mrs, pd, &wqe.wr.sg_list, 0, &mut payload).is_ok()
    };
    let mut status = WcStatus::Success;
    if ok {
        let opcode = match wqe.wr.op {
            SendOp::SendWithImm(_) => Opcode::UdSendOnlyWithImmediate,
            _ => Opcode::UdSendOnly,
        };
        let mut repr = RoceRepr::new(bth(opcode, dest.remote_qpn, psn));
        repr.bth.solicited = wqe.wr.flags.contains(SendFlags::SOLICITED);
        // IBA 10.2.5: a WR Q_Key with the high bit set means "use the QP's Q_Key".
        let qkey = if gsi {
            GSI_QKEY
        } else if dest.remote_qkey & 0x8000_0000 != 0 {
            own_qkey
        } else {
            dest.remote_qkey
        };
        repr.deth = Some(DethRepr { qkey, src_qp: qpn });
        if let SendOp::SendWithImm(imm) = wqe.wr.op {
            repr.immdt = Some(ImmDtRepr { imm });
        }
        repr.payload_len = payload.len();
        if !emit(eng, &dest.ah.av, sport, &repr, |out| {
            out.copy_from_slice(&payload);
            true
        }) {
            status = WcStatus::LocQpOpErr;
        }
    } else {
        status = WcStatus::LocProtErr;
    }
    wqe.state = WqeState::Done(status);
    qp.req.psn = psn_add(psn, 1);
    qp.req.wqe_index = idx.wrapping_add(1);
    ReqState::GetWqe
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn psn_counts() {
        assert_eq!(psns_for(0, 256), 1);
        assert_eq!(psns_for(256, 256), 1);
        assert_eq!(psns_for(257, 256), 2);
        assert_eq!(psns_for(8 << 20, 4096), 2048);
    }
}
