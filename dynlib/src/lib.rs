//! C libraries loaded at run time rather than linked: rdma-core (for RDMA devices) and
//! librados/librbd (for Ceph images). A build, the package and the quick start then need
//! none of them, and a host without one gets an error naming what to install when a feature
//! that needs it is configured.
//!
//! [`functions!`] declares a library's function table and its loader. Each function is
//! taken at the symbol version its C header binds to (`dlvsym`) where the library versions
//! its symbols, so an older compatibility entry point is never called by mistake; an empty
//! version takes the unversioned symbol (`dlsym`). Libraries stay loaded for the life of the
//! process.

use std::ffi::{c_void, CStr, CString};
use std::fmt;

/// Why a library's table could not be loaded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoadError {
    /// The library could not be opened (`dlerror`'s reason).
    Library { name: &'static str, why: String },
    /// The library lacks a function (an older release than the header rtgt follows).
    Symbol {
        name: &'static str,
        version: &'static str,
    },
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LoadError::Library { name, why } => write!(f, "{name} cannot be loaded ({why})"),
            LoadError::Symbol { name, version: "" } => write!(f, "no function {name}"),
            LoadError::Symbol { name, version } => write!(f, "no function {name}@{version}"),
        }
    }
}

impl std::error::Error for LoadError {}

/// A library opened with `dlopen`, never closed.
#[derive(Debug, Clone, Copy)]
pub struct Library {
    handle: *mut c_void,
    name: &'static str,
}

// SAFETY: a dlopen handle is a process-wide token; dlsym and dlvsym may be called with it
// from any thread.
unsafe impl Send for Library {}
// SAFETY: as above; the handle is never closed, so it is never invalidated.
unsafe impl Sync for Library {}

impl Library {
    /// Opens `name` (a soname such as `librbd.so.1`).
    pub fn open(name: &'static str) -> Result<Library, LoadError> {
        let c = CString::new(name).map_err(|_| LoadError::Library {
            name,
            why: "NUL in the name".into(),
        })?;
        // SAFETY: `c` is a valid C string; RTLD_NOW resolves the library's own symbols at
        // once, so a broken installation fails here and not at the first call.
        let handle = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if handle.is_null() {
            return Err(LoadError::Library {
                name,
                why: last_dl_error(),
            });
        }
        Ok(Library { handle, name })
    }

    /// The name it was opened by.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The address of function `name` at `version` (unversioned when empty).
    pub fn symbol(
        &self,
        name: &'static str,
        version: &'static str,
    ) -> Result<*mut c_void, LoadError> {
        let missing = LoadError::Symbol { name, version };
        let n = CString::new(name).map_err(|_| missing.clone())?;
        let p = if version.is_empty() {
            // SAFETY: `handle` came from dlopen and is never closed; `n` is a C string.
            unsafe { libc::dlsym(self.handle, n.as_ptr()) }
        } else {
            let v = CString::new(version).map_err(|_| missing.clone())?;
            // SAFETY: as above; `v` is a C string.
            unsafe { libc::dlvsym(self.handle, n.as_ptr(), v.as_ptr()) }
        };
        if p.is_null() {
            return Err(missing);
        }
        Ok(p)
    }
}

fn last_dl_error() -> String {
    // SAFETY: dlerror returns null or a C string valid until the next dl call on this thread.
    let e = unsafe { libc::dlerror() };
    if e.is_null() {
        return "unknown error".into();
    }
    // SAFETY: non-null, NUL-terminated (above).
    unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
}

/// Declares a function table and its loader: each entry is `name: version, fn type`, the
/// version `""` for a library without symbol versions. The table's `load()` opens the
/// library and takes every function, or names the first one missing. The caller's module
/// checks the declared types against the C headers in a test.
#[macro_export]
macro_rules! functions {
    ($(#[$meta:meta])* $vis:vis $table:ident in $lib:literal {
        $($name:ident: $version:literal, fn($($arg:ty),*) -> $ret:ty;)*
    }) => {
        $(#[$meta])*
        #[allow(non_snake_case)]
        $vis struct $table {
            $(pub $name: unsafe extern "C" fn($($arg),*) -> $ret,)*
        }

        impl $table {
            $vis fn load() -> Result<$table, $crate::LoadError> {
                let lib = $crate::Library::open($lib)?;
                Ok($table {
                    $($name: {
                        let p = lib.symbol(stringify!($name), $version)?;
                        // SAFETY: `p` is the address of the C function of that name and
                        // version, whose signature in the library's headers is the one
                        // declared here (the declaring crate's ABI test checks the types).
                        unsafe {
                            ::std::mem::transmute::<
                                *mut ::std::ffi::c_void,
                                unsafe extern "C" fn($($arg),*) -> $ret,
                            >(p)
                        }
                    },)*
                })
            }
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    functions! {
        Libc in "libc.so.6" {
            getpid: "GLIBC_2.2.5", fn() -> libc::pid_t;
            strlen: "", fn(*const libc::c_char) -> usize;
        }
    }

    #[test]
    fn loads_versioned_and_unversioned_functions() {
        let t = Libc::load().expect("libc loads");
        // SAFETY: getpid and strlen of the running libc, called with a C string.
        let (pid, n) = unsafe { ((t.getpid)(), (t.strlen)(c"four".as_ptr())) };
        assert_eq!(pid as u32, std::process::id());
        assert_eq!(n, 4);
    }

    #[test]
    fn names_what_is_missing() {
        let e = Library::open("libnot-there.so.9").unwrap_err();
        assert!(
            matches!(&e, LoadError::Library { name: "libnot-there.so.9", why } if why.contains("libnot-there")),
            "{e:?}"
        );
        let lib = Library::open("libc.so.6").unwrap();
        assert_eq!(
            lib.symbol("no_such_function_here", "")
                .unwrap_err()
                .to_string(),
            "no function no_such_function_here"
        );
        assert_eq!(
            lib.symbol("getpid", "GLIBC_0.0").unwrap_err(),
            LoadError::Symbol {
                name: "getpid",
                version: "GLIBC_0.0"
            }
        );
    }
}
