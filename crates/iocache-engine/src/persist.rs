//! Persistent metadata: what the engine writes to the cache device so that a
//! restart (clean or after a crash) finds every dirty line, and in mode
//! `all` the clean ones too. The on-device format is `iocache-format`'s;
//! this module decides what to write and when (docs/format.md, "Engine
//! write ordering").
//!
//! Three rules keep a crash from ever exposing wrong data:
//! 1. A record says "dirty" only for data that was durable on the cache
//!    device before the record was written: records are written at barriers
//!    (client FLUSH, FUA, shutdown), between two cache-device flushes, from a
//!    *shadow* of each slot that is updated only after its data write
//!    returned.
//! 2. A slot whose on-device record may say "dirty, line X" is never
//!    overwritten with another line's data before a later record for that
//!    slot is durable (the writer runs a barrier first).
//! 3. A dirty record is replaced by a clean or empty one only after the
//!    backend is flushed (every barrier flushes the backend first).
//!
//! Clean lines (mode `all`) carry a hash of their data, taken when a fill
//! wrote the whole line; after a crash a clean line is kept only if its data
//! still has that hash, so a slot reused since its record was written is
//! never mistaken for the old line, and only if it still equals the backend
//! (`recovery::check_clean_lines`): writes reach the backend between
//! barriers without any record changing.
//!
//! Dirty lines carry a checksum of their dirty sectors
//! ([`iocache_format::dirty_checksum`]), kept up to date from the data of
//! each write as it is noted, so that damaged dirty data is found at start-up
//! instead of being served or written back. A checksum on the device stops
//! matching as soon as a write lands in place on the sectors it covers,
//! which is legal between two barriers; so every dirty sector stays
//! verifiable by two more rules:
//! 4. Before a write overlapping sectors that a checksum on the device
//!    covers is issued, an *intent* naming the terms it leaves in those
//!    sectors (and, the first time since the record, the terms the checksum
//!    counts for them) is durable in the intent log, tied to the record
//!    (`Inner::write_intents`).
//! 5. A barrier takes no record of a slot with a write in flight: it waits
//!    for the shard's writes to land, new ones held back meanwhile, so the
//!    checksum it writes is over data that is on the device.
//!
//! A data write that a kill may tear (a copy into a cache file in memory,
//! cheaper than `pwrite`) is allowed only where no record on the device
//! may say its slot is dirty ([`Shadow::tearable`]): a torn sector then
//! either belongs to no record or fails a clean line's checks at restart.

use crate::dirty_sums::DirtySums;
use iocache_core::bitmap::{clear_range, count_range, set_range};
use iocache_core::{LineKey, SlotId};
use iocache_format::{encode_record, Layout, LineRecord, Persistence, Record, SlotDisk};

/// Bytes of the metadata images written as one unit (the O_DIRECT-friendly
/// block size; records never straddle a sector, see iocache-format).
pub const META_BLOCK_BYTES: usize = 4096;

/// The engine's view of what each slot of one shard holds on the device,
/// as far as executed I/O goes.
pub struct Shadow {
    enabled: bool,
    words: usize,
    keys: Vec<Option<LineKey>>,
    /// Per slot: `words` valid bits then `words` dirty bits.
    bits: Vec<u64>,
    /// Hash of the whole line's data, known after a full-line clean fill.
    hashes: Vec<Option<u64>>,
    /// Whether dirty records carry checksums.
    dirty_checksums: bool,
    /// The checksums of the dirty sectors as the executed writes left them.
    dirty_sums: DirtySums,
    /// Per slot: data writes begun ([`Shadow::begin_cache_write`]) and not
    /// yet noted. A barrier puts no checksum on such a slot.
    writes_in_flight: Vec<u32>,
    /// Per slot, `words` bits: the sectors covered by a checksum in a record
    /// that is, or may be, the slot's newest on the device (rule 4).
    checksummed_on_disk: Vec<u64>,
    /// Per slot, `words` bits: the sectors named by an intent tied to the
    /// slot's newest durable record (their base is on the device).
    intended: Vec<u64>,
    /// Per slot: bumped whenever a barrier takes the slot's record, so that
    /// an intent written for a later write is known to be tied to the
    /// record that is still the newest.
    record_epoch: Vec<u32>,
    /// Intents written ahead for the writes of a request, not yet begun.
    prewritten: Vec<Prewritten>,
    /// Data writes begun and not yet noted, in all slots.
    in_flight_total: u32,
    /// A barrier waits for the writes in flight to land: none may begin.
    draining: bool,
    /// Cache arrays: the mirror slot holding a copy of the dirty sectors.
    mirrors: Vec<Option<u32>>,
    /// Ordered write-back: the flush epoch of a dirty line (low 32 bits),
    /// and the epoch of the dirty record that may be on the device.
    epochs: Vec<Option<u32>>,
    disk_epochs: Vec<Option<u32>>,
    /// Slots changed since the last barrier took them.
    pending: Vec<SlotId>,
    queued: Vec<bool>,
    /// The line whose dirty record may be on the device for the slot (set
    /// when a barrier takes a dirty record, cleared once a later record for
    /// the slot is durable).
    disk_dirty: Vec<Option<LineKey>>,
}

/// An intent written ahead for a write of a request (`owner`: its
/// segment) to `[first, end)` of `slot`, when the slot's record epoch was
/// `epoch`.
struct Prewritten {
    owner: usize,
    slot: SlotId,
    first: u32,
    end: u32,
    epoch: u32,
}

/// A record a barrier will write: shard-local slot, and its content.
pub struct PlannedRecord {
    pub slot: SlotId,
    pub line: Option<LineRecord>,
}

impl Shadow {
    /// A shadow of `slots` slots of `words` bitmap words each; `enabled`
    /// with persistent metadata, `dirty_checksums` to checksum dirty data.
    pub fn new(
        slots: usize,
        words: usize,
        sectors_per_line: u32,
        enabled: bool,
        dirty_checksums: bool,
    ) -> Shadow {
        let n = if enabled { slots } else { 0 };
        let checked = if enabled && dirty_checksums { slots } else { 0 };
        Shadow {
            enabled,
            words,
            keys: vec![None; n],
            bits: vec![0; n * words * 2],
            hashes: vec![None; n],
            dirty_checksums: enabled && dirty_checksums,
            dirty_sums: DirtySums::new(checked, sectors_per_line, words),
            writes_in_flight: vec![0; checked],
            checksummed_on_disk: vec![0; checked * words],
            intended: vec![0; checked * words],
            record_epoch: vec![0; checked],
            prewritten: Vec::new(),
            in_flight_total: 0,
            draining: false,
            mirrors: vec![None; n],
            epochs: vec![None; n],
            disk_epochs: vec![None; n],
            pending: Vec::new(),
            queued: vec![false; n],
            disk_dirty: vec![None; n],
        }
    }

    fn valid_mut(&mut self, slot: SlotId) -> &mut [u64] {
        let at = slot as usize * self.words * 2;
        &mut self.bits[at..at + self.words]
    }

    fn dirty_mut(&mut self, slot: SlotId) -> &mut [u64] {
        let at = slot as usize * self.words * 2 + self.words;
        &mut self.bits[at..at + self.words]
    }

    fn valid(&self, slot: SlotId) -> &[u64] {
        let at = slot as usize * self.words * 2;
        &self.bits[at..at + self.words]
    }

    fn dirty(&self, slot: SlotId) -> &[u64] {
        let at = slot as usize * self.words * 2 + self.words;
        &self.bits[at..at + self.words]
    }

    fn checksummed_mut(&mut self, slot: SlotId) -> &mut [u64] {
        let at = slot as usize * self.words;
        &mut self.checksummed_on_disk[at..at + self.words]
    }

    /// `slot`'s dirty bits beside the dirty checksums (disjoint fields:
    /// no copy of the bits on the write path).
    fn dirty_and_sums(&mut self, slot: SlotId) -> (&[u64], &mut DirtySums) {
        let at = slot as usize * self.words * 2 + self.words;
        (&self.bits[at..at + self.words], &mut self.dirty_sums)
    }

    /// Clears dirty sectors `[first, end)` of `slot` (all with `None`),
    /// keeping the dirty checksums in step.
    fn clear_dirty(&mut self, slot: SlotId, range: Option<(u32, u32)>) {
        if self.dirty_checksums {
            let (before, sums) = self.dirty_and_sums(slot);
            sums.shrinking(slot, before);
        }
        match range {
            Some((first, end)) => clear_range(self.dirty_mut(slot), first, end),
            None => self.dirty_mut(slot).fill(0),
        }
        // An epoch only under ordered write-back: no scan otherwise.
        if self.epochs[slot as usize].is_some() && self.dirty(slot).iter().all(|&w| w == 0) {
            self.epochs[slot as usize] = None;
        }
        if self.dirty_checksums {
            // While a checksum on the device covers the slot, the terms of
            // its sectors are the bases of intents to come: kept.
            let at = slot as usize * self.words;
            if self.checksummed_on_disk[at..at + self.words]
                .iter()
                .all(|&w| w == 0)
            {
                let (after, sums) = self.dirty_and_sums(slot);
                sums.cleaned(slot, after);
            }
        }
    }

    /// Called before a data write to sectors `[first, end)` of `slot` is
    /// issued. `true`: the write is counted in flight until it is noted
    /// ([`Shadow::note_cache_write`], [`Shadow::cache_write_failed`] or
    /// [`Shadow::cache_write_cancelled`]). `false`, nothing counted: a
    /// checksum on the device covers some of those sectors and the write
    /// needs an intent first (rule 4), or a barrier drains the shard.
    pub fn begin_cache_write(&mut self, slot: SlotId, first: u32, end: u32) -> bool {
        if !self.dirty_checksums {
            return true;
        }
        if self.draining || self.checksum_covers(slot, first, end) {
            return false;
        }
        self.count_in_flight(slot);
        true
    }

    fn count_in_flight(&mut self, slot: SlotId) {
        self.writes_in_flight[slot as usize] += 1;
        self.in_flight_total += 1;
    }

    fn count_landed(&mut self, slot: SlotId, what: &str) {
        let in_flight = &mut self.writes_in_flight[slot as usize];
        *in_flight = in_flight
            .checked_sub(1)
            .unwrap_or_else(|| panic!("a {what} write was begun"));
        self.in_flight_total -= 1;
    }

    /// Data writes begun and not yet noted, in all slots of the shard.
    pub fn in_flight(&self) -> u32 {
        self.in_flight_total
    }

    /// While set, no write begins ([`Shadow::begin_cache_write`] sends the
    /// writer the slow way, behind the barrier).
    pub fn set_draining(&mut self, draining: bool) {
        self.draining = draining;
    }

    /// Whether a barrier waits for this shard's writes to land (a writer
    /// that notes one wakes it when none is left).
    pub fn draining(&self) -> bool {
        self.draining
    }

    /// The intent a write of `terms` (one per sector) to sectors `[first,
    /// first + terms.len())` of `slot` needs before it is issued: a pair per
    /// sector a checksum on the device covers, with that sector's base the
    /// first time since the record. Sectors whose base this does not know
    /// (data it never saw) are pushed to `unknown_bases`, their pairs left
    /// without one for the caller to fill in. Empty: no intent needed.
    pub fn intent_pairs(
        &self,
        slot: SlotId,
        first: u32,
        terms: &[u64],
        unknown_bases: &mut Vec<usize>,
    ) -> Vec<iocache_format::IntentPair> {
        let mut pairs = Vec::new();
        if !self.dirty_checksums {
            return pairs;
        }
        let at = slot as usize * self.words;
        let covered = &self.checksummed_on_disk[at..at + self.words];
        let intended = &self.intended[at..at + self.words];
        for (i, &term) in terms.iter().enumerate() {
            let s = first + i as u32;
            let (w, bit) = ((s / 64) as usize, 1u64 << (s % 64));
            if covered[w] & bit == 0 {
                continue;
            }
            let base = if intended[w] & bit != 0 {
                None
            } else {
                let base = self.dirty_sums.term(slot, s);
                if base.is_none() {
                    unknown_bases.push(pairs.len());
                }
                base
            };
            pairs.push(iocache_format::IntentPair {
                sector: s as u16,
                term,
                base,
            });
        }
        pairs
    }

    /// The intent of a write to `[first, end)` of `slot` is durable: the
    /// write is counted in flight (it may be issued), and the sectors it
    /// named have their base on the device.
    pub fn intent_durable(&mut self, slot: SlotId, first: u32, end: u32) {
        self.intent_named(slot, first, end);
        self.count_in_flight(slot);
    }

    fn intent_named(&mut self, slot: SlotId, first: u32, end: u32) {
        let at = slot as usize * self.words;
        for s in first..end {
            let (w, bit) = (at + (s / 64) as usize, 1u64 << (s % 64));
            self.intended[w] |= bit & self.checksummed_on_disk[w];
        }
        // Its record is rewritten by the next barrier, after which the
        // intent log may be reused.
        self.touch(slot);
    }

    /// The checksum term of the data last written to dirty sector `sector`
    /// of `slot`, if known.
    pub fn dirty_term(&self, slot: SlotId, sector: u32) -> Option<u64> {
        if !self.dirty_checksums {
            return None;
        }
        let dirty = self.dirty(slot);
        (dirty[(sector / 64) as usize] >> (sector % 64) & 1 == 1)
            .then(|| self.dirty_sums.term(slot, sector))
            .flatten()
    }

    /// The slot's record epoch (see [`Shadow::intent_prewritten`]).
    pub fn record_epoch(&self, slot: SlotId) -> u32 {
        self.record_epoch[slot as usize]
    }

    /// The intent of a request's later write to `[first, end)` of `slot`
    /// is durable, tied to the record of epoch `epoch`: the write may begin
    /// without another ([`Shadow::begin_prewritten`]) while that record is
    /// the newest.
    pub fn intent_prewritten(&mut self, owner: usize, slot: SlotId, first: u32, end: u32, epoch: u32) {
        self.intent_named(slot, first, end);
        self.prewritten.push(Prewritten {
            owner,
            slot,
            first,
            end,
            epoch,
        });
    }

    /// Begins a write whose intent `owner` wrote ahead: `true` (counted in
    /// flight) while the record it is tied to is still the newest and no
    /// barrier drains the shard.
    pub fn begin_prewritten(&mut self, owner: usize, slot: SlotId, first: u32, end: u32) -> bool {
        let Some(at) = self
            .prewritten
            .iter()
            .position(|p| p.owner == owner && p.slot == slot && p.first == first && p.end == end)
        else {
            return false;
        };
        let p = self.prewritten.swap_remove(at);
        if self.draining || p.epoch != self.record_epoch[slot as usize] {
            return false;
        }
        self.count_in_flight(slot);
        true
    }

    /// Begins a write of `owner` to `[first, end)` of `slot` if it may
    /// begin at once: no checksum on the device covers it, or its intent
    /// was written ahead ([`Shadow::begin_cache_write`],
    /// [`Shadow::begin_prewritten`]).
    pub fn begin_now(&mut self, owner: usize, slot: SlotId, first: u32, end: u32) -> bool {
        self.begin_cache_write(slot, first, end) || self.begin_prewritten(owner, slot, first, end)
    }

    /// Forgets what `owner` wrote ahead and did not use.
    pub fn drop_prewritten(&mut self, owner: usize) {
        self.prewritten.retain(|p| p.owner != owner);
    }

    /// Whether a begun write into `slot` may be torn by a kill (a sector
    /// left half old, half new): only if no record on the device may say
    /// the slot holds dirty data, whose unchecked sectors a restart would
    /// serve. A clean record's line is checked at a restart against its
    /// hash and the backend, which a torn sector fails; and no barrier
    /// takes a record of the slot until the write is noted, as it is
    /// counted in flight (rule 5). Without dirty checksums writes are not
    /// counted: never then. Without persistent metadata: always.
    pub fn tearable(&self, slot: SlotId) -> bool {
        !self.enabled || (self.dirty_checksums && self.disk_dirty[slot as usize].is_none())
    }

    /// Whether a checksum on the device may cover some of sectors
    /// `[first, end)` of `slot` (a write there needs an intent first).
    pub fn checksum_covers(&self, slot: SlotId, first: u32, end: u32) -> bool {
        if !self.dirty_checksums {
            return false;
        }
        let at = slot as usize * self.words;
        count_range(&self.checksummed_on_disk[at..at + self.words], first, end) > 0
    }

    /// A begun write of `slot` was not issued after all.
    pub fn cache_write_cancelled(&mut self, slot: SlotId) {
        if self.dirty_checksums {
            self.count_landed(slot, "cancelled");
        }
    }

    /// A begun write to `[first, end)` of `slot` failed: the sectors hold
    /// the old data or the new.
    pub fn cache_write_failed(&mut self, slot: SlotId, first: u32, end: u32) {
        if !self.dirty_checksums {
            return;
        }
        self.count_landed(slot, "failed");
        let (before, sums) = self.dirty_and_sums(slot);
        if count_range(before, first, end) > 0 {
            sums.unseen(slot, before, first, end);
        }
        // The next barrier records what the slot may hold now.
        self.touch(slot);
    }

    fn touch(&mut self, slot: SlotId) {
        if !self.queued[slot as usize] {
            self.queued[slot as usize] = true;
            self.pending.push(slot);
        }
    }

    /// Whether writing `key`'s data into `slot` must wait for a barrier:
    /// the slot's on-device record may still say it holds another line's
    /// dirty data (rule 2).
    pub fn blocks_reuse(&self, slot: SlotId, key: LineKey) -> bool {
        self.enabled && matches!(self.disk_dirty[slot as usize], Some(held) if held != key)
    }

    /// [`Shadow::blocks_reuse`] for a dirty write of ordered write-back's
    /// `epoch` (`None` for any other write): it also waits while a record on
    /// the device may say the line is dirty from another epoch, which a
    /// crash would otherwise give the new data (and a restart would write it
    /// back out of turn).
    pub fn blocks_write(&self, slot: SlotId, key: LineKey, epoch: Option<u32>) -> bool {
        self.blocks_reuse(slot, key)
            || (self.enabled
                && epoch.is_some()
                && self.disk_dirty[slot as usize] == Some(key)
                && self.disk_epochs[slot as usize] != epoch)
    }

    /// Sectors `[first, end)` of `key` were written into `slot`; `dirty`
    /// says whether they are now dirty; `full_line_hash` is the hash of the
    /// whole line when this write covered all of it; `sector_sums` are the
    /// [`iocache_format::sector_checksums`] of the data written (dirty
    /// writes, with dirty checksums). Ends a begun write.
    #[allow(clippy::too_many_arguments)]
    pub fn note_cache_write(
        &mut self,
        slot: SlotId,
        key: LineKey,
        first: u32,
        end: u32,
        dirty: bool,
        full_line_hash: Option<u64>,
        sector_sums: &[u64],
    ) {
        if !self.enabled {
            return;
        }
        if self.keys[slot as usize] != Some(key) {
            self.keys[slot as usize] = Some(key);
            self.valid_mut(slot).fill(0);
            self.dirty_mut(slot).fill(0);
            self.mirrors[slot as usize] = None;
            self.epochs[slot as usize] = None;
            if self.dirty_checksums {
                self.dirty_sums.line_replaced(slot);
            }
        }
        if self.dirty_checksums {
            self.count_landed(slot, "noted");
        }
        if !dirty {
            set_range(self.valid_mut(slot), first, end);
            self.clear_dirty(slot, Some((first, end)));
            self.hashes[slot as usize] = full_line_hash;
            self.touch(slot);
            return;
        }
        if self.dirty_checksums {
            let (before, sums) = self.dirty_and_sums(slot);
            if sector_sums.len() == (end - first) as usize {
                sums.written(slot, before, first, sector_sums);
            } else {
                sums.unseen(slot, before, first, end);
            }
        }
        set_range(self.valid_mut(slot), first, end);
        set_range(self.dirty_mut(slot), first, end);
        self.hashes[slot as usize] = None;
        self.touch(slot);
    }

    /// The dirty sectors of `slot` also live in mirror slot `mirror` (a
    /// cache array), or nowhere else on the cache (`None`).
    pub fn note_mirror(&mut self, slot: SlotId, mirror: Option<u32>) {
        if !self.enabled {
            return;
        }
        if self.mirrors[slot as usize] != mirror {
            self.mirrors[slot as usize] = mirror;
            self.touch(slot);
        }
    }

    /// The dirty line in `slot` belongs to flush `epoch` (ordered
    /// write-back; its low 32 bits), as its next record will say (the
    /// write that dirtied it already queued the record).
    pub fn note_epoch(&mut self, slot: SlotId, epoch: Option<u32>) {
        if self.enabled {
            self.epochs[slot as usize] = epoch;
        }
    }

    /// At start-up: the line restored in `slot` has `epoch`, as its record
    /// on the device says.
    pub fn restore_epoch(&mut self, slot: SlotId, epoch: Option<u32>) {
        if self.enabled {
            self.epochs[slot as usize] = epoch;
            self.disk_epochs[slot as usize] = epoch;
        }
    }

    /// Sectors `[first, end)` of `slot` were written back to the backend.
    pub fn note_write_back(&mut self, slot: SlotId, first: u32, end: u32) {
        if !self.enabled {
            return;
        }
        self.clear_dirty(slot, Some((first, end)));
        // The clean line's full data was not seen: it is not hashed.
        self.hashes[slot as usize] = None;
        self.touch(slot);
    }

    /// `slot` no longer holds anything.
    pub fn note_empty(&mut self, slot: SlotId) {
        if !self.enabled {
            return;
        }
        self.keys[slot as usize] = None;
        self.valid_mut(slot).fill(0);
        self.clear_dirty(slot, None);
        self.hashes[slot as usize] = None;
        self.mirrors[slot as usize] = None;
        self.epochs[slot as usize] = None;
        self.touch(slot);
    }

    /// Sectors `[first, end)` of `slot` are no longer trusted (a failed write).
    pub fn note_forget(&mut self, slot: SlotId, first: u32, end: u32) {
        if !self.enabled {
            return;
        }
        clear_range(self.valid_mut(slot), first, end);
        self.clear_dirty(slot, Some((first, end)));
        self.hashes[slot as usize] = None;
        if self.valid(slot).iter().all(|&w| w == 0) {
            self.keys[slot as usize] = None;
        }
        self.touch(slot);
    }

    /// Loads a restored line (start-up). `hash` is a clean line's data
    /// hash or a dirty line's verified checksum (which its record on the
    /// device carries); `terms`, a verified dirty line's per-sector terms
    /// as read; `rewrite`, its record verified with intents only (the
    /// next barrier writes it again).
    #[allow(clippy::too_many_arguments)]
    pub fn restore(
        &mut self,
        slot: SlotId,
        key: LineKey,
        valid: &[u64],
        dirty: &[u64],
        hash: Option<u64>,
        terms: Option<&[u64]>,
        rewrite: bool,
        dirty_on_disk: bool,
        mirror: Option<u32>,
    ) {
        if !self.enabled {
            return;
        }
        self.mirrors[slot as usize] = mirror;
        self.keys[slot as usize] = Some(key);
        self.valid_mut(slot).copy_from_slice(valid);
        self.dirty_mut(slot).copy_from_slice(dirty);
        let is_dirty = dirty.iter().any(|&w| w != 0);
        self.hashes[slot as usize] = if is_dirty { None } else { hash };
        if self.dirty_checksums {
            self.dirty_sums.line_replaced(slot);
            if let (true, Some(checksum)) = (is_dirty, hash) {
                match terms {
                    Some(terms) => self.dirty_sums.restored_terms(slot, terms),
                    None => self.dirty_sums.restored(slot, checksum),
                }
                self.checksummed_mut(slot).copy_from_slice(dirty);
            }
        }
        if dirty_on_disk {
            self.disk_dirty[slot as usize] = Some(key);
        }
        if rewrite {
            self.touch(slot);
        }
    }

    /// `slot` is free but its record on the device says `key` is dirty in
    /// it (start-up): block its reuse until a barrier rewrites the record.
    pub fn stale_dirty_record(&mut self, slot: SlotId, key: LineKey) {
        if !self.enabled {
            return;
        }
        self.disk_dirty[slot as usize] = Some(key);
        self.touch(slot);
    }

    /// The records a barrier writes for the slots changed since the last
    /// one (all slots with `everything`), in mode `mode`. Marks the slots
    /// whose record says dirty as possibly dirty on the device (rule 2).
    pub fn take_records(&mut self, mode: Persistence, everything: bool) -> Vec<PlannedRecord> {
        if !self.enabled {
            return Vec::new();
        }
        let slots: Vec<SlotId> = if everything {
            self.pending.clear();
            (0..self.keys.len() as SlotId).collect()
        } else {
            std::mem::take(&mut self.pending)
        };
        let mut out = Vec::with_capacity(slots.len());
        for slot in slots {
            self.queued[slot as usize] = false;
            if self.dirty_checksums {
                let epoch = &mut self.record_epoch[slot as usize];
                *epoch = epoch.wrapping_add(1);
            }
            let line = self.record_of(slot, mode, everything);
            if let Some(line) = &line {
                if line.dirty {
                    self.disk_dirty[slot as usize] = Some(LineKey {
                        volume: line.volume,
                        line_index: line.line_index,
                    });
                    self.disk_epochs[slot as usize] = line.epoch;
                    // With a checksum, or one the barrier works out by
                    // reading the line back: until a later record is
                    // durable, this one or the one before may be the
                    // newest, and both count.
                    if self.dirty_checksums {
                        let words = self.words;
                        let at = slot as usize * words;
                        for (on_disk, &d) in self.checksummed_on_disk[at..at + words]
                            .iter_mut()
                            .zip(&line.dirty_bits)
                        {
                            *on_disk |= d;
                        }
                    }
                }
            }
            out.push(PlannedRecord { slot, line });
        }
        out
    }

    /// A barrier failed: its slots are written by the next one.
    pub fn requeue(&mut self, records: &[PlannedRecord]) {
        for record in records {
            self.touch(record.slot);
        }
    }

    /// A barrier read back the dirty data of `slot` whose terms it did not
    /// know, and put the checksum of `dirty` into the record it writes:
    /// `terms` has one term per sector of the line.
    pub fn checksum_read_back(&mut self, slot: SlotId, dirty: &[u64], terms: &[u64]) {
        if !self.dirty_checksums {
            return;
        }
        self.dirty_sums.learned(slot, dirty, terms);
        for (on_disk, &d) in self.checksummed_mut(slot).iter_mut().zip(dirty) {
            *on_disk |= d;
        }
    }

    /// After the records of a barrier are durable: slots whose record is
    /// not dirty no longer block reuse, and intents tied to the records
    /// they replace no longer count.
    pub fn records_durable(&mut self, records: &[PlannedRecord]) {
        for record in records {
            if self.dirty_checksums {
                let at = record.slot as usize * self.words;
                self.intended[at..at + self.words].fill(0);
            }
            if !record.line.as_ref().is_some_and(|l| l.dirty) {
                self.disk_dirty[record.slot as usize] = None;
            }
            if self.dirty_checksums {
                let covered = match &record.line {
                    Some(line) if line.dirty && line.data_hash.is_some() => Some(line.dirty_bits.clone()),
                    _ => None,
                };
                let on_disk = self.checksummed_mut(record.slot);
                match covered {
                    Some(bits) => on_disk.copy_from_slice(&bits),
                    None => on_disk.fill(0),
                }
                // Terms kept for a checksum no longer on the device go.
                let (after, sums) = self.dirty_and_sums(record.slot);
                sums.cleaned(record.slot, after);
            }
        }
    }

    /// What the device should say about `slot`. With `unhashed_clean`
    /// (a clean shutdown's full snapshot), clean lines are recorded without
    /// a hash: the superblock's clean state vouches for them.
    fn record_of(&self, slot: SlotId, mode: Persistence, unhashed_clean: bool) -> Option<LineRecord> {
        let key = self.keys[slot as usize]?;
        let valid = self.valid(slot);
        let dirty = self.dirty(slot);
        if valid.iter().all(|&w| w == 0) {
            return None;
        }
        let is_dirty = dirty.iter().any(|&w| w != 0);
        if !is_dirty {
            let hash = self.hashes[slot as usize];
            if mode != Persistence::All || (hash.is_none() && !unhashed_clean) {
                return None;
            }
            return Some(LineRecord {
                volume: key.volume,
                line_index: key.line_index,
                dirty: false,
                data_hash: hash,
                valid: valid.to_vec(),
                dirty_bits: vec![0; self.words],
                mirror: None,
                epoch: None,
            });
        }
        // A write in flight may land in place on the sectors a checksum
        // would cover, before or after the record: no checksum then.
        let checksum = if self.dirty_checksums && self.writes_in_flight[slot as usize] == 0 {
            self.dirty_sums.checksum(slot, dirty)
        } else {
            None
        };
        Some(LineRecord {
            volume: key.volume,
            line_index: key.line_index,
            dirty: true,
            data_hash: checksum,
            valid: valid.to_vec(),
            dirty_bits: dirty.to_vec(),
            mirror: self.mirrors[slot as usize],
            epoch: self.epochs[slot as usize],
        })
    }
}

/// The in-memory images of the two record regions and, per slot, which
/// copy holds the newest durable record: the writer always writes the other
/// copy, so a torn write never damages the newest durable record.
///
/// Sequences come from one counter for the whole device, so records of
/// different slots are ordered too: when a crash leaves two slots claiming
/// the same line, recovery knows which is newer.
pub struct RecordWriter {
    pub layout: Layout,
    images: [Vec<u8>; 2],
    slots: Vec<SlotDisk>,
    next_sequence: u64,
    /// Blocks of each image changed since they were last written.
    changed: [Vec<usize>; 2],
    changed_flag: [Vec<bool>; 2],
    /// Per slot: a record was staged but never made durable (its barrier
    /// failed). It may be on the device, or reach it with a neighbour's
    /// block, newer than the durable one: the slot's next record is
    /// written even when empty, over it.
    unsettled: Vec<bool>,
}

impl RecordWriter {
    /// A writer over regions read from the device (`images`) and their
    /// per-slot state as loaded.
    pub fn new(layout: Layout, images: [Vec<u8>; 2], slots: Vec<SlotDisk>) -> RecordWriter {
        let blocks = (layout.copy_region_bytes as usize).div_ceil(META_BLOCK_BYTES);
        let next_sequence = slots.iter().map(|s| s.sequence).max().unwrap_or(0) + 1;
        let unsettled = vec![false; slots.len()];
        RecordWriter {
            layout,
            images,
            slots,
            next_sequence,
            changed: [Vec::new(), Vec::new()],
            changed_flag: [vec![false; blocks], vec![false; blocks]],
            unsettled,
        }
    }

    /// Whether the newest record of `slot` is empty or absent, so writing
    /// an empty record again can be skipped.
    pub fn is_blank(&self, slot: u64, line: &Option<LineRecord>) -> bool {
        line.is_none()
            && !self.unsettled[slot as usize]
            && self.slots[slot as usize].newest_copy.is_none_or(|copy| {
                let at = (slot * self.layout.record_bytes) as usize;
                let bytes = &self.images[copy as usize][at..at + self.layout.record_bytes as usize];
                matches!(
                    iocache_format::decode_record(bytes, &self.layout),
                    iocache_format::RecordCopy::Valid(Record { line: None, .. })
                )
            })
    }

    /// Encodes the next record of `slot` into the copy that is not the
    /// newest; returns that copy and the record's sequence (to pass to
    /// [`RecordWriter::durable`]).
    pub fn stage(
        &mut self,
        slot: u64,
        line: Option<LineRecord>,
    ) -> Result<(u8, u64), iocache_format::FormatError> {
        let disk = self.slots[slot as usize];
        let copy = match disk.newest_copy {
            Some(c) => 1 - c,
            None => 0,
        };
        let sequence = self.next_sequence;
        self.next_sequence += 1;
        let record = Record { sequence, line };
        self.unsettled[slot as usize] = true;
        let bytes = self.layout.record_bytes as usize;
        let at = slot as usize * bytes;
        encode_record(
            &record,
            &self.layout,
            &mut self.images[copy as usize][at..at + bytes],
        )?;
        let first = at / META_BLOCK_BYTES;
        let last = (at + bytes - 1) / META_BLOCK_BYTES;
        for block in first..=last {
            if !self.changed_flag[copy as usize][block] {
                self.changed_flag[copy as usize][block] = true;
                self.changed[copy as usize].push(block);
            }
        }
        Ok((copy, sequence))
    }

    /// The runs of changed bytes to write: (device offset, bytes), and
    /// forgets them as changed.
    pub fn take_writes(&mut self) -> Vec<(u64, &[u8])> {
        let mut runs: Vec<(usize, usize, usize)> = Vec::new(); // (copy, first block, end block)
        for copy in 0..2 {
            let mut blocks = std::mem::take(&mut self.changed[copy]);
            blocks.sort_unstable();
            for &block in &blocks {
                self.changed_flag[copy][block] = false;
                match runs.last_mut() {
                    Some((c, _, end)) if *c == copy && *end == block => *end += 1,
                    _ => runs.push((copy, block, block + 1)),
                }
            }
        }
        let region = self.layout.copy_region_bytes as usize;
        runs.into_iter()
            .map(|(copy, first, end)| {
                let start = first * META_BLOCK_BYTES;
                let stop = (end * META_BLOCK_BYTES).min(region);
                let offset = self.layout.metadata_offset + (copy * region + start) as u64;
                (offset, &self.images[copy][start..stop])
            })
            .collect()
    }

    /// The sequence of `slot`'s newest durable record.
    pub fn durable_sequence(&self, slot: u64) -> u64 {
        self.slots[slot as usize].sequence
    }

    /// The staged record of `slot` in `copy`, numbered `sequence`, is durable.
    pub fn durable(&mut self, slot: u64, copy: u8, sequence: u64) {
        let disk = &mut self.slots[slot as usize];
        disk.sequence = sequence;
        disk.newest_copy = Some(copy);
        self.unsettled[slot as usize] = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A barrier that failed after staging a dirty record leaves it in the
    /// image (and maybe on the device): the slot's next record, even an
    /// empty one, must be written over it, never skipped as blank.
    #[test]
    fn a_record_staged_but_never_durable_is_written_over_even_when_empty() {
        let layout = Layout::for_slots(4096, 16).unwrap();
        let empty = iocache_format::empty_region(&layout).unwrap();
        let disk = SlotDisk {
            sequence: 0,
            newest_copy: Some(0),
        };
        let words = layout.bitmap_words();
        let mut writer = RecordWriter::new(layout, [empty.clone(), empty], vec![disk; 16]);
        assert!(writer.is_blank(3, &None));
        let dirty = LineRecord {
            volume: 1,
            line_index: 7,
            dirty: true,
            data_hash: None,
            valid: vec![1; words],
            dirty_bits: vec![1; words],
            mirror: None,
            epoch: None,
        };
        writer.stage(3, Some(dirty)).unwrap();
        let _ = writer.take_writes();
        // The barrier failed: nothing made durable.
        assert!(
            !writer.is_blank(3, &None),
            "the staged dirty record must be replaced"
        );
        let (copy, sequence) = writer.stage(3, None).unwrap();
        writer.durable(3, copy, sequence);
        assert!(writer.is_blank(3, &None));
        assert!(writer.is_blank(4, &None), "other slots are not concerned");
    }

    /// Ordered write-back: once a barrier took a record calling a line
    /// dirty from epoch 3, a dirty write of epoch 8 into the same slot waits
    /// for a barrier (a crash would give the new data the old epoch), a
    /// write of epoch 3 does not, and neither waits once a record saying
    /// clean is durable.
    #[test]
    fn a_dirty_write_of_another_epoch_waits_for_the_record() {
        let key = LineKey {
            volume: 0,
            line_index: 9,
        };
        let mut shadow = Shadow::new(4, 1, 8, true, false);
        shadow.note_cache_write(2, key, 0, 8, true, None, &[]);
        shadow.note_epoch(2, Some(3));
        let records = shadow.take_records(Persistence::Dirty, false);
        assert_eq!(records[0].line.as_ref().unwrap().epoch, Some(3));
        shadow.records_durable(&records);
        assert!(shadow.blocks_write(2, key, Some(8)));
        assert!(!shadow.blocks_write(2, key, Some(3)));
        assert!(!shadow.blocks_write(2, key, None), "clean writes are not held");
        // Written back, and a record saying so made durable.
        shadow.note_write_back(2, 0, 8);
        let records = shadow.take_records(Persistence::Dirty, false);
        shadow.records_durable(&records);
        assert!(!shadow.blocks_write(2, key, Some(8)));
    }
}
