//! Heap buffers aligned to the device unit, as O_DIRECT requires.
//!
//! Buffers of [`MAP_MIN`] or more are mapped straight from the kernel and unmapped when dropped.
//! Through malloc they would not be returned: glibc raises its mmap threshold to the size of
//! each mapped chunk it frees (up to 32 MiB), so later multi-MiB buffers come from its heap and
//! stay in the process after they are freed (a server that had served a burst of 32 MiB objects
//! kept ~500 MB resident with no connection left). The kernel zeroes mapped pages when first
//! touched, so a large buffer costs memory only for the bytes written into it.

use std::alloc::{self, Layout};
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

use kvhoard_format::UNIT_BYTES;

/// Buffers at least this large are mapped from the kernel rather than allocated by malloc.
pub const MAP_MIN: usize = 1 << 20;

/// A zero-initialised byte buffer whose address and length are multiples of 4 KiB.
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
    /// Mapped by [`map`] (unmapped when dropped) rather than allocated by malloc.
    mapped: bool,
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
        if len >= MAP_MIN {
            if let Some(ptr) = map(len) {
                return AlignedBuf { ptr, len, mapped: true };
            }
            // Out of mappings (vm.max_map_count): malloc may still have room.
        }
        let layout = Self::layout(len);
        // SAFETY: layout has a non-zero size (len >= unit) and a power-of-two alignment.
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let Some(ptr) = NonNull::new(raw) else { alloc::handle_alloc_error(layout) };
        AlignedBuf { ptr, len, mapped: false }
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

/// Maps `len` (a multiple of the page size) zeroed bytes, or `None` if the kernel refuses.
fn map(len: usize) -> Option<NonNull<u8>> {
    // SAFETY: an anonymous private mapping at an address of the kernel's choosing touches no
    // existing memory; the result is checked before use.
    let raw = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if raw == libc::MAP_FAILED {
        return None;
    }
    NonNull::new(raw.cast::<u8>())
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        if self.mapped {
            // SAFETY: ptr and len are exactly a mapping made by map() and owned by self alone;
            // it is unmapped once, here.
            unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
            return;
        }
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

    #[test]
    fn large_buffers_are_mapped_zeroed_and_writable() {
        let mut b = AlignedBuf::zeroed(MAP_MIN + 1);
        assert!(b.mapped);
        assert_eq!(b.len(), MAP_MIN + 4096);
        assert_eq!(b.as_ptr() as usize % 4096, 0);
        assert!(b.iter().all(|&x| x == 0));
        b.fill(7);
        assert!(b.iter().all(|&x| x == 7));
        assert!(!AlignedBuf::zeroed(MAP_MIN - 4096).mapped);
    }
}
