#!/usr/bin/env bash
# Everything the CUDA kernels need checked on a GPU machine, in one call: build (sm_90 only, for
# speed; CI builds "80;90"), the gpu tests, compute-sanitizer (sanitize.sh), and the attention
# benchmark at the target shapes (kernels/README.md, "CUDA kernels"). Logs and JSON go to $OUT
# (or /tmp/chunkserve-gpu); a short summary is printed last. Needs the project's dependencies
# (.ci/install-deps) and nvcc. Usage: kernels/cuda/gpu_check.sh [build-dir]
set -uo pipefail
build="${1:-build-gpu}"
out="${OUT:-/tmp/chunkserve-gpu}"
mkdir -p "$out"
status=0
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCHUNKSERVE_CUDA=ON \
    -DCHUNKSERVE_CUDA_ARCHITECTURES=90 -DCHUNKSERVE_BUILD_BINDINGS=OFF > "$out/configure.log" 2>&1 \
  && ninja -C "$build" chunkserve_kernels_cuda_test chunkserve_kernels_cuda_host_test \
       chunkserve-bench > "$out/build.log" 2>&1 || { echo "build failed: $out/build.log"; exit 1; }
ctest --test-dir "$build" -L kernels -R 'Cuda|TppSchedule|TppPlanCache' -j4 --output-on-failure \
    > "$out/tests.log" 2>&1 || status=1
kernels/cuda/sanitize.sh "$build" > "$out/sanitize.log" 2>&1 || status=1
bench="$build/bin/chunkserve-bench attention --device cuda --iters 50 --json"
{
  $bench --np 4096 --ns 4096   # full sharing: target <= 36 us, >= 0.60 of the floor, >= 6.8x paged
  $bench --np 1024 --ns 0      # no sharing: target >= 0.85 of the floor
  $bench --np 4096 --ns 4096 --kv-dtype bf16
  $bench --np 2048 --ns 2048 --kv-heads 8
  $bench --np 2048 --ns 2048 --head-dim 64
  $bench --grid
} > "$out/bench.jsonl" 2> "$out/bench.err" || status=1
echo "tests:    $(grep -E 'tests passed|tests failed' "$out/tests.log" | tail -1)"
echo "sanitize: $(grep -cE 'ERROR SUMMARY: [1-9]' "$out/sanitize.log") tool runs with errors"
python3 - "$out/bench.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
by = {}
for r in rows:
    by.setdefault((r["section"], r["np"], r["ns"], r["batch"], r["kv_dtype"], r["kv_heads"],
                   r["head_dim"]), {})[r["impl"]] = r
print(f"{'np':>5} {'ns':>5} {'b':>3} {'dt':>4} {'kvh':>3} {'hd':>3} {'paged_us':>9} {'tpp_us':>8} "
      f"{'ratio':>6} {'floor_us':>8} {'tpp_eff':>7}")
for (sec, np_, ns, b, dt, kvh, hd), m in by.items():
    if "tpp" not in m or "paged" not in m: continue
    t, p = m["tpp"], m["paged"]
    print(f"{np_:>5} {ns:>5} {b:>3} {dt:>4} {kvh:>3} {hd:>3} {p['median_ms']*1e3:>9.1f} "
          f"{t['median_ms']*1e3:>8.1f} {p['median_ms']/t['median_ms']:>6.2f} "
          f"{t['floor_ms']*1e3:>8.1f} {t['efficiency']:>7.2f}")
PY
exit $status
