//! Handler tests through `Device::execute` on a RAM backstore: each command's good path and
//! the status / sense the libiscsi conformance tests expect for its error cases.

use std::sync::Arc;

use async_trait::async_trait;
use rtgt_backstore::{
    Backstore, BackstoreError, BufPool, BufResult, DeviceInfo, IoBuf, RamBackstore,
};

use super::sense::{asc, key, Sense};
use super::*;

const BS: u32 = 512;
const NB: u64 = 4096;

fn cfg() -> DeviceConfig {
    DeviceConfig {
        name: "test".into(),
        serial: "SERIAL0001".into(),
        wwn: 0x6001_4050_0000_0000_0000_0000_0000_0001,
        thin: true,
        sanitize_rate: 0,
        ..Default::default()
    }
}

fn ram() -> Arc<dyn Backstore> {
    Arc::new(TestStore::new())
}

/// A RAM backstore with block-granular allocation tracking (GET LBA STATUS answers per
/// block) that records the FUA flag of every write.
struct TestStore {
    inner: RamBackstore,
    mapped: std::sync::Mutex<Vec<bool>>,
    fua: std::sync::Mutex<Vec<bool>>,
    /// errno every read and write fails with (0: none).
    fail: std::sync::atomic::AtomicI32,
}

impl TestStore {
    fn new() -> TestStore {
        TestStore {
            inner: RamBackstore::new(NB * u64::from(BS), BS),
            mapped: std::sync::Mutex::new(vec![false; NB as usize]),
            fua: Default::default(),
            fail: Default::default(),
        }
    }

    fn failure(&self, offset: u64, len: usize, write: bool) -> Option<BackstoreError> {
        let errno = self.fail.load(std::sync::atomic::Ordering::Relaxed);
        if errno == 0 {
            return None;
        }
        let source = std::io::Error::from_raw_os_error(errno);
        let len = len as u64;
        Some(if write {
            BackstoreError::Write {
                offset,
                len,
                source,
            }
        } else {
            BackstoreError::Read {
                offset,
                len,
                source,
            }
        })
    }

    fn mark(&self, offset: u64, len: u64, mapped: bool) {
        let mut m = self.mapped.lock().unwrap();
        let b = u64::from(BS);
        for i in offset / b..(offset + len) / b {
            m[i as usize] = mapped;
        }
    }
}

#[async_trait]
impl Backstore for TestStore {
    fn info(&self) -> DeviceInfo {
        self.inner.info()
    }
    async fn read(&self, offset: u64, buf: IoBuf) -> BufResult<()> {
        if let Some(e) = self.failure(offset, buf.len(), false) {
            return (Err(e), buf);
        }
        self.inner.read(offset, buf).await
    }
    async fn write(&self, offset: u64, buf: IoBuf, fua: bool) -> BufResult<()> {
        if let Some(e) = self.failure(offset, buf.len(), true) {
            return (Err(e), buf);
        }
        self.fua.lock().unwrap().push(fua);
        let len = buf.len() as u64;
        let r = self.inner.write(offset, buf, fua).await;
        if r.0.is_ok() {
            self.mark(offset, len, true);
        }
        r
    }
    async fn flush(&self) -> Result<(), BackstoreError> {
        self.inner.flush().await
    }
    async fn unmap(&self, offset: u64, len: u64) -> Result<(), BackstoreError> {
        self.inner.unmap(offset, len).await?;
        self.mark(offset, len, false);
        Ok(())
    }
    async fn lba_status(&self, offset: u64, len: u64) -> Result<(bool, u64), BackstoreError> {
        let m = self.mapped.lock().unwrap();
        let b = u64::from(BS);
        let first = (offset / b) as usize;
        let end = ((offset + len) / b) as usize;
        let st = m[first];
        let run = m[first..end].iter().take_while(|&&x| x == st).count() as u64;
        Ok((st, run * b))
    }
    async fn resize(&self, num_blocks: u64) -> Result<(), BackstoreError> {
        self.inner.resize(num_blocks).await
    }
}

fn make_with(backstore: Arc<dyn Backstore>, cfg: DeviceConfig) -> Arc<Device> {
    Device::new(backstore, BufPool::new(64 << 20), cfg).unwrap()
}

fn make(cfg: DeviceConfig) -> Arc<Device> {
    make_with(ram(), cfg)
}

fn nx(id: u64) -> Nexus {
    Nexus {
        id,
        initiator_port: format!("iqn.2024-01.test:init{id},i,0x00023d000001"),
        transport_id: Vec::new(),
        target_port: "iqn.2025-01.io.rtgt:disk,t,0x0001".into(),
        relative_port: 1,
        port_group: 1,
    }
}

async fn run(dev: &Device, n: &Nexus, cdb: &[u8], out: Option<&[u8]>, edtl: u32) -> Response {
    dev.execute(
        n,
        Command {
            cdb: cdb.into(),
            data_out: out.map(IoBuf::from_slice),
            expected_in_len: edtl,
            attr: TaskAttr::Simple,
            tag: 0,
        },
    )
    .await
}

/// Consumes pending unit attentions with TEST UNIT READY, as an initiator does at login.
async fn ready(dev: &Device, n: &Nexus) {
    for _ in 0..8 {
        if run(dev, n, &[0; 6], None, 0).await.status == Status::Good {
            return;
        }
    }
    panic!("unit attentions do not clear");
}

async fn setup() -> (Arc<Device>, Nexus) {
    let dev = make(cfg());
    let n = nx(1);
    ready(&dev, &n).await;
    (dev, n)
}

fn sense_of(r: &Response) -> (u8, u8, u8) {
    assert_eq!(r.status, Status::CheckCondition, "{r:?}");
    Sense::parse(r.sense.as_ref().expect("sense")).expect("parsable sense")
}

#[track_caller]
fn check(r: &Response, key: u8, code: asc::Code) {
    assert_eq!(sense_of(r), (key, code.0, code.1), "{r:?}");
}

#[track_caller]
fn good(r: &Response) {
    assert_eq!(
        r.status,
        Status::Good,
        "{:?}",
        r.sense.as_ref().map(|s| Sense::parse(s))
    );
}

#[track_caller]
fn invalid_cdb(r: &Response) {
    check(r, key::ILLEGAL_REQUEST, asc::INVALID_FIELD_IN_CDB);
}

#[track_caller]
fn lba_oob(r: &Response) {
    check(r, key::ILLEGAL_REQUEST, asc::LBA_OUT_OF_RANGE);
}

fn data(r: &Response) -> Vec<u8> {
    r.data_in.as_ref().map(|d| d.to_vec()).unwrap_or_default()
}

fn rw6(op: u8, lba: u32, n: u8) -> Vec<u8> {
    vec![
        op,
        (lba >> 16) as u8 & 0x1f,
        (lba >> 8) as u8,
        lba as u8,
        n,
        0,
    ]
}

fn rw10(op: u8, lba: u32, n: u16, flags: u8) -> Vec<u8> {
    let mut c = vec![op, flags, 0, 0, 0, 0, 0, 0, 0, 0];
    c[2..6].copy_from_slice(&lba.to_be_bytes());
    c[7..9].copy_from_slice(&n.to_be_bytes());
    c
}

fn rw12(op: u8, lba: u32, n: u32, flags: u8) -> Vec<u8> {
    let mut c = vec![op, flags, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    c[2..6].copy_from_slice(&lba.to_be_bytes());
    c[6..10].copy_from_slice(&n.to_be_bytes());
    c
}

fn rw16(op: u8, lba: u64, n: u32, flags: u8) -> Vec<u8> {
    let mut c = vec![0u8; 16];
    c[0] = op;
    c[1] = flags;
    c[2..10].copy_from_slice(&lba.to_be_bytes());
    c[10..14].copy_from_slice(&n.to_be_bytes());
    c
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(7).wrapping_add(seed))
        .collect()
}

async fn read_blocks(dev: &Device, n: &Nexus, lba: u64, blocks: u32) -> Vec<u8> {
    let r = run(dev, n, &rw16(0x88, lba, blocks, 0), None, blocks * BS).await;
    good(&r);
    data(&r)
}

async fn write_blocks(dev: &Device, n: &Nexus, lba: u64, d: &[u8]) {
    let blocks = (d.len() / BS as usize) as u32;
    good(&run(dev, n, &rw16(0x8a, lba, blocks, 0), Some(d), 0).await);
}

// ---- admission, unit attentions ----------------------------------------------------------

#[tokio::test]
async fn power_on_unit_attention_and_exempt_commands() {
    let dev = make(cfg());
    let n = nx(1);
    good(&run(&dev, &n, &[0x12, 0, 0, 0, 36, 0], None, 36).await);
    good(
        &run(
            &dev,
            &n,
            &[0xa0, 0, 0, 0, 0, 0, 0, 0, 0, 64, 0, 0],
            None,
            64,
        )
        .await,
    );
    check(
        &run(&dev, &n, &[0; 6], None, 0).await,
        key::UNIT_ATTENTION,
        asc::POWER_ON_RESET,
    );
    good(&run(&dev, &n, &[0; 6], None, 0).await);
}

#[tokio::test]
async fn request_sense_reports_and_clears_ua() {
    let dev = make(cfg());
    let n = nx(1);
    let r = run(&dev, &n, &[0x03, 0, 0, 0, 252, 0], None, 252).await;
    good(&r);
    let d = data(&r);
    assert_eq!(d.len(), 18);
    assert_eq!(Sense::parse(&d), Some((key::UNIT_ATTENTION, 0x29, 0)));
    good(&run(&dev, &n, &[0; 6], None, 0).await);
    // Descriptor format on request, NO SENSE when nothing is pending.
    let r = run(&dev, &n, &[0x03, 1, 0, 0, 252, 0], None, 252).await;
    let d = data(&r);
    assert_eq!(d[0], 0x72);
    assert_eq!(Sense::parse(&d), Some((0, 0, 0)));
}

#[tokio::test]
async fn unknown_opcodes_and_cdb_checks() {
    let (dev, n) = setup().await;
    check(
        &run(&dev, &n, &[0x7f, 0, 0, 0, 0, 0, 0, 0x18, 0, 0], None, 0).await,
        key::ILLEGAL_REQUEST,
        asc::INVALID_OPCODE,
    );
    check(
        &run(&dev, &n, &[0xc0, 0, 0, 0, 0, 0], None, 0).await,
        key::ILLEGAL_REQUEST,
        asc::INVALID_OPCODE,
    );
    check(
        &run(&dev, &n, &[], None, 0).await,
        key::ILLEGAL_REQUEST,
        asc::INVALID_OPCODE,
    );
    // Short CDB.
    invalid_cdb(&run(&dev, &n, &[0x28, 0, 0], None, 0).await);
    // NACA in the control byte, with a field pointer at byte 9 bit 2.
    let r = run(&dev, &n, &[0x28, 0, 0, 0, 0, 0, 0, 0, 1, 0x04], None, 512).await;
    let s = r.sense.unwrap();
    assert_eq!(&s[15..18], &[0xc8 | 2, 0, 9]);
    // Unknown service action of SERVICE ACTION IN(16).
    invalid_cdb(&run(&dev, &n, &rw16(0x9e, 0, 0, 0x11), None, 0).await);
}

#[tokio::test]
async fn lun_reset_and_nexus_loss() {
    let (dev, n) = setup().await;
    let n2 = nx(2);
    ready(&dev, &n2).await;
    good(&run(&dev, &n, &[0x16, 0, 0, 0, 0, 0], None, 0).await);
    assert_eq!(
        run(&dev, &n2, &[0; 6], None, 0).await.status,
        Status::ReservationConflict
    );
    dev.lun_reset(&n);
    check(
        &run(&dev, &n, &[0; 6], None, 0).await,
        key::UNIT_ATTENTION,
        asc::BUS_DEVICE_RESET,
    );
    check(
        &run(&dev, &n2, &[0; 6], None, 0).await,
        key::UNIT_ATTENTION,
        asc::BUS_DEVICE_RESET,
    );
    // The SPC-2 reservation is gone.
    good(&run(&dev, &n2, &[0x16, 0, 0, 0, 0, 0], None, 0).await);
    assert_eq!(
        run(&dev, &n, &[0; 6], None, 0).await.status,
        Status::ReservationConflict
    );
    dev.nexus_loss(&n2);
    good(&run(&dev, &n, &[0x16, 0, 0, 0, 0, 0], None, 0).await);
    // A new session of the lost nexus starts with POWER ON.
    let r = run(&dev, &n2, &[0x12, 0, 0, 0, 36, 0], None, 36).await;
    good(&r);
    check(
        &run(&dev, &n2, &[0; 6], None, 0).await,
        key::UNIT_ATTENTION,
        asc::POWER_ON_RESET,
    );
}

#[tokio::test]
async fn capacity_and_luns_changed_ua() {
    let (dev, n) = setup().await;
    dev.capacity_changed();
    check(
        &run(&dev, &n, &[0; 6], None, 0).await,
        key::UNIT_ATTENTION,
        asc::CAPACITY_DATA_CHANGED,
    );
    dev.reported_luns_changed();
    let mut map = LunMap::default();
    map.luns.insert(0, dev.clone());
    // REPORT LUNS clears REPORTED LUNS DATA HAS CHANGED.
    good(
        &map.execute(
            &n,
            0,
            Command {
                cdb: [0xa0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0][..].into(),
                data_out: None,
                expected_in_len: 256,
                attr: TaskAttr::Simple,
                tag: 0,
            },
        )
        .await,
    );
    good(&run(&dev, &n, &[0; 6], None, 0).await);
}

// ---- INQUIRY and VPD ---------------------------------------------------------------------

#[tokio::test]
async fn inquiry_standard() {
    let (dev, n) = setup().await;
    let r = run(&dev, &n, &[0x12, 0, 0, 1, 4, 0], None, 260).await;
    good(&r);
    let d = data(&r);
    assert_eq!(d.len(), spc::STD_INQUIRY_LEN);
    assert_eq!(usize::from(d[4]) + 5, d.len());
    assert_eq!(d[0], 0);
    assert_eq!(d[2], 6);
    assert_eq!(d[3] & 0x0f, 2);
    assert_eq!(&d[8..16], b"RTGT    ");
    assert_eq!(&d[58..64], &[0x00, 0xa0, 0x04, 0x60, 0x04, 0xc0]);
    for alloc in 5..256u16 {
        let mut c = vec![0x12, 0, 0, 0, 0, 0];
        c[3..5].copy_from_slice(&alloc.to_be_bytes());
        let r = run(&dev, &n, &c, None, u32::from(alloc)).await;
        good(&r);
        assert_eq!(r.data_in.unwrap().len(), usize::from(alloc).min(d.len()));
    }
    // EVPD=0 with a page code.
    invalid_cdb(&run(&dev, &n, &[0x12, 0, 1, 1, 0, 0], None, 256).await);
    // CMDDT (obsolete).
    invalid_cdb(&run(&dev, &n, &[0x12, 2, 0, 0, 36, 0], None, 36).await);
}

#[tokio::test]
async fn inquiry_vpd_pages() {
    let (dev, n) = setup().await;
    let r = run(&dev, &n, &[0x12, 1, 0, 0, 255, 0], None, 255).await;
    let pages = data(&r)[4..].to_vec();
    assert_eq!(pages, vec![0x00, 0x80, 0x83, 0x86, 0xb0, 0xb1, 0xb2]);
    for p in pages {
        let r = run(&dev, &n, &[0x12, 1, p, 0, 255, 0], None, 255).await;
        good(&r);
        let d = data(&r);
        assert_eq!(d[1], p);
        assert_eq!(usize::from(u16::from_be_bytes([d[2], d[3]])) + 4, d.len());
    }
    invalid_cdb(&run(&dev, &n, &[0x12, 1, 0x87, 0, 255, 0], None, 255).await);
    // Serial number.
    let d = data(&run(&dev, &n, &[0x12, 1, 0x80, 0, 255, 0], None, 255).await);
    assert_eq!(&d[4..], b"SERIAL0001");
    // Device identification: NAA first.
    let d = data(&run(&dev, &n, &[0x12, 1, 0x83, 0, 255, 0], None, 255).await);
    assert_eq!(&d[4..8], &[0x01, 0x03, 0, 16]);
    assert_eq!(&d[8..24], dev.naa());
    // Block limits: SBC-3 length, WSNZ=0, limits, granularities of one logical block.
    let d = data(&run(&dev, &n, &[0x12, 1, 0xb0, 0, 255, 0], None, 255).await);
    assert_eq!(d.len(), 64);
    assert_eq!(d[3], 0x3c);
    assert_eq!(d[4], 0);
    assert_eq!(d[5], 255);
    assert_eq!(&d[6..8], &[0, 1]);
    assert_eq!(u32::from_be_bytes(d[28..32].try_into().unwrap()), 1);
    assert_eq!(&d[32..36], &[0x80, 0, 0, 0]);
    assert_eq!(
        u32::from_be_bytes(d[8..12].try_into().unwrap()),
        MAX_TRANSFER_BYTES / BS
    );
    assert_eq!(
        u32::from_be_bytes(d[20..24].try_into().unwrap()),
        sbc::MAX_UNMAP_BLOCKS
    );
    assert_eq!(
        u32::from_be_bytes(d[24..28].try_into().unwrap()),
        sbc::MAX_UNMAP_DESCRIPTORS
    );
    assert_eq!(u64::from_be_bytes(d[36..44].try_into().unwrap()), 0xffff);
    // Logical block provisioning: LBPU, LBPWS, LBPWS10, LBPRZ, thin.
    let d = data(&run(&dev, &n, &[0x12, 1, 0xb2, 0, 255, 0], None, 255).await);
    assert_eq!(&d[4..8], &[0, 0xe4, 0x02, 0]);
}

#[tokio::test]
async fn fully_provisioned_has_no_unmap() {
    let dev = make(DeviceConfig {
        thin: false,
        ..cfg()
    });
    let n = nx(1);
    ready(&dev, &n).await;
    let d = data(&run(&dev, &n, &[0x12, 1, 0xb2, 0, 255, 0], None, 255).await);
    assert_eq!(&d[4..8], &[0, 0, 0, 0]);
    let d = data(&run(&dev, &n, &rw16(0x9e, 0, 32, 0x10), None, 32).await);
    assert_eq!(d[14], 0);
    check(
        &run(
            &dev,
            &n,
            &[0x42, 0, 0, 0, 0, 0, 0, 0, 24, 0],
            Some(&[0; 24]),
            0,
        )
        .await,
        key::ILLEGAL_REQUEST,
        asc::INVALID_OPCODE,
    );
    let mut ws = rw10(0x41, 0, 1, 0x08);
    ws[9] = 0;
    invalid_cdb(&run(&dev, &n, &ws, Some(&[0; 512]), 0).await);
    // GET LBA STATUS: everything mapped.
    let d = data(&run(&dev, &n, &rw16(0x9e, 0, 24, 0x12), None, 24).await);
    assert_eq!(u32::from_be_bytes(d[16..20].try_into().unwrap()) as u64, NB);
    assert_eq!(d[20], 0);
}

// ---- capacity ------------------------------------------------------------------------------

#[tokio::test]
async fn read_capacity() {
    let (dev, n) = setup().await;
    let d = data(&run(&dev, &n, &[0x25, 0, 0, 0, 0, 0, 0, 0, 0, 0], None, 8).await);
    assert_eq!(d, [0, 0, 0x0f, 0xff, 0, 0, 2, 0]);
    invalid_cdb(&run(&dev, &n, &[0x25, 0, 0, 0, 0, 1, 0, 0, 0, 0], None, 8).await);
    let d = data(&run(&dev, &n, &rw16(0x9e, 0, 32, 0x10), None, 32).await);
    assert_eq!(u64::from_be_bytes(d[0..8].try_into().unwrap()), NB - 1);
    assert_eq!(d[14], 0xc0);
    for alloc in 0..16 {
        let r = run(&dev, &n, &rw16(0x9e, 0, alloc, 0x10), None, alloc).await;
        good(&r);
        assert_eq!(r.transfer_len, alloc);
    }
}

// ---- READ / WRITE ----------------------------------------------------------------------

#[tokio::test]
async fn read_write_all_sizes() {
    let (dev, n) = setup().await;
    let d = pattern(4 * BS as usize, 1);
    good(&run(&dev, &n, &rw6(0x0a, 10, 4), Some(&d), 0).await);
    let r = run(&dev, &n, &rw6(0x08, 10, 4), None, 4 * BS).await;
    assert_eq!(data(&r), d);
    let d = pattern(3 * BS as usize, 2);
    good(&run(&dev, &n, &rw10(0x2a, 20, 3, 0x18), Some(&d), 0).await);
    assert_eq!(
        data(&run(&dev, &n, &rw10(0x28, 20, 3, 0x18), None, 3 * BS).await),
        d
    );
    good(&run(&dev, &n, &rw12(0xaa, 30, 3, 0x08), Some(&d), 0).await);
    assert_eq!(
        data(&run(&dev, &n, &rw12(0xa8, 30, 3, 0x10), None, 3 * BS).await),
        d
    );
    good(&run(&dev, &n, &rw16(0x8a, NB - 3, 3, 0x02), Some(&d), 0).await);
    assert_eq!(read_blocks(&dev, &n, NB - 3, 3).await, d);
    // READ(6) with length 0 transfers 256 blocks.
    let r = run(&dev, &n, &rw6(0x08, 0, 0), None, 256 * BS).await;
    assert_eq!(r.data_in.unwrap().len(), 256 * BS as usize);
}

#[tokio::test]
async fn read_write_range_and_fields() {
    let (dev, n) = setup().await;
    lba_oob(&run(&dev, &n, &rw10(0x28, NB as u32, 1, 0), None, 512).await);
    lba_oob(&run(&dev, &n, &rw10(0x28, NB as u32 + 1, 0, 0), None, 0).await);
    lba_oob(&run(&dev, &n, &rw10(0x28, NB as u32 - 1, 2, 0), None, 1024).await);
    lba_oob(&run(&dev, &n, &rw16(0x88, u64::MAX, 1, 0), None, 512).await);
    lba_oob(&run(&dev, &n, &rw16(0x88, 1 << 63, 1, 0), None, 512).await);
    lba_oob(&run(&dev, &n, &rw6(0x08, 0x1f_ffff, 1), None, 512).await);
    good(&run(&dev, &n, &rw10(0x28, 0, 0, 0), None, 0).await);
    good(&run(&dev, &n, &rw10(0x2a, 0, 0, 0), None, 0).await);
    for prot in 1..8u8 {
        invalid_cdb(&run(&dev, &n, &rw10(0x28, 0, 1, prot << 5), None, 512).await);
        invalid_cdb(&run(&dev, &n, &rw16(0x8a, 0, 1, prot << 5), Some(&[0; 512]), 0).await);
    }
    // Transfer length above the Block Limits maximum.
    let max = MAX_TRANSFER_BYTES / BS;
    let r = run(&dev, &n, &rw16(0x88, 0, max + 1, 0), None, 0).await;
    invalid_cdb(&r);
    assert_eq!(&r.sense.unwrap()[15..18], &[0xc0, 0, 10]);
}

#[tokio::test]
async fn read_residuals() {
    let (dev, n) = setup().await;
    // Expected length 0: nothing read, transfer length still one block (overflow).
    let r = run(&dev, &n, &rw10(0x28, 0, 1, 0), None, 0).await;
    good(&r);
    assert!(r.data_in.is_none());
    assert_eq!(r.transfer_len, BS);
    let r = run(&dev, &n, &rw10(0x28, 0, 1, 0), None, 200).await;
    assert_eq!(r.data_in.unwrap().len(), 200);
    assert_eq!(r.transfer_len, BS);
    let r = run(&dev, &n, &rw10(0x28, 0, 1, 0), None, 10000).await;
    assert_eq!(r.data_in.unwrap().len(), BS as usize);
    assert_eq!(r.transfer_len, BS);
    let r = run(&dev, &n, &rw10(0x28, 0, 2, 0), None, BS).await;
    assert_eq!(r.data_in.unwrap().len(), BS as usize);
    assert_eq!(r.transfer_len, 2 * BS);
}

#[tokio::test]
async fn write_residuals_write_what_was_received() {
    let (dev, n) = setup().await;
    let a = vec![b'a'; 2 * BS as usize];
    let b = vec![b'b'; 2 * BS as usize];
    write_blocks(&dev, &n, 0, &a).await;
    // Two blocks announced, one received: only the first is written.
    let r = run(&dev, &n, &rw10(0x2a, 0, 2, 0), Some(&b[..BS as usize]), 0).await;
    good(&r);
    assert_eq!(r.transfer_len, 2 * BS);
    let d = read_blocks(&dev, &n, 0, 2).await;
    assert!(d[..512].iter().all(|&x| x == b'b') && d[512..].iter().all(|&x| x == b'a'));
    // One block announced, two received: only one is written.
    write_blocks(&dev, &n, 0, &a).await;
    good(&run(&dev, &n, &rw10(0x2a, 0, 1, 0), Some(&b), 0).await);
    let d = read_blocks(&dev, &n, 0, 2).await;
    assert!(d[..512].iter().all(|&x| x == b'b') && d[512..].iter().all(|&x| x == b'a'));
    // Nothing or a partial block received.
    good(&run(&dev, &n, &rw10(0x2a, 0, 1, 0), None, 0).await);
    good(&run(&dev, &n, &rw10(0x2a, 0, 1, 0), Some(&b[..200]), 0).await);
}

fn caching_page(wce: bool) -> Vec<u8> {
    let mut d = vec![0u8, 0, 0, 0, 0x08, 0x12];
    d.extend_from_slice(&[0u8; 18]);
    if wce {
        d[6] = 0x04;
    }
    d
}

#[tokio::test]
async fn mode_select_wce_controls_write_durability() {
    let rec = Arc::new(TestStore::new());
    let dev = make_with(rec.clone(), cfg());
    let n = nx(1);
    let n2 = nx(2);
    ready(&dev, &n).await;
    ready(&dev, &n2).await;
    let blk = vec![1u8; BS as usize];
    good(&run(&dev, &n, &rw10(0x2a, 0, 1, 0), Some(&blk), 0).await);
    good(&run(&dev, &n, &rw10(0x2a, 0, 1, 0x08), Some(&blk), 0).await);
    let sel = caching_page(false);
    good(
        &run(
            &dev,
            &n,
            &[0x15, 0x10, 0, 0, sel.len() as u8, 0],
            Some(&sel),
            0,
        )
        .await,
    );
    good(&run(&dev, &n, &rw10(0x2a, 0, 1, 0), Some(&blk), 0).await);
    assert_eq!(*rec.fua.lock().unwrap(), vec![false, true, true]);
    // The caching page reports WCE=0 and the other nexus is told.
    let d = data(&run(&dev, &n, &[0x1a, 0x08, 0x08, 0, 255, 0], None, 255).await);
    assert_eq!(d[6] & 0x04, 0);
    check(
        &run(&dev, &n2, &[0; 6], None, 0).await,
        key::UNIT_ATTENTION,
        asc::MODE_PARAMETERS_CHANGED,
    );
    good(&run(&dev, &n, &[0; 6], None, 0).await);
}

#[tokio::test]
async fn backstore_errors_map_to_sense() {
    let store = Arc::new(TestStore::new());
    let dev = make_with(store.clone(), cfg());
    let n = nx(1);
    ready(&dev, &n).await;
    store
        .fail
        .store(libc::EIO, std::sync::atomic::Ordering::Relaxed);
    check(
        &run(&dev, &n, &rw10(0x28, 0, 1, 0), None, 512).await,
        key::MEDIUM_ERROR,
        asc::UNRECOVERED_READ_ERROR,
    );
    check(
        &run(&dev, &n, &rw10(0x2a, 0, 1, 0), Some(&[0; 512]), 0).await,
        key::MEDIUM_ERROR,
        asc::WRITE_ERROR,
    );
    store
        .fail
        .store(libc::ENOSPC, std::sync::atomic::Ordering::Relaxed);
    check(
        &run(&dev, &n, &rw10(0x2a, 0, 1, 0), Some(&[0; 512]), 0).await,
        key::DATA_PROTECT,
        (0x27, 0x07),
    );
    store
        .fail
        .store(libc::EINVAL, std::sync::atomic::Ordering::Relaxed);
    check(
        &run(&dev, &n, &rw10(0x28, 0, 1, 0), None, 512).await,
        key::HARDWARE_ERROR,
        asc::INTERNAL_TARGET_FAILURE,
    );
}

// ---- VERIFY / WRITE AND VERIFY ---------------------------------------------------------

#[tokio::test]
async fn verify_bytchk() {
    let (dev, n) = setup().await;
    let d = pattern(4 * BS as usize, 9);
    write_blocks(&dev, &n, 100, &d).await;
    good(&run(&dev, &n, &rw10(0x2f, 100, 4, 0x02), Some(&d), 0).await);
    good(&run(&dev, &n, &rw12(0xaf, 100, 4, 0x12), Some(&d), 0).await);
    let mut bad = d.clone();
    bad[1000] ^= b'X';
    let r = run(&dev, &n, &rw16(0x8f, 100, 4, 0x02), Some(&bad), 0).await;
    check(&r, key::MISCOMPARE, asc::MISCOMPARE_DURING_VERIFY);
    let s = r.sense.unwrap();
    assert_eq!(s[0], 0xf0);
    assert_eq!(u32::from_be_bytes(s[3..7].try_into().unwrap()), 1000);
    // BYTCHK=0 only checks the range; the data-out is ignored.
    good(&run(&dev, &n, &rw10(0x2f, 100, 4, 0), Some(&bad), 0).await);
    lba_oob(&run(&dev, &n, &rw10(0x2f, NB as u32 + 1, 0, 0x02), None, 0).await);
    invalid_cdb(&run(&dev, &n, &rw10(0x2f, 100, 4, 0x04), Some(&d), 0).await);
    for p in 1..8u8 {
        invalid_cdb(
            &run(
                &dev,
                &n,
                &rw10(0x2f, 100, 1, (p << 5) | 0x02),
                Some(&d[..512]),
                0,
            )
            .await,
        );
    }
    // BYTCHK=3: one block compared with every block.
    let same = vec![0x5au8; 3 * BS as usize];
    write_blocks(&dev, &n, 200, &same).await;
    good(&run(&dev, &n, &rw10(0x2f, 200, 3, 0x06), Some(&same[..512]), 0).await);
    let r = run(&dev, &n, &rw10(0x2f, 199, 3, 0x06), Some(&same[..512]), 0).await;
    check(&r, key::MISCOMPARE, asc::MISCOMPARE_DURING_VERIFY);
}

#[tokio::test]
async fn write_and_verify() {
    let (dev, n) = setup().await;
    let d = pattern(2 * BS as usize, 3);
    good(&run(&dev, &n, &rw10(0x2e, 50, 2, 0x12), Some(&d), 0).await);
    assert_eq!(read_blocks(&dev, &n, 50, 2).await, d);
    good(&run(&dev, &n, &rw16(0x8e, 60, 2, 0x00), Some(&d), 0).await);
    good(&run(&dev, &n, &rw12(0xae, 0, 0, 0), None, 0).await);
    lba_oob(&run(&dev, &n, &rw10(0x2e, NB as u32 - 1, 2, 0x02), Some(&d), 0).await);
    invalid_cdb(&run(&dev, &n, &rw10(0x2e, 0, 1, 0x08), Some(&d[..512]), 0).await);
    invalid_cdb(&run(&dev, &n, &rw10(0x2e, 0, 1, 0x04), Some(&d[..512]), 0).await);
}

// ---- ORWRITE, COMPARE AND WRITE, WRITE ATOMIC -----------------------------------------------

#[tokio::test]
async fn orwrite() {
    let (dev, n) = setup().await;
    write_blocks(&dev, &n, 0, &vec![0xa5; 512]).await;
    good(&run(&dev, &n, &rw16(0x8b, 0, 1, 0x18), Some(&[0x5a; 512]), 0).await);
    assert!(read_blocks(&dev, &n, 0, 1).await.iter().all(|&x| x == 0xff));
    lba_oob(&run(&dev, &n, &rw16(0x8b, NB + 1, 0, 0), None, 0).await);
    invalid_cdb(&run(&dev, &n, &rw16(0x8b, 0, 1, 0x20), Some(&[0; 512]), 0).await);
}

fn caw(lba: u64, blocks: u8, flags: u8) -> Vec<u8> {
    let mut c = rw16(0x89, lba, 0, flags);
    c[13] = blocks;
    c
}

#[tokio::test]
async fn compare_and_write() {
    let (dev, n) = setup().await;
    write_blocks(&dev, &n, 5, &vec![b'A'; 1024]).await;
    let mut buf = vec![b'A'; 1024];
    buf.extend(vec![b'B'; 1024]);
    good(&run(&dev, &n, &caw(5, 2, 0x18), Some(&buf), 0).await);
    assert!(read_blocks(&dev, &n, 5, 2).await.iter().all(|&x| x == b'B'));
    // Miscompare: INFORMATION is the offset of the first difference; nothing written.
    let mut buf = vec![b'B'; 1024];
    buf[700] = b'C';
    buf.extend(vec![b'D'; 1024]);
    let r = run(&dev, &n, &caw(5, 2, 0), Some(&buf), 0).await;
    check(&r, key::MISCOMPARE, asc::MISCOMPARE_DURING_VERIFY);
    let s = r.sense.unwrap();
    assert_eq!(s[0] & 0x80, 0x80);
    assert_eq!(u32::from_be_bytes(s[3..7].try_into().unwrap()), 700);
    assert!(read_blocks(&dev, &n, 5, 2).await.iter().all(|&x| x == b'B'));
    // Data-out size must match; zero blocks with an oversized buffer is also an error.
    invalid_cdb(&run(&dev, &n, &caw(5, 1, 0), Some(&buf), 0).await);
    invalid_cdb(&run(&dev, &n, &caw(5, 0, 0), Some(&buf), 0).await);
    good(&run(&dev, &n, &caw(5, 0, 0), None, 0).await);
    lba_oob(&run(&dev, &n, &caw(NB - 1, 2, 0), Some(&buf), 0).await);
    // Descriptor-format sense carries the INFORMATION descriptor.
    let ctl = control_page(0x06, 0);
    good(
        &run(
            &dev,
            &n,
            &[0x15, 0x10, 0, 0, ctl.len() as u8, 0],
            Some(&ctl),
            0,
        )
        .await,
    );
    let mut buf = vec![b'X'; 1024];
    buf.extend(vec![b'D'; 1024]);
    let r = run(&dev, &n, &caw(5, 2, 0), Some(&buf), 0).await;
    let s = r.sense.unwrap();
    assert_eq!(&s[..4], &[0x72, key::MISCOMPARE, 0x1d, 0]);
    assert_eq!(&s[8..12], &[0, 0x0a, 0x80, 0]);
    assert_eq!(u64::from_be_bytes(s[12..20].try_into().unwrap()), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn compare_and_write_is_atomic_against_writers() {
    let (dev, n) = setup().await;
    write_blocks(&dev, &n, 0, &[0u8; 512]).await;
    // Writers keep rewriting block 0 with 0 while CAW flips 0 -> 1 -> 0; a CAW must never
    // see a torn block, and writes never interleave with one.
    let writer = {
        let dev = dev.clone();
        let n = nx(2);
        tokio::spawn(async move {
            ready(&dev, &n).await;
            for _ in 0..300 {
                let r = run(&dev, &n, &rw10(0x2a, 0, 1, 0), Some(&[0u8; 512]), 0).await;
                assert_eq!(r.status, Status::Good);
            }
        })
    };
    let mut tasks = Vec::new();
    for t in 0..4u64 {
        let dev = dev.clone();
        tasks.push(tokio::spawn(async move {
            let n = nx(10 + t);
            ready(&dev, &n).await;
            let mut ok = 0;
            for _ in 0..200 {
                let mut buf = vec![0u8; 512];
                buf.extend(vec![0u8; 512]);
                let r = run(&dev, &n, &caw(0, 1, 0), Some(&buf), 0).await;
                match r.status {
                    Status::Good => ok += 1,
                    _ => check(&r, key::MISCOMPARE, asc::MISCOMPARE_DURING_VERIFY),
                }
            }
            ok
        }));
    }
    let mut ok = 0;
    for t in tasks {
        ok += t.await.unwrap();
    }
    writer.await.unwrap();
    // The compare data equals the write data, so every CAW must succeed.
    assert_eq!(ok, 800);
    // Counter semantics: concurrent increments through CAW never lose an update.
    let counter = Arc::new(std::sync::atomic::AtomicU64::new(0));
    write_blocks(&dev, &n, 1, &[0u8; 512]).await;
    let mut tasks = Vec::new();
    for t in 0..4u64 {
        let dev = dev.clone();
        let counter = counter.clone();
        tasks.push(tokio::spawn(async move {
            let n = nx(20 + t);
            ready(&dev, &n).await;
            let mut done = 0;
            while done < 50 {
                let cur = read_blocks(&dev, &n, 1, 1).await;
                let v = u64::from_be_bytes(cur[..8].try_into().unwrap());
                let mut next = cur.clone();
                next[..8].copy_from_slice(&(v + 1).to_be_bytes());
                let mut buf = cur;
                buf.extend(next);
                if run(&dev, &n, &caw(1, 1, 0), Some(&buf), 0).await.status == Status::Good {
                    done += 1;
                    counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let cur = read_blocks(&dev, &n, 1, 1).await;
    assert_eq!(u64::from_be_bytes(cur[..8].try_into().unwrap()), 200);
}

#[tokio::test]
async fn write_atomic16() {
    let (dev, n) = setup().await;
    let mut c = rw16(0x9c, 0, 0, 0x18);
    c[12..14].copy_from_slice(&2u16.to_be_bytes());
    c[10..12].copy_from_slice(&0u16.to_be_bytes());
    c[13] = 2;
    let d = pattern(1024, 4);
    good(&run(&dev, &n, &c, Some(&d), 0).await);
    assert_eq!(read_blocks(&dev, &n, 0, 2).await, d);
    c[2..10].copy_from_slice(&(NB - 1).to_be_bytes());
    lba_oob(&run(&dev, &n, &c, Some(&d), 0).await);
    c[10] = 1; // ATOMIC BOUNDARY is not supported.
    invalid_cdb(&run(&dev, &n, &c, Some(&d), 0).await);
}

// ---- PRE-FETCH, SYNCHRONIZE CACHE, READ DEFECT DATA ----------------------------------------

#[tokio::test]
async fn prefetch_sync_defects() {
    let (dev, n) = setup().await;
    assert_eq!(
        run(&dev, &n, &rw10(0x34, 0, 1, 0x02), None, 0).await.status,
        Status::ConditionMet
    );
    let mut c = rw10(0x34, 0, 1, 0);
    c[6] = 3;
    assert_eq!(
        run(&dev, &n, &c, None, 0).await.status,
        Status::ConditionMet
    );
    assert_eq!(
        run(&dev, &n, &rw16(0x90, NB - 256, 256, 0), None, 0)
            .await
            .status,
        Status::ConditionMet
    );
    lba_oob(&run(&dev, &n, &rw10(0x34, NB as u32 - 1, 2, 0), None, 0).await);
    lba_oob(&run(&dev, &n, &rw16(0x90, u64::MAX, 1, 0), None, 0).await);
    good(&run(&dev, &n, &rw10(0x35, 0, 0, 0x06), None, 0).await);
    good(&run(&dev, &n, &rw16(0x91, 0, 0, 0x02), None, 0).await);
    lba_oob(&run(&dev, &n, &rw16(0x91, NB + 1, 0, 0), None, 0).await);
    let r = run(&dev, &n, &[0x37, 0, 0x18, 0, 0, 0, 0, 0, 32, 0], None, 32).await;
    assert_eq!(data(&r), vec![0, 0x18, 0, 0]);
    let r = run(
        &dev,
        &n,
        &[0xb7, 0, 0, 0, 0, 0, 0, 0, 0, 32, 0, 0],
        None,
        32,
    )
    .await;
    assert_eq!(data(&r), vec![0; 8]);
}

// ---- WRITE SAME, UNMAP, GET LBA STATUS -------------------------------------------------

fn ws10(lba: u32, n: u16, flags: u8) -> Vec<u8> {
    rw10(0x41, lba, n, flags)
}

async fn lba_status(dev: &Device, n: &Nexus, lba: u64) -> (u64, u32, u8) {
    let r = run(dev, n, &rw16(0x9e, lba, 24, 0x12), None, 24).await;
    good(&r);
    let d = data(&r);
    (
        u64::from_be_bytes(d[8..16].try_into().unwrap()),
        u32::from_be_bytes(d[16..20].try_into().unwrap()),
        d[20],
    )
}

#[tokio::test]
async fn write_same() {
    let (dev, n) = setup().await;
    let blk = vec![7u8; 512];
    good(&run(&dev, &n, &ws10(10, 5, 0), Some(&blk), 0).await);
    assert!(read_blocks(&dev, &n, 10, 5).await.iter().all(|&x| x == 7));
    good(&run(&dev, &n, &rw16(0x93, NB - 256, 256, 0), Some(&blk), 0).await);
    // Too many blocks refused.
    invalid_cdb(&run(&dev, &n, &rw16(0x93, 0, 0x10000, 0), Some(&blk), 0).await);
    // ANCHOR without UNMAP, ANCHOR with UNMAP (ANC_SUP=0), obsolete LBDATA.
    invalid_cdb(&run(&dev, &n, &ws10(0, 1, 0x10), Some(&blk), 0).await);
    invalid_cdb(&run(&dev, &n, &ws10(0, 1, 0x18), Some(&blk), 0).await);
    invalid_cdb(&run(&dev, &n, &ws10(0, 1, 0x02), Some(&blk), 0).await);
    // Wrong data-out size.
    invalid_cdb(&run(&dev, &n, &ws10(0, 1, 0x08), Some(&blk[..256]), 0).await);
    invalid_cdb(&run(&dev, &n, &ws10(0, 1, 0x08), Some(&[0u8; 1024]), 0).await);
    lba_oob(&run(&dev, &n, &ws10(NB as u32, 1, 0), Some(&blk), 0).await);
    lba_oob(&run(&dev, &n, &rw16(0x93, u64::MAX, 1, 0), Some(&blk), 0).await);
    // UNMAP with a zero block deallocates; LBPRZ reads back zeroes.
    write_blocks(&dev, &n, 100, &vec![0xff; 8 * 512]).await;
    assert_eq!(lba_status(&dev, &n, 100).await.2, 0);
    good(&run(&dev, &n, &ws10(100, 8, 0x08), Some(&[0u8; 512]), 0).await);
    assert!(read_blocks(&dev, &n, 100, 8).await.iter().all(|&x| x == 0));
    let (lba, len, st) = lba_status(&dev, &n, 100).await;
    assert_eq!((lba, st), (100, 1));
    assert!(len >= 8);
    // UNMAP deallocates whatever the block holds.
    write_blocks(&dev, &n, 100, &vec![0xff; 2 * 512]).await;
    good(&run(&dev, &n, &ws10(100, 2, 0x08), Some(&blk), 0).await);
    assert!(read_blocks(&dev, &n, 100, 2).await.iter().all(|&x| x == 0));
    assert_eq!(lba_status(&dev, &n, 100).await.2, 1);
    // NDOB: zeroes without a data-out buffer.
    good(&run(&dev, &n, &rw16(0x93, 100, 2, 0x09), None, 0).await);
    assert!(read_blocks(&dev, &n, 100, 2).await.iter().all(|&x| x == 0));
    good(&run(&dev, &n, &rw16(0x93, 100, 2, 0x01), None, 0).await);
}

fn unmap_params(descs: &[(u64, u32)]) -> Vec<u8> {
    let mut b = vec![0u8; 8 + 16 * descs.len()];
    let n = b.len();
    b[0..2].copy_from_slice(&((n - 2) as u16).to_be_bytes());
    b[2..4].copy_from_slice(&((n - 8) as u16).to_be_bytes());
    for (i, (lba, nb)) in descs.iter().enumerate() {
        b[8 + 16 * i..16 + 16 * i].copy_from_slice(&lba.to_be_bytes());
        b[16 + 16 * i..20 + 16 * i].copy_from_slice(&nb.to_be_bytes());
    }
    b
}

fn unmap_cdb(len: usize, anchor: bool) -> Vec<u8> {
    let mut c = vec![0x42, u8::from(anchor), 0, 0, 0, 0, 0, 0, 0, 0];
    c[7..9].copy_from_slice(&(len as u16).to_be_bytes());
    c
}

#[tokio::test]
async fn unmap_and_lba_status() {
    let (dev, n) = setup().await;
    write_blocks(&dev, &n, 0, &vec![b'a'; 300 * 512]).await;
    let p = unmap_params(&[(10, 5), (NB, 0)]);
    good(&run(&dev, &n, &unmap_cdb(p.len(), false), Some(&p), 0).await);
    assert!(read_blocks(&dev, &n, 10, 5).await.iter().all(|&x| x == 0));
    assert_eq!(lba_status(&dev, &n, 10).await, (10, 5, 1));
    assert_eq!(lba_status(&dev, &n, 15).await.0, 15);
    assert_eq!(lba_status(&dev, &n, 15).await.2, 0);
    // Empty lists.
    good(&run(&dev, &n, &unmap_cdb(0, false), None, 0).await);
    let p = unmap_params(&[]);
    good(&run(&dev, &n, &unmap_cdb(p.len(), false), Some(&p), 0).await);
    // Errors.
    let p = unmap_params(&[(NB - 1, 2)]);
    lba_oob(&run(&dev, &n, &unmap_cdb(p.len(), false), Some(&p), 0).await);
    check(
        &run(&dev, &n, &unmap_cdb(4, false), Some(&p[..4]), 0).await,
        key::ILLEGAL_REQUEST,
        asc::PARAMETER_LIST_LENGTH_ERROR,
    );
    invalid_cdb(&run(&dev, &n, &unmap_cdb(p.len(), true), Some(&p), 0).await);
    let many: Vec<(u64, u32)> = (0..257).map(|i| (i, 1)).collect();
    let p = unmap_params(&many);
    check(
        &run(&dev, &n, &unmap_cdb(p.len(), false), Some(&p), 0).await,
        key::ILLEGAL_REQUEST,
        asc::INVALID_FIELD_IN_PARAM_LIST,
    );
    // GET LBA STATUS beyond the end.
    lba_oob(&run(&dev, &n, &rw16(0x9e, NB, 24, 0x12), None, 24).await);
    lba_oob(&run(&dev, &n, &rw16(0x9e, u64::MAX, 24, 0x12), None, 24).await);
    let r = run(&dev, &n, &rw16(0x9e, NB - 1, 24, 0x12), None, 24).await;
    good(&r);
}

// ---- MODE SENSE / MODE SELECT ----------------------------------------------------------

fn control_page(b2: u8, b4: u8) -> Vec<u8> {
    let mut d = vec![
        0u8, 0, 0, 0, 0x0a, 0x0a, b2, 0x10, b4, 0, 0, 0, 0xff, 0xff, 0, 0,
    ];
    d.truncate(16);
    d
}

#[tokio::test]
async fn mode_sense_pages() {
    let (dev, n) = setup().await;
    let r = run(&dev, &n, &[0x1a, 0, 0x3f, 0, 255, 0], None, 255).await;
    let d = data(&r);
    assert_eq!(usize::from(d[0]) + 1, d.len());
    assert_eq!(d[2], 0x10); // DPOFUA
                            // Truncation never overflows.
    let r = run(&dev, &n, &[0x1a, 0, 0x3f, 0, 4, 0], None, 4).await;
    assert_eq!(r.transfer_len, 4);
    assert_eq!(r.data_in.unwrap().len(), 4);
    // The control page alone equals the one inside all pages.
    let c = data(&run(&dev, &n, &[0x1a, 0x08, 0x0a, 0, 255, 0], None, 255).await);
    assert_eq!(
        &c[4..],
        &[0x0a, 0x0a, 0x02, 0x10, 0, 0, 0, 0, 0xff, 0xff, 0, 0]
    );
    assert!(d.windows(12).any(|w| w == &c[4..]));
    // Saved values are not supported; unknown pages are invalid.
    check(
        &run(&dev, &n, &[0x1a, 0, 0xff, 0, 255, 0], None, 255).await,
        key::ILLEGAL_REQUEST,
        asc::SAVING_PARAMS_NOT_SUPPORTED,
    );
    invalid_cdb(&run(&dev, &n, &[0x1a, 0, 0x02, 0, 255, 0], None, 255).await);
    // MODE SENSE(10) with LLBAA.
    let d = data(
        &run(
            &dev,
            &n,
            &[0x5a, 0x10, 0x3f, 0xff, 0, 0, 0, 1, 0, 0],
            None,
            256,
        )
        .await,
    );
    assert_eq!(d[4], 1);
    assert_eq!(u16::from_be_bytes([d[6], d[7]]), 16);
    assert_eq!(u64::from_be_bytes(d[8..16].try_into().unwrap()), NB);
}

#[tokio::test]
async fn mode_select_swp_and_d_sense() {
    let (dev, n) = setup().await;
    let n2 = nx(2);
    ready(&dev, &n2).await;
    let p = control_page(0x02, 0x08);
    good(&run(&dev, &n, &[0x15, 0x10, 0, 0, p.len() as u8, 0], Some(&p), 0).await);
    good(&run(&dev, &n, &rw10(0x28, 0, 1, 0), None, 512).await);
    let r = run(&dev, &n, &rw10(0x2a, 0, 1, 0), Some(&[0; 512]), 0).await;
    check(&r, key::DATA_PROTECT, asc::SOFTWARE_WRITE_PROTECTED);
    let d = data(&run(&dev, &n, &[0x1a, 0, 0x3f, 0, 255, 0], None, 255).await);
    assert_eq!(d[2] & 0x80, 0x80);
    check(
        &run(&dev, &n2, &rw10(0x2a, 0, 1, 0), Some(&[0; 512]), 0).await,
        key::UNIT_ATTENTION,
        asc::MODE_PARAMETERS_CHANGED,
    );
    let p = control_page(0x06, 0);
    good(&run(&dev, &n, &[0x15, 0x10, 0, 0, p.len() as u8, 0], Some(&p), 0).await);
    let r = run(&dev, &n, &rw16(0x88, u64::MAX, 1, 0), None, 512).await;
    assert_eq!(r.sense.as_ref().unwrap()[0], 0x72);
    lba_oob(&r);
    // Unchangeable field, SP bit, truncated list.
    let p = control_page(0x22, 0);
    let r = run(&dev, &n, &[0x15, 0x10, 0, 0, p.len() as u8, 0], Some(&p), 0).await;
    check(&r, key::ILLEGAL_REQUEST, asc::INVALID_FIELD_IN_PARAM_LIST);
    let p = control_page(0x02, 0);
    invalid_cdb(&run(&dev, &n, &[0x15, 0x11, 0, 0, p.len() as u8, 0], Some(&p), 0).await);
    check(
        &run(&dev, &n, &[0x15, 0x10, 0, 0, 10, 0], Some(&p[..10]), 0).await,
        key::ILLEGAL_REQUEST,
        asc::PARAMETER_LIST_LENGTH_ERROR,
    );
    // MODE SELECT(10).
    let mut p10 = vec![0u8; 4];
    p10.extend(control_page(0x02, 0));
    good(
        &run(
            &dev,
            &n,
            &[0x55, 0x10, 0, 0, 0, 0, 0, 0, p10.len() as u8, 0],
            Some(&p10),
            0,
        )
        .await,
    );
    let r = run(&dev, &n, &rw16(0x88, u64::MAX, 1, 0), None, 512).await;
    assert_eq!(r.sense.unwrap()[0], 0x70);
}

// ---- REPORT SUPPORTED OPERATION CODES, TMFs -------------------------------------------

fn rsoc(rctd: bool, options: u8, opcode: u8, sa: u16) -> Vec<u8> {
    let mut c = vec![
        0xa3,
        0x0c,
        options | if rctd { 0x80 } else { 0 },
        opcode,
        0,
        0,
        0,
        0,
        0xff,
        0xff,
        0,
        0,
    ];
    c[4..6].copy_from_slice(&sa.to_be_bytes());
    c
}

#[tokio::test]
async fn report_supported_opcodes() {
    let (dev, n) = setup().await;
    let d = data(&run(&dev, &n, &rsoc(false, 0, 0, 0), None, 65535).await);
    let len = u32::from_be_bytes(d[0..4].try_into().unwrap()) as usize;
    assert_eq!(len + 4, d.len());
    let descs: Vec<&[u8]> = d[4..].chunks(8).collect();
    assert_eq!(descs.len(), table::TABLE.len());
    for desc in &descs {
        let (op, sa, servactv) = (
            desc[0],
            u16::from_be_bytes([desc[2], desc[3]]),
            desc[5] & 1 != 0,
        );
        assert!(servactv || sa == 0);
        let one = run(
            &dev,
            &n,
            &rsoc(false, if servactv { 2 } else { 1 }, op, sa),
            None,
            65535,
        )
        .await;
        let o = data(&one);
        assert_eq!(o[1] & 0x07, 3);
        assert_eq!(o[4], op);
        // Asking the other way round is an error.
        invalid_cdb(
            &run(
                &dev,
                &n,
                &rsoc(false, if servactv { 1 } else { 2 }, op, sa),
                None,
                65535,
            )
            .await,
        );
        // Every command refuses a bit its usage data does not list.
        let usage = &o[4..];
        for (i, &u) in usage.iter().enumerate().skip(1) {
            // The service action field selects another command; it is not a free bit.
            let fixed = if servactv && i == 1 { u | 0x1f } else { u };
            if fixed != 0xff {
                let mut cdb = usage.to_vec();
                cdb.iter_mut().skip(1).for_each(|b| *b = 0);
                cdb[1] = if servactv { sa as u8 } else { 0 };
                let bit = (!fixed).trailing_zeros() as u8;
                cdb[i] |= 1 << bit;
                let r = run(&dev, &n, &cdb, Some(&[0u8; 512]), 512).await;
                assert_eq!(
                    r.status,
                    Status::CheckCondition,
                    "{op:02x}/{sa} byte {i} {cdb:02x?}"
                );
                invalid_cdb(&r);
                let s = r.sense.unwrap();
                assert_eq!(
                    &s[15..18],
                    &[0xc8 | bit, 0, i as u8],
                    "{:02x}/{sa} byte {i}",
                    op
                );
            }
        }
    }
    // READ(10) usage data announces DPO and FUA.
    let o = data(&run(&dev, &n, &rsoc(false, 1, 0x28, 0), None, 65535).await);
    assert_eq!(o[5] & 0x18, 0x18);
    // RCTD: every descriptor has a timeout descriptor.
    let d = data(&run(&dev, &n, &rsoc(true, 0, 0, 0), None, 65535).await);
    assert_eq!(d.len(), 4 + 20 * table::TABLE.len());
    assert!(d[4..]
        .chunks(20)
        .all(|c| c[5] & 2 != 0 && c[8..10] == [0, 0x0a]));
    let o = data(&run(&dev, &n, &rsoc(true, 1, 0x28, 0), None, 65535).await);
    assert_eq!(o[1], 0x83);
    assert_eq!(&o[14..16], &[0, 0x0a]);
    // Unsupported opcode.
    assert_eq!(
        data(&run(&dev, &n, &rsoc(false, 1, 0xc0, 0), None, 65535).await),
        vec![0, 1, 0, 0]
    );
    invalid_cdb(&run(&dev, &n, &rsoc(false, 4, 0, 0), None, 65535).await);
    // Truncation.
    let r = run(&dev, &n, &rsoc(false, 0, 0, 0), None, 1024).await;
    good(&r);
}

#[tokio::test]
async fn report_supported_tmf() {
    let (dev, n) = setup().await;
    let d = data(
        &run(
            &dev,
            &n,
            &[0xa3, 0x0d, 0, 0, 0, 0, 0, 0, 0, 16, 0, 0],
            None,
            16,
        )
        .await,
    );
    assert_eq!(d, vec![0xda, 0, 0, 0]);
    let d = data(
        &run(
            &dev,
            &n,
            &[0xa3, 0x0d, 0x80, 0, 0, 0, 0, 0, 0, 16, 0, 0],
            None,
            16,
        )
        .await,
    );
    assert_eq!(d.len(), 16);
    invalid_cdb(
        &run(
            &dev,
            &n,
            &[0xa3, 0x0d, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0],
            None,
            3,
        )
        .await,
    );
}

// ---- START STOP UNIT, PREVENT ALLOW ----------------------------------------------------

#[tokio::test]
async fn start_stop_unit() {
    let (dev, n) = setup().await;
    good(&run(&dev, &n, &[0x1b, 1, 0, 0, 0, 0], None, 0).await);
    check(
        &run(&dev, &n, &rw10(0x28, 0, 1, 0), None, 512).await,
        key::NOT_READY,
        asc::NOT_READY_INIT_REQUIRED,
    );
    check(
        &run(&dev, &n, &[0; 6], None, 0).await,
        key::NOT_READY,
        asc::NOT_READY_INIT_REQUIRED,
    );
    good(&run(&dev, &n, &[0x12, 0, 0, 0, 36, 0], None, 36).await);
    good(&run(&dev, &n, &[0x1b, 0, 0, 0, 1, 0], None, 0).await);
    good(&run(&dev, &n, &rw10(0x28, 0, 1, 0), None, 512).await);
    // Power conditions, reserved ones too, are accepted without effect; START and LOEJ are
    // then ignored.
    for pc in 1..16u8 {
        good(&run(&dev, &n, &[0x1b, 1, 0, 0, pc << 4, 0], None, 0).await);
        good(&run(&dev, &n, &[0; 6], None, 0).await);
    }
    // LOEJ on a fixed medium is ignored.
    good(&run(&dev, &n, &[0x1b, 0, 0, 0, 0x02, 0], None, 0).await);
    good(&run(&dev, &n, &[0x1b, 0, 0, 0, 0x03, 0], None, 0).await);
    good(&run(&dev, &n, &[0; 6], None, 0).await);
    // Not removable: RMB=0.
    let d = data(&run(&dev, &n, &[0x12, 0, 0, 0, 36, 0], None, 36).await);
    assert_eq!(d[1] & 0x80, 0);
    good(&run(&dev, &n, &[0x1e, 0, 0, 0, 1, 0], None, 0).await);
    good(&run(&dev, &n, &[0x1e, 0, 0, 0, 0, 0], None, 0).await);
    invalid_cdb(&run(&dev, &n, &[0x1e, 0, 0, 0, 2, 0], None, 0).await);
}

// ---- SPC-2 reservations ------------------------------------------------------------------

#[tokio::test]
async fn reserve_release_spc2() {
    let (dev, n) = setup().await;
    let n2 = nx(2);
    ready(&dev, &n2).await;
    good(&run(&dev, &n, &[0x16, 0, 0, 0, 0, 0], None, 0).await);
    good(&run(&dev, &n, &[0x16, 0, 0, 0, 0, 0], None, 0).await);
    assert_eq!(
        run(&dev, &n2, &[0x16, 0, 0, 0, 0, 0], None, 0).await.status,
        Status::ReservationConflict
    );
    good(&run(&dev, &n2, &[0x17, 0, 0, 0, 0, 0], None, 0).await);
    good(&run(&dev, &n, &[0x1a, 0, 0x3f, 0, 255, 0], None, 255).await);
    assert_eq!(
        run(&dev, &n2, &[0x1a, 0, 0x3f, 0, 255, 0], None, 255)
            .await
            .status,
        Status::ReservationConflict
    );
    good(&run(&dev, &n2, &[0x12, 0, 0, 0, 36, 0], None, 36).await);
    assert_eq!(
        run(&dev, &n2, &rw10(0x28, 0, 1, 0), None, 512).await.status,
        Status::ReservationConflict
    );
    let mut c = rw10(0x48, 0, 0, 0x02);
    c[7] = 0;
    assert_eq!(
        run(&dev, &n2, &c, None, 0).await.status,
        Status::ReservationConflict
    );
    good(&run(&dev, &n, &[0x57, 0, 0, 0, 0, 0, 0, 0, 0, 0], None, 0).await);
    good(&run(&dev, &n2, &[0x56, 0, 0, 0, 0, 0, 0, 0, 0, 0], None, 0).await);
    good(&run(&dev, &n2, &[0x17, 0, 0, 0, 0, 0], None, 0).await);
    // Third-party reservations are not supported.
    invalid_cdb(&run(&dev, &n, &[0x16, 0x10, 0, 0, 0, 0], None, 0).await);
}

// ---- persistent reservations ---------------------------------------------------------------

async fn prout(
    dev: &Device,
    n: &Nexus,
    sa: u8,
    ty: u8,
    key: u64,
    sark: u64,
    flags: u8,
) -> Response {
    let mut p = vec![0u8; 24];
    p[0..8].copy_from_slice(&key.to_be_bytes());
    p[8..16].copy_from_slice(&sark.to_be_bytes());
    p[20] = flags;
    let cdb = [0x5f, sa, ty, 0, 0, 0, 0, 0, 24, 0];
    run(dev, n, &cdb, Some(&p), 0).await
}

/// A command of nexus `n` on `dev` in flight, as a fabric tracks it.
fn in_flight(
    dev: &Arc<Device>,
    n: &Nexus,
    tag: u64,
) -> (Arc<task::TaskSet<task::Task>>, Arc<task::Task>) {
    let set = task::TaskSet::new(n.id);
    let t = Arc::new(task::Task::new(tag, 0, TaskAttr::Simple, Some(dev.clone())));
    set.admit(&t).unwrap();
    (set, t)
}

/// The unit attentions pending for `n`, taken with TEST UNIT READY.
async fn pending_uas(dev: &Device, n: &Nexus) -> Vec<(u8, u8)> {
    let mut out = Vec::new();
    loop {
        let r = run(dev, n, &[0; 6], None, 0).await;
        if r.status == Status::Good {
            return out;
        }
        let (k, a, q) = sense_of(&r);
        assert_eq!(k, key::UNIT_ATTENTION);
        out.push((a, q));
    }
}

/// PREEMPT AND ABORT completes only after the preempted nexus's commands have ended (TAS=0:
/// silently, with COMMANDS CLEARED BY ANOTHER INITIATOR); PREEMPT leaves them running, and
/// other nexuses' commands are not touched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preempt_and_abort_ends_the_preempted_commands_first() {
    let dev = make(cfg());
    let (n1, n2, n3) = (nx(1), nx(2), nx(3));
    for (n, k) in [(&n1, 0xa), (&n2, 0xb), (&n3, 0xc)] {
        ready(&dev, n).await;
        good(&prout(&dev, n, 0, 0, 0, k, 0).await);
    }
    good(&prout(&dev, &n1, 1, 1, 0xa, 0, 0).await);
    let (_s1, t1) = in_flight(&dev, &n1, 5);
    let (_s3, t3) = in_flight(&dev, &n3, 6);
    good(&prout(&dev, &n2, 4, 1, 0xb, 0xc, 0).await);
    assert!(!t3.is_aborted(), "PREEMPT aborted a command");
    let pa = {
        let (dev, n2) = (dev.clone(), n2.clone());
        tokio::spawn(async move { prout(&dev, &n2, 5, 1, 0xb, 0xa, 0).await })
    };
    let aborted = async {
        while !t1.is_aborted() {
            tokio::task::yield_now().await;
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(10), aborted)
        .await
        .expect("PREEMPT AND ABORT left the preempted nexus's command running");
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    assert!(
        !pa.is_finished(),
        "completed before the aborted command ended"
    );
    t1.set_done();
    good(&pa.await.unwrap());
    assert!(!t3.is_aborted());
    assert_eq!(keys(&prin(&dev, &n2, 0, 64).await), vec![0xb]);
    let uas = pending_uas(&dev, &n1).await;
    assert!(uas.contains(&asc::REGISTRATIONS_PREEMPTED), "{uas:?}");
    assert!(uas.contains(&asc::COMMANDS_CLEARED), "{uas:?}");
    assert_eq!(
        pending_uas(&dev, &n3).await,
        vec![asc::REGISTRATIONS_PREEMPTED]
    );
}

async fn prin(dev: &Device, n: &Nexus, sa: u8, alloc: u16) -> Vec<u8> {
    let mut c = [0x5e, sa, 0, 0, 0, 0, 0, 0, 0, 0];
    c[7..9].copy_from_slice(&alloc.to_be_bytes());
    let r = run(dev, n, &c, None, u32::from(alloc)).await;
    good(&r);
    data(&r)
}

fn keys(d: &[u8]) -> Vec<u64> {
    d[8..]
        .chunks(8)
        .map(|c| u64::from_be_bytes(c.try_into().unwrap()))
        .collect()
}

fn gen(d: &[u8]) -> u32 {
    u32::from_be_bytes(d[0..4].try_into().unwrap())
}

#[tokio::test]
async fn pr_register_and_keys() {
    let (dev, n) = setup().await;
    let d = prin(&dev, &n, 0, 16384).await;
    assert_eq!(d.len(), 8);
    let r = prout(&dev, &n, 6, 0, 0, 0xabc, 0).await;
    good(&r);
    // Parameter list commands report their list length for residuals.
    assert_eq!(r.transfer_len, 24);
    assert_eq!(keys(&prin(&dev, &n, 0, 16384).await), vec![0xabc]);
    // Re-register with the wrong key conflicts.
    assert_eq!(
        prout(&dev, &n, 0, 0, 0, 0xabd, 0).await.status,
        Status::ReservationConflict
    );
    good(&prout(&dev, &n, 0, 0, 0xabc, 0xdef, 0).await);
    // Truncated READ KEYS keeps ADDITIONAL LENGTH.
    let d = prin(&dev, &n, 0, 8).await;
    assert_eq!(u32::from_be_bytes(d[4..8].try_into().unwrap()), 8);
    assert_eq!(d.len(), 8);
    good(&prout(&dev, &n, 0, 0, 0xdef, 0, 0).await);
    assert!(keys(&prin(&dev, &n, 0, 16384).await).is_empty());
    // Unregistered with SARK 0: no-op.
    good(&prout(&dev, &n, 0, 0, 0, 0, 0).await);
    // Service actions 0..3 are valid, the rest are not.
    for sa in 4..0x20 {
        let r = run(
            &dev,
            &n,
            &[0x5e, sa, 0, 0, 0, 0, 0, 0x40, 0, 0],
            None,
            16384,
        )
        .await;
        invalid_cdb(&r);
    }
    // Parameter list length must be 24.
    let r = run(
        &dev,
        &n,
        &[0x5f, 0, 0, 0, 0, 0, 0, 0, 20, 0],
        Some(&[0; 20]),
        0,
    )
    .await;
    check(&r, key::ILLEGAL_REQUEST, asc::PARAMETER_LIST_LENGTH_ERROR);
}

#[tokio::test]
async fn pr_report_capabilities_and_types() {
    let (dev, n) = setup().await;
    good(&prout(&dev, &n, 6, 0, 0, 7, 0).await);
    let d = prin(&dev, &n, 2, 16384).await;
    assert_eq!(u16::from_be_bytes([d[0], d[1]]), 8);
    assert_eq!((d[3] >> 4) & 7, 1);
    assert_eq!(&d[4..6], &[0xea, 0x01]);
    for ty in [1u8, 3, 5, 6, 7, 8] {
        good(&prout(&dev, &n, 1, ty, 7, 0, 0).await);
        // Reserving again with the same type is a no-op, another type conflicts.
        good(&prout(&dev, &n, 1, ty, 7, 0, 0).await);
        assert_eq!(
            prout(&dev, &n, 1, if ty == 1 { 3 } else { 1 }, 7, 0, 0)
                .await
                .status,
            Status::ReservationConflict
        );
        let d = prin(&dev, &n, 1, 16384).await;
        assert_eq!(u32::from_be_bytes(d[4..8].try_into().unwrap()), 16);
        let k = u64::from_be_bytes(d[8..16].try_into().unwrap());
        assert_eq!(k, if ty >= 7 { 0 } else { 7 });
        assert_eq!(d[21], ty);
        // Releasing with the wrong type.
        let r = prout(&dev, &n, 2, if ty == 1 { 3 } else { 1 }, 7, 0, 0).await;
        check(&r, key::ILLEGAL_REQUEST, asc::INVALID_RELEASE_OF_PR);
        good(&prout(&dev, &n, 2, ty, 7, 0, 0).await);
        let d = prin(&dev, &n, 1, 16384).await;
        assert_eq!(d.len(), 8);
    }
    // Invalid type and scope.
    invalid_cdb(&prout(&dev, &n, 1, 2, 7, 0, 0).await);
    invalid_cdb(&prout(&dev, &n, 1, 0x11, 7, 0, 0).await);
    // Unregistered nexus cannot reserve.
    let n2 = nx(2);
    ready(&dev, &n2).await;
    assert_eq!(
        prout(&dev, &n2, 1, 1, 0, 0, 0).await.status,
        Status::ReservationConflict
    );
}

/// SPC-4 5.13 access table as the libiscsi access tests exercise it.
#[tokio::test]
async fn pr_access_table() {
    // (type, registered can read, registered can write, unregistered can read, can write)
    let table = [
        (3u8, false, false, false, false),
        (1, true, false, true, false),
        (6, true, true, false, false),
        (5, true, true, true, false),
        (8, true, true, false, false),
        (7, true, true, true, false),
    ];
    for (ty, rr, rw, ur, uw) in table {
        let (dev, n1) = setup().await;
        let n2 = nx(2);
        ready(&dev, &n2).await;
        good(&prout(&dev, &n1, 6, 0, 0, 0x11, 0).await);
        good(&prout(&dev, &n2, 6, 0, 0, 0x22, 0).await);
        good(&prout(&dev, &n1, 1, ty, 0x11, 0, 0).await);
        let can_read = |r: Response| r.status == Status::Good;
        assert!(can_read(
            run(&dev, &n1, &rw10(0x28, 1, 1, 0), None, 512).await
        ));
        assert!(can_read(
            run(&dev, &n1, &rw10(0x2a, 1, 1, 0), Some(&[0; 512]), 0).await
        ));
        let r = run(&dev, &n2, &rw10(0x28, 1, 1, 0), None, 512).await;
        assert_eq!(r.status == Status::Good, rr, "type {ty} registered read");
        if !rr {
            assert_eq!(r.status, Status::ReservationConflict);
        }
        let r = run(&dev, &n2, &rw10(0x2a, 1, 1, 0), Some(&[0; 512]), 0).await;
        assert_eq!(r.status == Status::Good, rw, "type {ty} registered write");
        good(&prout(&dev, &n2, 0, 0, 0x22, 0, 0).await);
        let r = run(&dev, &n2, &rw10(0x28, 1, 1, 0), None, 512).await;
        assert_eq!(r.status == Status::Good, ur, "type {ty} unregistered read");
        let r = run(&dev, &n2, &rw10(0x2a, 1, 1, 0), Some(&[0; 512]), 0).await;
        assert_eq!(r.status == Status::Good, uw, "type {ty} unregistered write");
        // Commands that are always allowed.
        good(&run(&dev, &n2, &[0x12, 0, 0, 0, 36, 0], None, 36).await);
        good(&run(&dev, &n2, &[0x25, 0, 0, 0, 0, 0, 0, 0, 0, 0], None, 8).await);
        good(&run(&dev, &n2, &[0x5e, 0, 0, 0, 0, 0, 0, 0, 64, 0], None, 64).await);
        // START STOP UNIT START=1 is allowed, STOP is a write.
        good(&run(&dev, &n2, &[0x1b, 0, 0, 0, 1, 0], None, 0).await);
        assert_eq!(
            run(&dev, &n2, &[0x1b, 0, 0, 0, 0, 0], None, 0).await.status,
            Status::ReservationConflict
        );
        // RESERVE(6) conflicts with persistent reservations.
        assert_eq!(
            run(&dev, &n1, &[0x16, 0, 0, 0, 0, 0], None, 0).await.status,
            Status::ReservationConflict
        );
        good(&prout(&dev, &n1, 2, ty, 0x11, 0, 0).await);
    }
}

#[tokio::test]
async fn pr_ownership_on_unregister() {
    for (ty, shared) in [
        (1u8, false),
        (3, false),
        (5, false),
        (6, false),
        (7, true),
        (8, true),
    ] {
        let (dev, n1) = setup().await;
        let n2 = nx(2);
        ready(&dev, &n2).await;
        good(&prout(&dev, &n1, 6, 0, 0, 1, 0).await);
        good(&prout(&dev, &n2, 6, 0, 0, 2, 0).await);
        good(&prout(&dev, &n1, 1, ty, 1, 0, 0).await);
        good(&prout(&dev, &n1, 0, 0, 1, 0, 0).await);
        let d = prin(&dev, &n1, 1, 16384).await;
        assert_eq!(d.len() > 8, shared, "type {ty}");
        if shared {
            good(&prout(&dev, &n2, 2, ty, 2, 0, 0).await);
        } else if ty == 5 || ty == 6 {
            // Registrants-only reservation released by unregistering: RESERVATIONS RELEASED.
            check(
                &run(&dev, &n2, &[0; 6], None, 0).await,
                key::UNIT_ATTENTION,
                asc::RESERVATIONS_RELEASED,
            );
        }
        good(&prout(&dev, &n2, 0, 0, 2, 0, 0).await);
    }
}

#[tokio::test]
async fn pr_clear_and_preempt() {
    let (dev, n1) = setup().await;
    let n2 = nx(2);
    ready(&dev, &n2).await;
    good(&prout(&dev, &n1, 6, 0, 0, 1, 0).await);
    let g0 = gen(&prin(&dev, &n1, 0, 16384).await);
    good(&prout(&dev, &n1, 1, 3, 1, 0, 0).await);
    good(&prout(&dev, &n1, 3, 0, 1, 0, 0).await);
    let d = prin(&dev, &n1, 0, 16384).await;
    assert!(keys(&d).is_empty());
    assert_eq!(gen(&d), g0 + 1);
    assert_eq!(prin(&dev, &n1, 1, 16384).await.len(), 8);
    // PREEMPT removes the other registration and reports REGISTRATIONS PREEMPTED.
    good(&prout(&dev, &n1, 6, 0, 0, 1, 0).await);
    good(&prout(&dev, &n2, 6, 0, 0, 2, 0).await);
    let g1 = gen(&prin(&dev, &n1, 0, 16384).await);
    good(&prout(&dev, &n2, 4, 3, 2, 1, 0).await);
    check(
        &run(&dev, &n1, &[0; 6], None, 0).await,
        key::UNIT_ATTENTION,
        asc::REGISTRATIONS_PREEMPTED,
    );
    let d = prin(&dev, &n1, 0, 16384).await;
    assert_eq!(keys(&d), vec![2]);
    assert_eq!(gen(&d), g1 + 1);
    // The preempted nexus is no longer registered.
    assert_eq!(
        prout(&dev, &n1, 1, 1, 1, 0, 0).await.status,
        Status::ReservationConflict
    );
    // Preempting a reservation holder takes the reservation.
    good(&prout(&dev, &n1, 6, 0, 0, 1, 0).await);
    good(&prout(&dev, &n1, 1, 1, 1, 0, 0).await);
    good(&prout(&dev, &n2, 5, 3, 2, 1, 0).await);
    let d = prin(&dev, &n2, 1, 16384).await;
    assert_eq!(u64::from_be_bytes(d[8..16].try_into().unwrap()), 2);
    assert_eq!(d[21], 3);
    // Preempting a key nobody holds conflicts; SARK 0 without all-registrants is invalid.
    assert_eq!(
        prout(&dev, &n2, 4, 3, 2, 0x99, 0).await.status,
        Status::ReservationConflict
    );
    check(
        &prout(&dev, &n2, 4, 3, 2, 0, 0).await,
        key::ILLEGAL_REQUEST,
        asc::INVALID_FIELD_IN_PARAM_LIST,
    );
    // CLEAR tells the other registrants.
    check(
        &run(&dev, &n1, &[0; 6], None, 0).await,
        key::UNIT_ATTENTION,
        asc::REGISTRATIONS_PREEMPTED,
    );
    good(&prout(&dev, &n1, 6, 0, 0, 1, 0).await);
    good(&prout(&dev, &n2, 3, 0, 2, 0, 0).await);
    check(
        &run(&dev, &n1, &[0; 6], None, 0).await,
        key::UNIT_ATTENTION,
        asc::RESERVATIONS_PREEMPTED,
    );
}

#[tokio::test]
async fn pr_full_status_spec_i_pt_and_move() {
    let (dev, n1) = setup().await;
    let n2 = nx(2);
    ready(&dev, &n2).await;
    // REGISTER with SPEC_I_PT registers n2 as well.
    let name = n2.initiator_port.clone();
    let mut tid = vec![0x45u8, 0, 0, 0];
    let mut s = name.as_bytes().to_vec();
    s.push(0);
    while s.len() & 3 != 0 {
        s.push(0);
    }
    tid[2..4].copy_from_slice(&(s.len() as u16).to_be_bytes());
    tid.extend(&s);
    let mut p = vec![0u8; 28];
    p[8..16].copy_from_slice(&5u64.to_be_bytes());
    p[20] = 0x08;
    p[24..28].copy_from_slice(&(tid.len() as u32).to_be_bytes());
    p.extend(&tid);
    let mut c = [0x5f, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    c[5..9].copy_from_slice(&(p.len() as u32).to_be_bytes());
    good(&run(&dev, &n1, &c, Some(&p), 0).await);
    assert_eq!(keys(&prin(&dev, &n1, 0, 16384).await), vec![5, 5]);
    good(&prout(&dev, &n1, 1, 1, 5, 0, 0).await);
    let d = prin(&dev, &n1, 3, 16384).await;
    let first = &d[8..];
    assert_eq!(u64::from_be_bytes(first[0..8].try_into().unwrap()), 5);
    assert_eq!(first[12], 1);
    assert_eq!(first[13], 1);
    assert_eq!(u16::from_be_bytes([first[18], first[19]]), 1);
    let tlen = u32::from_be_bytes(first[20..24].try_into().unwrap()) as usize;
    assert_eq!(&d[8 + 24 + tlen..8 + 24 + tlen + 8], &5u64.to_be_bytes());
    assert_eq!(
        u32::from_be_bytes(d[4..8].try_into().unwrap()) as usize,
        d.len() - 8
    );
    // REGISTER AND MOVE the reservation to n2 with a new key, unregistering n1.
    let mut p = vec![0u8; 24];
    p[0..8].copy_from_slice(&5u64.to_be_bytes());
    p[8..16].copy_from_slice(&9u64.to_be_bytes());
    p[17] = 0x02;
    p[18..20].copy_from_slice(&1u16.to_be_bytes());
    p[20..24].copy_from_slice(&(tid.len() as u32).to_be_bytes());
    p.extend(&tid);
    let mut c = [0x5f, 7, 0x01, 0, 0, 0, 0, 0, 0, 0];
    c[5..9].copy_from_slice(&(p.len() as u32).to_be_bytes());
    good(&run(&dev, &n1, &c, Some(&p), 0).await);
    assert_eq!(keys(&prin(&dev, &n1, 0, 16384).await), vec![9]);
    let d = prin(&dev, &n2, 1, 16384).await;
    assert_eq!(u64::from_be_bytes(d[8..16].try_into().unwrap()), 9);
    good(&run(&dev, &n2, &rw10(0x2a, 0, 1, 0), Some(&[0; 512]), 0).await);
    assert_eq!(
        run(&dev, &n1, &rw10(0x2a, 0, 1, 0), Some(&[0; 512]), 0)
            .await
            .status,
        Status::ReservationConflict
    );
}

#[tokio::test]
async fn pr_persists_across_device_recreation() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("lun0.pr");
    let backstore = ram();
    let config = DeviceConfig {
        pr_file: Some(path.clone()),
        ..cfg()
    };
    let n1 = nx(1);
    let n2 = nx(2);
    {
        let dev = make_with(backstore.clone(), config.clone());
        ready(&dev, &n1).await;
        ready(&dev, &n2).await;
        // APTPL=1 on registration.
        good(&prout(&dev, &n1, 6, 0, 0, 0x1111, 0x01).await);
        good(&prout(&dev, &n2, 6, 0, 0, 0x2222, 0x01).await);
        good(&prout(&dev, &n1, 1, 3, 0x1111, 0, 0).await);
        assert!(path.exists());
        let d = prin(&dev, &n1, 2, 64).await;
        assert_eq!(d[3] & 1, 1);
    }
    let dev = make_with(backstore.clone(), config.clone());
    ready(&dev, &n1).await;
    ready(&dev, &n2).await;
    assert_eq!(keys(&prin(&dev, &n1, 0, 16384).await), vec![0x1111, 0x2222]);
    let d = prin(&dev, &n1, 1, 16384).await;
    assert_eq!(u64::from_be_bytes(d[8..16].try_into().unwrap()), 0x1111);
    assert_eq!(d[21], 3);
    assert_eq!(
        run(&dev, &n2, &rw10(0x28, 0, 1, 0), None, 512).await.status,
        Status::ReservationConflict
    );
    good(&run(&dev, &n1, &rw10(0x28, 0, 1, 0), None, 512).await);
    // Registering with APTPL=0 stops persistence.
    good(&prout(&dev, &n2, 6, 0, 0, 0x3333, 0).await);
    assert!(!path.exists());
    drop(dev);
    let dev = make_with(backstore, config);
    ready(&dev, &n1).await;
    assert!(keys(&prin(&dev, &n1, 0, 16384).await).is_empty());
    // APTPL without a state file is refused.
    let dev = make(cfg());
    ready(&dev, &n1).await;
    check(
        &prout(&dev, &n1, 6, 0, 0, 1, 0x01).await,
        key::ILLEGAL_REQUEST,
        asc::INVALID_FIELD_IN_PARAM_LIST,
    );
}

/// Two processes exporting one logical unit (two devices over one backstore) with a shared
/// reservation file: each sees the other's registrations and reservation, a preemption
/// through one reaches the preempted I_T nexus on the other, and without sharing they
/// would not.
#[tokio::test]
async fn pr_state_shared_by_two_gateways() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("lun0.pr");
    let backstore = ram();
    let shared = |path: &std::path::Path| -> Option<Arc<dyn rtgt_backstore::SharedState>> {
        Some(Arc::new(rtgt_backstore::SharedFile::new(path)))
    };
    // Each process has its own handle on the file.
    let config = || DeviceConfig {
        pr_shared: shared(&path),
        ..cfg()
    };
    let a = make_with(backstore.clone(), config());
    let b = make_with(backstore.clone(), config());
    let (n1, n2) = (nx_port(1, 1, 1), nx_port(2, 2, 2));
    ready(&a, &n1).await;
    ready(&b, &n2).await;
    // A shared file announces no changes: no listener stays behind.
    for d in [&a, &b] {
        tokio::time::timeout(std::time::Duration::from_secs(5), async {
            while d.pr_listener.lock().unwrap().is_some() {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("the listener of a shared file ends");
    }
    // A registration through A (no APTPL) is in the file and reported through B.
    good(&prout(&a, &n1, 0, 0, 0, 0x1111, 0).await);
    assert!(path.exists());
    assert_eq!(keys(&prin(&b, &n2, 0, 16384).await), vec![0x1111]);
    good(&prout(&b, &n2, 0, 0, 0, 0x2222, 0).await);
    assert_eq!(keys(&prin(&a, &n1, 0, 16384).await), vec![0x1111, 0x2222]);
    // A reserves (write exclusive): B's writes conflict, its reads do not.
    good(&prout(&a, &n1, 1, 1, 0x1111, 0, 0).await);
    assert_eq!(
        run(&b, &n2, &rw10(0x2a, 0, 1, 0), Some(&[0; 512]), 0)
            .await
            .status,
        Status::ReservationConflict
    );
    good(&run(&b, &n2, &rw10(0x28, 0, 1, 0), None, 512).await);
    let d = prin(&b, &n2, 1, 64).await;
    assert_eq!(u64::from_be_bytes(d[8..16].try_into().unwrap()), 0x1111);
    // B preempts A's key: A's nexus hears of it on its next command, then conflicts.
    good(&prout(&b, &n2, 4, 1, 0x2222, 0x1111, 0).await);
    good(&run(&b, &n2, &rw10(0x2a, 0, 1, 0), Some(&[0; 512]), 0).await);
    check(
        &run(&a, &n1, &rw10(0x28, 0, 1, 0), None, 512).await,
        key::UNIT_ATTENTION,
        asc::REGISTRATIONS_PREEMPTED,
    );
    assert_eq!(
        run(&a, &n1, &rw10(0x2a, 0, 1, 0), Some(&[0; 512]), 0)
            .await
            .status,
        Status::ReservationConflict
    );
    assert_eq!(keys(&prin(&a, &n1, 0, 16384).await), vec![0x2222]);
    // A third gateway started now reads the same state.
    let c = make_with(backstore.clone(), config());
    let n3 = nx_port(3, 3, 3);
    ready(&c, &n3).await;
    assert_eq!(keys(&prin(&c, &n3, 0, 16384).await), vec![0x2222]);
    // Not shared: each process keeps its own.
    let private = DeviceConfig {
        pr_file: Some(dir.path().join("private.pr")),
        ..cfg()
    };
    let (pa, pb) = (
        make_with(backstore.clone(), private.clone()),
        make_with(backstore, private),
    );
    ready(&pa, &n1).await;
    ready(&pb, &n2).await;
    good(&prout(&pa, &n1, 0, 0, 0, 0x1111, 0).await);
    assert!(keys(&prin(&pb, &n2, 0, 16384).await).is_empty());
}

#[tokio::test]
async fn pr_corrupt_state_file_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.pr");
    std::fs::write(&path, "rtgt-pr 1\nreg zz\n").unwrap();
    let r = Device::new(
        ram(),
        BufPool::new(1 << 20),
        DeviceConfig {
            pr_file: Some(path),
            ..cfg()
        },
    );
    assert!(matches!(r, Err(ScsiError::PrCorrupt { .. })));
}

// ---- EXTENDED COPY -------------------------------------------------------------------------

fn xcopy_list(
    list_id: u8,
    usage: u8,
    naas: &[[u8; 16]],
    segs: &[(u16, u16, u16, u64, u64)],
) -> Vec<u8> {
    let mut b = vec![0u8; 16];
    b[0] = list_id;
    b[1] = usage << 3;
    for naa in naas {
        let mut d = [0u8; 32];
        d[0] = 0xe4;
        d[4] = 0x01;
        d[5] = 0x03;
        d[7] = 16;
        d[8..24].copy_from_slice(naa);
        d[29..32].copy_from_slice(&BS.to_be_bytes()[1..]);
        b.extend_from_slice(&d);
    }
    for &(src, dst, n, sl, dl) in segs {
        let mut d = [0u8; 28];
        d[0] = 0x02;
        d[3] = 0x18;
        d[4..6].copy_from_slice(&src.to_be_bytes());
        d[6..8].copy_from_slice(&dst.to_be_bytes());
        d[10..12].copy_from_slice(&n.to_be_bytes());
        d[12..20].copy_from_slice(&sl.to_be_bytes());
        d[20..28].copy_from_slice(&dl.to_be_bytes());
        b.extend_from_slice(&d);
    }
    b[2..4].copy_from_slice(&((naas.len() * 32) as u16).to_be_bytes());
    b[8..12].copy_from_slice(&((segs.len() * 28) as u32).to_be_bytes());
    b
}

fn xcopy_cdb(len: usize) -> Vec<u8> {
    let mut c = vec![0u8; 16];
    c[0] = 0x83;
    c[10..14].copy_from_slice(&(len as u32).to_be_bytes());
    c
}

fn rcr(sa: u8, list_id: u8) -> Vec<u8> {
    let mut c = vec![0u8; 16];
    c[0] = 0x84;
    c[1] = sa;
    c[2] = list_id;
    c[10..14].copy_from_slice(&1024u32.to_be_bytes());
    c
}

#[tokio::test]
async fn extended_copy_within_and_between_devices() {
    let registry = DeviceRegistry::new();
    let a = make(DeviceConfig {
        registry: Some(registry.clone()),
        ..cfg()
    });
    let b = make(DeviceConfig {
        registry: Some(registry.clone()),
        wwn: 0x6001_4050_0000_0000_0000_0000_0000_0002,
        ..cfg()
    });
    let n = nx(1);
    ready(&a, &n).await;
    ready(&b, &n).await;
    let d = pattern(2048 * BS as usize, 11);
    write_blocks(&a, &n, 0, &d[..1024 * 512]).await;
    write_blocks(&a, &n, 1024, &d[1024 * 512..]).await;
    // Copy status before any copy: invalid list identifier.
    invalid_cdb(&run(&a, &n, &rcr(0, 1), None, 1024).await);
    // Within one device, start to end.
    let p = xcopy_list(1, 0, &[*a.naa()], &[(0, 0, 2048, 0, NB - 2048)]);
    good(&run(&a, &n, &xcopy_cdb(p.len()), Some(&p), 0).await);
    let back = [
        read_blocks(&a, &n, NB - 2048, 1024).await,
        read_blocks(&a, &n, NB - 1024, 1024).await,
    ]
    .concat();
    assert_eq!(back, d);
    let st = data(&run(&a, &n, &rcr(0, 1), None, 1024).await);
    assert_eq!(st[4], 0);
    assert_eq!(u16::from_be_bytes([st[5], st[6]]), 1);
    // Between devices.
    let p = xcopy_list(2, 0, &[*a.naa(), *b.naa()], &[(0, 1, 16, 0, 100)]);
    good(&run(&a, &n, &xcopy_cdb(p.len()), Some(&p), 0).await);
    assert_eq!(read_blocks(&b, &n, 100, 16).await, d[..16 * 512].to_vec());
    // Overlapping copy on one device moves data correctly.
    let p = xcopy_list(3, 2, &[*a.naa()], &[(0, 0, 8, 0, 4)]);
    good(&run(&a, &n, &xcopy_cdb(p.len()), Some(&p), 0).await);
    assert_eq!(read_blocks(&a, &n, 4, 8).await, d[..8 * 512].to_vec());
    // Empty parameter list.
    good(&run(&a, &n, &xcopy_cdb(0), None, 0).await);
    // Errors: unknown index, beyond the end, unknown designator.
    let p = xcopy_list(4, 0, &[*a.naa()], &[(0, 1, 8, 0, 0)]);
    check(
        &run(&a, &n, &xcopy_cdb(p.len()), Some(&p), 0).await,
        key::COPY_ABORTED,
        asc::COPY_TARGET_NOT_REACHABLE,
    );
    let p = xcopy_list(4, 0, &[*a.naa()], &[(0, 0, 2048, 0, NB - 1)]);
    check(
        &run(&a, &n, &xcopy_cdb(p.len()), Some(&p), 0).await,
        key::COPY_ABORTED,
        asc::NO_ADDITIONAL,
    );
    let st = data(&run(&a, &n, &rcr(0, 4), None, 1024).await);
    assert_eq!(st[4], 1);
    let p = xcopy_list(4, 0, &[[0x60; 16]], &[(0, 0, 8, 0, 0)]);
    check(
        &run(&a, &n, &xcopy_cdb(p.len()), Some(&p), 0).await,
        key::COPY_ABORTED,
        asc::COPY_TARGET_NOT_REACHABLE,
    );
    // Parameter list length errors and limits.
    let p = xcopy_list(5, 0, &[*a.naa()], &[(0, 0, 8, 0, 0)]);
    check(
        &run(&a, &n, &xcopy_cdb(47), Some(&p[..47]), 0).await,
        key::ILLEGAL_REQUEST,
        asc::PARAMETER_LIST_LENGTH_ERROR,
    );
    let p = xcopy_list(5, 0, &[*a.naa(); 9], &[(0, 0, 8, 0, 0)]);
    check(
        &run(&a, &n, &xcopy_cdb(p.len()), Some(&p), 0).await,
        key::ILLEGAL_REQUEST,
        asc::TOO_MANY_TARGET_DESCRIPTORS,
    );
    // Operating parameters.
    let op = data(&run(&a, &n, &rcr(3, 0), None, 1024).await);
    assert_eq!(u16::from_be_bytes([op[8], op[9]]), 8);
    assert_eq!(
        u32::from_be_bytes(op[0..4].try_into().unwrap()) as usize,
        op.len() - 4
    );
    // Held results belong to the I_T nexus.
    a.nexus_loss(&n);
    ready(&a, &n).await;
    invalid_cdb(&run(&a, &n, &rcr(0, 1), None, 1024).await);
}

// ---- SANITIZE ------------------------------------------------------------------------------

fn sanitize(sa: u8, plen: u16) -> Vec<u8> {
    let mut c = vec![0x48, sa, 0, 0, 0, 0, 0, 0, 0, 0];
    c[7..9].copy_from_slice(&plen.to_be_bytes());
    c
}

#[tokio::test]
async fn sanitize_commands() {
    let (dev, n) = setup().await;
    write_blocks(&dev, &n, 0, &vec![b'a'; 256 * 512]).await;
    let mut p = vec![0x01u8, 0, 0, 4];
    p.extend_from_slice(&[0xaa, 0xbb, 0xcc, 0xdd]);
    good(&run(&dev, &n, &sanitize(1, 8), Some(&p), 0).await);
    let d = read_blocks(&dev, &n, NB - 1, 1).await;
    assert_eq!(&d[..8], &[0xaa, 0xbb, 0xcc, 0xdd, 0xaa, 0xbb, 0xcc, 0xdd]);
    for plen in 0..5 {
        invalid_cdb(&run(&dev, &n, &sanitize(1, plen), Some(&p), 0).await);
    }
    invalid_cdb(&run(&dev, &n, &sanitize(1, 517), Some(&[0; 520]), 0).await);
    // Overwrite count 0, pattern length 0.
    let r = run(
        &dev,
        &n,
        &sanitize(1, 8),
        Some(&[0, 0, 0, 4, 1, 1, 1, 1]),
        0,
    )
    .await;
    check(&r, key::ILLEGAL_REQUEST, asc::INVALID_FIELD_IN_PARAM_LIST);
    let r = run(
        &dev,
        &n,
        &sanitize(1, 8),
        Some(&[1, 0, 0, 0, 1, 1, 1, 1]),
        0,
    )
    .await;
    check(&r, key::ILLEGAL_REQUEST, asc::INVALID_FIELD_IN_PARAM_LIST);
    // Block erase deallocates everything.
    good(&run(&dev, &n, &sanitize(2, 0), None, 0).await);
    let d = data(&run(&dev, &n, &rw16(0x9e, 0, 256, 0x12), None, 256).await);
    assert_eq!(&d[8..16], &0u64.to_be_bytes());
    assert_eq!(u32::from_be_bytes(d[16..20].try_into().unwrap()) as u64, NB);
    assert_eq!(d[20], 1);
    good(&run(&dev, &n, &sanitize(3, 0), None, 0).await);
    good(&run(&dev, &n, &sanitize(0x1f, 0), None, 0).await);
    invalid_cdb(&run(&dev, &n, &sanitize(2, 8), Some(&[0; 8]), 0).await);
    invalid_cdb(&run(&dev, &n, &sanitize(0x1f, 8), Some(&[0; 8]), 0).await);
    for sa in [0u8, 4, 5, 0x10, 0x1e] {
        invalid_cdb(&run(&dev, &n, &sanitize(sa, 0), None, 0).await);
    }
    // Reserved bits and bytes.
    invalid_cdb(&run(&dev, &n, &sanitize(0x42, 0), None, 0).await);
    for i in 2..7 {
        let mut c = sanitize(2, 0);
        c[i] = i as u8;
        invalid_cdb(&run(&dev, &n, &c, None, 0).await);
    }
}

// ---- read-only logical units ---------------------------------------------------------------

#[tokio::test]
async fn read_only_refuses_every_write() {
    let dev = make(DeviceConfig {
        read_only: true,
        ..cfg()
    });
    let n = nx(1);
    ready(&dev, &n).await;
    let blk = vec![0u8; 512];
    let wp = |r: Response| check(&r, key::DATA_PROTECT, asc::WRITE_PROTECTED);
    wp(run(&dev, &n, &rw10(0x2a, 0, 1, 0), Some(&blk), 0).await);
    wp(run(&dev, &n, &rw12(0xaa, 0, 1, 0), Some(&blk), 0).await);
    wp(run(&dev, &n, &rw16(0x8a, 0, 1, 0), Some(&blk), 0).await);
    wp(run(&dev, &n, &rw10(0x2e, 0, 1, 0x02), Some(&blk), 0).await);
    wp(run(&dev, &n, &rw16(0x8b, 0, 1, 0), Some(&blk), 0).await);
    wp(run(&dev, &n, &caw(0, 1, 0), Some(&[0; 1024]), 0).await);
    wp(run(&dev, &n, &ws10(0, 1, 0), Some(&blk), 0).await);
    // WRITE SAME with UNMAP and no data-out buffer.
    wp(run(&dev, &n, &ws10(0, 1, 0x08), None, 0).await);
    wp(run(&dev, &n, &rw16(0x93, 0, 1, 0x08), None, 0).await);
    let p = unmap_params(&[(0, 1)]);
    wp(run(&dev, &n, &unmap_cdb(p.len(), false), Some(&p), 0).await);
    wp(run(&dev, &n, &sanitize(2, 0), None, 0).await);
    let d = data(&run(&dev, &n, &[0x1a, 0, 0x3f, 0, 255, 0], None, 255).await);
    assert_eq!(d[2] & 0x80, 0x80);
    good(&run(&dev, &n, &rw10(0x28, 0, 1, 0), None, 512).await);
}

// ---- LUN map -------------------------------------------------------------------------------

#[tokio::test]
async fn lun_map_report_luns_and_unmapped() {
    let mut map = LunMap::default();
    map.luns.insert(0, make(cfg()));
    map.luns.insert(300, make(cfg()));
    let n = nx(1);
    let exec = |lun: u64, cdb: Vec<u8>, edtl: u32| {
        let map = map.clone();
        let n = n.clone();
        async move {
            map.execute(
                &n,
                lun,
                Command {
                    cdb: cdb.into(),
                    data_out: None,
                    expected_in_len: edtl,
                    attr: TaskAttr::Simple,
                    tag: 0,
                },
            )
            .await
        }
    };
    let r = exec(5, vec![0xa0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0], 256).await;
    let d = data(&r);
    assert_eq!(&d[0..4], &[0, 0, 0, 16]);
    assert_eq!(&d[8..10], &[0, 0]);
    assert_eq!(&d[16..18], &[0x41, 0x2c]);
    let r = exec(0, vec![0xa0, 0, 0x01, 0, 0, 0, 0, 0, 1, 0, 0, 0], 256).await;
    assert_eq!(&data(&r)[0..4], &[0, 0, 0, 0]);
    invalid_cdb(&exec(0, vec![0xa0, 0, 0x03, 0, 0, 0, 0, 0, 1, 0, 0, 0], 256).await);
    // Allocation length truncation keeps the full list length.
    let r = exec(0, vec![0xa0, 0, 0, 0, 0, 0, 0, 0, 0, 8, 0, 0], 8).await;
    assert_eq!(data(&r), vec![0, 0, 0, 16, 0, 0, 0, 0]);
    // Unmapped LUN.
    let r = exec(7, vec![0x12, 0, 0, 0, 96, 0], 96).await;
    let d = data(&r);
    assert_eq!(d[0], 0x7f);
    check(
        &exec(7, vec![0, 0, 0, 0, 0, 0], 0).await,
        key::ILLEGAL_REQUEST,
        asc::LU_NOT_SUPPORTED,
    );
    let r = exec(7, vec![0x03, 0, 0, 0, 18, 0], 18).await;
    assert_eq!(
        Sense::parse(&data(&r)),
        Some((key::ILLEGAL_REQUEST, 0x25, 0))
    );
    // Mapped LUN goes to the device.
    check(
        &exec(300, vec![0, 0, 0, 0, 0, 0], 0).await,
        key::UNIT_ATTENTION,
        asc::POWER_ON_RESET,
    );
}

// ---- physical block size ---------------------------------------------------------------------

#[tokio::test]
async fn physical_block_size_exponent_and_granularity() {
    let dev = make(DeviceConfig {
        physical_block_size: Some(4096),
        ..cfg()
    });
    let n = nx(1);
    ready(&dev, &n).await;
    assert_eq!(dev.lbppb(), 8);
    let d = data(&run(&dev, &n, &rw16(0x9e, 0, 32, 0x10), None, 32).await);
    // LBPPBE 3, LBPME and LBPRZ, LOWEST ALIGNED LBA 0.
    assert_eq!(&d[13..16], &[0x03, 0xc0, 0x00]);
    let d = data(&run(&dev, &n, &[0x12, 1, 0xb0, 0, 255, 0], None, 255).await);
    assert_eq!(&d[6..8], &[0, 8]);
    assert_eq!(u32::from_be_bytes(d[12..16].try_into().unwrap()) % 8, 0);
    assert_eq!(u32::from_be_bytes(d[28..32].try_into().unwrap()), 8);
    assert_eq!(&d[32..36], &[0x80, 0, 0, 0]);
    // Unaligned deallocation works (LBPRZ: the blocks read back as zeroes).
    write_blocks(&dev, &n, 0, &vec![0xa6; 16 * 512]).await;
    for i in 1..8u32 {
        good(&run(&dev, &n, &ws10(i, 8 - i as u16, 0x08), Some(&[0; 512]), 0).await);
        good(&run(&dev, &n, &rw16(0x93, u64::from(i), 8 - i, 0x09), None, 0).await);
    }
    let d = read_blocks(&dev, &n, 0, 16).await;
    assert!(d[..512].iter().all(|&x| x == 0xa6));
    assert!(d[512..8 * 512].iter().all(|&x| x == 0));
    assert!(d[8 * 512..].iter().all(|&x| x == 0xa6));
    // A fully provisioned unit reports the exponent without LBPME.
    let dev = make(DeviceConfig {
        physical_block_size: Some(4096),
        thin: false,
        ..cfg()
    });
    ready(&dev, &n).await;
    let d = data(&run(&dev, &n, &rw16(0x9e, 0, 32, 0x10), None, 32).await);
    assert_eq!(&d[13..16], &[0x03, 0, 0]);
}

#[test]
fn bad_physical_block_size() {
    for pbs in [256, 768, 3000, 512 << 16] {
        let r = Device::new(
            ram(),
            BufPool::new(1 << 20),
            DeviceConfig {
                physical_block_size: Some(pbs),
                ..cfg()
            },
        );
        assert!(
            matches!(r, Err(ScsiError::InvalidConfig(_))),
            "{pbs} accepted"
        );
    }
}

// ---- WRITE SAME with zero blocks -------------------------------------------------------------

#[tokio::test]
async fn write_same_zero_blocks_writes_to_the_end() {
    let (dev, n) = setup().await;
    let blk = vec![9u8; 512];
    // NUMBER OF LOGICAL BLOCKS 0: from the LBA to the last block.
    good(&run(&dev, &n, &ws10(NB as u32 - 96, 0, 0), Some(&blk), 0).await);
    assert!(read_blocks(&dev, &n, NB - 96, 96)
        .await
        .iter()
        .all(|&x| x == 9));
    assert!(read_blocks(&dev, &n, NB - 97, 1)
        .await
        .iter()
        .all(|&x| x == 0));
    good(&run(&dev, &n, &rw16(0x93, 0, 0, 0), Some(&[3u8; 512]), 0).await);
    assert!(read_blocks(&dev, &n, 0, 256).await.iter().all(|&x| x == 3));
    // At or past the end: LBA OUT OF RANGE.
    lba_oob(&run(&dev, &n, &ws10(NB as u32, 0, 0), Some(&blk), 0).await);
    lba_oob(&run(&dev, &n, &ws10(NB as u32 + 1, 0, 0), Some(&blk), 0).await);
    lba_oob(&run(&dev, &n, &rw16(0x93, u64::MAX, 0, 0), Some(&blk), 0).await);
    // Block limits advertise WSNZ=0.
    let d = data(&run(&dev, &n, &[0x12, 1, 0xb0, 0, 255, 0], None, 255).await);
    assert_eq!(d[4] & 1, 0);
}

#[tokio::test]
async fn write_same_zero_blocks_within_maximum_length() {
    let big = 0x2_0000u64;
    let dev = make_with(Arc::new(RamBackstore::new(big * u64::from(BS), BS)), cfg());
    let n = nx(1);
    ready(&dev, &n).await;
    let max = u64::from(sbc::MAX_WRITE_SAME_BLOCKS);
    let zero = [0u8; 512];
    // The range to the end exceeds MAXIMUM WRITE SAME LENGTH: INVALID FIELD IN CDB.
    invalid_cdb(&run(&dev, &n, &rw16(0x93, 0, 0, 0x08), Some(&zero), 0).await);
    invalid_cdb(
        &run(
            &dev,
            &n,
            &rw16(0x93, big - max - 1, 0, 0x08),
            Some(&zero),
            0,
        )
        .await,
    );
    invalid_cdb(
        &run(
            &dev,
            &n,
            &ws10((big - max - 1) as u32, 0, 0x08),
            Some(&zero),
            0,
        )
        .await,
    );
    good(&run(&dev, &n, &rw16(0x93, big - max, 0, 0x08), Some(&zero), 0).await);
    good(
        &run(
            &dev,
            &n,
            &ws10((big - max + 1) as u32, 0, 0x08),
            Some(&zero),
            0,
        )
        .await,
    );
}

// ---- removable medium ------------------------------------------------------------------------

fn removable() -> DeviceConfig {
    DeviceConfig {
        removable: true,
        ..cfg()
    }
}

const EJECT: [u8; 6] = [0x1b, 0, 0, 0, 0x02, 0];
const LOAD: [u8; 6] = [0x1b, 0, 0, 0, 0x03, 0];
const PREVENT: [u8; 6] = [0x1e, 0, 0, 0, 1, 0];
const ALLOW: [u8; 6] = [0x1e, 0, 0, 0, 0, 0];

#[track_caller]
fn no_medium(r: &Response) {
    check(r, key::NOT_READY, asc::MEDIUM_NOT_PRESENT);
}

#[track_caller]
fn removal_prevented(r: &Response) {
    check(r, key::ILLEGAL_REQUEST, asc::MEDIUM_REMOVAL_PREVENTED);
}

#[tokio::test]
async fn removable_medium_eject_and_load() {
    let dev = make(removable());
    let n = nx(1);
    let n2 = nx(2);
    ready(&dev, &n).await;
    ready(&dev, &n2).await;
    let d = data(&run(&dev, &n, &[0x12, 0, 0, 0, 36, 0], None, 36).await);
    assert_eq!(d[1] & 0x80, 0x80);
    // START without LOEJ leaves the medium alone.
    for cdb in [
        [0x1b, 0, 0, 0, 0, 0],
        [0x1b, 1, 0, 0, 0x01, 0],
        [0x1b, 0, 0, 0, 0x04, 0],
    ] {
        good(&run(&dev, &n, &cdb, None, 0).await);
        good(&run(&dev, &n, &[0; 6], None, 0).await);
    }
    // A power condition ignores LOEJ.
    good(&run(&dev, &n, &[0x1b, 1, 0, 0, 0x32, 0], None, 0).await);
    good(&run(&dev, &n, &[0; 6], None, 0).await);
    // Eject: TEST UNIT READY, medium access and REQUEST SENSE report no medium; INQUIRY,
    // MODE SENSE and PREVENT ALLOW still work.
    good(&run(&dev, &n, &EJECT, None, 0).await);
    no_medium(&run(&dev, &n, &[0; 6], None, 0).await);
    no_medium(&run(&dev, &n2, &[0; 6], None, 0).await);
    no_medium(&run(&dev, &n, &rw10(0x28, 0, 1, 0), None, 512).await);
    no_medium(&run(&dev, &n, &rw10(0x2a, 0, 1, 0), Some(&[0; 512]), 0).await);
    no_medium(&run(&dev, &n, &[0x25, 0, 0, 0, 0, 0, 0, 0, 0, 0], None, 8).await);
    no_medium(&run(&dev, &n, &rw16(0x9e, 0, 32, 0x10), None, 32).await);
    let p = unmap_params(&[(0, 1)]);
    no_medium(&run(&dev, &n, &unmap_cdb(p.len(), false), Some(&p), 0).await);
    let d = data(&run(&dev, &n, &[0x03, 0, 0, 0, 18, 0], None, 18).await);
    assert_eq!((d[2] & 0x0f, d[12], d[13]), (key::NOT_READY, 0x3a, 0x00));
    good(&run(&dev, &n, &[0x12, 0, 0, 0, 36, 0], None, 36).await);
    good(&run(&dev, &n, &[0x1a, 0, 0x3f, 0, 255, 0], None, 255).await);
    // Ejecting again is fine.
    good(&run(&dev, &n, &EJECT, None, 0).await);
    // Load: ready again; the other I_T nexus learns that the medium may have changed.
    good(&run(&dev, &n, &LOAD, None, 0).await);
    good(&run(&dev, &n, &[0; 6], None, 0).await);
    check(
        &run(&dev, &n2, &[0; 6], None, 0).await,
        key::UNIT_ATTENTION,
        asc::NOT_READY_TO_READY_CHANGE,
    );
    good(&run(&dev, &n2, &rw10(0x28, 0, 1, 0), None, 512).await);
}

#[tokio::test]
async fn prevent_allow_medium_removal() {
    let dev = make(removable());
    let n = nx(1);
    let n2 = nx(2);
    ready(&dev, &n).await;
    ready(&dev, &n2).await;
    // Prevention by one nexus holds for every nexus, for eject and load alike.
    good(&run(&dev, &n, &PREVENT, None, 0).await);
    removal_prevented(&run(&dev, &n, &EJECT, None, 0).await);
    removal_prevented(&run(&dev, &n2, &EJECT, None, 0).await);
    good(&run(&dev, &n, &[0; 6], None, 0).await);
    good(&run(&dev, &n, &ALLOW, None, 0).await);
    good(&run(&dev, &n, &EJECT, None, 0).await);
    no_medium(&run(&dev, &n, &[0; 6], None, 0).await);
    good(&run(&dev, &n2, &PREVENT, None, 0).await);
    removal_prevented(&run(&dev, &n, &LOAD, None, 0).await);
    // Each nexus has its own prevention; ALLOW from another nexus does not end it.
    good(&run(&dev, &n, &ALLOW, None, 0).await);
    removal_prevented(&run(&dev, &n, &LOAD, None, 0).await);
    good(&run(&dev, &n2, &ALLOW, None, 0).await);
    good(&run(&dev, &n, &LOAD, None, 0).await);
    good(&run(&dev, &n, &[0; 6], None, 0).await);
    // I_T nexus loss ends that nexus' prevention.
    check(
        &run(&dev, &n2, &PREVENT, None, 0).await,
        key::UNIT_ATTENTION,
        asc::NOT_READY_TO_READY_CHANGE,
    );
    good(&run(&dev, &n2, &PREVENT, None, 0).await);
    removal_prevented(&run(&dev, &n, &EJECT, None, 0).await);
    dev.nexus_loss(&n2);
    good(&run(&dev, &n, &EJECT, None, 0).await);
    good(&run(&dev, &n, &LOAD, None, 0).await);
    // A logical unit reset ends every prevention; the medium stays loaded.
    good(&run(&dev, &n, &PREVENT, None, 0).await);
    dev.lun_reset(&n);
    check(
        &run(&dev, &n, &[0; 6], None, 0).await,
        key::UNIT_ATTENTION,
        asc::BUS_DEVICE_RESET,
    );
    good(&run(&dev, &n, &[0; 6], None, 0).await);
    good(&run(&dev, &n, &EJECT, None, 0).await);
    dev.lun_reset(&n);
    check(
        &run(&dev, &n, &[0; 6], None, 0).await,
        key::UNIT_ATTENTION,
        asc::BUS_DEVICE_RESET,
    );
    no_medium(&run(&dev, &n, &[0; 6], None, 0).await);
    good(&run(&dev, &n, &LOAD, None, 0).await);
    // The obsolete persistent prevention values are refused.
    invalid_cdb(&run(&dev, &n, &[0x1e, 0, 0, 0, 2, 0], None, 0).await);
    invalid_cdb(&run(&dev, &n, &[0x1e, 0, 0, 0, 3, 0], None, 0).await);
}

// ---- SANITIZE in the background -------------------------------------------------------------

/// A backstore whose writes wait until the test opens the gate.
struct GatedStore {
    inner: TestStore,
    open: tokio::sync::watch::Sender<bool>,
}

impl GatedStore {
    fn new() -> Arc<GatedStore> {
        Arc::new(GatedStore {
            inner: TestStore::new(),
            open: tokio::sync::watch::channel(false).0,
        })
    }

    fn open(&self) {
        self.open.send_replace(true);
    }
}

#[async_trait]
impl Backstore for GatedStore {
    fn info(&self) -> DeviceInfo {
        self.inner.info()
    }
    async fn read(&self, offset: u64, buf: IoBuf) -> BufResult<()> {
        self.inner.read(offset, buf).await
    }
    async fn write(&self, offset: u64, buf: IoBuf, fua: bool) -> BufResult<()> {
        let mut rx = self.open.subscribe();
        let _ = rx.wait_for(|o| *o).await;
        self.inner.write(offset, buf, fua).await
    }
    async fn flush(&self) -> Result<(), BackstoreError> {
        self.inner.flush().await
    }
    async fn unmap(&self, offset: u64, len: u64) -> Result<(), BackstoreError> {
        self.inner.unmap(offset, len).await
    }
    async fn lba_status(&self, offset: u64, len: u64) -> Result<(bool, u64), BackstoreError> {
        self.inner.lba_status(offset, len).await
    }
    async fn resize(&self, num_blocks: u64) -> Result<(), BackstoreError> {
        self.inner.resize(num_blocks).await
    }
}

fn overwrite_params(count: u8, pattern: &[u8]) -> Vec<u8> {
    let mut p = vec![count, 0];
    p.extend_from_slice(&(pattern.len() as u16).to_be_bytes());
    p.extend_from_slice(pattern);
    p
}

#[track_caller]
fn sanitizing(r: &Response) {
    check(r, key::NOT_READY, asc::SANITIZE_IN_PROGRESS);
    // SKSV with a progress indication.
    assert_eq!(r.sense.as_ref().unwrap()[15] & 0x80, 0x80);
}

/// Runs TEST UNIT READY until the sanitize operation has ended.
async fn until_sanitized(dev: &Device, n: &Nexus) -> Response {
    loop {
        let r = run(dev, n, &[0; 6], None, 0).await;
        let busy =
            r.status == Status::CheckCondition && sense_of(&r) == (key::NOT_READY, 0x04, 0x1b);
        if !busy {
            return r;
        }
        tokio::task::yield_now().await;
    }
}

#[tokio::test]
async fn sanitize_runs_in_the_background() {
    let store = GatedStore::new();
    let dev = make_with(store.clone(), cfg());
    let n = nx(1);
    let n2 = nx(2);
    ready(&dev, &n).await;
    ready(&dev, &n2).await;
    // IMMED=1: status once the parameters are validated.
    let p = overwrite_params(1, &[0x5a]);
    let mut c = sanitize(1, p.len() as u16);
    c[1] |= 0x80;
    good(&run(&dev, &n, &c, Some(&p), 0).await);
    // Everything but the commands allowed during a sanitize is refused.
    sanitizing(&run(&dev, &n, &[0; 6], None, 0).await);
    sanitizing(&run(&dev, &n2, &rw16(0x88, 0, 1, 0), None, 512).await);
    sanitizing(&run(&dev, &n, &[0x1b, 1, 0, 0, 0x13, 0], None, 0).await);
    sanitizing(&run(&dev, &n, &[0x1a, 0, 0x3f, 0, 255, 0], None, 255).await);
    sanitizing(&run(&dev, &n, &sanitize(2, 0), None, 0).await);
    sanitizing(&run(&dev, &n, &sanitize(0x1f, 0), None, 0).await);
    good(&run(&dev, &n, &[0x12, 0, 0, 0, 36, 0], None, 36).await);
    good(&run(&dev, &n, &rsoc(false, 0, 0, 0), None, 4096).await);
    // REQUEST SENSE reports the progress.
    let d = data(&run(&dev, &n, &[0x03, 0, 0, 0, 18, 0], None, 18).await);
    assert_eq!((d[2] & 0x0f, d[12], d[13]), (key::NOT_READY, 0x04, 0x1b));
    assert_eq!(d[15] & 0x80, 0x80);
    // Task management and nexus loss leave it running.
    dev.abort_task_set(None);
    dev.lun_reset(&n);
    dev.nexus_loss(&n2);
    check(
        &run(&dev, &n, &[0; 6], None, 0).await,
        key::UNIT_ATTENTION,
        asc::BUS_DEVICE_RESET,
    );
    sanitizing(&run(&dev, &n, &[0; 6], None, 0).await);
    check(
        &run(&dev, &n2, &[0; 6], None, 0).await,
        key::UNIT_ATTENTION,
        asc::POWER_ON_RESET,
    );
    sanitizing(&run(&dev, &n2, &[0; 6], None, 0).await);
    store.open();
    good(&until_sanitized(&dev, &n).await);
    assert!(read_blocks(&dev, &n, 0, 8).await.iter().all(|&x| x == 0x5a));
    assert!(read_blocks(&dev, &n2, NB - 8, 8)
        .await
        .iter()
        .all(|&x| x == 0x5a));
}

#[tokio::test]
async fn sanitize_waits_until_aborted() {
    let store = GatedStore::new();
    let dev = make_with(store.clone(), cfg());
    let n = nx(1);
    ready(&dev, &n).await;
    let p = overwrite_params(2, &[0x11, 0x22]);
    let cmd = {
        let dev = dev.clone();
        let n = n.clone();
        let c = sanitize(1, p.len() as u16);
        tokio::spawn(async move {
            dev.execute(
                &n,
                Command {
                    cdb: c.into(),
                    data_out: Some(IoBuf::from_slice(&p)),
                    expected_in_len: 0,
                    attr: TaskAttr::Simple,
                    tag: 7,
                },
            )
            .await
        })
    };
    while dev.lock().sanitize.waiting() == 0 {
        tokio::task::yield_now().await;
    }
    // Another command's abort does not end the wait; aborting this one does, while the
    // operation goes on.
    dev.abort_task(&n, 8);
    dev.abort_task(&nx(2), 7);
    assert!(!cmd.is_finished());
    dev.abort_task(&n, 7);
    let r = cmd.await.unwrap();
    check(&r, key::ABORTED_COMMAND, asc::NO_ADDITIONAL);
    assert_eq!(dev.lock().sanitize.waiting(), 0);
    sanitizing(&run(&dev, &n, &[0; 6], None, 0).await);
    store.open();
    good(&until_sanitized(&dev, &n).await);
    // Two passes: the last one writes the pattern itself.
    let d = read_blocks(&dev, &n, 0, 1).await;
    assert_eq!(&d[..4], &[0x11, 0x22, 0x11, 0x22]);
}

#[tokio::test]
async fn sanitize_overwrite_invert_ends_with_the_pattern() {
    let (dev, n) = setup().await;
    for count in 1..=4u8 {
        let mut p = overwrite_params(count, &[0x0f]);
        p[0] |= 0x80;
        good(&run(&dev, &n, &sanitize(1, p.len() as u16), Some(&p), 0).await);
        assert!(read_blocks(&dev, &n, 0, 4).await.iter().all(|&x| x == 0x0f));
    }
}

#[tokio::test]
async fn sanitize_failure_mode() {
    let store = Arc::new(TestStore::new());
    let dev = make_with(
        store.clone(),
        DeviceConfig {
            thin: false,
            ..cfg()
        },
    );
    let n = nx(1);
    ready(&dev, &n).await;
    let fail = |errno: i32| {
        store
            .fail
            .store(errno, std::sync::atomic::Ordering::Relaxed)
    };
    let failed = |r: &Response| check(r, key::MEDIUM_ERROR, asc::SANITIZE_COMMAND_FAILED);
    // A failed sanitize (AUSE=0) fails medium access until a sanitize succeeds.
    fail(libc::EIO);
    failed(&run(&dev, &n, &sanitize(3, 0), None, 0).await);
    fail(0);
    failed(&run(&dev, &n, &[0; 6], None, 0).await);
    failed(&run(&dev, &n, &rw10(0x28, 0, 1, 0), None, 512).await);
    let d = data(&run(&dev, &n, &[0x03, 0, 0, 0, 18, 0], None, 18).await);
    assert_eq!((d[2] & 0x0f, d[12], d[13]), (key::MEDIUM_ERROR, 0x31, 0x03));
    good(&run(&dev, &n, &[0x12, 0, 0, 0, 36, 0], None, 36).await);
    // Restricted completion mode: no EXIT FAILURE MODE, no AUSE=1.
    invalid_cdb(&run(&dev, &n, &sanitize(0x1f, 0), None, 0).await);
    invalid_cdb(&run(&dev, &n, &sanitize(0x23, 0), None, 0).await);
    good(&run(&dev, &n, &sanitize(3, 0), None, 0).await);
    good(&run(&dev, &n, &[0; 6], None, 0).await);
    // After a failure with AUSE=1, EXIT FAILURE MODE leaves it.
    fail(libc::EIO);
    failed(&run(&dev, &n, &sanitize(0x23, 0), None, 0).await);
    fail(0);
    failed(&run(&dev, &n, &[0; 6], None, 0).await);
    good(&run(&dev, &n, &sanitize(0x1f, 0), None, 0).await);
    good(&run(&dev, &n, &[0; 6], None, 0).await);
    // Without a failure EXIT FAILURE MODE has nothing to do.
    good(&run(&dev, &n, &sanitize(0x1f, 0), None, 0).await);
}

// ---- robustness ------------------------------------------------------------------------------

#[tokio::test]
async fn random_cdbs_never_panic() {
    use rand::{Rng, SeedableRng};
    let (dev, n) = setup().await;
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x5c51);
    let ops: Vec<u8> = table::TABLE.iter().map(|c| c.opcode).collect();
    for i in 0..4000 {
        let len = rng.random_range(0..20);
        let mut cdb: Vec<u8> = (0..len).map(|_| rng.random()).collect();
        if !cdb.is_empty() && i % 2 == 0 {
            cdb[0] = ops[rng.random_range(0..ops.len())];
            // Keep transfers small so the loop stays fast.
            for b in cdb.iter_mut().skip(2) {
                if rng.random_bool(0.5) {
                    *b = 0;
                }
            }
        }
        let dlen = rng.random_range(0..1100);
        let out: Vec<u8> = (0..dlen).map(|_| rng.random()).collect();
        let r = run(&dev, &n, &cdb, Some(&out), rng.random_range(0..70000)).await;
        if let Some(d) = &r.data_in {
            assert!(!d.is_empty());
        }
    }
}

// --- Asymmetric logical unit access ---

/// A nexus through target port group `group` and relative target port `port`.
fn nx_port(id: u64, group: u16, port: u16) -> Nexus {
    Nexus {
        relative_port: port,
        port_group: group,
        ..nx(id)
    }
}

/// Groups 1 (port 1, active/optimized, preferred) and 2 (port 2, standby), both allowing
/// implicit and explicit changes.
fn alua_cfg() -> DeviceConfig {
    let g = |id: u16, state| PortGroup {
        id,
        relative_ports: vec![id],
        state,
        preferred: id == 1,
        implicit: true,
        explicit: true,
    };
    DeviceConfig {
        alua: AluaConfig {
            groups: vec![
                g(1, AccessState::ActiveOptimized),
                g(2, AccessState::Standby),
            ],
            transition_secs: 30,
        },
        ..cfg()
    }
}

const RTPG_EXT: [u8; 12] = [0xa3, 0x2a, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0];
const READ10: [u8; 10] = [0x28, 0, 0, 0, 0, 0, 0, 0, 1, 0];

/// (group, state code, PREF, status code, relative ports) of each descriptor of extended
/// REPORT TARGET PORT GROUPS data.
fn rtpg_groups(d: &[u8]) -> Vec<(u16, u8, bool, u8, Vec<u16>)> {
    assert_eq!(d[4] & 0x70, 0x10, "extended header");
    let mut out = Vec::new();
    let mut at = 8;
    while at + 8 <= d.len() {
        let n = d[at + 7] as usize;
        let ports = (0..n)
            .map(|i| u16::from_be_bytes([d[at + 10 + 4 * i], d[at + 11 + 4 * i]]))
            .collect();
        out.push((
            u16::from_be_bytes([d[at + 2], d[at + 3]]),
            d[at] & 0x0f,
            d[at] & 0x80 != 0,
            d[at + 5],
            ports,
        ));
        at += 8 + 4 * n;
    }
    out
}

fn stpg(descs: &[(u8, u16)]) -> (Vec<u8>, Vec<u8>) {
    let mut p = vec![0u8; 4];
    for (state, group) in descs {
        p.extend_from_slice(&[*state, 0]);
        p.extend_from_slice(&group.to_be_bytes());
    }
    let mut cdb = vec![0xa4, 0x0a, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    cdb[6..10].copy_from_slice(&(p.len() as u32).to_be_bytes());
    (cdb, p)
}

#[tokio::test]
async fn alua_groups_are_learned_from_the_nexuses_when_none_are_configured() {
    let dev = make(cfg());
    let (a, b) = (nx_port(1, 1, 1), nx_port(2, 2, 5));
    ready(&dev, &a).await;
    ready(&dev, &b).await;
    let r = run(&dev, &a, &[0x12, 0, 0, 0, 96, 0], None, 96).await;
    assert_eq!(data(&r)[5] & 0x30, 0x30, "TPGS: implicit and explicit");
    let r = run(&dev, &a, &RTPG_EXT, None, 256).await;
    good(&r);
    assert_eq!(
        rtpg_groups(&data(&r)),
        [(1, 0, false, 0, vec![1]), (2, 0, false, 0, vec![5])]
    );
    // The length-only format: the same descriptors after a 4-byte header.
    let length_only = [0xa3, 0x0a, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0];
    let r2 = run(&dev, &a, &length_only, None, 256).await;
    assert_eq!(&data(&r2)[4..], &data(&r)[8..]);
    // A format this device server does not know.
    let bad_format = [0xa3, 0x4a, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0];
    let r = run(&dev, &a, &bad_format, None, 256).await;
    invalid_cdb(&r);
}

#[tokio::test]
async fn standby_and_the_other_states_refuse_what_spc_says_with_the_exact_sense() {
    let dev = make(alua_cfg());
    let (a, b) = (nx_port(1, 1, 1), nx_port(2, 2, 2));
    ready(&dev, &a).await;
    good(&run(&dev, &a, &READ10, None, 512).await);
    // B's first command reports the power-on unit attention, then the state's sense.
    let r = run(&dev, &b, &[0; 6], None, 0).await;
    check(&r, key::UNIT_ATTENTION, asc::POWER_ON_RESET);
    let standby = (key::NOT_READY, asc::ALUA_STANDBY);
    check(&run(&dev, &b, &[0; 6], None, 0).await, standby.0, standby.1);
    check(
        &run(&dev, &b, &READ10, None, 512).await,
        standby.0,
        standby.1,
    );
    let write = [0x2a, 0, 0, 0, 0, 0, 0, 0, 1, 0];
    check(
        &run(&dev, &b, &write, Some(&[7u8; 512]), 0).await,
        standby.0,
        standby.1,
    );
    // Standby answers INQUIRY, READ CAPACITY, REPORT TARGET PORT GROUPS and PR IN.
    good(&run(&dev, &b, &[0x12, 0, 0, 0, 96, 0], None, 96).await);
    good(
        &run(
            &dev,
            &b,
            &[0x9e, 0x10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 32, 0, 0],
            None,
            32,
        )
        .await,
    );
    good(&run(&dev, &b, &RTPG_EXT, None, 256).await);
    good(&run(&dev, &b, &[0x5e, 0, 0, 0, 0, 0, 0, 0x20, 0, 0], None, 32).await);
    let r = run(&dev, &b, &RTPG_EXT, None, 256).await;
    let d = data(&r);
    assert_eq!(d[5], 30, "implicit transition time");
    assert_eq!(
        rtpg_groups(&d),
        [(1, 0x0, true, 0, vec![1]), (2, 0x2, false, 0, vec![2])]
    );

    // Implicit changes (the API): every nexus hears of them, and each state answers with
    // its own sense.
    for (state, sense) in [
        (AccessState::Unavailable, asc::ALUA_UNAVAILABLE),
        (AccessState::Transitioning, asc::ALUA_TRANSITION),
        (AccessState::Offline, asc::LU_OFFLINE),
    ] {
        let mut alua = alua_cfg().alua;
        alua.groups[1].state = state;
        dev.set_alua(&alua).unwrap();
        for n in [&a, &b] {
            let r = run(&dev, n, &READ10, None, 512).await;
            check(
                &r,
                key::UNIT_ATTENTION,
                asc::ASYMMETRIC_ACCESS_STATE_CHANGED,
            );
        }
        good(&run(&dev, &a, &READ10, None, 512).await);
        check(
            &run(&dev, &b, &READ10, None, 512).await,
            key::NOT_READY,
            sense,
        );
        // Unavailable also refuses READ CAPACITY; every state answers INQUIRY and RTPG.
        let rc = run(&dev, &b, &[0x25, 0, 0, 0, 0, 0, 0, 0, 0, 0], None, 8).await;
        check(&rc, key::NOT_READY, sense);
        good(&run(&dev, &b, &RTPG_EXT, None, 256).await);
    }
    let r = run(&dev, &a, &RTPG_EXT, None, 256).await;
    assert_eq!(rtpg_groups(&data(&r))[1].3, 2, "status: altered implicitly");
    // The same state again changes nothing and tells nobody.
    let mut alua = alua_cfg().alua;
    alua.groups[1].state = AccessState::Offline;
    dev.set_alua(&alua).unwrap();
    good(&run(&dev, &a, &READ10, None, 512).await);

    // A port in no configured group is unavailable.
    let c = nx_port(3, 7, 7);
    let r = run(&dev, &c, &[0; 6], None, 0).await;
    check(&r, key::UNIT_ATTENTION, asc::POWER_ON_RESET);
    let r = run(&dev, &c, &READ10, None, 512).await;
    check(&r, key::NOT_READY, asc::ALUA_UNAVAILABLE);
}

#[tokio::test]
async fn set_target_port_groups_switches_the_owner_and_tells_the_other_nexuses() {
    let dev = make(alua_cfg());
    let (a, b) = (nx_port(1, 1, 1), nx_port(2, 2, 2));
    ready(&dev, &a).await;
    let r = run(&dev, &b, &[0; 6], None, 0).await;
    check(&r, key::UNIT_ATTENTION, asc::POWER_ON_RESET);
    // B (standby) moves the logical unit to its own group.
    let (cdb, p) = stpg(&[(0x2, 1), (0x0, 2)]);
    good(&run(&dev, &b, &cdb, Some(&p), 0).await);
    good(&run(&dev, &b, &READ10, None, 512).await);
    let r = run(&dev, &a, &READ10, None, 512).await;
    check(
        &r,
        key::UNIT_ATTENTION,
        asc::ASYMMETRIC_ACCESS_STATE_CHANGED,
    );
    check(
        &run(&dev, &a, &READ10, None, 512).await,
        key::NOT_READY,
        asc::ALUA_STANDBY,
    );
    let r = run(&dev, &a, &RTPG_EXT, None, 256).await;
    assert_eq!(
        rtpg_groups(&data(&r)),
        [(1, 0x2, true, 1, vec![1]), (2, 0x0, false, 1, vec![2])]
    );
}

/// Two processes exporting one logical unit with a shared state share the target port
/// group states too: a SET TARGET PORT GROUPS or an API change through one reaches the other
/// process's I_T nexuses, a configuration's change is shared, and a process that starts later
/// takes the shared states over its configuration's.
#[tokio::test]
async fn alua_states_shared_by_two_gateways() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("lun0.pr");
    let backstore = ram();
    let config = || DeviceConfig {
        pr_shared: Some(Arc::new(rtgt_backstore::SharedFile::new(&path))),
        ..alua_cfg()
    };
    let a = make_with(backstore.clone(), config());
    let b = make_with(backstore.clone(), config());
    let (n1, n2) = (nx_port(1, 1, 1), nx_port(2, 2, 2));
    ready(&a, &n1).await;
    let rtpg = |dev: &Arc<Device>, n: &Nexus| {
        let (dev, n) = (dev.clone(), n.clone());
        async move {
            let mut r = run(&dev, &n, &RTPG_EXT, None, 256).await;
            for _ in 0..4 {
                if r.status == Status::Good {
                    break;
                }
                r = run(&dev, &n, &RTPG_EXT, None, 256).await;
            }
            rtpg_groups(&data(&r))
        }
    };
    // The configured states are written for the others (in the background).
    let shared = |want: &str| {
        let path = path.clone();
        let want = want.to_string();
        async move {
            for _ in 0..500 {
                if std::fs::read_to_string(&path).is_ok_and(|t| t.contains(&want)) {
                    return;
                }
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
            panic!("{want:?} not in {:?}", std::fs::read_to_string(&path));
        }
    };
    shared("tpg 1 active_optimized 0\ntpg 2 standby 0\n").await;
    assert_eq!(
        rtpg(&b, &n2).await,
        [(1, 0x0, true, 0, vec![1]), (2, 0x2, false, 0, vec![2])]
    );
    // B (standby) takes the logical unit: A's nexus hears of it and is standby.
    let (cdb, p) = stpg(&[(0x2, 1), (0x0, 2)]);
    good(&run(&b, &n2, &cdb, Some(&p), 0).await);
    check(
        &run(&a, &n1, &READ10, None, 512).await,
        key::UNIT_ATTENTION,
        asc::ASYMMETRIC_ACCESS_STATE_CHANGED,
    );
    check(
        &run(&a, &n1, &READ10, None, 512).await,
        key::NOT_READY,
        asc::ALUA_STANDBY,
    );
    assert_eq!(
        rtpg(&a, &n1).await,
        [(1, 0x2, true, 1, vec![1]), (2, 0x0, false, 1, vec![2])]
    );
    // Through A's API: group 1 active/optimized now, although A's configuration says so
    // already. B's nexus hears of it (an implicit change).
    assert_eq!(
        a.set_group_state(1, AccessState::ActiveOptimized).await,
        Ok(true)
    );
    check(
        &run(&b, &n2, &READ10, None, 512).await,
        key::UNIT_ATTENTION,
        asc::ASYMMETRIC_ACCESS_STATE_CHANGED,
    );
    assert_eq!(
        rtpg(&b, &n2).await,
        [(1, 0x0, true, 2, vec![1]), (2, 0x0, false, 1, vec![2])]
    );
    assert!(a.set_group_state(7, AccessState::Standby).await.is_err());
    // B's configuration gives group 2 another state: shared, and A takes it in.
    let mut alua = alua_cfg().alua;
    alua.groups[1].state = AccessState::ActiveNonOptimized;
    b.set_alua(&alua).unwrap();
    shared("tpg 2 active_non_optimized 2\n").await;
    assert_eq!(
        rtpg(&a, &n1).await,
        [(1, 0x0, true, 2, vec![1]), (2, 0x1, false, 2, vec![2])]
    );
    // A process started later (configured with group 2 standby) takes the shared states.
    let c = make_with(backstore.clone(), config());
    let n3 = nx_port(3, 2, 2);
    assert_eq!(
        rtpg(&c, &n3).await,
        [(1, 0x0, true, 2, vec![1]), (2, 0x1, false, 2, vec![2])]
    );
    good(&run(&c, &n3, &READ10, None, 512).await);
}

#[tokio::test]
async fn a_new_configuration_keeps_explicit_states_of_groups_it_does_not_change() {
    let dev = make(alua_cfg());
    let (a, b) = (nx_port(1, 1, 1), nx_port(2, 2, 2));
    ready(&dev, &a).await;
    let r = run(&dev, &b, &RTPG_EXT, None, 256).await;
    check(&r, key::UNIT_ATTENTION, asc::POWER_ON_RESET);
    // B takes the logical unit with SET TARGET PORT GROUPS.
    let (cdb, p) = stpg(&[(0x2, 1), (0x0, 2)]);
    good(&run(&dev, &b, &cdb, Some(&p), 0).await);
    let r = run(&dev, &a, &RTPG_EXT, None, 256).await;
    check(
        &r,
        key::UNIT_ATTENTION,
        asc::ASYMMETRIC_ACCESS_STATE_CHANGED,
    );
    // A port added to group 2 only: the states SET TARGET PORT GROUPS set stay (the new
    // port's state is news: it was in no group, unavailable).
    let mut alua = alua_cfg().alua;
    alua.groups[1].relative_ports.push(5);
    dev.set_alua(&alua).unwrap();
    let r = run(&dev, &b, &READ10, None, 512).await;
    check(
        &r,
        key::UNIT_ATTENTION,
        asc::ASYMMETRIC_ACCESS_STATE_CHANGED,
    );
    good(&run(&dev, &b, &READ10, None, 512).await);
    // The same configuration again is no news.
    dev.set_alua(&alua).unwrap();
    good(&run(&dev, &b, &READ10, None, 512).await);
    let r = run(&dev, &a, &RTPG_EXT, None, 256).await;
    check(
        &r,
        key::UNIT_ATTENTION,
        asc::ASYMMETRIC_ACCESS_STATE_CHANGED,
    );
    let r = run(&dev, &a, &RTPG_EXT, None, 256).await;
    assert_eq!(
        rtpg_groups(&data(&r)),
        [(1, 0x2, true, 1, vec![1]), (2, 0x0, false, 1, vec![2, 5])]
    );
    // Group 1's configured state changes: it takes it, implicitly; group 2 keeps its own.
    // (A was standby: set by SET TARGET PORT GROUPS, and its configured state had not changed.)
    alua.groups[0].state = AccessState::ActiveNonOptimized;
    dev.set_alua(&alua).unwrap();
    for n in [&a, &b] {
        let r = run(&dev, n, &READ10, None, 512).await;
        check(
            &r,
            key::UNIT_ATTENTION,
            asc::ASYMMETRIC_ACCESS_STATE_CHANGED,
        );
    }
    let r = run(&dev, &a, &RTPG_EXT, None, 256).await;
    assert_eq!(
        rtpg_groups(&data(&r)),
        [(1, 0x1, true, 2, vec![1]), (2, 0x0, false, 1, vec![2, 5])]
    );
    good(&run(&dev, &a, &READ10, None, 512).await);

    // No groups configured any more: learned again from the nexuses, all active/optimized,
    // and TPGS changed (implicit only before, both now).
    for g in &mut alua.groups {
        g.explicit = false;
    }
    dev.set_alua(&alua).unwrap();
    ready(&dev, &a).await;
    let r = run(&dev, &a, &[0x12, 0, 0, 0, 96, 0], None, 96).await;
    assert_eq!(data(&r)[5] & 0x30, 0x10);
    dev.set_alua(&AluaConfig::default()).unwrap();
    let r = run(&dev, &a, &READ10, None, 512).await;
    check(
        &r,
        key::UNIT_ATTENTION,
        asc::ASYMMETRIC_ACCESS_STATE_CHANGED,
    );
    let r = run(&dev, &a, &READ10, None, 512).await;
    check(&r, key::UNIT_ATTENTION, asc::INQUIRY_DATA_CHANGED);
    let r = run(&dev, &a, &[0x12, 0, 0, 0, 96, 0], None, 96).await;
    assert_eq!(data(&r)[5] & 0x30, 0x30);
    let r = run(&dev, &a, &RTPG_EXT, None, 256).await;
    assert_eq!(
        rtpg_groups(&data(&r)),
        [(1, 0x0, false, 0, vec![1]), (2, 0x0, false, 0, vec![2])]
    );
    assert_eq!(dev.port_groups().len(), 2);
    // A configuration that names a port twice is refused and changes nothing.
    let mut bad = alua_cfg().alua;
    bad.groups[1].relative_ports = vec![1];
    assert!(dev.set_alua(&bad).is_err());
    assert_eq!(dev.port_groups().len(), 2);
}

#[tokio::test]
async fn set_target_port_groups_refuses_bad_lists_and_changes_nothing() {
    let dev = make(alua_cfg());
    let a = nx_port(1, 1, 1);
    ready(&dev, &a).await;
    let before = data(&run(&dev, &a, &RTPG_EXT, None, 256).await);
    let param = |at: usize| (key::ILLEGAL_REQUEST, asc::INVALID_FIELD_IN_PARAM_LIST, at);
    for (descs, why) in [
        (vec![(0x0, 2), (0x2, 9)], param(10)), // an unknown group after a valid one
        (vec![(0xf, 2)], param(4)),            // transitioning cannot be asked for
        (vec![(0x4, 2)], param(4)),            // logical block dependent: unsupported
        (vec![(0x7, 1)], param(4)),            // reserved state
    ] {
        let (cdb, p) = stpg(&descs);
        let r = run(&dev, &a, &cdb, Some(&p), 0).await;
        let (k, c, q) = sense_of(&r);
        assert_eq!((k, (c, q)), (why.0, why.1), "{descs:?}");
        let s = r.sense.as_ref().unwrap();
        // SKSV with the field pointer of the offending byte.
        assert_eq!(s[15] & 0x80, 0x80);
        assert_eq!(
            u16::from_be_bytes([s[16], s[17]]) as usize,
            why.2,
            "{descs:?}"
        );
    }
    // A list that ends inside a descriptor, or shorter than it says.
    let (mut cdb, p) = stpg(&[(0x0, 2)]);
    cdb[9] = 6;
    let r = run(&dev, &a, &cdb, Some(&p[..6]), 0).await;
    check(&r, key::ILLEGAL_REQUEST, asc::PARAMETER_LIST_LENGTH_ERROR);
    cdb[9] = 12;
    let r = run(&dev, &a, &cdb, Some(&p), 0).await;
    check(&r, key::ILLEGAL_REQUEST, asc::PARAMETER_LIST_LENGTH_ERROR);
    // A zero-length list is no change.
    cdb[9] = 0;
    good(&run(&dev, &a, &cdb, None, 0).await);
    assert_eq!(data(&run(&dev, &a, &RTPG_EXT, None, 256).await), before);
}

#[tokio::test]
async fn groups_without_explicit_changes_have_no_set_target_port_groups() {
    let mut c = alua_cfg();
    for g in &mut c.alua.groups {
        g.explicit = false;
    }
    let dev = make(c);
    let a = nx_port(1, 1, 1);
    ready(&dev, &a).await;
    let r = run(&dev, &a, &[0x12, 0, 0, 0, 96, 0], None, 96).await;
    assert_eq!(data(&r)[5] & 0x30, 0x10, "TPGS: implicit only");
    let (cdb, p) = stpg(&[(0x2, 1)]);
    let r = run(&dev, &a, &cdb, Some(&p), 0).await;
    check(&r, key::ILLEGAL_REQUEST, asc::INVALID_FIELD_IN_CDB);
    // One group that refuses explicit changes among others that allow them.
    let mut c = alua_cfg();
    c.alua.groups[1].explicit = false;
    let dev = make(c);
    ready(&dev, &a).await;
    let (cdb, p) = stpg(&[(0x0, 2)]);
    let r = run(&dev, &a, &cdb, Some(&p), 0).await;
    check(&r, key::ILLEGAL_REQUEST, asc::INVALID_FIELD_IN_PARAM_LIST);
    // Duplicate groups or ports in the configuration are refused at creation.
    let mut c = alua_cfg();
    c.alua.groups[1].relative_ports = vec![1];
    assert!(matches!(
        Device::new(ram(), BufPool::new(1 << 20), c),
        Err(ScsiError::InvalidConfig(_))
    ));
}

/// A gateway restarted over a shared state whose configured group states it writes first (an
/// update that changes nothing) still reads the registrations before its first command: an
/// update counts the store as read, so the device takes in what it read there.
#[tokio::test]
async fn a_restarted_gateway_takes_in_the_shared_state_its_groups_update_read() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("lun0.pr");
    let backstore = ram();
    let config = || DeviceConfig {
        pr_shared: Some(Arc::new(rtgt_backstore::SharedFile::new(&path))),
        ..cfg()
    };
    // As rtgtd builds them: no groups, then the configuration's.
    let alua = alua_cfg().alua;
    let start = || {
        let d = make_with(backstore.clone(), config());
        d.set_alua(&alua).unwrap();
        d
    };
    let settle = || async {
        for _ in 0..20 {
            tokio::task::yield_now().await;
        }
    };
    let a = start();
    let b = start();
    settle().await;
    let n1 = nx_port(1, 1, 1);
    ready(&a, &n1).await;
    good(&prout(&a, &n1, 0, 0, 0, 0xabc1, 0).await);
    drop(a);
    let a2 = start();
    settle().await;
    ready(&a2, &n1).await;
    let r = run(&a2, &n1, &[0x5e, 0, 0, 0, 0, 0, 0, 1, 0, 0], None, 256).await;
    assert_eq!(
        &data(&r)[..16],
        &[0, 0, 0, 1, 0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0xab, 0xc1]
    );
    drop(b);
}
