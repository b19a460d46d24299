//! Heap buffers aligned to the device unit, as O_DIRECT requires.
//!
//! Buffers of [`MAP_MIN`] or more are mapped straight from the kernel and unmapped when dropped.
//! Through malloc they would not be returned: glibc raises its mmap threshold to the size of
//! each mapped chunk it frees (up to 32 MiB), so later multi-MiB buffers come from its heap and
//! stay in the process after they are freed (a server that had served a burst of 32 MiB objects
//! kept ~500 MB resident with no connection left). The kernel zeroes mapped pages when first
//! touched, so a large buffer costs memory only for the bytes written into it.
//!
//! A buffer of [`HUGE_PAGE`] or more starts on a huge-page boundary and is advised to use
//! transparent huge pages. The kernel backs only whole aligned huge pages that way: the rest,
//! less than one, stays in 4 KiB pages, so a 2 MiB block's record of 2 MiB and 4 KiB does not
//! take 4 MiB. A direct write or read of a buffer of scattered 4 KiB pages reaches the device as
//! requests of at most `max_segments` pages each (254 on virtio-blk: about 1 MiB), and pinning
//! it walks every page; in 2 MiB pages a 32 MiB record goes as requests of the device's largest
//! size (docs/benchmarks.md, "Huge pages for large buffers, and the writer's next record").
//! Where transparent huge pages are off, the advice is refused and the buffer is as it would be
//! without it.

use std::alloc::{self, Layout};
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

use kvhoard_format::UNIT_BYTES;

/// Buffers at least this large are mapped from the kernel rather than allocated by malloc.
pub const MAP_MIN: usize = 1 << 20;

/// The size of a transparent huge page on x86-64 (and arm64 with 4 KiB pages).
pub const HUGE_PAGE: usize = 2 << 20;

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
    /// Large buffers are advised to use huge pages: for buffers written whole at once (a record,
    /// a device read), not for those filled over time ([`AlignedBuf::zeroed_for_stream`]).
    pub fn zeroed(len: usize) -> AlignedBuf {
        Self::new(len, true)
    }

    /// As [`AlignedBuf::zeroed`], in 4 KiB pages only: for a buffer filled over time, as a
    /// client's bytes arrive, whose memory must grow with them. In huge pages the first byte of
    /// each 2 MiB would make all of it resident (a server holding many slow uploads measured
    /// 320 MiB over a 256 MiB budget that way).
    pub fn zeroed_for_stream(len: usize) -> AlignedBuf {
        Self::new(len, false)
    }

    fn new(len: usize, huge: bool) -> AlignedBuf {
        let unit = UNIT_BYTES as usize;
        let len = len.max(1).div_ceil(unit) * unit;
        if len >= MAP_MIN {
            if let Some(ptr) = map(len, huge) {
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

/// Maps `len` (a multiple of 4 KiB) zeroed bytes, or `None` if the kernel refuses. From
/// [`HUGE_PAGE`] up, if `huge` and where pages are 4 KiB, the mapping starts on a huge-page boundary and is
/// advised to use huge pages. (With larger pages, `len` need not be a multiple of one, so the
/// excess could not be trimmed exactly; and a huge page there is not 2 MiB.)
fn map(len: usize, huge: bool) -> Option<NonNull<u8>> {
    // SAFETY: sysconf reads a constant of the running kernel and has no other effect.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if !huge || len < HUGE_PAGE || page != 4096 {
        return map_anonymous(len);
    }
    // One huge page more than needed, so that a boundary lies in its first one; the excess on
    // either side is returned at once.
    let raw = map_anonymous(len.checked_add(HUGE_PAGE)?)?.as_ptr() as usize;
    let start = raw.next_multiple_of(HUGE_PAGE);
    let (head, tail) = (start - raw, raw + HUGE_PAGE - start);
    // SAFETY: [raw, start) and [start + len, raw + len + HUGE_PAGE) lie inside the mapping just
    // made, which nothing else refers to; unmapping them leaves exactly [start, start + len)
    // mapped. Both lengths are multiples of the page size (4 KiB, checked above: raw and start
    // are page aligned, and len is a multiple of 4 KiB); a zero length is skipped, since munmap
    // refuses it.
    unsafe {
        if head > 0 {
            let rc = libc::munmap(raw as *mut libc::c_void, head);
            debug_assert_eq!(rc, 0);
        }
        if tail > 0 {
            let rc = libc::munmap((start + len) as *mut libc::c_void, tail);
            debug_assert_eq!(rc, 0);
        }
    }
    // SAFETY: [start, start + len) is that private anonymous mapping, owned by the caller; the
    // advice changes how its pages are backed, never their contents. A refusal (transparent
    // huge pages compiled out or disabled) leaves 4 KiB pages, as without it. (Advising only
    // the whole huge pages would split the mapping in two for nothing.)
    unsafe { libc::madvise(start as *mut libc::c_void, len, libc::MADV_HUGEPAGE) };
    NonNull::new(start as *mut u8)
}

/// An anonymous private mapping of `len` zeroed bytes, or `None` if the kernel refuses.
fn map_anonymous(len: usize) -> Option<NonNull<u8>> {
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

    #[test]
    fn buffers_of_huge_pages_start_on_a_huge_page_and_are_whole() {
        for len in [HUGE_PAGE, HUGE_PAGE + 4096, 16 * HUGE_PAGE + 4096] {
            let mut b = AlignedBuf::zeroed(len);
            assert!(b.mapped);
            assert_eq!(b.len(), len);
            // SAFETY: sysconf has no effect beyond returning the kernel's page size.
            if unsafe { libc::sysconf(libc::_SC_PAGESIZE) } == 4096 {
                assert_eq!(b.as_ptr() as usize % HUGE_PAGE, 0, "{len}");
            }
            assert!(b.iter().all(|&x| x == 0));
            b.fill(9);
            assert!(b.iter().all(|&x| x == 9));
        }
    }
}
