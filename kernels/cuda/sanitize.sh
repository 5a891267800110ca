#!/usr/bin/env bash
# Runs the CUDA kernel tests (and the CUDA backend's, with memcheck) under compute-sanitizer:
# memcheck (out-of-bounds and misaligned accesses, with the arena's unused rows and the rows past
# a task's last never touched), racecheck (shared-memory hazards between the cp.async stages, the
# slice merge and ldmatrix reads), initcheck (the merge kernel must read only partials some task
# wrote) and synccheck (barrier misuse). The tools run side by side (one process each), each over
# the decode and prefill cases that cover every dtype, head dim, chunk size and GQA ratio of the
# test parameters (random trees, full sharing, split-KV, cached prefixes, batches), the plan-step
# and error tests. Not a ctest: it needs a GPU and takes minutes. Usage:
#   kernels/cuda/sanitize.sh [build-dir]        (default: build)
# Exit status: non-zero when a tool reports an error or a test fails. Each run's log is printed.
set -uo pipefail
build="${1:-build}"
test_bin="$build/bin/chunkserve_kernels_cuda_test"
backend_bin="$build/bin/chunkserve_cuda_backend_test"
sanitizer="${COMPUTE_SANITIZER:-/usr/local/cuda/bin/compute-sanitizer}"
[[ -x "$test_bin" ]] || { echo "sanitize.sh: $test_bin not built" >&2; exit 2; }
[[ -x "$sanitizer" ]] || { echo "sanitize.sh: $sanitizer not found" >&2; exit 2; }
logs="$(mktemp -d)"
trap 'rm -rf "$logs"' EXIT

attention='Kernels/CudaDecodeTest.RandomTreeMatchesReference/*:'
attention+='Kernels/CudaDecodeTest.FullSharingNoPrivateTokens/*:'
attention+='Kernels/CudaDecodeTest.LongPrivateContextSplitsKv/*:'
attention+='Kernels/CudaPrefillTest.SuffixAfterCachedPrefix/*:'
attention+='Kernels/CudaPrefillTest.BatchOfSequences/*:'
attention+='CudaDecodeStepsTest.*:CudaAttentionErrorsTest.*'
ops='Kernels/CudaModelOpsTest.*:CudaSamplingTest.*'

pids=()
names=()
run() {  # run NAME TOOL BINARY FILTER
  local name="$1" tool="$2" bin="$3" filter="$4"
  "$sanitizer" --tool "$tool" --error-exitcode 1 --print-limit 20 \
      "$bin" --gtest_filter="$filter" --gtest_brief=1 > "$logs/$name.log" 2>&1 &
  pids+=($!)
  names+=("$name")
}
for tool in memcheck racecheck initcheck synccheck; do
  run "attention-$tool" "$tool" "$test_bin" "$attention"
done
run "model-ops-memcheck" memcheck "$test_bin" "$ops"
[[ -x "$backend_bin" ]] && run "backend-memcheck" memcheck "$backend_bin" '*'

status=0
for i in "${!pids[@]}"; do
  wait "${pids[$i]}"
  rc=$?
  echo "== ${names[$i]}: exit $rc"
  grep -vE '^\[ seed|^Running main' "$logs/${names[$i]}.log" | tail -40
  [[ $rc -eq 0 ]] || status=1
done
exit $status
