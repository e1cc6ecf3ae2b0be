//! SRP (`rtgt-srp`): information unit codecs and login validation.

use rtgt_srp::iu::{
    opcode, AerReq, Cmd, InitiatorIu, LoginRej, LoginReq, LoginRsp, Rsp, ShortIu, TargetIu,
    TskMgmt, IMM_DATA_OFFSET,
};
use rtgt_srp::login::{validate, Limits};

/// Arbitrary bytes through every SRP IU parser: nothing panics, and every IU that parses
/// emits bytes that parse to the same IU (SRP_RSP: emitting is idempotent, since RSPVALID and
/// SNSVALID follow from the data present).
///
/// Input: one information unit (or the 56-byte RDMA/CM login request).
pub fn srp_iu(data: &[u8]) {
    match InitiatorIu::parse(data) {
        Ok(InitiatorIu::Cmd(c)) => {
            let mut b = vec![0u8; c.buffer_len()];
            c.emit(&mut b);
            assert_eq!(Cmd::parse(&b), Ok(c.clone()));
            if let Some(imm) = c.immediate_data(data, IMM_DATA_OFFSET) {
                assert!(IMM_DATA_OFFSET + imm.len() <= data.len());
            }
        }
        Ok(InitiatorIu::TskMgmt(t)) => assert_eq!(TskMgmt::parse(&t.to_bytes()), Ok(t)),
        Ok(InitiatorIu::ILogout(s) | InitiatorIu::CredRsp(s) | InitiatorIu::AerRsp(s)) => {
            assert_eq!(ShortIu::parse(&s.to_bytes(), s.opcode), Ok(s));
        }
        Err(_) => {}
    }
    match TargetIu::parse(data) {
        Ok(TargetIu::Rsp(r)) => {
            let once = r.to_bytes();
            let again = Rsp::parse(&once).expect("an emitted SRP_RSP parses");
            assert_eq!(again.to_bytes(), once);
            let _ = again.tmf_status();
        }
        Ok(TargetIu::AerReq(a)) => {
            let mut b = vec![0u8; a.buffer_len()];
            a.emit(&mut b);
            assert_eq!(AerReq::parse(&b), Ok(a));
        }
        Ok(TargetIu::TLogout(s) | TargetIu::CredReq(s)) => {
            assert_eq!(ShortIu::parse(&s.to_bytes(), s.opcode), Ok(s));
        }
        Err(_) => {}
    }
    if let Ok(r) = LoginReq::parse(data) {
        let mut b = vec![0u8; LoginReq::LEN];
        r.emit(&mut b);
        assert_eq!(LoginReq::parse(&b), Ok(r));
    }
    if let Ok(r) = LoginReq::parse_rdma(data) {
        assert_eq!(LoginReq::parse_rdma(&r.to_rdma_bytes()), Ok(r));
    }
    if let Ok(r) = LoginRsp::parse(data) {
        assert_eq!(LoginRsp::parse(&r.to_bytes()), Ok(r));
    }
    if let Ok(r) = LoginRej::parse(data) {
        assert_eq!(LoginRej::parse(&r.to_bytes()), Ok(r));
    }
    for op in [opcode::I_LOGOUT, opcode::T_LOGOUT, opcode::CRED_REQ] {
        let _ = ShortIu::parse(data, op);
    }
}

/// The target port identifier [`srp_login`] validates against.
const PORT_ID: [u8; 16] = [
    0x00, 0x02, 0xc9, 0x03, 0x00, 0x00, 0x11, 0x11, 0x00, 0x02, 0xc9, 0x03, 0x00, 0x00, 0x22, 0x22,
];

/// Login validation of arbitrary RDMA/CM login requests: a rejection echoes the tag and has
/// one of the standard reasons; an acceptance stays within the limits and its LOGIN_RSP
/// round-trips.
///
/// Input: byte 0 is the number of channels the initiator already holds, the rest the 56-byte
/// `srp_login_req_rdma`.
pub fn srp_login(data: &[u8]) {
    let Some((&existing, rest)) = data.split_first() else {
        return;
    };
    let Ok(req) = LoginReq::parse_rdma(rest) else {
        return;
    };
    let limits = Limits::default();
    match validate(&req, &PORT_ID, &limits, usize::from(existing)) {
        Ok(p) => {
            assert!(p.it_iu_len >= 64 && p.it_iu_len <= limits.max_it_iu_len);
            assert!(p.imm_data_offset.is_none_or(|o| u32::from(o) < p.it_iu_len));
            let rsp = p.login_rsp(req.tag, existing > 0);
            assert_eq!(rsp.tag, req.tag);
            assert_eq!(LoginRsp::parse(&rsp.to_bytes()), Ok(rsp));
        }
        Err(rej) => {
            assert_eq!(rej.tag, req.tag);
            assert!((0x0001_0000..=0x0001_0006).contains(&rej.reason));
        }
    }
}
