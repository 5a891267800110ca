#!/usr/bin/env python3
"""chunkserve-sim --plot: a real simulator run draws real PNGs, and the drawing script refuses a
malformed log with the file and line in its message.

  python3 tests/router/sim_plot_test.py BIN_DIR

Exit 77 (ctest: skipped) when no interpreter with matplotlib is found (.ci/python-deps installs it
into ~/.cache/chunkserve/venv).
"""

import os
import struct
import subprocess
import sys
import tempfile


def python_with_matplotlib():
    candidates = [os.environ.get("CHUNKSERVE_PYTHON"),
                  os.path.expanduser("~/.cache/chunkserve/venv/bin/python"), "python3"]
    for py in candidates:
        if not py:
            continue
        try:
            if subprocess.run([py, "-c", "import matplotlib"], capture_output=True,
                              timeout=60).returncode == 0:
                return py
        except (OSError, subprocess.TimeoutExpired):
            pass
    return None


def png_size(path):
    with open(path, "rb") as f:
        head = f.read(24)
    if head[:8] != b"\x89PNG\r\n\x1a\n" or head[12:16] != b"IHDR":
        raise AssertionError(f"{path} is not a PNG")
    return struct.unpack(">II", head[16:24])


def main():
    bin_dir = sys.argv[1]
    py = python_with_matplotlib()
    if py is None:
        print("SKIP: no python with matplotlib (bash .ci/python-deps)")
        return 77
    env = dict(os.environ, CHUNKSERVE_PYTHON=py)
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "plots")
        run = subprocess.run([os.path.join(bin_dir, "chunkserve-sim"), "--workers", "4",
                              "--requests", "200", "--policies", "ttft,least_loaded", "--quiet",
                              "--plot", out], capture_output=True, text=True, timeout=300, env=env)
        assert run.returncode == 0, run.stderr
        for name in ("policies.png", "load.png"):
            w, h = png_size(os.path.join(out, name))
            assert w >= 600 and h >= 300, f"{name} is {w}x{h}"
        with open(os.path.join(out, "requests.jsonl"), encoding="utf-8") as f:
            assert sum(1 for _ in f) == 400  # 200 requests x 2 policies
        # A malformed log line: exit status 2 and the line named, nothing drawn.
        bad = os.path.join(tmp, "bad.jsonl")
        with open(bad, "w", encoding="utf-8") as f:
            f.write('{"policy": "ttft", "arrival_s": 0, "worker": 0, "ttft_s": 0.1, "end_s": 1}\n')
            f.write('{"policy": "ttft", "worker": 0}\n')
        again = os.path.join(tmp, "again")
        run = subprocess.run([py, os.path.join(bin_dir, "chunkserve-sim-plot.py"), "--json",
                              os.path.join(out, "results.json"), "--log", bad, "--out", again],
                             capture_output=True, text=True, timeout=120)
        assert run.returncode == 2, run
        assert "bad.jsonl:2: missing arrival_s" in run.stderr, run.stderr
        assert not os.path.exists(os.path.join(again, "policies.png"))
    print("ok: sim --plot drew policies.png and load.png; a malformed log is refused")
    return 0


if __name__ == "__main__":
    sys.exit(main())
