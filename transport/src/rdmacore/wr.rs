//! Work requests and completions in the engine's own types ([`crate::verbs`]), which the
//! RDMA channel layer speaks whichever provider runs, turned into rdma-core's and back.

use std::ffi::c_int;

use smallvec::SmallVec;

use super::res::{post_recv, post_send, Context};
use super::sys::*;
use super::RdmaCoreError;
use crate::verbs::{
    RecvWr, SendFlags, SendOp, SendWr, WcFlags, WcOpcode, WcStatus, WorkCompletion,
};

type Sges = SmallVec<[ibv_sge; 4]>;

fn sges(list: &[crate::verbs::Sge]) -> Sges {
    list.iter()
        .map(|s| ibv_sge {
            addr: s.addr,
            length: s.length,
            lkey: s.lkey,
        })
        .collect()
}

/// Work requests chained in one `ibv_post_send` without allocating, up to this many.
const CHAIN_INLINE: usize = 16;

/// `ibv_post_send` of one work request. Inline data is copied by the provider during the call.
pub(crate) fn post_send_wr(
    ctx: &Context,
    qp: *mut ibv_qp,
    wr: &SendWr,
) -> Result<(), RdmaCoreError> {
    post_send_wrs(ctx, qp, std::slice::from_ref(wr)).map_err(|(_, e)| e)
}

/// `ibv_post_send` of `wrs` chained, in order: one doorbell (one system call with rdma_rxe)
/// for all of them. On failure, the number posted before the one that failed (those will
/// complete), and why.
pub(crate) fn post_send_wrs(
    ctx: &Context,
    qp: *mut ibv_qp,
    wrs: &[SendWr],
) -> Result<(), (usize, RdmaCoreError)> {
    if wrs.is_empty() {
        return Ok(());
    }
    // Every SGE list first, so that the chain's pointers into them stay put.
    let mut lists: SmallVec<[Sges; CHAIN_INLINE]> = wrs.iter().map(sge_list).collect();
    let mut chain: SmallVec<[ibv_send_wr; CHAIN_INLINE]> = SmallVec::with_capacity(wrs.len());
    for (i, (wr, list)) in wrs.iter().zip(lists.iter_mut()).enumerate() {
        chain.push(fill(wr, list).map_err(|e| (i, e))?);
    }
    let base = chain.as_mut_ptr();
    for i in 1..chain.len() {
        // SAFETY: `i` is within the chain, whose storage does not move from here on.
        chain[i - 1].next = unsafe { base.add(i) };
    }
    post_send(ctx, qp, &mut chain[0]).map_err(|(bad, e)| {
        // The provider names the request it stopped at; those before it went out.
        let posted = if bad.is_null() {
            0
        } else {
            // SAFETY: `bad` points into the chain.
            (unsafe { bad.offset_from(base) }).clamp(0, chain.len() as isize) as usize
        };
        (posted, e)
    })
}

/// The SGEs of `wr` as the provider reads them (inline data as one SGE).
fn sge_list(wr: &SendWr) -> Sges {
    if wr.flags.contains(SendFlags::INLINE) && !wr.inline_data.is_empty() {
        let mut l = Sges::new();
        l.push(ibv_sge {
            addr: wr.inline_data.as_ptr() as u64,
            length: wr.inline_data.len() as u32,
            lkey: 0,
        });
        l
    } else {
        sges(&wr.sg_list)
    }
}

/// `wr` as rdma-core's work request over `list` (its SGEs, which must outlive the post).
fn fill(wr: &SendWr, list: &mut Sges) -> Result<ibv_send_wr, RdmaCoreError> {
    // SAFETY: ibv_send_wr is plain data (pointers may be null); all zeroes is valid.
    let mut w: ibv_send_wr = unsafe { std::mem::zeroed() };
    w.wr_id = wr.wr_id;
    w.sg_list = list.as_mut_ptr();
    w.num_sge = list.len() as c_int;
    let mut flags = 0;
    for (ours, theirs) in [
        (SendFlags::FENCE, IBV_SEND_FENCE),
        (SendFlags::SIGNALED, IBV_SEND_SIGNALED),
        (SendFlags::SOLICITED, IBV_SEND_SOLICITED),
        (SendFlags::INLINE, IBV_SEND_INLINE),
    ] {
        if wr.flags.contains(ours) {
            flags |= theirs;
        }
    }
    w.send_flags = flags;
    let rdma = |remote_addr, rkey| ibv_send_wr_wr {
        rdma: ibv_rdma_wr { remote_addr, rkey },
    };
    let atomic = |remote_addr, rkey, compare_add, swap| ibv_send_wr_wr {
        atomic: ibv_atomic_wr {
            remote_addr,
            compare_add,
            swap,
            rkey,
        },
    };
    match &wr.op {
        SendOp::Send => w.opcode = IBV_WR_SEND,
        SendOp::SendWithImm(imm) => {
            w.opcode = IBV_WR_SEND_WITH_IMM;
            w.imm_data_or_invalidate_rkey = imm.to_be();
        }
        SendOp::SendWithInv(key) => {
            w.opcode = IBV_WR_SEND_WITH_INV;
            w.imm_data_or_invalidate_rkey = *key;
        }
        SendOp::RdmaWrite { remote_addr, rkey } => {
            w.opcode = IBV_WR_RDMA_WRITE;
            w.wr = rdma(*remote_addr, *rkey);
        }
        SendOp::RdmaWriteWithImm {
            remote_addr,
            rkey,
            imm,
        } => {
            w.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
            w.wr = rdma(*remote_addr, *rkey);
            w.imm_data_or_invalidate_rkey = imm.to_be();
        }
        SendOp::RdmaRead { remote_addr, rkey } => {
            w.opcode = IBV_WR_RDMA_READ;
            w.wr = rdma(*remote_addr, *rkey);
        }
        SendOp::CompareSwap {
            remote_addr,
            rkey,
            compare,
            swap,
        } => {
            w.opcode = IBV_WR_ATOMIC_CMP_AND_SWP;
            w.wr = atomic(*remote_addr, *rkey, *compare, *swap);
        }
        SendOp::FetchAdd {
            remote_addr,
            rkey,
            add,
        } => {
            w.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
            w.wr = atomic(*remote_addr, *rkey, *add, 0);
        }
        SendOp::LocalInv { key } => {
            w.opcode = IBV_WR_LOCAL_INV;
            w.imm_data_or_invalidate_rkey = *key;
        }
        SendOp::FastReg(_) => return Err(RdmaCoreError::Unsupported("fast registration")),
    }
    Ok(w)
}

/// `ibv_post_recv` of one work request.
pub(crate) fn post_recv_wr(
    ctx: &Context,
    qp: *mut ibv_qp,
    wr: &RecvWr,
) -> Result<(), RdmaCoreError> {
    let mut list = sges(&wr.sg_list);
    let mut w = ibv_recv_wr {
        wr_id: wr.wr_id,
        next: std::ptr::null_mut(),
        sg_list: list.as_mut_ptr(),
        num_sge: list.len() as c_int,
    };
    post_recv(ctx, qp, &mut w)
}

fn status(s: u32) -> WcStatus {
    match s {
        IBV_WC_SUCCESS => WcStatus::Success,
        IBV_WC_LOC_LEN_ERR => WcStatus::LocLenErr,
        IBV_WC_LOC_QP_OP_ERR => WcStatus::LocQpOpErr,
        IBV_WC_LOC_PROT_ERR => WcStatus::LocProtErr,
        IBV_WC_WR_FLUSH_ERR => WcStatus::WrFlushErr,
        IBV_WC_BAD_RESP_ERR => WcStatus::BadRespErr,
        IBV_WC_LOC_ACCESS_ERR => WcStatus::LocAccessErr,
        IBV_WC_REM_INV_REQ_ERR => WcStatus::RemInvReqErr,
        IBV_WC_REM_ACCESS_ERR => WcStatus::RemAccessErr,
        IBV_WC_REM_OP_ERR => WcStatus::RemOpErr,
        IBV_WC_RETRY_EXC_ERR => WcStatus::RetryExcErr,
        IBV_WC_RNR_RETRY_EXC_ERR => WcStatus::RnrRetryExcErr,
        _ => WcStatus::GeneralErr,
    }
}

/// rdma-core's completion in the engine's terms. A failed completion's opcode is undefined
/// in verbs; it reads as a SEND here, and the consumer looks at the status first.
pub fn completion(wc: &ibv_wc) -> WorkCompletion {
    let opcode = match wc.opcode {
        IBV_WC_RDMA_WRITE => WcOpcode::RdmaWrite,
        IBV_WC_RDMA_READ => WcOpcode::RdmaRead,
        IBV_WC_COMP_SWAP => WcOpcode::CompSwap,
        IBV_WC_FETCH_ADD => WcOpcode::FetchAdd,
        IBV_WC_LOCAL_INV => WcOpcode::LocalInv,
        IBV_WC_RECV => WcOpcode::Recv,
        IBV_WC_RECV_RDMA_WITH_IMM => WcOpcode::RecvRdmaWithImm,
        _ => WcOpcode::Send,
    };
    let mut flags = WcFlags::empty();
    let mut imm_or_inv = 0;
    if wc.wc_flags & IBV_WC_GRH != 0 {
        flags |= WcFlags::GRH;
    }
    if wc.wc_flags & IBV_WC_WITH_IMM != 0 {
        flags |= WcFlags::WITH_IMM;
        imm_or_inv = u32::from_be(wc.imm_data_or_invalidated_rkey);
    }
    if wc.wc_flags & IBV_WC_WITH_INV != 0 {
        flags |= WcFlags::WITH_INVALIDATE;
        imm_or_inv = wc.imm_data_or_invalidated_rkey;
    }
    WorkCompletion {
        wr_id: wc.wr_id,
        status: status(wc.status),
        opcode,
        byte_len: wc.byte_len,
        qp_num: wc.qp_num,
        src_qp: wc.src_qp,
        flags,
        imm_or_inv,
        src_addr: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn completions_in_the_engines_terms() {
        let wc = ibv_wc {
            wr_id: 7,
            status: IBV_WC_SUCCESS,
            opcode: IBV_WC_RECV,
            byte_len: 48,
            imm_data_or_invalidated_rkey: 0x1234_5678,
            qp_num: 17,
            wc_flags: IBV_WC_WITH_INV,
            ..Default::default()
        };
        let c = completion(&wc);
        assert_eq!(
            (c.wr_id, c.status, c.opcode),
            (7, WcStatus::Success, WcOpcode::Recv)
        );
        assert_eq!((c.byte_len, c.qp_num), (48, 17));
        assert_eq!(c.flags, WcFlags::WITH_INVALIDATE);
        // The invalidated key is in host order; immediate data is big-endian on the wire.
        assert_eq!(c.imm_or_inv, 0x1234_5678);
        let imm = ibv_wc {
            opcode: IBV_WC_RECV_RDMA_WITH_IMM,
            wc_flags: IBV_WC_WITH_IMM,
            imm_data_or_invalidated_rkey: 0x0102_0304u32.to_be(),
            ..Default::default()
        };
        let c = completion(&imm);
        assert_eq!(c.opcode, WcOpcode::RecvRdmaWithImm);
        assert_eq!(c.imm_or_inv, 0x0102_0304);
        let flushed = ibv_wc {
            status: IBV_WC_WR_FLUSH_ERR,
            opcode: 0xdead,
            ..Default::default()
        };
        assert_eq!(completion(&flushed).status, WcStatus::WrFlushErr);
        let unknown = ibv_wc {
            status: 21,
            ..Default::default()
        };
        assert_eq!(completion(&unknown).status, WcStatus::GeneralErr);
    }
}
