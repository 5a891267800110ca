#!/usr/bin/env python3
"""Draws a chunkserve-sim run as PNG files: what `chunkserve-sim --plot DIR` runs.

Inputs are the simulator's own outputs: the results JSON (`--json-out`) and, optionally, the
per-request log (`--log`, one JSON object per request: policy, arrival_s, worker, reason, ttft_s,
end_s, ...). Outputs, in --out:

  policies.png  per policy: hit rate beside the two oracles (infinite single cache, perfect
                affinity over the simulated per-worker caches), and TTFT mean / p50 / p99
  load.png      per policy (from the log): requests in flight on each worker over time, and the
                TTFT of each request at its arrival time (rolling p50 over 50 requests, p99
                over 200)

Needs matplotlib (`.ci/python-deps` installs it into the project's virtual environment). Exit
status 2 with a message on stderr, naming the file and line, for a missing or malformed input.

  python3 router/sim/tools/plot.py --json results.json --log requests.jsonl --out plots/
"""

import argparse
import json
import os
import sys


def fail(message):
    print(f"plot.py: {message}", file=sys.stderr)
    sys.exit(2)


def load_results(path):
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except OSError as e:
        fail(f"{path}: {e.strerror}")
    except json.JSONDecodeError as e:
        fail(f"{path}:{e.lineno}: not JSON: {e.msg}")
    runs = doc.get("shared") if isinstance(doc, dict) else None
    if not isinstance(runs, list) or not runs:
        fail(f"{path}: no \"shared\" results (write it with chunkserve-sim --json-out)")
    for i, r in enumerate(runs):
        for key in ("policy", "hit_rate", "ttft_s"):
            if key not in r:
                fail(f"{path}: result {i} has no \"{key}\"")
    return doc


REQUIRED_LOG_KEYS = ("policy", "arrival_s", "worker", "ttft_s", "end_s")


def load_log(path):
    rows = []
    try:
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as e:
                    fail(f"{path}:{n}: not JSON: {e.msg}")
                if not isinstance(row, dict):
                    fail(f"{path}:{n}: not a JSON object")
                missing = [k for k in REQUIRED_LOG_KEYS if k not in row]
                if missing:
                    fail(f"{path}:{n}: missing {', '.join(missing)}")
                rows.append(row)
    except OSError as e:
        fail(f"{path}: {e.strerror}")
    if not rows:
        fail(f"{path}: no requests")
    return rows


def plot_policies(doc, out, plt):
    runs = doc["shared"]
    names = [r["policy"] for r in runs]
    x = range(len(runs))
    fig, (hit, ttft) = plt.subplots(1, 2, figsize=(12, 4.5))
    width = 0.27
    hit.bar([i - width for i in x], [r["hit_rate"] for r in runs], width, label="policy")
    oracle = [r.get("oracle", {}) for r in runs]
    hit.bar(list(x), [o.get("affinity_hit_rate", 0) for o in oracle], width,
            label="perfect affinity")
    hit.bar([i + width for i in x], [o.get("infinite_hit_rate", 0) for o in oracle], width,
            label="infinite cache")
    hit.set_xticks(list(x), names, rotation=20)
    hit.set_ylabel("prefix hit rate")
    hit.set_ylim(0, 1)
    hit.legend(fontsize=8)
    for i, key in enumerate(("mean", "p50", "p99")):
        ttft.bar([j + (i - 1) * width for j in x], [r["ttft_s"].get(key, 0) for r in runs],
                 width, label=key)
    ttft.set_xticks(list(x), names, rotation=20)
    ttft.set_ylabel("TTFT (s)")
    ttft.legend(fontsize=8)
    c = doc.get("config", {})
    fig.suptitle(f"{c.get('workload', '?')} workload, {c.get('workers', '?')} workers, "
                 f"{c.get('requests', '?')} requests")
    fig.tight_layout()
    path = os.path.join(out, "policies.png")
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def in_flight(rows, workers, step):
    """Requests in flight per worker, sampled every `step` seconds."""
    end = max(r["end_s"] for r in rows)
    times = [i * step for i in range(int(end / step) + 2)]
    counts = [[0] * len(times) for _ in range(workers)]
    for r in rows:
        w = r["worker"]
        if not 0 <= w < workers:
            continue
        first = int(r["arrival_s"] / step)
        last = min(int(r["end_s"] / step), len(times) - 1)
        for i in range(first, last + 1):
            counts[w][i] += 1
    return times, counts


def rolling(values, window, q):
    out = []
    for i in range(len(values)):
        part = sorted(values[max(0, i - window + 1):i + 1])
        out.append(part[min(len(part) - 1, int(q * len(part)))])
    return out


def plot_load(rows, out, plt):
    policies = sorted({r["policy"] for r in rows})
    workers = max(r["worker"] for r in rows) + 1
    fig, axes = plt.subplots(len(policies), 2, figsize=(12, 3.2 * len(policies)), squeeze=False)
    for row, policy in enumerate(policies):
        mine = sorted((r for r in rows if r["policy"] == policy), key=lambda r: r["arrival_s"])
        span = max(r["end_s"] for r in mine)
        times, counts = in_flight(mine, workers, max(span / 400, 1e-3))
        load = axes[row][0]
        for w in range(workers):
            load.plot(times, counts[w], linewidth=0.8)
        load.set_title(f"{policy}: requests in flight per worker", fontsize=10)
        load.set_xlabel("time (s)")
        arrivals = [r["arrival_s"] for r in mine]
        ttfts = [r["ttft_s"] for r in mine]
        t = axes[row][1]
        t.scatter(arrivals, ttfts, s=2, alpha=0.3, label="request")
        t.plot(arrivals, rolling(ttfts, 50, 0.5), label="rolling p50 (50)")
        t.plot(arrivals, rolling(ttfts, 200, 0.99), label="rolling p99 (200)")
        t.set_title(f"{policy}: TTFT by arrival", fontsize=10)
        t.set_xlabel("arrival (s)")
        t.set_ylabel("TTFT (s)")
        t.legend(fontsize=8)
    fig.tight_layout()
    path = os.path.join(out, "load.png")
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", required=True, help="chunkserve-sim --json-out file")
    p.add_argument("--log", help="chunkserve-sim --log file (per-request JSONL)")
    p.add_argument("--out", required=True, help="folder for the PNG files")
    args = p.parse_args()
    doc = load_results(args.json)
    rows = load_log(args.log) if args.log else None
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        fail("matplotlib is not installed (bash .ci/python-deps, then use its python)")
    os.makedirs(args.out, exist_ok=True)
    written = [plot_policies(doc, args.out, plt)]
    if rows:
        written.append(plot_load(rows, args.out, plt))
    for path in written:
        print(path)


if __name__ == "__main__":
    main()
