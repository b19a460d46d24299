#!/usr/bin/env bash
# kvhoard serve against LMCache's own lm:// server (`python -m lmcache.v1.server`), same client,
# same objects, same machine, measured in one run: GET throughput and p50/p99 latency for 2 MiB
# and 32 MiB chunks. kvhoard is measured twice: with its DRAM tier (LMCache's server keeps
# everything in a Python dict, so this is the like-for-like case) and with the DRAM tier off
# (every GET read from the volume with O_DIRECT).
#
#   scripts/bench-lmcache.sh DIR     DIR: where to put the volume (on the disk to measure)
#   CLIENTS="1 4"                    concurrent client connections to measure, one after the
#                                    other on the same server (default 1); the objects are
#                                    shared out among them, so every run moves the same bytes
#
# Needs the LMCache environment (scripts/lmcache-interop.sh --install).
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:?usage: scripts/bench-lmcache.sh DIR}
venv=${KVHOARD_LMCACHE_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/kvhoard/lmcache-0.5.6}
py=$venv/bin/python
export LMCACHE_TRACK_USAGE=false
cargo build -q --release --locked -p kvhoard-tools
kvhoard=target/release/kvhoard
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true; rm -rf "$dir/bench-lmcache"' EXIT
rm -rf "$dir/bench-lmcache"

serve_kvhoard() { # PORT DRAM
  rm -rf "$dir/bench-lmcache"
  "$kvhoard" init "$dir/bench-lmcache" --capacity 8GiB >/dev/null
  "$kvhoard" serve "$dir/bench-lmcache" --lm "$1" --dram-tier "$2" ${SERVE_THREADS:+--threads "$SERVE_THREADS"} 2>/dev/null &
  pids+=($!)
  sleep 1
}

bench() { # PORT SIZE COUNT ROUNDS LABEL
  for clients in ${CLIENTS:-1}; do
    "$py" tests/lmcache/bench_lm.py 127.0.0.1 "$1" "$2" $(($3 / clients)) "$4" "$5" "$clients"
  done
}

for spec in "2097152 128 4" "33554432 32 2"; do
  set -- $spec
  "$py" -m lmcache.v1.server 127.0.0.1 65501 cpu >/dev/null 2>&1 &
  pids+=($!)
  sleep 4
  bench 65501 "$1" "$2" "$3" lmcache-server
  kill "${pids[-1]}"; wait "${pids[-1]}" 2>/dev/null || true
  serve_kvhoard 65502 4GiB
  bench 65502 "$1" "$2" "$3" kvhoard-dram
  kill -TERM "${pids[-1]}"; wait "${pids[-1]}" 2>/dev/null || true
  serve_kvhoard 65503 0
  bench 65503 "$1" "$2" "$3" kvhoard-ssd
  kill -TERM "${pids[-1]}"; wait "${pids[-1]}" 2>/dev/null || true
done
