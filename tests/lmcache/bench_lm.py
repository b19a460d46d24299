"""GET throughput and latency of an lm:// server, with one client speaking LMCache 0.5.6's wire
format (the same bytes as lmcache/v1/protocol.py) over one connection.

Usage: bench_lm.py HOST PORT SIZE_BYTES COUNT ROUNDS LABEL [CLIENTS]

Puts COUNT objects of SIZE_BYTES (KV_2LTD bf16 shapes), checks with EXIST that each is stored
(as LMCache's RemoteBackend asks before it retrieves; a server that stores a PUT in the
background answers once that PUT is done), then GETs each of them ROUNDS times in order,
timing every GET from the request to the last payload byte. Prints one JSON line.
With CLIENTS > 1, that many processes do this at once, each over its own connection with its
own keys (as the workers of one tensor-parallel vLLM instance do); the GET phase starts in all
of them together, and the throughput is all bytes over the time of the slowest.

With SERVER_PID set in the environment, also reports the CPU time that process spent during the
GET phase (user + system, all its threads, from /proc): `server_cpu_s` and `server_cpu_s_per_gb`.
When the client is what limits throughput, this is where servers differ.
"""

import json
import multiprocessing
import os
import socket
import struct
import sys
import time

HOST, PORT, SIZE, COUNT, ROUNDS, LABEL = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), \
    int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
CLIENTS = int(sys.argv[7]) if len(sys.argv) > 7 else 1
PUT, GET, EXIST = 1, 2, 3


def header(cmd, length, shape, key):
    return struct.pack("iiiiiiiii150s", cmd, length, 1, 3, 0, *shape, key.encode().ljust(150))


def recv_exact(sock, view):
    got = 0
    while got < len(view):
        n = sock.recv_into(view[got:])
        if n == 0:
            raise ConnectionError("server closed the connection")
        got += n


def client(index, barrier, out):
    """One connection; sends back (latencies, seconds), or (None, why) if it failed."""
    try:
        out.put(run_client(index, barrier))
    except BaseException as e:  # noqa: BLE001 - reported by the parent, which must not hang
        barrier.abort()
        out.put((None, f"client {index}: {e!r}"))


def run_client(index, barrier):
    """Puts this client's objects, waits for every client, GETs them."""
    tokens = SIZE // (2 * 2 * 8 * 1024)  # [2, 8 layers, tokens, 1024] bf16
    shape = (2, 8, tokens, 1024)
    sock = socket.create_connection((HOST, PORT))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    # Distinct bytes per object and client (a content-addressed store must not share them).
    fill = [(index * COUNT + i) % 251 for i in range(COUNT)]
    keys = [f"bench/model@{CLIENTS}@{index}@{i:x}@bfloat16" for i in range(COUNT)]
    for k, f in zip(keys, fill):
        sock.sendall(header(PUT, SIZE, shape, k))
        sock.sendall(bytes([f]) * SIZE)
    reply = bytearray(36)
    for k in keys:
        sock.sendall(header(EXIST, 0, (0, 0, 0, 0), k))
        recv_exact(sock, memoryview(reply))
        if struct.unpack_from("i", reply)[0] != 200:
            raise SystemExit(f"EXIST {k}: not stored")
    buf = bytearray(SIZE)
    view = memoryview(buf)
    lat = []
    barrier.wait()
    start = time.perf_counter()
    for _ in range(ROUNDS):
        for f, k in zip(fill, keys):
            t0 = time.perf_counter()
            sock.sendall(header(GET, 0, (0, 0, 0, 0), k))
            recv_exact(sock, memoryview(reply))
            code, length = struct.unpack_from("ii", reply)
            if code != 200 or length != SIZE:
                raise SystemExit(f"GET {k}: code {code}, length {length}")
            recv_exact(sock, view)
            lat.append(time.perf_counter() - t0)
            if buf[0] != f or buf[-1] != f:
                raise SystemExit(f"GET {k}: wrong bytes")
    return lat, time.perf_counter() - start


def cpu_seconds(pid):
    """User + system CPU seconds of every thread of `pid` so far (None without a pid)."""
    if not pid:
        return None
    with open(f"/proc/{pid}/stat") as f:
        # The command name (field 2) may hold spaces; the fields after it are fixed.
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main():
    tokens = SIZE // (2 * 2 * 8 * 1024)
    assert 2 * 8 * tokens * 1024 * 2 == SIZE, "size must be a multiple of 32 KiB"
    ctx = multiprocessing.get_context("fork")
    # The parent is one more party: it reads the server's CPU time as the GET phase starts.
    barrier, out = ctx.Barrier(CLIENTS + 1), ctx.Queue()
    procs = [ctx.Process(target=client, args=(i, barrier, out)) for i in range(CLIENTS)]
    for p in procs:
        p.start()
    server = os.environ.get("SERVER_PID")
    try:
        barrier.wait()
    except Exception:  # noqa: BLE001 - a client failed before the GET phase; reported below
        pass
    cpu0 = cpu_seconds(server)
    results = [out.get() for _ in procs]
    cpu1 = cpu_seconds(server)
    for p in procs:
        p.join()
    failed = [why for lat, why in results if lat is None]
    if failed:
        raise SystemExit("; ".join(failed))
    lat = sorted(x for r, _ in results for x in r)
    total = max(t for _, t in results)
    pct = lambda q: lat[min(len(lat) - 1, int(q * len(lat)))] * 1e6
    report = {"server": LABEL, "object_bytes": SIZE, "clients": CLIENTS, "gets": len(lat),
              "get_mbps": round(SIZE * len(lat) / total / 1e6, 1),
              "get_p50_us": round(pct(0.50)), "get_p99_us": round(pct(0.99))}
    if cpu0 is not None:
        report["server_cpu_s"] = round(cpu1 - cpu0, 3)
        report["server_cpu_s_per_gb"] = round((cpu1 - cpu0) / (SIZE * len(lat) / 1e9), 4)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
