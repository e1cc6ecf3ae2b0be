//! rtgt-srp: an SRP initiator on rtgt's soft-RoCE stack (RDMA/CM, as Linux ib_srp with
//! `dest=`): login, block reads and writes, and benchmarks (`bench` prints IOPS and MB/s).
//!
//! The target is named by the string Linux's `add_target` takes and rtgtd logs:
//! `id_ext=HEX,ioc_guid=HEX,dest=IP:PORT`. The initiator's own soft-RoCE device binds UDP 4791
//! on `--local`, which must differ from the target's address (on one host: the target on
//! 127.0.0.1, the initiator on 127.0.0.2).

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};
use rtgt_tools::bench::{parse_size, Rw};
use rtgt_tools::srp::{ConnectOptions, DescMode, Initiator};
use rtgt_transport::cm::CmConn;
use rtgt_transport::hca::{Hca, HcaConfig};

#[derive(Parser)]
#[command(name = "rtgt-srp", about = "SRP initiator: login, read, write, bench")]
struct Cli {
    /// Local address of the initiator's RoCEv2 device (default: 127.0.0.2 for a loopback
    /// target).
    #[arg(long, global = true)]
    local: Option<IpAddr>,
    /// Initiator port identifier (32 hex digits, optional 0x).
    #[arg(
        long,
        global = true,
        default_value = "0x00000000000000000000000000007273"
    )]
    initiator_id: String,
    /// Request limit assumed for the channel.
    #[arg(long, global = true, default_value_t = 64)]
    queue_depth: u32,
    /// Data buffer descriptors: direct, indirect (4 inline), external (table fetched by the
    /// target), immediate (writes).
    #[arg(long, global = true, value_enum, default_value_t = Mode::Direct)]
    mode: Mode,
    /// LUN.
    #[arg(long, global = true, default_value_t = 0)]
    lun: u64,
    /// Ethernet MTU of the link (1500 gives an RDMA path MTU of 1024, 4200 gives 4096); the
    /// target must offer at least the same.
    #[arg(long, global = true, default_value_t = 1500)]
    eth_mtu: usize,
    /// Microseconds the initiator's device keeps polling its UDP socket after a datagram
    /// moved before it sleeps; 0 sleeps at once.
    #[arg(long, global = true, default_value_t = 0)]
    busy_poll: u64,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Mode {
    Direct,
    Indirect,
    External,
    Immediate,
}

impl Mode {
    fn desc(self) -> DescMode {
        match self {
            Mode::Direct => DescMode::Direct,
            Mode::Indirect => DescMode::Indirect { pieces: 4 },
            Mode::External => DescMode::External {
                pieces: 16,
                inline: 0,
            },
            Mode::Immediate => DescMode::Immediate,
        }
    }
}

#[derive(Subcommand)]
enum Cmd {
    /// Logs in, prints the capacity and logs out.
    Login {
        #[arg(long)]
        target: String,
    },
    /// Reads blocks and writes them to stdout (or a file).
    Read {
        #[arg(long)]
        target: String,
        #[arg(long, default_value_t = 0)]
        lba: u64,
        #[arg(long, default_value_t = 1)]
        blocks: u32,
        #[arg(long)]
        out: Option<std::path::PathBuf>,
    },
    /// Writes blocks from a file (or a repeated byte).
    Write {
        #[arg(long)]
        target: String,
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
        #[arg(long)]
        target: String,
        #[arg(long, value_enum, default_value_t = Rw::Randread)]
        rw: Rw,
        /// Block size per I/O, e.g. 4k, 128k, 1m.
        #[arg(long, default_value = "4k")]
        bs: String,
        #[arg(long, default_value_t = 32)]
        iodepth: usize,
        #[arg(long, default_value_t = 10)]
        seconds: u64,
    },
}

/// The target of an `add_target` string.
struct Target {
    id_ext: u64,
    ioc_guid: u64,
    dest: SocketAddr,
}

fn parse_target(s: &str) -> Result<Target> {
    let (mut id_ext, mut ioc_guid, mut dest) = (None, None, None);
    for kv in s.trim().split(',') {
        let (k, v) = kv
            .split_once('=')
            .ok_or(format!("{kv:?}: expected key=value"))?;
        let hex = |v: &str| {
            u64::from_str_radix(v.trim_start_matches("0x"), 16).map_err(|e| format!("{k}: {e}"))
        };
        match k {
            "id_ext" => id_ext = Some(hex(v)?),
            "ioc_guid" => ioc_guid = Some(hex(v)?),
            "dest" => dest = Some(v.parse::<SocketAddr>().map_err(|e| format!("dest: {e}"))?),
            // Linux ib_srp options that do not concern this initiator.
            _ => {}
        }
    }
    Ok(Target {
        id_ext: id_ext.ok_or("id_ext missing")?,
        ioc_guid: ioc_guid.ok_or("ioc_guid missing")?,
        dest: dest.ok_or("dest missing")?,
    })
}

fn parse_id(s: &str) -> Result<[u8; 16]> {
    let h = s.trim_start_matches("0x");
    let v = u128::from_str_radix(h, 16).map_err(|e| format!("initiator id: {e}"))?;
    if h.len() != 32 {
        return Err("initiator id: 32 hex digits".into());
    }
    Ok(v.to_be_bytes())
}

type Result<T> = std::result::Result<T, String>;

fn e<E: std::fmt::Display>(what: &'static str) -> impl FnOnce(E) -> String {
    move |err| format!("{what}: {err}")
}

struct Open {
    ini: Arc<Initiator>,
    _conn: CmConn,
    _hca: Hca,
    block: u32,
    blocks: u64,
}

async fn open(cli: &Cli, target: &str) -> Result<Open> {
    let t = parse_target(target)?;
    let local = match cli.local {
        Some(a) => a,
        None if t.dest.ip().is_loopback() => IpAddr::from([127, 0, 0, 2]),
        None => return Err("--local is needed for a remote target".into()),
    };
    let mut cfg = HcaConfig::new(vec![local]);
    cfg.name = "rtgt-srp".into();
    cfg.eth_mtu = cli.eth_mtu;
    cfg.busy_poll = Duration::from_micros(cli.busy_poll);
    let hca = Hca::open(&cfg).map_err(e("RDMA device"))?;
    let mut opts = ConnectOptions::new(parse_id(&cli.initiator_id)?, t.id_ext, t.ioc_guid);
    opts.queue_depth = cli.queue_depth.max(2);
    let (ini, conn) = tokio::time::timeout(
        Duration::from_secs(30),
        Initiator::connect(hca.cm(), t.dest, &opts),
    )
    .await
    .map_err(|_| "login timed out".to_string())?
    .map_err(e("login"))?;
    let (blocks, block) = ini
        .read_capacity(cli.lun)
        .await
        .map_err(e("READ CAPACITY"))?;
    Ok(Open {
        ini,
        _conn: conn,
        _hca: hca,
        block,
        blocks,
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
    let mode = cli.mode.desc();
    let (ini, lun, block) = (o.ini.clone(), cli.lun, o.block);
    let report = rtgt_tools::bench::run(rw, bs, iodepth, seconds, slots, move |slot| {
        let (ini, data) = (ini.clone(), data.clone());
        async move {
            let lba = slot * u64::from(per_io);
            if rw.is_read() {
                ini.read(lun, lba, per_io, block, mode).await.map(drop)
            } else {
                ini.write(lun, lba, &data, block, mode).await
            }
        }
    })
    .await
    .map_err(e("I/O"))?;
    println!("{report}");
    Ok(())
}

async fn run(cli: Cli) -> Result<()> {
    let target = match &cli.cmd {
        Cmd::Login { target }
        | Cmd::Read { target, .. }
        | Cmd::Write { target, .. }
        | Cmd::Bench { target, .. } => target.clone(),
    };
    let o = open(&cli, &target).await?;
    match &cli.cmd {
        Cmd::Login { .. } => {
            println!(
                "logged in: LUN {} has {} blocks of {} bytes ({} bytes)",
                cli.lun,
                o.blocks,
                o.block,
                o.blocks * u64::from(o.block)
            );
        }
        Cmd::Read {
            lba, blocks, out, ..
        } => {
            let data = o
                .ini
                .read(cli.lun, *lba, *blocks, o.block, cli.mode.desc())
                .await
                .map_err(e("READ"))?;
            rtgt_tools::cli::write_out(&data, out.as_deref())?;
        }
        Cmd::Write {
            lba,
            file,
            pattern,
            blocks,
            ..
        } => {
            let data = rtgt_tools::cli::data_in(file.as_deref(), *pattern, *blocks, o.block)?;
            o.ini
                .write(cli.lun, *lba, &data, o.block, cli.mode.desc())
                .await
                .map_err(e("WRITE"))?;
        }
        Cmd::Bench {
            rw,
            bs,
            iodepth,
            seconds,
            ..
        } => {
            let bs = parse_size(bs)?;
            bench(&cli, &o, *rw, bs, *iodepth, *seconds).await?;
        }
    }
    let _ = o.ini.logout();
    tokio::time::sleep(Duration::from_millis(50)).await;
    Ok(())
}

fn main() {
    let cli = Cli::parse();
    // The soft-RoCE device and the channel share one thread, as rtgtd's engine thread does:
    // a completion and the next command never hop between cores.
    rtgt_tools::cli::main("rtgt-srp", false, run(cli));
}
