#![no_main]
//! Arbitrary login/text segments through the key=value codec, the negotiation result
//! functions, the target's negotiator and the CHAP value decoders: no panics, and parsed
//! text re-encodes to something that parses to the same pairs.

use libfuzzer_sys::fuzz_target;
use rtgt_target::core::IscsiParams;
use rtgt_target::iscsi::chap;
use rtgt_target::iscsi::params::{
    accept, resolve, SessionType, TargetNegotiator, TransportKind, KEYS,
};
use rtgt_target::iscsi::text::TextPairs;

fuzz_target!(|data: &[u8]| {
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
            assert!(p.first_burst_length <= p.max_burst_length);
        }
    }
    for (k, v) in pairs.iter() {
        for def in KEYS {
            let ans = resolve(def.rule, def.default, v);
            let _ = accept(def.rule, v, &ans);
            let _ = accept(def.rule, def.default, v);
        }
        let _ = chap::decode_binary(v);
        let _ = chap::parse_id(k);
    }
});
