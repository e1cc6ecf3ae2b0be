//! rtgt on Ceph: [`RbdBackstore`] serves an RBD image through librbd, which rtgt loads at
//! run time (`librbd.so.1`, `librados.so.2`), so neither a build nor a host without Ceph
//! needs the libraries.

pub mod cluster;
mod rbd;
mod state;
pub mod sys;

use std::path::PathBuf;

pub use cluster::{Cluster, ClusterSpec, Usage};
pub use rbd::{RbdBackstore, RbdOptions};
pub use state::RadosState;

/// Why a cluster, pool or image could not be used.
#[derive(Debug, thiserror::Error)]
pub enum CephError {
    #[error("{0}: install Ceph's client libraries (Debian: librbd1 librados2)")]
    Load(#[from] rtgt_dynlib::LoadError),
    #[error("{0}")]
    Config(String),
    #[error("cannot read the Ceph configuration {}: {}", path.display(), errno_text(*errno))]
    Conf { path: PathBuf, errno: i32 },
    #[error("cannot connect to the Ceph cluster of {}: {}", conf.display(), errno_text(*errno))]
    Connect { conf: PathBuf, errno: i32 },
    #[error("cannot open pool {pool:?}: {}", errno_text(*errno))]
    Pool { pool: String, errno: i32 },
    #[error("cannot open rbd image {image}: {}", errno_text(*errno))]
    Image { image: String, errno: i32 },
    #[error("{what} failed: {}", errno_text(*errno))]
    Call { what: &'static str, errno: i32 },
}

impl CephError {
    pub(crate) fn call(what: &'static str, ret: std::ffi::c_int) -> CephError {
        CephError::Call { what, errno: -ret }
    }

    /// The error number librados or librbd returned, if any.
    pub fn errno(&self) -> Option<i32> {
        match self {
            CephError::Conf { errno, .. }
            | CephError::Connect { errno, .. }
            | CephError::Pool { errno, .. }
            | CephError::Image { errno, .. }
            | CephError::Call { errno, .. } => Some(*errno),
            _ => None,
        }
    }
}

fn errno_text(errno: i32) -> String {
    std::io::Error::from_raw_os_error(errno).to_string()
}
