//! The SCSI engine (`rtgt-scsi`): CDBs and parameter lists through a [`Device`] on a
//! RAM backstore.
//!
//! Every input gets fresh logical units, so a failure reproduces from its input alone; an
//! input is a sequence of commands, so that state one command sets up (a registration, a
//! mode page, a reservation) is seen by the next.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rtgt_backstore::{BufPool, IoBuf, RamBackstore, SharedFile};
use rtgt_iscsi::session::transport_id;
use rtgt_scsi::sense::Sense;
use rtgt_scsi::{
    AccessState, AluaConfig, Command, Device, DeviceConfig, DeviceRegistry, Nexus, PortGroup,
    Response, Status, TaskAttr,
};

/// Commands an input may carry; the rest of a longer input is ignored.
const MAX_COMMANDS: usize = 8;
/// I_T nexuses commands can come from.
const NEXUSES: u8 = 4;
/// Capacity of each logical unit (one `RamBackstore` chunk).
const CAPACITY: u64 = 1 << 20;
const BLOCK_SIZE: u32 = 512;
/// No command on a 1 MiB ramdisk takes this long; one that does is stuck.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(10);

/// Two logical units in one EXTENDED COPY registry (commands go to `dev`; `other` is a copy
/// target), sharing one buffer pool, and a runtime of their own: what a command leaves
/// running in the background (a SANITIZE with IMMED set) ends with the input.
struct Lab {
    rt: tokio::runtime::Runtime,
    pool: Arc<BufPool>,
    dev: Arc<Device>,
    other: Arc<Device>,
    nexuses: Vec<Nexus>,
}

impl Lab {
    fn new() -> Lab {
        Lab::with_pr_file(None)
    }

    /// A lab whose `dev` keeps its reservations in `pr_file`, shared as with another process.
    fn with_pr_file(pr_file: Option<PathBuf>) -> Lab {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("tokio runtime");
        let pool = BufPool::new(16 << 20);
        let registry = DeviceRegistry::new();
        let lu_config = |wwn: u128| DeviceConfig {
            name: format!("fuzz{}", wwn & 0xf),
            serial: format!("FUZZ{:04}", wwn & 0xf),
            thin: true,
            wwn,
            registry: Some(registry.clone()),
            // Unpaced: a sanitize of the 1 MiB medium takes no time.
            sanitize_rate: 0,
            ..DeviceConfig::default()
        };
        let lu = |wwn: u128| {
            let backstore = Arc::new(RamBackstore::new(CAPACITY, BLOCK_SIZE));
            Device::new(backstore, pool.clone(), lu_config(wwn)).expect("device")
        };
        let dev = {
            let wwn = 0x6001_4050_0000_0000_0000_0000_0000_0001;
            // Shared with another process: the target port groups are configured (their
            // states are shared too); otherwise learned.
            let alua = match pr_file {
                Some(_) => shared_groups(),
                None => AluaConfig::default(),
            };
            let config = DeviceConfig {
                pr_shared: pr_file
                    .map(|p| Arc::new(SharedFile::new(p)) as Arc<dyn rtgt_backstore::SharedState>),
                alua,
                ..lu_config(wwn)
            };
            let backstore = Arc::new(RamBackstore::new(CAPACITY, BLOCK_SIZE));
            Device::new(backstore, pool.clone(), config).expect("device")
        };
        let other = lu(0x6001_4050_0000_0000_0000_0000_0000_0002);
        let nexuses = (0..NEXUSES)
            .map(|id| {
                let initiator_port = format!("iqn.2024-01.fuzz:init{id},i,0x00023d00000{id}");
                Nexus {
                    id: u64::from(id),
                    transport_id: transport_id(&initiator_port),
                    initiator_port,
                    target_port: "iqn.2025-01.io.rtgt:fuzz,t,0x0001".into(),
                    // Two target port groups of two ports each: SET TARGET PORT GROUPS
                    // moves one nexus's group away from another's.
                    relative_port: u16::from(id) + 1,
                    port_group: u16::from(id) % 2 + 1,
                }
            })
            .collect();
        let lab = Lab {
            rt,
            pool,
            dev,
            other,
            nexuses,
        };
        // Consume the POWER ON unit attention every nexus starts with, so that an input's
        // first command from a nexus is executed rather than answered with it.
        for n in 0..NEXUSES {
            lab.execute(n, vec![0; 6], &[], 0);
        }
        lab
    }

    /// Runs one command from nexus `n % NEXUSES` and checks the response's invariants.
    fn execute(&self, n: u8, cdb: Vec<u8>, data_out: &[u8], expected_in_len: u32) -> Response {
        let nexus = &self.nexuses[usize::from(n % NEXUSES)];
        let cmd = Command {
            cdb: cdb.into(),
            data_out: (!data_out.is_empty()).then(|| IoBuf::from_slice(data_out)),
            expected_in_len,
            attr: TaskAttr::Simple,
            tag: 0,
        };
        let r = self.rt.block_on(async {
            tokio::time::timeout(COMMAND_TIMEOUT, self.dev.execute(nexus, cmd)).await
        });
        let r = r.unwrap_or_else(|_| panic!("command did not complete in {COMMAND_TIMEOUT:?}"));
        if let Some(d) = &r.data_in {
            assert!(
                d.len() <= expected_in_len as usize,
                "{} bytes of data-in for an expected length of {expected_in_len}",
                d.len()
            );
            assert!(
                d.len() <= r.transfer_len as usize,
                "{} bytes of data-in, transfer length {}",
                d.len(),
                r.transfer_len
            );
        }
        assert_eq!(
            r.status == Status::CheckCondition,
            r.sense.is_some(),
            "status {:?}, sense {:02x?}",
            r.status,
            r.sense
        );
        if let Some(s) = &r.sense {
            assert!(Sense::parse(s).is_some(), "malformed sense {s:02x?}");
        }
        r
    }

    /// Ends what still runs, drops the logical units and checks that every buffer went back
    /// to the pool.
    fn finish(self) {
        let Lab {
            rt,
            pool,
            dev,
            other,
            ..
        } = self;
        drop(rt);
        drop((dev, other));
        assert_eq!(pool.in_use_bytes(), 0, "buffers leaked from the pool");
    }
}

/// Splits `n` bytes (at most what is left) off the front of `rest`.
fn take<'a>(rest: &mut &'a [u8], n: usize) -> &'a [u8] {
    let (head, tail) = rest.split_at(n.min(rest.len()));
    *rest = tail;
    head
}

/// Arbitrary CDBs and data-out buffers through a SCSI `Device`: every command gets a SCSI
/// answer (CHECK CONDITION exactly when there is sense data, well-formed sense, data-in
/// within the expected and the transfer length), never a panic or a hang, and no buffer
/// leaks from the pool.
///
/// Input: up to 8 records of a 6-byte header — byte 0 the CDB length (mod 33), bytes 1-2 the
/// expected data-in length / 16 (little endian), byte 3 the nexus (mod 4), bytes 4-5 the
/// data-out length (little endian) — followed by the CDB and the data-out buffer, both cut
/// short at the end of the input.
pub fn scsi_cdb(data: &[u8]) {
    let lab = Lab::new();
    let mut rest = data;
    for _ in 0..MAX_COMMANDS {
        if rest.len() < 6 {
            break;
        }
        let hdr = take(&mut rest, 6);
        let edtl = u32::from(u16::from_le_bytes([hdr[1], hdr[2]])) * 16;
        let cdb = take(&mut rest, usize::from(hdr[0] % 33)).to_vec();
        let out = take(&mut rest, usize::from(u16::from_le_bytes([hdr[4], hdr[5]])));
        lab.execute(hdr[3], cdb, out, edtl);
    }
    lab.finish();
}

/// Parameter lists of PERSISTENT RESERVE OUT, UNMAP, MODE SELECT(6/10), EXTENDED COPY,
/// SANITIZE and SET TARGET PORT GROUPS through a SCSI `Device`: the CDB is well formed (its PARAMETER LIST LENGTH is
/// the length of the data-out buffer), the parameter list is arbitrary. Same checks as
/// [`scsi_cdb`], and none of these commands returns data-in.
///
/// Input: up to 8 records of a 4-byte header — byte 0 the command (bits 0-5, mod 7) and the
/// nexus (bits 6-7), byte 1 the PERSISTENT RESERVE OUT service action (bits 0-2) and type
/// (bits 3-6), bytes 2-3 the parameter list length (little endian) — followed by the
/// parameter list, cut short at the end of the input and at what the CDB field can express.
pub fn scsi_params(data: &[u8]) {
    let lab = Lab::new();
    let mut rest = data;
    for _ in 0..MAX_COMMANDS {
        if rest.len() < 4 {
            break;
        }
        let hdr = take(&mut rest, 4);
        let (sel, flags) = (hdr[0], hdr[1]);
        let want = usize::from(u16::from_le_bytes([hdr[2], hdr[3]]));
        let (cdb, max_len): (Vec<u8>, usize) = match (sel & 0x3f) % 7 {
            // PERSISTENT RESERVE OUT: service action, scope LU, type.
            0 => (
                vec![0x5f, flags & 0x07, (flags >> 3) & 0x0f, 0, 0, 0, 0, 0, 0, 0],
                0xffff,
            ),
            // UNMAP.
            1 => (vec![0x42, 0, 0, 0, 0, 0, 0, 0, 0, 0], 0xffff),
            // MODE SELECT(6) with PF.
            2 => (vec![0x15, 0x10, 0, 0, 0, 0], 0xff),
            // MODE SELECT(10) with PF.
            3 => (vec![0x55, 0x10, 0, 0, 0, 0, 0, 0, 0, 0], 0xffff),
            // EXTENDED COPY (LID1).
            4 => (
                vec![0x83, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
                0xffff,
            ),
            // SANITIZE, OVERWRITE.
            5 => (vec![0x48, 0x01, 0, 0, 0, 0, 0, 0, 0, 0], 0xffff),
            // SET TARGET PORT GROUPS.
            _ => (vec![0xa4, 0x0a, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0], 0xffff),
        };
        let params = take(&mut rest, want.min(max_len));
        let mut cdb = cdb;
        let len = params.len();
        match cdb[0] {
            0x5f => cdb[5..9].copy_from_slice(&(len as u32).to_be_bytes()),
            0x15 => cdb[4] = len as u8,
            0x83 => cdb[10..14].copy_from_slice(&(len as u32).to_be_bytes()),
            0xa4 => cdb[6..10].copy_from_slice(&(len as u32).to_be_bytes()),
            _ => cdb[7..9].copy_from_slice(&(len as u16).to_be_bytes()),
        }
        let r = lab.execute(sel >> 6, cdb, params, 0);
        assert!(r.data_in.is_none());
    }
    lab.finish();
}

/// The groups of a logical unit shared with another process: 1 (ports 1, 3) and 2 (ports 2,
/// 4), as the nexuses are spread over them.
fn shared_groups() -> AluaConfig {
    let group = |id: u16, state| PortGroup {
        id,
        relative_ports: vec![id, id + 2],
        state,
        preferred: id == 1,
        implicit: true,
        explicit: true,
    };
    AluaConfig {
        groups: vec![
            group(1, AccessState::ActiveOptimized),
            group(2, AccessState::ActiveNonOptimized),
        ],
        transition_secs: 0,
    }
}

/// A reservation state file as another process sharing the logical unit left it: read when
/// a logical unit opens (refused, or opened, never a panic), and taken in by a running one
/// when it changes, before its next command — which answers with CHECK CONDITION when the
/// file cannot be used. Then PERSISTENT RESERVE IN, a WRITE, a registration (which writes
/// the file again), REPORT TARGET PORT GROUPS and a SET TARGET PORT GROUPS making the
/// nexus's group active/optimized (the groups' states are in the file too) from every nexus,
/// with [`scsi_cdb`]'s checks.
///
/// Input: the file's contents.
pub fn scsi_pr_state(data: &[u8]) {
    static N: AtomicU64 = AtomicU64::new(0);
    let path = std::env::temp_dir().join(format!(
        "rtgt-fuzz-pr-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::write(&path, data).expect("write the state file");
    let opened = Device::new(
        Arc::new(RamBackstore::new(CAPACITY, BLOCK_SIZE)),
        BufPool::new(1 << 20),
        DeviceConfig {
            pr_shared: Some(Arc::new(SharedFile::new(&path))),
            ..DeviceConfig::default()
        },
    );
    drop(opened);
    let _ = std::fs::remove_file(&path);
    let lab = Lab::with_pr_file(Some(path.clone()));
    std::fs::write(&path, data).expect("write the state file");
    for n in 0..NEXUSES {
        for sa in 0..4u8 {
            lab.execute(n, vec![0x5e, sa, 0, 0, 0, 0, 0, 0x10, 0, 0], &[], 0x1000);
        }
        lab.execute(n, vec![0x2a, 0, 0, 0, 0, 0, 0, 0, 1, 0], &[0u8; 512], 0);
        let mut register = vec![0u8; 24];
        register[8..16].copy_from_slice(&(u64::from(n) + 1).to_be_bytes());
        lab.execute(n, vec![0x5f, 0x06, 0, 0, 0, 0, 0, 0, 24, 0], &register, 0);
        lab.execute(
            n,
            vec![0xa3, 0x0a, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0],
            &[],
            0x100,
        );
        let stpg = [0, 0, 0, 0, 0, 0, 0, n % 2 + 1];
        lab.execute(n, vec![0xa4, 0x0a, 0, 0, 0, 0, 0, 0, 0, 8, 0, 0], &stpg, 0);
    }
    lab.finish();
    let _ = std::fs::remove_file(&path);
    let mut lock = path.into_os_string();
    lock.push(".lock");
    let _ = std::fs::remove_file(lock);
}
