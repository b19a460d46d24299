//! Python buffers as byte regions the engine can read or fill without the GIL.

use pyo3::buffer::PyUntypedBuffer;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;

/// A contiguous byte buffer exported by a Python object, held (so neither the object nor its
/// memory can go away) until this is dropped.
pub(crate) struct Region {
    ptr: *mut u8,
    len: usize,
    _buffer: PyUntypedBuffer,
}

// SAFETY: the memory belongs to the exporting object, which the held `PyUntypedBuffer` keeps alive and
// whose buffer it keeps exported (an exporter may not move or free exported memory); nothing in
// the region is tied to the thread that created it. `PyUntypedBuffer` itself is `Send` and releases the
// export under the GIL when dropped.
unsafe impl Send for Region {}

// SAFETY: a shared `&Region` only gives out `&[u8]` (through the unsafe `bytes`, whose caller
// guarantees no concurrent writer); writing needs `&mut Region`.
unsafe impl Sync for Region {}

impl Region {
    /// A buffer to read from (bytes, bytearray, memoryview, numpy array).
    pub(crate) fn readable(object: &Bound<'_, PyAny>) -> PyResult<Region> {
        Self::new(object, false)
    }

    /// A buffer to write into: writable and contiguous (bytearray, a writable memoryview, a numpy
    /// array, the memory of a CPU tensor through `tensor.numpy()`).
    pub(crate) fn writable(object: &Bound<'_, PyAny>) -> PyResult<Region> {
        Self::new(object, true)
    }

    fn new(object: &Bound<'_, PyAny>, writable: bool) -> PyResult<Region> {
        // Any element type: a block is bytes, whatever the exporter calls its items (LMCache's
        // memoryviews say '<B', numpy arrays their dtype).
        let buffer = PyUntypedBuffer::get(object).map_err(|e| {
            PyTypeError::new_err(format!(
                "expected an object with the buffer protocol (bytes, bytearray, memoryview, numpy array): {e}"
            ))
        })?;
        if !buffer.is_c_contiguous() {
            return Err(PyValueError::new_err("the buffer must be contiguous"));
        }
        if writable && buffer.readonly() {
            return Err(PyValueError::new_err("the buffer is read-only; pass a bytearray or a writable memoryview"));
        }
        Ok(Region { ptr: buffer.buf_ptr().cast::<u8>(), len: buffer.len_bytes(), _buffer: buffer })
    }

    /// The bytes.
    ///
    /// # Safety
    ///
    /// Nobody may write to the buffer while the slice lives. Python code that hands a buffer to
    /// kvhoard promises not to touch it until the call (or, for `NativePlugin`, the completion)
    /// returns; LMCache keeps that promise for the memory objects it submits.
    pub(crate) unsafe fn bytes(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: ptr and len describe the exported, live buffer (see `Send` above); the caller
        // guarantees no concurrent writer.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    /// The bytes, to fill.
    ///
    /// # Safety
    ///
    /// Nobody else may read or write the buffer while the slice lives (see [`Region::bytes`]).
    /// The buffer was checked writable when the region was made.
    pub(crate) unsafe fn bytes_mut(&mut self) -> &mut [u8] {
        if self.len == 0 {
            return &mut [];
        }
        // SAFETY: as in `bytes`, and the exporter declared the buffer writable; `&mut self`
        // prevents a second slice from this region.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}
