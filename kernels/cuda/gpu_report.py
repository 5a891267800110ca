#!/usr/bin/env python3
"""Tables from a gpu_check.sh output folder: attention (chunkserve paged / tpp against FlashInfer,
with the floor), the issue's targets, and the engine benchmark. Markdown, printed to stdout.

Usage: kernels/cuda/gpu_report.py OUT_DIR
"""
import json
import os
import sys


def load(path):
    if not os.path.exists(path):
        return []
    rows = []
    with open(path) as f:
        for line in f:
            if line.startswith("{"):
                rows.append(json.loads(line))
    return rows


def key(r):
    return (r["np"], r["ns"], r["batch"], r["kv_dtype"], r["kv_heads"], r["head_dim"])


def main():
    out = sys.argv[1]
    ours = load(os.path.join(out, "bench.jsonl"))
    fi = load(os.path.join(out, "flashinfer.jsonl"))
    engine = load(os.path.join(out, "engine.jsonl"))
    by = {}
    for r in ours + fi:
        by.setdefault(key(r), {}).setdefault(r["impl"], r)  # first row of a shape wins
    if ours:
        gpu = ours[0].get("device_name", "?")
        print(f"\nattention on {gpu}: median us, L2 flushed; floor = minimal bytes / copy bandwidth "
              f"({ours[0]['bandwidth_gbs']:.0f} GB/s)")
        cols = ["np", "ns", "b", "kv", "kvh", "hd", "paged", "tpp", "tpp/paged", "floor", "tpp eff",
                "fi_decode", "fi_tc", "fi_cascade", "best fi/tpp"]
        print("| " + " | ".join(cols) + " |")
        print("|" + "---:|" * len(cols))
        for k, m in by.items():
            if "tpp" not in m or "paged" not in m:
                continue
            t, p = m["tpp"], m["paged"]
            fis = [m[n]["median_ms"] for n in ("fi_decode", "fi_decode_tc", "fi_cascade") if n in m]
            cell = lambda n: f"{m[n]['median_ms'] * 1e3:.1f}" if n in m else "-"
            print("| " + " | ".join([
                str(k[0]), str(k[1]), str(k[2]), k[3], str(k[4]), str(k[5]),
                f"{p['median_ms'] * 1e3:.1f}", f"{t['median_ms'] * 1e3:.1f}",
                f"{p['median_ms'] / t['median_ms']:.2f}x", f"{t['floor_ms'] * 1e3:.1f}",
                f"{t['efficiency']:.2f}", cell("fi_decode"), cell("fi_decode_tc"),
                cell("fi_cascade"),
                f"{min(fis) / t['median_ms']:.2f}x" if fis else "-"]) + " |")
        print("\ntargets (H100; fp16, b 32, 32 heads, head dim 128, chunk 64):")
        full = by.get((4096, 4096, 32, "f16", 32, 128), {})
        none = by.get((1024, 0, 32, "f16", 32, 128), {})
        if "tpp" in full:
            us = full["tpp"]["median_ms"] * 1e3
            print(f"- full sharing 4096/4096: tpp {us:.1f} us (target <= 36): "
                  f"{'met' if us <= 36 else 'NOT met'}")
            ratio = full["paged"]["median_ms"] / full["tpp"]["median_ms"]
            print(f"- tpp/paged at 4096/4096: {ratio:.2f}x (target >= 6.8x): "
                  f"{'met' if ratio >= 6.8 else 'NOT met'}")
        if "tpp" in none:
            eff = none["tpp"]["efficiency"]
            print(f"- no sharing 1024: tpp efficiency {eff:.2f} (target >= 0.85): "
                  f"{'met' if eff >= 0.85 else 'NOT met'}")
    if engine:
        print("\nengine (chunkserve-bench engine --backend cuda):")
        cols = ["model", "kv", "np", "ns", "nc", "system", "tok/s", "ms/tok", "TTFT p50 ms",
                "peak KV MiB", "KV saved", "failed"]
        print("| " + " | ".join(cols) + " |")
        print("|---|---|" + "---:|" * (len(cols) - 2))
        for r in engine:
            print("| " + " | ".join([
                r.get("model", "tiny"), r.get("kv_dtype", "?"), str(r["np"]), str(r["ns"]),
                str(r["nc"]), r["system"], f"{r['generated_tokens_per_s']:.0f}",
                f"{r['tpot_ms_mean']:.2f}", f"{r['ttft_ms_p50']:.1f}",
                f"{r['kv_bytes_peak'] / 2**20:.1f}", f"{r['kv_saved_pct']:.1f}%",
                str(r["failed"])]) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
