//! Plain verbs types: attributes, work requests, work completions (IBA 11; `ib_verbs.h`).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

use bitflags::bitflags;

use super::mem::Region;

/// A 128-bit GID. RoCEv2 GIDs are IPv6 addresses; IPv4 addresses are IPv4-mapped
/// (`::ffff:a.b.c.d`, IBA Annex A17.4.5.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Gid(pub [u8; 16]);

impl Gid {
    pub fn from_ip(ip: IpAddr) -> Gid {
        match ip {
            IpAddr::V4(v4) => Gid(v4.to_ipv6_mapped().octets()),
            IpAddr::V6(v6) => Gid(v6.octets()),
        }
    }

    /// The address this GID stands for (IPv4 for a mapped GID).
    pub fn to_ip(self) -> IpAddr {
        let v6 = Ipv6Addr::from(self.0);
        match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        }
    }
}

/// The IB path MTU enumeration (1 = 256 ... 5 = 4096).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Mtu {
    Mtu256 = 1,
    Mtu512 = 2,
    Mtu1024 = 3,
    Mtu2048 = 4,
    Mtu4096 = 5,
}

impl Mtu {
    pub const fn bytes(self) -> usize {
        128 << (self as usize)
    }

    pub fn from_bytes(bytes: usize) -> Option<Mtu> {
        Some(match bytes {
            256 => Mtu::Mtu256,
            512 => Mtu::Mtu512,
            1024 => Mtu::Mtu1024,
            2048 => Mtu::Mtu2048,
            4096 => Mtu::Mtu4096,
            _ => return None,
        })
    }

    /// The largest IB MTU that fits an Ethernet MTU as rxe computes it (netdev MTU − 80).
    pub fn for_eth_mtu(eth_mtu: usize) -> Option<Mtu> {
        let room = eth_mtu.checked_sub(80)?;
        [
            Mtu::Mtu4096,
            Mtu::Mtu2048,
            Mtu::Mtu1024,
            Mtu::Mtu512,
            Mtu::Mtu256,
        ]
        .into_iter()
        .find(|m| m.bytes() <= room)
    }
}

bitflags! {
    /// Memory region and QP access rights (`ib_access_flags`).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub struct Access: u32 {
        const LOCAL_WRITE = 1;
        const REMOTE_WRITE = 1 << 1;
        const REMOTE_READ = 1 << 2;
        const REMOTE_ATOMIC = 1 << 3;
    }
}

/// Atomic capability (`ib_atomic_cap`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AtomicCap {
    None,
    /// Atomic with respect to this HCA's own accesses only (rxe reports this).
    Hca,
    Global,
}

/// Device attributes, with the limits a soft HCA enforces (close to rxe's `rxe_param.h`).
#[derive(Debug, Clone)]
pub struct DeviceAttr {
    pub fw_ver: u64,
    pub vendor_id: u32,
    pub vendor_part_id: u32,
    pub node_guid: u64,
    pub max_mr_size: u64,
    pub page_size_cap: u64,
    pub max_qp: u32,
    pub max_qp_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_sge_rd: u32,
    pub max_cq: u32,
    pub max_cqe: u32,
    pub max_mr: u32,
    pub max_pd: u32,
    pub max_qp_rd_atom: u32,
    pub max_qp_init_rd_atom: u32,
    pub max_res_rd_atom: u32,
    pub atomic_cap: AtomicCap,
    pub max_srq: u32,
    pub max_srq_wr: u32,
    pub max_srq_sge: u32,
    pub max_fast_reg_page_list_len: u32,
    pub max_pkeys: u16,
    pub local_ca_ack_delay: u8,
    pub max_inline_data: u32,
    /// Largest message (8 MiB as in rxe); also bounds a READ response burst.
    pub max_msg_sz: u32,
}

impl Default for DeviceAttr {
    fn default() -> Self {
        DeviceAttr {
            fw_ver: 0x0001_0000,
            vendor_id: 0x00_5254,
            vendor_part_id: 0x1,
            node_guid: 0x0252_54ff_fe00_0001,
            max_mr_size: u64::MAX,
            page_size_cap: 0xFFFF_F000,
            max_qp: 1 << 12,
            max_qp_wr: 1 << 14,
            max_send_sge: 32,
            max_recv_sge: 32,
            max_sge_rd: 32,
            max_cq: 1 << 12,
            max_cqe: (1 << 15) - 1,
            max_mr: 1 << 16,
            max_pd: 1 << 12,
            max_qp_rd_atom: 128,
            max_qp_init_rd_atom: 128,
            max_res_rd_atom: 128 << 12,
            atomic_cap: AtomicCap::Hca,
            max_srq: 1 << 10,
            max_srq_wr: 1 << 14,
            max_srq_sge: 27,
            max_fast_reg_page_list_len: 512,
            max_pkeys: 64,
            local_ca_ack_delay: 15,
            max_inline_data: 400,
            max_msg_sz: 0x80_0000,
        }
    }
}

/// Port attributes.
#[derive(Debug, Clone)]
pub struct PortAttr {
    pub state_active: bool,
    pub max_mtu: Mtu,
    pub active_mtu: Mtu,
    pub gid_tbl_len: u32,
    pub pkey_tbl_len: u16,
}

/// The transport service of a QP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QpType {
    Rc,
    Ud,
    /// The general services QP (QP1), a UD QP that carries MADs.
    Gsi,
}

/// QP states (IBA 10.3.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QpState {
    Reset,
    Init,
    Rtr,
    Rts,
    Sqd,
    Sqe,
    Err,
}

/// An address vector: where RC packets or a UD send go (IBA 11.2.2; RoCEv2 uses IP addresses).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AddressVector {
    pub dest: IpAddr,
    /// Index into the local GID table of the source address.
    pub sgid_index: u32,
    pub hop_limit: u8,
    pub traffic_class: u8,
    pub flow_label: u32,
    /// UDP source port; `None` derives it from the flow label or the QPNs as Linux does.
    pub udp_sport: Option<u16>,
}

impl AddressVector {
    pub fn new(dest: IpAddr) -> AddressVector {
        AddressVector {
            dest,
            sgid_index: 0,
            hop_limit: 64,
            traffic_class: 0,
            flow_label: 0,
            udp_sport: None,
        }
    }
}

impl Default for AddressVector {
    fn default() -> Self {
        AddressVector::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED))
    }
}

bitflags! {
    /// Which [`QpAttr`] fields a modify_qp call sets (`ib_qp_attr_mask`).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub struct QpAttrMask: u32 {
        const STATE = 1;
        const CUR_STATE = 1 << 1;
        const EN_SQD_ASYNC_NOTIFY = 1 << 2;
        const ACCESS_FLAGS = 1 << 3;
        const PKEY_INDEX = 1 << 4;
        const PORT = 1 << 5;
        const QKEY = 1 << 6;
        const AV = 1 << 7;
        const PATH_MTU = 1 << 8;
        const TIMEOUT = 1 << 9;
        const RETRY_CNT = 1 << 10;
        const RNR_RETRY = 1 << 11;
        const RQ_PSN = 1 << 12;
        const MAX_QP_RD_ATOMIC = 1 << 13;
        const ALT_PATH = 1 << 14;
        const MIN_RNR_TIMER = 1 << 15;
        const SQ_PSN = 1 << 16;
        const MAX_DEST_RD_ATOMIC = 1 << 17;
        const PATH_MIG_STATE = 1 << 18;
        const CAP = 1 << 19;
        const DEST_QPN = 1 << 20;
    }
}

/// QP attributes for modify_qp; only the fields named in the mask are used.
#[derive(Debug, Clone, Default)]
pub struct QpAttr {
    pub qp_state: Option<QpState>,
    pub cur_qp_state: Option<QpState>,
    pub qp_access_flags: Option<Access>,
    pub pkey_index: u16,
    pub port_num: u8,
    pub qkey: u32,
    pub av: AddressVector,
    pub path_mtu: Option<Mtu>,
    /// Local ACK timeout: 4.096 µs × 2^timeout, 0 = infinite.
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub rq_psn: u32,
    pub sq_psn: u32,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    pub min_rnr_timer: u8,
    pub dest_qp_num: u32,
    pub en_sqd_async_notify: bool,
}

/// Queue sizes requested at QP creation.
#[derive(Debug, Clone, Copy)]
pub struct QpCap {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
}

impl Default for QpCap {
    fn default() -> Self {
        QpCap {
            max_send_wr: 128,
            max_recv_wr: 128,
            max_send_sge: 4,
            max_recv_sge: 4,
            max_inline_data: 64,
        }
    }
}

/// A scatter/gather element: `length` bytes at I/O virtual address `addr` of the MR `lkey`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sge {
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}

bitflags! {
    /// Send flags (`ib_send_flags`).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct SendFlags: u32 {
        const FENCE = 1;
        const SIGNALED = 1 << 1;
        const SOLICITED = 1 << 2;
        const INLINE = 1 << 3;
    }
}

/// A fast-register request: binds an MR allocated with `alloc_mr` to memory.
#[derive(Debug, Clone)]
pub struct FastReg {
    /// The key to install; its index part must be the MR's, its low 8 bits are the new variant.
    pub key: u32,
    pub region: Arc<Region>,
    /// Offset of the mapping inside the region.
    pub offset: usize,
    pub length: usize,
    pub iova: u64,
    pub access: Access,
}

/// What a send work request does.
#[derive(Debug, Clone)]
pub enum SendOp {
    Send,
    SendWithImm(u32),
    /// SEND with invalidate: the responder invalidates this R_Key.
    SendWithInv(u32),
    RdmaWrite {
        remote_addr: u64,
        rkey: u32,
    },
    RdmaWriteWithImm {
        remote_addr: u64,
        rkey: u32,
        imm: u32,
    },
    RdmaRead {
        remote_addr: u64,
        rkey: u32,
    },
    /// Compare and swap; the original value lands in the first SGE (8 bytes).
    CompareSwap {
        remote_addr: u64,
        rkey: u32,
        compare: u64,
        swap: u64,
    },
    FetchAdd {
        remote_addr: u64,
        rkey: u32,
        add: u64,
    },
    LocalInv {
        key: u32,
    },
    FastReg(FastReg),
}

impl SendOp {
    pub(crate) fn is_read_or_atomic(&self) -> bool {
        matches!(
            self,
            SendOp::RdmaRead { .. } | SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. }
        )
    }

    pub(crate) fn is_atomic(&self) -> bool {
        matches!(self, SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. })
    }

    pub(crate) fn is_local(&self) -> bool {
        matches!(self, SendOp::LocalInv { .. } | SendOp::FastReg(_))
    }

    pub(crate) fn wc_opcode(&self) -> WcOpcode {
        match self {
            SendOp::Send | SendOp::SendWithImm(_) | SendOp::SendWithInv(_) => WcOpcode::Send,
            SendOp::RdmaWrite { .. } | SendOp::RdmaWriteWithImm { .. } => WcOpcode::RdmaWrite,
            SendOp::RdmaRead { .. } => WcOpcode::RdmaRead,
            SendOp::CompareSwap { .. } => WcOpcode::CompSwap,
            SendOp::FetchAdd { .. } => WcOpcode::FetchAdd,
            SendOp::LocalInv { .. } => WcOpcode::LocalInv,
            SendOp::FastReg(_) => WcOpcode::RegMr,
        }
    }
}

/// An address handle.
#[derive(Debug, Clone)]
pub struct Ah {
    pub(crate) pd: u32,
    pub av: AddressVector,
}

/// A UD destination.
#[derive(Debug, Clone)]
pub struct UdDest {
    pub ah: Ah,
    pub remote_qpn: u32,
    pub remote_qkey: u32,
}

/// The scatter/gather list of a work request: up to two SGEs are held inline, so posting the
/// usual one-buffer request allocates nothing.
pub type SgList = smallvec::SmallVec<[Sge; 2]>;

impl From<Sge> for SgList {
    fn from(sge: Sge) -> SgList {
        smallvec::smallvec![sge]
    }
}

/// A send work request.
#[derive(Debug, Clone)]
pub struct SendWr {
    pub wr_id: u64,
    pub op: SendOp,
    pub sg_list: SgList,
    pub flags: SendFlags,
    /// Inline data, sent instead of the SGE list when `flags` has INLINE.
    pub inline_data: Vec<u8>,
    /// Destination of a UD/GSI send.
    pub ud: Option<UdDest>,
}

impl SendWr {
    pub fn new(wr_id: u64, op: SendOp, sg_list: impl Into<SgList>) -> SendWr {
        SendWr {
            wr_id,
            op,
            sg_list: sg_list.into(),
            flags: SendFlags::SIGNALED,
            inline_data: Vec::new(),
            ud: None,
        }
    }
}

/// A receive work request.
#[derive(Debug, Clone)]
pub struct RecvWr {
    pub wr_id: u64,
    pub sg_list: SgList,
}

/// Work completion status (`ib_wc_status`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WcStatus {
    Success,
    LocLenErr,
    LocQpOpErr,
    LocProtErr,
    WrFlushErr,
    BadRespErr,
    LocAccessErr,
    RemInvReqErr,
    RemAccessErr,
    RemOpErr,
    RetryExcErr,
    RnrRetryExcErr,
    GeneralErr,
}

/// Work completion opcode (`ib_wc_opcode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WcOpcode {
    Send,
    RdmaWrite,
    RdmaRead,
    CompSwap,
    FetchAdd,
    LocalInv,
    RegMr,
    Recv,
    RecvRdmaWithImm,
}

bitflags! {
    /// Work completion flags (`ib_wc_flags`).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct WcFlags: u32 {
        const GRH = 1;
        const WITH_IMM = 1 << 1;
        const WITH_INVALIDATE = 1 << 2;
    }
}

/// A work completion.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkCompletion {
    pub wr_id: u64,
    pub status: WcStatus,
    pub opcode: WcOpcode,
    pub byte_len: u32,
    pub qp_num: u32,
    pub src_qp: u32,
    pub flags: WcFlags,
    /// Immediate data (WITH_IMM) or the invalidated R_Key (WITH_INVALIDATE).
    pub imm_or_inv: u32,
    /// Source address of a UD receive.
    pub src_addr: Option<IpAddr>,
}

impl WorkCompletion {
    pub(crate) fn new(wr_id: u64, status: WcStatus, opcode: WcOpcode, qp_num: u32) -> Self {
        WorkCompletion {
            wr_id,
            status,
            opcode,
            byte_len: 0,
            qp_num,
            src_qp: 0,
            flags: WcFlags::empty(),
            imm_or_inv: 0,
            src_addr: None,
        }
    }
}

/// Asynchronous events (`ib_event_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AsyncEvent {
    CqError {
        cq: u32,
    },
    QpFatal {
        qpn: u32,
    },
    SqDrained {
        qpn: u32,
    },
    QpLastWqeReached {
        qpn: u32,
    },
    /// The SRQ fell below its armed limit (`IB_EVENT_SRQ_LIMIT_REACHED`); the limit disarms.
    SrqLimitReached {
        srq: u32,
    },
}
