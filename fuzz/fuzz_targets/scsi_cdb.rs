#![no_main]
//! Arbitrary CDBs and data-out buffers through a SCSI `Device` on a RAM backstore: every
//! input must get a SCSI answer (status, sense, bounded data-in), never a panic.
//!
//! Input layout: byte 0 = CDB length (mod 33), bytes 1-2 = expected data-in length / 16,
//! byte 3 = I_T nexus selector, then the CDB, then the data-out buffer.

use std::sync::{Arc, OnceLock};

use libfuzzer_sys::fuzz_target;
use rtgt_backstore::{BufPool, IoBuf, RamBackstore};
use rtgt_target::scsi::{Command, Device, DeviceConfig, Nexus, Status, TaskAttr};

struct Env {
    rt: tokio::runtime::Runtime,
    dev: Arc<Device>,
}

fn env() -> &'static Env {
    static ENV: OnceLock<Env> = OnceLock::new();
    ENV.get_or_init(|| {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let backstore = Arc::new(RamBackstore::new(1 << 20, 512));
        let config = DeviceConfig {
            name: "fuzz".into(),
            thin: true,
            wwn: 0x6001_4050_0000_0000_0000_0000_0000_0001,
            ..DeviceConfig::default()
        };
        let dev = Device::new(backstore, BufPool::new(32 << 20), config).expect("device");
        Env { rt, dev }
    })
}

fn nexus(sel: u8) -> Nexus {
    let id = u64::from(sel % 3);
    Nexus {
        id,
        initiator_port: format!("iqn.2024-01.fuzz:init{id},i,0x00023d000001"),
        transport_id: Vec::new(),
        target_port: "iqn.2025-01.io.rtgt:fuzz,t,0x0001".into(),
        relative_port: 1,
        port_group: 1,
    }
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 4 {
        return;
    }
    let cdb_len = usize::from(data[0] % 33).min(data.len() - 4);
    let edtl = u32::from(u16::from_le_bytes([data[1], data[2]])) * 16;
    let n = nexus(data[3]);
    let cdb = data[4..4 + cdb_len].to_vec();
    let out = &data[4 + cdb_len..];
    let env = env();
    let cmd = Command {
        cdb,
        data_out: (!out.is_empty()).then(|| IoBuf::from_slice(out)),
        expected_in_len: edtl,
        attr: TaskAttr::Simple,
        tag: 0,
    };
    let r = env.rt.block_on(env.dev.execute(&n, cmd));
    if let Some(d) = &r.data_in {
        assert!(d.len() <= edtl as usize);
    }
    assert_eq!(r.status == Status::CheckCondition, r.sense.is_some());
});
