#![no_main]
//! A sequence of Login Request PDUs into the target's login state machine: every request
//! gets a response (or the login completes), never a panic, and a completed login has
//! consistent parameters.
//!
//! Input: PDUs of [48-byte BHS][2-byte data length][data], repeated.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use libfuzzer_sys::fuzz_target;
use rtgt_target::core::{Auth, ChapCredentials, IscsiParams, PortalGroup, Registry, Target};
use rtgt_target::iscsi::login::{Login, LoginContext, LoginStep};
use rtgt_target::iscsi::params::TransportKind;
use rtgt_target::iscsi::pdu::{Bhs, BhsRepr, BHS_LEN};
use rtgt_target::scsi::LunMap;

fn registry() -> Arc<Registry> {
    static REG: OnceLock<Arc<Registry>> = OnceLock::new();
    REG.get_or_init(|| {
        let r = Registry::new();
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
        for (name, auth) in [("iqn.a", Auth::default()), ("iqn.b", chap)] {
            r.set_target(Target {
                name: name.into(),
                alias: Some("alias".into()),
                portal_groups: vec![PortalGroup {
                    tag: 1,
                    portals: vec!["0.0.0.0:3260".parse().unwrap()],
                    auth,
                    acls: HashMap::new(),
                    allow_any_initiator: true,
                    luns: LunMap::default(),
                    params: IscsiParams::default(),
                }],
            });
        }
        r
    })
    .clone()
}

fuzz_target!(|data: &[u8]| {
    let mut login = Login::new(LoginContext {
        registry: registry(),
        local: "127.0.0.1:3260".parse().unwrap(),
        peer: "127.0.0.1:50000".parse().unwrap(),
        transport: if data.first().is_some_and(|b| b & 1 == 1) {
            TransportKind::Iser
        } else {
            TransportKind::Tcp
        },
        session_exists: Arc::new(|t| t == 1),
    });
    let mut rest = data.get(1..).unwrap_or_default();
    while rest.len() >= BHS_LEN + 2 {
        let (hdr, tail) = rest.split_at(BHS_LEN);
        let len = (u16::from_be_bytes([tail[0], tail[1]]) as usize).min(tail.len() - 2);
        let text = &tail[2..2 + len];
        rest = &tail[2 + len..];
        let Ok(BhsRepr::LoginRequest(req)) = BhsRepr::parse(&Bhs::new_unchecked(hdr)) else {
            continue;
        };
        match login.handle(&req, text) {
            LoginStep::Respond(r, d) => assert!(d.len() <= 8192 && r.status_class == 0),
            LoginStep::Fail(r, _) => {
                assert_ne!(r.status_class, 0);
                return;
            }
            LoginStep::Complete(o) => {
                assert!(o.params.first_burst_length <= o.params.max_burst_length);
                let (r, _) = login.accept(7, o.cmd_sn, o.cmd_sn);
                assert!(r.transit && r.tsih == 7);
                return;
            }
        }
    }
});
