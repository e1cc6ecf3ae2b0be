//! NVMe/RDMA (NVMe over Fabrics 1.1, section 7.3): the private data of the RDMA/CM REQ,
//! REP and REJ that set up a queue. Capsules are SENDs holding a submission entry and any
//! in-capsule data, or a completion entry; data moves by RDMA READ and WRITE against keyed
//! SGL descriptors ([`crate::sqe::Sgl::Keyed`]).

use crate::{le16, put16};

/// Length of the REQ and REP private data.
pub const CM_REQ_LEN: usize = 32;
pub const CM_REP_LEN: usize = 32;
/// Length of the REJ private data.
pub const CM_REJ_LEN: usize = 4;

/// Reasons a controller rejects a queue (REJ private data STS).
pub mod cm_status {
    pub const INVALID_LEN: u16 = 0x01;
    pub const INVALID_RECFMT: u16 = 0x02;
    pub const INVALID_QID: u16 = 0x03;
    pub const INVALID_HSQSIZE: u16 = 0x04;
    pub const INVALID_HRQSIZE: u16 = 0x05;
    pub const NO_RESOURCES: u16 = 0x06;
    pub const INVALID_IRD: u16 = 0x07;
    pub const INVALID_ORD: u16 = 0x08;
    pub const INVALID_CNTLID: u16 = 0x09;
}

/// The host's REQ private data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CmReq {
    pub recfmt: u16,
    /// 0: the admin queue.
    pub qid: u16,
    /// Host receive queue size (the completions it can take).
    pub hrqsize: u16,
    /// Host submission queue size, zero based.
    pub hsqsize: u16,
    pub cntlid: u16,
}

impl CmReq {
    /// Parses the private data; a short one is [`cm_status::INVALID_LEN`].
    pub fn parse(b: &[u8]) -> Result<CmReq, u16> {
        if b.len() < CM_REQ_LEN {
            return Err(cm_status::INVALID_LEN);
        }
        let r = CmReq {
            recfmt: le16(b, 0),
            qid: le16(b, 2),
            hrqsize: le16(b, 4),
            hsqsize: le16(b, 6),
            cntlid: le16(b, 8),
        };
        if r.recfmt != 0 {
            return Err(cm_status::INVALID_RECFMT);
        }
        Ok(r)
    }

    pub fn to_bytes(&self) -> [u8; CM_REQ_LEN] {
        let mut b = [0u8; CM_REQ_LEN];
        put16(&mut b, 0, self.recfmt);
        put16(&mut b, 2, self.qid);
        put16(&mut b, 4, self.hrqsize);
        put16(&mut b, 6, self.hsqsize);
        put16(&mut b, 8, self.cntlid);
        b
    }
}

/// The controller's REP private data: its receive queue size (the capsules the host may
/// have outstanding).
pub fn cm_rep(crqsize: u16) -> [u8; CM_REP_LEN] {
    let mut b = [0u8; CM_REP_LEN];
    put16(&mut b, 2, crqsize);
    b
}

/// The controller's REJ private data.
pub fn cm_rej(status: u16) -> [u8; CM_REJ_LEN] {
    let mut b = [0u8; CM_REJ_LEN];
    put16(&mut b, 2, status);
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cm_private_data() {
        // Linux's nvme_rdma_route_resolved for I/O queue 2 of 128 entries, controller 1.
        let mut linux = [0u8; 32];
        linux[2] = 2;
        linux[4] = 128;
        linux[6] = 127;
        linux[8] = 1;
        let r = CmReq::parse(&linux).unwrap();
        assert_eq!(
            r,
            CmReq {
                recfmt: 0,
                qid: 2,
                hrqsize: 128,
                hsqsize: 127,
                cntlid: 1
            }
        );
        assert_eq!(r.to_bytes(), linux);
        assert_eq!(CmReq::parse(&linux[..31]), Err(cm_status::INVALID_LEN));
        let mut v1 = linux;
        v1[0] = 1;
        assert_eq!(CmReq::parse(&v1), Err(cm_status::INVALID_RECFMT));
        assert_eq!(&cm_rep(128)[..4], &[0, 0, 128, 0]);
        assert_eq!(cm_rej(cm_status::INVALID_QID), [0, 0, 3, 0]);
    }
}
