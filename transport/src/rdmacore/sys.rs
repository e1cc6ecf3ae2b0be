//! The C types of rdma-core's libibverbs and librdmacm that rtgt uses, as `verbs.h` and
//! `rdma_cma.h` (rdma-core 44, the ABI `IBVERBS_1.1` / `RDMACM_1.0`) lay them out on 64-bit
//! Linux. Only what the `verbs` provider touches is spelled out; everything else is opaque.
//! `tests/rdmacore_abi.rs` compiles the real headers and checks every size and offset here.

#![allow(non_camel_case_types)]

use std::ffi::{c_char, c_int, c_uint, c_void};

/// `struct ibv_device`: only handled by pointer.
#[repr(C)]
pub struct ibv_device {
    _opaque: [u8; 0],
}

/// `struct ibv_ah`, `struct ibv_mw`, `struct ibv_sa_path_rec`: only by pointer.
#[repr(C)]
pub struct ibv_ah {
    _opaque: [u8; 0],
}

/// The provider's operations; the data path calls through these directly, as libibverbs'
/// inline `ibv_post_send` and friends do.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_context_ops {
    pub _compat: [*mut c_void; 11],
    pub poll_cq: Option<unsafe extern "C" fn(*mut ibv_cq, c_int, *mut ibv_wc) -> c_int>,
    pub req_notify_cq: Option<unsafe extern "C" fn(*mut ibv_cq, c_int) -> c_int>,
    pub _compat2: [*mut c_void; 7],
    pub post_srq_recv: Option<
        unsafe extern "C" fn(*mut ibv_srq, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int,
    >,
    pub _compat3: [*mut c_void; 4],
    pub post_send:
        Option<unsafe extern "C" fn(*mut ibv_qp, *mut ibv_send_wr, *mut *mut ibv_send_wr) -> c_int>,
    pub post_recv:
        Option<unsafe extern "C" fn(*mut ibv_qp, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int>,
    pub _compat4: [*mut c_void; 5],
}

#[repr(C)]
pub struct ibv_context {
    pub device: *mut ibv_device,
    pub ops: ibv_context_ops,
    pub cmd_fd: c_int,
    pub async_fd: c_int,
    pub num_comp_vectors: c_int,
    pub mutex: libc::pthread_mutex_t,
    pub abi_compat: *mut c_void,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_device_attr {
    pub fw_ver: [c_char; 64],
    pub node_guid: u64,
    pub sys_image_guid: u64,
    pub max_mr_size: u64,
    pub page_size_cap: u64,
    pub vendor_id: u32,
    pub vendor_part_id: u32,
    pub hw_ver: u32,
    pub max_qp: c_int,
    pub max_qp_wr: c_int,
    pub device_cap_flags: c_uint,
    pub max_sge: c_int,
    pub max_sge_rd: c_int,
    pub max_cq: c_int,
    pub max_cqe: c_int,
    pub max_mr: c_int,
    pub max_pd: c_int,
    pub max_qp_rd_atom: c_int,
    pub max_ee_rd_atom: c_int,
    pub max_res_rd_atom: c_int,
    pub max_qp_init_rd_atom: c_int,
    pub max_ee_init_rd_atom: c_int,
    pub atomic_cap: c_uint,
    pub max_ee: c_int,
    pub max_rdd: c_int,
    pub max_mw: c_int,
    pub max_raw_ipv6_qp: c_int,
    pub max_raw_ethy_qp: c_int,
    pub max_mcast_grp: c_int,
    pub max_mcast_qp_attach: c_int,
    pub max_total_mcast_qp_attach: c_int,
    pub max_ah: c_int,
    pub max_fmr: c_int,
    pub max_map_per_fmr: c_int,
    pub max_srq: c_int,
    pub max_srq_wr: c_int,
    pub max_srq_sge: c_int,
    pub max_pkeys: u16,
    pub local_ca_ack_delay: u8,
    pub phys_port_cnt: u8,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_port_attr {
    pub state: c_uint,
    pub max_mtu: c_uint,
    pub active_mtu: c_uint,
    pub gid_tbl_len: c_int,
    pub port_cap_flags: u32,
    pub max_msg_sz: u32,
    pub bad_pkey_cntr: u32,
    pub qkey_viol_cntr: u32,
    pub pkey_tbl_len: u16,
    pub lid: u16,
    pub sm_lid: u16,
    pub lmc: u8,
    pub max_vl_num: u8,
    pub sm_sl: u8,
    pub subnet_timeout: u8,
    pub init_type_reply: u8,
    pub active_width: u8,
    pub active_speed: u8,
    pub phys_state: u8,
    pub link_layer: u8,
    pub flags: u8,
    pub port_cap_flags2: u16,
}

/// `union ibv_gid`, as its raw bytes (8-aligned, for the `__be64` pair it overlays).
#[repr(C, align(8))]
#[derive(Clone, Copy, Default, PartialEq, Eq)]
pub struct ibv_gid {
    pub raw: [u8; 16],
}

/// `struct ibv_gid_entry` (`ibv_query_gid_table`).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_gid_entry {
    pub gid: ibv_gid,
    pub gid_index: u32,
    pub port_num: u32,
    pub gid_type: u32,
    pub ndev_ifindex: u32,
}

pub const IBV_GID_TYPE_IB: u32 = 0;
pub const IBV_GID_TYPE_ROCE_V1: u32 = 1;
pub const IBV_GID_TYPE_ROCE_V2: u32 = 2;

#[repr(C)]
pub struct ibv_pd {
    pub context: *mut ibv_context,
    pub handle: u32,
}

#[repr(C)]
pub struct ibv_mr {
    pub context: *mut ibv_context,
    pub pd: *mut ibv_pd,
    pub addr: *mut c_void,
    pub length: usize,
    pub handle: u32,
    pub lkey: u32,
    pub rkey: u32,
}

#[repr(C)]
pub struct ibv_comp_channel {
    pub context: *mut ibv_context,
    pub fd: c_int,
    pub refcnt: c_int,
}

#[repr(C)]
pub struct ibv_cq {
    pub context: *mut ibv_context,
    pub channel: *mut ibv_comp_channel,
    pub cq_context: *mut c_void,
    pub handle: u32,
    pub cqe: c_int,
    pub mutex: libc::pthread_mutex_t,
    pub cond: libc::pthread_cond_t,
    pub comp_events_completed: u32,
    pub async_events_completed: u32,
}

#[repr(C)]
pub struct ibv_srq {
    pub context: *mut ibv_context,
    pub srq_context: *mut c_void,
    pub pd: *mut ibv_pd,
    pub handle: u32,
    pub mutex: libc::pthread_mutex_t,
    pub cond: libc::pthread_cond_t,
    pub events_completed: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_srq_attr {
    pub max_wr: u32,
    pub max_sge: u32,
    pub srq_limit: u32,
}

#[repr(C)]
pub struct ibv_srq_init_attr {
    pub srq_context: *mut c_void,
    pub attr: ibv_srq_attr,
}

#[repr(C)]
pub struct ibv_qp {
    pub context: *mut ibv_context,
    pub qp_context: *mut c_void,
    pub pd: *mut ibv_pd,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut ibv_srq,
    pub handle: u32,
    pub qp_num: u32,
    pub state: c_uint,
    pub qp_type: c_uint,
    pub mutex: libc::pthread_mutex_t,
    pub cond: libc::pthread_cond_t,
    pub events_completed: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_qp_cap {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
}

#[repr(C)]
pub struct ibv_qp_init_attr {
    pub qp_context: *mut c_void,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut ibv_srq,
    pub cap: ibv_qp_cap,
    pub qp_type: c_uint,
    pub sq_sig_all: c_int,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_global_route {
    pub dgid: ibv_gid,
    pub flow_label: u32,
    pub sgid_index: u8,
    pub hop_limit: u8,
    pub traffic_class: u8,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_ah_attr {
    pub grh: ibv_global_route,
    pub dlid: u16,
    pub sl: u8,
    pub src_path_bits: u8,
    pub static_rate: u8,
    pub is_global: u8,
    pub port_num: u8,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_qp_attr {
    pub qp_state: c_uint,
    pub cur_qp_state: c_uint,
    pub path_mtu: c_uint,
    pub path_mig_state: c_uint,
    pub qkey: u32,
    pub rq_psn: u32,
    pub sq_psn: u32,
    pub dest_qp_num: u32,
    pub qp_access_flags: c_uint,
    pub cap: ibv_qp_cap,
    pub ah_attr: ibv_ah_attr,
    pub alt_ah_attr: ibv_ah_attr,
    pub pkey_index: u16,
    pub alt_pkey_index: u16,
    pub en_sqd_async_notify: u8,
    pub sq_draining: u8,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    pub min_rnr_timer: u8,
    pub port_num: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub alt_port_num: u8,
    pub alt_timeout: u8,
    pub rate_limit: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_sge {
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}

/// `wr.rdma` of `struct ibv_send_wr`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_rdma_wr {
    pub remote_addr: u64,
    pub rkey: u32,
}

/// `wr.atomic` of `struct ibv_send_wr`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_atomic_wr {
    pub remote_addr: u64,
    pub compare_add: u64,
    pub swap: u64,
    pub rkey: u32,
}

/// `wr.ud` of `struct ibv_send_wr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_ud_wr {
    pub ah: *mut ibv_ah,
    pub remote_qpn: u32,
    pub remote_qkey: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub union ibv_send_wr_wr {
    pub rdma: ibv_rdma_wr,
    pub atomic: ibv_atomic_wr,
    pub ud: ibv_ud_wr,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_send_wr {
    pub wr_id: u64,
    pub next: *mut ibv_send_wr,
    pub sg_list: *mut ibv_sge,
    pub num_sge: c_int,
    pub opcode: c_uint,
    pub send_flags: c_uint,
    /// `imm_data` (big-endian) or `invalidate_rkey`.
    pub imm_data_or_invalidate_rkey: u32,
    pub wr: ibv_send_wr_wr,
    /// `qp_type.xrc.remote_srqn`.
    pub remote_srqn: u32,
    /// `bind_mw` / `tso`: not used; kept zeroed.
    pub _bind_mw_or_tso: [u64; 6],
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_recv_wr {
    pub wr_id: u64,
    pub next: *mut ibv_recv_wr,
    pub sg_list: *mut ibv_sge,
    pub num_sge: c_int,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_wc {
    pub wr_id: u64,
    pub status: c_uint,
    pub opcode: c_uint,
    pub vendor_err: u32,
    pub byte_len: u32,
    /// `imm_data` (big-endian) or `invalidated_rkey`.
    pub imm_data_or_invalidated_rkey: u32,
    pub qp_num: u32,
    pub src_qp: u32,
    pub wc_flags: c_uint,
    pub pkey_index: u16,
    pub slid: u16,
    pub sl: u8,
    pub dlid_path_bits: u8,
}

#[repr(C)]
pub struct ibv_async_event {
    /// `element`: the CQ, QP or SRQ pointer, or the port number.
    pub element: *mut c_void,
    pub event_type: c_uint,
}

#[repr(C)]
pub struct rdma_event_channel {
    pub fd: c_int,
}

/// `struct rdma_ib_addr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_ib_addr {
    pub sgid: ibv_gid,
    pub dgid: ibv_gid,
    pub pkey: u16,
}

/// `struct rdma_addr`: the source and destination as `sockaddr_storage`.
#[repr(C)]
pub struct rdma_addr {
    pub src: libc::sockaddr_storage,
    pub dst: libc::sockaddr_storage,
    pub ibaddr: rdma_ib_addr,
}

#[repr(C)]
pub struct rdma_route {
    pub addr: rdma_addr,
    pub path_rec: *mut c_void,
    pub num_paths: c_int,
}

#[repr(C)]
pub struct rdma_cm_id {
    pub verbs: *mut ibv_context,
    pub channel: *mut rdma_event_channel,
    pub context: *mut c_void,
    pub qp: *mut ibv_qp,
    pub route: rdma_route,
    pub ps: c_uint,
    pub port_num: u8,
    pub event: *mut rdma_cm_event,
    pub send_cq_channel: *mut ibv_comp_channel,
    pub send_cq: *mut ibv_cq,
    pub recv_cq_channel: *mut ibv_comp_channel,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut ibv_srq,
    pub pd: *mut ibv_pd,
    pub qp_type: c_uint,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_conn_param {
    pub private_data: *const c_void,
    pub private_data_len: u8,
    pub responder_resources: u8,
    pub initiator_depth: u8,
    pub flow_control: u8,
    pub retry_count: u8,
    pub rnr_retry_count: u8,
    pub srq: u8,
    pub qp_num: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_ud_param {
    pub private_data: *const c_void,
    pub private_data_len: u8,
    pub ah_attr: ibv_ah_attr,
    pub qp_num: u32,
    pub qkey: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub union rdma_cm_event_param {
    pub conn: rdma_conn_param,
    pub ud: rdma_ud_param,
}

#[repr(C)]
pub struct rdma_cm_event {
    pub id: *mut rdma_cm_id,
    pub listen_id: *mut rdma_cm_id,
    pub event: c_uint,
    pub status: c_int,
    pub param: rdma_cm_event_param,
}

// Constants of the enums above that rtgt uses.
pub const IBV_LINK_LAYER_INFINIBAND: u8 = 1;
pub const IBV_LINK_LAYER_ETHERNET: u8 = 2;
pub const IBV_PORT_ACTIVE: c_uint = 4;

pub const IBV_QPT_RC: c_uint = 2;
pub const IBV_QPS_RESET: c_uint = 0;
pub const IBV_QPS_INIT: c_uint = 1;
pub const IBV_QPS_RTR: c_uint = 2;
pub const IBV_QPS_RTS: c_uint = 3;
pub const IBV_QPS_ERR: c_uint = 6;

pub const IBV_QP_STATE: c_int = 1;
pub const IBV_QP_ACCESS_FLAGS: c_int = 1 << 3;
pub const IBV_QP_PKEY_INDEX: c_int = 1 << 4;
pub const IBV_QP_PORT: c_int = 1 << 5;
pub const IBV_QP_AV: c_int = 1 << 7;
pub const IBV_QP_PATH_MTU: c_int = 1 << 8;
pub const IBV_QP_TIMEOUT: c_int = 1 << 9;
pub const IBV_QP_RETRY_CNT: c_int = 1 << 10;
pub const IBV_QP_RNR_RETRY: c_int = 1 << 11;
pub const IBV_QP_RQ_PSN: c_int = 1 << 12;
pub const IBV_QP_MAX_QP_RD_ATOMIC: c_int = 1 << 13;
pub const IBV_QP_MIN_RNR_TIMER: c_int = 1 << 15;
pub const IBV_QP_SQ_PSN: c_int = 1 << 16;
pub const IBV_QP_MAX_DEST_RD_ATOMIC: c_int = 1 << 17;
pub const IBV_QP_DEST_QPN: c_int = 1 << 20;

pub const IBV_ACCESS_LOCAL_WRITE: c_uint = 1;
pub const IBV_ACCESS_REMOTE_WRITE: c_uint = 1 << 1;
pub const IBV_ACCESS_REMOTE_READ: c_uint = 1 << 2;

pub const IBV_WR_RDMA_WRITE: c_uint = 0;
pub const IBV_WR_RDMA_WRITE_WITH_IMM: c_uint = 1;
pub const IBV_WR_SEND: c_uint = 2;
pub const IBV_WR_SEND_WITH_IMM: c_uint = 3;
pub const IBV_WR_RDMA_READ: c_uint = 4;
pub const IBV_WR_ATOMIC_CMP_AND_SWP: c_uint = 5;
pub const IBV_WR_ATOMIC_FETCH_AND_ADD: c_uint = 6;
pub const IBV_WR_LOCAL_INV: c_uint = 7;
pub const IBV_WR_SEND_WITH_INV: c_uint = 9;

pub const IBV_SEND_SIGNALED: c_uint = 1 << 1;
pub const IBV_SEND_INLINE: c_uint = 1 << 3;

pub const IBV_SEND_FENCE: c_uint = 1;
pub const IBV_SEND_SOLICITED: c_uint = 1 << 2;

pub const IBV_WC_SUCCESS: c_uint = 0;
pub const IBV_WC_LOC_LEN_ERR: c_uint = 1;
pub const IBV_WC_LOC_QP_OP_ERR: c_uint = 2;
pub const IBV_WC_LOC_PROT_ERR: c_uint = 4;
pub const IBV_WC_WR_FLUSH_ERR: c_uint = 5;
pub const IBV_WC_BAD_RESP_ERR: c_uint = 7;
pub const IBV_WC_LOC_ACCESS_ERR: c_uint = 8;
pub const IBV_WC_REM_INV_REQ_ERR: c_uint = 9;
pub const IBV_WC_REM_ACCESS_ERR: c_uint = 10;
pub const IBV_WC_REM_OP_ERR: c_uint = 11;
pub const IBV_WC_RETRY_EXC_ERR: c_uint = 12;
pub const IBV_WC_RNR_RETRY_EXC_ERR: c_uint = 13;

pub const IBV_WC_SEND: c_uint = 0;
pub const IBV_WC_RDMA_WRITE: c_uint = 1;
pub const IBV_WC_RDMA_READ: c_uint = 2;
pub const IBV_WC_COMP_SWAP: c_uint = 3;
pub const IBV_WC_FETCH_ADD: c_uint = 4;
pub const IBV_WC_LOCAL_INV: c_uint = 6;
pub const IBV_WC_RECV: c_uint = 1 << 7;
pub const IBV_WC_RECV_RDMA_WITH_IMM: c_uint = (1 << 7) + 1;

pub const IBV_WC_GRH: c_uint = 1;
pub const IBV_WC_WITH_IMM: c_uint = 1 << 1;
pub const IBV_WC_WITH_INV: c_uint = 1 << 3;

pub const RDMA_PS_TCP: c_uint = 0x0106;
pub const RDMA_CM_EVENT_CONNECT_REQUEST: c_uint = 4;
pub const RDMA_CM_EVENT_ESTABLISHED: c_uint = 9;
pub const RDMA_CM_EVENT_DISCONNECTED: c_uint = 10;
pub const RDMA_CM_EVENT_DEVICE_REMOVAL: c_uint = 11;
pub const RDMA_CM_EVENT_TIMEWAIT_EXIT: c_uint = 15;
