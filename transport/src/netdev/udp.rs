//! RoCEv2 over a kernel UDP socket bound to one local address on port 4791.
//!
//! # What a UDP socket can and cannot do (docs/WIRE.md §2 and §8)
//!
//! * Transmit: the socket is unconnected and has `IP_PMTUDISC_DO`, so Linux sends DF with
//!   IP ID 0 — the IPv4 header is then known in advance and the ICRC (which covers the ID,
//!   flags, lengths, addresses and UDP ports) is computable. The engine's datagram is rewritten
//!   to what the kernel will put on the wire (source address and port of the socket, ID 0,
//!   DF) and its ICRC regenerated before the UDP payload is sent. The device learns the
//!   socket's ports ([`NetDev::tx_ports`]) and builds its datagrams that way, so these go out
//!   as they are, without a copy or a second ICRC pass.
//! * Buffers are reused: rewritten datagrams in the netdev, received ones once the device gives
//!   them back ([`NetDev::recycle`]), so the data path does not allocate per packet.
//! * Receive: the kernel strips the IP header and does not report the IPv4 ID, so the header
//!   handed to the engine is a reconstruction (ID 0, DF): create the device with
//!   `ipv4_header_rebuilt`, and it checks IPv4 ICRCs for everything but those two fields
//!   ([`crate::wire::icrc::UnknownIpv4Fields`]). IPv6 has no ID field, so its reconstruction
//!   is exact and the ICRC is checked in full. Checking IPv4 ICRCs in full needs an
//!   AF_PACKET, raw or AF_XDP socket: [`UdpNetDev::bind_with_packet_rx`] adds an AF_PACKET
//!   socket on the interface (CAP_NET_RAW) that receives the whole IP datagrams, real ID
//!   included, so the device can keep `check_icrc = true`; the UDP socket then only transmits
//!   (and keeps the port bound so the kernel sends no ICMP port-unreachable).
//! * Segmentation offload: a run of datagrams to one peer whose UDP payloads have one size
//!   (the last may be shorter) — the packets of one message at the path MTU — goes out as one
//!   UDP GSO send (`UDP_SEGMENT`), which Linux (or the NIC) cuts back into exactly those
//!   datagrams, so the wire carries the same RoCEv2 packets for a fraction of the stack's
//!   per-datagram work. Linux numbers the segments of one send with consecutive IPv4 IDs from
//!   0; since the ICRC covers the ID, the segment at index k is sent with the ICRC computed for
//!   ID k (checked against a tap device: every segment's ICRC holds). A kernel or route that
//!   refuses GSO turns it off for the socket.
//! * Receive offload: the socket has `UDP_GRO`, so a GSO run from a sender on the same host
//!   arrives in one piece with its segment size, and is cut into its datagrams here. A packet
//!   socket sees such a run before the stack cuts it; its virtio-net header
//!   (`PACKET_VNET_HDR`) gives the segment size, and the datagrams are cut with the IPv4 IDs
//!   the stack would give them.
//! * IPv6 peers (rxe) send zero UDP checksums; `UDP_NO_CHECK6_RX` makes the kernel accept them.
//! * The socket is bound to one address, which therefore is the destination of everything it
//!   receives (no `IP_PKTINFO` needed).
//!
//! Socket options, `sendmmsg` and `recvmmsg` (batches of 32 messages per system call, control
//! messages for GSO and GRO) go through libc; that is the only `unsafe` in this module.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsRawFd;

use super::{Expected, NetDev, Outgoing, RxSink};
use crate::wire::{datagram, icrc, ipv4, ipv6, roce, udp, Datagram, IpRepr};

/// A UDP socket carrying RoCEv2.
#[derive(Debug)]
pub struct UdpNetDev {
    socket: tokio::net::UdpSocket,
    local: SocketAddr,
    /// Destination UDP port (4791; tests may use another).
    pub peer_port: u16,
    buf: Vec<u8>,
    batch_bufs: Vec<Vec<u8>>,
    /// Buffers for received datagrams (given back through `recycle`) and for rewritten
    /// outgoing ones, reused so the data path allocates nothing per packet.
    rx_pool: Vec<Vec<u8>>,
    tx_bufs: Vec<Vec<u8>>,
    packet_rx: Option<tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>>,
    /// Runs of datagrams to one peer go out as one UDP GSO send (cleared if the kernel or
    /// the route refuses it).
    gso: bool,
    /// The socket has `UDP_GRO`: a received datagram may be several coalesced ones.
    gro: bool,
    /// Segments of a coalesced datagram that [`NetDev::receive`] has not returned yet.
    pending: std::collections::VecDeque<Vec<u8>>,
    /// Whole datagrams on their way to [`NetDev::receive_each`] (kept for its allocation).
    whole: Vec<Vec<u8>>,
    /// What the last `recvmmsg` got (kept for its allocation).
    got: Vec<(usize, usize, SocketAddr, usize)>,
    /// The part of a datagram received in place that was not expected, put together again.
    gather: Vec<u8>,
    /// How a segment's ICRC changes with the IP ID the kernel gives it in a GSO send.
    ident_deltas: icrc::UnknownIpv4Fields,
}

fn setsockopt_int(fd: i32, level: i32, name: i32, value: i32) -> io::Result<()> {
    // SAFETY: `value` is a live c_int for the duration of the call and its exact size is
    // passed; `fd` is an open socket owned by the caller.
    let r = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (&value as *const i32).cast(),
            std::mem::size_of::<i32>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

impl UdpNetDev {
    /// Binds `addr` (normally port 4791) with the options above. Needs a tokio runtime.
    pub fn bind(addr: SocketAddr) -> io::Result<UdpNetDev> {
        UdpNetDev::from_socket(std::net::UdpSocket::bind(addr)?)
    }

    /// [`UdpNetDev::bind`] for a socket already bound (one of [`bind_group`]'s).
    pub fn from_socket(std_sock: std::net::UdpSocket) -> io::Result<UdpNetDev> {
        let addr = std_sock.local_addr()?;
        std_sock.set_nonblocking(true)?;
        let fd = std_sock.as_raw_fd();
        match addr.ip() {
            IpAddr::V4(_) => setsockopt_int(
                fd,
                libc::IPPROTO_IP,
                libc::IP_MTU_DISCOVER,
                libc::IP_PMTUDISC_DO,
            )?,
            IpAddr::V6(_) => {
                setsockopt_int(
                    fd,
                    libc::IPPROTO_IPV6,
                    libc::IPV6_MTU_DISCOVER,
                    libc::IP_PMTUDISC_DO,
                )?;
                setsockopt_int(fd, libc::SOL_UDP, libc::UDP_NO_CHECK6_RX, 1)?;
            }
        }
        // Bursts of a whole message window must not overflow the socket buffers (a UDP socket
        // drops what does not fit, and the transport then waits for its retransmit timer).
        // Privileged processes get the size past net.core.[rw]mem_max; others what it allows.
        for (force, plain) in [
            (libc::SO_RCVBUFFORCE, libc::SO_RCVBUF),
            (libc::SO_SNDBUFFORCE, libc::SO_SNDBUF),
        ] {
            if setsockopt_int(fd, libc::SOL_SOCKET, force, SOCKET_BUFFER).is_err() {
                let _ = setsockopt_int(fd, libc::SOL_SOCKET, plain, SOCKET_BUFFER);
            }
        }
        let local = std_sock.local_addr()?;
        // Coalesced receive: a GSO sender's run of datagrams arrives in one piece (split
        // again by its segment size below) instead of one trip through the stack each.
        let gro = setsockopt_int(fd, libc::SOL_UDP, libc::UDP_GRO, 1).is_ok();
        let rx_buf = if gro { GRO_BUF } else { RX_BUF };
        Ok(UdpNetDev {
            socket: tokio::net::UdpSocket::from_std(std_sock)?,
            local,
            peer_port: roce::UDP_PORT,
            buf: vec![0u8; 65536 + sys::VNET_HDR_LEN + 64],
            batch_bufs: (0..BATCH).map(|_| vec![0u8; rx_buf]).collect(),
            rx_pool: Vec::new(),
            tx_bufs: Vec::new(),
            packet_rx: None,
            gso: true,
            ident_deltas: icrc::UnknownIpv4Fields::new(),
            got: Vec::with_capacity(BATCH),
            whole: Vec::new(),
            gather: Vec::with_capacity(rx_buf),
            gro,
            pending: std::collections::VecDeque::new(),
        })
    }

    /// Like [`UdpNetDev::bind`], and receives through an AF_PACKET socket on interface
    /// `ifname` instead, so received ICRCs can be checked (see the module documentation).
    pub fn bind_with_packet_rx(addr: SocketAddr, ifname: &str) -> io::Result<UdpNetDev> {
        let mut nd = UdpNetDev::bind(addr)?;
        nd.add_packet_rx(ifname)?;
        Ok(nd)
    }

    /// Receives through an AF_PACKET socket on `ifname` from now on (see
    /// [`UdpNetDev::bind_with_packet_rx`]).
    pub fn add_packet_rx(&mut self, ifname: &str) -> io::Result<()> {
        let nd = self;
        if nd.gro {
            // Only the packet socket's copies count, one per datagram.
            let _ = setsockopt_int(nd.socket.as_raw_fd(), libc::SOL_UDP, libc::UDP_GRO, 0);
            nd.gro = false;
        }
        let fd = sys::packet_socket(ifname)?;
        // SAFETY: `fd` is an OwnedFd: open, owned by the AsyncFd from here on, and its
        // `as_raw_fd` always returns the same descriptor.
        let afd = unsafe {
            tokio::io::unix::AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE)
        }
        .map_err(|e| io::Error::other(e.to_string()))?;
        nd.packet_rx = Some(afd);
        Ok(())
    }

    /// Receives whole datagrams from the packet socket: incoming only, UDP to our address and
    /// port. The UDP socket's own copies are discarded.
    fn packet_receive(&mut self, out: &mut Vec<Vec<u8>>, max: usize) -> io::Result<usize> {
        while let Ok((_, _)) = self.socket.try_recv_from(&mut self.buf) {}
        let Some(afd) = &self.packet_rx else {
            return Ok(0);
        };
        let mut n = 0;
        while n < max {
            let (link, len) = match sys::packet_recv(afd.get_ref(), &mut self.buf) {
                Ok(Some(v)) => v,
                Ok(None) => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => return Err(e),
            };
            n += 1;
            // The virtio-net header in front says whether this is a GSO datagram that the
            // stack has not cut yet (a sender on this host's loopback).
            let Some(hdr) = self.buf.get(..sys::VNET_HDR_LEN) else {
                continue;
            };
            let segment = match hdr[1] & !sys::VNET_GSO_ECN {
                sys::VNET_GSO_NONE => 0,
                sys::VNET_GSO_UDP_L4 => usize::from(u16::from_le_bytes([hdr[4], hdr[5]])),
                _ => continue,
            };
            let Some(d) = self.buf.get(sys::VNET_HDR_LEN + link..len) else {
                continue;
            };
            let Ok(dg) = Datagram::split(d) else {
                continue;
            };
            let Ok(ip) = dg.ip_repr() else {
                continue;
            };
            if ip.dst_addr() != self.local.ip() || dg.udp_repr().dst_port != self.local.port() {
                continue;
            }
            if segment == 0 {
                out.push(d.to_vec());
            } else {
                split_gso(d, dg.ip_header.len(), segment, out);
            }
        }
        Ok(n)
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// [`UdpNetDev::readable`] as a poll function, for netdevs made of several sockets.
    pub fn poll_readable(
        &self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        use std::task::Poll;
        match &self.packet_rx {
            Some(afd) => match afd.poll_read_ready(cx) {
                Poll::Ready(Ok(mut g)) => {
                    g.clear_ready();
                    Poll::Ready(Ok(()))
                }
                Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
                Poll::Pending => Poll::Pending,
            },
            None => self.socket.poll_recv_ready(cx),
        }
    }

    /// Waits until a datagram can be read.
    pub async fn readable(&self) -> io::Result<()> {
        match &self.packet_rx {
            Some(afd) => {
                // Cleared before the caller drains the socket: data arriving later raises
                // readiness again.
                afd.readable().await?.clear_ready();
                Ok(())
            }
            None => self.socket.readable().await,
        }
    }

    /// The datagram as the kernel will send it: our address and port, IPv4 ID 0 with DF.
    fn rewrite(&self, d: &[u8]) -> io::Result<(Vec<u8>, SocketAddr, usize)> {
        let mut out = Vec::new();
        let (to, hl) = self.rewrite_into(d, &mut out)?;
        Ok((out, to, hl))
    }

    /// [`UdpNetDev::rewrite`] into `out` (resized to the datagram).
    fn rewrite_into(&self, d: &[u8], out: &mut Vec<u8>) -> io::Result<(SocketAddr, usize)> {
        let bad = || io::Error::new(io::ErrorKind::InvalidInput, "not a RoCEv2 datagram");
        let dg = Datagram::split(d).map_err(|_| bad())?;
        let ip = dg.ip_repr().map_err(|_| bad())?;
        let dst = ip.dst_addr();
        let ip = match (ip, self.local.ip()) {
            (IpRepr::V4(mut r), IpAddr::V4(src)) => {
                r.src_addr = src;
                r.ident = 0;
                r.dont_frag = true;
                IpRepr::V4(r)
            }
            (IpRepr::V6(mut r), IpAddr::V6(src)) => {
                r.src_addr = src;
                IpRepr::V6(r)
            }
            _ => return Err(bad()),
        };
        out.clear();
        out.resize(ip.header_len() + udp::HEADER_LEN + dg.roce.len(), 0);
        let hl = datagram::emit_headers(&ip, self.local.port(), self.peer_port, dg.roce.len(), out)
            .map_err(|_| bad())?;
        out[hl..].copy_from_slice(dg.roce);
        icrc::generate(out).map_err(|_| bad())?;
        Ok((SocketAddr::new(dst, self.peer_port), hl))
    }
}

impl NetDev for UdpNetDev {
    fn transmit(&mut self, d: &[u8]) -> io::Result<()> {
        let (out, to, hl) = self.rewrite(d)?;
        self.send_all(&[Msg::new([&out, &[], &[]], hl, to)])
    }

    fn receive(&mut self) -> io::Result<Option<Vec<u8>>> {
        if self.packet_rx.is_some() || self.gro {
            // One received datagram may be several (GRO, GSO seen by the packet socket).
            if self.pending.is_empty() {
                let mut v = Vec::new();
                self.receive_batch(&mut v, 1)?;
                self.pending.extend(v);
            }
            return Ok(self.pending.pop_front());
        }
        let (n, from) = match self.socket.try_recv_from(&mut self.buf) {
            Ok(v) => v,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
            Err(e) => return Err(e),
        };
        Ok(wrap(from, self.local, &self.buf[..n]))
    }

    fn transmit_batch(&mut self, datagrams: &[Outgoing]) -> io::Result<()> {
        // Datagrams built as the kernel will send them go out as they are, their payload
        // straight from memory; the others are rewritten (and their ICRC regenerated) into
        // reused buffers.
        let mut bufs = std::mem::take(&mut self.tx_bufs);
        // (the datagram, or the buffer it was rewritten into; header length; destination)
        let mut plan: Vec<(Result<usize, usize>, usize, SocketAddr)> =
            Vec::with_capacity(datagrams.len());
        let mut used = 0;
        for (k, d) in datagrams.iter().enumerate() {
            if let Some((to, hl)) = self.as_sent(&d.bytes) {
                plan.push((Err(k), hl, to));
                continue;
            }
            if bufs.len() <= used {
                bufs.push(Vec::new());
            }
            // A datagram the socket cannot send is dropped like any other loss.
            if let Ok((to, hl)) = self.rewrite_into(&d.to_vec(), &mut bufs[used]) {
                plan.push((Ok(used), hl, to));
                used += 1;
            }
        }
        let msgs: Vec<Msg> = plan
            .iter()
            .map(|&(slot, hl, to)| match slot {
                Ok(i) => Msg::new([&bufs[i][..], &[], &[]], hl, to),
                Err(k) => Msg::new(datagrams[k].pieces(), hl, to),
            })
            .collect();
        let r = if self.gso {
            self.send_gso(&msgs)
        } else {
            self.send_all(&msgs)
        };
        drop(msgs);
        self.tx_bufs = bufs;
        r
    }

    fn tx_ports(&self) -> Option<(u16, u16)> {
        Some((self.local.port(), self.peer_port))
    }

    fn recycle(&mut self, bufs: &mut Vec<Vec<u8>>) {
        let room = RX_POOL.saturating_sub(self.rx_pool.len());
        self.rx_pool.extend(bufs.drain(..).take(room));
        bufs.clear();
    }

    fn receive_batch(&mut self, out: &mut Vec<Vec<u8>>, max: usize) -> io::Result<usize> {
        let mut total = 0;
        while total < max {
            let Some(d) = self.pending.pop_front() else {
                break;
            };
            out.push(d);
            total += 1;
        }
        if self.packet_rx.is_some() {
            return Ok(total + self.packet_receive(out, max - total)?);
        }
        let mut pool = std::mem::take(&mut self.rx_pool);
        let r = self.receive_segments(max - total, &mut |head, payload| {
            let mut d = pool.pop().unwrap_or_default();
            d.clear();
            d.extend_from_slice(head);
            d.extend_from_slice(payload);
            out.push(d);
        });
        self.rx_pool = pool;
        Ok(total + r?)
    }

    fn receive_each(&mut self, max: usize, f: &mut dyn FnMut(&[u8], &[u8])) -> io::Result<usize> {
        if self.packet_rx.is_none() && self.pending.is_empty() {
            return self.receive_segments(max, f);
        }
        // Segments held back and packet-socket datagrams are whole already.
        let mut got = std::mem::take(&mut self.whole);
        got.clear();
        let r = self.receive_batch(&mut got, max);
        for d in &got {
            f(d, &[]);
        }
        self.recycle(&mut got);
        self.whole = got;
        r
    }

    fn receive_into(&mut self, max: usize, sink: &mut dyn RxSink) -> io::Result<usize> {
        if self.packet_rx.is_some() || !self.pending.is_empty() {
            return self.receive_each(max, &mut |head, rest| sink.datagram(head, rest, &[]));
        }
        let mut total = 0;
        // Placing pays for its system call per datagram when datagrams come coalesced (GRO:
        // up to 64 packets each); after a single packet, or one that was not expected, the
        // next call takes a whole batch.
        let mut place = true;
        while total < max {
            let expected = if place {
                sink.expect().map(|(peer, exp)| {
                    (
                        peer,
                        exp.iter().copied().take(PLACE_MAX).collect::<Placed>(),
                    )
                })
            } else {
                None
            };
            if let Some((peer, exp)) = expected {
                match self.receive_placed(peer, &exp, sink)? {
                    None => break,
                    Some((n, hit)) => {
                        total += n;
                        place = hit;
                        continue;
                    }
                }
            }
            place = true;
            let n =
                self.receive_segments(1, &mut |head, payload| sink.datagram(head, payload, &[]))?;
            if n == 0 {
                break;
            }
            total += n;
        }
        Ok(total)
    }
}

/// Packets received in place by one system call at most.
const PLACE_MAX: usize = 64;
/// Room for a placed packet's transport headers (BTH and AETH: 16 bytes).
const PLACE_HEAD: usize = 32;
type Placed = smallvec::SmallVec<[Expected; PLACE_MAX]>;

impl UdpNetDev {
    /// Receives one datagram (coalesced or not) with the payloads of the packets `exp`
    /// expects where they go, and hands its packets to `sink`: those that are the ones
    /// expected, from `peer`, with their payload in place; the rest put together again (and
    /// the memory their bytes passed through zeroed, so no other peer's data stays there).
    /// `None` if no datagram was waiting; otherwise how many packets it held and whether to
    /// place again: it held several and none was unexpected (the expected ones first, any
    /// others after them).
    fn receive_placed(
        &mut self,
        peer: IpAddr,
        exp: &[Expected],
        sink: &mut dyn RxSink,
    ) -> io::Result<Option<(usize, bool)>> {
        let exp = &exp[..exp
            .iter()
            .position(|e| e.header_len > PLACE_HEAD)
            .unwrap_or(exp.len())];
        // Between two payloads, the ICRC of one packet and the headers of the next: one
        // buffer (`gaps[k]`: ICRC of packet k - 1, headers of packet k), so a packet costs
        // two iovecs.
        let mut gaps = [[0u8; roce::ICRC_LEN + PLACE_HEAD]; PLACE_MAX + 1];
        let at_head = |k: usize| if k == 0 { 0 } else { roce::ICRC_LEN };
        // (where, length, placed payload) of each piece the datagram is received into.
        let mut pieces: smallvec::SmallVec<[(*mut u8, usize, bool); 256]> =
            smallvec::SmallVec::new();
        for (k, g) in gaps.iter_mut().enumerate().take(exp.len() + 1) {
            let e = exp.get(k);
            pieces.push((
                g.as_mut_ptr(),
                at_head(k) + e.map_or(0, |e| e.header_len),
                false,
            ));
            if let Some(e) = e {
                pieces.push((e.dst.as_ptr(), e.len, true));
            }
        }
        let overflow = &mut self.batch_bufs[0];
        pieces.push((overflow.as_mut_ptr(), overflow.len(), false));
        let got = match self.socket.try_io(tokio::io::Interest::READABLE, || {
            // SAFETY: every piece is writable for its length for the call: the stack arrays
            // and the overflow buffer are exclusively borrowed here, and the placed payloads
            // are registered memory the engine gave out for these packets (`Expected::dst`).
            unsafe { sys::recvmsg_pieces(&self.socket, &pieces[..]) }
        }) {
            Ok(g) => g,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
            Err(e) => return Err(e),
        };
        let Some((n, from, seg)) = got else {
            // Truncated: dropped, as any other loss.
            return Ok(Some((0, true)));
        };
        let seg = if seg == 0 { n.max(1) } else { seg };
        let mut pos = 0;
        let mut count = 0;
        let mut k = 0;
        while pos < n && k < exp.len() {
            let e = &exp[k];
            let len = seg.min(n - pos);
            let headers = &gaps[k][at_head(k)..at_head(k) + e.header_len];
            if len != e.udp_payload_len() || from.ip() != peer || !e.matches(headers) {
                break;
            }
            let mut head = [0u8; REBUILT_MAX];
            if let Some(hl) = rebuilt_headers(from, self.local, len, &mut head) {
                let mut rest = [0u8; PLACE_HEAD + roce::ICRC_LEN];
                rest[..e.header_len].copy_from_slice(headers);
                rest[e.header_len..e.header_len + roce::ICRC_LEN]
                    .copy_from_slice(&gaps[k + 1][..roce::ICRC_LEN]);
                // SAFETY: the kernel just wrote these `len` bytes of registered memory
                // (`Expected::dst`), which nothing holds as `&mut`.
                let placed = unsafe { std::slice::from_raw_parts(e.dst.as_ptr(), e.len) };
                sink.datagram(&head[..hl], &rest[..e.header_len + roce::ICRC_LEN], placed);
            }
            pos += len;
            count += 1;
            k += 1;
        }
        let coalesced = n > seg;
        if pos == n {
            return Ok(Some((count, coalesced)));
        }
        if k == exp.len() {
            // Packets after the expected ones: in the overflow buffer, in order.
            for p in self.batch_bufs[0][..n - pos].chunks(seg) {
                let mut head = [0u8; REBUILT_MAX];
                if let Some(hl) = rebuilt_headers(from, self.local, p.len(), &mut head) {
                    sink.datagram(&head[..hl], p, &[]);
                }
                count += 1;
            }
            return Ok(Some((count, coalesced)));
        }
        // A packet that was not the one expected: the rest of the datagram is gathered from
        // the pieces (zeroing the placed memory it went through).
        let mut gathered = std::mem::take(&mut self.gather);
        gathered.clear();
        let mut at = 0;
        for &(ptr, len, placed) in &pieces {
            let (start, end) = (at.max(pos), (at + len).min(n));
            at += len;
            if start >= end {
                continue;
            }
            // SAFETY: `ptr` is valid for `len` bytes (see the receive above) and
            // `start - (at - len) .. end - (at - len)` lies within them.
            let bytes =
                unsafe { std::slice::from_raw_parts(ptr.add(start + len - at), end - start) };
            gathered.extend_from_slice(bytes);
            if placed {
                // SAFETY: as above; registered memory the engine gave out for an expected
                // packet, whose contents are undefined until it arrives.
                unsafe { std::ptr::write_bytes(ptr.add(start + len - at), 0, end - start) };
            }
        }
        for p in gathered.chunks(seg) {
            let mut head = [0u8; REBUILT_MAX];
            if let Some(hl) = rebuilt_headers(from, self.local, p.len(), &mut head) {
                sink.datagram(&head[..hl], p, &[]);
            }
            count += 1;
        }
        self.gather = gathered;
        Ok(Some((count, false)))
    }

    /// Receives up to `max` datagrams from the socket (a GRO datagram counts as its segments
    /// and may exceed `max` by one batch) and hands each to `f` as its rebuilt IP and UDP
    /// headers and its payload where the socket put it.
    fn receive_segments(
        &mut self,
        max: usize,
        f: &mut dyn FnMut(&[u8], &[u8]),
    ) -> io::Result<usize> {
        let mut total = 0;
        let mut got = std::mem::take(&mut self.got);
        while total < max {
            let bufs = &mut self.batch_bufs;
            got.clear();
            match self.socket.try_io(tokio::io::Interest::READABLE, || {
                sys::recvmmsg(&self.socket, bufs, &mut got)
            }) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => {
                    self.got = got;
                    return Err(e);
                }
            }
            for &(i, len, from, seg) in &got {
                let payload = &self.batch_bufs[i][..len];
                let seg = if seg == 0 { len.max(1) } else { seg };
                for p in payload.chunks(seg) {
                    total += 1;
                    let mut head = [0u8; REBUILT_MAX];
                    if let Some(hl) = rebuilt_headers(from, self.local, p.len(), &mut head) {
                        f(&head[..hl], p);
                    }
                }
            }
        }
        self.got = got;
        Ok(total)
    }

    /// Destination and header length of a datagram that is already what the kernel will send
    /// (our address and port, the peer's port, IPv4 ID 0 with DF), so its ICRC holds as is.
    fn as_sent(&self, d: &[u8]) -> Option<(SocketAddr, usize)> {
        let dg = Datagram::headers(d).ok()?;
        let ip = dg.ip_repr().ok()?;
        let ok = match (ip, self.local.ip()) {
            (IpRepr::V4(r), IpAddr::V4(src)) => r.src_addr == src && r.ident == 0 && r.dont_frag,
            (IpRepr::V6(r), IpAddr::V6(src)) => r.src_addr == src,
            _ => false,
        };
        let udp = dg.udp_repr();
        (ok && udp.src_port == self.local.port() && udp.dst_port == self.peer_port).then(|| {
            (
                SocketAddr::new(ip.dst_addr(), self.peer_port),
                dg.ip_header.len() + dg.udp_header.len(),
            )
        })
    }

    /// The ICRC of IPv4 datagram `d` as it is when the kernel gives it IP ID `ident` (the
    /// datagram's own ICRC adjusted, not computed again).
    fn icrc_as_segment(&mut self, d: &Msg, ident: u16) -> u32 {
        let own = d.icrc();
        let old = u16::from_be_bytes([d.head[4], d.head[5]]);
        own ^ self
            .ident_deltas
            .ident_delta(d.len() - roce::ICRC_LEN, old ^ ident)
    }

    /// Sends datagrams with UDP GSO: each run of datagrams to one peer whose payloads have one
    /// size (the last may be shorter) goes out as one message that the kernel (or the NIC)
    /// cuts back into exactly those datagrams.
    ///
    /// The cut datagrams carry what the engine built, with one difference: for IPv4, Linux
    /// numbers the segments of one send with consecutive IP IDs from the ID of the first,
    /// which is 0 here (DF, unconnected socket), and the ICRC covers the ID, so the ICRC of
    /// the segment at index `k` is sent as computed with ID `k`. Receivers that see the IP
    /// header (rxe, a packet socket) then find every ICRC valid.
    ///
    /// A route or kernel that refuses GSO turns it off for the socket, and the datagrams go
    /// out one by one as before.
    fn send_gso(&mut self, msgs: &[Msg]) -> io::Result<()> {
        // Runs: (first datagram, count, segment size).
        let mut runs: Vec<(usize, usize, usize)> = Vec::new();
        let mut i = 0;
        while i < msgs.len() {
            let (to, seg) = (msgs[i].to, msgs[i].udp_payload_len());
            let mut bytes = seg;
            let mut j = i + 1;
            while j < msgs.len() && j - i < GSO_MAX_SEGMENTS {
                let len = msgs[j].udp_payload_len();
                if msgs[j].to != to || len > seg || bytes + len > GSO_MAX_BYTES {
                    break;
                }
                bytes += len;
                j += 1;
                if len < seg {
                    break;
                }
            }
            runs.push((i, j - i, seg));
            i = j;
        }
        self.send_runs(msgs, &runs)
    }

    /// `sendmmsg` of the datagrams one by one, [`BATCH`] per call; a full socket drops the
    /// rest.
    ///
    /// The call goes straight to the non-blocking socket rather than through tokio's
    /// readiness: a socket that has not been polled yet counts as not writable there, which
    /// would drop the first datagrams of a new device (a CM REQ then waits for its
    /// retransmission, seconds later).
    fn send_all(&mut self, msgs: &[Msg]) -> io::Result<()> {
        let runs: Vec<(usize, usize, usize)> = (0..msgs.len()).map(|i| (i, 1, 0)).collect();
        self.send_runs(msgs, &runs)
    }

    /// Sends `runs` of `msgs` (first datagram, count, segment size), each as one message; a
    /// run of more than one is cut by the kernel (UDP GSO).
    fn send_runs(&mut self, msgs: &[Msg], runs: &[(usize, usize, usize)]) -> io::Result<()> {
        let v4 = self.local.is_ipv4();
        // Every datagram's ICRC: its own, or for the segments after the first of an IPv4 run,
        // the one with their IP ID.
        let mut icrcs: Vec<[u8; 4]> = Vec::with_capacity(msgs.len());
        for &(first, count, _) in runs {
            for (k, d) in msgs[first..first + count].iter().enumerate() {
                let icrc = if v4 && k > 0 {
                    self.icrc_as_segment(d, k as u16)
                } else {
                    d.icrc()
                };
                icrcs.push(icrc.to_le_bytes());
            }
        }
        // Every datagram as up to four pieces: headers before the payload, the payload, the
        // pad, the ICRC.
        let mut pieces: Vec<&[u8]> = Vec::with_capacity(msgs.len() * 4);
        let mut sends: Vec<sys::GsoMsg> = Vec::with_capacity(runs.len());
        let mut next_icrc = 0;
        for &(first, count, seg) in runs {
            let start = pieces.len();
            for d in &msgs[first..first + count] {
                d.push_udp_payload(&mut pieces, &icrcs[next_icrc]);
                next_icrc += 1;
            }
            sends.push(sys::GsoMsg {
                pieces: start..pieces.len(),
                to: msgs[first].to,
                segment: if count > 1 { seg as u16 } else { 0 },
            });
        }
        let mut done = 0;
        while done < sends.len() {
            let chunk = &sends[done..(done + BATCH).min(sends.len())];
            match sys::sendmmsg_gso(&self.socket, &pieces, chunk) {
                Ok(n) => done += n.max(1),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if chunk[0].segment != 0 && gso_refused(&e) => {
                    // Send the rest one by one, with the ICRCs the engine computed.
                    self.gso = false;
                    return self.send_all(&msgs[runs[done].0..]);
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

/// One datagram to send, as an [`Outgoing`] holds it: `head` (from the IP header on), the
/// payload sent from memory (`data`) and `tail` (pad and ICRC) after it, or `head` alone
/// holding it whole; its UDP payload starts at `hl`.
struct Msg<'a> {
    head: &'a [u8],
    data: &'a [u8],
    tail: &'a [u8],
    hl: usize,
    to: SocketAddr,
}

impl<'a> Msg<'a> {
    fn new([head, data, tail]: [&'a [u8]; 3], hl: usize, to: SocketAddr) -> Msg<'a> {
        Msg {
            head,
            data,
            tail,
            hl,
            to,
        }
    }

    fn len(&self) -> usize {
        self.head.len() + self.data.len() + self.tail.len()
    }

    fn udp_payload_len(&self) -> usize {
        self.len().saturating_sub(self.hl)
    }

    /// The piece that ends with the ICRC, and where the ICRC starts in it.
    fn last(&self) -> (&'a [u8], usize) {
        let last = if self.tail.is_empty() {
            self.head
        } else {
            self.tail
        };
        (last, last.len().saturating_sub(roce::ICRC_LEN))
    }

    fn icrc(&self) -> u32 {
        let (last, at) = self.last();
        let mut v = [0u8; 4];
        if let Some(b) = last.get(at..at + roce::ICRC_LEN) {
            v.copy_from_slice(b);
        }
        u32::from_le_bytes(v)
    }

    /// Appends the pieces of the UDP payload, with `icrc` in place of the datagram's own.
    fn push_udp_payload(&self, out: &mut Vec<&'a [u8]>, icrc: &'a [u8; 4]) {
        let (_, at) = self.last();
        if self.tail.is_empty() {
            out.push(self.head.get(self.hl..at).unwrap_or_default());
        } else {
            out.push(self.head.get(self.hl..).unwrap_or_default());
            for p in [self.data, &self.tail[..at]] {
                if !p.is_empty() {
                    out.push(p);
                }
            }
        }
        out.push(icrc);
    }
}

/// Datagrams per `sendmmsg`/`recvmmsg` call.
const BATCH: usize = 32;
/// Requested SO_RCVBUF / SO_SNDBUF (the kernel doubles it for its bookkeeping).
const SOCKET_BUFFER: i32 = 8 << 20;
/// Receive buffer per datagram: a 4096-byte MTU packet with all headers fits.
const RX_BUF: usize = 8192;

/// Received datagram buffers kept for reuse.
const RX_POOL: usize = 1024;
/// Receive buffer per datagram with `UDP_GRO`: a coalesced datagram is at most 64 KiB.
const GRO_BUF: usize = 65536;
/// Datagrams per GSO send (the kernel's `UDP_MAX_SEGMENTS` is 64 or more).
const GSO_MAX_SEGMENTS: usize = 64;
/// Segments a received GSO datagram may stand for (the kernel's `UDP_MAX_SEGMENTS` is at
/// most 128).
const GSO_RX_MAX_SEGMENTS: usize = 128;
/// UDP payload bytes per GSO send: one IPv4 datagram's worth (65535 - 20 - 8).
const GSO_MAX_BYTES: usize = 65507;

/// Cuts a GSO datagram `d` (IP header of `ip_len` bytes, UDP header, payload) into the
/// datagrams of `segment` payload bytes the stack would make of it: lengths rewritten and, for
/// IPv4, consecutive IDs from the first one with the header checksum refreshed.
fn split_gso(d: &[u8], ip_len: usize, segment: usize, out: &mut Vec<Vec<u8>>) {
    let hl = ip_len + udp::HEADER_LEN;
    let Some(payload) = d.get(hl..) else {
        return;
    };
    let segment = segment.max(1);
    // The kernel makes at most 128 segments of one send; anything else is not its doing.
    if payload.len().div_ceil(segment) > GSO_RX_MAX_SEGMENTS {
        return;
    }
    let ident = u16::from_be_bytes([d[4], d[5]]);
    for (k, p) in payload.chunks(segment).enumerate() {
        let mut seg = Vec::with_capacity(hl + p.len());
        seg.extend_from_slice(&d[..hl]);
        seg.extend_from_slice(p);
        let udp_len = (udp::HEADER_LEN + p.len()) as u16;
        if ip_len == ipv4::HEADER_LEN {
            let total = (hl + p.len()) as u16;
            seg[2..4].copy_from_slice(&total.to_be_bytes());
            seg[4..6].copy_from_slice(&ident.wrapping_add(k as u16).to_be_bytes());
            seg[10..12].fill(0);
            let sum = ipv4::checksum(&seg[..ipv4::HEADER_LEN]);
            seg[10..12].copy_from_slice(&sum.to_be_bytes());
        } else {
            seg[4..6].copy_from_slice(&udp_len.to_be_bytes());
        }
        seg[ip_len + 4..ip_len + 6].copy_from_slice(&udp_len.to_be_bytes());
        seg[ip_len + 6..ip_len + 8].fill(0);
        out.push(seg);
    }
}

/// Errors by which a kernel or route says it cannot segment a UDP send.
fn gso_refused(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EIO | libc::EINVAL | libc::EOPNOTSUPP | libc::ENOPROTOOPT | libc::EMSGSIZE)
    )
}

/// The ICRC of IPv4 datagram `d` (UDP payload at `hl`) as it would be with IP ID `ident`.
#[cfg(test)]
fn icrc_with_ident(d: &[u8], hl: usize, ident: u16) -> u32 {
    let ip_len = hl - udp::HEADER_LEN;
    let mut ip = [0u8; ipv4::HEADER_LEN];
    ip.copy_from_slice(&d[..ipv4::HEADER_LEN.min(ip_len)]);
    ip[4..6].copy_from_slice(&ident.to_be_bytes());
    icrc::compute(&ip, &d[ip_len..hl], &d[hl..d.len() - roce::ICRC_LEN])
}

/// Rebuilds the IP and UDP headers the kernel stripped (see the module documentation).
fn wrap(from: SocketAddr, local: SocketAddr, payload: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    wrap_into(from, local, payload, &mut out).then_some(out)
}

/// The IP and UDP headers the kernel stripped from a datagram of `payload_len` bytes from
/// `from` to `local`, written into `out`; their length, or `None` if the families differ.
fn rebuilt_headers(
    from: SocketAddr,
    local: SocketAddr,
    payload_len: usize,
    out: &mut [u8; REBUILT_MAX],
) -> Option<usize> {
    let ip = rebuilt_ip(from, local)?;
    datagram::emit_header_bytes(&ip, from.port(), local.port(), payload_len, out).ok()
}

/// Room for rebuilt IPv6 and UDP headers.
const REBUILT_MAX: usize = ipv6::HEADER_LEN + udp::HEADER_LEN;

/// [`wrap`] into `out` (resized to the datagram); false if the families differ.
fn wrap_into(from: SocketAddr, local: SocketAddr, payload: &[u8], out: &mut Vec<u8>) -> bool {
    let mut head = [0u8; REBUILT_MAX];
    let Some(hl) = rebuilt_headers(from, local, payload.len(), &mut head) else {
        return false;
    };
    out.clear();
    out.extend_from_slice(&head[..hl]);
    out.extend_from_slice(payload);
    true
}

/// The IP header fields of a datagram a UDP socket received (what it does not report is given
/// as Linux sends it: ID 0, DF, TTL 64; docs/WIRE.md §8).
fn rebuilt_ip(from: SocketAddr, local: SocketAddr) -> Option<IpRepr> {
    let ip = match (from.ip(), local.ip()) {
        (IpAddr::V4(s), IpAddr::V4(d)) => IpRepr::V4(ipv4::Repr::udp(s, d)),
        (IpAddr::V6(s), IpAddr::V6(d)) => IpRepr::V6(ipv6::Repr {
            src_addr: s,
            dst_addr: d,
            next_header: ipv4::PROTOCOL_UDP,
            payload_len: 0,
            hop_limit: 64,
            traffic_class: 0,
            flow_label: 0,
        }),
        _ => return None,
    };
    Some(ip)
}

/// Binds `count` sockets to `addr` in one `SO_REUSEPORT` group, for the devices of a
/// [`crate::verbs::ShardSet`] in order: the kernel runs a steering program on each datagram
/// that picks socket [`crate::verbs::shards::owner`]`(destination QP number, count)`, so a QP's
/// packets reach the engine thread that owns it. (A run of datagrams the kernel coalesced is
/// steered by its first; the devices pass on what is not theirs.) An address something else
/// holds is refused, as without the option; sockets of another user cannot join the group
/// later (Linux only groups sockets of one user ID). The flag is false when
/// the kernel refused the program: it then spreads flows by hash, and the devices pass on
/// every datagram that is not theirs.
pub fn bind_group(addr: SocketAddr, count: usize) -> io::Result<(Vec<std::net::UdpSocket>, bool)> {
    if count <= 1 {
        return Ok((vec![std::net::UdpSocket::bind(addr)?], true));
    }
    // Any socket of this user with SO_REUSEPORT could join a group already bound (another
    // rtgtd, say): bind once without it first, which fails if anything holds the address.
    drop(std::net::UdpSocket::bind(addr)?);
    let socks = (0..count)
        .map(|_| sys::reuseport_socket(addr))
        .collect::<io::Result<Vec<_>>>()?;
    let steered = sys::attach_qpn_steering(&socks[0], count).is_ok();
    Ok((socks, steered))
}

/// The steering program of [`bind_group`], classic BPF run on the UDP payload: the BTH's
/// destination QP (bytes 4..8, low 24 bits); QP1 goes to socket 0, any other to
/// `qpn % count`. A datagram too short for a BTH goes to socket 0 (the program aborts with 0).
fn qpn_steering(count: usize) -> [libc::sock_filter; 6] {
    let op = |code: u32, jt: u8, jf: u8, k: u32| libc::sock_filter {
        code: code as u16,
        jt,
        jf,
        k,
    };
    [
        op(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, 0, 0, 4),
        op(
            libc::BPF_ALU | libc::BPF_AND | libc::BPF_K,
            0,
            0,
            crate::wire::U24_MASK,
        ),
        op(libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K, 2, 0, 1),
        op(
            libc::BPF_ALU | libc::BPF_MOD | libc::BPF_K,
            0,
            0,
            count as u32,
        ),
        op(libc::BPF_RET | libc::BPF_A, 0, 0, 0),
        op(libc::BPF_RET | libc::BPF_K, 0, 0, 0),
    ]
}

/// `sendmmsg`/`recvmmsg` through libc.
mod sys {
    use std::io;
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
    use std::os::fd::AsRawFd;

    use crate::sockaddr::to_storage;

    fn from_storage(st: &libc::sockaddr_storage) -> Option<SocketAddr> {
        match i32::from(st.ss_family) {
            libc::AF_INET => {
                // SAFETY: the kernel wrote a sockaddr_in (family AF_INET) into the storage,
                // which is aligned for it.
                let sin =
                    unsafe { &*(st as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
                let ip = Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes());
                Some(SocketAddr::new(IpAddr::V4(ip), u16::from_be(sin.sin_port)))
            }
            libc::AF_INET6 => {
                // SAFETY: as above for sockaddr_in6 (family AF_INET6).
                let sin6 =
                    unsafe { &*(st as *const libc::sockaddr_storage).cast::<libc::sockaddr_in6>() };
                let ip = Ipv6Addr::from(sin6.sin6_addr.s6_addr);
                let ip = ip.to_ipv4_mapped().map_or(IpAddr::V6(ip), IpAddr::V4);
                Some(SocketAddr::new(ip, u16::from_be(sin6.sin6_port)))
            }
            _ => None,
        }
    }

    /// A UDP socket with `SO_REUSEPORT`, bound to `addr` (blocking; the netdev makes it
    /// non-blocking).
    pub(super) fn reuseport_socket(addr: SocketAddr) -> io::Result<std::net::UdpSocket> {
        use std::os::fd::FromRawFd;
        let family = if addr.is_ipv4() {
            libc::AF_INET
        } else {
            libc::AF_INET6
        };
        // SAFETY: plain system call with constant arguments.
        let fd = unsafe { libc::socket(family, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just returned by socket() and is owned by nothing else.
        let sock = unsafe { std::net::UdpSocket::from_raw_fd(fd) };
        super::setsockopt_int(sock.as_raw_fd(), libc::SOL_SOCKET, libc::SO_REUSEPORT, 1)?;
        let (st, len) = to_storage(addr);
        // SAFETY: `st` holds a socket address of `len` bytes; the socket is open.
        let r = unsafe {
            libc::bind(
                sock.as_raw_fd(),
                (&st as *const libc::sockaddr_storage).cast(),
                len,
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(sock)
    }

    /// `SO_ATTACH_REUSEPORT_CBPF` (asm-generic/socket.h; libc does not export it for Linux).
    const SO_ATTACH_REUSEPORT_CBPF: i32 = 51;

    /// Attaches [`super::qpn_steering`] to the reuseport group of `sock`.
    pub(super) fn attach_qpn_steering(sock: &impl AsRawFd, count: usize) -> io::Result<()> {
        let mut prog = super::qpn_steering(count);
        let fprog = libc::sock_fprog {
            len: prog.len() as u16,
            filter: prog.as_mut_ptr(),
        };
        // SAFETY: `fprog` points at `prog`, alive for the call; the kernel copies the program.
        let r = unsafe {
            libc::setsockopt(
                sock.as_raw_fd(),
                libc::SOL_SOCKET,
                SO_ATTACH_REUSEPORT_CBPF,
                (&fprog as *const libc::sock_fprog).cast(),
                std::mem::size_of::<libc::sock_fprog>() as libc::socklen_t,
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// An AF_PACKET raw socket for IPv4 on interface `ifname`, non-blocking, with a virtio-net
    /// header in front of each frame (`PACKET_VNET_HDR` needs a raw socket).
    pub(super) fn packet_socket(ifname: &str) -> io::Result<std::os::fd::OwnedFd> {
        use std::os::fd::FromRawFd;
        let name = std::ffi::CString::new(ifname)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "interface name"))?;
        // SAFETY: `name` is a valid NUL-terminated string for the duration of the call.
        let index = unsafe { libc::if_nametoindex(name.as_ptr()) };
        if index == 0 {
            return Err(io::Error::last_os_error());
        }
        let proto = (libc::ETH_P_IP as u16).to_be();
        // SAFETY: plain system call with constant arguments.
        let fd = unsafe {
            libc::socket(
                libc::AF_PACKET,
                libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                i32::from(proto),
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just returned by socket() and is owned by nothing else.
        let owned = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
        // SAFETY: sockaddr_ll is plain old data; all-zero is valid before filling it in.
        let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_protocol = proto;
        sll.sll_ifindex = index as i32;
        // SAFETY: `sll` is a valid sockaddr_ll of the length passed; `owned` is open.
        let r = unsafe {
            libc::bind(
                owned.as_raw_fd(),
                (&sll as *const libc::sockaddr_ll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        // A virtio-net header in front of each datagram tells GSO datagrams (not cut yet
        // when sender and receiver share a host) from plain ones.
        super::setsockopt_int(
            owned.as_raw_fd(),
            libc::SOL_PACKET,
            libc::PACKET_VNET_HDR,
            1,
        )?;
        // A peer's burst (a whole message window) must fit, as for the UDP socket.
        if super::setsockopt_int(
            owned.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVBUFFORCE,
            super::SOCKET_BUFFER,
        )
        .is_err()
        {
            let _ = super::setsockopt_int(
                owned.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVBUF,
                super::SOCKET_BUFFER,
            );
        }
        Ok(owned)
    }

    /// Length of the virtio-net header (`struct virtio_net_hdr`) before each datagram a
    /// packet socket with `PACKET_VNET_HDR` returns; its byte 1 is the GSO type and bytes 4..6
    /// the segment size (little-endian).
    pub(super) const VNET_HDR_LEN: usize = 10;
    pub(super) const VNET_GSO_NONE: u8 = 0;
    pub(super) const VNET_GSO_UDP_L4: u8 = 5;
    pub(super) const VNET_GSO_ECN: u8 = 0x80;

    /// One frame from a packet socket into `buf`: `Some((link-layer header length, frame
    /// length))` for an incoming frame (virtio-net header, link-layer header, IP datagram),
    /// `None` for one this host sent (seen on loopback and by taps) or of an unknown link
    /// type, `WouldBlock` when empty.
    pub(super) fn packet_recv(
        fd: &impl AsRawFd,
        buf: &mut [u8],
    ) -> io::Result<Option<(usize, usize)>> {
        // SAFETY: sockaddr_ll is plain old data; all-zero is valid.
        let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t;
        // SAFETY: `buf` is writable for its length, `sll`/`len` describe a writable address
        // buffer of the right size; the call does not retain any pointer.
        let n = unsafe {
            libc::recvfrom(
                fd.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                libc::MSG_DONTWAIT | libc::MSG_TRUNC,
                (&mut sll as *mut libc::sockaddr_ll).cast(),
                &mut len,
            )
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let n = n as usize;
        if sll.sll_pkttype == libc::PACKET_OUTGOING || n > buf.len() {
            return Ok(None);
        }
        // The link-layer header between the virtio-net header and the IP header.
        let link = match sll.sll_hatype {
            libc::ARPHRD_ETHER | libc::ARPHRD_LOOPBACK => 14,
            libc::ARPHRD_NONE => 0,
            _ => return Ok(None),
        };
        Ok(Some((link, n)))
    }

    /// `sendmmsg(2)` of prepared headers without blocking; returns how many went out.
    ///
    /// # Safety
    /// Every header must point at names, iovecs, control data and buffers that stay valid
    /// for the call; the kernel only reads them.
    unsafe fn send_prepared(sock: &impl AsRawFd, hdrs: &mut [libc::mmsghdr]) -> io::Result<usize> {
        // SAFETY: `hdrs` is a valid array of `hdrs.len()` headers; the caller vouches for
        // what they point at.
        let r = unsafe {
            libc::sendmmsg(
                sock.as_raw_fd(),
                hdrs.as_mut_ptr(),
                hdrs.len() as libc::c_uint,
                libc::MSG_DONTWAIT,
            )
        };
        if r < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(r as usize)
        }
    }

    /// One message of [`sendmmsg_gso`]: `pieces` (a range of the pieces passed) to `to`, cut
    /// by the kernel into datagrams of `segment` bytes when it is not 0.
    pub(super) struct GsoMsg {
        pub pieces: std::ops::Range<usize>,
        pub to: SocketAddr,
        pub segment: u16,
    }

    /// Control data with one `int`-sized or smaller option (CMSG_SPACE(4) is 24 or less),
    /// aligned for `cmsghdr`.
    #[derive(Clone, Copy)]
    #[repr(C, align(8))]
    struct Cmsg([u8; 32]);

    /// Sends `msgs` (UDP GSO where `segment` is set); returns how many went out.
    pub(super) fn sendmmsg_gso(
        sock: &impl AsRawFd,
        pieces: &[&[u8]],
        msgs: &[GsoMsg],
    ) -> io::Result<usize> {
        let mut names: Vec<(libc::sockaddr_storage, libc::socklen_t)> =
            msgs.iter().map(|m| to_storage(m.to)).collect();
        let mut iovs: Vec<libc::iovec> = pieces
            .iter()
            .map(|p| libc::iovec {
                iov_base: p.as_ptr() as *mut libc::c_void,
                iov_len: p.len(),
            })
            .collect();
        let mut cmsgs: Vec<Cmsg> = vec![Cmsg([0; 32]); msgs.len()];
        let iov_base = iovs.as_mut_ptr();
        let mut hdrs: Vec<libc::mmsghdr> = Vec::with_capacity(msgs.len());
        for ((m, name), cm) in msgs.iter().zip(names.iter_mut()).zip(cmsgs.iter_mut()) {
            if m.pieces.end > pieces.len() || m.pieces.is_empty() {
                return Err(io::Error::from(io::ErrorKind::InvalidInput));
            }
            // SAFETY: msghdr is plain old data; zero is a valid "no control data" value.
            let mut h: libc::msghdr = unsafe { std::mem::zeroed() };
            h.msg_name = (&mut name.0 as *mut libc::sockaddr_storage).cast();
            h.msg_namelen = name.1;
            // SAFETY: `m.pieces` lies within `iovs` (checked above).
            h.msg_iov = unsafe { iov_base.add(m.pieces.start) };
            h.msg_iovlen = m.pieces.len() as _;
            if m.segment != 0 {
                // SAFETY: CMSG_SPACE/CMSG_LEN are pure arithmetic.
                let (space, len) = unsafe {
                    (
                        libc::CMSG_SPACE(std::mem::size_of::<u16>() as u32),
                        libc::CMSG_LEN(std::mem::size_of::<u16>() as u32),
                    )
                };
                h.msg_control = cm.0.as_mut_ptr().cast();
                h.msg_controllen = space as _;
                // SAFETY: the control buffer is 32 bytes, aligned for cmsghdr, and larger
                // than CMSG_SPACE(2), so the first header and its data fit in it.
                unsafe {
                    let c = libc::CMSG_FIRSTHDR(&h);
                    (*c).cmsg_level = libc::SOL_UDP;
                    (*c).cmsg_type = libc::UDP_SEGMENT;
                    (*c).cmsg_len = len as _;
                    std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<u16>(), m.segment);
                }
            }
            hdrs.push(libc::mmsghdr {
                msg_hdr: h,
                msg_len: 0,
            });
        }
        // SAFETY: every header points at a live name, control buffer and iovecs in
        // `names`/`cmsgs`/`iovs`, whose buffers (`pieces`) outlive the call.
        unsafe { send_prepared(sock, &mut hdrs) }
    }

    /// Receives one datagram into `pieces` (pointer, length, placed payload or not), in
    /// order; `Some((length, source, GRO segment size or 0))`, or `None` if it was truncated.
    ///
    /// # Safety
    ///
    /// Every piece must be valid for writes of its length for the duration of the call.
    pub(super) unsafe fn recvmsg_pieces(
        sock: &impl AsRawFd,
        pieces: &[(*mut u8, usize, bool)],
    ) -> io::Result<Option<(usize, SocketAddr, usize)>> {
        const N: usize = 2 * super::PLACE_MAX + 2;
        let n = pieces.len().min(N);
        let mut cmsg = Cmsg([0; 32]);
        // SAFETY: sockaddr_storage, iovec and msghdr are plain old data for which all-zero
        // bytes are valid (null pointers, zero lengths).
        let mut name: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let mut iovs: [libc::iovec; N] = unsafe { std::mem::zeroed() };
        for (iov, &(ptr, len, _)) in iovs.iter_mut().zip(pieces) {
            *iov = libc::iovec {
                iov_base: ptr.cast(),
                iov_len: len,
            };
        }
        // SAFETY: as above.
        let mut h: libc::msghdr = unsafe { std::mem::zeroed() };
        h.msg_name = (&mut name as *mut libc::sockaddr_storage).cast();
        h.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        h.msg_iov = iovs.as_mut_ptr();
        h.msg_iovlen = n as _;
        h.msg_control = cmsg.0.as_mut_ptr().cast();
        h.msg_controllen = cmsg.0.len() as _;
        // SAFETY: the header points at a live name, control buffer and iovecs; the pieces
        // behind the iovecs are writable per the caller's contract.
        let r = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut h, libc::MSG_DONTWAIT) };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        if h.msg_flags & libc::MSG_TRUNC != 0 {
            return Ok(None);
        }
        // SAFETY: the kernel filled the control buffer and set msg_controllen.
        let segment = unsafe { gro_segment(&h) };
        Ok(from_storage(&name).map(|from| (r as usize, from, segment)))
    }

    /// The segment size of a coalesced datagram (UDP_GRO) from a received message's control
    /// data, 0 if it has none.
    ///
    /// # Safety
    ///
    /// `h` must be a message header the kernel filled, control buffer included.
    unsafe fn gro_segment(h: &libc::msghdr) -> usize {
        let mut segment = 0;
        // SAFETY: per the contract, the CMSG macros stay within the filled control buffer.
        unsafe {
            let mut c = libc::CMSG_FIRSTHDR(h);
            while !c.is_null() {
                if (*c).cmsg_level == libc::SOL_UDP && (*c).cmsg_type == libc::UDP_GRO {
                    let v = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<libc::c_int>());
                    segment = usize::try_from(v).unwrap_or(0);
                }
                c = libc::CMSG_NXTHDR(h, c);
            }
        }
        segment
    }

    /// Receives up to `bufs.len()` (at most [`super::BATCH`]) datagrams and appends (buffer
    /// index, length, source, GRO segment size or 0) to `out` for each one that was not
    /// truncated; returns how many the kernel gave. The message headers live on the stack:
    /// this runs on every turn of the engine, mostly to find nothing.
    pub(super) fn recvmmsg(
        sock: &impl AsRawFd,
        bufs: &mut [Vec<u8>],
        out: &mut Vec<(usize, usize, SocketAddr, usize)>,
    ) -> io::Result<usize> {
        const N: usize = super::BATCH;
        let n = bufs.len().min(N);
        let mut cmsgs = [Cmsg([0; 32]); N];
        // SAFETY: sockaddr_storage, iovec and mmsghdr are plain old data for which all-zero
        // bytes are valid (null pointers, zero lengths).
        let mut names: [libc::sockaddr_storage; N] = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let mut iovs: [libc::iovec; N] = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let mut hdrs: [libc::mmsghdr; N] = unsafe { std::mem::zeroed() };
        for (i, b) in bufs.iter_mut().take(n).enumerate() {
            iovs[i] = libc::iovec {
                iov_base: b.as_mut_ptr().cast(),
                iov_len: b.len(),
            };
            let h = &mut hdrs[i].msg_hdr;
            h.msg_name = (&mut names[i] as *mut libc::sockaddr_storage).cast();
            h.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            h.msg_iov = &mut iovs[i];
            h.msg_iovlen = 1;
            h.msg_control = cmsgs[i].0.as_mut_ptr().cast();
            h.msg_controllen = cmsgs[i].0.len() as _;
        }
        // SAFETY: the first `n` headers point at a live, writable name, control buffer and
        // iovec whose buffer is exclusively borrowed (`bufs`) for the call; lengths match.
        let r = unsafe {
            libc::recvmmsg(
                sock.as_raw_fd(),
                hdrs.as_mut_ptr(),
                n as libc::c_uint,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        for (i, h) in hdrs.iter().take(r as usize).enumerate() {
            if h.msg_hdr.msg_flags & libc::MSG_TRUNC != 0 {
                continue;
            }
            // SAFETY: the kernel filled the control buffer of this header.
            let segment = unsafe { gro_segment(&h.msg_hdr) };
            if let Some(from) = from_storage(&names[i]) {
                out.push((i, h.msg_len as usize, from, segment));
            }
        }
        Ok(r as usize)
    }
}

/// [`super::run`] for a UDP netdev.
pub async fn run(dev: crate::verbs::Device, netdev: UdpNetDev) -> io::Result<()> {
    super::run(dev, netdev).await
}

impl super::AsyncNetDev for UdpNetDev {
    fn readable(&self) -> impl std::future::Future<Output = io::Result<()>> + Send + '_ {
        UdpNetDev::readable(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::skip_or_fail;
    use std::net::Ipv4Addr;

    #[tokio::test]
    async fn rewrite_makes_kernel_header() {
        let nd = match UdpNetDev::bind("127.0.0.1:0".parse().unwrap()) {
            Ok(nd) => nd,
            Err(e) => return skip_or_fail(format!("cannot bind a UDP socket: {e}")),
        };
        let ip = IpRepr::V4(ipv4::Repr {
            src_addr: Ipv4Addr::new(9, 9, 9, 9),
            dst_addr: Ipv4Addr::new(127, 0, 0, 1),
            protocol: ipv4::PROTOCOL_UDP,
            payload_len: 0,
            ttl: 64,
            tos: 0,
            ident: 77,
            dont_frag: false,
        });
        let mut d = vec![0u8; 28 + 16];
        datagram::emit_headers(&ip, 0xc000, 4791, 16, &mut d).unwrap();
        d[28] = 0x04; // RC SEND_ONLY
        d[30] = 0xff;
        d[31] = 0xff;
        let (out, to, hl) = nd.rewrite(&d).unwrap();
        assert_eq!(hl, 28);
        assert_eq!(to, SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 4791));
        let dg = Datagram::split(&out).unwrap();
        let IpRepr::V4(r) = dg.ip_repr().unwrap() else {
            panic!()
        };
        assert_eq!(
            (r.ident, r.dont_frag, r.src_addr),
            (0, true, Ipv4Addr::LOCALHOST)
        );
        assert_eq!(dg.udp_repr().src_port, nd.local_addr().port());
        assert_eq!(dg.computed_icrc(), dg.wire_icrc());
    }

    /// The kernel runs the steering program on real datagrams: each reaches the socket of
    /// the device that owns its destination QP.
    #[test]
    fn group_steers_by_destination_qpn() {
        use crate::verbs::shards::owner;
        let probe = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let addr = probe.local_addr().unwrap();
        drop(probe);
        let (socks, steered) = match bind_group(addr, 3) {
            Ok(g) => g,
            Err(e) => return skip_or_fail(format!("cannot bind a reuseport group: {e}")),
        };
        assert!(steered, "the kernel refused the steering program");
        assert_eq!(socks.len(), 3);
        for s in &socks {
            s.set_read_timeout(Some(std::time::Duration::from_secs(5)))
                .unwrap();
        }
        let tx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        // A bare BTH with each destination QP; the last datagram is too short for one.
        let qpns = [1u32, 2, 0x11, 0x12, 0x13, 0x00AB_CDEF, 0x00FF_FFFF];
        for &qpn in &qpns {
            let mut bth = [0u8; 12];
            bth[0] = 0x04;
            bth[4..8].copy_from_slice(&(0x5500_0000 | qpn).to_be_bytes());
            tx.send_to(&bth, addr).unwrap();
            let want = owner(qpn, 3);
            let mut buf = [0u8; 64];
            let (n, _) = socks[want]
                .recv_from(&mut buf)
                .unwrap_or_else(|e| panic!("QP {qpn:#x} not on socket {want}: {e}"));
            assert_eq!(&buf[..n], &bth);
        }
        tx.send_to(&[1, 2, 3], addr).unwrap();
        let mut buf = [0u8; 64];
        assert_eq!(socks[0].recv_from(&mut buf).unwrap().0, 3);
        // A second group (another rtgtd) cannot join this one.
        assert!(bind_group(addr, 2).is_err());
        assert!(bind_group(addr, 1).is_err());
    }
}

#[cfg(test)]
mod gso_tests {
    use super::*;
    use crate::test_support::skip_or_fail;
    use std::net::Ipv4Addr;

    /// A RoCEv2 datagram from `from` to `to` as the device builds it for this netdev (its
    /// ports, ID 0, DF), `payload` bytes after the BTH, PSN `psn`.
    fn datagram(from: SocketAddr, to: SocketAddr, payload: usize, psn: u8) -> Vec<u8> {
        let (IpAddr::V4(src), IpAddr::V4(dst)) = (from.ip(), to.ip()) else {
            panic!("IPv4 only");
        };
        let ip = IpRepr::V4(ipv4::Repr::udp(src, dst));
        let roce_len = 12 + payload + roce::ICRC_LEN;
        let mut d = vec![0u8; 28 + roce_len];
        datagram::emit_headers(&ip, from.port(), to.port(), roce_len, &mut d).unwrap();
        d[28] = 0x04; // RC SEND_ONLY
        d[30] = 0xff;
        d[31] = 0xff;
        d[35] = 0x11;
        d[39] = psn;
        for (i, b) in d[40..40 + payload].iter_mut().enumerate() {
            *b = (i as u8).wrapping_mul(31) ^ psn;
        }
        icrc::generate(&mut d).unwrap();
        d
    }

    /// Runs of equal datagrams, a shorter last one, a second peer in between: what GSO must
    /// group and where it must cut.
    fn burst(from: SocketAddr, to: SocketAddr, other: SocketAddr) -> Vec<Vec<u8>> {
        let mut v = Vec::new();
        for k in 0..20u8 {
            v.push(datagram(from, to, 1024, k));
        }
        v.push(datagram(from, to, 100, 20));
        v.push(datagram(from, other, 1024, 21));
        for k in 22..30u8 {
            v.push(datagram(from, to, 512, k));
        }
        v
    }

    /// The datagrams as the engine queues them: every other one with its payload (after
    /// the 40 bytes of IPv4, UDP and BTH headers) in a memory region, sent from there.
    fn outgoing(sent: &[Vec<u8>]) -> Vec<Outgoing> {
        sent.iter()
            .enumerate()
            .map(|(i, d)| {
                if i % 2 == 1 {
                    return Outgoing::whole(d.clone());
                }
                let end = d.len() - roce::ICRC_LEN;
                let region =
                    std::sync::Arc::new(crate::verbs::Region::from_vec(d[40..end].to_vec()));
                let bytes = [&d[..40], &d[end..]].concat();
                Outgoing::from_region(bytes, region, 0, end - 40, 40)
            })
            .collect()
    }

    /// Two sockets on 127.0.0.1, the first sending to the second; `None` where they cannot be
    /// bound (which fails the test in CI).
    fn pair() -> Option<(UdpNetDev, UdpNetDev)> {
        match (
            UdpNetDev::bind("127.0.0.1:0".parse().unwrap()),
            UdpNetDev::bind("127.0.0.1:0".parse().unwrap()),
        ) {
            (Ok(mut a), Ok(b)) => {
                a.peer_port = b.local_addr().port();
                Some((a, b))
            }
            (a, b) => {
                skip_or_fail(format!(
                    "cannot bind UDP sockets: {:?} {:?}",
                    a.err(),
                    b.err()
                ));
                None
            }
        }
    }

    async fn collect(nd: &mut UdpNetDev, n: usize) -> Vec<Vec<u8>> {
        let mut got = Vec::new();
        let wait = async {
            while got.len() < n {
                nd.readable().await.unwrap();
                nd.receive_batch(&mut got, 1024).unwrap();
            }
        };
        tokio::time::timeout(std::time::Duration::from_secs(10), wait)
            .await
            .expect("datagrams lost");
        got
    }

    /// The segments a GRO socket receives are the datagrams sent, in order (those held whole
    /// and those sent with their payload straight from memory), the ICRC of the k-th segment
    /// of a GSO run computed with IPv4 ID k (what the kernel gives it when it cuts the run on
    /// a link).
    #[tokio::test]
    async fn gso_runs_arrive_as_the_datagrams_sent() {
        let Some((mut a, mut b)) = pair() else {
            return;
        };
        assert!(b.gro, "UDP_GRO refused");
        let to = b.local_addr();
        // A datagram to another address (nobody listens there) breaks the run.
        let other = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2)), to.port());
        let sent = burst(a.local_addr(), to, other);
        a.transmit_batch(&outgoing(&sent)).unwrap();
        assert!(a.gso, "GSO was refused on loopback");
        let got = collect(&mut b, sent.len() - 1).await;
        let mine: Vec<&Vec<u8>> = sent
            .iter()
            .filter(|d| d[16..20] == [127, 0, 0, 1])
            .collect();
        assert_eq!(got.len(), mine.len());
        // Runs: 20 x 1024 + 100 (one send), then 8 x 512.
        let index_in_run = |i: usize| if i <= 20 { i } else { i - 21 };
        for (i, (g, s)) in got.iter().zip(&mine).enumerate() {
            let (gd, sd) = (Datagram::split(g).unwrap(), Datagram::split(s).unwrap());
            let n = sd.roce.len() - roce::ICRC_LEN;
            assert_eq!(gd.roce[..n], sd.roce[..n], "datagram {i}");
            let k = index_in_run(i) as u16;
            assert_eq!(
                gd.wire_icrc(),
                icrc_with_ident(s, 28, k),
                "ICRC of datagram {i}"
            );
        }
    }

    /// A sink that expects the SEND_ONLY packets of `burst` (QP 0x11) with PSNs below 20 at
    /// 1 KiB each in `mem`, then the one with PSN 21 wrongly (as PSN 77, at 40 KiB), and
    /// records every datagram as it arrived put together again.
    struct Expecting {
        mem: crate::verbs::Region,
        next: u32,
        exp: Vec<Expected>,
        got: Vec<(bool, Vec<u8>)>,
    }

    impl RxSink for Expecting {
        fn expect(&mut self) -> Option<(IpAddr, &[Expected])> {
            let one = |psn: u32, at: usize| Expected {
                opcode: 0x04,
                qpn: 0x11,
                psn,
                header_len: 12,
                dst: self.mem.place(at, 1024).unwrap(),
                len: 1024,
            };
            self.exp.clear();
            match self.next {
                n @ 0..=19 => self
                    .exp
                    .extend((n..20).map(|p| one(p, p as usize * 1024)).take(16)),
                21 => self.exp.push(one(77, 40 * 1024)),
                _ => return None,
            }
            Some((IpAddr::V4(Ipv4Addr::LOCALHOST), &self.exp))
        }

        fn datagram(&mut self, head: &[u8], rest: &[u8], placed: &[u8]) {
            let mut d = [head, rest].concat();
            if !placed.is_empty() {
                let (h, icrc) = rest.split_at(12);
                d = [head, h, placed, icrc].concat();
            }
            self.next = u32::from(d[head.len() + 11]) + 1;
            self.got.push((!placed.is_empty(), d));
        }
    }

    /// `receive_into` receives the payloads of expected packets where they go (the first 16
    /// of a GSO run of 21, whose others follow from the receive buffer), and hands over a
    /// packet that is not the one expected whole, zeroing the memory it passed through.
    #[tokio::test]
    async fn expected_payloads_are_received_in_place() {
        let Some((mut a, mut b)) = pair() else {
            return;
        };
        let to = b.local_addr();
        let sent = burst(a.local_addr(), to, to);
        a.transmit_batch(&outgoing(&sent)).unwrap();
        let mem = crate::verbs::Region::zeroed(64 * 1024);
        mem.fill(0, 64 * 1024, 0xaa);
        let mut sink = Expecting {
            mem,
            next: 0,
            exp: Vec::new(),
            got: Vec::new(),
        };
        let wait = async {
            while sink.got.len() < sent.len() {
                b.readable().await.unwrap();
                b.receive_into(1024, &mut sink).unwrap();
            }
        };
        tokio::time::timeout(std::time::Duration::from_secs(10), wait)
            .await
            .expect("datagrams lost");
        let placed: Vec<usize> = (0..sink.got.len()).filter(|&i| sink.got[i].0).collect();
        assert_eq!(placed, (0..16).collect::<Vec<_>>());
        for (i, ((_, g), s)) in sink.got.iter().zip(&sent).enumerate() {
            let (gd, sd) = (Datagram::split(g).unwrap(), Datagram::split(s).unwrap());
            // (The ICRC differs with the IP ID a GSO segment got, as above.)
            let n = sd.roce.len() - roce::ICRC_LEN;
            assert_eq!(gd.roce[..n], sd.roce[..n], "datagram {i}");
        }
        let mut m = vec![0u8; 64 * 1024];
        sink.mem.read(0, &mut m);
        for k in 0..16 {
            assert_eq!(
                m[k * 1024..(k + 1) * 1024],
                sent[k][40..40 + 1024],
                "payload {k}"
            );
        }
        assert!(m[16 * 1024..40 * 1024].iter().all(|&x| x == 0xaa));
        assert!(
            m[40 * 1024..41 * 1024].iter().all(|&x| x == 0),
            "not zeroed"
        );
    }

    /// `receive_each` hands the segments of coalesced datagrams over where the socket put
    /// them, behind rebuilt headers: the same datagrams `receive_batch` copies out.
    #[tokio::test]
    async fn segments_are_received_in_place() {
        let Some((mut a, mut b)) = pair() else {
            return;
        };
        let to = b.local_addr();
        let sent = burst(a.local_addr(), to, to);
        a.transmit_batch(&outgoing(&sent)).unwrap();
        let mut got: Vec<(usize, Vec<u8>)> = Vec::new();
        let wait = async {
            while got.len() < sent.len() {
                b.readable().await.unwrap();
                b.receive_each(1024, &mut |head, rest| {
                    got.push((head.len(), [head, rest].concat()))
                })
                .unwrap();
            }
        };
        tokio::time::timeout(std::time::Duration::from_secs(10), wait)
            .await
            .expect("datagrams lost");
        assert_eq!(got.len(), sent.len());
        for (i, ((hl, g), s)) in got.iter().zip(&sent).enumerate() {
            assert_eq!(*hl, 28, "datagram {i} in two parts");
            let (gd, sd) = (Datagram::split(g).unwrap(), Datagram::split(s).unwrap());
            let n = sd.roce.len() - roce::ICRC_LEN;
            assert_eq!(gd.roce[..n], sd.roce[..n], "datagram {i}");
            assert_eq!(gd.udp_repr().src_port, a.local_addr().port());
        }
    }

    /// A packet socket on loopback sees the run before the stack cuts it: the virtio-net
    /// header gives the segment size, and every datagram cut from it has a valid ICRC.
    #[tokio::test]
    async fn packet_socket_cuts_gso_runs_with_valid_icrcs() {
        let (mut a, mut b) = match (
            UdpNetDev::bind("127.0.0.5:0".parse().unwrap()),
            UdpNetDev::bind_with_packet_rx("127.0.0.6:0".parse().unwrap(), "lo"),
        ) {
            (Ok(a), Ok(b)) => (a, b),
            (a, b) => {
                return skip_or_fail(format!(
                    "no packet socket on lo (needs CAP_NET_RAW): {:?} {:?}",
                    a.err(),
                    b.err()
                ))
            }
        };
        a.peer_port = b.local_addr().port();
        let to = b.local_addr();
        let sent = burst(a.local_addr(), to, to);
        a.transmit_batch(&outgoing(&sent)).unwrap();
        let got = collect(&mut b, sent.len()).await;
        assert_eq!(got.len(), sent.len());
        for (i, (g, s)) in got.iter().zip(&sent).enumerate() {
            assert!(icrc::check(g).unwrap(), "ICRC of datagram {i}");
            let (gd, sd) = (Datagram::split(g).unwrap(), Datagram::split(s).unwrap());
            let n = sd.roce.len() - roce::ICRC_LEN;
            assert_eq!(gd.roce[..n], sd.roce[..n], "datagram {i}");
        }
    }
}
