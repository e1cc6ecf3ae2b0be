//! iSER (`rtgt_iscsi::iser`): the iSER header, Hello messages, the CM private-data header and
//! the split of a received SEND into iSER header and iSCSI PDU.

use rtgt_iscsi::iser::conn::{split, Received};
use rtgt_iscsi::iser::header::{CmHeader, Packet, Repr, HEADER_LEN};
use rtgt_iscsi::pdu::{Bhs, Opcode, BHS_LEN};

/// Arbitrary bytes as one received iSER message: nothing panics, a header that parses
/// re-emits to an equal `Repr`, a split PDU has exactly the lengths its BHS declares (or is
/// marked short with no data when the message ends before them; only a SCSI Command with a
/// Write STag may come out with its DataSegmentLength cleared instead), and the CM header of
/// the first bytes answers with ZBVA not supported and the initiator's send-with-invalidate
/// choice.
pub fn iser_header(data: &[u8]) {
    if let Ok(p) = Packet::new_checked(data) {
        if let Ok(repr) = Repr::parse(&p) {
            let bytes = repr.to_bytes();
            let again =
                Repr::parse(&Packet::new_unchecked(&bytes[..])).expect("emitted header parses");
            assert_eq!(again, repr);
        }
    }
    match split(data) {
        Received::Pdu(stags, pdu) => {
            assert!(data.len() >= HEADER_LEN + BHS_LEN);
            let sent = Bhs::new_unchecked(&data[HEADER_LEN..HEADER_LEN + BHS_LEN]);
            let h = Bhs::new_unchecked(&pdu.bhs[..]);
            let announced =
                HEADER_LEN + BHS_LEN + sent.total_ahs_len() + sent.data_segment_len() as usize;
            if pdu.data_short {
                assert!(data.len() < announced);
                assert!(pdu.data.is_empty());
                assert_eq!(&pdu.bhs[..], sent.as_bytes());
            } else {
                assert_eq!(pdu.ahs.len(), h.total_ahs_len());
                assert_eq!(pdu.data.len(), h.data_segment_len() as usize);
                if &pdu.bhs[..] != sent.as_bytes() {
                    // Immediate data left for the RDMA READ from the Write STag.
                    assert!(data.len() < announced);
                    assert_eq!(h.opcode(), Opcode::ScsiCommand);
                    assert!(stags.write.is_some());
                    assert_eq!(h.data_segment_len(), 0);
                }
            }
        }
        Received::Hello | Received::Bad(_) => {}
    }
    let cm = CmHeader::parse(data);
    let answer = CmHeader::answer(&cm);
    assert!(answer.zbva_not_supported);
    assert_eq!(answer.send_w_inv_not_supported, cm.send_w_inv_not_supported);
    assert_eq!(CmHeader::parse(&answer.to_bytes()), answer);
}
