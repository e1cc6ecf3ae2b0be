//! `rtgt-rdma rping`: server and client wire-compatible with rdma-core's `rping`
//! (librdmacm/examples/rping.c), connected through rtgt's connection manager (RDMA_PS_TCP,
//! port 7174 by default).
//!
//! One ping: the client SENDs the advertisement of its source buffer (`struct rping_rdma_info`:
//! big-endian u64 address, u32 R_Key, u32 size, 16 bytes); the server RDMA READs it and SENDs a
//! 16-byte "go ahead"; the client advertises its sink buffer; the server RDMA WRITEs what it
//! read (up to and including the first NUL) and SENDs "go ahead" again. The client's buffer
//! holds `"rdma-ping-%d: "` then letters cycling from 'A' + ping (mod 58) through 'z', and a
//! final NUL; `-V` compares source and sink after each ping. The client disconnects after
//! `-C` pings; the server treats that as the normal end.
//!
//! The server serves one connection (rping's default), or with `-P` keeps accepting; `--verify`
//! also checks every buffer it reads against the pattern above. `--stats-file` rewrites a file
//! with the device's live QP count and the CM's counters a few times a second, for tests that
//! watch resources come and go.

use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use rtgt_transport::cm::{prepare_qp, Cm, CmConn, ConnParams, ConnectRequest};
use rtgt_transport::hca::Hca;
use rtgt_transport::verbs::*;

use super::{err, open_hca, Result};

/// `sizeof(struct rping_rdma_info)`.
const INFO_LEN: usize = 16;
/// rping's largest buffer (`RPING_BUFSIZE`); sizes go up to one less.
const BUFSIZE: usize = 64 * 1024;
const SQ_DEPTH: u32 = 16;

#[derive(Args, Clone)]
pub(crate) struct RpingArgs {
    /// Server side (rping -s).
    #[arg(short = 's', long)]
    server: bool,
    /// Client side (rping -c).
    #[arg(short = 'c', long)]
    client: bool,
    /// Address to listen on (server; default every address of the host) or to connect to.
    #[arg(short = 'a', long)]
    addr: Option<String>,
    /// Source address of the client (default: the one the host routes to the server from).
    #[arg(short = 'I', long)]
    source: Option<IpAddr>,
    #[arg(short = 'p', long, default_value_t = 7174)]
    port: u16,
    /// Pings (client; 0 = until interrupted).
    #[arg(short = 'C', long, default_value_t = 0)]
    count: u32,
    /// Ping data size.
    #[arg(short = 'S', long, default_value_t = 64)]
    size: usize,
    /// Print ping data.
    #[arg(short = 'v', long)]
    verbose: bool,
    /// Validate ping data (client: the echo equals what was sent; server: the pattern).
    #[arg(short = 'V', long)]
    validate: bool,
    /// Persistent server: accept connections until interrupted (or --connections).
    #[arg(short = 'P', long)]
    persistent: bool,
    /// Server: exit after serving this many connections.
    #[arg(long)]
    connections: Option<u64>,
    /// Ethernet MTU of the link (the path MTU follows: 1024 at 1500).
    #[arg(long, default_value_t = 1500)]
    eth_mtu: usize,
    /// Receive through an AF_PACKET socket on this interface so that IPv4 ICRCs are verified in
    /// full (IP ID and DF included).
    #[arg(long)]
    packet_rx: Option<String>,
    /// Rewrite this file with live QPs and CM counters while running.
    #[arg(long)]
    stats_file: Option<PathBuf>,
    /// Give up after this many seconds.
    #[arg(long, default_value_t = 600)]
    timeout: u64,
}

const MIN_SIZE: usize = 28; // sizeof(stringify(INT_MAX)) + sizeof(RPING_MSG_FMT)

pub(crate) fn run_rping(rt: &tokio::runtime::Runtime, a: &RpingArgs) -> Result<()> {
    if a.server == a.client {
        return Err("give exactly one of -s (server) and -c (client)".into());
    }
    if a.size < MIN_SIZE || a.size >= BUFSIZE {
        return Err(format!(
            "invalid size {} (valid range is {MIN_SIZE} to {})",
            a.size,
            BUFSIZE - 1
        ));
    }
    let deadline = Instant::now() + Duration::from_secs(a.timeout);
    if a.server {
        server(rt, a, deadline)
    } else {
        client(rt, a, deadline)
    }
}

fn resolve(name: &str, port: u16) -> Result<SocketAddr> {
    (name, port)
        .to_socket_addrs()
        .map_err(err("cannot resolve the address"))?
        .next()
        .ok_or_else(|| format!("{name}: no address"))
}

/// The pattern rping's client puts in its buffer for ping `n`.
pub(crate) fn ping_pattern(n: u32, size: usize) -> Vec<u8> {
    let mut b = format!("rdma-ping-{n}: ").into_bytes();
    b.truncate(size.saturating_sub(1));
    let mut c = b'A' + (n % 58) as u8;
    while b.len() < size {
        b.push(c);
        c = if c >= b'z' { b'A' } else { c + 1 };
    }
    if let Some(last) = b.last_mut() {
        *last = 0;
    }
    b
}

/// Checks a buffer an rping client sent: its ping number and the pattern that follows.
fn check_pattern(buf: &[u8]) -> std::result::Result<u32, String> {
    let text = buf.split(|&b| b == b':').next().unwrap_or(&[]);
    let n: u32 = std::str::from_utf8(text)
        .ok()
        .and_then(|t| t.strip_prefix("rdma-ping-"))
        .and_then(|t| t.parse().ok())
        .ok_or("no \"rdma-ping-N:\" prefix")?;
    if buf != ping_pattern(n, buf.len()).as_slice() {
        return Err(format!("ping {n}: payload differs from the pattern"));
    }
    Ok(n)
}

/// Buffers and queues of one rping end.
struct Conn {
    _pd: Pd,
    cq: Cq,
    qp: Qp,
    region: Arc<Region>,
    mr: Mr,
}

const RECV_OFF: usize = 0;
const SEND_OFF: usize = 64;
const RDMA_OFF: usize = 128;
const START_OFF: usize = RDMA_OFF + BUFSIZE;

impl Conn {
    fn new(dev: &Device) -> Result<Conn> {
        let pd = dev.alloc_pd().map_err(err("alloc PD"))?;
        let cq = dev.create_cq(SQ_DEPTH * 2).map_err(err("create CQ"))?;
        let mut init = QpInitAttr::new(QpType::Rc, &cq, &cq);
        init.cap.max_send_wr = SQ_DEPTH;
        init.cap.max_recv_wr = 2;
        init.cap.max_send_sge = 1;
        init.cap.max_recv_sge = 1;
        let qp = pd.create_qp(init).map_err(err("create QP"))?;
        // INIT now, so receives are posted before the peer can send (as rdma_create_qp does).
        prepare_qp(&qp).map_err(err("QP to INIT"))?;
        let region = Arc::new(Region::zeroed(START_OFF + BUFSIZE));
        let mr = pd
            .reg_mr(
                region.clone(),
                Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE,
            )
            .map_err(err("register MR"))?;
        Ok(Conn {
            _pd: pd,
            cq,
            qp,
            region,
            mr,
        })
    }

    fn post_recv(&self) -> Result<()> {
        self.qp
            .post_recv(RecvWr {
                wr_id: 1,
                sg_list: self.mr.sge(RECV_OFF, INFO_LEN as u32).into(),
            })
            .map_err(err("post receive"))
    }

    fn post(&self, wr_id: u64, op: SendOp, off: usize, len: usize) -> Result<()> {
        self.qp
            .post_send(SendWr::new(wr_id, op, vec![self.mr.sge(off, len as u32)]))
            .map_err(err("post send"))
    }

    /// SENDs an advertisement of `len` bytes at `off` of our buffer.
    fn advertise(&self, off: usize, len: usize) -> Result<()> {
        let mut info = [0u8; INFO_LEN];
        info[..8].copy_from_slice(&(self.mr.iova() + off as u64).to_be_bytes());
        info[8..12].copy_from_slice(&self.mr.rkey().to_be_bytes());
        info[12..16].copy_from_slice(&(len as u32).to_be_bytes());
        self.region.write(SEND_OFF, &info);
        self.post(2, SendOp::Send, SEND_OFF, INFO_LEN)
    }

    /// The next successful completion; `Ok(None)` once the connection is gone (a flushed
    /// work request or the peer's disconnect).
    async fn next(&self, conn: &CmConn, deadline: Instant) -> Result<Option<WorkCompletion>> {
        loop {
            if let Some(wc) = self.cq.poll(1).pop() {
                return match wc.status {
                    WcStatus::Success => Ok(Some(wc)),
                    WcStatus::WrFlushErr => Ok(None),
                    s => Err(format!("completion {s:?} for wr_id {}", wc.wr_id)),
                };
            }
            if conn.is_disconnected() {
                return Ok(None);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            tokio::select! {
                _ = self.cq.wait_nonempty() => {}
                _ = conn.disconnected() => {}
                _ = tokio::time::sleep(left) => return Err("timed out".into()),
            }
        }
    }

    /// Waits for the completion of `opcode`, reposting receives; `Ok(false)` when the
    /// connection ended first.
    async fn wait(
        &self,
        conn: &CmConn,
        opcode: WcOpcode,
        deadline: Instant,
    ) -> Result<Option<WorkCompletion>> {
        loop {
            let Some(wc) = self.next(conn, deadline).await? else {
                return Ok(None);
            };
            if wc.opcode == WcOpcode::Recv {
                if wc.byte_len as usize != INFO_LEN {
                    return Err(format!("received bogus data, size {}", wc.byte_len));
                }
                self.post_recv()?;
            }
            if wc.opcode == opcode {
                return Ok(Some(wc));
            }
        }
    }

    fn info(&self) -> (u64, u32, u32) {
        let mut b = [0u8; INFO_LEN];
        self.region.read(RECV_OFF, &mut b);
        let addr = u64::from_be_bytes(b[..8].try_into().unwrap_or_default());
        let rkey = u32::from_be_bytes(b[8..12].try_into().unwrap_or_default());
        let size = u32::from_be_bytes(b[12..16].try_into().unwrap_or_default());
        (addr, rkey, size)
    }
}

fn params() -> ConnParams {
    // rping_init_conn_param.
    ConnParams {
        responder_resources: 1,
        initiator_depth: 1,
        retry_count: 7,
        rnr_retry_count: 7,
        ..ConnParams::default()
    }
}

/// Counters of the server, for its summary and the stats file.
#[derive(Default)]
struct Served {
    connections: AtomicU64,
    pings: AtomicU64,
    failed: AtomicU64,
    bad_payload: AtomicU64,
}

fn write_stats(path: &std::path::Path, hca: &Hca, served: &Served) {
    let s = hca.cm().stats();
    let text = format!(
        "live_qps {}\nlive_connections {}\ncm_connections {}\nserved {}\npings {}\nfailed {}\nbad_payload {}\nreq {}\nrej_sent {}\ndreq_received {}\n",
        hca.device().live_qps(),
        s.live_connections,
        s.connections,
        served.connections.load(Ordering::Relaxed),
        served.pings.load(Ordering::Relaxed),
        served.failed.load(Ordering::Relaxed),
        served.bad_payload.load(Ordering::Relaxed),
        s.received.req,
        s.rejects_sent,
        s.received.dreq,
    );
    let tmp = path.with_extension("tmp");
    if std::fs::write(&tmp, text).is_ok() {
        let _ = std::fs::rename(&tmp, path);
    }
}

fn server(rt: &tokio::runtime::Runtime, a: &RpingArgs, deadline: Instant) -> Result<()> {
    let listen_ip: IpAddr = match &a.addr {
        Some(name) => resolve(name, a.port)?.ip(),
        None => IpAddr::from([0u8, 0, 0, 0]),
    };
    let hca = open_hca(
        rt,
        SocketAddr::new(listen_ip, 4791),
        a.eth_mtu,
        a.packet_rx.as_deref(),
        None,
    )?;
    let hca = Arc::new(hca);
    let served = Arc::new(Served::default());
    let mut listener = {
        let _g = rt.enter();
        hca.cm()
            .listen(SocketAddr::new(listen_ip, a.port))
            .map_err(err("listen"))?
    };
    // The stats file appears once the listener is up.
    let stats_task = a.stats_file.clone().map(|path| {
        let (hca, served) = (hca.clone(), served.clone());
        rt.spawn(async move {
            loop {
                write_stats(&path, &hca, &served);
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        })
    });
    println!(
        "rping server listening on {} (device addresses {:?})",
        listener.local_addr(),
        hca.addrs()
    );
    let limit = match (a.connections, a.persistent) {
        (Some(n), _) => Some(n),
        (None, true) => None,
        (None, false) => Some(1),
    };
    let r: Result<()> = rt.block_on(async {
        let mut tasks = tokio::task::JoinSet::new();
        let mut accepted = 0u64;
        while limit.is_none_or(|n| accepted < n) {
            let left = deadline.saturating_duration_since(Instant::now());
            let req = tokio::select! {
                r = listener.accept() => r.ok_or("the connection manager stopped")?,
                _ = tokio::time::sleep(left) => return Err("timed out waiting for clients".into()),
            };
            accepted += 1;
            let (dev, served, a) = (hca.device().clone(), served.clone(), a.clone());
            tasks.spawn(async move {
                let peer = req.peer();
                match serve(&dev, req, &a, &served, deadline).await {
                    Ok(n) => {
                        served.connections.fetch_add(1, Ordering::Relaxed);
                        println!("{peer}: {n} pings served");
                    }
                    Err(e) => {
                        served.failed.fetch_add(1, Ordering::Relaxed);
                        eprintln!("{peer}: {e}");
                    }
                }
            });
            // Reap finished connections so the set stays small.
            while tasks.try_join_next().is_some() {}
        }
        while tasks.join_next().await.is_some() {}
        Ok(())
    });
    rt.block_on(hca.drain(Duration::from_secs(1)));
    if let Some(t) = stats_task {
        t.abort();
    }
    if let Some(path) = &a.stats_file {
        write_stats(path, &hca, &served);
    }
    r?;
    let s = hca.cm().stats();
    println!(
        "rping server: {} connections served, {} failed, {} pings; CM: {} REQ, {} REJ sent, {} timeouts; live QPs {}",
        served.connections.load(Ordering::Relaxed),
        served.failed.load(Ordering::Relaxed),
        served.pings.load(Ordering::Relaxed),
        s.received.req,
        s.rejects_sent,
        s.timeouts,
        hca.device().live_qps()
    );
    let bad = served.bad_payload.load(Ordering::Relaxed);
    if bad > 0 {
        return Err(format!("{bad} pings with a wrong payload"));
    }
    if a.validate {
        println!(
            "payload check: {} pings intact",
            served.pings.load(Ordering::Relaxed)
        );
    }
    if served.failed.load(Ordering::Relaxed) > 0 {
        return Err("a connection failed".into());
    }
    Ok(())
}

/// One server connection (rping_test_server): returns the pings served.
async fn serve(
    dev: &Device,
    req: ConnectRequest,
    a: &RpingArgs,
    served: &Served,
    deadline: Instant,
) -> Result<u64> {
    let c = Conn::new(dev)?;
    c.post_recv()?;
    c.post_recv()?;
    let conn = req.accept(&c.qp, params()).await.map_err(err("accept"))?;
    let mut pings = 0u64;
    loop {
        // The client's source advertisement.
        if c.wait(&conn, WcOpcode::Recv, deadline).await?.is_none() {
            break;
        }
        let (addr, rkey, len) = c.info();
        let len = len as usize;
        if len > BUFSIZE {
            return Err(format!("advertised size {len} larger than {BUFSIZE}"));
        }
        c.post(
            3,
            SendOp::RdmaRead {
                remote_addr: addr,
                rkey,
            },
            RDMA_OFF,
            len,
        )?;
        if c.wait(&conn, WcOpcode::RdmaRead, deadline).await?.is_none() {
            break;
        }
        let mut data = vec![0u8; len];
        c.region.read(RDMA_OFF, &mut data);
        if a.validate {
            if let Err(e) = check_pattern(&data) {
                served.bad_payload.fetch_add(1, Ordering::Relaxed);
                eprintln!("{e}");
            }
        }
        if a.verbose {
            let end = data.iter().position(|&b| b == 0).unwrap_or(len);
            println!(
                "server ping data: {}",
                String::from_utf8_lossy(&data[..end])
            );
        }
        // Go ahead: the 16-byte send buffer (rping's server never fills it in).
        c.region.write(SEND_OFF, &[0u8; INFO_LEN]);
        c.post(2, SendOp::Send, SEND_OFF, INFO_LEN)?;
        // The client's sink advertisement.
        if c.wait(&conn, WcOpcode::Recv, deadline).await?.is_none() {
            break;
        }
        let (addr, rkey, sink_len) = c.info();
        // rping writes strlen(rdma_buf) + 1 bytes.
        let n = data.iter().position(|&b| b == 0).map_or(len, |p| p + 1);
        if n > sink_len as usize {
            return Err(format!("sink of {sink_len} bytes is smaller than {n}"));
        }
        c.post(
            4,
            SendOp::RdmaWrite {
                remote_addr: addr,
                rkey,
            },
            RDMA_OFF,
            n,
        )?;
        if c.wait(&conn, WcOpcode::RdmaWrite, deadline)
            .await?
            .is_none()
        {
            break;
        }
        c.post(2, SendOp::Send, SEND_OFF, INFO_LEN)?;
        pings += 1;
        served.pings.fetch_add(1, Ordering::Relaxed);
    }
    conn.disconnect();
    Ok(pings)
}

/// The local address the host would use towards `dst`.
fn route_source(dst: SocketAddr) -> Result<IpAddr> {
    let any: SocketAddr = if dst.is_ipv4() {
        "0.0.0.0:0".parse().map_err(err("address"))?
    } else {
        "[::]:0".parse().map_err(err("address"))?
    };
    let s = std::net::UdpSocket::bind(any).map_err(err("route lookup"))?;
    s.connect(dst).map_err(err("route lookup"))?;
    Ok(s.local_addr().map_err(err("route lookup"))?.ip())
}

fn client(rt: &tokio::runtime::Runtime, a: &RpingArgs, deadline: Instant) -> Result<()> {
    let name = a.addr.as_deref().ok_or("the client needs -a ADDRESS")?;
    let dst = resolve(name, a.port)?;
    let local = match a.source {
        Some(ip) => ip,
        None => route_source(dst)?,
    };
    let hca = open_hca(
        rt,
        SocketAddr::new(local, 4791),
        a.eth_mtu,
        a.packet_rx.as_deref(),
        None,
    )?;
    let cm = hca.cm().clone();
    let size = a.size;
    let r = rt.block_on(async {
        let r = ping(&cm, hca.device(), dst, a, size, deadline).await;
        hca.drain(Duration::from_secs(1)).await;
        r
    });
    let st = hca.device().stats();
    eprintln!(
        "rtgt stats: rx {} (dropped {}, bad ICRC {}), tx {}, retransmits {}",
        st.rx_packets, st.rx_dropped, st.rx_bad_icrc, st.tx_packets, st.retransmits
    );
    let n = r?;
    if a.validate {
        println!("payload check: {n} pings intact");
    }
    Ok(())
}

/// The client's pings (rping_test_client); returns how many completed.
async fn ping(
    cm: &Cm,
    dev: &Device,
    dst: SocketAddr,
    a: &RpingArgs,
    size: usize,
    deadline: Instant,
) -> Result<u32> {
    let c = Conn::new(dev)?;
    c.post_recv()?;
    let left = deadline.saturating_duration_since(Instant::now());
    let conn = tokio::time::timeout(left, cm.connect(&c.qp, dst, params()))
        .await
        .map_err(|_| "connect: timed out".to_string())?
        .map_err(err("connect"))?;
    let mut done = 0u32;
    let mut n = 0u32;
    let mut sink = vec![0u8; size];
    let start = Instant::now();
    while a.count == 0 || n < a.count {
        let pattern = ping_pattern(n, size);
        c.region.write(START_OFF, &pattern);
        c.advertise(START_OFF, size)?;
        if c.wait(&conn, WcOpcode::Recv, deadline).await?.is_none() {
            return Err(format!("disconnected after {done} pings"));
        }
        c.advertise(RDMA_OFF, size)?;
        if c.wait(&conn, WcOpcode::Recv, deadline).await?.is_none() {
            return Err(format!("disconnected after {done} pings"));
        }
        c.region.read(RDMA_OFF, &mut sink);
        if a.validate && sink != pattern {
            let at = sink.iter().zip(&pattern).position(|(x, y)| x != y);
            return Err(format!("ping {n}: data mismatch at {at:?}"));
        }
        if a.verbose {
            let end = sink.iter().position(|&b| b == 0).unwrap_or(size);
            println!("ping data: {}", String::from_utf8_lossy(&sink[..end]));
        }
        // Clear the sink so the next echo is really new.
        c.region.write(RDMA_OFF, &vec![0u8; size]);
        done += 1;
        n += 1;
    }
    let secs = start.elapsed().as_secs_f64();
    println!(
        "{done} pings of {size} bytes in {secs:.2} s ({:.0} us per ping)",
        secs * 1e6 / f64::from(done.max(1))
    );
    conn.disconnect();
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_as_rping_fills_it() {
        let p = ping_pattern(0, 32);
        assert_eq!(&p, b"rdma-ping-0: ABCDEFGHIJKLMNOPQR\0");
        let p = ping_pattern(1, 20);
        assert_eq!(&p, b"rdma-ping-1: BCDEFG\0");
        // Letters run through 'z' and wrap to 'A'.
        let p = ping_pattern(57, 20);
        assert_eq!(&p[14..19], b"zABCD");
        assert_eq!(check_pattern(&ping_pattern(123, 1000)), Ok(123));
        let mut bad = ping_pattern(5, 100);
        bad[50] ^= 1;
        assert!(check_pattern(&bad).is_err());
        assert!(check_pattern(b"hello").is_err());
    }
}
