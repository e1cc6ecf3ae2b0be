//! SBC-4 block commands: READ/WRITE (5.14-5.17, 5.38-5.41), WRITE AND VERIFY (5.44-5.46),
//! VERIFY (5.33-5.35), ORWRITE (5.10), PRE-FETCH (5.11-5.12), SYNCHRONIZE CACHE (5.28-5.29),
//! UNMAP (5.31), WRITE SAME (5.50-5.51), COMPARE AND WRITE (5.3), WRITE ATOMIC (5.48),
//! GET LBA STATUS (5.6), READ CAPACITY (5.20-5.21), READ DEFECT DATA (5.18-5.19) and
//! SANITIZE (5.26), which runs in the background (4.11).
//!
//! Data moves in one pool buffer per command: READ hands the backstore's buffer to the
//! fabric, WRITE hands the fabric's data-out buffer to the backstore.

use std::sync::Arc;
use std::time::Duration;

use rtgt_backstore::{BackstoreError, FileSlice, IoBuf, IoErrorKind};
use tokio::sync::{watch, Notify};

use super::cdb::{be, field, put_be32, put_be64, LbaLayout, LbaReq, WriteSameReq};
use super::range_lock::Mode;
use super::sense::{asc, key, KeySpecific, Sense};
use super::{CmdResult, Ctx, Device, Done, FileRange, Nexus, Status};

/// MAXIMUM COMPARE AND WRITE LENGTH (Block Limits VPD).
pub const MAX_CAW_BLOCKS: u32 = 255;
/// MAXIMUM UNMAP LBA COUNT.
pub const MAX_UNMAP_BLOCKS: u32 = 1 << 20;
/// MAXIMUM UNMAP BLOCK DESCRIPTOR COUNT.
pub const MAX_UNMAP_DESCRIPTORS: u32 = 256;
/// MAXIMUM WRITE SAME LENGTH.
pub const MAX_WRITE_SAME_BLOCKS: u32 = 0xffff;
/// Buffer size for commands that sweep ranges larger than one transfer.
const CHUNK_BYTES: u64 = 1 << 20;
/// Write size of a sanitize sweep.
const SANITIZE_CHUNK_BYTES: u64 = 8 << 20;
/// Deallocation size of a sanitize block erase (one progress step).
const SANITIZE_UNMAP_BYTES: u64 = 1 << 30;

/// Maps a backstore failure to sense data (SBC-4 4.18).
pub fn io_error(e: &BackstoreError, write: bool) -> Sense {
    match e.kind() {
        IoErrorKind::Medium if write => Sense::new(key::MEDIUM_ERROR, asc::WRITE_ERROR),
        IoErrorKind::Medium => Sense::new(key::MEDIUM_ERROR, asc::UNRECOVERED_READ_ERROR),
        // SPACE ALLOCATION FAILED WRITE PROTECT (thin provisioning exhausted).
        IoErrorKind::NoSpace => Sense::new(key::DATA_PROTECT, (0x27, 0x07)),
        IoErrorKind::ReadOnly => Sense::write_protected(),
        IoErrorKind::OutOfRange => Sense::lba_out_of_range(),
        // The storage behind the backstore is out of reach: a multipath initiator fails the
        // path and retries through another (Linux fails the command on this sense).
        IoErrorKind::NotReady => Sense::new(key::NOT_READY, asc::NOT_READY_CAUSE_NOT_REPORTABLE),
        _ => Sense::internal_failure(),
    }
}

impl Device {
    fn offset(&self, lba: u64) -> u64 {
        lba * u64::from(self.block_size)
    }

    fn bytes(&self, blocks: u64) -> u64 {
        blocks * u64::from(self.block_size)
    }

    /// A buffer for a command that already holds one (its data-out buffer): taken from the
    /// pool only if that does not wait, so commands holding pool memory never wait on each
    /// other for more.
    pub(crate) fn second_buf(&self, len: usize) -> IoBuf {
        self.pool.try_get(len).unwrap_or_else(|| IoBuf::zeroed(len))
    }

    /// Reads into the command's one pool buffer.
    pub(crate) async fn read_buf(&self, lba: u64, len: usize) -> Result<IoBuf, Sense> {
        let buf = self.pool.get(len).await;
        self.read_into(lba, buf).await
    }

    /// Reads into a second buffer (see [`Device::second_buf`]).
    pub(crate) async fn read_second(&self, lba: u64, len: usize) -> Result<IoBuf, Sense> {
        let buf = self.second_buf(len);
        self.read_into(lba, buf).await
    }

    async fn read_into(&self, lba: u64, buf: IoBuf) -> Result<IoBuf, Sense> {
        let (res, buf) = self.backstore.read(self.offset(lba), buf).await;
        res.map_err(|e| io_error(&e, false))?;
        Ok(buf)
    }

    /// Writes for an atomic command holding its range exclusively
    /// ([`rtgt_backstore::Backstore::write_replacing`]).
    pub(crate) async fn write_buf_atomic(
        &self,
        lba: u64,
        buf: IoBuf,
        fua: bool,
    ) -> Result<IoBuf, Sense> {
        let (res, buf) = self
            .backstore
            .write_replacing(self.offset(lba), buf, fua)
            .await;
        res.map_err(|e| io_error(&e, true))?;
        Ok(buf)
    }

    pub(crate) async fn write_buf(&self, lba: u64, buf: IoBuf, fua: bool) -> Result<IoBuf, Sense> {
        let (res, buf) = self.backstore.write(self.offset(lba), buf, fua).await;
        res.map_err(|e| io_error(&e, true))?;
        Ok(buf)
    }

    /// Writes `pattern` (one block) to every block of the range, in chunks.
    async fn write_pattern(
        &self,
        lba: u64,
        blocks: u64,
        pattern: &[u8],
        fua: bool,
    ) -> Result<(), Sense> {
        let bs = u64::from(self.block_size);
        let chunk_blocks = (CHUNK_BYTES / bs).clamp(1, blocks.max(1));
        let mut buf = self.second_buf((chunk_blocks * bs) as usize);
        for blk in buf.as_mut_slice().chunks_mut(bs as usize) {
            blk.copy_from_slice(&pattern[..blk.len()]);
        }
        let mut done = 0;
        while done < blocks {
            let n = chunk_blocks.min(blocks - done);
            if (n * bs) as usize != buf.len() {
                buf.truncate((n * bs) as usize);
            }
            buf = self.write_buf(lba + done, buf, fua).await?;
            done += n;
        }
        Ok(())
    }

    /// Zeroes the range: by the backstore's own operation where it has one, else by writing
    /// `zero_block` (one block of zeroes) over it.
    async fn write_zeroes(&self, lba: u64, blocks: u64, zero_block: &[u8]) -> Result<(), Sense> {
        let fua = self.write_fua(false);
        match self
            .backstore
            .write_zeroes(self.offset(lba), self.bytes(blocks), fua)
            .await
        {
            Err(e) if e.kind() == IoErrorKind::Unsupported => {
                self.write_pattern(lba, blocks, zero_block, fua).await
            }
            res => res.map_err(|e| io_error(&e, true)),
        }
    }

    async fn unmap_range(&self, lba: u64, blocks: u64) -> Result<(), Sense> {
        self.backstore
            .unmap(self.offset(lba), self.bytes(blocks))
            .await
            .map_err(|e| io_error(&e, true))
    }
}

fn parse_lba(ctx: &Ctx<'_>, layout: &LbaLayout) -> LbaReq {
    LbaReq::parse(&ctx.cdb(), layout)
}

fn layout(ctx: &Ctx<'_>) -> LbaLayout {
    LbaLayout::for_len(ctx.desc.cdb_len())
}

fn check_transfer(ctx: &Ctx<'_>, r: &LbaReq) -> Result<(), Sense> {
    if r.blocks > ctx.dev.max_transfer_blocks() {
        return Err(r.bad_len());
    }
    Ok(())
}

/// Whole blocks of data-out available for a transfer of `r.blocks`.
fn blocks_received(ctx: &Ctx<'_>, r: &LbaReq) -> u64 {
    let bs = ctx.dev.block_size as usize;
    u64::from(r.blocks).min((ctx.data_out_len() / bs) as u64)
}

fn first_difference(a: &[u8], b: &[u8]) -> Option<usize> {
    a.iter().zip(b.iter()).position(|(x, y)| x != y)
}

/// READ(6/10/12/16). Only the blocks the initiator can receive are read.
pub async fn read(ctx: &mut Ctx<'_>) -> CmdResult {
    let r = parse_lba(ctx, &layout(ctx));
    check_transfer(ctx, &r)?;
    let dev = ctx.dev;
    r.check_range(dev.num_blocks())?;
    let total = dev.bytes(u64::from(r.blocks));
    let bs = u64::from(dev.block_size);
    let want = total.min(u64::from(ctx.edtl_in).div_ceil(bs) * bs);
    if want == 0 {
        return Ok(Done {
            status: Status::Good,
            data: None,
            transfer_len: total as u32,
        });
    }
    if ctx.range_ok {
        if let Some(slice) = FileSlice::of(&dev.backstore, dev.offset(r.lba), want) {
            // The fabric sends the blocks from the file; the lock goes with them and is
            // released once they are handed to the kernel.
            let guard = dev
                .range_lock
                .lock_owned(r.lba, want / bs, Mode::Shared)
                .await;
            ctx.data_range = Some(FileRange {
                slice,
                _guard: guard,
            });
            return Ok(Done {
                status: Status::Good,
                data: None,
                transfer_len: total as u32,
            });
        }
    }
    let _g = dev.range_lock.lock(r.lba, want / bs, Mode::Shared).await;
    let buf = dev.read_buf(r.lba, want as usize).await?;
    Ok(Done {
        status: Status::Good,
        data: Some(buf),
        transfer_len: total as u32,
    })
}

/// Common admission for medium-modifying commands: transfer length, write protection,
/// range.
fn write_admission(ctx: &Ctx<'_>, r: &LbaReq) -> Result<(), Sense> {
    check_transfer(ctx, r)?;
    ctx.dev.check_writable()?;
    r.check_range(ctx.dev.num_blocks())
}

/// Writes the received blocks of a WRITE-style command; returns the data buffer back.
async fn write_received(
    ctx: &mut Ctx<'_>,
    r: &LbaReq,
    fua: bool,
    mode: Mode,
) -> Result<Option<IoBuf>, Sense> {
    let dev = ctx.dev;
    let n = blocks_received(ctx, r);
    if n == 0 {
        return Ok(None);
    }
    let Some(mut buf) = ctx.data_out.take() else {
        return Ok(None);
    };
    let len = dev.bytes(n) as usize;
    if buf.len() > len {
        buf.truncate(len);
    }
    let fua = dev.write_fua(fua);
    // An ORDERED write must not show through to the earlier reads it waited for, whose
    // data the kernel may still be sending from the file's pages: it replaces them.
    let mode = if ctx.ordered { Mode::Exclusive } else { mode };
    let _g = dev.range_lock.lock(r.lba, n, mode).await;
    if mode == Mode::Exclusive {
        return Ok(Some(dev.write_buf_atomic(r.lba, buf, fua).await?));
    }
    Ok(Some(dev.write_buf(r.lba, buf, fua).await?))
}

fn done_out(r: &LbaReq, dev: &Device) -> Done {
    Done {
        status: Status::Good,
        data: None,
        transfer_len: dev.bytes(u64::from(r.blocks)) as u32,
    }
}

/// WRITE(6/10/12/16).
pub async fn write(ctx: &mut Ctx<'_>) -> CmdResult {
    let r = parse_lba(ctx, &layout(ctx));
    write_admission(ctx, &r)?;
    write_received(ctx, &r, r.fua(), Mode::Shared).await?;
    Ok(done_out(&r, ctx.dev))
}

/// WRITE ATOMIC(16): the write is exclusive against every overlapping command.
pub async fn write_atomic(ctx: &mut Ctx<'_>) -> CmdResult {
    let r = parse_lba(ctx, &LbaLayout::ATOMIC16);
    write_admission(ctx, &r)?;
    write_received(ctx, &r, r.fua(), Mode::Exclusive).await?;
    Ok(done_out(&r, ctx.dev))
}

/// WRITE AND VERIFY(10/12/16): the write goes to stable media; with BYTCHK=1 the blocks are
/// read back and compared.
pub async fn write_and_verify(ctx: &mut Ctx<'_>) -> CmdResult {
    let r = parse_lba(ctx, &layout(ctx));
    if r.bytchk() > 1 {
        return Err(Sense::invalid_cdb(1, Some(2)).into());
    }
    write_admission(ctx, &r)?;
    let written = write_received(ctx, &r, true, Mode::Shared).await?;
    if r.bytchk() == 1 {
        if let Some(data) = written {
            let back = ctx.dev.read_second(r.lba, data.len()).await?;
            if let Some(i) = first_difference(&data, &back) {
                return Err(Sense::miscompare(i as u64).into());
            }
        }
    }
    Ok(done_out(&r, ctx.dev))
}

/// VERIFY(10/12/16): BYTCHK 0 checks the range, 1 compares the data-out buffer, 3 compares
/// every block with the single block sent.
pub async fn verify(ctx: &mut Ctx<'_>) -> CmdResult {
    let r = parse_lba(ctx, &layout(ctx));
    let dev = ctx.dev;
    let bytchk = r.bytchk();
    if bytchk == 2 {
        return Err(Sense::invalid_cdb(1, Some(2)).into());
    }
    if bytchk != 0 {
        check_transfer(ctx, &r)?;
    }
    r.check_range(dev.num_blocks())?;
    let bs = dev.block_size as usize;
    let transfer = match bytchk {
        1 => dev.bytes(u64::from(r.blocks)) as u32,
        3 if r.blocks > 0 => dev.block_size,
        _ => 0,
    };
    match bytchk {
        1 => {
            let n = blocks_received(ctx, &r);
            if n > 0 {
                let len = dev.bytes(n) as usize;
                let _g = dev.range_lock.lock(r.lba, n, Mode::Shared).await;
                let medium = dev.read_second(r.lba, len).await?;
                if let Some(i) = first_difference(&ctx.data_out()[..len], &medium) {
                    return Err(Sense::miscompare(i as u64).into());
                }
            }
        }
        3 if r.blocks > 0 => {
            if ctx.data_out_len() < bs {
                return Err(r.bad_len().into());
            }
            let _g = dev
                .range_lock
                .lock(r.lba, u64::from(r.blocks), Mode::Shared)
                .await;
            let medium = dev
                .read_second(r.lba, dev.bytes(u64::from(r.blocks)) as usize)
                .await?;
            let pattern = &ctx.data_out()[..bs];
            for (b, blk) in medium.chunks(bs).enumerate() {
                if let Some(i) = first_difference(pattern, blk) {
                    return Err(Sense::miscompare((b * bs + i) as u64).into());
                }
            }
        }
        _ => {}
    }
    Ok(Done {
        status: Status::Good,
        data: None,
        transfer_len: transfer,
    })
}

/// ORWRITE(16): read, OR with the data-out buffer, write, exclusive over the range.
pub async fn or_write(ctx: &mut Ctx<'_>) -> CmdResult {
    let r = parse_lba(ctx, &LbaLayout::RW16);
    write_admission(ctx, &r)?;
    let dev = ctx.dev;
    let n = blocks_received(ctx, &r);
    if n > 0 {
        let len = dev.bytes(n) as usize;
        let _g = dev.range_lock.lock(r.lba, n, Mode::Exclusive).await;
        let mut medium = dev.read_second(r.lba, len).await?;
        for (m, d) in medium.as_mut_slice().iter_mut().zip(ctx.data_out()) {
            *m |= d;
        }
        dev.write_buf_atomic(r.lba, medium, dev.write_fua(r.fua()))
            .await?;
    }
    Ok(done_out(&r, dev))
}

/// MAXIMUM COMPARE AND WRITE LENGTH: what the backstore does atomically by itself where it
/// does (the length its other gateways' writers respect too), else [`MAX_CAW_BLOCKS`].
pub fn dev_max_caw(dev: &Device) -> u32 {
    let native = dev.backstore.compare_and_write_limit() / u64::from(dev.block_size);
    match u32::try_from(native) {
        Ok(0) => MAX_CAW_BLOCKS,
        Ok(n) => n.min(MAX_CAW_BLOCKS),
        Err(_) => MAX_CAW_BLOCKS,
    }
}

/// COMPARE AND WRITE: compare and write are atomic against every other write to the range.
pub async fn compare_and_write(ctx: &mut Ctx<'_>) -> CmdResult {
    let r = parse_lba(ctx, &LbaLayout::CAW);
    if r.blocks > dev_max_caw(ctx.dev) {
        return Err(r.bad_len().into());
    }
    let dev = ctx.dev;
    dev.check_writable()?;
    r.check_range(dev.num_blocks())?;
    let half = dev.bytes(u64::from(r.blocks)) as usize;
    // The data-out buffer must hold exactly the compare and the write data.
    if ctx.data_out_len() != 2 * half {
        return Err(r.bad_len().into());
    }
    if r.blocks == 0 {
        return Ok(Done::good());
    }
    let _g = dev
        .range_lock
        .lock(r.lba, u64::from(r.blocks), Mode::Exclusive)
        .await;
    if dev.backstore.compare_and_write_limit() >= half as u64 {
        // Atomic on the device itself, against other gateways' writers too.
        let mut both = dev.second_buf(2 * half);
        both.as_mut_slice().copy_from_slice(ctx.data_out());
        let (res, _) = dev
            .backstore
            .compare_and_write(dev.offset(r.lba), both, dev.write_fua(r.fua()))
            .await;
        return match res.map_err(|e| io_error(&e, true))? {
            Some(i) => Err(Sense::miscompare(i).into()),
            None => Ok(Done {
                status: Status::Good,
                data: None,
                transfer_len: (2 * half) as u32,
            }),
        };
    }
    let mut medium = dev.read_second(r.lba, half).await?;
    let data = ctx.data_out();
    if let Some(i) = first_difference(&data[..half], &medium) {
        return Err(Sense::miscompare(i as u64).into());
    }
    medium.as_mut_slice().copy_from_slice(&data[half..]);
    dev.write_buf_atomic(r.lba, medium, dev.write_fua(r.fua()))
        .await?;
    Ok(Done {
        status: Status::Good,
        data: None,
        transfer_len: (2 * half) as u32,
    })
}

/// PRE-FETCH(10/16): nothing to load ahead of time; CONDITION MET tells the initiator the
/// blocks are as good as cached.
pub fn pre_fetch(ctx: &mut Ctx<'_>) -> CmdResult {
    let r = parse_lba(ctx, &layout(ctx));
    r.check_range(ctx.dev.num_blocks())?;
    Ok(Done {
        status: Status::ConditionMet,
        data: None,
        transfer_len: 0,
    })
}

/// SYNCHRONIZE CACHE(10/16).
pub async fn synchronize_cache(ctx: &mut Ctx<'_>) -> CmdResult {
    let r = parse_lba(ctx, &layout(ctx));
    r.check_range(ctx.dev.num_blocks())?;
    ctx.dev
        .backstore
        .flush()
        .await
        .map_err(|e| io_error(&e, true))?;
    Ok(Done::good())
}

/// READ CAPACITY(10).
pub fn read_capacity10(ctx: &mut Ctx<'_>) -> CmdResult {
    let cdb = ctx.cdb();
    if !cdb.bit(8, 0x01) && cdb.be(2..6) != 0 {
        return Err(Sense::invalid_cdb(2, None).into());
    }
    let mut b = [0u8; 8];
    let last = ctx.dev.num_blocks().saturating_sub(1);
    put_be32(&mut b[0..4], u32::try_from(last).unwrap_or(u32::MAX));
    put_be32(&mut b[4..8], ctx.dev.block_size);
    Ok(Done::data(&b, 8))
}

/// READ CAPACITY(16), with the physical block exponent and LBPME/LBPRZ for
/// thin-provisioned units.
pub fn read_capacity16(ctx: &mut Ctx<'_>) -> CmdResult {
    let cdb = ctx.cdb();
    let alloc = cdb.be(field::ALLOC16) as u32;
    if !cdb.bit(14, 0x01) && cdb.be(2..10) != 0 {
        return Err(Sense::invalid_cdb(2, None).into());
    }
    let mut b = [0u8; 32];
    put_be64(&mut b[0..8], ctx.dev.num_blocks().saturating_sub(1));
    put_be32(&mut b[8..12], ctx.dev.block_size);
    // LOGICAL BLOCKS PER PHYSICAL BLOCK EXPONENT; the LOWEST ALIGNED LOGICAL BLOCK ADDRESS
    // (bytes 14-15, bits 13:0) is 0.
    b[13] = ctx.dev.lbppb_exp & 0x0f;
    if ctx.dev.thin() {
        b[14] |= 0x80 | 0x40;
    }
    Ok(Done::data(&b, alloc))
}

/// READ DEFECT DATA(10/12): the defect lists are empty.
pub fn read_defect_data(ctx: &mut Ctx<'_>) -> CmdResult {
    let cdb = ctx.cdb();
    if ctx.desc.cdb_len() == 10 {
        let alloc = cdb.be(field::ALLOC10) as u32;
        let b = [0, cdb.byte(2) & 0x1f, 0, 0];
        Ok(Done::data(&b, alloc))
    } else {
        let alloc = cdb.be(field::ALLOC12) as u32;
        let b = [0, cdb.byte(1) & 0x1f, 0, 0, 0, 0, 0, 0];
        Ok(Done::data(&b, alloc))
    }
}

/// WRITE SAME(10/16) (SBC-4 5.50, 5.51). WSNZ=0: NUMBER OF LOGICAL BLOCKS 0 writes from
/// the LBA to the end of the medium, within MAXIMUM WRITE SAME LENGTH like any other
/// length. ANC_SUP=0. With UNMAP set on a thin-provisioned unit the range is deallocated
/// whatever the data-out block holds, as SBC-3 allows and LIO and tgt do (LBPRZ: it then
/// reads back as zeroes).
pub async fn write_same(ctx: &mut Ctx<'_>) -> CmdResult {
    let sixteen = ctx.desc.cdb_len() == 16;
    let mut w = WriteSameReq::parse(&ctx.cdb(), sixteen);
    let dev = ctx.dev;
    if w.req.blocks == 0 {
        let nb = dev.num_blocks();
        if w.req.lba >= nb {
            return Err(Sense::lba_out_of_range().into());
        }
        match u32::try_from(nb - w.req.lba) {
            Ok(n) if n <= MAX_WRITE_SAME_BLOCKS => w.req.blocks = n,
            _ => return Err(w.req.bad_len().into()),
        }
    }
    let r = &w.req;
    if r.blocks > MAX_WRITE_SAME_BLOCKS {
        return Err(r.bad_len().into());
    }
    if w.anchor {
        return Err(Sense::invalid_cdb(1, Some(4)).into());
    }
    dev.check_writable()?;
    if w.unmap && !dev.thin() {
        return Err(Sense::invalid_cdb(1, Some(3)).into());
    }
    r.check_range(dev.num_blocks())?;
    let bs = dev.block_size as usize;
    let zero_block;
    let pattern: &[u8] = if w.ndob {
        zero_block = vec![0u8; bs];
        &zero_block
    } else {
        if ctx.data_out_len() != bs {
            return Err(r.bad_len().into());
        }
        ctx.data_out()
    };
    let blocks = u64::from(r.blocks);
    let _g = dev.range_lock.lock(r.lba, blocks, Mode::Shared).await;
    if w.unmap {
        dev.unmap_range(r.lba, blocks).await?;
    } else if pattern.iter().all(|&b| b == 0) {
        dev.write_zeroes(r.lba, blocks, pattern).await?;
    } else {
        let fua = dev.write_fua(false);
        dev.write_pattern(r.lba, blocks, pattern, fua).await?;
    }
    Ok(Done {
        status: Status::Good,
        data: None,
        transfer_len: if w.ndob { 0 } else { bs as u32 },
    })
}

/// One UNMAP block descriptor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnmapDesc {
    pub lba: u64,
    pub blocks: u32,
}

/// Parses and validates an UNMAP parameter list (SBC-4 5.31.2) against the capacity and
/// the Block Limits VPD.
pub fn parse_unmap(data: &[u8], num_blocks: u64) -> Result<Vec<UnmapDesc>, Sense> {
    if data.is_empty() {
        return Ok(Vec::new());
    }
    if data.len() < 8 {
        return Err(Sense::param_list_length());
    }
    let dl = be(&data[0..2]) as usize;
    let bdl = be(&data[2..4]) as usize;
    if dl + 2 > data.len() || bdl + 8 > data.len() {
        return Err(Sense::param_list_length());
    }
    let count = bdl / 16;
    if count > MAX_UNMAP_DESCRIPTORS as usize {
        return Err(Sense::invalid_param(2, None));
    }
    let mut v = Vec::with_capacity(count);
    for i in 0..count {
        let d = &data[8 + 16 * i..8 + 16 * i + 16];
        let lba = be(&d[0..8]);
        let blocks = be(&d[8..12]) as u32;
        if blocks > MAX_UNMAP_BLOCKS {
            return Err(Sense::invalid_param(8 + 16 * i + 8, None));
        }
        match lba.checked_add(u64::from(blocks)) {
            Some(end) if end <= num_blocks => {}
            _ => return Err(Sense::lba_out_of_range()),
        }
        v.push(UnmapDesc { lba, blocks });
    }
    Ok(v)
}

/// UNMAP.
pub async fn unmap(ctx: &mut Ctx<'_>) -> CmdResult {
    let cdb = ctx.cdb();
    if cdb.bit(1, 0x01) {
        // ANCHOR: ANC_SUP=0.
        return Err(Sense::invalid_cdb(1, Some(0)).into());
    }
    let plen = cdb.be(field::PARAM_LEN10) as usize;
    let dev = ctx.dev;
    dev.check_writable()?;
    let data = ctx.data_out();
    let data = &data[..data.len().min(plen)];
    let descs = parse_unmap(data, dev.num_blocks())?;
    for d in descs.iter().filter(|d| d.blocks > 0) {
        let _g = dev
            .range_lock
            .lock(d.lba, u64::from(d.blocks), Mode::Shared)
            .await;
        dev.unmap_range(d.lba, u64::from(d.blocks)).await?;
    }
    Ok(Done::good())
}

/// GET LBA STATUS (SBC-4 5.6).
pub async fn get_lba_status(ctx: &mut Ctx<'_>) -> CmdResult {
    let cdb = ctx.cdb();
    let start = cdb.be(2..10);
    let alloc = cdb.be(field::ALLOC16) as u32;
    let dev = ctx.dev;
    let nb = dev.num_blocks();
    if start >= nb {
        return Err(Sense::lba_out_of_range().into());
    }
    let max_desc = ((alloc.saturating_sub(8)) / 16).clamp(1, 512) as usize;
    let mut b = vec![0u8; 8];
    let mut cursor = start;
    let mut n = 0;
    while n < max_desc && cursor < nb {
        let (mapped, run) = if dev.thin() {
            let (mapped, bytes) = dev
                .backstore
                .lba_status(dev.offset(cursor), dev.bytes(nb - cursor))
                .await
                .map_err(|e| io_error(&e, false))?;
            (
                mapped,
                (bytes / u64::from(dev.block_size)).clamp(1, nb - cursor),
            )
        } else {
            (true, nb - cursor)
        };
        let run = run.min(u64::from(u32::MAX));
        let mut d = [0u8; 16];
        put_be64(&mut d[0..8], cursor);
        put_be32(&mut d[8..12], run as u32);
        d[12] = if mapped { 0 } else { 1 };
        b.extend_from_slice(&d);
        cursor += run;
        n += 1;
    }
    let len = (b.len() - 4) as u32;
    put_be32(&mut b[0..4], len);
    Ok(Done::data(&b, alloc))
}

/// SANITIZE OVERWRITE parameter list (SBC-4 5.26.2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OverwriteParams {
    pub invert: bool,
    pub count: u8,
    pub pattern: Vec<u8>,
}

/// Parses the OVERWRITE parameter list; `plen` is the CDB's PARAMETER LIST LENGTH.
pub fn parse_overwrite(
    data: &[u8],
    plen: usize,
    block_size: usize,
) -> Result<OverwriteParams, Sense> {
    if plen < 5 || plen > block_size + 4 {
        return Err(Sense::invalid_cdb(7, None));
    }
    if data.len() < plen {
        return Err(Sense::param_list_length());
    }
    let data = &data[..plen];
    if data[0] & 0x60 != 0 {
        return Err(Sense::invalid_param(0, Some(6)));
    }
    let count = data[0] & 0x1f;
    if count == 0 {
        return Err(Sense::invalid_param(0, Some(4)));
    }
    if data[1] != 0 {
        return Err(Sense::invalid_param(1, None));
    }
    let plen_pattern = be(&data[2..4]) as usize;
    if plen_pattern == 0 || plen_pattern > plen - 4 {
        return Err(Sense::invalid_param(2, None));
    }
    Ok(OverwriteParams {
        invert: data[0] & 0x80 != 0,
        count,
        pattern: data[4..4 + plen_pattern].to_vec(),
    })
}

/// How a sanitize operation changes the medium.
#[derive(Debug, Clone)]
enum SanitizeMethod {
    Overwrite(OverwriteParams),
    /// BLOCK ERASE and CRYPTOGRAPHIC ERASE: deallocation on a thin-provisioned unit,
    /// zeroes otherwise.
    Erase,
}

impl SanitizeMethod {
    fn name(&self) -> &'static str {
        match self {
            SanitizeMethod::Overwrite(_) => "overwrite",
            SanitizeMethod::Erase => "erase",
        }
    }
}

/// A SANITIZE command with IMMED=0 waiting for its operation.
#[derive(Debug)]
struct Waiter {
    id: u64,
    nexus: u64,
    tag: u64,
    abort: Arc<Notify>,
}

/// Sanitize state of a logical unit (SBC-4 4.11): at most one operation in progress, in
/// the background, and whether the last one failed.
#[derive(Debug, Default)]
pub(crate) struct SanitizeState {
    /// The operation in progress: (work done, total work), in logical blocks.
    progress: Option<(u64, u64)>,
    /// The last operation failed: `Some(AUSE of its command)`.
    failed: Option<bool>,
    waiters: Vec<Waiter>,
    next_waiter: u64,
}

impl SanitizeState {
    pub(crate) fn running(&self) -> bool {
        self.progress.is_some()
    }

    pub(crate) fn failed(&self) -> bool {
        self.failed.is_some()
    }

    /// PROGRESS INDICATION: the fraction done in units of 1/65536.
    fn progress_indication(&self) -> u16 {
        match self.progress {
            Some((done, total)) if total > 0 => {
                let p = u128::from(done.min(total)) * 65536 / u128::from(total);
                p.min(0xffff) as u16
            }
            _ => 0,
        }
    }

    /// NOT READY, SANITIZE IN PROGRESS with the progress indication.
    pub(crate) fn in_progress_sense(&self) -> Sense {
        Sense::new(key::NOT_READY, asc::SANITIZE_IN_PROGRESS)
            .with_key_specific(KeySpecific::Progress(self.progress_indication()))
    }

    /// SANITIZE commands waiting for the operation.
    #[cfg(test)]
    pub(crate) fn waiting(&self) -> usize {
        self.waiters.len()
    }

    /// Ends the waits of the commands `pred(nexus id, tag)` selects.
    pub(crate) fn abort_waiters(&mut self, pred: impl Fn(u64, u64) -> bool) {
        for w in self.waiters.iter().filter(|w| pred(w.nexus, w.tag)) {
            w.abort.notify_one();
        }
    }
}

/// The sense a failed sanitize operation leaves behind (SBC-4 4.11.2).
pub(crate) fn sanitize_failed() -> Sense {
    Sense::new(key::MEDIUM_ERROR, asc::SANITIZE_COMMAND_FAILED)
}

/// Outcome of a sanitize operation, published when it ends.
type Outcome = Option<Result<(), Sense>>;

/// The running operation: publishes its outcome and leaves the in-progress state when it
/// ends, also if its task is dropped.
struct SanitizeRun {
    dev: Arc<Device>,
    ause: bool,
    tx: watch::Sender<Outcome>,
    finished: bool,
}

impl SanitizeRun {
    async fn run(mut self, method: SanitizeMethod) {
        let r = self.dev.sanitize_medium(&method).await;
        self.finish(r);
    }

    fn finish(&mut self, r: Result<(), Sense>) {
        self.finished = true;
        let dev = &self.dev;
        {
            let mut st = dev.lock();
            st.sanitize.progress = None;
            st.sanitize.failed = r.is_err().then_some(self.ause);
        }
        match &r {
            Ok(()) => tracing::info!(device = %dev.config.name, "sanitize completed"),
            Err(s) => tracing::error!(device = %dev.config.name, key = s.key, asc = s.asc,
                ascq = s.ascq, "sanitize failed"),
        }
        self.tx.send_replace(Some(r.map_err(|_| sanitize_failed())));
    }
}

impl Drop for SanitizeRun {
    fn drop(&mut self) {
        if !self.finished {
            self.finish(Err(Sense::internal_failure()));
        }
    }
}

/// Keeps a sanitize operation to a byte rate.
struct Pacer {
    start: tokio::time::Instant,
    rate: u64,
    bytes: u64,
}

impl Pacer {
    fn new(rate: u64) -> Pacer {
        Pacer {
            start: tokio::time::Instant::now(),
            rate,
            bytes: 0,
        }
    }

    /// Accounts `n` bytes written; waits until they are within the rate.
    async fn account(&mut self, n: u64) {
        if self.rate == 0 {
            return;
        }
        self.bytes += n;
        let due = Duration::from_secs_f64(self.bytes as f64 / self.rate as f64);
        tokio::time::sleep_until(self.start + due).await;
    }
}

/// Removes a waiter when its command ends.
struct WaiterGuard<'a> {
    dev: &'a Device,
    id: u64,
}

impl Drop for WaiterGuard<'_> {
    fn drop(&mut self) {
        self.dev.lock().sanitize.waiters.retain(|w| w.id != self.id);
    }
}

impl Device {
    /// Starts a sanitize operation in the background; the receiver sees its outcome.
    fn start_sanitize(
        &self,
        method: SanitizeMethod,
        ause: bool,
    ) -> Result<watch::Receiver<Outcome>, Sense> {
        let dev = self.me.upgrade().ok_or_else(Sense::internal_failure)?;
        let nb = self.num_blocks();
        let total = match &method {
            SanitizeMethod::Overwrite(p) => nb * u64::from(p.count),
            SanitizeMethod::Erase => nb,
        };
        {
            let mut st = self.lock();
            if st.sanitize.running() {
                return Err(st.sanitize.in_progress_sense());
            }
            // Restricted completion mode: after a failure with AUSE=0 only a sanitize with
            // AUSE=0 may follow.
            if st.sanitize.failed == Some(false) && ause {
                return Err(Sense::invalid_cdb(1, Some(5)));
            }
            st.sanitize.progress = Some((0, total.max(1)));
        }
        tracing::info!(device = %self.config.name, method = method.name(), "sanitize started");
        let (tx, rx) = watch::channel(None);
        let run = SanitizeRun {
            dev,
            ause,
            tx,
            finished: false,
        };
        tokio::spawn(run.run(method));
        Ok(rx)
    }

    /// Waits for the outcome of a sanitize operation for a command with IMMED=0, or until the
    /// fabric aborts the command ([`Device::abort_task`]).
    async fn wait_sanitize(
        &self,
        nexus: &Nexus,
        tag: u64,
        mut rx: watch::Receiver<Outcome>,
    ) -> Result<(), Sense> {
        let abort = Arc::new(Notify::new());
        let id = {
            let mut st = self.lock();
            let id = st.sanitize.next_waiter;
            st.sanitize.next_waiter += 1;
            st.sanitize.waiters.push(Waiter {
                id,
                nexus: nexus.id,
                tag,
                abort: abort.clone(),
            });
            id
        };
        let _guard = WaiterGuard { dev: self, id };
        tokio::select! {
            r = rx.wait_for(Option::is_some) => match r {
                Ok(outcome) => (*outcome).unwrap_or_else(|| Err(Sense::internal_failure())),
                Err(_) => Err(Sense::internal_failure()),
            },
            _ = abort.notified() => Err(Sense::new(key::ABORTED_COMMAND, asc::NO_ADDITIONAL)),
        }
    }

    fn sanitize_progress(&self, done: u64, total: u64) {
        self.lock().sanitize.progress = Some((done, total));
    }

    /// The sanitize operation proper: every block, excluding all other access to the
    /// medium, then a cache flush.
    async fn sanitize_medium(&self, method: &SanitizeMethod) -> Result<(), Sense> {
        let nb = self.num_blocks();
        let _g = self.range_lock.lock(0, nb, Mode::Exclusive).await;
        let bs = self.block_size as usize;
        let mut pacer = Pacer::new(self.config.sanitize_rate);
        match method {
            SanitizeMethod::Overwrite(p) => {
                let count = u64::from(p.count);
                let mut block = vec![0u8; bs];
                for (i, b) in block.iter_mut().enumerate() {
                    *b = p.pattern[i % p.pattern.len()];
                }
                for pass in 0..count {
                    // With INVERT the passes alternate so that the last one writes the
                    // pattern itself (SBC-4 5.26.2).
                    let invert = p.invert && (count - pass) % 2 == 0;
                    let pat: Vec<u8> = if invert {
                        block.iter().map(|b| !b).collect()
                    } else {
                        block.clone()
                    };
                    self.sanitize_sweep(&pat, pass * nb, nb * count, &mut pacer)
                        .await?;
                }
            }
            SanitizeMethod::Erase if self.thin() => {
                let step = (SANITIZE_UNMAP_BYTES / self.block_size as u64).max(1);
                let mut lba = 0;
                while lba < nb {
                    let n = step.min(nb - lba);
                    self.unmap_range(lba, n).await?;
                    lba += n;
                    self.sanitize_progress(lba, nb);
                }
            }
            SanitizeMethod::Erase => {
                self.sanitize_sweep(&vec![0u8; bs], 0, nb, &mut pacer)
                    .await?;
            }
        }
        self.backstore.flush().await.map_err(|e| io_error(&e, true))
    }

    /// Writes `block` to every logical block in large chunks at the sanitize rate;
    /// `done` and `total` place the sweep in the operation's progress.
    async fn sanitize_sweep(
        &self,
        block: &[u8],
        done: u64,
        total: u64,
        pacer: &mut Pacer,
    ) -> Result<(), Sense> {
        let nb = self.num_blocks();
        let bs = u64::from(self.block_size);
        let chunk = (SANITIZE_CHUNK_BYTES / bs).clamp(1, nb.max(1));
        // Not from the pool: the buffer is held for as long as the operation runs.
        let mut buf = IoBuf::zeroed((chunk * bs) as usize);
        for b in buf.as_mut_slice().chunks_mut(bs as usize) {
            b.copy_from_slice(&block[..b.len()]);
        }
        let mut lba = 0;
        while lba < nb {
            let n = chunk.min(nb - lba);
            if ((n * bs) as usize) < buf.len() {
                buf.truncate((n * bs) as usize);
            }
            buf = self.write_buf(lba, buf, false).await?;
            lba += n;
            self.sanitize_progress(done + lba, total);
            pacer.account(n * bs).await;
        }
        Ok(())
    }
}

/// SANITIZE (SBC-4 5.26). The operation runs in the background (4.11): the command returns
/// once it completes (IMMED=0) or once the CDB and parameter list are validated (IMMED=1);
/// meanwhile other commands get SANITIZE IN PROGRESS with a progress indication, and the
/// operation survives task management functions and I_T nexus loss.
pub async fn sanitize(ctx: &mut Ctx<'_>) -> CmdResult {
    let cdb = ctx.cdb();
    let sa = cdb.byte(1) & 0x1f;
    let immed = cdb.bit(1, 0x80);
    let ause = cdb.bit(1, 0x20);
    let plen = cdb.be(field::PARAM_LEN10) as usize;
    let dev = ctx.dev;
    let bs = dev.block_size as usize;
    let method = if sa == 0x01 {
        SanitizeMethod::Overwrite(parse_overwrite(ctx.data_out(), plen, bs)?)
    } else {
        if plen != 0 {
            return Err(Sense::invalid_cdb(7, None).into());
        }
        SanitizeMethod::Erase
    };
    if sa == 0x1f {
        // EXIT FAILURE MODE: leaves the failure of a sanitize whose command set AUSE; in
        // the restricted completion mode only a successful sanitize does.
        let mut st = dev.lock();
        if st.sanitize.failed == Some(false) {
            return Err(Sense::invalid_cdb(1, Some(4)).into());
        }
        st.sanitize.failed = None;
        return Ok(Done::good());
    }
    dev.check_writable()?;
    let rx = dev.start_sanitize(method, ause)?;
    if !immed {
        dev.wait_sanitize(ctx.nexus, ctx.tag, rx).await?;
    }
    Ok(Done::good())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unmap_list(descs: &[(u64, u32)]) -> Vec<u8> {
        let mut b = vec![0xa5u8; 8 + 16 * descs.len()];
        let n = b.len();
        b[0..2].copy_from_slice(&((n - 2) as u16).to_be_bytes());
        b[2..4].copy_from_slice(&((n - 8) as u16).to_be_bytes());
        for (i, (lba, nb)) in descs.iter().enumerate() {
            let d = &mut b[8 + 16 * i..];
            d[0..8].copy_from_slice(&lba.to_be_bytes());
            d[8..12].copy_from_slice(&nb.to_be_bytes());
        }
        b
    }

    #[test]
    fn parse_unmap_list() {
        let b = unmap_list(&[(0, 8), (100, 0)]);
        assert_eq!(
            parse_unmap(&b, 100).unwrap(),
            vec![
                UnmapDesc { lba: 0, blocks: 8 },
                UnmapDesc {
                    lba: 100,
                    blocks: 0
                }
            ]
        );
        assert_eq!(parse_unmap(&[], 100).unwrap(), vec![]);
    }

    #[test]
    fn truncated_unmap() {
        let b = unmap_list(&[(0, 8)]);
        assert_eq!(parse_unmap(&b[..7], 100), Err(Sense::param_list_length()));
        assert_eq!(parse_unmap(&b[..20], 100), Err(Sense::param_list_length()));
    }

    #[test]
    fn bad_field_unmap() {
        let b = unmap_list(&[(99, 2)]);
        assert_eq!(parse_unmap(&b, 100), Err(Sense::lba_out_of_range()));
        let b = unmap_list(&[(0, MAX_UNMAP_BLOCKS + 1)]);
        assert_eq!(
            parse_unmap(&b, u64::MAX),
            Err(Sense::invalid_param(16, None))
        );
        let many: Vec<(u64, u32)> = (0..257).map(|i| (i, 1)).collect();
        assert_eq!(
            parse_unmap(&unmap_list(&many), 1000),
            Err(Sense::invalid_param(2, None))
        );
        let b = unmap_list(&[(u64::MAX, 1)]);
        assert_eq!(parse_unmap(&b, 100), Err(Sense::lba_out_of_range()));
    }

    #[test]
    fn parse_overwrite_params() {
        let mut d = vec![0xa5u8; 8];
        d[0] = 0x81;
        d[1] = 0;
        d[2..4].copy_from_slice(&4u16.to_be_bytes());
        let p = parse_overwrite(&d, 8, 512).unwrap();
        assert!(p.invert);
        assert_eq!(p.count, 1);
        assert_eq!(p.pattern, vec![0xa5; 4]);
    }

    #[test]
    fn bad_field_overwrite() {
        let mut d = vec![0u8; 520];
        d[0] = 1;
        d[2..4].copy_from_slice(&512u16.to_be_bytes());
        for plen in 0..5 {
            assert_eq!(
                parse_overwrite(&d, plen, 512),
                Err(Sense::invalid_cdb(7, None))
            );
        }
        assert_eq!(
            parse_overwrite(&d, 517, 512),
            Err(Sense::invalid_cdb(7, None))
        );
        assert!(parse_overwrite(&d, 516, 512).is_ok());
        d[0] = 0;
        assert_eq!(
            parse_overwrite(&d, 516, 512),
            Err(Sense::invalid_param(0, Some(4)))
        );
        d[0] = 1;
        d[2..4].copy_from_slice(&0u16.to_be_bytes());
        assert_eq!(
            parse_overwrite(&d, 516, 512),
            Err(Sense::invalid_param(2, None))
        );
        d[2..4].copy_from_slice(&516u16.to_be_bytes());
        assert_eq!(
            parse_overwrite(&d, 516, 512),
            Err(Sense::invalid_param(2, None))
        );
        assert_eq!(
            parse_overwrite(&d[..10], 516, 512),
            Err(Sense::param_list_length())
        );
    }

    #[test]
    fn difference() {
        assert_eq!(first_difference(b"abcd", b"abxd"), Some(2));
        assert_eq!(first_difference(b"abcd", b"abcd"), None);
    }
}
