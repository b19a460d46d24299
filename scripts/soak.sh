#!/usr/bin/env bash
# Soak test of `kvhoard serve`: CLIENTS connections (half lm://, half RESP) for DURATION s, mixed
# object sizes (64 KiB to 4 MiB, a few of 32 MiB), the server restarted every RESTART_EVERY
# seconds (SIGTERM and SIGKILL in turn), every byte read back checked. Prints errors, wrong
# bytes, p50/p99 latency and the server's peak resident memory against its budgets, and writes
# soak.json and soak.svg (memory and p99 over time) into OUT. Fails on any error, any wrong
# byte, or memory past the budgets.
#
#   scripts/soak.sh DIR              DIR: where the volume goes (on the disk to test)
#   CLIENTS=64 DURATION=600 RESTART_EVERY=120   (the defaults: the full soak; seconds)
#   CAPACITY=8GiB MAX_INFLIGHT=1GiB DRAM_TIER=512MiB
#   OUT=DIR                          where soak.json and soak.svg go (default: DIR)
#   BIN_DIR=target/debug             use kvhoard and soak already built there (scripts/test
#                                    does, after cargo test built them) instead of a release build
#
# scripts/test runs a short one (16 clients, 30 s, a restart every 10 s).
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:?usage: scripts/soak.sh DIR}
out=${OUT:-$dir}
if [ -n "${BIN_DIR:-}" ]; then
  bin=$BIN_DIR
else
  cargo build -q --release --locked -p kvhoard-tools -p kvhoard-tests --bin kvhoard --bin soak
  bin=target/release
fi
mkdir -p "$dir" "$out"
work=$(mktemp -d "$dir/soak.XXXXXX")
trap 'rm -rf "$work"' EXIT
"$bin/soak" \
  --kvhoard "$bin/kvhoard" \
  --dir "$work" \
  --clients "${CLIENTS:-64}" \
  --seconds "${DURATION:-600}" \
  --restart-every "${RESTART_EVERY:-120}" \
  --capacity "${CAPACITY:-8GiB}" \
  --max-inflight "${MAX_INFLIGHT:-1GiB}" \
  --dram-tier "${DRAM_TIER:-512MiB}" \
  --json "$out/soak.json" \
  --svg "$out/soak.svg"
