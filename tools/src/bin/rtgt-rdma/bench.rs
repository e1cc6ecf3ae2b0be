//! `rtgt-rdma bench`: two rtgt devices over UDP on 127.0.0.1 (two ports) in one process: RDMA
//! WRITE, READ and SEND bandwidth (4 KiB, 64 KiB, 1 MiB), SEND round-trip latency, next to the
//! ceiling of the same UDP path without the transport engine (the same netdev,
//! `sendmmsg`/`recvmmsg` batches of 32, 4 KiB datagrams with BTH and ICRC) measured in the same
//! run. Each device runs on an engine thread of its own, with the loop that posts and reaps its
//! work requests on that thread, as rtgtd runs a device and the connections on it; devices and
//! the raw receiver poll their sockets for `--busy-poll` after traffic before they sleep.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use rtgt_transport::netdev::udp::UdpNetDev;
use rtgt_transport::netdev::{AsyncNetDev, NetDev};
use rtgt_transport::verbs::*;
use rtgt_transport::wire::{datagram, icrc, ipv4, IpRepr};

use super::{connect_rc, err, hca_config, open_config, Hca, Result};

#[derive(Args, Clone)]
pub(crate) struct BenchArgs {
    /// Seconds per bandwidth measurement.
    #[arg(long, default_value_t = 2.0)]
    pub seconds: f64,
    /// Round trips of the latency measurements.
    #[arg(long, default_value_t = 2000)]
    pub rtts: u32,
    /// First of the two UDP ports on 127.0.0.1.
    #[arg(long, default_value_t = 47910)]
    pub port: u16,
    /// Path MTU (the links are loopback; 4096 is what a 9000-byte Ethernet would give).
    #[arg(short = 'm', long, default_value_t = 4096)]
    pub mtu: usize,
    /// RDMA operations kept in flight (the raw UDP sender keeps 512 datagrams in flight).
    #[arg(long, default_value_t = 64)]
    pub depth: u32,
    /// Microseconds each device (and the raw UDP receiver) keeps polling its socket after a
    /// datagram moved before it sleeps; rtgtd's default is 50 (`rdma.busy_poll_micros`).
    #[arg(long, default_value_t = RTGTD_BUSY_POLL)]
    pub busy_poll: u64,
}

/// rtgtd's default `rdma.busy_poll_micros`, which the engine-thread rows run with whatever
/// `--busy-poll` says: with two threads on each side, polling longer only takes the CPU from
/// the other threads on a machine with fewer cores than four.
const RTGTD_BUSY_POLL: u64 = 50;

const LO: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);
const REGION: usize = 16 << 20;
/// Datagrams the raw sender keeps in flight.
const RAW_WINDOW: u64 = 512;

struct End {
    hca: Arc<Hca>,
    /// The device of `hca` the QP is on.
    index: usize,
    _pd: Pd,
    cq: Cq,
    qp: Qp,
    mr: Mr,
    /// Whether the receives of the SEND bandwidth measurements are posted.
    send_recvs: AtomicBool,
}

impl End {
    /// Runs `fut` where the device of this end runs (its engine thread), as rtgtd runs a
    /// fabric connection next to its QP's device.
    async fn run_here<T: Send + 'static>(
        &self,
        fut: impl std::future::Future<Output = Result<T>> + Send + 'static,
    ) -> Result<T> {
        self.hca
            .runtime_at(self.index)
            .spawn(fut)
            .await
            .map_err(|e| format!("bench task: {e}"))?
    }
}

/// An endpoint on a device of its own, run by one engine thread as rtgtd runs its devices.
fn end(
    rt: &tokio::runtime::Runtime,
    port: u16,
    peer: u16,
    busy_poll: Duration,
) -> Result<Arc<End>> {
    let mut cfg = hca_config(SocketAddr::new(LO, port), 9000, None, Some(peer));
    cfg.shards = 1;
    cfg.busy_poll = busy_poll;
    end_on(&Arc::new(open_config(rt, &cfg)?), 0).map(Arc::new)
}

/// An endpoint (PD, CQ, QP, MR) on device `index` of `hca`.
fn end_on(hca: &Arc<Hca>, index: usize) -> Result<End> {
    let dev = hca.device_at(index);
    let pd = dev.alloc_pd().map_err(err("alloc PD"))?;
    let cq = dev.create_cq(1024).map_err(err("create CQ"))?;
    let mut init = QpInitAttr::new(QpType::Rc, &cq, &cq);
    init.cap.max_send_wr = 256;
    init.cap.max_recv_wr = 256;
    let qp = pd.create_qp(init).map_err(err("create QP"))?;
    let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    let mr = pd
        .reg_mr(Arc::new(Region::zeroed(REGION)), access)
        .map_err(err("register MR"))?;
    Ok(End {
        hca: hca.clone(),
        index,
        _pd: pd,
        cq,
        qp,
        mr,
        send_recvs: AtomicBool::new(false),
    })
}

/// Waits for `n` successful completions on `cq`.
async fn reap(cq: &Cq, n: usize) -> Result<()> {
    let mut got = 0;
    let mut wcs = Vec::new();
    while got < n {
        cq.wait_nonempty().await;
        wcs.clear();
        cq.poll_into(&mut wcs, 64);
        for wc in &wcs {
            if wc.status != WcStatus::Success {
                return Err(format!("completion {:?}", wc.status));
            }
        }
        got += wcs.len();
    }
    Ok(())
}

/// The operation a bandwidth measurement repeats.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Op {
    Write,
    Read,
    Send,
}

/// Receives `b` keeps posted during a SEND bandwidth measurement.
const SEND_RECVS: u64 = 128;
/// The largest SEND measured (the size of every receive).
const SEND_MAX: usize = 1 << 20;

/// Bytes per second of RDMA WRITE, READ or SEND of `size` from `a` to `b`, `depth` in
/// flight (for SEND, `b` reposts each receive as it completes). Each side's loop runs on its
/// device's engine thread.
async fn rdma_bw(
    a: &Arc<End>,
    b: &Arc<End>,
    size: usize,
    op: Op,
    depth: u32,
    secs: f64,
) -> Result<f64> {
    let slots = (REGION / size).max(1);
    if op == Op::Send && !b.send_recvs.swap(true, Ordering::Relaxed) {
        for i in 0..SEND_RECVS {
            post_big_recv(b, i)?;
        }
    }
    let stop = Arc::new(tokio::sync::Notify::new());
    // The receiving side reposts what completes until the sender is done (its last SEND
    // completed, so every receive it consumed has completed too).
    let receiver = {
        let (b, stop) = (b.clone(), stop.clone());
        async move {
            if op != Op::Send {
                return Ok(());
            }
            let mut wcs = Vec::new();
            let mut next = SEND_RECVS;
            loop {
                let done = tokio::select! {
                    _ = b.cq.wait_nonempty() => false,
                    _ = stop.notified() => true,
                };
                loop {
                    wcs.clear();
                    if b.cq.poll_into(&mut wcs, 64) == 0 {
                        break;
                    }
                    for wc in &wcs {
                        if wc.status != WcStatus::Success {
                            return Err(format!("receive completion {:?}", wc.status));
                        }
                        post_big_recv(&b, next)?;
                        next += 1;
                    }
                }
                if done {
                    return Ok::<(), String>(());
                }
            }
        }
    };
    let sender = {
        let (a, b, stop) = (a.clone(), b.clone(), stop.clone());
        async move {
            let post = |i: u64| {
                let off = (i as usize % slots) * size;
                let remote_addr = b.mr.iova() + off as u64;
                let op = match op {
                    Op::Read => SendOp::RdmaRead {
                        remote_addr,
                        rkey: b.mr.rkey(),
                    },
                    Op::Write => SendOp::RdmaWrite {
                        remote_addr,
                        rkey: b.mr.rkey(),
                    },
                    Op::Send => SendOp::Send,
                };
                a.qp.post_send(SendWr::new(i, op, a.mr.sge(off, size as u32)))
                    .map_err(err("post send"))
            };
            let run = async {
                let mut posted = 0u64;
                for _ in 0..depth {
                    post(posted)?;
                    posted += 1;
                }
                let start = Instant::now();
                let until = Duration::from_secs_f64(secs);
                let mut done = 0u64;
                let mut wcs = Vec::new();
                while start.elapsed() < until {
                    let w =
                        tokio::time::timeout(Duration::from_secs(10), a.cq.wait_nonempty()).await;
                    if w.is_err() {
                        return Err(format!("stalled after {done} operations"));
                    }
                    wcs.clear();
                    a.cq.poll_into(&mut wcs, 64);
                    for wc in &wcs {
                        if wc.status != WcStatus::Success {
                            return Err(format!("completion {:?}", wc.status));
                        }
                        done += 1;
                        post(posted)?;
                        posted += 1;
                    }
                }
                let elapsed = start.elapsed().as_secs_f64();
                reap(&a.cq, (posted - done) as usize).await?;
                Ok(done as f64 * size as f64 / elapsed)
            };
            let r = run.await;
            stop.notify_one();
            r
        }
    };
    let (bw, ()) = tokio::try_join!(a.run_here(sender), b.run_here(receiver))?;
    Ok(bw)
}

/// Posts a receive on `b` for the largest SEND measured, so that those left posted by one
/// measurement serve the next.
fn post_big_recv(b: &End, i: u64) -> Result<()> {
    let off = (i as usize % (REGION / SEND_MAX)) * SEND_MAX;
    b.qp.post_recv(RecvWr {
        wr_id: i,
        sg_list: b.mr.sge(off, SEND_MAX as u32).into(),
    })
    .map_err(err("post receive"))
}

/// Mean SEND round trip of `size` bytes: `a` sends, `b` answers each receive with a SEND.
fn send_rtt(rt: &tokio::runtime::Runtime, a: &End, b: &End, size: usize, n: u32) -> Result<f64> {
    for e in [a, b] {
        for i in 0..64u64 {
            e.qp.post_recv(RecvWr {
                wr_id: i,
                sg_list: e.mr.sge(REGION / 2 + i as usize * size, size as u32).into(),
            })
            .map_err(err("post receive"))?;
        }
    }
    let send = |e: &End, id: u64| {
        e.qp.post_send(SendWr::new(
            1 << 32 | id,
            SendOp::Send,
            vec![e.mr.sge(0, size as u32)],
        ))
        .map_err(err("post send"))
    };
    // One side's step: wait for the receive (and the own send's completion), repost, answer.
    async fn step(e: &End, want_send: bool) -> Result<u64> {
        let mut recv = None;
        let mut sent = !want_send;
        let mut wcs = Vec::new();
        while recv.is_none() || !sent {
            let w = tokio::time::timeout(Duration::from_secs(10), e.cq.wait_nonempty()).await;
            if w.is_err() {
                return Err("SEND round trip stalled".into());
            }
            wcs.clear();
            e.cq.poll_into(&mut wcs, 8);
            for wc in &wcs {
                if wc.status != WcStatus::Success {
                    return Err(format!("completion {:?}", wc.status));
                }
                if wc.wr_id >> 32 == 1 {
                    sent = true;
                } else {
                    recv = Some(wc.wr_id);
                }
            }
        }
        recv.ok_or_else(|| "no receive".to_string())
    }
    rt.block_on(async {
        let start = Instant::now();
        let mut b_pending = false;
        for i in 0..n as u64 {
            send(a, i)?;
            let r = step(b, b_pending).await?;
            // The receive may be one the SEND bandwidth measurement left posted (any wr_id):
            // the repost takes one of the 64 slots.
            b.qp.post_recv(RecvWr {
                wr_id: r,
                sg_list: b
                    .mr
                    .sge(REGION / 2 + (r as usize % 64) * size, size as u32)
                    .into(),
            })
            .map_err(err("post receive"))?;
            send(b, i)?;
            b_pending = true;
            let r = step(a, true).await?;
            a.qp.post_recv(RecvWr {
                wr_id: r,
                sg_list: a
                    .mr
                    .sge(REGION / 2 + (r as usize % 64) * size, size as u32)
                    .into(),
            })
            .map_err(err("post receive"))?;
        }
        let rtt = start.elapsed().as_secs_f64() / n as f64;
        reap(&b.cq, 1).await?;
        Ok(rtt)
    })
}

/// A RoCEv2 datagram (IPv4, UDP, BTH, `payload` bytes, ICRC) from 127.0.0.1 port `sport` to
/// `dport`: as the device builds its datagrams for a UDP netdev (the netdev's own ports), so
/// the netdev sends it as it is.
fn raw_datagram(sport: u16, dport: u16, payload: usize) -> Result<Vec<u8>> {
    let roce_len = 12 + payload + 4;
    let ip = IpRepr::V4(ipv4::Repr::udp(Ipv4Addr::LOCALHOST, Ipv4Addr::LOCALHOST));
    let mut d = vec![0u8; 28 + roce_len];
    datagram::emit_headers(&ip, sport, dport, roce_len, &mut d).map_err(|e| format!("{e:?}"))?;
    d[28] = 0x04; // RC SEND_ONLY
    d[30] = 0xff; // P_Key 0xffff
    d[31] = 0xff;
    d[35] = 0x11; // destination QP 0x11 (none exists: this is the bare netdev)
    icrc::generate(&mut d).map_err(|e| format!("{e:?}"))?;
    Ok(d)
}

fn raw_pair(rt: &tokio::runtime::Runtime, port: u16) -> Result<(UdpNetDev, UdpNetDev)> {
    let _g = rt.enter();
    let mut a = UdpNetDev::bind(SocketAddr::new(LO, port)).map_err(err("bind"))?;
    let mut b = UdpNetDev::bind(SocketAddr::new(LO, port + 1)).map_err(err("bind"))?;
    a.peer_port = port + 1;
    b.peer_port = port;
    Ok((a, b))
}

/// Bytes per second of 4 KiB payloads through the bare netdevs (sendmmsg batches of 32).
fn raw_bw(rt: &tokio::runtime::Runtime, port: u16, secs: f64, poll: Duration) -> Result<f64> {
    let (mut a, mut b) = raw_pair(rt, port)?;
    let batch: Vec<Outgoing> = (0..32)
        .map(|_| raw_datagram(port, port + 1, 4096).map(Outgoing::whole))
        .collect::<Result<_>>()?;
    let stop = Arc::new(AtomicBool::new(false));
    let bytes = Arc::new(AtomicU64::new(0));
    let count = Arc::new(AtomicU64::new(0));
    let rx = {
        let (stop, bytes, count) = (stop.clone(), bytes.clone(), count.clone());
        rt.spawn(async move {
            let mut got = Vec::new();
            let mut last = Instant::now();
            while !stop.load(Ordering::Relaxed) {
                // Polls as the devices do, then sleeps until readable.
                if last.elapsed() < poll {
                    tokio::task::yield_now().await;
                } else {
                    let wait = AsyncNetDev::readable(&b);
                    let _ = tokio::time::timeout(Duration::from_millis(50), wait).await;
                }
                got.clear();
                while b.receive_batch(&mut got, 32).unwrap_or(0) > 0 {
                    let n: usize = got.iter().map(|d| d.len().saturating_sub(28 + 16)).sum();
                    bytes.fetch_add(n as u64, Ordering::Relaxed);
                    count.fetch_add(got.len() as u64, Ordering::Relaxed);
                    // Buffers go back to the netdev, as the device does with what it received.
                    b.recycle(&mut got);
                    last = Instant::now();
                }
            }
        })
    };
    let tx = {
        let (stop, count) = (stop.clone(), count.clone());
        rt.spawn(async move {
            // A window of datagrams in flight, as the transport keeps, so that the receiver's
            // socket buffer does not overflow; a stalled window (datagrams lost) restarts.
            let mut sent = 0u64;
            let mut stalled = Instant::now();
            while !stop.load(Ordering::Relaxed) {
                let got = count.load(Ordering::Relaxed);
                if sent.saturating_sub(got) + batch.len() as u64 > RAW_WINDOW {
                    if stalled.elapsed() > Duration::from_millis(2) {
                        sent = got;
                    }
                    tokio::task::yield_now().await;
                    continue;
                }
                if a.transmit_batch(&batch).is_err() {
                    break;
                }
                sent += batch.len() as u64;
                stalled = Instant::now();
                tokio::task::yield_now().await;
            }
        })
    };
    std::thread::sleep(Duration::from_millis(200));
    let b0 = bytes.load(Ordering::Relaxed);
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_secs_f64(secs));
    let b1 = bytes.load(Ordering::Relaxed);
    let el = t0.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    let _ = rt.block_on(async { tokio::join!(rx, tx) });
    Ok((b1 - b0) as f64 / el)
}

/// One round trip of `wait` at most; false if the datagram or its echo was lost (a socket whose
/// writability the runtime has not seen yet drops the first datagrams).
async fn round(a: &mut UdpNetDev, ping: &[u8], wait: Duration) -> bool {
    let _ = a.transmit(ping);
    let until = Instant::now() + wait;
    let mut got = Vec::new();
    loop {
        if a.receive_batch(&mut got, 1).unwrap_or(0) > 0 {
            return true;
        }
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero()
            || tokio::time::timeout(left, AsyncNetDev::readable(a))
                .await
                .is_err()
        {
            return false;
        }
    }
}

/// Mean round trip of one 4 KiB datagram through the bare netdevs (echoed by the other end).
fn raw_rtt(rt: &tokio::runtime::Runtime, port: u16, n: u32) -> Result<f64> {
    let (mut a, mut b) = raw_pair(rt, port)?;
    let ping = raw_datagram(port, port + 1, 4096)?;
    let pong = Outgoing::whole(raw_datagram(port + 1, port, 4096)?);
    rt.block_on(async move {
        let echo = tokio::spawn(async move {
            let mut got = Vec::new();
            loop {
                got.clear();
                if b.receive_batch(&mut got, 8).unwrap_or(0) > 0 {
                    let _ = b.transmit_batch(std::slice::from_ref(&pong));
                } else if AsyncNetDev::readable(&b).await.is_err() {
                    return;
                }
            }
        });
        let mut warm = 0;
        while !round(&mut a, &ping, Duration::from_millis(20)).await {
            warm += 1;
            if warm > 100 {
                echo.abort();
                return Err("raw UDP round trip: no echo".to_string());
            }
        }
        let start = Instant::now();
        for i in 0..n {
            if !round(&mut a, &ping, Duration::from_secs(5)).await {
                echo.abort();
                return Err(format!("raw UDP round trip {i} lost"));
            }
        }
        let rtt = start.elapsed().as_secs_f64() / n as f64;
        echo.abort();
        Ok(rtt)
    })
}

/// Bytes per second of RDMA WRITEs of `size` on two connections at once between two HCAs
/// with `shards` engine threads each (connection `i` on device `i % shards` of both).
fn sharded_bw(
    rt: &tokio::runtime::Runtime,
    a: &BenchArgs,
    port: u16,
    shards: usize,
    size: usize,
    secs: f64,
    mtu: Mtu,
) -> Result<f64> {
    let depth = a.depth;
    let open = |port: u16, peer: u16| -> Result<Arc<Hca>> {
        let mut cfg = hca_config(SocketAddr::new(LO, port), 9000, None, Some(peer));
        cfg.shards = shards;
        cfg.busy_poll = Duration::from_micros(RTGTD_BUSY_POLL);
        open_config(rt, &cfg).map(Arc::new)
    };
    let x = open(port, port + 1)?;
    let y = open(port + 1, port)?;
    let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    let mut pairs = Vec::new();
    for i in 0..2 {
        let k = i % x.count();
        let (a, b) = (Arc::new(end_on(&x, k)?), Arc::new(end_on(&y, k)?));
        connect_rc(&a.qp, LO, b.qp.qpn(), 100, 200, mtu, access)?;
        connect_rc(&b.qp, LO, a.qp.qpn(), 200, 100, mtu, access)?;
        pairs.push((a, b));
    }
    rt.block_on(async {
        let (p0, p1) = (&pairs[0], &pairs[1]);
        let (r0, r1) = tokio::join!(
            rdma_bw(&p0.0, &p0.1, size, Op::Write, depth, secs),
            rdma_bw(&p1.0, &p1.1, size, Op::Write, depth, secs)
        );
        Ok(r0? + r1?)
    })
}

pub(crate) fn run_bench(rt: &tokio::runtime::Runtime, a: &BenchArgs) -> Result<()> {
    let mtu = Mtu::from_bytes(a.mtu).ok_or_else(|| format!("bad MTU {}", a.mtu))?;
    let secs = a.seconds.clamp(0.1, 600.0);
    let rtts = a.rtts.max(10);
    let p = a.port;
    let poll = Duration::from_micros(a.busy_poll);
    let raw = raw_bw(rt, p + 2, secs, poll)?;
    let raw_rt = raw_rtt(rt, p + 4, rtts)?;
    let x = end(rt, p, p + 1, poll)?;
    let y = end(rt, p + 1, p, poll)?;
    let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    connect_rc(&x.qp, LO, y.qp.qpn(), 100, 200, mtu, access)?;
    connect_rc(&y.qp, LO, x.qp.qpn(), 200, 100, mtu, access)?;
    let mut rows = Vec::new();
    for (name, op) in [
        ("RDMA WRITE", Op::Write),
        ("RDMA READ", Op::Read),
        ("SEND", Op::Send),
    ] {
        for size in [4 << 10, 64 << 10, 1 << 20] {
            let bw = rt.block_on(rdma_bw(&x, &y, size, op, a.depth, secs))?;
            rows.push((
                format!("{name} bandwidth"),
                format!("{} KiB", size >> 10),
                format!("{:.0} MB/s", bw / 1e6),
                format!("{:.0} MB/s", raw / 1e6),
                bw / raw,
            ));
        }
    }
    let rtt = send_rtt(rt, &x, &y, 4096, rtts)?;
    rows.push((
        "SEND round trip".into(),
        "4 KiB".into(),
        format!("{:.1} us", rtt * 1e6),
        format!("{:.1} us", raw_rt * 1e6),
        raw_rt / rtt,
    ));
    let sx = x.hca.device().stats();
    let sy = y.hca.device().stats();
    println!(
        "rtgt-rdma bench: 127.0.0.1 UDP ports {p}/{}, path MTU {}, {} in flight, {secs} s each, \
         each device on an engine thread of its own polling {} us",
        p + 1,
        mtu.bytes(),
        a.depth,
        a.busy_poll
    );
    println!(
        "{:<20} {:>8} {:>14} {:>22} {:>7}",
        "test", "size", "rtgt", "raw UDP (4 KiB, x32)", "ratio"
    );
    for (t, s, v, r, q) in &rows {
        println!("{t:<20} {s:>8} {v:>14} {r:>22} {q:>7.2}");
    }
    println!(
        "retransmits {}, NAKs {}, dropped {}; payloads received in place {} of {} packets",
        sx.retransmits + sy.retransmits,
        sx.naks_sent + sy.naks_sent,
        sx.rx_dropped + sy.rx_dropped,
        sx.rx_placed + sy.rx_placed,
        sx.rx_packets + sy.rx_packets
    );
    println!(
        "engine threads: RDMA WRITE on two connections at once, each side 1 or 2 threads \
         (polling {RTGTD_BUSY_POLL} us)"
    );
    println!(
        "{:<20} {:>8} {:>14} {:>22} {:>7}",
        "test", "size", "2 threads", "1 thread", "ratio"
    );
    for size in [4 << 10, 64 << 10] {
        let one = sharded_bw(rt, a, p + 6, 1, size, secs, mtu)?;
        let two = sharded_bw(rt, a, p + 8, 2, size, secs, mtu)?;
        println!(
            "{:<20} {:>8} {:>14} {:>22} {:>7.2}",
            "RDMA WRITE x2",
            format!("{} KiB", size >> 10),
            format!("{:.0} MB/s", two / 1e6),
            format!("{:.0} MB/s", one / 1e6),
            two / one
        );
    }
    Ok(())
}
