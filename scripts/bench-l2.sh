#!/usr/bin/env bash
# `lmcache bench l2` (LMCache's own L2 benchmark) over three adapters on the same directory, in
# one run: kvhoard's native plugin (kvhoard.lmcache.NativePlugin), LMCache's built-in `fs`
# adapter (one file per key; with and without O_DIRECT) and its `raw_block` adapter
# (lmcache-rust-raw-block-io, O_DIRECT on a pre-sized file, io_uring). Store and load throughput,
# and their ratios to kvhoard's, for 2 MiB and 32 MiB keys. Buffers are 4 KiB-aligned for all.
#
#   scripts/bench-l2.sh DIR       DIR: a directory on the disk to measure
#   ADAPTERS="raw_block fs-odirect fs kvhoard" scripts/bench-l2.sh DIR    the reverse order
#
# LMCache's benchmark fills each key's buffer with one byte, (key index) mod 256, and repeats the
# same keys' bytes in every round: kvhoard stores identical bytes once, so with several rounds
# most of its "stores" would be deduplicated. One measured round, no warmup, and at most 256
# keys keep every stored buffer distinct. Without O_DIRECT the fs adapter's loads read what the
# store phase just wrote from the page cache, not from the disk: that row measures memory, and
# is shown for what users get by default.
# Needs the LMCache environment with the package built (scripts/lmcache-interop.sh --install,
# then scripts/lmcache-interop.sh once).
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:?usage: scripts/bench-l2.sh DIR}
venv=${KVHOARD_LMCACHE_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/kvhoard/lmcache-0.5.6}
export LMCACHE_TRACK_USAGE=false LMCACHE_DISABLE_BANNER=1
"$venv/bin/python" -c 'import kvhoard.lmcache, lmcache_rust_raw_block_io' || {
  echo "needs the LMCache environment with kvhoard built into it (see the header of this script)" >&2
  exit 1
}
# The order the adapters run in: this disk drifts, so alternate it between runs (kvhoard must be
# among them; the ratios are to it).
adapters=${ADAPTERS:-kvhoard fs fs-odirect raw_block}
case " $adapters " in *" kvhoard "*) ;; *) echo "ADAPTERS must include kvhoard" >&2; exit 2 ;; esac
work=$dir/bench-l2
out=$(mktemp -d)
trap 'rm -rf "$work" "$out"' EXIT

run() { # LABEL SIZE_KB KEYS ROUNDS ADAPTER_JSON
  rm -rf "$work" && mkdir -p "$work"
  # raw_block needs its file (or device) to exist at its full size.
  [ "$1" = raw_block ] && truncate -s "$bytes" "$work/raw"
  if ! (cd "$out" && timeout 600 "$venv/bin/lmcache" bench l2 --l2-adapter "$5" --num-keys "$3" \
    --data-size-kb "$2" --rounds "$4" --warmup-rounds 0 --l1-align-bytes 4096 --format json \
    --output "$out/$1-$2.json" >"$out/$1-$2.log" 2>&1); then
    tail -20 "$out/$1-$2.log" >&2
    echo "lmcache bench l2 failed for $1 ($2 KiB)" >&2
    exit 1
  fi
}

for spec in "2048 256 1" "32768 32 1"; do
  set -- $spec
  bytes=$(($1 * 1024 * $2 * 2 + (1 << 30)))
  # (SIZE_KB KEYS ROUNDS): 512 MiB and 1 GiB per adapter, every key's bytes distinct.
  for adapter in $adapters; do
    case $adapter in
      kvhoard) run kvhoard "$@" '{"type": "native_plugin", "module_path": "kvhoard.lmcache", "class_name": "NativePlugin",
        "adapter_params": {"path": "'$work/vol'", "create": true, "capacity": '$bytes'}}' ;;
      fs) run fs "$@" '{"type": "fs", "base_path": "'$work'"}' ;;
      fs-odirect) run fs-odirect "$@" '{"type": "fs", "base_path": "'$work'", "use_odirect": true}' ;;
      raw_block) run raw_block "$@" '{"type": "raw_block", "device_path": "'$work/raw'", "slot_bytes": '$(($1 * 1024 + 4096))',
        "capacity_bytes": '$bytes', "io_engine": "io_uring", "meta_total_bytes": 16777216}' ;;
      *) echo "unknown adapter $adapter in ADAPTERS (kvhoard, fs, fs-odirect, raw_block)" >&2; exit 2 ;;
    esac
  done
done

"$venv/bin/python" - "$out" <<'EOF'
import json, pathlib, sys

rows = {}
for f in sorted(pathlib.Path(sys.argv[1]).glob("*.json")):
    label, size = f.stem.rsplit("-", 1)
    ops = {m["operation"]: m for k, m in json.load(open(f))["metrics"].items() if k.startswith("op_")}
    rows[(int(size), label)] = {op: ops[op]["throughput_avg_mbps"] for op in ("Store", "Load")}
print("| key size | adapter | store MB/s | load MB/s | kvhoard / adapter, store | kvhoard / adapter, load |")
print("|---|---|---|---|---|---|")
for size in sorted({s for s, _ in rows}):
    ours = rows[(size, "kvhoard")]
    for label in ("kvhoard", "fs", "fs-odirect", "raw_block"):
        r = rows.get((size, label))
        if r is None:
            continue
        ratio = "" if label == "kvhoard" else \
            f"{ours['Store'] / r['Store']:.2f}× | {ours['Load'] / r['Load']:.2f}×"
        print(f"| {size // 1024} MiB | {label} | {r['Store']:.0f} | {r['Load']:.0f} | {ratio or ' | '} |")
EOF
