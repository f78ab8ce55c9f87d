//! Counters that many request threads update at once, split into stripes
//! so that threads do not fight over one cache line: each thread updates
//! its own stripe (chosen once per thread, round robin), readers add the
//! stripes up. Two threads sharing one counter made the engine scale 1.3x
//! from one to two request threads where the raw device scales 1.9x.

/// Stripes per counter set: more than the request threads that usually
/// run at once on the machines this targets.
pub const STRIPES: usize = 8;

/// This thread's stripe.
#[inline]
pub fn stripe() -> usize {
    iocache_device::thread_stripe() % STRIPES
}

/// A value alone on its cache lines (two, against adjacent-line prefetch).
#[derive(Default)]
#[repr(align(128))]
pub struct Padded<T>(pub T);

impl<T> std::ops::Deref for Padded<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}
