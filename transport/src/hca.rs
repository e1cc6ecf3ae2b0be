//! A ready-to-use soft HCA: [`Device`]s serving one or more local addresses on UDP 4791 —
//! one per engine thread, each owning a share of the QPs ([`crate::verbs::shards`]) — the
//! tasks that drive them over their sockets, and the connection manager.
//!
//! The device has one GID per address, and RoCEv2 peers address it by GID, so every address
//! initiators connect to must be bound: a wildcard (or empty) address list means every
//! address of the host ([`host_addrs`]), one socket each ([`MultiUdpNetDev`]).

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use crate::cm::{Cm, CmError, CmLimits};
use crate::netdev::multi::MultiUdpNetDev;
use crate::netdev::udp::UdpNetDev;
use crate::netdev::AsyncNetDev;
use crate::shard::Shard;
use crate::verbs::{Device, DeviceConfig, ShardMember, ShardSet, Stats, VerbsError};
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
    #[error("packet socket receive needs a single engine thread")]
    PacketRxSharded,
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
    /// Receive through an AF_PACKET socket on this interface so that IPv4 ICRCs are checked
    /// (one engine thread at most).
    pub packet_rx: Option<String>,
    pub cm_limits: CmLimits,
    /// [`crate::verbs::DeviceConfig::busy_poll`].
    pub busy_poll: std::time::Duration,
    /// Engine threads ([`crate::shard`]), each with a device of its own that owns a share of
    /// the QPs ([`crate::verbs::shards`]) and the connections spawned on it
    /// ([`Hca::spawn_at`]); 0 runs one device on the caller's runtime.
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

/// One device of the HCA and its driver task.
#[derive(Debug)]
struct Member {
    dev: Device,
    task: tokio::task::JoinHandle<io::Result<()>>,
    /// Live connections placed on it ([`Hca::place`]).
    placed: Arc<AtomicUsize>,
}

/// A connection's place on one device of an [`Hca`] ([`Hca::place`]); dropping it frees it.
#[derive(Debug)]
pub struct Placement {
    index: usize,
    placed: Arc<AtomicUsize>,
}

impl Placement {
    /// The device ([`Hca::device_at`], [`Hca::spawn_at`]).
    pub fn index(&self) -> usize {
        self.index
    }
}

impl Drop for Placement {
    fn drop(&mut self) {
        self.placed.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The devices (one per engine thread), their driver tasks and the CM, which runs on the
/// first; dropping it stops the tasks and the threads.
#[derive(Debug)]
pub struct Hca {
    members: Vec<Member>,
    cm: Cm,
    addrs: Vec<IpAddr>,
    skipped: Vec<(IpAddr, String)>,
    /// The engine threads the members run on, if any (dropped last).
    threads: Vec<Shard>,
    /// Where [`Hca::place`] starts looking next.
    next: AtomicUsize,
}

impl Hca {
    /// Binds the sockets, creates the devices and starts their tasks and the CM. With a
    /// wildcard, addresses that cannot be bound are skipped (see [`Hca::skipped`]); an
    /// explicit address that cannot be bound is an error.
    pub fn open(cfg: &HcaConfig) -> Result<Hca, HcaError> {
        let count = cfg.shards.max(1);
        if count > 1 && cfg.packet_rx.is_some() {
            return Err(HcaError::PacketRxSharded);
        }
        let (groups, skipped) = bind_groups(cfg, count)?;
        let bound: Vec<IpAddr> = groups.iter().map(|(ip, _)| *ip).collect();
        let set = (count > 1).then(|| ShardSet::new(count));
        let mut per_member: Vec<Vec<std::net::UdpSocket>> =
            (0..count).map(|_| Vec::new()).collect();
        for (_, socks) in groups {
            for (k, s) in socks.into_iter().enumerate() {
                per_member[k].push(s);
            }
        }
        let mut threads = Vec::new();
        let mut members = Vec::new();
        let mut cm = None;
        for (k, socks) in per_member.into_iter().enumerate() {
            let thread = if cfg.shards == 0 {
                None
            } else {
                let name = format!("{}-shard{k}", cfg.name);
                Some(Shard::start(&name).map_err(HcaError::Shard)?)
            };
            // Sockets register with the member's reactor; its runner (and the CM) spawn there.
            let _on_thread = thread.as_ref().map(|t| t.handle().enter());
            let mut dcfg = DeviceConfig::new(&cfg.name, bound.clone());
            dcfg.eth_mtu = cfg.eth_mtu;
            dcfg.busy_poll = cfg.busy_poll;
            // Every ICRC is checked. A plain UDP socket cannot see the IPv4 identification and
            // DF flag: without AF_PACKET receive, IPv4 ICRCs are checked for everything else.
            dcfg.check_icrc = true;
            dcfg.ipv4_header_rebuilt = cfg.packet_rx.is_none();
            dcfg.shard = set.clone().map(|set| ShardMember { set, index: k });
            let dev = Device::new(dcfg).map_err(HcaError::Device)?;
            let task = spawn_runner(&dev, socks, cfg, bound[0])?;
            if k == 0 {
                cm = Some(Cm::start_with(&dev, cfg.cm_limits).map_err(|e| {
                    task.abort();
                    HcaError::Cm(e)
                })?);
            }
            drop(_on_thread);
            members.push(Member {
                dev,
                task,
                placed: Arc::default(),
            });
            threads.extend(thread);
        }
        Ok(Hca {
            members,
            cm: cm.ok_or(HcaError::NoAddress)?,
            addrs: bound,
            skipped,
            threads,
            next: Default::default(),
        })
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
            members: vec![Member {
                dev,
                task,
                placed: Arc::default(),
            }],
            cm,
            addrs,
            skipped: Vec::new(),
            threads: Vec::new(),
            next: Default::default(),
        })
    }

    /// Spawns a task that serves this HCA (a fabric's listener) where the CM runs: on the
    /// first engine thread, or on the current runtime.
    pub fn spawn<F>(&self, fut: F) -> tokio::task::JoinHandle<F::Output>
    where
        F: std::future::Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.spawn_at(0, fut)
    }

    /// Spawns a task where device `index` runs (a connection whose QP it owns): its engine
    /// thread, or the current runtime.
    pub fn spawn_at<F>(&self, index: usize, fut: F) -> tokio::task::JoinHandle<F::Output>
    where
        F: std::future::Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.runtime_at(index).spawn(fut)
    }

    /// The runtime device `index` runs on (its engine thread's, or the current one).
    pub fn runtime_at(&self, index: usize) -> tokio::runtime::Handle {
        match self.threads.get(index) {
            Some(s) => s.handle().clone(),
            None => tokio::runtime::Handle::current(),
        }
    }

    /// Whether the devices run on engine threads of their own.
    pub fn on_shard(&self) -> bool {
        !self.threads.is_empty()
    }

    /// The number of devices (engine threads, or 1).
    pub fn count(&self) -> usize {
        self.members.len()
    }

    /// A device for a new connection: one with the fewest connections placed on it, taking
    /// turns among equals. The connection holds the placement while it lives.
    pub fn place(&self) -> Placement {
        let n = self.members.len();
        let start = self.next.fetch_add(1, Ordering::Relaxed) % n;
        let index = (0..n)
            .map(|i| (start + i) % n)
            .min_by_key(|&k| self.members[k].placed.load(Ordering::Relaxed))
            .unwrap_or(0);
        let placed = self.members[index].placed.clone();
        placed.fetch_add(1, Ordering::Relaxed);
        Placement { index, placed }
    }

    /// Connections placed on each device and still alive.
    pub fn placed(&self) -> Vec<usize> {
        self.members
            .iter()
            .map(|m| m.placed.load(Ordering::Relaxed))
            .collect()
    }

    /// The first device: the CM's (QP1), and the only one without engine threads.
    pub fn device(&self) -> &Device {
        &self.members[0].dev
    }

    /// Device `index` (see [`Hca::count`]).
    pub fn device_at(&self, index: usize) -> &Device {
        &self.members[index].dev
    }

    /// Every device, in order.
    pub fn devices(&self) -> impl Iterator<Item = &Device> {
        self.members.iter().map(|m| &m.dev)
    }

    /// The packet counters of all devices together.
    pub fn stats(&self) -> Stats {
        let mut s = Stats::default();
        for m in &self.members {
            s += m.dev.stats();
        }
        s
    }

    /// Live QPs of all devices (QP1 included).
    pub fn live_qps(&self) -> usize {
        self.members.iter().map(|m| m.dev.live_qps()).sum()
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

    /// True while every driver task runs (one ends on a socket error).
    pub fn is_running(&self) -> bool {
        self.members.iter().all(|m| !m.task.is_finished())
    }

    /// Waits (at most `limit`) until the devices have nothing left to send: the last MADs of
    /// a tool about to exit (a DREP, say) leave before the sockets close.
    pub async fn drain(&self, limit: std::time::Duration) {
        let end = tokio::time::Instant::now() + limit;
        while self.members.iter().any(|m| m.dev.has_work()) && tokio::time::Instant::now() < end {
            tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        }
    }

    /// Stops the driver tasks; the devices stop moving packets.
    pub fn shutdown(&self) {
        for m in &self.members {
            m.task.abort();
        }
    }
}

impl Drop for Hca {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// The sockets of every address to serve, `count` per address in one steering group
/// ([`crate::netdev::udp::bind_group`]), and the addresses a wildcard skipped.
#[allow(clippy::type_complexity)]
fn bind_groups(
    cfg: &HcaConfig,
    count: usize,
) -> Result<
    (
        Vec<(IpAddr, Vec<std::net::UdpSocket>)>,
        Vec<(IpAddr, String)>,
    ),
    HcaError,
> {
    let wildcard = cfg.addrs.is_empty() || cfg.addrs.iter().any(|a| a.is_unspecified());
    let addrs = if wildcard {
        host_addrs().map_err(HcaError::HostAddrs)?
    } else {
        dedup(cfg.addrs.clone())
    };
    let mut groups = Vec::new();
    let mut skipped = Vec::new();
    for ip in addrs {
        let addr = SocketAddr::new(ip, cfg.port);
        match crate::netdev::udp::bind_group(addr, count) {
            Ok((socks, _steered)) => groups.push((ip, socks)),
            Err(e) if wildcard => skipped.push((ip, e.to_string())),
            Err(source) => return Err(HcaError::Bind { addr, source }),
        }
    }
    if groups.is_empty() {
        return match skipped.first() {
            Some((ip, e)) => Err(HcaError::Bind {
                addr: SocketAddr::new(*ip, cfg.port),
                source: io::Error::other(e.clone()),
            }),
            None => Err(HcaError::NoAddress),
        };
    }
    Ok((groups, skipped))
}

/// Starts the runner of `dev` over `socks` (one per address) on the current runtime.
fn spawn_runner(
    dev: &Device,
    socks: Vec<std::net::UdpSocket>,
    cfg: &HcaConfig,
    first: IpAddr,
) -> Result<tokio::task::JoinHandle<io::Result<()>>, HcaError> {
    let bind_err = |source: io::Error| HcaError::Bind {
        addr: SocketAddr::new(first, cfg.port),
        source,
    };
    let mut nds = Vec::new();
    for s in socks {
        let mut nd = UdpNetDev::from_socket(s).map_err(bind_err)?;
        if let Some(ifname) = &cfg.packet_rx {
            nd.add_packet_rx(ifname).map_err(bind_err)?;
        }
        nd.peer_port = cfg.peer_port;
        nds.push(nd);
    }
    Ok(if nds.len() == 1 {
        let nd = nds.pop().ok_or(HcaError::NoAddress)?;
        tokio::spawn(crate::netdev::run(dev.clone(), nd))
    } else {
        let nd = MultiUdpNetDev::new(nds).map_err(bind_err)?;
        tokio::spawn(crate::netdev::run(dev.clone(), nd))
    })
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
