//! ReCA's categories want different line sizes (4 KiB
//! for random workloads, 128 KiB for sequential ones), and on a category
//! change the paper "reconstructs" its cache table for the new line size
//! (§4.2: large lines split into small ones, small ones merged into large
//! ones whose missing pages are marked and filled later). A core [`Cache`]
//! has one line size for life, so [`relayout`] builds a *new* cache of the
//! same capacity in bytes and the new line size that holds every cached
//! sector of the old one (the valid and dirty bitmaps are per sector, so a
//! merged line is simply partly valid: the paper's missing-page bits).
//!
//! When the lines do not fit (merging scattered small lines can need more
//! large lines than the capacity holds), lines with dirty sectors are kept
//! first, then those with the most valid sectors; the dirty sectors of a
//! line that is not kept are written back ([`Relayout::write_backs`], ops
//! on the *old* cache's slots, to run before it is dropped), so no dirty
//! sector is ever lost; clean sectors that do not fit are dropped and
//! counted. Splitting always fits.
//!
//! It is a pure function: the caller swaps the caches. The simulator does
//! (`iocache sim --adapt reca`); a runtime would also have to move each kept
//! line's data from its old slot to its new one ([`Relayout::kept_sectors`]
//! counts that copy), which nothing does yet. Statistics start at zero in the
//! new cache, and the replacement policy is built afresh (told of every line
//! as just inserted; a `reca` policy's priorities restart at zero); the
//! controller's write policy and what it set apart per process
//! ([`crate::ProcessSettings`]) are carried over. Call it
//! with no flush in progress (tokens name old slots).

use std::collections::BTreeMap;

use crate::addr::{LineKey, LineSize, SlotId};
use crate::bitmap;
use crate::cache::{Cache, RestoredLine};
use crate::error::CoreError;
use crate::ops::Op;

/// The new cache and what it took to build it.
pub struct Relayout {
    pub cache: Cache,
    /// Dirty sectors of lines that did not fit, to write back from the old
    /// cache's slots before it is dropped.
    pub write_backs: Vec<Op>,
    /// Valid sectors carried into the new cache (a runtime copies them).
    pub kept_sectors: u64,
    /// Clean sectors that did not fit.
    pub dropped_clean_sectors: u64,
    /// Dirty sectors of lines that did not fit (in `write_backs`).
    pub written_back_sectors: u64,
}

struct NewLine {
    valid: Vec<u64>,
    dirty: Vec<u64>,
    /// (old slot, first sector, end sector in the old line) that fill it.
    parts: Vec<(SlotId, u32, u32)>,
}

/// Builds a cache like `old` with lines of `line` bytes and the same
/// capacity in bytes (at least one line), holding every sector `old` holds
/// that fits (see the module doc).
pub fn relayout(old: &Cache, line: LineSize, now_ns: u64) -> Result<Relayout, CoreError> {
    let old_line = old.line_size();
    let capacity_bytes = old.capacity_lines() * old_line.bytes();
    let capacity = (capacity_bytes / line.bytes()).max(1);
    let mut config = old.config().clone();
    config.line_size = line;
    config.capacity_lines = capacity;
    let mut cache = Cache::new(config)?;
    let mode = old.mode_settings();
    cache.set_controller_policy(mode.controller);
    cache.set_cache_device_failed(mode.cache_device_failed);
    for (process, settings) in old.process_settings() {
        cache.set_process_settings(process, Some(settings))?;
    }

    let old_sectors = u64::from(old_line.sectors());
    let new_sectors = u64::from(line.sectors());
    let words = line.bitmap_words();
    let mut lines: BTreeMap<LineKey, NewLine> = BTreeMap::new();
    let mut runs = Vec::new();
    for slot in 0..old.capacity_lines() as SlotId {
        let Some(snap) = old.slot_snapshot(slot) else {
            continue;
        };
        let base = snap.key.line_index * old_sectors;
        runs.clear();
        bitmap::for_each_run(snap.valid, 0, old_sectors as u32, |a, b, valid| {
            if valid {
                runs.push((a, b));
            }
        });
        for &(a, b) in &runs {
            // Cut the run at the new lines' boundaries.
            let mut s = base + u64::from(a);
            let end = base + u64::from(b);
            while s < end {
                let index = s / new_sectors;
                let piece_end = end.min((index + 1) * new_sectors);
                let key = LineKey {
                    volume: snap.key.volume,
                    line_index: index,
                };
                let entry = lines.entry(key).or_insert_with(|| NewLine {
                    valid: vec![0; words],
                    dirty: vec![0; words],
                    parts: Vec::new(),
                });
                let new_first = (s - index * new_sectors) as u32;
                let new_end = (piece_end - index * new_sectors) as u32;
                bitmap::set_range(&mut entry.valid, new_first, new_end);
                let (old_first, old_end) = ((s - base) as u32, (piece_end - base) as u32);
                bitmap::for_each_run(snap.dirty, old_first, old_end, |x, y, dirty| {
                    if dirty {
                        bitmap::set_range(
                            &mut entry.dirty,
                            x - old_first + new_first,
                            y - old_first + new_first,
                        );
                    }
                });
                entry.parts.push((slot, old_first, old_end));
                s = piece_end;
            }
        }
    }

    let mut order: Vec<(LineKey, bool, u32)> = lines
        .iter()
        .map(|(k, l)| (*k, bitmap::any(&l.dirty), bitmap::count(&l.valid)))
        .collect();
    order.sort_by(|a, b| b.1.cmp(&a.1).then(b.2.cmp(&a.2)).then(a.0.cmp(&b.0)));
    let mut out = Relayout {
        cache,
        write_backs: Vec::new(),
        kept_sectors: 0,
        dropped_clean_sectors: 0,
        written_back_sectors: 0,
    };
    let mut kept: Vec<LineKey> = Vec::new();
    for (i, (key, _, valid)) in order.iter().enumerate() {
        let l = &lines[key];
        if (i as u64) < capacity {
            kept.push(*key);
            out.kept_sectors += u64::from(*valid);
            continue;
        }
        let dirty = bitmap::count(&l.dirty);
        out.dropped_clean_sectors += u64::from(valid - dirty);
        out.written_back_sectors += u64::from(dirty);
        for &(slot, first, end) in &l.parts {
            let snap = old.slot_snapshot(slot).expect("a part's slot is resident");
            let base = snap.key.line_index * old_sectors;
            bitmap::for_each_run(snap.dirty, first, end, |x, y, d| {
                if d {
                    out.write_backs.push(Op::WriteBack {
                        slot,
                        line_offset_bytes: x * 512,
                        length_bytes: (y - x) * 512,
                        volume: snap.key.volume,
                        offset_bytes: (base + u64::from(x)) * 512,
                    });
                }
            });
        }
    }
    kept.sort();
    let restored: Vec<RestoredLine<'_>> = kept
        .iter()
        .enumerate()
        .map(|(slot, key)| RestoredLine {
            slot: slot as SlotId,
            key: *key,
            valid: &lines[key].valid,
            dirty: &lines[key].dirty,
            // Lines merged or split lose their epochs: ordered write-back
            // and a change of line size are not combined.
            epoch: 0,
        })
        .collect();
    out.cache.restore(&restored, now_ns)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{CacheConfig, OpList, PolicySpec, Request};

    fn cache(lines: u64, line: u64) -> Cache {
        Cache::new(CacheConfig::new(
            lines,
            LineSize::new(line).unwrap(),
            PolicySpec::lru(),
        ))
        .unwrap()
    }

    #[test]
    fn splitting_keeps_every_sector_and_merging_writes_back_what_does_not_fit() {
        let mut c = cache(2, 8192);
        let mut ops = OpList::new();
        c.access(&Request::write(0, 512, 1024, 0), &mut ops).unwrap();
        c.access(&Request::read(0, 1 << 20, 8192, 1), &mut ops).unwrap();
        let small = relayout(&c, LineSize::new(4096).unwrap(), 2).unwrap();
        assert_eq!(small.cache.capacity_lines(), 4);
        assert_eq!(small.kept_sectors, 2 + 16);
        assert!(small.write_backs.is_empty());
        let s = small
            .cache
            .line_state(LineKey {
                volume: 0,
                line_index: 0,
            })
            .unwrap();
        assert_eq!((s.valid_sectors, s.dirty_sectors), (2, 2));
        assert_eq!(small.cache.resident_lines(), 3);
        small.cache.check_invariants();
        // Merged into one 16 KiB line: two lines, one slot. The dirty one is
        // kept; the clean one dropped.
        let big = relayout(&c, LineSize::new(16384).unwrap(), 3).unwrap();
        assert_eq!(big.cache.capacity_lines(), 1);
        assert_eq!((big.kept_sectors, big.dropped_clean_sectors), (2, 16));
        assert!(big.write_backs.is_empty());
        big.cache.check_invariants();
        // With a clean line kept in place of a dirty one impossible, a dirty
        // line that does not fit is written back.
        let mut d = cache(2, 8192);
        d.access(&Request::write(0, 0, 512, 0), &mut ops).unwrap();
        d.access(&Request::write(0, 1 << 20, 1024, 1), &mut ops).unwrap();
        let big = relayout(&d, LineSize::new(16384).unwrap(), 2).unwrap();
        assert_eq!(big.written_back_sectors, 1);
        assert_eq!(
            big.write_backs,
            vec![Op::WriteBack {
                slot: d
                    .line_state(LineKey {
                        volume: 0,
                        line_index: 0
                    })
                    .unwrap()
                    .slot,
                line_offset_bytes: 0,
                length_bytes: 512,
                volume: 0,
                offset_bytes: 0
            }]
        );
    }
}
