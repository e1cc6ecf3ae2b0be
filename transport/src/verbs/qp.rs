//! Queue pair context, its state machine (IBA 10.3.1) and the per-transition attribute masks
//! (as `ib_modify_qp_is_ok` in drivers/infiniband/core/verbs.c).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use super::cq::Cq;
use super::mem::Region;
use super::types::{
    Access, AddressVector, Mtu, QpAttrMask as M, QpCap, QpState, QpType, SendWr, SgList, WcStatus,
    WorkCompletion,
};
use crate::ring::Ring;

/// Required and optional attributes of a transition, `None` if it is not allowed.
pub(crate) fn transition_masks(t: QpType, cur: QpState, next: QpState) -> Option<(M, M)> {
    use QpState::*;
    let rc = t == QpType::Rc;
    let ud_keys = if t == QpType::Gsi {
        M::PKEY_INDEX | M::QKEY
    } else {
        M::PKEY_INDEX | M::PORT | M::QKEY
    };
    let none = M::empty();
    Some(match (cur, next) {
        (_, Reset) => (none, none),
        (_, Err) => (none, none),
        (Reset, Init) if rc => (M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS, none),
        (Reset, Init) => (ud_keys, none),
        (Init, Init) if rc => (none, M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS),
        (Init, Init) => (none, ud_keys),
        (Init, Rtr) if rc => (
            M::AV
                | M::PATH_MTU
                | M::DEST_QPN
                | M::RQ_PSN
                | M::MAX_DEST_RD_ATOMIC
                | M::MIN_RNR_TIMER,
            M::ALT_PATH | M::ACCESS_FLAGS | M::PKEY_INDEX,
        ),
        (Init, Rtr) => (none, M::PKEY_INDEX | M::QKEY),
        (Rtr, Rts) if rc => (
            M::SQ_PSN | M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::MAX_QP_RD_ATOMIC,
            M::CUR_STATE | M::ALT_PATH | M::ACCESS_FLAGS | M::MIN_RNR_TIMER | M::PATH_MIG_STATE,
        ),
        (Rtr, Rts) => (M::SQ_PSN, M::CUR_STATE | M::QKEY),
        (Rts, Rts) | (Sqd, Rts) if rc => (
            none,
            M::CUR_STATE | M::ACCESS_FLAGS | M::ALT_PATH | M::PATH_MIG_STATE | M::MIN_RNR_TIMER,
        ),
        (Rts, Rts) | (Sqd, Rts) => (none, M::CUR_STATE | M::QKEY),
        (Rts, Sqd) => (none, M::EN_SQD_ASYNC_NOTIFY),
        (Sqd, Sqd) if rc => (
            none,
            M::AV
                | M::TIMEOUT
                | M::RETRY_CNT
                | M::RNR_RETRY
                | M::MAX_QP_RD_ATOMIC
                | M::MAX_DEST_RD_ATOMIC
                | M::CUR_STATE
                | M::ALT_PATH
                | M::ACCESS_FLAGS
                | M::PKEY_INDEX
                | M::MIN_RNR_TIMER
                | M::PATH_MIG_STATE
                | M::PORT,
        ),
        (Sqd, Sqd) => (none, M::PKEY_INDEX | M::QKEY),
        (Sqe, Rts) if !rc => (none, M::CUR_STATE | M::QKEY),
        _ => return None,
    })
}

/// Whether `mask` (without STATE) fits the transition.
pub(crate) fn modify_is_ok(t: QpType, cur: QpState, next: QpState, mask: M) -> bool {
    let Some((req, opt)) = transition_masks(t, cur, next) else {
        return false;
    };
    let mask = mask - M::STATE;
    mask.contains(req) && (mask - req - opt).is_empty()
}

/// Progress of a send WQE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WqeState {
    /// Not (or no longer, after a rewind) sent.
    Posted,
    /// Partly sent.
    Processing,
    /// Every packet sent; waiting for the response.
    Pending,
    /// Finished; the completer reports `status` in order.
    Done(WcStatus),
}

#[derive(Debug)]
pub(crate) struct SendWqe {
    pub wr: SendWr,
    pub state: WqeState,
    pub total_len: usize,
    /// PSN of the first packet (valid once started).
    pub first_psn: u32,
    pub last_psn: u32,
    /// Next byte and PSN to send.
    pub offset: usize,
    pub next_psn: u32,
    /// Bytes of READ response placed, atomic result for atomics.
    pub placed: usize,
}

#[derive(Debug, Clone)]
pub(crate) struct RecvWqe {
    pub wr_id: u64,
    pub sg_list: SgList,
    #[allow(dead_code)]
    pub total_len: usize,
}

/// Requester state (rxe `qp->req`).
#[derive(Debug)]
pub(crate) struct ReqState {
    /// Absolute SQ index of the next WQE to start or continue.
    pub wqe_index: u32,
    pub psn: u32,
    /// Packets sent since the last AckReq.
    pub noack_pkts: u32,
    /// READs and atomics sent and not completed.
    pub rd_atomic_inflight: u32,
    /// Waiting for an RNR timer before retransmitting.
    pub rnr_deadline: Option<Duration>,
    /// How many PSNs may be unacknowledged ([`crate::rc::window`]).
    pub window: u32,
}

impl Default for ReqState {
    fn default() -> Self {
        ReqState {
            wqe_index: 0,
            psn: 0,
            noack_pkts: 0,
            rd_atomic_inflight: 0,
            rnr_deadline: None,
            window: crate::rc::window::MIN,
        }
    }
}

/// Completer state (rxe `qp->comp`).
#[derive(Debug, Default)]
pub(crate) struct CompState {
    /// Oldest PSN not yet acknowledged.
    pub psn: u32,
    pub retry_left: u8,
    pub rnr_retry_left: u8,
    pub deadline: Option<Duration>,
    /// A counted go-back-N is under way and nothing was acknowledged since: further
    /// sequence NAKs for it (duplicates, or one per packet of the burst that is being
    /// resent) do not spend the retry budget again (rxe `started_retry`).
    pub retrying: bool,
}

/// A saved READ or atomic for duplicate replay (rxe `resp_res`).
#[derive(Debug, Clone)]
pub(crate) enum Resource {
    Read {
        first_psn: u32,
        last_psn: u32,
        va: u64,
        rkey: u32,
        len: u32,
    },
    Atomic {
        psn: u32,
        orig: u64,
    },
}

/// An in-progress READ response stream.
#[derive(Debug, Clone)]
pub(crate) struct ReadCursor {
    pub region: Arc<Region>,
    /// Offset in the region of the next byte.
    pub offset: usize,
    pub remaining: usize,
    pub psn: u32,
    pub first: bool,
}

/// The receive WQE a multi-packet SEND is being written into.
#[derive(Debug, Clone)]
pub(crate) struct RecvInProgress {
    pub wqe: RecvWqe,
    pub written: usize,
}

/// Responder state (rxe `qp->resp`).
#[derive(Debug, Default)]
pub(crate) struct RespState {
    pub psn: u32,
    pub msn: u32,
    /// Opcode of the last accepted request packet (for sequence checks).
    pub last_op: Option<crate::wire::Opcode>,
    pub sent_psn_nak: bool,
    pub recv: Option<RecvInProgress>,
    /// Current RDMA WRITE target.
    pub write: Option<(Arc<Region>, usize, usize)>,
    pub resources: VecDeque<Resource>,
    pub read: Option<ReadCursor>,
    /// An ACK owed (PSN and MSN): the responder acknowledges once per received batch, for
    /// the newest PSN that asked for one (coalesced ACKs, IBA 9.7.5.1.2).
    pub ack: Option<(u32, u32)>,
}

/// Everything the engine keeps per QP.
#[derive(Debug)]
pub(crate) struct QpCtx {
    pub qpn: u32,
    pub qp_type: QpType,
    pub state: QpState,
    pub pd: u32,
    pub send_cq: Cq,
    pub recv_cq: Cq,
    pub srq: Option<u32>,
    pub cap: QpCap,
    pub access: Access,
    pub qkey: u32,
    pub av: AddressVector,
    pub mtu: Mtu,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub min_rnr_timer: u8,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    pub dest_qpn: u32,
    pub sport: u16,
    pub sq_sig_all: bool,
    pub sqd_notify: bool,
    pub sq: Ring<SendWqe>,
    pub rq: Ring<RecvWqe>,
    pub req: ReqState,
    pub comp: CompState,
    pub resp: RespState,
    /// On the engine's ready list ([`crate::verbs::device::Engine::mark_ready`]).
    pub ready: bool,
}

impl QpCtx {
    /// Moves to ERR and flushes every outstanding WQE (IBA 10.3.1.7; rxe `rxe_qp_error`).
    pub fn enter_error(&mut self) {
        self.state = QpState::Err;
        self.flush();
    }

    /// Completes every WQE left in the queues with WR_FLUSH_ERR, after reporting the ones
    /// already finished in order.
    pub fn flush(&mut self) {
        while let Some(wqe) = self.sq.pop() {
            let status = match wqe.state {
                WqeState::Done(s) => s,
                _ => WcStatus::WrFlushErr,
            };
            if status == WcStatus::Success
                && !(self.sq_sig_all || wqe.wr.flags.contains(super::SendFlags::SIGNALED))
            {
                continue;
            }
            let mut wc = WorkCompletion::new(wqe.wr.wr_id, status, wqe.wr.op.wc_opcode(), self.qpn);
            if status == WcStatus::Success {
                wc.byte_len = wqe.total_len as u32;
            }
            self.send_cq.push(wc, false);
        }
        self.req = ReqState {
            wqe_index: self.sq.tail(),
            psn: self.req.psn,
            ..ReqState::default()
        };
        self.comp.deadline = None;
        while let Some(r) = self.rq.pop() {
            let wc = WorkCompletion::new(
                r.wr_id,
                WcStatus::WrFlushErr,
                super::WcOpcode::Recv,
                self.qpn,
            );
            self.recv_cq.push(wc, false);
        }
        if let Some(r) = self.resp.recv.take() {
            let wc = WorkCompletion::new(
                r.wqe.wr_id,
                WcStatus::WrFlushErr,
                super::WcOpcode::Recv,
                self.qpn,
            );
            self.recv_cq.push(wc, false);
        }
        self.resp.read = None;
        self.resp.write = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rc_transitions() {
        let rc = QpType::Rc;
        let init = M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS;
        assert!(modify_is_ok(rc, QpState::Reset, QpState::Init, init));
        assert!(!modify_is_ok(
            rc,
            QpState::Reset,
            QpState::Init,
            M::STATE | M::PKEY_INDEX
        ));
        assert!(!modify_is_ok(
            rc,
            QpState::Reset,
            QpState::Init,
            init | M::QKEY
        ));
        let rtr = M::AV
            | M::PATH_MTU
            | M::DEST_QPN
            | M::RQ_PSN
            | M::MAX_DEST_RD_ATOMIC
            | M::MIN_RNR_TIMER;
        assert!(modify_is_ok(rc, QpState::Init, QpState::Rtr, rtr));
        assert!(!modify_is_ok(rc, QpState::Init, QpState::Rtr, rtr - M::AV));
        assert!(!modify_is_ok(rc, QpState::Reset, QpState::Rts, M::empty()));
        assert!(modify_is_ok(rc, QpState::Rts, QpState::Err, M::STATE));
        assert!(!modify_is_ok(rc, QpState::Sqe, QpState::Rts, M::STATE));
        assert!(modify_is_ok(
            QpType::Ud,
            QpState::Sqe,
            QpState::Rts,
            M::STATE
        ));
        assert!(modify_is_ok(
            QpType::Gsi,
            QpState::Reset,
            QpState::Init,
            M::PKEY_INDEX | M::QKEY
        ));
        assert!(modify_is_ok(
            QpType::Ud,
            QpState::Rtr,
            QpState::Rts,
            M::SQ_PSN
        ));
    }
}
