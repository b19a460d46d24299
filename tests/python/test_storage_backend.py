"""kvhoard.lmcache.StorageBackend loaded by LMCache's own plugin launcher, driven by its
StorageManager: chunks stored, found, loaded byte-identical, removed, and found again after the
volume is reopened (a new StorageManager on the same volume)."""

import os
import time

import pytest

os.environ.setdefault("LMCACHE_TRACK_USAGE", "false")
torch = pytest.importorskip("torch")
pytest.importorskip("lmcache")

from lmcache.utils import CacheEngineKey  # noqa: E402
from lmcache.v1.config import LMCacheEngineConfig  # noqa: E402
from lmcache.v1.event_manager import EventManager  # noqa: E402
from lmcache.v1.memory_management import MemoryFormat  # noqa: E402
from lmcache.v1.metadata import LMCacheMetadata  # noqa: E402
from lmcache.v1.storage_backend.storage_manager import StorageManager  # noqa: E402

import kvhoard  # noqa: E402
from kvhoard.lmcache import StorageBackend  # noqa: E402

MODEL = "org/plugin-test"
# (layers, 2, tokens, heads, head_size) in vLLM's order: 2 MiB KV_2LTD bf16 chunks.
KV_SHAPE = (8, 2, 256, 4, 64)
CHUNK = torch.Size([2, 8, 256, 4 * 64])


def config(path, **extra):
    return LMCacheEngineConfig.from_defaults(
        chunk_size=256,
        local_cpu=False,
        max_local_cpu_size=0.1,
        local_disk=None,
        storage_plugins=["kvhoard"],
        extra_config={
            "storage_plugin.kvhoard.module_path": "kvhoard.lmcache",
            "storage_plugin.kvhoard.class_name": "StorageBackend",
            "kvhoard.path": str(path),
            "kvhoard.capacity": str(256 << 20),
            "kvhoard.segment_size": 16 << 20,
            **extra,
        },
    )


def manager(path, **extra):
    metadata = LMCacheMetadata(
        model_name=MODEL, world_size=1, local_world_size=1, worker_id=0, local_worker_id=0,
        kv_dtype=torch.bfloat16, kv_shape=KV_SHAPE,
    )
    return StorageManager(config(path, **extra), metadata, EventManager())


def key(i):
    return CacheEngineKey(model_name=MODEL, world_size=1, worker_id=0, chunk_hash=(-1) ** i * (7000 + i),
                          dtype=torch.bfloat16)


def chunk(i):
    return torch.randn(CHUNK, generator=torch.Generator().manual_seed(i)).to(torch.bfloat16)


def same(obj, want):
    """Whether a loaded memory object holds `want`; releases it (the caller's reference)."""
    if obj is None:
        return False
    ok = obj.tensor.shape == want.shape and obj.tensor.dtype == want.dtype and \
        torch.equal(obj.tensor.view(torch.int16), want.view(torch.int16))
    obj.ref_count_down()
    return ok


def store_chunks(sm, indices):
    keys, objs = [], []
    for i in indices:
        obj = sm.allocate(CHUNK, torch.bfloat16, MemoryFormat.KV_2LTD)
        obj.tensor.copy_(chunk(i))
        keys.append(key(i))
        objs.append(obj)
    sm.batched_put(keys, objs)
    backend = sm.storage_backends["kvhoard"]
    deadline = time.monotonic() + 60
    while any(backend.exists_in_put_tasks(k) for k in keys):
        assert time.monotonic() < deadline, "puts did not finish in 60 s"
        time.sleep(0.01)
    return keys


def test_launcher_loads_the_plugin_and_chunks_round_trip(tmp_path):
    sm = manager(tmp_path / "vol")
    try:
        assert isinstance(sm.storage_backends.get("kvhoard"), StorageBackend), list(sm.storage_backends)
        keys = store_chunks(sm, range(6))
        for i, k in enumerate(keys):
            assert sm.contains(k, search_range=["kvhoard"]) == "kvhoard"
            assert same(sm.get(k), chunk(i)), f"chunk {i} differs"
        got = sm.batched_get(keys, location="kvhoard")
        assert all(same(obj, chunk(i)) for i, obj in enumerate(got))
        backend = sm.storage_backends["kvhoard"]
        assert backend.batched_contains(keys + [key(99)]) == 6
        assert backend.batched_contains([key(99)] + keys) == 0
        assert sm.get(key(99)) is None
        assert backend.remove(keys[0])
        assert sm.contains(keys[0], search_range=["kvhoard"]) is None
        assert backend.pin(keys[1]) and backend.unpin(keys[1]) and not backend.unpin(keys[1])
    finally:
        sm.close()
    # A new manager on the same volume (a restarted vLLM worker) finds what was stored.
    sm = manager(tmp_path / "vol")
    try:
        assert sm.contains(key(0), search_range=["kvhoard"]) is None
        for i in range(1, 6):
            assert same(sm.get(key(i)), chunk(i)), f"chunk {i} lost across reopen"
        # What the volume holds is described for other tools too.
        with pytest.raises(kvhoard.KvhoardError, match="lock"):
            kvhoard.Store(str(tmp_path / "vol"))
    finally:
        sm.close()
    with kvhoard.Store(str(tmp_path / "vol"), namespace="lmcache") as store:
        d = store.describe(key(3).to_string())
        assert d["layout"] == "kv_2ltd" and d["dtype"] == "bf16" and d["shape"] == list(CHUNK)
        assert d["size"] == CHUNK.numel() * 2


def test_a_chunk_replaced_by_another_shape_is_a_miss_not_garbage(tmp_path):
    sm = manager(tmp_path / "vol")
    try:
        store_chunks(sm, [1])
        backend = sm.storage_backends["kvhoard"]
        real = backend.store

        class Racing:
            """The store, as seen when another writer replaces the key with bytes of another size
            between the description and the read."""

            def __getattr__(self, name):
                return getattr(real, name)

            def describe_batch(self, names, io_depth=8):
                return [{**real.describe(n), "shape": [2, 8, 512, 256]} for n in names]

        backend.store = Racing()
        assert backend.get_blocking(key(1)) is None
        backend.store = real
        assert same(backend.get_blocking(key(1)), chunk(1))
    finally:
        sm.close()


def test_bad_settings_are_refused_clearly(tmp_path):
    with pytest.raises(ValueError, match="kvhoard.path"):
        StorageBackend(config=config(tmp_path / "v").__class__.from_defaults(extra_config={}),
                       local_cpu_backend=object())
    bad = config(tmp_path / "v", **{"kvhoard.capacity": "lots"})
    with pytest.raises(ValueError, match="kvhoard.capacity"):
        StorageBackend(config=bad, local_cpu_backend=object())


def test_store_describe_and_desc_validation(tmp_path):
    with kvhoard.Store(str(tmp_path / "vol"), create=True, capacity=64 << 20, segment_size=4 << 20) as store:
        data = bytes(2 * 4 * 16 * 8 * 2)
        store.put("t", data, desc=("kv_2ltd", "bf16", (2, 4, 16, 8)))
        d = store.describe("t")
        assert (d["layout"], d["dtype"], d["shape"], d["size"], d["compressed"]) == \
            ("kv_2ltd", "bf16", [2, 4, 16, 8], len(data), False)
        store.put("plain", b"abc")
        assert (store.describe("plain")["layout"], store.describe("plain")["shape"]) == ("opaque", [])
        assert store.describe("missing") is None
        with pytest.raises(kvhoard.KvhoardError, match="does not describe"):
            store.put("t2", data, desc=("kv_2ltd", "bf16", (2, 4, 16, 9)))
        with pytest.raises(ValueError, match="unknown dtype"):
            store.put("t2", data, desc=("kv_2ltd", "bfloat16", (2, 4, 16, 8)))
        with pytest.raises(ValueError, match="unknown layout"):
            store.put("t2", data, desc=("kv_9xyz", "bf16", (2, 4, 16, 8)))
        # Layout names are taken in any case (LMCache writes KV_2LTD).
        store.put("upper", data, desc=("KV_2LTD", "bf16", (2, 4, 16, 8)))
        assert store.describe("upper")["layout"] == "kv_2ltd"
        other = bytes([1]) * len(data)
        store.put_batch(["a", "b", "c"], [data, other, b"x"],
                        descs=[("kv_2ltd", "bf16", (2, 4, 16, 8)), ("kv_2ltd", "f16", (2, 4, 16, 8)), None])
        assert [store.describe(k)["dtype"] for k in "abc"] == ["bf16", "f16", "bytes"]
        assert not store.contains("t2")
