//! The completer (rxe_comp.c): matches ACKs, NAKs, READ responses and atomic acknowledges to
//! the send queue, places READ data, completes WQEs in order, and drives retransmission
//! (go-back-N from the oldest unacknowledged PSN) on timeout, PSN-sequence NAK, RNR NAK and
//! implied NAK (an ACK beyond an unanswered READ or atomic).

use std::time::Duration;

use super::{ack_timeout, scatter, window};
use crate::verbs::device::Engine;
use crate::verbs::qp::{QpCtx, WqeState};
use crate::verbs::{QpState, SendFlags, SendOp, WcStatus, WorkCompletion};
use crate::wire::aeth::{rnr_timer_micros, NakCode, Syndrome};
use crate::wire::bth::{psn_add, psn_diff};
use crate::wire::opcode::{Operation, Position};
use crate::wire::RocePacket;

/// Completer states for one response packet; each function returns the next one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompState {
    /// Report finished WQEs at the head and look at the oldest outstanding one.
    GetWqe,
    /// Compare the response PSN with the WQE and the expected PSN.
    CheckPsn,
    /// Dispatch on the response type.
    CheckAck,
    /// Place a READ response.
    Read,
    /// Store an atomic's original value.
    Atomic,
    /// The head WQE is acknowledged: complete it and look at the next.
    CompWqe,
    /// Go back N.
    Retry,
    /// The head WQE fails with this status; the QP goes to error.
    Error(WcStatus),
    Done,
}

struct Resp<'a> {
    psn: u32,
    operation: Operation,
    position: Position,
    syndrome: Option<Syndrome>,
    payload: &'a [u8],
    atomic_orig: Option<u64>,
}

/// Handles one response packet.
pub(crate) fn on_response(
    eng: &mut Engine,
    qp: &mut QpCtx,
    pkt: &RocePacket<&[u8]>,
    payload: &[u8],
    now: Duration,
) {
    let Some(info) = pkt.opcode_info() else {
        return;
    };
    let syndrome = match pkt.aeth() {
        Some(a) => match a.syndrome() {
            Ok(s) => Some(s),
            Err(_) => return,
        },
        None => None,
    };
    let r = Resp {
        psn: pkt.bth().psn(),
        operation: info.operation,
        position: info.position,
        syndrome,
        payload,
        atomic_orig: pkt.atomic_ack_eth().map(|a| a.orig()),
    };
    // First, last and only READ responses carry an ACK-type AETH (IBA 9.2.1 Table 38, rxe
    // `rxe_comp.c`; docs/WIRE.md §3).
    if r.operation == Operation::RdmaReadResponse
        && r.position != Position::Middle
        && !matches!(r.syndrome, Some(Syndrome::Ack { .. }))
    {
        return;
    }
    let mut state = CompState::GetWqe;
    loop {
        state = match state {
            CompState::GetWqe => get_wqe(qp),
            CompState::CheckPsn => check_psn(qp, &r),
            CompState::CheckAck => check_ack(qp, &r, now),
            CompState::Read => read(eng, qp, &r, now),
            CompState::Atomic => atomic(eng, qp, &r),
            CompState::CompWqe => {
                comp_wqe(qp, now);
                CompState::GetWqe
            }
            CompState::Retry => {
                retry(eng, qp, now, true);
                CompState::Done
            }
            CompState::Error(status) => {
                fail_head(qp, status);
                CompState::Done
            }
            CompState::Done => return,
        };
    }
}

fn get_wqe(qp: &mut QpCtx) -> CompState {
    complete_ready(qp);
    match qp.sq.front() {
        Some(w) if matches!(w.state, WqeState::Processing | WqeState::Pending) => {
            CompState::CheckPsn
        }
        _ => CompState::Done,
    }
}

fn check_psn(qp: &QpCtx, r: &Resp<'_>) -> CompState {
    let Some(wqe) = qp.sq.front() else {
        return CompState::Done;
    };
    if psn_diff(r.psn, wqe.last_psn) > 0 {
        // The response is for a later WQE: this one was acknowledged (coalesced ACK), unless
        // it still expects data, which the peer evidently skipped (implied NAK). A SEND or
        // WRITE being sent again after a rewind counts as acknowledged too: ACKs are
        // cumulative, so the peer has all of it.
        if wqe.wr.op.is_read_or_atomic() {
            if wqe.state != WqeState::Pending {
                return CompState::Done;
            }
            return CompState::Retry;
        }
        return CompState::CompWqe;
    }
    let d = psn_diff(r.psn, qp.comp.psn);
    if d < 0 {
        return CompState::Done;
    }
    if d > 0 && wqe.wr.op.is_read_or_atomic() {
        // A response is missing; the retransmit timer recovers.
        return CompState::Done;
    }
    CompState::CheckAck
}

fn check_ack(qp: &mut QpCtx, r: &Resp<'_>, now: Duration) -> CompState {
    let Some(wqe) = qp.sq.front() else {
        return CompState::Done;
    };
    let is_read = matches!(wqe.wr.op, SendOp::RdmaRead { .. });
    match r.operation {
        Operation::RdmaReadResponse if is_read => return CompState::Read,
        Operation::AtomicAcknowledge if wqe.wr.op.is_atomic() => return CompState::Atomic,
        Operation::RdmaReadResponse | Operation::AtomicAcknowledge => {
            return CompState::Error(WcStatus::BadRespErr)
        }
        Operation::Acknowledge => {}
        _ => return CompState::Done,
    }
    match r.syndrome {
        Some(Syndrome::Ack { .. }) => {
            if wqe.wr.op.is_read_or_atomic() {
                return CompState::Done;
            }
            advance_psn(qp, psn_add(r.psn, 1), now);
            // The ACK of the last PSN completes the WQE, also when a rewind is sending it
            // again (the ACK of the first transmission arrived after the timeout).
            if r.psn == qp.sq.front().map_or(r.psn.wrapping_add(1), |w| w.last_psn)
                && qp
                    .sq
                    .front()
                    .is_some_and(|w| matches!(w.state, WqeState::Pending | WqeState::Processing))
            {
                CompState::CompWqe
            } else {
                CompState::Done
            }
        }
        Some(Syndrome::RnrNak { timer }) => {
            if qp.comp.rnr_retry_left == 0 {
                return CompState::Error(WcStatus::RnrRetryExcErr);
            }
            if qp.rnr_retry != 7 {
                qp.comp.rnr_retry_left -= 1;
            }
            if psn_diff(r.psn, qp.comp.psn) > 0 {
                qp.comp.psn = r.psn;
            }
            let wait = Duration::from_micros(u64::from(rnr_timer_micros(timer)));
            qp.req.rnr_deadline = Some(now + wait);
            qp.comp.deadline = None;
            CompState::Done
        }
        Some(Syndrome::Nak(code)) => match code {
            NakCode::PsnSequenceError => {
                // The NAK acknowledges everything before its PSN: progress when that moves.
                if psn_diff(r.psn, qp.comp.psn) > 0 {
                    advance_psn(qp, r.psn, now);
                } else if qp.comp.retrying {
                    return CompState::Done;
                }
                CompState::Retry
            }
            NakCode::InvalidRequest => CompState::Error(WcStatus::RemInvReqErr),
            NakCode::RemoteAccessError => CompState::Error(WcStatus::RemAccessErr),
            _ => CompState::Error(WcStatus::RemOpErr),
        },
        None => CompState::Done,
    }
}

fn read(eng: &mut Engine, qp: &mut QpCtx, r: &Resp<'_>, now: Duration) -> CompState {
    let mtu = qp.mtu.bytes();
    let pd = qp.pd;
    let Some(wqe) = qp.sq.front_mut() else {
        return CompState::Done;
    };
    if r.psn != qp.comp.psn {
        return CompState::Done;
    }
    let offset = psn_diff(r.psn, wqe.first_psn).max(0) as usize * mtu;
    let remaining = wqe.total_len.saturating_sub(offset);
    let last = r.psn == wqe.last_psn;
    let expect = if last { remaining } else { mtu };
    if r.payload.len() != expect || remaining < expect || last != r.position.is_end() {
        return CompState::Error(WcStatus::BadRespErr);
    }
    if scatter(&eng.mrs, pd, &wqe.wr.sg_list, offset, r.payload).is_err() {
        return CompState::Error(WcStatus::LocProtErr);
    }
    wqe.placed = offset + r.payload.len();
    advance_psn(qp, psn_add(r.psn, 1), now);
    if last {
        CompState::CompWqe
    } else {
        CompState::Done
    }
}

fn atomic(eng: &mut Engine, qp: &mut QpCtx, r: &Resp<'_>) -> CompState {
    let pd = qp.pd;
    let Some(wqe) = qp.sq.front_mut() else {
        return CompState::Done;
    };
    let Some(orig) = r.atomic_orig else {
        return CompState::Error(WcStatus::BadRespErr);
    };
    if r.psn != wqe.first_psn {
        return CompState::Done;
    }
    if scatter(&eng.mrs, pd, &wqe.wr.sg_list, 0, &orig.to_ne_bytes()).is_err() {
        return CompState::Error(WcStatus::LocProtErr);
    }
    qp.comp.psn = psn_add(r.psn, 1);
    CompState::CompWqe
}

/// The head WQE succeeded.
fn comp_wqe(qp: &mut QpCtx, now: Duration) {
    let Some(wqe) = qp.sq.front_mut() else {
        return;
    };
    if wqe.wr.op.is_read_or_atomic() {
        qp.req.rd_atomic_inflight = qp.req.rd_atomic_inflight.saturating_sub(1);
    }
    let last = wqe.last_psn;
    wqe.state = WqeState::Done(WcStatus::Success);
    acknowledge(qp, psn_add(last, 1));
    reset_retry(qp, now);
}

fn advance_psn(qp: &mut QpCtx, psn: u32, now: Duration) {
    if acknowledge(qp, psn) {
        reset_retry(qp, now);
    }
}

/// Everything before `psn` is acknowledged: moves the oldest unacknowledged PSN there and
/// grows the window by what that acknowledges; false if `psn` is not beyond it.
fn acknowledge(qp: &mut QpCtx, psn: u32) -> bool {
    let acked = psn_diff(psn, qp.comp.psn);
    if acked > 0 {
        qp.comp.psn = psn;
        window::grow(qp, acked as u32);
    }
    acked > 0
}

/// Progress: fresh retry budgets and a fresh timer.
fn reset_retry(qp: &mut QpCtx, now: Duration) {
    qp.comp.retry_left = qp.retry_cnt;
    qp.comp.rnr_retry_left = qp.rnr_retry;
    qp.comp.retrying = false;
    qp.comp.deadline = ack_timeout(qp.timeout).map(|t| now + t);
}

/// The head WQE fails with `status`: report it and flush the rest (QP to ERR).
fn fail_head(qp: &mut QpCtx, status: WcStatus) {
    if let Some(wqe) = qp.sq.front_mut() {
        wqe.state = WqeState::Done(status);
    }
    complete_ready(qp);
}

/// Reports finished WQEs at the head of the send queue, in order. An error completion moves
/// the QP to ERR, which flushes everything behind it.
pub(crate) fn complete_ready(qp: &mut QpCtx) {
    while let Some(wqe) = qp.sq.front() {
        let WqeState::Done(status) = wqe.state else {
            break;
        };
        if status != WcStatus::Success {
            qp.enter_error();
            return;
        }
        let Some(wqe) = qp.sq.pop() else {
            break;
        };
        // The requester may have been rewound onto the WQE that just completed.
        if !qp.sq.contains(qp.req.wqe_index) && qp.req.wqe_index != qp.sq.tail() {
            qp.req.wqe_index = qp.sq.head();
        }
        if qp.sq_sig_all || wqe.wr.flags.contains(SendFlags::SIGNALED) {
            let mut wc = WorkCompletion::new(wqe.wr.wr_id, status, wqe.wr.op.wc_opcode(), qp.qpn);
            wc.byte_len = wqe.total_len as u32;
            qp.send_cq.push(wc, false);
        }
    }
    if qp.sq.is_empty() || qp.sq.front().is_some_and(|w| w.state == WqeState::Posted) {
        qp.comp.deadline = None;
    }
}

/// Retransmit and RNR timers.
pub(crate) fn timers(eng: &mut Engine, qp: &mut QpCtx, now: Duration) {
    if qp.req.rnr_deadline.is_some_and(|d| now >= d) {
        qp.req.rnr_deadline = None;
        retry(eng, qp, now, false);
    }
    if qp.comp.deadline.is_some_and(|d| now >= d) {
        qp.comp.deadline = None;
        let outstanding = qp
            .sq
            .front()
            .is_some_and(|w| matches!(w.state, WqeState::Processing | WqeState::Pending));
        if outstanding {
            retry(eng, qp, now, true);
        }
    }
}

/// Go back N: rewind the requester to the oldest unacknowledged PSN (rxe `req_retry`).
/// `counted` retries spend `retry_cnt` (7 means unlimited).
pub(crate) fn retry(eng: &mut Engine, qp: &mut QpCtx, now: Duration, counted: bool) {
    if counted {
        if qp.comp.retry_left == 0 {
            fail_head(qp, WcStatus::RetryExcErr);
            return;
        }
        if qp.retry_cnt != 7 {
            qp.comp.retry_left -= 1;
        }
        qp.comp.retrying = true;
        window::shrink(qp);
    }
    eng.stats.retransmits += 1;
    let mtu = qp.mtu.bytes();
    let comp_psn = qp.comp.psn;
    let head = qp.sq.head();
    // Every started WQE is rewound, including ones beyond the requester's index that an
    // earlier rewind left behind.
    let end = qp.sq.tail();
    let mut idx = head;
    let mut first_unfinished = None;
    while idx != end {
        if let Some(wqe) = qp.sq.get_mut(idx) {
            let started = !matches!(wqe.state, WqeState::Posted | WqeState::Done(_));
            let acknowledged =
                started && psn_diff(comp_psn, wqe.last_psn) > 0 && !wqe.wr.op.is_read_or_atomic();
            if acknowledged {
                // A SEND or WRITE whose ACK came after all (the timer fired with it in
                // flight): done, not sent again, since an ACK older than comp_psn could never
                // complete it.
                wqe.state = WqeState::Done(WcStatus::Success);
            } else if !matches!(wqe.state, WqeState::Done(_)) {
                first_unfinished.get_or_insert(idx);
                let inside = started
                    && psn_diff(comp_psn, wqe.first_psn) > 0
                    && psn_diff(comp_psn, wqe.last_psn) <= 0
                    && !wqe.wr.op.is_atomic();
                if inside {
                    let n = psn_diff(comp_psn, wqe.first_psn) as usize;
                    wqe.offset = (n * mtu).min(wqe.total_len);
                    wqe.next_psn = comp_psn;
                    wqe.state = WqeState::Processing;
                } else if started {
                    wqe.offset = 0;
                    wqe.next_psn = wqe.first_psn;
                    wqe.state = WqeState::Processing;
                    if psn_diff(wqe.first_psn, comp_psn) > 0 {
                        wqe.state = WqeState::Posted;
                    }
                }
            }
        }
        idx = idx.wrapping_add(1);
    }
    if let Some(i) = first_unfinished {
        qp.req.wqe_index = i;
    }
    qp.req.psn = comp_psn;
    qp.req.rd_atomic_inflight = 0;
    qp.req.noack_pkts = 0;
    qp.comp.deadline = ack_timeout(qp.timeout).map(|t| now + t);
    if qp.state == QpState::Err {
        qp.comp.deadline = None;
    }
}
