//! Connections to Ceph clusters: one librados handle per cluster and identity, shared by every
//! image opened through it (a handle carries its own threads and sockets).

use std::ffi::CString;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use crate::sys::{rados_ioctx_t, rados_t, Ceph};
use crate::CephError;

/// Which cluster, as whom, and how long an operation may take.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ClusterSpec {
    /// The cluster's configuration file (monitor addresses).
    pub conf: PathBuf,
    /// The client name without `client.` (`admin`, `rtgt`).
    pub client_id: String,
    /// A keyring other than the configuration's.
    pub keyring: Option<PathBuf>,
    /// How long a monitor or OSD operation, or the connection, may take before it fails with
    /// ETIMEDOUT; commands then end with NOT READY instead of hanging while the cluster is
    /// unreachable.
    pub op_timeout: Duration,
}

/// The open connections, by spec and use.
static OPEN: Mutex<Vec<(ClusterSpec, Usage, Weak<Cluster>)>> = Mutex::new(Vec::new());

/// What a connection is for (each use has its own client per cluster and identity).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Usage {
    /// RBD images (their I/O and exclusive locks).
    Images,
    /// State the gateways share ([`crate::RadosState`]).
    SharedState,
}

/// A connected librados handle.
pub struct Cluster {
    pub(crate) lib: &'static Ceph,
    handle: rados_t,
    spec: ClusterSpec,
}

// SAFETY: librados handles may be used from any thread; rtgt never frees one while it is
// used (the handle lives as long as the last image opened through it holds its Arc).
unsafe impl Send for Cluster {}
// SAFETY: as above: librados serialises what needs serialising inside.
unsafe impl Sync for Cluster {}

pub(crate) fn cstring(what: &str, s: &str) -> Result<CString, CephError> {
    CString::new(s).map_err(|_| CephError::Config(format!("{what} {s:?} contains NUL")))
}

fn path_cstring(what: &str, p: &std::path::Path) -> Result<CString, CephError> {
    use std::os::unix::ffi::OsStrExt;
    CString::new(p.as_os_str().as_bytes())
        .map_err(|_| CephError::Config(format!("{what} {} contains NUL", p.display())))
}

impl Cluster {
    /// Connects (blocking, at most about `op_timeout`), or returns the existing connection
    /// for the same spec and use: images share one client, the gateways' shared state
    /// another, so that a client the cluster blocklists (another gateway broke its image
    /// lock) leaves the reservation state reachable.
    pub fn connect(spec: &ClusterSpec, usage: Usage) -> Result<Arc<Cluster>, CephError> {
        let mut open = OPEN.lock().unwrap_or_else(PoisonError::into_inner);
        open.retain(|(_, _, w)| w.strong_count() > 0);
        if let Some(c) = open
            .iter()
            .find(|(s, u, _)| s == spec && *u == usage)
            .and_then(|(_, _, w)| w.upgrade())
        {
            return Ok(c);
        }
        let c = Arc::new(Cluster::connect_new(spec)?);
        open.push((spec.clone(), usage, Arc::downgrade(&c)));
        Ok(c)
    }

    /// A new connection in place of `old` (which the cluster blocklisted): later
    /// [`Cluster::connect`]s for the same spec and use get the new one.
    pub fn reconnect(
        spec: &ClusterSpec,
        usage: Usage,
        old: &Arc<Cluster>,
    ) -> Result<Arc<Cluster>, CephError> {
        {
            let mut open = OPEN.lock().unwrap_or_else(PoisonError::into_inner);
            open.retain(|(_, _, w)| w.as_ptr() != Arc::as_ptr(old));
        }
        Cluster::connect(spec, usage)
    }

    fn connect_new(spec: &ClusterSpec) -> Result<Cluster, CephError> {
        let lib = Ceph::load()?;
        let name = cstring("client id", &format!("client.{}", spec.client_id))?;
        let mut handle: rados_t = std::ptr::null_mut();
        // SAFETY: `handle` is written by rados_create2; the strings are valid C strings.
        let r =
            unsafe { (lib.rados.rados_create2)(&mut handle, c"ceph".as_ptr(), name.as_ptr(), 0) };
        if r < 0 {
            return Err(CephError::call("rados_create2", r));
        }
        // From here `cluster` owns the handle and shuts it down on every error path.
        let cluster = Cluster {
            lib,
            handle,
            spec: spec.clone(),
        };
        let conf = path_cstring("ceph_conf", &spec.conf)?;
        // SAFETY: live handle, valid C string.
        let r = unsafe { (lib.rados.rados_conf_read_file)(handle, conf.as_ptr()) };
        if r < 0 {
            return Err(CephError::Conf {
                path: spec.conf.clone(),
                errno: -r,
            });
        }
        if let Some(k) = &spec.keyring {
            cluster.set("keyring", &path_cstring("keyring", k)?)?;
        }
        let secs = spec.op_timeout.as_secs().max(1).to_string();
        for option in [
            "rados_osd_op_timeout",
            "rados_mon_op_timeout",
            "client_mount_timeout",
        ] {
            cluster.set(option, &cstring(option, &secs)?)?;
        }
        // Gateways share images: a client-side cache would answer reads with data another
        // gateway has overwritten, and writes are durable when they complete without one.
        cluster.set("rbd_cache", c"false")?;
        // A discard of less than librbd's granularity (64 KiB) is otherwise skipped, and the
        // blocks would not read back as zeroes as UNMAP promises (LBPRZ).
        cluster.set("rbd_skip_partial_discard", c"false")?;
        // SAFETY: live, configured handle.
        let r = unsafe { (lib.rados.rados_connect)(handle) };
        if r < 0 {
            return Err(CephError::Connect {
                conf: spec.conf.clone(),
                errno: -r,
            });
        }
        tracing::info!(conf = %spec.conf.display(), client = %spec.client_id, "connected to the Ceph cluster");
        Ok(cluster)
    }

    fn set(&self, option: &str, value: &std::ffi::CStr) -> Result<(), CephError> {
        let o = cstring("option", option)?;
        // SAFETY: live handle, valid C strings.
        let r = unsafe { (self.lib.rados.rados_conf_set)(self.handle, o.as_ptr(), value.as_ptr()) };
        if r < 0 {
            return Err(CephError::call("rados_conf_set", r));
        }
        Ok(())
    }

    /// The librados handle.
    pub(crate) fn raw(&self) -> rados_t {
        self.handle
    }

    pub fn spec(&self) -> &ClusterSpec {
        &self.spec
    }

    /// An I/O context on `pool` and `namespace` (blocking: looks the pool up).
    pub(crate) fn ioctx(self: &Arc<Self>, pool: &str, namespace: &str) -> Result<IoCtx, CephError> {
        let p = cstring("pool", pool)?;
        let mut io: rados_ioctx_t = std::ptr::null_mut();
        // SAFETY: connected handle; `io` is written on success.
        let r = unsafe { (self.lib.rados.rados_ioctx_create)(self.handle, p.as_ptr(), &mut io) };
        if r < 0 {
            return Err(CephError::Pool {
                pool: pool.into(),
                errno: -r,
            });
        }
        let ns = cstring("namespace", namespace)?;
        // SAFETY: `io` was just created; librados copies the namespace.
        unsafe { (self.lib.rados.rados_ioctx_set_namespace)(io, ns.as_ptr()) };
        Ok(IoCtx {
            cluster: Arc::clone(self),
            io,
        })
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // SAFETY: the handle came from rados_create2 and nothing uses it any more: every
        // I/O context and image holds an Arc of this.
        unsafe { (self.lib.rados.rados_shutdown)(self.handle) };
    }
}

/// A pool (and namespace) of a cluster.
pub(crate) struct IoCtx {
    pub(crate) cluster: Arc<Cluster>,
    pub(crate) io: rados_ioctx_t,
}

// SAFETY: librados I/O contexts are thread-safe for the calls rtgt makes.
unsafe impl Send for IoCtx {}
// SAFETY: as above.
unsafe impl Sync for IoCtx {}

impl Drop for IoCtx {
    fn drop(&mut self) {
        // SAFETY: created by rados_ioctx_create; images opened on it hold an Arc of the
        // IoCtx, so none is open any more.
        unsafe { (self.cluster.lib.rados.rados_ioctx_destroy)(self.io) };
    }
}
