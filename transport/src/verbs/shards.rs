//! Devices that serve the same addresses and split the QPs between them, one per engine thread
//! ([`crate::shard`]): QP `qpn` belongs to device [`owner`]`(qpn)`, and each device only hands
//! out QP numbers it owns. The links steer a datagram to its owner by destination QP number
//! where the kernel can ([`crate::netdev::udp::bind_group`]); a datagram that reaches another
//! device anyway (a coalesced run of several QPs, a kernel without the steering program) is
//! passed on through the owner's inbox, which is bounded: a full inbox drops, as a full
//! receive ring would, and the transport retransmits.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

/// Datagrams an inbox holds before it drops.
pub const INBOX_LIMIT: usize = 2048;

/// The device that owns QP `qpn` among `count`: QP1 (the connection manager's) is device 0's,
/// any other QP is device `qpn % count`'s.
pub fn owner(qpn: u32, count: usize) -> usize {
    if qpn == 1 || count <= 1 {
        0
    } else {
        (qpn as usize) % count
    }
}

/// The inboxes of a set of devices, shared by all of them.
#[derive(Debug)]
pub struct ShardSet {
    inboxes: Box<[Inbox]>,
}

#[derive(Debug)]
pub(crate) struct Inbox {
    pub queue: Mutex<VecDeque<Vec<u8>>>,
    /// The owner's wake-up (also its doorbell for posted work).
    pub kick: Arc<tokio::sync::Notify>,
}

impl ShardSet {
    pub fn new(count: usize) -> Arc<ShardSet> {
        Arc::new(ShardSet {
            inboxes: (0..count.max(1))
                .map(|_| Inbox {
                    queue: Mutex::new(VecDeque::new()),
                    kick: Arc::new(tokio::sync::Notify::new()),
                })
                .collect(),
        })
    }

    pub fn count(&self) -> usize {
        self.inboxes.len()
    }

    pub(crate) fn inbox(&self, index: usize) -> &Inbox {
        &self.inboxes[index]
    }

    /// Queues a datagram for device `index` and wakes it; false (dropped) if its inbox is full.
    pub(crate) fn pass(&self, index: usize, parts: &[&[u8]]) -> bool {
        let inbox = &self.inboxes[index];
        {
            let mut q = inbox.queue.lock().unwrap_or_else(|e| e.into_inner());
            if q.len() >= INBOX_LIMIT {
                return false;
            }
            q.push_back(parts.concat());
        }
        inbox.kick.notify_one();
        true
    }
}

/// A device's place in its set.
#[derive(Debug, Clone)]
pub struct ShardMember {
    pub set: Arc<ShardSet>,
    pub index: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owners_split_qpns_and_keep_qp1_on_the_first() {
        assert_eq!(owner(1, 4), 0);
        assert_eq!(owner(0x11, 1), 0);
        assert_eq!(owner(0x11, 2), 1);
        assert_eq!(owner(0x12, 2), 0);
        assert_eq!(owner(0x00FF_FFFF, 3), 0x00FF_FFFF % 3);
    }

    #[test]
    fn a_full_inbox_drops() {
        let set = ShardSet::new(2);
        for i in 0..INBOX_LIMIT {
            assert!(set.pass(1, &[&[i as u8], &[1, 2]]));
        }
        assert!(!set.pass(1, &[&[0]]));
        let q = set.inbox(1).queue.lock().unwrap();
        assert_eq!(q.len(), INBOX_LIMIT);
        assert_eq!(q[3], vec![3, 1, 2]);
        assert!(set.inbox(0).queue.lock().unwrap().is_empty());
    }

    /// A datagram for a QP of the other device is passed on, counted once where it was
    /// received and handled by its owner; QP numbers follow their device.
    #[test]
    fn datagrams_for_another_device_are_passed_on() {
        use crate::verbs::{Device, DeviceConfig, QpInitAttr, QpType};
        use crate::wire::{datagram, icrc, ipv4, IpRepr};
        use std::net::Ipv4Addr;
        use std::time::Duration;
        let set = ShardSet::new(2);
        let dev = |index| {
            let mut c = DeviceConfig::new("s", vec![Ipv4Addr::new(10, 0, 0, 1).into()]);
            c.shard = Some(ShardMember {
                set: set.clone(),
                index,
            });
            Device::new(c).unwrap()
        };
        let (d0, d1) = (dev(0), dev(1));
        let mk_qp = |d: &Device| {
            let pd = d.alloc_pd().unwrap();
            let cq = d.create_cq(16).unwrap();
            pd.create_qp(QpInitAttr::new(QpType::Rc, &cq, &cq)).unwrap()
        };
        let (q0, q1) = (mk_qp(&d0), mk_qp(&d1));
        assert_eq!((owner(q0.qpn(), 2), owner(q1.qpn(), 2)), (0, 1));
        assert_eq!(owner(mk_qp(&d1).qpn(), 2), 1);
        // An RC SEND to d1's QP (in RESET: d1 drops it, after counting it).
        let ip = IpRepr::V4(ipv4::Repr::udp(
            Ipv4Addr::new(10, 0, 0, 2),
            Ipv4Addr::new(10, 0, 0, 1),
        ));
        let mut d = vec![0u8; 28 + 12 + 8 + 4];
        datagram::emit_headers(&ip, 0xc000, 4791, 24, &mut d).unwrap();
        d[28] = 0x04;
        d[30..32].copy_from_slice(&[0xff, 0xff]);
        d[33..36].copy_from_slice(&q1.qpn().to_be_bytes()[1..]);
        icrc::generate(&mut d).unwrap();
        d0.receive(&d, Duration::ZERO);
        let s0 = d0.stats();
        assert_eq!((s0.rx_passed, s0.rx_packets, s0.rx_dropped), (1, 0, 0));
        let (mut l1, _peer) = crate::netdev::loopback::pair(16);
        d1.drive(&mut l1, Duration::ZERO);
        let s1 = d1.stats();
        assert_eq!((s1.rx_passed, s1.rx_packets, s1.rx_dropped), (0, 1, 1));
        assert!(set.inbox(1).queue.lock().unwrap().is_empty());
    }
}
