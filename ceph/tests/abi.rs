//! rtgt's librados and librbd declarations against the real headers: every function of
//! `rtgt_ceph::sys` is written here twice, as the Rust type the table must have (checked by
//! the compiler) and as the C type, which a C program built with the host's `librados.h` and
//! `librbd.h` must find compatible with the header's declaration. Needs a C compiler and
//! Ceph's headers (Debian: librbd-dev, librados-dev); without them the test skips with one
//! line, except in CI.

use std::ffi::{c_char, c_int, c_void};
use std::process::Command;

use rtgt_ceph::sys::*;

#[path = "../../transport/src/test_support.rs"]
mod test_support;
use test_support::skip_or_fail;

type Cb = rbd_callback_t;
type UpdateCb = rbd_update_callback_t;
type WatchCb = rados_watchcb2_t;
type DiffCb = rbd_diff_callback_t;
type WatchErrCb = rados_watcherrcb_t;

macro_rules! abi {
    ($($table:ident . $name:ident: fn($($arg:ty),*) -> $ret:ty = $c:literal;)*) => {
        /// Never called: compiles only if each table entry has the type written here.
        #[allow(dead_code)]
        fn rust_types(ceph: &Ceph) {
            $(let _: unsafe extern "C" fn($($arg),*) -> $ret = ceph.$table.$name;)*
        }
        const C_TYPES: &[(&str, &str)] = &[$((stringify!($name), $c)),*];
    };
}

abi! {
    rados.rados_create2: fn(*mut rados_t, *const c_char, *const c_char, u64) -> c_int
        = "int (*)(rados_t *, const char *const, const char *const, uint64_t)";
    rados.rados_conf_read_file: fn(rados_t, *const c_char) -> c_int
        = "int (*)(rados_t, const char *)";
    rados.rados_conf_set: fn(rados_t, *const c_char, *const c_char) -> c_int
        = "int (*)(rados_t, const char *, const char *)";
    rados.rados_connect: fn(rados_t) -> c_int = "int (*)(rados_t)";
    rados.rados_shutdown: fn(rados_t) -> () = "void (*)(rados_t)";
    rados.rados_ioctx_create: fn(rados_t, *const c_char, *mut rados_ioctx_t) -> c_int
        = "int (*)(rados_t, const char *, rados_ioctx_t *)";
    rados.rados_ioctx_destroy: fn(rados_ioctx_t) -> () = "void (*)(rados_ioctx_t)";
    rados.rados_ioctx_set_namespace: fn(rados_ioctx_t, *const c_char) -> ()
        = "void (*)(rados_ioctx_t, const char *)";
    rados.rados_read: fn(rados_ioctx_t, *const c_char, *mut c_char, usize, u64) -> c_int
        = "int (*)(rados_ioctx_t, const char *, char *, size_t, uint64_t)";
    rados.rados_stat: fn(rados_ioctx_t, *const c_char, *mut u64, *mut libc::time_t) -> c_int
        = "int (*)(rados_ioctx_t, const char *, uint64_t *, time_t *)";
    rados.rados_getxattr: fn(rados_ioctx_t, *const c_char, *const c_char, *mut c_char, usize) -> c_int
        = "int (*)(rados_ioctx_t, const char *, const char *, char *, size_t)";
    rados.rados_create_write_op: fn() -> rados_write_op_t = "rados_write_op_t (*)(void)";
    rados.rados_release_write_op: fn(rados_write_op_t) -> () = "void (*)(rados_write_op_t)";
    rados.rados_write_op_create: fn(rados_write_op_t, c_int, *const c_char) -> ()
        = "void (*)(rados_write_op_t, int, const char *)";
    rados.rados_write_op_cmpxattr: fn(rados_write_op_t, *const c_char, u8, *const c_char, usize) -> ()
        = "void (*)(rados_write_op_t, const char *, uint8_t, const char *, size_t)";
    rados.rados_write_op_write_full: fn(rados_write_op_t, *const c_char, usize) -> ()
        = "void (*)(rados_write_op_t, const char *, size_t)";
    rados.rados_write_op_setxattr: fn(rados_write_op_t, *const c_char, *const c_char, usize) -> ()
        = "void (*)(rados_write_op_t, const char *, const char *, size_t)";
    rados.rados_write_op_operate: fn(rados_write_op_t, rados_ioctx_t, *const c_char, *mut libc::time_t, c_int) -> c_int
        = "int (*)(rados_write_op_t, rados_ioctx_t, const char *, time_t *, int)";
    rados.rados_watch3: fn(rados_ioctx_t, *const c_char, *mut u64, WatchCb, WatchErrCb, u32, *mut c_void) -> c_int
        = "int (*)(rados_ioctx_t, const char *, uint64_t *, rados_watchcb2_t, rados_watcherrcb_t, uint32_t, void *)";
    rados.rados_unwatch2: fn(rados_ioctx_t, u64) -> c_int = "int (*)(rados_ioctx_t, uint64_t)";
    rados.rados_watch_flush: fn(rados_t) -> c_int = "int (*)(rados_t)";
    rados.rados_notify2: fn(rados_ioctx_t, *const c_char, *const c_char, c_int, u64, *mut *mut c_char, *mut usize) -> c_int
        = "int (*)(rados_ioctx_t, const char *, const char *, int, uint64_t, char **, size_t *)";
    rados.rados_notify_ack: fn(rados_ioctx_t, *const c_char, u64, u64, *const c_char, c_int) -> c_int
        = "int (*)(rados_ioctx_t, const char *, uint64_t, uint64_t, const char *, int)";
    rados.rados_get_instance_id: fn(rados_t) -> u64 = "uint64_t (*)(rados_t)";
    rados.rados_buffer_free: fn(*mut c_char) -> () = "void (*)(char *)";
    rbd.rbd_open: fn(rados_ioctx_t, *const c_char, *mut rbd_image_t, *const c_char) -> c_int
        = "int (*)(rados_ioctx_t, const char *, rbd_image_t *, const char *)";
    rbd.rbd_close: fn(rbd_image_t) -> c_int = "int (*)(rbd_image_t)";
    rbd.rbd_get_size: fn(rbd_image_t, *mut u64) -> c_int = "int (*)(rbd_image_t, uint64_t *)";
    rbd.rbd_get_id: fn(rbd_image_t, *mut c_char, usize) -> c_int = "int (*)(rbd_image_t, char *, size_t)";
    rbd.rbd_is_exclusive_lock_owner: fn(rbd_image_t, *mut c_int) -> c_int = "int (*)(rbd_image_t, int *)";
    rbd.rbd_resize: fn(rbd_image_t, u64) -> c_int = "int (*)(rbd_image_t, uint64_t)";
    rbd.rbd_update_watch: fn(rbd_image_t, *mut u64, UpdateCb, *mut c_void) -> c_int
        = "int (*)(rbd_image_t, uint64_t *, rbd_update_callback_t, void *)";
    rbd.rbd_update_unwatch: fn(rbd_image_t, u64) -> c_int = "int (*)(rbd_image_t, uint64_t)";
    rbd.rbd_aio_create_completion: fn(*mut c_void, Cb, *mut rbd_completion_t) -> c_int
        = "int (*)(void *, rbd_callback_t, rbd_completion_t *)";
    rbd.rbd_aio_get_return_value: fn(rbd_completion_t) -> isize
        = "ssize_t (*)(rbd_completion_t)";
    rbd.rbd_aio_release: fn(rbd_completion_t) -> () = "void (*)(rbd_completion_t)";
    rbd.rbd_aio_read: fn(rbd_image_t, u64, usize, *mut c_char, rbd_completion_t) -> c_int
        = "int (*)(rbd_image_t, uint64_t, size_t, char *, rbd_completion_t)";
    rbd.rbd_aio_write: fn(rbd_image_t, u64, usize, *const c_char, rbd_completion_t) -> c_int
        = "int (*)(rbd_image_t, uint64_t, size_t, const char *, rbd_completion_t)";
    rbd.rbd_aio_discard: fn(rbd_image_t, u64, u64, rbd_completion_t) -> c_int
        = "int (*)(rbd_image_t, uint64_t, uint64_t, rbd_completion_t)";
    rbd.rbd_aio_write_zeroes: fn(rbd_image_t, u64, usize, rbd_completion_t, c_int, c_int) -> c_int
        = "int (*)(rbd_image_t, uint64_t, size_t, rbd_completion_t, int, int)";
    rbd.rbd_aio_compare_and_write: fn(rbd_image_t, u64, usize, *const c_char, *const c_char, rbd_completion_t, *mut u64, c_int) -> isize
        = "ssize_t (*)(rbd_image_t, uint64_t, size_t, const char *, const char *, rbd_completion_t, uint64_t *, int)";
    rbd.rbd_aio_flush: fn(rbd_image_t, rbd_completion_t) -> c_int
        = "int (*)(rbd_image_t, rbd_completion_t)";
    rbd.rbd_diff_iterate2: fn(rbd_image_t, *const c_char, u64, u64, u8, u8, DiffCb, *mut c_void) -> c_int
        = "int (*)(rbd_image_t, const char *, uint64_t, uint64_t, uint8_t, uint8_t, int (*)(uint64_t, size_t, int, void *), void *)";
}

#[test]
fn declarations_match_the_headers() {
    let dir = tempfile::tempdir().unwrap();
    let mut src = String::from(
        "#include <stdint.h>\n#include <sys/types.h>\n#include <rados/librados.h>\n#include <rbd/librbd.h>\n",
    );
    for (name, ty) in C_TYPES {
        src.push_str(&format!(
            "_Static_assert(__builtin_types_compatible_p(__typeof__(&{name}), {ty}), \"{name}\");\n"
        ));
    }
    // The constants rtgt uses.
    src.push_str(&format!(
        "_Static_assert(LIBRADOS_CMPXATTR_OP_EQ == {LIBRADOS_CMPXATTR_OP_EQ}, \"cmpxattr\");\n\
         _Static_assert(LIBRADOS_CREATE_EXCLUSIVE == {LIBRADOS_CREATE_EXCLUSIVE}, \"create\");\n\
         int main(void) {{ return 0; }}\n"
    ));
    let c = dir.path().join("abi.c");
    std::fs::write(&c, src).unwrap();
    if !std::path::Path::new("/usr/include/rbd/librbd.h").exists() {
        return skip_or_fail("no rbd/librbd.h (Debian: librbd-dev librados-dev)");
    }
    let out = Command::new("cc")
        .args(["-std=gnu11", "-fsyntax-only"])
        .arg(&c)
        .output();
    let out = match out {
        Ok(o) => o,
        Err(e) => return skip_or_fail(format!("no C compiler: {e}")),
    };
    assert!(
        out.status.success(),
        "the declarations differ from the headers:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The libraries load with every function rtgt declares.
#[test]
fn libraries_load() {
    match Ceph::load() {
        Ok(_) => {}
        Err(e) => skip_or_fail(format!("{e} (Debian: librbd1 librados2)")),
    }
}
