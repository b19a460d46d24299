//! `kvhoard.lmcache.NativePlugin`: what LMCache's multiprocess `native_plugin` L2 adapter drives.
//!
//! LMCache calls `submit_batch_{get,set,exists,delete}` from its own threads and gets a future id
//! back at once; worker threads run the batch against the engine, queue a completion and bump an
//! eventfd; LMCache polls the eventfd and calls `drain_completions()`, which returns
//! `[(future_id, ok, error, per_key_results_or_None)]`. Buffers of a batch stay exported (held)
//! until the batch completes, and LMCache does not touch them before that.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use kvhoard_engine::PutOptions;
use pyo3::exceptions::{PyOSError, PyRuntimeError};
use pyo3::prelude::*;

use crate::buffers::Region;
use crate::engine_error;
use crate::reads::get_all_into;
use crate::store::{open_engine, parse_durability, same_length};

enum Job {
    Get(u64, Vec<String>, Vec<Region>),
    Set(u64, Vec<String>, Vec<Region>),
    Exists(u64, Vec<String>),
    Delete(u64, Vec<String>),
}

/// `(future_id, ok, error, per-key results)`, as LMCache reads it.
type Completion = (u64, bool, String, Option<Vec<bool>>);

struct Shared {
    engine: kvhoard_engine::Store,
    namespace: String,
    put: PutOptions,
    completions: Mutex<Vec<Completion>>,
    event_fd: libc::c_int,
    /// Keys of one get batch read at once (all if `None`).
    io_depth: Option<usize>,
}

impl Shared {
    /// Reads a batch: every key's reads in flight at once, or `io_depth` keys' at a time.
    fn get_all(&self, keys: &[String], regions: &mut [Region]) -> (Vec<bool>, Option<String>) {
        // SAFETY: LMCache does not touch a submitted buffer until its completion.
        let results = unsafe { get_all_into(&self.engine, &self.namespace, keys, regions, self.io_depth) };
        let first_error = results.iter().find_map(|r| r.as_ref().err().cloned());
        (results.into_iter().map(|r| r.is_ok_and(|found| found.is_some())).collect(), first_error)
    }

    /// Stores a batch with one group commit; if the batch is refused (one bad key, say), key by
    /// key, so each key's result says what happened to it.
    fn put_all(&self, keys: &[String], regions: &[Region]) -> (Vec<bool>, Option<String>) {
        // SAFETY: LMCache does not write to a submitted buffer until its completion.
        let items: Vec<(&str, &[u8])> =
            keys.iter().zip(regions).map(|(k, r)| (k.as_str(), unsafe { r.bytes() })).collect();
        if self.engine.put_batch(&self.namespace, &items, &self.put).is_ok() {
            return (vec![true; keys.len()], None);
        }
        let mut first_error = None;
        let stored = items
            .iter()
            .map(|(key, bytes)| match self.engine.put(&self.namespace, key, bytes, &self.put) {
                Ok(_) => true,
                Err(e) => {
                    first_error.get_or_insert_with(|| format!("set {key:?}: {e}"));
                    false
                }
            })
            .collect();
        (stored, first_error)
    }

    fn run(&self, job: Job) {
        let completion = match job {
            Job::Get(id, keys, mut regions) => {
                let (found, first_error) = self.get_all(&keys, &mut regions);
                drop(regions);
                (id, first_error.is_none(), first_error.unwrap_or_default(), Some(found))
            }
            Job::Set(id, keys, regions) => {
                let (stored, first_error) = self.put_all(&keys, &regions);
                drop(regions);
                (id, first_error.is_none(), first_error.unwrap_or_default(), Some(stored))
            }
            Job::Exists(id, keys) => {
                let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
                match self.engine.contains_batch(&self.namespace, &keys) {
                    Ok(found) => (id, true, String::new(), Some(found)),
                    Err(e) => (id, false, format!("exists: {e}"), None),
                }
            }
            Job::Delete(id, keys) => {
                let mut first_error = None;
                let deleted = keys
                    .iter()
                    .map(|key| match self.engine.delete(&self.namespace, key, self.put.durability) {
                        Ok(was) => was,
                        Err(e) => {
                            first_error.get_or_insert_with(|| format!("delete {key:?}: {e}"));
                            false
                        }
                    })
                    .collect();
                (id, first_error.is_none(), first_error.unwrap_or_default(), Some(deleted))
            }
        };
        self.completions.lock().unwrap_or_else(|p| p.into_inner()).push(completion);
        let one: u64 = 1;
        // SAFETY: event_fd is an eventfd this object owns and closes only after every worker has
        // exited; writing 8 bytes from a live u64 is what eventfd expects.
        unsafe { libc::write(self.event_fd, (&one as *const u64).cast(), 8) };
    }
}

/// LMCache's `native_plugin` L2 adapter over a kvhoard volume.
///
/// LMCache config (`lmcache server --l2-adapter`):
/// `{"type": "native_plugin", "module_path": "kvhoard.lmcache", "class_name": "NativePlugin",
///   "adapter_params": {"path": "/data/kv", "create": true}}`.
/// Parameters: `path`, `create=False`, `capacity=None`, `segment_size=None`, `namespace="lmcache"`,
/// `durability="written"`, `ttl=None`, `dram_tier=0`, `threads=4` (batches run at once),
/// `io_depth=None` (keys of one get batch read at once: all of them unless given).
#[pyclass(module = "kvhoard._native", frozen)]
pub(crate) struct NativePlugin {
    shared: Arc<Shared>,
    jobs: Mutex<Option<Sender<Job>>>,
    workers: Mutex<Vec<JoinHandle<()>>>,
    next_id: AtomicU64,
}

#[pymethods]
impl NativePlugin {
    #[new]
    #[pyo3(signature = (path, *, create=false, capacity=None, segment_size=None, namespace="lmcache", durability="written", ttl=None, dram_tier=0, threads=4, io_depth=None))]
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
        threads: usize,
        io_depth: Option<usize>,
    ) -> PyResult<NativePlugin> {
        let durability = parse_durability(durability)?;
        let engine =
            py.detach(|| open_engine(path, create, capacity, segment_size, dram_tier)).map_err(engine_error)?;
        // SAFETY: eventfd has no memory preconditions; the result is checked.
        let event_fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if event_fd < 0 {
            return Err(PyOSError::new_err(format!("eventfd: {}", std::io::Error::last_os_error())));
        }
        let shared = Arc::new(Shared {
            engine,
            namespace: namespace.to_string(),
            put: PutOptions { durability, ttl_secs: ttl, ..Default::default() },
            completions: Mutex::new(Vec::new()),
            event_fd,
            io_depth: io_depth.map(|d| d.max(1)),
        });
        let (sender, receiver) = channel::<Job>();
        let receiver = Arc::new(Mutex::new(receiver));
        let workers = (0..threads.max(1))
            .map(|i| {
                let shared = Arc::clone(&shared);
                let receiver: Arc<Mutex<Receiver<Job>>> = Arc::clone(&receiver);
                std::thread::Builder::new()
                    .name(format!("kvhoard-plugin-{i}"))
                    .spawn(move || loop {
                        let job = receiver.lock().unwrap_or_else(|p| p.into_inner()).recv();
                        match job {
                            Ok(job) => shared.run(job),
                            Err(_) => return,
                        }
                    })
                    .map_err(|e| PyOSError::new_err(format!("cannot start a worker thread: {e}")))
            })
            .collect::<PyResult<Vec<_>>>()?;
        Ok(NativePlugin {
            shared,
            jobs: Mutex::new(Some(sender)),
            workers: Mutex::new(workers),
            next_id: AtomicU64::new(1),
        })
    }

    /// The eventfd that becomes readable when completions are waiting.
    fn event_fd(&self) -> i32 {
        self.shared.event_fd
    }

    /// Reads the blocks under `keys` into `memoryviews`; completes with one bool per key (found).
    fn submit_batch_get(&self, keys: Vec<String>, memoryviews: Vec<Bound<'_, PyAny>>) -> PyResult<u64> {
        same_length(keys.len(), memoryviews.len())?;
        let regions = memoryviews.iter().map(|m| Region::writable(m)).collect::<PyResult<Vec<_>>>()?;
        self.submit(|id| Job::Get(id, keys, regions))
    }

    /// Stores `memoryviews` under `keys`; completes with one bool per key (stored).
    fn submit_batch_set(&self, keys: Vec<String>, memoryviews: Vec<Bound<'_, PyAny>>) -> PyResult<u64> {
        same_length(keys.len(), memoryviews.len())?;
        let regions = memoryviews.iter().map(|m| Region::readable(m)).collect::<PyResult<Vec<_>>>()?;
        self.submit(|id| Job::Set(id, keys, regions))
    }

    /// Completes with one bool per key (stored and not expired).
    fn submit_batch_exists(&self, keys: Vec<String>) -> PyResult<u64> {
        self.submit(|id| Job::Exists(id, keys))
    }

    /// Deletes `keys`; completes with one bool per key (was there).
    fn submit_batch_delete(&self, keys: Vec<String>) -> PyResult<u64> {
        self.submit(|id| Job::Delete(id, keys))
    }

    /// Every completion since the last call: `[(future_id, ok, error, per_key_or_None)]`.
    fn drain_completions(&self) -> Vec<Completion> {
        let mut counter = 0u64;
        // SAFETY: reading 8 bytes into a live u64 from our own nonblocking eventfd; EAGAIN (no
        // event) is fine and ignored.
        unsafe { libc::read(self.shared.event_fd, (&mut counter as *mut u64).cast(), 8) };
        std::mem::take(&mut *self.shared.completions.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Finishes the submitted batches, stops the workers and closes the volume. Idempotent.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let sender = self.jobs.lock().unwrap_or_else(|p| p.into_inner()).take();
        let Some(sender) = sender else { return Ok(()) };
        drop(sender);
        let workers = std::mem::take(&mut *self.workers.lock().unwrap_or_else(|p| p.into_inner()));
        // Workers release Python buffers as they finish, which needs the GIL: wait without it.
        py.detach(|| {
            for worker in workers {
                let _ = worker.join();
            }
            self.shared.engine.close()
        })
        .map_err(engine_error)
    }
}

impl NativePlugin {
    fn submit(&self, job: impl FnOnce(u64) -> Job) -> PyResult<u64> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let jobs = self.jobs.lock().unwrap_or_else(|p| p.into_inner());
        let sender = jobs.as_ref().ok_or_else(|| PyRuntimeError::new_err("the plugin is closed"))?;
        sender.send(job(id)).map_err(|_| PyRuntimeError::new_err("the plugin's workers have stopped"))?;
        Ok(id)
    }
}

impl Drop for NativePlugin {
    fn drop(&mut self) {
        // Workers hold the shared state; stop them before the eventfd goes. The sender is
        // dropped with `self.jobs`, so they exit once their queue is empty.
        drop(self.jobs.get_mut().unwrap_or_else(|p| p.into_inner()).take());
        for worker in std::mem::take(self.workers.get_mut().unwrap_or_else(|p| p.into_inner())) {
            let _ = worker.join();
        }
        // SAFETY: every worker has exited, so nothing writes to the eventfd any more.
        unsafe { libc::close(self.shared.event_fd) };
    }
}
