//! The target's login state machine (RFC 7143 §6.3, §11.12, §11.13), independent of the
//! connection driver: it takes Login Requests and returns Login Responses.
//!
//! Stages: security (CSG 0, AuthMethod and CHAP), operational (CSG 1, [`TargetNegotiator`])
//! and full feature phase (3). Text may span PDUs in both directions (C bit). The last step
//! returns [`LoginStep::Complete`]; the caller creates or reinstates the session and then
//! builds the final response with [`Login::accept`] (or [`Login::refuse`]).

use std::net::SocketAddr;
use std::sync::Arc;

use rtgt_scsi::core::{Auth, PortalGroup, Registry, Target};
use rtgt_scsi::LunMap;

use super::chap::{ChapError, TargetChap};
use super::params::{SessionParams, SessionType, TargetNegotiator, TransportKind};
use super::pdu::{LoginRequest, LoginResponse};
use super::text::{TextAssembler, TextPairs, TextSplitter};

/// Login status class and detail (RFC 7143 §11.13.5).
pub mod status {
    pub const SUCCESS: u16 = 0x0000;
    pub const TARGET_MOVED_TEMPORARILY: u16 = 0x0101;
    pub const TARGET_MOVED_PERMANENTLY: u16 = 0x0102;
    pub const INITIATOR_ERROR: u16 = 0x0200;
    pub const AUTHENTICATION_FAILURE: u16 = 0x0201;
    pub const AUTHORIZATION_FAILURE: u16 = 0x0202;
    pub const NOT_FOUND: u16 = 0x0203;
    pub const TARGET_REMOVED: u16 = 0x0204;
    pub const UNSUPPORTED_VERSION: u16 = 0x0205;
    pub const TOO_MANY_CONNECTIONS: u16 = 0x0206;
    pub const MISSING_PARAMETER: u16 = 0x0207;
    pub const CANT_INCLUDE_IN_SESSION: u16 = 0x0208;
    pub const SESSION_TYPE_NOT_SUPPORTED: u16 = 0x0209;
    pub const SESSION_DOES_NOT_EXIST: u16 = 0x020a;
    pub const INVALID_DURING_LOGIN: u16 = 0x020b;
    pub const TARGET_ERROR: u16 = 0x0300;
    pub const SERVICE_UNAVAILABLE: u16 = 0x0301;
    pub const OUT_OF_RESOURCES: u16 = 0x0302;
}

/// Login stages (RFC 7143 §11.12.3).
pub const STAGE_SECURITY: u8 = 0;
pub const STAGE_OPERATIONAL: u8 = 1;
pub const STAGE_FULL_FEATURE: u8 = 3;

/// The only protocol version (RFC 7143 §11.12.4).
pub const VERSION: u8 = 0x00;
/// Data segment limit during login (RFC 7143 §13.12: 8192 until negotiated).
pub const LOGIN_MAX_DATA: usize = 8192;
/// Upper bound on one login's text across continuation PDUs.
const MAX_LOGIN_TEXT: usize = 64 * 1024;

/// What a login needs to know about the connection and the target.
#[derive(Clone)]
pub struct LoginContext {
    pub registry: Arc<Registry>,
    pub local: SocketAddr,
    pub peer: SocketAddr,
    pub transport: TransportKind,
    /// Whether a session with this TSIH exists (for logins that add a connection).
    pub session_exists: Arc<dyn Fn(u16) -> bool + Send + Sync>,
}

/// Everything the caller needs to create the session once login succeeds.
pub struct LoginOutcome {
    pub isid: [u8; 6],
    /// TSIH from the initiator: 0 for a new session (or a reinstatement).
    pub tsih: u16,
    pub cid: u16,
    pub session_type: SessionType,
    pub initiator_name: String,
    pub target: Option<Arc<Target>>,
    pub portal_group: Option<PortalGroup>,
    pub luns: LunMap,
    pub params: SessionParams,
    /// CmdSN of the first command (the final Login Request's CmdSN).
    pub cmd_sn: u32,
    /// StatSN of the first response in full feature phase.
    pub next_stat_sn: u32,
}

impl std::fmt::Debug for LoginOutcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoginOutcome")
            .field("isid", &self.isid)
            .field("tsih", &self.tsih)
            .field("initiator", &self.initiator_name)
            .field("target", &self.target.as_ref().map(|t| t.name.clone()))
            .field("params", &self.params)
            .finish()
    }
}

/// What to do after one Login Request.
#[derive(Debug)]
pub enum LoginStep {
    /// Send this response and read the next request.
    Respond(LoginResponse, Vec<u8>),
    /// Login succeeded: create the session, then send [`Login::accept`]'s response.
    Complete(Box<LoginOutcome>),
    /// Send this response and close the connection.
    Fail(LoginResponse, Vec<u8>),
}

#[derive(Debug, Clone)]
enum AuthState {
    /// No AuthMethod agreed yet.
    Start,
    /// AuthMethod=CHAP agreed; waiting for CHAP_A.
    ChapAgreed,
    /// Challenge sent; waiting for CHAP_N/CHAP_R.
    Challenged(TargetChap),
    Done,
}

/// Identity fields that must not change during one login (RFC 7143 §6.3).
#[derive(Debug, Clone, Copy)]
struct Leading {
    isid: [u8; 6],
    tsih: u16,
    cid: u16,
}

/// The target's login state machine for one connection.
pub struct Login {
    ctx: LoginContext,
    leading: Option<Leading>,
    stage: u8,
    stat_sn: u32,
    session_type: SessionType,
    initiator_name: String,
    target: Option<Arc<Target>>,
    portal_group: Option<PortalGroup>,
    luns: LunMap,
    auth: Auth,
    auth_state: AuthState,
    negotiator: Option<TargetNegotiator>,
    incoming: TextAssembler,
    /// Rest of a response that did not fit one PDU, and the flags its last piece takes.
    outgoing: Option<(TextSplitter, bool, u8, u8)>,
    first_response: bool,
    last_cmd_sn: u32,
    /// Response text kept for the final response.
    final_text: Vec<u8>,
    final_itt: u32,
    final_csg: u8,
}

fn fail_text(why: &str) -> Vec<u8> {
    tracing::debug!(reason = why, "login refused");
    Vec::new()
}

impl Login {
    pub fn new(ctx: LoginContext) -> Login {
        Login {
            ctx,
            leading: None,
            stage: STAGE_SECURITY,
            stat_sn: rand::random::<u32>() & 0x00ff_ffff,
            session_type: SessionType::Normal,
            initiator_name: String::new(),
            target: None,
            portal_group: None,
            luns: LunMap::default(),
            auth: Auth::default(),
            auth_state: AuthState::Start,
            negotiator: None,
            incoming: TextAssembler::new(MAX_LOGIN_TEXT),
            outgoing: None,
            first_response: true,
            last_cmd_sn: 0,
            final_text: Vec::new(),
            final_itt: 0,
            final_csg: STAGE_OPERATIONAL,
        }
    }

    fn queue_depth(&self) -> u32 {
        self.portal_group
            .as_ref()
            .map(|g| g.params.queue_depth)
            .unwrap_or(32)
            .max(1)
    }

    fn response(
        &mut self,
        req: &LoginRequest,
        transit: bool,
        nsg: u8,
        status: u16,
        data_len: usize,
    ) -> LoginResponse {
        let stat_sn = self.stat_sn;
        self.stat_sn = self.stat_sn.wrapping_add(1);
        let ok = status == status::SUCCESS;
        LoginResponse {
            transit: ok && transit,
            continue_: false,
            csg: if ok { req.csg } else { 0 },
            nsg: if ok && transit { nsg } else { 0 },
            version_max: VERSION,
            version_active: VERSION,
            isid: req.isid,
            tsih: 0,
            itt: req.itt,
            stat_sn,
            exp_cmd_sn: req.cmd_sn,
            max_cmd_sn: req.cmd_sn.wrapping_add(self.queue_depth() - 1),
            status_class: (status >> 8) as u8,
            status_detail: status as u8,
            data_len: data_len as u32,
        }
    }

    fn fail(&mut self, req: &LoginRequest, status: u16, why: &str) -> LoginStep {
        tracing::info!(
            status = format_args!("0x{status:04x}"),
            initiator = %self.initiator_name,
            peer = %self.ctx.peer,
            reason = why,
            "iSCSI login failed"
        );
        let r = self.response(req, false, 0, status, 0);
        LoginStep::Fail(r, fail_text(why))
    }

    /// Sends `text`, splitting it over PDUs when it does not fit (C bit, §11.13.2).
    fn respond_text(
        &mut self,
        req: &LoginRequest,
        text: Vec<u8>,
        transit: bool,
        nsg: u8,
    ) -> LoginStep {
        if text.len() <= LOGIN_MAX_DATA {
            let r = self.response(req, transit, nsg, status::SUCCESS, text.len());
            return LoginStep::Respond(r, text);
        }
        let mut s = TextSplitter::new(text);
        let (piece, _) = s.next_piece(LOGIN_MAX_DATA);
        self.outgoing = Some((s, transit, nsg, req.csg));
        let mut r = self.response(req, false, 0, status::SUCCESS, piece.len());
        r.continue_ = true;
        LoginStep::Respond(r, piece)
    }

    /// Handles one Login Request with its data segment.
    pub fn handle(&mut self, req: &LoginRequest, data: &[u8]) -> LoginStep {
        if req.version_min > VERSION {
            return self.fail(req, status::UNSUPPORTED_VERSION, "unsupported version");
        }
        match self.leading {
            None => {
                self.leading = Some(Leading {
                    isid: req.isid,
                    tsih: req.tsih,
                    cid: req.cid,
                })
            }
            Some(l) if l.isid != req.isid || l.tsih != req.tsih || l.cid != req.cid => {
                return self.fail(
                    req,
                    status::INITIATOR_ERROR,
                    "ISID, TSIH or CID changed during login",
                );
            }
            Some(_) => {}
        }
        if data.len() > LOGIN_MAX_DATA {
            return self.fail(req, status::INITIATOR_ERROR, "login data segment too long");
        }
        if req.csg == 2 || req.csg == STAGE_FULL_FEATURE {
            return self.fail(req, status::INITIATOR_ERROR, "invalid CSG");
        }
        if req.transit && (req.nsg == 2 || req.nsg <= req.csg) {
            return self.fail(req, status::INITIATOR_ERROR, "invalid NSG");
        }
        self.last_cmd_sn = req.cmd_sn;

        // The initiator fetches the rest of a long response with empty requests.
        if let Some((mut s, transit, nsg, _csg)) = self.outgoing.take() {
            if !data.is_empty() || req.continue_ {
                return self.fail(req, status::INITIATOR_ERROR, "text while target continues");
            }
            let (piece, more) = s.next_piece(LOGIN_MAX_DATA);
            if more {
                self.outgoing = Some((s, transit, nsg, req.csg));
                let mut r = self.response(req, false, 0, status::SUCCESS, piece.len());
                r.continue_ = true;
                return LoginStep::Respond(r, piece);
            }
            if transit && nsg == STAGE_FULL_FEATURE {
                return self.complete(req, piece);
            }
            if transit {
                self.stage = nsg;
            }
            let r = self.response(req, transit, nsg, status::SUCCESS, piece.len());
            return LoginStep::Respond(r, piece);
        }

        if req.continue_ {
            if req.transit {
                return self.fail(req, status::INITIATOR_ERROR, "C and T both set");
            }
            if self.incoming.push(data).is_err() {
                return self.fail(req, status::INITIATOR_ERROR, "login text too long");
            }
            let r = self.response(req, false, 0, status::SUCCESS, 0);
            return LoginStep::Respond(r, Vec::new());
        }
        let text = if self.incoming.is_empty() {
            data.to_vec()
        } else {
            if self.incoming.push(data).is_err() {
                return self.fail(req, status::INITIATOR_ERROR, "login text too long");
            }
            self.incoming.take()
        };
        let Ok(keys) = TextPairs::parse(&text) else {
            return self.fail(req, status::INITIATOR_ERROR, "malformed login text");
        };
        if let Some(k) = keys.duplicate() {
            let k = k.to_string();
            return self.fail(req, status::INITIATOR_ERROR, &format!("key {k} sent twice"));
        }

        let first = self.negotiator.is_none();
        if first {
            if let Err(step) = self.first_request(req, &keys) {
                return *step;
            }
            self.stage = req.csg;
        } else if req.csg != self.stage {
            return self.fail(req, status::INITIATOR_ERROR, "unexpected CSG");
        }

        let mut out = TextPairs::new();
        if self.first_response {
            self.first_response = false;
            if let (SessionType::Normal, Some(g)) = (self.session_type, &self.portal_group) {
                out.push("TargetPortalGroupTag", g.tag.to_string());
                if let Some(a) = self.target.as_ref().and_then(|t| t.alias.clone()) {
                    out.push("TargetAlias", a);
                }
            }
        }

        let stage_done = match req.csg {
            STAGE_SECURITY => match self.security(req, &keys, &mut out) {
                Ok(done) => done,
                Err(step) => return *step,
            },
            _ => {
                if !matches!(self.auth_state, AuthState::Done) {
                    if self.auth.chap.is_some() {
                        return self.fail(
                            req,
                            status::AUTHENTICATION_FAILURE,
                            "authentication skipped",
                        );
                    }
                    self.auth_state = AuthState::Done;
                }
                if let Err(step) = self.operational(req, &keys, &mut out) {
                    return *step;
                }
                true
            }
        };

        let transit = req.transit && stage_done;
        if transit && req.nsg == STAGE_FULL_FEATURE {
            if let Some(n) = self.negotiator.as_mut() {
                for (k, v) in n.closing_declarations() {
                    out.push(&k, v);
                }
            }
            let text = out.encode();
            if text.len() > LOGIN_MAX_DATA {
                return self.respond_text(req, text, true, STAGE_FULL_FEATURE);
            }
            return self.complete(req, text);
        }
        if transit {
            self.stage = req.nsg;
        }
        self.respond_text(req, out.encode(), transit, req.nsg)
    }

    /// Checks the first request: names, session type, target, portal group and ACL.
    fn first_request(
        &mut self,
        req: &LoginRequest,
        keys: &TextPairs,
    ) -> Result<(), Box<LoginStep>> {
        let Some(init) = keys.get("InitiatorName").filter(|n| !n.is_empty()) else {
            return Err(Box::new(self.fail(
                req,
                status::MISSING_PARAMETER,
                "no InitiatorName",
            )));
        };
        self.initiator_name = init.to_string();
        self.session_type = match keys.get("SessionType").unwrap_or("Normal") {
            "Normal" => SessionType::Normal,
            "Discovery" => SessionType::Discovery,
            _ => {
                return Err(Box::new(self.fail(
                    req,
                    status::SESSION_TYPE_NOT_SUPPORTED,
                    "bad SessionType",
                )))
            }
        };
        if req.tsih != 0 {
            // Adding a connection to an existing session: MaxConnections is 1.
            let exists = (self.ctx.session_exists)(req.tsih);
            let (st, why) = if exists {
                (status::TOO_MANY_CONNECTIONS, "MaxConnections=1")
            } else {
                (status::SESSION_DOES_NOT_EXIST, "unknown TSIH")
            };
            return Err(Box::new(self.fail(req, st, why)));
        }
        let params = match self.session_type {
            SessionType::Discovery => {
                self.auth = self.ctx.registry.discovery_auth();
                rtgt_scsi::core::IscsiParams::default()
            }
            SessionType::Normal => {
                let Some(name) = keys.get("TargetName").filter(|n| !n.is_empty()) else {
                    return Err(Box::new(self.fail(
                        req,
                        status::MISSING_PARAMETER,
                        "no TargetName",
                    )));
                };
                let Some(target) = self.ctx.registry.target(name) else {
                    return Err(Box::new(self.fail(
                        req,
                        status::NOT_FOUND,
                        "unknown target",
                    )));
                };
                let Some(group) = choose_portal_group(&target, self.ctx.local) else {
                    return Err(Box::new(self.fail(
                        req,
                        status::NOT_FOUND,
                        "target not on this portal",
                    )));
                };
                let Some((luns, auth)) = group.admit(&self.initiator_name) else {
                    return Err(Box::new(self.fail(
                        req,
                        status::AUTHORIZATION_FAILURE,
                        "initiator not in ACL",
                    )));
                };
                self.luns = luns;
                self.auth = auth;
                let p = group.params.clone();
                self.target = Some(target);
                self.portal_group = Some(group);
                p
            }
        };
        self.negotiator = Some(TargetNegotiator::new(
            params,
            self.ctx.transport,
            self.session_type,
        ));
        Ok(())
    }

    /// Security stage: AuthMethod and CHAP (RFC 7143 §12.1). Returns whether
    /// authentication is complete.
    fn security(
        &mut self,
        req: &LoginRequest,
        keys: &TextPairs,
        out: &mut TextPairs,
    ) -> Result<bool, Box<LoginStep>> {
        let auth_fail =
            |me: &mut Login, why: &str| Box::new(me.fail(req, status::AUTHENTICATION_FAILURE, why));
        for (k, v) in keys.iter() {
            match k {
                "AuthMethod" => {
                    if !matches!(self.auth_state, AuthState::Start) {
                        return Err(Box::new(self.fail(
                            req,
                            status::INITIATOR_ERROR,
                            "AuthMethod again",
                        )));
                    }
                    let ours = if self.auth.chap.is_some() {
                        "CHAP"
                    } else {
                        "None"
                    };
                    let ans = super::params::resolve(super::params::Rule::List, ours, v);
                    out.push("AuthMethod", ans.clone());
                    match ans.as_str() {
                        "CHAP" => self.auth_state = AuthState::ChapAgreed,
                        "None" => self.auth_state = AuthState::Done,
                        _ => return Err(auth_fail(self, "no acceptable AuthMethod")),
                    }
                }
                "CHAP_A" => {
                    if !matches!(self.auth_state, AuthState::ChapAgreed) {
                        return Err(auth_fail(self, "CHAP_A out of sequence"));
                    }
                    match TargetChap::start(v) {
                        Ok((chap, send)) => {
                            for (k, v) in send {
                                out.push(&k, v);
                            }
                            self.auth_state = AuthState::Challenged(chap);
                        }
                        Err(_) => return Err(auth_fail(self, "CHAP algorithm")),
                    }
                }
                "CHAP_N" | "CHAP_R" | "CHAP_I" | "CHAP_C" => {}
                "InitiatorName" | "TargetName" | "SessionType" => {}
                k if k.starts_with("CHAP_") => return Err(auth_fail(self, "unknown CHAP key")),
                _ => {
                    let n = self.negotiator.as_mut().expect("set by first request");
                    match n.respond(k, v) {
                        Ok(Some(ans)) => out.push(k, ans),
                        Ok(None) => {}
                        Err(_) => {
                            return Err(Box::new(self.fail(
                                req,
                                status::INITIATOR_ERROR,
                                "key renegotiated",
                            )));
                        }
                    }
                }
            }
        }
        if keys.contains("CHAP_N") || keys.contains("CHAP_R") {
            let AuthState::Challenged(chap) = self.auth_state.clone() else {
                return Err(auth_fail(self, "CHAP response out of sequence"));
            };
            let Some(expected) = self.auth.chap.clone() else {
                return Err(auth_fail(self, "no CHAP credentials"));
            };
            let res = chap.finish(
                keys.get("CHAP_N"),
                keys.get("CHAP_R"),
                keys.get("CHAP_I"),
                keys.get("CHAP_C"),
                &expected,
                self.auth.mutual.as_ref(),
            );
            match res {
                Ok(send) => {
                    for (k, v) in send {
                        out.push(&k, v);
                    }
                    self.auth_state = AuthState::Done;
                }
                Err(e) => {
                    let why = match e {
                        ChapError::User => "CHAP user",
                        ChapError::Response => "CHAP response",
                        ChapError::NoMutual => "mutual CHAP not configured",
                        ChapError::Reflected => "CHAP challenge reflected",
                        _ => "malformed CHAP",
                    };
                    return Err(auth_fail(self, why));
                }
            }
        } else if keys.contains("CHAP_I") || keys.contains("CHAP_C") {
            return Err(auth_fail(self, "CHAP_I/CHAP_C without a response"));
        }
        if req.transit && matches!(self.auth_state, AuthState::Start) {
            // Leaving security without AuthMethod: only allowed when none is required.
            if self.auth.chap.is_some() {
                return Err(auth_fail(self, "authentication skipped"));
            }
            self.auth_state = AuthState::Done;
        }
        Ok(matches!(self.auth_state, AuthState::Done))
    }

    /// Operational stage: every key goes to the negotiator.
    fn operational(
        &mut self,
        req: &LoginRequest,
        keys: &TextPairs,
        out: &mut TextPairs,
    ) -> Result<(), Box<LoginStep>> {
        for (k, v) in keys.iter() {
            if k.starts_with("CHAP_") {
                return Err(Box::new(self.fail(
                    req,
                    status::INITIATOR_ERROR,
                    "CHAP key in operational stage",
                )));
            }
            let n = self.negotiator.as_mut().expect("set by first request");
            match n.respond(k, v) {
                Ok(Some(ans)) => out.push(k, ans),
                Ok(None) => {}
                Err(_) => {
                    return Err(Box::new(self.fail(
                        req,
                        status::INITIATOR_ERROR,
                        "key renegotiated",
                    )))
                }
            }
        }
        Ok(())
    }

    fn complete(&mut self, req: &LoginRequest, text: Vec<u8>) -> LoginStep {
        self.final_text = text;
        self.final_itt = req.itt;
        self.final_csg = req.csg;
        let leading = self.leading.expect("set by the first request");
        let mut n = self.negotiator.take().expect("set by the first request");
        let mut params = n.finish();
        if self.ctx.transport == TransportKind::Iser
            && self.session_type == SessionType::Normal
            && !params.rdma_extensions
        {
            // RFC 7145 §5.1.3: an iSER-assisted connection needs RDMAExtensions=Yes.
            return self.fail(
                req,
                status::MISSING_PARAMETER,
                "RDMAExtensions=Yes required on an iSER connection",
            );
        }
        params.initiator_name = self.initiator_name.clone();
        if let Some(t) = &self.target {
            params.target_name = t.name.clone();
            params.target_alias = t.alias.clone();
        }
        if let Some(g) = &self.portal_group {
            params.target_portal_group_tag = g.tag;
        }
        LoginStep::Complete(Box::new(LoginOutcome {
            isid: leading.isid,
            tsih: leading.tsih,
            cid: leading.cid,
            session_type: self.session_type,
            initiator_name: self.initiator_name.clone(),
            target: self.target.clone(),
            portal_group: self.portal_group.clone(),
            luns: self.luns.clone(),
            params,
            cmd_sn: req.cmd_sn,
            next_stat_sn: self.stat_sn.wrapping_add(1),
        }))
    }

    /// The final response after the session was created with `tsih`.
    pub fn accept(
        &mut self,
        tsih: u16,
        exp_cmd_sn: u32,
        max_cmd_sn: u32,
    ) -> (LoginResponse, Vec<u8>) {
        let leading = self.leading.expect("set by the first request");
        let text = std::mem::take(&mut self.final_text);
        let stat_sn = self.stat_sn;
        self.stat_sn = self.stat_sn.wrapping_add(1);
        let r = LoginResponse {
            transit: true,
            continue_: false,
            csg: self.final_csg,
            nsg: STAGE_FULL_FEATURE,
            version_max: VERSION,
            version_active: VERSION,
            isid: leading.isid,
            tsih,
            itt: self.final_itt,
            stat_sn,
            exp_cmd_sn,
            max_cmd_sn,
            status_class: 0,
            status_detail: 0,
            data_len: text.len() as u32,
        };
        (r, text)
    }

    /// A failure response when the session could not be created.
    pub fn refuse(&mut self, code: u16) -> LoginResponse {
        let leading = self.leading.expect("set by the first request");
        let stat_sn = self.stat_sn;
        self.stat_sn = self.stat_sn.wrapping_add(1);
        LoginResponse {
            isid: leading.isid,
            itt: self.final_itt,
            stat_sn,
            exp_cmd_sn: self.last_cmd_sn,
            max_cmd_sn: self.last_cmd_sn,
            status_class: (code >> 8) as u8,
            status_detail: code as u8,
            ..LoginResponse::default()
        }
    }

    /// The StatSN the next response carries.
    pub fn next_stat_sn(&self) -> u32 {
        self.stat_sn
    }
}

/// The portal group a connection to `local` belongs to: an exact portal match, then a
/// wildcard portal on the same port, then any wildcard portal (or a group without portals).
pub fn choose_portal_group(target: &Target, local: SocketAddr) -> Option<PortalGroup> {
    let local_ip = local.ip().to_canonical();
    let exact = target.portal_groups.iter().find(|g| {
        g.portals
            .iter()
            .any(|p| p.ip().to_canonical() == local_ip && p.port() == local.port())
    });
    let same_port = || {
        target.portal_groups.iter().find(|g| {
            g.portals
                .iter()
                .any(|p| p.ip().is_unspecified() && p.port() == local.port())
        })
    };
    let any = || {
        target
            .portal_groups
            .iter()
            .find(|g| g.portals.is_empty() || g.portals.iter().any(|p| p.ip().is_unspecified()))
    };
    exact.or_else(same_port).or_else(any).cloned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chap;
    use rtgt_scsi::core::{Acl, ChapCredentials, IscsiParams};
    use std::collections::HashMap;

    const TARGET: &str = "iqn.2025-01.io.rtgt:t1";
    const INIT: &str = "iqn.1994-05.com.example:host";

    fn registry(auth: Auth, any: bool) -> Arc<Registry> {
        let mut acls = HashMap::new();
        acls.insert(
            "iqn.acl".to_string(),
            Acl {
                initiator: "iqn.acl".into(),
                auth: Auth::default(),
                luns: LunMap::default(),
            },
        );
        let r = Registry::new();
        r.set_target(Target {
            name: TARGET.into(),
            alias: Some("disk one".into()),
            portal_groups: vec![PortalGroup {
                tag: 7,
                ids: rtgt_scsi::core::PortIds::alone(7),
                portals: vec!["0.0.0.0:3260".parse().unwrap()],
                auth,
                acls,
                allow_any_initiator: any,
                luns: LunMap::default(),
                params: IscsiParams::default(),
                iser: true,
            }],
        });
        r
    }

    fn login(r: Arc<Registry>) -> Login {
        Login::new(LoginContext {
            registry: r,
            local: "127.0.0.1:3260".parse().unwrap(),
            peer: "127.0.0.1:40000".parse().unwrap(),
            transport: TransportKind::Tcp,
            session_exists: Arc::new(|t| t == 5),
        })
    }

    fn req(csg: u8, nsg: u8, transit: bool) -> LoginRequest {
        LoginRequest {
            transit,
            csg,
            nsg,
            isid: [0x80, 0, 0, 0, 0, 1],
            itt: 1,
            cid: 0,
            cmd_sn: 10,
            ..Default::default()
        }
    }

    fn text(pairs: &[(&str, &str)]) -> Vec<u8> {
        let mut t = TextPairs::new();
        for (k, v) in pairs {
            t.push(k, *v);
        }
        t.encode()
    }

    fn failed(step: LoginStep) -> u16 {
        match step {
            LoginStep::Fail(r, _) => r.status(),
            other => panic!("expected failure, got {other:?}"),
        }
    }

    fn responded(step: LoginStep) -> (LoginResponse, TextPairs) {
        match step {
            LoginStep::Respond(r, d) => (r, TextPairs::parse(&d).unwrap()),
            other => panic!("expected response, got {other:?}"),
        }
    }

    #[test]
    fn none_auth_straight_to_ffp() {
        let mut l = login(registry(Auth::default(), true));
        let d = text(&[
            ("InitiatorName", INIT),
            ("TargetName", TARGET),
            ("AuthMethod", "None"),
        ]);
        let (r, t) = responded(l.handle(&req(0, 1, true), &d));
        assert!(r.transit);
        assert_eq!((r.csg, r.nsg, r.status()), (0, 1, 0));
        assert_eq!(t.get("AuthMethod"), Some("None"));
        assert_eq!(t.get("TargetPortalGroupTag"), Some("7"));
        assert_eq!(t.get("TargetAlias"), Some("disk one"));
        let d = text(&[
            ("HeaderDigest", "None"),
            ("MaxRecvDataSegmentLength", "65536"),
            ("X-foo", "1"),
        ]);
        let LoginStep::Complete(o) = l.handle(&req(1, 3, true), &d) else {
            panic!()
        };
        assert_eq!(o.initiator_name, INIT);
        assert_eq!(o.params.max_xmit_data_segment_length, 65536);
        assert_eq!(o.params.target_portal_group_tag, 7);
        let (r, d) = l.accept(3, 10, 41);
        assert!(r.transit && r.nsg == 3 && r.tsih == 3);
        let t = TextPairs::parse(&d).unwrap();
        assert_eq!(t.get("X-foo"), Some("NotUnderstood"));
        assert_eq!(t.get("HeaderDigest"), Some("None"));
    }

    #[test]
    fn iser_needs_rdma_extensions() {
        let run = |keys: &[(&str, &str)]| {
            let mut l = login(registry(Auth::default(), true));
            l.ctx.transport = TransportKind::Iser;
            let d = text(&[("InitiatorName", INIT), ("TargetName", TARGET)]);
            let _ = responded(l.handle(&req(0, 1, true), &d));
            l.handle(&req(1, 3, true), &text(keys))
        };
        assert_eq!(
            failed(run(&[("HeaderDigest", "None")])),
            status::MISSING_PARAMETER
        );
        assert_eq!(
            failed(run(&[("RDMAExtensions", "No")])),
            status::MISSING_PARAMETER
        );
        let LoginStep::Complete(o) = run(&[
            ("RDMAExtensions", "Yes"),
            ("InitialR2T", "No"),
            ("TargetRecvDataSegmentLength", "8192"),
        ]) else {
            panic!("iSER login with RDMAExtensions=Yes did not complete")
        };
        assert!(o.params.rdma_extensions);
        assert!(o.params.initial_r2t, "iSER answers InitialR2T=Yes");
        assert_eq!(o.params.max_recv_data_segment_length, 8192);
    }

    #[test]
    fn stat_sn_increments() {
        let mut l = login(registry(Auth::default(), true));
        let d = text(&[("InitiatorName", INIT), ("TargetName", TARGET)]);
        let (r1, _) = responded(l.handle(&req(0, 1, false), &d));
        let (r2, _) = responded(l.handle(&req(0, 1, true), &[]));
        assert_eq!(r2.stat_sn, r1.stat_sn.wrapping_add(1));
    }

    #[test]
    fn missing_names() {
        let mut l = login(registry(Auth::default(), true));
        assert_eq!(
            failed(l.handle(&req(0, 1, true), &text(&[("TargetName", TARGET)]))),
            0x0207
        );
        let mut l = login(registry(Auth::default(), true));
        assert_eq!(
            failed(l.handle(&req(0, 1, true), &text(&[("InitiatorName", INIT)]))),
            0x0207
        );
    }

    #[test]
    fn unknown_target_and_acl() {
        let mut l = login(registry(Auth::default(), true));
        let d = text(&[("InitiatorName", INIT), ("TargetName", "iqn.nope")]);
        assert_eq!(failed(l.handle(&req(0, 1, true), &d)), 0x0203);
        let mut l = login(registry(Auth::default(), false));
        let d = text(&[("InitiatorName", INIT), ("TargetName", TARGET)]);
        assert_eq!(failed(l.handle(&req(0, 1, true), &d)), 0x0202);
        let mut l = login(registry(Auth::default(), false));
        let d = text(&[("InitiatorName", "iqn.acl"), ("TargetName", TARGET)]);
        assert!(matches!(
            l.handle(&req(0, 1, true), &d),
            LoginStep::Respond(..)
        ));
    }

    #[test]
    fn bad_stages_and_version() {
        let d = text(&[("InitiatorName", INIT), ("TargetName", TARGET)]);
        let mut l = login(registry(Auth::default(), true));
        assert_eq!(failed(l.handle(&req(3, 3, true), &d)), 0x0200);
        let mut l = login(registry(Auth::default(), true));
        assert_eq!(failed(l.handle(&req(1, 1, true), &d)), 0x0200);
        let mut l = login(registry(Auth::default(), true));
        assert_eq!(failed(l.handle(&req(0, 2, true), &d)), 0x0200);
        let mut l = login(registry(Auth::default(), true));
        let mut r = req(0, 1, true);
        r.version_min = 2;
        assert_eq!(failed(l.handle(&r, &d)), 0x0205);
        let mut l = login(registry(Auth::default(), true));
        let mut r = req(0, 1, true);
        r.continue_ = true;
        assert_eq!(failed(l.handle(&r, &d)), 0x0200);
        let mut l = login(registry(Auth::default(), true));
        assert!(matches!(
            l.handle(&req(0, 1, false), &d),
            LoginStep::Respond(..)
        ));
        let mut r = req(0, 1, false);
        r.isid[5] = 9;
        assert_eq!(failed(l.handle(&r, &[])), 0x0200);
        let mut l = login(registry(Auth::default(), true));
        let d2 = text(&[("InitiatorName", INIT), ("SessionType", "Weird")]);
        assert_eq!(failed(l.handle(&req(0, 1, true), &d2)), 0x0209);
        let mut l = login(registry(Auth::default(), true));
        assert_eq!(
            failed(l.handle(&req(0, 1, true), b"garbage-without-equals\0")),
            0x0200
        );
        let mut l = login(registry(Auth::default(), true));
        let dup = text(&[
            ("InitiatorName", INIT),
            ("TargetName", TARGET),
            ("TargetName", TARGET),
        ]);
        assert_eq!(failed(l.handle(&req(0, 1, true), &dup)), 0x0200);
    }

    #[test]
    fn tsih_rules() {
        let d = text(&[("InitiatorName", INIT), ("TargetName", TARGET)]);
        let mut l = login(registry(Auth::default(), true));
        let mut r = req(0, 1, true);
        r.tsih = 5;
        assert_eq!(failed(l.handle(&r, &d)), 0x0206);
        let mut l = login(registry(Auth::default(), true));
        r.tsih = 6;
        assert_eq!(failed(l.handle(&r, &d)), 0x020a);
    }

    fn chap_auth(mutual: bool) -> Auth {
        Auth {
            chap: Some(ChapCredentials {
                user: "alice".into(),
                secret: "alicesecret1".into(),
            }),
            mutual: mutual.then(|| ChapCredentials {
                user: "tgt".into(),
                secret: "targetsecret".into(),
            }),
        }
    }

    fn chap_exchange(l: &mut Login, secret: &str, mutual: Option<&[u8]>) -> LoginStep {
        let d = text(&[
            ("InitiatorName", INIT),
            ("TargetName", TARGET),
            ("AuthMethod", "CHAP,None"),
        ]);
        let (r, t) = responded(l.handle(&req(0, 1, true), &d));
        assert!(!r.transit);
        assert_eq!(t.get("AuthMethod"), Some("CHAP"));
        let (r, t) = responded(l.handle(&req(0, 1, true), &text(&[("CHAP_A", "5")])));
        assert!(!r.transit);
        let id = chap::parse_id(t.get("CHAP_I").unwrap()).unwrap();
        let c = chap::decode_binary(t.get("CHAP_C").unwrap()).unwrap();
        let resp = chap::encode_hex(&chap::response(id, secret.as_bytes(), &c));
        let mut keys = vec![("CHAP_N", "alice".to_string()), ("CHAP_R", resp)];
        if let Some(mc) = mutual {
            keys.push(("CHAP_I", "77".into()));
            keys.push(("CHAP_C", chap::encode_hex(mc)));
        }
        let mut t = TextPairs::new();
        for (k, v) in keys {
            t.push(k, v);
        }
        l.handle(&req(0, 1, true), &t.encode())
    }

    #[test]
    fn chap_one_way() {
        let mut l = login(registry(chap_auth(false), true));
        let (r, _) = responded(chap_exchange(&mut l, "alicesecret1", None));
        assert!(r.transit && r.nsg == 1);
        let mut l = login(registry(chap_auth(false), true));
        assert_eq!(failed(chap_exchange(&mut l, "wrong-secret", None)), 0x0201);
    }

    #[test]
    fn chap_mutual() {
        let mut l = login(registry(chap_auth(true), true));
        let mc = [5u8; 16];
        let (r, t) = responded(chap_exchange(&mut l, "alicesecret1", Some(&mc)));
        assert!(r.transit);
        assert_eq!(t.get("CHAP_N"), Some("tgt"));
        let want = chap::encode_hex(&chap::response(77, b"targetsecret", &mc));
        assert_eq!(t.get("CHAP_R"), Some(want.as_str()));
        // Mutual asked for but not configured.
        let mut l = login(registry(chap_auth(false), true));
        assert_eq!(
            failed(chap_exchange(&mut l, "alicesecret1", Some(&mc))),
            0x0201
        );
    }

    #[test]
    fn chap_required_but_skipped() {
        let mut l = login(registry(chap_auth(false), true));
        let d = text(&[
            ("InitiatorName", INIT),
            ("TargetName", TARGET),
            ("AuthMethod", "None"),
        ]);
        assert_eq!(failed(l.handle(&req(0, 1, true), &d)), 0x0201);
        let mut l = login(registry(chap_auth(false), true));
        let d = text(&[("InitiatorName", INIT), ("TargetName", TARGET)]);
        assert_eq!(failed(l.handle(&req(1, 3, true), &d)), 0x0201);
    }

    #[test]
    fn discovery_uses_discovery_auth() {
        let r = registry(Auth::default(), true);
        r.set_discovery_auth(chap_auth(false));
        let mut l = login(r.clone());
        let d = text(&[
            ("InitiatorName", INIT),
            ("SessionType", "Discovery"),
            ("AuthMethod", "None"),
        ]);
        assert_eq!(failed(l.handle(&req(0, 1, true), &d)), 0x0201);
        r.set_discovery_auth(Auth::default());
        let mut l = login(r);
        let (resp, t) = responded(l.handle(&req(0, 1, true), &d));
        assert!(resp.transit);
        assert!(t.get("TargetPortalGroupTag").is_none());
        let d = text(&[("MaxBurstLength", "4096")]);
        let LoginStep::Complete(o) = l.handle(&req(1, 3, true), &d) else {
            panic!()
        };
        assert_eq!(o.session_type, SessionType::Discovery);
        let (_, d) = l.accept(9, 10, 10);
        assert_eq!(
            TextPairs::parse(&d).unwrap().get("MaxBurstLength"),
            Some("Irrelevant")
        );
    }

    #[test]
    fn text_continuation() {
        let mut l = login(registry(Auth::default(), true));
        let d = text(&[
            ("InitiatorName", INIT),
            ("TargetName", TARGET),
            ("AuthMethod", "None"),
        ]);
        let (a, b) = d.split_at(10);
        let mut r = req(0, 1, false);
        r.continue_ = true;
        let (resp, t) = responded(l.handle(&r, a));
        assert!(!resp.transit && t.is_empty());
        let (resp, t) = responded(l.handle(&req(0, 1, true), b));
        assert!(resp.transit);
        assert_eq!(t.get("AuthMethod"), Some("None"));
    }

    #[test]
    fn long_response_is_continued() {
        let mut l = login(registry(Auth::default(), true));
        let d = text(&[
            ("InitiatorName", INIT),
            ("TargetName", TARGET),
            ("AuthMethod", "None"),
        ]);
        responded(l.handle(&req(0, 1, true), &d));
        // 200 unknown keys: the request fits one PDU, the answer needs two.
        let mut t = TextPairs::new();
        for i in 0..200 {
            t.push(&format!("X-com.example.longer.key.name.{i:04}"), "v");
        }
        let (r, d1) = match l.handle(&req(1, 3, true), &t.encode()) {
            LoginStep::Respond(r, d) => (r, d),
            other => panic!("{other:?}"),
        };
        assert!(r.continue_ && !r.transit && d1.len() == LOGIN_MAX_DATA);
        let LoginStep::Complete(_) = l.handle(&req(1, 3, true), &[]) else {
            panic!()
        };
        let (r, d2) = l.accept(1, 10, 20);
        assert!(r.transit);
        let mut all = d1;
        all.extend_from_slice(&d2);
        // Plus our MaxRecvDataSegmentLength declaration.
        assert_eq!(TextPairs::parse(&all).unwrap().0.len(), 201);
    }

    #[test]
    fn portal_group_choice() {
        let mut t = Target {
            name: "t".into(),
            alias: None,
            portal_groups: vec![],
        };
        let mk = |tag, p: &str| PortalGroup {
            tag,
            ids: rtgt_scsi::core::PortIds::alone(tag),
            portals: vec![p.parse().unwrap()],
            auth: Auth::default(),
            acls: HashMap::new(),
            allow_any_initiator: true,
            luns: LunMap::default(),
            params: IscsiParams::default(),
            iser: true,
        };
        t.portal_groups = vec![mk(1, "0.0.0.0:3260"), mk(2, "10.0.0.1:3260")];
        assert_eq!(
            choose_portal_group(&t, "10.0.0.1:3260".parse().unwrap())
                .unwrap()
                .tag,
            2
        );
        assert_eq!(
            choose_portal_group(&t, "10.0.0.2:3260".parse().unwrap())
                .unwrap()
                .tag,
            1
        );
        t.portal_groups = vec![mk(2, "10.0.0.1:3260")];
        assert!(choose_portal_group(&t, "10.0.0.2:3260".parse().unwrap()).is_none());
    }
}
