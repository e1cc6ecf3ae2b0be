//! Who may use the API: callers, their scopes, and the checks each kind of listener makes.
//!
//! - TCP listeners take a bearer token: the admin token may do everything, the read-only
//!   token may read the configuration without secrets, sessions and metrics. A missing or
//!   wrong token is a 401; only the health check and the OpenAPI document need none.
//! - The unix socket takes no token; its file mode and the peer's credentials guard it: root,
//!   rtgtd's own user and the members of the socket's group (default `rtgt`) are admins,
//!   anyone else who reaches it gets a 403.
//! - Metrics listeners serve only `/metrics`, to anyone.

use std::ffi::CString;
use std::fmt;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::sync::Arc;

use axum::extract::connect_info::Connected;
use axum::serve::IncomingStream;
use tokio::net::UnixListener;

/// What a caller may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Scope {
    /// Only `/metrics` (metrics listeners).
    Metrics,
    /// Read the configuration without secrets, sessions, status and metrics.
    Read,
    /// Everything: changes, secrets.
    Admin,
}

/// Who made a request, as its listener established it; shown in the audit log.
#[derive(Debug, Clone)]
pub enum Caller {
    /// A process on the unix socket.
    Socket(PeerCred),
    /// A bearer token on a TCP listener.
    Token {
        name: &'static str,
        peer: Option<SocketAddr>,
    },
    /// No credentials (the health check, metrics listeners).
    Anonymous { peer: Option<SocketAddr> },
}

impl fmt::Display for Caller {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Caller::Socket(p) => write!(f, "uid {} (pid {}) on the socket", p.uid, p.pid),
            Caller::Token {
                name,
                peer: Some(a),
            } => write!(f, "{name} token from {a}"),
            Caller::Token { name, peer: None } => write!(f, "{name} token"),
            Caller::Anonymous { peer: Some(a) } => write!(f, "anonymous from {a}"),
            Caller::Anonymous { peer: None } => f.write_str("anonymous"),
        }
    }
}

/// The address of a TCP caller.
#[derive(Debug, Clone, Copy)]
pub struct Peer(pub SocketAddr);

impl Connected<IncomingStream<'_, tokio::net::TcpListener>> for Peer {
    fn connect_info(stream: IncomingStream<'_, tokio::net::TcpListener>) -> Self {
        Peer(*stream.remote_addr())
    }
}

/// The credentials of the process at the other end of a unix socket connection
/// (SO_PEERCRED and SO_PEERGROUPS).
#[derive(Debug, Clone, Default)]
pub struct PeerCred {
    pub uid: u32,
    pub gid: u32,
    pub pid: i32,
    /// Supplementary groups; empty when the kernel cannot tell.
    pub groups: Vec<u32>,
    /// The credentials could be read.
    pub known: bool,
}

impl PeerCred {
    /// Reads the peer's credentials of a connected unix socket.
    pub fn of(stream: &tokio::net::UnixStream) -> PeerCred {
        match stream.peer_cred() {
            Ok(c) => PeerCred {
                uid: c.uid(),
                gid: c.gid(),
                pid: c.pid().unwrap_or(0),
                groups: peer_groups(stream.as_raw_fd()).unwrap_or_default(),
                known: true,
            },
            Err(_) => PeerCred::default(),
        }
    }
}

impl Connected<IncomingStream<'_, UnixListener>> for PeerCred {
    fn connect_info(stream: IncomingStream<'_, UnixListener>) -> Self {
        PeerCred::of(stream.io())
    }
}

/// SO_PEERGROUPS: the supplementary groups of the peer when it connected (Linux 4.13+).
fn peer_groups(fd: i32) -> std::io::Result<Vec<u32>> {
    let mut groups = vec![0 as libc::gid_t; 64];
    loop {
        let mut len = (groups.len() * std::mem::size_of::<libc::gid_t>()) as libc::socklen_t;
        // SAFETY: the buffer holds `len` bytes of gid_t and outlives the call; the kernel
        // writes at most `len` bytes and stores the size it needs in `len`.
        let rc = unsafe {
            libc::getsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_PEERGROUPS,
                groups.as_mut_ptr().cast(),
                &mut len,
            )
        };
        let n = len as usize / std::mem::size_of::<libc::gid_t>();
        if rc == 0 {
            groups.truncate(n);
            return Ok(groups);
        }
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::ERANGE) && n > groups.len() && n <= 65536 {
            groups.resize(n, 0);
            continue;
        }
        return Err(e);
    }
}

/// The id of group `name`, if the system has it.
pub fn group_id(name: &str) -> Option<u32> {
    let cname = CString::new(name).ok()?;
    let mut buf = vec![0 as libc::c_char; 16 * 1024];
    // SAFETY: an all-zero `struct group` is a valid value to be overwritten.
    let mut grp: libc::group = unsafe { std::mem::zeroed() };
    let mut result: *mut libc::group = std::ptr::null_mut();
    // SAFETY: every pointer is valid for the call: the name is NUL-terminated, the buffer
    // holds `buf.len()` bytes, `grp` and `result` are live locals. The returned strings
    // point into `buf`, which is not read after this function.
    let rc = unsafe {
        libc::getgrnam_r(
            cname.as_ptr(),
            &mut grp,
            buf.as_mut_ptr(),
            buf.len(),
            &mut result,
        )
    };
    (rc == 0 && !result.is_null()).then_some(grp.gr_gid)
}

/// Who the unix socket admits: root, rtgtd's own user and the members of one group.
#[derive(Debug, Clone)]
pub struct SocketPolicy {
    /// rtgtd's effective uid.
    pub owner: u32,
    /// The admitted group, with its name for messages.
    pub group: Option<(String, u32)>,
}

impl SocketPolicy {
    /// The policy for rtgtd's effective user and the group `group`, if it exists.
    pub fn new(group: &str) -> SocketPolicy {
        SocketPolicy {
            // SAFETY: geteuid has no preconditions and cannot fail.
            owner: unsafe { libc::geteuid() },
            group: group_id(group).map(|g| (group.to_string(), g)),
        }
    }

    pub fn admits(&self, p: &PeerCred) -> bool {
        if !p.known {
            return false;
        }
        if p.uid == 0 || p.uid == self.owner {
            return true;
        }
        self.group
            .as_ref()
            .is_some_and(|(_, g)| p.gid == *g || p.groups.contains(g))
    }

    /// Why a peer was refused, for the 403.
    pub fn refusal(&self) -> String {
        match &self.group {
            Some((name, _)) => {
                format!("the API socket admits root, rtgtd's user and members of group {name:?}")
            }
            None => "the API socket admits root and rtgtd's user".to_string(),
        }
    }
}

/// The bearer tokens of TCP listeners.
#[derive(Clone)]
pub struct Tokens {
    pub admin: Arc<str>,
    pub read: Arc<str>,
}

impl fmt::Debug for Tokens {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Tokens(********)")
    }
}

impl Tokens {
    /// The scope and name of a presented token; every comparison takes time independent of
    /// where the strings differ, and both are always made.
    pub fn check(&self, given: &str) -> Option<(Scope, &'static str)> {
        let admin = crate::token::matches(given, &self.admin);
        let read = crate::token::matches(given, &self.read);
        if admin {
            Some((Scope::Admin, "admin"))
        } else if read {
            Some((Scope::Read, "read-only"))
        } else {
            None
        }
    }
}

/// What a listener checks.
#[derive(Debug, Clone)]
pub enum Guard {
    /// Bearer tokens (TCP listeners).
    Tokens(Tokens),
    /// Peer credentials (the unix socket).
    Socket(SocketPolicy),
    /// Nothing; the listener serves `/metrics` only.
    Metrics,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_scopes() {
        let t = Tokens {
            admin: "a".repeat(64).into(),
            read: "b".repeat(64).into(),
        };
        assert_eq!(t.check(&"a".repeat(64)), Some((Scope::Admin, "admin")));
        assert_eq!(t.check(&"b".repeat(64)), Some((Scope::Read, "read-only")));
        assert_eq!(t.check(&"a".repeat(63)), None);
        assert_eq!(t.check(""), None);
        assert!(!format!("{t:?}").contains('a'));
    }

    #[test]
    fn socket_admission() {
        let p = SocketPolicy {
            owner: 1000,
            group: Some(("rtgt".into(), 990)),
        };
        let peer = |uid, gid, groups: &[u32]| PeerCred {
            uid,
            gid,
            pid: 1,
            groups: groups.to_vec(),
            known: true,
        };
        assert!(p.admits(&peer(0, 0, &[])));
        assert!(p.admits(&peer(1000, 1000, &[])));
        assert!(p.admits(&peer(1001, 990, &[])));
        assert!(p.admits(&peer(1001, 1001, &[27, 990])));
        assert!(!p.admits(&peer(65534, 65534, &[])));
        assert!(!p.admits(&PeerCred::default()));
        let no_group = SocketPolicy {
            owner: 0,
            group: None,
        };
        assert!(!no_group.admits(&peer(1001, 990, &[990])));
        assert!(p.refusal().contains("rtgt"));
    }

    #[test]
    fn groups_are_looked_up() {
        assert_eq!(group_id("root"), Some(0));
        assert_eq!(group_id("no-such-group-for-rtgt"), None);
        assert_eq!(group_id("nul\0byte"), None);
    }

    #[tokio::test]
    async fn peer_credentials_of_a_socket_pair() {
        let (a, _b) = tokio::net::UnixStream::pair().unwrap();
        let p = PeerCred::of(&a);
        assert!(p.known);
        // SAFETY: getuid/getgid have no preconditions.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        assert_eq!((p.uid, p.gid), (uid, gid));
        assert_eq!(p.pid as u32, std::process::id());
    }
}
