//! A global allocator for the binary: the system allocator, with large
//! allocations (the cache's slot records, line index and policy lists)
//! placed on 2 MiB boundaries and marked for transparent huge pages once
//! [`enable`] was called (by the offline commands, `sim`, `lab` and
//! `trace`, before they allocate anything that large; the server's memory,
//! whose large buffers come and go with requests, is left as it was).
//!
//! A simulated or served cache touches its tables at random; with 4 KiB
//! pages a table of a few MiB takes more TLB entries than the CPU has, so
//! most accesses pay a page walk on top of their cache miss. Huge pages
//! cover such a table with a handful of entries. On a kernel whose THP mode
//! is `madvise` the advice is what turns them on; with `always` it is
//! redundant, with `never` ignored. The advice changes no decision and no
//! result, only where memory lands; a failed `madvise` is ignored.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, Ordering};

/// Allocations of at least this many bytes get huge pages.
const HUGE_FROM_BYTES: usize = 1 << 20;
/// The size of a transparent huge page on x86-64 and most arm64 kernels.
const HUGE_PAGE_BYTES: usize = 2 << 20;

pub struct HugeTableAlloc;

/// Whether large allocations get huge pages: off until [`enable`], and
/// never turned off, so an allocation is freed with the layout it was
/// made with as long as nothing that large was allocated before.
static ENABLED: AtomicBool = AtomicBool::new(false);

/// Turns huge pages on for allocations made from now on. Call it before
/// anything of `HUGE_FROM_BYTES` or more is allocated.
pub fn enable() {
    ENABLED.store(true, Ordering::Relaxed);
}

/// The layout a large allocation is made with when huge pages are
/// `enabled`: aligned to, and a whole number of, huge pages (at most one
/// huge page more than asked for).
#[inline]
fn huge_layout(layout: Layout, enabled: bool) -> Option<Layout> {
    if layout.size() < HUGE_FROM_BYTES || !enabled {
        return None;
    }
    let size = layout.size().checked_add(HUGE_PAGE_BYTES - 1)? & !(HUGE_PAGE_BYTES - 1);
    Layout::from_size_align(size, layout.align().max(HUGE_PAGE_BYTES)).ok()
}

#[cfg(target_os = "linux")]
fn advise_huge(ptr: *mut u8, size: usize) {
    // SAFETY: `ptr..ptr + size` is a live allocation just made by System;
    // MADV_HUGEPAGE only changes how the kernel backs it.
    unsafe {
        libc::madvise(ptr.cast(), size, libc::MADV_HUGEPAGE);
    }
}

#[cfg(not(target_os = "linux"))]
fn advise_huge(_ptr: *mut u8, _size: usize) {}

/// Allocates `layout` (zeroed or not), on huge pages when large and `enabled`.
///
/// # Safety
/// As `GlobalAlloc::alloc`.
unsafe fn alloc_with(layout: Layout, zeroed: bool, enabled: bool) -> *mut u8 {
    let (layout, huge) = match huge_layout(layout, enabled) {
        Some(huge) => (huge, true),
        None => (layout, false),
    };
    let ptr = if zeroed {
        System.alloc_zeroed(layout)
    } else {
        System.alloc(layout)
    };
    if huge && !ptr.is_null() {
        advise_huge(ptr, layout.size());
    }
    ptr
}

/// Frees what `alloc_with(layout, _, enabled)` returned.
///
/// # Safety
/// As `GlobalAlloc::dealloc`, with the `enabled` the allocation was made with.
unsafe fn dealloc_with(ptr: *mut u8, layout: Layout, enabled: bool) {
    System.dealloc(ptr, huge_layout(layout, enabled).unwrap_or(layout))
}

/// Moves an allocation of `layout` to one of `new_size` bytes.
///
/// # Safety
/// As `GlobalAlloc::realloc`, with the `enabled` the allocation was made with.
unsafe fn realloc_with(ptr: *mut u8, layout: Layout, new_size: usize, enabled: bool) -> *mut u8 {
    let Ok(new_layout) = Layout::from_size_align(new_size, layout.align()) else {
        return std::ptr::null_mut();
    };
    if huge_layout(layout, enabled).is_none() && huge_layout(new_layout, enabled).is_none() {
        return System.realloc(ptr, layout, new_size);
    }
    let new_ptr = alloc_with(new_layout, false, enabled);
    if !new_ptr.is_null() {
        std::ptr::copy_nonoverlapping(ptr, new_ptr, layout.size().min(new_size));
        dealloc_with(ptr, layout, enabled);
    }
    new_ptr
}

// SAFETY: every allocation is made by System with a layout at least as
// large and as aligned as the one asked for, and freed by System with the
// same layout (computed again from the caller's, deterministically: the
// flag only ever turns on, before anything large is allocated).
unsafe impl GlobalAlloc for HugeTableAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        alloc_with(layout, false, ENABLED.load(Ordering::Relaxed))
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        alloc_with(layout, true, ENABLED.load(Ordering::Relaxed))
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        dealloc_with(ptr, layout, ENABLED.load(Ordering::Relaxed))
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        realloc_with(ptr, layout, new_size, ENABLED.load(Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn large_layouts_are_whole_aligned_huge_pages() {
        assert_eq!(huge_layout(Layout::from_size_align(4096, 8).unwrap(), true), None);
        assert_eq!(
            huge_layout(Layout::from_size_align(3 << 20, 8).unwrap(), false),
            None
        );
        let huge = huge_layout(Layout::from_size_align(3 << 20, 8).unwrap(), true).unwrap();
        assert_eq!((huge.size(), huge.align()), (4 << 20, 2 << 20));
        let exact = huge_layout(Layout::from_size_align(4 << 20, 64).unwrap(), true).unwrap();
        assert_eq!((exact.size(), exact.align()), (4 << 20, 2 << 20));
    }

    #[test]
    fn allocations_round_trip() {
        // Through the functions the allocator calls, with huge pages on
        // (the process's own flag is left alone).
        for size in [16usize, 1 << 20, (3 << 20) + 5] {
            let layout = Layout::from_size_align(size, 8).unwrap();
            // SAFETY: a fresh allocation of `layout`, written, grown, read
            // and freed, all with huge pages on.
            unsafe {
                let p = alloc_with(layout, true, true);
                assert!(!p.is_null());
                assert!((0..size).step_by(4096).all(|i| *p.add(i) == 0));
                *p = 7;
                let q = realloc_with(p, layout, size * 2, true);
                assert_eq!(*q, 7);
                dealloc_with(q, Layout::from_size_align(size * 2, 8).unwrap(), true);
            }
        }
    }
}
