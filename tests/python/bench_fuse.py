"""One phase of scripts/bench-fuse.sh, or its report.

    bench_fuse.py mount MOUNT_NAMESPACE_DIR TOTAL_MIB ROUND   write, read, stat through the mount
    bench_fuse.py native VOLUME TOTAL_MIB ROUND               put and get_into through the engine
    bench_fuse.py report RESULTS_JSONL                        per-round ratios and medians

Each phase prints one JSON line. Both phases move the same number of 32 MiB blocks with one
thread and write blocks of the same content (the keys differ, and so do the bytes of each block).
"""

import json
import mmap
import os
import statistics
import sys
import time

SIZE = 32 << 20


def blocks(total_mib, round_):
    count = total_mib * (1 << 20) // SIZE
    base = os.urandom(SIZE)
    # Distinct bytes per block and round, so nothing is deduplicated.
    return [bytes([round_ % 251, i % 251]) + base[2:] for i in range(count)]


def mount_phase(base, total_mib, round_):
    data = blocks(total_mib, round_)
    names = [f"{base}/model@1@0@{round_:x}{i:04x}@bfloat16" for i in range(len(data))]
    t = time.perf_counter()
    for name, block in zip(names, data):
        with open(name + ".tmp", "wb") as f:
            f.write(block)
        os.replace(name + ".tmp", name)
    write = len(data) * SIZE / (time.perf_counter() - t) / 1e6
    buf = bytearray(16 << 20)
    t = time.perf_counter()
    for name in names:
        with open(name, "rb", buffering=0) as f:
            n = 0
            while (r := f.readinto(buf)) > 0:
                n += r
        assert n == SIZE, (name, n)
    read = len(data) * SIZE / (time.perf_counter() - t) / 1e6
    probes = 20000
    t = time.perf_counter()
    for i in range(probes):
        try:
            os.stat(f"{base}/missing-{round_}-{i}")
        except FileNotFoundError:
            pass
    stat_rate = probes / (time.perf_counter() - t)
    return {"phase": "mount", "round": round_, "write_mbps": write, "read_mbps": read, "missing_stat_per_s": stat_rate}


def native_phase(volume, total_mib, round_):
    import kvhoard

    data = blocks(total_mib, round_ + 1000)
    keys = [f"native-{round_}-{i}" for i in range(len(data))]
    with kvhoard.Store(volume, namespace="default") as store:
        t = time.perf_counter()
        for key, block in zip(keys, data):
            store.put(key, block)
        write = len(data) * SIZE / (time.perf_counter() - t) / 1e6
        buf = mmap.mmap(-1, SIZE)
        t = time.perf_counter()
        for key in keys:
            assert store.get_into(key, buf) == SIZE
        read = len(data) * SIZE / (time.perf_counter() - t) / 1e6
    return {"phase": "native", "round": round_, "write_mbps": write, "read_mbps": read}


def report(path):
    rows = [json.loads(line) for line in open(path)]
    by_round = {}
    for r in rows:
        by_round.setdefault(r["round"], {})[r["phase"]] = r
    print("| round | mount write | native put | ratio (bar ≥ 0.5) | mount read | native get | ratio (bar ≥ 0.7) |")
    print("|---|---|---|---|---|---|---|")
    wr, rr = [], []
    for n, r in sorted(by_round.items()):
        m, x = r["mount"], r["native"]
        wr.append(m["write_mbps"] / x["write_mbps"])
        rr.append(m["read_mbps"] / x["read_mbps"])
        print(f"| {n} | {m['write_mbps']:.0f} MB/s | {x['write_mbps']:.0f} MB/s | {wr[-1]:.2f} "
              f"| {m['read_mbps']:.0f} MB/s | {x['read_mbps']:.0f} MB/s | {rr[-1]:.2f} |")
    print(f"| median | | | **{statistics.median(wr):.2f}** | | | **{statistics.median(rr):.2f}** |")
    stat = statistics.median(r["mount"]["missing_stat_per_s"] for r in by_round.values())
    print(f"\n`stat` of a missing name through the mount: {stat:,.0f} per second (median of rounds).")


if __name__ == "__main__":
    what = sys.argv[1]
    if what == "report":
        report(sys.argv[2])
    else:
        fn = mount_phase if what == "mount" else native_phase
        print(json.dumps(fn(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))))
