"""`kvhoard serve --cluster-config` nodes as a Redis Cluster, driven by unmodified clients:
redis-py's `redis.cluster.RedisCluster` and LMCache 0.5.6's `redis-cluster://` connector
(`RedisClusterConnector`, through `RemoteBackend`, as interop.py drives the other connectors).

Usage: cluster_check.py HOST:PORT,... store|verify
       cluster_check.py HOST:PORT,... kill DOWN_HOST:PORT MAP_FILE PID SYNC_DIR
       cluster_check.py HOST:PORT,... reassigned DOWN_HOST:PORT MAP_FILE

Every mode works on the same chunks: a few chunk-shaped objects (32 MiB and 2 MiB KV_2LTD bf16)
and SPREAD_CHUNKS small ones (1 KiB), each stored by LMCache as two keys (`...kv_bytes`,
`...metadata`) that hash to unrelated slots.

`store`: redis-py sets and gets values byte for byte (CRLF and NUL inside) on the node its slot
names; LMCache stores every chunk and reads it back identical; the keys (DBSIZE on each node) are
spread within 10 % of even. `verify`: LMCache finds every chunk again, identical (after a node
came back on its volume). `kill`: one LMCache client reads chunks in a loop (and writes new ones)
while a timer thread SIGKILLs PID (the node DOWN) mid-run; every chunk served must be identical,
every miss must come after the kill and involve a key that lives, by MAP_FILE (the map the chunks
were stored under), on DOWN. The script then writes SYNC_DIR/killed and waits for SYNC_DIR/back
(the node started again on its volume), and the same client must then find every chunk.
`reassigned`: after the nodes that are up took over the slots of the one down (a new map,
SIGHUP): the same chunks are served, the others missed, and the misses must be quick. Prints how
long misses took. Exits non-zero on failure.
"""

import asyncio
import os
import signal
import sys
import threading
import time

os.environ.setdefault("LMCACHE_TRACK_USAGE", "false")
NODES, MODE = sys.argv[1].split(","), sys.argv[2]
DOWN = sys.argv[3] if len(sys.argv) > 3 else None
MAP_FILE = sys.argv[4] if len(sys.argv) > 4 else None
PID = int(sys.argv[5]) if len(sys.argv) > 5 else None
SYNC_DIR = sys.argv[6] if len(sys.argv) > 6 else None
# A miss once the slots of the node down have other owners: a redirection and a nil, no retries.
QUICK_MISS_SECONDS = 1.0
# Small chunks stored to measure how evenly the keys spread (two keys each).
SPREAD_CHUNKS = 3000
# How far from an even share of the keys a node may be.
SPREAD_TOLERANCE = 0.10
# `kill`: when the node is killed, and how long the client goes on reading after that.
KILL_AFTER_SECONDS = 2.0
RUN_AFTER_KILL_SECONDS = 15.0
os.environ["LMCACHE_REMOTE_URL"] = "redis-cluster://" + ",".join(NODES)
os.environ.setdefault("LMCACHE_LOCAL_CPU", "True")
os.environ.setdefault("LMCACHE_MAX_LOCAL_CPU_SIZE", "2")

import redis  # noqa: E402
from redis.cluster import ClusterNode, RedisCluster  # noqa: E402
from redis.crc import key_slot  # noqa: E402
import torch  # noqa: E402
from lmcache.integration.vllm.utils import lmcache_get_or_create_config  # noqa: E402
from lmcache.utils import CacheEngineKey  # noqa: E402
from lmcache.v1.metadata import LMCacheMetadata  # noqa: E402
from lmcache.v1.storage_backend import RemoteBackend  # noqa: E402
from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend  # noqa: E402

# (layers, 2, tokens, heads, head_size) in vLLM's order; LMCache stores [2, layers, tokens, heads*size].
SHAPES = {"chunk32m": ((32, 2, 256, 8, 128), 3), "chunk2m": ((8, 2, 256, 4, 64), 12),
          "spread": ((1, 2, 16, 1, 16), SPREAD_CHUNKS)}
failures = 0


def fail(msg):
    global failures
    print(f"FAIL {msg}", flush=True)
    failures += 1


def read_map(path):
    """The slot ranges of a kvhoard cluster map file, as redis-py's cluster_slots() gives them."""
    slots = {}
    for line in open(path):
        words = line.split("#")[0].split()
        if not words or words[0] != "node":
            continue
        host, port = words[1].rsplit(":", 1)
        for word in words[2:]:
            for r in filter(None, word.split(",")):
                if r.startswith("id="):
                    continue
                first, _, last = r.partition("-")
                slots[int(first), int(last or first)] = {"primary": (host.strip("[]"), int(port))}
    return slots


def node_of(slots, key: bytes):
    slot = key_slot(key)
    for (first, last), nodes in slots.items():
        if first <= slot <= last:
            return "%s:%s" % nodes["primary"]
    return None


def spread(counts):
    """The largest relative distance of a node's count from an even share."""
    even = sum(counts.values()) / len(counts)
    return max(abs(c - even) for c in counts.values()) / even


def redis_py_check():
    """redis-py's RedisCluster against the nodes: routing, bytes, spread."""
    host, port = NODES[0].rsplit(":", 1)
    rc = RedisCluster(startup_nodes=[ClusterNode(host, int(port))], decode_responses=False)
    slots = rc.cluster_slots()
    if sorted("%s:%s" % v["primary"] for v in slots.values()) != sorted(NODES):
        fail(f"CLUSTER SLOTS names {slots}, not the nodes {NODES}")
    keys = [f"rp/{i}@{i * 7919:x}".encode() for i in range(3000)]
    for i, k in enumerate(keys):
        rc.set(k, b"\r\n\x00" + k * (1 + i % 5))
    wrong = sum(rc.get(k) != b"\r\n\x00" + k * (1 + i % 5) for i, k in enumerate(keys))
    if wrong:
        fail(f"redis-py: {wrong} values came back different")
    dbsize = {n: dbsize_of(n) for n in NODES}
    counts = {n: sum(node_of(slots, k) == n for k in keys) for n in NODES}
    if counts != dbsize:
        fail(f"redis-py: keys are not on the nodes their slots name: expected {counts}, DBSIZE {dbsize}")
    print(f"ok redis-py RedisCluster over {len(NODES)} nodes: {len(keys)} keys byte-identical, "
          f"each on the node its slot names ({spread(counts):.1%} from even)", flush=True)
    if rc.exists(keys[0]) != 1 or rc.delete(keys[0]) != 1 or rc.get(keys[0]) is not None:
        fail("redis-py: EXISTS/DEL/GET after DEL")
    for k in keys[1:]:
        rc.delete(k)
    rc.close()
    return slots


def dbsize_of(node):
    h, p = node.rsplit(":", 1)
    r = redis.Redis(host=h, port=int(p))
    n = r.dbsize()
    r.close()
    return n


def chunk_key(name, i):
    # LMCache's chunk hashes are signed 64-bit integers; spread them as a real hash would.
    chunk_hash = (-1) ** i * (7000 + i) if name != "spread" else (i * 0x9E3779B97F4A7C15) % (1 << 63) - (1 << 62)
    return CacheEngineKey(model_name=f"org/cluster-{name}", world_size=1, worker_id=0,
                          chunk_hash=chunk_hash, dtype=torch.bfloat16)


def chunks(every_spread=1):
    """(name, kv_shape, key, tensor) for every chunk, the same in every mode; only every
    `every_spread`-th small chunk."""
    for name, (kv_shape, count) in SHAPES.items():
        gen = torch.Generator().manual_seed(7)
        layers, _, tokens, heads, size = kv_shape
        shape = torch.Size([2, layers, tokens, heads * size])
        for i in range(count):
            if name == "spread":
                if i % every_spread:
                    continue
                # Cheap and distinct: consecutive 16-bit patterns starting at i.
                want = torch.arange(i, i + shape.numel(), dtype=torch.int32).to(torch.int16)
                yield name, kv_shape, chunk_key(name, i), want.view(torch.bfloat16).reshape(shape)
            else:
                yield name, kv_shape, chunk_key(name, i), torch.randn(shape, generator=gen).to(torch.bfloat16)


class Client:
    """One LMCache RemoteBackend per chunk shape, over redis-cluster://."""

    def __init__(self):
        self.config = lmcache_get_or_create_config()
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        self.backends = {}

    def backend(self, name, kv_shape):
        if name not in self.backends:
            metadata = LMCacheMetadata(model_name=f"org/cluster-{name}", world_size=1, local_world_size=1,
                                       worker_id=0, local_worker_id=0, kv_dtype=torch.bfloat16, kv_shape=kv_shape)
            cpu = LocalCPUBackend(config=self.config, metadata=metadata, dst_device="cpu")
            self.backends[name] = (cpu, RemoteBackend(config=self.config, metadata=metadata, loop=self.loop,
                                                      local_cpu_backend=cpu, dst_device="cpu"))
        return self.backends[name]

    def put(self, name, kv_shape, key, want):
        cpu, backend = self.backend(name, kv_shape)
        obj = cpu.allocate(want.shape, torch.bfloat16)
        obj.tensor.copy_(want)
        fut = backend.submit_put_task(key, obj)
        # Our reference from allocate() goes once the write is done (or at once if none started).
        if fut is None:
            obj.ref_count_down()
        else:
            fut.add_done_callback(lambda _: obj.ref_count_down())
        return fut

    def get(self, name, kv_shape, key, want):
        """'served', 'missed' or 'WRONG', and the seconds it took."""
        _, backend = self.backend(name, kv_shape)
        started = time.monotonic()
        got = backend.get_blocking(key) if backend.contains(key) else None
        took = time.monotonic() - started
        if got is None:
            return "missed", took
        same = got.tensor.shape == want.shape and torch.equal(got.tensor.view(torch.int16), want.view(torch.int16))
        got.ref_count_down()
        return ("served" if same else "WRONG"), took


def homes(slots, key):
    text = key.to_string()
    return {node_of(slots, (text + suffix).encode()) for suffix in ("kv_bytes", "metadata")}


def store(slots):
    client = Client()
    pending = []
    for name, kv_shape, key, want in chunks():
        fut = client.put(name, kv_shape, key, want)
        if fut is not None:
            pending.append(fut)
        if len(pending) >= 64:
            for f in pending:
                f.result(timeout=120)
            pending = []
    for f in pending:
        f.result(timeout=120)
    counts = {"served": 0, "missed": 0, "WRONG": 0}
    for name, kv_shape, key, want in chunks():
        outcome, _ = client.get(name, kv_shape, key, want)
        counts[outcome] += 1
        if outcome != "served":
            fail(f"{name} {key.to_string()}: {outcome} right after it was stored")
    dbsize = {n: dbsize_of(n) for n in NODES}
    off = spread(dbsize)
    total = sum(counts.values())
    print(f"{'ok' if off <= SPREAD_TOLERANCE else 'FAIL'} LMCache redis-cluster:// store over {len(NODES)} nodes: "
          f"{counts['served']} of {total} chunks (3 x 32 MiB, 12 x 2 MiB, {SPREAD_CHUNKS} x 1 KiB) byte-identical; "
          f"keys per node (DBSIZE) {sorted(dbsize.values())}, {off:.1%} from even at most", flush=True)
    if off > SPREAD_TOLERANCE:
        fail(f"keys are spread {off:.1%} from even, more than {SPREAD_TOLERANCE:.0%}")
    # The same over many more keys, computed (no storing): what a long-running cache converges to.
    many = {n: 0 for n in NODES}
    for i in range(100_000):
        text = chunk_key("spread", i).to_string()
        for suffix in ("kv_bytes", "metadata"):
            many[node_of(slots, (text + suffix).encode())] += 1
    print(f"ok spread of 200000 LMCache keys (computed by slot): {spread(many):.2%} from even at most", flush=True)


def verify(client=None, what="verify"):
    client = client or Client()
    counts = {"served": 0, "missed": 0, "WRONG": 0}
    for name, kv_shape, key, want in chunks():
        outcome, _ = client.get(name, kv_shape, key, want)
        counts[outcome] += 1
        if outcome != "served":
            fail(f"{name} {key.to_string()}: {outcome}")
    print(f"{'ok' if not failures else 'FAIL'} LMCache redis-cluster:// {what}: {counts['served']} of "
          f"{sum(counts.values())} chunks byte-identical over {len(NODES)} nodes", flush=True)


def kill(slots):
    """Reads (and writes) while the node DOWN is SIGKILLed; then waits for it to come back."""
    client = Client()
    killed_at = [None]

    def killer():
        killed_at[0] = time.monotonic()
        os.kill(PID, signal.SIGKILL)

    timer = threading.Timer(KILL_AFTER_SECONDS, killer)
    seen = {"served": 0, "missed": 0, "WRONG": 0, "missed_down": 0}
    miss_seconds = []
    reads = fresh = 0

    def running():
        return killed_at[0] is None or time.monotonic() - killed_at[0] < RUN_AFTER_KILL_SECONDS

    # The chunks over and over (every tenth small one, the shapes taken in turn), until the node
    # has been dead a while.
    by_shape = {}
    for chunk in chunks(every_spread=10):
        by_shape.setdefault(chunk[0], []).append(chunk)
    longest = max(len(v) for v in by_shape.values())
    order = [v[i % len(v)] for i in range(longest) for v in by_shape.values()]
    for name, kv_shape, _, _ in order:
        client.backend(name, kv_shape)
    started = time.monotonic()
    timer.start()
    while running():
        for name, kv_shape, key, want in order:
            if not running():
                break
            reads += 1
            began = time.monotonic()
            outcome, took = client.get(name, kv_shape, key, want)
            seen[outcome] += 1
            if outcome == "WRONG":
                fail(f"{name} {key.to_string()}: different bytes")
            elif outcome == "missed":
                dead = killed_at[0] is not None and killed_at[0] <= began + took
                if not dead or DOWN not in homes(slots, key):
                    fail(f"{name} {key.to_string()}: missed, keys on {sorted(homes(slots, key))}, "
                         f"{'after' if dead else 'before'} the kill")
                else:
                    seen["missed_down"] += 1
                    miss_seconds.append(took)
            # A new chunk now and then: written while the node dies, read back at once.
            if name == "spread":
                fresh += 1
                key2 = chunk_key("spread", 10_000_000 + fresh)
                want2 = torch.full(want.shape, fresh % 1000, dtype=torch.int16).view(torch.bfloat16)
                fut = client.put(name, kv_shape, key2, want2)
                try:
                    if fut is not None:
                        fut.result(timeout=30)
                except Exception:
                    pass  # a write to the node that is down fails; LMCache logs it and counts it
                outcome, took = client.get(name, kv_shape, key2, want2)
                if outcome == "WRONG":
                    fail(f"fresh {key2.to_string()}: different bytes")
                elif outcome == "missed":
                    dead = killed_at[0] is not None and killed_at[0] <= time.monotonic()
                    if not dead or DOWN not in homes(slots, key2):
                        fail(f"fresh {key2.to_string()}: missed, keys on {sorted(homes(slots, key2))}")
                seen[outcome] += 1
    timer.join()
    slowest = max(miss_seconds, default=0.0)
    mean = sum(miss_seconds) / max(len(miss_seconds), 1)
    print(f"{'ok' if not failures else 'FAIL'} LMCache redis-cluster:// with {DOWN} SIGKILLed "
          f"{killed_at[0] - started:.1f} s into the run: {reads + fresh} reads, {fresh} writes; {seen['served']} reads served "
          f"byte-identical, {seen['missed']} misses ({seen['missed_down']} of stored chunks, every one with a key "
          f"on the node killed), 0 wrong bytes; misses took {mean * 1e3:.0f} ms on average, "
          f"{slowest * 1e3:.0f} ms at most", flush=True)
    if seen["missed_down"] == 0:
        fail("no chunk was missed although a node was killed")
    # The node comes back on its volume; the same client must find every stored chunk again.
    open(os.path.join(SYNC_DIR, "killed"), "w").close()
    deadline = time.monotonic() + 120
    while not os.path.exists(os.path.join(SYNC_DIR, "back")):
        if time.monotonic() > deadline:
            fail("the node did not come back within 120 s")
            return
        time.sleep(0.05)
    verify(client, f"after {DOWN} came back, same client")


def reassigned(slots):
    client = Client()
    served = missed = 0
    miss_seconds = []
    for name, kv_shape, key, want in chunks(every_spread=10):
        outcome, took = client.get(name, kv_shape, key, want)
        if outcome == "WRONG":
            fail(f"{name} {key.to_string()}: different bytes")
        elif outcome == "served":
            served += 1
            if DOWN in homes(slots, key):
                fail(f"{name} {key.to_string()}: served although a key of it lived on {DOWN}")
        else:
            missed += 1
            miss_seconds.append(took)
            if DOWN not in homes(slots, key):
                fail(f"{name} {key.to_string()}: missed; keys on {sorted(homes(slots, key))}")
    slowest = max(miss_seconds, default=0.0)
    mean = sum(miss_seconds) / max(len(miss_seconds), 1)
    print(f"{'ok' if not failures else 'FAIL'} LMCache redis-cluster:// with {DOWN} down, its slots reassigned: "
          f"{served} of {served + missed} chunks served byte-identical, {missed} misses (a key on the node down), "
          f"misses took {mean * 1e3:.1f} ms on average, {slowest * 1e3:.1f} ms at most", flush=True)
    if slowest > QUICK_MISS_SECONDS:
        fail(f"a miss took {slowest:.2f} s after the slots were reassigned")
    if missed == 0 or served == 0:
        fail(f"expected both served and missed chunks with {DOWN} down ({served} served, {missed} missed)")


def main():
    if MODE == "store":
        store(redis_py_check())
    elif MODE == "verify":
        verify()
    elif MODE == "kill":
        kill(read_map(MAP_FILE))
    elif MODE == "reassigned":
        reassigned(read_map(MAP_FILE))
    else:
        fail(f"unknown mode {MODE}")
    print(f"redis-cluster:// {MODE}: {failures} failure(s)", flush=True)
    # RemoteBackend.close() is not called: it deadlocks for the redis connectors in 0.5.6.
    os._exit(1 if failures else 0)


if __name__ == "__main__":
    main()
