#!/bin/sh
# Smoke test of examples/c/remote_client.c: starts a chunkserve-worker on 127.0.0.1 with an
# ephemeral port, runs the example against it, and stops the worker.
#
#   run_remote_example.sh <chunkserve-worker> <chunkserve-example-c-remote>
set -eu
worker_bin=$1
example_bin=$2
out=$(mktemp)
"$worker_bin" --tiny-model --listen 127.0.0.1:0 --threads 1 --kv-cache-mb 32 > "$out" &
pid=$!
trap 'kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; rm -f "$out"' EXIT
port=""
for _ in $(seq 1 600); do
  port=$(sed -n 's/^listening on 127\.0\.0\.1:\([0-9]*\)$/\1/p' "$out")
  [ -n "$port" ] && break
  kill -0 "$pid" 2>/dev/null || { echo "the worker exited"; exit 1; }
  sleep 0.1
done
[ -n "$port" ] || { echo "the worker did not print its port"; exit 1; }
"$example_bin" 127.0.0.1 "$port"
