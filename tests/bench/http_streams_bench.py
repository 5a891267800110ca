#!/usr/bin/env python3
"""Many concurrent streaming HTTP clients against chunkserve-router's OpenAI API.

  http_streams_bench.py [--bin build/bin] [--connections 1000] [--max-tokens 8] [--json]

Starts a real chunkserve-router (with the model's tokenizer) and one chunkserve-worker serving
SmolLM2-135M-Instruct (.ci/fetch-models), opens N connections at once, each streaming one
/v1/completions request (server-sent events), and reports: requests completed (each must end
with [DONE] and its finish reason), events received, time to first event and to the end
(p50/p99), wall time, and the router's resident memory and thread count sampled every 50 ms
(peak and idle). Only Python's standard library on the client side (asyncio sockets), so the
numbers measure the servers, not an SDK.
"""
import argparse
import asyncio
import json
import os
import re
import resource
import signal
import statistics
import subprocess
import sys
import time

CACHE = os.environ.get("CHUNKSERVE_MODEL_CACHE", os.path.expanduser("~/.cache/chunkserve/models"))
MODEL = os.path.join(CACHE, "SmolLM2-135M-Instruct.Q4_1.gguf")


def raise_fd_limit():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def start(argv):
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                         preexec_fn=raise_fd_limit)
    ports = {}
    while not {"listening", "http"} <= ports.keys():
        line = p.stdout.readline()
        if not line:
            raise RuntimeError(f"{argv[0]} exited")
        m = re.match(r"(listening|http) on [\d.]+:(\d+)", line)
        if m:
            ports[m.group(1)] = int(m.group(2))
    return p, ports


def proc_status(pid):
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "Threads"):
                out[key] = int(value.split()[0])
    return out  # VmRSS in KiB


async def http_get(port, path):
    r, w = await asyncio.open_connection("127.0.0.1", port)
    w.write(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
    data = await r.read()
    w.close()
    return data.decode(errors="replace")


async def one(port, i, max_tokens, results):
    body = json.dumps({"model": "smollm2", "prompt": f"Request {i}: tell me a fact about the number {i}.",
                       "max_tokens": max_tokens, "temperature": 0, "stream": True,
                       "ignore_eos": True})
    t0 = time.perf_counter()
    first = None
    events = 0
    done = False
    finish = None
    try:
        r, w = await asyncio.open_connection("127.0.0.1", port)
        w.write((f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 f"Connection: close\r\nContent-Length: {len(body)}\r\n\r\n{body}").encode())
        await w.drain()
        head = await r.readuntil(b"\r\n\r\n")
        status = int(head.split()[1])
        if status != 200:
            results.append({"ok": False, "status": status})
            w.close()
            return
        buf = b""
        while True:
            chunk = await r.read(65536)
            if not chunk:
                break
            buf += chunk
            while b"\n\n" in buf:
                event, buf = buf.split(b"\n\n", 1)
                # Chunked encoding frames the events; the data lines are what matters.
                for line in event.split(b"\n"):
                    line = line.strip()
                    if not line.startswith(b"data: "):
                        continue
                    if first is None:
                        first = time.perf_counter() - t0
                    events += 1
                    payload = line[6:]
                    if payload == b"[DONE]":
                        done = True
                    else:
                        choice = json.loads(payload)["choices"]
                        if choice and choice[0].get("finish_reason"):
                            finish = choice[0]["finish_reason"]
        w.close()
    except Exception as e:  # noqa: BLE001 - reported, not raised
        results.append({"ok": False, "error": repr(e)})
        return
    results.append({"ok": done and finish == "length", "first": first,
                    "end": time.perf_counter() - t0, "events": events})


async def run(args, router_pid, http_port):
    samples = []
    stop = asyncio.Event()

    async def sampler():
        while not stop.is_set():
            samples.append(proc_status(router_pid))
            await asyncio.sleep(0.05)

    idle = proc_status(router_pid)
    task = asyncio.create_task(sampler())
    results = []
    t0 = time.perf_counter()
    await asyncio.gather(*(one(http_port, i, args.max_tokens, results)
                           for i in range(args.connections)))
    wall = time.perf_counter() - t0
    stop.set()
    await task
    metrics = await http_get(http_port, "/metrics")
    return results, wall, idle, samples, metrics


def pct(values, q):
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="build/bin")
    ap.add_argument("--connections", type=int, default=1000)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if not os.path.exists(MODEL):
        sys.exit(f"{MODEL} is missing: bash .ci/fetch-models")
    raise_fd_limit()
    router, rports = start([f"{args.bin}/chunkserve-router", "--listen", "127.0.0.1:0",
                            "--http", "127.0.0.1:0", "--tokenizer", MODEL,
                            "--served-model-name", "smollm2", "--max-connections", "65536"])
    worker, _ = start([f"{args.bin}/chunkserve-worker", "--listen", "127.0.0.1:0",
                       "--http", "127.0.0.1:0", "--model", MODEL, "--kv-cache-mb", "512",
                       "--max-queue", "100000", "--router", f"127.0.0.1:{rports['listening']}"])
    try:
        deadline = time.time() + 30
        while "chunkserve_router_workers_alive 1" not in asyncio.run(http_get(rports["http"], "/metrics")):
            if time.time() > deadline:
                sys.exit("the worker did not register")
            time.sleep(0.1)
        results, wall, idle, samples, metrics = asyncio.run(run(args, router.pid, rports["http"]))
    finally:
        for p in (worker, router):
            p.send_signal(signal.SIGTERM)
            p.wait(timeout=60)
    ok = [r for r in results if r["ok"]]
    firsts = [r["first"] for r in ok]
    ends = [r["end"] for r in ok]
    report = {
        "connections": args.connections,
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "events": sum(r.get("events", 0) for r in results),
        "wall_s": round(wall, 2),
        "first_event_s": {"p50": round(pct(firsts, 0.5), 3), "p99": round(pct(firsts, 0.99), 3)},
        "end_s": {"p50": round(pct(ends, 0.5), 3), "p99": round(pct(ends, 0.99), 3)},
        "router_rss_mib": {"idle": round(idle["VmRSS"] / 1024, 1),
                           "peak": round(max(s["VmRSS"] for s in samples) / 1024, 1)},
        "router_threads": {"idle": idle["Threads"], "peak": max(s["Threads"] for s in samples)},
        "disconnects": re.search(r"chunkserve_http_disconnects_total (\d+)", metrics).group(1),
    }
    errors = [r for r in results if not r["ok"]][:3]
    print(f"{'connections':<28}{report['connections']:>10}")
    print(f"{'completed':<28}{report['completed']:>10}")
    print(f"{'failed':<28}{report['failed']:>10}")
    print(f"{'events':<28}{report['events']:>10}")
    print(f"{'wall / s':<28}{report['wall_s']:>10}")
    print(f"{'first event p50 / p99 / s':<28}{report['first_event_s']['p50']:>10} {report['first_event_s']['p99']:>8}")
    print(f"{'end p50 / p99 / s':<28}{report['end_s']['p50']:>10} {report['end_s']['p99']:>8}")
    print(f"{'router RSS idle / peak MiB':<28}{report['router_rss_mib']['idle']:>10} {report['router_rss_mib']['peak']:>8}")
    print(f"{'router threads idle / peak':<28}{report['router_threads']['idle']:>10} {report['router_threads']['peak']:>8}")
    if errors:
        print("first failures:", errors)
    if args.json:
        print(json.dumps(report))
    sys.exit(0 if report["failed"] == 0 else 1)


if __name__ == "__main__":
    main()
