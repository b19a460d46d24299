#!/usr/bin/env bash
# An unmodified LMCache 0.5.6 (from PyPI, CPU-only) against `kvhoard serve`:
#   - LMCache's own check, `python -m lmcache.v1.basic_check --mode test_remote`, over lm://;
#   - LMCache's RemoteBackend storing and loading chunk-shaped objects (32 MiB KV_2LTD bf16 and
#     2 MiB) over lm://, resp:// (native client) and redis:// (redis-py), bytes compared;
#   - the server stopped with SIGTERM and started again: LMCache still finds every object;
#   - the kvhoard Python package (tools/python) built into the environment: its tests (the
#     storage plugin through LMCache's own StorageManager and plugin launcher), the storage plugin
#     loading the chunks `kvhoard serve` stored over lm://, and `lmcache bench l2` driving
#     kvhoard.lmcache.NativePlugin with data verification.
#
#   scripts/lmcache-interop.sh --install   create the Python environment (about 6 GB: torch
#                                          from PyPI bundles CUDA libraries; several minutes)
#   scripts/lmcache-interop.sh             run (skips, saying so, when the environment is missing)
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
cleanup() {
  [ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
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
echo "lmcache interop: passed"
