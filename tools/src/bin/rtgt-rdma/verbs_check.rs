//! `rtgt-rdma verbs-check`: rdma-core's data path as rtgt drives it, on one device of the host
//! (an RDMA NIC or rdma_rxe): two RC QPs connected to each other over the port's RoCE v2 (or IB)
//! GID, a SEND, an RDMA WRITE and an RDMA READ checked byte for byte, then RDMA WRITEs for a
//! few seconds with their bandwidth. Completions are waited for through the CQ's completion
//! channel, as the `verbs` provider waits for them.

use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use rtgt_transport::cm::ConnParams;
use rtgt_transport::rdmacore::cm::{CmEventKind, CmId, EventChannel};
use rtgt_transport::rdmacore::res::{Context, Cq, Mr, Pd, Qp};
use rtgt_transport::rdmacore::sys::*;
use rtgt_transport::rdmacore::{GidKind, RdmaCore};
use rtgt_transport::verbs::Region;

use crate::{err, Result};

#[derive(Args, Clone)]
pub struct VerbsCheckArgs {
    /// The device (default: the first one with an active port).
    #[arg(short = 'd', long)]
    device: Option<String>,
    /// Message size in bytes.
    #[arg(short = 's', long, default_value_t = 65536)]
    size: usize,
    /// Seconds of RDMA WRITEs after the checks.
    #[arg(long, default_value_t = 2.0)]
    seconds: f64,
    /// Then connect through the RDMA CM to a listener of this process on the GID's address
    /// and this port: private data both ways, SENDs both ways, a rejected request with its
    /// private data, a disconnect seen by both ends.
    #[arg(long)]
    cm_port: Option<u16>,
}

/// Waits until `n` completions are in, through the completion channel; fails on an error
/// status or after 10 s.
async fn completions(cq: &Cq, n: usize) -> Result<Vec<ibv_wc>> {
    let mut got = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while got.len() < n {
        let want = n - got.len();
        cq.poll(&mut got, want).map_err(err("poll CQ"))?;
        if got.len() >= n {
            break;
        }
        cq.arm().map_err(err("arm CQ"))?;
        let want = n - got.len();
        cq.poll(&mut got, want).map_err(err("poll CQ"))?;
        if got.len() < n {
            tokio::time::timeout_at(deadline, cq.wait())
                .await
                .map_err(|_| format!("{} of {n} completions after 10 s", got.len()))?
                .map_err(err("CQ event"))?;
        }
    }
    if let Some(w) = got.iter().find(|w| w.status != IBV_WC_SUCCESS) {
        return Err(format!(
            "work request {} completed with status {} (vendor error {:#x})",
            w.wr_id, w.status, w.vendor_err
        ));
    }
    Ok(got)
}

/// INIT, RTR towards `dest` (GID `gid` at `sgid_index`), RTS.
fn connect(qp: &Qp, dest: u32, gid: [u8; 16], sgid_index: u8, mtu: u32) -> Result<()> {
    let access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
    let mut a = ibv_qp_attr {
        qp_state: IBV_QPS_INIT,
        port_num: 1,
        qp_access_flags: access,
        ..Default::default()
    };
    qp.modify(
        &a,
        IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS,
    )
    .map_err(err("QP to INIT"))?;
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = mtu;
    a.dest_qp_num = dest;
    a.rq_psn = 0x1234;
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = 12;
    a.ah_attr = ibv_ah_attr {
        grh: ibv_global_route {
            dgid: ibv_gid { raw: gid },
            sgid_index,
            hop_limit: 64,
            ..Default::default()
        },
        is_global: 1,
        port_num: 1,
        ..Default::default()
    };
    qp.modify(
        &a,
        IBV_QP_STATE
            | IBV_QP_AV
            | IBV_QP_PATH_MTU
            | IBV_QP_DEST_QPN
            | IBV_QP_RQ_PSN
            | IBV_QP_MAX_DEST_RD_ATOMIC
            | IBV_QP_MIN_RNR_TIMER,
    )
    .map_err(err("QP to RTR"))?;
    a.qp_state = IBV_QPS_RTS;
    a.timeout = 14;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.sq_psn = 0x1234;
    a.max_rd_atomic = 1;
    qp.modify(
        &a,
        IBV_QP_STATE
            | IBV_QP_TIMEOUT
            | IBV_QP_RETRY_CNT
            | IBV_QP_RNR_RETRY
            | IBV_QP_SQ_PSN
            | IBV_QP_MAX_QP_RD_ATOMIC,
    )
    .map_err(err("QP to RTS"))?;
    Ok(())
}

fn send_wr(id: u64, opcode: u32, sge: &mut ibv_sge, remote: Option<(u64, u32)>) -> ibv_send_wr {
    // SAFETY: ibv_send_wr is plain data (pointers may be null); all zeroes is valid.
    let mut wr: ibv_send_wr = unsafe { std::mem::zeroed() };
    wr.wr_id = id;
    wr.sg_list = sge;
    wr.num_sge = 1;
    wr.opcode = opcode;
    wr.send_flags = IBV_SEND_SIGNALED;
    if let Some((addr, rkey)) = remote {
        wr.wr.rdma = ibv_rdma_wr {
            remote_addr: addr,
            rkey,
        };
    }
    wr
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(13).wrapping_add(seed) ^ (i >> 12) as u8)
        .collect()
}

pub fn run(rt: &tokio::runtime::Runtime, a: &VerbsCheckArgs) -> Result<()> {
    let lib = RdmaCore::load().map_err(|e| e.to_string())?;
    let devs = lib.devices().map_err(|e| e.to_string())?;
    let dev = devs
        .iter()
        .find(|d| match &a.device {
            Some(n) => &d.name == n,
            None => d.ports.first().is_some_and(|p| p.active),
        })
        .ok_or_else(|| match &a.device {
            Some(n) => format!("no RDMA device {n}"),
            None => "no RDMA device with an active port".to_string(),
        })?;
    let port = dev.ports.first().ok_or("the device has no port")?;
    // RoCE: the port's RoCE v2 GID of an IPv4 address if there is one, else any RoCE v2 one;
    // InfiniBand: GID 0.
    let gid = if port.ethernet {
        let v2 = port.gids.iter().filter(|g| g.kind == GidKind::RoceV2);
        v2.clone()
            .find(|g| g.ip().is_ipv4())
            .or_else(|| v2.clone().next())
            .ok_or("the port has no RoCE v2 GID (no IP address on its network device?)")?
    } else {
        port.gids.first().ok_or("the port has no GID")?
    };
    println!(
        "{} port {}: GID {} ({}), MTU {}",
        dev.name,
        port.port,
        gid.index,
        gid.ip(),
        port.active_mtu
    );
    let size = a.size.max(1);
    rt.block_on(async {
        let ctx = Context::open(lib, &dev.name).map_err(|e| e.to_string())?;
        let mtu = ctx.query_port(1).map_err(err("query port"))?.active_mtu;
        let pd = Pd::alloc(&ctx).map_err(err("alloc PD"))?;
        let cq = Cq::create(&ctx, 64).map_err(err("create CQ"))?;
        let cap = ibv_qp_cap {
            max_send_wr: 16,
            max_recv_wr: 16,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        let qa = Qp::create_rc(&pd, &cq, &cq, cap).map_err(err("create QP"))?;
        let qb = Qp::create_rc(&pd, &cq, &cq, cap).map_err(err("create QP"))?;
        connect(&qa, qb.qpn(), gid.gid, gid.index as u8, mtu)?;
        connect(&qb, qa.qpn(), gid.gid, gid.index as u8, mtu)?;
        // A's send buffer, A's READ landing, B's receive buffer, B's WRITE target.
        let region = Arc::new(Region::zeroed(4 * size));
        let access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
        let mr: Mr = pd
            .reg_mr(region.clone(), access)
            .map_err(err("register MR"))?;
        let remote = |slot: usize| (region.addr() + (slot * size) as u64, mr.rkey());
        let len = size as u32;

        // SEND A -> B.
        let data = pattern(1, size);
        region.write(0, &data);
        let mut rsge = mr.sge(2 * size, len);
        let mut rwr = ibv_recv_wr {
            wr_id: 100,
            next: std::ptr::null_mut(),
            sg_list: &mut rsge,
            num_sge: 1,
        };
        qb.post_recv(&mut rwr).map_err(err("post receive"))?;
        let mut sge = mr.sge(0, len);
        qa.post_send(&mut send_wr(1, IBV_WR_SEND, &mut sge, None))
            .map_err(err("post SEND"))?;
        let wcs = completions(&cq, 2).await?;
        let recv = wcs
            .iter()
            .find(|w| w.opcode == IBV_WC_RECV)
            .ok_or("no receive completion")?;
        if recv.byte_len != len || recv.qp_num != qb.qpn() {
            return Err(format!(
                "receive completion: {} bytes on QP {:#x}",
                recv.byte_len, recv.qp_num
            ));
        }
        let mut got = vec![0u8; size];
        region.read(2 * size, &mut got);
        if got != data {
            return Err("SEND: the received bytes differ".into());
        }
        println!("SEND of {size} bytes: received intact");

        // RDMA WRITE A -> B's target, then RDMA READ it back into A's landing.
        let data = pattern(2, size);
        region.write(0, &data);
        let mut sge = mr.sge(0, len);
        qa.post_send(&mut send_wr(
            2,
            IBV_WR_RDMA_WRITE,
            &mut sge,
            Some(remote(3)),
        ))
        .map_err(err("post RDMA WRITE"))?;
        completions(&cq, 1).await?;
        region.read(3 * size, &mut got);
        if got != data {
            return Err("RDMA WRITE: the target's bytes differ".into());
        }
        let mut sge = mr.sge(size, len);
        qa.post_send(&mut send_wr(3, IBV_WR_RDMA_READ, &mut sge, Some(remote(3))))
            .map_err(err("post RDMA READ"))?;
        completions(&cq, 1).await?;
        region.read(size, &mut got);
        if got != data {
            return Err("RDMA READ: the bytes read differ".into());
        }
        println!("RDMA WRITE and RDMA READ of {size} bytes: intact");

        // RDMA WRITEs, 8 in flight, for the time asked.
        let start = Instant::now();
        let (mut posted, mut done) = (0u64, 0u64);
        let mut sges = [mr.sge(0, len); 8];
        while start.elapsed().as_secs_f64() < a.seconds || posted > done {
            while posted - done < 8 && start.elapsed().as_secs_f64() < a.seconds {
                let s = &mut sges[(posted % 8) as usize];
                qa.post_send(&mut send_wr(
                    1000 + posted,
                    IBV_WR_RDMA_WRITE,
                    s,
                    Some(remote(3)),
                ))
                .map_err(err("post RDMA WRITE"))?;
                posted += 1;
            }
            done += completions(&cq, 1).await?.len() as u64;
        }
        let secs = start.elapsed().as_secs_f64();
        println!(
            "RDMA WRITE {size} bytes x {done}: {:.1} MB/s",
            (done as f64 * size as f64) / secs / 1e6
        );
        if let Some(port) = a.cm_port {
            cm_check(lib, std::net::SocketAddr::new(gid.ip(), port)).await?;
        }
        Ok(())
    })
}

/// The next event of `ch`, which must be `want`.
async fn expect(
    ch: &EventChannel,
    want: CmEventKind,
) -> Result<rtgt_transport::rdmacore::cm::CmEvent> {
    let ev = tokio::time::timeout(Duration::from_secs(10), ch.next())
        .await
        .map_err(|_| format!("no CM event after 10 s (waiting for {want:?})"))?
        .map_err(err("CM event"))?;
    if ev.kind != want {
        return Err(format!(
            "CM event {:?} (status {}), expected {want:?}",
            ev.kind, ev.status
        ));
    }
    Ok(ev)
}

/// One end of a CM connection: its id with a QP, CQ and a registered buffer of two slots
/// (send, receive).
struct End {
    id: CmId,
    cq: Arc<Cq>,
    mr: Mr,
}

impl End {
    fn new(id: CmId) -> Result<End> {
        let ctx = id.context().ok_or("the CM id has no device")?;
        let pd = Pd::alloc(&ctx).map_err(err("alloc PD"))?;
        let cq = Cq::create(&ctx, 16).map_err(err("create CQ"))?;
        let cap = ibv_qp_cap {
            max_send_wr: 4,
            max_recv_wr: 4,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        id.create_qp(&pd, &cq, &cq, cap)
            .map_err(err("rdma_create_qp"))?;
        let region = Arc::new(Region::zeroed(2 * CM_MSG));
        let mr = pd
            .reg_mr(region, IBV_ACCESS_LOCAL_WRITE)
            .map_err(err("register MR"))?;
        let end = End { id, cq, mr };
        let mut sge = end.mr.sge(CM_MSG, CM_MSG as u32);
        let mut wr = ibv_recv_wr {
            wr_id: 7,
            next: std::ptr::null_mut(),
            sg_list: &mut sge,
            num_sge: 1,
        };
        end.id.post_recv(&mut wr).map_err(err("post receive"))?;
        Ok(end)
    }

    /// SENDs `msg` to `to`, which must receive it intact.
    async fn send_to(&self, to: &End, msg: &[u8]) -> Result<()> {
        self.mr.region().write(0, msg);
        let mut sge = self.mr.sge(0, msg.len() as u32);
        self.id
            .post_send(&mut send_wr(8, IBV_WR_SEND, &mut sge, None))
            .map_err(err("post SEND"))?;
        completions(&self.cq, 1).await?;
        let wc = completions(&to.cq, 1).await?;
        let mut got = vec![0u8; msg.len()];
        to.mr.region().read(CM_MSG, &mut got);
        if wc[0].byte_len as usize != msg.len() || got != msg {
            return Err("SEND over the CM connection: the received bytes differ".into());
        }
        Ok(())
    }
}

const CM_MSG: usize = 4096;

/// A client end: resolved, with its QP, connect sent with `data`.
async fn connecting(ch: &Arc<EventChannel>, dst: std::net::SocketAddr, data: &[u8]) -> Result<End> {
    let id = CmId::create(ch).map_err(err("rdma_create_id"))?;
    id.resolve_addr(dst, 2000)
        .map_err(err("rdma_resolve_addr"))?;
    expect(ch, CmEventKind::AddrResolved).await?;
    id.resolve_route(2000).map_err(err("rdma_resolve_route"))?;
    expect(ch, CmEventKind::RouteResolved).await?;
    let end = End::new(id)?;
    end.id
        .connect(&ConnParams {
            private_data: data.to_vec(),
            responder_resources: 1,
            initiator_depth: 1,
            ..ConnParams::default()
        })
        .map_err(err("rdma_connect"))?;
    Ok(end)
}

/// The RDMA CM through librdmacm: a listener on `at` and clients of this process.
async fn cm_check(lib: &'static RdmaCore, at: std::net::SocketAddr) -> Result<()> {
    let sch = EventChannel::create(lib).map_err(err("event channel"))?;
    let listener = CmId::create(&sch).map_err(err("rdma_create_id"))?;
    listener.bind(at).map_err(err("rdma_bind_addr"))?;
    listener.listen(8).map_err(err("rdma_listen"))?;
    let cch = EventChannel::create(lib).map_err(err("event channel"))?;
    let client = connecting(&cch, at, b"rtgt verbs-check hello").await?;
    let req = expect(&sch, CmEventKind::ConnectRequest).await?;
    if !req.private_data.starts_with(b"rtgt verbs-check hello") {
        return Err(format!("request private data {:02x?}", req.private_data));
    }
    // SAFETY: the id of this connection request, adopted once.
    let server = End::new(unsafe { CmId::adopt(&sch, req.id) })?;
    server
        .id
        .accept(&ConnParams {
            private_data: b"rtgt verbs-check welcome".to_vec(),
            responder_resources: 1,
            initiator_depth: 1,
            ..ConnParams::default()
        })
        .map_err(err("rdma_accept"))?;
    let est = expect(&cch, CmEventKind::Established).await?;
    if !est.private_data.starts_with(b"rtgt verbs-check welcome") {
        return Err(format!("reply private data {:02x?}", est.private_data));
    }
    expect(&sch, CmEventKind::Established).await?;
    client
        .send_to(&server, b"over the CM, client to server")
        .await?;
    server.send_to(&client, b"and back").await?;
    println!("CM connection to {at}: private data both ways, SENDs both ways");

    let refused = connecting(&cch, at, b"rtgt verbs-check again").await?;
    let req = expect(&sch, CmEventKind::ConnectRequest).await?;
    // SAFETY: as above.
    let r = unsafe { CmId::adopt(&sch, req.id) };
    r.reject(b"rtgt verbs-check no")
        .map_err(err("rdma_reject"))?;
    let rej = expect(&cch, CmEventKind::Rejected).await?;
    if !rej.private_data.starts_with(b"rtgt verbs-check no") {
        return Err(format!("reject private data {:02x?}", rej.private_data));
    }
    drop((r, refused));
    println!("CM request rejected with its private data");

    // The DREQ reaches the server, whose own disconnect answers it (DREP): then the client
    // sees its end disconnected too.
    client.id.disconnect().map_err(err("rdma_disconnect"))?;
    expect(&sch, CmEventKind::Disconnected).await?;
    server.id.disconnect().map_err(err("rdma_disconnect"))?;
    expect(&cch, CmEventKind::Disconnected).await?;
    println!("CM disconnect seen by both ends");
    Ok(())
}
