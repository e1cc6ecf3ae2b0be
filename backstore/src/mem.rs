//! Memory-backed backstores: a sparse ramdisk and a null device.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{PoisonError, RwLock};

use async_trait::async_trait;

use crate::buf::IoBuf;
use crate::error::BackstoreError;
use crate::{check_range, Backstore, BufResult, DeviceInfo};

/// Allocation unit of [`RamBackstore`]: large enough to keep the table small, small enough that
/// a thinly used disk stays cheap.
pub const RAM_CHUNK: u64 = 1 << 20;

fn check_block_size(block_size: u32) {
    assert!(
        block_size.is_power_of_two() && (512..=65536).contains(&block_size),
        "block size {block_size} is not a power of two in 512..=65536"
    );
}

type Chunk = RwLock<Option<Box<[u8]>>>;

/// A ramdisk that allocates [`RAM_CHUNK`]-sized chunks on first write; unmapping a whole chunk
/// frees it and reads of unallocated chunks return zeroes.
pub struct RamBackstore {
    block_size: u32,
    num_blocks: AtomicU64,
    /// The outer lock is taken for writing only by `resize`.
    chunks: RwLock<Vec<Chunk>>,
}

impl RamBackstore {
    /// A ramdisk of `size` bytes (rounded down to whole blocks).
    ///
    /// # Panics
    /// If `block_size` is not a power of two between 512 and 65536.
    pub fn new(size: u64, block_size: u32) -> RamBackstore {
        check_block_size(block_size);
        let num_blocks = size / u64::from(block_size);
        let chunks = (0..chunk_count(num_blocks * u64::from(block_size)))
            .map(|_| RwLock::new(None))
            .collect();
        RamBackstore {
            block_size,
            num_blocks: AtomicU64::new(num_blocks),
            chunks: RwLock::new(chunks),
        }
    }

    /// Bytes of memory held by allocated chunks.
    pub fn allocated_bytes(&self) -> u64 {
        let chunks = self.chunks.read().unwrap_or_else(PoisonError::into_inner);
        let n = chunks
            .iter()
            .filter(|c| c.read().unwrap_or_else(PoisonError::into_inner).is_some())
            .count();
        n as u64 * RAM_CHUNK
    }

    fn capacity(&self) -> u64 {
        self.num_blocks.load(Ordering::Acquire) * u64::from(self.block_size)
    }
}

fn chunk_count(bytes: u64) -> usize {
    bytes.div_ceil(RAM_CHUNK) as usize
}

/// Splits `offset..offset + len` at chunk boundaries: (chunk index, offset in chunk, position
/// in the range, length).
fn pieces(offset: u64, len: u64) -> impl Iterator<Item = (usize, usize, usize, usize)> {
    let end = offset + len;
    let mut at = offset;
    std::iter::from_fn(move || {
        if at >= end {
            return None;
        }
        let in_chunk = at % RAM_CHUNK;
        let n = (RAM_CHUNK - in_chunk).min(end - at);
        let piece = (
            (at / RAM_CHUNK) as usize,
            in_chunk as usize,
            (at - offset) as usize,
            n as usize,
        );
        at += n;
        Some(piece)
    })
}

#[async_trait]
impl Backstore for RamBackstore {
    fn info(&self) -> DeviceInfo {
        DeviceInfo {
            block_size: self.block_size,
            num_blocks: self.num_blocks.load(Ordering::Acquire),
            read_only: false,
            thin: true,
            write_cache: false,
        }
    }

    async fn read(&self, offset: u64, mut buf: IoBuf) -> BufResult<()> {
        let chunks = self.chunks.read().unwrap_or_else(PoisonError::into_inner);
        if let Err(e) = check_range(offset, buf.len() as u64, self.capacity()) {
            drop(chunks);
            return (Err(e), buf);
        }
        for (chunk, at, pos, n) in pieces(offset, buf.len() as u64) {
            let dst = &mut buf[pos..pos + n];
            match &*chunks[chunk].read().unwrap_or_else(PoisonError::into_inner) {
                Some(data) => dst.copy_from_slice(&data[at..at + n]),
                None => dst.fill(0),
            }
        }
        drop(chunks);
        (Ok(()), buf)
    }

    async fn write(&self, offset: u64, buf: IoBuf, _fua: bool) -> BufResult<()> {
        let chunks = self.chunks.read().unwrap_or_else(PoisonError::into_inner);
        if let Err(e) = check_range(offset, buf.len() as u64, self.capacity()) {
            drop(chunks);
            return (Err(e), buf);
        }
        for (chunk, at, pos, n) in pieces(offset, buf.len() as u64) {
            let src = &buf[pos..pos + n];
            let mut slot = chunks[chunk]
                .write()
                .unwrap_or_else(PoisonError::into_inner);
            match &mut *slot {
                Some(data) => data[at..at + n].copy_from_slice(src),
                // Zeroes into an unallocated chunk change nothing: stay thin.
                None if src.iter().all(|&b| b == 0) => {}
                None => {
                    let mut data = vec![0u8; RAM_CHUNK as usize].into_boxed_slice();
                    data[at..at + n].copy_from_slice(src);
                    *slot = Some(data);
                }
            }
        }
        drop(chunks);
        (Ok(()), buf)
    }

    async fn flush(&self) -> Result<(), BackstoreError> {
        Ok(())
    }

    async fn unmap(&self, offset: u64, len: u64) -> Result<(), BackstoreError> {
        let chunks = self.chunks.read().unwrap_or_else(PoisonError::into_inner);
        check_range(offset, len, self.capacity())?;
        for (chunk, at, _, n) in pieces(offset, len) {
            let mut slot = chunks[chunk]
                .write()
                .unwrap_or_else(PoisonError::into_inner);
            if n as u64 == RAM_CHUNK {
                *slot = None;
            } else if let Some(data) = &mut *slot {
                data[at..at + n].fill(0);
            }
        }
        Ok(())
    }

    async fn lba_status(&self, offset: u64, len: u64) -> Result<(bool, u64), BackstoreError> {
        let chunks = self.chunks.read().unwrap_or_else(PoisonError::into_inner);
        check_range(offset, len, self.capacity())?;
        let allocated = |i: usize| {
            chunks[i]
                .read()
                .unwrap_or_else(PoisonError::into_inner)
                .is_some()
        };
        let end = offset + len;
        if len == 0 {
            return Ok((true, 0));
        }
        let first = (offset / RAM_CHUNK) as usize;
        let mapped = allocated(first);
        let mut next = first + 1;
        while (next as u64) * RAM_CHUNK < end && allocated(next) == mapped {
            next += 1;
        }
        Ok((mapped, ((next as u64) * RAM_CHUNK).min(end) - offset))
    }

    async fn resize(&self, num_blocks: u64) -> Result<(), BackstoreError> {
        let size = num_blocks.saturating_mul(u64::from(self.block_size));
        let mut chunks = self.chunks.write().unwrap_or_else(PoisonError::into_inner);
        let old = self.capacity();
        chunks.resize_with(chunk_count(size), || RwLock::new(None));
        if size < old && size % RAM_CHUNK != 0 {
            // Bytes past the new end must read as zero if the disk grows again.
            let last = chunks.last_mut().expect("a partial chunk exists");
            if let Some(data) = last.get_mut().unwrap_or_else(PoisonError::into_inner) {
                data[(size % RAM_CHUNK) as usize..].fill(0);
            }
        }
        self.num_blocks.store(num_blocks, Ordering::Release);
        Ok(())
    }
}

impl std::fmt::Debug for RamBackstore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RamBackstore")
            .field("info", &self.info())
            .finish()
    }
}

/// A device that reads zeroes and discards writes: for benchmarking the layers above.
#[derive(Debug)]
pub struct NullBackstore {
    block_size: u32,
    num_blocks: AtomicU64,
}

impl NullBackstore {
    /// A null device of `size` bytes (rounded down to whole blocks).
    ///
    /// # Panics
    /// If `block_size` is not a power of two between 512 and 65536.
    pub fn new(size: u64, block_size: u32) -> NullBackstore {
        check_block_size(block_size);
        NullBackstore {
            block_size,
            num_blocks: AtomicU64::new(size / u64::from(block_size)),
        }
    }

    fn capacity(&self) -> u64 {
        self.num_blocks.load(Ordering::Acquire) * u64::from(self.block_size)
    }
}

#[async_trait]
impl Backstore for NullBackstore {
    fn info(&self) -> DeviceInfo {
        DeviceInfo {
            block_size: self.block_size,
            num_blocks: self.num_blocks.load(Ordering::Acquire),
            read_only: false,
            thin: false,
            write_cache: false,
        }
    }

    async fn read(&self, offset: u64, mut buf: IoBuf) -> BufResult<()> {
        if let Err(e) = check_range(offset, buf.len() as u64, self.capacity()) {
            return (Err(e), buf);
        }
        buf.fill(0);
        (Ok(()), buf)
    }

    async fn write(&self, offset: u64, buf: IoBuf, _fua: bool) -> BufResult<()> {
        let r = check_range(offset, buf.len() as u64, self.capacity());
        (r, buf)
    }

    async fn flush(&self) -> Result<(), BackstoreError> {
        Ok(())
    }

    async fn unmap(&self, offset: u64, len: u64) -> Result<(), BackstoreError> {
        check_range(offset, len, self.capacity())
    }

    async fn lba_status(&self, offset: u64, len: u64) -> Result<(bool, u64), BackstoreError> {
        check_range(offset, len, self.capacity())?;
        Ok((true, len))
    }

    async fn resize(&self, num_blocks: u64) -> Result<(), BackstoreError> {
        self.num_blocks.store(num_blocks, Ordering::Release);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pattern(seed: u64, len: usize) -> Vec<u8> {
        (0..len as u64)
            .map(|i| (i.wrapping_mul(31) ^ seed.wrapping_mul(0x9e37)) as u8)
            .collect()
    }

    async fn read(bs: &dyn Backstore, offset: u64, len: usize) -> Vec<u8> {
        let (r, buf) = bs.read(offset, IoBuf::from_slice(&vec![0xa5; len])).await;
        r.unwrap();
        buf.to_vec()
    }

    async fn write(bs: &dyn Backstore, offset: u64, data: &[u8]) {
        bs.write(offset, IoBuf::from_slice(data), false)
            .await
            .0
            .unwrap();
    }

    #[tokio::test]
    async fn ram_round_trip_across_chunks() {
        let ram = RamBackstore::new(8 << 20, 512);
        assert_eq!(ram.info().num_blocks, 16384);
        assert_eq!(ram.allocated_bytes(), 0);
        for (i, (off, len)) in [
            (0u64, 512usize),
            (RAM_CHUNK - 512, 4096),
            (3 << 20, 2 << 20),
        ]
        .into_iter()
        .enumerate()
        {
            let data = pattern(i as u64 + 1, len);
            write(&ram, off, &data).await;
            assert_eq!(read(&ram, off, len).await, data);
        }
        assert_eq!(read(&ram, 2 << 20, 4096).await, vec![0; 4096]);
        assert_eq!(ram.allocated_bytes(), 4 * RAM_CHUNK, "chunks 0, 1, 3 and 4");
    }

    #[tokio::test]
    async fn ram_zero_writes_stay_thin() {
        let ram = RamBackstore::new(4 << 20, 4096);
        write(&ram, 0, &vec![0; 1 << 20]).await;
        assert_eq!(ram.allocated_bytes(), 0);
        assert_eq!(ram.lba_status(0, 4 << 20).await.unwrap(), (false, 4 << 20));
    }

    #[tokio::test]
    async fn ram_unmap_frees_and_zeroes() {
        let ram = RamBackstore::new(4 << 20, 512);
        let data = pattern(7, 4 << 20);
        write(&ram, 0, &data).await;
        assert_eq!(ram.allocated_bytes(), 4 << 20);
        assert_eq!(ram.lba_status(0, 4 << 20).await.unwrap(), (true, 4 << 20));
        // One whole chunk and a partial one.
        ram.unmap(RAM_CHUNK, RAM_CHUNK + 4096).await.unwrap();
        assert_eq!(ram.allocated_bytes(), 3 * RAM_CHUNK);
        let back = read(&ram, 0, 4 << 20).await;
        let (a, rest) = back.split_at(RAM_CHUNK as usize);
        assert_eq!(a, &data[..RAM_CHUNK as usize]);
        assert!(rest[..RAM_CHUNK as usize + 4096].iter().all(|&b| b == 0));
        assert_eq!(
            &rest[RAM_CHUNK as usize + 4096..],
            &data[2 * RAM_CHUNK as usize + 4096..]
        );
        assert_eq!(ram.lba_status(0, 4 << 20).await.unwrap(), (true, RAM_CHUNK));
        assert_eq!(
            ram.lba_status(RAM_CHUNK, 3 * RAM_CHUNK).await.unwrap(),
            (false, RAM_CHUNK)
        );
        assert_eq!(
            ram.lba_status(RAM_CHUNK + 512, 1024).await.unwrap(),
            (false, 1024)
        );
        assert_eq!(
            ram.lba_status(2 * RAM_CHUNK, 2 * RAM_CHUNK).await.unwrap(),
            (true, 2 * RAM_CHUNK)
        );
    }

    #[tokio::test]
    async fn ram_range_checks() {
        let ram = RamBackstore::new(1 << 20, 512);
        let (r, buf) = ram.read((1 << 20) - 512, IoBuf::zeroed(1024)).await;
        assert_eq!(r.unwrap_err().kind(), crate::IoErrorKind::OutOfRange);
        assert_eq!(buf.len(), 1024);
        let (r, _) = ram.write(u64::MAX - 10, IoBuf::zeroed(512), false).await;
        assert_eq!(r.unwrap_err().kind(), crate::IoErrorKind::OutOfRange);
        assert!(ram.unmap(1 << 20, 512).await.is_err());
        assert!(ram.lba_status(0, 2 << 20).await.is_err());
    }

    #[tokio::test]
    async fn ram_resize_shrink_then_grow_reads_zero() {
        let ram = RamBackstore::new(3 << 20, 512);
        write(&ram, 0, &pattern(3, 3 << 20)).await;
        let half = (RAM_CHUNK + RAM_CHUNK / 2) / 512;
        ram.resize(half).await.unwrap();
        assert_eq!(ram.info().num_blocks, half);
        assert_eq!(ram.allocated_bytes(), 2 * RAM_CHUNK);
        let (r, _) = ram.read(half * 512, IoBuf::zeroed(512)).await;
        assert!(r.is_err());
        ram.resize(6144).await.unwrap();
        assert_eq!(read(&ram, 0, 1 << 20).await, pattern(3, 3 << 20)[..1 << 20]);
        assert!(read(&ram, half * 512, (3 << 20) - half as usize * 512)
            .await
            .iter()
            .all(|&b| b == 0));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn ram_concurrent_writers() {
        let ram = std::sync::Arc::new(RamBackstore::new(16 << 20, 4096));
        let tasks: Vec<_> = (0..64u64)
            .map(|t| {
                let ram = std::sync::Arc::clone(&ram);
                tokio::spawn(async move {
                    let data = pattern(t, 256 << 10);
                    write(&*ram, t * (256 << 10), &data).await;
                    assert_eq!(read(&*ram, t * (256 << 10), 256 << 10).await, data);
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
    }

    #[tokio::test]
    async fn null_reads_zero_and_discards() {
        let null = NullBackstore::new(1 << 30, 4096);
        assert_eq!(null.info().num_blocks, 1 << 18);
        write(&null, 4096, &pattern(1, 8192)).await;
        assert_eq!(read(&null, 4096, 8192).await, vec![0; 8192]);
        null.flush().await.unwrap();
        null.unmap(0, 4096).await.unwrap();
        assert_eq!(null.lba_status(0, 8192).await.unwrap(), (true, 8192));
        let (r, _) = null.read(1 << 30, IoBuf::zeroed(4096)).await;
        assert_eq!(r.unwrap_err().kind(), crate::IoErrorKind::OutOfRange);
        null.resize(1).await.unwrap();
        assert_eq!(null.info().num_blocks, 1);
    }

    #[test]
    #[should_panic(expected = "block size")]
    fn bad_block_size_panics() {
        RamBackstore::new(1 << 20, 1000);
    }
}
