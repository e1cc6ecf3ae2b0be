//! The memory region table and its single lookup (as `rxe_mr.c` `lookup_mr` /
//! `rxe_mr_check_access`): key, state, protection domain, access rights and bounds are checked
//! in `MrTable::lookup` and nowhere else.
//!
//! A key is `index << 8 | variant` (IBA 10.6.3.1: the low 8 bits are the consumer-owned "key"
//! part that fast-register changes so stale keys stop working).

use std::sync::Arc;

use super::mem::Region;
use super::types::{Access, FastReg};

/// Why a key lookup failed; every variant maps to a protection error on the wire (NAK 0x62
/// for R_Keys, LOC_PROT_ERR for L_Keys).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MrError {
    NoSuchKey,
    StaleKey,
    Invalid,
    WrongPd,
    Access,
    Bounds,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MrState {
    /// Usable.
    Valid,
    /// Allocated for fast registration (or invalidated): no access until registered.
    Free,
}

#[derive(Debug)]
pub(crate) struct MrEntry {
    pub pd: u32,
    pub key: u32,
    pub state: MrState,
    pub region: Option<Arc<Region>>,
    pub offset: usize,
    pub length: usize,
    pub iova: u64,
    pub access: Access,
    /// Allocated with `alloc_mr` (fast-register target) and its page-list limit in bytes.
    pub fast_reg_max: Option<usize>,
}

/// Whose key this is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyKind {
    Local,
    Remote,
}

#[derive(Debug)]
pub(crate) struct MrTable {
    entries: Vec<Option<MrEntry>>,
    free: Vec<u32>,
    max: u32,
    next_variant: u8,
}

impl MrTable {
    pub fn new(max: u32) -> MrTable {
        MrTable {
            // Index 0 is never handed out, so key 0 is always invalid.
            entries: vec![None],
            free: Vec::new(),
            max,
            next_variant: 0x5a,
        }
    }

    pub fn count(&self) -> usize {
        self.entries.iter().filter(|e| e.is_some()).count()
    }

    pub fn insert(&mut self, mut entry: MrEntry) -> Option<u32> {
        let index = match self.free.pop() {
            Some(i) => i,
            None => {
                if self.entries.len() as u32 > self.max || self.entries.len() >= 1 << 24 {
                    return None;
                }
                self.entries.push(None);
                (self.entries.len() - 1) as u32
            }
        };
        self.next_variant = self.next_variant.wrapping_add(0x3b);
        entry.key = index << 8 | u32::from(self.next_variant);
        let key = entry.key;
        self.entries[index as usize] = Some(entry);
        Some(key)
    }

    pub fn remove(&mut self, key: u32) -> Option<MrEntry> {
        let index = (key >> 8) as usize;
        let slot = self.entries.get_mut(index)?;
        if slot.as_ref().is_some_and(|e| e.key >> 8 == key >> 8) {
            self.free.push(index as u32);
            slot.take()
        } else {
            None
        }
    }

    pub fn entry(&self, key: u32) -> Option<&MrEntry> {
        self.entries.get((key >> 8) as usize)?.as_ref()
    }

    #[allow(dead_code)]
    pub fn pd_in_use(&self, pd: u32) -> bool {
        self.entries.iter().flatten().any(|e| e.pd == pd)
    }

    /// The one place keys are checked: the key must name a valid MR of `pd` whose current
    /// variant matches, that grants `need`, and that covers `iova..iova+len`. Returns the
    /// backing region and the byte offset inside it.
    pub fn lookup(
        &self,
        pd: u32,
        key: u32,
        kind: KeyKind,
        need: Access,
        iova: u64,
        len: usize,
    ) -> Result<(Arc<Region>, usize), MrError> {
        let e = self
            .entries
            .get((key >> 8) as usize)
            .and_then(Option::as_ref)
            .ok_or(MrError::NoSuchKey)?;
        if e.key != key {
            return Err(MrError::StaleKey);
        }
        if e.state != MrState::Valid {
            return Err(MrError::Invalid);
        }
        if e.pd != pd {
            return Err(MrError::WrongPd);
        }
        let remote = Access::REMOTE_READ | Access::REMOTE_WRITE | Access::REMOTE_ATOMIC;
        if kind == KeyKind::Local && need.intersects(remote) {
            return Err(MrError::Access);
        }
        if !e.access.contains(need) {
            return Err(MrError::Access);
        }
        let region = e.region.as_ref().ok_or(MrError::Invalid)?;
        let start = iova.checked_sub(e.iova).ok_or(MrError::Bounds)?;
        let end = start.checked_add(len as u64).ok_or(MrError::Bounds)?;
        if end > e.length as u64 {
            return Err(MrError::Bounds);
        }
        Ok((Arc::clone(region), e.offset + start as usize))
    }

    /// Fast-register (IB_WR_REG_MR) executed by the send queue of a QP of `pd`.
    pub fn fast_reg(&mut self, pd: u32, fr: &FastReg) -> Result<(), MrError> {
        let e = self
            .entries
            .get_mut((fr.key >> 8) as usize)
            .and_then(Option::as_mut)
            .ok_or(MrError::NoSuchKey)?;
        let max = e.fast_reg_max.ok_or(MrError::Access)?;
        if e.pd != pd {
            return Err(MrError::WrongPd);
        }
        if e.state != MrState::Free {
            return Err(MrError::Invalid);
        }
        let in_region = fr
            .offset
            .checked_add(fr.length)
            .is_some_and(|end| end <= fr.region.len());
        if fr.length > max || !in_region || !access_valid(fr.access) {
            return Err(MrError::Bounds);
        }
        e.key = (e.key & !0xFF) | (fr.key & 0xFF);
        e.state = MrState::Valid;
        e.region = Some(Arc::clone(&fr.region));
        e.offset = fr.offset;
        e.length = fr.length;
        e.iova = fr.iova;
        e.access = fr.access;
        Ok(())
    }

    /// Invalidate (local, or remote through SEND with Invalidate): only fast-register MRs of
    /// the same PD, with the exact current key (IBA 10.6.5; rxe `rxe_invalidate_mr`).
    pub fn invalidate(&mut self, pd: u32, key: u32) -> Result<(), MrError> {
        let e = self
            .entries
            .get_mut((key >> 8) as usize)
            .and_then(Option::as_mut)
            .ok_or(MrError::NoSuchKey)?;
        if e.key != key {
            return Err(MrError::StaleKey);
        }
        if e.pd != pd {
            return Err(MrError::WrongPd);
        }
        if e.fast_reg_max.is_none() {
            return Err(MrError::Access);
        }
        e.state = MrState::Free;
        e.region = None;
        Ok(())
    }
}

/// IBA 10.6.3.2: remote write or atomic access requires local write.
pub(crate) fn access_valid(access: Access) -> bool {
    !access.intersects(Access::REMOTE_WRITE | Access::REMOTE_ATOMIC)
        || access.contains(Access::LOCAL_WRITE)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(pd: u32, region: &Arc<Region>, access: Access) -> MrEntry {
        MrEntry {
            pd,
            key: 0,
            state: MrState::Valid,
            region: Some(region.clone()),
            offset: 0,
            length: region.len(),
            iova: 0x1000,
            access,
            fast_reg_max: None,
        }
    }

    #[test]
    fn lookup_checks_everything() {
        let r = Arc::new(Region::zeroed(64));
        let mut t = MrTable::new(16);
        let all = Access::LOCAL_WRITE | Access::REMOTE_READ;
        let key = t.insert(entry(1, &r, all)).unwrap();
        let ok = t.lookup(1, key, KeyKind::Remote, Access::REMOTE_READ, 0x1008, 8);
        assert_eq!(ok.unwrap().1, 8);
        let l = |pd, key, kind, need, va, len| t.lookup(pd, key, kind, need, va, len).err();
        assert_eq!(
            l(2, key, KeyKind::Remote, Access::REMOTE_READ, 0x1000, 1),
            Some(MrError::WrongPd)
        );
        assert_eq!(
            l(1, key ^ 1, KeyKind::Remote, Access::REMOTE_READ, 0x1000, 1),
            Some(MrError::StaleKey)
        );
        assert_eq!(
            l(1, key, KeyKind::Remote, Access::REMOTE_WRITE, 0x1000, 1),
            Some(MrError::Access)
        );
        assert_eq!(
            l(1, key, KeyKind::Remote, Access::REMOTE_READ, 0x1039, 8),
            Some(MrError::Bounds)
        );
        assert_eq!(
            l(1, key, KeyKind::Remote, Access::REMOTE_READ, 0xfff, 1),
            Some(MrError::Bounds)
        );
        assert_eq!(
            l(1, 0, KeyKind::Local, Access::empty(), 0x1000, 1),
            Some(MrError::NoSuchKey)
        );
        assert_eq!(
            l(1, key, KeyKind::Local, Access::LOCAL_WRITE, 0x1000, 64),
            None
        );
    }

    #[test]
    fn fast_reg_and_invalidate() {
        let r = Arc::new(Region::zeroed(64));
        let mut t = MrTable::new(16);
        let mut e = entry(1, &r, Access::empty());
        e.state = MrState::Free;
        e.region = None;
        e.fast_reg_max = Some(4096);
        let key = t.insert(e).unwrap();
        assert_eq!(
            t.lookup(1, key, KeyKind::Local, Access::empty(), 0x1000, 1)
                .err(),
            Some(MrError::Invalid)
        );
        let new_key = (key & !0xFF) | 0x77;
        let fr = FastReg {
            key: new_key,
            region: r.clone(),
            offset: 0,
            length: 64,
            iova: 0x9000,
            access: Access::LOCAL_WRITE | Access::REMOTE_WRITE,
        };
        t.fast_reg(1, &fr).unwrap();
        assert!(t
            .lookup(
                1,
                new_key,
                KeyKind::Remote,
                Access::REMOTE_WRITE,
                0x9000,
                64
            )
            .is_ok());
        assert_eq!(t.invalidate(1, key), Err(MrError::StaleKey));
        t.invalidate(1, new_key).unwrap();
        assert!(t
            .lookup(1, new_key, KeyKind::Remote, Access::REMOTE_WRITE, 0x9000, 1)
            .is_err());
    }
}
