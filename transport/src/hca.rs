//! A ready-to-use soft HCA: a [`Device`] serving one or more local addresses on UDP 4791,
//! the task that drives it over its sockets, and its connection manager.
//!
//! The device has one GID per address, and RoCEv2 peers address it by GID, so every address
//! initiators connect to must be bound: a wildcard (or empty) address list means every
//! address of the host ([`host_addrs`]), one socket each ([`MultiUdpNetDev`]).

use std::io;
use std::net::{IpAddr, SocketAddr};

use crate::cm::{Cm, CmError, CmLimits};
use crate::netdev::multi::MultiUdpNetDev;
use crate::netdev::udp::UdpNetDev;
use crate::netdev::AsyncNetDev;
use crate::shard::Shard;
use crate::verbs::{Device, DeviceConfig, VerbsError};
use crate::wire::roce;

/// Errors of [`Hca::open`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HcaError {
    #[error("cannot bind UDP {addr}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: io::Error,
    },
    #[error("cannot list the host's addresses")]
    HostAddrs(#[source] io::Error),
    #[error("no address to serve")]
    NoAddress,
    #[error("cannot create the device: {0}")]
    Device(VerbsError),
    #[error("cannot start the connection manager: {0}")]
    Cm(CmError),
    #[error("cannot start the engine thread")]
    Shard(#[source] io::Error),
}

/// What to bring up.
#[derive(Debug, Clone)]
pub struct HcaConfig {
    pub name: String,
    /// Local addresses; empty or a wildcard address means every address of the host.
    pub addrs: Vec<IpAddr>,
    /// Local UDP port (4791).
    pub port: u16,
    /// Destination UDP port of outgoing datagrams (4791; tests may use another).
    pub peer_port: u16,
    /// Ethernet MTU of the links: the port MTU follows (1500 gives 1024).
    pub eth_mtu: usize,
    /// Receive through an AF_PACKET socket on this interface so that IPv4 ICRCs are checked.
    pub packet_rx: Option<String>,
    pub cm_limits: CmLimits,
    /// [`crate::verbs::DeviceConfig::busy_poll`].
    pub busy_poll: std::time::Duration,
    /// Engine threads ([`crate::shard`]): 1 runs the device, its CM and the connections
    /// spawned through [`Hca::spawn`] on a thread of their own; 0 on the caller's runtime.
    pub shards: usize,
}

impl HcaConfig {
    pub fn new(addrs: Vec<IpAddr>) -> HcaConfig {
        HcaConfig {
            name: "rtgt0".into(),
            addrs,
            port: roce::UDP_PORT,
            peer_port: roce::UDP_PORT,
            eth_mtu: 1500,
            packet_rx: None,
            cm_limits: CmLimits::default(),
            busy_poll: std::time::Duration::ZERO,
            shards: 0,
        }
    }
}

/// A device, its driver task and its CM; dropping it stops the task.
#[derive(Debug)]
pub struct Hca {
    dev: Device,
    cm: Cm,
    addrs: Vec<IpAddr>,
    skipped: Vec<(IpAddr, String)>,
    task: tokio::task::JoinHandle<io::Result<()>>,
    /// The engine thread everything above runs on, if any (dropped last).
    shard: Option<Shard>,
}

impl Hca {
    /// Binds the sockets, creates the device and starts its task and CM on the current
    /// tokio runtime. With a wildcard, addresses that cannot be bound are skipped (see
    /// [`Hca::skipped`]); an explicit address that cannot be bound is an error.
    pub fn open(cfg: &HcaConfig) -> Result<Hca, HcaError> {
        if cfg.shards == 0 {
            return Hca::open_here(cfg);
        }
        let shard = Shard::start(&format!("{}-shard0", cfg.name)).map_err(HcaError::Shard)?;
        // Sockets register with the shard's reactor; the runner and the CM spawn there.
        let mut hca = {
            let _on_shard = shard.handle().enter();
            Hca::open_here(cfg)?
        };
        hca.shard = Some(shard);
        Ok(hca)
    }

    /// [`Hca::open`] on the current runtime.
    fn open_here(cfg: &HcaConfig) -> Result<Hca, HcaError> {
        let wildcard = cfg.addrs.is_empty() || cfg.addrs.iter().any(|a| a.is_unspecified());
        let addrs = if wildcard {
            host_addrs().map_err(HcaError::HostAddrs)?
        } else {
            dedup(cfg.addrs.clone())
        };
        let mut socks = Vec::new();
        let mut skipped = Vec::new();
        for ip in addrs {
            let addr = SocketAddr::new(ip, cfg.port);
            let r = match &cfg.packet_rx {
                Some(ifname) => UdpNetDev::bind_with_packet_rx(addr, ifname),
                None => UdpNetDev::bind(addr),
            };
            match r {
                Ok(mut nd) => {
                    nd.peer_port = cfg.peer_port;
                    socks.push(nd);
                }
                Err(e) if wildcard => skipped.push((ip, e.to_string())),
                Err(source) => return Err(HcaError::Bind { addr, source }),
            }
        }
        if socks.is_empty() {
            return match skipped.first() {
                Some((ip, e)) => Err(HcaError::Bind {
                    addr: SocketAddr::new(*ip, cfg.port),
                    source: io::Error::other(e.clone()),
                }),
                None => Err(HcaError::NoAddress),
            };
        }
        let bound: Vec<IpAddr> = socks.iter().map(|s| s.local_addr().ip()).collect();
        let mut dcfg = DeviceConfig::new(&cfg.name, bound.clone());
        dcfg.eth_mtu = cfg.eth_mtu;
        dcfg.busy_poll = cfg.busy_poll;
        // Every ICRC is checked. A plain UDP socket cannot see the IPv4 identification and
        // DF flag: without AF_PACKET receive, IPv4 ICRCs are checked for everything else.
        dcfg.check_icrc = true;
        dcfg.ipv4_header_rebuilt = cfg.packet_rx.is_none();
        let dev = Device::new(dcfg).map_err(HcaError::Device)?;
        let mut hca = if socks.len() == 1 {
            let nd = socks.pop().ok_or(HcaError::NoAddress)?;
            Hca::with_netdev(dev, nd, cfg.cm_limits)?
        } else {
            let nd = MultiUdpNetDev::new(socks).map_err(|source| HcaError::Bind {
                addr: SocketAddr::new(bound[0], cfg.port),
                source,
            })?;
            Hca::with_netdev(dev, nd, cfg.cm_limits)?
        };
        hca.skipped = skipped;
        Ok(hca)
    }

    /// An HCA over any netdev (a loopback pair in tests).
    pub fn with_netdev<N: AsyncNetDev + 'static>(
        dev: Device,
        netdev: N,
        limits: CmLimits,
    ) -> Result<Hca, HcaError> {
        let addrs = dev.gid_table().iter().map(|g| g.to_ip()).collect();
        let task = tokio::spawn(crate::netdev::run(dev.clone(), netdev));
        let cm = match Cm::start_with(&dev, limits) {
            Ok(cm) => cm,
            Err(e) => {
                task.abort();
                return Err(HcaError::Cm(e));
            }
        };
        Ok(Hca {
            dev,
            cm,
            addrs,
            skipped: Vec::new(),
            task,
            shard: None,
        })
    }

    /// Spawns a task that serves this device (a fabric's listener or connection) where the
    /// device runs: on its engine thread, or on the current runtime.
    pub fn spawn<F>(&self, fut: F) -> tokio::task::JoinHandle<F::Output>
    where
        F: std::future::Future + Send + 'static,
        F::Output: Send + 'static,
    {
        match &self.shard {
            Some(s) => s.handle().spawn(fut),
            None => tokio::spawn(fut),
        }
    }

    /// Whether the device runs on an engine thread of its own.
    pub fn on_shard(&self) -> bool {
        self.shard.is_some()
    }

    pub fn device(&self) -> &Device {
        &self.dev
    }

    pub fn cm(&self) -> &Cm {
        &self.cm
    }

    /// The addresses served (the device's GID table, in order).
    pub fn addrs(&self) -> &[IpAddr] {
        &self.addrs
    }

    /// Host addresses a wildcard open could not bind, with the reason.
    pub fn skipped(&self) -> &[(IpAddr, String)] {
        &self.skipped
    }

    /// True while the driver task runs (it ends on a socket error).
    pub fn is_running(&self) -> bool {
        !self.task.is_finished()
    }

    /// Waits (at most `limit`) until the device has nothing left to send: the last MADs of a
    /// tool about to exit (a DREP, say) leave before the sockets close.
    pub async fn drain(&self, limit: std::time::Duration) {
        let end = tokio::time::Instant::now() + limit;
        while self.dev.has_work() && tokio::time::Instant::now() < end {
            tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        }
    }

    /// Stops the driver task; the device stops moving packets.
    pub fn shutdown(&self) {
        self.task.abort();
    }
}

impl Drop for Hca {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn dedup(mut v: Vec<IpAddr>) -> Vec<IpAddr> {
    let mut seen = Vec::new();
    v.retain(|a| {
        let new = !seen.contains(a);
        seen.push(*a);
        new
    });
    v
}

/// Every IPv4 address and every IPv6 address that is not link-local (those need a scope,
/// which a GID cannot carry) of the host's interfaces that are up.
pub fn host_addrs() -> io::Result<Vec<IpAddr>> {
    let mut out = Vec::new();
    let mut ifap: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs writes a list head into `ifap`, freed below with freeifaddrs.
    if unsafe { libc::getifaddrs(&mut ifap) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let mut cur = ifap;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs returned, alive until freeifaddrs.
        let ifa = unsafe { &*cur };
        cur = ifa.ifa_next;
        if ifa.ifa_addr.is_null() || ifa.ifa_flags & libc::IFF_UP as u32 == 0 {
            continue;
        }
        // SAFETY: ifa_addr is non-null and points at a sockaddr whose family says its type.
        let family = i32::from(unsafe { (*ifa.ifa_addr).sa_family });
        let ip = match family {
            libc::AF_INET => {
                // SAFETY: an AF_INET address is a sockaddr_in.
                let sin = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
                IpAddr::from(sin.sin_addr.s_addr.to_ne_bytes())
            }
            libc::AF_INET6 => {
                // SAFETY: an AF_INET6 address is a sockaddr_in6.
                let sin6 = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in6) };
                IpAddr::from(sin6.sin6_addr.s6_addr)
            }
            _ => continue,
        };
        let link_local = matches!(ip, IpAddr::V6(a) if (a.segments()[0] & 0xffc0) == 0xfe80);
        if !link_local && !out.contains(&ip) {
            out.push(ip);
        }
    }
    // SAFETY: `ifap` came from a successful getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(ifap) };
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_addrs_has_loopback() {
        let a = host_addrs().unwrap();
        assert!(a.contains(&IpAddr::from([127, 0, 0, 1])), "{a:?}");
        assert!(a
            .iter()
            .all(|a| !matches!(a, IpAddr::V6(v) if v.segments()[0] == 0xfe80)));
    }

    #[test]
    fn dedup_keeps_order() {
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        assert_eq!(dedup(vec![a, b, a]), vec![a, b]);
    }
}
