//! Heap buffers aligned to the device unit, as O_DIRECT requires.

use std::alloc::{self, Layout};
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

use kvhoard_format::UNIT_BYTES;

/// A zero-initialised byte buffer whose address and length are multiples of 4 KiB.
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: AlignedBuf owns its allocation exclusively (like Vec<u8>); sharing &AlignedBuf only
// permits reads, and moving it to another thread moves that ownership.
unsafe impl Send for AlignedBuf {}
// SAFETY: see above; &AlignedBuf exposes only &[u8].
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// Allocates `len` bytes rounded up to a whole number of units (at least one).
    pub fn zeroed(len: usize) -> AlignedBuf {
        let unit = UNIT_BYTES as usize;
        let len = len.max(1).div_ceil(unit) * unit;
        let layout = Self::layout(len);
        // SAFETY: layout has a non-zero size (len >= unit) and a power-of-two alignment.
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let Some(ptr) = NonNull::new(raw) else { alloc::handle_alloc_error(layout) };
        AlignedBuf { ptr, len }
    }

    fn layout(len: usize) -> Layout {
        match Layout::from_size_align(len, UNIT_BYTES as usize) {
            Ok(layout) => layout,
            // Only reachable for lengths near isize::MAX, which no block can have.
            Err(_) => alloc::handle_alloc_error(Layout::new::<[u8; 4096]>()),
        }
    }
}

impl Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: ptr points to len initialised (zeroed at allocation) bytes owned by self,
        // valid for the lifetime of &self.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in deref, and &mut self guarantees exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: ptr was allocated in zeroed() with exactly this layout and is freed once.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), Self::layout(self.len)) }
    }
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AlignedBuf({} bytes)", self.len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn is_aligned_rounded_and_zeroed() {
        let b = AlignedBuf::zeroed(5000);
        assert_eq!(b.len(), 8192);
        assert_eq!(b.as_ptr() as usize % 4096, 0);
        assert!(b.iter().all(|&x| x == 0));
        assert_eq!(AlignedBuf::zeroed(0).len(), 4096);
    }
}
