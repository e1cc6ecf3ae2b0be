//! Connecting an RC QP by hand: the INIT → RTR → RTS transitions with the attributes a
//! connection manager would negotiate, for tools and tests that exchange QP numbers and PSNs
//! out of band (as `ibv_rc_pingpong` does over TCP).

use std::net::IpAddr;

use super::{Access, AddressVector, Mtu, Qp, QpAttr, QpAttrMask, QpState, VerbsError};

/// The far end of an RC connection and the transport parameters of both directions.
#[derive(Debug, Clone, Copy)]
pub struct RcPath {
    pub remote: IpAddr,
    pub dest_qpn: u32,
    /// The PSN expected from the peer (its send PSN).
    pub rq_psn: u32,
    /// The PSN this side starts sending with.
    pub sq_psn: u32,
    pub mtu: Mtu,
    /// Local ACK timeout: 4.096 µs × 2^timeout.
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    /// RDMA READs and atomics this side may have outstanding (initiator depth).
    pub max_rd_atomic: u8,
    /// RDMA READs and atomics this side serves at once (responder resources).
    pub max_dest_rd_atomic: u8,
    pub min_rnr_timer: u8,
}

impl RcPath {
    /// Linux rdma_cm's defaults: 1024-byte MTU, ACK timeout 14 (67 ms), retries 7, 16 reads
    /// outstanding both ways.
    pub fn new(remote: IpAddr, dest_qpn: u32, rq_psn: u32, sq_psn: u32) -> RcPath {
        RcPath {
            remote,
            dest_qpn,
            rq_psn,
            sq_psn,
            mtu: Mtu::Mtu1024,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            max_rd_atomic: 16,
            max_dest_rd_atomic: 16,
            min_rnr_timer: 1,
        }
    }
}

impl Qp {
    /// RESET → INIT with `access` for remote peers.
    pub fn to_init(&self, access: Access) -> Result<(), VerbsError> {
        let a = QpAttr {
            qp_state: Some(QpState::Init),
            qp_access_flags: Some(access),
            port_num: 1,
            ..Default::default()
        };
        self.modify(
            &a,
            QpAttrMask::STATE
                | QpAttrMask::PKEY_INDEX
                | QpAttrMask::PORT
                | QpAttrMask::ACCESS_FLAGS,
        )
    }

    /// INIT → RTR → RTS towards `p`.
    pub fn to_rts(&self, p: &RcPath) -> Result<(), VerbsError> {
        let mut a = QpAttr {
            qp_state: Some(QpState::Rtr),
            av: AddressVector::new(p.remote),
            path_mtu: Some(p.mtu),
            dest_qp_num: p.dest_qpn,
            rq_psn: p.rq_psn,
            max_dest_rd_atomic: p.max_dest_rd_atomic,
            min_rnr_timer: p.min_rnr_timer,
            ..Default::default()
        };
        self.modify(
            &a,
            QpAttrMask::STATE
                | QpAttrMask::AV
                | QpAttrMask::PATH_MTU
                | QpAttrMask::DEST_QPN
                | QpAttrMask::RQ_PSN
                | QpAttrMask::MAX_DEST_RD_ATOMIC
                | QpAttrMask::MIN_RNR_TIMER,
        )?;
        a.qp_state = Some(QpState::Rts);
        a.sq_psn = p.sq_psn;
        a.timeout = p.timeout;
        a.retry_cnt = p.retry_cnt;
        a.rnr_retry = p.rnr_retry;
        a.max_rd_atomic = p.max_rd_atomic;
        self.modify(
            &a,
            QpAttrMask::STATE
                | QpAttrMask::SQ_PSN
                | QpAttrMask::TIMEOUT
                | QpAttrMask::RETRY_CNT
                | QpAttrMask::RNR_RETRY
                | QpAttrMask::MAX_QP_RD_ATOMIC,
        )
    }
}
