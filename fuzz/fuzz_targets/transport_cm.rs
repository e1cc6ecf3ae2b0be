#![no_main]
//! MADs, CM messages and the rdma_cm header from arbitrary bytes: parse, emit, and re-parse to
//! the same representation. Nothing may panic.
use libfuzzer_sys::fuzz_target;
use rtgt_transport::wire::cm::{self, AttributeId, CmMessage};
use rtgt_transport::wire::{cma, mad, CmaHdrPacket, CmaHdrRepr, MadPacket, MadRepr};

fuzz_target!(|data: &[u8]| {
    if let Ok(p) = MadPacket::new_checked(data) {
        let _ = (p.tid(), p.attr_id(), p.attr_mod(), p.method(), p.data());
        if let Ok(r) = MadRepr::parse(&p) {
            let mut out = [0u8; mad::HEADER_LEN];
            r.emit(&mut MadPacket::new_unchecked(&mut out[..]));
            assert_eq!(MadRepr::parse(&MadPacket::new_unchecked(&out[..])), Ok(r));
        }
    }

    if let Ok(m) = cm::Mad::parse(data) {
        let mut out = [0u8; mad::MAD_LEN];
        m.emit(&mut out);
        assert_eq!(cm::Mad::parse(&out), Ok(m));
    }

    // Every message layout over the same bytes, as if they were a CM payload.
    for attr in 0x0010..=0x001a {
        let attr = AttributeId::from(attr);
        if let Ok(msg) = CmMessage::parse(attr, data) {
            let mut out = [0u8; cm::CM_DATA_LEN];
            msg.emit(&mut out);
            assert_eq!(CmMessage::parse(attr, &out), Ok(msg));
        }
    }
    if let Ok(p) = cm::req::Packet::new_checked(data) {
        let _ = (p.has_alternate_path(), p.primary_path().flow_label());
    }

    if let Ok(p) = CmaHdrPacket::new_checked(data) {
        let _ = (p.src_addr(), p.dst_addr(), p.payload());
        if let Ok(r) = CmaHdrRepr::parse(&p) {
            let mut out = [0u8; cma::HEADER_LEN];
            r.emit(&mut CmaHdrPacket::new_unchecked(&mut out[..]));
            assert_eq!(
                CmaHdrRepr::parse(&CmaHdrPacket::new_unchecked(&out[..])),
                Ok(r)
            );
        }
    }
    if data.len() >= 8 {
        let sid = u64::from_be_bytes(data[..8].try_into().unwrap());
        if let Some((space, port)) = cma::parse_service_id(sid) {
            assert_eq!(cma::service_id(space, port), sid);
        }
    }
});
