//! File and block-device backstores on a real io_uring, against real files.

mod common;

use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::Path;
use std::sync::Arc;
use std::task::{Context, Waker};

use common::{pattern, LoopDevice, SmallTmpfs};
use rtgt_backstore::{
    Backstore, BackstoreError, BufPool, FileBackstore, FileOptions, IoBuf, IoErrorKind,
};

const MIB: u64 = 1 << 20;

fn opts(size: u64, direct: bool) -> FileOptions {
    FileOptions {
        size: Some(size),
        block_size: 512,
        read_only: false,
        write_cache: true,
        direct,
        thin: true,
        create: true,
    }
}

async fn write(bs: &dyn Backstore, offset: u64, data: &[u8], fua: bool) {
    let (r, buf) = bs.write(offset, IoBuf::from_slice(data), fua).await;
    r.unwrap_or_else(|e| panic!("write {} at {offset}: {e:?}", data.len()));
    assert_eq!(buf.len(), data.len(), "the buffer comes back whole");
}

async fn read(bs: &dyn Backstore, offset: u64, len: usize) -> Vec<u8> {
    // Start from a non-zero fill so that bytes the read did not touch show.
    let (r, buf) = bs.read(offset, IoBuf::from_slice(&vec![0xa5; len])).await;
    r.unwrap_or_else(|e| panic!("read {len} at {offset}: {e:?}"));
    buf.to_vec()
}

fn file_bytes(path: &Path, offset: u64, len: usize) -> Vec<u8> {
    let f = std::fs::File::open(path).unwrap();
    let mut out = vec![0; len];
    f.read_exact_at(&mut out, offset).unwrap();
    out
}

async fn round_trips(direct: bool) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("disk.img");
    let bs = FileBackstore::open(&path, opts(64 * MIB, direct)).unwrap();
    // A memory file system only emulates O_DIRECT, and its transfers run inline.
    assert_eq!(bs.is_direct(), direct && !bs.is_memory_fs());
    let sizes = [
        512usize,
        1024,
        4096,
        4608,
        65536,
        (MIB as usize) + 512,
        8 << 20,
    ];
    let offsets = [0u64, 512, 4096, MIB - 512, 37 * 512, 13 * MIB + 3 * 512];
    let mut seed = 1;
    for &len in &sizes {
        for &off in &offsets {
            seed += 1;
            let data = pattern(seed, len);
            write(&bs, off, &data, false).await;
            assert_eq!(read(&bs, off, len).await, data, "len {len} offset {off}");
            assert_eq!(
                file_bytes(&path, off, len),
                data,
                "on disk: len {len} offset {off}"
            );
        }
    }
    let c = bs.counters();
    if bs.is_direct() {
        assert!(c.direct > 0, "{c:?}");
    } else {
        assert_eq!(c.direct, 0, "{c:?}");
    }
}

#[tokio::test]
async fn round_trips_direct() {
    round_trips(true).await;
}

#[tokio::test]
async fn round_trips_buffered() {
    round_trips(false).await;
}

#[tokio::test]
async fn direct_and_buffered_views_agree() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("disk.img");
    let direct = FileBackstore::open(&path, opts(16 * MIB, true)).unwrap();
    let buffered = FileBackstore::open(
        &path,
        FileOptions {
            create: false,
            ..opts(16 * MIB, false)
        },
    )
    .unwrap();
    let a = pattern(10, 1 << 20);
    let b = pattern(11, 1 << 20);
    write(&direct, 0, &a, false).await;
    assert_eq!(read(&buffered, 0, a.len()).await, a);
    write(&buffered, MIB, &b, false).await;
    assert_eq!(read(&direct, MIB, b.len()).await, b);
    if !direct.is_memory_fs() {
        assert!(direct.counters().direct >= 2);
        assert!(buffered.counters().buffered + buffered.counters().inline >= 2);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_modes_switch_under_io() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("disk.img");
    let bs = Arc::new(FileBackstore::open(&path, opts(16 * MIB, false)).unwrap());
    let memory_fs = bs.is_memory_fs();
    assert!(!bs.is_direct());
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let io = {
        let (bs, stop, done) = (bs.clone(), stop.clone(), done.clone());
        tokio::spawn(async move {
            let mut round = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let offset = (round % 64) * 64 * 1024;
                let data = pattern(round, 64 * 1024);
                write(&*bs, offset, &data, round % 3 == 0).await;
                assert_eq!(read(&*bs, offset, data.len()).await, data, "round {round}");
                round += 1;
                done.store(round, Ordering::Relaxed);
            }
            round
        })
    };
    // Each step lets the transfers go on for a few rounds in the new mode (however long that
    // takes on a busy machine).
    let settle = || {
        let done = done.clone();
        async move {
            let from = done.load(Ordering::Relaxed);
            let rounds = async {
                while done.load(Ordering::Relaxed) < from + 4 {
                    tokio::time::sleep(std::time::Duration::from_millis(2)).await;
                }
            };
            tokio::time::timeout(std::time::Duration::from_secs(120), rounds)
                .await
                .expect("the transfers stopped");
        }
    };
    settle().await;
    let before = bs.counters();
    // Through the page cache: nothing on the O_DIRECT descriptor.
    assert_eq!(before.direct, 0, "{before:?}");
    assert_eq!(bs.set_direct(true), !memory_fs);
    settle().await;
    bs.set_write_cache(false).await.unwrap();
    assert!(!bs.info().write_cache);
    settle().await;
    let during = bs.counters();
    if !memory_fs {
        assert!(during.direct > 0, "{during:?}");
    }
    assert!(!bs.set_direct(false));
    bs.set_write_cache(true).await.unwrap();
    assert!(bs.info().write_cache);
    settle().await;
    let after = bs.counters();
    settle().await;
    assert_eq!(
        bs.counters().direct,
        after.direct,
        "no direct transfers once switched back"
    );
    stop.store(true, Ordering::Relaxed);
    let rounds = io.await.expect("no transfer failed");
    assert!(rounds >= 20, "{rounds} rounds");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_256_ops_keep_their_data() {
    let dir = tempfile::tempdir().unwrap();
    let bs = Arc::new(FileBackstore::open(dir.path().join("d"), opts(64 * MIB, true)).unwrap());
    let pool = BufPool::new(32 << 20);
    let region = 64 << 10;
    let mut tasks = Vec::new();
    for i in 0..256u64 {
        let (bs, pool) = (Arc::clone(&bs), Arc::clone(&pool));
        tasks.push(tokio::spawn(async move {
            let len = region - (i as usize % 8) * 4096;
            let mut buf = pool.get(len).await;
            buf.copy_from_slice(&pattern(i, len));
            let (r, _) = bs.write(i * region as u64, buf, i % 16 == 0).await;
            r.unwrap();
        }));
    }
    for t in tasks.drain(..) {
        t.await.unwrap();
    }
    for i in 0..256u64 {
        let (bs, pool) = (Arc::clone(&bs), Arc::clone(&pool));
        tasks.push(tokio::spawn(async move {
            let len = region - (i as usize % 8) * 4096;
            let buf = pool.get(len).await;
            let (r, buf) = bs.read(i * region as u64, buf).await;
            r.unwrap();
            assert!(buf[..] == pattern(i, len)[..], "region {i}");
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(pool.in_use_bytes(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_queue_depth_applies_back_pressure() {
    let dir = tempfile::tempdir().unwrap();
    let bs = Arc::new(
        FileBackstore::open_with_queue_depth(dir.path().join("d"), opts(8 * MIB, false), 4)
            .unwrap(),
    );
    let tasks: Vec<_> = (0..64u64)
        .map(|i| {
            let bs = Arc::clone(&bs);
            tokio::spawn(async move {
                let data = pattern(i + 100, 8192);
                write(&*bs, i * 8192, &data, false).await;
                assert_eq!(read(&*bs, i * 8192, 8192).await, data);
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
}

#[tokio::test]
async fn fixed_buffers_from_a_registered_pool() {
    let dir = tempfile::tempdir().unwrap();
    let bs = FileBackstore::open(dir.path().join("d"), opts(16 * MIB, true)).unwrap();
    let pool = BufPool::new(8 << 20);
    bs.register_pool(&pool).unwrap();
    assert!(bs.register_pool(&pool).is_err(), "one pool per ring");
    for i in 0..16u64 {
        let len = 4096 << (i % 6);
        let mut buf = pool.get(len).await;
        buf.copy_from_slice(&pattern(i, len));
        let (r, _) = bs.write(i * MIB, buf, false).await;
        r.unwrap();
        let (r, buf) = bs.read(i * MIB, pool.get(len).await).await;
        r.unwrap();
        assert!(buf[..] == pattern(i, len)[..]);
    }
    // Unpooled buffers still work on the same ring.
    write(&bs, 0, &pattern(99, 4096), false).await;
    assert_eq!(read(&bs, 0, 4096).await, pattern(99, 4096));
    if !bs.is_memory_fs() {
        assert_eq!(bs.counters().fixed, 32);
    }
}

#[tokio::test]
async fn fua_and_flush_make_data_visible_on_disk() {
    for write_cache in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d");
        let bs = FileBackstore::open(
            &path,
            FileOptions {
                write_cache,
                ..opts(4 * MIB, true)
            },
        )
        .unwrap();
        assert_eq!(bs.info().write_cache, write_cache);
        let a = pattern(1, 8192);
        write(&bs, 0, &a, true).await;
        let b = pattern(2, 4096);
        write(&bs, 3 * MIB, &b, false).await;
        bs.flush().await.unwrap();
        assert_eq!(file_bytes(&path, 0, a.len()), a);
        assert_eq!(file_bytes(&path, 3 * MIB, b.len()), b);
    }
}

#[tokio::test]
async fn unmap_punches_holes_that_read_as_zero() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("d");
    let bs = FileBackstore::open(&path, opts(8 * MIB, true)).unwrap();
    let data = pattern(5, 8 << 20);
    write(&bs, 0, &data, false).await;
    bs.flush().await.unwrap();
    let before = std::fs::metadata(&path).unwrap().blocks();
    assert_eq!(bs.lba_status(0, 8 * MIB).await.unwrap(), (true, 8 * MIB));

    bs.unmap(MIB, 2 * MIB).await.unwrap();
    let back = read(&bs, 0, 8 << 20).await;
    assert_eq!(&back[..MIB as usize], &data[..MIB as usize]);
    assert!(back[MIB as usize..3 * MIB as usize].iter().all(|&b| b == 0));
    assert_eq!(&back[3 * MIB as usize..], &data[3 * MIB as usize..]);

    assert_eq!(bs.lba_status(0, 8 * MIB).await.unwrap(), (true, MIB));
    assert_eq!(bs.lba_status(MIB, 7 * MIB).await.unwrap(), (false, 2 * MIB));
    assert_eq!(bs.lba_status(2 * MIB, MIB).await.unwrap(), (false, MIB));
    assert_eq!(
        bs.lba_status(3 * MIB, 5 * MIB).await.unwrap(),
        (true, 5 * MIB)
    );
    assert_eq!(bs.lba_status(3 * MIB, 512).await.unwrap(), (true, 512));
    let after = std::fs::metadata(&path).unwrap().blocks();
    assert!(
        after + 2 * MIB / 512 <= before,
        "blocks {before} -> {after}"
    );
    assert_eq!(
        std::fs::metadata(&path).unwrap().len(),
        8 * MIB,
        "KEEP_SIZE"
    );
}

#[tokio::test]
async fn sparse_creation() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("big.img");
    let bs = FileBackstore::open(
        &path,
        FileOptions {
            block_size: 4096,
            ..opts(1 << 30, true)
        },
    )
    .unwrap();
    let meta = std::fs::metadata(&path).unwrap();
    assert_eq!(meta.len(), 1 << 30);
    assert!(
        meta.blocks() < 64,
        "created sparse: {} blocks",
        meta.blocks()
    );
    assert_eq!(bs.info().num_blocks, (1 << 30) / 4096);
    assert_eq!(bs.info().block_size, 4096);
    assert_eq!(bs.lba_status(0, 1 << 30).await.unwrap(), (false, 1 << 30));
    assert!(read(&bs, 512 * MIB, 65536).await.iter().all(|&b| b == 0));
    write(&bs, 512 * MIB, &pattern(3, 4096), false).await;
    assert_eq!(bs.lba_status(0, 1 << 30).await.unwrap(), (false, 512 * MIB));
    assert_eq!(
        bs.lba_status(512 * MIB, 1 << 20).await.unwrap(),
        (true, 4096)
    );
}

#[tokio::test]
async fn capacity_beyond_end_of_file_reads_zero() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("short.img");
    std::fs::write(&path, pattern(8, 6000)).unwrap();
    // Read-only leaves the file as it is; the capacity past its end reads as zero.
    let bs = FileBackstore::open(
        &path,
        FileOptions {
            read_only: true,
            create: false,
            ..opts(MIB, true)
        },
    )
    .unwrap();
    let back = read(&bs, 4096, 8192).await;
    assert_eq!(&back[..6000 - 4096], &pattern(8, 6000)[4096..]);
    assert!(back[6000 - 4096..].iter().all(|&b| b == 0));
    assert_eq!(bs.lba_status(8192, 8192).await.unwrap(), (false, 8192));
    assert!(bs.counters().short_transfers >= 1);
}

#[tokio::test]
async fn thick_backstore_refuses_unmap() {
    let dir = tempfile::tempdir().unwrap();
    let bs = FileBackstore::open(
        dir.path().join("d"),
        FileOptions {
            thin: false,
            ..opts(MIB, true)
        },
    )
    .unwrap();
    assert!(!bs.info().thin);
    let err = bs.unmap(0, 4096).await.unwrap_err();
    assert_eq!(err.kind(), IoErrorKind::Unsupported);
    assert!(matches!(err, BackstoreError::Unmap { .. }));
}

#[tokio::test]
async fn read_only_refuses_changes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ro.img");
    let data = pattern(4, 1 << 20);
    std::fs::write(&path, &data).unwrap();
    let bs = FileBackstore::open(
        &path,
        FileOptions {
            size: None,
            read_only: true,
            create: false,
            ..opts(0, true)
        },
    )
    .unwrap();
    assert!(bs.info().read_only);
    assert_eq!(bs.info().num_blocks, 2048);
    let (r, buf) = bs.write(0, IoBuf::zeroed(4096), true).await;
    assert_eq!(r.unwrap_err().kind(), IoErrorKind::ReadOnly);
    assert_eq!(buf.len(), 4096);
    assert_eq!(
        bs.unmap(0, 4096).await.unwrap_err().kind(),
        IoErrorKind::ReadOnly
    );
    assert_eq!(
        bs.resize(4096).await.unwrap_err().kind(),
        IoErrorKind::ReadOnly
    );
    assert_eq!(read(&bs, 0, 1 << 20).await, data);
    assert_eq!(std::fs::read(&path).unwrap(), data);
}

#[tokio::test]
async fn resize_grows_and_shrinks_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("d");
    let bs = FileBackstore::open(&path, opts(4 * MIB, true)).unwrap();
    write(&bs, 0, &pattern(6, 4 << 20), false).await;
    bs.resize(16 * MIB / 512).await.unwrap();
    assert_eq!(bs.info().num_blocks, 16 * MIB / 512);
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 16 * MIB);
    write(&bs, 15 * MIB, &pattern(7, 4096), false).await;
    bs.resize(MIB / 512).await.unwrap();
    assert_eq!(std::fs::metadata(&path).unwrap().len(), MIB);
    let (r, _) = bs.read(MIB, IoBuf::zeroed(512)).await;
    assert_eq!(r.unwrap_err().kind(), IoErrorKind::OutOfRange);
    bs.resize(4 * MIB / 512).await.unwrap();
    assert_eq!(read(&bs, 0, 1 << 20).await, pattern(6, 4 << 20)[..1 << 20]);
    assert!(
        read(&bs, MIB, 3 << 20).await.iter().all(|&b| b == 0),
        "shrunk data is gone"
    );
}

#[tokio::test]
async fn out_of_range_is_refused_before_io() {
    let dir = tempfile::tempdir().unwrap();
    let bs = FileBackstore::open(dir.path().join("d"), opts(MIB, true)).unwrap();
    let (r, buf) = bs.read(MIB - 512, IoBuf::zeroed(1024)).await;
    let err = r.unwrap_err();
    assert_eq!(err.kind(), IoErrorKind::OutOfRange);
    assert!(matches!(err, BackstoreError::OutOfRange { capacity, .. } if capacity == MIB));
    assert_eq!(buf.len(), 1024);
    let (r, _) = bs.write(u64::MAX - 100, IoBuf::zeroed(512), false).await;
    assert_eq!(r.unwrap_err().kind(), IoErrorKind::OutOfRange);
    assert_eq!(
        bs.unmap(MIB, 512).await.unwrap_err().kind(),
        IoErrorKind::OutOfRange
    );
    assert_eq!(
        bs.lba_status(0, 2 * MIB).await.unwrap_err().kind(),
        IoErrorKind::OutOfRange
    );
}

#[tokio::test]
async fn open_errors() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.img");
    let err = FileBackstore::open(
        &missing,
        FileOptions {
            create: false,
            ..opts(MIB, true)
        },
    )
    .unwrap_err();
    assert!(matches!(err, BackstoreError::Open { .. }), "{err:?}");
    assert_eq!(err.kind(), IoErrorKind::Other);
    assert!(!missing.exists());
    let err = FileBackstore::open(
        dir.path().join("x"),
        FileOptions {
            block_size: 1000,
            ..opts(MIB, true)
        },
    )
    .unwrap_err();
    assert!(matches!(err, BackstoreError::Config(_)), "{err:?}");
    let err = FileBackstore::open(dir.path(), opts(MIB, true)).unwrap_err();
    assert!(
        matches!(err, BackstoreError::Config(_)),
        "a directory: {err:?}"
    );
    let err = FileBackstore::open("/dev/null", opts(MIB, true)).unwrap_err();
    assert!(
        matches!(err, BackstoreError::Config(_)),
        "a character device: {err:?}"
    );
}

#[test]
fn open_outside_a_runtime_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let err = FileBackstore::open(dir.path().join("d"), opts(MIB, true)).unwrap_err();
    assert!(err.to_string().contains("cannot open"), "{err}");
}

/// Polls a future once, then drops it: the caller went away while the kernel may be busy.
fn poll_once_and_drop<F: std::future::Future>(fut: F) -> bool {
    let mut fut = std::pin::pin!(fut);
    let mut cx = Context::from_waker(Waker::noop());
    fut.as_mut().poll(&mut cx).is_ready()
}

async fn wait_until_idle(pool: &BufPool) {
    // Abandoned operations return their buffers when their completions are reaped.
    for _ in 0..10_000 {
        if pool.in_use_bytes() == 0 {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
    panic!("{} bytes never returned to the pool", pool.in_use_bytes());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_reads_do_not_corrupt_memory() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("d");
    let bs = Arc::new(FileBackstore::open(&path, opts(32 * MIB, true)).unwrap());
    let data = pattern(77, 32 << 20);
    write(&*bs, 0, &data, false).await;
    let pool = BufPool::new(16 << 20);
    // Canaries: buffers from the same pool that no read targets; they must never change.
    let mut canaries = Vec::new();
    for i in 0..8u8 {
        let mut c = pool.get(64 << 10).await;
        c.fill(0xc0 | i);
        canaries.push(c);
    }
    let mut ready = 0;
    for round in 0..2000u64 {
        let len = 4096 << (round % 5);
        let off = (round * 7919 * 4096) % (32 * MIB - len as u64);
        let buf = pool.get(len).await;
        if round % 2 == 0 {
            if poll_once_and_drop(bs.read(off, buf)) {
                ready += 1;
            }
        } else {
            // Cancel a task mid-read instead.
            let bs2 = Arc::clone(&bs);
            let task = tokio::spawn(async move { bs2.read(off, buf).await });
            tokio::task::yield_now().await;
            task.abort();
        }
    }
    eprintln!("{ready} of 1000 polled reads completed on the first poll");
    // Fresh reads still return the right data, into recycled buffers.
    for round in 0..200u64 {
        let len = 4096 << (round % 5);
        let off = (round * 104_729 * 512) % (32 * MIB - len as u64);
        let (r, buf) = bs.read(off, pool.get(len).await).await;
        r.unwrap();
        assert!(
            buf[..] == data[off as usize..off as usize + len],
            "round {round}"
        );
    }
    for (i, c) in canaries.iter().enumerate() {
        assert!(
            c.iter().all(|&b| b == 0xc0 | i as u8),
            "canary {i} overwritten"
        );
    }
    drop(canaries);
    wait_until_idle(&pool).await;
}

#[tokio::test]
async fn cancelled_writes_complete_or_not_but_never_tear_buffers() {
    let dir = tempfile::tempdir().unwrap();
    let bs = FileBackstore::open(dir.path().join("d"), opts(8 * MIB, true)).unwrap();
    let pool = BufPool::new(4 << 20);
    for i in 0..500u64 {
        let mut buf = pool.get(8192).await;
        buf.copy_from_slice(&pattern(i % 4, 8192));
        poll_once_and_drop(bs.write((i % 64) * 8192, buf, false));
    }
    wait_until_idle(&pool).await;
    // Whatever landed, each 8 KiB block holds one whole pattern (no torn or foreign data).
    bs.flush().await.unwrap();
    let back = read(&bs, 0, 64 * 8192).await;
    for (i, block) in back.chunks(8192).enumerate() {
        let whole = (0..4).any(|s| block == &pattern(s, 8192)[..]) || block.iter().all(|&b| b == 0);
        assert!(whole, "block {i}");
    }
}

#[tokio::test]
async fn dropping_the_backstore_with_abandoned_operations() {
    let dir = tempfile::tempdir().unwrap();
    let pool = BufPool::new(8 << 20);
    {
        let bs = FileBackstore::open(dir.path().join("d"), opts(16 * MIB, true)).unwrap();
        write(&bs, 0, &pattern(1, 16 << 20), false).await;
        for i in 0..64u64 {
            let buf = pool.get(128 << 10).await;
            poll_once_and_drop(bs.read(i * (128 << 10), buf));
        }
    }
    wait_until_idle(&pool).await;
}

#[tokio::test]
async fn block_device_through_a_loop_device() {
    let dir = tempfile::tempdir().unwrap();
    let backing = dir.path().join("backing.img");
    std::fs::File::create(&backing)
        .unwrap()
        .set_len(32 * MIB)
        .unwrap();
    let Some(dev) = LoopDevice::attach(&backing, None) else {
        return;
    };
    let bdev_opts = FileOptions {
        size: None,
        create: false,
        ..opts(0, true)
    };
    let bs = FileBackstore::open(&dev.path, bdev_opts.clone()).unwrap();
    assert!(bs.is_block_device());
    assert!(bs.is_direct());
    assert_eq!(bs.info().num_blocks, 32 * MIB / 512);

    let data = pattern(21, 4 << 20);
    write(&bs, MIB, &data, true).await;
    write(&bs, 512, &pattern(22, 512), false).await;
    bs.flush().await.unwrap();
    assert_eq!(read(&bs, MIB, data.len()).await, data);
    assert_eq!(read(&bs, 512, 512).await, pattern(22, 512));
    assert_eq!(
        file_bytes(&backing, MIB, data.len()),
        data,
        "reached the backing file"
    );

    // Discard on a loop device punches the backing file: the range reads as zero.
    bs.unmap(2 * MIB, MIB).await.unwrap();
    let back = read(&bs, MIB, data.len()).await;
    assert_eq!(&back[..MIB as usize], &data[..MIB as usize]);
    assert!(back[MIB as usize..2 * MIB as usize].iter().all(|&b| b == 0));
    assert_eq!(&back[2 * MIB as usize..], &data[2 * MIB as usize..]);
    assert_eq!(bs.lba_status(0, 32 * MIB).await.unwrap(), (true, 32 * MIB));

    // Reading past the end of the device is out of range, not a short read.
    let (r, _) = bs.read(32 * MIB - 512, IoBuf::zeroed(4096)).await;
    assert_eq!(r.unwrap_err().kind(), IoErrorKind::OutOfRange);
    assert_eq!(
        bs.resize(1).await.unwrap_err().kind(),
        IoErrorKind::Unsupported
    );

    // A second writable open is refused while the first holds the device exclusively.
    let err = FileBackstore::open(&dev.path, bdev_opts.clone()).unwrap_err();
    assert!(matches!(err, BackstoreError::Open { .. }), "{err:?}");
    drop(bs);

    let err = FileBackstore::open(
        &dev.path,
        FileOptions {
            size: Some(64 * MIB),
            ..bdev_opts.clone()
        },
    )
    .unwrap_err();
    assert!(matches!(err, BackstoreError::Config(_)), "{err:?}");
    let smaller = FileBackstore::open(
        &dev.path,
        FileOptions {
            size: Some(8 * MIB),
            ..bdev_opts
        },
    )
    .unwrap();
    assert_eq!(smaller.info().num_blocks, 8 * MIB / 512);
}

#[tokio::test]
async fn full_file_system_is_no_space() {
    let Some(fs) = SmallTmpfs::mount("1m") else {
        return;
    };
    let bs = FileBackstore::open(fs.dir.path().join("d"), opts(16 * MIB, true)).unwrap();
    let mut failure = None;
    for i in 0..16u64 {
        let (r, _) = bs
            .write(i * MIB, IoBuf::from_slice(&pattern(i, 1 << 20)), false)
            .await;
        if let Err(e) = r {
            failure = Some(e);
            break;
        }
    }
    let err = failure.expect("a 1 MiB tmpfs cannot hold 16 MiB");
    assert_eq!(err.kind(), IoErrorKind::NoSpace, "{err:?}");
    assert!(matches!(err, BackstoreError::Write { .. }));
    drop(bs);
}
