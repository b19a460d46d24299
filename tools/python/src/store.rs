//! `kvhoard.Store`: the engine, synchronous, GIL released during I/O.

use std::path::PathBuf;

use kvhoard_engine::format::{BlockDesc, Dtype, Layout};
use kvhoard_engine::{
    BlockMeta, CodecSpec, CreateOptions, Durability, Policy, Positions, PutOptions, ReadOptions, StoreOptions,
};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

use crate::buffers::Region;
use crate::parallel::{for_each_key, PANICKED};
use crate::reads::get_all_into;
use crate::{engine_error, KvhoardError};

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
    ///
    /// `desc=(layout, dtype, shape)` says what the bytes are (for example
    /// `("kv_2ltd", "bf16", (2, 32, 256, 1024))`); `describe` returns it. Without it the block is
    /// opaque bytes.
    ///
    /// `codec` (a codec spec, e.g. `"lossless"`, `"quant:bits=4"`, `"raw"`) compresses the block
    /// in the store; without it the namespace's default applies (see `set_policy`). A lossy
    /// codec is refused where the namespace denies them; a block the codec cannot take (no
    /// description) is stored as it is. `get` returns the block decoded.
    #[pyo3(signature = (key, data, *, desc=None, codec=None))]
    fn put<'py>(
        &self,
        py: Python<'py>,
        key: &str,
        data: &Bound<'py, PyAny>,
        desc: Option<DescArg>,
        codec: Option<&str>,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let region = Region::readable(data)?;
        let opts =
            PutOptions { codec: parse_codec(codec)?, ..self.put_options(desc.map(DescArg::into_desc).transpose()?) };
        // SAFETY: the caller does not write to `data` during the call (see `Region::bytes`).
        let hash = py
            .detach(|| self.engine.put(&self.namespace, key, unsafe { region.bytes() }, &opts))
            .map_err(engine_error)?;
        Ok(PyBytes::new(py, &hash))
    }

    /// What is stored under `key`, without reading its bytes, or None: a dict with `size`,
    /// `stored_size`, `hash`, `layout`, `dtype`, `shape` (as given to `put`; `opaque`, `bytes`
    /// and `[]` for plain bytes), `compressed` and `created_unix_ms`.
    fn describe<'py>(&self, py: Python<'py>, key: &str) -> PyResult<Option<Bound<'py, PyDict>>> {
        let meta = py.detach(|| self.engine.meta(&self.namespace, key)).map_err(engine_error)?;
        meta.map(|m| describe_dict(py, &m)).transpose()
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

    /// The block under `key` decoded, and which original tokens it holds: `(bytes, None)` when
    /// it holds them all, `(bytes, [positions])` when its codec kept one set of tokens, `(bytes,
    /// [[positions] per layer and head])` when it kept a set per head; None on a miss. The only
    /// read that returns a block whose codec dropped tokens.
    fn get_kv<'py>(&self, py: Python<'py>, key: &str) -> PyResult<Option<(Bound<'py, PyBytes>, Py<PyAny>)>> {
        let got =
            py.detach(|| self.engine.get_kv(&self.namespace, key, ReadOptions::default())).map_err(engine_error)?;
        let Some((block, positions)) = got else { return Ok(None) };
        let positions: Py<PyAny> = match positions {
            Positions::All => py.None(),
            Positions::Shared(kept) => kept.into_pyobject(py)?.into_any().unbind(),
            Positions::PerHead { kept, layers, heads } => {
                let per = kept.len() / (layers * heads).max(1);
                let sets: Vec<Vec<u32>> = kept.chunks(per.max(1)).map(<[u32]>::to_vec).collect();
                sets.into_pyobject(py)?.into_any().unbind()
            }
        };
        Ok(Some((PyBytes::new(py, &block), positions)))
    }

    /// The block under `key` as stored (the codec's output, untouched) and its description
    /// (see `describe`; `codec_params` holds the codec's parameters), for a client that decodes
    /// itself; None on a miss.
    fn get_frame<'py>(
        &self,
        py: Python<'py>,
        key: &str,
    ) -> PyResult<Option<(Bound<'py, PyBytes>, Bound<'py, PyDict>)>> {
        let got =
            py.detach(|| self.engine.get_frame(&self.namespace, key, ReadOptions::default())).map_err(engine_error)?;
        let Some(frame) = got else { return Ok(None) };
        let meta = describe_dict(py, &frame.meta)?;
        meta.set_item("codec_params", PyBytes::new(py, &frame.meta.compression.params))?;
        Ok(Some((PyBytes::new(py, &frame), meta)))
    }

    /// Reports the quality (0 to 1; 1 is what the uncompressed blocks give) a client observed
    /// from the context of `key` (its `group` when blocks were put with one) as it is stored now.
    /// When it falls below what the placement planner assumed by more than the namespace's drift
    /// threshold, the context is scored again. Returns whether it was (False without a planner).
    #[pyo3(signature = (key, quality, *, group=None))]
    fn report_quality(&self, py: Python<'_>, key: &str, quality: f64, group: Option<u64>) -> PyResult<bool> {
        py.detach(|| self.engine.report_quality(&self.namespace, group, key, quality)).map_err(engine_error)
    }

    /// Rewrites the block under `key` with `codec` (e.g. from lossless to `"quant:bits=8"`, or
    /// 8-bit to 4-bit); readers see the old or the new form, whole. False if the key is gone or
    /// changed meanwhile.
    fn recompress(&self, py: Python<'_>, key: &str, codec: &str) -> PyResult<bool> {
        let spec = parse_codec(Some(codec))?.unwrap_or(CodecSpec::RAW);
        py.detach(|| self.engine.recompress(&self.namespace, key, spec, self.put.durability)).map_err(engine_error)
    }

    /// Sets a namespace's policy (kept with the volume): its default codec (None: store blocks
    /// as they are) and whether lossy codecs may be applied in it.
    #[pyo3(signature = (namespace, *, codec=None, lossy=false))]
    fn set_policy(&self, py: Python<'_>, namespace: &str, codec: Option<&str>, lossy: bool) -> PyResult<()> {
        // Placement settings (`kvhoard ns set`) are kept as they are.
        let settings = self.engine.policy(namespace).settings;
        let policy = Policy { codec: parse_codec(codec)?.filter(|c| !c.is_raw()), lossy, settings };
        py.detach(|| self.engine.set_policy(namespace, policy)).map_err(engine_error)
    }

    /// A namespace's policy: `{"codec": spec or None, "lossy": bool}`.
    fn policy<'py>(&self, py: Python<'py>, namespace: &str) -> PyResult<Bound<'py, PyDict>> {
        let p = self.engine.policy(namespace);
        let d = PyDict::new(py);
        d.set_item("codec", p.codec.map(|c| c.to_string()))?;
        d.set_item("lossy", p.lossy)?;
        Ok(d)
    }

    /// Whether `key` is stored (and not expired). No I/O.
    fn contains(&self, key: &str) -> PyResult<bool> {
        self.engine.contains(&self.namespace, key).map_err(engine_error)
    }

    /// Pins `key`: while pinned (until `unpin`, or ten minutes after the last pin), a full volume
    /// reclaims other segments before the ones holding it, as long as any other is left.
    /// Returns False, pinning nothing, if the key is not stored. Each pin needs its own unpin.
    fn pin(&self, key: &str) -> PyResult<bool> {
        self.engine.pin(&self.namespace, key).map_err(engine_error)
    }

    /// Releases one pin on `key`; returns whether it held one.
    fn unpin(&self, key: &str) -> PyResult<bool> {
        self.engine.unpin(&self.namespace, key).map_err(engine_error)
    }

    /// Deletes `key`; returns whether it was there.
    fn delete(&self, py: Python<'_>, key: &str) -> PyResult<bool> {
        py.detach(|| self.engine.delete(&self.namespace, key, self.put.durability)).map_err(engine_error)
    }

    /// Stores many blocks; returns their hashes. `descs`, if given, holds one `desc` (see `put`)
    /// or None per block. Blocks with the same description are committed together.
    /// `codec` as for `put`, for every block; compression runs on every core, overlapped with
    /// the writes.
    #[pyo3(signature = (keys, data, *, descs=None, codec=None))]
    fn put_batch<'py>(
        &self,
        py: Python<'py>,
        keys: Vec<String>,
        data: Vec<Bound<'py, PyAny>>,
        descs: Option<Vec<Option<DescArg>>>,
        codec: Option<&str>,
    ) -> PyResult<Vec<Bound<'py, PyBytes>>> {
        let codec = parse_codec(codec)?;
        same_length(keys.len(), data.len())?;
        let descs = match descs {
            Some(d) => {
                same_length(keys.len(), d.len())?;
                d.into_iter().map(|d| d.map(DescArg::into_desc).transpose()).collect::<PyResult<Vec<_>>>()?
            }
            None => vec![None; keys.len()],
        };
        let regions = data.iter().map(|d| Region::readable(d)).collect::<PyResult<Vec<_>>>()?;
        let hashes = py
            .detach(|| {
                let mut hashes = Vec::with_capacity(keys.len());
                let mut start = 0;
                for group in descs.chunk_by(|a, b| a == b) {
                    let end = start + group.len();
                    let opts = PutOptions { codec, ..self.put_options(group.first().cloned().flatten()) };
                    // SAFETY: the caller does not write to the buffers during the call.
                    let items: Vec<(&str, &[u8])> = keys[start..end]
                        .iter()
                        .zip(&regions[start..end])
                        .map(|(k, r)| (k.as_str(), unsafe { r.bytes() }))
                        .collect();
                    hashes.extend(self.engine.put_batch(&self.namespace, &items, &opts)?);
                    start = end;
                }
                Ok::<_, kvhoard_engine::StoreError>(hashes)
            })
            .map_err(engine_error)?;
        Ok(hashes.iter().map(|h| PyBytes::new(py, h)).collect())
    }

    /// Reads many blocks into their buffers; a miss is None in its place. Every key's reads are
    /// in flight at once, or `io_depth` keys' at a time when given.
    #[pyo3(signature = (keys, outs, *, io_depth=None))]
    fn get_batch_into(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        outs: Vec<Bound<'_, PyAny>>,
        io_depth: Option<usize>,
    ) -> PyResult<Vec<Option<usize>>> {
        same_length(keys.len(), outs.len())?;
        let mut regions = outs.iter().map(|o| Region::writable(o)).collect::<PyResult<Vec<_>>>()?;
        py.detach(|| {
            // SAFETY: the caller does not touch the buffers during the call.
            unsafe { get_all_into(&self.engine, &self.namespace, &keys, &mut regions, io_depth) }
                .into_iter()
                .collect::<Result<Vec<_>, String>>()
        })
        .map_err(KvhoardError::new_err)
    }

    /// `describe` for many keys, `io_depth` at once (each reads a record header from the volume).
    #[pyo3(signature = (keys, *, io_depth=8))]
    fn describe_batch<'py>(
        &self,
        py: Python<'py>,
        keys: Vec<String>,
        io_depth: usize,
    ) -> PyResult<Vec<Option<Bound<'py, PyDict>>>> {
        let mut slots = vec![(); keys.len()];
        let metas = py
            .detach(|| {
                let meta = |key: &String, _: &mut ()| self.engine.meta(&self.namespace, key).map_err(|e| e.to_string());
                for_each_key(&keys, &mut slots, io_depth, meta, || Err(PANICKED.to_string()))
                    .into_iter()
                    .collect::<Result<Vec<_>, String>>()
            })
            .map_err(KvhoardError::new_err)?;
        metas.into_iter().map(|m| m.map(|m| describe_dict(py, &m)).transpose()).collect()
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

impl Store {
    fn put_options(&self, desc: Option<BlockDesc>) -> PutOptions {
        PutOptions { desc, ..self.put.clone() }
    }
}

/// A codec spec from Python (None: the namespace's default).
fn parse_codec(codec: Option<&str>) -> PyResult<Option<CodecSpec>> {
    codec.map(|c| CodecSpec::parse(c).map_err(|e| PyValueError::new_err(format!("codec {c:?}: {e}")))).transpose()
}

/// `(layout, dtype, shape)` as Python passes it.
#[derive(FromPyObject)]
pub(crate) struct DescArg(String, String, Vec<u64>);

impl DescArg {
    fn into_desc(self) -> PyResult<BlockDesc> {
        let DescArg(layout, dtype, shape) = self;
        let names = |all: &[&str]| all.join(", ");
        let layout = Layout::from_name(&layout).ok_or_else(|| {
            let all: Vec<&str> = Layout::NAMES.iter().map(|(_, n)| *n).collect();
            PyValueError::new_err(format!("unknown layout {layout:?}; expected one of {}", names(&all)))
        })?;
        let dtype = Dtype::from_name(&dtype).ok_or_else(|| {
            let all: Vec<&str> = Dtype::NAMES.iter().map(|(_, n)| *n).collect();
            PyValueError::new_err(format!("unknown dtype {dtype:?}; expected one of {}", names(&all)))
        })?;
        Ok(BlockDesc { dtype, layout, shape })
    }
}

fn describe_dict<'py>(py: Python<'py>, meta: &BlockMeta) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("size", meta.raw_len)?;
    d.set_item("stored_size", meta.stored_len)?;
    d.set_item("hash", PyBytes::new(py, &meta.content_hash))?;
    d.set_item("layout", meta.desc.layout.name())?;
    d.set_item("dtype", meta.desc.dtype.name())?;
    d.set_item("shape", meta.desc.shape.clone())?;
    d.set_item("compressed", meta.compression.codec_id != kvhoard_engine::format::record::CompressionMeta::CODEC_NONE)?;
    d.set_item("codec", meta.codec())?;
    d.set_item("created_unix_ms", meta.created_unix_ms)?;
    Ok(d)
}

pub(crate) fn same_length(keys: usize, buffers: usize) -> PyResult<()> {
    if keys != buffers {
        return Err(PyValueError::new_err(format!("{keys} keys but {buffers} buffers: pass one buffer per key")));
    }
    Ok(())
}
