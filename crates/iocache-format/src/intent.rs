//! The intent log (format version 4): before a write lands in place on
//! dirty sectors that a durable record's checksum covers, the checksum
//! terms it will leave there are made durable here, tied to that record,
//! so that recovery can verify every dirty sector whatever mix of old and
//! new data a crash left (docs/format.md, "Intents").
//!
//! The log is a region of `intent_bytes` after metadata copy 1, written in
//! *blocks*, each at a 512-byte boundary and a whole number of sectors,
//! ending with a crc32c (a torn block fails it):
//!
//! ```text
//!  0  tag        [u8; 4]  "IOCJ"
//!  4  bytes      u32      the block's size, a multiple of 512
//!  8  intents    u32      number of intents that follow
//! 12  reserved   u32      0
//! 16  intents, each:
//!      0  slot       u64  the slot whose record it extends
//!      8  sequence   u64  that record's sequence
//!     16  pairs      u32  number of (sector, term) pairs that follow
//!     20  reserved   u32  0
//!     24  pairs, each 24 bytes:
//!          0  sector   u16  sector of the line
//!          2  flags    u16  bit 0: base present
//!          4  reserved u32  0
//!          8  term     u64  a checksum term the sector may hold
//!         16  base     u64  the term the record's checksum counts for the
//!                           sector (0 unless the flag is set)
//!     padding 0 up to bytes - 4
//! bytes-4  crc32c   u32   of bytes 0..bytes-4
//! ```

use crate::layout::Layout;
use crate::le::{get_u16, get_u32, get_u64};
use crate::SECTOR_BYTES;

/// The first four bytes of every intent block.
pub const INTENT_TAG: [u8; 4] = *b"IOCJ";

const BLOCK_HEADER_BYTES: usize = 16;
const INTENT_HEADER_BYTES: usize = 24;
const PAIR_BYTES: usize = 24;
const CRC_BYTES: usize = 4;
const FLAG_BASE: u16 = 1;

/// One sector's entry in an intent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IntentPair {
    /// The sector of the line.
    pub sector: u16,
    /// A checksum term ([`crate::sector_checksums`]) the sector may hold.
    pub term: u64,
    /// The term the record's checksum counts for the sector, given by the
    /// first intent for that sector since the record.
    pub base: Option<u64>,
}

/// Checksum terms that dirty sectors of one slot may hold besides those its
/// record's checksum counts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Intent {
    /// The slot.
    pub slot: u64,
    /// The sequence of the slot's record it extends.
    pub sequence: u64,
    /// One per sector written, at most one per sector of the line.
    pub pairs: Vec<IntentPair>,
}

/// Bytes of a block holding one intent of `sectors` pairs.
pub fn intent_bytes_for_sectors(sectors: usize) -> usize {
    block_bytes(INTENT_HEADER_BYTES + sectors * PAIR_BYTES)
}

fn block_bytes(intents_bytes: usize) -> usize {
    (BLOCK_HEADER_BYTES + intents_bytes + CRC_BYTES).next_multiple_of(SECTOR_BYTES as usize)
}

/// Bytes of the block [`encode_intent_block`] makes of `intents`.
pub fn intent_block_bytes(intents: &[Intent]) -> usize {
    block_bytes(
        intents
            .iter()
            .map(|i| INTENT_HEADER_BYTES + i.pairs.len() * PAIR_BYTES)
            .sum(),
    )
}

/// Appends the block holding `intents` to `out`.
pub fn encode_intent_block(intents: &[Intent], out: &mut Vec<u8>) {
    let start = out.len();
    let bytes = intent_block_bytes(intents);
    out.resize(start + bytes, 0);
    let b = &mut out[start..];
    b[0..4].copy_from_slice(&INTENT_TAG);
    b[4..8].copy_from_slice(&(bytes as u32).to_le_bytes());
    b[8..12].copy_from_slice(&(intents.len() as u32).to_le_bytes());
    let mut at = BLOCK_HEADER_BYTES;
    for intent in intents {
        b[at..at + 8].copy_from_slice(&intent.slot.to_le_bytes());
        b[at + 8..at + 16].copy_from_slice(&intent.sequence.to_le_bytes());
        b[at + 16..at + 20].copy_from_slice(&(intent.pairs.len() as u32).to_le_bytes());
        at += INTENT_HEADER_BYTES;
        for pair in &intent.pairs {
            b[at..at + 2].copy_from_slice(&pair.sector.to_le_bytes());
            let flags = if pair.base.is_some() { FLAG_BASE } else { 0 };
            b[at + 2..at + 4].copy_from_slice(&flags.to_le_bytes());
            b[at + 8..at + 16].copy_from_slice(&pair.term.to_le_bytes());
            b[at + 16..at + 24].copy_from_slice(&pair.base.unwrap_or(0).to_le_bytes());
            at += PAIR_BYTES;
        }
    }
    let crc = crc32c::crc32c(&b[..bytes - CRC_BYTES]);
    b[bytes - CRC_BYTES..bytes].copy_from_slice(&crc.to_le_bytes());
}

/// What a scan of the intent log found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IntentScan {
    /// Every intent of every valid block, in log order.
    pub intents: Vec<Intent>,
    /// Valid blocks.
    pub blocks: usize,
    /// Blocks whose tag, size and crc were right but whose content broke a
    /// rule (a slot or sector out of range, nonzero reserved bytes): not
    /// used.
    pub malformed: usize,
}

/// Reads every valid block of the intent log `log` (the region's bytes) of
/// a cache of `layout`. Blocks are looked for at every 512-byte boundary;
/// anything else (zeroes, torn blocks, leftovers of overwritten ones) is
/// skipped. Which intents still count is the reader's business: those tied
/// to a slot's current record.
pub fn scan_intents(log: &[u8], layout: &Layout) -> IntentScan {
    let mut scan = IntentScan::default();
    let sector = SECTOR_BYTES as usize;
    let mut at = 0;
    while at + sector <= log.len() {
        match block_at(&log[at..]) {
            Some(block) => {
                match parse_block(block, layout) {
                    Some(intents) => {
                        scan.blocks += 1;
                        scan.intents.extend(intents);
                    }
                    None => scan.malformed += 1,
                }
                at += block.len();
            }
            None => at += sector,
        }
    }
    scan
}

/// The block starting at `bytes[0]`, if its tag, size and crc are right.
fn block_at(bytes: &[u8]) -> Option<&[u8]> {
    if bytes[0..4] != INTENT_TAG {
        return None;
    }
    let size = get_u32(bytes, 4) as usize;
    if size < SECTOR_BYTES as usize || !size.is_multiple_of(SECTOR_BYTES as usize) || size > bytes.len() {
        return None;
    }
    let block = &bytes[..size];
    let stored = get_u32(block, size - CRC_BYTES);
    (crc32c::crc32c(&block[..size - CRC_BYTES]) == stored).then_some(block)
}

fn parse_block(block: &[u8], layout: &Layout) -> Option<Vec<Intent>> {
    let count = get_u32(block, 8) as usize;
    if get_u32(block, 12) != 0 {
        return None;
    }
    let end = block.len() - CRC_BYTES;
    let sectors = layout.sectors_per_line() as usize;
    let mut at = BLOCK_HEADER_BYTES;
    let mut intents = Vec::new();
    for _ in 0..count {
        if at + INTENT_HEADER_BYTES > end {
            return None;
        }
        let slot = get_u64(block, at);
        let sequence = get_u64(block, at + 8);
        let pairs = get_u32(block, at + 16) as usize;
        if get_u32(block, at + 20) != 0 || slot >= layout.slots || pairs > sectors {
            return None;
        }
        at += INTENT_HEADER_BYTES;
        if at + pairs * PAIR_BYTES > end {
            return None;
        }
        let mut intent = Intent {
            slot,
            sequence,
            pairs: Vec::with_capacity(pairs),
        };
        for _ in 0..pairs {
            let sector = get_u16(block, at);
            let flags = get_u16(block, at + 2);
            if usize::from(sector) >= sectors || flags & !FLAG_BASE != 0 || get_u32(block, at + 4) != 0 {
                return None;
            }
            let base = get_u64(block, at + 16);
            if flags & FLAG_BASE == 0 && base != 0 {
                return None;
            }
            intent.pairs.push(IntentPair {
                sector,
                term: get_u64(block, at + 8),
                base: (flags & FLAG_BASE != 0).then_some(base),
            });
            at += PAIR_BYTES;
        }
        intents.push(intent);
    }
    block[at..end].iter().all(|&b| b == 0).then_some(intents)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout() -> Layout {
        Layout::for_slots(4096, 16).unwrap()
    }

    fn intent(slot: u64, sequence: u64, sectors: std::ops::Range<u16>) -> Intent {
        Intent {
            slot,
            sequence,
            pairs: sectors
                .map(|s| IntentPair {
                    sector: s,
                    term: 1000 + u64::from(s),
                    base: (s % 2 == 0).then_some(7 * u64::from(s)),
                })
                .collect(),
        }
    }

    #[test]
    fn blocks_round_trip_wherever_they_lie_in_the_log() {
        let layout = layout();
        let mut log = vec![0u8; layout.intent_bytes as usize];
        let first = vec![intent(3, 17, 0..8), intent(5, 18, 2..4)];
        let second = vec![intent(15, 99, 7..8)];
        let mut bytes = Vec::new();
        encode_intent_block(&first, &mut bytes);
        assert_eq!(bytes.len(), intent_block_bytes(&first));
        log[..bytes.len()].copy_from_slice(&bytes);
        bytes.clear();
        encode_intent_block(&second, &mut bytes);
        log[4096..4096 + bytes.len()].copy_from_slice(&bytes);
        let scan = scan_intents(&log, &layout);
        assert_eq!(scan.blocks, 2);
        assert_eq!(scan.malformed, 0);
        assert_eq!(scan.intents, [first, second].concat());
    }

    #[test]
    fn a_torn_or_damaged_block_is_skipped_and_the_next_one_found() {
        let layout = layout();
        let mut log = vec![0u8; layout.intent_bytes as usize];
        let big = vec![intent(1, 2, 0..8); 6];
        let mut bytes = Vec::new();
        encode_intent_block(&big, &mut bytes);
        assert!(bytes.len() > 512, "spans sectors");
        log[..bytes.len()].copy_from_slice(&bytes);
        let after = bytes.len().next_multiple_of(512);
        let mut small = Vec::new();
        encode_intent_block(&[intent(2, 3, 1..2)], &mut small);
        log[after..after + small.len()].copy_from_slice(&small);
        // Its second sector never reached the device.
        log[512..1024].fill(0);
        let scan = scan_intents(&log, &layout);
        assert_eq!(scan.intents, vec![intent(2, 3, 1..2)]);
    }

    #[test]
    fn out_of_range_content_with_a_right_crc_is_not_used() {
        let layout = layout();
        for bad in [intent(16, 1, 0..1), intent(0, 1, 8..9)] {
            let mut log = vec![0u8; 4096];
            let mut bytes = Vec::new();
            encode_intent_block(&[bad], &mut bytes);
            log[..bytes.len()].copy_from_slice(&bytes);
            let scan = scan_intents(&log, &layout);
            assert!(scan.intents.is_empty());
            assert_eq!(scan.malformed, 1);
        }
    }

    #[test]
    fn a_whole_line_intent_fits_four_times_in_every_log() {
        for shift in 9..=20 {
            let line = 1u64 << shift;
            let layout = Layout::for_slots(line, 1).unwrap();
            let sectors = (line / 512) as usize;
            assert!(4 * intent_bytes_for_sectors(sectors) as u64 <= layout.intent_bytes);
        }
    }
}
