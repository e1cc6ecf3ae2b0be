//! QP1, the General Services Interface: 256-byte MADs as UD SEND ONLY datagrams with Q_Key
//! 0x80010000 (docs/WIRE.md §4). Receives land in a ring of buffers behind a 40-byte GRH area
//! that holds the IP header (for IPv4 in its last 20 bytes), from which the source and
//! destination addresses of each MAD are read; sends are inline and unsignaled, so the send
//! queue recycles itself and a full one drops the MAD (the CM retransmits on its timers).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

use crate::rc::ud::GRH_LEN;
use crate::verbs::{
    AddressVector, Cq, Device, Mr, Pd, Qp, QpAttr, QpAttrMask, QpInitAttr, QpState, QpType, RecvWr,
    Region, SendFlags, SendOp, SendWr, UdDest, VerbsError, WcOpcode, WcStatus, WorkCompletion,
    GSI_QKEY,
};
use crate::wire::mad::{GSI_QPN, MAD_LEN};

/// Receive buffers kept posted on QP1.
pub(crate) const RECV_DEPTH: u32 = 256;
/// Sends that may be queued on QP1.
const SEND_DEPTH: u32 = 256;
const SLOT: usize = GRH_LEN + MAD_LEN;

/// A received MAD with its addresses.
#[derive(Debug, Clone)]
pub(crate) struct Received {
    pub src: IpAddr,
    pub dst: IpAddr,
    pub mad: Vec<u8>,
}

#[derive(Debug)]
pub(crate) struct Gsi {
    pub dev: Device,
    pub pd: Pd,
    pub cq: Cq,
    pub qp: Qp,
    mr: Mr,
    region: Arc<Region>,
}

impl Gsi {
    /// Creates QP1 and brings it to RTS with its receive ring posted.
    pub fn open(dev: &Device) -> Result<Gsi, VerbsError> {
        let pd = dev.alloc_pd()?;
        let cq = dev.create_cq(RECV_DEPTH + SEND_DEPTH)?;
        let mut init = QpInitAttr::new(QpType::Gsi, &cq, &cq);
        init.cap.max_recv_wr = RECV_DEPTH;
        init.cap.max_send_wr = SEND_DEPTH;
        init.cap.max_recv_sge = 1;
        init.cap.max_send_sge = 1;
        init.cap.max_inline_data = (MAD_LEN as u32).min(dev.attr().max_inline_data);
        let qp = pd.create_qp(init)?;
        let region = Arc::new(Region::zeroed(SLOT * RECV_DEPTH as usize));
        let mr = pd.reg_mr(region.clone(), crate::verbs::Access::LOCAL_WRITE)?;
        use QpAttrMask as M;
        let mut a = QpAttr {
            qp_state: Some(QpState::Init),
            port_num: 1,
            qkey: GSI_QKEY,
            ..Default::default()
        };
        qp.modify(&a, M::STATE | M::PKEY_INDEX | M::QKEY)?;
        a.qp_state = Some(QpState::Rtr);
        qp.modify(&a, M::STATE)?;
        a.qp_state = Some(QpState::Rts);
        qp.modify(&a, M::STATE | M::SQ_PSN)?;
        let gsi = Gsi {
            dev: dev.clone(),
            pd,
            cq,
            qp,
            mr,
            region,
        };
        for i in 0..RECV_DEPTH {
            gsi.repost(u64::from(i))?;
        }
        Ok(gsi)
    }

    fn repost(&self, slot: u64) -> Result<(), VerbsError> {
        self.qp.post_recv(RecvWr {
            wr_id: slot,
            sg_list: self.mr.sge(slot as usize * SLOT, SLOT as u32).into(),
        })
    }

    /// Decodes a receive completion into a MAD and gives its buffer back to the ring. `None`
    /// for send completions, errors and datagrams that are not whole MADs.
    pub fn take(&self, wc: &WorkCompletion) -> Option<Received> {
        if wc.opcode != WcOpcode::Recv {
            return None;
        }
        let slot = wc.wr_id;
        if slot >= u64::from(RECV_DEPTH) {
            return None;
        }
        let got = (wc.status == WcStatus::Success && wc.byte_len as usize >= SLOT).then(|| {
            let mut buf = vec![0u8; SLOT];
            self.region.read(slot as usize * SLOT, &mut buf);
            buf
        });
        // The ring must stay full; a failing repost only shrinks it (QP1 in error).
        let _ = self.repost(slot);
        let buf = got?;
        let (src, dst) = grh_addrs(&buf[..GRH_LEN])?;
        Some(Received {
            src,
            dst,
            mad: buf[GRH_LEN..].to_vec(),
        })
    }

    /// Sends one MAD from local address `src` to QP1 at `dst`; false if it could not be
    /// queued.
    pub fn send(&self, src: IpAddr, dst: IpAddr, mad: &[u8]) -> bool {
        let Some(sgid_index) = self.dev.gid_index(src) else {
            return false;
        };
        let mut av = AddressVector::new(dst);
        av.sgid_index = sgid_index;
        let Ok(ah) = self.dev.create_ah(&self.pd, av) else {
            return false;
        };
        let mut wr = SendWr::new(0, SendOp::Send, crate::verbs::SgList::new());
        wr.flags = SendFlags::INLINE;
        wr.inline_data = mad.to_vec();
        wr.ud = Some(UdDest {
            ah,
            remote_qpn: GSI_QPN,
            remote_qkey: GSI_QKEY,
        });
        self.qp.post_send(wr).is_ok()
    }
}

/// Source and destination of the IP header in a GRH area: an IPv4 header in the last 20
/// bytes, or an IPv6 header filling all 40.
pub(crate) fn grh_addrs(grh: &[u8]) -> Option<(IpAddr, IpAddr)> {
    if grh.len() != GRH_LEN {
        return None;
    }
    let v4 = &grh[GRH_LEN - 20..];
    if v4[0] >> 4 == 4 {
        let a = |o: usize| Ipv4Addr::new(v4[o], v4[o + 1], v4[o + 2], v4[o + 3]);
        return Some((IpAddr::V4(a(12)), IpAddr::V4(a(16))));
    }
    if grh[0] >> 4 == 6 {
        let a = |o: usize| {
            let b: [u8; 16] = grh[o..o + 16].try_into().unwrap_or([0; 16]);
            Ipv6Addr::from(b)
        };
        return Some((IpAddr::V6(a(8)), IpAddr::V6(a(24))));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grh_ipv4_and_ipv6() {
        let mut g = [0u8; GRH_LEN];
        g[20] = 0x45;
        g[32..36].copy_from_slice(&[10, 0, 0, 1]);
        g[36..40].copy_from_slice(&[10, 0, 0, 2]);
        assert_eq!(
            grh_addrs(&g),
            Some((
                "10.0.0.1".parse::<IpAddr>().unwrap(),
                "10.0.0.2".parse().unwrap()
            ))
        );
        let mut g = [0u8; GRH_LEN];
        g[0] = 0x60;
        g[8..24].copy_from_slice(&"fd00::1".parse::<Ipv6Addr>().unwrap().octets());
        g[24..40].copy_from_slice(&"fd00::2".parse::<Ipv6Addr>().unwrap().octets());
        assert_eq!(
            grh_addrs(&g),
            Some((
                "fd00::1".parse::<IpAddr>().unwrap(),
                "fd00::2".parse().unwrap()
            ))
        );
        assert_eq!(grh_addrs(&[0u8; GRH_LEN]), None);
        assert_eq!(grh_addrs(&[0u8; 20]), None);
    }
}
