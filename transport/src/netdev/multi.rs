//! Several UDP netdevs as one: a device that serves more than one local address (rtgtd on
//! every address of the host) gets one socket per address, since a socket bound to the
//! wildcard address could neither tell which address a datagram was sent to nor send from a
//! chosen one without control messages. Datagrams go out through the socket bound to their
//! source address; receive takes from every socket.

use std::io;
use std::net::IpAddr;
use std::task::Poll;

use super::udp::UdpNetDev;
use super::{NetDev, Outgoing};
use crate::wire::Datagram;

/// UDP netdevs bound to distinct local addresses on the same port.
#[derive(Debug)]
pub struct MultiUdpNetDev {
    devs: Vec<UdpNetDev>,
    /// Where the next receive batch starts, so a busy socket does not starve the others.
    next: usize,
}

impl MultiUdpNetDev {
    /// Joins netdevs; all must use the same local port (the device builds every datagram
    /// with one pair of ports).
    pub fn new(devs: Vec<UdpNetDev>) -> io::Result<MultiUdpNetDev> {
        let Some(first) = devs.first() else {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "no sockets"));
        };
        let port = first.local_addr().port();
        if devs.iter().any(|d| d.local_addr().port() != port) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "sockets on different ports",
            ));
        }
        Ok(MultiUdpNetDev { devs, next: 0 })
    }

    /// The local addresses, one per socket.
    pub fn addrs(&self) -> Vec<IpAddr> {
        self.devs.iter().map(|d| d.local_addr().ip()).collect()
    }

    /// Receives up to `max` datagrams with `recv(socket, room left)` from the sockets in
    /// turn, starting one further each time, so that no socket starves the others.
    fn take_turns(
        &mut self,
        max: usize,
        mut recv: impl FnMut(&mut UdpNetDev, usize) -> io::Result<usize>,
    ) -> io::Result<usize> {
        let n = self.devs.len();
        let mut total = 0;
        for k in 0..n {
            if total >= max {
                break;
            }
            let i = (self.next + k) % n;
            total += recv(&mut self.devs[i], max - total)?;
        }
        self.next = (self.next + 1) % n.max(1);
        Ok(total)
    }

    fn route(&self, datagram: &[u8]) -> Option<usize> {
        let src = Datagram::headers(datagram).ok()?.ip_repr().ok()?.src_addr();
        self.devs.iter().position(|d| d.local_addr().ip() == src)
    }
}

impl NetDev for MultiUdpNetDev {
    fn transmit(&mut self, datagram: &[u8]) -> io::Result<()> {
        // A datagram from an address no socket holds cannot be sent: a loss like any other.
        match self.route(datagram) {
            Some(i) => self.devs[i].transmit(datagram),
            None => Ok(()),
        }
    }

    fn receive(&mut self) -> io::Result<Option<Vec<u8>>> {
        let n = self.devs.len();
        for k in 0..n {
            let i = (self.next + k) % n;
            if let Some(d) = self.devs[i].receive()? {
                self.next = (i + 1) % n;
                return Ok(Some(d));
            }
        }
        Ok(None)
    }

    fn transmit_batch(&mut self, datagrams: &[Outgoing]) -> io::Result<()> {
        if self.devs.len() == 1 {
            return self.devs[0].transmit_batch(datagrams);
        }
        let mut per: Vec<Vec<Outgoing>> = (0..self.devs.len()).map(|_| Vec::new()).collect();
        for d in datagrams {
            if let Some(i) = self.route(&d.bytes) {
                per[i].push(d.clone());
            }
        }
        for (dev, batch) in self.devs.iter_mut().zip(&per) {
            if !batch.is_empty() {
                dev.transmit_batch(batch)?;
            }
        }
        Ok(())
    }

    fn tx_ports(&self) -> Option<(u16, u16)> {
        self.devs.first().and_then(|d| d.tx_ports())
    }

    fn recycle(&mut self, bufs: &mut Vec<Vec<u8>>) {
        // Any socket can receive into any buffer.
        if let Some(d) = self.devs.first_mut() {
            d.recycle(bufs);
        }
        bufs.clear();
    }

    fn receive_each(&mut self, max: usize, f: &mut dyn FnMut(&[u8], &[u8])) -> io::Result<usize> {
        self.take_turns(max, |dev, room| dev.receive_each(room, f))
    }

    fn receive_into(&mut self, max: usize, sink: &mut dyn super::RxSink) -> io::Result<usize> {
        self.take_turns(max, |dev, room| dev.receive_into(room, sink))
    }

    fn receive_batch(&mut self, out: &mut Vec<Vec<u8>>, max: usize) -> io::Result<usize> {
        self.take_turns(max, |dev, room| dev.receive_batch(out, room))
    }
}

impl super::AsyncNetDev for MultiUdpNetDev {
    fn readable(&self) -> impl std::future::Future<Output = io::Result<()>> + Send + '_ {
        std::future::poll_fn(move |cx| {
            for d in &self.devs {
                if let Poll::Ready(r) = d.poll_readable(cx) {
                    return Poll::Ready(r);
                }
            }
            Poll::Pending
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::skip_or_fail;
    use crate::wire::{datagram, ipv4, IpRepr};
    use std::net::{Ipv4Addr, SocketAddr};

    fn datagram_from(src: Ipv4Addr, dst: Ipv4Addr, port: u16) -> Vec<u8> {
        let ip = IpRepr::V4(ipv4::Repr::udp(src, dst));
        let mut d = vec![0u8; 28 + 16];
        datagram::emit_headers(&ip, port, 4791, 16, &mut d).unwrap();
        d[28] = 0x04; // RC SEND_ONLY
        d[30] = 0xff;
        d[31] = 0xff;
        d
    }

    #[tokio::test]
    async fn routes_by_source_address() {
        let mut a = match UdpNetDev::bind("127.0.0.1:0".parse().unwrap()) {
            Ok(a) => a,
            Err(e) => return skip_or_fail(format!("cannot bind a UDP socket: {e}")),
        };
        let port = a.local_addr().port();
        let mut b = match UdpNetDev::bind(SocketAddr::new(Ipv4Addr::new(127, 0, 0, 2).into(), port))
        {
            Ok(b) => b,
            Err(e) => return skip_or_fail(format!("cannot bind 127.0.0.2 port {port}: {e}")),
        };
        let sink = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        sink.set_read_timeout(Some(std::time::Duration::from_secs(5)))
            .unwrap();
        let sink_port = sink.local_addr().unwrap().port();
        a.peer_port = sink_port;
        b.peer_port = sink_port;
        let other = UdpNetDev::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        assert!(MultiUdpNetDev::new(vec![other]).is_ok());
        assert!(MultiUdpNetDev::new(Vec::new()).is_err());
        let mut m = MultiUdpNetDev::new(vec![a, b]).unwrap();
        assert_eq!(m.addrs().len(), 2);
        let lo = Ipv4Addr::LOCALHOST;
        let d2 = datagram_from(Ipv4Addr::new(127, 0, 0, 2), lo, port);
        let d1 = datagram_from(lo, lo, port);
        // From an address no socket holds: dropped.
        let d9 = datagram_from(Ipv4Addr::new(127, 0, 0, 9), lo, port);
        // Let the reactor learn that the sockets are writable.
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        m.transmit_batch(&[d2, d9, d1].map(Outgoing::whole))
            .unwrap();
        let mut buf = [0u8; 256];
        let mut froms = Vec::new();
        for _ in 0..2 {
            let (n, from) = sink.recv_from(&mut buf).unwrap();
            assert_eq!(n, 16);
            froms.push(from);
        }
        froms.sort();
        assert_eq!(
            froms,
            vec![
                SocketAddr::new(lo.into(), port),
                SocketAddr::new(Ipv4Addr::new(127, 0, 0, 2).into(), port)
            ]
        );
    }
}
