//! `O_DIRECT` needs buffers whose address is a
//! multiple of the device's alignment, which `Vec<u8>` does not promise.
//! `AlignedBuf` is such a buffer; devices use it as a bounce buffer for
//! unaligned requests, and callers use it to stay on the fast path.

use std::alloc::{self, Layout};
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

/// A zero-initialised heap buffer whose address is a multiple of `align`.
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
    layout: Layout,
}

// SAFETY: AlignedBuf owns its allocation exclusively, like Vec<u8>.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared access only hands out `&[u8]`.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// A zeroed buffer of `len` bytes aligned to `align` (a power of two;
    /// values below 1 are taken as 1).
    ///
    /// # Panics
    /// If `align` is not a power of two or the size overflows.
    pub fn zeroed(len: usize, align: usize) -> Self {
        let align = align.max(1);
        let layout = Layout::from_size_align(len.max(1), align).expect("valid aligned layout");
        // SAFETY: layout has non-zero size.
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).unwrap_or_else(|| alloc::handle_alloc_error(layout));
        AlignedBuf { ptr, len, layout }
    }

    /// The alignment of the buffer's address.
    pub fn align(&self) -> usize {
        self.layout.align()
    }
}

impl Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: ptr is valid for len initialised bytes for self's lifetime.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, and &mut self gives exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `zeroed` with this layout.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AlignedBuf")
            .field("len", &self.len)
            .field("align", &self.layout.align())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_and_zeroed() {
        for align in [1, 512, 4096] {
            let mut b = AlignedBuf::zeroed(10_000, align);
            assert_eq!(b.as_ptr() as usize % align, 0);
            assert!(b.iter().all(|&x| x == 0));
            b[9_999] = 7;
            assert_eq!(b[9_999], 7);
        }
        let empty = AlignedBuf::zeroed(0, 4096);
        assert!(empty.is_empty());
    }
}
