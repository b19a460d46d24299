#!/usr/bin/env bash
# kvhoard serve against LMCache's own lm:// server (`python -m lmcache.v1.server`), same client,
# same objects, same machine, measured in one run: GET throughput, p50/p99 latency and the
# server's CPU time per GB served, for 2 MiB and 32 MiB chunks. Servers measured, in turn:
#   lmcache-server   LMCache's server (a Python dict, a thread per connection)
#   kvhoard-dram     kvhoard serve with its DRAM tier (the like-for-like case: every GET a hit)
#   kvhoard-ssd      kvhoard serve with the DRAM tier off (every GET an O_DIRECT read)
#
#   scripts/bench-lmcache.sh DIR     DIR: where to put the volume (on the disk to measure)
#   CLIENTS="1 4"                    concurrent client connections to measure, one after the
#                                    other on the same server (default 1); the objects are
#                                    shared out among them, so every run moves the same bytes
#   SERVER_CPUS=0 CLIENT_CPUS=1-15   confine the servers and the clients to these CPUs
#                                    (taskset lists): the servers' own cost then decides
#   SERVERS="lmcache-server kvhoard-dram"   which servers to measure (default: all three)
#   ROUNDS=N                         repeat everything N times, alternating (default 1)
#
# Needs the LMCache environment (scripts/lmcache-interop.sh --install) and taskset (util-linux).
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:?usage: scripts/bench-lmcache.sh DIR}
venv=${KVHOARD_LMCACHE_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/kvhoard/lmcache-0.5.6}
py=$venv/bin/python
export LMCACHE_TRACK_USAGE=false
cargo build -q --release --locked -p kvhoard-tools
kvhoard=target/release/kvhoard
servers=${SERVERS:-lmcache-server kvhoard-dram kvhoard-ssd}
on_servers=(taskset -c "${SERVER_CPUS:-0-$(($(nproc) - 1))}")
on_clients=(taskset -c "${CLIENT_CPUS:-0-$(($(nproc) - 1))}")
pid=
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$dir/bench-lmcache"' EXIT

listening() { # PORT: waits until something accepts connections on it
  for _ in $(seq 300); do
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    sleep 0.1
  done
  echo "nothing listens on port $1" >&2
  return 1
}

start() { # SERVER PORT
  case $1 in
    lmcache-server) "${on_servers[@]}" "$py" -m lmcache.v1.server 127.0.0.1 "$2" cpu >/dev/null 2>&1 & ;;
    kvhoard-*)
      rm -rf "$dir/bench-lmcache"
      "$kvhoard" init "$dir/bench-lmcache" --capacity 8GiB >/dev/null
      local dram=4GiB
      [ "$1" = kvhoard-ssd ] && dram=0
      "${on_servers[@]}" "$kvhoard" serve "$dir/bench-lmcache" --lm "$2" --dram-tier "$dram" \
        ${SERVE_THREADS:+--threads "$SERVE_THREADS"} 2>/dev/null &
      ;;
  esac
  pid=$!
  listening "$2"
}

port=65500
for _ in $(seq "${ROUNDS:-1}"); do
  for spec in "2097152 128 4" "33554432 32 2"; do
    set -- $spec
    for server in $servers; do
      port=$((port + 1))
      start "$server" "$port"
      for clients in ${CLIENTS:-1}; do
        SERVER_PID=$pid "${on_clients[@]}" "$py" tests/lmcache/bench_lm.py 127.0.0.1 "$port" "$1" \
          $(($2 / clients)) "$3" "$server" "$clients"
      done
      kill -TERM "$pid"
      wait "$pid" 2>/dev/null || true
      pid=
    done
  done
done
