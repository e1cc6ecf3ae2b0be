//! `rtgt-iscsi durability write|check`: does a LUN keep what it acknowledged as durable?
//!
//! `write` writes every chunk of a region once, in a scattered order, with several commands in
//! flight, a SYNCHRONIZE CACHE after every so many acknowledged writes and FUA on some writes,
//! until it is stopped (SIGTERM, SIGINT, `--seconds`) or the connection ends; after SIGUSR1 it
//! sends plain writes only. Every sector
//! describes itself (see [`fill_sector`]); every acknowledgement goes to a log. After the
//! target lost power, `check` reads the region back and applies [`Log::analyse`]'s rule: a
//! write acknowledged before an acknowledged SYNCHRONIZE CACHE was sent, an acknowledged FUA
//! write, and with WCE=0 any acknowledged write must read back intact; the other sectors may
//! hold the new data or zeroes, nothing else.
//!
//! Log format (text, one event a line, in the order the writer saw them):
//!
//! ```text
//! rtgt-durability 1 run=<hex> block_size=512 chunk_blocks=8 start_lba=0 chunks=N iodepth=8 wce=1
//! W <seq> <lba> <fua 0|1>   write <seq> (chunk at <lba>) acknowledged with GOOD status
//! S <n>                     SYNCHRONIZE CACHE <n> about to be sent
//! F <n>                     SYNCHRONIZE CACHE <n> acknowledged with GOOD status
//! E <text>                  the writer's end
//! ```

use std::collections::HashSet;
use std::fmt::Write as _;
use std::io::{BufWriter, Write as _};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::{Args, Subcommand};
use rtgt_iscsi::IscsiError;
use rtgt_tools::iscsi::{ScsiResult, Session};
use tokio::signal::unix::{signal, SignalKind};
use tokio::task::JoinSet;

use crate::{capacity, open, parse_size, rw16, Cli};

/// First bytes of every sector the writer produces.
pub const MAGIC: [u8; 8] = *b"RTGTDUR1";
/// Bytes of the self-describing header: magic, run id, LBA, sequence number.
const HEADER: usize = 32;
const LOG_VERSION: &str = "rtgt-durability 1";

#[derive(Subcommand)]
pub enum DurabilityCmd {
    /// Writes a region once with flushes and FUA writes, logging every acknowledgement.
    Write(WriteArgs),
    /// Reads the region back and checks it against the log of `write`.
    Check(CheckArgs),
}

#[derive(Args)]
pub struct WriteArgs {
    #[arg(long)]
    url: String,
    /// The log of acknowledgements (created; must not exist).
    #[arg(long)]
    log: PathBuf,
    /// Bytes per write (a multiple of the block size), e.g. 4k.
    #[arg(long, default_value = "4k")]
    bs: String,
    /// First byte of the region (a multiple of the block size).
    #[arg(long, default_value = "0")]
    offset: String,
    /// Bytes of the region; default up to the end of the LUN.
    #[arg(long)]
    size: Option<String>,
    /// Writes in flight.
    #[arg(long, default_value_t = 8)]
    iodepth: usize,
    /// Send a SYNCHRONIZE CACHE after this many acknowledged writes (0: never).
    #[arg(long, default_value_t = 200)]
    sync_every: u64,
    /// Set FUA on every Nth write (0: never).
    #[arg(long, default_value_t = 50)]
    fua_every: u64,
    /// Stop after this many seconds (0: only on SIGTERM, SIGINT or the end of the connection).
    #[arg(long, default_value_t = 0)]
    seconds: u64,
}

#[derive(Args)]
pub struct CheckArgs {
    #[arg(long)]
    url: String,
    /// The log written by `durability write`.
    #[arg(long)]
    log: PathBuf,
    /// Fail unless the log holds at least this many acknowledged SYNCHRONIZE CACHE.
    #[arg(long, default_value_t = 1)]
    min_flushes: u64,
    /// Fail unless at least this many writes were acknowledged after the last acknowledged
    /// SYNCHRONIZE CACHE was sent (the cut came while the writer was busy).
    #[arg(long, default_value_t = 1)]
    min_after_flush: u64,
    /// Fail unless at least this many acknowledged writes had to survive.
    #[arg(long, default_value_t = 1)]
    min_required: u64,
    /// Bytes per read.
    #[arg(long, default_value = "1m")]
    read_size: String,
}

pub async fn run(cli: &Cli, cmd: &DurabilityCmd) -> Result<(), String> {
    match cmd {
        DurabilityCmd::Write(a) => write(cli, a).await,
        DurabilityCmd::Check(a) => check(cli, a).await,
    }
}

// --- sector contents -----------------------------------------------------------------------

fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn filler_seed(run: u64, lba: u64, seq: u64) -> u64 {
    run ^ lba.rotate_left(17) ^ seq.wrapping_mul(0x2545_f491_4f6c_dd1d)
}

/// Fills one sector: magic, run id, its LBA, the write's sequence number (little endian), then
/// a pseudo-random filler derived from the three.
pub fn fill_sector(buf: &mut [u8], run: u64, lba: u64, seq: u64) {
    buf[0..8].copy_from_slice(&MAGIC);
    buf[8..16].copy_from_slice(&run.to_le_bytes());
    buf[16..24].copy_from_slice(&lba.to_le_bytes());
    buf[24..32].copy_from_slice(&seq.to_le_bytes());
    let mut st = filler_seed(run, lba, seq);
    for c in buf[HEADER..].chunks_mut(8) {
        let v = splitmix64(&mut st).to_le_bytes();
        c.copy_from_slice(&v[..c.len()]);
    }
}

/// What a sector read back holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sector {
    /// Never written (or the write was lost).
    Zero,
    /// Written by write `seq` of this run, intact.
    Written(u64),
    /// Anything else: another run's data, another LBA's, a torn or corrupted sector.
    Foreign,
}

pub fn classify(buf: &[u8], run: u64, lba: u64) -> Sector {
    if buf.iter().all(|&b| b == 0) {
        return Sector::Zero;
    }
    if buf.len() < HEADER || buf[0..8] != MAGIC {
        return Sector::Foreign;
    }
    let word = |i: usize| u64::from_le_bytes(buf[i..i + 8].try_into().unwrap_or_default());
    if word(8) != run || word(16) != lba {
        return Sector::Foreign;
    }
    let seq = word(24);
    let mut st = filler_seed(run, lba, seq);
    for c in buf[HEADER..].chunks(8) {
        let v = splitmix64(&mut st).to_le_bytes();
        if c != &v[..c.len()] {
            return Sector::Foreign;
        }
    }
    Sector::Written(seq)
}

/// The chunk written by write `seq`: a scattered order (a fixed stride coprime with the
/// number of chunks), so that consecutive writes land far apart.
pub fn chunk_of(seq: u64, chunks: u64) -> u64 {
    (seq.wrapping_mul(stride(chunks))) % chunks.max(1)
}

fn stride(chunks: u64) -> u64 {
    fn gcd(a: u64, b: u64) -> u64 {
        if b == 0 {
            a
        } else {
            gcd(b, a % b)
        }
    }
    let mut s = (chunks / 2 + chunks / 7).max(1) | 1;
    while chunks > 1 && gcd(s, chunks) != 1 {
        s += 2;
    }
    s
}

// --- the log -------------------------------------------------------------------------------

/// The header line of a log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub run: u64,
    pub block_size: u32,
    pub chunk_blocks: u32,
    pub start_lba: u64,
    pub chunks: u64,
    pub iodepth: usize,
    /// The LUN's write cache (caching mode page WCE) when the writer started.
    pub wce: bool,
}

impl Header {
    fn line(&self) -> String {
        format!(
            "{LOG_VERSION} run={:016x} block_size={} chunk_blocks={} start_lba={} chunks={} iodepth={} wce={}",
            self.run,
            self.block_size,
            self.chunk_blocks,
            self.start_lba,
            self.chunks,
            self.iodepth,
            u8::from(self.wce)
        )
    }

    fn parse(line: &str) -> Result<Header, String> {
        let rest = line.strip_prefix(LOG_VERSION).ok_or_else(|| {
            format!("not a durability log (first line is not '{LOG_VERSION} ...')")
        })?;
        let mut h = Header {
            run: 0,
            block_size: 0,
            chunk_blocks: 0,
            start_lba: 0,
            chunks: 0,
            iodepth: 0,
            wce: true,
        };
        let mut seen = HashSet::new();
        for kv in rest.split_whitespace() {
            let (k, v) = kv
                .split_once('=')
                .ok_or_else(|| format!("header: '{kv}' is not KEY=VALUE"))?;
            let bad = || format!("header: bad value for {k}: '{v}'");
            match k {
                "run" => h.run = u64::from_str_radix(v, 16).map_err(|_| bad())?,
                "block_size" => h.block_size = v.parse().map_err(|_| bad())?,
                "chunk_blocks" => h.chunk_blocks = v.parse().map_err(|_| bad())?,
                "start_lba" => h.start_lba = v.parse().map_err(|_| bad())?,
                "chunks" => h.chunks = v.parse().map_err(|_| bad())?,
                "iodepth" => h.iodepth = v.parse().map_err(|_| bad())?,
                "wce" => {
                    h.wce = match v {
                        "0" => false,
                        "1" => true,
                        _ => return Err(bad()),
                    }
                }
                _ => return Err(format!("header: unknown key '{k}'")),
            }
            seen.insert(k.to_string());
        }
        for k in [
            "run",
            "block_size",
            "chunk_blocks",
            "start_lba",
            "chunks",
            "iodepth",
            "wce",
        ] {
            if !seen.contains(k) {
                return Err(format!("header: {k} missing"));
            }
        }
        if h.block_size < HEADER as u32 || h.chunk_blocks == 0 || h.chunks == 0 {
            return Err("header: block_size, chunk_blocks or chunks out of range".into());
        }
        Ok(h)
    }

    pub fn chunk_lba(&self, chunk: u64) -> u64 {
        self.start_lba + chunk * self.chunk_blocks as u64
    }
}

/// One logged event after the header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    Write { seq: u64, lba: u64, fua: bool },
    SyncSent(u64),
    SyncDone(u64),
    End(String),
}

impl Event {
    fn parse(line: &str) -> Result<Event, String> {
        let mut f = line.split_whitespace();
        let tag = f.next().unwrap_or("");
        let mut num = |what: &str| -> Result<u64, String> {
            f.next()
                .ok_or_else(|| format!("{what} missing"))?
                .parse()
                .map_err(|_| format!("bad {what}"))
        };
        match tag {
            "W" => {
                let seq = num("sequence number")?;
                let lba = num("LBA")?;
                let fua = match num("FUA flag")? {
                    0 => false,
                    1 => true,
                    _ => return Err("bad FUA flag".into()),
                };
                Ok(Event::Write { seq, lba, fua })
            }
            "S" => Ok(Event::SyncSent(num("flush number")?)),
            "F" => Ok(Event::SyncDone(num("flush number")?)),
            "E" => Ok(Event::End(line[1..].trim().to_string())),
            _ => Err(format!("unknown event '{tag}'")),
        }
    }

    fn line(&self) -> String {
        match self {
            Event::Write { seq, lba, fua } => format!("W {seq} {lba} {}", u8::from(*fua)),
            Event::SyncSent(n) => format!("S {n}"),
            Event::SyncDone(n) => format!("F {n}"),
            Event::End(t) => format!("E {t}"),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Log {
    pub header: Header,
    pub events: Vec<Event>,
}

/// Why an acknowledged write must have survived.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Required {
    /// Acknowledged before an acknowledged SYNCHRONIZE CACHE was sent.
    Flushed,
    /// Written with FUA.
    Fua,
    /// The write cache was off (WCE=0): every acknowledged write is durable.
    WriteThrough,
}

/// An acknowledged write and whether it must be intact.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Acked {
    pub seq: u64,
    pub chunk: u64,
    pub required: Option<Required>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Analysis {
    pub acked: Vec<Acked>,
    pub flushes: u64,
    /// Acknowledged writes logged after the last acknowledged flush was sent.
    pub after_last_flush: u64,
    pub end: Option<String>,
}

impl Log {
    pub fn parse(text: &str) -> Result<Log, String> {
        let mut lines = text.lines();
        let header = Header::parse(lines.next().ok_or("empty log")?)?;
        let mut events = Vec::new();
        for (i, line) in lines.enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            events.push(Event::parse(line).map_err(|e| format!("line {}: {e}", i + 2))?);
        }
        Ok(Log { header, events })
    }

    pub fn read(path: &Path) -> Result<Log, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        Log::parse(&text).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// Applies the durability rule: which acknowledged writes must read back intact.
    /// A flush covers the writes logged before its `S` line, once its `F` line exists.
    pub fn analyse(&self) -> Result<Analysis, String> {
        let h = &self.header;
        let done: HashSet<u64> = self
            .events
            .iter()
            .filter_map(|e| match e {
                Event::SyncDone(n) => Some(*n),
                _ => None,
            })
            .collect();
        // Position (index in events) of the last S line whose flush was acknowledged.
        let mut cover = 0;
        let mut sent = HashSet::new();
        for (i, e) in self.events.iter().enumerate() {
            match e {
                Event::SyncSent(n) => {
                    if !sent.insert(*n) {
                        return Err(format!("flush {n} sent twice"));
                    }
                    if done.contains(n) {
                        cover = i;
                    }
                }
                Event::SyncDone(n) if !sent.contains(n) => {
                    return Err(format!("flush {n} acknowledged before it was sent"));
                }
                _ => {}
            }
        }
        let mut a = Analysis {
            flushes: done.len() as u64,
            ..Analysis::default()
        };
        let mut seen = HashSet::new();
        for (i, e) in self.events.iter().enumerate() {
            match e {
                Event::Write { seq, lba, fua } => {
                    let chunk = chunk_of(*seq, h.chunks);
                    if h.chunk_lba(chunk) != *lba {
                        return Err(format!(
                            "write {seq}: LBA {lba} is not its chunk's ({})",
                            h.chunk_lba(chunk)
                        ));
                    }
                    if *seq >= h.chunks || !seen.insert(*seq) {
                        return Err(format!("write {seq} out of range or logged twice"));
                    }
                    let required = if !h.wce {
                        Some(Required::WriteThrough)
                    } else if *fua {
                        Some(Required::Fua)
                    } else if i < cover {
                        Some(Required::Flushed)
                    } else {
                        None
                    };
                    if i > cover || a.flushes == 0 {
                        a.after_last_flush += 1;
                    }
                    a.acked.push(Acked {
                        seq: *seq,
                        chunk,
                        required,
                    });
                }
                Event::End(t) => a.end = Some(t.clone()),
                _ => {}
            }
        }
        Ok(a)
    }
}

// --- write -----------------------------------------------------------------------------------

fn io(what: &str) -> impl Fn(IscsiError) -> String + '_ {
    move |e| format!("{what}: {e}")
}

/// The region of a LUN: (first LBA, chunks, blocks per chunk).
fn region(
    bs: u32,
    blocks: u64,
    chunk: &str,
    offset: &str,
    size: Option<&str>,
) -> Result<(u64, u64, u32), String> {
    let chunk = parse_size(chunk)?;
    let offset = parse_size(offset)?;
    let bs64 = bs as u64;
    if chunk == 0 || !chunk.is_multiple_of(bs64) || chunk > 1 << 20 {
        return Err(format!(
            "--bs must be a multiple of the block size {bs}, at most 1m"
        ));
    }
    if !offset.is_multiple_of(bs64) {
        return Err(format!(
            "--offset must be a multiple of the block size {bs}"
        ));
    }
    let end = blocks * bs64;
    let size = match size {
        Some(s) => parse_size(s)?,
        None => end.saturating_sub(offset),
    };
    if offset.checked_add(size).is_none_or(|e| e > end) {
        return Err(format!("the region ends beyond the LUN ({end} bytes)"));
    }
    let chunks = size / chunk;
    if chunks == 0 {
        return Err("the region holds no chunk".into());
    }
    Ok((offset / bs64, chunks, (chunk / bs64) as u32))
}

/// The write cache enable bit of the caching mode page (MODE SENSE(10), page 08h).
async fn write_cache_enabled(s: &Session, lun: u64) -> Result<bool, String> {
    let cdb = [0x5a, 0x08, 0x08, 0, 0, 0, 0, 0, 64, 0];
    let r = s
        .command(lun, &cdb, None, 64)
        .await
        .map_err(io("MODE SENSE"))?;
    if !r.is_good() || r.data.len() < 8 {
        return Err(format!("MODE SENSE(10) failed: status 0x{:02x}", r.status));
    }
    let bd = u16::from_be_bytes([r.data[6], r.data[7]]) as usize;
    let page = r
        .data
        .get(8 + bd..8 + bd + 3)
        .ok_or("MODE SENSE(10): no caching mode page in the answer")?;
    if page[0] & 0x3f != 0x08 {
        return Err(format!(
            "MODE SENSE(10): page 0x{:02x} instead of the caching page",
            page[0] & 0x3f
        ));
    }
    Ok(page[2] & 0x04 != 0)
}

enum Done {
    Write { seq: u64, lba: u64, fua: bool },
    Sync(u64),
}

struct LogFile {
    w: BufWriter<std::fs::File>,
    path: PathBuf,
}

impl LogFile {
    fn put(&mut self, line: &str) -> Result<(), String> {
        writeln!(self.w, "{line}").map_err(|e| format!("{}: {e}", self.path.display()))
    }
}

async fn write(cli: &Cli, a: &WriteArgs) -> Result<(), String> {
    if a.iodepth == 0 || a.iodepth > 256 {
        return Err("--iodepth must be between 1 and 256".into());
    }
    let o = open(cli, &a.url).await.map_err(io("login"))?;
    let (s, lun) = (o.s.clone(), o.u.lun);
    let (bs, blocks) = capacity(&s, lun).await.map_err(io("READ CAPACITY"))?;
    let (start_lba, chunks, chunk_blocks) =
        region(bs, blocks, &a.bs, &a.offset, a.size.as_deref())?;
    let h = Header {
        run: rand::random(),
        block_size: bs,
        chunk_blocks,
        start_lba,
        chunks,
        iodepth: a.iodepth,
        wce: write_cache_enabled(&s, lun).await?,
    };
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&a.log)
        .map_err(|e| format!("cannot create the log {}: {e}", a.log.display()))?;
    let mut log = LogFile {
        w: BufWriter::new(file),
        path: a.log.clone(),
    };
    log.put(&h.line())?;

    let mut term = signal(SignalKind::terminate()).map_err(|e| format!("SIGTERM: {e}"))?;
    let mut int = signal(SignalKind::interrupt()).map_err(|e| format!("SIGINT: {e}"))?;
    let mut usr1 = signal(SignalKind::user_defined1()).map_err(|e| format!("SIGUSR1: {e}"))?;
    // After SIGUSR1: plain writes only, so that the log ends with writes no flush covers.
    let mut plain = false;
    let deadline = (a.seconds > 0).then(|| Instant::now() + Duration::from_secs(a.seconds));
    let mut set: JoinSet<Result<(Done, Status), IscsiError>> = JoinSet::new();
    let (mut seq, mut flush_n, mut since_sync, mut sync_busy) = (0u64, 0u64, 0u64, false);
    let (mut acked, mut fua_acked, mut flushes) = (0u64, 0u64, 0u64);
    let end = loop {
        if seq >= chunks && set.is_empty() {
            break "the region is full".to_string();
        }
        while set.len() < a.iodepth + usize::from(sync_busy) {
            if !plain && a.sync_every > 0 && since_sync >= a.sync_every && !sync_busy {
                flush_n += 1;
                log.put(&Event::SyncSent(flush_n).line())?;
                let (s, n) = (s.clone(), flush_n);
                set.spawn(async move {
                    let cdb = [0x35, 0, 0, 0, 0, 0, 0, 0, 0, 0];
                    let r = s.command(lun, &cdb, None, 0).await?;
                    Ok((Done::Sync(n), Status::from(&r)))
                });
                since_sync = 0;
                sync_busy = true;
                continue;
            }
            if seq >= chunks {
                break;
            }
            let lba = h.chunk_lba(chunk_of(seq, chunks));
            let fua = !plain && a.fua_every > 0 && seq % a.fua_every == a.fua_every - 1;
            let mut data = vec![0u8; (chunk_blocks * bs) as usize];
            for (i, sector) in data.chunks_mut(bs as usize).enumerate() {
                fill_sector(sector, h.run, lba + i as u64, seq);
            }
            let mut cdb = rw16(0x8a, lba, chunk_blocks);
            if fua {
                cdb[1] |= 0x08;
            }
            let (s, this) = (s.clone(), seq);
            set.spawn(async move {
                let r = s.command(lun, &cdb, Some(Bytes::from(data)), 0).await?;
                Ok((
                    Done::Write {
                        seq: this,
                        lba,
                        fua,
                    },
                    Status::from(&r),
                ))
            });
            seq += 1;
        }
        let sleep = async {
            match deadline {
                Some(d) => tokio::time::sleep_until(d.into()).await,
                None => std::future::pending().await,
            }
        };
        let joined = tokio::select! {
            j = set.join_next() => j,
            _ = term.recv() => break "stopped by SIGTERM".to_string(),
            _ = int.recv() => break "stopped by SIGINT".to_string(),
            _ = usr1.recv() => {
                plain = true;
                continue;
            }
            _ = sleep => break format!("stopped after {} s", a.seconds),
        };
        let Some(joined) = joined else { continue };
        let (done, r) = match joined {
            Ok(Ok(x)) => x,
            Ok(Err(e)) => break format!("connection ended: {e}"),
            Err(e) => return Err(format!("a command task failed: {e}")),
        };
        if !r.good {
            let what = match done {
                Done::Write { lba, .. } => format!("WRITE(16) at LBA {lba}"),
                Done::Sync(_) => "SYNCHRONIZE CACHE(10)".to_string(),
            };
            let _ = log.put(&Event::End(format!("{what} failed: {}", r.text)).line());
            let _ = log.w.flush();
            return Err(format!("{what} failed: {}", r.text));
        }
        match done {
            Done::Write { seq, lba, fua } => {
                log.put(&Event::Write { seq, lba, fua }.line())?;
                acked += 1;
                if acked % 16 == 0 {
                    // Let a watcher of the log see the progress.
                    log.w
                        .flush()
                        .map_err(|e| format!("{}: {e}", a.log.display()))?;
                }
                fua_acked += u64::from(fua);
                since_sync += 1;
            }
            Done::Sync(n) => {
                log.put(&Event::SyncDone(n).line())?;
                // Let a watcher of the log see the progress.
                log.w
                    .flush()
                    .map_err(|e| format!("{}: {e}", a.log.display()))?;
                flushes += 1;
                sync_busy = false;
            }
        }
    };
    log.put(&Event::End(end.clone()).line())?;
    log.w
        .flush()
        .map_err(|e| format!("{}: {e}", a.log.display()))?;
    println!(
        "durability write: {acked} writes acknowledged ({fua_acked} with FUA), {flushes} \
         SYNCHRONIZE CACHE acknowledged, wce={}; {end}",
        u8::from(h.wce)
    );
    // The session is left as it is: after a power cut there is nobody to log out from.
    if !end.starts_with("connection") {
        set.abort_all();
        let _ = tokio::time::timeout(Duration::from_secs(2), s.logout()).await;
    }
    Ok(())
}

/// The outcome of a command as the writer and the checker report it.
struct Status {
    good: bool,
    text: String,
}

impl From<&ScsiResult> for Status {
    fn from(r: &ScsiResult) -> Status {
        let text = match r.sense_key() {
            Some((k, asc, ascq)) => format!(
                "status 0x{:02x}, sense key 0x{k:x} ASC 0x{asc:02x} ASCQ 0x{ascq:02x}",
                r.status
            ),
            None => format!("response {}, status 0x{:02x}", r.response, r.status),
        };
        Status {
            good: r.is_good(),
            text,
        }
    }
}

// --- check -----------------------------------------------------------------------------------

/// What the read-back found.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Verdict {
    pub required: u64,
    pub required_lost: u64,
    /// Lost required writes by reason (flushed, FUA, write-through).
    pub lost_by: [u64; 3],
    pub required_by: [u64; 3],
    pub unflushed: u64,
    pub unflushed_lost: u64,
    /// Chunks found written by a write that was never acknowledged (in flight at the cut).
    pub unacked_found: u64,
    /// Sectors holding neither zeroes nor their own pattern, or another write's.
    pub corrupt: u64,
    pub first_problems: Vec<String>,
}

fn reason_index(r: Required) -> usize {
    match r {
        Required::Flushed => 0,
        Required::Fua => 1,
        Required::WriteThrough => 2,
    }
}

/// Judges the region read back (`sector(i)` returns sector `i` of the region).
pub fn judge<'a>(h: &Header, a: &Analysis, sector: impl Fn(u64) -> &'a [u8]) -> Verdict {
    let mut v = Verdict::default();
    let cb = h.chunk_blocks as u64;
    let mut acked_seq = vec![None; h.chunks as usize];
    for w in &a.acked {
        acked_seq[w.chunk as usize] = Some(*w);
    }
    let note = |v: &mut Verdict, s: String| {
        if v.first_problems.len() < 10 {
            v.first_problems.push(s);
        }
    };
    for chunk in 0..h.chunks {
        let lba0 = h.chunk_lba(chunk);
        let mut written = 0;
        let mut zero = 0;
        for i in 0..cb {
            let lba = lba0 + i;
            match classify(sector(chunk * cb + i), h.run, lba) {
                Sector::Zero => zero += 1,
                Sector::Written(seq) => {
                    let expected = acked_seq[chunk as usize].map(|w| w.seq).unwrap_or(seq);
                    if seq != expected || chunk_of(seq, h.chunks) != chunk {
                        v.corrupt += 1;
                        note(
                            &mut v,
                            format!("LBA {lba}: data of write {seq}, not {expected}"),
                        );
                    } else {
                        written += 1;
                    }
                }
                Sector::Foreign => {
                    v.corrupt += 1;
                    note(&mut v, format!("LBA {lba}: neither zeroes nor its pattern"));
                }
            }
        }
        let intact = written == cb;
        match acked_seq[chunk as usize] {
            Some(w) => match w.required {
                Some(r) => {
                    v.required += 1;
                    v.required_by[reason_index(r)] += 1;
                    if !intact {
                        v.required_lost += 1;
                        v.lost_by[reason_index(r)] += 1;
                        note(
                            &mut v,
                            format!(
                                "write {} (LBA {lba0}, {r:?}): {written} of {cb} sectors intact, {zero} zero",
                                w.seq
                            ),
                        );
                    }
                }
                None => {
                    v.unflushed += 1;
                    if !intact {
                        v.unflushed_lost += 1;
                    }
                }
            },
            None if written > 0 => v.unacked_found += 1,
            None => {}
        }
    }
    v
}

async fn check(cli: &Cli, a: &CheckArgs) -> Result<(), String> {
    let log = Log::read(&a.log)?;
    let an = log
        .analyse()
        .map_err(|e| format!("{}: {e}", a.log.display()))?;
    let h = log.header;
    let read_size = parse_size(&a.read_size)?;
    let o = open(cli, &a.url).await.map_err(io("login"))?;
    let (s, lun) = (o.s.clone(), o.u.lun);
    let (bs, blocks) = capacity(&s, lun).await.map_err(io("READ CAPACITY"))?;
    if bs != h.block_size {
        return Err(format!(
            "the LUN's block size is {bs}, the log's {}",
            h.block_size
        ));
    }
    let total = h.chunks * h.chunk_blocks as u64;
    if h.start_lba + total > blocks {
        return Err(format!(
            "the log's region ends beyond the LUN ({blocks} blocks)"
        ));
    }
    if read_size < bs as u64 || read_size > 16 << 20 {
        return Err(format!(
            "--read-size must be between the block size {bs} and 16m"
        ));
    }
    let per_read = (read_size / bs as u64) as u32;
    let mut data = vec![0u8; (total * bs as u64) as usize];
    let mut set = JoinSet::new();
    let mut next = 0u64;
    loop {
        while set.len() < 4 && next < total {
            let n = per_read.min((total - next) as u32);
            let (s, at) = (s.clone(), next);
            set.spawn(async move {
                let r = s
                    .command(lun, &rw16(0x88, h.start_lba + at, n), None, n * bs)
                    .await;
                (at, n, r)
            });
            next += n as u64;
        }
        let Some(j) = set.join_next().await else {
            break;
        };
        let (at, n, r) = j.map_err(|e| format!("a read task failed: {e}"))?;
        let r = r.map_err(io("READ(16)"))?;
        let len = (n * bs) as usize;
        if !r.is_good() || r.data.len() < len {
            return Err(format!(
                "READ(16) at LBA {}: {}",
                h.start_lba + at,
                Status::from(&r).text
            ));
        }
        let off = (at * bs as u64) as usize;
        data[off..off + len].copy_from_slice(&r.data[..len]);
    }
    let _ = s.logout().await;
    let bsz = bs as usize;
    let v = judge(&h, &an, |i| &data[i as usize * bsz..(i as usize + 1) * bsz]);
    let mut out = String::new();
    let _ = write!(
        out,
        "durability check: wce={} acked={} flushes={} after-last-flush={}; required={} \
         (flushed {}, fua {}, write-through {}) intact={} lost={}; not required={} lost={}; \
         unacknowledged found written={}; corrupt sectors={}",
        u8::from(h.wce),
        an.acked.len(),
        an.flushes,
        an.after_last_flush,
        v.required,
        v.required_by[0],
        v.required_by[1],
        v.required_by[2],
        v.required - v.required_lost,
        v.required_lost,
        v.unflushed,
        v.unflushed_lost,
        v.unacked_found,
        v.corrupt
    );
    if let Some(e) = &an.end {
        let _ = write!(out, "; writer: {e}");
    }
    println!("{out}");
    for p in &v.first_problems {
        println!("  {p}");
    }
    let mut fail = Vec::new();
    if v.required_lost > 0 {
        fail.push(format!(
            "{} writes that had to be durable were lost (flushed {}, fua {}, write-through {})",
            v.required_lost, v.lost_by[0], v.lost_by[1], v.lost_by[2]
        ));
    }
    if v.corrupt > 0 {
        fail.push(format!("{} sectors hold foreign data", v.corrupt));
    }
    if an.flushes < a.min_flushes {
        fail.push(format!(
            "only {} acknowledged flushes (--min-flushes {})",
            an.flushes, a.min_flushes
        ));
    }
    if v.required < a.min_required {
        fail.push(format!(
            "only {} writes had to survive (--min-required {})",
            v.required, a.min_required
        ));
    }
    if an.after_last_flush < a.min_after_flush {
        fail.push(format!(
            "only {} writes acknowledged after the last flush (--min-after-flush {})",
            an.after_last_flush, a.min_after_flush
        ));
    }
    if fail.is_empty() {
        Ok(())
    } else {
        Err(fail.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(chunks: u64, wce: bool) -> Header {
        Header {
            run: 0x1234_5678_9abc_def0,
            block_size: 512,
            chunk_blocks: 2,
            start_lba: 100,
            chunks,
            iodepth: 4,
            wce,
        }
    }

    fn w(h: &Header, seq: u64, fua: bool) -> Event {
        Event::Write {
            seq,
            lba: h.chunk_lba(chunk_of(seq, h.chunks)),
            fua,
        }
    }

    fn log_text(h: &Header, events: &[Event]) -> String {
        let mut s = h.line() + "\n";
        for e in events {
            s += &e.line();
            s.push('\n');
        }
        s
    }

    fn required(a: &Analysis) -> Vec<(u64, Option<Required>)> {
        a.acked.iter().map(|x| (x.seq, x.required)).collect()
    }

    #[test]
    fn order_visits_every_chunk_once() {
        for chunks in [1u64, 2, 3, 7, 10, 64, 1000, 65536, 12345] {
            let mut seen = vec![false; chunks as usize];
            for seq in 0..chunks {
                let c = chunk_of(seq, chunks) as usize;
                assert!(!seen[c], "chunk {c} twice for {chunks}");
                seen[c] = true;
            }
        }
    }

    #[test]
    fn sectors_describe_themselves() {
        let mut b = vec![0u8; 512];
        fill_sector(&mut b, 7, 42, 9);
        assert_eq!(classify(&b, 7, 42), Sector::Written(9));
        assert_eq!(classify(&b, 8, 42), Sector::Foreign);
        assert_eq!(classify(&b, 7, 43), Sector::Foreign);
        b[300] ^= 1;
        assert_eq!(classify(&b, 7, 42), Sector::Foreign);
        assert_eq!(classify(&[0u8; 512], 7, 42), Sector::Zero);
        let mut big = vec![0u8; 4096];
        fill_sector(&mut big, 7, 1, 2);
        assert_eq!(classify(&big, 7, 1), Sector::Written(2));
    }

    #[test]
    fn header_and_events_round_trip() {
        let h = header(10, true);
        let ev = vec![
            w(&h, 0, false),
            Event::SyncSent(1),
            w(&h, 1, true),
            Event::SyncDone(1),
            Event::End("stopped by SIGTERM".into()),
        ];
        let log = Log::parse(&log_text(&h, &ev)).unwrap();
        assert_eq!(log.header, h);
        assert_eq!(log.events, ev);
    }

    #[test]
    fn bad_logs_are_refused_with_a_reason() {
        let h = header(10, true);
        assert!(Log::parse("").unwrap_err().contains("empty"));
        assert!(Log::parse("hello\n")
            .unwrap_err()
            .contains("not a durability log"));
        let no_wce = h.line().replace(" wce=1", "");
        assert!(Log::parse(&no_wce).unwrap_err().contains("wce missing"));
        let bad = log_text(&h, &[]) + "W 1 x 0\n";
        assert!(Log::parse(&bad).unwrap_err().contains("line 2: bad LBA"));
        let bad = log_text(&h, &[]) + "Q 1\n";
        assert!(Log::parse(&bad).unwrap_err().contains("unknown event"));
        let wrong_lba = log_text(
            &h,
            &[Event::Write {
                seq: 1,
                lba: 5,
                fua: false,
            }],
        );
        assert!(Log::parse(&wrong_lba).unwrap().analyse().is_err());
        let twice = log_text(&h, &[w(&h, 1, false), w(&h, 1, false)]);
        assert!(Log::parse(&twice).unwrap().analyse().is_err());
        let early = log_text(&h, &[Event::SyncDone(1), Event::SyncSent(1)]);
        assert!(Log::parse(&early).unwrap().analyse().is_err());
    }

    #[test]
    fn a_flush_covers_writes_acknowledged_before_it_was_sent() {
        let h = header(20, true);
        let ev = vec![
            w(&h, 0, false),
            w(&h, 1, false),
            Event::SyncSent(1),
            w(&h, 2, false), // acknowledged while flush 1 ran: not covered by it
            Event::SyncDone(1),
            w(&h, 3, true), // FUA
            Event::SyncSent(2),
            w(&h, 4, false),
            Event::SyncSent(3), // never acknowledged: covers nothing
            w(&h, 5, false),
        ];
        let log = Log::parse(&log_text(&h, &ev)).unwrap();
        let a = log.analyse().unwrap();
        assert_eq!(a.flushes, 1);
        assert_eq!(
            required(&a),
            vec![
                (0, Some(Required::Flushed)),
                (1, Some(Required::Flushed)),
                (2, None),
                (3, Some(Required::Fua)),
                (4, None),
                (5, None),
            ]
        );
        assert_eq!(a.after_last_flush, 4);

        // Flush 2's acknowledgement covers writes 2 and 3 as well.
        let mut ev2 = ev.clone();
        ev2.push(Event::SyncDone(2));
        let a = Log::parse(&log_text(&h, &ev2)).unwrap().analyse().unwrap();
        assert_eq!(
            required(&a),
            vec![
                (0, Some(Required::Flushed)),
                (1, Some(Required::Flushed)),
                (2, Some(Required::Flushed)),
                (3, Some(Required::Fua)),
                (4, None),
                (5, None),
            ]
        );
        assert_eq!(a.after_last_flush, 2);
    }

    #[test]
    fn without_write_cache_every_acknowledged_write_is_required() {
        let h = header(5, false);
        let ev = vec![w(&h, 0, false), w(&h, 1, true), w(&h, 2, false)];
        let a = Log::parse(&log_text(&h, &ev)).unwrap().analyse().unwrap();
        assert!(a
            .acked
            .iter()
            .all(|x| x.required == Some(Required::WriteThrough)));
        assert_eq!(a.flushes, 0);
        assert_eq!(a.after_last_flush, 3);
    }

    /// A region image: `written` chunks hold their data, the rest zeroes.
    fn image(h: &Header, written: &[u64]) -> Vec<u8> {
        let bs = h.block_size as usize;
        let cb = h.chunk_blocks as u64;
        let mut d = vec![0u8; (h.chunks * cb) as usize * bs];
        for &seq in written {
            let chunk = chunk_of(seq, h.chunks);
            for i in 0..cb {
                let idx = (chunk * cb + i) as usize;
                fill_sector(
                    &mut d[idx * bs..(idx + 1) * bs],
                    h.run,
                    h.chunk_lba(chunk) + i,
                    seq,
                );
            }
        }
        d
    }

    #[test]
    fn judge_counts_lost_and_corrupt_sectors() {
        let h = header(8, true);
        let ev = vec![
            w(&h, 0, false),
            w(&h, 1, false),
            Event::SyncSent(1),
            Event::SyncDone(1),
            w(&h, 2, true),
            w(&h, 3, false),
            w(&h, 4, false),
        ];
        let a = Log::parse(&log_text(&h, &ev)).unwrap().analyse().unwrap();
        let bs = h.block_size as usize;
        let judge_img = |d: &[u8]| judge(&h, &a, |i| &d[i as usize * bs..(i as usize + 1) * bs]);

        // Everything required there, write 4 lost, write 5 (in flight) landed.
        let d = image(&h, &[0, 1, 2, 3, 5]);
        let v = judge_img(&d);
        assert_eq!((v.required, v.required_lost, v.corrupt), (3, 0, 0));
        assert_eq!((v.unflushed, v.unflushed_lost, v.unacked_found), (2, 1, 1));

        // A flushed write lost, half of the FUA write lost.
        let mut d = image(&h, &[0, 2, 3]);
        let c2 = chunk_of(2, h.chunks) as usize * 2;
        d[(c2 + 1) * bs..(c2 + 2) * bs].fill(0);
        let v = judge_img(&d);
        assert_eq!((v.required_lost, v.lost_by), (2, [1, 1, 0]));
        assert_eq!(v.corrupt, 0);

        // Garbage and a sector of another write are corruption.
        let mut d = image(&h, &[0, 1, 2]);
        d[5] = 0xff;
        let c1 = chunk_of(1, h.chunks) as usize * 2;
        let mut other = vec![0u8; bs];
        fill_sector(&mut other, h.run, h.chunk_lba(chunk_of(1, h.chunks)), 6);
        d[c1 * bs..(c1 + 1) * bs].copy_from_slice(&other);
        let v = judge_img(&d);
        assert_eq!(v.corrupt, 2);
        assert!(v.required_lost >= 1);
    }

    #[test]
    fn region_arguments_are_checked() {
        assert_eq!(region(512, 2048, "4k", "0", None).unwrap(), (0, 256, 8));
        assert_eq!(
            region(512, 2048, "4k", "64k", Some("64k")).unwrap(),
            (128, 16, 8)
        );
        assert!(region(512, 2048, "1000", "0", None).is_err());
        assert!(region(512, 2048, "4k", "100", None).is_err());
        assert!(region(512, 2048, "4k", "0", Some("2m")).is_err());
        assert!(region(512, 2048, "4k", "1m", Some("0")).is_err());
        assert!(region(512, 2048, "x", "0", None).is_err());
    }
}
