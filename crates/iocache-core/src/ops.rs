//! The operations a runtime performs to carry out the core's decisions.
//!
//! The core never touches data. For each request it emits an ordered list of
//! [`Op`]s; the simulator counts them and the real engine executes them. The
//! contract for a runtime: the result must be as if the ops ran one after the
//! other in list order. Ops in a row that touch different slots and disjoint
//! backend ranges may run concurrently.

use crate::addr::{LineKey, SlotId, VolumeId};

/// One I/O (or metadata) action. Byte offsets inside a line are `line_offset_bytes`;
/// the cache device offset of a slot is `slot × line_bytes`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// Copy cache data into the request buffer.
    ReadCache {
        slot: SlotId,
        line_offset_bytes: u32,
        length_bytes: u32,
        buffer_offset_bytes: u64,
    },
    /// Read backend data into the request buffer.
    ReadBackend {
        volume: VolumeId,
        offset_bytes: u64,
        length_bytes: u64,
        buffer_offset_bytes: u64,
    },
    /// Store request-buffer data (the client's write, or data just read from the backend) in the cache.
    WriteCache {
        slot: SlotId,
        line_offset_bytes: u32,
        length_bytes: u32,
        buffer_offset_bytes: u64,
        /// Whether the written sectors are dirty afterwards (newer than the
        /// backend: a write-back or write-only write), rather than clean (a
        /// fill, or a write-through copy).
        dirty: bool,
        /// Whether none of the written sectors held valid data of this line
        /// before: if the op does not run, the runtime must make the core
        /// forget them (`Cache::forget_sectors`), since the slot holds
        /// something else there.
        fresh: bool,
    },
    /// Store the client's write on the backend.
    WriteBackend {
        volume: VolumeId,
        offset_bytes: u64,
        length_bytes: u64,
        buffer_offset_bytes: u64,
    },
    /// Copy dirty data from a cache slot to the backend (eviction, invalidation or flush).
    WriteBack {
        slot: SlotId,
        line_offset_bytes: u32,
        length_bytes: u32,
        volume: VolumeId,
        offset_bytes: u64,
    },
    /// The line in `slot` no longer holds `key`: metadata only, no data moves.
    Invalidate { slot: SlotId, key: LineKey },
}

/// Which phase of a request an op belongs to; see [`OpList`].
#[derive(Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Make room: write back and invalidate.
    Clear = 0,
    /// Reads from cache and backend, writes of client data to the backend.
    Transfer = 1,
    /// Writes into the cache (client data and fills).
    Fill = 2,
}

/// The ordered op list of one request (or flush), built in phases so that
/// adjacent backend transfers can be merged into one I/O.
///
/// Ops are collected into three phases (clear, transfer, fill) and the phases
/// are appended in that order when the list is sealed. If a victim slot was
/// already used by this request, the core seals before clearing it, so the
/// list order stays a correct execution order.
#[derive(Default, Debug)]
pub struct OpList {
    ops: Vec<Op>,
    pending: [Vec<Op>; 3],
}

impl OpList {
    pub fn new() -> Self {
        Self::default()
    }

    /// The finished ops, in execution order.
    pub fn ops(&self) -> &[Op] {
        debug_assert!(self.pending.iter().all(Vec::is_empty), "unsealed ops");
        &self.ops
    }

    pub fn clear(&mut self) {
        self.ops.clear();
        for phase in &mut self.pending {
            phase.clear();
        }
    }

    pub(crate) fn seal(&mut self) {
        for phase in &mut self.pending {
            self.ops.append(phase);
        }
    }

    #[inline(always)]
    pub(crate) fn push(&mut self, op: Op) {
        let phase = match op {
            Op::WriteBack { .. } | Op::Invalidate { .. } => Phase::Clear,
            Op::ReadCache { .. } | Op::ReadBackend { .. } | Op::WriteBackend { .. } => Phase::Transfer,
            Op::WriteCache { .. } => Phase::Fill,
        };
        let list = &mut self.pending[phase as usize];
        if let Some(last) = list.last_mut() {
            if merge(last, &op) {
                return;
            }
        }
        list.push(op);
    }
}

/// Where the core puts the ops of a decision: an [`OpList`] for a runtime
/// that performs them, [`DiscardOps`] for a driver that only counts. The
/// core's decision code is generic over it, so both run the same decisions;
/// byte counters are kept by the core before an op reaches the sink.
pub(crate) trait OpSink {
    /// Whether the ops are kept (and so their order matters).
    const KEEPS_OPS: bool;
    fn push(&mut self, op: Op);
    fn seal(&mut self);
    fn clear(&mut self);
}

impl OpSink for OpList {
    const KEEPS_OPS: bool = true;
    #[inline(always)]
    fn push(&mut self, op: Op) {
        OpList::push(self, op)
    }
    #[inline(always)]
    fn seal(&mut self) {
        OpList::seal(self)
    }
    #[inline(always)]
    fn clear(&mut self) {
        OpList::clear(self)
    }
}

/// A sink that drops every op (see [`crate::Cache::access_counted`]).
pub(crate) struct DiscardOps;

impl OpSink for DiscardOps {
    const KEEPS_OPS: bool = false;
    #[inline(always)]
    fn push(&mut self, _op: Op) {}
    #[inline(always)]
    fn seal(&mut self) {}
    #[inline(always)]
    fn clear(&mut self) {}
}

impl Op {
    /// The bytes the op moves (none for [`Op::Invalidate`]).
    #[inline(always)]
    pub fn length_bytes(&self) -> u64 {
        match *self {
            Op::ReadCache { length_bytes, .. }
            | Op::WriteCache { length_bytes, .. }
            | Op::WriteBack { length_bytes, .. } => u64::from(length_bytes),
            Op::ReadBackend { length_bytes, .. } | Op::WriteBackend { length_bytes, .. } => length_bytes,
            Op::Invalidate { .. } => 0,
        }
    }

    /// The same op moved `by` bytes further along each range it names (in
    /// the slot's line, on the backend, in the request buffer), and
    /// `length` bytes long; `None` for an op that moves no data.
    #[inline(always)]
    fn shifted(&self, by: u64, length: u64) -> Option<Op> {
        let mut op = *self;
        // The range in the line, and the length (as wide as that range).
        match &mut op {
            Op::ReadCache {
                line_offset_bytes: at,
                length_bytes: len,
                ..
            }
            | Op::WriteCache {
                line_offset_bytes: at,
                length_bytes: len,
                ..
            }
            | Op::WriteBack {
                line_offset_bytes: at,
                length_bytes: len,
                ..
            } => {
                *at += by as u32;
                *len = length as u32;
            }
            Op::ReadBackend {
                length_bytes: len, ..
            }
            | Op::WriteBackend {
                length_bytes: len, ..
            } => *len = length,
            Op::Invalidate { .. } => return None,
        }
        // The range on the backend.
        match &mut op {
            Op::ReadBackend { offset_bytes: at, .. }
            | Op::WriteBackend { offset_bytes: at, .. }
            | Op::WriteBack { offset_bytes: at, .. } => *at += by,
            Op::ReadCache { .. } | Op::WriteCache { .. } | Op::Invalidate { .. } => {}
        }
        // The range in the request buffer.
        match &mut op {
            Op::ReadCache {
                buffer_offset_bytes: at,
                ..
            }
            | Op::WriteCache {
                buffer_offset_bytes: at,
                ..
            }
            | Op::ReadBackend {
                buffer_offset_bytes: at,
                ..
            }
            | Op::WriteBackend {
                buffer_offset_bytes: at,
                ..
            } => *at += by,
            Op::WriteBack { .. } | Op::Invalidate { .. } => {}
        }
        Some(op)
    }
}

/// Extends `last` by `next` when `next` is the same kind of transfer (same
/// slot, volume and flags) and continues it on every range it names.
#[inline(always)]
fn merge(last: &mut Op, next: &Op) -> bool {
    if std::mem::discriminant(last) != std::mem::discriminant(next) {
        return false;
    }
    let (own, more) = (last.length_bytes(), next.length_bytes());
    match last.shifted(own, more) {
        Some(continued) if continued == *next => {
            *last = last.shifted(0, own + more).expect("a transfer");
            true
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contiguous_backend_reads_merge_and_phases_order() {
        let mut list = OpList::new();
        list.push(Op::WriteCache {
            slot: 1,
            line_offset_bytes: 0,
            length_bytes: 512,
            buffer_offset_bytes: 0,
            dirty: false,
            fresh: true,
        });
        list.push(Op::ReadBackend {
            volume: 0,
            offset_bytes: 4096,
            length_bytes: 512,
            buffer_offset_bytes: 0,
        });
        list.push(Op::ReadBackend {
            volume: 0,
            offset_bytes: 4608,
            length_bytes: 1024,
            buffer_offset_bytes: 512,
        });
        list.push(Op::ReadBackend {
            volume: 1,
            offset_bytes: 5632,
            length_bytes: 512,
            buffer_offset_bytes: 1536,
        });
        list.seal();
        assert_eq!(
            list.ops(),
            &[
                Op::ReadBackend {
                    volume: 0,
                    offset_bytes: 4096,
                    length_bytes: 1536,
                    buffer_offset_bytes: 0
                },
                Op::ReadBackend {
                    volume: 1,
                    offset_bytes: 5632,
                    length_bytes: 512,
                    buffer_offset_bytes: 1536
                },
                Op::WriteCache {
                    slot: 1,
                    line_offset_bytes: 0,
                    length_bytes: 512,
                    buffer_offset_bytes: 0,
                    dirty: false,
                    fresh: true
                },
            ]
        );
    }
}
