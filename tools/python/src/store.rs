//! `kvhoard.Store`: the engine, synchronous, GIL released during I/O.

use std::path::PathBuf;

use kvhoard_engine::{CreateOptions, Durability, PutOptions, ReadOptions, StoreOptions};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::buffers::Region;
use crate::engine_error;

/// A kvhoard volume opened in this process.
///
/// `Store(path, create=False, capacity=None, segment_size=None, namespace="default",
/// durability="written", ttl=None, dram_tier=0)`. With `create=True` a missing volume is created
/// (`capacity` bytes, default 1 GiB; `segment_size` bytes per log
/// segment, default 64 MiB, at least two segments). Keys live in `namespace`; puts are acknowledged at
/// `durability` (`buffered`, `written`, `synced`) and expire after `ttl` seconds when it is set.
/// Every method releases the GIL while the engine works.
#[pyclass(module = "kvhoard._native", frozen)]
pub(crate) struct Store {
    pub(crate) engine: kvhoard_engine::Store,
    namespace: String,
    put: PutOptions,
}

pub(crate) fn parse_durability(text: &str) -> PyResult<Durability> {
    text.parse().map_err(PyValueError::new_err)
}

pub(crate) fn open_engine(
    path: PathBuf,
    create: bool,
    capacity: Option<u64>,
    segment_size: Option<u64>,
    dram_tier: u64,
) -> Result<kvhoard_engine::Store, kvhoard_engine::StoreError> {
    let opts = StoreOptions { dram_tier_bytes: dram_tier, ..Default::default() };
    if create {
        let defaults = CreateOptions::default();
        let create_opts = CreateOptions {
            capacity_bytes: capacity.or(defaults.capacity_bytes),
            segment_size_bytes: segment_size.unwrap_or(defaults.segment_size_bytes),
        };
        match kvhoard_engine::Store::create(&path, &create_opts, opts.clone()) {
            Err(kvhoard_engine::StoreError::AlreadyExists { .. }) => {}
            other => return other,
        }
    }
    kvhoard_engine::Store::open(&path, opts)
}

#[pymethods]
impl Store {
    #[new]
    #[pyo3(signature = (path, *, create=false, capacity=None, segment_size=None, namespace="default", durability="written", ttl=None, dram_tier=0))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        path: PathBuf,
        create: bool,
        capacity: Option<u64>,
        segment_size: Option<u64>,
        namespace: &str,
        durability: &str,
        ttl: Option<u32>,
        dram_tier: u64,
    ) -> PyResult<Store> {
        let durability = parse_durability(durability)?;
        let engine =
            py.detach(|| open_engine(path, create, capacity, segment_size, dram_tier)).map_err(engine_error)?;
        Ok(Store {
            engine,
            namespace: namespace.to_string(),
            put: PutOptions { durability, ttl_secs: ttl, ..Default::default() },
        })
    }

    /// Stores the bytes of `data` (any byte buffer) under `key`; returns the blake3 hash.
    fn put<'py>(&self, py: Python<'py>, key: &str, data: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyBytes>> {
        let region = Region::readable(data)?;
        // SAFETY: the caller does not write to `data` during the call (see `Region::bytes`).
        let hash = py
            .detach(|| self.engine.put(&self.namespace, key, unsafe { region.bytes() }, &self.put))
            .map_err(engine_error)?;
        Ok(PyBytes::new(py, &hash))
    }

    /// Reads the block under `key` into `out` (a writable byte buffer at least as large);
    /// returns the number of bytes written, or None if there is no such key.
    fn get_into(&self, py: Python<'_>, key: &str, out: &Bound<'_, PyAny>) -> PyResult<Option<usize>> {
        let mut region = Region::writable(out)?;
        // SAFETY: the caller does not touch `out` during the call (see `Region::bytes_mut`).
        let got = py
            .detach(|| {
                self.engine.get_into(&self.namespace, key, unsafe { region.bytes_mut() }, ReadOptions::default())
            })
            .map_err(engine_error)?;
        Ok(got.map(|(_, n)| n))
    }

    /// The block under `key` as bytes, or None.
    fn get<'py>(&self, py: Python<'py>, key: &str) -> PyResult<Option<Bound<'py, PyBytes>>> {
        let block =
            py.detach(|| self.engine.get(&self.namespace, key, ReadOptions::default())).map_err(engine_error)?;
        Ok(block.map(|b| PyBytes::new(py, &b)))
    }

    /// Whether `key` is stored (and not expired). No I/O.
    fn contains(&self, key: &str) -> PyResult<bool> {
        self.engine.contains(&self.namespace, key).map_err(engine_error)
    }

    /// Deletes `key`; returns whether it was there.
    fn delete(&self, py: Python<'_>, key: &str) -> PyResult<bool> {
        py.detach(|| self.engine.delete(&self.namespace, key, self.put.durability)).map_err(engine_error)
    }

    /// Stores many blocks; returns their hashes.
    fn put_batch<'py>(
        &self,
        py: Python<'py>,
        keys: Vec<String>,
        data: Vec<Bound<'py, PyAny>>,
    ) -> PyResult<Vec<Bound<'py, PyBytes>>> {
        same_length(keys.len(), data.len())?;
        let regions = data.iter().map(|d| Region::readable(d)).collect::<PyResult<Vec<_>>>()?;
        let hashes = py
            .detach(|| {
                // SAFETY: the caller does not write to the buffers during the call.
                let items: Vec<(&str, &[u8])> =
                    keys.iter().zip(&regions).map(|(k, r)| (k.as_str(), unsafe { r.bytes() })).collect();
                self.engine.put_batch(&self.namespace, &items, &self.put)
            })
            .map_err(engine_error)?;
        Ok(hashes.iter().map(|h| PyBytes::new(py, h)).collect())
    }

    /// Reads many blocks into their buffers; a miss is None in its place.
    fn get_batch_into(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        outs: Vec<Bound<'_, PyAny>>,
    ) -> PyResult<Vec<Option<usize>>> {
        same_length(keys.len(), outs.len())?;
        let mut regions = outs.iter().map(|o| Region::writable(o)).collect::<PyResult<Vec<_>>>()?;
        py.detach(|| {
            keys.iter()
                .zip(regions.iter_mut())
                .map(|(key, region)| {
                    // SAFETY: the caller does not touch the buffers during the call.
                    let out = unsafe { region.bytes_mut() };
                    Ok(self.engine.get_into(&self.namespace, key, out, ReadOptions::default())?.map(|(_, n)| n))
                })
                .collect::<Result<Vec<_>, kvhoard_engine::StoreError>>()
        })
        .map_err(engine_error)
    }

    /// `contains` for many keys, under one lock.
    fn contains_batch(&self, keys: Vec<String>) -> PyResult<Vec<bool>> {
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        self.engine.contains_batch(&self.namespace, &keys).map_err(engine_error)
    }

    /// Writes everything buffered and a checkpoint, and closes the volume; later calls fail.
    /// (The volume's lock is released when the object is collected.)
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| self.engine.close()).map_err(engine_error)
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __exit__(&self, py: Python<'_>, _t: Py<PyAny>, _v: Py<PyAny>, _tb: Py<PyAny>) -> PyResult<bool> {
        self.close(py)?;
        Ok(false)
    }
}

pub(crate) fn same_length(keys: usize, buffers: usize) -> PyResult<()> {
    if keys != buffers {
        return Err(PyValueError::new_err(format!("{keys} keys but {buffers} buffers: pass one buffer per key")));
    }
    Ok(())
}
