//! The UD/GSI receive path (rxe_resp.c for UD): Q_Key check, one receive WQE per datagram, a
//! 40-byte GRH in front of the payload as verbs consumers expect (for IPv4 the IPv4 header sits
//! in the last 20 bytes of it, as rdma-core's `ibv_wc_read_...` users assume).

use super::{scatter, ScatterError};
use crate::verbs::device::{Engine, GSI_QKEY};
use crate::verbs::qp::QpCtx;
use crate::verbs::{QpType, WcFlags, WcOpcode, WcStatus, WorkCompletion};
use crate::wire::{Datagram, IpRepr, RocePacket};

/// Size of the GRH area at the start of every UD receive buffer.
pub const GRH_LEN: usize = 40;

pub(crate) fn on_receive(
    eng: &mut Engine,
    qp: &mut QpCtx,
    d: &Datagram<'_>,
    ip: IpRepr,
    pkt: &RocePacket<&[u8]>,
) -> bool {
    let Some(deth) = pkt.deth() else {
        return false;
    };
    let want = if qp.qp_type == QpType::Gsi {
        GSI_QKEY
    } else {
        qp.qkey
    };
    if deth.qkey() != want {
        return false;
    }
    let wqe = match qp.srq {
        Some(id) => eng.srqs.get_mut(&id).and_then(|s| s.take(id, &eng.events)),
        None => qp.rq.pop(),
    };
    let Some(wqe) = wqe else {
        return false;
    };
    let mut grh = [0u8; GRH_LEN];
    let h = d.ip_header;
    grh[GRH_LEN - h.len()..].copy_from_slice(h);
    let payload = pkt.payload();
    let mut status = WcStatus::Success;
    for (off, data) in [(0usize, &grh[..]), (GRH_LEN, payload)] {
        match scatter(&eng.mrs, qp.pd, &wqe.sg_list, off, data) {
            Ok(()) => {}
            Err(ScatterError::Length) => status = WcStatus::LocLenErr,
            Err(ScatterError::Protection) => status = WcStatus::LocProtErr,
        }
        if status != WcStatus::Success {
            break;
        }
    }
    let mut wc = WorkCompletion::new(wqe.wr_id, status, WcOpcode::Recv, qp.qpn);
    wc.byte_len = (GRH_LEN + payload.len()) as u32;
    wc.src_qp = deth.src_qp();
    wc.flags = WcFlags::GRH;
    if let Some(imm) = pkt.immdt() {
        wc.flags |= WcFlags::WITH_IMM;
        wc.imm_or_inv = imm.imm();
    }
    wc.src_addr = Some(ip.src_addr());
    qp.recv_cq.push(wc, pkt.bth().solicited());
    true
}
