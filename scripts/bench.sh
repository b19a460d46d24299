#!/usr/bin/env bash
# Measures kvhoard against the disk it runs on, in one run: fio's O_DIRECT io_uring baseline
# (../shared/tools/disk-baseline.sh, or DISK_BASELINE=path) before and after kvhoard's own
# benchmark, for several block sizes and thread counts. Prints a Markdown table with ratios.
#
#   scripts/bench.sh [DIR] [TOTAL]      defaults: a directory under /var/tmp, 2GiB
#   BACKEND=io_uring|pread              the engine's I/O backend (default io_uring)
#   BATCH=N                             blocks per put call (default 1; LMCache stores in batches)
#   ONLY=disk                           only the first table (against fio)
#   SIZES="2MiB"                        block sizes of the first table (default 64KiB 2MiB 32MiB)
#
# The first table also runs fio's write once more with a final fsync (--end_fsync=1): the
# engine's put figure includes a final sync, and on a disk with a volatile write cache fio
# without one measures how fast the cache absorbs writes, not how fast they become durable.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-/var/tmp/kvhoard-bench}
total=${2:-2GiB}
baseline=${DISK_BASELINE:-../shared/tools/disk-baseline.sh}
mkdir -p "$dir"
cargo build --release -q -p kvhoard-tools
kv=target/release/kvhoard

base() { bash "$baseline" "$dir" "$1" 2g 32; }
durable() { # block size -> MB/s of fio's O_DIRECT writes (queue depth 32) including a final fsync
  local file="$dir/.durable-baseline.$$"
  fio --name=durable --filename="$file" --size=2g --bs="$1" --rw=write --direct=1 --ioengine=io_uring \
      --iodepth=32 --numjobs=1 --end_fsync=1 --output-format=json 2>/dev/null |
    python3 -c 'import json,sys; print(round(json.load(sys.stdin)["jobs"][0]["write"]["bw_bytes"]/1e6,1))'
  rm -f "$file"
}
field() { python3 -c 'import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])' "$1" "$2"; }

echo "backend: ${BACKEND:-io_uring}"
echo
echo "batch: ${BATCH:-1} block(s) per put call; put = until durable (final sync included), acked = until the last put returned (fio's writes have no fsync)"
echo
echo "| block | threads | put MB/s | acked MB/s | get MB/s | disk write MB/s | disk write+fsync MB/s | disk read MB/s | put / disk | acked / disk | put / disk+fsync | get / disk | get p50 µs | get p99 µs | CPU s/GB |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
for bs in ${SIZES:-64KiB 2MiB 32MiB}; do
  fio_bs=$(echo "$bs" | sed 's/KiB/k/; s/MiB/m/')
  b1=$(base "$fio_bs")
  for threads in 1 4; do
    r=$("$kv" bench "$dir/vol" --block-size "$bs" --total "$total" --threads "$threads" --batch "${BATCH:-1}" \
      --io-backend "${BACKEND:-io_uring}" --json)
    d=$(durable "$fio_bs")
    b2=$(base "$fio_bs")
    w=$(python3 -c 'import json,sys; a,b=json.loads(sys.argv[1]),json.loads(sys.argv[2]); print(round((a["write_mbps"]+b["write_mbps"])/2,1))' "$b1" "$b2")
    rd=$(python3 -c 'import json,sys; a,b=json.loads(sys.argv[1]),json.loads(sys.argv[2]); print(round((a["read_mbps"]+b["read_mbps"])/2,1))' "$b1" "$b2")
    put=$(field "$r" put_mbps); acked=$(field "$r" put_acked_mbps); get=$(field "$r" get_mbps)
    printf '| %s | %s | %s | %s | %s | %s | %s | %s | %.2f | %.2f | %.2f | %.2f | %s | %s | %s |\n' "$bs" "$threads" "$put" "$acked" "$get" \
      "$w" "$d" "$rd" "$(python3 -c "print($put/$w)")" "$(python3 -c "print($acked/$w)")" "$(python3 -c "print($put/$d)")" \
      "$(python3 -c "print($get/$rd)")" \
      "$(field "$r" get_p50_us)" "$(field "$r" get_p99_us)" "$(field "$r" cpu_seconds_per_gb)"
    b1=$b2
  done
done

[ "${ONLY:-}" = disk ] && exit 0
echo
echo "One file per block in the same directory (O_DIRECT, same threads and durability):"
echo
echo "| block | threads | put MB/s | files put MB/s | get MB/s | files get MB/s | put / files | get / files |"
echo "|---|---|---|---|---|---|---|---|"
for bs in 64KiB 2MiB; do
  for threads in 1 4; do
    r=$("$kv" bench "$dir/vol" --block-size "$bs" --total "$total" --threads "$threads" --io-backend "${BACKEND:-io_uring}" --compare-files --json)
    printf '| %s | %s | %s | %s | %s | %s | %s | %s |\n' "$bs" "$threads" "$(field "$r" put_mbps)" "$(field "$r" files_put_mbps)" \
      "$(field "$r" get_mbps)" "$(field "$r" files_get_mbps)" "$(field "$r" put_vs_files)" "$(field "$r" get_vs_files)"
  done
done

echo
echo "DRAM tier (every block resident; each get copies into the caller's buffer):"
echo
echo "| block | threads | get MB/s | get MB/s per thread | get p50 µs | get p99 µs | get CPU s/GB |"
echo "|---|---|---|---|---|---|---|"
for bs in 64KiB 2MiB 32MiB; do
  for threads in 1 2; do
    r=$("$kv" bench "$dir/vol" --block-size "$bs" --total "$total" --threads "$threads" --tier dram --json)
    printf '| %s | %s | %s | %s | %s | %s | %s |\n' "$bs" "$threads" "$(field "$r" get_mbps)" "$(field "$r" get_mbps_per_thread)" \
      "$(field "$r" get_p50_us)" "$(field "$r" get_p99_us)" "$(field "$r" get_cpu_seconds_per_gb)"
  done
done
