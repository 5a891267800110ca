#!/usr/bin/env bash
# ctest router.local_cluster_quick: examples/cluster/run_local_cluster.sh in its QUICK mode
# (router + 2 workers + loadgen, 16 requests) against this build's binaries. Passes when the
# script exits 0, prints the per-worker hit-rate table for both phases with every worker in
# it, and every process it started is gone afterwards (no orphans).
#
#   local_cluster_test.sh SCRIPT BIN_DIR
set -uo pipefail
script="$1"
bin="$2"
out="$(mktemp -d -t chunkserve-cluster-test.XXXXXX)"
trap 'rm -rf "$out"' EXIT
fail() {
  echo "FAIL: $*"
  for f in "$out"/*.log; do [[ -f "$f" ]] && { echo "--- $f"; tail -20 "$f"; }; done
  exit 1
}

QUICK=1 BIN="$bin" OUT="$out" bash "$script" >"$out/stdout.txt" 2>&1
rc=$?
cat "$out/stdout.txt"
[[ $rc == 0 ]] || fail "run_local_cluster.sh exited $rc"

# The per-worker table: a header per phase, then "  worker-N  <routed>  <hit>%" per worker the
# router has routed to so far (the control phase comes second: 16 unique prompts spread by
# rendezvous placement, so both workers are listed by then; all on one has odds 2^-15).
for phase in shared control; do
  header="$(grep -n "^per worker (.*$phase.*): routed, hit rate" "$out/stdout.txt" | head -1)"
  [[ -n "$header" ]] || fail "no per-worker table for the $phase phase"
  line="${header%%:*}"
  rows="$(tail -n "+$((line + 1))" "$out/stdout.txt" | grep -E '^  ' | head -2)"
  grep -Eq "^  worker-[01] +[0-9]+ +[0-9]+\.[0-9]%$" <<<"$rows" || fail "no $phase rows"
  if [[ $phase == control ]]; then
    for w in worker-0 worker-1; do
      grep -Eq "^  $w +[0-9]+ +[0-9]+\.[0-9]%$" <<<"$rows" || fail "no $phase row for $w"
    done
  fi
done
routed="$(awk '/^per worker \(.*shared.*\)/ {on=1; next} on && /^  worker-/ {s += $2} on && !/^  worker-/ {on=0} END {print s + 0}' "$out/stdout.txt")"
[[ "$routed" -ge 16 ]] || fail "the shared phase routed $routed requests, expected >= 16"

# No orphans: router, 2 workers and loadgen were started, and none is left.
n="$(wc -l <"$out/pids")"
[[ "$n" == 4 ]] || fail "expected 4 started processes, $out/pids lists $n"
while read -r pid; do
  if kill -0 "$pid" 2>/dev/null; then
    ps -o pid,args -p "$pid" || true
    kill -KILL "$pid" 2>/dev/null || true
    fail "process $pid is still running after the script returned"
  fi
done <"$out/pids"
echo "PASS"
