//! BTH opcodes and the table that drives header parsing.
//!
//! An opcode is a transport base (RC 0x00, UC 0x20, RD 0x40, UD 0x60, CNP 0x80; IBA 9.2.1
//! Table 38, `include/rdma/ib_pack.h`) plus an operation. Which extension headers follow the BTH,
//! and in which order, is fixed by the opcode (`rxe_opcode.c`); [`Opcode::info`] returns that
//! layout together with the classification the transport engines need (first/middle/last/only,
//! payload, request or response, completion and receive-WQE semantics).
//!
//! Reliable Datagram opcodes (0x40..0x5F) are not supported (rxe rejects RD QPs as well) and map
//! to [`Opcode::Unknown`] with no table entry.

use bitflags::bitflags;

enum_with_unknown! {
    /// The BTH OpCode (IBA 9.2.1 Table 38; `include/rdma/ib_pack.h`).
    pub enum Opcode(u8) {
        RcSendFirst = 0x00,
        RcSendMiddle = 0x01,
        RcSendLast = 0x02,
        RcSendLastWithImmediate = 0x03,
        RcSendOnly = 0x04,
        RcSendOnlyWithImmediate = 0x05,
        RcRdmaWriteFirst = 0x06,
        RcRdmaWriteMiddle = 0x07,
        RcRdmaWriteLast = 0x08,
        RcRdmaWriteLastWithImmediate = 0x09,
        RcRdmaWriteOnly = 0x0a,
        RcRdmaWriteOnlyWithImmediate = 0x0b,
        RcRdmaReadRequest = 0x0c,
        RcRdmaReadResponseFirst = 0x0d,
        RcRdmaReadResponseMiddle = 0x0e,
        RcRdmaReadResponseLast = 0x0f,
        RcRdmaReadResponseOnly = 0x10,
        RcAcknowledge = 0x11,
        RcAtomicAcknowledge = 0x12,
        RcCompareSwap = 0x13,
        RcFetchAdd = 0x14,
        RcSendLastWithInvalidate = 0x16,
        RcSendOnlyWithInvalidate = 0x17,
        /// FLUSH (IBA 1.5 memory placement extensions; newer `rxe_opcode.c`).
        RcFlush = 0x1c,
        /// ATOMIC WRITE (IBA 1.5 memory placement extensions; newer `rxe_opcode.c`).
        RcAtomicWrite = 0x1d,
        UcSendFirst = 0x20,
        UcSendMiddle = 0x21,
        UcSendLast = 0x22,
        UcSendLastWithImmediate = 0x23,
        UcSendOnly = 0x24,
        UcSendOnlyWithImmediate = 0x25,
        UcRdmaWriteFirst = 0x26,
        UcRdmaWriteMiddle = 0x27,
        UcRdmaWriteLast = 0x28,
        UcRdmaWriteLastWithImmediate = 0x29,
        UcRdmaWriteOnly = 0x2a,
        UcRdmaWriteOnlyWithImmediate = 0x2b,
        UdSendOnly = 0x64,
        UdSendOnlyWithImmediate = 0x65,
        /// RoCEv2 Congestion Notification Packet (IBA Annex A17.9.2): BTH, 16 reserved bytes,
        /// ICRC. rxe neither sends nor handles it.
        Cnp = 0x81,
    }
}

impl Opcode {
    /// The layout and classification of this opcode, or `None` for opcodes this stack does not
    /// know (reserved, RD, manufacturer specific).
    #[inline]
    pub fn info(self) -> Option<&'static OpcodeInfo> {
        TABLE[u8::from(self) as usize].as_ref()
    }
}

/// The transport service an opcode belongs to (the top three bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Transport {
    /// Reliable Connection.
    Rc,
    /// Unreliable Connection.
    Uc,
    /// Unreliable Datagram (also the GSI QP1 that carries CM MADs).
    Ud,
    /// Congestion notification (RoCEv2).
    Cnp,
}

/// What a packet does, independent of its place in a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Operation {
    Send,
    RdmaWrite,
    RdmaReadRequest,
    RdmaReadResponse,
    Acknowledge,
    AtomicAcknowledge,
    CompareSwap,
    FetchAdd,
    Flush,
    AtomicWrite,
    Cnp,
}

/// The packet's place in its message (rxe's START/MIDDLE/END masks).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Position {
    First,
    Middle,
    Last,
    Only,
}

impl Position {
    /// The packet starts a message (FIRST or ONLY).
    pub const fn is_start(self) -> bool {
        matches!(self, Position::First | Position::Only)
    }

    /// The packet ends a message (LAST or ONLY).
    pub const fn is_end(self) -> bool {
        matches!(self, Position::Last | Position::Only)
    }
}

bitflags! {
    /// Extension headers that follow the BTH. The flags are declared in wire order: when an
    /// opcode carries several, they appear in the order of their bits (DETH before ImmDt,
    /// FETH before RETH, RETH before ImmDt, AETH before AtomicAckETH; `rxe_opcode.c`).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub struct ExtHeaders: u16 {
        /// Datagram ETH, 8 bytes.
        const DETH = 1 << 0;
        /// FLUSH ETH, 4 bytes.
        const FETH = 1 << 1;
        /// RDMA ETH, 16 bytes.
        const RETH = 1 << 2;
        /// Atomic ETH, 28 bytes.
        const ATOMIC_ETH = 1 << 3;
        /// ACK ETH, 4 bytes.
        const AETH = 1 << 4;
        /// Atomic ACK ETH, 8 bytes.
        const ATOMIC_ACK_ETH = 1 << 5;
        /// Immediate data, 4 bytes.
        const IMM_DT = 1 << 6;
        /// Invalidate ETH, 4 bytes.
        const IETH = 1 << 7;
        /// The 16 reserved bytes of a RoCEv2 CNP.
        const CNP_RESERVED = 1 << 8;
    }
}

/// Size of each extension header, indexed by bit position.
const EXT_SIZES: [usize; 9] = [
    crate::wire::deth::HEADER_LEN,
    crate::wire::feth::HEADER_LEN,
    crate::wire::reth::HEADER_LEN,
    crate::wire::atomic_eth::HEADER_LEN,
    crate::wire::aeth::HEADER_LEN,
    crate::wire::atomic_ack_eth::HEADER_LEN,
    crate::wire::immdt::HEADER_LEN,
    crate::wire::ieth::HEADER_LEN,
    CNP_RESERVED_LEN,
];

/// Length of the reserved area after the BTH of a CNP (IBA Annex A17.9.2).
pub const CNP_RESERVED_LEN: usize = 16;

impl ExtHeaders {
    /// Total length in bytes of the headers in the set.
    pub const fn byte_len(self) -> usize {
        let bits = self.bits();
        let mut total = 0;
        let mut i = 0;
        while i < EXT_SIZES.len() {
            if bits & (1 << i) != 0 {
                total += EXT_SIZES[i];
            }
            i += 1;
        }
        total
    }

    /// Offset of `header` (a single flag) from the end of the BTH, or `None` when the set does
    /// not contain it.
    pub const fn offset_of(self, header: ExtHeaders) -> Option<usize> {
        let h = header.bits();
        if h.count_ones() != 1 || self.bits() & h == 0 {
            return None;
        }
        let below = ExtHeaders::from_bits_retain(self.bits() & (h - 1));
        Some(below.byte_len())
    }
}

bitflags! {
    /// Properties of an opcode (after rxe's opcode masks).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub struct OpFlags: u16 {
        /// The packet may carry payload (and therefore pad).
        const PAYLOAD = 1 << 0;
        /// Sent by a requester (SEND, WRITE, READ request, atomics, FLUSH).
        const REQUEST = 1 << 1;
        /// Sent by a responder (ACK, READ response, atomic ACK).
        const RESPONSE = 1 << 2;
        /// Carries immediate data that the receive completion reports.
        const IMMEDIATE = 1 << 3;
        /// Carries an R_Key for the responder to invalidate.
        const INVALIDATE = 1 << 4;
        /// Ends a message that produces a receive completion (rxe COMP_MASK).
        const COMPLETES = 1 << 5;
        /// Consumes a receive WQE at the responder (rxe RWR_MASK).
        const CONSUMES_RECV_WQE = 1 << 6;
    }
}

/// Layout and classification of one opcode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct OpcodeInfo {
    pub transport: Transport,
    pub operation: Operation,
    pub position: Position,
    /// Extension headers after the BTH, in wire order.
    pub headers: ExtHeaders,
    pub flags: OpFlags,
}

impl OpcodeInfo {
    pub const fn has_payload(&self) -> bool {
        self.flags.contains(OpFlags::PAYLOAD)
    }

    pub const fn is_request(&self) -> bool {
        self.flags.contains(OpFlags::REQUEST)
    }

    pub const fn is_response(&self) -> bool {
        self.flags.contains(OpFlags::RESPONSE)
    }

    /// Whether a requester must set AckReq on this packet: the last packet of every RC
    /// request message. rxe's responder sends an ACK only for packets with AckReq set (or when
    /// a NAK is pending), so leaving it clear stalls the connection (`rxe_req.c`,
    /// `rxe_resp.c`). A requester may set it on other RC request packets too (rxe does every
    /// 64 packets).
    pub const fn requires_ack_req(&self) -> bool {
        matches!(self.transport, Transport::Rc) && self.is_request() && self.position.is_end()
    }

    /// Whether the responder answers with data rather than a plain ACK: READ requests (READ
    /// responses) and atomics (ATOMIC ACKNOWLEDGE). These are answered whatever AckReq says.
    pub const fn expects_data_response(&self) -> bool {
        matches!(
            self.operation,
            Operation::RdmaReadRequest | Operation::CompareSwap | Operation::FetchAdd
        )
    }
}

/// One entry per opcode byte.
static TABLE: [Option<OpcodeInfo>; 256] = {
    let mut table = [None; 256];
    let mut op = 0;
    while op < 256 {
        table[op] = lookup(op as u8);
        op += 1;
    }
    table
};

/// The operations shared by RC and UC (low five bits 0x00..=0x0B).
const fn send_write(low: u8) -> Option<(Operation, Position, ExtHeaders, OpFlags)> {
    const NONE: ExtHeaders = ExtHeaders::empty();
    const RETH: ExtHeaders = ExtHeaders::RETH;
    const IMM: ExtHeaders = ExtHeaders::IMM_DT;
    const RQ: OpFlags = OpFlags::PAYLOAD.union(OpFlags::REQUEST);
    const CMP: OpFlags = OpFlags::COMPLETES;
    const RWR: OpFlags = OpFlags::CONSUMES_RECV_WQE;
    const IMMF: OpFlags = OpFlags::IMMEDIATE;
    use Operation::{RdmaWrite, Send};
    use Position::{First, Last, Middle, Only};
    Some(match low {
        0x00 => (Send, First, NONE, RQ.union(RWR)),
        0x01 => (Send, Middle, NONE, RQ),
        0x02 => (Send, Last, NONE, RQ.union(CMP)),
        0x03 => (Send, Last, IMM, RQ.union(CMP).union(IMMF)),
        0x04 => (Send, Only, NONE, RQ.union(CMP).union(RWR)),
        0x05 => (Send, Only, IMM, RQ.union(CMP).union(RWR).union(IMMF)),
        0x06 => (RdmaWrite, First, RETH, RQ),
        0x07 => (RdmaWrite, Middle, NONE, RQ),
        0x08 => (RdmaWrite, Last, NONE, RQ),
        0x09 => (RdmaWrite, Last, IMM, RQ.union(CMP).union(RWR).union(IMMF)),
        0x0a => (RdmaWrite, Only, RETH, RQ),
        0x0b => (
            RdmaWrite,
            Only,
            RETH.union(IMM),
            RQ.union(CMP).union(RWR).union(IMMF),
        ),
        _ => return None,
    })
}

/// The RC-only operations (low five bits 0x0C..=0x1D).
const fn rc_only(low: u8) -> Option<(Operation, Position, ExtHeaders, OpFlags)> {
    const NONE: OpFlags = OpFlags::empty();
    const P: OpFlags = OpFlags::PAYLOAD;
    const REQ: OpFlags = OpFlags::REQUEST;
    const RSP: OpFlags = OpFlags::RESPONSE;
    const AETH: ExtHeaders = ExtHeaders::AETH;
    use Operation::*;
    use Position::{First, Last, Middle, Only};
    let inv = OpFlags::PAYLOAD
        .union(OpFlags::REQUEST)
        .union(OpFlags::COMPLETES)
        .union(OpFlags::INVALIDATE);
    Some(match low {
        0x0c => (RdmaReadRequest, Only, ExtHeaders::RETH, REQ),
        0x0d => (RdmaReadResponse, First, AETH, P.union(RSP)),
        0x0e => (RdmaReadResponse, Middle, ExtHeaders::empty(), P.union(RSP)),
        0x0f => (RdmaReadResponse, Last, AETH, P.union(RSP)),
        0x10 => (RdmaReadResponse, Only, AETH, P.union(RSP)),
        0x11 => (Acknowledge, Only, AETH, RSP.union(NONE)),
        0x12 => (
            AtomicAcknowledge,
            Only,
            AETH.union(ExtHeaders::ATOMIC_ACK_ETH),
            RSP,
        ),
        0x13 => (CompareSwap, Only, ExtHeaders::ATOMIC_ETH, REQ),
        0x14 => (FetchAdd, Only, ExtHeaders::ATOMIC_ETH, REQ),
        0x16 => (Send, Last, ExtHeaders::IETH, inv),
        0x17 => (
            Send,
            Only,
            ExtHeaders::IETH,
            inv.union(OpFlags::CONSUMES_RECV_WQE),
        ),
        0x1c => (Flush, Only, ExtHeaders::FETH.union(ExtHeaders::RETH), REQ),
        0x1d => (AtomicWrite, Only, ExtHeaders::RETH, P.union(REQ)),
        _ => return None,
    })
}

const fn lookup(op: u8) -> Option<OpcodeInfo> {
    let low = op & 0x1f;
    let (transport, entry) = match op >> 5 {
        0 => match send_write(low) {
            Some(e) => (Transport::Rc, Some(e)),
            None => (Transport::Rc, rc_only(low)),
        },
        1 => (Transport::Uc, send_write(low)),
        3 => {
            let send = OpFlags::PAYLOAD
                .union(OpFlags::REQUEST)
                .union(OpFlags::COMPLETES)
                .union(OpFlags::CONSUMES_RECV_WQE);
            let entry = match low {
                0x04 => Some((Operation::Send, Position::Only, ExtHeaders::DETH, send)),
                0x05 => Some((
                    Operation::Send,
                    Position::Only,
                    ExtHeaders::DETH.union(ExtHeaders::IMM_DT),
                    send.union(OpFlags::IMMEDIATE),
                )),
                _ => None,
            };
            (Transport::Ud, entry)
        }
        4 if low == 0x01 => (
            Transport::Cnp,
            Some((
                Operation::Cnp,
                Position::Only,
                ExtHeaders::CNP_RESERVED,
                OpFlags::empty(),
            )),
        ),
        _ => return None,
    };
    match entry {
        Some((operation, position, headers, flags)) => Some(OpcodeInfo {
            transport,
            operation,
            position,
            headers,
            flags,
        }),
        None => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_all_bytes() {
        for b in 0..=255u8 {
            let op = Opcode::from(b);
            assert_eq!(u8::from(op), b);
            assert_eq!(
                op.info().is_some(),
                !matches!(op, Opcode::Unknown(_)),
                "{b:#x}"
            );
        }
    }

    #[test]
    fn header_lengths_match_rxe() {
        // Expected BTH + extension header lengths from rxe_opcode.c.
        let cases: &[(Opcode, usize)] = &[
            (Opcode::RcSendFirst, 12),
            (Opcode::RcSendLastWithImmediate, 16),
            (Opcode::RcRdmaWriteFirst, 28),
            (Opcode::RcRdmaWriteOnlyWithImmediate, 32),
            (Opcode::RcRdmaReadRequest, 28),
            (Opcode::RcRdmaReadResponseMiddle, 12),
            (Opcode::RcRdmaReadResponseLast, 16),
            (Opcode::RcAcknowledge, 16),
            (Opcode::RcAtomicAcknowledge, 24),
            (Opcode::RcCompareSwap, 40),
            (Opcode::RcSendOnlyWithInvalidate, 16),
            (Opcode::RcFlush, 32),
            (Opcode::RcAtomicWrite, 28),
            (Opcode::UcRdmaWriteOnlyWithImmediate, 32),
            (Opcode::UdSendOnly, 20),
            (Opcode::UdSendOnlyWithImmediate, 24),
            (Opcode::Cnp, 28),
        ];
        for &(op, len) in cases {
            assert_eq!(op.info().unwrap().header_len(), len, "{op:?}");
        }
    }

    #[test]
    fn header_order() {
        let wo = Opcode::RcRdmaWriteOnlyWithImmediate.info().unwrap().headers;
        assert_eq!(wo.offset_of(ExtHeaders::RETH), Some(0));
        assert_eq!(wo.offset_of(ExtHeaders::IMM_DT), Some(16));
        assert_eq!(wo.offset_of(ExtHeaders::AETH), None);
        let aa = Opcode::RcAtomicAcknowledge.info().unwrap().headers;
        assert_eq!(aa.offset_of(ExtHeaders::AETH), Some(0));
        assert_eq!(aa.offset_of(ExtHeaders::ATOMIC_ACK_ETH), Some(4));
        let fl = Opcode::RcFlush.info().unwrap().headers;
        assert_eq!(fl.offset_of(ExtHeaders::FETH), Some(0));
        assert_eq!(fl.offset_of(ExtHeaders::RETH), Some(4));
        let ud = Opcode::UdSendOnlyWithImmediate.info().unwrap().headers;
        assert_eq!(ud.offset_of(ExtHeaders::IMM_DT), Some(8));
        // Not a single flag.
        assert_eq!(wo.offset_of(wo), None);
    }

    #[test]
    fn classification() {
        let i = Opcode::RcSendLast.info().unwrap();
        assert_eq!(i.transport, Transport::Rc);
        assert_eq!(i.position, Position::Last);
        assert!(i.requires_ack_req() && i.has_payload());
        assert!(!Opcode::RcSendMiddle.info().unwrap().requires_ack_req());
        assert!(!Opcode::UcSendLast.info().unwrap().requires_ack_req());
        assert!(!Opcode::RcAcknowledge.info().unwrap().has_payload());
        assert!(Opcode::RcRdmaReadRequest
            .info()
            .unwrap()
            .expects_data_response());
        assert!(Opcode::RcRdmaReadRequest.info().unwrap().requires_ack_req());
        let inv = Opcode::RcSendOnlyWithInvalidate.info().unwrap();
        assert!(inv
            .flags
            .contains(OpFlags::INVALIDATE | OpFlags::CONSUMES_RECV_WQE));
        assert_eq!(Opcode::from(0x15), Opcode::Unknown(0x15));
        assert!(Opcode::from(0x40).info().is_none());
        assert!(Opcode::from(0x80).info().is_none());
    }
}
