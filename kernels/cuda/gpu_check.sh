#!/usr/bin/env bash
# The whole GPU check in one command, for a machine with an NVIDIA GPU (sm_90: H100 / H200):
#
#   kernels/cuda/gpu_check.sh OUT_DIR [--build DIR] [--steps LIST] [--jobs N] [--fi-dtypes LIST]
#
# Steps (default: all, in this order; --steps build,tests,... picks some):
#   env        GPU, driver, compilers, OS                                      -> env.txt
#   build      configure (sm_90 only) and build the GPU tests, chunkserve-bench and
#              chunkserve-make-tiny-model with every core                       -> build.log
#   tests      every `gpu` and `multigpu` ctest test (multigpu ones skip on one GPU)  -> tests.log
#   sanitize   compute-sanitizer memcheck / racecheck / initcheck / synccheck over the kernel
#              tests, memcheck over the backend tests (sanitize.sh)              -> sanitize.log
#   bench      chunkserve-bench attention --device cuda at the paper's shapes (b 32, 32 heads,
#              head dim 128, chunk 64; fp16 and bf16) and its Table 3 grid    -> bench.jsonl
#   flashinfer FlashInfer's paged decode and cascade decode on the same shapes
#              (tests/bench/flashinfer_attention.py; skipped when flashinfer cannot be imported;
#              --fi-dtypes f16 halves its kernel compilation, ~2-4 minutes per dtype, which runs
#              in the background from the start)
#                                                                              -> flashinfer.jsonl
#   engine     chunkserve-bench engine --backend cuda, sharing on vs off, on the built-in tiny
#              model and a generated 0.2B-parameter model                     -> engine.jsonl
#
# Works on a machine that reaches no package registry: where the project's Debian dependencies
# are missing and .gpu-deps/debs holds them (kernels/cuda/gpu_deps.sh download, here), they are
# unpacked into a prefix first; where .whl holds Python wheels (flashinfer-python and what it
# needs), they are installed into a private folder. Logs, JSON and summary.txt go to OUT_DIR; a
# short summary is printed last. Exit status: 0 when every step that ran passed, 1 otherwise.
set -uo pipefail
cd "$(dirname "$0")/../.."

out="${1:-}"
[[ -n "$out" && "$out" != --* ]] || { sed -n '2,29p' "$0"; exit 2; }
shift
build=build-gpu
steps=env,build,tests,sanitize,bench,flashinfer,engine
jobs=$(nproc)
fi_dtypes="f16,bf16"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build) build="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --jobs) jobs="$2"; shift 2 ;;
    --fi-dtypes) fi_dtypes="$2"; shift 2 ;;
    *) echo "gpu_check: unknown argument $1" >&2; exit 2 ;;
  esac
done
mkdir -p "$out"
out="$(cd "$out" && pwd)"
summary="$out/summary.txt"
: > "$summary"
status=0
has_step() { [[ ",$steps," == *",$1,"* ]]; }
# record STEP OK|FAIL|SKIP SECONDS DETAIL
record() {
  printf '%-10s %-4s %5ss  %s\n' "$1" "$2" "$3" "$4" | tee -a "$summary"
  [[ "$2" == FAIL ]] && status=1
  return 0
}

# --- dependencies --------------------------------------------------------------------------------
if [[ ! -e /usr/include/glog/logging.h && -d .gpu-deps/debs ]]; then
  if kernels/cuda/gpu_deps.sh unpack .gpu-deps /tmp/chunkserve-deps > "$out/deps.log" 2>&1; then
    # shellcheck disable=SC1091
    source /tmp/chunkserve-deps/env.sh
  else
    echo "gpu_check: unpacking .gpu-deps failed: $out/deps.log" >&2
  fi
fi
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/chunkserve-site .whl/*.whl > "$out/wheels.log" 2>&1 \
    && export PYTHONPATH="/tmp/chunkserve-site${PYTHONPATH:+:$PYTHONPATH}"
fi
export FLASHINFER_CUDA_ARCH_LIST="${FLASHINFER_CUDA_ARCH_LIST:-9.0a}"
export MAX_JOBS="$jobs"
bin="$build/bin"

# --- env -----------------------------------------------------------------------------------------
if has_step env; then
  {
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem \
        --format=csv 2>&1
    nvcc --version 2>&1 | tail -2
    g++ --version 2>&1 | head -1
    cmake --version 2>&1 | head -1
    grep PRETTY_NAME /etc/os-release 2>&1
    python3 -c 'import torch; print("torch", torch.__version__)' 2>&1
    python3 -c 'import flashinfer; print("flashinfer", flashinfer.__version__)' 2>&1 | tail -1
    nproc
  } > "$out/env.txt"
  record env OK 0 "$(head -2 "$out/env.txt" | tail -1)"
fi

# FlashInfer compiles its kernels on first use; warm them up (both dtypes) while we build.
fi_warm_pid=""
if has_step flashinfer && python3 -c 'import flashinfer' > /dev/null 2>&1; then
  (for dt in ${fi_dtypes//,/ }; do
     python3 tests/bench/flashinfer_attention.py --np 128 --ns 64 --batch 4 --iters 2 \
         --kv-dtype "$dt"
   done) > "$out/flashinfer_warmup.log" 2>&1 &
  fi_warm_pid=$!
fi

# --- build ---------------------------------------------------------------------------------------
if has_step build; then
  t0=$SECONDS
  targets=(chunkserve_cuda_device_test chunkserve_kernels_cuda_test chunkserve_kernels_cuda_host_test
           chunkserve_cuda_backend_test chunkserve_cuda_backend_create_test
           chunkserve_parallel_nccl_test chunkserve_parallel_nccl_multigpu_test
           chunkserve-bench chunkserve-make-tiny-model)
  if cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCHUNKSERVE_CUDA=ON \
        -DCHUNKSERVE_CUDA_ARCHITECTURES=90 -DCHUNKSERVE_BUILD_BINDINGS=OFF \
        -DCHUNKSERVE_BUILD_EXAMPLES=OFF > "$out/build.log" 2>&1 \
     && cmake --build "$build" -j "$jobs" --target "${targets[@]}" >> "$out/build.log" 2>&1; then
    record build OK $((SECONDS - t0)) "${#targets[@]} targets"
  else
    record build FAIL $((SECONDS - t0)) "$(grep -m1 -E 'error|Error' "$out/build.log")"
    echo "gpu_check: build failed; see $out/build.log" >&2
    cat "$summary"
    exit 1
  fi
fi

# --- tests ---------------------------------------------------------------------------------------
if has_step tests; then
  t0=$SECONDS
  timeout 300 ctest --test-dir "$build" -L 'gpu|multigpu' -j 4 --output-on-failure \
      --timeout 120 > "$out/tests.log" 2>&1
  rc=$?
  line=$(grep -E 'tests passed|tests failed' "$out/tests.log" | tail -1)
  skipped=$(grep -c 'Skipped' "$out/tests.log")
  [[ $rc -eq 0 && -n "$line" ]] && record tests OK $((SECONDS - t0)) "$line; $skipped skipped" \
    || record tests FAIL $((SECONDS - t0)) "${line:-ctest failed}; see tests.log"
fi

# --- sanitize ------------------------------------------------------------------------------------
if has_step sanitize; then
  t0=$SECONDS
  timeout 420 kernels/cuda/sanitize.sh "$build" > "$out/sanitize.log" 2>&1
  rc=$?
  errs=$(grep -cE 'ERROR SUMMARY: [1-9]' "$out/sanitize.log")
  runs=$(grep -c 'ERROR SUMMARY' "$out/sanitize.log")
  [[ $rc -eq 0 ]] && record sanitize OK $((SECONDS - t0)) "$runs tool runs, 0 with errors" \
    || record sanitize FAIL $((SECONDS - t0)) "$errs of $runs tool runs with errors (rc $rc)"
fi

# --- attention bench -----------------------------------------------------------------------------
shapes=("--np 4096 --ns 4096" "--np 1024 --ns 0" "--np 4096 --ns 0" "--np 2048 --ns 1024")
if has_step bench; then
  t0=$SECONDS
  rc=0
  : > "$out/bench.jsonl"
  for dt in f16 bf16; do
    for s in "${shapes[@]}"; do
      # shellcheck disable=SC2086
      timeout 60 "$bin/chunkserve-bench" attention --device cuda --iters 100 --json --kv-dtype "$dt" $s \
          >> "$out/bench.jsonl" 2>> "$out/bench.err" || rc=1
    done
  done
  timeout 120 "$bin/chunkserve-bench" attention --device cuda --iters 50 --json --grid \
      >> "$out/bench.jsonl" 2>> "$out/bench.err" || rc=1
  timeout 60 "$bin/chunkserve-bench" attention --device cuda --iters 50 --json --np 2048 --ns 2048 \
      --kv-heads 8 >> "$out/bench.jsonl" 2>> "$out/bench.err" || rc=1
  [[ $rc -eq 0 ]] && record bench OK $((SECONDS - t0)) "$(grep -c '^{' "$out/bench.jsonl") rows" \
    || record bench FAIL $((SECONDS - t0)) "see bench.err"
fi

# --- flashinfer ----------------------------------------------------------------------------------
if has_step flashinfer; then
  t0=$SECONDS
  if [[ -z "$fi_warm_pid" ]]; then
    record flashinfer SKIP 0 "flashinfer cannot be imported (carry its wheels in .whl)"
  else
    wait "$fi_warm_pid" || echo "gpu_check: FlashInfer warm-up failed" >> "$out/flashinfer.err"
    rc=0
    : > "$out/flashinfer.jsonl"
    for dt in ${fi_dtypes//,/ }; do
      args=()
      for s in "${shapes[@]}"; do read -r _ n _ m <<< "$s"; args+=(--np "$n" --ns "$m"); done
      timeout 120 python3 tests/bench/flashinfer_attention.py "${args[@]}" --kv-dtype "$dt" --iters 100 \
          >> "$out/flashinfer.jsonl" 2>> "$out/flashinfer.err" || rc=1
    done
    timeout 120 python3 tests/bench/flashinfer_attention.py --grid --iters 50 \
        --kv-dtype "${fi_dtypes%%,*}" >> "$out/flashinfer.jsonl" 2>> "$out/flashinfer.err" || rc=1
    [[ $rc -eq 0 ]] && record flashinfer OK $((SECONDS - t0)) \
        "$(grep -c '^{' "$out/flashinfer.jsonl") rows" \
      || record flashinfer FAIL $((SECONDS - t0)) "see flashinfer.err, flashinfer_warmup.log"
  fi
fi

# --- engine bench --------------------------------------------------------------------------------
if has_step engine; then
  t0=$SECONDS
  rc=0
  : > "$out/engine.jsonl"
  timeout 120 "$bin/chunkserve-bench" engine --backend cuda --np 512,2048 --nc 64 --requests 64 --rate 1000 \
      --kv-cache-mb 4096 --budget 4096 --json >> "$out/engine.jsonl" 2>> "$out/engine.err" || rc=1
  model=/tmp/chunkserve-gpu-model
  if "$bin/chunkserve-make-tiny-model" --out "$model" --dtype f16 --vocab 32000 --hidden 1024 \
       --layers 16 --heads 16 --kv-heads 4 --head-dim 64 --intermediate 2816 --tied \
       >> "$out/engine.err" 2>&1; then
    timeout 180 "$bin/chunkserve-bench" engine --backend cuda --model "$model" --np 512,2048 --nc 64 \
        --requests 64 --rate 1000 --kv-cache-mb 8192 --budget 4096 --json \
        >> "$out/engine.jsonl" 2>> "$out/engine.err" || rc=1
  else
    rc=1
  fi
  [[ $rc -eq 0 ]] && record engine OK $((SECONDS - t0)) "$(grep -c '^{' "$out/engine.jsonl") rows" \
    || record engine FAIL $((SECONDS - t0)) "see engine.err"
fi

# --- summary -------------------------------------------------------------------------------------
python3 kernels/cuda/gpu_report.py "$out" >> "$summary" 2>&1
echo
cat "$summary"
exit $status
