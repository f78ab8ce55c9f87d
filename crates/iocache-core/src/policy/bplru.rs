//! BPLRU (Block Padding LRU), the flash write-buffer policy of H. Kim and
//! S. Ahn, "BPLRU: A Buffer Management Scheme for Improving Random Writes in
//! Flash Storage", FAST'08 (§3: block-level LRU, page padding, LRU
//! compensation); it is one of the baselines of Req-block (Lin et al.,
//! ICPP'22, §4.1).
//!
//! - **Block-level LRU**: the buffered pages of one flash block (`block_pages`
//!   consecutive lines of a volume: block = `line_index / block_pages`) form
//!   one unit on an LRU list; an access to any of its pages moves the block to
//!   the MRU end. The victim is the LRU block, evicted whole (one batch).
//! - **Page padding**: the evicted block is written to flash as a full block,
//!   so the pages of it that are not buffered are read from flash first. The
//!   cache cannot issue those reads; they are counted in the policy counter
//!   `padding_pages` (block_pages − buffered pages, per evicted block).
//! - **LRU compensation**: a block whose pages were all written in order, from
//!   its first page to its last in one pass, is moved to the LRU end, since a
//!   sequentially written block is unlikely to be rewritten soon. Counted in
//!   `compensations`.
//!
//! Parameter: `block_pages` (default 64, the pages per block of Req-block's
//! SSDsim setup, Table 1).
//!
//! Choices and deviations:
//! - BPLRU buffers writes only; use write policy `wo` for that. A read hit on
//!   a buffered page also moves its block to the MRU end here (any page
//!   access counts); reads never count toward a sequential pass.
//! - The sequential pass: a write to a block's first page starts it, a write
//!   to the next page in order continues it, any other write to the block
//!   ends it; when the block's last page is written in order the block is
//!   compensated and the pass ends. The paper describes the idea (a block
//!   written fully and sequentially) rather than a detection rule; this one
//!   also accepts a pass that rewrites pages already buffered.
//! - Padding is counted for every evicted block, dirty or not (under `wo` all
//!   buffered pages are dirty); a volume's last, partial block is padded to
//!   `block_pages` like the others.
//! - A write of a page that is not buffered, to a block that is, moves the
//!   block to the MRU end *before* the victim is chosen (the cache asks for a
//!   victim before it inserts), so the block being written is evicted only
//!   when it is the only one.
//! - An invalidated line (`on_remove`) leaves its block; an emptied block is
//!   dropped.

use super::groups::Groups;
use super::list::{Links, ListHead, NIL};
use super::{AccessInfo, PolicyParams, ReplacementPolicy};
use crate::addr::{IoKind, LineKey, SlotId};
use crate::error::CoreError;
use crate::index::LineIndex;

/// No sequential pass in progress.
const NO_PASS: u32 = u32::MAX;

pub struct Bplru {
    block_pages: u64,
    groups: Groups,
    /// Offset of each slot's page inside its block.
    slot_offset: Vec<u32>,
    block_links: Links,
    /// Blocks, MRU at the head.
    lru: ListHead,
    block_key: Vec<LineKey>,
    /// The next page offset a sequential pass over the block expects.
    pass_next: Vec<u32>,
    index: LineIndex,
    padding_pages: u64,
    compensations: u64,
}

impl Bplru {
    /// A BPLRU cache from its parameters (`block_pages` 64 when absent), as
    /// the registry builds it.
    pub fn from_params(params: &PolicyParams, capacity_lines: usize) -> Result<Self, CoreError> {
        let block_pages = params.u64_or("block_pages", 64, 1..=1 << 20)?;
        Ok(Self::new(capacity_lines, block_pages))
    }

    pub fn new(capacity_lines: usize, block_pages: u64) -> Self {
        let blocks = capacity_lines + 1;
        let none = LineKey {
            volume: 0,
            line_index: 0,
        };
        Bplru {
            block_pages: block_pages.max(1),
            groups: Groups::new(capacity_lines, blocks),
            slot_offset: vec![0; capacity_lines],
            block_links: Links::new(blocks),
            lru: ListHead::default(),
            block_key: vec![none; blocks],
            pass_next: vec![NO_PASS; blocks],
            index: LineIndex::new(blocks),
            padding_pages: 0,
            compensations: 0,
        }
    }

    /// Buffered blocks from MRU to LRU, each as (volume, block number, its slots).
    pub fn blocks(&self) -> Vec<(u32, u64, Vec<SlotId>)> {
        self.block_links
            .iter(&self.lru)
            .map(|b| {
                let k = self.block_key[b as usize];
                (k.volume, k.line_index, self.groups.members(b).collect())
            })
            .collect()
    }

    pub fn padding_pages(&self) -> u64 {
        self.padding_pages
    }

    pub fn compensations(&self) -> u64 {
        self.compensations
    }

    fn block_of(&self, key: LineKey) -> LineKey {
        LineKey {
            volume: key.volume,
            line_index: key.line_index / self.block_pages,
        }
    }

    /// Moves block `b` on the LRU list after an access to its page at `offset`.
    fn touch(&mut self, b: u32, offset: u32, info: &AccessInfo) {
        if info.kind == IoKind::Write {
            let next = &mut self.pass_next[b as usize];
            *next = if offset == 0 {
                1
            } else if *next == offset {
                offset + 1
            } else {
                NO_PASS
            };
            if *next as u64 == self.block_pages {
                *next = NO_PASS;
                self.block_links.unlink(&mut self.lru, b);
                self.block_links.push_tail(&mut self.lru, b);
                self.compensations += 1;
                return;
            }
        }
        self.block_links.move_to_head(&mut self.lru, b);
    }

    fn drop_block(&mut self, b: u32) {
        let key = self.block_key[b as usize];
        self.index.remove(&key, b);
        self.block_links.unlink(&mut self.lru, b);
        self.groups.release(b);
    }
}

impl ReplacementPolicy for Bplru {
    fn name(&self) -> &'static str {
        "bplru"
    }

    fn on_hit(&mut self, slot: SlotId, info: &AccessInfo) {
        let b = self.groups.group_of(slot);
        if b != NIL {
            self.touch(b, self.slot_offset[slot as usize], info);
        }
    }

    fn on_miss(&mut self, key: LineKey, need_victim: bool, _info: &AccessInfo, victims: &mut Vec<SlotId>) {
        if !need_victim {
            return;
        }
        // A new page of a buffered block is an access to that block: it becomes
        // the MRU block before the victim is chosen.
        let block_key = self.block_of(key);
        let keys = &self.block_key;
        if let Some(b) = self.index.get(&block_key, |b| keys[b as usize]) {
            self.block_links.move_to_head(&mut self.lru, b);
        }
        let b = self.lru.tail;
        if b == NIL {
            return;
        }
        self.padding_pages += self.block_pages - self.groups.len(b) as u64;
        self.groups.drain_into(b, victims);
        self.drop_block(b);
    }

    fn on_insert(&mut self, slot: SlotId, key: LineKey, info: &AccessInfo) {
        let block_key = self.block_of(key);
        let keys = &self.block_key;
        let b = match self.index.get(&block_key, |b| keys[b as usize]) {
            Some(b) => b,
            None => {
                let b = self.groups.alloc();
                self.block_key[b as usize] = block_key;
                self.index.insert(&block_key, b);
                self.pass_next[b as usize] = NO_PASS;
                self.block_links.push_head(&mut self.lru, b);
                b
            }
        };
        let offset = (key.line_index % self.block_pages) as u32;
        self.slot_offset[slot as usize] = offset;
        self.groups.add(b, slot);
        self.touch(b, offset, info);
    }

    fn on_remove(&mut self, slot: SlotId) {
        let b = self.groups.remove(slot);
        if b != NIL && self.groups.len(b) == 0 {
            self.drop_block(b);
        }
    }

    fn counters(&self) -> Vec<(&'static str, u64)> {
        vec![
            ("padding_pages", self.padding_pages),
            ("compensations", self.compensations),
        ]
    }

    fn gauges(&self) -> Vec<(&'static str, u64)> {
        vec![("blocks", u64::from(self.lru.len))]
    }
}
