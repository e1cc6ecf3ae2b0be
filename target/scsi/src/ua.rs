//! Unit attention conditions (SAM-5 5.14), one queue per I_T nexus.

use std::collections::VecDeque;

use super::sense::{asc, Sense};

/// The unit attention conditions the engine establishes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnitAttention {
    /// POWER ON, RESET, OR BUS DEVICE RESET OCCURRED (29h/00h): first command of a new nexus.
    PowerOn,
    /// BUS DEVICE RESET FUNCTION OCCURRED (29h/03h): LOGICAL UNIT RESET (SAM-5 7.7).
    LunReset,
    /// I_T NEXUS LOSS OCCURRED (29h/07h): I_T NEXUS RESET (SAM-5 7.8).
    ItNexusLoss,
    /// COMMANDS CLEARED BY ANOTHER INITIATOR (2Fh/00h): CLEAR TASK SET or a reset from
    /// another I_T nexus aborted this nexus's tasks while TAS=0 (SAM-5 7.4).
    CommandsCleared,
    /// NOT READY TO READY CHANGE, MEDIUM MAY HAVE CHANGED (28h/00h): a removable medium
    /// was loaded.
    MediumChanged,
    /// MODE PARAMETERS CHANGED (2Ah/01h).
    ModeParametersChanged,
    /// RESERVATIONS PREEMPTED (2Ah/03h).
    ReservationsPreempted,
    /// RESERVATIONS RELEASED (2Ah/04h).
    ReservationsReleased,
    /// REGISTRATIONS PREEMPTED (2Ah/05h).
    RegistrationsPreempted,
    /// CAPACITY DATA HAS CHANGED (2Ah/09h).
    CapacityChanged,
    /// ASYMMETRIC ACCESS STATE CHANGED (2Ah/06h): a target port group changed state.
    AsymmetricAccessChanged,
    /// REPORTED LUNS DATA HAS CHANGED (3Fh/0Eh).
    ReportedLunsChanged,
    /// INQUIRY DATA HAS CHANGED (3Fh/03h): TPGS changed with the target port groups.
    InquiryDataChanged,
}

impl UnitAttention {
    pub fn code(self) -> asc::Code {
        match self {
            UnitAttention::PowerOn => asc::POWER_ON_RESET,
            UnitAttention::LunReset => asc::BUS_DEVICE_RESET,
            UnitAttention::ItNexusLoss => asc::IT_NEXUS_LOSS,
            UnitAttention::CommandsCleared => asc::COMMANDS_CLEARED,
            UnitAttention::MediumChanged => asc::NOT_READY_TO_READY_CHANGE,
            UnitAttention::ModeParametersChanged => asc::MODE_PARAMETERS_CHANGED,
            UnitAttention::ReservationsPreempted => asc::RESERVATIONS_PREEMPTED,
            UnitAttention::ReservationsReleased => asc::RESERVATIONS_RELEASED,
            UnitAttention::RegistrationsPreempted => asc::REGISTRATIONS_PREEMPTED,
            UnitAttention::CapacityChanged => asc::CAPACITY_DATA_CHANGED,
            UnitAttention::AsymmetricAccessChanged => asc::ASYMMETRIC_ACCESS_STATE_CHANGED,
            UnitAttention::ReportedLunsChanged => asc::REPORTED_LUNS_CHANGED,
            UnitAttention::InquiryDataChanged => asc::INQUIRY_DATA_CHANGED,
        }
    }

    pub fn sense(self) -> Sense {
        Sense::unit_attention(self.code())
    }

    /// Reset-class conditions supersede everything queued before them (SAM-5 5.14).
    fn is_reset(self) -> bool {
        matches!(
            self,
            UnitAttention::PowerOn | UnitAttention::LunReset | UnitAttention::ItNexusLoss
        )
    }
}

/// Pending unit attentions of one I_T nexus, reported oldest first.
#[derive(Debug, Default, Clone)]
pub struct UaQueue {
    q: VecDeque<UnitAttention>,
}

/// Bound on queued conditions; duplicates are coalesced so this is rarely reached.
const MAX_PENDING: usize = 16;

impl UaQueue {
    pub fn push(&mut self, ua: UnitAttention) {
        if ua.is_reset() {
            self.q.clear();
        } else if self.q.contains(&ua) {
            return;
        } else if self.q.len() >= MAX_PENDING {
            self.q.pop_back();
        }
        self.q.push_back(ua);
    }

    pub fn pop(&mut self) -> Option<UnitAttention> {
        self.q.pop_front()
    }

    pub fn remove(&mut self, ua: UnitAttention) {
        self.q.retain(|&u| u != ua);
    }

    /// The condition [`UaQueue::pop`] would return, left in place.
    pub fn peek(&self) -> Option<UnitAttention> {
        self.q.front().copied()
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.q.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fifo_dedup_and_reset() {
        let mut q = UaQueue::default();
        q.push(UnitAttention::CapacityChanged);
        q.push(UnitAttention::ModeParametersChanged);
        q.push(UnitAttention::CapacityChanged);
        assert_eq!(q.pop(), Some(UnitAttention::CapacityChanged));
        q.push(UnitAttention::LunReset);
        assert_eq!(q.pop(), Some(UnitAttention::LunReset));
        assert_eq!(q.pop(), None);
        assert!(q.is_empty());
    }

    #[test]
    fn bounded() {
        let mut q = UaQueue::default();
        for _ in 0..100 {
            q.push(UnitAttention::ReportedLunsChanged);
            q.push(UnitAttention::CapacityChanged);
        }
        assert_eq!(q.q.len(), 2);
    }

    #[test]
    fn sense_codes() {
        assert_eq!(UnitAttention::PowerOn.sense().asc, 0x29);
        assert_eq!(UnitAttention::ReportedLunsChanged.code(), (0x3f, 0x0e));
    }
}
