//! The load loop of the initiators' `bench` commands: `iodepth` workers each issue one I/O at
//! a time until the time is up, and one line reports IOPS, MB/s and the mean and 99th
//! percentile latency.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::Rng;

/// A size as the tools' options take it: bytes, or a number with `k`, `m` or `g` (powers of
/// 1024), e.g. `4k`, `128k`, `1m`.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim().to_ascii_lowercase();
    let (num, mult) = match s.chars().last() {
        Some('k') => (&s[..s.len() - 1], 1 << 10),
        Some('m') => (&s[..s.len() - 1], 1 << 20),
        Some('g') => (&s[..s.len() - 1], 1 << 30),
        _ => (&s[..], 1),
    };
    num.parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .ok_or_else(|| format!("bad size {s}"))
}

/// The access pattern.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Rw {
    Randread,
    Randwrite,
    Read,
    Write,
}

impl Rw {
    pub fn name(self) -> &'static str {
        match self {
            Rw::Randread => "randread",
            Rw::Randwrite => "randwrite",
            Rw::Read => "read",
            Rw::Write => "write",
        }
    }

    pub fn is_read(self) -> bool {
        matches!(self, Rw::Randread | Rw::Read)
    }
}

/// Sub-buckets per power of two: latencies are kept to within 1/8 (12.5%).
const SUB: u32 = 8;
const SUB_BITS: u32 = SUB.trailing_zeros();
/// Buckets for latencies up to 2^40 µs (values below 2 * SUB are exact).
const BUCKETS: usize = (2 * SUB + (40 - SUB_BITS - 1) * SUB) as usize;

/// A latency histogram in microseconds (log-linear buckets), shared by the workers.
#[derive(Debug)]
pub struct Latencies {
    buckets: Box<[AtomicU64]>,
    sum_us: AtomicU64,
}

impl Default for Latencies {
    fn default() -> Self {
        Latencies {
            buckets: (0..BUCKETS).map(|_| AtomicU64::new(0)).collect(),
            sum_us: AtomicU64::new(0),
        }
    }
}

fn bucket(us: u64) -> usize {
    if us < u64::from(2 * SUB) {
        return us as usize;
    }
    let e = 63 - us.leading_zeros();
    let sub = (us >> (e - SUB_BITS)) as u32 & (SUB - 1);
    ((2 * SUB + (e - SUB_BITS - 1) * SUB + sub) as usize).min(BUCKETS - 1)
}

/// The smallest latency that falls in bucket `b`.
fn bucket_floor(b: usize) -> u64 {
    let b = b as u32;
    if b < 2 * SUB {
        return u64::from(b);
    }
    let e = (b - 2 * SUB) / SUB + SUB_BITS + 1;
    let sub = (b - 2 * SUB) % SUB;
    (1u64 << e) | (u64::from(sub) << (e - SUB_BITS))
}

impl Latencies {
    pub fn record(&self, d: Duration) {
        let us = d.as_micros().min(u128::from(u64::MAX)) as u64;
        self.buckets[bucket(us)].fetch_add(1, Ordering::Relaxed);
        self.sum_us.fetch_add(us, Ordering::Relaxed);
    }

    pub fn count(&self) -> u64 {
        self.buckets.iter().map(|b| b.load(Ordering::Relaxed)).sum()
    }

    /// Mean latency in microseconds (0 without samples).
    pub fn mean_us(&self) -> f64 {
        let n = self.count();
        if n == 0 {
            0.0
        } else {
            self.sum_us.load(Ordering::Relaxed) as f64 / n as f64
        }
    }

    /// The latency `q` (0..=1) of the samples are at or below, to the bucket's lower bound.
    pub fn quantile_us(&self, q: f64) -> u64 {
        let n = self.count();
        if n == 0 {
            return 0;
        }
        let rank = ((q.clamp(0.0, 1.0) * n as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (i, b) in self.buckets.iter().enumerate() {
            seen += b.load(Ordering::Relaxed);
            if seen >= rank {
                return bucket_floor(i);
            }
        }
        bucket_floor(BUCKETS - 1)
    }
}

/// What a run did.
#[derive(Debug)]
pub struct Report {
    pub rw: Rw,
    pub bs: u64,
    pub iodepth: usize,
    pub elapsed: Duration,
    pub lat: Arc<Latencies>,
}

impl std::fmt::Display for Report {
    /// `rw=… bs=… iodepth=… time=…s ios=N IOPS=… MB/s=… avg_lat=…us p99_lat=…us`
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let secs = self.elapsed.as_secs_f64().max(1e-9);
        let n = self.lat.count();
        let iops = n as f64 / secs;
        write!(
            f,
            "rw={} bs={} iodepth={} time={:.1}s ios={} IOPS={:.0} MB/s={:.1} avg_lat={:.0}us p99_lat={}us",
            self.rw.name(),
            self.bs,
            self.iodepth,
            secs,
            n,
            iops,
            iops * self.bs as f64 / 1e6,
            self.lat.mean_us(),
            self.lat.quantile_us(0.99)
        )
    }
}

/// Runs `iodepth` workers for `seconds`, each calling `io(slot)` (the `slots` of the device in
/// order for sequential patterns, at random otherwise) one at a time; the first error ends
/// the run.
pub async fn run<F, Fut, E>(
    rw: Rw,
    bs: u64,
    iodepth: usize,
    seconds: u64,
    slots: u64,
    io: F,
) -> Result<Report, E>
where
    F: Fn(u64) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Result<(), E>> + Send,
    E: Send + 'static,
{
    let slots = slots.max(1);
    let lat = Arc::new(Latencies::default());
    let next = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let deadline = start + Duration::from_secs(seconds);
    let mut workers = Vec::new();
    for _ in 0..iodepth.max(1) {
        let (io, lat, next, failed) = (io.clone(), lat.clone(), next.clone(), failed.clone());
        workers.push(tokio::spawn(async move {
            while !failed.load(Ordering::Relaxed) && Instant::now() < deadline {
                let slot = match rw {
                    Rw::Randread | Rw::Randwrite => rand::rng().random_range(0..slots),
                    Rw::Read | Rw::Write => next.fetch_add(1, Ordering::Relaxed) % slots,
                };
                let t = Instant::now();
                if let Err(e) = io(slot).await {
                    failed.store(true, Ordering::Relaxed);
                    return Err(e);
                }
                lat.record(t.elapsed());
            }
            Ok::<(), E>(())
        }));
    }
    for w in workers {
        match w.await {
            Ok(r) => r?,
            // A worker that panicked is a bug: the panic goes on (workers are never aborted).
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        }
    }
    let elapsed = start.elapsed();
    Ok(Report {
        rw,
        bs,
        iodepth: iodepth.max(1),
        elapsed,
        lat,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_ordered_and_within_an_eighth() {
        let mut last = 0;
        for us in [
            0u64,
            1,
            7,
            15,
            16,
            17,
            31,
            32,
            100,
            999,
            1000,
            123_456,
            1 << 39,
        ] {
            let b = bucket(us);
            assert!(b >= last, "{us}");
            last = b;
            let floor = bucket_floor(b);
            assert!(floor <= us && us - floor <= us / 8, "{us}: floor {floor}");
        }
        for b in 0..BUCKETS - 1 {
            assert!(bucket_floor(b) < bucket_floor(b + 1), "bucket {b}");
            assert_eq!(bucket(bucket_floor(b)), b);
        }
    }

    #[test]
    fn quantiles_and_mean() {
        let l = Latencies::default();
        for us in 1..=100u64 {
            l.record(Duration::from_micros(us));
        }
        assert_eq!(l.count(), 100);
        assert!((l.mean_us() - 50.5).abs() < 1e-9);
        let p99 = l.quantile_us(0.99);
        assert!((88..=99).contains(&p99), "{p99}");
        assert_eq!(l.quantile_us(0.0), 1);
        assert_eq!(Latencies::default().quantile_us(0.99), 0);
    }

    #[derive(Debug, PartialEq)]
    struct Failed;

    #[tokio::test]
    async fn run_counts_every_io_and_stops_on_error() {
        let seen = Arc::new(AtomicU64::new(0));
        let s = seen.clone();
        let r = run(Rw::Read, 4096, 4, 1, 10, move |slot| {
            let s = s.clone();
            async move {
                assert!(slot < 10);
                s.fetch_add(1, Ordering::Relaxed);
                tokio::task::yield_now().await;
                Ok::<(), Failed>(())
            }
        })
        .await
        .unwrap();
        assert!(r.lat.count() > 0);
        assert_eq!(r.lat.count(), seen.load(Ordering::Relaxed));
        let line = r.to_string();
        assert!(line.starts_with("rw=read bs=4096 iodepth=4 "), "{line}");
        assert!(line.contains(" p99_lat="), "{line}");
        // The 50th I/O fails: the run ends with its error, long before the 60 s are up.
        let n = Arc::new(AtomicU64::new(0));
        let t = Instant::now();
        let r = run(Rw::Randwrite, 512, 2, 60, 1, move |_| {
            let n = n.clone();
            async move {
                tokio::task::yield_now().await;
                if n.fetch_add(1, Ordering::Relaxed) == 49 {
                    Err(Failed)
                } else {
                    Ok(())
                }
            }
        })
        .await;
        assert_eq!(r.err(), Some(Failed));
        assert!(t.elapsed() < Duration::from_secs(30));
    }
}
