"""The kvhoard Python package: Store and LMCache's NativePlugin, against a real volume."""

import os
import select
import threading

import pytest

import kvhoard
from kvhoard.lmcache import NativePlugin


def chunk(seed, size=256 * 1024):
    return bytes((i * 31 + seed) % 251 for i in range(size))


def test_store_put_get_contains_delete(tmp_path):
    path = str(tmp_path / "vol")
    with kvhoard.Store(path, create=True, capacity=64 << 20, segment_size=4 << 20) as store:
        data = chunk(1)
        digest = store.put("org/model@1@0@-3f2a@bfloat16", data)
        assert len(digest) == 32
        assert store.contains("org/model@1@0@-3f2a@bfloat16")
        assert store.get("org/model@1@0@-3f2a@bfloat16") == data
        out = bytearray(len(data) + 100)
        assert store.get_into("org/model@1@0@-3f2a@bfloat16", out) == len(data)
        assert out[: len(data)] == data
        view = memoryview(bytearray(len(data)))
        assert store.get_into("org/model@1@0@-3f2a@bfloat16", view) == len(data)
        assert bytes(view) == data
        assert store.get("missing") is None
        assert store.get_into("missing", out) is None
        assert store.delete("org/model@1@0@-3f2a@bfloat16")
        assert not store.delete("org/model@1@0@-3f2a@bfloat16")
        assert not store.contains("org/model@1@0@-3f2a@bfloat16")


def kv_chunk(seed, layers=2, tokens=256, channels=1024):
    """A bf16 KV_2LTD chunk with the value spread of a real one (compressible, unlike noise)."""
    import random

    rng = random.Random(seed)
    out = bytearray()
    for _ in range(2 * layers * tokens * channels):
        value = rng.gauss(0.0, 1.0)
        bits = int.from_bytes(__import__("struct").pack("<f", value), "little")
        out += (bits >> 16).to_bytes(2, "little")
    return bytes(out), ("kv_2ltd", "bf16", (2, layers, tokens, channels))


def test_codecs_policies_frames_and_recompression(tmp_path):
    path = str(tmp_path / "vol")
    data, desc = kv_chunk(3, layers=1, tokens=64, channels=256)
    with kvhoard.Store(path, create=True, capacity=64 << 20, segment_size=4 << 20) as store:
        store.put("l", data, desc=desc, codec="lossless")
        assert store.get("l") == data
        assert store.describe("l")["codec"].startswith("lossless")
        assert store.describe("l")["stored_size"] < len(data)
        frame, meta = store.get_frame("l")
        assert len(frame) == meta["stored_size"] and meta["codec_params"]
        # Lossy codecs only where the namespace allows them.
        with pytest.raises(kvhoard.KvhoardError, match="lossy"):
            store.put("q", data, desc=desc, codec="quant:bits=4")
        store.set_policy("default", codec="quant:bits=8", lossy=True)
        assert store.policy("default") == {"codec": "quant:bits=8,group=32,residual=0", "lossy": True}
        store.put("q", data, desc=desc)
        assert len(store.get("q")) == len(data)
        assert store.describe("q")["codec"].startswith("quant:bits=8")
        assert store.recompress("q", "quant:bits=4")
        assert store.describe("q")["codec"].startswith("quant:bits=4")
        # Without a planner a quality report changes nothing; a quality out of range is refused.
        assert store.report_quality("q", 0.5) is False
        with pytest.raises(kvhoard.KvhoardError, match="quality"):
            store.report_quality("q", 1.5, group=3)
        # Dropped tokens come back only with their positions.
        store.put("d", data, desc=desc, codec="drop-knorm:keep=0.5")
        with pytest.raises(kvhoard.KvhoardError, match="get_kv"):
            store.get("d")
        block, positions = store.get_kv("d")
        assert len(block) == len(data) // 2 and len(positions) == 32
        assert store.get_kv("l") == (data, None)
    with kvhoard.Store(path) as store:
        assert store.policy("default")["lossy"]
        assert store.get("l") == data


def test_a_pinned_chunk_outlives_reclaim(tmp_path):
    path = str(tmp_path / "vol")
    # 8 segments of 1 MiB: 3 chunks of 256 KiB each (records have a header unit).
    with kvhoard.Store(path, create=True, capacity=8 << 20, segment_size=1 << 20) as store:
        store.put("pinned", chunk(0))
        assert store.pin("pinned")
        assert not store.pin("missing")
        # Four times the volume: every segment but the pinned one is reclaimed over and over.
        for i in range(1, 100):
            store.put(f"k{i}", chunk(i))
        assert not store.contains("k5"), "the segment after the pinned one was reclaimed"
        assert store.get("pinned") == chunk(0)
        assert store.unpin("pinned") and not store.unpin("pinned")
        for i in range(100, 200):
            store.put(f"k{i}", chunk(i))
        assert not store.contains("pinned"), "once unpinned, it is reclaimed like the rest"


def test_batches_and_reopen(tmp_path):
    path = str(tmp_path / "vol")
    keys = [f"k{i}" for i in range(8)]
    blocks = [chunk(i, 64 * 1024) for i in range(8)]
    store = kvhoard.Store(path, create=True, capacity=64 << 20, segment_size=4 << 20, durability="synced")
    store.put_batch(keys, blocks)
    store.close()
    del store
    store = kvhoard.Store(path)
    assert store.contains_batch(keys + ["nope"]) == [True] * 8 + [False]
    outs = [bytearray(64 * 1024) for _ in range(9)]
    assert store.get_batch_into(keys + ["nope"], outs) == [64 * 1024] * 8 + [None]
    assert [bytes(o) for o in outs[:8]] == blocks
    # Several keys in flight: the same answers, in the keys' order.
    for depth in (1, 3, 64):
        outs = [bytearray(64 * 1024) for _ in range(9)]
        order = ["nope"] + keys[::-1]
        assert store.get_batch_into(order, outs, io_depth=depth) == [None] + [64 * 1024] * 8
        assert [bytes(o) for o in outs[1:]] == blocks[::-1]
        descs = store.describe_batch(order, io_depth=depth)
        assert descs[0] is None
        assert [d["size"] for d in descs[1:]] == [64 * 1024] * 8
        assert [d["hash"] for d in descs[1:]] == [store.describe(k)["hash"] for k in keys[::-1]]


def test_threads_share_a_store(tmp_path):
    store = kvhoard.Store(str(tmp_path / "vol"), create=True, capacity=128 << 20, segment_size=4 << 20)
    errors = []

    def worker(n):
        try:
            for i in range(20):
                data = chunk(n * 100 + i, 32 * 1024)
                store.put(f"t{n}/{i}", data)
                assert store.get(f"t{n}/{i}") == data
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_bad_input_is_a_clear_error(tmp_path):
    with pytest.raises(kvhoard.KvhoardError, match="not a kvhoard volume|No such file"):
        kvhoard.Store(str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="durability"):
        kvhoard.Store(str(tmp_path / "v"), create=True, durability="sometimes")
    store = kvhoard.Store(str(tmp_path / "v2"), create=True, capacity=64 << 20, segment_size=4 << 20)
    store.put("k", b"x" * 1000)
    with pytest.raises(ValueError, match="read-only"):
        store.get_into("k", b"\0" * 1000)
    with pytest.raises(kvhoard.KvhoardError, match="too small"):
        store.get_into("k", bytearray(10))
    with pytest.raises(TypeError):
        store.put("k", 12345)
    with pytest.raises(ValueError, match="one buffer per key"):
        store.put_batch(["a", "b"], [b"1"])
    with pytest.raises(kvhoard.KvhoardError, match="invalid key"):
        store.put("", b"x")
    # The store keeps serving after every error.
    assert store.get("k") == b"x" * 1000


def wait_for(plugin, future_id, timeout=10.0):
    """Polls the eventfd as LMCache's adapter does until `future_id` completes."""
    poller = select.poll()
    poller.register(plugin.event_fd(), select.POLLIN)
    seen = {}
    while future_id not in seen:
        assert poller.poll(int(timeout * 1000)), "no completion before the timeout"
        for fid, ok, error, results in plugin.drain_completions():
            seen[fid] = (ok, error, results)
    return seen[future_id]


def test_native_plugin_round_trip_and_restart(tmp_path):
    path = str(tmp_path / "vol")
    plugin = NativePlugin(path=path, create=True, capacity=64 << 20, segment_size=4 << 20, threads=2)
    keys = [f"model@1@0@{i:x}@bfloat16" for i in range(6)]
    blocks = [chunk(i, 128 * 1024) for i in range(6)]
    ok, error, results = wait_for(plugin, plugin.submit_batch_set(keys, [memoryview(b) for b in blocks]))
    assert ok and error == "" and results == [True] * 6
    ok, _, results = wait_for(plugin, plugin.submit_batch_exists(keys + ["absent"]))
    assert ok and results == [True] * 6 + [False]
    outs = [bytearray(128 * 1024) for _ in range(7)]
    ok, _, results = wait_for(plugin, plugin.submit_batch_get(keys + ["absent"], [memoryview(o) for o in outs]))
    assert results == [True] * 6 + [False]
    assert [bytes(o) for o in outs[:6]] == blocks
    ok, _, results = wait_for(plugin, plugin.submit_batch_delete([keys[0], "absent"]))
    assert ok and results == [True, False]
    plugin.close()
    plugin.close()
    with pytest.raises(RuntimeError, match="closed"):
        plugin.submit_batch_exists(keys)
    del plugin

    # What was stored survives a restart.
    plugin = NativePlugin(path=path)
    _, _, results = wait_for(plugin, plugin.submit_batch_exists(keys))
    assert results == [False] + [True] * 5
    plugin.close()


def test_native_plugin_reports_failures_per_key(tmp_path):
    plugin = NativePlugin(path=str(tmp_path / "vol"), create=True, capacity=64 << 20, segment_size=4 << 20)
    ok, _, results = wait_for(plugin, plugin.submit_batch_set(["good", ""], [b"a" * 100, b"b" * 100]))
    assert not ok and results == [True, False]
    small = bytearray(10)
    ok, error, results = wait_for(plugin, plugin.submit_batch_get(["good"], [memoryview(small)]))
    assert not ok and "too small" in error and results == [False]
    with pytest.raises(ValueError, match="read-only"):
        plugin.submit_batch_get(["good"], [b"x" * 100])
    plugin.close()


def test_a_get_batch_is_read_by_several_readers_in_key_order(tmp_path):
    import mmap

    plugin = NativePlugin(path=str(tmp_path / "vol"), create=True, capacity=128 << 20, segment_size=8 << 20,
                          io_depth=3)
    size = 256 * 1024  # above the engine's direct-read size: page-aligned buffers are filled in place
    keys = [f"k{i}" for i in range(10)]
    blocks = [chunk(i, size) for i in range(10)]
    stored = [k for i, k in enumerate(keys) if i % 4 != 1]
    ok, _, _ = wait_for(plugin, plugin.submit_batch_set(stored, [blocks[keys.index(k)] for k in stored]))
    assert ok
    region = mmap.mmap(-1, size * 10)
    views = [memoryview(region)[i * size:(i + 1) * size] for i in range(10)]
    ok, error, results = wait_for(plugin, plugin.submit_batch_get(keys, views))
    assert ok, error
    assert results == [i % 4 != 1 for i in range(10)]
    for i in range(10):
        if i % 4 != 1:
            assert views[i] == blocks[i], f"key {i}"
    for v in views:
        v.release()
    plugin.close()


def test_many_batches_in_flight(tmp_path):
    plugin = NativePlugin(path=str(tmp_path / "vol"), create=True, capacity=128 << 20, segment_size=4 << 20, threads=4)
    ids = [plugin.submit_batch_set([f"b{i}"], [chunk(i, 64 * 1024)]) for i in range(32)]
    poller = select.poll()
    poller.register(plugin.event_fd(), select.POLLIN)
    done = {}
    while len(done) < len(ids):
        assert poller.poll(10000)
        for fid, ok, _, results in plugin.drain_completions():
            done[fid] = ok and results == [True]
    assert all(done[i] for i in ids)
    plugin.close()


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
