#!/usr/bin/env python3
"""HF tokenizers' Encode throughput on the same text as `chunkserve-bench tokenizer`.

  python3 tests/tokenizer/bench_tokenizers.py [--mb 10] [--reps 3]

The corpus (corpus.jsonl) repeated to --mb megabytes, one encode per line without special
tokens: single thread (Tokenizer.encode in a loop, RAYON_NUM_THREADS=1) and batch
(encode_batch, which parallelizes over all cores). Prints MB/s and tokens/s per tokenizer.
"""
import argparse
import json
import os
import time
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
from tokenizers import Tokenizer  # noqa: E402

HERE = Path(__file__).resolve().parent


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=float, default=10)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    corpus = [json.loads(l)["text"] for l in open(HERE / "corpus.jsonl", encoding="utf-8")
              if l.strip()]
    lines, size = [], 0
    while size < args.mb * 1e6:
        for l in corpus:
            lines.append(l)
            size += len(l.encode("utf-8"))
    toks = {n: Tokenizer.from_file(str(HERE / "data" / f"{n}.tokenizer.json"))
            for n in ("bytelevel_bpe", "sentencepiece_bpe")}
    print(f"tokenizers: {size / 1e6:.1f} MB in {len(lines)} encode calls, best of {args.reps}")
    print(f"{'tokenizer':20} {'mode':8} {'MB/s':>10} {'tokens/s':>14}")
    for name, tok in toks.items():
        for mode in ("single", "batch"):
            best, n = float("inf"), 0
            for _ in range(args.reps):
                start = time.perf_counter()
                if mode == "single":
                    n = sum(len(tok.encode(l, add_special_tokens=False).ids) for l in lines)
                else:
                    n = sum(len(e.ids) for e in tok.encode_batch(lines, add_special_tokens=False))
                best = min(best, time.perf_counter() - start)
            print(f"{name:20} {mode:8} {size / 1e6 / best:10.2f} {n / best:14.0f}")
            print(json.dumps({"bench": "tokenizers_py", "tokenizer": name, "mode": mode,
                              "mb_per_s": size / 1e6 / best, "tokens_per_s": n / best}))


if __name__ == "__main__":
    main()
