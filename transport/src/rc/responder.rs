//! The responder (rxe_resp.c): check PSN → check opcode sequence → check operation valid →
//! check resources → check length → check R_Key → execute → complete → acknowledge, with the
//! duplicate path (ACK again, replay READ responses from the saved responder resources,
//! resend atomic results) and the error paths (NAK 0x60 once per gap; NAK 0x61–0x63 with the
//! QP to error; RNR NAK when no receive WQE is posted).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use super::{emit, scatter, ScatterError};
use crate::verbs::device::Engine;
use crate::verbs::mem::Region;
use crate::verbs::mr::KeyKind;
use crate::verbs::qp::{QpCtx, ReadCursor, RecvInProgress, Resource};
use crate::verbs::{Access, QpState, WcFlags, WcOpcode, WcStatus, WorkCompletion};
use crate::wire::aeth::{NakCode, Syndrome};
use crate::wire::bth::{psn_add, psn_diff, DEFAULT_PKEY};
use crate::wire::opcode::{OpFlags, Operation, Position};
use crate::wire::{AethRepr, AtomicAckEthRepr, BthRepr, Opcode, OpcodeInfo, RocePacket, RoceRepr};

use super::requester::psns_for;

/// Responder states; each function returns the next one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RespState {
    CheckPsn,
    CheckOpSeq,
    CheckOpValid,
    CheckResource,
    CheckLength,
    CheckRkey,
    Execute,
    Complete,
    Acknowledge,
    Duplicate,
    /// Receiver not ready: no receive WQE.
    RnrNak,
    /// Send a NAK; codes other than PSN sequence error move the QP to error, completing the
    /// receive WQE in use (if any) with the status.
    Nak(NakCode, WcStatus),
    Done,
}

struct Req<'a> {
    opcode: Opcode,
    info: &'static OpcodeInfo,
    psn: u32,
    ack_req: bool,
    solicited: bool,
    payload: &'a [u8],
    reth: Option<(u64, u32, u32)>,
    atomic: Option<(u64, u32, u64, u64)>,
    imm: Option<u32>,
    inv: Option<u32>,
    /// Resolved by CheckRkey for READ and atomics.
    target: Option<(Arc<Region>, usize)>,
}

/// Handles one request packet.
pub(crate) fn on_request(
    eng: &mut Engine,
    qp: &mut QpCtx,
    pkt: &RocePacket<&[u8]>,
    payload: &[u8],
    _now: Duration,
) {
    let Some(info) = pkt.opcode_info() else {
        return;
    };
    // Requests are served in order: finish a READ response stream before the next request,
    // so ACKs never overtake READ data (bounded by the 8 MiB message limit).
    if qp.resp.read.is_some() {
        read_responses(eng, qp, usize::MAX, true);
    }
    let bth = pkt.bth();
    let mut r = Req {
        opcode: pkt.opcode(),
        info,
        psn: bth.psn(),
        ack_req: bth.ack_req(),
        solicited: bth.solicited(),
        payload,
        reth: pkt.reth().map(|h| (h.va(), h.rkey(), h.dma_len())),
        atomic: pkt
            .atomic_eth()
            .map(|h| (h.va(), h.rkey(), h.swap_add(), h.compare())),
        imm: pkt.immdt().map(|h| h.imm()),
        inv: pkt.ieth().map(|h| h.rkey()),
        target: None,
    };
    let mut state = RespState::CheckPsn;
    loop {
        state = match state {
            RespState::CheckPsn => check_psn(eng, qp, &r),
            RespState::CheckOpSeq => check_op_seq(qp, &r),
            RespState::CheckOpValid => check_op_valid(qp, &r),
            RespState::CheckResource => check_resource(eng, qp, &r),
            RespState::CheckLength => check_length(qp, &r),
            RespState::CheckRkey => check_rkey(eng, qp, &mut r),
            RespState::Execute => execute(eng, qp, &mut r),
            RespState::Complete => complete(eng, qp, &r),
            RespState::Acknowledge => {
                if r.ack_req {
                    defer_ack(eng, qp, r.psn);
                }
                RespState::Done
            }
            RespState::Duplicate => duplicate(eng, qp, &r),
            RespState::RnrNak => {
                eng.stats.rnr_naks_sent += 1;
                let timer = qp.min_rnr_timer;
                send_ack(eng, qp, Syndrome::RnrNak { timer }, r.psn);
                RespState::Done
            }
            RespState::Nak(code, status) => {
                eng.stats.naks_sent += 1;
                send_ack(eng, qp, Syndrome::Nak(code), r.psn);
                if code != NakCode::PsnSequenceError {
                    if let Some(rip) = qp.resp.recv.take() {
                        let wc = WorkCompletion::new(rip.wqe.wr_id, status, WcOpcode::Recv, qp.qpn);
                        qp.recv_cq.push(wc, false);
                    }
                    qp.enter_error();
                    eng.events
                        .push(crate::verbs::AsyncEvent::QpFatal { qpn: qp.qpn });
                }
                RespState::Done
            }
            RespState::Done => return,
        };
    }
}

fn check_psn(eng: &mut Engine, qp: &mut QpCtx, r: &Req<'_>) -> RespState {
    let d = psn_diff(r.psn, qp.resp.psn);
    if d > 0 {
        if !qp.resp.sent_psn_nak {
            qp.resp.sent_psn_nak = true;
            eng.stats.naks_sent += 1;
            let expected = qp.resp.psn;
            send_ack(eng, qp, Syndrome::Nak(NakCode::PsnSequenceError), expected);
        }
        return RespState::Done;
    }
    if d < 0 {
        return RespState::Duplicate;
    }
    qp.resp.sent_psn_nak = false;
    RespState::CheckOpSeq
}

fn in_progress(last: Option<Opcode>) -> Option<Operation> {
    let info = last?.info()?;
    match info.position {
        Position::First | Position::Middle => Some(info.operation),
        _ => None,
    }
}

fn check_op_seq(qp: &QpCtx, r: &Req<'_>) -> RespState {
    let ok = match in_progress(qp.resp.last_op) {
        Some(op) => {
            r.info.operation == op && matches!(r.info.position, Position::Middle | Position::Last)
        }
        None => r.info.position.is_start(),
    };
    if ok {
        RespState::CheckOpValid
    } else {
        RespState::Nak(NakCode::InvalidRequest, WcStatus::RemInvReqErr)
    }
}

fn check_op_valid(qp: &QpCtx, r: &Req<'_>) -> RespState {
    let ok = match r.info.operation {
        Operation::Send => true,
        Operation::RdmaWrite => qp.access.contains(Access::REMOTE_WRITE),
        Operation::RdmaReadRequest => {
            qp.access.contains(Access::REMOTE_READ) && qp.max_dest_rd_atomic > 0
        }
        Operation::CompareSwap | Operation::FetchAdd => {
            qp.access.contains(Access::REMOTE_ATOMIC) && qp.max_dest_rd_atomic > 0
        }
        _ => false,
    };
    if ok {
        RespState::CheckResource
    } else {
        RespState::Nak(NakCode::InvalidRequest, WcStatus::RemInvReqErr)
    }
}

fn check_resource(eng: &mut Engine, qp: &mut QpCtx, r: &Req<'_>) -> RespState {
    if r.info.flags.contains(OpFlags::CONSUMES_RECV_WQE) && qp.resp.recv.is_none() {
        let wqe = match qp.srq {
            Some(id) => eng.srqs.get_mut(&id).and_then(|s| s.take(id, &eng.events)),
            None => qp.rq.pop(),
        };
        match wqe {
            Some(wqe) => qp.resp.recv = Some(RecvInProgress { wqe, written: 0 }),
            None => return RespState::RnrNak,
        }
    }
    if r.info.operation == Operation::Send && qp.resp.recv.is_none() {
        return RespState::Nak(NakCode::InvalidRequest, WcStatus::RemInvReqErr);
    }
    RespState::CheckLength
}

fn check_length(qp: &QpCtx, r: &Req<'_>) -> RespState {
    let mtu = qp.mtu.bytes();
    let len = r.payload.len();
    let bad = RespState::Nak(NakCode::InvalidRequest, WcStatus::RemInvReqErr);
    if r.info.has_payload() {
        let ok = match r.info.position {
            Position::Only => len <= mtu,
            Position::First | Position::Middle => len == mtu,
            Position::Last => (1..=mtu).contains(&len),
        };
        if !ok {
            return bad;
        }
    }
    if r.info.operation == Operation::RdmaWrite && r.info.position.is_start() {
        let Some((_, _, dma_len)) = r.reth else {
            return bad;
        };
        let dma_len = dma_len as usize;
        let ok = match r.info.position {
            Position::Only => len == dma_len,
            _ => dma_len > len,
        };
        if !ok {
            return bad;
        }
    }
    if r.info.operation == Operation::RdmaReadRequest
        && r.reth.is_none_or(|(_, _, l)| l > 0x80_0000)
    {
        return bad;
    }
    RespState::CheckRkey
}

fn check_rkey(eng: &mut Engine, qp: &mut QpCtx, r: &mut Req<'_>) -> RespState {
    let access_err = RespState::Nak(NakCode::RemoteAccessError, WcStatus::RemAccessErr);
    let inv = RespState::Nak(NakCode::InvalidRequest, WcStatus::RemInvReqErr);
    match r.info.operation {
        Operation::RdmaWrite if r.info.position.is_start() => {
            let Some((va, rkey, len)) = r.reth else {
                return inv;
            };
            if len == 0 {
                qp.resp.write = None;
                return RespState::Execute;
            }
            match eng.mrs.lookup(
                qp.pd,
                rkey,
                KeyKind::Remote,
                Access::REMOTE_WRITE,
                va,
                len as usize,
            ) {
                Ok((region, off)) => qp.resp.write = Some((region, off, len as usize)),
                Err(_) => return access_err,
            }
        }
        Operation::RdmaWrite => {
            // Middle and last packets continue the write the first packet validated.
            let resid = qp.resp.write.as_ref().map_or(0, |w| w.2);
            let ok = match r.info.position {
                Position::Middle => resid > r.payload.len(),
                _ => resid == r.payload.len(),
            };
            if !ok {
                return inv;
            }
        }
        Operation::RdmaReadRequest => {
            let Some((va, rkey, len)) = r.reth else {
                return inv;
            };
            if len > 0 {
                match eng.mrs.lookup(
                    qp.pd,
                    rkey,
                    KeyKind::Remote,
                    Access::REMOTE_READ,
                    va,
                    len as usize,
                ) {
                    Ok(t) => r.target = Some(t),
                    Err(_) => return access_err,
                }
            }
        }
        Operation::CompareSwap | Operation::FetchAdd => {
            let Some((va, rkey, _, _)) = r.atomic else {
                return inv;
            };
            if va % 8 != 0 {
                return inv;
            }
            match eng
                .mrs
                .lookup(qp.pd, rkey, KeyKind::Remote, Access::REMOTE_ATOMIC, va, 8)
            {
                Ok((region, off)) if region.atomic_u64(off).is_some() => {
                    r.target = Some((region, off))
                }
                Ok(_) => return inv,
                Err(_) => return access_err,
            }
        }
        _ => {}
    }
    RespState::Execute
}

fn execute(eng: &mut Engine, qp: &mut QpCtx, r: &mut Req<'_>) -> RespState {
    match r.info.operation {
        Operation::Send => {
            let Some(rip) = qp.resp.recv.as_mut() else {
                return RespState::Nak(NakCode::InvalidRequest, WcStatus::RemInvReqErr);
            };
            match scatter(&eng.mrs, qp.pd, &rip.wqe.sg_list, rip.written, r.payload) {
                Ok(()) => rip.written += r.payload.len(),
                Err(ScatterError::Length) => {
                    return RespState::Nak(NakCode::InvalidRequest, WcStatus::LocLenErr)
                }
                Err(ScatterError::Protection) => {
                    return RespState::Nak(NakCode::RemoteOperationalError, WcStatus::LocProtErr)
                }
            }
            if let Some(rkey) = r.inv {
                if eng.mrs.invalidate(qp.pd, rkey).is_err() {
                    return RespState::Nak(NakCode::InvalidRequest, WcStatus::RemInvReqErr);
                }
            }
            RespState::Complete
        }
        Operation::RdmaWrite => {
            if let Some((region, off, resid)) = qp.resp.write.as_mut() {
                if !region.write(*off, r.payload) {
                    return RespState::Nak(NakCode::RemoteAccessError, WcStatus::RemAccessErr);
                }
                *off += r.payload.len();
                *resid -= r.payload.len().min(*resid);
            }
            RespState::Complete
        }
        Operation::RdmaReadRequest => {
            let (va, rkey, len) = r.reth.unwrap_or_default();
            let npsn = psns_for(len as usize, qp.mtu.bytes());
            if qp.resp.resources.len() >= usize::from(qp.max_dest_rd_atomic.max(1)) {
                qp.resp.resources.pop_front();
            }
            qp.resp.resources.push_back(Resource::Read {
                first_psn: r.psn,
                last_psn: psn_add(r.psn, npsn - 1),
                va,
                rkey,
                len,
            });
            let (region, offset) = r
                .target
                .take()
                .unwrap_or_else(|| (Arc::new(Region::zeroed(0)), 0));
            qp.resp.read = Some(ReadCursor {
                region,
                offset,
                remaining: len as usize,
                psn: r.psn,
                first: true,
            });
            qp.resp.psn = psn_add(r.psn, npsn);
            qp.resp.msn = psn_add(qp.resp.msn, 1);
            qp.resp.last_op = Some(r.opcode);
            read_responses(eng, qp, super::POLL_BUDGET, false);
            RespState::Done
        }
        Operation::CompareSwap | Operation::FetchAdd => {
            let Some((region, off)) = r.target.take() else {
                return RespState::Nak(NakCode::InvalidRequest, WcStatus::RemInvReqErr);
            };
            let Some(cell) = region.atomic_u64(off) else {
                return RespState::Nak(NakCode::InvalidRequest, WcStatus::RemInvReqErr);
            };
            let (_, _, swap_add, compare) = r.atomic.unwrap_or_default();
            let orig = if r.info.operation == Operation::CompareSwap {
                match cell.compare_exchange(compare, swap_add, Ordering::AcqRel, Ordering::Acquire)
                {
                    Ok(v) | Err(v) => v,
                }
            } else {
                cell.fetch_add(swap_add, Ordering::AcqRel)
            };
            if qp.resp.resources.len() >= usize::from(qp.max_dest_rd_atomic.max(1)) {
                qp.resp.resources.pop_front();
            }
            qp.resp
                .resources
                .push_back(Resource::Atomic { psn: r.psn, orig });
            qp.resp.psn = psn_add(r.psn, 1);
            qp.resp.msn = psn_add(qp.resp.msn, 1);
            qp.resp.last_op = Some(r.opcode);
            send_atomic_ack(eng, qp, r.psn, orig);
            RespState::Done
        }
        _ => RespState::Done,
    }
}

fn complete(_eng: &mut Engine, qp: &mut QpCtx, r: &Req<'_>) -> RespState {
    qp.resp.psn = psn_add(r.psn, 1);
    qp.resp.last_op = Some(r.opcode);
    if r.info.position.is_end() {
        if r.info.flags.contains(OpFlags::COMPLETES) {
            if let Some(rip) = qp.resp.recv.take() {
                let write = r.info.operation == Operation::RdmaWrite;
                let mut wc = WorkCompletion::new(
                    rip.wqe.wr_id,
                    WcStatus::Success,
                    if write {
                        WcOpcode::RecvRdmaWithImm
                    } else {
                        WcOpcode::Recv
                    },
                    qp.qpn,
                );
                wc.byte_len = if write { 0 } else { rip.written as u32 };
                if let Some(imm) = r.imm {
                    wc.flags |= WcFlags::WITH_IMM;
                    wc.imm_or_inv = imm;
                }
                if let Some(rkey) = r.inv {
                    wc.flags |= WcFlags::WITH_INVALIDATE;
                    wc.imm_or_inv = rkey;
                }
                wc.src_qp = qp.dest_qpn;
                qp.recv_cq.push(wc, r.solicited);
            }
        }
        qp.resp.write = None;
        qp.resp.msn = psn_add(qp.resp.msn, 1);
    }
    RespState::Acknowledge
}

fn duplicate(eng: &mut Engine, qp: &mut QpCtx, r: &Req<'_>) -> RespState {
    match r.info.operation {
        Operation::Send | Operation::RdmaWrite => {
            let prev = psn_add(qp.resp.psn, crate::wire::U24_MASK);
            defer_ack(eng, qp, prev);
        }
        Operation::RdmaReadRequest => {
            let Some((va, rkey, len)) = r.reth else {
                return RespState::Done;
            };
            let found = qp.resp.resources.iter().any(|res| match *res {
                Resource::Read {
                    first_psn,
                    last_psn,
                    va: rva,
                    rkey: rrkey,
                    len: rlen,
                } => {
                    let end = va.checked_add(u64::from(len));
                    let rend = rva.checked_add(u64::from(rlen));
                    psn_diff(r.psn, first_psn) >= 0
                        && psn_diff(r.psn, last_psn) <= 0
                        && rrkey == rkey
                        && va >= rva
                        && end.is_some()
                        && end <= rend
                }
                _ => false,
            });
            if !found {
                return RespState::Done;
            }
            let target = if len == 0 {
                Some((Arc::new(Region::zeroed(0)), 0))
            } else {
                eng.mrs
                    .lookup(
                        qp.pd,
                        rkey,
                        KeyKind::Remote,
                        Access::REMOTE_READ,
                        va,
                        len as usize,
                    )
                    .ok()
            };
            if let Some((region, offset)) = target {
                qp.resp.read = Some(ReadCursor {
                    region,
                    offset,
                    remaining: len as usize,
                    psn: r.psn,
                    first: true,
                });
                read_responses(eng, qp, super::POLL_BUDGET, false);
            }
        }
        Operation::CompareSwap | Operation::FetchAdd => {
            let orig = qp.resp.resources.iter().find_map(|res| match *res {
                Resource::Atomic { psn, orig } if psn == r.psn => Some(orig),
                _ => None,
            });
            if let Some(orig) = orig {
                send_atomic_ack(eng, qp, r.psn, orig);
            }
        }
        _ => {}
    }
    RespState::Done
}

fn bth(qp: &QpCtx, opcode: Opcode, psn: u32) -> BthRepr {
    BthRepr {
        opcode,
        solicited: false,
        mig_req: false,
        pad_count: 0,
        pkey: DEFAULT_PKEY,
        fecn: false,
        becn: false,
        dest_qp: qp.dest_qpn,
        ack_req: false,
        psn,
    }
}

/// Owes the requester an ACK for `psn` (and what precedes it), sent by [`flush_ack`] once the
/// received batch is processed: a burst of requests gets one ACK, as from a NIC that coalesces
/// them. Anything else the responder sends for this QP goes after it.
fn defer_ack(eng: &mut Engine, qp: &mut QpCtx, psn: u32) {
    if qp.resp.ack.is_none() {
        eng.acks.push(qp.qpn);
    }
    qp.resp.ack = Some((psn, qp.resp.msn));
}

/// Sends the ACK `qp` owes, if any.
pub(crate) fn flush_ack(eng: &mut Engine, qp: &mut QpCtx) {
    let Some((psn, msn)) = qp.resp.ack.take() else {
        return;
    };
    if !matches!(
        qp.state,
        QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe
    ) {
        return;
    }
    let mut repr = RoceRepr::new(bth(qp, Opcode::RcAcknowledge, psn));
    repr.aeth = Some(AethRepr {
        syndrome: Syndrome::ACK_UNLIMITED,
        msn,
    });
    emit(eng, &qp.av, qp.sport, &repr, |_| true);
}

/// Sends an ACKNOWLEDGE (a NAK here) with `syndrome` for `psn` and the current MSN, after the
/// ACK owed.
fn send_ack(eng: &mut Engine, qp: &mut QpCtx, syndrome: Syndrome, psn: u32) {
    flush_ack(eng, qp);
    let mut repr = RoceRepr::new(bth(qp, Opcode::RcAcknowledge, psn));
    repr.aeth = Some(AethRepr {
        syndrome,
        msn: qp.resp.msn,
    });
    emit(eng, &qp.av, qp.sport, &repr, |_| true);
}

fn send_atomic_ack(eng: &mut Engine, qp: &mut QpCtx, psn: u32, orig: u64) {
    flush_ack(eng, qp);
    let mut repr = RoceRepr::new(bth(qp, Opcode::RcAtomicAcknowledge, psn));
    repr.aeth = Some(AethRepr {
        syndrome: Syndrome::ACK_UNLIMITED,
        msn: qp.resp.msn,
    });
    repr.atomic_ack_eth = Some(AtomicAckEthRepr { orig });
    emit(eng, &qp.av, qp.sport, &repr, |_| true);
}

/// Sends up to `budget` packets of the READ response in progress.
/// With `force`, ignores the transmit queue limit (used before serving the next request).
pub(crate) fn read_responses(eng: &mut Engine, qp: &mut QpCtx, mut budget: usize, force: bool) {
    if qp.resp.read.is_some() {
        flush_ack(eng, qp);
    }
    let mtu = qp.mtu.bytes();
    while budget > 0 {
        let Some(cur) = qp.resp.read.as_mut() else {
            return;
        };
        if !cur.first && cur.remaining == 0 {
            qp.resp.read = None;
            return;
        }
        if !force && !eng.tx.has_room() {
            return;
        }
        let len = cur.remaining.min(mtu);
        let last = cur.remaining <= mtu;
        let opcode = match (cur.first, last) {
            (true, true) => Opcode::RcRdmaReadResponseOnly,
            (true, false) => Opcode::RcRdmaReadResponseFirst,
            (false, true) => Opcode::RcRdmaReadResponseLast,
            (false, false) => Opcode::RcRdmaReadResponseMiddle,
        };
        let psn = cur.psn;
        let (region, offset) = (Arc::clone(&cur.region), cur.offset);
        cur.psn = psn_add(psn, 1);
        cur.offset += len;
        cur.remaining -= len;
        cur.first = false;
        let done = cur.remaining == 0;
        let mut repr = RoceRepr::new(BthRepr {
            opcode,
            solicited: false,
            mig_req: false,
            pad_count: 0,
            pkey: DEFAULT_PKEY,
            fecn: false,
            becn: false,
            dest_qp: qp.dest_qpn,
            ack_req: false,
            psn,
        });
        if opcode != Opcode::RcRdmaReadResponseMiddle {
            repr.aeth = Some(AethRepr {
                syndrome: Syndrome::ACK_UNLIMITED,
                msn: qp.resp.msn,
            });
        }
        repr.payload_len = len;
        let Engine { gids, tx, .. } = eng;
        super::emit_from_region(gids, tx, &qp.av, qp.sport, &repr, &region, offset);
        if done {
            qp.resp.read = None;
            return;
        }
        budget -= 1;
    }
}
