//! Cache RAID (SYSTOR'14 §8): one cache spread over several devices, clean
//! lines striped across them (RAID-0) and dirty lines mirrored (RAID-1), so
//! that losing one cache device loses no acknowledged write.
//!
//! [`CacheArray`] is a [`BlockDevice`] whose address space is the one the
//! engine's on-device format expects (superblock, metadata, then one line
//! per slot); underneath:
//! - the superblock and metadata bytes are written to every live member (any
//!   survivor can load the cache);
//! - slot `g`'s line lives on member `g % N` (striping);
//! - each member also has `mirror_per_member` mirror slots; a dirty line
//!   gets one on another member ([`CacheArray::ensure_mirror`]) and the
//!   engine writes its dirty sectors to both. Clean sectors live only in
//!   the primary slot (the backend holds them too).
//!
//! The engine caps each shard's dirty lines at the mirror slots a failure
//! leaves usable, `(live members - 1) * mirror_per_member` (zero with one
//! member left: every write is then written through), through the core's
//! dirty-line cap; the shards share the pool, so when it runs out (or a
//! release still waits for a metadata barrier) a line's dirty writes also go
//! to the backend ([`MirrorState::Through`]). Either way every acknowledged
//! dirty sector is on two devices.
//!
//! A member that fails an I/O is marked failed for good: the array's member
//! headers (4 KiB at the start of each member, below the address space)
//! record which members failed, with an epoch, so a restart never trusts a
//! member that missed writes. A failed (or retired) member can be replaced
//! by a new device while the array serves ([`CacheArray::replace_member`]):
//! the metadata is copied to it, its slots come back empty, and its
//! generation in the headers goes up, so the device it replaced is never
//! trusted again even if it comes back. Header layout, little endian:
//!
//! ```text
//!  0  magic        [u8; 8]  "IOCARRAY"
//!  8  version      u32      1, or 2 once a member was replaced
//! 12  member       u32      this member's index
//! 16  members      u32      member count, 2..=16
//! 20  mirror_pct   u32      share of each member's line slots kept for mirrors
//! 24  array_uuid   [u8; 16]
//! 40  epoch        u64      incremented at each header rewrite
//! 48  failed_mask  u64      bit i: member i failed
//! 56  line_bytes   u64
//! 64  meta_bytes   u64      bytes of superblock + metadata (mirrored)
//! 72  primary      u64      primary slots per member
//! 80  mirrors      u64      mirror slots per member
//! 88  generations  [u64; 16] version 2: per member, how often it was replaced
//! 216 rebuilding   u64      version 3: bit i: member i is still being rebuilt
//! 224 zero         ...
//! 4092 crc32c      u32      of bytes 0..4092
//! ```

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use iocache_device::{check_range, BlockDevice, DeviceError, IoKind};

use crate::layout::layout_for_slots;

mod rebuild;

/// Bytes of the member header that precedes the array's address space.
pub const MEMBER_HEADER_BYTES: u64 = 4096;
/// Most members an array may have (the failed mask is a u64; kept small).
pub const MEMBERS_MAX: usize = 16;
const MAGIC: [u8; 8] = *b"IOCARRAY";
/// Headers are written in version 1 until a member is replaced (so that a
/// build before replacements reads an array that never had one), and in
/// version 3 only while a replacement is being rebuilt (a build before
/// rebuilds then takes that member for a failed one, which is safe).
const HEADER_VERSION: u32 = 3;
/// `mirror_of` value: no mirror.
const NO_MIRROR: u32 = u32::MAX;
/// `mirror_of` value: no mirror; the line's dirty writes went to the backend too.
const THROUGH: u32 = u32::MAX - 1;

/// What protects a slot's dirty sectors besides the slot itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MirrorState {
    /// Clean line or empty slot.
    None,
    /// Mirror slot `m` holds a copy of the dirty sectors.
    Mirrored(u32),
    /// No mirror; every dirty write of the line was also written to the backend.
    Through,
}

/// Geometry shared by all members.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ArrayGeometry {
    pub members: usize,
    pub line_bytes: u64,
    /// Superblock and metadata bytes (the virtual device's data offset).
    pub meta_bytes: u64,
    pub primary_per_member: u64,
    pub mirror_per_member: u64,
    pub mirror_percent: u32,
}

impl ArrayGeometry {
    /// The largest geometry for `members` devices of at least `member_bytes`
    /// each: `mirror_percent` of each member's line slots are mirror slots.
    pub fn fitting(
        members: usize,
        member_bytes: u64,
        line_bytes: u64,
        mirror_percent: u32,
    ) -> Result<ArrayGeometry, String> {
        if !(2..=MEMBERS_MAX).contains(&members) {
            return Err(format!(
                "a cache array needs 2 to {MEMBERS_MAX} devices, got {members}"
            ));
        }
        if !(1..=50).contains(&mirror_percent) {
            return Err(format!("mirror share {mirror_percent}% is outside 1..=50"));
        }
        let mirrors_for =
            |primary: u64| (primary * u64::from(mirror_percent)).div_ceil(u64::from(100 - mirror_percent));
        let fits = |primary: u64| -> Option<ArrayGeometry> {
            let slots = primary.checked_mul(members as u64)?;
            let layout = layout_for_slots(line_bytes, slots.max(1)).ok()?;
            let mirrors = mirrors_for(primary);
            let need = MEMBER_HEADER_BYTES
                .checked_add(layout.data_offset)?
                .checked_add((primary + mirrors).checked_mul(line_bytes)?)?;
            (need <= member_bytes).then_some(ArrayGeometry {
                members,
                line_bytes,
                meta_bytes: layout.data_offset,
                primary_per_member: primary,
                mirror_per_member: mirrors,
                mirror_percent,
            })
        };
        let (mut low, mut high) = (0u64, member_bytes / line_bytes);
        let mut best = None;
        while low <= high {
            let mid = low + (high - low) / 2;
            match fits(mid) {
                Some(g) if mid > 0 => {
                    best = Some(g);
                    low = mid + 1;
                }
                _ => {
                    if mid == 0 {
                        break;
                    }
                    high = mid - 1;
                }
            }
        }
        best.ok_or_else(|| {
            format!("cache array devices of {member_bytes} bytes are too small for one {line_bytes}-byte line each")
        })
    }

    /// Lines the cache holds: the primary slots of all members.
    /// The bytes a member needs: its header, the metadata, its line and
    /// mirror slots.
    pub fn member_bytes(&self) -> u64 {
        MEMBER_HEADER_BYTES
            + self.meta_bytes
            + (self.primary_per_member + self.mirror_per_member) * self.line_bytes
    }

    pub fn slots(&self) -> u64 {
        self.primary_per_member * self.members as u64
    }
}

struct Member {
    /// Its name and device, replaced together by `replace_member`.
    device: RwLock<MemberDevice>,
    failed: AtomicBool,
}

struct MemberDevice {
    name: String,
    device: Option<Arc<dyn BlockDevice>>,
}

impl Member {
    fn name(&self) -> String {
        read(&self.device).name.clone()
    }

    fn device(&self) -> Option<Arc<dyn BlockDevice>> {
        read(&self.device).device.clone()
    }
}

fn read<T>(lock: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(|p| p.into_inner())
}

/// What the headers say beside the failures: rewritten under one lock.
struct HeaderState {
    epoch: u64,
    generations: [u64; MEMBERS_MAX],
    /// Bit i: member i is a replacement still being rebuilt.
    rebuilding_mask: u64,
}

/// Counters of the array, for stats.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ArrayStats {
    pub members: Vec<(String, bool)>,
    /// Members replaced by another device while the array served.
    pub replacements: u64,
    pub mirror_slots: u64,
    pub mirror_slots_used: u64,
    /// Dirty-sector writes that also went to a mirror.
    pub mirror_writes: u64,
    /// Reads served from a mirror because the primary member failed.
    pub mirror_reads: u64,
    /// Dirty writes sent to the backend too because no mirror was free.
    pub through_writes: u64,
    /// The replacement member being rebuilt, and how many of its line
    /// slots and mirror slots are still to rebuild.
    pub rebuilding: Option<usize>,
    pub rebuild_pending: u64,
}

/// A cache spread over several devices; see the module documentation.
pub struct CacheArray {
    name: String,
    geometry: ArrayGeometry,
    members: Vec<Member>,
    uuid: [u8; 16],
    /// Serializes header rewrites; holds the current epoch and generations.
    header: Mutex<HeaderState>,
    /// Held shared by metadata writes, exclusively while the metadata is
    /// copied to a replacement member (so that it misses none).
    meta_gate: RwLock<()>,
    replacements: AtomicU64,
    /// Per global slot: mirror slot, `NO_MIRROR` or `THROUGH`.
    mirror_of: Vec<AtomicU32>,
    /// Per global slot, and per mirror slot: on a replacement member and
    /// not rebuilt yet, so not to be read (its data is elsewhere).
    primary_pending: Vec<AtomicBool>,
    mirror_pending: Vec<AtomicBool>,
    /// How many of those are set.
    pending: AtomicU64,
    /// Free mirror slots (global mirror ids), per member.
    free_mirrors: Mutex<Vec<Vec<u32>>>,
    mirror_writes: AtomicU64,
    mirror_reads: AtomicU64,
    through_writes: AtomicU64,
    /// Bumped whenever a member fails (the engine reacts once per change).
    failures: AtomicU64,
}

impl std::fmt::Debug for CacheArray {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CacheArray")
            .field("name", &self.name)
            .field("geometry", &self.geometry)
            .finish_non_exhaustive()
    }
}

/// Why an array could not be opened or created.
#[derive(Debug, thiserror::Error)]
pub enum ArrayError {
    #[error("cache array: {0}")]
    Invalid(String),
    #[error("cache array: {0}")]
    Device(#[from] DeviceError),
}

#[derive(Debug)]
struct Header {
    member: u32,
    members: u32,
    mirror_percent: u32,
    uuid: [u8; 16],
    epoch: u64,
    failed_mask: u64,
    line_bytes: u64,
    meta_bytes: u64,
    primary: u64,
    mirrors: u64,
    generations: [u64; MEMBERS_MAX],
    rebuilding_mask: u64,
}

fn get_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}
fn get_u64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

impl Header {
    fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; MEMBER_HEADER_BYTES as usize];
        b[0..8].copy_from_slice(&MAGIC);
        let version: u32 = if self.rebuilding_mask != 0 {
            HEADER_VERSION
        } else if self.generations.iter().all(|&g| g == 0) {
            1
        } else {
            2
        };
        b[8..12].copy_from_slice(&version.to_le_bytes());
        b[12..16].copy_from_slice(&self.member.to_le_bytes());
        b[16..20].copy_from_slice(&self.members.to_le_bytes());
        b[20..24].copy_from_slice(&self.mirror_percent.to_le_bytes());
        b[24..40].copy_from_slice(&self.uuid);
        b[40..48].copy_from_slice(&self.epoch.to_le_bytes());
        b[48..56].copy_from_slice(&self.failed_mask.to_le_bytes());
        b[56..64].copy_from_slice(&self.line_bytes.to_le_bytes());
        b[64..72].copy_from_slice(&self.meta_bytes.to_le_bytes());
        b[72..80].copy_from_slice(&self.primary.to_le_bytes());
        b[80..88].copy_from_slice(&self.mirrors.to_le_bytes());
        for (i, g) in self.generations.iter().enumerate() {
            b[88 + 8 * i..96 + 8 * i].copy_from_slice(&g.to_le_bytes());
        }
        b[216..224].copy_from_slice(&self.rebuilding_mask.to_le_bytes());
        let crc = crc32c::crc32c(&b[..4092]);
        b[4092..].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// `Ok(None)` for a blank header, `Err` naming the problem for anything
    /// that is neither blank nor a valid header.
    fn decode(b: &[u8]) -> Result<Option<Header>, String> {
        if b.iter().all(|&x| x == 0) {
            return Ok(None);
        }
        if b[0..8] != MAGIC {
            return Err(format!(
                "magic {:02x?} at offset 0, expected \"IOCARRAY\"",
                &b[0..8]
            ));
        }
        let crc = crc32c::crc32c(&b[..4092]);
        if get_u32(b, 4092) != crc {
            return Err(format!(
                "crc32c at offset 4092 is {:#010x}, computed {crc:#010x}",
                get_u32(b, 4092)
            ));
        }
        let version = get_u32(b, 8);
        if !(1..=HEADER_VERSION).contains(&version) {
            return Err(format!(
                "header version {version} at offset 8, this build reads 1 to {HEADER_VERSION}"
            ));
        }
        let mut generations = [0u64; MEMBERS_MAX];
        if version >= 2 {
            for (i, g) in generations.iter_mut().enumerate() {
                *g = get_u64(b, 88 + 8 * i);
            }
        }
        let h = Header {
            member: get_u32(b, 12),
            members: get_u32(b, 16),
            mirror_percent: get_u32(b, 20),
            uuid: b[24..40].try_into().expect("16 bytes"),
            epoch: get_u64(b, 40),
            failed_mask: get_u64(b, 48),
            line_bytes: get_u64(b, 56),
            meta_bytes: get_u64(b, 64),
            primary: get_u64(b, 72),
            mirrors: get_u64(b, 80),
            generations,
            rebuilding_mask: if version >= 3 { get_u64(b, 216) } else { 0 },
        };
        if !(2..=MEMBERS_MAX as u32).contains(&h.members) || h.member >= h.members {
            return Err(format!(
                "member {} of {} at offsets 12 and 16",
                h.member, h.members
            ));
        }
        Ok(Some(h))
    }
}

fn new_uuid() -> [u8; 16] {
    let mut uuid = [0u8; 16];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        use std::io::Read;
        let _ = f.read_exact(&mut uuid);
    }
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    for (i, byte) in t.to_le_bytes().iter().enumerate() {
        uuid[i] ^= byte;
    }
    uuid
}

impl CacheArray {
    /// Opens the array on `members` (name, device or `None` if it could not
    /// be opened), creating it when every member is blank. A member that is
    /// missing, blank or unreadable while others hold the array, or that the
    /// newest header marks failed, is a failed member: the array runs
    /// degraded (at least one member must be live). `line_bytes` and
    /// `mirror_percent` shape a new array; an existing one must have the
    /// same line size.
    pub fn open_or_create(
        members: Vec<(String, Option<Arc<dyn BlockDevice>>)>,
        line_bytes: u64,
        mirror_percent: u32,
    ) -> Result<CacheArray, ArrayError> {
        let n = members.len();
        let mut headers = Vec::with_capacity(n);
        for (name, device) in &members {
            let found = match device {
                None => Err("missing".to_string()),
                Some(dev) => {
                    let mut b = vec![0u8; MEMBER_HEADER_BYTES as usize];
                    match dev.read_at(&mut b, 0) {
                        Ok(()) => Header::decode(&b).map_err(|e| format!("{name}: {e}")),
                        Err(e) => Err(e.to_string()),
                    }
                }
            };
            headers.push(found);
        }
        // The array is the one most members belong to (then the newest);
        // its newest header says which members failed.
        let valid: Vec<&Header> = headers
            .iter()
            .filter_map(|h| h.as_ref().ok().and_then(|h| h.as_ref()))
            .collect();
        let newest = valid
            .iter()
            .max_by_key(|h| (valid.iter().filter(|o| o.uuid == h.uuid).count(), h.epoch))
            .copied();
        let Some(newest) = newest else {
            // A new array: every member must be present and blank.
            for ((name, _), h) in members.iter().zip(&headers) {
                if let Err(e) = h {
                    return Err(ArrayError::Invalid(format!(
                        "cannot create an array: device {name}: {e}"
                    )));
                }
            }
            let smallest = members
                .iter()
                .map(|(_, d)| d.as_ref().expect("checked present").len_bytes())
                .min()
                .unwrap_or(0);
            let geometry = ArrayGeometry::fitting(n, smallest, line_bytes, mirror_percent)
                .map_err(ArrayError::Invalid)?;
            let array = CacheArray::build(
                members,
                geometry,
                new_uuid(),
                HeaderState {
                    epoch: 0,
                    generations: [0; MEMBERS_MAX],
                    rebuilding_mask: 0,
                },
                0,
            );
            array.write_headers()?;
            return Ok(array);
        };
        if newest.members as usize != n {
            return Err(ArrayError::Invalid(format!(
                "the devices hold an array of {} members, {n} were given",
                newest.members
            )));
        }
        if newest.line_bytes != line_bytes {
            return Err(ArrayError::Invalid(format!(
                "the array has {}-byte lines, the configuration asks for {line_bytes}",
                newest.line_bytes
            )));
        }
        let geometry = ArrayGeometry {
            members: n,
            line_bytes: newest.line_bytes,
            meta_bytes: newest.meta_bytes,
            primary_per_member: newest.primary,
            mirror_per_member: newest.mirrors,
            mirror_percent: newest.mirror_percent,
        };
        let check = ArrayGeometry::fitting(n, u64::MAX / 4, line_bytes, geometry.mirror_percent.max(1));
        if check.is_err() {
            return Err(ArrayError::Invalid(format!(
                "the array header's geometry {geometry:?} is unusable"
            )));
        }
        let (uuid, epoch, generations) = (newest.uuid, newest.epoch, newest.generations);
        let mut failed_mask = newest.failed_mask;
        let recorded_rebuilding = newest.rebuilding_mask;
        for (i, ((name, device), h)) in members.iter().zip(&headers).enumerate() {
            let problem = match h {
                Err(e) => Some(e.clone()),
                Ok(None) => Some("blank (a replacement device?)".to_string()),
                Ok(Some(h)) if h.uuid != uuid => Some("belongs to another array".to_string()),
                Ok(Some(h)) if h.member as usize != i => Some(format!(
                    "is member {} of the array, given as member {i}",
                    h.member
                )),
                Ok(Some(h)) if h.generations[i] != generations[i] => Some(format!(
                    "was replaced by another device (its generation is {}, the array's {})",
                    h.generations[i], generations[i]
                )),
                Ok(Some(_)) => None,
            };
            if let Some(problem) = problem {
                if failed_mask & (1 << i) == 0 {
                    log::warn!("cache array member {name}: {problem}; running without it");
                }
                failed_mask |= 1 << i;
            } else if let Some(dev) = device {
                let need = MEMBER_HEADER_BYTES
                    + geometry.meta_bytes
                    + (geometry.primary_per_member + geometry.mirror_per_member) * line_bytes;
                if dev.len_bytes() < need {
                    return Err(ArrayError::Invalid(format!(
                        "member {name} has {} bytes, the array needs {need}",
                        dev.len_bytes()
                    )));
                }
            }
        }
        if failed_mask.count_ones() as usize >= n {
            return Err(ArrayError::Invalid(
                "no member of the cache array is usable".into(),
            ));
        }
        // A failed member is not rebuilt (it is replaced again).
        let rebuilding_mask = recorded_rebuilding & !failed_mask;
        // A member cut off in a rewrite of the headers gets the newest.
        let stale = headers
            .iter()
            .enumerate()
            .any(|(i, h)| failed_mask & (1 << i) == 0 && matches!(h, Ok(Some(h)) if h.epoch != epoch));
        let changed = failed_mask != newest.failed_mask || rebuilding_mask != recorded_rebuilding || stale;
        let array = CacheArray::build(
            members,
            geometry,
            uuid,
            HeaderState {
                epoch,
                generations,
                rebuilding_mask,
            },
            failed_mask,
        );
        // What a rebuild cut short had done is not known: all of it again.
        for i in (0..n).filter(|i| rebuilding_mask & (1 << i) != 0) {
            array.mark_member_pending(i);
        }
        if changed {
            array.write_headers()?;
        }
        Ok(array)
    }

    fn build(
        members: Vec<(String, Option<Arc<dyn BlockDevice>>)>,
        geometry: ArrayGeometry,
        uuid: [u8; 16],
        header: HeaderState,
        failed_mask: u64,
    ) -> CacheArray {
        let name = format!(
            "array({})",
            members
                .iter()
                .map(|(n, _)| n.as_str())
                .collect::<Vec<_>>()
                .join(",")
        );
        let m = geometry.mirror_per_member as u32;
        let members_len = members.len();
        let free = (0..members.len() as u32)
            .map(|k| (k * m..(k + 1) * m).rev().collect())
            .collect();
        CacheArray {
            name,
            members: members
                .into_iter()
                .enumerate()
                .map(|(i, (name, device))| Member {
                    device: RwLock::new(MemberDevice { name, device }),
                    failed: AtomicBool::new(failed_mask & (1 << i) != 0),
                })
                .collect(),
            uuid,
            header: Mutex::new(header),
            meta_gate: RwLock::new(()),
            replacements: AtomicU64::new(0),
            mirror_of: (0..geometry.slots()).map(|_| AtomicU32::new(NO_MIRROR)).collect(),
            primary_pending: (0..geometry.slots()).map(|_| AtomicBool::new(false)).collect(),
            mirror_pending: (0..geometry.mirror_per_member * members_len as u64)
                .map(|_| AtomicBool::new(false))
                .collect(),
            pending: AtomicU64::new(0),
            free_mirrors: Mutex::new(free),
            mirror_writes: AtomicU64::new(0),
            mirror_reads: AtomicU64::new(0),
            through_writes: AtomicU64::new(0),
            failures: AtomicU64::new(failed_mask.count_ones().into()),
            geometry,
        }
    }

    pub fn geometry(&self) -> ArrayGeometry {
        self.geometry
    }

    fn failed_mask(&self) -> u64 {
        self.members
            .iter()
            .enumerate()
            .filter(|(_, m)| m.failed.load(Ordering::Acquire))
            .fold(0, |mask, (i, _)| mask | 1 << i)
    }

    /// Rewrites every live member's header with the current failed mask;
    /// returns the mask of members whose header was written (an error only
    /// when none was).
    fn write_headers(&self) -> Result<u64, DeviceError> {
        self.write_headers_from(0)
    }

    /// [`CacheArray::write_headers`], member `first`'s header first: what
    /// a restart finds if it is cut in between (its header may be the only
    /// one a restart reads).
    fn write_headers_from(&self, first: usize) -> Result<u64, DeviceError> {
        let mut state = self.header.lock().unwrap_or_else(|p| p.into_inner());
        state.epoch += 1;
        let failed_mask = self.failed_mask();
        let mut last_error = None;
        let mut written = 0u64;
        let n = self.members.len();
        for i in (0..n).map(|k| (first + k) % n) {
            let member = &self.members[i];
            let Some(dev) = member.device() else { continue };
            if failed_mask & (1 << i) != 0 {
                continue;
            }
            let header = Header {
                member: i as u32,
                members: self.members.len() as u32,
                mirror_percent: self.geometry.mirror_percent,
                uuid: self.uuid,
                epoch: state.epoch,
                failed_mask,
                line_bytes: self.geometry.line_bytes,
                meta_bytes: self.geometry.meta_bytes,
                primary: self.geometry.primary_per_member,
                mirrors: self.geometry.mirror_per_member,
                generations: state.generations,
                rebuilding_mask: state.rebuilding_mask,
            };
            match dev.write_at(&header.encode(), 0).and_then(|()| dev.flush()) {
                Ok(()) => written |= 1 << i,
                Err(e) => last_error = Some(e),
            }
        }
        match (written, last_error) {
            (0, Some(e)) => Err(e),
            _ => Ok(written),
        }
    }

    /// Marks member `i` failed (once) and records it in the other members'
    /// headers before returning, so no restart trusts its stale copy.
    fn fail_member(&self, i: usize, cause: &dyn std::fmt::Display) {
        if self.members[i].failed.swap(true, Ordering::AcqRel) {
            return;
        }
        log::warn!(
            "cache array member {} failed ({cause}); running degraded on the others",
            self.members[i].name()
        );
        self.failures.fetch_add(1, Ordering::AcqRel);
        // Its free mirror slots are gone; used ones are found by the engine.
        self.free_mirrors.lock().unwrap_or_else(|p| p.into_inner())[i].clear();
        // A replacement that fails is not rebuilt any further.
        self.header
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .rebuilding_mask &= !(1 << i);
        self.clear_member_pending(i);
        if let Err(e) = self.write_headers() {
            log::error!(
                "cache array: recording the failure of {} failed: {e}",
                self.members[i].name()
            );
        }
    }

    /// The index of the member named `name` (as the array was given it, or
    /// as a replacement named it).
    pub fn member_index(&self, name: &str) -> Option<usize> {
        self.members.iter().position(|m| read(&m.device).name == name)
    }

    /// Whether member `i` is out of service (failed or retired).
    pub fn member_failed(&self, i: usize) -> bool {
        self.is_failed(i)
    }

    /// The member holding global slot `slot`'s line.
    pub fn member_of(&self, slot: u64) -> usize {
        self.member_of_slot(slot)
    }

    /// Takes member `i` out of service as a failure would, recorded in the
    /// headers; the engine then writes back what depended on it. Refused
    /// when no other member is live.
    pub fn retire_member(&self, i: usize) -> Result<(), ArrayError> {
        if self.live_members() <= 1 && !self.is_failed(i) {
            return Err(ArrayError::Invalid(format!(
                "member {} is the last live member",
                self.members[i].name()
            )));
        }
        self.fail_member(i, &"retired by the operator");
        Ok(())
    }

    /// Whether `device` is large enough to be a member (an error naming
    /// both sizes if not).
    pub fn check_member_size(&self, name: &str, device: &dyn BlockDevice) -> Result<(), ArrayError> {
        let need = self.geometry.member_bytes();
        if device.len_bytes() < need {
            return Err(ArrayError::Invalid(format!(
                "{name} has {} bytes, a member of this array needs {need}",
                device.len_bytes()
            )));
        }
        Ok(())
    }

    /// Puts `device`, named `name`, in the place of member `i`, which must
    /// have failed (or been retired) and have no mirror in use (the engine
    /// has written back what depended on it). The new device's header is
    /// zeroed first, then the array's metadata is copied to it while
    /// metadata writes wait, and it is live: its line slots are empty (the
    /// engine puts them back in service). Its generation goes up in every
    /// live header, so the device it replaces is not trusted again at a
    /// restart; its mirror slots are handed out only once its own header
    /// says so. A crash before the headers are written leaves the new
    /// device blank to a restart (a failed member); after, it is a member.
    /// If its own header cannot be written, it is failed again.
    pub fn replace_member(
        &self,
        i: usize,
        name: &str,
        device: Arc<dyn BlockDevice>,
    ) -> Result<(), ArrayError> {
        let g = self.geometry;
        if !self.is_failed(i) {
            return Err(ArrayError::Invalid(format!(
                "member {} is live: only a failed or retired member is replaced",
                self.members[i].name()
            )));
        }
        self.check_member_size(name, &*device)?;
        let mirrors = (i as u64 * g.mirror_per_member) as u32..((i as u64 + 1) * g.mirror_per_member) as u32;
        if let Some(slot) = self
            .mirror_of
            .iter()
            .position(|m| mirrors.contains(&m.load(Ordering::Acquire)))
        {
            return Err(ArrayError::Invalid(format!(
                "slot {slot} still has its mirror on the member being replaced"
            )));
        }
        self.install(i, name, device, false)?;
        self.free_mirrors.lock().unwrap_or_else(|p| p.into_inner())[i] = mirrors.rev().collect();
        log::warn!("cache array: {name} replaced member {i}; its slots come back empty");
        Ok(())
    }

    /// Copies the metadata to `device` while metadata writes wait, puts it
    /// in member `i`'s place (live, its generation one up; `rebuilding`:
    /// marked as being rebuilt) and writes every live member's header.
    fn install(
        &self,
        i: usize,
        name: &str,
        device: Arc<dyn BlockDevice>,
        rebuilding: bool,
    ) -> Result<(), ArrayError> {
        let source = (0..self.members.len())
            .find(|&k| k != i && !self.is_failed(k))
            .ok_or_else(|| ArrayError::Invalid("no live member to copy the metadata from".into()))?;
        // Blank before anything else: a device that held another array's
        // header never looks like a member while it is being filled.
        device.write_at(&[0u8; MEMBER_HEADER_BYTES as usize], 0)?;
        device.flush()?;
        {
            let _gate = self.meta_gate.write().unwrap_or_else(|p| p.into_inner());
            self.copy_metadata(source, &*device)?;
            *self.members[i].device.write().unwrap_or_else(|p| p.into_inner()) = MemberDevice {
                name: name.to_string(),
                device: Some(device),
            };
            let mut header = self.header.lock().unwrap_or_else(|p| p.into_inner());
            header.generations[i] += 1;
            if rebuilding {
                header.rebuilding_mask |= 1 << i;
            }
            drop(header);
            self.members[i].failed.store(false, Ordering::Release);
        }
        let written = self.write_headers();
        if written.as_ref().map_or(true, |mask| mask & (1 << i) == 0) {
            let why = match &written {
                Err(e) => e.to_string(),
                Ok(_) => "its header could not be written".to_string(),
            };
            self.fail_member(i, &why);
            return Err(ArrayError::Invalid(format!(
                "{name} did not take the array's header: {why}"
            )));
        }
        self.replacements.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// How many member failures the array has seen (changes when one fails).
    pub fn failures(&self) -> u64 {
        self.failures.load(Ordering::Acquire)
    }

    pub fn live_members(&self) -> usize {
        self.members
            .iter()
            .filter(|m| !m.failed.load(Ordering::Acquire))
            .count()
    }

    /// Dirty lines the array can mirror with the members it has left.
    pub fn dirty_cap(&self) -> u64 {
        (self.live_members().saturating_sub(1) as u64) * self.geometry.mirror_per_member
    }

    fn member_of_slot(&self, slot: u64) -> usize {
        (slot % self.geometry.members as u64) as usize
    }

    fn member_of_mirror(&self, mirror: u32) -> usize {
        (u64::from(mirror) / self.geometry.mirror_per_member) as usize
    }

    fn is_failed(&self, member: usize) -> bool {
        self.members[member].failed.load(Ordering::Acquire)
    }

    /// Whether global slot `slot`'s line is not to be read from its slot:
    /// its member failed, or is a replacement that has not rebuilt it yet.
    pub fn primary_failed(&self, slot: u64) -> bool {
        self.is_failed(self.member_of_slot(slot))
            || self.primary_pending[slot as usize].load(Ordering::Acquire)
    }

    /// Whether `mirror` is not to be read: its member failed, or is a
    /// replacement that has not rebuilt it yet.
    pub fn mirror_failed(&self, mirror: u32) -> bool {
        self.is_failed(self.member_of_mirror(mirror))
            || self.mirror_pending[mirror as usize].load(Ordering::Acquire)
    }

    pub fn mirror_state(&self, slot: u64) -> MirrorState {
        match self.mirror_of[slot as usize].load(Ordering::Acquire) {
            NO_MIRROR => MirrorState::None,
            THROUGH => MirrorState::Through,
            m => MirrorState::Mirrored(m),
        }
    }

    /// The mirror state of a slot about to take dirty data: its current one,
    /// or a new mirror on a live member other than the slot's, or `Through`
    /// when none is free.
    pub fn ensure_mirror(&self, slot: u64) -> MirrorState {
        let state = self.mirror_state(slot);
        if state != MirrorState::None {
            return state;
        }
        let primary = self.member_of_slot(slot);
        let chosen = {
            let mut free = self.free_mirrors.lock().unwrap_or_else(|p| p.into_inner());
            let best = (0..self.members.len())
                .filter(|&k| k != primary && !self.is_failed(k))
                .max_by_key(|&k| {
                    (
                        free[k].len(),
                        std::cmp::Reverse((k + self.members.len() - primary) % self.members.len()),
                    )
                });
            best.and_then(|k| free[k].pop())
        };
        let value = chosen.unwrap_or(THROUGH);
        self.mirror_of[slot as usize].store(value, Ordering::Release);
        match chosen {
            Some(m) => MirrorState::Mirrored(m),
            None => MirrorState::Through,
        }
    }

    /// Frees `slot`'s mirror (its line is clean, and no durable record
    /// still names the mirror).
    pub fn release_mirror(&self, slot: u64) {
        let old = self.mirror_of[slot as usize].swap(NO_MIRROR, Ordering::AcqRel);
        if old != NO_MIRROR && old != THROUGH {
            let member = self.member_of_mirror(old);
            if !self.is_failed(member) {
                self.free_mirrors.lock().unwrap_or_else(|p| p.into_inner())[member].push(old);
            }
        }
    }

    /// Gives `slot` the state a recovered record says it had.
    pub fn claim(&self, slot: u64, state: MirrorState) -> Result<(), String> {
        let value = match state {
            MirrorState::None => return Ok(()),
            MirrorState::Through => THROUGH,
            MirrorState::Mirrored(m) => {
                if u64::from(m) >= self.geometry.mirror_per_member * self.geometry.members as u64 {
                    return Err(format!("mirror slot {m} does not exist"));
                }
                let member = self.member_of_mirror(m);
                if member == self.member_of_slot(slot) {
                    return Err(format!("mirror slot {m} is on the line's own member"));
                }
                let mut free = self.free_mirrors.lock().unwrap_or_else(|p| p.into_inner());
                let list = &mut free[member];
                match list.iter().position(|&f| f == m) {
                    Some(at) => {
                        list.swap_remove(at);
                    }
                    None if self.is_failed(member) => {}
                    None => return Err(format!("mirror slot {m} is claimed twice")),
                }
                m
            }
        };
        self.mirror_of[slot as usize].store(value, Ordering::Release);
        Ok(())
    }

    fn mirror_location(&self, mirror: u32, line_offset: u64) -> (usize, u64) {
        let g = &self.geometry;
        let member = self.member_of_mirror(mirror);
        let local = u64::from(mirror) % g.mirror_per_member;
        let offset =
            MEMBER_HEADER_BYTES + g.meta_bytes + (g.primary_per_member + local) * g.line_bytes + line_offset;
        (member, offset)
    }

    fn member_io(
        &self,
        member: usize,
        kind: IoKind,
        offset: u64,
        len: u64,
        io: impl FnOnce(&dyn BlockDevice) -> Result<(), DeviceError>,
    ) -> Result<(), DeviceError> {
        self.member_io_unless(member, kind, offset, len, || false, io)
    }

    /// [`CacheArray::member_io`], refused (without failing the member)
    /// when `not_rebuilt` holds once the device is in hand: a replacement
    /// is marked not rebuilt before it takes the member's place, so a
    /// read that finds the new device also finds the mark.
    fn member_io_unless(
        &self,
        member: usize,
        kind: IoKind,
        offset: u64,
        len: u64,
        not_rebuilt: impl Fn() -> bool,
        io: impl FnOnce(&dyn BlockDevice) -> Result<(), DeviceError>,
    ) -> Result<(), DeviceError> {
        let m = &self.members[member];
        let unavailable = || DeviceError::Io {
            device: m.name(),
            kind,
            offset,
            len,
            source: std::io::Error::other("cache array member has failed"),
        };
        let Some(dev) = m.device() else {
            return Err(unavailable());
        };
        if m.failed.load(Ordering::Acquire) {
            return Err(unavailable());
        }
        if not_rebuilt() {
            return Err(self.not_rebuilt(kind, offset, len));
        }
        io(&*dev).inspect_err(|e| self.fail_member(member, e))
    }

    /// Writes `data` at `line_offset` of mirror slot `mirror`.
    pub fn write_mirror(&self, mirror: u32, line_offset: u64, data: &[u8]) -> Result<(), DeviceError> {
        let (member, offset) = self.mirror_location(mirror, line_offset);
        self.member_io(member, IoKind::Write, offset, data.len() as u64, |d| {
            d.write_at(data, offset)
        })?;
        self.mirror_writes.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Reads `buf` from `line_offset` of mirror slot `mirror`.
    pub fn read_mirror(&self, mirror: u32, line_offset: u64, buf: &mut [u8]) -> Result<(), DeviceError> {
        let (member, offset) = self.mirror_location(mirror, line_offset);
        let len = buf.len() as u64;
        self.member_io_unless(
            member,
            IoKind::Read,
            offset,
            len,
            || self.mirror_pending(mirror),
            |d| d.read_at(buf, offset),
        )?;
        self.mirror_reads.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    pub fn note_through_write(&self) {
        self.through_writes.fetch_add(1, Ordering::Relaxed);
    }

    pub fn stats(&self) -> ArrayStats {
        let total = self.geometry.mirror_per_member * self.members.len() as u64;
        let used = self
            .mirror_of
            .iter()
            .filter(|m| !matches!(m.load(Ordering::Relaxed), NO_MIRROR | THROUGH))
            .count() as u64;
        ArrayStats {
            members: self
                .members
                .iter()
                .map(|m| (m.name(), m.failed.load(Ordering::Relaxed)))
                .collect(),
            replacements: self.replacements.load(Ordering::Relaxed),
            mirror_slots: total,
            mirror_slots_used: used,
            mirror_writes: self.mirror_writes.load(Ordering::Relaxed),
            mirror_reads: self.mirror_reads.load(Ordering::Relaxed),
            through_writes: self.through_writes.load(Ordering::Relaxed),
            rebuilding: self.rebuilding_member(),
            rebuild_pending: self.pending(),
        }
    }

    /// Calls `f(member, member_offset, range)` for each piece of the
    /// virtual range `offset..offset + len`: the metadata part once per
    /// call with `member = None`, data parts per line.
    fn pieces(
        &self,
        offset: u64,
        len: u64,
        mut f: impl FnMut(Option<(usize, u64)>, u64, std::ops::Range<usize>) -> Result<(), DeviceError>,
    ) -> Result<(), DeviceError> {
        let g = &self.geometry;
        let end = offset + len;
        let mut at = offset;
        while at < end {
            let start = (at - offset) as usize;
            if at < g.meta_bytes {
                let stop = end.min(g.meta_bytes);
                f(None, MEMBER_HEADER_BYTES + at, start..(stop - offset) as usize)?;
                at = stop;
            } else {
                let slot = (at - g.meta_bytes) / g.line_bytes;
                let within = (at - g.meta_bytes) % g.line_bytes;
                let stop = end.min(at - within + g.line_bytes);
                let member = self.member_of_slot(slot);
                let local = slot / g.members as u64;
                let member_offset = MEMBER_HEADER_BYTES + g.meta_bytes + local * g.line_bytes + within;
                f(
                    Some((member, slot)),
                    member_offset,
                    start..(stop - offset) as usize,
                )?;
                at = stop;
            }
        }
        Ok(())
    }
}

impl BlockDevice for CacheArray {
    fn len_bytes(&self) -> u64 {
        self.geometry.meta_bytes + self.geometry.slots() * self.geometry.line_bytes
    }

    /// Every member in place reads at memory speed (a failed member's
    /// reads go to the mirror, another member).
    fn reads_at_memory_speed(&self) -> bool {
        self.members.iter().all(|m| {
            read(&m.device)
                .device
                .as_ref()
                .is_none_or(|d| d.reads_at_memory_speed())
        })
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), DeviceError> {
        check_range(self, IoKind::Read, offset, buf.len() as u64)?;
        self.pieces(offset, buf.len() as u64, |member, at, range| {
            let chunk = &mut buf[range];
            let len = chunk.len() as u64;
            match member {
                Some((k, slot)) => self.member_io_unless(
                    k,
                    IoKind::Read,
                    at,
                    len,
                    || self.primary_pending(slot),
                    |d| d.read_at(chunk, at),
                ),
                None => {
                    // Metadata: any live member has it.
                    let mut last = None;
                    for k in 0..self.members.len() {
                        if self.is_failed(k) {
                            continue;
                        }
                        match self.member_io(k, IoKind::Read, at, len, |d| d.read_at(chunk, at)) {
                            Ok(()) => return Ok(()),
                            Err(e) => last = Some(e),
                        }
                    }
                    Err(last.unwrap_or_else(|| self.no_member(IoKind::Read, at, len)))
                }
            }
        })
    }

    fn write_at(&self, data: &[u8], offset: u64) -> Result<(), DeviceError> {
        check_range(self, IoKind::Write, offset, data.len() as u64)?;
        self.pieces(offset, data.len() as u64, |member, at, range| {
            let chunk = &data[range];
            let len = chunk.len() as u64;
            match member {
                Some((k, _)) => self.member_io(k, IoKind::Write, at, len, |d| d.write_at(chunk, at)),
                None => {
                    let _gate = read(&self.meta_gate);
                    self.on_live_members(IoKind::Write, at, len, |d| d.write_at(chunk, at))
                }
            }
        })
    }

    fn flush(&self) -> Result<(), DeviceError> {
        self.on_live_members(IoKind::Flush, 0, 0, |d| d.flush())
    }

    fn alignment(&self) -> usize {
        self.members
            .iter()
            .filter_map(|m| m.device().map(|d| d.alignment()))
            .max()
            .unwrap_or(1)
    }

    fn name(&self) -> &str {
        &self.name
    }
}

impl CacheArray {
    fn no_member(&self, kind: IoKind, offset: u64, len: u64) -> DeviceError {
        DeviceError::Io {
            device: self.name.clone(),
            kind,
            offset,
            len,
            source: std::io::Error::other("no member of the cache array is live"),
        }
    }

    /// Runs `io` on every live member; succeeds if at least one did (the
    /// others are marked failed).
    fn on_live_members(
        &self,
        kind: IoKind,
        offset: u64,
        len: u64,
        io: impl Fn(&dyn BlockDevice) -> Result<(), DeviceError>,
    ) -> Result<(), DeviceError> {
        let mut ok = 0;
        let mut last = None;
        for k in 0..self.members.len() {
            if self.is_failed(k) {
                continue;
            }
            match self.member_io(k, kind, offset, len, &io) {
                Ok(()) => ok += 1,
                Err(e) => last = Some(e),
            }
        }
        if ok > 0 {
            Ok(())
        } else {
            Err(last.unwrap_or_else(|| self.no_member(kind, offset, len)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use iocache_device::MemDevice;

    pub(super) fn members(n: usize, bytes: u64) -> Vec<(String, Option<Arc<dyn BlockDevice>>)> {
        (0..n)
            .map(|i| {
                let dev: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(format!("m{i}"), bytes));
                (format!("m{i}"), Some(dev))
            })
            .collect()
    }

    #[test]
    fn geometry_fits_the_smallest_member() {
        let g = ArrayGeometry::fitting(2, 8 << 20, 4096, 25).unwrap();
        let need = MEMBER_HEADER_BYTES + g.meta_bytes + (g.primary_per_member + g.mirror_per_member) * 4096;
        assert!(need <= 8 << 20);
        // One more primary slot would not fit.
        let bigger = ArrayGeometry::fitting(2, need - 1, 4096, 25).unwrap();
        assert!(bigger.primary_per_member < g.primary_per_member);
        assert!(g.mirror_per_member * 3 >= g.primary_per_member, "{g:?}");
        assert!(ArrayGeometry::fitting(1, 8 << 20, 4096, 25).is_err());
        assert!(ArrayGeometry::fitting(2, 8 << 20, 4096, 0).is_err());
    }

    #[test]
    fn metadata_is_on_every_member_and_lines_are_striped() {
        let devs = members(2, 4 << 20);
        let raw: Vec<Arc<dyn BlockDevice>> = devs.iter().map(|(_, d)| d.clone().unwrap()).collect();
        let array = CacheArray::open_or_create(devs, 4096, 25).unwrap();
        let g = array.geometry();
        array.write_at(&[7u8; 512], 512).unwrap();
        // Two lines at once: slot 0 on member 0, slot 1 on member 1.
        let mut lines = vec![1u8; 4096];
        lines.extend(vec![2u8; 4096]);
        array.write_at(&lines, g.meta_bytes).unwrap();
        let mut b = vec![0u8; 512];
        for dev in &raw {
            dev.read_at(&mut b, MEMBER_HEADER_BYTES + 512).unwrap();
            assert_eq!(b, vec![7u8; 512]);
        }
        raw[0]
            .read_at(&mut b, MEMBER_HEADER_BYTES + g.meta_bytes)
            .unwrap();
        assert_eq!(b, vec![1u8; 512]);
        raw[1]
            .read_at(&mut b, MEMBER_HEADER_BYTES + g.meta_bytes)
            .unwrap();
        assert_eq!(b, vec![2u8; 512]);
        let mut back = vec![0u8; 8192];
        array.read_at(&mut back, g.meta_bytes).unwrap();
        assert_eq!(back, lines);
    }

    #[test]
    fn mirrors_go_to_another_member_and_come_back() {
        let array = CacheArray::open_or_create(members(3, 4 << 20), 4096, 25).unwrap();
        let per = array.geometry().mirror_per_member;
        for slot in 0..30u64 {
            let MirrorState::Mirrored(m) = array.ensure_mirror(slot) else {
                panic!("slot {slot} got no mirror")
            };
            assert_ne!(
                u64::from(m) / per,
                slot % 3,
                "slot {slot}: mirror on its own member"
            );
            assert_eq!(array.ensure_mirror(slot), MirrorState::Mirrored(m));
        }
        assert_eq!(array.stats().mirror_slots_used, 30);
        for slot in 0..30u64 {
            array.release_mirror(slot);
        }
        assert_eq!(array.stats().mirror_slots_used, 0);
        // Exhaust the pool: the rest are written through.
        let total = per * 3;
        let mut through = 0;
        for slot in 0..array.geometry().slots() {
            if array.ensure_mirror(slot) == MirrorState::Through {
                through += 1;
            }
        }
        assert_eq!(array.stats().mirror_slots_used, total);
        assert_eq!(through, array.geometry().slots() - total);
    }

    #[test]
    fn a_failed_member_is_remembered_across_reopen() {
        let devs = members(2, 4 << 20);
        let array = CacheArray::open_or_create(devs.clone(), 4096, 25).unwrap();
        assert_eq!(array.dirty_cap(), array.geometry().mirror_per_member);
        array.fail_member(1, &array.no_member(IoKind::Write, 0, 0));
        assert_eq!(array.live_members(), 1);
        assert_eq!(array.dirty_cap(), 0);
        assert!(array.primary_failed(1) && !array.primary_failed(0));
        // Metadata still readable and writable on the survivor.
        array.write_at(&[9u8; 512], 0).unwrap();
        drop(array);
        let again = CacheArray::open_or_create(devs.clone(), 4096, 25).unwrap();
        assert_eq!(
            again.live_members(),
            1,
            "member 1's stale copy must not be trusted"
        );
        let mut b = vec![0u8; 512];
        again.read_at(&mut b, 0).unwrap();
        assert_eq!(b, vec![9u8; 512]);
        // The wrong line size is refused, naming both.
        let e = CacheArray::open_or_create(devs, 8192, 25)
            .unwrap_err()
            .to_string();
        assert!(e.contains("4096") && e.contains("8192"), "{e}");
    }

    #[test]
    fn corrupt_foreign_or_misplaced_members_are_failed_members() {
        let devs = members(3, 4 << 20);
        CacheArray::open_or_create(devs.clone(), 4096, 25).unwrap();
        // A flipped bit in member 2's header: its crc no longer matches.
        let dev = devs[2].1.clone().unwrap();
        let mut b = vec![0u8; 4096];
        dev.read_at(&mut b, 0).unwrap();
        b[50] ^= 1;
        dev.write_at(&b, 0).unwrap();
        let array = CacheArray::open_or_create(devs.clone(), 4096, 25).unwrap();
        assert_eq!(array.stats().members.iter().filter(|m| m.1).count(), 1);
        assert!(array.stats().members[2].1, "the corrupt member is failed");
        assert!(Header::decode(&b).unwrap_err().contains("crc32c"));
        // A member of another array in its place, and two members swapped.
        let other = members(2, 4 << 20);
        CacheArray::open_or_create(other.clone(), 4096, 25).unwrap();
        let mixed = vec![devs[0].clone(), other[1].clone(), devs[1].clone()];
        let array = CacheArray::open_or_create(mixed, 4096, 25).unwrap();
        let failed: Vec<bool> = array.stats().members.iter().map(|m| m.1).collect();
        assert_eq!(
            failed,
            vec![false, true, true],
            "foreign member 1 and misplaced member 2"
        );
    }

    #[test]
    fn a_missing_member_runs_degraded_but_not_every_member() {
        let mut devs = members(2, 4 << 20);
        CacheArray::open_or_create(devs.clone(), 4096, 25).unwrap();
        devs[1].1 = None;
        let array = CacheArray::open_or_create(devs.clone(), 4096, 25).unwrap();
        assert_eq!(array.live_members(), 1);
        devs[0].1 = None;
        let e = CacheArray::open_or_create(devs, 4096, 25)
            .unwrap_err()
            .to_string();
        assert!(e.contains("m0"), "{e}");
    }
}
