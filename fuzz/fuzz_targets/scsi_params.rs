#![no_main]
//! Parameter lists of PERSISTENT RESERVE OUT, UNMAP, MODE SELECT(6/10), EXTENDED COPY and
//! SANITIZE through a SCSI `Device`: the CDB is well formed (its PARAMETER LIST LENGTH matches
//! the data), the parameter list is arbitrary.
//!
//! Input layout: byte 0 selects the command, byte 1 the service action / flags, then the
//! parameter list.

use std::sync::{Arc, OnceLock};

use libfuzzer_sys::fuzz_target;
use rtgt_backstore::{BufPool, IoBuf, RamBackstore};
use rtgt_target::scsi::{Command, Device, DeviceConfig, DeviceRegistry, Nexus, Status, TaskAttr};

struct Env {
    rt: tokio::runtime::Runtime,
    dev: Arc<Device>,
    _other: Arc<Device>,
}

fn env() -> &'static Env {
    static ENV: OnceLock<Env> = OnceLock::new();
    ENV.get_or_init(|| {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let registry = DeviceRegistry::new();
        let mk = |wwn: u128| {
            let config = DeviceConfig {
                name: "fuzz".into(),
                thin: true,
                wwn,
                registry: Some(registry.clone()),
                ..DeviceConfig::default()
            };
            Device::new(
                Arc::new(RamBackstore::new(1 << 20, 512)),
                BufPool::new(32 << 20),
                config,
            )
            .expect("device")
        };
        let dev = mk(0x6001_4050_0000_0000_0000_0000_0000_0001);
        let other = mk(0x6001_4050_0000_0000_0000_0000_0000_0002);
        Env {
            rt,
            dev,
            _other: other,
        }
    })
}

fn nexus(sel: u8) -> Nexus {
    let id = u64::from(sel >> 6);
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
    if data.len() < 2 {
        return;
    }
    let (sel, flags, params) = (data[0], data[1], &data[2..]);
    let len = params.len();
    let mut cdb = vec![0u8; 16];
    match sel % 6 {
        0 => {
            cdb.truncate(10);
            cdb[0] = 0x5f;
            cdb[1] = flags & 0x07;
            cdb[2] = (flags >> 3) & 0x0f;
            cdb[5..9].copy_from_slice(&(len as u32).to_be_bytes());
        }
        1 => {
            cdb.truncate(10);
            cdb[0] = 0x42;
            cdb[7..9].copy_from_slice(&(len.min(0xffff) as u16).to_be_bytes());
        }
        2 => {
            cdb.truncate(6);
            cdb[0] = 0x15;
            cdb[1] = 0x10;
            cdb[4] = len.min(0xff) as u8;
        }
        3 => {
            cdb.truncate(10);
            cdb[0] = 0x55;
            cdb[1] = 0x10;
            cdb[7..9].copy_from_slice(&(len.min(0xffff) as u16).to_be_bytes());
        }
        4 => {
            cdb[0] = 0x83;
            cdb[10..14].copy_from_slice(&(len as u32).to_be_bytes());
        }
        _ => {
            cdb.truncate(10);
            cdb[0] = 0x48;
            cdb[1] = 0x01;
            cdb[7..9].copy_from_slice(&(len.min(0xffff) as u16).to_be_bytes());
        }
    }
    let env = env();
    let cmd = Command {
        cdb,
        data_out: (!params.is_empty()).then(|| IoBuf::from_slice(params)),
        expected_in_len: 0,
        attr: TaskAttr::Simple,
        tag: 0,
    };
    let r = env.rt.block_on(env.dev.execute(&nexus(flags), cmd));
    assert!(r.data_in.is_none());
    assert_eq!(r.status == Status::CheckCondition, r.sense.is_some());
});
