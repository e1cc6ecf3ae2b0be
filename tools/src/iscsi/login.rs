//! The initiator's side of login (RFC 7143 §6.3, §12.1.3), without I/O: it produces Login
//! Requests and consumes Login Responses, so any connection driver can carry it.

use rtgt_iscsi::chap;
use rtgt_iscsi::login::{STAGE_FULL_FEATURE, STAGE_OPERATIONAL, STAGE_SECURITY, VERSION};
use rtgt_iscsi::params::{self, SessionParams, SessionType, TransportKind};
use rtgt_iscsi::pdu::{LoginRequest, LoginResponse};
use rtgt_iscsi::text::{TextAssembler, TextPairs};
use rtgt_iscsi::IscsiError;
use rtgt_scsi::core::ChapCredentials;

/// What the initiator offers and how it authenticates.
#[derive(Debug, Clone)]
pub struct LoginConfig {
    pub initiator_name: String,
    pub initiator_alias: Option<String>,
    pub isid: [u8; 6],
    /// `None` makes a discovery session.
    pub target_name: Option<String>,
    /// CHAP credentials the initiator presents.
    pub chap: Option<ChapCredentials>,
    /// Credentials the target must present (mutual CHAP).
    pub mutual: Option<ChapCredentials>,
    pub header_digest: bool,
    pub data_digest: bool,
    pub max_recv_data_segment_length: u32,
    pub max_burst_length: u32,
    pub first_burst_length: u32,
    pub initial_r2t: bool,
    pub immediate_data: bool,
    pub max_outstanding_r2t: u32,
    pub transport: TransportKind,
    /// Extra keys to offer (tests use X- keys).
    pub extra_keys: Vec<(String, String)>,
    /// How long the full-feature reader keeps trying a TCP connection after data arrived
    /// before it sleeps ([`crate::poll::PollingRead`]); zero sleeps at once.
    pub busy_poll: std::time::Duration,
}

impl Default for LoginConfig {
    fn default() -> Self {
        LoginConfig {
            initiator_name: "iqn.2025-01.io.rtgt:initiator".to_string(),
            initiator_alias: None,
            isid: [0x80, 0x00, 0x52, 0x54, 0x00, 0x01],
            target_name: None,
            chap: None,
            mutual: None,
            header_digest: false,
            data_digest: false,
            max_recv_data_segment_length: 262_144,
            max_burst_length: 16_776_192,
            first_burst_length: 262_144,
            initial_r2t: false,
            immediate_data: true,
            max_outstanding_r2t: 1,
            transport: TransportKind::Tcp,
            extra_keys: Vec::new(),
            busy_poll: std::time::Duration::ZERO,
        }
    }
}

/// The next step of an initiator login.
#[derive(Debug)]
pub enum LoginProgress {
    /// Send this request and wait for the response.
    Send(LoginRequest, Vec<u8>),
    /// Login complete: full feature phase starts.
    Done {
        params: SessionParams,
        tsih: u16,
        stat_sn: u32,
    },
}

#[derive(Debug, Clone)]
enum Auth {
    /// AuthMethod offered, answer pending.
    Offered,
    /// CHAP_A sent.
    AlgorithmSent,
    /// CHAP_R sent; for mutual CHAP our challenge is kept.
    ResponseSent(Option<(u8, Vec<u8>)>),
    Done,
}

/// Initiator login state machine.
pub struct InitiatorLogin {
    cfg: LoginConfig,
    stage: u8,
    auth: Auth,
    cmd_sn: u32,
    exp_stat_sn: u32,
    tsih: u16,
    offered: Vec<(String, String)>,
    params: SessionParams,
    incoming: TextAssembler,
    first: bool,
}

impl InitiatorLogin {
    pub fn new(cfg: LoginConfig, cmd_sn: u32) -> InitiatorLogin {
        let params = SessionParams {
            session_type: if cfg.target_name.is_some() {
                SessionType::Normal
            } else {
                SessionType::Discovery
            },
            initiator_name: cfg.initiator_name.clone(),
            initiator_alias: cfg.initiator_alias.clone(),
            target_name: cfg.target_name.clone().unwrap_or_default(),
            max_recv_data_segment_length: cfg.max_recv_data_segment_length,
            ..SessionParams::default()
        };
        InitiatorLogin {
            cfg,
            stage: STAGE_SECURITY,
            auth: Auth::Offered,
            cmd_sn,
            exp_stat_sn: 0,
            tsih: 0,
            offered: Vec::new(),
            params,
            incoming: TextAssembler::new(64 * 1024),
            first: true,
        }
    }

    /// CmdSN of the first command after login.
    pub fn cmd_sn(&self) -> u32 {
        self.cmd_sn
    }

    fn request(&self, transit: bool, nsg: u8, keys: &TextPairs) -> LoginProgress {
        let data = keys.encode();
        LoginProgress::Send(
            LoginRequest {
                transit,
                continue_: false,
                csg: self.stage,
                nsg: if transit { nsg } else { 0 },
                version_max: VERSION,
                version_min: VERSION,
                isid: self.cfg.isid,
                tsih: self.tsih,
                itt: 0,
                cid: 0,
                cmd_sn: self.cmd_sn,
                exp_stat_sn: self.exp_stat_sn,
                data_len: data.len() as u32,
            },
            data,
        )
    }

    /// The operational keys we offer (RFC 7143 §13).
    fn operational_offer(&mut self) -> TextPairs {
        let c = &self.cfg;
        let mut t = TextPairs::new();
        let digest = |on: bool| if on { "CRC32C,None" } else { "None" };
        let discovery = c.target_name.is_none();
        let mut offers: Vec<(&str, String)> = Vec::new();
        if c.transport == TransportKind::Tcp {
            offers.push(("HeaderDigest", digest(c.header_digest).into()));
            offers.push(("DataDigest", digest(c.data_digest).into()));
        }
        if !discovery {
            offers.extend([
                ("InitialR2T", params::yes_no(c.initial_r2t).to_string()),
                (
                    "ImmediateData",
                    params::yes_no(c.immediate_data).to_string(),
                ),
                ("MaxBurstLength", c.max_burst_length.to_string()),
                ("FirstBurstLength", c.first_burst_length.to_string()),
                ("MaxOutstandingR2T", c.max_outstanding_r2t.to_string()),
                ("MaxConnections", "1".to_string()),
                ("DataPDUInOrder", "Yes".to_string()),
                ("DataSequenceInOrder", "Yes".to_string()),
            ]);
        }
        offers.extend([
            ("DefaultTime2Wait", "2".to_string()),
            ("DefaultTime2Retain", "0".to_string()),
            ("ErrorRecoveryLevel", "0".to_string()),
        ]);
        let iser = c.transport == TransportKind::Iser;
        if iser {
            // RFC 7145 §6.3: the iSER lengths replace MaxRecvDataSegmentLength; the target's
            // limit bounds immediate data, ours the control PDUs it sends.
            offers.push(("RDMAExtensions", "Yes".into()));
            offers.push((
                "TargetRecvDataSegmentLength",
                c.max_recv_data_segment_length.min(8192).to_string(),
            ));
            offers.push((
                "InitiatorRecvDataSegmentLength",
                c.max_recv_data_segment_length.to_string(),
            ));
        }
        for (k, v) in offers {
            t.push(k, v.clone());
            self.offered.push((k.to_string(), v));
        }
        if !iser {
            t.push(
                "MaxRecvDataSegmentLength",
                c.max_recv_data_segment_length.to_string(),
            );
        }
        for (k, v) in &c.extra_keys {
            t.push(k, v.clone());
            self.offered.push((k.clone(), v.clone()));
        }
        t
    }

    fn leading_keys(&self, t: &mut TextPairs) {
        t.push("InitiatorName", self.cfg.initiator_name.clone());
        if let Some(a) = &self.cfg.initiator_alias {
            t.push("InitiatorAlias", a.clone());
        }
        match &self.cfg.target_name {
            Some(n) => {
                t.push("SessionType", "Normal");
                t.push("TargetName", n.clone());
            }
            None => t.push("SessionType", "Discovery"),
        }
    }

    /// The first Login Request.
    pub fn start(&mut self) -> LoginProgress {
        let mut t = TextPairs::new();
        self.leading_keys(&mut t);
        let method = if self.cfg.chap.is_some() {
            "CHAP,None"
        } else {
            "None"
        };
        t.push("AuthMethod", method);
        self.request(true, STAGE_OPERATIONAL, &t)
    }

    /// Consumes one Login Response.
    pub fn on_response(
        &mut self,
        r: &LoginResponse,
        data: &[u8],
    ) -> Result<LoginProgress, IscsiError> {
        if r.status_class != 0 {
            return Err(IscsiError::LoginFailed(r.status()));
        }
        self.exp_stat_sn = r.stat_sn.wrapping_add(1);
        if self.first {
            self.first = false;
            self.tsih = r.tsih;
        }
        if r.continue_ {
            self.incoming
                .push(data)
                .map_err(|_| IscsiError::Protocol("login text too long"))?;
            return Ok(self.request(false, 0, &TextPairs::new()));
        }
        self.incoming
            .push(data)
            .map_err(|_| IscsiError::Protocol("login text too long"))?;
        let keys = TextPairs::parse(&self.incoming.take())?;
        let mut reply = TextPairs::new();
        match r.csg {
            STAGE_SECURITY => self.security(&keys, &mut reply)?,
            STAGE_OPERATIONAL => self.operational(&keys, &mut reply)?,
            _ => return Err(IscsiError::Protocol("login response with a bad CSG")),
        }
        if r.transit {
            if r.nsg == STAGE_FULL_FEATURE {
                if !matches!(self.auth, Auth::Done) && self.cfg.mutual.is_some() {
                    return Err(IscsiError::Authentication("target did not authenticate"));
                }
                self.tsih = r.tsih;
                self.params.finish();
                return Ok(LoginProgress::Done {
                    params: self.params.clone(),
                    tsih: r.tsih,
                    stat_sn: r.stat_sn,
                });
            }
            self.stage = r.nsg;
            if self.stage == STAGE_OPERATIONAL {
                let offer = self.operational_offer();
                for (k, v) in offer.iter() {
                    reply.push(k, v);
                }
            }
        }
        let (transit, nsg) = match self.stage {
            STAGE_SECURITY => (
                matches!(self.auth, Auth::Done | Auth::ResponseSent(_)),
                STAGE_OPERATIONAL,
            ),
            _ => (true, STAGE_FULL_FEATURE),
        };
        Ok(self.request(transit, nsg, &reply))
    }

    fn security(&mut self, keys: &TextPairs, reply: &mut TextPairs) -> Result<(), IscsiError> {
        for (k, v) in keys.iter() {
            match k {
                "AuthMethod" => match v {
                    "None" => self.auth = Auth::Done,
                    "CHAP" if self.cfg.chap.is_some() => {
                        reply.push("CHAP_A", chap::ALGORITHM_MD5);
                        self.auth = Auth::AlgorithmSent;
                    }
                    _ => return Err(IscsiError::Authentication("no common AuthMethod")),
                },
                "TargetPortalGroupTag" | "TargetAlias" | "TargetAddress" => {
                    self.params.apply(k, v, true)
                }
                _ => {}
            }
        }
        if let Some(c) = keys.get("CHAP_C") {
            let cred = self
                .cfg
                .chap
                .clone()
                .ok_or(IscsiError::Authentication("unexpected CHAP"))?;
            if keys.get("CHAP_A") != Some(chap::ALGORITHM_MD5) {
                return Err(IscsiError::Authentication("CHAP algorithm"));
            }
            let id = chap::parse_id(keys.get("CHAP_I").unwrap_or(""))?;
            let challenge = chap::decode_binary(c)?;
            reply.push("CHAP_N", cred.user.clone());
            reply.push(
                "CHAP_R",
                chap::encode_hex(&chap::response(id, cred.secret.as_bytes(), &challenge)),
            );
            let mine = self.cfg.mutual.as_ref().map(|_| {
                let (id, c) = chap::new_challenge();
                reply.push("CHAP_I", id.to_string());
                reply.push("CHAP_C", chap::encode_hex(&c));
                (id, c)
            });
            self.auth = Auth::ResponseSent(mine);
        } else if let (Some(n), Some(rsp)) = (keys.get("CHAP_N"), keys.get("CHAP_R")) {
            let (Auth::ResponseSent(Some((id, c))), Some(m)) = (&self.auth, &self.cfg.mutual)
            else {
                return Err(IscsiError::Authentication("unexpected CHAP response"));
            };
            let want = chap::response(*id, m.secret.as_bytes(), c);
            if n != m.user || !chap::verify(&want, &chap::decode_binary(rsp)?) {
                return Err(IscsiError::Authentication("target failed mutual CHAP"));
            }
            self.auth = Auth::Done;
        } else if let Auth::ResponseSent(None) = self.auth {
            self.auth = Auth::Done;
        }
        Ok(())
    }

    fn operational(&mut self, keys: &TextPairs, reply: &mut TextPairs) -> Result<(), IscsiError> {
        for (k, v) in keys.iter() {
            if let Some(pos) = self.offered.iter().position(|(o, _)| o == k) {
                let (_, offered) = self.offered.remove(pos);
                if matches!(v, params::NOT_UNDERSTOOD | params::IRRELEVANT) {
                    continue;
                }
                let Some(def) = params::lookup(k) else {
                    continue;
                };
                if v == params::REJECT {
                    return Err(IscsiError::Negotiation(format!("{k}={offered} rejected")));
                }
                let value = params::accept(def.rule, &offered, v).ok_or_else(|| {
                    IscsiError::Negotiation(format!("{k}: illegal answer {v} to {offered}"))
                })?;
                self.params.apply(k, &value, false);
                continue;
            }
            match k {
                "MaxRecvDataSegmentLength"
                | "TargetAlias"
                | "TargetPortalGroupTag"
                | "TargetAddress" => self.params.apply(k, v, true),
                "TargetRecvDataSegmentLength" | "InitiatorRecvDataSegmentLength" => {
                    self.params.apply(k, v, false)
                }
                // The target offers a key: answer with the same result functions.
                _ => match params::lookup(k) {
                    Some(def) if !matches!(def.rule, params::Rule::Declarative) => {
                        let ours = match k {
                            "HeaderDigest" | "DataDigest" => "None".to_string(),
                            _ => def.default.to_string(),
                        };
                        let ans = params::resolve(def.rule, &ours, v);
                        if ans != params::REJECT {
                            self.params.apply(k, &ans, false);
                        }
                        reply.push(k, ans);
                    }
                    Some(_) => {}
                    None => reply.push(k, params::NOT_UNDERSTOOD),
                },
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rtgt_iscsi::login::{Login, LoginContext, LoginStep};
    use rtgt_scsi::core::{Auth as CoreAuth, IscsiParams, PortalGroup, Registry, Target};
    use rtgt_scsi::LunMap;
    use std::collections::HashMap;
    use std::sync::Arc;

    fn registry(auth: CoreAuth) -> Arc<Registry> {
        let r = Registry::new();
        r.set_target(Target {
            name: "iqn.t".into(),
            alias: None,
            portal_groups: vec![PortalGroup {
                tag: 3,
                ids: rtgt_scsi::core::PortIds::alone(3),
                portals: vec![],
                auth,
                acls: HashMap::new(),
                allow_any_initiator: true,
                luns: LunMap::default(),
                params: IscsiParams {
                    header_digest: true,
                    ..IscsiParams::default()
                },
                iser: true,
            }],
        });
        r
    }

    /// Runs both state machines against each other.
    fn run(reg: Arc<Registry>, cfg: LoginConfig) -> Result<SessionParams, IscsiError> {
        let mut t = Login::new(LoginContext {
            registry: reg,
            local: "127.0.0.1:3260".parse().unwrap(),
            peer: "127.0.0.1:5000".parse().unwrap(),
            transport: TransportKind::Tcp,
            session_exists: Arc::new(|_| false),
        });
        let mut i = InitiatorLogin::new(cfg, 1);
        let mut step = i.start();
        for _ in 0..20 {
            let LoginProgress::Send(req, data) = step else {
                unreachable!()
            };
            let (resp, d) = match t.handle(&req, &data) {
                LoginStep::Respond(r, d) | LoginStep::Fail(r, d) => (r, d),
                LoginStep::Complete(_) => t.accept(9, 1, 32),
            };
            step = i.on_response(&resp, &d)?;
            if let LoginProgress::Done { params, tsih, .. } = step {
                assert_eq!(tsih, 9);
                return Ok(params);
            }
        }
        panic!("login did not finish");
    }

    fn cfg() -> LoginConfig {
        LoginConfig {
            target_name: Some("iqn.t".into()),
            header_digest: true,
            ..LoginConfig::default()
        }
    }

    #[test]
    fn login_none() {
        let p = run(registry(CoreAuth::default()), cfg()).unwrap();
        assert!(p.header_digest && !p.data_digest);
        assert_eq!(p.target_portal_group_tag, 3);
        assert_eq!(p.max_xmit_data_segment_length, 262_144);
        assert_eq!(p.max_burst_length, 1_048_576);
        assert!(!p.initial_r2t);
    }

    fn creds(u: &str, s: &str) -> ChapCredentials {
        ChapCredentials {
            user: u.into(),
            secret: s.into(),
        }
    }

    #[test]
    fn login_chap_and_mutual() {
        let auth = CoreAuth {
            chap: Some(creds("u", "secret-one-23")),
            mutual: Some(creds("tgt", "secret-two-45")),
        };
        let c = LoginConfig {
            chap: Some(creds("u", "secret-one-23")),
            ..cfg()
        };
        run(registry(auth.clone()), c).unwrap();
        let c = LoginConfig {
            chap: Some(creds("u", "secret-one-23")),
            mutual: Some(creds("tgt", "secret-two-45")),
            ..cfg()
        };
        run(registry(auth.clone()), c).unwrap();
        let c = LoginConfig {
            chap: Some(creds("u", "wrong")),
            ..cfg()
        };
        assert!(matches!(
            run(registry(auth.clone()), c),
            Err(IscsiError::LoginFailed(0x0201))
        ));
        let c = LoginConfig {
            chap: Some(creds("u", "secret-one-23")),
            mutual: Some(creds("tgt", "other")),
            ..cfg()
        };
        assert!(matches!(
            run(registry(auth), c),
            Err(IscsiError::Authentication(_))
        ));
    }

    #[test]
    fn discovery_login() {
        let p = run(
            registry(CoreAuth::default()),
            LoginConfig {
                target_name: None,
                ..cfg()
            },
        )
        .unwrap();
        assert_eq!(p.session_type, SessionType::Discovery);
    }
}
