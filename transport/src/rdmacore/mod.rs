//! rdma-core, loaded at run time: libibverbs for RDMA devices (mlx5, irdma, the kernel's
//! rdma_rxe, ...) and librdmacm for addressing them by IP, as the kernel's targets do. rtgt
//! links neither: [`RdmaCore::load`] opens `libibverbs.so.1` and `librdmacm.so.1` when the
//! `verbs` provider is asked for, so a build and the quick start need no rdma-core, and a
//! host without it gets an error that names what to install.
//!
//! Each function is taken at the symbol version its C header binds to (`dlvsym`), so an older
//! compatibility entry point is never called by mistake. The data-path calls (`post_send`,
//! `post_recv`, `post_srq_recv`, `poll_cq`, `req_notify_cq`) are inline in `verbs.h`: they go
//! through the device context's operation table, and so do they here.

pub mod cm;
pub mod res;
pub mod sys;
pub mod wr;

use std::ffi::{c_char, c_int, c_void, CStr};
use std::fmt;
use std::sync::OnceLock;

use sys::*;

/// Why rdma-core is not usable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RdmaCoreError {
    /// A library could not be opened.
    Library { name: &'static str, why: String },
    /// A library lacks a function (an rdma-core older than 1.11's ABI).
    Symbol {
        name: &'static str,
        version: &'static str,
    },
    /// The kernel offers no RDMA devices to user space (no `ib_uverbs`).
    NoKernelSupport,
    /// No device of that name, or it could not be opened.
    NoDevice { name: String, errno: i32 },
    /// The device's provider lacks an operation.
    Unsupported(&'static str),
    /// A call failed with `errno`.
    Call { what: &'static str, errno: i32 },
}

impl fmt::Display for RdmaCoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RdmaCoreError::Library { name, why } => write!(
                f,
                "{name} cannot be loaded ({why}): install rdma-core's libraries and the \
                 device's user-space driver (Debian: libibverbs1 librdmacm1 ibverbs-providers)"
            ),
            RdmaCoreError::Symbol { name, version } => {
                write!(f, "rdma-core has no {name}@{version}: it is too old")
            }
            RdmaCoreError::NoKernelSupport => write!(
                f,
                "the kernel offers no RDMA devices to user space: load ib_uverbs and rdma_ucm \
                 with the device's driver (mlx5_ib, irdma, or rdma_rxe over an Ethernet device)"
            ),
            RdmaCoreError::NoDevice { name, errno } => write!(
                f,
                "RDMA device {name} cannot be opened ({}); `rtgt-rdma devices` lists them",
                std::io::Error::from_raw_os_error(*errno)
            ),
            RdmaCoreError::Unsupported(op) => {
                write!(f, "the device's provider has no {op}")
            }
            RdmaCoreError::Call { what, errno } => write!(
                f,
                "{what} failed: {}",
                std::io::Error::from_raw_os_error(*errno)
            ),
        }
    }
}

impl std::error::Error for RdmaCoreError {}

impl From<rtgt_dynlib::LoadError> for RdmaCoreError {
    fn from(e: rtgt_dynlib::LoadError) -> Self {
        match e {
            rtgt_dynlib::LoadError::Library { name, why } => RdmaCoreError::Library { name, why },
            rtgt_dynlib::LoadError::Symbol { name, version } => {
                RdmaCoreError::Symbol { name, version }
            }
        }
    }
}

rtgt_dynlib::functions! {
    /// libibverbs.
    pub Verbs in "libibverbs.so.1" {
        ibv_get_device_list: "IBVERBS_1.1", fn(*mut c_int) -> *mut *mut ibv_device;
        ibv_free_device_list: "IBVERBS_1.1", fn(*mut *mut ibv_device) -> ();
        ibv_get_device_name: "IBVERBS_1.1", fn(*mut ibv_device) -> *const c_char;
        ibv_open_device: "IBVERBS_1.1", fn(*mut ibv_device) -> *mut ibv_context;
        ibv_close_device: "IBVERBS_1.1", fn(*mut ibv_context) -> c_int;
        ibv_query_device: "IBVERBS_1.1", fn(*mut ibv_context, *mut ibv_device_attr) -> c_int;
        ibv_query_port: "IBVERBS_1.1", fn(*mut ibv_context, u8, *mut ibv_port_attr) -> c_int;
        _ibv_query_gid_table: "IBVERBS_1.11", fn(*mut ibv_context, *mut ibv_gid_entry, usize, u32, usize) -> isize;
        ibv_alloc_pd: "IBVERBS_1.1", fn(*mut ibv_context) -> *mut ibv_pd;
        ibv_dealloc_pd: "IBVERBS_1.1", fn(*mut ibv_pd) -> c_int;
        ibv_reg_mr: "IBVERBS_1.1", fn(*mut ibv_pd, *mut c_void, usize, c_int) -> *mut ibv_mr;
        ibv_dereg_mr: "IBVERBS_1.1", fn(*mut ibv_mr) -> c_int;
        ibv_create_comp_channel: "IBVERBS_1.0", fn(*mut ibv_context) -> *mut ibv_comp_channel;
        ibv_destroy_comp_channel: "IBVERBS_1.0", fn(*mut ibv_comp_channel) -> c_int;
        ibv_create_cq: "IBVERBS_1.1", fn(*mut ibv_context, c_int, *mut c_void, *mut ibv_comp_channel, c_int) -> *mut ibv_cq;
        ibv_destroy_cq: "IBVERBS_1.1", fn(*mut ibv_cq) -> c_int;
        ibv_get_cq_event: "IBVERBS_1.1", fn(*mut ibv_comp_channel, *mut *mut ibv_cq, *mut *mut c_void) -> c_int;
        ibv_ack_cq_events: "IBVERBS_1.1", fn(*mut ibv_cq, u32) -> ();
        ibv_create_qp: "IBVERBS_1.1", fn(*mut ibv_pd, *mut ibv_qp_init_attr) -> *mut ibv_qp;
        ibv_modify_qp: "IBVERBS_1.1", fn(*mut ibv_qp, *mut ibv_qp_attr, c_int) -> c_int;
        ibv_query_qp: "IBVERBS_1.1", fn(*mut ibv_qp, *mut ibv_qp_attr, c_int, *mut ibv_qp_init_attr) -> c_int;
        ibv_destroy_qp: "IBVERBS_1.1", fn(*mut ibv_qp) -> c_int;
        ibv_create_srq: "IBVERBS_1.1", fn(*mut ibv_pd, *mut ibv_srq_init_attr) -> *mut ibv_srq;
        ibv_destroy_srq: "IBVERBS_1.1", fn(*mut ibv_srq) -> c_int;
        ibv_get_async_event: "IBVERBS_1.1", fn(*mut ibv_context, *mut ibv_async_event) -> c_int;
        ibv_ack_async_event: "IBVERBS_1.1", fn(*mut ibv_async_event) -> ();
    }
}

rtgt_dynlib::functions! {
    /// librdmacm.
    pub Cm in "librdmacm.so.1" {
        rdma_create_event_channel: "RDMACM_1.0", fn() -> *mut rdma_event_channel;
        rdma_destroy_event_channel: "RDMACM_1.0", fn(*mut rdma_event_channel) -> ();
        rdma_create_id: "RDMACM_1.0", fn(*mut rdma_event_channel, *mut *mut rdma_cm_id, *mut c_void, u32) -> c_int;
        rdma_destroy_id: "RDMACM_1.0", fn(*mut rdma_cm_id) -> c_int;
        rdma_bind_addr: "RDMACM_1.0", fn(*mut rdma_cm_id, *mut libc::sockaddr) -> c_int;
        rdma_listen: "RDMACM_1.0", fn(*mut rdma_cm_id, c_int) -> c_int;
        rdma_get_cm_event: "RDMACM_1.0", fn(*mut rdma_event_channel, *mut *mut rdma_cm_event) -> c_int;
        rdma_ack_cm_event: "RDMACM_1.0", fn(*mut rdma_cm_event) -> c_int;
        rdma_create_qp: "RDMACM_1.0", fn(*mut rdma_cm_id, *mut ibv_pd, *mut ibv_qp_init_attr) -> c_int;
        rdma_destroy_qp: "RDMACM_1.0", fn(*mut rdma_cm_id) -> ();
        rdma_accept: "RDMACM_1.0", fn(*mut rdma_cm_id, *mut rdma_conn_param) -> c_int;
        rdma_reject: "RDMACM_1.0", fn(*mut rdma_cm_id, *const c_void, u8) -> c_int;
        rdma_disconnect: "RDMACM_1.0", fn(*mut rdma_cm_id) -> c_int;
        rdma_migrate_id: "RDMACM_1.0", fn(*mut rdma_cm_id, *mut rdma_event_channel) -> c_int;
        rdma_resolve_addr: "RDMACM_1.0", fn(*mut rdma_cm_id, *mut libc::sockaddr, *mut libc::sockaddr, c_int) -> c_int;
        rdma_resolve_route: "RDMACM_1.0", fn(*mut rdma_cm_id, c_int) -> c_int;
        rdma_connect: "RDMACM_1.0", fn(*mut rdma_cm_id, *mut rdma_conn_param) -> c_int;
        rdma_event_str: "RDMACM_1.0", fn(c_int) -> *const c_char;
    }
}

/// Both libraries.
pub struct RdmaCore {
    pub verbs: Verbs,
    pub cm: Cm,
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

impl RdmaCore {
    /// rdma-core, loaded once per process (the libraries stay loaded: rdma-core's providers
    /// cannot be unloaded safely).
    pub fn load() -> Result<&'static RdmaCore, RdmaCoreError> {
        static LIB: OnceLock<Result<RdmaCore, RdmaCoreError>> = OnceLock::new();
        LIB.get_or_init(|| {
            Ok(RdmaCore {
                verbs: Verbs::load()?,
                cm: Cm::load()?,
            })
        })
        .as_ref()
        .map_err(Clone::clone)
    }

    /// The RDMA devices of this host, their ports and GID tables.
    pub fn devices(&'static self) -> Result<Vec<DeviceInfo>, RdmaCoreError> {
        let names: Vec<String> = DeviceList::get(self)?.iter().map(|(n, _)| n).collect();
        names
            .iter()
            .map(|n| res::Context::open(self, n)?.info())
            .collect()
    }
}

/// `ibv_get_device_list`'s list, freed on drop.
pub(crate) struct DeviceList<'a> {
    lib: &'a RdmaCore,
    list: *mut *mut ibv_device,
    len: usize,
}

impl<'a> DeviceList<'a> {
    pub(crate) fn get(lib: &'a RdmaCore) -> Result<DeviceList<'a>, RdmaCoreError> {
        let mut n: c_int = 0;
        // SAFETY: `n` is a valid out-pointer; the list is freed on drop.
        let list = unsafe { (lib.verbs.ibv_get_device_list)(&mut n) };
        if list.is_null() {
            return Err(match errno() {
                libc::ENOSYS => RdmaCoreError::NoKernelSupport,
                errno => RdmaCoreError::Call {
                    what: "ibv_get_device_list",
                    errno,
                },
            });
        }
        Ok(DeviceList {
            lib,
            list,
            len: n.max(0) as usize,
        })
    }

    /// Each device with its name.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (String, *mut ibv_device)> + '_ {
        (0..self.len).map(|i| {
            // SAFETY: the list holds `len` device pointers while it lives.
            let dev = unsafe { *self.list.add(i) };
            // SAFETY: a device of the live list has a NUL-terminated name.
            let name = unsafe { CStr::from_ptr((self.lib.verbs.ibv_get_device_name)(dev)) };
            (name.to_string_lossy().into_owned(), dev)
        })
    }
}

impl Drop for DeviceList<'_> {
    fn drop(&mut self) {
        // SAFETY: from ibv_get_device_list; contexts opened from it keep their devices.
        unsafe { (self.lib.verbs.ibv_free_device_list)(self.list) };
    }
}

/// One RDMA device as rdma-core reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    pub name: String,
    pub fw_ver: String,
    pub max_qp: u32,
    pub max_qp_wr: u32,
    pub max_sge: u32,
    pub max_cqe: u32,
    pub max_mr_size: u64,
    pub max_qp_rd_atom: u32,
    pub ports: Vec<PortInfo>,
}

/// A port of a device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortInfo {
    pub port: u8,
    pub active: bool,
    /// The active path MTU in bytes.
    pub active_mtu: u32,
    /// RoCE (Ethernet link layer) rather than InfiniBand.
    pub ethernet: bool,
    pub gids: Vec<GidInfo>,
}

/// A valid entry of a port's GID table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GidInfo {
    pub index: u32,
    pub gid: [u8; 16],
    pub kind: GidKind,
    /// The network device the GID belongs to (RoCE).
    pub netdev: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GidKind {
    Ib,
    RoceV1,
    RoceV2,
}

impl GidInfo {
    /// The IP address a RoCE GID stands for (IPv4-mapped GIDs as IPv4).
    pub fn ip(&self) -> std::net::IpAddr {
        let v6 = std::net::Ipv6Addr::from(self.gid);
        match v6.to_ipv4_mapped() {
            Some(v4) => v4.into(),
            None => v6.into(),
        }
    }
}
