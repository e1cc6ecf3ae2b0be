//! The parts of librados and librbd (Ceph 16 and later) rtgt calls, as declared in
//! `rados/librados.h` and `rbd/librbd.h`; `tests/abi.rs` checks every type here against those
//! headers. Neither library versions its symbols.

#![allow(non_camel_case_types)]

use std::ffi::{c_char, c_int, c_void};
use std::sync::OnceLock;

use rtgt_dynlib::LoadError;

pub type rados_t = *mut c_void;
pub type rados_ioctx_t = *mut c_void;
pub type rbd_image_t = *mut c_void;
pub type rbd_completion_t = *mut c_void;
pub type rbd_callback_t = unsafe extern "C" fn(rbd_completion_t, *mut c_void);
pub type rbd_update_callback_t = unsafe extern "C" fn(*mut c_void);
pub type rados_write_op_t = *mut c_void;
pub type rbd_diff_callback_t = unsafe extern "C" fn(u64, usize, c_int, *mut c_void) -> c_int;
pub type rados_watchcb2_t = unsafe extern "C" fn(*mut c_void, u64, u64, u64, *mut c_void, usize);
pub type rados_watcherrcb_t = unsafe extern "C" fn(*mut c_void, u64, c_int);

/// `LIBRADOS_CMPXATTR_OP_EQ`.
pub const LIBRADOS_CMPXATTR_OP_EQ: u8 = 1;
/// `LIBRADOS_CREATE_EXCLUSIVE`.
pub const LIBRADOS_CREATE_EXCLUSIVE: c_int = 1;

rtgt_dynlib::functions! {
    /// librados.
    pub Rados in "librados.so.2" {
        rados_create2: "", fn(*mut rados_t, *const c_char, *const c_char, u64) -> c_int;
        rados_conf_read_file: "", fn(rados_t, *const c_char) -> c_int;
        rados_conf_set: "", fn(rados_t, *const c_char, *const c_char) -> c_int;
        rados_connect: "", fn(rados_t) -> c_int;
        rados_shutdown: "", fn(rados_t) -> ();
        rados_ioctx_create: "", fn(rados_t, *const c_char, *mut rados_ioctx_t) -> c_int;
        rados_ioctx_destroy: "", fn(rados_ioctx_t) -> ();
        rados_ioctx_set_namespace: "", fn(rados_ioctx_t, *const c_char) -> ();
        rados_read: "", fn(rados_ioctx_t, *const c_char, *mut c_char, usize, u64) -> c_int;
        rados_stat: "", fn(rados_ioctx_t, *const c_char, *mut u64, *mut libc::time_t) -> c_int;
        rados_getxattr: "", fn(rados_ioctx_t, *const c_char, *const c_char, *mut c_char, usize) -> c_int;
        rados_create_write_op: "", fn() -> rados_write_op_t;
        rados_release_write_op: "", fn(rados_write_op_t) -> ();
        rados_write_op_create: "", fn(rados_write_op_t, c_int, *const c_char) -> ();
        rados_write_op_cmpxattr: "", fn(rados_write_op_t, *const c_char, u8, *const c_char, usize) -> ();
        rados_write_op_write_full: "", fn(rados_write_op_t, *const c_char, usize) -> ();
        rados_write_op_setxattr: "", fn(rados_write_op_t, *const c_char, *const c_char, usize) -> ();
        rados_write_op_operate: "", fn(rados_write_op_t, rados_ioctx_t, *const c_char, *mut libc::time_t, c_int) -> c_int;
        rados_watch3: "", fn(rados_ioctx_t, *const c_char, *mut u64, rados_watchcb2_t, rados_watcherrcb_t, u32, *mut c_void) -> c_int;
        rados_unwatch2: "", fn(rados_ioctx_t, u64) -> c_int;
        rados_watch_flush: "", fn(rados_t) -> c_int;
        rados_notify2: "", fn(rados_ioctx_t, *const c_char, *const c_char, c_int, u64, *mut *mut c_char, *mut usize) -> c_int;
        rados_notify_ack: "", fn(rados_ioctx_t, *const c_char, u64, u64, *const c_char, c_int) -> c_int;
        rados_get_instance_id: "", fn(rados_t) -> u64;
        rados_buffer_free: "", fn(*mut c_char) -> ();
    }
}

rtgt_dynlib::functions! {
    /// librbd.
    pub Rbd in "librbd.so.1" {
        rbd_open: "", fn(rados_ioctx_t, *const c_char, *mut rbd_image_t, *const c_char) -> c_int;
        rbd_close: "", fn(rbd_image_t) -> c_int;
        rbd_get_size: "", fn(rbd_image_t, *mut u64) -> c_int;
        rbd_get_id: "", fn(rbd_image_t, *mut c_char, usize) -> c_int;
        rbd_is_exclusive_lock_owner: "", fn(rbd_image_t, *mut c_int) -> c_int;
        rbd_resize: "", fn(rbd_image_t, u64) -> c_int;
        rbd_update_watch: "", fn(rbd_image_t, *mut u64, rbd_update_callback_t, *mut c_void) -> c_int;
        rbd_update_unwatch: "", fn(rbd_image_t, u64) -> c_int;
        rbd_aio_create_completion: "", fn(*mut c_void, rbd_callback_t, *mut rbd_completion_t) -> c_int;
        rbd_aio_get_return_value: "", fn(rbd_completion_t) -> isize;
        rbd_aio_release: "", fn(rbd_completion_t) -> ();
        rbd_aio_read: "", fn(rbd_image_t, u64, usize, *mut c_char, rbd_completion_t) -> c_int;
        rbd_aio_write: "", fn(rbd_image_t, u64, usize, *const c_char, rbd_completion_t) -> c_int;
        rbd_aio_discard: "", fn(rbd_image_t, u64, u64, rbd_completion_t) -> c_int;
        rbd_aio_write_zeroes: "", fn(rbd_image_t, u64, usize, rbd_completion_t, c_int, c_int) -> c_int;
        rbd_aio_compare_and_write: "", fn(rbd_image_t, u64, usize, *const c_char, *const c_char, rbd_completion_t, *mut u64, c_int) -> isize;
        rbd_aio_flush: "", fn(rbd_image_t, rbd_completion_t) -> c_int;
        rbd_diff_iterate2: "", fn(rbd_image_t, *const c_char, u64, u64, u8, u8, rbd_diff_callback_t, *mut c_void) -> c_int;
    }
}

/// Both libraries.
pub struct Ceph {
    pub rados: Rados,
    pub rbd: Rbd,
}

impl Ceph {
    /// librados and librbd, loaded once per process.
    pub fn load() -> Result<&'static Ceph, LoadError> {
        static LIB: OnceLock<Result<Ceph, LoadError>> = OnceLock::new();
        LIB.get_or_init(|| {
            Ok(Ceph {
                rados: Rados::load()?,
                rbd: Rbd::load()?,
            })
        })
        .as_ref()
        .map_err(Clone::clone)
    }
}
