#!/usr/bin/env bash
# One command: a chunkserve-router and N chunkserve-workers (built-in tiny model) on 127.0.0.1,
# the shared-prompt workload (plus its no-sharing control) replayed through chunkserve-loadgen,
# per-worker hit rates printed, everything shut down cleanly. Builds nothing: uses BIN.
#
#   examples/cluster/run_local_cluster.sh                     # ttft policy, 4 workers
#   POLICIES="ttft round_robin least_loaded" examples/cluster/run_local_cluster.sh
#   BIN=build-rel/bin WORKERS=2 REQUESTS=40 examples/cluster/run_local_cluster.sh
#
# Environment (all optional):
#   BIN        directory with chunkserve-router/-worker/-loadgen   (default: build/bin)
#   WORKERS    worker processes                                  (default: 4)
#   POLICIES   router policies, one fresh cluster each            (default: ttft)
#   ROUTER_PORT / HTTP_PORT   router ports; 0 = ephemeral        (default: 0)
#   THREADS    CPU threads per worker                            (default: 1)
#   KV_MB      KV arena per worker in MiB                        (default: 128)
#   LOADGEN_ARGS  extra chunkserve-loadgen flags (workload shape); the default is a small load
#              for a 2-core machine
#   OUT        directory for logs and JSON results               (default: a temp dir)
#   QUICK=1    a short smoke run: 2 workers, 32 MiB KV, 16 requests (each default above still
#              yields to an explicit setting); the ctest `router.local_cluster_quick` uses it
#
# Every process it starts is listed (one pid a line) in $OUT/pids; all of them are gone when
# the script returns, whatever the exit path (errors, Ctrl-C, SIGTERM).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
BIN="${BIN:-$here/../../build/bin}"
if [[ "${QUICK:-0}" == 1 ]]; then
  WORKERS="${WORKERS:-2}"
  KV_MB="${KV_MB:-32}"
  LOADGEN_ARGS="${LOADGEN_ARGS:---requests 16 --rate 8 --tenants 3 --zipf 1.0 --prefix-tokens 256,192 --suffix-tokens 8,16 --output-tokens 4,8 --connections 2 --seed 7}"
fi
WORKERS="${WORKERS:-4}"
POLICIES="${POLICIES:-ttft}"
ROUTER_PORT="${ROUTER_PORT:-0}"
HTTP_PORT="${HTTP_PORT:-0}"
THREADS="${THREADS:-1}"
KV_MB="${KV_MB:-128}"
LOADGEN_ARGS="${LOADGEN_ARGS:---requests 120 --rate 6 --tenants 8 --zipf 1.0 --prefix-tokens 384,256,512,320 --suffix-tokens 16,48 --output-tokens 8,24 --connections 4 --seed 7}"
OUT="${OUT:-$(mktemp -d -t chunkserve-cluster.XXXXXX)}"
mkdir -p "$OUT"
: >"$OUT/pids"

for b in chunkserve-router chunkserve-worker chunkserve-loadgen; do
  if [[ ! -x "$BIN/$b" ]]; then
    echo "missing $BIN/$b: build it first (cmake --build build --target $b) or set BIN" >&2
    exit 1
  fi
done

pids=()
started() {  # records the last background process
  pids+=($!)
  echo "$!" >>"$OUT/pids"
}
cleanup() {
  # SIGTERM: workers drain, the router ends its requests; then reap (SIGKILL after 20 s).
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do
    for _ in $(seq 200); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  pids=()
}
trap cleanup EXIT
trap 'exit 130' INT TERM  # exit runs the EXIT trap: everything is shut down

# Waits until FILE contains a line starting with PREFIX; prints the HOST:PORT after it.
wait_for_line() {
  local file="$1" prefix="$2" pid="$3"
  for _ in $(seq 600); do
    if line="$(grep -m1 "^$prefix" "$file" 2>/dev/null)"; then
      echo "${line#"$prefix"}"
      return 0
    fi
    kill -0 "$pid" 2>/dev/null || { echo "process $pid exited; see $file" >&2; return 1; }
    sleep 0.1
  done
  echo "timed out waiting for '$prefix' in $file" >&2
  return 1
}

metric() {  # metric HTTP_ADDR SERIES
  local host="${1%:*}" port="${1##*:}"
  exec 3<>"/dev/tcp/$host/$port"
  printf 'GET /metrics HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n' "$host" >&3
  grep -F "$2 " <&3 | grep -v "^#" | awk '{print $2}' | head -1
  exec 3<&-
}

for policy in $POLICIES; do
  echo "=== policy $policy: router + $WORKERS workers (tiny model, $THREADS thread(s) each)"
  "$BIN/chunkserve-router" --listen "127.0.0.1:$ROUTER_PORT" --http "127.0.0.1:$HTTP_PORT" \
      --policy "$policy" >"$OUT/router-$policy.log" 2>&1 &
  started
  router_addr="$(wait_for_line "$OUT/router-$policy.log" "listening on " "${pids[-1]}")"
  http_addr="$(wait_for_line "$OUT/router-$policy.log" "http on " "${pids[-1]}")"
  echo "router on $router_addr, metrics on http://$http_addr/metrics"
  for i in $(seq 0 $((WORKERS - 1))); do
    "$BIN/chunkserve-worker" --tiny-model --listen 127.0.0.1:0 --http 127.0.0.1:0 --threads "$THREADS" \
        --kv-cache-mb "$KV_MB" --worker-id "worker-$i" --router "$router_addr" \
        >"$OUT/worker-$i-$policy.log" 2>&1 &
    started
  done
  for _ in $(seq 600); do
    alive="$(metric "$http_addr" chunkserve_router_workers_alive || true)"
    [[ "${alive%.*}" == "$WORKERS" ]] && break
    sleep 0.1
  done
  if [[ "${alive%.*}" != "$WORKERS" ]]; then
    echo "only ${alive:-0} of $WORKERS workers registered; logs in $OUT" >&2
    exit 1
  fi
  # shellcheck disable=SC2086
  # In the background so that a signal interrupts `wait` at once (bash runs traps only after a
  # foreground child ends) and cleanup stops loadgen too; set -e exits on its failure.
  "$BIN/chunkserve-loadgen" --target "$router_addr" --metrics "$http_addr" --label "$policy" \
      --json "$OUT/result-$policy.json" $LOADGEN_ARGS &
  started
  wait "$!"
  cleanup
done
echo "logs and JSON results in $OUT"
