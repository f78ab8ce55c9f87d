//! Payload buffers a serving thread keeps from one request to the next,
//! within one allowance for the whole server.
//!
//! Allocating, faulting in and zeroing a fresh buffer for every large
//! request costs more than serving it (9 % of the server's time on 1 MiB
//! reads when such buffers were dropped after each request), but a buffer
//! kept after its reply is memory no request's budget counts any more. So:
//! a buffer of at most [`SMALL_BUFFER_BYTES`] is always kept (that much per
//! thread at most); a larger one, up to [`LARGEST_KEPT_BYTES`], only while
//! the server's [`KeptAllowance`] has room for it, else it is dropped. What
//! all threads keep above the small size is then bounded by one figure,
//! whatever the number of connections and threads.

use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Buffers of at most this capacity are kept without asking the allowance:
/// a 64 KiB request's reply and its header, with room.
pub(crate) const SMALL_BUFFER_BYTES: usize = 128 << 10;

/// No buffer above this capacity is kept: 1 MiB (the largest request most
/// clients send) and room for a reply's header, since a read's reply is
/// header and data in one buffer.
pub(crate) const LARGEST_KEPT_BYTES: usize = (1 << 20) + 4096;

/// Bytes of large kept buffers the whole server may hold.
#[derive(Debug)]
pub(crate) struct KeptAllowance {
    held_bytes: AtomicUsize,
    limit_bytes: usize,
}

impl KeptAllowance {
    pub(crate) fn new(limit_bytes: usize) -> KeptAllowance {
        KeptAllowance {
            held_bytes: AtomicUsize::new(0),
            limit_bytes,
        }
    }

    /// Takes `n` bytes if they fit under the limit.
    fn try_take(&self, n: usize) -> bool {
        self.held_bytes
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                held.checked_add(n).filter(|&after| after <= self.limit_bytes)
            })
            .is_ok()
    }

    fn give_back(&self, n: usize) {
        if n > 0 {
            let before = self.held_bytes.fetch_sub(n, Ordering::AcqRel);
            debug_assert!(before >= n, "gave back {n} bytes of {before} held");
        }
    }

    /// Bytes held now by large kept buffers.
    #[cfg(test)]
    pub(crate) fn held_bytes(&self) -> usize {
        self.held_bytes.load(Ordering::Acquire)
    }
}

/// A thread's reusable buffer (a WRITE's payload, a READ's reply, a batch of
/// replies). Used as a `Vec<u8>`; [`KeptBuffer::recycle`] after each use
/// decides whether it is kept.
#[derive(Debug)]
pub(crate) struct KeptBuffer<'a> {
    bytes: Vec<u8>,
    /// Bytes of the allowance this buffer holds (its capacity when it was
    /// last kept as a large buffer, else 0).
    charged_bytes: usize,
    allowance: &'a KeptAllowance,
}

impl<'a> KeptBuffer<'a> {
    pub(crate) fn new(allowance: &'a KeptAllowance) -> KeptBuffer<'a> {
        KeptBuffer {
            bytes: Vec::new(),
            charged_bytes: 0,
            allowance,
        }
    }

    /// After a use: keeps the buffer if it is small, or large but no larger
    /// than [`LARGEST_KEPT_BYTES`] and within the allowance; else drops it.
    pub(crate) fn recycle(&mut self) {
        let capacity = self.bytes.capacity();
        if capacity == self.charged_bytes {
            return; // kept as it was
        }
        self.allowance.give_back(self.charged_bytes);
        self.charged_bytes = 0;
        if capacity <= SMALL_BUFFER_BYTES {
            return;
        }
        if capacity <= LARGEST_KEPT_BYTES && self.allowance.try_take(capacity) {
            self.charged_bytes = capacity;
        } else {
            self.bytes = Vec::new();
        }
    }
}

impl Deref for KeptBuffer<'_> {
    type Target = Vec<u8>;
    fn deref(&self) -> &Vec<u8> {
        &self.bytes
    }
}

impl DerefMut for KeptBuffer<'_> {
    fn deref_mut(&mut self) -> &mut Vec<u8> {
        &mut self.bytes
    }
}

impl Drop for KeptBuffer<'_> {
    fn drop(&mut self) {
        self.allowance.give_back(self.charged_bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: usize = 1 << 20;

    fn grown(b: &mut KeptBuffer<'_>, len: usize) {
        b.clear();
        b.reserve_exact(len);
        b.resize(len, 0);
    }

    #[test]
    fn small_buffers_are_kept_without_the_allowance() {
        let allowance = KeptAllowance::new(0);
        let mut b = KeptBuffer::new(&allowance);
        grown(&mut b, SMALL_BUFFER_BYTES);
        b.recycle();
        assert_eq!(b.capacity(), SMALL_BUFFER_BYTES);
        assert_eq!(allowance.held_bytes(), 0);
    }

    #[test]
    fn large_buffers_are_kept_only_within_the_allowance() {
        let allowance = KeptAllowance::new(2 * MIB + 8192);
        let mut a = KeptBuffer::new(&allowance);
        let mut b = KeptBuffer::new(&allowance);
        let mut c = KeptBuffer::new(&allowance);
        for buffer in [&mut a, &mut b, &mut c] {
            grown(buffer, MIB + 32);
            buffer.recycle();
        }
        assert_eq!(a.capacity(), MIB + 32, "kept");
        assert_eq!(b.capacity(), MIB + 32, "kept");
        assert_eq!(c.capacity(), 0, "past the allowance: dropped");
        assert_eq!(allowance.held_bytes(), 2 * (MIB + 32));
        // Kept again as it is: nothing more taken.
        a.recycle();
        assert_eq!(allowance.held_bytes(), 2 * (MIB + 32));
        // A dropped buffer gives its share back, and another may take it.
        drop(a);
        assert_eq!(allowance.held_bytes(), MIB + 32);
        grown(&mut c, MIB);
        c.recycle();
        assert_eq!(c.capacity(), MIB);
        assert_eq!(allowance.held_bytes(), 2 * MIB + 32);
    }

    #[test]
    fn buffers_above_the_largest_kept_size_are_dropped_and_give_back_their_share() {
        let allowance = KeptAllowance::new(64 * MIB);
        let mut b = KeptBuffer::new(&allowance);
        grown(&mut b, MIB);
        b.recycle();
        assert_eq!(allowance.held_bytes(), MIB);
        grown(&mut b, LARGEST_KEPT_BYTES + 1);
        b.recycle();
        assert_eq!(b.capacity(), 0);
        assert_eq!(allowance.held_bytes(), 0);
        // Shrunk to a small buffer: its share goes back, the buffer stays.
        grown(&mut b, MIB);
        b.recycle();
        b.truncate(4096);
        b.shrink_to(4096);
        b.recycle();
        assert!(b.capacity() <= SMALL_BUFFER_BYTES && b.capacity() >= 4096);
        assert_eq!(allowance.held_bytes(), 0);
    }
}
