//! `rtgt-rdma`: RDMA test tools on rtgt's software RoCEv2 stack over a UDP socket on port 4791.
//!
//! * `rc-pingpong`: wire-compatible with rdma-core's `ibv_rc_pingpong` (server or client);
//! * `ud-pingpong`: wire-compatible with rdma-core's `ibv_ud_pingpong`;
//! * `perftest`: the server side of perftest's `ib_write_bw` / `ib_read_bw` / `ib_send_bw` /
//!   `ib_write_lat`;
//! * `bench`: two devices over UDP on 127.0.0.1 in one process, next to a raw UDP ceiling;
//! * `rping`: server and client of rdma-core's `rping`, through rtgt's connection manager.
//!
//! The pingpong tools exchange `LLLL:QQQQQQ:PPPPPP:GGGG...` (LID, QPN, PSN, GID as 32 hex digits)
//! over TCP, as the rdma-core examples do, then bounce SENDs of `--size` bytes `--iters` times.
//! As with the rdma-core tools, the server needs no address: its RoCEv2 address is the one the
//! client's TCP connection reached.
//!
//! Every message rtgt sends carries a pattern of its own (one per iteration, seeded by the
//! sender's QPN and PSN), with a 0 at the start of every page as rdma-core's `--chk` expects.
//! The rdma-core tools send back the buffer they received into, another rtgt end sends its own
//! pattern: rtgt checks each message it receives against the pattern of the message it answers
//! and against the peer's pattern for that iteration, and fails unless one matches
//! (`--no-check` turns this off). `-c`/`--chk` also requires the 0 at every page start of every
//! message received, which covers the first message of an rdma-core client running `--chk`.

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Args, Parser, Subcommand};
use rtgt_transport::verbs::*;

mod bench;
mod perftest;
mod rping;
mod verbs_check;

#[derive(Parser)]
#[command(
    name = "rtgt-rdma",
    about = "RDMA test tools on rtgt's software RoCEv2 stack"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// RC SEND ping-pong, compatible with ibv_rc_pingpong.
    RcPingpong(PpArgs),
    /// UD SEND ping-pong, compatible with ibv_ud_pingpong.
    UdPingpong(PpArgs),
    /// Server for perftest's ib_write_bw, ib_read_bw, ib_send_bw and ib_write_lat (RC, one
    /// client run).
    Perftest(perftest::PerftestArgs),
    /// Loopback benchmark: two rtgt devices over UDP on 127.0.0.1 and a raw UDP ceiling.
    Bench(bench::BenchArgs),
    /// RDMA ping through the connection manager, compatible with rdma-core's rping (server
    /// or client).
    Rping(rping::RpingArgs),
    /// The host's RDMA devices as rdma-core sees them (the `verbs` provider's devices): ports,
    /// link layer, MTU and GIDs with their addresses and network devices.
    Devices,
    /// rdma-core's data path on one device: two RC QPs connected to each other, SEND, RDMA
    /// WRITE and READ checked, then RDMA WRITE bandwidth.
    VerbsCheck(verbs_check::VerbsCheckArgs),
}

#[derive(Args, Clone)]
struct PpArgs {
    /// Wait for a client (the default without a server name).
    #[arg(long)]
    server: bool,
    /// The server to connect to (client mode).
    servername: Option<String>,
    /// Local IPv4/IPv6 address for RoCEv2 (UDP 4791). Defaults to this end's address of the
    /// TCP exchange: for the server the address the client reached, for the client the one
    /// its connection to the server starts from.
    #[arg(long)]
    local: Option<IpAddr>,
    /// TCP port of the address exchange.
    #[arg(short = 'p', long, default_value_t = 18515)]
    port: u16,
    /// Message size in bytes.
    #[arg(short = 's', long, default_value_t = 4096)]
    size: u32,
    /// Number of exchanges.
    #[arg(short = 'n', long, default_value_t = 1000)]
    iters: u32,
    /// Path MTU (256, 512, 1024, 2048, 4096).
    #[arg(short = 'm', long, default_value_t = 1024)]
    mtu: usize,
    /// Receives kept posted.
    #[arg(short = 'r', long, default_value_t = 8)]
    rx_depth: u32,
    /// Accepted for compatibility with the rdma-core tools (rtgt has one GID per address).
    #[arg(short = 'g', long)]
    gid_idx: Option<u32>,
    /// Accepted for compatibility (rtgt has one device).
    #[arg(short = 'd', long)]
    ib_dev: Option<String>,
    /// Ethernet MTU of the link (the port MTU follows as in rxe: 1500 gives 1024).
    #[arg(long, default_value_t = 1500)]
    eth_mtu: usize,
    /// Receive through an AF_PACKET socket on this interface so that IPv4 ICRCs are verified in
    /// full (IP ID and DF included).
    #[arg(long)]
    packet_rx: Option<String>,
    /// Do not check the payload of received messages.
    #[arg(long)]
    no_check: bool,
    /// Validate the received buffers as rdma-core's `--chk` does: every page of every message
    /// received must start with 0 (on top of the pattern check).
    #[arg(short = 'c', long = "chk", conflicts_with = "no_check")]
    chk: bool,
    /// Give up after this many seconds.
    #[arg(long, default_value_t = 120)]
    timeout: u64,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // The bench runs two devices (and a raw sender and receiver): one worker each.
    let workers = if matches!(cli.cmd, Cmd::Bench(_)) {
        2
    } else {
        1
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("rtgt-rdma: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let r = match cli.cmd {
        Cmd::RcPingpong(a) => pingpong(&rt, &a, QpType::Rc),
        Cmd::UdPingpong(a) => pingpong(&rt, &a, QpType::Ud),
        Cmd::Perftest(a) => perftest::run_perftest(&rt, &a),
        Cmd::Bench(a) => bench::run_bench(&rt, &a),
        Cmd::Rping(a) => rping::run_rping(&rt, &a),
        Cmd::Devices => devices(),
        Cmd::VerbsCheck(a) => verbs_check::run(&rt, &a),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rtgt-rdma: {e}");
            ExitCode::FAILURE
        }
    }
}

pub(crate) type Result<T> = std::result::Result<T, String>;

pub(crate) fn err<E: std::fmt::Display>(what: &str) -> impl FnOnce(E) -> String + '_ {
    move |e| format!("{what}: {e}")
}

/// The address of a pingpong end as the rdma-core examples exchange it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Dest {
    lid: u32,
    qpn: u32,
    psn: u32,
    gid: Gid,
}

/// `sizeof "0000:000000:000000:00000000000000000000000000000000"`, NUL included.
const MSG_LEN: usize = 52;

impl Dest {
    /// `%04x:%06x:%06x:%s` with the GID as 32 hex digits (byte order as on the wire), NUL
    /// padded to [`MSG_LEN`].
    fn encode(&self) -> [u8; MSG_LEN] {
        let mut s = format!("{:04x}:{:06x}:{:06x}:", self.lid, self.qpn, self.psn);
        for b in self.gid.0 {
            s.push_str(&format!("{b:02x}"));
        }
        let mut out = [0u8; MSG_LEN];
        let n = s.len().min(MSG_LEN - 1);
        out[..n].copy_from_slice(&s.as_bytes()[..n]);
        out
    }

    fn decode(msg: &[u8]) -> Option<Dest> {
        let end = msg.iter().position(|&b| b == 0).unwrap_or(msg.len());
        let s = std::str::from_utf8(&msg[..end]).ok()?;
        let mut it = s.splitn(4, ':');
        let lid = u32::from_str_radix(it.next()?, 16).ok()?;
        let qpn = u32::from_str_radix(it.next()?, 16).ok()?;
        let psn = u32::from_str_radix(it.next()?, 16).ok()?;
        let g = it.next()?.trim();
        if g.len() != 32 || !g.is_ascii() {
            return None;
        }
        let mut gid = [0u8; 16];
        for (i, b) in gid.iter_mut().enumerate() {
            *b = u8::from_str_radix(&g[2 * i..2 * i + 2], 16).ok()?;
        }
        Some(Dest {
            lid,
            qpn: qpn & 0xFF_FFFF,
            psn: psn & 0xFF_FFFF,
            gid: Gid(gid),
        })
    }
}

/// The pattern of message `iter` sent by an end with `seed`: position-dependent bytes, with a
/// 0 at the start of every page of `page` bytes (what rdma-core's `--chk` checks).
fn pattern(seed: u32, iter: u32, len: usize, page: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9) ^ iter.wrapping_mul(0x85EB_CA6B) ^ 0x2545_F491;
    let mut out: Vec<u8> = (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect();
    for b in out.iter_mut().step_by(page.max(1)) {
        *b = 0;
    }
    out
}

/// The pattern seed of the end with this address.
fn pattern_seed(d: &Dest) -> u32 {
    d.qpn ^ d.psn.rotate_left(8)
}

/// The first page (of `page` bytes) of `buf` that does not start with 0.
fn unmarked_page(buf: &[u8], page: usize) -> Option<usize> {
    buf.iter().step_by(page.max(1)).position(|&b| b != 0)
}

/// The system's page size, the unit of rdma-core's `--chk` marks.
fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(n).ok().filter(|&n| n > 0).unwrap_or(4096)
}

pub(crate) fn psn_seed() -> u32 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    (t.subsec_nanos() ^ (t.as_secs() as u32) ^ std::process::id().rotate_left(16)) & 0xFF_FFFF
}

fn read_full(s: &mut TcpStream, buf: &mut [u8]) -> Result<()> {
    s.read_exact(buf).map_err(err("exchange: read"))
}

/// The TCP side of the exchange, connected before the QP exists: each end's RoCEv2 address
/// defaults to the local address of this connection.
enum Conn {
    /// The accepted connection and the client's address.
    Server(TcpStream, SocketAddr),
    Client(TcpStream),
}

impl Conn {
    fn stream(&self) -> &TcpStream {
        match self {
            Conn::Server(s, _) | Conn::Client(s) => s,
        }
    }
}

fn open_conn(a: &PpArgs, deadline: Instant) -> Result<Conn> {
    match (&a.servername, a.server) {
        (Some(_), true) => Err("--server and a server name exclude each other".into()),
        (None, _) => {
            let l = TcpListener::bind((Ipv4Addr::UNSPECIFIED, a.port))
                .map_err(err("exchange: cannot listen"))?;
            l.set_nonblocking(true).map_err(err("exchange"))?;
            let (s, peer) = loop {
                match l.accept() {
                    Ok(x) => break x,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        if Instant::now() >= deadline {
                            return Err("exchange: no client connected".into());
                        }
                        std::thread::sleep(Duration::from_millis(50));
                    }
                    Err(e) => return Err(format!("exchange: accept: {e}")),
                }
            };
            s.set_nonblocking(false).map_err(err("exchange"))?;
            Ok(Conn::Server(s, peer))
        }
        (Some(name), false) => {
            let addrs: Vec<SocketAddr> = (name.as_str(), a.port)
                .to_socket_addrs()
                .map_err(err("exchange: cannot resolve the server"))?
                .collect();
            // The server may not listen yet: retry until the deadline.
            loop {
                for sa in &addrs {
                    if let Ok(s) = TcpStream::connect_timeout(sa, Duration::from_secs(2)) {
                        return Ok(Conn::Client(s));
                    }
                }
                if Instant::now() >= deadline {
                    return Err(format!("exchange: cannot connect to {name}:{}", a.port));
                }
                std::thread::sleep(Duration::from_millis(200));
            }
        }
    }
}

pub(crate) use rtgt_transport::hca::{Hca, HcaConfig};

/// An rtgt device on a UDP socket (with its connection manager), run by the runtime until
/// dropped.
pub(crate) fn open_hca(
    rt: &tokio::runtime::Runtime,
    local: SocketAddr,
    eth_mtu: usize,
    packet_rx: Option<&str>,
    peer_port: Option<u16>,
) -> Result<Hca> {
    open_config(rt, &hca_config(local, eth_mtu, packet_rx, peer_port))
}

/// The configuration [`open_hca`] opens.
pub(crate) fn hca_config(
    local: SocketAddr,
    eth_mtu: usize,
    packet_rx: Option<&str>,
    peer_port: Option<u16>,
) -> HcaConfig {
    let mut cfg = HcaConfig::new(vec![local.ip()]);
    cfg.port = local.port();
    cfg.eth_mtu = eth_mtu;
    cfg.packet_rx = packet_rx.map(str::to_string);
    if let Some(p) = peer_port {
        cfg.peer_port = p;
    }
    cfg
}

/// Opens `cfg` with its tasks on `rt`.
pub(crate) fn open_config(rt: &tokio::runtime::Runtime, cfg: &HcaConfig) -> Result<Hca> {
    let _g = rt.enter();
    Hca::open(cfg).map_err(|e| error_chain(&e))
}

/// An error with its sources, joined.
pub(crate) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(s) = cur {
        out.push_str(": ");
        out.push_str(&s.to_string());
        cur = s.source();
    }
    out
}

/// Moves an RC QP from RESET to INIT.
pub(crate) fn rc_init(qp: &Qp, access: Access) -> Result<()> {
    qp.to_init(access).map_err(err("modify QP to INIT"))
}

/// Moves an RC QP to RTS towards `remote` (the attributes ibv_rc_pingpong uses).
pub(crate) fn connect_rc(
    qp: &Qp,
    remote: IpAddr,
    rqpn: u32,
    rpsn: u32,
    my_psn: u32,
    mtu: Mtu,
    access: Access,
) -> Result<()> {
    if qp.state() == QpState::Reset {
        rc_init(qp, access)?;
    }
    qp.to_rts(&RcPath {
        mtu,
        min_rnr_timer: 12,
        ..RcPath::new(remote, rqpn, rpsn, my_psn)
    })
    .map_err(err("modify QP to RTR/RTS"))
}

const UD_QKEY: u32 = 0x1111_1111;
const GRH_LEN: usize = 40;
const SEND_WRID: u64 = 1 << 32;

fn pingpong(rt: &tokio::runtime::Runtime, a: &PpArgs, qp_type: QpType) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(a.timeout);
    let mtu = Mtu::from_bytes(a.mtu).ok_or_else(|| format!("bad MTU {}", a.mtu))?;
    let size = a.size as usize;
    if size == 0 {
        return Err("--size must be at least 1".into());
    }
    if qp_type == QpType::Ud && size > mtu.bytes() {
        return Err(format!(
            "UD messages are at most the MTU ({} bytes)",
            mtu.bytes()
        ));
    }
    let conn = open_conn(a, deadline)?;
    // Without --local, the address the TCP connection uses on this end: for a server the one
    // the client reached, for a client the one its route to the server starts from.
    let local_ip = match a.local {
        Some(ip) => ip,
        None => conn.stream().local_addr().map_err(err("exchange"))?.ip(),
    };
    let hca = open_hca(
        rt,
        SocketAddr::new(local_ip, 4791),
        a.eth_mtu,
        a.packet_rx.as_deref(),
        None,
    )?;
    let dev = hca.device();
    let pd = dev.alloc_pd().map_err(err("alloc PD"))?;
    if a.size > dev.attr().max_msg_sz {
        return Err(format!(
            "--size {} is larger than the largest message ({})",
            a.size,
            dev.attr().max_msg_sz
        ));
    }
    // Receives kept posted, within 64 MiB of buffers.
    let depth = a
        .rx_depth
        .clamp(2, 64)
        .min(((64 << 20) / size).max(2) as u32);
    let cq = dev.create_cq(2 * depth + 8).map_err(err("create CQ"))?;
    let mut init = QpInitAttr::new(qp_type, &cq, &cq);
    init.cap.max_recv_wr = depth;
    init.cap.max_send_wr = 4;
    let qp = pd.create_qp(init).map_err(err("create QP"))?;
    // UD receives start with 40 bytes of GRH space.
    let slot = if qp_type == QpType::Ud {
        size + GRH_LEN
    } else {
        size
    };
    let region = Arc::new(Region::zeroed(slot * (depth as usize + 1)));
    let access = Access::LOCAL_WRITE;
    let mr = pd
        .reg_mr(region.clone(), access)
        .map_err(err("register MR"))?;
    let send_off = slot * depth as usize;
    let recv_sge = |i: u64| mr.sge(i as usize * slot, slot as u32);
    if qp_type == QpType::Ud {
        use QpAttrMask as M;
        let mut at = QpAttr {
            qp_state: Some(QpState::Init),
            port_num: 1,
            qkey: UD_QKEY,
            ..Default::default()
        };
        qp.modify(&at, M::STATE | M::PKEY_INDEX | M::PORT | M::QKEY)
            .map_err(err("modify QP to INIT"))?;
        at.qp_state = Some(QpState::Rtr);
        qp.modify(&at, M::STATE).map_err(err("modify QP to RTR"))?;
        at.qp_state = Some(QpState::Rts);
        at.sq_psn = 0;
        qp.modify(&at, M::STATE | M::SQ_PSN)
            .map_err(err("modify QP to RTS"))?;
    }
    if qp_type == QpType::Rc {
        rc_init(&qp, access)?;
    }
    for i in 0..depth as u64 {
        qp.post_recv(RecvWr {
            wr_id: i,
            sg_list: recv_sge(i).into(),
        })
        .map_err(err("post receive"))?;
    }
    let my = Dest {
        lid: 0,
        qpn: qp.qpn(),
        psn: if qp_type == QpType::Ud { 0 } else { psn_seed() },
        gid: Gid::from_ip(local_ip),
    };
    println!(
        "  local address:  LID 0x{:04x}, QPN 0x{:06x}, PSN 0x{:06x}, GID {}",
        my.lid,
        my.qpn,
        my.psn,
        std::net::Ipv6Addr::from(my.gid.0)
    );
    let connect = |rem: &Dest, peer: IpAddr| -> Result<IpAddr> {
        // A zero GID (the peer ran without -g) leaves only the exchange's address.
        let ip = if rem.gid.0 == [0; 16] {
            peer
        } else {
            rem.gid.to_ip()
        };
        if qp_type == QpType::Rc {
            connect_rc(&qp, ip, rem.qpn, rem.psn, my.psn, mtu, access)?;
        }
        Ok(ip)
    };
    let is_client = matches!(conn, Conn::Client(_));
    let (rem, rem_ip) = match conn {
        Conn::Server(mut s, peer) => {
            s.set_read_timeout(Some(Duration::from_secs(30)))
                .map_err(err("exchange"))?;
            let mut msg = [0u8; MSG_LEN];
            read_full(&mut s, &mut msg)?;
            let rem = Dest::decode(&msg).ok_or("exchange: bad address message")?;
            let ip = connect(&rem, peer.ip())?;
            s.write_all(&my.encode()).map_err(err("exchange: write"))?;
            // The client answers "done" (5 bytes with the NUL).
            let mut done = [0u8; 5];
            read_full(&mut s, &mut done)?;
            (rem, ip)
        }
        Conn::Client(mut s) => {
            s.set_read_timeout(Some(Duration::from_secs(30)))
                .map_err(err("exchange"))?;
            let peer = s.peer_addr().map_err(err("exchange"))?.ip();
            s.write_all(&my.encode()).map_err(err("exchange: write"))?;
            let mut msg = [0u8; MSG_LEN];
            read_full(&mut s, &mut msg)?;
            s.write_all(b"done\0").map_err(err("exchange: write"))?;
            let rem = Dest::decode(&msg).ok_or("exchange: bad address message")?;
            let ip = connect(&rem, peer)?;
            (rem, ip)
        }
    };
    println!(
        "  remote address: LID 0x{:04x}, QPN 0x{:06x}, PSN 0x{:06x}, GID {}",
        rem.lid,
        rem.qpn,
        rem.psn,
        std::net::Ipv6Addr::from(rem.gid.0)
    );
    let ud = if qp_type == QpType::Ud {
        let ah = dev
            .create_ah(&pd, AddressVector::new(rem_ip))
            .map_err(err("create AH"))?;
        Some(UdDest {
            ah,
            remote_qpn: rem.qpn,
            remote_qkey: UD_QKEY,
        })
    } else {
        None
    };

    let seed = pattern_seed(&my);
    let peer_seed = pattern_seed(&rem);
    let page = page_size();
    let check = !a.no_check;
    let mut scnt = 0u32;
    let mut rcnt = 0u32;
    let mut bad = 0u32;
    let mut pending_send = false;
    let mut pending_recv = true;
    let send = |iter: u32| -> Result<()> {
        region.write(send_off, &pattern(seed, iter, size, page));
        let mut wr = SendWr::new(
            SEND_WRID | iter as u64,
            SendOp::Send,
            vec![mr.sge(send_off, size as u32)],
        );
        wr.ud = ud.clone();
        qp.post_send(wr).map_err(err("post send"))
    };
    let start = Instant::now();
    if is_client {
        send(0)?;
        pending_send = true;
    }
    let mut wcs = Vec::new();
    let mut got = vec![0u8; size];
    while rcnt < a.iters || scnt < a.iters {
        let left = deadline.saturating_duration_since(Instant::now());
        let ok = rt.block_on(async { tokio::time::timeout(left, cq.wait_nonempty()).await });
        if ok.is_err() {
            return Err(format!(
                "timed out after {scnt} sends and {rcnt} receives (QP {})",
                qp.debug_state()
            ));
        }
        wcs.clear();
        cq.poll_into(&mut wcs, 16);
        for wc in &wcs {
            if wc.status != WcStatus::Success {
                return Err(format!(
                    "completion {:?} for wr_id {:#x} after {scnt} sends and {rcnt} receives",
                    wc.status, wc.wr_id
                ));
            }
            if wc.wr_id & SEND_WRID != 0 {
                scnt += 1;
                pending_send = false;
            } else {
                let i = wc.wr_id;
                let skip = if qp_type == QpType::Ud { GRH_LEN } else { 0 };
                if wc.byte_len as usize != size + skip {
                    return Err(format!(
                        "receive {rcnt}: {} bytes, expected {}",
                        wc.byte_len,
                        size + skip
                    ));
                }
                region.read(i as usize * slot + skip, &mut got);
                // An rdma-core peer sends back what it received: the client's message `n`
                // answers its own message `n`, the server's message `n` answers its message
                // `n - 1`. Another rtgt end sends its own pattern: message `n` of either end
                // arrives as the other's receive `n`.
                let answered = if is_client {
                    Some(rcnt)
                } else {
                    rcnt.checked_sub(1)
                };
                let problem = if !check {
                    None
                } else if let Some(p) = a.chk.then(|| unmarked_page(&got, page)).flatten() {
                    Some(format!(
                        "page {p} does not start with 0 (does the peer run --chk?)"
                    ))
                } else if answered.is_some_and(|n| got == pattern(seed, n, size, page))
                    || got == pattern(peer_seed, rcnt, size, page)
                {
                    None
                } else if let Some(n) = answered {
                    let want = pattern(seed, n, size, page);
                    let at = got.iter().zip(&want).position(|(x, y)| x != y);
                    Some(format!(
                        "payload is neither the peer's message {rcnt} nor message {n} sent \
                         back (it differs from that at byte {at:?})"
                    ))
                } else {
                    // The first message of an rdma-core client carries its own buffer.
                    None
                };
                if let Some(p) = problem {
                    bad += 1;
                    if bad <= 3 {
                        eprintln!("receive {rcnt}: {p}");
                    }
                }
                rcnt += 1;
                pending_recv = false;
                qp.post_recv(RecvWr {
                    wr_id: i,
                    sg_list: recv_sge(i).into(),
                })
                .map_err(err("post receive"))?;
            }
            if scnt < a.iters && !pending_send && !pending_recv {
                send(scnt)?;
                pending_send = true;
                pending_recv = true;
            }
        }
    }
    let secs = start.elapsed().as_secs_f64();
    let bytes = size as u64 * a.iters as u64 * 2;
    println!(
        "{bytes} bytes in {secs:.2} seconds = {:.2} Mbit/sec",
        bytes as f64 * 8.0 / secs / 1e6
    );
    println!(
        "{} iters in {secs:.2} seconds = {:.2} usec/iter",
        a.iters,
        secs * 1e6 / a.iters as f64
    );
    let st = dev.stats();
    eprintln!(
        "rtgt stats: rx {} (dropped {}, bad ICRC {}), tx {}, retransmits {}, NAKs {}, RNR NAKs {}",
        st.rx_packets,
        st.rx_dropped,
        st.rx_bad_icrc,
        st.tx_packets,
        st.retransmits,
        st.naks_sent,
        st.rnr_naks_sent
    );
    if bad > 0 {
        return Err(format!(
            "{bad} of {rcnt} received messages had a wrong payload"
        ));
    }
    if check {
        println!("payload check: {rcnt} messages intact");
    }
    Ok(())
}

/// `rtgt-rdma devices`: rdma-core's devices, one block each.
fn devices() -> Result<()> {
    use rtgt_transport::rdmacore::{GidKind, RdmaCore};
    let lib = RdmaCore::load().map_err(|e| e.to_string())?;
    let devs = lib.devices().map_err(|e| e.to_string())?;
    if devs.is_empty() {
        println!("no RDMA devices");
    }
    for d in devs {
        println!(
            "{}: fw {}, max {} QPs of {} WRs, {} SGEs, {} CQEs, {} RDMA READs in flight per QP",
            d.name, d.fw_ver, d.max_qp, d.max_qp_wr, d.max_sge, d.max_cqe, d.max_qp_rd_atom
        );
        for p in &d.ports {
            println!(
                "  port {}: {}, {}, MTU {}",
                p.port,
                if p.active { "active" } else { "down" },
                if p.ethernet { "RoCE" } else { "InfiniBand" },
                p.active_mtu
            );
            for g in &p.gids {
                let kind = match g.kind {
                    GidKind::Ib => "IB",
                    GidKind::RoceV1 => "RoCE v1",
                    GidKind::RoceV2 => "RoCE v2",
                };
                println!(
                    "    gid {:>3} {:<8} {:<40} {}",
                    g.index,
                    kind,
                    g.ip(),
                    g.netdev.as_deref().unwrap_or("-")
                );
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_carry_the_chk_marks() {
        let p = pattern(7, 3, 10_000, 4096);
        assert_eq!((p[0], p[4096], p[8192]), (0, 0, 0));
        assert_eq!(unmarked_page(&p, 4096), None);
        assert_ne!(p, pattern(7, 4, 10_000, 4096), "one pattern per iteration");
        assert_ne!(p, pattern(8, 3, 10_000, 4096), "one pattern per end");
        // An rdma-core client's buffer without --chk: 0x7b everywhere.
        assert_eq!(unmarked_page(&[0x7b; 5000], 4096), Some(0));
        let mut q = p.clone();
        q[8192] = 1;
        assert_eq!(unmarked_page(&q, 4096), Some(2));
    }

    #[test]
    fn dest_round_trip() {
        let d = Dest {
            lid: 0,
            qpn: 0x11,
            psn: 0xabcdef,
            gid: Gid::from_ip("10.77.1.2".parse().unwrap()),
        };
        let m = d.encode();
        assert_eq!(
            &m[..MSG_LEN - 1],
            b"0000:000011:abcdef:00000000000000000000ffff0a4d0102"
        );
        assert_eq!(m[MSG_LEN - 1], 0);
        assert_eq!(Dest::decode(&m), Some(d));
        assert_eq!(Dest::decode(b"zz"), None);
        assert_eq!(Dest::decode(b"0000:1:2:abc"), None);
    }
}
