#!/usr/bin/env bash
# An unmodified LMCache 0.5.6 (from PyPI, CPU-only) against `kvhoard serve`:
#   - LMCache's own check, `python -m lmcache.v1.basic_check --mode test_remote`, over lm://;
#   - LMCache's RemoteBackend storing and loading chunk-shaped objects (32 MiB KV_2LTD bf16 and
#     2 MiB) over lm://, resp:// (native client) and redis:// (redis-py), bytes compared;
#   - the server stopped with SIGTERM and started again: LMCache still finds every object;
#   - the kvhoard Python package (tools/python) built into the environment: its tests (the
#     storage plugin through LMCache's own StorageManager and plugin launcher), the storage plugin
#     loading the chunks `kvhoard serve` stored over lm://, and `lmcache bench l2` driving
#     kvhoard.lmcache.NativePlugin with data verification;
#   - three, then six `kvhoard serve --cluster-config` nodes as one Redis Cluster
#     (docs/cluster.md): redis-py's RedisCluster, `redis-cli -c` and LMCache's redis-cluster://
#     connector storing and loading chunks byte for byte, keys spread within 10 % of even; one
#     node SIGKILLed while LMCache reads and writes (only chunks with a key on it are missed, no
#     wrong bytes), then started again on its volume (the same client finds every chunk); on
#     three nodes also: its slots reassigned on SIGHUP (the misses become quick), then the node
#     back under the first map (every chunk found again).
#
#   scripts/lmcache-interop.sh --install   create the Python environment (about 6 GB: torch
#                                          from PyPI bundles CUDA libraries; several minutes)
#   scripts/lmcache-interop.sh             run (skips, saying so, when the environment is missing)
#   scripts/lmcache-interop.sh cluster     only the redis-cluster:// part
#
#   KVHOARD_LMCACHE_VENV=DIR   where the environment lives (default ~/.cache/kvhoard/lmcache-0.5.6)
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${KVHOARD_LMCACHE_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/kvhoard/lmcache-0.5.6}
py=$venv/bin/python
export LMCACHE_TRACK_USAGE=false

if [ "${1:-}" = --install ]; then
  if "$py" -c 'import lmcache, torch, redis' 2>/dev/null; then
    "$venv/bin/pip" install -q "maturin>=1.5,<2" pytest
    echo "LMCache environment ready at $venv"
    exit 0
  fi
  rm -rf "$venv"
  mkdir -p "$(dirname "$venv")"
  python3 -m venv "$venv"
  # `pip install lmcache` alone spends many minutes resolving; pinning its dependencies is fast.
  "$venv/bin/pip" install -q --no-deps lmcache==0.5.6
  "$venv/bin/pip" install -q torch "numpy<=2.2.6" aiofiles aiofile pyyaml msgspec redis sortedcontainers \
    psutil "prometheus_client<=0.24.1" "opentelemetry-api==1.40.0" "opentelemetry-sdk==1.40.0" \
    "opentelemetry-exporter-prometheus==0.61b0" nvtx cachetools blake3 pyzmq py-cpuinfo numba \
    safetensors aiohttp httpx fastapi uvicorn cryptography requests "huggingface_hub>=1.5.0" awscrt \
    "grpcio>=1.78.0" "protobuf>=6.31.1,<7" httptools "transformers>=5.4" lmcache-rust-raw-block-io \
    "maturin>=1.5,<2" pytest
  "$py" -c 'import lmcache, torch, redis'
  echo "LMCache environment ready at $venv"
  exit 0
fi

if ! "$py" -c 'import lmcache' 2>/dev/null; then
  echo "lmcache interop: SKIPPED: no LMCache environment at $venv (create it with scripts/lmcache-interop.sh --install)"
  exit 0
fi

cargo build -q --locked -p kvhoard-tools
kvhoard=target/debug/kvhoard
work=$(mktemp -d)
server_pid=
node_pid=()
node_log=()
check_pid=
cleanup() {
  [ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null || true
  [ -n "$check_pid" ] && kill "$check_pid" 2>/dev/null || true
  for pid in "${node_pid[@]:-}"; do
    [ -n "$pid" ] && kill "$pid" 2>/dev/null || true
  done
  rm -rf "$work"
}
trap cleanup EXIT

# redis-cluster:// (LMCache's RedisClusterConnector on redis-py's RedisCluster) over N nodes
# sharing one slot map (docs/cluster.md). Node I serves $cdir/vol$I on port ${port[I]}.
start_node() { # INDEX
  local log=$cdir/node$1.$((++node_starts)).log
  "$kvhoard" serve "$cdir/vol$1" --resp "${port[$1]}" --cluster-config "$cdir/cluster.map" 2>"$log" &
  node_pid[$1]=$!
  node_log[$1]=$log
  for _ in $(seq 100); do
    grep -q "serving" "$log" 2>/dev/null && return
    sleep 0.1
  done
  cat "$log"
  echo "lmcache interop: FAILED: node $1 did not start"
  exit 1
}
stop_node() { # INDEX: SIGTERM; the volume must close cleanly
  kill -TERM "${node_pid[$1]}"
  wait "${node_pid[$1]}"
  node_pid[$1]=
  grep -q "volume closed" "${node_log[$1]}" || cluster_failed "node $1 did not close its volume"
  node_log[$1]=
}
reload() { # INDEX...: SIGHUP to those nodes, then wait until `cluster status` says all run the map
  for i in "$@"; do kill -HUP "${node_pid[$i]}"; done
  for _ in $(seq 100); do
    "$kvhoard" cluster status --config "$cdir/cluster.map" >/dev/null 2>&1 && return
    sleep 0.1
  done
  "$kvhoard" cluster status --config "$cdir/cluster.map"
  echo "lmcache interop: FAILED: the nodes did not take the new cluster map"
  exit 1
}
cluster_failed() { # WHAT
  cat "$cdir/check.log" "$cdir"/node*.log
  echo "lmcache interop: FAILED: $1"
  exit 1
}
run_cluster() { # MODE [ARGS...]
  (cd "$work" && timeout 300 "$py" -u "$OLDPWD/tests/lmcache/cluster_check.py" "$nodes" "$@" \
    >"$cdir/check.log" 2>&1) || cluster_failed "cluster_check.py $*"
  grep -E '^(ok|FAIL)|failure' "$cdir/check.log"
}
redis_cli_check() { # Debian's redis-cli in cluster mode: keys set through the first node land on all
  if ! command -v redis-cli >/dev/null 2>&1; then
    echo "== redis-cli -c: SKIPPED (no redis-cli; apt-get install redis-tools)"
    return
  fi
  local i before=() after=() cli=(redis-cli -c -h 127.0.0.1 -p "${port[1]}")
  for i in $(seq "$count"); do before[i]=$(redis-cli -p "${port[$i]}" DBSIZE); done
  for i in $(seq 60); do
    [ "$("${cli[@]}" SET "cli:$i" "value $i" | tail -n 1)" = OK ] || cluster_failed "redis-cli -c SET cli:$i"
    [ "$("${cli[@]}" GET "cli:$i" | tail -n 1)" = "value $i" ] || cluster_failed "redis-cli -c GET cli:$i"
  done
  for i in $(seq "$count"); do
    after[i]=$(redis-cli -p "${port[$i]}" DBSIZE)
    [ "${after[i]}" -gt "${before[i]}" ] || cluster_failed "redis-cli -c stored nothing on node $i"
  done
  redis-cli --cluster check "127.0.0.1:${port[1]}" >"$cdir/cli-check.log" 2>&1 || cluster_failed "redis-cli --cluster check"
  grep -q "All 16384 slots covered" "$cdir/cli-check.log" || cluster_failed "redis-cli --cluster check"
  for i in $(seq 60); do "${cli[@]}" DEL "cli:$i" >/dev/null; done
  echo "ok redis-cli -c: 60 keys set and read through one node, stored on all $count ($(for i in $(seq "$count"); do
    printf '%s ' $((after[i] - before[i])); done)); redis-cli --cluster check: all 16384 slots covered"
}
kill_midrun() { # INDEX: cluster_check.py SIGKILLs the node while LMCache reads; it comes back
  local down=127.0.0.1:${port[$1]}
  rm -f "$cdir/killed" "$cdir/back"
  (cd "$work" && exec timeout 300 "$py" -u "$OLDPWD/tests/lmcache/cluster_check.py" "$nodes" kill "$down" \
    "$cdir/cluster.map" "${node_pid[$1]}" "$cdir" >"$cdir/check.log" 2>&1) &
  check_pid=$!
  for _ in $(seq 3000); do
    [ -e "$cdir/killed" ] || ! kill -0 "$check_pid" 2>/dev/null && break
    sleep 0.1
  done
  [ -e "$cdir/killed" ] || cluster_failed "cluster_check.py kill: no kill"
  local rc=0
  wait "${node_pid[$1]}" || rc=$?
  node_pid[$1]=
  [ "$rc" = 137 ] || cluster_failed "node $1 ended with $rc, not by SIGKILL"
  start_node "$1"
  touch "$cdir/back"
  rc=0
  wait "$check_pid" || rc=$?
  check_pid=
  [ "$rc" = 0 ] || cluster_failed "cluster_check.py kill"
  grep -E '^(ok|FAIL)|failure' "$cdir/check.log"
}
cluster_interop() { # N: N nodes on loopback, each on its own volume
  count=$1
  cdir=$work/cluster$count
  mkdir -p "$cdir"
  port=()
  read -r -a port <<<"0 $("$py" -c 'import socket, sys
socks = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))' "$count")"
  nodes=$(for i in $(seq "$count"); do printf '127.0.0.1:%s,' "${port[$i]}"; done)
  nodes=${nodes%,}
  "$kvhoard" cluster init --nodes "$nodes" --out "$cdir/cluster-first.map" 2>/dev/null
  cp "$cdir/cluster-first.map" "$cdir/cluster.map"
  for i in $(seq "$count"); do
    "$kvhoard" init "$cdir/vol$i" --capacity 1GiB >/dev/null
    start_node "$i"
  done
  echo "== $count nodes as a Redis Cluster ($nodes): redis-py RedisCluster, LMCache redis-cluster:// store"
  run_cluster store
  redis_cli_check
  "$kvhoard" cluster status --config "$cdir/cluster.map"
  echo "== node 127.0.0.1:${port[2]} SIGKILLed while LMCache reads and writes, then started again on its volume"
  kill_midrun 2
  if [ "$count" = 3 ]; then
    echo "== node 127.0.0.1:${port[2]} stopped, its slots given to the other two (kvhoard cluster init --from, SIGHUP)"
    stop_node 2
    "$kvhoard" cluster init --from "$cdir/cluster-first.map" --nodes "127.0.0.1:${port[1]},127.0.0.1:${port[3]}" \
      --out "$cdir/cluster.map" --force 2>/dev/null
    reload 1 3
    run_cluster reassigned "127.0.0.1:${port[2]}" "$cdir/cluster-first.map"
    echo "== the node back on its volume, the first map again (a new epoch): every chunk is found"
    sed 's/^epoch .*/epoch 3/' "$cdir/cluster-first.map" >"$cdir/cluster.map"
    start_node 2
    reload 1 3
    run_cluster verify
  fi
  for i in $(seq "$count"); do
    stop_node "$i"
  done
}
cluster_all() {
  if "$py" -c 'import redis.cluster' 2>/dev/null; then
    node_starts=0
    cluster_interop 3
    cluster_interop 6
  else
    echo "== redis-cluster://: SKIPPED (redis-py's cluster client missing; run scripts/lmcache-interop.sh --install)"
  fi
}
if [ "${1:-}" = cluster ]; then
  cluster_all
  echo "lmcache interop (cluster part): passed"
  exit 0
fi
"$kvhoard" init "$work/vol" --capacity 2GiB >/dev/null

start() {
  # The three connectors store the same keys with the same bytes. RESP gets a namespace of its
  # own: a key's description is the key's own, so a RESP SET (no description) over an lm:// key
  # would make an lm:// GET of it a miss, as it should.
  "$kvhoard" serve "$work/vol" --lm 0 --resp 0 --resp-namespace lmcache-resp 2>"$work/serve.log" &
  server_pid=$!
  for _ in $(seq 100); do
    grep -q "serving" "$work/serve.log" 2>/dev/null && break
    sleep 0.1
  done
  lm=$(grep -o 'lm://[0-9.:]*' "$work/serve.log")
  resp=$(grep -o 'resp://[0-9.:]*' "$work/serve.log")
  redis=redis://${resp#resp://}
}

stop() {
  kill -TERM "$server_pid"
  wait "$server_pid"
  server_pid=
  grep -q "volume closed" "$work/serve.log" || { cat "$work/serve.log"; exit 1; }
}

run() {
  # LMCache logs a lot; show only our verdict lines unless something failed.
  if ! (cd "$work" && timeout 300 "$py" -u "$OLDPWD/tests/lmcache/interop.py" "$@" >"$work/py.log" 2>&1); then
    cat "$work/py.log"
    echo "lmcache interop: FAILED: interop.py $*"
    exit 1
  fi
  grep -E '^(ok|FAIL)|failure' "$work/py.log"
}

start
echo "== LMCache basic_check over $lm"
(cd "$work" && LMCACHE_REMOTE_URL=$lm timeout 300 "$py" -m lmcache.v1.basic_check --mode test_remote >"$work/check.log" 2>&1) || {
  cat "$work/check.log"
  exit 1
}
grep -E 'Validation' "$work/check.log"
if grep -E 'Validation' "$work/check.log" | grep -v '5/5'; then
  echo "lmcache interop: FAILED: basic_check"
  exit 1
fi
for url in "$lm" "$resp" "$redis"; do
  echo "== LMCache RemoteBackend over $url: store"
  run "$url" store 1
done
stop
start
for url in "$lm" "$resp" "$redis"; do
  echo "== after a restart, over $url: verify"
  run "$url" verify 1
done
stop

# fs:// (LMCache's FSConnector: 28-byte header + payload, .tmp then os.replace) on a kvhoard mount.
if [ -e /dev/fuse ] && [ "$(id -u)" = 0 ]; then
  "$kvhoard" init "$work/fsvol" --capacity 1GiB >/dev/null
  mkdir "$work/mnt"
  mount_fs() {
    "$kvhoard" mount "$work/fsvol" "$work/mnt" 2>"$work/mount.log" &
    server_pid=$!
    for _ in $(seq 100); do
      grep -q "mounted" "$work/mount.log" 2>/dev/null && break
      sleep 0.1
    done
  }
  mount_fs
  echo "== LMCache FSConnector over a kvhoard mount: store"
  run "fs://localhost:0$work/mnt/default" store 1
  kill -TERM "$server_pid"; wait "$server_pid"; server_pid=
  mount_fs
  echo "== after unmount and remount: verify"
  run "fs://localhost:0$work/mnt/default" verify 1
  kill -TERM "$server_pid"; wait "$server_pid"; server_pid=
else
  echo "== fs:// on a mount: SKIPPED (needs root and /dev/fuse)"
fi

if "$py" -c 'import maturin, pytest' 2>/dev/null; then
  echo "== the kvhoard Python package: build, tests"
  (cd tools/python && VIRTUAL_ENV=$venv PATH=$venv/bin:$PATH maturin develop --release --locked -q >"$work/maturin.log" 2>&1) || {
    cat "$work/maturin.log"
    echo "lmcache interop: FAILED: building the Python package"
    exit 1
  }
  "$py" -m pytest -q -p no:cacheprovider tests/python
  echo "== kvhoard.lmcache.StorageBackend loads the chunks stored over lm:// (same volume, serve stopped)"
  run "plugin:$work/vol" verify 1
  echo "== lmcache bench l2 with kvhoard.lmcache.NativePlugin (data verified)"
  adapter='{"type": "native_plugin", "module_path": "kvhoard.lmcache", "class_name": "NativePlugin",
    "adapter_params": {"path": "'$work/plugin'", "create": true, "capacity": 1073741824, "segment_size": 16777216}}'
  (cd "$work" && LMCACHE_DISABLE_BANNER=1 timeout 300 "$venv/bin/lmcache" bench l2 --l2-adapter "$adapter" \
    --num-keys 8 --data-size-kb 256 --rounds 2 --no-skip-verify --format json --output "$work/l2.json" \
    >"$work/l2.log" 2>&1) || {
    cat "$work/l2.log"
    echo "lmcache interop: FAILED: lmcache bench l2 with the native plugin"
    exit 1
  }
  "$py" tests/python/check_l2_bench.py "$work/l2.json"
else
  echo "== the Python package: SKIPPED (maturin or pytest missing; run scripts/lmcache-interop.sh --install)"
fi
cluster_all
echo "lmcache interop: passed"
