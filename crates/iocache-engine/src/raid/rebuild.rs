//! A replacement member rebuilt from the other copies while the array
//! serves: which of its slots are not rebuilt yet (reads go elsewhere),
//! the mark in the headers that a restart resumes from, and the metadata
//! copies the members keep in step.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use iocache_device::{BlockDevice, DeviceError, IoKind};

use super::{ArrayError, CacheArray, MEMBER_HEADER_BYTES};

impl CacheArray {
    /// Whether global slot `slot` is on a replacement and not rebuilt yet.
    pub fn primary_pending(&self, slot: u64) -> bool {
        self.primary_pending[slot as usize].load(Ordering::Acquire)
    }

    /// Whether `mirror` is on a replacement and not rebuilt yet.
    pub fn mirror_pending(&self, mirror: u32) -> bool {
        self.mirror_pending[mirror as usize].load(Ordering::Acquire)
    }

    /// The mirror slots of member `i`.
    pub fn mirrors_of_member(&self, i: usize) -> std::ops::Range<u32> {
        let m = self.geometry.mirror_per_member as u32;
        i as u32 * m..(i as u32 + 1) * m
    }

    /// The global slots whose mirror is `mirror`: at most one, unless a
    /// change is under way (the caller checks under the slot's lock).
    pub fn owner_of_mirror(&self, mirror: u32) -> Option<u64> {
        self.mirror_of
            .iter()
            .position(|m| m.load(Ordering::Acquire) == mirror)
            .map(|slot| slot as u64)
    }

    /// Every mirror slot of member `i` in use, with the global slot using it.
    pub fn mirror_owners(&self, i: usize) -> Vec<(u32, u64)> {
        let mirrors = self.mirrors_of_member(i);
        self.mirror_of
            .iter()
            .enumerate()
            .filter_map(|(slot, m)| {
                let m = m.load(Ordering::Acquire);
                mirrors.contains(&m).then_some((m, slot as u64))
            })
            .collect()
    }

    /// Marks every line slot and mirror slot of member `i` as not rebuilt:
    /// reads of them are served elsewhere (a failed member's way) until the
    /// engine rebuilds each ([`CacheArray::rebuilt_primary`],
    /// [`CacheArray::rebuilt_mirror`]).
    pub fn mark_member_pending(&self, i: usize) {
        let mut marked = 0;
        for slot in (i as u64..self.geometry.slots()).step_by(self.members.len()) {
            marked += u64::from(!self.primary_pending[slot as usize].swap(true, Ordering::AcqRel));
        }
        for m in self.mirrors_of_member(i) {
            marked += u64::from(!self.mirror_pending[m as usize].swap(true, Ordering::AcqRel));
        }
        self.pending.fetch_add(marked, Ordering::AcqRel);
    }

    /// Slots and mirrors still to rebuild.
    pub fn pending(&self) -> u64 {
        self.pending.load(Ordering::Acquire)
    }

    /// The member being rebuilt, if any.
    pub fn rebuilding_member(&self) -> Option<usize> {
        let mask = self
            .header
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .rebuilding_mask;
        (mask != 0).then(|| mask.trailing_zeros() as usize)
    }

    /// Writes `data` at `line_offset` of global slot `slot` on its member,
    /// which is being rebuilt (the slot is still pending).
    pub fn write_rebuilt_primary(&self, slot: u64, line_offset: u64, data: &[u8]) -> Result<(), DeviceError> {
        let g = &self.geometry;
        let member = self.member_of_slot(slot);
        let offset =
            MEMBER_HEADER_BYTES + g.meta_bytes + (slot / g.members as u64) * g.line_bytes + line_offset;
        self.member_io(member, IoKind::Write, offset, data.len() as u64, |d| {
            d.write_at(data, offset)
        })
    }

    /// Global slot `slot` holds what it should on its member again.
    pub fn rebuilt_primary(&self, slot: u64) {
        if self.primary_pending[slot as usize].swap(false, Ordering::AcqRel) {
            self.pending.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Mirror slot `mirror` holds what it should again.
    pub fn rebuilt_mirror(&self, mirror: u32) {
        if self.mirror_pending[mirror as usize].swap(false, Ordering::AcqRel) {
            self.pending.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Puts `device`, named `name`, in the place of member `i` (failed,
    /// or live and retired by this) without waiting for what depended on
    /// it to be written back: every line slot and mirror slot of member
    /// `i` is marked not rebuilt first, so reads go to the other copy (a
    /// failed member's way), then the metadata is copied as
    /// [`CacheArray::replace_member`] does and the headers name the new
    /// device, marked as being rebuilt. The engine then copies each slot's
    /// line and each mirror's dirty sectors from their other copy
    /// ([`CacheArray::rebuilt_primary`], [`CacheArray::rebuilt_mirror`])
    /// and calls [`CacheArray::finish_rebuild`]. A restart before that
    /// finds the member still marked and rebuilds all of it again. Every
    /// other member must be live: their copies are the source.
    pub fn begin_rebuild(
        &self,
        i: usize,
        name: &str,
        device: Arc<dyn BlockDevice>,
    ) -> Result<(), ArrayError> {
        if let Some(k) = (0..self.members.len()).find(|&k| k != i && self.is_failed(k)) {
            return Err(ArrayError::Invalid(format!(
                "member {} has failed too: member {} cannot be rebuilt from the others",
                self.members[k].name(),
                self.members[i].name()
            )));
        }
        if let Some(k) = self.rebuilding_member().filter(|&k| k != i) {
            return Err(ArrayError::Invalid(format!(
                "member {} is being rebuilt: one rebuild at a time",
                self.members[k].name()
            )));
        }
        self.check_member_size(name, &*device)?;
        // A live member is out first, recorded in the headers: from the
        // mark below until the headers name the new device, dirty writes
        // skip its slots, and a restart that still names it must not
        // trust them.
        self.fail_member(i, &"retired by the operator: replaced");
        self.mark_member_pending(i);
        let installed = self.install(i, name, device, true);
        match &installed {
            Ok(()) => {
                log::warn!("cache array: {name} replaced member {i}; rebuilding it from the other copies")
            }
            Err(_) => self.clear_member_pending(i),
        }
        installed
    }

    /// The end of a rebuild of member `i` (every slot and mirror rebuilt):
    /// the mark goes (the headers say so once [`CacheArray::record_rebuilt`]
    /// writes them), and its mirror slots that no line uses are handed out
    /// again. Call with every engine shard locked, so that
    /// no mirror is released meanwhile.
    pub fn finish_rebuild(&self, i: usize) -> Result<(), ArrayError> {
        if self.is_failed(i) {
            return Err(ArrayError::Invalid(format!(
                "member {} failed while it was rebuilt",
                self.members[i].name()
            )));
        }
        let left = self.pending();
        if left > 0 {
            return Err(ArrayError::Invalid(format!(
                "{left} slots of the replacement are not rebuilt yet"
            )));
        }
        {
            let mut free = self.free_mirrors.lock().unwrap_or_else(|p| p.into_inner());
            let used: std::collections::HashSet<u32> =
                self.mirror_owners(i).into_iter().map(|(m, _)| m).collect();
            let listed: std::collections::HashSet<u32> = free[i].iter().copied().collect();
            let back: Vec<u32> = self
                .mirrors_of_member(i)
                .rev()
                .filter(|m| !used.contains(m) && !listed.contains(m))
                .collect();
            free[i].extend(back);
        }
        self.header
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .rebuilding_mask &= !(1 << i);
        Ok(())
    }

    /// Writes the headers once [`CacheArray::finish_rebuild`] is done (no
    /// lock of the engine's held): member `i`'s own header first, since
    /// alone at a restart a stale one would have everything it holds
    /// rebuilt again, from members that may be gone. Until they are
    /// written a restart rebuilds it again, which is safe.
    pub fn record_rebuilt(&self, i: usize) -> Result<(), ArrayError> {
        self.write_headers_from(i)?;
        log::warn!("cache array: member {} rebuilt", self.members[i].name());
        Ok(())
    }

    pub(super) fn clear_member_pending(&self, i: usize) {
        for slot in (i as u64..self.geometry.slots()).step_by(self.members.len()) {
            self.rebuilt_primary(slot);
        }
        for m in self.mirrors_of_member(i) {
            self.rebuilt_mirror(m);
        }
    }

    /// Copies member `source`'s metadata onto `device` and flushes it. The
    /// caller holds the metadata gate.
    pub(super) fn copy_metadata(&self, source: usize, device: &dyn BlockDevice) -> Result<(), DeviceError> {
        let meta_bytes = self.geometry.meta_bytes;
        let mut buf = vec![0u8; (1 << 20).min(meta_bytes.max(1)) as usize];
        let mut at = 0;
        while at < meta_bytes {
            let len = (meta_bytes - at).min(buf.len() as u64) as usize;
            let offset = MEMBER_HEADER_BYTES + at;
            self.member_io(source, IoKind::Read, offset, len as u64, |d| {
                d.read_at(&mut buf[..len], offset)
            })?;
            device.write_at(&buf[..len], offset)?;
            at += len as u64;
        }
        device.flush()
    }

    /// Gives every live member the metadata that reads use, the first live
    /// member's. A crash can leave the copies different (each member kept
    /// another part of the last writes), and a later start with that
    /// member gone would believe another copy than this start did.
    pub fn resync_metadata(&self) -> Result<(), ArrayError> {
        let live: Vec<usize> = (0..self.members.len()).filter(|&k| !self.is_failed(k)).collect();
        let Some((&source, others)) = live.split_first() else {
            return Ok(());
        };
        let _gate = self.meta_gate.write().unwrap_or_else(|p| p.into_inner());
        for &k in others {
            let Some(dev) = self.members[k].device() else {
                continue;
            };
            if let Err(e) = self.copy_metadata(source, &*dev) {
                self.fail_member(k, &e);
            }
        }
        Ok(())
    }

    /// A read of a slot or mirror a replacement has not rebuilt yet: an
    /// error that does not fail the member (the caller reads elsewhere).
    pub(super) fn not_rebuilt(&self, kind: IoKind, offset: u64, len: u64) -> DeviceError {
        DeviceError::Io {
            device: self.name.clone(),
            kind,
            offset,
            len,
            source: std::io::Error::other("this part of the replacement member is not rebuilt yet"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{get_u32, tests::members};
    use super::*;
    use iocache_device::MemDevice;

    #[test]
    fn a_rebuild_is_marked_in_the_headers_until_it_finishes() {
        let devs = members(2, 4 << 20);
        let array = CacheArray::open_or_create(devs.clone(), 4096, 25).unwrap();
        let g = array.geometry();
        let replacement: Arc<dyn BlockDevice> = Arc::new(MemDevice::new("m1b", 4 << 20));
        array.begin_rebuild(1, "m1b", replacement.clone()).unwrap();
        assert_eq!(array.rebuilding_member(), Some(1));
        assert_eq!(array.pending(), g.primary_per_member + g.mirror_per_member);
        // A slot of the replacement does not read until it is rebuilt;
        // the other member's do, and the member is not failed.
        let data_at = |slot: u64| g.meta_bytes + slot * g.line_bytes;
        let mut b = vec![0u8; 512];
        assert!(array.read_at(&mut b, data_at(1)).is_err());
        array.read_at(&mut b, data_at(0)).unwrap();
        assert_eq!(array.live_members(), 2);
        assert!(array.finish_rebuild(1).is_err(), "pending slots are left");
        // A restart meanwhile: version 3 headers, all of it to rebuild again.
        let mut header = vec![0u8; MEMBER_HEADER_BYTES as usize];
        devs[0].1.as_ref().unwrap().read_at(&mut header, 0).unwrap();
        assert_eq!(get_u32(&header, 8), 3);
        let restarted = vec![devs[0].clone(), ("m1b".to_string(), Some(replacement.clone()))];
        let again = CacheArray::open_or_create(restarted.clone(), 4096, 25).unwrap();
        assert_eq!(again.rebuilding_member(), Some(1));
        assert_eq!(again.pending(), g.primary_per_member + g.mirror_per_member);
        for slot in (1..g.slots()).step_by(2) {
            again.rebuilt_primary(slot);
        }
        for m in again.mirrors_of_member(1) {
            again.rebuilt_mirror(m);
        }
        again.finish_rebuild(1).unwrap();
        again.record_rebuilt(1).unwrap();
        again.read_at(&mut b, data_at(1)).unwrap();
        drop(again);
        let done = CacheArray::open_or_create(restarted, 4096, 25).unwrap();
        assert_eq!((done.rebuilding_member(), done.pending()), (None, 0));
        devs[0].1.as_ref().unwrap().read_at(&mut header, 0).unwrap();
        assert_eq!(get_u32(&header, 8), 2, "back to version 2 once rebuilt");
    }
}
