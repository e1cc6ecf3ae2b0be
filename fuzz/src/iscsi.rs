//! iSCSI (`rtgt-iscsi`): PDU headers and framing, the login state machine, text
//! segments and key negotiation.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use bytes::BytesMut;
use rtgt_iscsi::chap;
use rtgt_iscsi::conn_tcp::PduReader;
use rtgt_iscsi::login::{Login, LoginContext, LoginStep, LOGIN_MAX_DATA};
use rtgt_iscsi::params::{
    accept, resolve, SessionType, TargetNegotiator, TransportKind, KEYS, REJECT,
};
use rtgt_iscsi::pdu::{Ahs, Bhs, BhsRepr, BHS_LEN};
use rtgt_iscsi::text::TextPairs;
use rtgt_scsi::core::{Auth, ChapCredentials, IscsiParams, PortalGroup, Registry, Target};
use rtgt_scsi::LunMap;

/// The targets of [`iscsi_login`]'s registry.
const OPEN_TARGET: &str = "iqn.2025-01.io.rtgt:open";
const CHAP_TARGET: &str = "iqn.2025-01.io.rtgt:chap";
/// MaxRecvDataSegmentLength of the PDU reader in [`iscsi_bhs`].
const READER_MAX_DATA: usize = 8192;

/// Arbitrary bytes through the BHS and AHS parsers and the resumable TCP PDU reader: nothing
/// panics, and every header that parses re-emits to an equal `BhsRepr`.
///
/// Input: byte 0 holds the reader's flags (bit 0 header digest, bit 1 data digest) and, in
/// bits 2-7, the size of the chunks the byte stream is fed in (0 means 1); the rest is the
/// byte stream, whose first 48 bytes are also parsed as a lone BHS.
pub fn iscsi_bhs(data: &[u8]) {
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    if let Ok(view) = Bhs::new_checked(rest) {
        if let Ok(repr) = BhsRepr::parse(&view) {
            let again = BhsRepr::parse(&Bhs::new_unchecked(&repr.to_bytes()[..]))
                .expect("an emitted header parses");
            assert_eq!(again, repr);
        }
        let ahs_len = view.total_ahs_len().min(rest.len() - BHS_LEN);
        let _ = Ahs::parse_all(&rest[BHS_LEN..BHS_LEN + ahs_len]);
    }
    let _ = Ahs::parse_all(rest);

    let mut reader = PduReader::new(READER_MAX_DATA, flags & 1 != 0, flags & 2 != 0);
    let chunk = usize::from(flags >> 2).max(1);
    let mut buf = BytesMut::new();
    for piece in rest.chunks(chunk) {
        buf.extend_from_slice(piece);
        loop {
            match reader.poll(&mut buf) {
                Ok(Some(pdu)) => {
                    assert!(pdu.data.len() <= READER_MAX_DATA);
                    let view = Bhs::new_unchecked(&pdu.bhs[..]);
                    assert_eq!(pdu.ahs.len(), view.total_ahs_len());
                    assert_eq!(pdu.data.len(), view.data_segment_len() as usize);
                    let _ = BhsRepr::parse(&view);
                    let _ = Ahs::parse_all(&pdu.ahs);
                }
                Ok(None) => break,
                Err(_) => return,
            }
        }
    }
}

/// The target registry [`iscsi_login`] logs in to: `iqn.2025-01.io.rtgt:open` without
/// authentication and `iqn.2025-01.io.rtgt:chap` with mutual CHAP (initiator `u` /
/// `secret-12345`, target `t` / `secret-67890`).
fn login_registry() -> Arc<Registry> {
    static REGISTRY: OnceLock<Arc<Registry>> = OnceLock::new();
    REGISTRY
        .get_or_init(|| {
            let registry = Registry::new();
            let chap = Auth {
                chap: Some(ChapCredentials {
                    user: "u".into(),
                    secret: "secret-12345".into(),
                }),
                mutual: Some(ChapCredentials {
                    user: "t".into(),
                    secret: "secret-67890".into(),
                }),
            };
            for (name, auth) in [(OPEN_TARGET, Auth::default()), (CHAP_TARGET, chap)] {
                registry.set_target(Target {
                    name: name.into(),
                    alias: Some("alias".into()),
                    portal_groups: vec![PortalGroup {
                        tag: 1,
                        ids: rtgt_scsi::core::PortIds::alone(1),
                        portals: vec!["0.0.0.0:3260".parse().expect("portal address")],
                        auth,
                        acls: HashMap::new(),
                        allow_any_initiator: true,
                        luns: LunMap::default(),
                        params: IscsiParams::default(),
                        iser: true,
                    }],
                });
            }
            registry
        })
        .clone()
}

/// A sequence of Login Request PDUs into the target's login state machine: every request
/// gets a response, a failure or a completed login, never a panic; continuing responses
/// have status 0 and fit the login data limit, failures have a non-zero status class, and
/// a completed login has consistent parameters and an accepting final response.
///
/// Input: byte 0 bit 0 selects iSER (else TCP), then records of a 48-byte BHS, a 2-byte
/// big-endian data length and that much text (cut short at the end of the input). Records
/// whose BHS is not a Login Request are skipped.
pub fn iscsi_login(data: &[u8]) {
    let transport = if data.first().is_some_and(|b| b & 1 == 1) {
        TransportKind::Iser
    } else {
        TransportKind::Tcp
    };
    let mut login = Login::new(LoginContext {
        registry: login_registry(),
        local: "127.0.0.1:3260".parse().expect("local address"),
        peer: "127.0.0.1:50000".parse().expect("peer address"),
        transport,
        session_exists: Arc::new(|tsih| tsih == 1),
    });
    let mut rest = data.get(1..).unwrap_or_default();
    while rest.len() >= BHS_LEN + 2 {
        let (hdr, tail) = rest.split_at(BHS_LEN);
        let len = usize::from(u16::from_be_bytes([tail[0], tail[1]])).min(tail.len() - 2);
        let text = &tail[2..2 + len];
        rest = &tail[2 + len..];
        let Ok(BhsRepr::LoginRequest(req)) = BhsRepr::parse(&Bhs::new_unchecked(hdr)) else {
            continue;
        };
        match login.handle(&req, text) {
            LoginStep::Respond(r, d) => {
                assert!(
                    d.len() <= LOGIN_MAX_DATA,
                    "response text of {} bytes",
                    d.len()
                );
                assert_eq!(r.status_class, 0, "{r:?}");
            }
            LoginStep::Fail(r, _) => {
                assert_ne!(r.status_class, 0, "{r:?}");
                return;
            }
            LoginStep::Complete(o) => {
                assert!(
                    o.params.first_burst_length <= o.params.max_burst_length,
                    "{:?}",
                    o.params
                );
                let (r, _) = login.accept(7, o.cmd_sn, o.cmd_sn);
                assert!(r.transit && r.tsih == 7 && r.status_class == 0, "{r:?}");
                return;
            }
        }
    }
}

/// Arbitrary login/text segments through the key=value codec, the negotiation result
/// functions, the target's negotiator and the CHAP value decoders: nothing panics, parsed
/// text re-encodes to something that parses to the same pairs, an answer the target's result
/// functions give to an offer is one the offering side accepts, and negotiated parameters
/// are consistent.
///
/// Input: the text segment.
pub fn iscsi_text(data: &[u8]) {
    let Ok(pairs) = TextPairs::parse(data) else {
        return;
    };
    assert_eq!(
        TextPairs::parse(&pairs.encode()).expect("re-encoded text parses"),
        pairs
    );
    for transport in [TransportKind::Tcp, TransportKind::Iser] {
        for kind in [SessionType::Normal, SessionType::Discovery] {
            let mut n = TargetNegotiator::new(IscsiParams::default(), transport, kind);
            for (k, v) in pairs.iter() {
                let _ = n.respond(k, v);
            }
            let _ = n.closing_declarations();
            let p = n.finish();
            assert!(p.first_burst_length <= p.max_burst_length, "{p:?}");
        }
    }
    for (k, v) in pairs.iter() {
        for def in KEYS {
            // What the target answers to an offer, the initiator accepts.
            let answer = resolve(def.rule, def.default, v);
            if answer != REJECT {
                assert!(
                    accept(def.rule, v, &answer).is_some(),
                    "{}={v} answered {answer}",
                    def.name
                );
            }
            let _ = accept(def.rule, def.default, v);
        }
        let _ = chap::decode_binary(v);
        let _ = chap::parse_id(k);
        let _ = chap::parse_id(v);
    }
}
