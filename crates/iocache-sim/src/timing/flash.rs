//! An SSD's flash internals: channels, chips, a page-mapped FTL and greedy
//! garbage collection, for simulating a DRAM write buffer in front of flash
//! (the setting of Req-block: Li et al., "Req-block: A Request
//! Granularity-Based Cache Management Scheme for SSD DRAM Caches", ICPP 2022).
//!
//! # Parameters ([`FlashSpec::req_block`])
//!
//! ICPP'22 Table 1 ("Experimental settings of SSDsim", §4.1): 128 GB, 8
//! channels, 2 chips per channel, 64 pages per block, 4 KB pages, page-level
//! FTL, read 0.075 ms, write (program) 2 ms, erase 15 ms, transfer 10 ns per
//! byte, GC threshold 10 %. The paper does not give the over-provisioning;
//! we use 15 % ([`DEFAULT_OVER_PROVISIONING`]), because with a 10 % free-block
//! threshold the spare area must exceed 10 % or a full drive could never get
//! back above the threshold.
//!
//! # Model
//!
//! - **Placement: static striping by logical page.** Logical page `l` lives
//!   on chip `c = l mod (channels × chips_per_channel)`, and chip `c` hangs on
//!   channel `c mod channels`, so consecutive pages go to consecutive
//!   channels first (SSDsim's static allocation is of this kind). Within its
//!   chip a page may be written to any free page (the FTL maps it).
//! - **Timing.** A page write holds its channel while the data moves
//!   (`bytes × transfer_ns_per_byte`) and its chip from the start of the
//!   transfer to the end of the program; it starts when both are free. A page
//!   read holds its chip for the cell read, then the channel (and the chip,
//!   whose register holds the data) for the transfer. Every chip and channel
//!   serves in arrival order. An op spanning several pages completes when its
//!   last page does.
//! - **FTL.** Page-mapped, per chip: a logical→physical map (a hash map over
//!   the pages written so far), a physical→logical array, a valid-page count
//!   per block, one open block that receives writes in page order, and a pool
//!   of free (erased) blocks.
//! - **Garbage collection.** After a page write, while the chip's free blocks
//!   are fewer than `gc_threshold × blocks per chip` (at least 2), greedy GC
//!   picks the sealed block with the fewest valid pages, copies its valid
//!   pages into the open block inside the chip (read + program each, no
//!   channel use: a copy-back) and erases it. That work is added to the
//!   chip's busy time after the write that triggered it, so it delays later
//!   ops on that chip but not the triggering write.
//! - **Addresses.** An op's byte address is divided into pages and wrapped
//!   into the logical capacity (`capacity × (1 − over_provisioning)`), so any
//!   address space can be replayed; distinct addresses that wrap onto one
//!   page are treated as overwrites of it.
//!
//! # Simplifications
//!
//! A partial-page write programs a whole page without reading the old page
//! first; reads of never-written pages cost a normal read; there is no
//! multi-plane or interleaved die operation, no read/write priority, no wear
//! levelling and no background (idle-time) GC.
//!
//! # Memory
//!
//! Per-block state is allocated as blocks are first used, and the map holds
//! only pages written so far, so memory grows with the data written and is
//! bounded by the capacity: about 11 bytes per block, 4 bytes per physical
//! page used and about 16 bytes per logical page written.

use std::collections::VecDeque;

use iocache_core::fasthash::FxHashMap;
use serde::Serialize;

use super::device::{BusySink, Dir, Scheduled};
use super::TimingError;

/// Over-provisioning used when the source does not give one (see the module doc).
pub const DEFAULT_OVER_PROVISIONING: f64 = 0.15;

const NONE: u32 = u32::MAX;

/// Geometry, timing and FTL parameters of a flash SSD.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct FlashSpec {
    pub channels: u32,
    pub chips_per_channel: u32,
    pub page_bytes: u32,
    pub pages_per_block: u32,
    /// Cell read of one page.
    pub read_ns: u64,
    /// Program of one page.
    pub program_ns: u64,
    /// Erase of one block.
    pub erase_ns: u64,
    /// Channel transfer time per byte.
    pub transfer_ns_per_byte: f64,
    /// GC runs while a chip's free blocks are fewer than this fraction of its blocks.
    pub gc_threshold: f64,
    /// Physical capacity, bytes.
    pub capacity_bytes: u64,
    /// Fraction of the physical capacity hidden from the host.
    pub over_provisioning: f64,
}

impl FlashSpec {
    /// The SSDsim configuration of Req-block (ICPP'22 Table 1).
    pub fn req_block() -> Self {
        FlashSpec {
            channels: 8,
            chips_per_channel: 2,
            page_bytes: 4096,
            pages_per_block: 64,
            read_ns: 75_000,
            program_ns: 2_000_000,
            erase_ns: 15_000_000,
            transfer_ns_per_byte: 10.0,
            gc_threshold: 0.10,
            capacity_bytes: 128 << 30,
            over_provisioning: DEFAULT_OVER_PROVISIONING,
        }
    }

    pub fn chips(&self) -> u32 {
        self.channels * self.chips_per_channel
    }

    pub fn blocks_per_chip(&self) -> u64 {
        self.capacity_bytes / (self.chips() as u64 * self.pages_per_block as u64 * self.page_bytes as u64)
    }

    /// GC keeps at least this many free blocks per chip.
    pub fn free_blocks_min(&self) -> u64 {
        ((self.gc_threshold * self.blocks_per_chip() as f64).ceil() as u64).max(2)
    }

    /// Logical pages each chip holds.
    pub fn logical_pages_per_chip(&self) -> u64 {
        let physical = self.blocks_per_chip() * self.pages_per_block as u64;
        (physical as f64 * (1.0 - self.over_provisioning)).floor() as u64
    }

    pub fn logical_bytes(&self) -> u64 {
        self.logical_pages_per_chip() * self.chips() as u64 * self.page_bytes as u64
    }

    fn transfer(&self, bytes: u64) -> u64 {
        (bytes as f64 * self.transfer_ns_per_byte).round() as u64
    }

    pub fn validate(&self) -> Result<(), TimingError> {
        let bad = |m: String| Err(TimingError::BadParameter(m));
        if !(1..=1024).contains(&self.channels) || !(1..=1024).contains(&self.chips_per_channel) {
            return bad("flash channels and chips per channel must be 1..=1024".into());
        }
        if !self.page_bytes.is_power_of_two() || !(512..=1 << 20).contains(&self.page_bytes) {
            return bad(format!(
                "flash page must be a power of two from 512 B to 1 MiB, not {}",
                self.page_bytes
            ));
        }
        if !(2..=32768).contains(&self.pages_per_block) {
            return bad(format!(
                "pages per block must be 2..=32768, not {}",
                self.pages_per_block
            ));
        }
        if [self.read_ns, self.program_ns, self.erase_ns]
            .iter()
            .any(|&t| t > 1_000_000_000_000)
        {
            return bad("flash times must be at most 1e12 ns".into());
        }
        if !self.transfer_ns_per_byte.is_finite() || !(0.0..=1e6).contains(&self.transfer_ns_per_byte) {
            return bad(format!(
                "transfer must be 0..=1e6 ns per byte, not {}",
                self.transfer_ns_per_byte
            ));
        }
        if !(self.gc_threshold > 0.0 && self.gc_threshold <= 0.5) {
            return bad(format!(
                "GC threshold must be in (0, 0.5], not {}",
                self.gc_threshold
            ));
        }
        if !(self.over_provisioning > 0.0 && self.over_provisioning <= 0.9) {
            return bad(format!(
                "over-provisioning must be in (0, 0.9], not {}",
                self.over_provisioning
            ));
        }
        let blocks = self.blocks_per_chip();
        if blocks < 8 {
            return bad(format!(
                "flash capacity {} B gives {blocks} blocks per chip; at least 8 are needed",
                self.capacity_bytes
            ));
        }
        if blocks * self.pages_per_block as u64 >= NONE as u64 {
            return bad("too many pages per chip (at most 2^32 - 2)".into());
        }
        // GC must always find a block with an invalid page while below the
        // threshold: the logical pages must fit in the blocks that are not
        // reserved free, minus the open block.
        let usable = (blocks - self.free_blocks_min() - 1) * self.pages_per_block as u64;
        if self.logical_pages_per_chip() > usable {
            return bad(format!(
                "over-provisioning {} leaves too few spare blocks: {blocks} blocks per chip, GC keeps \
                 {} free, so the {} logical pages per chip must fit in {usable} pages; raise the \
                 over-provisioning or the capacity",
                self.over_provisioning,
                self.free_blocks_min(),
                self.logical_pages_per_chip()
            ));
        }
        if self.logical_pages_per_chip() * self.chips() as u64 >= NONE as u64 {
            return bad("too many logical pages (at most 2^32 - 2)".into());
        }
        Ok(())
    }

    /// What one op of `bytes` costs on an idle, fresh device: its pages are
    /// striped over the chips, so the chip with the most pages decides.
    /// Approximate for ops larger than one page per channel.
    pub fn idle_service_ns(&self, dir: Dir, bytes: u64) -> u64 {
        let page = self.page_bytes as u64;
        let pages = bytes.div_ceil(page).max(1);
        let per_chip = pages.div_ceil(self.chips() as u64);
        let xfer = self.transfer(bytes.min(page));
        match dir {
            Dir::Read => per_chip * (self.read_ns + xfer),
            Dir::Write => per_chip * (xfer + self.program_ns),
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum BlockState {
    Free,
    Open,
    Sealed,
}

/// One chip's FTL state and clock.
#[derive(Debug)]
struct Chip {
    free_at: u64,
    /// Per block (allocated as blocks are first used).
    valid: Vec<u16>,
    state: Vec<BlockState>,
    prev: Vec<u32>,
    next: Vec<u32>,
    /// Sealed blocks by valid count: list heads, 0..=pages_per_block.
    heads: Vec<u32>,
    /// Blocks never used yet start here.
    next_fresh: u32,
    erased: VecDeque<u32>,
    open: u32,
    write_ptr: u32,
    /// Physical page → logical page (NONE when invalid).
    p2l: Vec<u32>,
    l2p: FxHashMap<u32, u32>,
}

impl Chip {
    fn new(ppb: u32) -> Self {
        Chip {
            free_at: 0,
            valid: Vec::new(),
            state: Vec::new(),
            prev: Vec::new(),
            next: Vec::new(),
            heads: vec![NONE; ppb as usize + 1],
            next_fresh: 0,
            erased: VecDeque::new(),
            open: NONE,
            write_ptr: 0,
            p2l: Vec::new(),
            l2p: FxHashMap::default(),
        }
    }

    fn free_blocks(&self, blocks: u64) -> u64 {
        blocks - self.next_fresh as u64 + self.erased.len() as u64
    }

    fn unlink(&mut self, b: u32) {
        let (p, n) = (self.prev[b as usize], self.next[b as usize]);
        if p == NONE {
            self.heads[self.valid[b as usize] as usize] = n;
        } else {
            self.next[p as usize] = n;
        }
        if n != NONE {
            self.prev[n as usize] = p;
        }
    }

    fn link(&mut self, b: u32) {
        let head = &mut self.heads[self.valid[b as usize] as usize];
        let n = *head;
        *head = b;
        self.prev[b as usize] = NONE;
        self.next[b as usize] = n;
        if n != NONE {
            self.prev[n as usize] = b;
        }
    }

    fn take_free(&mut self, blocks: u64, ppb: u32) -> u32 {
        let b = match self.erased.pop_front() {
            Some(b) => b,
            None => {
                assert!((self.next_fresh as u64) < blocks, "flash chip out of free blocks");
                let b = self.next_fresh;
                self.next_fresh += 1;
                self.valid.push(0);
                self.state.push(BlockState::Free);
                self.prev.push(NONE);
                self.next.push(NONE);
                self.p2l.resize(self.p2l.len() + ppb as usize, NONE);
                b
            }
        };
        self.state[b as usize] = BlockState::Open;
        b
    }

    /// A free physical page in the open block, opening a new block if needed.
    fn allocate(&mut self, blocks: u64, ppb: u32) -> u32 {
        if self.open == NONE || self.write_ptr == ppb {
            if self.open != NONE {
                self.state[self.open as usize] = BlockState::Sealed;
                self.link(self.open);
            }
            self.open = self.take_free(blocks, ppb);
            self.write_ptr = 0;
        }
        let ppn = self.open * ppb + self.write_ptr;
        self.write_ptr += 1;
        ppn
    }

    fn invalidate(&mut self, ppn: u32, ppb: u32) {
        let b = ppn / ppb;
        self.p2l[ppn as usize] = NONE;
        let sealed = self.state[b as usize] == BlockState::Sealed;
        if sealed {
            self.unlink(b);
        }
        self.valid[b as usize] -= 1;
        if sealed {
            self.link(b);
        }
    }

    fn place(&mut self, lpn: u32, blocks: u64, ppb: u32) {
        let ppn = self.allocate(blocks, ppb);
        self.p2l[ppn as usize] = lpn;
        self.valid[(ppn / ppb) as usize] += 1;
        self.l2p.insert(lpn, ppn);
    }

    fn write(&mut self, lpn: u32, blocks: u64, ppb: u32) {
        if let Some(&old) = self.l2p.get(&lpn) {
            self.invalidate(old, ppb);
        }
        self.place(lpn, blocks, ppb);
    }

    /// Greedy GC until the free pool is back at `free_min`; returns (blocks
    /// erased, pages copied).
    fn collect(&mut self, blocks: u64, ppb: u32, free_min: u64) -> (u64, u64) {
        let (mut erased, mut copied) = (0, 0);
        while self.free_blocks(blocks) < free_min {
            // Fewest valid pages first; a fully valid block frees nothing.
            let Some(victim) = self.heads[..ppb as usize].iter().copied().find(|&h| h != NONE) else {
                break;
            };
            self.unlink(victim);
            for p in 0..ppb {
                let ppn = victim * ppb + p;
                let lpn = self.p2l[ppn as usize];
                if lpn != NONE {
                    self.p2l[ppn as usize] = NONE;
                    self.place(lpn, blocks, ppb);
                    copied += 1;
                }
            }
            self.valid[victim as usize] = 0;
            self.state[victim as usize] = BlockState::Free;
            self.erased.push_back(victim);
            erased += 1;
        }
        (erased, copied)
    }
}

/// A flash SSD in operation.
#[derive(Debug)]
pub struct FlashDevice {
    spec: FlashSpec,
    blocks: u64,
    free_min: u64,
    logical_pages: u64,
    chips: Vec<Chip>,
    channel_free: Vec<u64>,
    // Counters.
    host_page_reads: u64,
    host_page_writes: u64,
    gc_erases: u64,
    gc_page_copies: u64,
    gc_busy_ns: u64,
    channel_busy_ns: u64,
}

impl FlashDevice {
    pub fn new(spec: FlashSpec) -> Result<Self, TimingError> {
        spec.validate()?;
        Ok(FlashDevice {
            blocks: spec.blocks_per_chip(),
            free_min: spec.free_blocks_min(),
            logical_pages: spec.logical_pages_per_chip() * spec.chips() as u64,
            chips: (0..spec.chips())
                .map(|_| Chip::new(spec.pages_per_block))
                .collect(),
            channel_free: vec![0; spec.channels as usize],
            spec,
            host_page_reads: 0,
            host_page_writes: 0,
            gc_erases: 0,
            gc_page_copies: 0,
            gc_busy_ns: 0,
            channel_busy_ns: 0,
        })
    }

    pub fn schedule(
        &mut self,
        at: u64,
        dir: Dir,
        address: u64,
        bytes: u64,
        sink: &mut impl BusySink,
    ) -> Scheduled {
        let page = self.spec.page_bytes as u64;
        let ppb = self.spec.pages_per_block;
        let chips = self.chips.len() as u64;
        let end_addr = address + bytes.max(1);
        let (mut first_start, mut last_end) = (u64::MAX, at);
        let mut p = address / page;
        while p * page < end_addr {
            let lo = (p * page).max(address);
            let hi = ((p + 1) * page).min(end_addr);
            let lpn = p % self.logical_pages;
            let c = (lpn % chips) as usize;
            let ch = c % self.channel_free.len();
            let xfer = self.spec.transfer(hi - lo);
            let chip = &mut self.chips[c];
            let (start, end) = match dir {
                Dir::Write => {
                    let start = at.max(self.channel_free[ch]).max(chip.free_at);
                    self.channel_free[ch] = start + xfer;
                    chip.free_at = start + xfer + self.spec.program_ns;
                    sink.busy(start, chip.free_at);
                    let end = chip.free_at;
                    chip.write(lpn as u32, self.blocks, ppb);
                    self.host_page_writes += 1;
                    let (erased, copied) = chip.collect(self.blocks, ppb, self.free_min);
                    if erased > 0 {
                        let gc =
                            copied * (self.spec.read_ns + self.spec.program_ns) + erased * self.spec.erase_ns;
                        sink.busy(chip.free_at, chip.free_at + gc);
                        chip.free_at += gc;
                        self.gc_busy_ns += gc;
                        self.gc_erases += erased;
                        self.gc_page_copies += copied;
                    }
                    (start, end)
                }
                Dir::Read => {
                    let start = at.max(chip.free_at);
                    let ready = start + self.spec.read_ns;
                    let t = ready.max(self.channel_free[ch]);
                    let end = t + xfer;
                    self.channel_free[ch] = end;
                    chip.free_at = end;
                    sink.busy(start, end);
                    self.host_page_reads += 1;
                    (start, end)
                }
            };
            self.channel_busy_ns += xfer;
            first_start = first_start.min(start);
            last_end = last_end.max(end);
            p += 1;
        }
        Scheduled {
            start_ns: first_start.min(last_end),
            end_ns: last_end,
        }
    }

    pub fn reset_counters(&mut self) {
        self.host_page_reads = 0;
        self.host_page_writes = 0;
        self.gc_erases = 0;
        self.gc_page_copies = 0;
        self.gc_busy_ns = 0;
        self.channel_busy_ns = 0;
    }

    pub fn counters(&self) -> Vec<(&'static str, u64)> {
        vec![
            ("host_page_reads", self.host_page_reads),
            ("host_page_writes", self.host_page_writes),
            ("gc_erases", self.gc_erases),
            ("gc_page_copies", self.gc_page_copies),
            ("gc_busy_ns", self.gc_busy_ns),
            ("channel_busy_ns", self.channel_busy_ns),
            (
                "mapped_pages",
                self.chips.iter().map(|c| c.l2p.len() as u64).sum(),
            ),
        ]
    }

    /// Checks the FTL's bookkeeping (O(pages used); for tests).
    #[cfg(test)]
    fn check(&self) {
        let ppb = self.spec.pages_per_block;
        for chip in &self.chips {
            let mut valid = vec![0u16; chip.valid.len()];
            for (&lpn, &ppn) in &chip.l2p {
                assert_eq!(chip.p2l[ppn as usize], lpn);
                valid[(ppn / ppb) as usize] += 1;
            }
            assert_eq!(valid, chip.valid);
            for (count, &head) in chip.heads.iter().enumerate() {
                let mut b = head;
                while b != NONE {
                    assert_eq!(chip.valid[b as usize] as usize, count);
                    assert_eq!(chip.state[b as usize], BlockState::Sealed);
                    b = chip.next[b as usize];
                }
            }
            assert!(chip.free_blocks(self.blocks) >= 1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::timing::rng::SplitMix64;

    /// A tiny drive: 1 channel × 1 chip, 4 pages per block, 16 blocks, 25 %
    /// over-provisioning, GC below 2 free blocks (threshold 0.1 × 16 → 2).
    fn tiny() -> FlashSpec {
        FlashSpec {
            channels: 1,
            chips_per_channel: 1,
            page_bytes: 4096,
            pages_per_block: 4,
            read_ns: 10,
            program_ns: 100,
            erase_ns: 1000,
            transfer_ns_per_byte: 0.0,
            gc_threshold: 0.1,
            capacity_bytes: 16 * 4 * 4096,
            over_provisioning: 0.25,
        }
    }

    #[test]
    fn req_block_parameters_are_valid() {
        let s = FlashSpec::req_block();
        s.validate().unwrap();
        assert_eq!(s.chips(), 16);
        assert_eq!(s.blocks_per_chip(), 32768);
        assert_eq!(s.free_blocks_min(), 3277);
        // One 4 KiB page: write = 4096 × 10 ns + 2 ms; read = 75 µs + 40.96 µs.
        assert_eq!(s.idle_service_ns(Dir::Write, 4096), 40_960 + 2_000_000);
        assert_eq!(s.idle_service_ns(Dir::Read, 4096), 75_000 + 40_960);
        let mut too_small = s.clone();
        too_small.over_provisioning = 0.10;
        assert!(too_small.validate().is_err());
    }

    /// Pages go to chips by logical page number, so eight one-page writes at
    /// once on 8 channels × 2 chips all run in parallel, and sixteen fill each
    /// chip once: the 17th waits for chip 0.
    #[test]
    fn pages_are_striped_over_channels_and_chips() {
        let mut spec = FlashSpec::req_block();
        spec.capacity_bytes = 1 << 30;
        let mut dev = FlashDevice::new(spec).unwrap();
        let mut sink = |_, _| {};
        let page_time = 40_960 + 2_000_000;
        for p in 0..8u64 {
            let s = dev.schedule(0, Dir::Write, p * 4096, 4096, &mut sink);
            assert_eq!(s.end_ns, page_time, "page {p}");
        }
        // Pages 8..16: chips 8..16, on channels 0..8 again: each waits for
        // its channel's previous transfer only (40.96 µs).
        for p in 8..16u64 {
            let s = dev.schedule(0, Dir::Write, p * 4096, 4096, &mut sink);
            assert_eq!(s.end_ns, 40_960 + page_time, "page {p}");
        }
        let s = dev.schedule(0, Dir::Write, 16 * 4096, 4096, &mut sink);
        assert_eq!(s.start_ns, page_time);
        // One 64 KiB write (16 pages) from idle: all chips in parallel, two transfers per channel.
        let mut dev = FlashDevice::new(FlashSpec {
            capacity_bytes: 1 << 30,
            ..FlashSpec::req_block()
        })
        .unwrap();
        let s = dev.schedule(0, Dir::Write, 0, 65536, &mut sink);
        assert_eq!(s.end_ns, 40_960 + page_time);
    }

    #[test]
    fn gc_starts_below_the_threshold_and_costs_copies_and_erases() {
        let spec = tiny();
        assert_eq!(spec.free_blocks_min(), 2);
        assert_eq!(spec.logical_pages_per_chip(), 48);
        let mut dev = FlashDevice::new(spec).unwrap();
        let mut busy = 0u64;
        let mut sink = |s: u64, e: u64| busy += e - s;
        // 56 page writes to 4 logical pages (0..4 repeated 14 times) fill 14
        // blocks: blocks 0..13 sealed with 0 valid pages except the last
        // written copy of each page. The 14th block opens at write 53 leaving
        // 16 − 14 = 2 free blocks: no GC yet.
        let mut t = 0;
        for i in 0..52u64 {
            let s = dev.schedule(t, Dir::Write, (i % 4) * 4096, 4096, &mut sink);
            assert_eq!(s.end_ns - s.start_ns, 100);
            t = s.end_ns;
        }
        assert_eq!(dev.gc_erases, 0);
        // Write 53 opens block 13: free = 2, still not below 2. Write 57 opens
        // block 14: free = 1 < 2, so GC erases one block with 0 valid pages
        // (pages were all overwritten): no copy, one erase of 1000 ns.
        for i in 52..57u64 {
            let s = dev.schedule(t, Dir::Write, (i % 4) * 4096, 4096, &mut sink);
            t = s.end_ns;
        }
        assert_eq!(dev.gc_erases, 1);
        assert_eq!(dev.gc_page_copies, 0);
        assert_eq!(dev.gc_busy_ns, 1000);
        // The next write on the chip waits for the erase.
        let s = dev.schedule(t, Dir::Write, 0, 4096, &mut sink);
        assert_eq!(s.start_ns, t + 1000);
        assert_eq!(busy, 58 * 100 + 1000);
        dev.check();
    }

    /// Random overwrites of the whole logical space keep the FTL consistent,
    /// GC copies valid pages, and write amplification stays finite.
    #[test]
    fn random_overwrites_keep_the_ftl_consistent() {
        let spec = tiny();
        let logical = spec.logical_pages_per_chip();
        let mut dev = FlashDevice::new(spec).unwrap();
        let mut rng = SplitMix64::new(3);
        let mut t = 0;
        for _ in 0..5000 {
            let lpn = rng.below(logical);
            let s = dev.schedule(t, Dir::Write, lpn * 4096, 4096, &mut |_, _| {});
            assert!(s.end_ns >= t + 100);
            t = s.start_ns;
        }
        dev.check();
        assert!(dev.gc_erases > 0);
        assert!(dev.gc_page_copies > 0, "a full drive must copy valid pages");
        assert_eq!(dev.chips[0].l2p.len() as u64, logical);
    }
}
