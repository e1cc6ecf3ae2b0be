#![no_main]
//! Arbitrary bytes through the BHS/AHS parsers and the resumable TCP PDU reader: parsing
//! must never panic, and every header that parses must re-emit to an equal `Repr`.
//!
//! Input layout: byte 0 = reader flags (bit 0 header digest, bit 1 data digest) and read
//! chunk size (upper bits), then the byte stream.

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use rtgt_target::iscsi::conn_tcp::PduReader;
use rtgt_target::iscsi::pdu::{Ahs, Bhs, BhsRepr, BHS_LEN};

fuzz_target!(|data: &[u8]| {
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    if let Ok(view) = Bhs::new_checked(rest) {
        if let Ok(repr) = BhsRepr::parse(&view) {
            let mut out = [0u8; BHS_LEN];
            repr.emit(&mut Bhs::new_unchecked(&mut out[..]));
            let again =
                BhsRepr::parse(&Bhs::new_unchecked(&out[..])).expect("emitted header parses");
            assert_eq!(again, repr);
        }
        let ahs_len = view.total_ahs_len().min(rest.len() - BHS_LEN);
        let _ = Ahs::parse_all(&rest[BHS_LEN..BHS_LEN + ahs_len]);
    }
    let _ = Ahs::parse_all(rest);

    let mut reader = PduReader::new(8192, flags & 1 != 0, flags & 2 != 0);
    let chunk = ((flags >> 2) as usize).max(1);
    let mut buf = BytesMut::new();
    for piece in rest.chunks(chunk) {
        buf.extend_from_slice(piece);
        loop {
            match reader.poll(&mut buf) {
                Ok(Some(pdu)) => assert!(pdu.data.len() <= 8192),
                Ok(None) => break,
                Err(_) => return,
            }
        }
    }
});
