#!/usr/bin/env python3
"""ctest multinode.*: chunkserve as a cluster of hosts with a real network between them.

Every case builds its own cluster with examples/cluster/netns_cluster.sh (network namespaces, a
user-space switch with netem-like links: examples/cluster/README.md, "Multi-node on one machine")
using the commands that README shows, checks what the case is about, prints what it measured
(lines starting with "measured:") and tears the cluster down. Cases:

  baseline          2 ms +- 1 ms between hosts, cluster secret + client token: loadgen's shared
                    phase and its control, every request complete, exact token counts, hits
  baseline_tls      the same with TLS on every wire link (cluster CA, a certificate per node)
  worker_partition  a worker cut off silently while it streams: detection time, re-routed and
                    migrated requests, every token once, its orphaned streams cancelled during
                    the partition; heal: it rejoins and serves, no stale index entries
  client_partition  the client cut off from the router mid-stream: the client's error within its
                    bound, the workers' chunks freed
  lossy             20 ms and 1% loss on every link under load for CSN_LOSSY_SECONDS (default
                    40; CSN_LOSSY_RATE requests/s, default 3; CSN_LOSSY_SHAPE the links'
                    settings, default "delay 20ms loss 1%", "" for an unshaped control): nothing
                    lost or duplicated; throughput and TTFT
  two_routers       two routers in front of the same workers, per policy (ttft, consistent_hash):
                    the fraction of a prefix's requests landing on its first holder via either

Exit status: 0 pass, 1 fail, 77 skip (no root, no `ip`, no namespaces or TUN here: ctest's
SKIP_RETURN_CODE). Standard library only.

  multinode_test.py --script examples/cluster/netns_cluster.sh --bin build/bin CASE
"""
import argparse
import datetime
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time

SKIP = 77
VOCAB = 1024  # the built-in tiny model
LEASE_S = 3.0  # netns_cluster.sh starts routers with --lease-ms 3000
LINK_IDLE_S = 5.0  # the router's --link-idle-timeout-ms default: the keepalive bound
RECONNECT_MAX_S = 5.0  # a worker's reconnect backoff cap
CONNECT_TIMEOUT_S = 3.0  # a worker's connection attempt to a router
UNACKED_S = 10.0  # wire connections close when sent data stays unacknowledged this long


class Skip(Exception):
    pass


class Fail(Exception):
    pass


def log(msg):
    print(msg, flush=True)


def measured(name, value, unit=""):
    log("measured: %s = %s%s" % (name, value, (" " + unit) if unit else ""))


def check(cond, what):
    if not cond:
        raise Fail(what)
    log("ok: " + what)


def poll(predicate, timeout, interval=0.1):
    """predicate() until it returns a truthy value (returned) or `timeout` seconds pass (None)."""
    end = time.time() + timeout
    while True:
        v = predicate()
        if v:
            return v
        if time.time() >= end:
            return None
        time.sleep(interval)


def glog_time(line):
    """Wall-clock seconds of a glog line (`W20261126 23:59:34.594782 ...`, local time)."""
    m = re.match(r"^[IWEF](\d{8} \d\d:\d\d:\d\d\.\d{6}) ", line)
    if not m:
        return None
    return datetime.datetime.strptime(m.group(1), "%Y%m%d %H:%M:%S.%f").timestamp()


class Cluster:
    """One netns_cluster.sh cluster: `up` in the background, the other commands on demand."""

    def __init__(self, script, bin_dir, name, up_args):
        self.script = script
        self.state = tempfile.mkdtemp(prefix="csn-%s-" % name)
        self.env = dict(os.environ, BIN=bin_dir, CSN_STATE=self.state)
        self.up_args = up_args
        self.proc = None
        self.ok = False

    def __enter__(self):
        cmd = [self.script, "up", *self.up_args, "--owner", str(os.getpid())]
        log("$ " + " ".join(cmd))
        self.up_log = open(os.path.join(self.state, "up.out"), "w")
        start = time.time()
        self.proc = subprocess.Popen(cmd, env=self.env, stdout=self.up_log,
                                     stderr=subprocess.STDOUT)
        ready = poll(lambda: os.path.exists(os.path.join(self.state, "ready")) or
                     self.proc.poll() is not None, 240, 0.2)
        if self.proc.poll() is not None:
            out = open(os.path.join(self.state, "up.out")).read()
            if self.proc.returncode == SKIP:
                raise Skip(out.strip().splitlines()[-1] if out.strip() else "netns_cluster.sh up: 77")
            raise Fail("netns_cluster.sh up exited %d:\n%s" % (self.proc.returncode, out))
        if not ready:
            raise Fail("the cluster was not ready within 240 s")
        measured("cluster up", "%.1f" % (time.time() - start), "s")
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None and exc_type is not Skip:
            self.dump_logs()
        self.sh("down", check=False, timeout=120)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.up_log.close()
        leftovers = [n for n in self.netns_list() if n.startswith("csn-%d-" % self.proc.pid)]
        if leftovers:
            log("FAIL: namespaces left behind: %s" % leftovers)
            self.sh("clean", check=False)
            if exc_type is None:
                raise Fail("teardown left namespaces behind")
        if exc_type is None:
            shutil.rmtree(self.state, ignore_errors=True)
        else:
            log("state and logs kept in " + self.state)
        return False

    @staticmethod
    def netns_list():
        out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        return [line.split()[0] for line in out.splitlines() if line.strip()]

    def dump_logs(self):
        logs = os.path.join(self.state, "logs")
        for name in sorted(os.listdir(logs)) if os.path.isdir(logs) else []:
            path = os.path.join(logs, name)
            lines = open(path, errors="replace").read().splitlines()
            log("--- %s (last 25 lines)" % path)
            for line in lines[-25:]:
                log("    " + line)

    def sh(self, *args, check=True, timeout=60, quiet=False):
        cmd = [self.script, *args]
        if not quiet:
            log("$ netns_cluster.sh " + " ".join(args))
        p = subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=timeout)
        if check and p.returncode != 0:
            raise Fail("netns_cluster.sh %s exited %d: %s" % (" ".join(args), p.returncode,
                                                              (p.stderr + p.stdout).strip()))
        return p.stdout

    def applied_at(self, out):
        m = re.search(r"applied at ([0-9.]+)", out)
        if not m:
            raise Fail("no 'applied at' in: " + out)
        return float(m.group(1))

    def shape(self, *settings):
        return self.applied_at(self.sh("shape", *settings))

    def cut(self, *hosts):
        return self.applied_at(self.sh("cut", *hosts))

    def heal(self, *hosts):
        return self.applied_at(self.sh("heal", *hosts))

    def metrics(self, host):
        out = self.sh("metrics", host, check=False, quiet=True, timeout=30)
        values = {}
        for line in out.splitlines():
            if line.startswith("#") or not line.strip():
                continue
            series, _, value = line.rpartition(" ")
            try:
                values[series] = float(value)
            except ValueError:
                pass
        return values

    def metric(self, host, series, default=None):
        return self.metrics(host).get(series, default)

    def stats(self):
        return json.loads(self.sh("stats", quiet=True))

    def log_path(self, host):
        return os.path.join(self.state, "logs", host + ".log")

    def log_times(self, host, pattern):
        """Wall-clock times of the lines of HOST's log matching `pattern` (a regex)."""
        times = []
        for line in open(self.log_path(host), errors="replace"):
            if re.search(pattern, line):
                t = glog_time(line)
                if t is not None:
                    times.append(t)
        return times

    def trace(self, name, requests):
        """Writes a loadgen JSONL trace; returns its path."""
        path = os.path.join(self.state, name + ".jsonl")
        with open(path, "w") as f:
            for r in requests:
                f.write(json.dumps(r) + "\n")
        return path

    def loadgen_cmd(self, args, via="r0"):
        return [self.script, "loadgen", "--via", via, *args]

    def loadgen(self, args, via="r0", timeout=600, expect_ok=True, label=None):
        """Runs loadgen to the end; returns (exit status, its JSON phases or None, output)."""
        json_path = os.path.join(self.state, "loadgen-%s.json" % (label or str(time.time())))
        cmd = self.loadgen_cmd([*args, "--json", json_path], via)
        log("$ netns_cluster.sh " + " ".join(cmd[1:]))
        p = subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=timeout)
        phases = None
        if p.returncode == 0 and os.path.exists(json_path):
            phases = json.load(open(json_path))["phases"]
        if expect_ok and p.returncode != 0:
            raise Fail("loadgen exited %d: %s" % (p.returncode, (p.stderr + p.stdout)[-2000:]))
        return p.returncode, phases, p.stdout + p.stderr

    def loadgen_background(self, args, label, via="r0"):
        json_path = os.path.join(self.state, "loadgen-%s.json" % label)
        out = open(os.path.join(self.state, "loadgen-%s.out" % label), "w")
        cmd = self.loadgen_cmd([*args, "--json", json_path], via)
        log("$ netns_cluster.sh " + " ".join(cmd[1:]) + " &")
        p = subprocess.Popen(cmd, env=self.env, stdout=out, stderr=subprocess.STDOUT)
        p.json_path, p.out_path, p.out, p.started = json_path, out.name, out, time.time()
        return p

    def finish_background(self, p, timeout):
        try:
            p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            raise Fail("loadgen %s did not end within %d s" % (p.json_path, timeout))
        p.out.close()
        text = open(p.out_path).read()
        if p.returncode != 0:
            raise Fail("loadgen exited %d: %s" % (p.returncode, text[-2000:]))
        return json.load(open(p.json_path))["phases"]


def check_phase(phase, what, min_hit=None, max_hit=None):
    """Every request finished, no error, continuous indices, exact token counts."""
    n = phase["requests"]
    log("%s: %d requests, %d finished, %d errors, %d bad indices, %d incomplete, %d tokens; "
        "hit %.1f%%, TTFT mean %.1f / p50 %.1f / p99 %.1f ms, e2e p50 %.1f / p99 %.1f ms, "
        "%.2f req/s, %.1f tok/s" % (
            what, n, phase["finished"], phase["errors"], phase["bad_indices"],
            phase["incomplete"], phase["tokens"], 100 * phase["hit_rate"], phase["ttft_mean_ms"],
            phase["ttft_p50_ms"], phase["ttft_p99_ms"], phase["e2e_p50_ms"], phase["e2e_p99_ms"],
            phase["requests_per_s"], phase["output_tokens_per_s"]))
    check(phase["finished"] == n and phase["errors"] == 0,
          "%s: all %d requests finished without error" % (what, n))
    check(phase["bad_indices"] == 0, "%s: token indices continuous in every stream" % what)
    check(phase["incomplete"] == 0,
          "%s: every stream delivered exactly its max_new_tokens, as its Finish counted" % what)
    if min_hit is not None:
        check(phase["hit_rate"] >= min_hit, "%s: hit rate %.1f%% >= %.0f%%" % (
            what, 100 * phase["hit_rate"], 100 * min_hit))
    if max_hit is not None:
        check(phase["hit_rate"] <= max_hit, "%s: hit rate %.1f%% <= %.0f%%" % (
            what, 100 * phase["hit_rate"], 100 * max_hit))


def tokens(rng, n):
    return [rng.randrange(VOCAB) for _ in range(n)]


def worker_idle(c, host):
    m = c.metrics(host)
    return (m.get("chunkserve_running") == 0 and m.get("chunkserve_queued") == 0 and
            m.get("chunkserve_kv_bytes_referenced") == 0)


def tcp_rtt_ms(c, src, dst, port, n=21):
    """Median time of a TCP connect from host `src` to host `dst` (one round trip), in ms."""
    code = ("import socket, statistics, sys, time\n"
            "ts = []\n"
            "for _ in range(%d):\n"
            "    t = time.perf_counter()\n"
            "    s = socket.create_connection((sys.argv[1], %d), timeout=10)\n"
            "    ts.append(time.perf_counter() - t)\n"
            "    s.close()\n"
            "    time.sleep(0.02)\n"
            "print(1000 * statistics.median(ts))\n" % (n, port))
    addr = c.sh("addr", dst, quiet=True).strip()
    return float(c.sh("exec", src, "python3", "-c", code, addr, quiet=True))


def tcp_retransmits(c, host):
    out = c.sh("exec", host, "cat", "/proc/net/snmp", quiet=True)
    rows = [line.split() for line in out.splitlines() if line.startswith("Tcp:")]
    if len(rows) < 2:
        return None
    return dict(zip(rows[0][1:], (int(x) for x in rows[1][1:])))


# --- cases ---------------------------------------------------------------------------------------

BASELINE_LOAD = ["--requests", "48", "--rate", "6", "--tenants", "4", "--zipf", "1.0",
                 "--prefix-tokens", "384,256", "--suffix-tokens", "16,48", "--output-tokens",
                 "16,64", "--connections", "4", "--seed", "7", "--timeout-s", "180"]


def baseline(a, tls=False):
    up = ["--workers", "3", "--secret"] + (["--tls"] if tls else [])
    with Cluster(a.script, a.bin, "baseline", up) as c:
        rtt0 = tcp_rtt_ms(c, "client", "r0", 9000)
        c.shape("all", "delay", "2ms", "1ms")
        rtt = tcp_rtt_ms(c, "client", "r0", 9000)
        measured("TCP connect time client -> r0 (one round trip), median", "%.2f ms shaped, "
                 "%.2f ms unshaped" % (rtt, rtt0))
        check(rtt >= 2.5, "the links add their delay (round trip %.2f ms >= 2.5 ms)" % rtt)
        load = BASELINE_LOAD if not tls else BASELINE_LOAD[:1] + ["24"] + BASELINE_LOAD[2:]
        _, phases, out = c.loadgen(load, label="baseline")
        log(out)
        shared, control = phases
        check_phase(shared, "shared", min_hit=0.3)
        check_phase(control, "control", max_hit=0.05)
        stats = c.stats()
        check(all(stats[h]["delay_ms"] == 2 and stats[h]["jitter_ms"] == 1
                  for h in stats if not h.startswith("_")),
              "every host's link: 2 ms +- 1 ms")
        m = c.metrics("r0")
        check(m.get("chunkserve_router_workers_alive") == 3 and
              m.get("chunkserve_router_workers_dead_total") == 0,
              "3 workers alive, none ever lost")
        measured("shared hit rate", "%.1f%%" % (100 * shared["hit_rate"]))
        measured("shared TTFT p50/p99", "%.1f / %.1f" % (shared["ttft_p50_ms"],
                                                        shared["ttft_p99_ms"]), "ms")
        measured("control TTFT p50/p99", "%.1f / %.1f" % (control["ttft_p50_ms"],
                                                         control["ttft_p99_ms"]), "ms")
        measured("throughput (shared)", "%.2f req/s, %.1f tok/s" % (
            shared["requests_per_s"], shared["output_tokens_per_s"]))
        if tls:
            # TLS is really on: a plaintext client is refused, and told why.
            p = subprocess.run(
                [c.script, "exec", "client", os.path.join(a.bin, "chunkserve-loadgen"), "--target",
                 c.sh("addr", "r0", quiet=True).strip() + ":7000", "--requests", "2",
                 "--no-control", "--timeout-s", "60"],
                env=c.env, capture_output=True, text=True, timeout=120)
            out = p.stdout + p.stderr
            log("plaintext client: " + " | ".join(
                line for line in out.splitlines() if "rror" in line or "TLS" in line))
            check(p.returncode != 0 and "requires TLS" in out,
                  "a plaintext client is refused, told that TLS is required")


def worker_partition(a):
    partition_s = float(os.environ.get("CSN_PARTITION_SECONDS", "20"))
    up = ["--workers", "3", "--policy", "round_robin", "--kv-mb", "32"]
    with Cluster(a.script, a.bin, "wpart", up) as c:
        c.shape("all", "delay", "2ms", "1ms")
        rng = random.Random(22)
        prefixes = [tokens(rng, 256) for _ in range(4)]
        # Long streams, one every 0.1 s, round robin over the 3 workers (4 each); long enough
        # that w1's cannot end on their own during the partition (near the model's 8192
        # positions).
        stream_tokens = 7800
        streams = [{"arrival_s": 0.1 * i, "prompt": prefixes[i % 4] + tokens(rng, 16),
                    "output_tokens": stream_tokens} for i in range(12)]
        # Short requests that arrive just after the cut (their loadgen is connected before it),
        # while the router still counts the worker: round robin gives it every third, which
        # cannot start there (re-routed at detection).
        burst = [{"arrival_s": 0.8 + 0.05 * i, "prompt": prefixes[i % 4] + tokens(rng, 24),
                  "output_tokens": 8} for i in range(9)]
        # After the heal: prefixes seen before, round robin again (so the rejoined worker gets
        # its share); routing precision shows whether the index predicts chunks it lacks.
        after = [{"arrival_s": 0.2 * i, "prompt": prefixes[i % 4] + tokens(rng, 16),
                  "output_tokens": 8} for i in range(12)]
        common = ["--no-control", "--connections", "4", "--timeout-s", "240"]
        before = c.metrics("r0")
        bg = c.loadgen_background(["--trace", c.trace("streams", streams), *common], "streams")
        # Cut w1 once its 4 streams run (or 2 s into the run with at least one).
        running = poll(lambda: (c.metric("w1", "chunkserve_running") or 0) >=
                       (4 if time.time() - bg.started < 2.0 else 1), 60, 0.05)
        check(running, "w1 streams before the cut")
        on_w1 = int(c.metric("w1", "chunkserve_running"))
        measured("streams running on w1 at the cut", on_w1)
        burst_p = c.loadgen_background(["--trace", c.trace("burst", burst), *common], "burst")
        t_cut = c.cut("w1")
        up_w1 = 'chunkserve_router_worker_up{worker="w1"}'
        dead = poll(lambda: c.metric("r0", up_w1) == 0, 30)
        check(dead, "the router marked w1 dead")
        removed = [t for t in c.log_times("r0", r"worker w1 .* removed") if t >= t_cut - 1]
        check(removed, "the router's log says when it removed w1")
        detection = removed[0] - t_cut
        reason = [line.strip() for line in open(c.log_path("r0")) if "worker w1 (" in line and
                  "removed" in line][-1].split("removed: ")[-1]
        measured("detection time (cut -> w1 removed)", "%.2f" % detection, "s (%s)" % reason)
        check(detection <= LINK_IDLE_S + 1.0,
              "detected within the keepalive bound: %.2f s <= %.1f s (link idle %.0f s + 1 s)"
              % (detection, LINK_IDLE_S + 1.0, LINK_IDLE_S))
        m = c.metrics("r0")
        migrated = m["chunkserve_router_requests_migrated_total"] - \
            before["chunkserve_router_requests_migrated_total"]
        rerouted = m["chunkserve_router_requests_rerouted_total"] - \
            before["chunkserve_router_requests_rerouted_total"]
        measured("streams migrated", int(migrated))
        measured("unstarted requests re-routed", int(rerouted))
        check(migrated >= 1, "w1's streams migrated (%d)" % migrated)
        check(rerouted >= 1, "requests sent to w1 after the cut were re-routed (%d)" % rerouted)
        # w1 cannot tell a silent partition from a quiet router, but the tokens it streams into
        # the cut stay unacknowledged: at UNACKED_S its data link closes and the orphaned
        # streams are cancelled, long before the partition heals.
        orphans_ended = poll(lambda: worker_idle(c, "w1"), UNACKED_S + 5.0, 0.1)
        t_orphans = time.time()
        check(orphans_ended, "w1 ended its orphaned streams during the partition")
        measured("cut -> w1's orphaned streams ended", "%.2f" % (t_orphans - t_cut),
                 "s (unacknowledged-data timeout %.0f s)" % UNACKED_S)
        check(t_orphans - t_cut < partition_s, "before the heal")
        generated = c.metric("w1", "chunkserve_generated_tokens_total")
        measured("tokens w1 generated", "%d (its %d streams ask %d)" % (
            generated, on_w1, on_w1 * stream_tokens))
        check(generated < on_w1 * stream_tokens, "cancelled, not run to their end")

        # Heal after the partition has lasted partition_s (the worker closed its router link at
        # its idle deadline and has been trying to reconnect into the void since).
        time.sleep(max(0.0, t_cut + partition_s - time.time()))
        t_heal = c.heal("w1")
        measured("partition length", "%.1f" % (t_heal - t_cut), "s")
        back = poll(lambda: c.metric("r0", up_w1) == 1 and
                    c.metric("r0", "chunkserve_router_workers_alive") == 3, 60)
        check(back, "w1 registered again after the heal")
        joined = [t for t in c.log_times("r0", r"worker w1 generation .* joined") if t >= t_heal]
        check(joined, "the router's log says when w1 joined again")
        rejoin = joined[0] - t_heal
        measured("rejoin time (heal -> w1 joined)", "%.2f" % rejoin, "s")
        check(rejoin <= RECONNECT_MAX_S + CONNECT_TIMEOUT_S + 2.0,
              "rejoined within the reconnect backoff + connect timeout: %.2f s <= %.1f s" % (
                  rejoin, RECONNECT_MAX_S + CONNECT_TIMEOUT_S + 2.0))
        # Every request of both runs completed, each token exactly once.
        check_phase(c.finish_background(bg, 240)[0], "streams")
        check_phase(c.finish_background(burst_p, 240)[0], "burst")
        # Every worker goes idle: no chunk stays referenced.
        idle = poll(lambda: all(worker_idle(c, w) for w in ("w0", "w1", "w2")), 120, 0.5)
        check(idle, "every worker idle afterwards (no running request, no referenced KV)")

        routed_w1 = 'chunkserve_router_worker_routed_total{worker="w1"}'
        before_after = c.metrics("r0")
        _, phases, _ = c.loadgen(["--trace", c.trace("after", after), *common], label="after")
        check_phase(phases[0], "after the heal")
        m = c.metrics("r0")
        served = m[routed_w1] - before_after[routed_w1]
        check(served >= 1, "w1 serves again (%d of 12 requests routed to it)" % served)
        measured("routing precision after the heal", "%.3f" % phases[0].get("precision", 0),
                 "(predicted %d, reported %d cached tokens)" % (
                     phases[0].get("predicted_cached_tokens", 0),
                     phases[0].get("reported_cached_tokens", 0)))
        if phases[0].get("predicted_cached_tokens", 0) > 0:
            check(phases[0]["precision"] >= 0.9,
                  "the index predicts only chunks the workers have (precision %.3f >= 0.9)" %
                  phases[0]["precision"])
        entries = m["chunkserve_router_index_holder_entries"]
        chunks = sum(c.metric(w, "chunkserve_chunks") for w in ("w0", "w1", "w2"))
        measured("index entries vs chunks on the workers", "%d <= %d" % (entries, chunks))
        check(entries <= chunks, "the router indexes no chunk beyond what the workers hold "
              "(%d entries, %d chunks)" % (entries, chunks))


def client_partition(a):
    idle_timeout_s = 3.0
    up = ["--workers", "2", "--router-args", "--idle-timeout-ms %d" % (idle_timeout_s * 1000)]
    with Cluster(a.script, a.bin, "cpart", up) as c:
        c.shape("all", "delay", "2ms", "1ms")
        rng = random.Random(23)
        output = 4000
        # One connection, a request every 0.4 s for 4 s (so the router hears from the client until
        # the cut), each streaming 4000 tokens.
        reqs = [{"arrival_s": 0.4 * i, "prompt": tokens(rng, 200), "output_tokens": output}
                for i in range(10)]
        timeout_s = 12
        gen_before = sum(c.metric(w, "chunkserve_generated_tokens_total") for w in ("w0", "w1"))
        bg = c.loadgen_background(["--trace", c.trace("client", reqs), "--no-control",
                                   "--connections", "1", "--timeout-s", str(timeout_s)],
                                  "client")
        streaming = poll(lambda: time.time() - bg.started > 2.0 and
                         sum(c.metric(w, "chunkserve_running") or 0 for w in ("w0", "w1")) >= 2,
                         60, 0.05)
        check(streaming, "both workers stream to the client before the cut")
        t_cut = c.cut("client")
        # The router hears nothing more from the client: after its idle timeout it closes the
        # connection and cancels the client's requests; the workers free their chunks.
        idle = poll(lambda: all(worker_idle(c, w) for w in ("w0", "w1")), 60, 0.1)
        t_idle = time.time()
        check(idle, "the workers went idle")
        measured("cut -> workers idle (chunks freed)", "%.2f" % (t_idle - t_cut),
                 "s (router --idle-timeout-ms %d)" % (idle_timeout_s * 1000))
        check(t_idle - t_cut <= idle_timeout_s + 4.0,
              "chunks freed within the router's idle timeout + 4 s")
        gen = sum(c.metric(w, "chunkserve_generated_tokens_total") for w in ("w0", "w1")) - \
            gen_before
        asked = output * len(reqs)
        measured("tokens the workers generated", "%d of %d asked" % (gen, asked))
        check(gen < asked, "the requests were cancelled, not run to their end")
        m = c.metrics("r0")
        check(m.get("chunkserve_router_in_flight") == 0, "the router holds no request")
        # The client: a clear error within its own bound (--timeout-s from the phase start).
        try:
            bg.wait(timeout=timeout_s + 30)
        except subprocess.TimeoutExpired:
            bg.kill()
            raise Fail("loadgen outlived its --timeout-s by 30 s")
        t_err = time.time()
        bg.out.close()
        text = open(bg.out_path).read()
        log("loadgen: " + text.strip().replace("\n", "\n    "))
        check(bg.returncode != 0, "loadgen failed (exit %d)" % bg.returncode)
        check("did not finish within the timeout" in text or "connection closed" in text,
              "loadgen says why")
        measured("cut -> client error", "%.2f" % (t_err - t_cut),
                 "s (its --timeout-s %d from its start: %.2f s)" % (timeout_s,
                                                                   t_err - bg.started))
        check(t_err - bg.started <= timeout_s + 5, "the error came within the client's bound")
        # Healed, the same client host is served again.
        c.heal("client")
        _, phases, _ = c.loadgen(["--requests", "6", "--rate", "6", "--tenants", "2",
                                  "--output-tokens", "8,16", "--no-control", "--timeout-s", "120"],
                                 label="after")
        check_phase(phases[0], "after the heal")


def lossy(a):
    seconds = float(os.environ.get("CSN_LOSSY_SECONDS", "40"))
    rate = float(os.environ.get("CSN_LOSSY_RATE", "3"))
    shape = os.environ.get("CSN_LOSSY_SHAPE", "delay 20ms loss 1%").split()  # "": a control run
    n = max(1, int(seconds * rate))
    with Cluster(a.script, a.bin, "lossy", ["--workers", "3"]) as c:
        c.shape("all", *shape)
        before = c.metrics("r0")
        retrans0 = {h: tcp_retransmits(c, h) for h in ("client", "r0", "w0", "w1", "w2")}
        stats0 = c.stats()
        _, phases, out = c.loadgen([
            "--requests", str(n), "--rate", str(rate), "--tenants", "8", "--zipf", "1.0",
            "--prefix-tokens", "384,256,512", "--suffix-tokens", "16,48",
            "--output-tokens", "16,64", "--connections", "4", "--seed", "11", "--no-control",
            "--timeout-s", str(int(seconds) + 300)], timeout=seconds + 400, label="lossy")
        log(out)
        p = phases[0]
        check_phase(p, "%.0f s of load, links: %s" % (seconds, " ".join(shape) or "unshaped"))
        stats = c.stats()
        sent = sum(stats[h]["sent"] - stats0[h]["sent"] for h in stats if not h.startswith("_"))
        lost = sum(stats[h]["lost"] - stats0[h]["lost"] for h in stats if not h.startswith("_"))
        retrans = 0
        for h, r0 in retrans0.items():
            r1 = tcp_retransmits(c, h)
            if r0 and r1:
                retrans += r1["RetransSegs"] - r0["RetransSegs"]
        m = c.metrics("r0")
        deaths = m["chunkserve_router_workers_dead_total"] - \
            before["chunkserve_router_workers_dead_total"]
        measured("offered load", "%d requests at %.1f/s over %.0f s" % (n, rate, seconds))
        measured("packets through the switch", "%d, %d dropped by the loss setting (%.2f%%)" % (
            sent, lost, 100.0 * lost / max(1, sent)))
        measured("TCP retransmissions (all hosts)", retrans)
        measured("throughput", "%.2f req/s, %.1f tok/s" % (p["requests_per_s"],
                                                          p["output_tokens_per_s"]))
        measured("TTFT mean/p50/p99", "%.1f / %.1f / %.1f" % (
            p["ttft_mean_ms"], p["ttft_p50_ms"], p["ttft_p99_ms"]), "ms")
        measured("e2e p50/p99", "%.1f / %.1f" % (p["e2e_p50_ms"], p["e2e_p99_ms"]), "ms")
        measured("hit rate", "%.1f%%" % (100 * p["hit_rate"]))
        measured("workers lost to the router meanwhile", int(deaths))
        if "loss" in shape:
            check(lost > 0, "the links did drop packets")


def two_routers(a):
    rounds = int(os.environ.get("CSN_TWO_ROUTER_ROUNDS", "6"))
    later = 12  # requests after the first two, half through each router
    up = ["--workers", "3", "--routers", "4", "--policy",
          "ttft,ttft,consistent_hash,consistent_hash"]
    with Cluster(a.script, a.bin, "tworouters", up) as c:
        c.shape("all", "delay", "2ms", "1ms")
        workers = ("w0", "w1", "w2")
        rng = random.Random(25)
        results = {}
        for policy, pair in (("ttft", ("r0", "r1")), ("consistent_hash", ("r2", "r3"))):
            agree = on_holder = total = 0

            def routed():
                return {(r, w): c.metric(r, 'chunkserve_router_worker_routed_total'
                                         '{worker="%s"}' % w) or 0
                        for r in pair for w in workers}

            def both(label, make):
                """One loadgen per router of the pair, started together; waits for both."""
                procs = [c.loadgen_background(
                    ["--trace", c.trace("%s-%s" % (label, via), make(i)), "--no-control",
                     "--timeout-s", "120"], "%s-%s" % (label, via), via=via)
                    for i, via in enumerate(pair)]
                for p, via in zip(procs, pair):
                    phase = c.finish_background(p, 180)[0]
                    check(phase["finished"] == phase["requests"] and phase["errors"] == 0 and
                          phase["bad_indices"] == 0 and phase["incomplete"] == 0,
                          "%s via %s: %d requests complete" % (label, via, phase["requests"]))

            for k in range(rounds):
                prefix = tokens(rng, 384)
                label = "%s-%d" % (policy, k)
                # From an idle cluster whose load reports have reached both routers, so that a
                # disagreement is the placement's, not a load the routers saw differently.
                check(poll(lambda: all(worker_idle(c, w) for w in workers), 60, 0.2),
                      "%s: workers idle" % label)
                time.sleep(0.5)
                # A new prefix reaches both routers at the same moment: each places it without
                # knowing the other's pick (the workers' KV events come a few ms later).
                r0 = routed()
                both(label + "-first", lambda i: [{
                    "arrival_s": 0.3, "prompt": prefix + tokens(rng, 16), "output_tokens": 8}])
                r1 = routed()
                picks = []
                for r in pair:
                    got = [w for w in workers if r1[(r, w)] > r0[(r, w)]]
                    check(len(got) == 1, "%s: %s placed the new prefix on one worker (%s)" % (
                        label, r, got))
                    picks.append(got[0])
                holder = picks[0]
                agree += picks[0] == picks[1]
                # Then a burst of the same prefix through both.
                both(label + "-later", lambda i: [{
                    "arrival_s": 0.08 * j + 0.04 * i, "prompt": prefix + tokens(rng, 16),
                    "output_tokens": 24} for j in range(later // 2)])
                r2 = routed()
                on = sum(r2[(r, holder)] - r1[(r, holder)] for r in pair)
                all_ = sum(r2[(r, w)] - r1[(r, w)] for r in pair for w in workers)
                log("%s: first placed on %s via %s and on %s via %s; %d of %d later requests on "
                    "%s" % (label, picks[0], pair[0], picks[1], pair[1], on, all_, holder))
                on_holder += on + (picks[1] == holder) + 1
                total += all_ + 2
            results[policy] = (agree, on_holder, total)
            measured("two routers, %s: new prefix placed on the same worker by both" % policy,
                     "%d of %d rounds" % (agree, rounds))
            measured("two routers, %s: requests for a prefix on its first holder" % policy,
                     "%.3f" % (on_holder / max(1, total)),
                     "(%d of %d, via either router)" % (on_holder, total))
        ch_agree, ch_on, ch_total = results["consistent_hash"]
        check(ch_agree == rounds and ch_on == ch_total,
              "consistent_hash: both routers put every request of a prefix on its first holder")


CASES = {
    "baseline": baseline,
    "baseline_tls": lambda a: baseline(a, tls=True),
    "worker_partition": worker_partition,
    "client_partition": client_partition,
    "lossy": lossy,
    "two_routers": two_routers,
}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--script", required=True, help="examples/cluster/netns_cluster.sh")
    p.add_argument("--bin", required=True, help="directory with the chunkserve binaries")
    p.add_argument("case", choices=sorted(CASES))
    a = p.parse_args()
    a.script = os.path.abspath(a.script)
    if os.geteuid() != 0:
        log("SKIP: not root (network namespaces and TUN devices need root)")
        return SKIP
    if shutil.which("ip") is None:
        log("SKIP: no 'ip' command (iproute2)")
        return SKIP
    start = time.time()
    try:
        CASES[a.case](a)
    except Skip as e:
        log("SKIP: %s" % e)
        return SKIP
    except Fail as e:
        log("FAIL: %s" % e)
        return 1
    except Exception:  # a bug here, or an unexpected answer: a failure, with its traceback
        import traceback
        traceback.print_exc()
        log("FAIL: unexpected error")
        return 1
    measured("case wall time", "%.1f" % (time.time() - start), "s")
    log("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
