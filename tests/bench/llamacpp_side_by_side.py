#!/usr/bin/env python3
"""chunkserve against llama.cpp's llama-server, side by side, on the same weights (issue 25).

What: one run that fills this table, for each weight dtype (f32, then bf16):

  | workload                                          | chunkserve, sharing on | sharing off | llama-server |
  | 32 users, one ~595-token system prompt, 32 tokens |                        |             |              |
  | 5 chat prompts (3 share a system prompt), 48 tok  |                        |             |              |

plus each server's resident memory (VmRSS after loading, VmHWM = peak over the run, from
/proc/<pid>/status), the prefill time of the 32-user batch (the moment the last of the 32
streams has its first token: every prompt has been prefilled by then), the prompt and generated
token counts each engine reported, and whether the engines' greedy texts agree. It prints a
Markdown table and one JSON object (also written to --json).

How: the three servers run at once, each with --threads (2) threads: chunkserve-worker with
--prefix-sharing on, chunkserve-worker with --prefix-sharing off, and llama-server with -np 32
slots. Rounds are interleaved (workload W on A, B, C, then the next workload, then the next
round), and the table shows medians over --rounds (>= 3). Both engines get the same requests
over the same HTTP client: POST /v1/completions with the prompt text rendered in SmolLM2's chat
template by this script (so no engine's template handling is measured), temperature 0,
ignore_eos, max_tokens = the workload's new tokens, sent all at once from one thread per
request (http.client, standard library only). Every round's prompts begin with a round number, so
neither engine can reuse KV from an earlier round (chunkserve's retained chunks, llama-server's
slot cache; its RAM prompt cache is off: --cache-ram 0); within a round, sharing is what is
measured.

Same weights: llama.cpp's own llama-quantize turns the Q4_1 file (.ci/fetch-models) into an F32
and a BF16 GGUF (--allow-requantize; cached beside the model), and both engines load those
files. llama-server computes in the file's dtype; chunkserve is told the same (--gguf-dtype):
its CPU backend keeps bf16 weights half-size and widens them in registers inside the GEMM
(kernels/cpu/gemm.h), computing in f32 with the same bf16 values. The KV cache has the weights' dtype in both engines (f32 / bf16) and
the same capacity in tokens (32 x --ctx-per-user), so resident memory compares like with like.

Why: issue 25 asks for chunkserve to beat llama.cpp also without sharing (prefill speed,
half-precision weights that pay, memory). This is the measurement that decides it, repeatable in
one command after each change. It needs a llama.cpp build: tests/bench/llamacpp_side_by_side.sh
builds one from the pinned PyPI llama-cpp-python sdist and then runs this. Not run in CI.

  tests/bench/llamacpp_side_by_side.sh [--rounds 3] [--dtypes f32,bf16] [--json out.json]
  python3 tests/bench/llamacpp_side_by_side.py --llama-bin DIR --worker build/bin/chunkserve-worker

Robustness: ports are chosen free (chunkserve binds port 0 and says which; llama-server gets a
port this script just found free), every wait has a deadline, and the servers (own process
groups) are killed on any exit of this script, Ctrl-C included.
"""
import argparse
import atexit
import builtins
import functools
import http.client
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time

CACHE = os.environ.get("CHUNKSERVE_MODEL_CACHE", os.path.expanduser("~/.cache/chunkserve/models"))
MODEL = os.path.join(CACHE, "SmolLM2-135M-Instruct.Q4_1.gguf")
CONFIGS = ("chunkserve_sharing_on", "chunkserve_sharing_off", "llama_server")
HEADERS = {"chunkserve_sharing_on": "chunkserve, sharing on",
           "chunkserve_sharing_off": "chunkserve, sharing off", "llama_server": "llama-server"}

# ---------------------------------------------------------------------------------------------
# Workloads. Deterministic text; the token counts the engines report are printed with the table.

_TOPICS = ["billing", "refunds", "shipping", "returns", "warranty", "accounts", "passwords",
           "privacy", "gift cards", "subscriptions", "outages", "escalations", "accessibility",
           "invoices", "discounts", "loyalty points", "device setup", "data export",
           "business plans", "student plans", "family sharing", "cancellations", "coupons",
           "international orders"]


def system_prompt_32_users():
    """A support-desk policy: 595 tokens with its chat markers and round tag (SmolLM2's
    tokenizer), 618-619 with a user turn, as issue 25's 32 x 618-token prefill."""
    lines = ["You are Nova, the customer support assistant of Larkspur Home Electronics. "
             "Follow the policy below in every answer. Be brief, friendly and precise, and never "
             "invent order numbers, prices or dates. Answer in the customer's language, and close "
             "every reply by asking whether anything else is needed."]
    for i, topic in enumerate(_TOPICS[:11], 1):
        lines.append(f"Rule {i} ({topic}): questions about {topic} are answered from the help "
                     f"center article on {topic}; if the customer is upset, apologise once, "
                     f"offer a ticket number, and hand over to a human agent after two replies.")
    return "\n".join(lines)


def system_prompt_shared_5():
    return ("You are a patient tutor for high-school students. Explain ideas step by step, use "
            "small concrete examples, check understanding with one short question at the end, "
            "and keep every answer under 150 words. Prefer plain words over jargon; when a term "
            "is needed, define it in one sentence. Never give the final answer to homework "
            "directly: guide the student to it.")


def chat(system, user):
    """SmolLM2-Instruct's chat template (ChatML), rendered here so both engines see one text."""
    text = ""
    if system is not None:
        text += f"<|im_start|>system\n{system}<|im_end|>\n"
    return text + f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"


def workload_32_users(round_no, new_tokens=32):
    system = f"[round {round_no}] " + system_prompt_32_users()
    users = [f"Customer {i}: where is my order {1000 + 37 * i}?" for i in range(32)]
    return [chat(system, u) for u in users], new_tokens


def workload_5_prompts(round_no, new_tokens=48):
    tag = f"[round {round_no}] "
    shared = tag + system_prompt_shared_5()
    return [
        chat(shared, "Why does ice float on water?"),
        chat(shared, "How do I find the slope of a line through two points?"),
        chat(shared, "What is the difference between weather and climate?"),
        chat(tag + "You are a concise assistant that writes Python code with short comments.",
             "Write a function that returns the n-th Fibonacci number iteratively."),
        chat(tag + "You are a travel guide who answers in three bullet points.",
             "What should I see in Lisbon in one day?"),
    ], new_tokens


WORKLOADS = {
    "32_users": ("32 users, one ~595-token system prompt (618-token prompts), 32 new tokens each",
                 workload_32_users),
    "5_prompts": ("5 chat prompts (3 share a system prompt), 48 new tokens", workload_5_prompts),
}

# ---------------------------------------------------------------------------------------------
# Processes: own process groups, killed on every exit path.

_procs = []


def _kill_all():
    for p in _procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + 5
    for p in _procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()
    _procs.clear()


atexit.register(_kill_all)
for _sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(_sig, lambda s, f: sys.exit(128 + s))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(argv, log_path, pipe_stdout):
    log = open(log_path, "w")
    p = subprocess.Popen(argv, stdout=subprocess.PIPE if pipe_stdout else log,
                         stderr=subprocess.STDOUT if not pipe_stdout else log, text=True,
                         start_new_session=True)
    _procs.append(p)
    return p


def http_json(port, method, path, body=None, timeout=600):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        data = None if body is None else json.dumps(body)
        conn.request(method, path, body=data, headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        raw = r.read()
        return r.status, (json.loads(raw) if raw.startswith(b"{") else raw.decode(errors="replace"))
    finally:
        conn.close()


def wait_ready(p, port, path, what, deadline_s):
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if p.poll() is not None:
            raise RuntimeError(f"{what} exited with status {p.returncode} (see its log)")
        try:
            status, _ = http_json(port, "GET", path, timeout=2)
            if status == 200:
                return
        except (OSError, http.client.HTTPException):
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{what} not ready within {deadline_s} s")


def start_chunkserve(args, gguf, dtype, sharing, kv_mb, log_path):
    argv = [args.worker, "--model", gguf, "--served-model-name", "smollm2",
            "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0", "--threads", str(args.threads),
            "--kv-cache-mb", str(kv_mb), "--kv-dtype", dtype, "--gguf-dtype", dtype,
            "--prefix-sharing", "on" if sharing else "off"]
    p = spawn(argv, log_path, pipe_stdout=True)
    # The worker prints "listening on HOST:PORT" and "http on HOST:PORT" once it serves; read
    # them under a deadline from a thread (a pipe read cannot time out by itself).
    found = {}

    def reader():  # drains stdout for the process' life, so the worker never blocks on it
        for line in p.stdout:
            m = re.match(r"http on [\d.]+:(\d+)", line)
            if m:
                found["port"] = int(m.group(1))
                ready.set()

    ready = threading.Event()

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    ready.wait(args.start_timeout)
    if "port" not in found:
        raise RuntimeError(f"chunkserve-worker gave no http port within {args.start_timeout} s "
                           f"(log: {log_path})")
    wait_ready(p, found["port"], "/readyz", "chunkserve-worker", args.start_timeout)
    return p, found["port"]


def start_llama(args, gguf, dtype, ctx_total, log_path):
    port = free_port()
    argv = [os.path.join(args.llama_bin, "llama-server"), "-m", gguf, "--host", "127.0.0.1",
            "--port", str(port), "-np", str(args.users), "-c", str(ctx_total),
            "-t", str(args.threads), "-tb", str(args.threads), "-ctk", dtype, "-ctv", dtype,
            "--cache-ram", "0", "--no-webui", "-a", "smollm2",
            # One KV buffer for all slots: llama-server's own choice when it picks the slot count.
            # Without it, 32 per-slot streams made the 5-prompt workload 5-15x slower here.
            ] + args.llama_args.split()
    p = spawn(argv, log_path, pipe_stdout=False)
    wait_ready(p, port, "/health", "llama-server", args.start_timeout)
    return p, port


def proc_mem(pid):
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0]) * 1024  # bytes
    return out


# ---------------------------------------------------------------------------------------------
# One request, streamed (server-sent events): the text, the time of the first token and of the
# end, and the engine's usage counts.

def one_request_into(port, prompt, max_tokens, timeout, t0, box):
    body = {"model": "smollm2", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    res = {"text": "", "first": None, "end": None, "usage": None, "events": 0, "error": None}
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("POST", "/v1/completions", body=json.dumps(body),
                     headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        if r.status != 200:
            res["error"] = f"HTTP {r.status}: {r.read()[:300]!r}"
            return
        for raw in r:
            line = raw.strip()
            if not line.startswith(b"data: "):
                continue
            payload = line[6:]
            if payload == b"[DONE]":
                break
            ev = json.loads(payload)
            if ev.get("usage"):
                res["usage"] = ev["usage"]
            for c in ev.get("choices") or []:
                if c.get("text"):
                    if res["first"] is None:
                        res["first"] = time.perf_counter() - t0
                    res["text"] += c["text"]
                    res["events"] += 1
        res["end"] = time.perf_counter() - t0
    except Exception as e:  # noqa: BLE001 - reported in the results, never silently dropped
        res["error"] = repr(e)
    finally:
        conn.close()
        box["res"] = res


def run_batch(port, prompts, max_tokens, timeout):
    """All prompts at once, one thread each; wall time from the first send to the last byte."""
    results = [None] * len(prompts)
    t0 = time.perf_counter()
    threads = []
    for i, p in enumerate(prompts):
        def go(i=i, p=p):
            box = {}
            one_request_into(port, p, max_tokens, timeout, t0, box)
            results[i] = box["res"]
        t = threading.Thread(target=go, daemon=True)
        t.start()
        threads.append(t)
    deadline = t0 + timeout
    for t in threads:
        t.join(max(0.0, deadline - time.perf_counter()))
    wall = time.perf_counter() - t0
    if any(r is None for r in results):
        raise RuntimeError(f"requests still running after {timeout} s")
    errors = [r["error"] for r in results if r["error"]]
    if errors:
        raise RuntimeError(f"{len(errors)} request(s) failed, first: {errors[0]}")
    return wall, results


# ---------------------------------------------------------------------------------------------
# Weights.

def make_gguf(llama_bin, src, dtype, log_dir):
    """The Q4_1 file requantized by llama.cpp to F32 or BF16 (every tensor dequantized exactly,
    then stored in the target type; cached beside the source)."""
    dst = os.path.splitext(src)[0] + f".{dtype.upper()}.gguf"
    if os.path.exists(dst):
        return dst
    tmp = dst + ".tmp"
    with open(os.path.join(log_dir, f"quantize-{dtype}.log"), "w") as log:
        subprocess.run([os.path.join(llama_bin, "llama-quantize"), "--allow-requantize", src, tmp,
                        dtype.upper()], stdout=log, stderr=subprocess.STDOUT, check=True,
                       timeout=600)
    os.replace(tmp, dst)
    return dst


# SmolLM2-135M: 30 layers x 3 KV heads x head_dim 64, K and V. Only used to size chunkserve's KV
# arena to the same token capacity as llama-server's context (--kv-cache-mb overrides).
KV_ELEMS_PER_TOKEN = 30 * 3 * 64 * 2
DTYPE_BYTES = {"f32": 4, "bf16": 2, "f16": 2}


def first_difference(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def run_dtype(args, dtype):
    gguf = make_gguf(args.llama_bin, args.model, dtype, args.log_dir)
    ctx_total = args.users * args.ctx_per_user
    kv_mb = args.kv_cache_mb or -(-ctx_total * KV_ELEMS_PER_TOKEN * DTYPE_BYTES[dtype] // (1 << 20)) + 8
    servers = {}
    t = time.perf_counter()
    servers["chunkserve_sharing_on"] = start_chunkserve(
        args, gguf, dtype, True, kv_mb, os.path.join(args.log_dir, f"worker-on-{dtype}.log"))
    servers["chunkserve_sharing_off"] = start_chunkserve(
        args, gguf, dtype, False, kv_mb, os.path.join(args.log_dir, f"worker-off-{dtype}.log"))
    servers["llama_server"] = start_llama(
        args, gguf, dtype, ctx_total, os.path.join(args.log_dir, f"llama-server-{dtype}.log"))
    print(f"[{dtype}] servers up in {time.perf_counter() - t:.1f} s ({gguf}, KV: "
          f"{ctx_total} tokens, chunkserve --kv-cache-mb {kv_mb})", file=sys.stderr, flush=True)
    idle_mem = {c: proc_mem(p.pid) for c, (p, _) in servers.items()}

    walls = {w: {c: [] for c in CONFIGS} for w in WORKLOADS}
    prefill = {c: [] for c in CONFIGS}
    texts = {}   # round 1: workload -> config -> [texts]
    usage = {}   # workload -> config -> (prompt tokens, completion tokens) of round 1
    # Round 0 is a warm-up (page faults, thread pools, first-use allocations) with the small
    # workload only, not counted.
    for rnd in range(args.rounds + 1):
        for w, (_, make) in WORKLOADS.items():
            if (args.workloads and w not in args.workloads) or (rnd == 0 and w != "5_prompts"):
                continue
            prompts, new_tokens = make(rnd)
            for c in CONFIGS:
                proc, port = servers[c]
                try:
                    wall, results = run_batch(port, prompts, new_tokens, args.request_timeout)
                finally:
                    if proc.poll() is not None:
                        print(f"[{dtype}] {c} exited with status {proc.returncode} during the "
                              f"run (log in {args.log_dir})", file=sys.stderr, flush=True)
                if rnd == 0:
                    continue
                walls[w][c].append(wall)
                if w == "32_users":
                    prefill[c].append(max(r["first"] for r in results))
                if rnd == 1:
                    texts.setdefault(w, {})[c] = [r["text"] for r in results]
                    u = [r["usage"] or {} for r in results]
                    usage.setdefault(w, {})[c] = {
                        "prompt_tokens": [x.get("prompt_tokens") for x in u],
                        "completion_tokens": [x.get("completion_tokens") for x in u],
                        "text_events": [r["events"] for r in results]}
                print(f"[{dtype}] round {rnd} {w} {c}: {wall:.2f} s", file=sys.stderr,
                      flush=True)
    peak_mem = {c: proc_mem(p.pid) for c, (p, _) in servers.items()}
    _kill_all()

    agreement = {}
    for w, by_config in texts.items():
        ref = by_config["llama_server"]
        agreement[w] = {}
        for c in ("chunkserve_sharing_on", "chunkserve_sharing_off"):
            same = [a == b for a, b in zip(by_config[c], ref)]
            agreement[w][c] = {
                "identical": sum(same), "of": len(same),
                "first_difference_chars": [first_difference(a, b)
                                           for a, b in zip(by_config[c], ref)]}
    med = lambda xs: statistics.median(xs) if xs else None  # noqa: E731
    return {
        "dtype": dtype, "gguf": gguf, "kv_tokens": ctx_total, "chunkserve_kv_cache_mb": kv_mb,
        "wall_s": {w: {c: {"median": med(v), "rounds": v} for c, v in by_c.items()}
                   for w, by_c in walls.items()},
        "prefill_32_users_s": {c: {"median": med(v), "rounds": v} for c, v in prefill.items()},
        "memory_bytes": {c: {"rss_idle": idle_mem[c]["VmRSS"], "peak": peak_mem[c]["VmHWM"]}
                         for c in CONFIGS},
        "tokens_round1": usage,
        "greedy_agreement_with_llama_server": agreement,
        "texts_round1": texts,
    }


def fmt_s(x):
    return "-" if x is None else f"{x:.2f} s"


def fmt_gb(b):
    return f"{b / 1e9:.2f} GB"


def print_table(res, out=sys.stdout):
    print = functools.partial(builtins.print, file=out, flush=True)  # noqa: A001
    d = res["dtype"]
    print(f"\n### {d} weights ({os.path.basename(res['gguf'])}), medians of the rounds\n")
    print("| workload | " + " | ".join(HEADERS[c] for c in CONFIGS) + " |")
    print("|---|" + "---|" * len(CONFIGS))
    for w, (title, _) in WORKLOADS.items():
        if w in res["wall_s"] and res["wall_s"][w]["llama_server"]["median"] is not None:
            print(f"| {title} | " + " | ".join(fmt_s(res["wall_s"][w][c]["median"])
                                                for c in CONFIGS) + " |")
    if res["prefill_32_users_s"]["llama_server"]["median"] is not None:
        print("| 32 users: prefill (last first token) | " +
              " | ".join(fmt_s(res["prefill_32_users_s"][c]["median"]) for c in CONFIGS) + " |")
    print("| resident memory after load (VmRSS) | " +
          " | ".join(fmt_gb(res["memory_bytes"][c]["rss_idle"]) for c in CONFIGS) + " |")
    print("| resident memory, peak (VmHWM) | " +
          " | ".join(fmt_gb(res["memory_bytes"][c]["peak"]) for c in CONFIGS) + " |")
    for w, by_c in res["tokens_round1"].items():
        parts = []
        for c in CONFIGS:
            pt = [x for x in by_c[c]["prompt_tokens"] if x is not None]
            ct = [x for x in by_c[c]["completion_tokens"] if x is not None]
            parts.append(f"{c}: prompt {min(pt) if pt else '?'}..{max(pt) if pt else '?'}, "
                         f"completion {sum(ct) if ct else '?'}")
        print(f"\ntokens ({w}, round 1): " + "; ".join(parts))
    for w, by_c in res["greedy_agreement_with_llama_server"].items():
        print(f"greedy text equal to llama-server's ({w}): " + "; ".join(
            f"{c} {a['identical']}/{a['of']}" for c, a in by_c.items()))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--llama-bin", required=True, help="folder with llama-server, llama-quantize")
    ap.add_argument("--worker", default="build/bin/chunkserve-worker")
    ap.add_argument("--model", default=MODEL, help="the Q4_1 GGUF the F32/BF16 files come from")
    ap.add_argument("--dtypes", default="f32,bf16")
    ap.add_argument("--workloads", default="", help="comma list of 32_users,5_prompts (all)")
    ap.add_argument("--rounds", type=int, default=3, help="counted rounds, after one warm-up")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--users", type=int, default=32, help="llama-server slots (-np)")
    ap.add_argument("--ctx-per-user", type=int, default=768,
                    help="KV tokens per user in both engines (llama-server -c = users x this)")
    ap.add_argument("--kv-cache-mb", type=int, default=0, help="chunkserve's arena; 0 = derived")
    ap.add_argument("--llama-args", default="", help="extra llama-server arguments")
    ap.add_argument("--start-timeout", type=float, default=120)
    ap.add_argument("--request-timeout", type=float, default=600)
    ap.add_argument("--log-dir", default="", help="server logs (default: a temporary folder)")
    ap.add_argument("--json", default="", help="also write the JSON here")
    args = ap.parse_args()
    args.workloads = [w for w in args.workloads.split(",") if w]
    if not args.log_dir:
        import tempfile
        args.log_dir = tempfile.mkdtemp(prefix="llamacpp-side-by-side-")
    os.makedirs(args.log_dir, exist_ok=True)
    for path in (args.worker, os.path.join(args.llama_bin, "llama-server"), args.model):
        if not os.path.exists(path):
            sys.exit(f"missing {path} (tests/bench/llamacpp_side_by_side.sh builds and fetches)")

    machine = {"cpu": "", "cores": os.cpu_count(), "load_avg_start": os.getloadavg()}
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        for key in ("Model name", "CPU family", "Model"):
            m = re.search(rf"^{key}:\s*(.+)$", out, re.M)
            if m:
                machine[key.lower().replace(" ", "_")] = m.group(1).strip()
    except OSError:
        pass
    t0 = time.perf_counter()
    results = []
    for d in (d for d in args.dtypes.split(",") if d):
        results.append(run_dtype(args, d))
        print_table(results[-1], sys.stderr)  # as it comes: a long run shows its first half
    machine["load_avg_end"] = os.getloadavg()
    report = {"machine": machine, "threads": args.threads, "rounds": args.rounds,
              "total_s": time.perf_counter() - t0, "logs": args.log_dir, "results": results}
    print(f"\nmachine: {machine}; {args.threads} threads per server; {args.rounds} rounds "
          f"(+1 warm-up); total {report['total_s']:.0f} s; logs in {args.log_dir}")
    for r in results:
        print_table(r)
    print("\n" + json.dumps(report))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
