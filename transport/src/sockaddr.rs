//! Socket addresses in C's layout, for the system calls and C libraries that take them.

use std::net::SocketAddr;

/// `addr` as a `sockaddr_storage` holding a `sockaddr_in` or `sockaddr_in6`, and that
/// structure's length.
pub(crate) fn to_storage(addr: SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: sockaddr_storage is plain old data for which all-zero bytes are valid.
    let mut st: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in.
            unsafe { std::ptr::write((&mut st as *mut libc::sockaddr_storage).cast(), sin) };
            std::mem::size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: 0,
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in6.
            unsafe { std::ptr::write((&mut st as *mut libc::sockaddr_storage).cast(), sin6) };
            std::mem::size_of::<libc::sockaddr_in6>()
        }
    };
    (st, len as libc::socklen_t)
}

/// The address a `sockaddr_storage` holds, if it is an IPv4 or IPv6 one.
pub(crate) fn from_storage(st: &libc::sockaddr_storage) -> Option<SocketAddr> {
    match st.ss_family as libc::c_int {
        libc::AF_INET => {
            // SAFETY: the family says the storage holds a sockaddr_in, which it is aligned
            // for and larger than.
            let sin = unsafe { *(st as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
            let ip = std::net::Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes());
            Some(SocketAddr::new(ip.into(), u16::from_be(sin.sin_port)))
        }
        libc::AF_INET6 => {
            // SAFETY: as above, for sockaddr_in6.
            let sin6 =
                unsafe { *(st as *const libc::sockaddr_storage).cast::<libc::sockaddr_in6>() };
            let ip = std::net::Ipv6Addr::from(sin6.sin6_addr.s6_addr);
            Some(SocketAddr::V6(std::net::SocketAddrV6::new(
                ip,
                u16::from_be(sin6.sin6_port),
                sin6.sin6_flowinfo,
                sin6.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socket_addresses_in_c_layout() {
        let (ss, len) = to_storage("10.1.2.3:3260".parse().unwrap());
        assert_eq!(len as usize, std::mem::size_of::<libc::sockaddr_in>());
        // SAFETY: written as a sockaddr_in.
        let sin = unsafe { *(&ss as *const _ as *const libc::sockaddr_in) };
        assert_eq!(sin.sin_family, libc::AF_INET as libc::sa_family_t);
        assert_eq!(sin.sin_port.to_ne_bytes(), [0x0c, 0xbc]);
        assert_eq!(sin.sin_addr.s_addr.to_ne_bytes(), [10, 1, 2, 3]);
        let (ss, len) = to_storage("[fe80::1%2]:4420".parse().unwrap());
        assert_eq!(len as usize, std::mem::size_of::<libc::sockaddr_in6>());
        // SAFETY: written as a sockaddr_in6.
        let sin6 = unsafe { *(&ss as *const _ as *const libc::sockaddr_in6) };
        assert_eq!(sin6.sin6_family, libc::AF_INET6 as libc::sa_family_t);
        assert_eq!(sin6.sin6_port.to_ne_bytes(), [0x11, 0x44]);
        assert_eq!(sin6.sin6_addr.s6_addr[0..2], [0xfe, 0x80]);
        assert_eq!(sin6.sin6_addr.s6_addr[15], 1);
        assert_eq!(sin6.sin6_scope_id, 2);
        for a in ["10.1.2.3:3260", "[fe80::1%2]:4420", "[::]:0"] {
            let a: SocketAddr = a.parse().unwrap();
            assert_eq!(from_storage(&to_storage(a).0), Some(a));
        }
        // SAFETY: all-zero sockaddr_storage is valid (family AF_UNSPEC).
        let none: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        assert_eq!(from_storage(&none), None);
    }
}
