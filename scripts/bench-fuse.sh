#!/usr/bin/env bash
# The FUSE mount against the native engine on the same disk, in one run: 32 MiB block files
# written the way LMCache's fs connector writes them (NAME.tmp, write, close, os.replace) and
# read back sequentially (16 MiB reads, one reader), then `kvhoard bench` with the same block
# size, total and one thread. Prints MB/s and the ratios the mount's bars are stated in, and the
# rate of `stat` on missing names.
#
#   scripts/bench-fuse.sh DIR [TOTAL_MIB]     DIR: a directory on the disk to measure (needs root
#                                            and /dev/fuse); TOTAL_MIB: data per phase (768)
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:?usage: scripts/bench-fuse.sh DIR [TOTAL_MIB]}
total_mib=${2:-768}
cargo build -q --release --locked -p kvhoard-tools
kvhoard=target/release/kvhoard
work=$dir/bench-fuse
mount_pid=
cleanup() {
  [ -n "$mount_pid" ] && kill -TERM "$mount_pid" 2>/dev/null && wait "$mount_pid" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
rm -rf "$work" && mkdir -p "$work/mnt"
capacity=$((total_mib * 3 + 1024))MiB
"$kvhoard" init "$work/vol" --capacity "$capacity" >/dev/null
"$kvhoard" mount "$work/vol" "$work/mnt" --dram-tier 0 2>"$work/mount.log" &
mount_pid=$!
for _ in $(seq 100); do
  grep -q "mounted" "$work/mount.log" 2>/dev/null && break
  sleep 0.1
done
grep -q "mounted" "$work/mount.log" || { cat "$work/mount.log"; exit 1; }

python3 - "$work/mnt/default" "$total_mib" >"$work/fuse.json" <<'EOF'
import json, os, sys, time

base, total_mib = sys.argv[1], int(sys.argv[2])
size = 32 << 20
count = total_mib * (1 << 20) // size
payload = os.urandom(size)
t = time.perf_counter()
for i in range(count):
    tmp = f"{base}/model@1@0@{i:x}@bfloat16.tmp"
    with open(tmp, "wb") as f:
        f.write(payload[i:] + payload[:i])
    os.replace(tmp, tmp[:-4])
write = count * size / (time.perf_counter() - t) / 1e6
buf = bytearray(16 << 20)
t = time.perf_counter()
for i in range(count):
    with open(f"{base}/model@1@0@{i:x}@bfloat16", "rb", buffering=0) as f:
        n = 0
        while (r := f.readinto(buf)) > 0:
            n += r
        assert n == size, (i, n)
read = count * size / (time.perf_counter() - t) / 1e6
probes = 20000
t = time.perf_counter()
for i in range(probes):
    try:
        os.stat(f"{base}/missing-{i}")
    except FileNotFoundError:
        pass
stat_rate = probes / (time.perf_counter() - t)
print(json.dumps({"write_mbps": write, "read_mbps": read, "missing_stat_per_s": stat_rate}))
EOF
kill -TERM "$mount_pid" && wait "$mount_pid"
mount_pid=
"$kvhoard" bench "$work/native" --block-size 32MiB --total "${total_mib}MiB" --threads 1 --json >"$work/native.json"

python3 - "$work/fuse.json" "$work/native.json" <<'EOF'
import json, sys

fuse, native = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
print("| | through the mount | native | ratio | bar |")
print("|---|---|---|---|---|")
print(f"| write (create, write, close, rename) | {fuse['write_mbps']:.0f} MB/s | put {native['put_mbps']:.0f} MB/s "
      f"| {fuse['write_mbps'] / native['put_mbps']:.2f} | ≥ 0.5 |")
print(f"| sequential read | {fuse['read_mbps']:.0f} MB/s | get {native['get_mbps']:.0f} MB/s "
      f"| {fuse['read_mbps'] / native['get_mbps']:.2f} | ≥ 0.7 |")
print(f"| `stat` of a missing name | {fuse['missing_stat_per_s']:,.0f} per second | | | reported |")
EOF
