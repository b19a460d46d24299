"""``kvhoard.lmcache.StorageBackend``: a classic-stack LMCache storage plugin on a kvhoard volume.

Imported lazily by ``kvhoard.lmcache`` because it needs LMCache and torch, which the native
plugin does not. LMCache builds it from its config::

    storage_plugins: ["kvhoard"]
    extra_config:
      storage_plugin.kvhoard.module_path: kvhoard.lmcache
      storage_plugin.kvhoard.class_name: StorageBackend
      kvhoard.path: /data/kv
      kvhoard.capacity: 107374182400

Every chunk is stored as one block under ``CacheEngineKey.to_string()`` with its layout, dtype
and shape, so a load allocates the right memory object without reading the payload first, and
chunks written by ``kvhoard serve``'s lm:// listener in the same namespace are found too.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch
from lmcache.v1.memory_management import MemoryFormat, MemoryObj
from lmcache.v1.storage_backend.abstract_backend import StoragePluginInterface

from kvhoard._native import KvhoardError, Store

logger = logging.getLogger("kvhoard.lmcache")

# kvhoard's stable names (see `kvhoard inspect`) for LMCache's dtypes and memory formats.
_DTYPES = {
    torch.bfloat16: "bf16",
    torch.float16: "f16",
    torch.float32: "f32",
    torch.float64: "f64",
    torch.uint8: "u8",
    torch.float8_e4m3fn: "f8e4m3",
    torch.float8_e5m2: "f8e5m2",
}
_TORCH_DTYPES = {name: dtype for dtype, name in _DTYPES.items()}
_FORMATS = {
    MemoryFormat.UNDEFINED: "opaque",
    MemoryFormat.KV_2LTD: "kv_2ltd",
    MemoryFormat.KV_T2D: "kv_t2d",
    MemoryFormat.KV_2TD: "kv_2td",
    MemoryFormat.BINARY: "binary",
    MemoryFormat.BINARY_BUFFER: "binary_buffer",
    MemoryFormat.KV_MLA_FMT: "kv_mla",
    MemoryFormat.EC_TD: "ec_td",
    MemoryFormat.HS_TD: "hs_td",
}
_MEMORY_FORMATS = {name: fmt for fmt, name in _FORMATS.items()}

# extra_config keys (all optional but `kvhoard.path`) and how to read them: YAML gives typed
# values, environment variables give strings.
_SETTINGS: Dict[str, Callable[[Any], Any]] = {
    "path": str,
    "create": lambda v: v if isinstance(v, bool) else str(v).lower() in ("1", "true", "yes"),
    "capacity": int,
    "segment_size": int,
    "namespace": str,
    "durability": str,
    "ttl": int,
    "dram_tier": int,
    "threads": int,
    "io_depth": int,
}


def _settings(extra: Optional[dict]) -> Dict[str, Any]:
    extra = extra or {}
    out: Dict[str, Any] = {"create": True, "namespace": "lmcache", "durability": "written", "threads": 4,
                           "io_depth": 8}
    for name, parse in _SETTINGS.items():
        value = extra.get(f"kvhoard.{name}")
        if value is not None:
            try:
                out[name] = parse(value)
            except (TypeError, ValueError) as e:
                raise ValueError(f"extra_config kvhoard.{name}={value!r} is not valid: {e}") from None
    if out["threads"] < 1 or out["io_depth"] < 1:
        raise ValueError("extra_config kvhoard.threads and kvhoard.io_depth must be at least 1")
    if "path" not in out:
        raise ValueError("the kvhoard storage plugin needs extra_config kvhoard.path: the volume to use")
    return out


def _desc(obj: MemoryObj):
    """(layout, dtype, shape) of a memory object, or None if kvhoard cannot describe it."""
    shapes, dtypes = obj.get_shapes(), obj.get_dtypes()
    if len(shapes) != 1 or len(dtypes) != 1:
        return None
    dtype = _DTYPES.get(dtypes[0])
    layout = _FORMATS.get(obj.get_memory_format())
    if dtype is None or layout is None:
        return None
    return (layout, dtype, tuple(int(d) for d in shapes[0]))


class StorageBackend(StoragePluginInterface):
    """LMCache's storage plugin interface over a kvhoard volume, opened in this process.

    Puts run on a thread pool (the engine releases the GIL), so the caller is never blocked on
    the disk; gets read straight into memory objects from LMCache's CPU allocator. The volume
    keeps everything across restarts, honours its capacity and the `kvhoard.ttl` setting.
    """

    def __init__(self, dst_device="cpu", config=None, metadata=None, local_cpu_backend=None, loop=None):
        super().__init__(dst_device=dst_device, config=config, metadata=metadata,
                         local_cpu_backend=local_cpu_backend, loop=loop)
        if local_cpu_backend is None:
            raise ValueError("the kvhoard storage plugin needs LMCache's local CPU backend to allocate loads")
        s = _settings(getattr(config, "extra_config", None))
        self.store = Store(s["path"], create=s["create"], capacity=s.get("capacity"),
                           segment_size=s.get("segment_size"), namespace=s["namespace"],
                           durability=s["durability"], ttl=s.get("ttl"), dram_tier=s.get("dram_tier", 0))
        self._pool = ThreadPoolExecutor(max_workers=s["threads"], thread_name_prefix="kvhoard-put")
        # Keys of one load whose headers, then blocks, are read at once.
        self._io_depth = s["io_depth"]
        self._lock = threading.Lock()
        self._in_flight: set = set()
        self._pins: Dict[Any, int] = {}
        self._closed = False
        self._skipped_undescribable = False
        logger.info("kvhoard storage plugin on %s (namespace %s)", s["path"], s["namespace"])

    def __str__(self):
        return self.__class__.__name__

    # Lookups.

    def contains(self, key, pin: bool = False) -> bool:
        found = self.store.contains(key.to_string())
        if found and pin:
            self.pin(key)
        return found

    def batched_contains(self, keys, pin: bool = False) -> int:
        hits = 0
        for found in self.store.contains_batch([k.to_string() for k in keys]):
            if not found:
                break
            hits += 1
        if pin:
            for key in keys[:hits]:
                self.pin(key)
        return hits

    async def batched_async_contains(self, lookup_id: str, keys, pin: bool = False) -> int:
        return self.batched_contains(keys, pin)

    def exists_in_put_tasks(self, key) -> bool:
        with self._lock:
            return key in self._in_flight

    # Puts.

    def batched_submit_put_task(self, keys: Sequence, objs: List[MemoryObj], transfer_spec=None,
                                on_complete_callback=None) -> Optional[List[Future]]:
        batch = []
        with self._lock:
            if self._closed:
                return None
            for key, obj in zip(keys, objs):
                if key in self._in_flight:
                    continue
                desc = _desc(obj)
                if desc is None:
                    if not self._skipped_undescribable:
                        logger.warning("kvhoard storage plugin: not storing %s: memory objects with several "
                                       "tensors or dtype %s are not supported", key, obj.get_dtypes())
                        self._skipped_undescribable = True
                    continue
                self._in_flight.add(key)
                # LMCache releases its reference when this call returns; ours keeps the memory
                # alive until the engine has written it.
                obj.ref_count_up()
                batch.append((key, obj, desc))
        if not batch:
            return None
        fresh = []
        for item, found in zip(batch, self.store.contains_batch([k.to_string() for k, _, _ in batch])):
            if found:
                # Already stored (chunk keys name their content): nothing to write.
                self._finish(item[0], item[1], None)
            else:
                fresh.append(item)
        if not fresh:
            return None
        return [self._pool.submit(self._put, fresh, on_complete_callback)]

    async def async_batched_submit_put_task(self, keys, objs, transfer_spec=None, on_complete_callback=None):
        futures = self.batched_submit_put_task(keys, objs, transfer_spec, on_complete_callback)
        for f in futures or []:
            await asyncio.wrap_future(f)

    def _put(self, batch, on_complete_callback) -> None:
        try:
            self.store.put_batch([k.to_string() for k, _, _ in batch], [o.byte_array for _, o, _ in batch],
                                 descs=[d for _, _, d in batch])
            done = on_complete_callback
        except Exception as e:  # noqa: BLE001 - a failed put is logged and is a later miss, as in LMCache
            logger.error("kvhoard storage plugin: storing %d chunks failed: %s", len(batch), e)
            done = None
        for key, obj, _ in batch:
            self._finish(key, obj, done)

    def _finish(self, key, obj: MemoryObj, on_complete_callback) -> None:
        obj.ref_count_down()
        with self._lock:
            self._in_flight.discard(key)
        if on_complete_callback is not None:
            try:
                on_complete_callback(key)
            except Exception as e:  # noqa: BLE001 - LMCache's contract: callback errors are logged
                logger.warning("on_complete_callback failed for %s: %s", key, e)

    # Gets.

    def _allocate(self, key: str, d: Optional[dict]) -> Optional[MemoryObj]:
        if d is None:
            return None
        dtype, fmt = _TORCH_DTYPES.get(d["dtype"]), _MEMORY_FORMATS.get(d["layout"])
        if dtype is None or fmt is None or not d["shape"]:
            logger.warning("kvhoard storage plugin: %s is stored as %s %s without a shape LMCache can load",
                           key, d["layout"], d["dtype"])
            return None
        return self.local_cpu_backend.allocate(torch.Size(d["shape"]), dtype, fmt)

    def get_blocking(self, key) -> Optional[MemoryObj]:
        return self.batched_get_blocking([key])[0]

    def batched_get_blocking(self, keys) -> List[Optional[MemoryObj]]:
        names = [k.to_string() for k in keys]
        try:
            # Each description is a record header read from the volume: read them together.
            descs = self.store.describe_batch(names, io_depth=self._io_depth)
        except KvhoardError as e:
            logger.error("kvhoard storage plugin: describing %d chunks failed: %s", len(names), e)
            return [None] * len(keys)
        objs = [self._allocate(name, d) for name, d in zip(names, descs)]
        want = [(i, o) for i, o in enumerate(objs) if o is not None]
        try:
            # Every block's reads in flight at once, from one thread.
            got = self.store.get_batch_into([names[i] for i, _ in want], [o.byte_array for _, o in want])
        except KvhoardError as e:
            logger.error("kvhoard storage plugin: loading %d chunks failed: %s", len(want), e)
            got = [None] * len(want)
        out: List[Optional[MemoryObj]] = [None] * len(keys)
        for (i, obj), n in zip(want, got):
            if n == obj.get_size():
                out[i] = obj
            else:
                # Deleted or replaced (by a block of another size) since it was described.
                obj.ref_count_down()
        return out

    def get_non_blocking(self, key, location=None) -> Optional[Future]:
        return self._pool.submit(self.get_blocking, key)

    async def batched_get_non_blocking(self, lookup_id: str, keys, transfer_spec=None) -> List[MemoryObj]:
        objs = await asyncio.get_running_loop().run_in_executor(self._pool, self.batched_get_blocking, keys)
        # LMCache's contract: the prefix that was found.
        out = []
        for obj in objs:
            if obj is None:
                break
            out.append(obj)
        for obj in objs[len(out):]:
            if obj is not None:
                obj.ref_count_down()
        return out

    # Pins, removal, lifecycle.

    def pin(self, key) -> bool:
        """Pins a chunk LMCache is about to load: the engine reclaims other log segments before
        the ones holding it while any other is left (a pin lapses ten minutes after it was
        taken, in case nobody unpins). Counted here too, for remove(force=False)."""
        if not self.store.pin(key.to_string()):
            return False
        with self._lock:
            self._pins[key] = self._pins.get(key, 0) + 1
        return True

    def unpin(self, key) -> bool:
        with self._lock:
            count = self._pins.get(key, 0)
            if count == 0:
                return False
            if count == 1:
                del self._pins[key]
            else:
                self._pins[key] = count - 1
        self.store.unpin(key.to_string())
        return True

    def remove(self, key, force: bool = True) -> bool:
        with self._lock:
            if not force and self._pins.get(key):
                return False
            self._pins.pop(key, None)
        return self.store.delete(key.to_string())

    def touch_cache(self) -> None:
        # The engine evicts whole log segments, oldest first: there is no per-key order to update.
        return None

    def get_allocator_backend(self):
        return self.local_cpu_backend

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._pool.shutdown(wait=True)
        self.store.close()
