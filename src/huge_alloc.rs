//! The binary's global allocator: the system allocator, with large
//! allocations (the cache's slot records, line index and policy lists)
//! placed on 2 MiB boundaries and marked for transparent huge pages.
//!
//! A simulated or served cache touches its tables at random; with 4 KiB
//! pages a table of a few MiB takes more TLB entries than the CPU has, so
//! most accesses pay a page walk on top of their cache miss. Huge pages
//! cover such a table with a handful of entries. On a kernel whose THP mode
//! is `madvise` the advice is what turns them on; with `always` it is
//! redundant, with `never` ignored. The advice changes no decision and no
//! result, only where memory lands; a failed `madvise` is ignored.

use std::alloc::{GlobalAlloc, Layout, System};

/// Allocations of at least this many bytes get huge pages.
const HUGE_FROM_BYTES: usize = 1 << 20;
/// The size of a transparent huge page on x86-64 and most arm64 kernels.
const HUGE_PAGE_BYTES: usize = 2 << 20;

pub struct HugeTableAlloc;

/// The layout a large allocation is made with: aligned to, and a whole
/// number of, huge pages (at most one huge page more than asked for).
#[inline]
fn huge_layout(layout: Layout) -> Option<Layout> {
    if layout.size() < HUGE_FROM_BYTES {
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

// SAFETY: every allocation is made by System with a layout at least as
// large and as aligned as the one asked for, and freed by System with the
// same layout (computed again from the caller's, deterministically).
unsafe impl GlobalAlloc for HugeTableAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        match huge_layout(layout) {
            None => System.alloc(layout),
            Some(huge) => {
                let ptr = System.alloc(huge);
                if !ptr.is_null() {
                    advise_huge(ptr, huge.size());
                }
                ptr
            }
        }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        match huge_layout(layout) {
            None => System.alloc_zeroed(layout),
            Some(huge) => {
                let ptr = System.alloc_zeroed(huge);
                if !ptr.is_null() {
                    advise_huge(ptr, huge.size());
                }
                ptr
            }
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, huge_layout(layout).unwrap_or(layout))
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let Ok(new_layout) = Layout::from_size_align(new_size, layout.align()) else {
            return std::ptr::null_mut();
        };
        if huge_layout(layout).is_none() && huge_layout(new_layout).is_none() {
            return System.realloc(ptr, layout, new_size);
        }
        let new_ptr = self.alloc(new_layout);
        if !new_ptr.is_null() {
            std::ptr::copy_nonoverlapping(ptr, new_ptr, layout.size().min(new_size));
            self.dealloc(ptr, layout);
        }
        new_ptr
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn large_layouts_are_whole_aligned_huge_pages() {
        assert_eq!(huge_layout(Layout::from_size_align(4096, 8).unwrap()), None);
        let huge = huge_layout(Layout::from_size_align(3 << 20, 8).unwrap()).unwrap();
        assert_eq!((huge.size(), huge.align()), (4 << 20, 2 << 20));
        let exact = huge_layout(Layout::from_size_align(4 << 20, 64).unwrap()).unwrap();
        assert_eq!((exact.size(), exact.align()), (4 << 20, 2 << 20));
    }

    #[test]
    fn allocations_round_trip() {
        let a = HugeTableAlloc;
        for size in [16usize, 1 << 20, (3 << 20) + 5] {
            let layout = Layout::from_size_align(size, 8).unwrap();
            // SAFETY: a fresh allocation of `layout`, written, grown, read and freed.
            unsafe {
                let p = a.alloc_zeroed(layout);
                assert!(!p.is_null());
                assert!((0..size).step_by(4096).all(|i| *p.add(i) == 0));
                *p = 7;
                let q = a.realloc(p, layout, size * 2);
                assert_eq!(*q, 7);
                a.dealloc(q, Layout::from_size_align(size * 2, 8).unwrap());
            }
        }
    }
}
