//! The wire codecs against a real conversation of Linux rxe peers (LIO ib_isert/ib_srpt and the
//! ib_iser/ib_srp initiators, see `tests/fixtures/README.md`): every RoCEv2 packet's ICRC, every
//! header field compared with Wireshark's decode, byte-exact re-emission of every datagram and
//! every CM MAD.

mod common;

use std::collections::HashMap;
use std::net::IpAddr;

use common::{load_capture, Tsv, LINKTYPE_ETHERNET};
use rtgt_transport::wire::cm::{self, CmMessage, Mtu, TransportServiceType};
use rtgt_transport::wire::{
    bth, cma, datagram, deth, icrc, mad, roce, Datagram, IpRepr, Opcode, Position, RocePacket,
    RoceRepr, Syndrome, Transport,
};

const ETHERTYPE_IPV4: u16 = 0x0800;
const ETHERTYPE_IPV6: u16 = 0x86DD;

/// The IP datagrams of the capture that carry RoCEv2, by frame number.
fn roce_datagrams(pcap: &common::Pcap) -> Vec<(usize, Vec<u8>)> {
    let mut out = Vec::new();
    for record in pcap.records() {
        let Some((ethertype, ip)) = pcap.network_layer(record.data) else {
            continue;
        };
        if ethertype != ETHERTYPE_IPV4 && ethertype != ETHERTYPE_IPV6 {
            continue;
        }
        let Ok(d) = Datagram::split(ip) else {
            continue;
        };
        if d.udp_repr().dst_port != roce::UDP_PORT {
            continue;
        }
        let len = d.ip_header.len() + d.udp_header.len() + d.roce.len();
        out.push((record.number, ip[..len].to_vec()));
    }
    out
}

#[test]
fn capture_layout() {
    let pcap = load_capture();
    assert_eq!(pcap.link_type, LINKTYPE_ETHERNET);
    assert_eq!(pcap.records().len(), 1402);
    let roce = roce_datagrams(&pcap);
    assert_eq!(roce.len(), 1388);
    assert_eq!(Tsv::load("lio-iser-srp.roce.tsv").rows.len(), roce.len());
}

#[test]
fn icrc_of_every_roce_packet() {
    let pcap = load_capture();
    let tsv = Tsv::load("lio-iser-srp.roce.tsv");
    let mut checked = 0;
    for (number, dg) in roce_datagrams(&pcap) {
        assert_eq!(icrc::check(&dg), Ok(true), "frame {number}");
        let d = Datagram::split(&dg).unwrap();
        let computed = d.computed_icrc();
        assert_eq!(computed, d.wire_icrc(), "frame {number}");
        // Wireshark prints the four wire bytes as a big-endian number.
        let row = tsv.frame(number).unwrap();
        assert_eq!(
            tsv.num(row, "infiniband.invariant.crc"),
            Some(u64::from(u32::from_be_bytes(computed.to_le_bytes()))),
            "frame {number}"
        );
        // Regenerating over a zeroed ICRC gives the same bytes.
        let mut copy = dg.clone();
        let n = copy.len();
        copy[n - 4..].fill(0);
        icrc::generate(&mut copy).unwrap();
        assert_eq!(copy, dg, "frame {number}");
        checked += 1;
    }
    assert_eq!(checked, 1388);
}

#[test]
fn every_roce_packet_decodes_like_wireshark() {
    let pcap = load_capture();
    let tsv = Tsv::load("lio-iser-srp.roce.tsv");
    let mut census: HashMap<Opcode, usize> = HashMap::new();
    for (number, dg) in roce_datagrams(&pcap) {
        let row = tsv.frame(number).unwrap();
        let num = |c: &str| tsv.num(row, c);
        let d = Datagram::split(&dg).unwrap();
        let udp = d.udp_repr();
        assert_eq!(Some(u64::from(udp.src_port)), num("udp.srcport"));
        assert_eq!(Some((udp.payload_len + 8) as u64), num("udp.length"));

        let packet = RocePacket::new_checked(d.roce).unwrap();
        let r = RoceRepr::parse(&packet).unwrap();
        *census.entry(r.bth.opcode).or_default() += 1;
        assert_eq!(
            Some(u64::from(u8::from(r.bth.opcode))),
            num("infiniband.bth.opcode")
        );
        assert_eq!(Some(u64::from(r.bth.dest_qp)), num("infiniband.bth.destqp"));
        assert_eq!(Some(u64::from(r.bth.psn)), num("infiniband.bth.psn"));
        assert_eq!(Some(u64::from(r.bth.ack_req)), num("infiniband.bth.a"));
        assert_eq!(
            Some(u64::from(r.bth.pad_count)),
            num("infiniband.bth.padcnt")
        );
        assert_eq!(Some(u64::from(r.bth.pkey)), num("infiniband.bth.p_key"));
        assert_eq!(Some(u64::from(r.bth.solicited)), num("infiniband.bth.se"));
        assert_eq!(Some(u64::from(r.bth.mig_req)), num("infiniband.bth.m"));
        assert_eq!(r.reth.map(|h| h.va), num("infiniband.reth.va"));
        assert_eq!(
            r.reth.map(|h| u64::from(h.rkey)),
            num("infiniband.reth.r_key")
        );
        assert_eq!(
            r.reth.map(|h| u64::from(h.dma_len)),
            num("infiniband.reth.dmalen")
        );
        assert_eq!(
            r.aeth.map(|h| u64::from(h.syndrome.to_byte())),
            num("infiniband.aeth.syndrome")
        );
        assert_eq!(r.aeth.map(|h| u64::from(h.msn)), num("infiniband.aeth.msn"));
        assert_eq!(
            r.deth.map(|h| u64::from(h.qkey)),
            num("infiniband.deth.q_key")
        );
        assert_eq!(
            r.deth.map(|h| u64::from(h.src_qp)),
            num("infiniband.deth.srcqp")
        );
        assert_eq!(
            r.header_len() + r.payload_len + r.pad_len() + roce::ICRC_LEN,
            d.roce.len()
        );
    }
    // The opcode census of tests/fixtures/README.md, as Wireshark counts it.
    let expected = [
        (Opcode::RcSendFirst, 4),
        (Opcode::RcSendMiddle, 28),
        (Opcode::RcSendLast, 4),
        (Opcode::RcSendOnly, 91),
        (Opcode::RcSendOnlyWithInvalidate, 25),
        (Opcode::RcRdmaWriteFirst, 16),
        (Opcode::RcRdmaWriteMiddle, 512),
        (Opcode::RcRdmaWriteLast, 16),
        (Opcode::RcRdmaWriteOnly, 25),
        (Opcode::RcRdmaReadRequest, 12),
        (Opcode::RcRdmaReadResponseFirst, 12),
        (Opcode::RcRdmaReadResponseMiddle, 456),
        (Opcode::RcRdmaReadResponseLast, 12),
        (Opcode::RcAcknowledge, 161),
        (Opcode::UdSendOnly, 14),
    ];
    for (op, count) in expected {
        assert_eq!(census.get(&op), Some(&count), "{op:?}");
    }
    assert_eq!(census.values().sum::<usize>(), 1388);
}

#[test]
fn every_roce_datagram_round_trips() {
    let pcap = load_capture();
    for (number, dg) in roce_datagrams(&pcap) {
        let d = Datagram::split(&dg).unwrap();
        let ip = d.ip_repr().unwrap();
        let udp = d.udp_repr();
        let packet = d.roce_packet().unwrap();
        let repr = RoceRepr::parse(&packet).unwrap();

        let mut out = vec![0xa5u8; dg.len()];
        let hl =
            datagram::emit_headers(&ip, udp.src_port, udp.dst_port, repr.buffer_len(), &mut out)
                .unwrap();
        let mut p = RocePacket::new_unchecked(&mut out[hl..hl + repr.buffer_len()]);
        repr.emit(&mut p).unwrap();
        p.payload_mut().copy_from_slice(packet.payload());
        icrc::generate(&mut out).unwrap();
        assert_eq!(out, dg, "frame {number}");
    }
}

/// What docs/WIRE.md §1-§3 and §8 say about rxe on the wire, checked packet by packet.
#[test]
fn rxe_behaviour_in_capture() {
    let pcap = load_capture();
    for (number, dg) in roce_datagrams(&pcap) {
        let d = Datagram::split(&dg).unwrap();
        let IpRepr::V4(ip) = d.ip_repr().unwrap() else {
            panic!("IPv6 in an IPv4 capture")
        };
        assert!(ip.dont_frag, "frame {number}: DF");
        assert_eq!(&d.udp_header[6..8], &[0, 0], "frame {number}: UDP checksum");
        let packet = d.roce_packet().unwrap();
        let r = RoceRepr::parse(&packet).unwrap();
        let info = r.bth.opcode.info().unwrap();
        assert_eq!(r.bth.pkey, bth::DEFAULT_PKEY);
        assert!(!r.bth.mig_req, "frame {number}: rxe sends MigReq 0");
        assert_eq!(usize::from(r.bth.pad_count), roce::pad_len(r.payload_len));
        assert!(packet.pad().iter().all(|&b| b == 0));
        // The requester sets AckReq on every message-ending request packet.
        if info.requires_ack_req() {
            assert!(
                r.bth.ack_req,
                "frame {number}: {:?} without AckReq",
                r.bth.opcode
            );
        }
        // READ responses FIRST/LAST carry an ACK-type AETH; ACKs are 0x1F.
        if let Some(aeth) = r.aeth {
            assert_eq!(aeth.syndrome, Syndrome::ACK_UNLIMITED, "frame {number}");
        }
        match info.transport {
            Transport::Ud => {
                let deth = r.deth.unwrap();
                assert_eq!((r.bth.dest_qp, deth.src_qp), (1, 1));
                assert_eq!(deth.qkey, deth::GSI_QKEY);
                assert_eq!(r.payload_len, mad::MAD_LEN);
                assert_eq!(udp_src_port(&d), roce::qp_initial_sport(1));
            }
            Transport::Rc => {
                if info.position != Position::Only && info.has_payload() {
                    // Segmentation at the path MTU (1024): FIRST and MIDDLE are full.
                    if matches!(info.position, Position::First | Position::Middle) {
                        assert_eq!(r.payload_len, 1024, "frame {number}");
                    } else {
                        assert!((1..=1024).contains(&r.payload_len), "frame {number}");
                    }
                }
            }
            other => panic!("unexpected transport {other:?}"),
        }
    }
}

fn udp_src_port(d: &Datagram<'_>) -> u16 {
    d.udp_repr().src_port
}

/// The CM MADs: decode as Wireshark does, re-emit byte for byte, and check the rdma_cm facts.
#[test]
fn cm_mads_decode_like_wireshark_and_round_trip() {
    let pcap = load_capture();
    let tsv = Tsv::load("lio-iser-srp.cm.tsv");
    let datagrams = roce_datagrams(&pcap);
    let mut seen = 0;
    for (number, dg) in &datagrams {
        let d = Datagram::split(dg).unwrap();
        let packet = d.roce_packet().unwrap();
        if packet.opcode() != Opcode::UdSendOnly {
            continue;
        }
        let bytes = packet.payload();
        let mad = cm::Mad::parse(bytes).unwrap();
        let mut out = [0xa5u8; mad::MAD_LEN];
        mad.emit(&mut out);
        assert_eq!(&out[..], bytes, "frame {number}: re-emitted MAD differs");

        let row = tsv.frame(*number).expect("frame in cm.tsv");
        let num = |c: &str| tsv.num(row, c);
        assert_eq!(mad.header.base_version, 1);
        assert_eq!(mad.header.class_version, cm::CLASS_VERSION);
        assert_eq!(mad.header.method, mad::Method::Send);
        assert_eq!(mad.header.attr_mod, 0);
        assert_eq!(
            Some(u64::from(mad.header.attr_id)),
            num("infiniband.mad.attributeid")
        );
        assert_eq!(Some(mad.header.tid), num("infiniband.mad.transactionid"));
        match mad.message {
            CmMessage::Req(req) => {
                assert_eq!(Some(u64::from(req.local_comm_id)), num("infiniband.cm.req"));
                assert_eq!(Some(req.service_id), num("infiniband.cm.req.serviceid"));
                assert_eq!(
                    Some(req.local_ca_guid),
                    num("infiniband.cm.req.localcaguid")
                );
                assert_eq!(
                    Some(u64::from(req.local_qpn)),
                    num("infiniband.cm.req.localqpn")
                );
                assert_eq!(
                    Some(u64::from(req.starting_psn)),
                    num("infiniband.cm.req.startpsn")
                );
                assert_eq!(
                    Some(u64::from(u8::from(req.path_mtu))),
                    num("infiniband.cm.req.pppmtu")
                );
                assert_eq!(req.path_mtu, Mtu::Mtu1024);
                assert_eq!(
                    Some(u64::from(req.responder_resources)),
                    num("infiniband.cm.req.responderres")
                );
                assert_eq!(
                    Some(u64::from(req.initiator_depth)),
                    num("infiniband.cm.req.initdepth")
                );
                assert_eq!(
                    Some(u64::from(req.retry_count)),
                    num("infiniband.cm.req.retrcount")
                );
                assert_eq!(
                    Some(u64::from(req.rnr_retry_count)),
                    num("infiniband.cm.req.rnrretrcount")
                );
                assert_eq!(
                    Some(u64::from(req.remote_cm_response_timeout)),
                    num("infiniband.cm.req.remoteresptout")
                );
                assert_eq!(
                    Some(u64::from(req.local_cm_response_timeout)),
                    num("infiniband.cm.req.localresptout")
                );
                assert_eq!(
                    Some(u64::from(req.max_cm_retries)),
                    num("infiniband.cm.req.maxcmretr")
                );
                assert_eq!(Some(u64::from(req.pkey)), num("infiniband.cm.req.pkey"));
                let path = req.primary_path;
                assert_eq!(
                    Some(u64::from(path.local_lid)),
                    num("infiniband.cm.req.prim_locallid")
                );
                assert_eq!(
                    Some(u64::from(path.remote_lid)),
                    num("infiniband.cm.req.prim_remotelid")
                );
                assert_eq!(
                    Some(u64::from(path.hop_limit)),
                    num("infiniband.cm.req.prim_hoplim")
                );
                assert_eq!(
                    Some(u64::from(path.local_ack_timeout)),
                    num("infiniband.cm.req.prim_localacktout")
                );
                assert_eq!(req.transport_service_type, TransportServiceType::Rc);
                assert_eq!(req.alternate_path, cm::path::Repr::default());
                assert_eq!(req.vendor_id, 0);

                // docs/WIRE.md §4: the GIDs are the IPv4-mapped addresses of the IP header.
                let ip = d.ip_repr().unwrap();
                assert_eq!(cma::ip_from_gid(path.local_gid), ip.src_addr());
                assert_eq!(cma::ip_from_gid(path.remote_gid), ip.dst_addr());

                // docs/WIRE.md §5: cma_hdr at the start of the private data.
                let hdr =
                    cma::Repr::parse(&cma::Packet::new_checked(&req.private_data[..]).unwrap())
                        .unwrap();
                assert_eq!(
                    Some(u64::from(hdr.src_port)),
                    num("infiniband.cm.req.ip_cm.sport")
                );
                let ip4 = |c: &str| tsv.text(row, c).parse::<IpAddr>().unwrap();
                assert_eq!(hdr.src_addr, ip4("infiniband.cm.req.ip_cm.sip4"));
                assert_eq!(hdr.dst_addr, ip4("infiniband.cm.req.ip_cm.dip4"));
                let (space, port) = cma::parse_service_id(req.service_id).unwrap();
                assert_eq!(space, cma::PortSpace::Tcp);
                assert!(port == 3260 || port == 5555);

                // Newer kernels fill in the flow label from the rdma_cm ports, and both peers
                // then send the connection's RC traffic from the UDP port derived from it.
                assert_eq!(
                    path.flow_label,
                    roce::rdma_cm_flow_label(hdr.src_port, port)
                );
                let sport = roce::udp_sport_from_flow_label(path.flow_label);
                let rc_ports: Vec<u16> = datagrams
                    .iter()
                    .filter_map(|(_, g)| {
                        let g = Datagram::split(g).unwrap();
                        let p = g.roce_packet().unwrap();
                        (p.bth().dest_qp() == req.local_qpn && p.opcode() != Opcode::UdSendOnly)
                            .then(|| g.udp_repr().src_port)
                    })
                    .collect();
                assert!(!rc_ports.is_empty());
                assert!(rc_ports.iter().all(|&p| p == sport), "frame {number}");

                // Linux forms the REQ TID from the agent's high TID and the comm ID as a
                // big-endian value read in host (little-endian) order.
                assert_eq!(mad.header.tid as u32, req.local_comm_id.swap_bytes());
            }
            CmMessage::Rep(rep) => {
                assert_eq!(Some(u64::from(rep.local_comm_id)), num("infiniband.cm.rep"));
                assert_eq!(
                    Some(u64::from(rep.remote_comm_id)),
                    num("infiniband.cm.rep.remotecommid")
                );
                assert_eq!(
                    Some(u64::from(rep.local_qpn)),
                    num("infiniband.cm.rep.localqpn")
                );
                assert_eq!(
                    Some(u64::from(rep.starting_psn)),
                    num("infiniband.cm.rep.startpsn")
                );
                assert_eq!(
                    Some(u64::from(rep.responder_resources)),
                    num("infiniband.cm.rep.respres")
                );
                assert_eq!(
                    Some(u64::from(rep.initiator_depth)),
                    num("infiniband.cm.rep.initdepth")
                );
                assert_eq!(
                    Some(u64::from(rep.rnr_retry_count)),
                    num("infiniband.cm.rep.rnrretrcount")
                );
                assert_eq!(
                    Some(u64::from(rep.target_ack_delay)),
                    num("infiniband.cm.rep.tgtackdelay")
                );
                assert_eq!(
                    Some(rep.local_ca_guid),
                    num("infiniband.cm.rep.localcaguid")
                );
            }
            CmMessage::Rtu(rtu) => {
                assert_eq!(
                    Some(u64::from(rtu.local_comm_id)),
                    num("infiniband.cm.rtu.localcommid")
                );
                assert_eq!(
                    Some(u64::from(rtu.remote_comm_id)),
                    num("infiniband.cm.rtu.remotecommid")
                );
            }
            CmMessage::Dreq(dreq) => {
                assert_eq!(
                    Some(u64::from(dreq.local_comm_id)),
                    num("infiniband.cm.dreq.localcommid")
                );
                assert_eq!(
                    Some(u64::from(dreq.remote_comm_id)),
                    num("infiniband.cm.dreq.remotecommid")
                );
                assert_eq!(
                    Some(u64::from(dreq.remote_qpn)),
                    num("infiniband.cm.req.remoteqpneecn")
                );
            }
            CmMessage::Drep(drep) => {
                assert_eq!(
                    Some(u64::from(drep.local_comm_id)),
                    num("infiniband.cm.drsp.localcommid")
                );
                assert_eq!(
                    Some(u64::from(drep.remote_comm_id)),
                    num("infiniband.cm.drsp.remotecommid")
                );
            }
            other => panic!("frame {number}: unexpected {other}"),
        }
        seen += 1;
    }
    assert_eq!(seen, 14);
}

/// The REQ → REP → RTU exchanges and the transport they set up.
#[test]
fn connection_parameters() {
    let pcap = load_capture();
    let mut reqs = Vec::new();
    let mut reps = Vec::new();
    let mut first_psn: HashMap<u32, u32> = HashMap::new();
    for (_, dg) in roce_datagrams(&pcap) {
        let d = Datagram::split(&dg).unwrap();
        let p = d.roce_packet().unwrap();
        if p.opcode() == Opcode::UdSendOnly {
            match cm::Mad::parse(p.payload()).unwrap().message {
                CmMessage::Req(r) => reqs.push(r),
                CmMessage::Rep(r) => reps.push(r),
                _ => {}
            }
        } else if p.opcode_info().unwrap().is_request() {
            first_psn.entry(p.bth().dest_qp()).or_insert(p.bth().psn());
        }
    }
    assert_eq!((reqs.len(), reps.len()), (2, 2));
    for (req, rep) in reqs.iter().zip(&reps) {
        assert_eq!(rep.remote_comm_id, req.local_comm_id);
        // The REQ's starting PSN is the one the passive side sends from (`cm.c`
        // `cm_req_handler`: sq_psn = REQ starting PSN) and the REP's the one the active side
        // sends from: each side announces the PSN it expects to receive.
        assert_eq!(first_psn[&req.local_qpn], req.starting_psn);
        assert_eq!(first_psn[&rep.local_qpn], rep.starting_psn);
        // The passive side's initiator depth is bounded by the REQ's responder resources.
        assert!(rep.initiator_depth <= req.responder_resources);
    }
    // iSER: ib_iser asks responder resources 128 / initiator depth 1 and ib_isert answers
    // initiator depth 128 = min(REQ responder resources, device max), responder resources 0.
    assert_eq!(
        (reqs[0].responder_resources, reqs[0].initiator_depth),
        (128, 1)
    );
    assert_eq!(
        (reps[0].responder_resources, reps[0].initiator_depth),
        (0, 128)
    );
    // SRP: 4/0 asked, 4/4 answered, RNR retry 7 both ways. ib_srpt's responder resources (4)
    // exceed the REQ's initiator depth (0), and the Linux CM accepts that.
    assert_eq!(
        (reqs[1].responder_resources, reqs[1].initiator_depth),
        (4, 0)
    );
    assert_eq!(
        (reps[1].responder_resources, reps[1].initiator_depth),
        (4, 4)
    );
    assert_eq!((reqs[1].rnr_retry_count, reps[1].rnr_retry_count), (7, 7));
    // SRP login request in the REQ private data after the cma_hdr: 36 + 56 = 92 bytes, opcode
    // SRP_LOGIN_REQ (0) at offset 11 of login_req_rdma, req_it_iu_len 8260 at offset 12.
    let login = &reqs[1].private_data[cma::HEADER_LEN..];
    assert_eq!(login[11], 0x00);
    assert_eq!(u32::from_be_bytes(login[12..16].try_into().unwrap()), 8260);
    // SRP LOGIN_RSP in the REP private data: opcode 0xC0.
    assert_eq!(reps[1].private_data[0], 0xc0);
}
