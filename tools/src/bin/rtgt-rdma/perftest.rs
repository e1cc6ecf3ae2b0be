//! `rtgt-rdma perftest`: the server side of perftest's `ib_write_bw`, `ib_read_bw`,
//! `ib_send_bw` and `ib_write_lat` (RC, one QP, no RDMA/CM), for one client run.
//!
//! perftest's TCP exchange (perftest_communication.c, perftest 6.x) is a fixed sequence of
//! steps in which the server reads what the client wrote and answers with as many bytes:
//! the version string (16 bytes; rtgt echoes the client's, so the client takes the code paths
//! of its own version), the cycle buffer and cache line size (4 + 4 bytes, from 5.32), the MTU
//! (`"%d"` of the MTU enumeration, 2 bytes from 5.31), then "hand shakes" of the QP keys
//! (`%04x:%04x:%06x:%06x:%08x:%016llx:` LID, outstanding reads, QPN, PSN, R_Key, address,
//! then 16 `%02x:` GID bytes and `%08x:` SRQN, 108 bytes with the NUL; 59 bytes without a GID).
//! WRITE and READ: three hand shakes, the client's run, a hand shake, the bandwidth reports
//! (5 × 8 bytes) and the closing hand shake followed by `"done"`. SEND: four hand shakes
//! (receives are posted), the client's run, the closing hand shake and `"done"`.
//!
//! `ib_write_lat` (write_lat.c, `run_iter_lat_write`) takes four hand shakes (the first two
//! before the client connects its QP, one for the remote side, one after RTR), then both sides play ping-pong with RDMA WRITEs of the message size to the
//! other side's advertised address: each side writes its next count (as a `char`) into the
//! last byte of its send buffer and posts the WRITE, then waits until the last byte of its own
//! buffer at the advertised address holds the count of the other side; the server sends first
//! (its first wait is skipped). The server does not know the iteration count: the run ends when
//! the client closes the connection, or starts a closing hand shake (older perftest), which the
//! server answers, followed by `"done"`. The server's last WRITE then finds no peer; errors of
//! WRITEs completed after the client's last one are not failures.

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use rtgt_transport::verbs::*;

use super::{connect_rc, err, open_hca, psn_seed, rc_init, Result};

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Test {
    Write,
    Read,
    Send,
    /// `ib_write_lat`.
    #[value(name = "write_lat", alias = "write-lat")]
    WriteLat,
}

#[derive(Args, Clone)]
pub(crate) struct PerftestArgs {
    /// Which client this serves: ib_write_bw, ib_read_bw, ib_send_bw or ib_write_lat.
    #[arg(long, value_enum)]
    pub test: Test,
    /// Local address for RoCEv2 (UDP 4791).
    #[arg(long)]
    pub local: IpAddr,
    /// TCP port of the exchange.
    #[arg(short = 'p', long, default_value_t = 18515)]
    pub port: u16,
    /// Largest message size the client uses (perftest's -s).
    #[arg(short = 's', long, default_value_t = 65536)]
    pub size: u32,
    /// Path MTU offered (the client takes the smaller of both).
    #[arg(short = 'm', long, default_value_t = 1024)]
    pub mtu: usize,
    /// Ethernet MTU of the link.
    #[arg(long, default_value_t = 1500)]
    pub eth_mtu: usize,
    /// Receive through an AF_PACKET socket on this interface so that IPv4 ICRCs are verified in
    /// full (IP ID and DF included).
    #[arg(long)]
    pub packet_rx: Option<String>,
    /// Give up after this many seconds.
    #[arg(long, default_value_t = 300)]
    pub timeout: u64,
}

/// perftest's `pingpong_dest` as its TCP hand shake carries it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Keys {
    lid: u32,
    out_reads: u32,
    qpn: u32,
    psn: u32,
    rkey: u32,
    vaddr: u64,
    gid: Option<Gid>,
    srqn: u32,
}

const KEY_MSG_SIZE: usize = 59;
const KEY_MSG_SIZE_GID: usize = 108;

impl Keys {
    fn encode(&self) -> Vec<u8> {
        let mut s = format!(
            "{:04x}:{:04x}:{:06x}:{:06x}:{:08x}:{:016x}",
            self.lid, self.out_reads, self.qpn, self.psn, self.rkey, self.vaddr
        );
        let len = match self.gid {
            Some(g) => {
                for b in g.0 {
                    s.push_str(&format!(":{b:02x}"));
                }
                s.push_str(&format!(":{:08x}:", self.srqn));
                KEY_MSG_SIZE_GID
            }
            None => {
                s.push_str(&format!(":{:08x}", self.srqn));
                KEY_MSG_SIZE
            }
        };
        let mut out = vec![0u8; len];
        let n = s.len().min(len - 1);
        out[..n].copy_from_slice(&s.as_bytes()[..n]);
        out
    }

    fn decode(msg: &[u8]) -> Option<Keys> {
        let end = msg.iter().position(|&b| b == 0).unwrap_or(msg.len());
        let s = std::str::from_utf8(&msg[..end]).ok()?;
        let f: Vec<&str> = s.split(':').collect();
        let hex = |i: usize| u64::from_str_radix(f.get(i)?, 16).ok();
        let (gid, srqn) = if f.len() >= 23 {
            let mut g = [0u8; 16];
            for (i, b) in g.iter_mut().enumerate() {
                *b = u8::try_from(hex(6 + i)?).ok()?;
            }
            (Some(Gid(g)), hex(22)?)
        } else {
            (None, hex(6)?)
        };
        Some(Keys {
            lid: hex(0)? as u32,
            out_reads: hex(1)? as u32,
            qpn: hex(2)? as u32 & 0xFF_FFFF,
            psn: hex(3)? as u32 & 0xFF_FFFF,
            rkey: hex(4)? as u32,
            vaddr: hex(5)?,
            gid,
            srqn: srqn as u32,
        })
    }
}

struct Exchange {
    s: TcpStream,
    /// Whether the client's keys carry a GID (108-byte messages).
    with_gid: bool,
}

impl Exchange {
    /// One step of ctx_xchg_data on the server side: read `n` bytes, answer `reply(read)`.
    fn xchg(&mut self, n: usize, reply: impl FnOnce(&[u8]) -> Vec<u8>) -> Result<Vec<u8>> {
        let mut buf = vec![0u8; n];
        self.s.read_exact(&mut buf).map_err(err("exchange: read"))?;
        let mut out = reply(&buf);
        out.resize(n, 0);
        self.s.write_all(&out).map_err(err("exchange: write"))?;
        Ok(buf)
    }

    /// A hand shake: the client's keys, then ours.
    fn hand_shake(&mut self, my: &Keys) -> Result<Keys> {
        let mut buf = vec![0u8; KEY_MSG_SIZE];
        self.s
            .read_exact(&mut buf)
            .map_err(err("hand shake: read"))?;
        // Byte 58 ends the message without a GID; with one it is a GID digit.
        if buf[KEY_MSG_SIZE - 1] != 0 {
            self.with_gid = true;
            buf.resize(KEY_MSG_SIZE_GID, 0);
            self.s
                .read_exact(&mut buf[KEY_MSG_SIZE..])
                .map_err(err("hand shake: read"))?;
        }
        let rem = Keys::decode(&buf).ok_or("hand shake: bad keys message")?;
        let mut mine = *my;
        if !self.with_gid {
            mine.gid = None;
        }
        self.s
            .write_all(&mine.encode())
            .map_err(err("hand shake: write"))?;
        Ok(rem)
    }
}

/// perftest's version string as a number (`atof`).
fn version(v: &[u8]) -> f64 {
    let end = v.iter().position(|&b| b == 0).unwrap_or(v.len());
    let s = String::from_utf8_lossy(&v[..end]);
    let num: String = s
        .trim()
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    num.parse().unwrap_or(0.0)
}

pub(crate) fn run_perftest(rt: &tokio::runtime::Runtime, a: &PerftestArgs) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(a.timeout);
    let mtu = Mtu::from_bytes(a.mtu).ok_or_else(|| format!("bad MTU {}", a.mtu))?;
    if a.size > rtgt_transport::verbs::DeviceAttr::default().max_msg_sz {
        return Err(format!(
            "--size {} is larger than the largest message",
            a.size
        ));
    }
    let size = (a.size as usize).max(1);
    let l = TcpListener::bind((Ipv4Addr::UNSPECIFIED, a.port))
        .map_err(err("exchange: cannot listen"))?;
    let hca = open_hca(
        rt,
        SocketAddr::new(a.local, 4791),
        a.eth_mtu,
        a.packet_rx.as_deref(),
        None,
    )?;
    let dev = hca.device();
    let pd = dev.alloc_pd().map_err(err("alloc PD"))?;
    let cq = dev.create_cq(2048).map_err(err("create CQ"))?;
    let depth = 512u32;
    let mut init = QpInitAttr::new(QpType::Rc, &cq, &cq);
    init.cap.max_recv_wr = depth;
    let qp = Arc::new(pd.create_qp(init).map_err(err("create QP"))?);
    // perftest's client targets the server's buffer at offsets below twice its own size.
    let region_len = (2 * size).max(1 << 20) + (1 << 20);
    let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    let mr = Arc::new(
        pd.reg_mr(Arc::new(Region::zeroed(region_len)), access)
            .map_err(err("register MR"))?,
    );
    rc_init(&qp, access)?;
    let recv_slots = (region_len / size).clamp(1, depth as usize);
    if a.test == Test::Send {
        for i in 0..recv_slots as u64 {
            qp.post_recv(RecvWr {
                wr_id: i,
                sg_list: mr.sge(i as usize * size, size as u32).into(),
            })
            .map_err(err("post receive"))?;
        }
    }
    let my = Keys {
        lid: 0,
        out_reads: 16,
        qpn: qp.qpn(),
        psn: psn_seed(),
        rkey: mr.rkey(),
        vaddr: mr.iova(),
        gid: Some(Gid::from_ip(a.local)),
        srqn: 0,
    };
    println!(
        "rtgt perftest server ({}): QPN {:#08x} PSN {:#08x} RKey {:#010x} VAddr {:#018x}",
        match a.test {
            Test::Write => "ib_write_bw",
            Test::Read => "ib_read_bw",
            Test::Send => "ib_send_bw",
            Test::WriteLat => "ib_write_lat",
        },
        my.qpn,
        my.psn,
        my.rkey,
        my.vaddr
    );
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
    s.set_read_timeout(Some(Duration::from_secs(a.timeout)))
        .map_err(err("exchange"))?;
    let mut x = Exchange { s, with_gid: false };
    // Versions: the client's own comes back, so it follows its own version's code paths.
    let v = x.xchg(16, |v| v.to_vec())?;
    let ver = version(&v);
    println!("client perftest version {ver}");
    if ver >= 5.32 {
        // Cycle buffer and cache line size: each side takes the larger; echo the client's.
        x.xchg(4, |v| v.to_vec())?;
        x.xchg(4, |v| v.to_vec())?;
    }
    if ver >= 5.1 {
        let n = if ver >= 5.31 { 2 } else { 4 };
        x.xchg(n, |v| {
            let end = v.iter().position(|&b| b == 0).unwrap_or(v.len());
            let theirs: u8 = std::str::from_utf8(&v[..end])
                .ok()
                .and_then(|s| s.trim().parse().ok())
                .unwrap_or(mtu as u8);
            format!("{}", theirs.min(mtu as u8)).into_bytes()
        })?;
    }
    let rem = x.hand_shake(&my)?;
    let rem_ip = match rem.gid {
        Some(g) if g.0 != [0; 16] => g.to_ip(),
        _ => peer.ip(),
    };
    println!(
        "client: QPN {:#08x} PSN {:#08x} out_reads {} address {rem_ip}",
        rem.qpn, rem.psn, rem.out_reads
    );
    connect_rc(&qp, rem_ip, rem.qpn, rem.psn, my.psn, mtu, access)?;
    let shakes = match a.test {
        Test::Send | Test::WriteLat => 3,
        Test::Write | Test::Read => 2,
    };
    for _ in 0..shakes {
        x.hand_shake(&my)?;
    }
    if a.test == Test::WriteLat {
        return write_lat(
            &mut x, &my, &rem, &qp, &cq, &mr, size, region_len, deadline, dev,
        );
    }
    // The client runs now. SEND: keep receives posted and count them meanwhile.
    let stop = Arc::new(AtomicBool::new(false));
    let received = Arc::new(AtomicU64::new(0));
    let bytes = Arc::new(AtomicU64::new(0));
    let reaper = {
        let (stop, received, bytes) = (stop.clone(), received.clone(), bytes.clone());
        let (qp, mr, cq) = (qp.clone(), mr.clone(), cq.clone());
        rt.spawn(async move {
            let mut wcs = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let _ = tokio::time::timeout(Duration::from_millis(100), cq.wait_nonempty()).await;
                wcs.clear();
                cq.poll_into(&mut wcs, 64);
                for wc in &wcs {
                    if wc.status != WcStatus::Success {
                        return Err(format!("completion {:?}", wc.status));
                    }
                    received.fetch_add(1, Ordering::Relaxed);
                    bytes.fetch_add(wc.byte_len as u64, Ordering::Relaxed);
                    let i = wc.wr_id;
                    qp.post_recv(RecvWr {
                        wr_id: i,
                        sg_list: mr.sge(i as usize * size, size as u32).into(),
                    })
                    .map_err(err("post receive"))?;
                }
            }
            Ok::<(), String>(())
        })
    };
    let start = Instant::now();
    let finish = (|| -> Result<()> {
        x.hand_shake(&my)?;
        if a.test != Test::Send {
            // Bandwidth reports: size, iterations, peak, average, message rate.
            for _ in 0..5 {
                x.xchg(8, |_| vec![0u8; 8])?;
            }
            x.hand_shake(&my)?;
        }
        // The client ends with "done" (5 bytes) and closes; so does the server.
        let _ = x.s.write_all(b"done\0");
        Ok(())
    })();
    let secs = start.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    let reaped = rt
        .block_on(reaper)
        .map_err(|e| format!("receive task: {e}"))?;
    finish?;
    reaped?;
    let st = dev.stats();
    if a.test == Test::Send {
        let b = bytes.load(Ordering::Relaxed);
        println!(
            "received {} messages, {b} bytes in {secs:.2} s ({:.1} MB/s)",
            received.load(Ordering::Relaxed),
            b as f64 / secs / 1e6
        );
    }
    println!(
        "rtgt stats: rx {} (dropped {}, bad ICRC {}), tx {}, retransmits {}, NAKs {}, RNR NAKs {}",
        st.rx_packets,
        st.rx_dropped,
        st.rx_bad_icrc,
        st.tx_packets,
        st.retransmits,
        st.naks_sent,
        st.rnr_naks_sent
    );
    Ok(())
}

/// The server's half of `ib_write_lat`'s ping-pong (see the module documentation). Our
/// receive buffer is the MR's start (the address we advertised), the send buffer its second
/// half.
#[allow(clippy::too_many_arguments)]
fn write_lat(
    x: &mut Exchange,
    my: &Keys,
    rem: &Keys,
    qp: &Qp,
    cq: &Cq,
    mr: &Mr,
    size: usize,
    region_len: usize,
    deadline: Instant,
    dev: &Device,
) -> Result<()> {
    let region = mr.region().ok_or("MR without memory")?.clone();
    let send_off = region_len / 2;
    let poll_off = size - 1;
    x.s.set_nonblocking(true).map_err(err("exchange"))?;
    let start = Instant::now();
    let (mut rcnt, mut scnt) = (0u64, 0u64);
    let mut wcs = Vec::new();
    let mut closing = false;
    let mut errors = 0u64;
    'run: loop {
        scnt += 1;
        region.write(send_off + size - 1, &[scnt as u8]);
        let mut wr = SendWr::new(
            scnt,
            SendOp::RdmaWrite {
                remote_addr: rem.vaddr,
                rkey: rem.rkey,
            },
            vec![mr.sge(send_off, size as u32)],
        );
        wr.flags = SendFlags::SIGNALED;
        qp.post_send(wr).map_err(err("post WRITE"))?;
        // Wait for the client's WRITE number `rcnt`, or for the end of the run.
        rcnt += 1;
        let mut spins = 0u32;
        loop {
            wcs.clear();
            cq.poll_into(&mut wcs, 64);
            errors += wcs
                .iter()
                .filter(|wc| wc.status != WcStatus::Success)
                .count() as u64;
            let mut b = [0u8; 1];
            region.read(poll_off, &mut b);
            if b[0] == rcnt as u8 {
                break;
            }
            spins += 1;
            if spins.is_multiple_of(256) {
                match x.s.peek(&mut b) {
                    Ok(0) => break 'run,
                    Ok(_) => {
                        closing = true;
                        break 'run;
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                    Err(e) => return Err(format!("exchange: {e}")),
                }
                if Instant::now() >= deadline {
                    return Err(format!("ib_write_lat: timed out at iteration {rcnt}"));
                }
                std::thread::sleep(Duration::from_micros(20));
            } else {
                std::thread::yield_now();
            }
        }
        if errors > 0 {
            return Err(format!(
                "ib_write_lat: WRITE {scnt} completed with an error"
            ));
        }
    }
    // The client's last WRITE arrived as count `rcnt - 1`.
    let round_trips = rcnt - 1;
    let secs = start.elapsed().as_secs_f64();
    x.s.set_nonblocking(false).map_err(err("exchange"))?;
    if closing {
        x.hand_shake(my)?;
        let _ = x.s.write_all(b"done\0");
    }
    let st = dev.stats();
    println!(
        "ib_write_lat: {round_trips} round trips of {size} bytes in {secs:.2} s; rtgt stats: rx {} (dropped {}, bad ICRC {}), tx {}, retransmits {}",
        st.rx_packets, st.rx_dropped, st.rx_bad_icrc, st.tx_packets, st.retransmits
    );
    if round_trips == 0 {
        return Err("ib_write_lat: no WRITE arrived".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip() {
        let k = Keys {
            lid: 0,
            out_reads: 16,
            qpn: 0x11,
            psn: 0x123456,
            rkey: 0xdeadbeef,
            vaddr: 0x7f00_0000_1000,
            gid: Some(Gid::from_ip("10.77.1.1".parse().unwrap())),
            srqn: 0,
        };
        let m = k.encode();
        assert_eq!(m.len(), KEY_MSG_SIZE_GID);
        assert_eq!(m[KEY_MSG_SIZE_GID - 1], 0);
        assert_eq!(m[KEY_MSG_SIZE_GID - 2], b':');
        assert_eq!(Keys::decode(&m), Some(k));
        let k2 = Keys { gid: None, ..k };
        let m2 = k2.encode();
        assert_eq!(m2.len(), KEY_MSG_SIZE);
        assert_eq!(m2[KEY_MSG_SIZE - 1], 0);
        assert_eq!(Keys::decode(&m2), Some(k2));
        assert_eq!(Keys::decode(b"12:zz"), None);
        assert_eq!(version(b"6.06\0\0\0"), 6.06);
    }
}
