#!/usr/bin/env python3
"""Runs `chunkserve-bench attention --json` on a small shape and checks what it reports.

Every implementation line must carry a positive time, a floor, the run-wide efficiency and the
local one (each timed iteration against the read bandwidth sampled around its round). The local
bandwidth is not compared with the run-wide one: a short sample may catch a burst of a shared
host's bandwidth that the run's longer passes missed. The benchmark itself checks
that tpp, paged and naive agree before it times them; a disagreement fails it (exit 1).

usage: attention_smoke_test.py BENCH_BINARY
"""
import json
import math
import subprocess
import sys


def main() -> int:
    bench = sys.argv[1]
    cmd = [bench, "attention", "--np", "256", "--ns", "128", "--batch", "4", "--heads", "4",
           "--kv-heads", "2", "--iters", "3", "--naive-iters", "1", "--json", "--isa-compare"]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if run.returncode != 0:
        print(run.stdout, run.stderr, sep="\n")
        print(f"FAIL: {' '.join(cmd)} exited {run.returncode}")
        return 1
    rows = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    impls = {r["impl"] for r in rows}
    for want in ("naive", "paged", "tpp", "tpp_avx2"):
        if want not in impls:
            print(f"FAIL: no {want} line in {sorted(impls)}")
            return 1
    for r in rows:
        for key in ("median_ms", "floor_ms", "efficiency", "bandwidth_gbs"):
            if not (isinstance(r[key], (int, float)) and r[key] > 0 and math.isfinite(r[key])):
                print(f"FAIL: {r['impl']}: {key} = {r[key]!r}")
                return 1
        if r["impl"] == "naive":
            continue  # timed alone, without bandwidth samples
        local_gbs = r.get("local_bandwidth_gbs")
        local_eff = r.get("efficiency_local")
        if not (isinstance(local_gbs, (int, float)) and 0 < local_gbs and math.isfinite(local_gbs)):
            print(f"FAIL: {r['impl']}: local_bandwidth_gbs = {local_gbs!r}")
            return 1
        if not (isinstance(local_eff, (int, float)) and 0 < local_eff and math.isfinite(local_eff)):
            print(f"FAIL: {r['impl']}: efficiency_local = {local_eff!r}")
            return 1
    print(f"ok: {len(rows)} lines, impls {sorted(impls)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
