//! A CPU cache prefetch hint, for hot paths whose next memory access is known
//! early (the next eviction victim, a request's index entry). It never
//! changes program behaviour.

/// Hints the CPU to load the cache line holding `value`.
#[inline(always)]
pub fn prefetch<T>(value: &T) {
    prefetch_address(value as *const T as usize);
}

/// Hints the CPU to load the cache line at `address`, which need not be
/// valid: a prefetch never faults, never writes and is never dereferenced.
#[inline(always)]
pub fn prefetch_address(address: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        // SAFETY: the prefetch instruction ignores invalid addresses (no
        // fault, no access); the pointer is only an operand.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(address as *const i8) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = address;
}
