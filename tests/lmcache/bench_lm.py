"""GET throughput and latency of an lm:// server, with one client speaking LMCache 0.5.6's wire
format (the same bytes as lmcache/v1/protocol.py) over one connection.

Usage: bench_lm.py HOST PORT SIZE_BYTES COUNT ROUNDS LABEL

Puts COUNT objects of SIZE_BYTES (KV_2LTD bf16 shapes), then GETs each of them ROUNDS times in
order, timing every GET from the request to the last payload byte. Prints one JSON line.
"""

import json
import socket
import struct
import sys
import time

HOST, PORT, SIZE, COUNT, ROUNDS, LABEL = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), \
    int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
PUT, GET = 1, 2


def header(cmd, length, shape, key):
    return struct.pack("iiiiiiiii150s", cmd, length, 1, 3, 0, *shape, key.encode().ljust(150))


def recv_exact(sock, view):
    got = 0
    while got < len(view):
        n = sock.recv_into(view[got:])
        if n == 0:
            raise ConnectionError("server closed the connection")
        got += n


def main():
    tokens = SIZE // (2 * 2 * 8 * 1024)  # [2, 8 layers, tokens, 1024] bf16
    shape = (2, 8, tokens, 1024)
    assert 2 * 8 * tokens * 1024 * 2 == SIZE, "size must be a multiple of 32 KiB"
    sock = socket.create_connection((HOST, PORT))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    payloads = [bytes([i % 251]) * SIZE for i in range(COUNT)]
    keys = [f"bench/model@1@0@{i:x}@bfloat16" for i in range(COUNT)]
    for k, p in zip(keys, payloads):
        sock.sendall(header(PUT, SIZE, shape, k))
        sock.sendall(p)
    buf = bytearray(SIZE)
    view = memoryview(buf)
    reply = bytearray(36)
    lat = []
    start = time.perf_counter()
    for _ in range(ROUNDS):
        for i, k in enumerate(keys):
            t0 = time.perf_counter()
            sock.sendall(header(GET, 0, (0, 0, 0, 0), k))
            recv_exact(sock, memoryview(reply))
            code, length = struct.unpack_from("ii", reply)
            if code != 200 or length != SIZE:
                raise SystemExit(f"GET {k}: code {code}, length {length}")
            recv_exact(sock, view)
            lat.append(time.perf_counter() - t0)
            if buf[0] != i % 251 or buf[-1] != i % 251:
                raise SystemExit(f"GET {k}: wrong bytes")
    total = time.perf_counter() - start
    lat.sort()
    pct = lambda q: lat[min(len(lat) - 1, int(q * len(lat)))] * 1e6
    print(json.dumps({"server": LABEL, "object_bytes": SIZE, "gets": len(lat),
                      "get_mbps": round(SIZE * len(lat) / total / 1e6, 1),
                      "get_p50_us": round(pct(0.50)), "get_p99_us": round(pct(0.99))}))


if __name__ == "__main__":
    main()
