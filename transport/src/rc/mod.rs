//! The transport engine, split by role as in rxe: [`requester`] (send queue → request
//! packets), [`responder`] (request packets → memory, receive completions, ACK/NAK and READ
//! responses) and [`completer`] (responses → send completions, retransmission). [`ud`] is the
//! datagram path of UD and GSI QPs.
//!
//! Everything here is pure logic over the device's tables: packets come in through
//! `receive`, timers and the send queues run in `poll_qp` (both driven by
//! [`crate::verbs::Device`], through the [`Device::receive`] and [`Device::poll`] this module
//! defines), and packets go out as whole IP
//! datagrams into the device's bounded transmit queue. Time is a `Duration` since an arbitrary
//! epoch given by the caller, so tests can run on a virtual clock. No packet from the wire can
//! make this code panic: every header goes through the wire module's checked views, and all
//! lengths and offsets are checked before use.

pub mod completer;
mod place;
pub mod requester;
pub mod responder;
pub mod ud;

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::verbs::device::{Engine, Outgoing, Tx};
use crate::verbs::mr::{KeyKind, MrError, MrTable};
use crate::verbs::qp::QpCtx;
use crate::verbs::Region;
use crate::verbs::{Access, AddressVector, Device, QpState, QpType, Sge};
use crate::wire::{datagram, icrc, ipv4, ipv6, roce, Datagram, IpRepr, RoceRepr};

/// ACK requests are forced after this many packets without one (rxe `RXE_MAX_PKT_PER_ACK`).
pub const MAX_PKT_PER_ACK: u32 = 64;

/// How many PSNs a requester may have unacknowledged. rxe stops at a fixed 128
/// (`RXE_MAX_UNACKED_PSNS`): four 128 KiB messages at a 4 KiB MTU, so a stream of larger or
/// more messages sends a burst, then idles a round trip for the ACK. Here the window starts
/// at that and grows while ACKs come back, by a quarter of what each ACK acknowledges (about
/// 1.25x per round trip), up to [`window::MAX`]; a retransmission (sequence NAK or timeout,
/// which on this transport mean a lost packet) halves it, never below [`window::MIN`]. Go-back-N
/// resends at most one window, and nothing is buffered for it (packets are rebuilt from the
/// send queue), so a larger window costs no memory.
pub mod window {
    use crate::verbs::qp::QpCtx;

    /// The starting and smallest window (rxe's fixed one).
    pub const MIN: u32 = 128;
    /// The largest window.
    pub const MAX: u32 = 1024;

    /// `acked` more PSNs were acknowledged.
    pub(crate) fn grow(qp: &mut QpCtx, acked: u32) {
        qp.req.window = (qp.req.window + acked.div_ceil(4)).min(MAX);
    }

    /// A packet was lost.
    pub(crate) fn shrink(qp: &mut QpCtx) {
        qp.req.window = (qp.req.window / 2).max(MIN);
    }
}
/// Packets a QP may generate per poll (fairness between QPs).
pub const POLL_BUDGET: usize = 256;

/// The retransmit timeout for an encoded local ACK timeout: 4.096 µs × 2^timeout, `None` for 0.
pub fn ack_timeout(timeout: u8) -> Option<Duration> {
    if timeout == 0 {
        None
    } else {
        Some(Duration::from_nanos(4096u64 << timeout.min(31)))
    }
}

/// Builds a datagram around `repr` from the QP's address and queues it. `fill` writes the
/// payload; returns false if the packet could not be built (it is then not sent).
pub(crate) fn emit(
    eng: &mut Engine,
    av: &AddressVector,
    sport: u16,
    repr: &RoceRepr,
    fill: impl FnOnce(&mut [u8]) -> bool,
) -> bool {
    emit_to(&eng.gids, &mut eng.tx, av, sport, repr, fill)
}

/// The IP header fields of a datagram from our GID `av.sgid_index` to `av.dest`.
fn ip_for(gids: &[crate::verbs::Gid], av: &AddressVector) -> Option<IpRepr> {
    let src = gids.get(av.sgid_index as usize).map(|g| g.to_ip())?;
    match (src, av.dest) {
        (IpAddr::V4(s), IpAddr::V4(d)) => Some(IpRepr::V4(ipv4::Repr {
            src_addr: s,
            dst_addr: d,
            protocol: ipv4::PROTOCOL_UDP,
            payload_len: 0,
            ttl: av.hop_limit,
            tos: av.traffic_class,
            // Linux gives an unconnected DF socket's packets ID 0 (docs/WIRE.md §8).
            ident: 0,
            dont_frag: true,
        })),
        (IpAddr::V6(s), IpAddr::V6(d)) => Some(IpRepr::V6(ipv6::Repr {
            src_addr: s,
            dst_addr: d,
            next_header: ipv4::PROTOCOL_UDP,
            payload_len: 0,
            hop_limit: av.hop_limit,
            traffic_class: av.traffic_class,
            flow_label: av.flow_label & 0xF_FFFF,
        })),
        _ => None,
    }
}

/// A datagram's layout: its length and where its payload lies.
fn layout(ip: &IpRepr, repr: &RoceRepr) -> (usize, std::ops::Range<usize>) {
    let len = ip.header_len() + crate::wire::udp::HEADER_LEN + repr.buffer_len();
    let end = len - roce::ICRC_LEN - repr.pad_len();
    (len, end - repr.payload_len..end)
}

/// Writes the IP, UDP and transport headers and the pad of a datagram into `buf` (its
/// length is the datagram's); false if they do not fit.
fn build(ip: &IpRepr, tx: &Tx, sport: u16, repr: &RoceRepr, buf: &mut [u8]) -> bool {
    let (sport, dport) = tx.ports.unwrap_or((sport, roce::UDP_PORT));
    let Ok(hl) = datagram::emit_headers(ip, sport, dport, repr.buffer_len(), buf) else {
        return false;
    };
    repr.emit(&mut roce::Packet::new_unchecked(&mut buf[hl..]))
        .is_ok()
}

/// [`emit`] with the engine split, so `fill` can borrow the MR table.
pub(crate) fn emit_to(
    gids: &[crate::verbs::Gid],
    tx: &mut Tx,
    av: &AddressVector,
    sport: u16,
    repr: &RoceRepr,
    fill: impl FnOnce(&mut [u8]) -> bool,
) -> bool {
    let Some(ip) = ip_for(gids, av) else {
        return false;
    };
    let (len, payload) = layout(&ip, repr);
    // `fill` writes the whole payload (or the packet is dropped); the rest is zeroed.
    let mut buf = tx.buffer(len, payload.clone());
    if !build(&ip, tx, sport, repr, &mut buf)
        || !fill(&mut buf[payload])
        || icrc::generate(&mut buf).is_err()
    {
        tx.give_back(buf);
        return false;
    }
    tx.push(Outgoing::whole(buf));
    true
}

/// [`emit_to`] for a payload of `repr.payload_len` bytes at `offset` in `region`, which
/// stays there: the datagram holds its headers, pad and ICRC (computed over the payload where
/// it lies), and the link sends the payload straight from the region.
pub(crate) fn emit_from_region(
    gids: &[crate::verbs::Gid],
    tx: &mut Tx,
    av: &AddressVector,
    sport: u16,
    repr: &RoceRepr,
    region: &Arc<Region>,
    offset: usize,
) -> bool {
    let Some(ip) = ip_for(gids, av) else {
        return false;
    };
    let Some(data) = region.slice(offset, repr.payload_len) else {
        return false;
    };
    let (len, payload) = layout(&ip, repr);
    // Built whole in the scratch buffer, its payload bytes left as they were, never sent.
    let mut full = std::mem::take(&mut tx.scratch);
    full.resize(len.max(full.len()), 0);
    full.truncate(len);
    full[..payload.start].fill(0);
    full[payload.end..].fill(0);
    let built = build(&ip, tx, sport, repr, &mut full);
    let ip_len = ip.header_len();
    let hl = ip_len + crate::wire::udp::HEADER_LEN;
    if built {
        let mut c = icrc::Icrc::new(&full[..ip_len], &full[ip_len..hl], &full[hl..payload.start]);
        c.update(data);
        c.update(&full[payload.end..len - roce::ICRC_LEN]);
        full[len - roce::ICRC_LEN..].copy_from_slice(&c.finish().to_le_bytes());
    }
    let mut out = tx.buffer(len - repr.payload_len, 0..0);
    out[..payload.start].copy_from_slice(&full[..payload.start]);
    out[payload.start..].copy_from_slice(&full[payload.end..]);
    tx.scratch = full;
    if !built {
        tx.give_back(out);
        return false;
    }
    tx.push(Outgoing::from_region(
        out,
        region.clone(),
        offset,
        repr.payload_len,
        payload.start,
    ));
    true
}

/// The pieces of `len` bytes starting `offset` bytes into an SGE list: each SGE they touch,
/// the offset into it and how many bytes; fewer than `len` bytes in all when the list ends
/// first. Every walk over an SGE list goes through here.
pub(crate) fn sge_pieces(
    sges: &[Sge],
    mut offset: usize,
    len: usize,
) -> impl Iterator<Item = (&Sge, usize, usize)> {
    let mut left = len;
    sges.iter().filter_map(move |s| {
        let sl = s.length as usize;
        if left == 0 {
            return None;
        }
        if offset >= sl {
            offset -= sl;
            return None;
        }
        let n = (sl - offset).min(left);
        let piece = (s, offset, n);
        offset = 0;
        left -= n;
        Some(piece)
    })
}

/// The region and offset of one piece of an SGE list (L_Key of `pd` with `access`).
pub(crate) fn lookup_piece(
    mrs: &MrTable,
    pd: u32,
    (s, offset, n): (&Sge, usize, usize),
    access: Access,
) -> Result<(Arc<Region>, usize), MrError> {
    mrs.lookup(
        pd,
        s.lkey,
        KeyKind::Local,
        access,
        s.addr + offset as u64,
        n,
    )
}

/// The region and offset of `len` bytes starting `offset` bytes into the SGE list when they
/// lie in one SGE (L_Keys of `pd`); `None` when they span several (then they are gathered).
pub(crate) fn single_region(
    mrs: &MrTable,
    pd: u32,
    sges: &[Sge],
    offset: usize,
    len: usize,
) -> Option<Result<(Arc<Region>, usize), MrError>> {
    let piece = sge_pieces(sges, offset, len).next()?;
    (piece.2 == len).then(|| lookup_piece(mrs, pd, piece, Access::empty()))
}

/// Copies `out.len()` bytes starting `offset` bytes into the SGE list (L_Keys of `pd`).
pub(crate) fn gather(
    mrs: &MrTable,
    pd: u32,
    sges: &[Sge],
    offset: usize,
    out: &mut [u8],
) -> Result<(), MrError> {
    let mut done = 0;
    for piece in sge_pieces(sges, offset, out.len()) {
        let (region, at) = lookup_piece(mrs, pd, piece, Access::empty())?;
        if !region.read(at, &mut out[done..done + piece.2]) {
            return Err(MrError::Bounds);
        }
        done += piece.2;
    }
    if done == out.len() {
        Ok(())
    } else {
        Err(MrError::Bounds)
    }
}

/// Why a scatter failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ScatterError {
    /// More data than the SGE list holds.
    Length,
    Protection,
}

/// Writes `data` starting `offset` bytes into the SGE list (L_Keys with LOCAL_WRITE).
pub(crate) fn scatter(
    mrs: &MrTable,
    pd: u32,
    sges: &[Sge],
    offset: usize,
    data: &[u8],
) -> Result<(), ScatterError> {
    let mut done = 0;
    for piece in sge_pieces(sges, offset, data.len()) {
        let (region, at) = lookup_piece(mrs, pd, piece, Access::LOCAL_WRITE)
            .map_err(|_| ScatterError::Protection)?;
        if !region.write(at, &data[done..done + piece.2]) {
            return Err(ScatterError::Protection);
        }
        done += piece.2;
    }
    if done == data.len() {
        Ok(())
    } else {
        Err(ScatterError::Length)
    }
}

/// What became of a received datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Received {
    Taken,
    /// For a QP of another device of the set: in its inbox.
    Passed,
}

/// Handles one received IP datagram (rxe `rxe_rcv` checks); `None` if it was dropped.
fn receive(
    eng: &mut Engine,
    head: &[u8],
    rest: &[u8],
    placed: &[u8],
    now: Duration,
) -> Option<Received> {
    let d = Datagram::split_placed(head, rest, placed).ok()?;
    // The UDP destination port is the netdev's business (it binds 4791, or another port in
    // tests); the ICRC covers whatever port was used.
    let ip = d.ip_repr().ok()?;
    let dst = crate::verbs::Gid::from_ip(ip.dst_addr());
    if !eng.gids.contains(&dst) {
        return None;
    }
    let pkt = d.roce_packet().ok()?;
    // Another device's QP: its owner checks the rest.
    if let Some(m) = &eng.shard {
        let to = crate::verbs::shards::owner(pkt.bth().dest_qp(), m.set.count());
        if to != m.index {
            // (`split_placed` made sure `rest` ends with the ICRC when `placed` is not empty.)
            let (hdr, icrc) = rest.split_at(rest.len() - d.placed.len().min(roce::ICRC_LEN));
            return m
                .set
                .pass(to, &[head, hdr, placed, icrc])
                .then_some(Received::Passed);
        }
    }
    if eng.check_icrc {
        let (computed, wire) = (d.computed_icrc(), d.wire_icrc());
        let sound = computed == wire
            || (eng.ipv4_header_rebuilt
                && matches!(ip, IpRepr::V4(_))
                && eng
                    .unknown_ipv4
                    .explains(d.icrc_covered_len(), computed, wire)
                    .is_some());
        if !sound {
            eng.stats.rx_bad_icrc += 1;
            return None;
        }
    }
    let bth = pkt.bth();
    if bth.pkey() & 0x7FFF != 0x7FFF {
        return None;
    }
    let qpn = bth.dest_qp();
    if qpn == 0 {
        return None;
    }
    let info = pkt.opcode_info()?;
    let mut qp = eng.qps.remove(&qpn)?;
    let ok = dispatch(eng, &mut qp, &d, ip, &pkt, info, now);
    if ok {
        eng.note_received(qpn, pkt.opcode());
    }
    eng.note_timers(&qp);
    eng.qps.insert(qpn, qp);
    // What the packet did (an ACK that opens the window, a READ to answer, a NAK to act on)
    // is followed up by the next `poll`.
    eng.mark_ready(qpn);
    ok.then_some(Received::Taken)
}

fn dispatch(
    eng: &mut Engine,
    qp: &mut QpCtx,
    d: &Datagram<'_>,
    ip: IpRepr,
    pkt: &roce::Packet<&[u8]>,
    info: &crate::wire::OpcodeInfo,
    now: Duration,
) -> bool {
    if !crate::verbs::device::opcode_matches(qp.qp_type, pkt.opcode()) {
        return false;
    }
    match qp.qp_type {
        QpType::Ud | QpType::Gsi => {
            if !matches!(
                qp.state,
                QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe
            ) {
                return false;
            }
            // Payloads are placed for RC messages only.
            d.placed.is_empty() && ud::on_receive(eng, qp, d, ip, pkt)
        }
        QpType::Rc => {
            if ip.src_addr() != qp.av.dest {
                return false;
            }
            if info.is_response() {
                if !matches!(qp.state, QpState::Rts | QpState::Sqd) {
                    return false;
                }
                completer::on_response(eng, qp, pkt, payload(d, pkt), now);
                true
            } else {
                if !matches!(
                    qp.state,
                    QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe
                ) {
                    return false;
                }
                responder::on_request(eng, qp, pkt, payload(d, pkt), now);
                true
            }
        }
    }
}

/// A received packet's payload: where the link placed it, or in the packet.
fn payload<'a>(d: &Datagram<'a>, pkt: &'a roce::Packet<&[u8]>) -> &'a [u8] {
    if d.placed.is_empty() {
        pkt.payload()
    } else {
        d.placed
    }
}

/// Timers, completions, READ responses and the send queue of one QP.
pub(crate) fn poll_qp(eng: &mut Engine, qp: &mut QpCtx, now: Duration) {
    if matches!(qp.state, QpState::Reset | QpState::Err | QpState::Init) {
        return;
    }
    if qp.qp_type == QpType::Rc {
        completer::timers(eng, qp, now);
        responder::read_responses(eng, qp, POLL_BUDGET, false);
    }
    completer::complete_ready(qp);
    requester::run(eng, qp, now, POLL_BUDGET);
    completer::complete_ready(qp);
    if qp.state == QpState::Sqd && qp.sqd_notify && qp.sq.is_empty() {
        qp.sqd_notify = false;
        eng.events
            .push(crate::verbs::AsyncEvent::SqDrained { qpn: qp.qpn });
    }
}

// The device runs the engine through these methods. They are defined here, with the engine,
// so that the verbs layer the engine builds on does not depend on it.
impl Engine {
    /// Hands one received IP datagram to the transport, counting it (and counting it dropped
    /// when the transport does not take it): `head` whole, or its IP and UDP headers with the
    /// UDP payload in `rest` ([`Datagram::split_parts`]), or with the payload placed in
    /// memory by the link ([`Datagram::split_placed`]).
    pub(crate) fn receive(&mut self, head: &[u8], rest: &[u8], placed: &[u8], now: Duration) {
        if !placed.is_empty() {
            self.stats.rx_placed += 1;
        }
        match receive(self, head, rest, placed, now) {
            Some(Received::Taken) => self.stats.rx_packets += 1,
            // Counted by the device it was passed to.
            Some(Received::Passed) => self.stats.rx_passed += 1,
            None => {
                self.stats.rx_packets += 1;
                self.stats.rx_dropped += 1;
            }
        }
    }

    /// Takes the datagrams other devices of the set passed to this one.
    pub(crate) fn receive_passed(&mut self, now: Duration) -> usize {
        let Some(m) = self.shard.clone() else {
            return 0;
        };
        let passed = std::mem::take(
            &mut *m
                .set
                .inbox(m.index)
                .queue
                .lock()
                .unwrap_or_else(|e| e.into_inner()),
        );
        let n = passed.len();
        for d in passed {
            self.receive(&d, &[], &[], now);
        }
        n
    }

    /// Sends the ACKs the received batch left owed.
    pub(crate) fn flush_acks(&mut self) {
        let mut acks = std::mem::take(&mut self.acks);
        for qpn in acks.drain(..) {
            if let Some(mut qp) = self.qps.remove(&qpn) {
                responder::flush_ack(self, &mut qp);
                self.qps.insert(qpn, qp);
            }
        }
        self.acks = acks;
    }

    /// Timers, completions and the send side of the QPs on the ready list, and of every
    /// running QP once a timer may be due.
    pub(crate) fn poll(&mut self, now: Duration) {
        let mut qpns = std::mem::take(&mut self.poll_scratch);
        qpns.clear();
        if now >= self.timers_from {
            // Every running QP is visited, so every QP with a deadline: the pass makes
            // `timers_from` exact again. QPs that are not running have nothing to do (and are
            // not taken out of the table).
            self.timers_from = Duration::MAX;
            for qpn in self.ready.drain(..) {
                if let Some(qp) = self.qps.get_mut(&qpn) {
                    qp.ready = false;
                }
            }
            qpns.extend(self.qps.iter().filter_map(|(n, q)| {
                (!matches!(q.state, QpState::Reset | QpState::Err | QpState::Init)).then_some(*n)
            }));
        } else {
            qpns.append(&mut self.ready);
        }
        for &qpn in &qpns {
            if let Some(mut qp) = self.qps.remove(&qpn) {
                let queued = self.tx.queue.len();
                qp.ready = false;
                poll_qp(self, &mut qp, now);
                self.note_timers(&qp);
                // A QP that sent may have more to send (its budget or the transmit queue
                // stopped it); one that could not send for want of room must try again.
                let again = self.tx.queue.len() > queued || !self.tx.has_room();
                self.qps.insert(qpn, qp);
                if again {
                    self.mark_ready(qpn);
                }
            }
        }
        self.poll_scratch = qpns;
    }
}

impl Device {
    /// Hands one received IP datagram (starting at the IP header) to the engine.
    pub fn receive(&self, datagram: &[u8], now: Duration) {
        let mut eng = self.engine();
        eng.receive(datagram, &[], &[], now);
        eng.flush_acks();
    }

    /// Runs timers and the send side of every QP.
    pub fn poll(&self, now: Duration) {
        self.engine().poll(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sge_pieces_walk_the_list_from_an_offset() {
        let sge = |addr, length| Sge {
            addr,
            length,
            lkey: 1,
        };
        let sges = [
            sge(0x1000, 100),
            sge(0x2000, 0),
            sge(0x3000, 50),
            sge(0x4000, 10),
        ];
        let walk = |offset, len| {
            sge_pieces(&sges, offset, len)
                .map(|(s, o, n)| (s.addr, o, n))
                .collect::<Vec<_>>()
        };
        assert_eq!(walk(0, 100), [(0x1000, 0, 100)]);
        // Starts inside the first SGE, skips the empty one, ends inside the third.
        assert_eq!(walk(90, 30), [(0x1000, 90, 10), (0x3000, 0, 20)]);
        assert_eq!(walk(100, 55), [(0x3000, 0, 50), (0x4000, 0, 5)]);
        // The list ends first: the pieces hold what there is.
        assert_eq!(walk(140, 100), [(0x3000, 40, 10), (0x4000, 0, 10)]);
        assert!(walk(160, 1).is_empty());
        assert!(walk(0, 0).is_empty());
    }

    /// Datagrams built in recycled buffers (full of an earlier datagram's bytes) are the ones
    /// built in fresh buffers: every byte outside the payload is written or zeroed.
    #[test]
    fn recycled_buffers_leave_nothing_behind() {
        use crate::verbs::device::Tx;
        use crate::verbs::Gid;
        use crate::wire::{AethRepr, BthRepr, ImmDtRepr, Opcode, RethRepr, Syndrome};
        let gids = [Gid::from_ip("10.0.0.1".parse().unwrap())];
        let av = AddressVector::new("10.0.0.2".parse().unwrap());
        let bth = |opcode| BthRepr {
            opcode,
            solicited: false,
            mig_req: false,
            pad_count: 0,
            pkey: 0xffff,
            fecn: false,
            becn: false,
            dest_qp: 0x11,
            ack_req: false,
            psn: 7,
        };
        let mut ack = RoceRepr::new(bth(Opcode::RcAcknowledge));
        ack.aeth = Some(AethRepr {
            syndrome: Syndrome::Ack { credits: 31 },
            msn: 3,
        });
        let mut write = RoceRepr::new(bth(Opcode::RcRdmaWriteOnlyWithImmediate));
        write.reth = Some(RethRepr {
            va: 0x1000,
            rkey: 0x42,
            dma_len: 5,
        });
        write.immdt = Some(ImmDtRepr { imm: 9 });
        write.payload_len = 5;
        let mut send = RoceRepr::new(bth(Opcode::RcSendOnly));
        send.payload_len = 4096;
        let build = |tx: &mut Tx| {
            for r in [&ack, &write, &send, &ack] {
                assert!(emit_to(&gids, tx, &av, 49152, r, |p| {
                    p.iter_mut().enumerate().for_each(|(i, b)| *b = i as u8);
                    true
                }));
            }
            tx.queue.drain(..).collect::<Vec<_>>()
        };
        let fresh = build(&mut Tx::default());
        let mut tx = Tx::default();
        let mut garbage: Vec<Outgoing> = vec![vec![0xa5; 5000]; 4]
            .into_iter()
            .chain(vec![vec![0x5a; 400]; 4])
            .map(Outgoing::whole)
            .collect();
        tx.recycle(&mut garbage);
        tx.scratch = vec![0xa5; 5000];
        let whole = |v: Vec<Outgoing>| v.iter().map(Outgoing::to_vec).collect::<Vec<_>>();
        assert_eq!(whole(build(&mut tx)), whole(fresh));
        // With the payload sent from a region: the same datagram, the payload not copied.
        let region = Arc::new(Region::from_vec((0..4200u32).map(|i| i as u8).collect()));
        let mut t = Tx::default();
        assert!(emit_to(&gids, &mut t, &av, 49152, &send, |p| {
            p.iter_mut().enumerate().for_each(|(i, b)| *b = i as u8);
            true
        }));
        let want = t.queue.pop_front().unwrap().to_vec();
        assert!(emit_from_region(
            &gids, &mut tx, &av, 49152, &send, &region, 0
        ));
        let d = tx.queue.pop_front().unwrap();
        assert!(d.payload.is_some());
        assert!(d.bytes.len() < 100);
        assert_eq!(d.to_vec(), want);
        assert!(crate::wire::icrc::check(&d.to_vec()).unwrap());
        // Out of the region's bounds: nothing is sent.
        assert!(!emit_from_region(
            &gids, &mut tx, &av, 49152, &send, &region, 200
        ));
        assert!(tx.queue.is_empty());
        // A datagram whose payload could not be filled is not sent.
        assert!(!emit_to(&gids, &mut tx, &av, 49152, &send, |_| false));
        assert!(tx.queue.is_empty());
    }

    #[test]
    fn timeout_values() {
        assert_eq!(ack_timeout(0), None);
        assert_eq!(ack_timeout(1), Some(Duration::from_nanos(8192)));
        assert_eq!(ack_timeout(14), Some(Duration::from_nanos(4096 << 14)));
    }
}
