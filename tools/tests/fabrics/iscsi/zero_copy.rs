//! Data-In sent with `sendfile(2)` straight from a file backstore: reads of many sizes over
//! several Data-In PDUs, the buffer path with DataDigest, writes (O_DIRECT on a disk file
//! system, buffered on tmpfs) seen by later reads, and reads racing COMPARE AND WRITE.

use std::path::PathBuf;

use rtgt_backstore::{FileBackstore, FileCounters, FileOptions};

use super::*;
use rtgt_iscsi::conn::FILE_RANGE_MIN;

use crate::file_dirs as dirs;

struct FileLab {
    lab: Lab,
    file: Arc<FileBackstore>,
}

async fn file_lab(path: PathBuf, size: u64) -> FileLab {
    let pool = BufPool::new(128 << 20);
    let file = Arc::new(
        FileBackstore::open(
            &path,
            FileOptions {
                size: Some(size),
                create: true,
                ..FileOptions::default()
            },
        )
        .unwrap(),
    );
    let dev = Device::new(file.clone(), pool.clone(), DeviceConfig::default()).unwrap();
    let lab = lab_on(
        IscsiParams::default(),
        Auth::default(),
        true,
        HashMap::new(),
        pool,
        dev,
    )
    .await;
    FileLab { lab, file }
}

fn reads(c: FileCounters) -> u64 {
    c.direct + c.buffered + c.inline
}

/// Reads `len` bytes at `lba` with an expected length of `edtl`.
async fn read_edtl(s: &Session, lba: u32, len: usize, edtl: u32) -> rtgt_tools::iscsi::ScsiResult {
    let r = s
        .command(0, &rw10(0x28, lba, (len / BLOCK) as u16), None, edtl)
        .await
        .unwrap();
    assert!(r.is_good(), "read: status {} sense {:?}", r.status, r.sense);
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_reads_sent_from_the_file() {
    for (dir, kind) in dirs() {
        let fl = file_lab(dir.path().join("lun.img"), 16 << 20).await;
        for (mrdsl, digests) in [
            (65536u32, false),
            (262_144, false),
            (8192, false),
            (65536, true),
        ] {
            let c = LoginConfig {
                header_digest: digests,
                data_digest: digests,
                max_recv_data_segment_length: mrdsl,
                ..cfg()
            };
            let s = connect(fl.lab.addr, c).await;
            for (i, len) in [512usize, 4096, 65536 + 512, 131_072, 1 << 20, 4 << 20]
                .into_iter()
                .enumerate()
            {
                let data = pattern(len, i as u8 ^ mrdsl as u8);
                let lba = (i * 2048) as u32;
                write(&s, lba, data.clone()).await;
                let before = reads(fl.file.counters());
                let got = read(&s, lba, len).await;
                assert!(
                    got == data[..],
                    "{kind} mrdsl {mrdsl} digests {digests} len {len}"
                );
                let from_backstore = reads(fl.file.counters()) - before;
                // Only a memory file system's pages are sent straight from the file.
                if kind != "tmpfs"
                    || digests
                    || mrdsl < FILE_RANGE_MIN
                    || len < FILE_RANGE_MIN as usize
                {
                    assert!(
                        from_backstore > 0,
                        "{kind}: {mrdsl} {digests} {len} uses a buffer"
                    );
                } else {
                    assert_eq!(
                        from_backstore, 0,
                        "{kind}: read {len} not sent from the file"
                    );
                }
            }
            // An expected length shorter than the CDB's, not a multiple of 4: the data is cut
            // there (with padding on the wire) and the residual reported.
            let data = pattern(131_072, 3);
            write(&s, 100, data.clone()).await;
            let r = read_edtl(&s, 100, 131_072, 65_537).await;
            assert_eq!(r.data[..], data[..65_537], "{kind} short expected length");
            assert_eq!(r.residual, 131_072 - 65_537);
            assert!(r.overflow);
            let (cmd_sn, exp, _) = s.window();
            assert_eq!(cmd_sn, exp);
        }
    }
}

/// Tasks write their own part of one range and read the whole range back, all at once on
/// one session: every read sees each task's latest completed write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_writes_and_reads_of_one_range() {
    const PART: usize = 64 << 10;
    const TASKS: usize = 8;
    for (dir, kind) in dirs() {
        let fl = file_lab(dir.path().join("lun.img"), 16 << 20).await;
        let c = LoginConfig {
            max_recv_data_segment_length: 65536,
            ..cfg()
        };
        let s = connect(fl.lab.addr, c).await;
        let mut tasks = Vec::new();
        for t in 0..TASKS {
            let s = s.clone();
            tasks.push(tokio::spawn(async move {
                for round in 0..12u8 {
                    let data = pattern(PART, round.wrapping_mul(17).wrapping_add(t as u8));
                    let lba = (t * PART / BLOCK) as u32;
                    write(&s, lba, data.clone()).await;
                    let all = read(&s, 0, PART * TASKS).await;
                    assert!(
                        all[t * PART..(t + 1) * PART] == data[..],
                        "{kind}: task {t} round {round} read stale or torn data"
                    );
                    let own = read(&s, lba, PART).await;
                    assert!(own == data[..], "{kind}: task {t} round {round}");
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
    }
}

/// 80 KiB: read in two Data-In PDUs.
const CAW_BLOCKS: usize = 160;

/// Generation `gen` of the COMPARE AND WRITE range: every block starts with `gen`.
fn generation(gen: u32) -> Vec<u8> {
    (0..CAW_BLOCKS)
        .flat_map(|b| {
            let mut block = pattern(BLOCK, (gen as u8).wrapping_add(b as u8)).to_vec();
            block[..4].copy_from_slice(&gen.to_le_bytes());
            block
        })
        .collect()
}

fn caw(lba: u64, blocks: u8) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = 0x89;
    c[2..10].copy_from_slice(&lba.to_be_bytes());
    c[13] = blocks;
    c
}

/// COMPARE AND WRITE replaces one generation of a range by the next while reads of the range
/// (sent from the file, over several Data-In PDUs) run: each read sees one whole generation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_racing_compare_and_write_see_whole_generations() {
    const LBA: u32 = 64;
    const ROUNDS: u32 = 150;
    for (dir, kind) in dirs() {
        let fl = file_lab(dir.path().join("lun.img"), 4 << 20).await;
        let c = LoginConfig {
            max_recv_data_segment_length: 65536,
            ..cfg()
        };
        let s = connect(fl.lab.addr, c).await;
        write(&s, LBA, generation(0).into()).await;
        let writer = {
            let s = s.clone();
            tokio::spawn(async move {
                for g in 0..ROUNDS {
                    let mut d = generation(g);
                    d.extend_from_slice(&generation(g + 1));
                    let r = s
                        .command(
                            0,
                            &caw(u64::from(LBA), CAW_BLOCKS as u8),
                            Some(d.into()),
                            (2 * CAW_BLOCKS * BLOCK) as u32,
                        )
                        .await
                        .unwrap();
                    assert!(r.is_good(), "compare and write {g}: {:?}", r.sense_key());
                }
            })
        };
        let mut readers = Vec::new();
        for r in 0..3 {
            let s = s.clone();
            readers.push(tokio::spawn(async move {
                let mut last = 0;
                let mut n = 0;
                while last < ROUNDS {
                    let got = read(&s, LBA, CAW_BLOCKS * BLOCK).await;
                    let g = u32::from_le_bytes(got[..4].try_into().unwrap());
                    assert!(
                        g >= last && g <= ROUNDS && got == generation(g),
                        "{kind} reader {r}: read {n} is no whole generation at or after {last}: starts as {g}, differs from it at {:?}",
                        got.iter().zip(generation(g)).position(|(a, b)| *a != b)
                    );
                    last = g;
                    n += 1;
                }
                n
            }));
        }
        writer.await.unwrap();
        for r in readers {
            assert!(r.await.unwrap() > 0, "{kind}");
        }
        assert_eq!(read(&s, LBA, CAW_BLOCKS * BLOCK).await, generation(ROUNDS));
    }
}

/// An ORDERED write waits for the reads before it (SAM-5 8.9), and once it runs it must not
/// show through to their data, which the kernel may still be sending from the file's pages.
/// The initiator here takes nothing off its socket until the write is done: with the write
/// changing the pages in place, the read's data would arrive with the new bytes.
#[tokio::test]
async fn ordered_write_leaves_earlier_read_data_alone() {
    const LEN: usize = 64 << 10;
    let dir = tempfile::tempdir_in("/dev/shm").expect("tmpfs at /dev/shm");
    let fl = file_lab(dir.path().join("lun.img"), 16 << 20).await;
    let s = connect(fl.lab.addr, cfg()).await;
    let old = pattern(LEN, 1);
    let new = pattern(4096, 2);
    write(&s, 0, old.clone()).await;

    let mut raw = RawConn::login(fl.lab.addr, [0x80, 0, 0, 0, 7, 7]).await;
    // The new nexus's unit attention first.
    let mut itt = 1;
    loop {
        raw.command(itt, 1, &[0u8; 6], 0, &[]).await;
        let p = raw.next().await;
        itt += 1;
        match BhsRepr::parse(&p.header()) {
            Ok(BhsRepr::ScsiResponse(r)) if r.status == 0 => break,
            Ok(BhsRepr::ScsiResponse(_)) => continue,
            other => panic!("{other:?}"),
        }
    }
    raw.command(
        100,
        1,
        &rw10(0x28, 0, (LEN / BLOCK) as u16),
        LEN as u32,
        &[],
    )
    .await;
    raw.command(101, 2, &rw10(0x2a, 0, (4096 / BLOCK) as u16), 0, &new)
        .await;
    // Another session sees the ordered write once it is done (the read is done by then).
    for _ in 0..500 {
        if read(&s, 0, 4096).await == new[..] {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        read(&s, 0, 4096).await,
        new[..],
        "the ordered write never ran"
    );

    let mut data = Vec::new();
    let mut statuses = HashMap::new();
    while statuses.len() < 2 {
        let p = raw.next().await;
        match BhsRepr::parse(&p.header()) {
            Ok(BhsRepr::DataIn(d)) => {
                assert_eq!(d.itt, 100);
                assert_eq!(d.buffer_offset as usize, data.len());
                data.extend_from_slice(&p.data);
                if d.status_present {
                    statuses.insert(d.itt, d.status);
                }
            }
            Ok(BhsRepr::ScsiResponse(r)) => {
                statuses.insert(r.itt, r.status);
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(statuses, HashMap::from([(100, 0), (101, 0)]));
    assert_eq!(data.len(), LEN);
    assert!(
        data[..] == old[..],
        "the read carries bytes of the later ordered write"
    );
}
