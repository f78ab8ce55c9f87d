//! The address model: volumes, byte offsets, 512-byte sectors and cache lines.
//!
//! Everything the core decides is keyed by a [`LineKey`] (volume × line index);
//! everything it is asked about arrives as a [`Request`] in bytes.

use crate::error::CoreError;

/// The unit of validity and dirtiness inside a line.
pub const SECTOR_BYTES: u64 = 512;
/// Smallest allowed cache line.
pub const LINE_BYTES_MIN: u64 = 512;
/// Largest allowed cache line (1 MiB).
pub const LINE_BYTES_MAX: u64 = 1 << 20;

/// Numeric id of a cached volume (a backend).
pub type VolumeId = u32;

/// Index of a cache line slot on the cache device (slot × line size = device offset).
pub type SlotId = u32;

/// Whether a request reads or writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum IoKind {
    Read,
    Write,
}

/// One client request, in bytes. `now_ns` is the caller's clock: the core never reads one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    pub volume: VolumeId,
    pub offset_bytes: u64,
    pub length_bytes: u64,
    pub kind: IoKind,
    pub now_ns: u64,
    /// The process, VM or client that issued the request, where the trace
    /// or the driver knows it (blkparse and FIU traces give a PID); 0 when
    /// unknown. Only ReCA's classifier looks at it (one stream per volume
    /// and process); every cache decision ignores it.
    pub process: u32,
}

impl Request {
    pub fn read(volume: VolumeId, offset_bytes: u64, length_bytes: u64, now_ns: u64) -> Self {
        Request {
            volume,
            offset_bytes,
            length_bytes,
            kind: IoKind::Read,
            now_ns,
            process: 0,
        }
    }

    pub fn write(volume: VolumeId, offset_bytes: u64, length_bytes: u64, now_ns: u64) -> Self {
        Request {
            volume,
            offset_bytes,
            length_bytes,
            kind: IoKind::Write,
            now_ns,
            process: 0,
        }
    }

    /// The same request, issued by `process` (see [`Request::process`]).
    pub fn from_process(self, process: u32) -> Self {
        Request { process, ..self }
    }

    /// Checks the request is non-empty, sector aligned and does not overflow.
    #[inline]
    pub fn validate(&self) -> Result<(), CoreError> {
        if self.length_bytes == 0 {
            return Err(CoreError::EmptyRequest {
                offset_bytes: self.offset_bytes,
            });
        }
        if !self.offset_bytes.is_multiple_of(SECTOR_BYTES) || !self.length_bytes.is_multiple_of(SECTOR_BYTES)
        {
            return Err(CoreError::Unaligned {
                offset_bytes: self.offset_bytes,
                length_bytes: self.length_bytes,
            });
        }
        if self.offset_bytes.checked_add(self.length_bytes).is_none() {
            return Err(CoreError::OutOfRange {
                offset_bytes: self.offset_bytes,
                length_bytes: self.length_bytes,
            });
        }
        Ok(())
    }

    /// The smallest sector-aligned request covering this one (for traces with byte offsets).
    #[inline]
    pub fn aligned_outward(mut self) -> Self {
        let start = self.offset_bytes / SECTOR_BYTES * SECTOR_BYTES;
        let end = self
            .offset_bytes
            .saturating_add(self.length_bytes.max(1))
            .div_ceil(SECTOR_BYTES)
            .saturating_mul(SECTOR_BYTES);
        self.offset_bytes = start;
        self.length_bytes = end - start;
        self
    }
}

/// Identifies one cache line's worth of a volume: `line_index × line_bytes` is its byte offset.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LineKey {
    pub volume: VolumeId,
    pub line_index: u64,
}

/// A validated cache line size (a power of two from 512 B to 1 MiB).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LineSize {
    shift: u32,
}

impl LineSize {
    pub fn new(line_bytes: u64) -> Result<Self, CoreError> {
        if !line_bytes.is_power_of_two() || !(LINE_BYTES_MIN..=LINE_BYTES_MAX).contains(&line_bytes) {
            return Err(CoreError::BadLineSize { line_bytes });
        }
        Ok(LineSize {
            shift: line_bytes.trailing_zeros(),
        })
    }

    pub fn bytes(self) -> u64 {
        1 << self.shift
    }

    pub fn shift(self) -> u32 {
        self.shift
    }

    pub fn sectors(self) -> u32 {
        (self.bytes() / SECTOR_BYTES) as u32
    }

    /// 64-bit words needed for one per-sector bitmap of a line.
    pub fn bitmap_words(self) -> usize {
        (self.sectors() as usize).div_ceil(64)
    }
}

/// One line's part of a request: sectors `[first_sector, end_sector)` of line `key`,
/// starting `buffer_offset_bytes` into the request's buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LinePart {
    pub key: LineKey,
    pub first_sector: u32,
    pub end_sector: u32,
    pub buffer_offset_bytes: u64,
}

impl LinePart {
    pub fn sectors(&self) -> u32 {
        self.end_sector - self.first_sector
    }
}

/// Splits a validated request into line parts, in address order.
pub fn split_request(request: &Request, line: LineSize) -> impl Iterator<Item = LinePart> {
    let sector_shift = SECTOR_BYTES.trailing_zeros();
    let first_sector = request.offset_bytes >> sector_shift;
    let end_sector = (request.offset_bytes + request.length_bytes) >> sector_shift;
    let sectors_per_line_shift = line.shift() - sector_shift;
    let volume = request.volume;
    let mut sector = first_sector;
    std::iter::from_fn(move || {
        if sector >= end_sector {
            return None;
        }
        let line_index = sector >> sectors_per_line_shift;
        let line_first = line_index << sectors_per_line_shift;
        let line_end = line_first + (1u64 << sectors_per_line_shift);
        let part_end = line_end.min(end_sector);
        let part = LinePart {
            key: LineKey { volume, line_index },
            first_sector: (sector - line_first) as u32,
            end_sector: (part_end - line_first) as u32,
            buffer_offset_bytes: (sector - first_sector) << sector_shift,
        };
        sector = part_end;
        Some(part)
    })
}

/// How many lines a validated request touches.
pub fn request_lines(request: &Request, line: LineSize) -> u64 {
    let first_line = request.offset_bytes >> line.shift();
    let last_line = (request.offset_bytes + request.length_bytes - 1) >> line.shift();
    last_line - first_line + 1
}

/// The keys of the lines a validated request touches, in address order.
pub fn split_request_keys(request: &Request, line: LineSize) -> impl Iterator<Item = LineKey> {
    let first_line = request.offset_bytes >> line.shift();
    let last_line = (request.offset_bytes + request.length_bytes - 1) >> line.shift();
    let volume = request.volume;
    (first_line..=last_line).map(move |line_index| LineKey { volume, line_index })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_size_bounds() {
        assert!(LineSize::new(256).is_err());
        assert!(LineSize::new(3 * 512).is_err());
        assert!(LineSize::new(2 << 20).is_err());
        assert_eq!(LineSize::new(512).unwrap().sectors(), 1);
        assert_eq!(LineSize::new(1 << 20).unwrap().bitmap_words(), 32);
        assert_eq!(LineSize::new(4096).unwrap().bitmap_words(), 1);
    }

    #[test]
    fn split_spans_lines() {
        let line = LineSize::new(4096).unwrap();
        // 3 KiB at 3 KiB: sectors 6..12 cross line 0 (sectors 6,7) into line 1 (0..4).
        let parts: Vec<_> = split_request(&Request::read(2, 3072, 3072, 0), line).collect();
        assert_eq!(parts.len(), 2);
        assert_eq!(
            parts[0],
            LinePart {
                key: LineKey {
                    volume: 2,
                    line_index: 0
                },
                first_sector: 6,
                end_sector: 8,
                buffer_offset_bytes: 0
            }
        );
        assert_eq!(
            parts[1],
            LinePart {
                key: LineKey {
                    volume: 2,
                    line_index: 1
                },
                first_sector: 0,
                end_sector: 4,
                buffer_offset_bytes: 1024
            }
        );
    }

    #[test]
    fn validate_rejects_bad_requests() {
        assert!(Request::read(0, 0, 0, 0).validate().is_err());
        assert!(Request::read(0, 1, 512, 0).validate().is_err());
        assert!(Request::read(0, 0, 100, 0).validate().is_err());
        assert!(Request::read(0, u64::MAX - 511, 1024, 0).validate().is_err());
        assert!(Request::read(0, 512, 512, 0).validate().is_ok());
    }

    #[test]
    fn aligned_outward_covers_the_bytes() {
        let r = Request::read(0, 700, 100, 0).aligned_outward();
        assert_eq!((r.offset_bytes, r.length_bytes), (512, 512));
        let r = Request::read(0, 500, 100, 0).aligned_outward();
        assert_eq!((r.offset_bytes, r.length_bytes), (0, 1024));
        let r = Request::read(0, 1024, 0, 0).aligned_outward();
        assert_eq!((r.offset_bytes, r.length_bytes), (1024, 512));
    }
}
