//! Negotiation of login and text keys (RFC 7143 §6, §13; RFC 7144 for iSCSIProtocolLevel;
//! RFC 7145 §6.3 for the iSER keys).
//!
//! The key table says how each key is negotiated; [`resolve`] is the responder's result
//! function and [`accept`] checks a responder's answer on the originator's side. The
//! negotiated values of a session live in [`SessionParams`]; [`TargetNegotiator`] answers an
//! initiator's operational keys from the portal group's [`IscsiParams`].

use std::collections::HashSet;

use rtgt_scsi::core::IscsiParams;

/// How a key's result is reached (RFC 7143 §6.2.2 - §6.2.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    /// Boolean, result is the AND of both values.
    And,
    /// Boolean, result is the OR of both values.
    Or,
    /// Number in `lo..=hi`, result is the smaller value.
    Min(u64, u64),
    /// Number in `lo..=hi`, result is the larger value.
    Max(u64, u64),
    /// The responder picks the first of the originator's values it supports.
    List,
    /// Each side states its own value; nothing is negotiated.
    Declarative,
    /// Declarative number in `lo..=hi` (MaxRecvDataSegmentLength and the iSER lengths).
    DeclarativeNumber(u64, u64),
}

/// When a key may be used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Only during login ("IO", initialize only).
    Login,
    /// Only in full feature phase (SendTargets).
    FullFeature,
    /// Login and full feature phase.
    Any,
}

/// One key of RFC 7143 §13 (and the iSER keys of RFC 7145).
#[derive(Debug, Clone, Copy)]
pub struct KeyDef {
    pub name: &'static str,
    pub rule: Rule,
    pub phase: Phase,
    /// Leading only: may only be negotiated on the first connection of a session.
    pub leading_only: bool,
    /// Answered `Irrelevant` in discovery sessions.
    pub normal_only: bool,
    /// Negotiated only when RDMAExtensions=Yes.
    pub iser: bool,
    pub default: &'static str,
}

const fn key(
    name: &'static str,
    rule: Rule,
    phase: Phase,
    leading_only: bool,
    normal_only: bool,
    default: &'static str,
) -> KeyDef {
    KeyDef {
        name,
        rule,
        phase,
        leading_only,
        normal_only,
        iser: false,
        default,
    }
}

const LEN_RANGE: (u64, u64) = (512, 16_777_215);

/// Every standard key.
pub const KEYS: &[KeyDef] = &[
    key(
        "HeaderDigest",
        Rule::List,
        Phase::Login,
        false,
        false,
        "None",
    ),
    key("DataDigest", Rule::List, Phase::Login, false, false, "None"),
    key(
        "MaxConnections",
        Rule::Min(1, 65535),
        Phase::Login,
        true,
        true,
        "1",
    ),
    key(
        "SendTargets",
        Rule::Declarative,
        Phase::FullFeature,
        false,
        false,
        "",
    ),
    key(
        "TargetName",
        Rule::Declarative,
        Phase::Login,
        true,
        false,
        "",
    ),
    key(
        "InitiatorName",
        Rule::Declarative,
        Phase::Login,
        true,
        false,
        "",
    ),
    key(
        "TargetAlias",
        Rule::Declarative,
        Phase::Any,
        false,
        false,
        "",
    ),
    key(
        "InitiatorAlias",
        Rule::Declarative,
        Phase::Any,
        false,
        false,
        "",
    ),
    key(
        "TargetAddress",
        Rule::Declarative,
        Phase::Any,
        false,
        false,
        "",
    ),
    key(
        "TargetPortalGroupTag",
        Rule::Declarative,
        Phase::Login,
        true,
        false,
        "",
    ),
    key("InitialR2T", Rule::Or, Phase::Login, true, true, "Yes"),
    key("ImmediateData", Rule::And, Phase::Login, true, true, "Yes"),
    key(
        "MaxRecvDataSegmentLength",
        Rule::DeclarativeNumber(LEN_RANGE.0, LEN_RANGE.1),
        Phase::Any,
        false,
        false,
        "8192",
    ),
    key(
        "MaxBurstLength",
        Rule::Min(LEN_RANGE.0, LEN_RANGE.1),
        Phase::Login,
        true,
        true,
        "262144",
    ),
    key(
        "FirstBurstLength",
        Rule::Min(LEN_RANGE.0, LEN_RANGE.1),
        Phase::Login,
        true,
        true,
        "65536",
    ),
    key(
        "DefaultTime2Wait",
        Rule::Max(0, 3600),
        Phase::Login,
        true,
        false,
        "2",
    ),
    key(
        "DefaultTime2Retain",
        Rule::Min(0, 3600),
        Phase::Login,
        true,
        false,
        "20",
    ),
    key(
        "MaxOutstandingR2T",
        Rule::Min(1, 65535),
        Phase::Login,
        true,
        true,
        "1",
    ),
    key("DataPDUInOrder", Rule::Or, Phase::Login, true, true, "Yes"),
    key(
        "DataSequenceInOrder",
        Rule::Or,
        Phase::Login,
        true,
        true,
        "Yes",
    ),
    key(
        "ErrorRecoveryLevel",
        Rule::Min(0, 2),
        Phase::Login,
        true,
        false,
        "0",
    ),
    key(
        "SessionType",
        Rule::Declarative,
        Phase::Login,
        true,
        false,
        "Normal",
    ),
    key(
        "TaskReporting",
        Rule::List,
        Phase::Login,
        true,
        true,
        "RFC3720",
    ),
    key(
        "iSCSIProtocolLevel",
        Rule::Min(0, 31),
        Phase::Login,
        true,
        true,
        "0",
    ),
    KeyDef {
        name: "RDMAExtensions",
        rule: Rule::And,
        phase: Phase::Login,
        leading_only: true,
        normal_only: false,
        iser: false,
        default: "No",
    },
    KeyDef {
        name: "TargetRecvDataSegmentLength",
        rule: Rule::DeclarativeNumber(LEN_RANGE.0, LEN_RANGE.1),
        phase: Phase::Login,
        leading_only: false,
        normal_only: false,
        iser: true,
        default: "8192",
    },
    KeyDef {
        name: "InitiatorRecvDataSegmentLength",
        rule: Rule::DeclarativeNumber(LEN_RANGE.0, LEN_RANGE.1),
        phase: Phase::Login,
        leading_only: false,
        normal_only: false,
        iser: true,
        default: "8192",
    },
    KeyDef {
        name: "MaxOutstandingUnexpectedPDUs",
        rule: Rule::Min(0, 4_294_967_295),
        phase: Phase::Login,
        leading_only: true,
        normal_only: true,
        iser: true,
        default: "0",
    },
    key("AuthMethod", Rule::List, Phase::Login, false, false, "None"),
];

/// The definition of a standard key.
pub fn lookup(name: &str) -> Option<&'static KeyDef> {
    KEYS.iter().find(|k| k.name == name)
}

/// Keys from RFC 3720 that RFC 7143 §13 no longer defines; answered without effect.
pub fn obsolete_answer(name: &str) -> Option<&'static str> {
    match name {
        "IFMarker" | "OFMarker" => Some("No"),
        "IFMarkInt" | "OFMarkInt" => Some(IRRELEVANT),
        _ => None,
    }
}

pub const NOT_UNDERSTOOD: &str = "NotUnderstood";
pub const IRRELEVANT: &str = "Irrelevant";
pub const REJECT: &str = "Reject";

/// Parses a numerical value: decimal or `0x` hexadecimal (RFC 7143 §6.1, §5.1).
pub fn parse_number(v: &str) -> Option<u64> {
    if let Some(h) = v.strip_prefix("0x").or_else(|| v.strip_prefix("0X")) {
        if h.is_empty() || h.len() > 16 {
            return None;
        }
        u64::from_str_radix(h, 16).ok()
    } else if !v.is_empty() && v.len() <= 20 && v.bytes().all(|b| b.is_ascii_digit()) {
        v.parse().ok()
    } else {
        None
    }
}

pub fn parse_bool(v: &str) -> Option<bool> {
    match v {
        "Yes" => Some(true),
        "No" => Some(false),
        _ => None,
    }
}

pub fn yes_no(b: bool) -> &'static str {
    if b {
        "Yes"
    } else {
        "No"
    }
}

/// The responder's result function (RFC 7143 §6.2.2 - §6.2.4): `ours` is our value (for a
/// list, our supported values), `offered` the originator's. Returns the value to answer,
/// which may be `Reject`.
pub fn resolve(rule: Rule, ours: &str, offered: &str) -> String {
    match rule {
        Rule::And | Rule::Or => match (parse_bool(ours), parse_bool(offered)) {
            (Some(a), Some(b)) => {
                yes_no(if rule == Rule::And { a && b } else { a || b }).to_string()
            }
            _ => REJECT.to_string(),
        },
        Rule::Min(lo, hi) | Rule::Max(lo, hi) => {
            match (parse_number(ours), parse_number(offered)) {
                (Some(a), Some(b)) if (lo..=hi).contains(&b) => {
                    let r = if matches!(rule, Rule::Min(..)) {
                        a.min(b)
                    } else {
                        a.max(b)
                    };
                    r.clamp(lo, hi).to_string()
                }
                _ => REJECT.to_string(),
            }
        }
        Rule::List => {
            let supported: Vec<&str> = ours.split(',').collect();
            offered
                .split(',')
                .find(|v| supported.contains(v))
                .unwrap_or(REJECT)
                .to_string()
        }
        Rule::Declarative | Rule::DeclarativeNumber(..) => ours.to_string(),
    }
}

/// The originator's check of an answer to its offer: the value to use, or `None` when the
/// answer is not a legal result of the offer (a negotiation failure).
pub fn accept(rule: Rule, offered: &str, answer: &str) -> Option<String> {
    match rule {
        Rule::And | Rule::Or => {
            let (o, a) = (parse_bool(offered)?, parse_bool(answer)?);
            // AND can only turn Yes into No; OR only No into Yes.
            let legal = if rule == Rule::And { a <= o } else { a >= o };
            legal.then(|| yes_no(a).to_string())
        }
        Rule::Min(lo, hi) | Rule::Max(lo, hi) => {
            let (o, a) = (parse_number(offered)?, parse_number(answer)?);
            let legal = (lo..=hi).contains(&a)
                && if matches!(rule, Rule::Min(..)) {
                    a <= o
                } else {
                    a >= o
                };
            legal.then(|| a.to_string())
        }
        Rule::List => offered
            .split(',')
            .any(|v| v == answer)
            .then(|| answer.to_string()),
        Rule::Declarative => Some(answer.to_string()),
        Rule::DeclarativeNumber(lo, hi) => {
            let a = parse_number(answer)?;
            (lo..=hi).contains(&a).then(|| a.to_string())
        }
    }
}

/// Session type (RFC 7143 §13.21).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SessionType {
    #[default]
    Normal,
    Discovery,
}

/// The largest data segment an iSER target receives (TargetRecvDataSegmentLength it accepts):
/// the size of its posted receive buffers beyond the headers, as LIO's 8 KiB. Data beyond the
/// immediate part moves by RDMA READ, so larger buffers would only cost memory.
pub const ISER_MAX_RECV_DATA: u32 = 8192;

/// The connection driver a login runs on; decides the iSER keys (RFC 7145 §6.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TransportKind {
    #[default]
    Tcp,
    Iser,
}

impl TransportKind {
    pub fn name(self) -> &'static str {
        match self {
            TransportKind::Tcp => "tcp",
            TransportKind::Iser => "iser",
        }
    }
}

/// The negotiated parameters of a session and its connection, from one side's point of
/// view. Defaults are the RFC's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionParams {
    pub session_type: SessionType,
    pub initiator_name: String,
    pub initiator_alias: Option<String>,
    pub target_name: String,
    pub target_alias: Option<String>,
    pub target_portal_group_tag: u16,
    pub header_digest: bool,
    pub data_digest: bool,
    pub max_connections: u16,
    pub initial_r2t: bool,
    pub immediate_data: bool,
    /// The most this side accepts in one data segment (its own declaration).
    pub max_recv_data_segment_length: u32,
    /// The most this side may send in one data segment (the peer's declaration).
    pub max_xmit_data_segment_length: u32,
    pub max_burst_length: u32,
    pub first_burst_length: u32,
    pub default_time2wait: u16,
    pub default_time2retain: u16,
    pub max_outstanding_r2t: u32,
    pub data_pdu_in_order: bool,
    pub data_sequence_in_order: bool,
    pub error_recovery_level: u8,
    pub task_reporting: String,
    pub protocol_level: u8,
    pub rdma_extensions: bool,
    pub target_recv_data_segment_length: u32,
    pub initiator_recv_data_segment_length: u32,
    pub max_outstanding_unexpected_pdus: u32,
}

impl Default for SessionParams {
    fn default() -> Self {
        SessionParams {
            session_type: SessionType::Normal,
            initiator_name: String::new(),
            initiator_alias: None,
            target_name: String::new(),
            target_alias: None,
            target_portal_group_tag: 0,
            header_digest: false,
            data_digest: false,
            max_connections: 1,
            initial_r2t: true,
            immediate_data: true,
            max_recv_data_segment_length: 8192,
            max_xmit_data_segment_length: 8192,
            max_burst_length: 262_144,
            first_burst_length: 65_536,
            default_time2wait: 2,
            default_time2retain: 20,
            max_outstanding_r2t: 1,
            data_pdu_in_order: true,
            data_sequence_in_order: true,
            error_recovery_level: 0,
            task_reporting: "RFC3720".to_string(),
            protocol_level: 0,
            rdma_extensions: false,
            target_recv_data_segment_length: 8192,
            initiator_recv_data_segment_length: 8192,
            max_outstanding_unexpected_pdus: 0,
        }
    }
}

impl SessionParams {
    /// Records a negotiated (or declared) operational value. `peer_declared` says the value
    /// is the peer's declaration of a declarative key. Unknown keys are ignored.
    pub fn apply(&mut self, key: &str, value: &str, peer_declared: bool) {
        let num = || parse_number(value);
        let b = || parse_bool(value);
        match key {
            "HeaderDigest" => self.header_digest = value == "CRC32C",
            "DataDigest" => self.data_digest = value == "CRC32C",
            "MaxConnections" => self.max_connections = num().unwrap_or(1) as u16,
            "InitialR2T" => self.initial_r2t = b().unwrap_or(true),
            "ImmediateData" => self.immediate_data = b().unwrap_or(true),
            "MaxRecvDataSegmentLength" => {
                let v = num().unwrap_or(8192) as u32;
                if peer_declared {
                    self.max_xmit_data_segment_length = v;
                } else {
                    self.max_recv_data_segment_length = v;
                }
            }
            "MaxBurstLength" => self.max_burst_length = num().unwrap_or(262_144) as u32,
            "FirstBurstLength" => self.first_burst_length = num().unwrap_or(65_536) as u32,
            "DefaultTime2Wait" => self.default_time2wait = num().unwrap_or(2) as u16,
            "DefaultTime2Retain" => self.default_time2retain = num().unwrap_or(20) as u16,
            "MaxOutstandingR2T" => self.max_outstanding_r2t = num().unwrap_or(1) as u32,
            "DataPDUInOrder" => self.data_pdu_in_order = b().unwrap_or(true),
            "DataSequenceInOrder" => self.data_sequence_in_order = b().unwrap_or(true),
            "ErrorRecoveryLevel" => self.error_recovery_level = num().unwrap_or(0) as u8,
            "TaskReporting" => self.task_reporting = value.to_string(),
            "iSCSIProtocolLevel" => self.protocol_level = num().unwrap_or(0) as u8,
            "RDMAExtensions" => self.rdma_extensions = b().unwrap_or(false),
            "TargetRecvDataSegmentLength" => {
                self.target_recv_data_segment_length = num().unwrap_or(8192) as u32
            }
            "InitiatorRecvDataSegmentLength" => {
                self.initiator_recv_data_segment_length = num().unwrap_or(8192) as u32
            }
            "MaxOutstandingUnexpectedPDUs" => {
                self.max_outstanding_unexpected_pdus = num().unwrap_or(0) as u32
            }
            "TargetAlias" => self.target_alias = Some(value.to_string()),
            "InitiatorAlias" => self.initiator_alias = Some(value.to_string()),
            "TargetPortalGroupTag" => self.target_portal_group_tag = num().unwrap_or(0) as u16,
            _ => {}
        }
    }

    /// Settles values that depend on each other once login completes (RFC 7143 §13.14:
    /// FirstBurstLength never exceeds MaxBurstLength).
    pub fn finish(&mut self) {
        if self.first_burst_length > self.max_burst_length {
            self.first_burst_length = self.max_burst_length;
        }
    }

    /// Unsolicited bytes an initiator may send for a write of `edtl` bytes beyond the
    /// immediate data (RFC 7143 §13.14).
    pub fn unsolicited_limit(&self, edtl: u32) -> u32 {
        if self.initial_r2t && !self.immediate_data {
            0
        } else {
            edtl.min(self.first_burst_length)
        }
    }
}

/// Why a negotiation failed; the login answers with the status code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NegotiationError {
    /// A key was negotiated twice in one login (RFC 7143 §6.2): initiator error 0x0200.
    Renegotiated(String),
    /// A key's answer is not a legal result (originator side).
    IllegalAnswer(String),
}

/// The target's side of operational negotiation (RFC 7143 §6.2, §13).
#[derive(Debug, Clone)]
pub struct TargetNegotiator {
    ours: IscsiParams,
    transport: TransportKind,
    session_type: SessionType,
    seen: HashSet<String>,
    declared_mrdsl: bool,
    pub params: SessionParams,
}

impl TargetNegotiator {
    pub fn new(ours: IscsiParams, transport: TransportKind, session_type: SessionType) -> Self {
        let mut params = SessionParams {
            session_type,
            max_recv_data_segment_length: ours.max_recv_data_segment_length.clamp(512, 16_777_215),
            ..SessionParams::default()
        };
        // The login phase always uses 8192 until the final values take effect (§13.12).
        params.max_xmit_data_segment_length = 8192;
        TargetNegotiator {
            ours,
            transport,
            session_type,
            seen: HashSet::new(),
            declared_mrdsl: false,
            params,
        }
    }

    pub fn set_session_type(&mut self, t: SessionType) {
        self.session_type = t;
        self.params.session_type = t;
    }

    /// The value we support or prefer for `key`, as the result functions take it.
    fn our_value(&self, key: &str) -> String {
        let o = &self.ours;
        let digest = |on: bool| if on { "CRC32C,None" } else { "None" };
        match key {
            "HeaderDigest" => {
                digest(o.header_digest && self.transport == TransportKind::Tcp).into()
            }
            "DataDigest" => digest(o.data_digest && self.transport == TransportKind::Tcp).into(),
            // One connection per session: MC/S is not implemented (RFC 7143 §13.2).
            "MaxConnections" => "1".into(),
            // iSER: one receive buffer per command is posted, and solicited data moves by
            // RDMA READ, so unsolicited Data-Out SENDs are not invited (the result is an OR).
            "InitialR2T" => yes_no(o.initial_r2t || self.transport == TransportKind::Iser).into(),
            "ImmediateData" => yes_no(o.immediate_data).into(),
            "MaxBurstLength" => o.max_burst_length.clamp(512, 16_777_215).to_string(),
            "FirstBurstLength" => o.first_burst_length.clamp(512, 16_777_215).to_string(),
            "DefaultTime2Wait" => o.default_time2wait.min(3600).to_string(),
            "DefaultTime2Retain" => o.default_time2retain.min(3600).to_string(),
            "MaxOutstandingR2T" => o.max_outstanding_r2t.clamp(1, 65535).to_string(),
            "DataPDUInOrder" | "DataSequenceInOrder" => "Yes".into(),
            // Only within-connection recovery level 0 is implemented.
            "ErrorRecoveryLevel" => "0".into(),
            "TaskReporting" => "RFC3720".into(),
            "iSCSIProtocolLevel" => "1".into(),
            "RDMAExtensions" => yes_no(self.transport == TransportKind::Iser).into(),
            "MaxOutstandingUnexpectedPDUs" => "0".into(),
            _ => String::new(),
        }
    }

    /// Answers one key offered during the operational stage (or a security-stage key that
    /// is not an authentication key). Returns the answer to put in the response, if any.
    pub fn respond(&mut self, key: &str, value: &str) -> Result<Option<String>, NegotiationError> {
        if let Some(ans) = obsolete_answer(key) {
            return Ok(Some(ans.to_string()));
        }
        let Some(def) = lookup(key) else {
            return Ok(Some(NOT_UNDERSTOOD.to_string()));
        };
        if !self.seen.insert(key.to_string()) && def.rule != Rule::Declarative {
            return Err(NegotiationError::Renegotiated(key.to_string()));
        }
        if matches!(value, NOT_UNDERSTOOD | IRRELEVANT | REJECT) {
            // An answer to nothing we offered: ignore.
            return Ok(None);
        }
        if def.phase == Phase::FullFeature {
            return Ok(Some(REJECT.to_string()));
        }
        if def.normal_only && self.session_type == SessionType::Discovery {
            return Ok(Some(IRRELEVANT.to_string()));
        }
        let iser = self.transport == TransportKind::Iser;
        if def.iser && !iser {
            return Ok(Some(IRRELEVANT.to_string()));
        }
        match key {
            // Declarations the login state machine handles.
            "InitiatorName" | "TargetName" | "SessionType" => Ok(None),
            "InitiatorAlias" => {
                self.params.initiator_alias = Some(value.to_string());
                Ok(None)
            }
            // Only a target declares these.
            "TargetAlias" | "TargetAddress" | "TargetPortalGroupTag" => {
                Ok(Some(REJECT.to_string()))
            }
            "AuthMethod" => Ok(Some(IRRELEVANT.to_string())),
            "MaxRecvDataSegmentLength" => {
                let Rule::DeclarativeNumber(lo, hi) = def.rule else {
                    unreachable!()
                };
                match parse_number(value) {
                    Some(v) if (lo..=hi).contains(&v) => {
                        self.params.max_xmit_data_segment_length = v as u32;
                        self.declared_mrdsl = true;
                        Ok(Some(self.params.max_recv_data_segment_length.to_string()))
                    }
                    _ => Ok(Some(REJECT.to_string())),
                }
            }
            "TargetRecvDataSegmentLength" | "InitiatorRecvDataSegmentLength" => {
                // Result function Minimum (RFC 7145 §6; LIO answers so, docs/WIRE.md §6).
                // What the target receives is also bounded by its iSER receive buffers.
                let mut ours = self
                    .ours
                    .max_recv_data_segment_length
                    .clamp(512, 16_777_215) as u64;
                if key == "TargetRecvDataSegmentLength" {
                    ours = ours.min(ISER_MAX_RECV_DATA as u64);
                }
                match parse_number(value) {
                    Some(v) if (512..=16_777_215).contains(&v) => {
                        let r = v.min(ours).to_string();
                        self.params.apply(key, &r, false);
                        Ok(Some(r))
                    }
                    _ => Ok(Some(REJECT.to_string())),
                }
            }
            _ => {
                let answer = resolve(def.rule, &self.our_value(key), value);
                if answer != REJECT {
                    self.params.apply(key, &answer, false);
                }
                Ok(Some(answer))
            }
        }
    }

    /// Declarations the target adds to the last operational response.
    pub fn closing_declarations(&mut self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        if !self.declared_mrdsl && self.transport == TransportKind::Tcp {
            self.declared_mrdsl = true;
            out.push((
                "MaxRecvDataSegmentLength".to_string(),
                self.params.max_recv_data_segment_length.to_string(),
            ));
        }
        out
    }

    /// The negotiated values once login completes.
    pub fn finish(&mut self) -> SessionParams {
        let mut p = self.params.clone();
        if self.transport == TransportKind::Iser && p.rdma_extensions {
            // RFC 7145 §6.3: the iSER lengths replace MaxRecvDataSegmentLength.
            p.max_recv_data_segment_length = p.target_recv_data_segment_length;
            p.max_xmit_data_segment_length = p.initiator_recv_data_segment_length;
        }
        p.finish();
        p
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers() {
        assert_eq!(parse_number("8192"), Some(8192));
        assert_eq!(parse_number("0x2000"), Some(8192));
        assert_eq!(parse_number("0X10"), Some(16));
        assert_eq!(parse_number(""), None);
        assert_eq!(parse_number("0x"), None);
        assert_eq!(parse_number("-1"), None);
        assert_eq!(parse_number("12a"), None);
        assert_eq!(parse_number("99999999999999999999999"), None);
    }

    #[test]
    fn result_functions() {
        assert_eq!(resolve(Rule::And, "Yes", "No"), "No");
        assert_eq!(resolve(Rule::And, "Yes", "Yes"), "Yes");
        assert_eq!(resolve(Rule::Or, "No", "Yes"), "Yes");
        assert_eq!(resolve(Rule::Or, "No", "No"), "No");
        assert_eq!(resolve(Rule::Or, "No", "maybe"), REJECT);
        assert_eq!(
            resolve(Rule::Min(512, 16_777_215), "65536", "262144"),
            "65536"
        );
        assert_eq!(resolve(Rule::Min(512, 16_777_215), "65536", "1024"), "1024");
        assert_eq!(resolve(Rule::Min(512, 16_777_215), "65536", "100"), REJECT);
        assert_eq!(resolve(Rule::Max(0, 3600), "2", "5"), "5");
        assert_eq!(resolve(Rule::Max(0, 3600), "2", "0"), "2");
        assert_eq!(resolve(Rule::Max(0, 3600), "2", "3601"), REJECT);
        assert_eq!(resolve(Rule::List, "CRC32C,None", "None,CRC32C"), "None");
        assert_eq!(resolve(Rule::List, "CRC32C,None", "CRC32C"), "CRC32C");
        assert_eq!(resolve(Rule::List, "None", "CRC32C"), REJECT);
        assert_eq!(resolve(Rule::List, "CHAP", "KRB5,CHAP,None"), "CHAP");
    }

    #[test]
    fn originator_accept() {
        assert_eq!(accept(Rule::And, "Yes", "No").as_deref(), Some("No"));
        assert_eq!(accept(Rule::And, "No", "Yes"), None);
        assert_eq!(accept(Rule::Or, "Yes", "No"), None);
        assert_eq!(
            accept(Rule::Min(512, 16_777_215), "65536", "8192").as_deref(),
            Some("8192")
        );
        assert_eq!(accept(Rule::Min(512, 16_777_215), "8192", "65536"), None);
        assert_eq!(accept(Rule::Max(0, 3600), "2", "1"), None);
        assert_eq!(
            accept(Rule::List, "CRC32C,None", "None").as_deref(),
            Some("None")
        );
        assert_eq!(accept(Rule::List, "None", "CRC32C"), None);
        assert_eq!(
            accept(Rule::DeclarativeNumber(512, 16_777_215), "", "100"),
            None
        );
    }

    fn negotiator() -> TargetNegotiator {
        TargetNegotiator::new(
            IscsiParams::default(),
            TransportKind::Tcp,
            SessionType::Normal,
        )
    }

    #[test]
    fn target_answers() {
        let mut n = negotiator();
        let mut r = |k: &str, v: &str| n.respond(k, v).unwrap();
        assert_eq!(r("HeaderDigest", "CRC32C,None").as_deref(), Some("CRC32C"));
        assert_eq!(r("DataDigest", "None").as_deref(), Some("None"));
        assert_eq!(r("MaxConnections", "8").as_deref(), Some("1"));
        assert_eq!(r("InitialR2T", "No").as_deref(), Some("No"));
        assert_eq!(r("ImmediateData", "Yes").as_deref(), Some("Yes"));
        assert_eq!(
            r("MaxRecvDataSegmentLength", "65536").as_deref(),
            Some("262144")
        );
        assert_eq!(r("MaxBurstLength", "16776192").as_deref(), Some("1048576"));
        assert_eq!(r("FirstBurstLength", "262144").as_deref(), Some("65536"));
        assert_eq!(r("DefaultTime2Wait", "0").as_deref(), Some("2"));
        assert_eq!(r("DefaultTime2Retain", "0").as_deref(), Some("0"));
        assert_eq!(r("MaxOutstandingR2T", "8").as_deref(), Some("1"));
        assert_eq!(r("DataPDUInOrder", "No").as_deref(), Some("Yes"));
        assert_eq!(r("DataSequenceInOrder", "No").as_deref(), Some("Yes"));
        assert_eq!(r("ErrorRecoveryLevel", "2").as_deref(), Some("0"));
        assert_eq!(
            r("TaskReporting", "FastAbort,RFC3720").as_deref(),
            Some("RFC3720")
        );
        assert_eq!(r("iSCSIProtocolLevel", "2").as_deref(), Some("1"));
        assert_eq!(r("RDMAExtensions", "Yes").as_deref(), Some("No"));
        assert_eq!(
            r("TargetRecvDataSegmentLength", "8192").as_deref(),
            Some(IRRELEVANT)
        );
        assert_eq!(
            r("MaxOutstandingUnexpectedPDUs", "8").as_deref(),
            Some(IRRELEVANT)
        );
        assert_eq!(r("X-com.example.foo", "1").as_deref(), Some(NOT_UNDERSTOOD));
        assert_eq!(r("X#foo", "1").as_deref(), Some(NOT_UNDERSTOOD));
        assert_eq!(r("IFMarker", "No").as_deref(), Some("No"));
        assert_eq!(r("OFMarkInt", "2048~8192").as_deref(), Some(IRRELEVANT));
        assert_eq!(r("SendTargets", "All").as_deref(), Some(REJECT));
        assert_eq!(r("TargetAlias", "x").as_deref(), Some(REJECT));
        assert_eq!(r("InitiatorAlias", "host").as_deref(), None);
        let p = n.finish();
        assert!(p.header_digest && !p.data_digest && !p.initial_r2t && p.immediate_data);
        assert_eq!(p.max_xmit_data_segment_length, 65536);
        assert_eq!(p.max_recv_data_segment_length, 262_144);
        assert_eq!(
            (p.max_burst_length, p.first_burst_length),
            (1_048_576, 65_536)
        );
        assert_eq!(p.initiator_alias.as_deref(), Some("host"));
    }

    #[test]
    fn renegotiation_is_an_error() {
        let mut n = negotiator();
        n.respond("MaxBurstLength", "4096").unwrap();
        assert!(n.respond("MaxBurstLength", "4096").is_err());
    }

    #[test]
    fn out_of_range() {
        let mut n = negotiator();
        assert_eq!(
            n.respond("MaxBurstLength", "100").unwrap().as_deref(),
            Some(REJECT)
        );
        assert_eq!(
            n.respond("MaxRecvDataSegmentLength", "zz")
                .unwrap()
                .as_deref(),
            Some(REJECT)
        );
        assert_eq!(
            n.respond("ErrorRecoveryLevel", "3").unwrap().as_deref(),
            Some(REJECT)
        );
    }

    #[test]
    fn discovery_irrelevant() {
        let mut n = TargetNegotiator::new(
            IscsiParams::default(),
            TransportKind::Tcp,
            SessionType::Discovery,
        );
        assert_eq!(
            n.respond("InitialR2T", "Yes").unwrap().as_deref(),
            Some(IRRELEVANT)
        );
        assert_eq!(
            n.respond("MaxBurstLength", "512").unwrap().as_deref(),
            Some(IRRELEVANT)
        );
        assert_eq!(
            n.respond("HeaderDigest", "None").unwrap().as_deref(),
            Some("None")
        );
    }

    #[test]
    fn iser_keys() {
        let mut n = TargetNegotiator::new(
            IscsiParams::default(),
            TransportKind::Iser,
            SessionType::Normal,
        );
        assert_eq!(
            n.respond("RDMAExtensions", "Yes").unwrap().as_deref(),
            Some("Yes")
        );
        assert_eq!(
            n.respond("HeaderDigest", "CRC32C,None").unwrap().as_deref(),
            Some("None")
        );
        assert_eq!(
            n.respond("TargetRecvDataSegmentLength", "8192")
                .unwrap()
                .as_deref(),
            Some("8192")
        );
        assert_eq!(
            n.respond("InitiatorRecvDataSegmentLength", "16777215")
                .unwrap()
                .as_deref(),
            Some("262144")
        );
        assert_eq!(
            n.respond("MaxOutstandingUnexpectedPDUs", "8")
                .unwrap()
                .as_deref(),
            Some("0")
        );
        let p = n.finish();
        assert!(p.rdma_extensions);
        assert_eq!(p.max_recv_data_segment_length, 8192);
        assert!(n.closing_declarations().is_empty());
    }

    #[test]
    fn iser_receive_limit() {
        let mut n = TargetNegotiator::new(
            IscsiParams::default(),
            TransportKind::Iser,
            SessionType::Normal,
        );
        assert_eq!(
            n.respond("TargetRecvDataSegmentLength", "262144")
                .unwrap()
                .as_deref(),
            Some("8192")
        );
        assert_eq!(
            TargetNegotiator::new(
                IscsiParams::default(),
                TransportKind::Iser,
                SessionType::Normal
            )
            .respond("TargetRecvDataSegmentLength", "4096")
            .unwrap()
            .as_deref(),
            Some("4096")
        );
    }

    #[test]
    fn first_burst_clamped() {
        let mut p = SessionParams {
            max_burst_length: 4096,
            first_burst_length: 65536,
            ..Default::default()
        };
        p.finish();
        assert_eq!(p.first_burst_length, 4096);
        assert_eq!(p.unsolicited_limit(100_000), 4096);
        p.initial_r2t = true;
        p.immediate_data = false;
        assert_eq!(p.unsolicited_limit(100_000), 0);
    }
}
