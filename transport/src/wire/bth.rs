//! Base Transport Header (IBA 9.2; `rxe_hdr.h` `struct rxe_bth`), 12 bytes.
//!
//! ```text
//! byte 0      OpCode
//! byte 1      SE (0x80) | MigReq (0x40) | PadCnt (0x30) | TVer (0x0F)
//! bytes 2-3   P_Key
//! byte 4      FECN (0x80) | BECN (0x40) | reserved (0x3F)
//! bytes 5-7   DestQP
//! byte 8      AckReq (0x80) | reserved (0x7F)
//! bytes 9-11  PSN
//! ```

use core::fmt;

use super::{be, Bits, Error, Field, Opcode, OpcodeInfo, Result, U24_MASK};

/// Length of the BTH.
pub const HEADER_LEN: usize = 12;

// Here rather than with the opcode table, which the BTH builds on and which knows only the
// extension headers that follow it.
impl OpcodeInfo {
    /// Length of BTH plus extension headers.
    pub const fn header_len(&self) -> usize {
        HEADER_LEN + self.headers.byte_len()
    }
}
/// The only transport header version (rxe drops anything else).
pub const TVER: u8 = 0;
/// The default partition key, full membership (`IB_DEFAULT_PKEY_FULL`); rxe always sends it.
pub const DEFAULT_PKEY: u16 = 0xFFFF;

/// `psn + n` modulo 2^24.
pub const fn psn_add(psn: u32, n: u32) -> u32 {
    psn.wrapping_add(n) & U24_MASK
}

/// The signed distance `a − b` between two PSNs in 24-bit serial arithmetic (`rxe_hdr.h`
/// `psn_compare`): negative when `a` is before `b`, within ±2^23.
pub const fn psn_diff(a: u32, b: u32) -> i32 {
    (a.wrapping_sub(b) << 8) as i32 >> 8
}

mod field {
    use super::{Bits, Field};

    pub const OPCODE: usize = 0;
    pub const SE: Bits = Bits::new(1, 0x80);
    pub const MIG_REQ: Bits = Bits::new(1, 0x40);
    pub const PAD_COUNT: Bits = Bits::new(1, 0x30);
    pub const TVER: Bits = Bits::new(1, 0x0F);
    pub const PKEY: Field = 2..4;
    pub const FECN: Bits = Bits::new(4, 0x80);
    pub const BECN: Bits = Bits::new(4, 0x40);
    pub const RESV6: Bits = Bits::new(4, 0x3F);
    pub const DEST_QP: Field = 5..8;
    pub const ACK_REQ: Bits = Bits::new(8, 0x80);
    pub const RESV7: Bits = Bits::new(8, 0x7F);
    pub const PSN: Field = 9..12;
}

/// A read/write view of a BTH.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wraps a buffer without checking its length.
    pub const fn new_unchecked(buffer: T) -> Packet<T> {
        Packet { buffer }
    }

    /// Wraps a buffer and checks that it holds a whole BTH.
    pub fn new_checked(buffer: T) -> Result<Packet<T>> {
        let packet = Self::new_unchecked(buffer);
        packet.check_len()?;
        Ok(packet)
    }

    /// Checks that no accessor will panic.
    pub fn check_len(&self) -> Result<()> {
        if self.buffer.as_ref().len() < HEADER_LEN {
            Err(Error)
        } else {
            Ok(())
        }
    }

    pub fn into_inner(self) -> T {
        self.buffer
    }

    pub fn opcode(&self) -> Opcode {
        Opcode::from(self.buffer.as_ref()[field::OPCODE])
    }

    /// Solicited Event.
    pub fn solicited(&self) -> bool {
        field::SE.get_bool(self.buffer.as_ref())
    }

    /// MigReq. rxe sends 0 and ignores it; hardware RoCE sends 1.
    pub fn mig_req(&self) -> bool {
        field::MIG_REQ.get_bool(self.buffer.as_ref())
    }

    /// Number of pad bytes (0..=3) between payload and ICRC.
    pub fn pad_count(&self) -> u8 {
        field::PAD_COUNT.get(self.buffer.as_ref())
    }

    /// Transport header version.
    pub fn tver(&self) -> u8 {
        field::TVER.get(self.buffer.as_ref())
    }

    pub fn pkey(&self) -> u16 {
        be::u16(&self.buffer.as_ref()[field::PKEY])
    }

    pub fn fecn(&self) -> bool {
        field::FECN.get_bool(self.buffer.as_ref())
    }

    pub fn becn(&self) -> bool {
        field::BECN.get_bool(self.buffer.as_ref())
    }

    /// The six reserved bits of byte 4 (covered by the ICRC as ones).
    pub fn resv6(&self) -> u8 {
        field::RESV6.get(self.buffer.as_ref())
    }

    /// Destination QP number (24 bits).
    pub fn dest_qp(&self) -> u32 {
        be::u24(&self.buffer.as_ref()[field::DEST_QP])
    }

    /// Acknowledge Request.
    pub fn ack_req(&self) -> bool {
        field::ACK_REQ.get_bool(self.buffer.as_ref())
    }

    /// The seven reserved bits of byte 8.
    pub fn resv7(&self) -> u8 {
        field::RESV7.get(self.buffer.as_ref())
    }

    /// Packet sequence number (24 bits).
    pub fn psn(&self) -> u32 {
        be::u24(&self.buffer.as_ref()[field::PSN])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    pub fn set_opcode(&mut self, value: Opcode) {
        self.buffer.as_mut()[field::OPCODE] = value.into();
    }

    pub fn set_solicited(&mut self, value: bool) {
        field::SE.set_bool(self.buffer.as_mut(), value)
    }

    pub fn set_mig_req(&mut self, value: bool) {
        field::MIG_REQ.set_bool(self.buffer.as_mut(), value)
    }

    /// Sets PadCnt; only the low two bits are kept.
    pub fn set_pad_count(&mut self, value: u8) {
        field::PAD_COUNT.set(self.buffer.as_mut(), value)
    }

    pub fn set_tver(&mut self, value: u8) {
        field::TVER.set(self.buffer.as_mut(), value)
    }

    pub fn set_pkey(&mut self, value: u16) {
        be::set_u16(&mut self.buffer.as_mut()[field::PKEY], value)
    }

    pub fn set_fecn(&mut self, value: bool) {
        field::FECN.set_bool(self.buffer.as_mut(), value)
    }

    pub fn set_becn(&mut self, value: bool) {
        field::BECN.set_bool(self.buffer.as_mut(), value)
    }

    pub fn set_resv6(&mut self, value: u8) {
        field::RESV6.set(self.buffer.as_mut(), value)
    }

    /// Sets DestQP; bits above 24 are dropped.
    pub fn set_dest_qp(&mut self, value: u32) {
        be::set_u24(&mut self.buffer.as_mut()[field::DEST_QP], value)
    }

    pub fn set_ack_req(&mut self, value: bool) {
        field::ACK_REQ.set_bool(self.buffer.as_mut(), value)
    }

    pub fn set_resv7(&mut self, value: u8) {
        field::RESV7.set(self.buffer.as_mut(), value)
    }

    /// Sets the PSN; bits above 24 are dropped.
    pub fn set_psn(&mut self, value: u32) {
        be::set_u24(&mut self.buffer.as_mut()[field::PSN], value)
    }
}

impl<T: AsRef<[u8]>> AsRef<[u8]> for Packet<T> {
    fn as_ref(&self) -> &[u8] {
        self.buffer.as_ref()
    }
}

/// The decoded BTH. TVer is always 0 and the reserved bits are not kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    pub opcode: Opcode,
    pub solicited: bool,
    pub mig_req: bool,
    pub pad_count: u8,
    pub pkey: u16,
    pub fecn: bool,
    pub becn: bool,
    pub dest_qp: u32,
    pub ack_req: bool,
    pub psn: u32,
}

impl Repr {
    /// Decodes a BTH; fails on a TVer other than 0 (IBA 9.2, `rxe_recv.c` `hdr_check`).
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<Repr> {
        packet.check_len()?;
        if packet.tver() != TVER {
            return Err(Error);
        }
        Ok(Repr {
            opcode: packet.opcode(),
            solicited: packet.solicited(),
            mig_req: packet.mig_req(),
            pad_count: packet.pad_count(),
            pkey: packet.pkey(),
            fecn: packet.fecn(),
            becn: packet.becn(),
            dest_qp: packet.dest_qp(),
            ack_req: packet.ack_req(),
            psn: packet.psn(),
        })
    }

    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes every bit of the header (reserved bits and TVer as zero). `dest_qp` and `psn` are
    /// truncated to 24 bits and `pad_count` to 2.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_opcode(self.opcode);
        let b = packet.buffer.as_mut();
        b[1] = 0;
        b[4] = 0;
        b[8] = 0;
        packet.set_solicited(self.solicited);
        packet.set_mig_req(self.mig_req);
        packet.set_pad_count(self.pad_count);
        packet.set_tver(TVER);
        packet.set_pkey(self.pkey);
        packet.set_fecn(self.fecn);
        packet.set_becn(self.becn);
        packet.set_dest_qp(self.dest_qp & U24_MASK);
        packet.set_ack_req(self.ack_req);
        packet.set_psn(self.psn & U24_MASK);
    }
}

impl fmt::Display for Repr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "BTH op={:?} qp={:#x} psn={:#x} pkey={:#x}{}{}{} pad={}",
            self.opcode,
            self.dest_qp,
            self.psn,
            self.pkey,
            if self.ack_req { " A" } else { "" },
            if self.solicited { " SE" } else { "" },
            if self.mig_req { " M" } else { "" },
            self.pad_count,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // RC SEND_ONLY to QP 0x11, AckReq, PSN 0x123456 (the docs/WIRE.md §2 test vector's BTH).
    static BYTES: [u8; 12] = [
        0x04, 0x00, 0xff, 0xff, 0x00, 0x00, 0x00, 0x11, 0x80, 0x12, 0x34, 0x56,
    ];

    fn repr() -> Repr {
        Repr {
            opcode: Opcode::RcSendOnly,
            solicited: false,
            mig_req: false,
            pad_count: 0,
            pkey: DEFAULT_PKEY,
            fecn: false,
            becn: false,
            dest_qp: 0x11,
            ack_req: true,
            psn: 0x12_3456,
        }
    }

    #[test]
    fn parse() {
        let p = Packet::new_checked(&BYTES[..]).unwrap();
        assert_eq!(p.opcode(), Opcode::RcSendOnly);
        assert_eq!(p.dest_qp(), 0x11);
        assert!(p.ack_req());
        assert_eq!(p.psn(), 0x12_3456);
        assert_eq!(Repr::parse(&p).unwrap(), repr());
    }

    #[test]
    fn emit() {
        let mut buf = [0xa5u8; 12];
        repr().emit(&mut Packet::new_unchecked(&mut buf[..]));
        assert_eq!(buf, BYTES);
    }

    #[test]
    fn emit_all_bits() {
        let r = Repr {
            opcode: Opcode::UcRdmaWriteLast,
            solicited: true,
            mig_req: true,
            pad_count: 3,
            pkey: 0x7fff,
            fecn: true,
            becn: true,
            dest_qp: 0xab_cdef,
            ack_req: false,
            psn: 0xff_ffff,
        };
        let mut buf = [0xa5u8; 12];
        r.emit(&mut Packet::new_unchecked(&mut buf[..]));
        assert_eq!(
            buf,
            [0x28, 0xf0, 0x7f, 0xff, 0xc0, 0xab, 0xcd, 0xef, 0x00, 0xff, 0xff, 0xff]
        );
        assert_eq!(
            Repr::parse(&Packet::new_checked(&buf[..]).unwrap()).unwrap(),
            r
        );
    }

    #[test]
    fn psn_arithmetic() {
        assert_eq!(psn_add(0xff_fffe, 3), 1);
        assert_eq!(psn_diff(1, 0xff_fffe), 3);
        assert_eq!(psn_diff(0xff_fffe, 1), -3);
        assert_eq!(psn_diff(5, 5), 0);
        assert_eq!(psn_diff(0x7f_ffff, 0), 0x7f_ffff);
        assert_eq!(psn_diff(0x80_0000, 0), -0x80_0000);
    }

    #[test]
    fn truncated() {
        assert_eq!(Packet::new_checked(&BYTES[..11]).unwrap_err(), Error);
    }

    #[test]
    fn bad_field() {
        let mut b = BYTES;
        b[1] |= 0x01; // TVer 1
        let p = Packet::new_checked(&b[..]).unwrap();
        assert_eq!(p.tver(), 1);
        assert_eq!(Repr::parse(&p), Err(Error));
    }

    #[test]
    fn reserved_bits_ignored() {
        let mut b = BYTES;
        b[4] |= 0x3f;
        b[8] |= 0x7f;
        let p = Packet::new_checked(&b[..]).unwrap();
        assert_eq!((p.resv6(), p.resv7()), (0x3f, 0x7f));
        assert_eq!(Repr::parse(&p).unwrap(), repr());
    }
}
