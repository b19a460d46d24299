#!/usr/bin/env bash
# The FUSE mount against the native engine on the same volume, in one run: 32 MiB block files
# written the way LMCache's fs connector writes them (NAME.tmp, write, close, os.replace) and
# read back sequentially (16 MiB reads, one reader); then the same number of blocks put and read
# back by one thread through the engine's Python API on the same volume (`Store.put`,
# `Store.get_into`). Rounds alternate mount and native so that drift of the disk hits both; the
# ratios the mount's bars are stated in are given per round and as the median. Also the rate of
# `stat` on missing names.
#
#   scripts/bench-fuse.sh DIR [TOTAL_MIB] [ROUNDS]
#       DIR: a directory on the disk to measure (needs root and /dev/fuse); TOTAL_MIB: data per
#       phase (512); ROUNDS: 3. Needs the Python package (built by scripts/lmcache-interop.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:?usage: scripts/bench-fuse.sh DIR [TOTAL_MIB] [ROUNDS]}
total_mib=${2:-512}
rounds=${3:-3}
venv=${KVHOARD_LMCACHE_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/kvhoard/lmcache-0.5.6}
py=$venv/bin/python
"$py" -c 'import kvhoard' || { echo "needs the Python package: run scripts/lmcache-interop.sh once" >&2; exit 1; }
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
"$kvhoard" init "$work/vol" --capacity "$((total_mib * 2 * rounds + 1024))MiB" >/dev/null

for round in $(seq "$rounds"); do
  "$kvhoard" mount "$work/vol" "$work/mnt" --dram-tier 0 2>"$work/mount.log" &
  mount_pid=$!
  for _ in $(seq 100); do
    grep -q "mounted" "$work/mount.log" 2>/dev/null && break
    sleep 0.1
  done
  grep -q "mounted" "$work/mount.log" || { cat "$work/mount.log"; exit 1; }
  "$py" tests/python/bench_fuse.py mount "$work/mnt/default" "$total_mib" "$round" >>"$work/results.jsonl"
  kill -TERM "$mount_pid" && wait "$mount_pid"
  mount_pid=
  "$py" tests/python/bench_fuse.py native "$work/vol" "$total_mib" "$round" >>"$work/results.jsonl"
done
"$py" tests/python/bench_fuse.py report "$work/results.jsonl"
