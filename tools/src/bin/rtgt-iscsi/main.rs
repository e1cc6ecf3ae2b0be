//! rtgt-iscsi: a small iSCSI initiator for discovery, block reads and writes, and
//! benchmarks (`bench` prints IOPS and MB/s, for side-by-side runs against other targets).
//! With `--iser ADDR` sessions run over iSER instead of TCP, on rtgt's soft-RoCE device bound
//! to ADDR (UDP 4791), connected through its CM to the URL's host and port.
//! `durability write` / `durability check` test that acknowledged flushes survive a power cut
//! (see the `durability` module).

mod durability;

use bytes::Bytes;
use clap::{Parser, Subcommand};
use rand::Rng;
use rtgt_iscsi::IscsiError;
use rtgt_scsi::core::ChapCredentials;
pub(crate) use rtgt_tools::bench::parse_size;
use rtgt_tools::bench::Rw;
use rtgt_tools::iscsi::{self as initiator, IscsiUrl, LoginConfig, Session};
use rtgt_transport::hca::{Hca, HcaConfig};

#[derive(Parser)]
#[command(
    name = "rtgt-iscsi",
    about = "iSCSI initiator: discovery, read, write, bench, durability tests"
)]
struct Cli {
    /// Initiator name.
    #[arg(long, global = true, default_value = "iqn.2025-01.io.rtgt:rtgt-iscsi")]
    initiator_name: String,
    /// Offer CRC32C header digests.
    #[arg(long, global = true)]
    header_digest: bool,
    /// Offer CRC32C data digests.
    #[arg(long, global = true)]
    data_digest: bool,
    /// Name and secret the target must present (mutual CHAP), as NAME%SECRET.
    #[arg(long, global = true)]
    mutual: Option<String>,
    /// Connect over iSER from this local address (rtgt's soft-RoCE device on UDP 4791).
    #[arg(long, global = true)]
    iser: Option<std::net::IpAddr>,
    /// Ethernet MTU of the iSER link (the RDMA path MTU follows: 1024 at 1500, 4096 from 4200).
    #[arg(long, global = true, default_value_t = 1500)]
    eth_mtu: usize,
    /// Microseconds the initiator keeps polling its connection (the TCP socket, or the iSER
    /// device's UDP socket) after data arrived before it sleeps; 0 sleeps at once.
    #[arg(long, global = true, default_value_t = 0)]
    busy_poll: u64,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// SendTargets discovery: HOST[:PORT], optionally USER%SECRET@HOST[:PORT].
    Discover { portal: String },
    /// Reads blocks and writes them to stdout (or a file).
    Read {
        #[arg(long)]
        url: String,
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
        url: String,
        #[arg(long, default_value_t = 0)]
        lba: u64,
        #[arg(long)]
        file: Option<std::path::PathBuf>,
        /// Byte to fill `--blocks` blocks with when no file is given.
        #[arg(long, default_value_t = 0)]
        pattern: u8,
        #[arg(long, default_value_t = 1)]
        blocks: u32,
    },
    /// Runs a fixed-time benchmark and prints IOPS and MB/s.
    Bench {
        #[arg(long)]
        url: String,
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
    /// Session reinstatement, as an initiator that lost its connection performs it: logs in,
    /// keeps READs in flight, logs in again with the same initiator name and ISID; the target
    /// must end the first session (its commands fail, it does not hang) and serve the second.
    Reinstate {
        #[arg(long)]
        url: String,
    },
    /// Power-cut tests: write a pattern with flushes and log the acknowledgements, then check
    /// what survived.
    #[command(subcommand)]
    Durability(durability::DurabilityCmd),
}

fn creds(s: &str) -> ChapCredentials {
    let (user, secret) = s.split_once('%').unwrap_or((s, ""));
    ChapCredentials {
        user: user.to_string(),
        secret: secret.to_string(),
    }
}

fn login_config(cli: &Cli, url: Option<&IscsiUrl>) -> LoginConfig {
    let mut isid = [0x80, 0, 0, 0, 0, 0];
    rand::rng().fill(&mut isid[2..]);
    LoginConfig {
        initiator_name: cli.initiator_name.clone(),
        isid,
        target_name: url.map(|u| u.target.clone()),
        chap: url.and_then(|u| {
            u.user.clone().map(|user| ChapCredentials {
                user,
                secret: u.password.clone().unwrap_or_default(),
            })
        }),
        mutual: cli.mutual.as_deref().map(creds),
        header_digest: cli.header_digest,
        data_digest: cli.data_digest,
        busy_poll: std::time::Duration::from_micros(cli.busy_poll),
        ..LoginConfig::default()
    }
}

/// Where sessions of one URL log in: its address and, for iSER, the device they run on
/// (kept as long as the sessions).
struct Portal {
    u: IscsiUrl,
    addr: std::net::SocketAddr,
    rdma: Option<(Hca, rtgt_transport::verbs::Pd)>,
}

impl Portal {
    async fn new(cli: &Cli, url: &str) -> Result<Portal, IscsiError> {
        let u: IscsiUrl = url.parse()?;
        let addr = initiator::resolve(&u.host, u.port).await?;
        let rdma = match cli.iser {
            None => None,
            Some(local) => {
                let mut hc = HcaConfig::new(vec![local]);
                hc.eth_mtu = cli.eth_mtu;
                hc.busy_poll = std::time::Duration::from_micros(cli.busy_poll);
                let hca =
                    Hca::open(&hc).map_err(|e| IscsiError::Address(format!("RDMA device: {e}")))?;
                let pd = hca
                    .device()
                    .alloc_pd()
                    .map_err(|_| IscsiError::Protocol("RDMA protection domain"))?;
                Some((hca, pd))
            }
        };
        Ok(Portal { u, addr, rdma })
    }

    /// Logs in with `cfg` and clears unit attentions (power on, reset) before real work.
    async fn login(&self, cfg: LoginConfig) -> Result<Session, IscsiError> {
        let s = match &self.rdma {
            None => Session::connect(self.addr, cfg).await?,
            Some((hca, pd)) => Session::connect_iser_cm(hca.cm(), pd, self.addr, cfg).await?,
        };
        for _ in 0..4 {
            if s.command(self.u.lun, &[0u8; 6], None, 0).await?.is_good() {
                break;
            }
        }
        Ok(s)
    }
}

/// A session and the portal it logged in through.
struct Opened {
    s: Session,
    u: IscsiUrl,
    _portal: Portal,
}

async fn open(cli: &Cli, url: &str) -> Result<Opened, IscsiError> {
    let portal = Portal::new(cli, url).await?;
    let s = portal.login(login_config(cli, Some(&portal.u))).await?;
    Ok(Opened {
        s,
        u: portal.u.clone(),
        _portal: portal,
    })
}

/// See [`Cmd::Reinstate`].
async fn reinstate(cli: &Cli, url: &str) -> Result<(), IscsiError> {
    const PATIENCE: std::time::Duration = std::time::Duration::from_secs(20);
    let portal = Portal::new(cli, url).await?;
    let lun = portal.u.lun;
    let cfg = login_config(cli, Some(&portal.u));
    let first = portal.login(cfg.clone()).await?;
    let (bs, _) = capacity(&first, lun).await?;
    // READs kept in flight on the first session until one fails.
    let done = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let reader = {
        let (s, done) = (first.clone(), done.clone());
        tokio::spawn(async move {
            loop {
                match s.command(lun, &rw16(0x88, 0, 8), None, bs * 8).await {
                    Ok(r) if r.is_good() => {
                        done.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                    Ok(r) => return format!("SCSI status 0x{:02x}", r.status),
                    Err(e) => return e.to_string(),
                }
            }
        })
    };
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let before = done.load(std::sync::atomic::Ordering::Relaxed);
    if before == 0 || reader.is_finished() {
        return Err(IscsiError::Protocol(
            "no READ completed on the first session",
        ));
    }
    let second = portal.login(cfg).await?;
    let ended = tokio::time::timeout(PATIENCE, reader)
        .await
        .map_err(|_| IscsiError::Protocol("the first session still runs after reinstatement"))?
        .map_err(|_| IscsiError::Protocol("reader task failed"))?;
    let data = Bytes::from(vec![0xa5u8; (bs * 8) as usize]);
    check(
        &second
            .command(lun, &rw16(0x8a, 64, 8), Some(data.clone()), 0)
            .await?,
    )?;
    let r = second
        .command(lun, &rw16(0x88, 64, 8), None, bs * 8)
        .await?;
    check(&r)?;
    if r.data != data {
        return Err(IscsiError::Protocol(
            "the second session read back other data",
        ));
    }
    println!(
        "reinstated: first session (TSIH {}) ended after {} READs ({ended}); second session \
         (TSIH {}) wrote and read back {} bytes",
        first.tsih(),
        done.load(std::sync::atomic::Ordering::Relaxed),
        second.tsih(),
        data.len()
    );
    first.disconnect().await;
    let _ = second.logout().await;
    Ok(())
}

/// READ CAPACITY(16): (block size, number of blocks).
async fn capacity(s: &Session, lun: u64) -> Result<(u32, u64), IscsiError> {
    let mut cdb = [0u8; 16];
    cdb[0] = 0x9e;
    cdb[1] = 0x10;
    cdb[13] = 32;
    let r = s.command(lun, &cdb, None, 32).await?;
    if !r.is_good() || r.data.len() < 12 {
        return Err(IscsiError::Protocol("READ CAPACITY(16) failed"));
    }
    let last = u64::from_be_bytes(r.data[0..8].try_into().unwrap_or_default());
    let bs = u32::from_be_bytes(r.data[8..12].try_into().unwrap_or_default());
    Ok((bs, last + 1))
}

fn rw16(op: u8, lba: u64, blocks: u32) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = op;
    c[2..10].copy_from_slice(&lba.to_be_bytes());
    c[10..14].copy_from_slice(&blocks.to_be_bytes());
    c
}

fn check(r: &initiator::ScsiResult) -> Result<(), IscsiError> {
    if r.is_good() {
        Ok(())
    } else {
        eprintln!("SCSI status 0x{:02x}, sense {:?}", r.status, r.sense_key());
        Err(IscsiError::Protocol("command failed"))
    }
}

async fn bench(
    cli: &Cli,
    url: &str,
    rw: Rw,
    bs: u64,
    iodepth: usize,
    seconds: u64,
) -> Result<(), IscsiError> {
    let o = open(cli, url).await?;
    let (s, u) = (&o.s, &o.u);
    let (block, blocks) = capacity(s, u.lun).await?;
    if bs == 0 || !bs.is_multiple_of(block as u64) {
        return Err(IscsiError::Address(format!(
            "--bs must be a multiple of the block size {block}"
        )));
    }
    let per_io = (bs / block as u64) as u32;
    let slots = (blocks / per_io as u64).max(1);
    let data = Bytes::from(vec![0x5au8; bs as usize]);
    let (s, lun) = (s.clone(), u.lun);
    let report = rtgt_tools::bench::run(rw, bs, iodepth, seconds, slots, move |slot| {
        let (s, data) = (s.clone(), data.clone());
        async move {
            let lba = slot * per_io as u64;
            let r = if rw.is_read() {
                s.command(lun, &rw16(0x88, lba, per_io), None, bs as u32)
                    .await?
            } else {
                s.command(lun, &rw16(0x8a, lba, per_io), Some(data), 0)
                    .await?
            };
            check(&r)
        }
    })
    .await?;
    println!("{report}");
    let _ = o.s.logout().await;
    Ok(())
}

async fn run(cli: Cli) -> Result<(), IscsiError> {
    match &cli.cmd {
        Cmd::Discover { portal } => {
            let (auth, hostport) = match portal.rsplit_once('@') {
                Some((a, h)) => (Some(creds(a)), h),
                None => (None, portal.as_str()),
            };
            let (host, port) = initiator::split_host_port(hostport)
                .ok_or_else(|| IscsiError::Address(portal.clone()))?;
            let addr = initiator::resolve(&host, port).await?;
            let mut cfg = login_config(&cli, None);
            cfg.chap = auth;
            for t in initiator::discover(addr, cfg).await? {
                for a in &t.addresses {
                    println!("{a} {}", t.name);
                }
                if t.addresses.is_empty() {
                    println!("- {}", t.name);
                }
            }
        }
        Cmd::Read {
            url,
            lba,
            blocks,
            out,
        } => {
            let o = open(&cli, url).await?;
            let (s, u) = (&o.s, &o.u);
            let (bs, _) = capacity(s, u.lun).await?;
            let len = bs * blocks;
            let r = s
                .command(u.lun, &rw16(0x88, *lba, *blocks), None, len)
                .await?;
            check(&r)?;
            rtgt_tools::cli::write_out(&r.data, out.as_deref()).map_err(IscsiError::Address)?;
            let _ = s.logout().await;
        }
        Cmd::Write {
            url,
            lba,
            file,
            pattern,
            blocks,
        } => {
            let o = open(&cli, url).await?;
            let (s, u) = (&o.s, &o.u);
            let (bs, _) = capacity(s, u.lun).await?;
            let data = rtgt_tools::cli::data_in(file.as_deref(), *pattern, *blocks, bs)
                .map_err(IscsiError::Address)?;
            let n = (data.len() / bs as usize) as u32;
            let r = s
                .command(u.lun, &rw16(0x8a, *lba, n), Some(data.into()), 0)
                .await?;
            check(&r)?;
            let _ = s.logout().await;
        }
        Cmd::Bench {
            url,
            rw,
            bs,
            iodepth,
            seconds,
        } => {
            let bs = parse_size(bs).map_err(IscsiError::Address)?;
            bench(&cli, url, *rw, bs, *iodepth, *seconds).await?;
        }
        Cmd::Reinstate { url } => reinstate(&cli, url).await?,
        // Run by main: its errors are not iSCSI errors.
        Cmd::Durability(_) => {}
    }
    Ok(())
}

fn main() {
    let cli = Cli::parse();
    // Over iSER the initiator's soft-RoCE device and its session share one thread, as
    // rtgtd's engine thread does: a completion and the next command never hop between cores.
    let multi_thread = cli.iser.is_none();
    rtgt_tools::cli::main("rtgt-iscsi", multi_thread, async move {
        match &cli.cmd {
            Cmd::Durability(d) => durability::run(&cli, d).await,
            _ => run(cli).await.map_err(|e| e.to_string()),
        }
    });
}
