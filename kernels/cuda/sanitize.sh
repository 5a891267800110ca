#!/usr/bin/env bash
# Runs the CUDA kernel tests under compute-sanitizer: memcheck (out-of-bounds and misaligned
# accesses, with the arena's unused rows and the rows past a task's last never touched),
# racecheck (shared-memory hazards between the cp.async stages, the slice merge and ldmatrix
# reads), initcheck (the merge kernel must read only partials some task wrote) and synccheck
# (barrier misuse). Not a ctest: it needs a GPU and takes minutes. Usage:
#   kernels/cuda/sanitize.sh [build-dir]        (default: build)
# Exit status: non-zero when a tool reports an error or a test fails.
set -euo pipefail
build="${1:-build}"
test_bin="$build/bin/chunkserve_kernels_cuda_test"
sanitizer="${COMPUTE_SANITIZER:-/usr/local/cuda/bin/compute-sanitizer}"
[[ -x "$test_bin" ]] || { echo "sanitize.sh: $test_bin not built" >&2; exit 2; }
[[ -x "$sanitizer" ]] || { echo "sanitize.sh: $sanitizer not found" >&2; exit 2; }
# Decode and prefill cases small enough for the tools' slowdown; one per dtype, head dim, chunk.
filter='Kernels/CudaDecodeTest.*:Kernels/CudaPrefillTest.*:CudaAttentionErrorsTest.*'
for tool in memcheck racecheck initcheck synccheck; do
  echo "== compute-sanitizer --tool $tool"
  "$sanitizer" --tool "$tool" --error-exitcode 1 --print-limit 20 \
      "$test_bin" --gtest_filter="$filter" --gtest_brief=1
done
echo "== compute-sanitizer --tool memcheck (model ops, sampling)"
"$sanitizer" --tool memcheck --error-exitcode 1 --print-limit 20 \
    "$test_bin" --gtest_filter='Kernels/CudaModelOpsTest.*:CudaSamplingTest.*' --gtest_brief=1
