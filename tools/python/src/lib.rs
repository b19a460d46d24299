//! `kvhoard._native`: the engine as Python objects.
//!
//! `Store` is the engine behind a synchronous API that releases the GIL during I/O and reads and
//! writes Python buffers (bytes, bytearray, memoryview, numpy arrays, torch CPU tensors' memory)
//! in place. `NativePlugin` is the object LMCache's multiprocess `native_plugin` L2 adapter drives:
//! batches are submitted, run on worker threads, and reported through an eventfd and
//! `drain_completions()`.

#![deny(missing_docs)]

mod buffers;
mod parallel;
mod plugin;
mod reads;
mod store;

use pyo3::prelude::*;

pyo3::create_exception!(
    _native,
    KvhoardError,
    pyo3::exceptions::PyException,
    "An engine error: the message says what failed and what to do."
);

pub(crate) fn engine_error(e: kvhoard_engine::StoreError) -> PyErr {
    KvhoardError::new_err(e.to_string())
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<store::Store>()?;
    m.add_class::<plugin::NativePlugin>()?;
    m.add("KvhoardError", m.py().get_type::<KvhoardError>())?;
    Ok(())
}
