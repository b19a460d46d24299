"""LMCache 0.5.6's own RemoteBackend against a running `kvhoard serve`.

Usage: interop.py URL store|verify SEED

URL `plugin:VOLUME` uses kvhoard.lmcache.StorageBackend on VOLUME instead of a RemoteBackend (to
check that chunks stored over lm:// are the chunks the storage plugin loads).

`store` puts chunk-shaped objects (KV_2LTD [2, 32, 256, 1024] bf16 = 32 MiB, and a 2 MiB one)
through LMCache's RemoteBackend, then checks contains and get return the same bytes; `verify`
only checks contains and get (run after the server restarted). Exits non-zero on any mismatch.
"""

import asyncio
import os
import sys
import threading

os.environ.setdefault("LMCACHE_TRACK_USAGE", "false")
URL, MODE, SEED = sys.argv[1], sys.argv[2], int(sys.argv[3])
PLUGIN = URL.startswith("plugin:")
if PLUGIN:
    os.environ["LMCACHE_EXTRA_CONFIG"] = '{"kvhoard.path": "%s", "kvhoard.create": false}' % URL[len("plugin:"):]
else:
    os.environ["LMCACHE_REMOTE_URL"] = URL
os.environ.setdefault("LMCACHE_LOCAL_CPU", "True")
os.environ.setdefault("LMCACHE_MAX_LOCAL_CPU_SIZE", "1")
if URL.startswith("resp://"):
    os.environ["LMCACHE_EXTRA_CONFIG"] = '{"save_chunk_meta": false}'

import torch  # noqa: E402
from lmcache.integration.vllm.utils import lmcache_get_or_create_config  # noqa: E402
from lmcache.utils import CacheEngineKey  # noqa: E402
from lmcache.v1.metadata import LMCacheMetadata  # noqa: E402
from lmcache.v1.storage_backend import RemoteBackend  # noqa: E402
from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend  # noqa: E402

# (layers, 2, tokens, heads, head_size) in vLLM's order; LMCache stores [2, layers, tokens, heads*size].
SHAPES = {"chunk32m": (32, 2, 256, 8, 128), "chunk2m": (8, 2, 256, 4, 64)}


def main():
    config = lmcache_get_or_create_config()
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    failures = 0
    for name, kv_shape in SHAPES.items():
        metadata = LMCacheMetadata(
            model_name=f"org/interop-{name}", world_size=1, local_world_size=1, worker_id=0,
            local_worker_id=0, kv_dtype=torch.bfloat16, kv_shape=kv_shape,
        )
        cpu = LocalCPUBackend(config=config, metadata=metadata, dst_device="cpu")
        if PLUGIN:
            from kvhoard.lmcache import StorageBackend

            backend = StorageBackend(config=config, metadata=metadata, loop=loop,
                                     local_cpu_backend=cpu, dst_device="cpu")
        else:
            backend = RemoteBackend(config=config, metadata=metadata, loop=loop,
                                    local_cpu_backend=cpu, dst_device="cpu")
        gen = torch.Generator().manual_seed(SEED)
        for i in range(3):
            key = CacheEngineKey(model_name=f"org/interop-{name}", world_size=1, worker_id=0,
                                 chunk_hash=(-1) ** i * (SEED * 1000 + i), dtype=torch.bfloat16)
            layers, _, tokens, heads, size = kv_shape
            shape = torch.Size([2, layers, tokens, heads * size])
            want = torch.randn(shape, generator=gen).to(torch.bfloat16)
            if MODE == "store":
                obj = cpu.allocate(shape, torch.bfloat16)
                obj.tensor.copy_(want)
                fut = backend.submit_put_task(key, obj)
                if fut is not None:
                    fut.result(timeout=30)
            if not backend.contains(key):
                print(f"FAIL {name} {i}: contains() is False for {key.to_string()}")
                failures += 1
                continue
            got = backend.get_blocking(key)
            if got is None:
                print(f"FAIL {name} {i}: get() returned nothing for {key.to_string()}")
                failures += 1
                continue
            same = got.tensor.shape == shape and got.tensor.dtype == torch.bfloat16 and \
                torch.equal(got.tensor.view(torch.int16), want.view(torch.int16))
            print(f"{'ok' if same else 'FAIL'} {name} {i}: {tuple(got.tensor.shape)} {got.tensor.dtype} "
                  f"{got.tensor.numel() * 2} bytes {key.to_string()}")
            failures += 0 if same else 1
        missing = CacheEngineKey(model_name=f"org/interop-{name}", world_size=1, worker_id=0,
                                 chunk_hash=987654321, dtype=torch.bfloat16)
        # LMCache's native resp:// client only GETs keys it found with EXISTS: it does not handle
        # the `$-1` a GET of a missing key gets (from Redis too), so only contains() is asked there.
        probe_get = not URL.startswith("resp://")
        if backend.contains(missing) or (probe_get and backend.get_blocking(missing) is not None):
            print(f"FAIL {name}: a key never stored was found")
            failures += 1
        # A RemoteBackend is not closed: its close() deadlocks for the redis:// and resp://
        # connectors in lmcache 0.5.6 (it waits on its event loop from that loop's own thread).
        # The storage plugin is, so that the next shape's plugin can open the volume.
        if PLUGIN:
            backend.close()
    print(f"{URL} {MODE}: {failures} failure(s)")
    sys.stdout.flush()
    os._exit(1 if failures else 0)


if __name__ == "__main__":
    main()
