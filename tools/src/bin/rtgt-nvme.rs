//! rtgt-nvme: an NVMe/TCP and NVMe/RDMA host (the in-repo one of `rtgt_tools::nvme`):
//! discovery, Identify, block reads and writes, and benchmarks over several I/O queues
//! (`bench` prints IOPS, MB/s and latency like `rtgt-iscsi bench` and `rtgt-srp bench`).
//!
//! With `--rdma LOCAL`, the queues are NVMe/RDMA queue pairs of the host's own soft-RoCE
//! device, which binds UDP 4791 on LOCAL (on one host: the target on 127.0.0.1, the host on
//! 127.0.0.2).

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, Subcommand};
use rtgt_nvme::subsys::DISCOVERY_NQN;
use rtgt_nvme::tcp::Digests;
use rtgt_tools::bench::{parse_size, Rw};
use rtgt_tools::nvme::{HostConfig, NvmeError, Queue};
use rtgt_transport::hca::{Hca, HcaConfig};

#[derive(Parser)]
#[command(
    name = "rtgt-nvme",
    about = "NVMe/TCP and NVMe/RDMA host: discover, identify, read, write, bench"
)]
struct Cli {
    /// The controller's address, e.g. 127.0.0.1:4420 (discovery: port 8009 or any port).
    #[arg(long, global = true, default_value = "127.0.0.1:4420")]
    addr: SocketAddr,
    /// Subsystem NQN.
    #[arg(long, global = true, default_value = "nqn.2025-01.io.rtgt:disk0")]
    nqn: String,
    /// Host NQN (default: the in-repo host's).
    #[arg(long, global = true)]
    hostnqn: Option<String>,
    /// Namespace ID.
    #[arg(long, global = true, default_value_t = 1)]
    nsid: u32,
    /// NVMe/RDMA from this local address (the host's RoCEv2 device) instead of NVMe/TCP.
    #[arg(long, global = true)]
    rdma: Option<IpAddr>,
    /// NVMe/RDMA: Ethernet MTU of the link (1500 gives an RDMA path MTU of 1024, 4200 gives
    /// 4096); the target must offer at least the same.
    #[arg(long, global = true, default_value_t = 1500)]
    eth_mtu: usize,
    /// NVMe/RDMA: microseconds the host's device keeps polling its UDP socket after a
    /// datagram moved before it sleeps; 0 sleeps at once.
    #[arg(long, global = true, default_value_t = 0)]
    busy_poll: u64,
    /// I/O queues (one connection each); bench workers are spread over them.
    #[arg(long, global = true, default_value_t = 1)]
    queues: u16,
    /// Entries of each I/O queue.
    #[arg(long, global = true, default_value_t = 128)]
    queue_size: u16,
    /// Header and data digests (CRC32C).
    #[arg(long, global = true)]
    digests: bool,
    /// Disable SQ flow control: reads complete with C2HData's SUCCESS flag, without a
    /// response capsule.
    #[arg(long, global = true)]
    disable_sqflow: bool,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Prints the discovery log.
    Discover,
    /// Connects, prints the controller and the namespace, disconnects.
    Identify,
    /// Reads blocks and writes them to stdout (or a file).
    Read {
        #[arg(long, default_value_t = 0)]
        lba: u64,
        #[arg(long, default_value_t = 1)]
        blocks: u32,
        #[arg(long)]
        out: Option<std::path::PathBuf>,
    },
    /// Writes blocks from a file (or a repeated byte).
    Write {
        #[arg(long, default_value_t = 0)]
        lba: u64,
        #[arg(long)]
        file: Option<std::path::PathBuf>,
        #[arg(long, default_value_t = 0)]
        pattern: u8,
        #[arg(long, default_value_t = 1)]
        blocks: u32,
    },
    /// Runs a fixed-time benchmark and prints IOPS and MB/s.
    Bench {
        #[arg(long, value_enum, default_value_t = Rw::Randread)]
        rw: Rw,
        /// Block size per I/O, e.g. 4k, 128k, 1m.
        #[arg(long, default_value = "4k")]
        bs: String,
        /// I/Os in flight, over all queues.
        #[arg(long, default_value_t = 32)]
        iodepth: usize,
        #[arg(long, default_value_t = 10)]
        seconds: u64,
    },
}

type Result<T> = std::result::Result<T, String>;

fn e<E: std::fmt::Display>(what: &'static str) -> impl FnOnce(E) -> String {
    move |err| format!("{what}: {err}")
}

fn host(cli: &Cli) -> HostConfig {
    let mut h = HostConfig {
        digests: if cli.digests {
            Digests {
                header: true,
                data: true,
            }
        } else {
            Digests::default()
        },
        disable_sqflow: cli.disable_sqflow,
        ..HostConfig::default()
    };
    if let Some(n) = &cli.hostnqn {
        h.host_nqn = n.clone();
    }
    h
}

/// How queues reach the controller.
enum Fabric {
    Tcp,
    /// The host's own soft-RoCE device.
    Rdma(Hca),
}

impl Fabric {
    fn new(cli: &Cli) -> Result<Fabric> {
        let Some(local) = cli.rdma else {
            return Ok(Fabric::Tcp);
        };
        let mut cfg = HcaConfig::new(vec![local]);
        cfg.name = "rtgt-nvme".into();
        cfg.eth_mtu = cli.eth_mtu;
        cfg.busy_poll = Duration::from_micros(cli.busy_poll);
        Ok(Fabric::Rdma(Hca::open(&cfg).map_err(e("RDMA device"))?))
    }

    /// Opens queue `qid` (of controller `cntlid`), `size` entries.
    async fn queue(
        &self,
        cli: &Cli,
        nqn: &str,
        qid: u16,
        cntlid: u16,
        size: u16,
    ) -> std::result::Result<Queue, NvmeError> {
        let h = host(cli);
        match self {
            Fabric::Tcp => Queue::connect(cli.addr, &h, nqn, qid, cntlid, size).await,
            Fabric::Rdma(hca) => {
                Queue::connect_rdma(hca.cm(), cli.addr, &h, nqn, qid, cntlid, size).await
            }
        }
    }
}

/// A controller with its I/O queues and the namespace's geometry.
struct Open {
    admin: Queue,
    io: Vec<Arc<Queue>>,
    block: u32,
    blocks: u64,
}

async fn open(cli: &Cli, fabric: &Fabric) -> Result<Open> {
    let admin = fabric
        .queue(cli, &cli.nqn, 0, 0, 32)
        .await
        .map_err(e("connect"))?;
    let granted = admin.enable(cli.queues).await.map_err(e("enable"))?;
    let id = admin
        .identify_controller()
        .await
        .map_err(e("identify controller"))?;
    let ns = admin
        .identify_namespace(cli.nsid)
        .await
        .map_err(e("identify namespace"))?;
    let mut io = Vec::new();
    for qid in 1..=granted.min(cli.queues).max(1) {
        let mut q = fabric
            .queue(cli, &cli.nqn, qid, admin.cntlid, cli.queue_size)
            .await
            .map_err(e("connect I/O queue"))?;
        q.use_ioccsz(id.ioccsz);
        io.push(Arc::new(q));
    }
    Ok(Open {
        admin,
        io,
        block: 1 << ns.lbads,
        blocks: ns.nsze,
    })
}

async fn bench(cli: &Cli, o: &Open, rw: Rw, bs: u64, iodepth: usize, seconds: u64) -> Result<()> {
    if bs == 0 || !bs.is_multiple_of(u64::from(o.block)) {
        return Err(format!(
            "--bs must be a multiple of the block size {}",
            o.block
        ));
    }
    let per_io = (bs / u64::from(o.block)) as u32;
    let slots = (o.blocks / u64::from(per_io)).max(1);
    let data = Arc::new(vec![0x5au8; bs as usize]);
    let (queues, nsid, block) = (Arc::new(o.io.clone()), cli.nsid, o.block);
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let report = rtgt_tools::bench::run(rw, bs, iodepth, seconds, slots, move |slot| {
        let (queues, data) = (queues.clone(), data.clone());
        // Commands go round the queues, as a host's CPUs spread them.
        let q =
            queues[next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % queues.len()].clone();
        async move {
            let lba = slot * u64::from(per_io);
            if rw.is_read() {
                q.read(nsid, lba, per_io, block).await.map(drop)
            } else {
                q.write(nsid, lba, data.to_vec(), block, false).await
            }
        }
    })
    .await
    .map_err(e("I/O"))?;
    println!("{report} queues={}", o.io.len());
    Ok(())
}

async fn run(cli: Cli) -> Result<()> {
    let fabric = Fabric::new(&cli)?;
    if let Cmd::Discover = cli.cmd {
        let q = fabric
            .queue(&cli, DISCOVERY_NQN, 0, 0, 32)
            .await
            .map_err(e("connect"))?;
        q.enable(0).await.map_err(e("enable"))?;
        for d in q.discovery_log().await.map_err(e("discovery log"))? {
            println!(
                "subnqn={} trtype={} traddr={} trsvcid={} portid={}",
                d.subnqn, d.trtype, d.traddr, d.trsvcid, d.portid
            );
        }
        return Ok(());
    }
    let o = open(&cli, &fabric).await?;

    match &cli.cmd {
        Cmd::Discover => {}
        Cmd::Identify => {
            let id = o.admin.identify_controller().await.map_err(e("identify"))?;
            println!(
                "controller {} of {}: serial {:?}, model {:?}, {} I/O queues; namespace {}: {} blocks of {} bytes",
                o.admin.cntlid,
                id.subnqn,
                id.serial.trim(),
                id.model.trim(),
                o.io.len(),
                cli.nsid,
                o.blocks,
                o.block
            );
        }
        Cmd::Read { lba, blocks, out } => {
            let data = o.io[0]
                .read(cli.nsid, *lba, *blocks, o.block)
                .await
                .map_err(e("read"))?;
            rtgt_tools::cli::write_out(&data, out.as_deref())?;
        }
        Cmd::Write {
            lba,
            file,
            pattern,
            blocks,
        } => {
            let data = rtgt_tools::cli::data_in(file.as_deref(), *pattern, *blocks, o.block)?;
            o.io[0]
                .write(cli.nsid, *lba, data, o.block, false)
                .await
                .map_err(e("write"))?;
        }
        Cmd::Bench {
            rw,
            bs,
            iodepth,
            seconds,
        } => {
            let bs = parse_size(bs)?;
            bench(&cli, &o, *rw, bs, *iodepth, *seconds).await?;
        }
    }
    Ok(())
}

fn main() {
    let cli = Cli::parse();
    // Worker threads over TCP; over RDMA the host's soft-RoCE device and its queues share
    // one thread, as `rtgt-iscsi` runs iSER: a completion and the next command never hop
    // between cores.
    let multi_thread = cli.rdma.is_none();
    rtgt_tools::cli::main("rtgt-nvme", multi_thread, run(cli));
}
