//! Torn writes: a record update whose 512-byte sectors each persist or not.
//! The loader must see exactly the old record or the new one for the slot
//! written, and nothing changes for any other slot (neighbours in the same
//! sectors are rewritten with their current bytes).

mod common;

use common::*;
use iocache_format::*;
use proptest::prelude::*;

/// Applies one update with the given sector survival mask and checks the
/// outcome against the state before. Returns the record written.
fn torn_update_checked(img: &mut Image, slot: u64, line: Option<LineRecord>, survive: u64) -> Record {
    let before = img.load();
    let old = slot_record(&before, slot);
    let (_, span_len) = img
        .layout
        .record_write_span(slot, before.slots[slot as usize].next_copy());
    let sectors = span_len / 512;
    let all = (1u64 << sectors) - 1;
    let new = img.update(slot, line, survive);
    let after = img.load();
    let got = slot_record(&after, slot);
    assert!(
        got == old || got.as_ref() == Some(&new),
        "slot {slot}, survive {survive:#b}: loaded {got:?}, old {old:?}, new {new:?}"
    );
    if survive & all == all {
        assert_eq!(got.as_ref(), Some(&new), "every sector persisted");
        assert!(
            after.corrupt_copies <= before.corrupt_copies,
            "a complete write repairs, never corrupts"
        );
    }
    if survive & all == 0 {
        assert_eq!(got, old, "no sector persisted");
    }
    for s in 0..img.layout.slots {
        if s != slot {
            assert_eq!(
                slot_record(&after, s),
                slot_record(&before, s),
                "neighbour {s} of {slot}"
            );
            assert_eq!(
                after.slots[s as usize], before.slots[s as usize],
                "neighbour {s} of {slot}"
            );
        }
    }
    if img.layout.record_bytes <= 512 {
        // A record copy inside one sector is all or nothing: never corrupt.
        assert_eq!(after.corrupt_copies, 0);
    }
    new
}

fn full_line(layout: &Layout, seed: u64, dirty: bool) -> LineRecord {
    let words = layout.bitmap_words();
    let valid: Vec<u64> = (0..words)
        .map(|w| (seed.rotate_left(w as u32 * 7) | 1) & word_mask(layout, w))
        .collect();
    let dirty_bits: Vec<u64> = if dirty {
        valid.iter().map(|v| v & (v >> 1 | 1)).collect()
    } else {
        vec![0; words]
    };
    LineRecord {
        volume: seed as u32 % 5,
        line_index: seed % 100_000,
        dirty: dirty_bits.iter().any(|&d| d != 0),
        data_hash: if dirty {
            None
        } else {
            Some(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15))
        },
        valid,
        dirty_bits,
        mirror: None,
        epoch: if dirty { Some(seed as u32) } else { None },
    }
}

/// Every line size, every survival pattern of the written sectors, for
/// slots at the start, middle and end of the table, with both copies of
/// every slot already written (so neighbours share the sectors).
#[test]
fn exhaustive_torn_updates_leave_old_or_new() {
    for line in ALL_LINE_BYTES {
        let layout = Layout::for_slots(line, 19).unwrap();
        let mut base = Image::new(layout);
        for generation in 0..3u64 {
            for slot in 0..layout.slots {
                let line = (slot + generation) % 3 != 0;
                let rec = line.then(|| full_line(&layout, slot * 31 + generation, generation % 2 == 0));
                base.update(slot, rec, u64::MAX);
            }
        }
        for slot in [0, 1, 7, 8, 9, 18] {
            let disk = base.load().slots[slot as usize];
            let (_, span_len) = layout.record_write_span(slot, disk.next_copy());
            let sectors = span_len / 512;
            for survive in 0..1u64 << sectors {
                for new_line in [None, Some(full_line(&layout, 1000 + slot, slot % 2 == 0))] {
                    let mut img = Image {
                        layout,
                        bytes: base.bytes.clone(),
                    };
                    torn_update_checked(&mut img, slot, new_line, survive);
                    // Recovery: the next update of the slot, after the crash, lands.
                    let next = img.update(slot, Some(full_line(&layout, 7, false)), u64::MAX);
                    assert_eq!(slot_record(&img.load(), slot), Some(next));
                }
            }
        }
    }
}

fn scenario() -> impl Strategy<Value = (Layout, Vec<(u64, Option<LineRecord>, u64)>)> {
    (line_bytes(), 1u64..=40).prop_flat_map(|(line, slots)| {
        let layout = Layout::for_slots(line, slots).unwrap();
        let step = (
            0..slots,
            prop::option::weighted(0.8, line_record(layout)),
            any::<u64>(),
        );
        (Just(layout), prop::collection::vec(step, 1..40))
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    /// A random history of updates, each torn at random (sector survival
    /// mask): after every one, the slot holds the old or the new record and
    /// no other slot changes.
    #[test]
    fn random_torn_histories_leave_old_or_new((layout, steps) in scenario()) {
        let mut img = Image::new(layout);
        for (slot, line, survive) in steps {
            // Half the steps complete; the others tear at random.
            let survive = if survive & 1 == 0 { u64::MAX } else { survive >> 1 };
            torn_update_checked(&mut img, slot, line, survive);
        }
    }
}
