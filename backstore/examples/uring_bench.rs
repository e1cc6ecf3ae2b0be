//! 4 KiB random reads against a file at a fixed queue depth; prints IOPS.
//!
//! ```text
//! cargo run --release -p rtgt-backstore --example uring_bench -- FILE [--qd 32] [--secs 10]
//!     [--bs 4096] [--size BYTES] [--buffered] [--fixed] [--threads 1]
//! ```
//!
//! `--size` creates or extends FILE and fills it first, so reads hit allocated blocks. The
//! matching fio job, for a side-by-side run:
//!
//! ```text
//! fio --name=randread --filename=FILE --rw=randread --bs=4k --iodepth=32 --ioengine=io_uring \
//!     --direct=1 --runtime=10 --time_based --numjobs=1
//! ```

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rtgt_backstore::{Backstore, BufPool, FileBackstore, FileOptions};

struct Args {
    path: String,
    qd: usize,
    secs: u64,
    bs: usize,
    size: Option<u64>,
    direct: bool,
    fixed: bool,
    threads: usize,
}

fn usage() -> String {
    "usage: uring_bench FILE [--qd N] [--secs S] [--bs BYTES] [--size BYTES] [--buffered] \
     [--fixed] [--threads N]"
        .to_string()
}

fn parse() -> Result<Args, String> {
    let mut args = Args {
        path: String::new(),
        qd: 32,
        secs: 10,
        bs: 4096,
        size: None,
        direct: true,
        fixed: false,
        threads: 1,
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut num = |name: &str| -> Result<u64, String> {
            it.next()
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| format!("{name} needs a number\n{}", usage()))
        };
        match a.as_str() {
            "--qd" => args.qd = num("--qd")? as usize,
            "--secs" => args.secs = num("--secs")?,
            "--bs" => args.bs = num("--bs")? as usize,
            "--size" => args.size = Some(num("--size")?),
            "--threads" => args.threads = num("--threads")? as usize,
            "--buffered" => args.direct = false,
            "--fixed" => args.fixed = true,
            "-h" | "--help" => return Err(usage()),
            s if s.starts_with('-') => return Err(format!("unknown option {s}\n{}", usage())),
            s => args.path = s.to_string(),
        }
    }
    if args.path.is_empty() || args.qd == 0 || args.bs == 0 || args.bs % 512 != 0 {
        return Err(usage());
    }
    Ok(args)
}

fn main() -> ExitCode {
    let args = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let rt = if args.threads <= 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(args.threads)
            .enable_all()
            .build()
    };
    match rt.expect("tokio runtime").block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("uring_bench: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let existed = std::path::Path::new(&args.path).exists();
    let opts = FileOptions {
        size: args.size,
        block_size: 512,
        read_only: args.size.is_none(),
        write_cache: true,
        direct: args.direct,
        thin: true,
        create: args.size.is_some(),
    };
    let bs = Arc::new(FileBackstore::open(&args.path, opts)?);
    let capacity = bs.info().num_blocks * 512;
    let blocks = capacity / args.bs as u64;
    if blocks == 0 {
        return Err(format!("{} is smaller than one {}-byte block", args.path, args.bs).into());
    }
    let pool = BufPool::new((args.qd * args.bs).max(1 << 20) + (1 << 20));
    if args.fixed {
        bs.register_pool(&pool)?;
    }
    if args.size.is_some() {
        fill(&bs, &pool, capacity, existed).await?;
    }

    let stop = Arc::new(AtomicBool::new(false));
    let ops = Arc::new(AtomicU64::new(0));
    let mut workers = Vec::new();
    for w in 0..args.qd {
        let (bs, pool, stop, ops) = (
            Arc::clone(&bs),
            Arc::clone(&pool),
            Arc::clone(&stop),
            Arc::clone(&ops),
        );
        let len = args.bs;
        workers.push(tokio::spawn(async move {
            let mut x =
                0x9e37_79b9_7f4a_7c15u64 ^ (w as u64 + 1).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            let mut buf = pool.get(len).await;
            while !stop.load(Ordering::Relaxed) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let (r, b) = bs.read((x % blocks) * len as u64, buf).await;
                buf = b;
                r?;
                ops.fetch_add(1, Ordering::Relaxed);
            }
            Ok::<(), rtgt_backstore::BackstoreError>(())
        }));
    }
    let start = Instant::now();
    tokio::time::sleep(Duration::from_secs(args.secs)).await;
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.await??;
    }
    let elapsed = start.elapsed().as_secs_f64();
    let n = ops.load(Ordering::Relaxed);
    let c = bs.counters();
    println!(
        "file={} bs={} qd={} threads={} direct={} fixed={} ops={} secs={:.2} iops={:.0} MiB/s={:.1} \
         (direct_submits={} buffered_submits={} fixed_submits={})",
        args.path,
        args.bs,
        args.qd,
        args.threads,
        bs.is_direct(),
        args.fixed,
        n,
        elapsed,
        n as f64 / elapsed,
        n as f64 * args.bs as f64 / elapsed / (1 << 20) as f64,
        c.direct,
        c.buffered,
        c.fixed,
    );
    Ok(())
}

/// Writes every block once so random reads hit allocated data rather than holes.
async fn fill(
    bs: &FileBackstore,
    pool: &BufPool,
    capacity: u64,
    existed: bool,
) -> Result<(), Box<dyn std::error::Error>> {
    if existed && bs.lba_status(0, capacity).await? == (true, capacity) {
        return Ok(());
    }
    let chunk = 1 << 20;
    let mut at = 0;
    while at < capacity {
        let len = chunk.min(capacity - at) as usize;
        let mut buf = pool.get(len).await;
        for (i, b) in buf.iter_mut().enumerate() {
            *b = (i as u64 ^ at) as u8;
        }
        let (r, _) = bs.write(at, buf, false).await;
        r?;
        at += len as u64;
    }
    bs.flush().await?;
    Ok(())
}
