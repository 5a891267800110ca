#!/usr/bin/env python3
"""FlashInfer's decode attention on the workload of `chunkserve-bench attention --device cuda`.

The same shapes, data layout and timing rules as tests/bench/attention_cuda.cc, so the two can be
compared line by line from one run on one GPU: `batch` sequences of `np` context tokens whose
first `ns` are one prefix shared by the whole batch (one physical copy of its pages), one query
token per sequence and head, pages of `chunk` tokens (FlashInfer's page_size), fp16 or bf16 KV.

Implementations (FlashInfer's public API; see its docs for the wrappers):
  fi_decode      BatchDecodeWithPagedKVCacheWrapper: every sequence's page table lists the shared
                 pages and its own, so shared pages are re-read per sequence (PagedAttention's
                 schedule, FlashInfer's kernel).
  fi_decode_tc   the same with use_tensor_cores=True (FlashInfer's prefill kernels for decode).
  fi_cascade     MultiLevelCascadeAttentionWrapper: level 0 is the shared prefix with the whole
                 batch's queries as one request, level 1 each sequence's private pages; the two
                 partial states are merged (FlashInfer's shared-prefix / cascade decode). With
                 ns = 0 or ns = np it has one level.

Timing: CUDA events around the run call (plans are made once, before timing, as a server does
once per step; a ~1 ms spin kernel queued before the start event hides Python's dispatch time,
so only device time is measured), L2 flushed before every timed iteration by reading a buffer of
4x the L2 size (read, not written: no dirty lines for the timed kernel to write back),
implementations interleaved, median and minimum of --iters. The floor uses the device-to-device
copy bandwidth measured in this run with the same byte count as chunkserve's bench: shared KV once
+ private KV + q + o. Before timing, each implementation's output is checked against a float32
reference on a few sequences (max |diff| <= 2e-2 for fp16/bf16 outputs).

Prints one JSON object per line per implementation (--json fields match chunkserve-bench's).
Needs PyTorch with CUDA and flashinfer-python; exits 77 without a CUDA device.
"""
import argparse
import json
import math
import os
import statistics
import sys


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--np", type=int, action="append", help="context tokens (repeatable)")
    p.add_argument("--ns", type=int, action="append",
                   help="shared tokens, paired with --np in order (repeatable)")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=32)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--chunk", type=int, default=64)
    p.add_argument("--kv-dtype", choices=["f16", "bf16"], default="f16")
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--impls", default="fi_decode,fi_decode_tc,fi_cascade")
    p.add_argument("--grid", action="store_true",
                   help="the paper's Table 3 grid: np 1024/2048/4096 x ns 0, np/2, 3np/4, np")
    a = p.parse_args()
    if a.grid:
        a.np, a.ns = [], []
        for n in (1024, 2048, 4096):
            for s in (0, n // 2, 3 * n // 4, n):
                a.np.append(n)
                a.ns.append(s)
    if not a.np:
        a.np, a.ns = [4096], [4096]
    if a.ns is None or len(a.ns) != len(a.np):
        p.error("give one --ns per --np")
    for n, s in zip(a.np, a.ns):
        if n % a.chunk or s % a.chunk or not 0 <= s <= n or n < a.chunk:
            p.error(f"np={n} ns={s}: both must be multiples of --chunk with 0 <= ns <= np")
    return a


def main():
    a = parse_args()
    import torch
    if not torch.cuda.is_available():
        print("flashinfer_attention: no CUDA device; nothing was run", file=sys.stderr)
        return 77
    import flashinfer

    dev = torch.device("cuda")
    dtype = torch.float16 if a.kv_dtype == "f16" else torch.bfloat16
    props = torch.cuda.get_device_properties(dev)
    gpu = props.name
    l2 = props.L2_cache_size
    flush = torch.ones(4 * l2 // 4, dtype=torch.int32, device=dev)
    workspace = torch.empty(256 << 20, dtype=torch.uint8, device=dev)

    def bandwidth_gbs():
        n = 1 << 30
        src = torch.empty(n, dtype=torch.uint8, device=dev)
        dst = torch.empty_like(src)
        src.fill_(1)
        times = []
        for _ in range(12):
            s, e = torch.cuda.Event(True), torch.cuda.Event(True)
            s.record()
            dst.copy_(src)
            e.record()
            e.synchronize()
            times.append(s.elapsed_time(e) / 1e3)
        del src, dst
        return 2 * n / statistics.median(times[2:]) / 1e9

    bw = bandwidth_gbs()
    b, h, kvh, d, c = a.batch, a.heads, a.kv_heads, a.head_dim, a.chunk
    group = h // kvh
    sm_scale = 1.0 / math.sqrt(d)
    gen = torch.Generator(device=dev)
    gen.manual_seed(int.from_bytes(os.urandom(8), "little") & ((1 << 63) - 1))

    for np_, ns in zip(a.np, a.ns):
        n_shared = ns // c
        n_priv = (np_ - ns) // c
        num_pages = n_shared + b * n_priv
        # Pages: [num_pages, 2, page_size, kv_heads, head_dim] (NHD), shared pages first.
        kv = torch.randn((num_pages, 2, c, kvh, d), generator=gen, device=dev,
                         dtype=torch.float32).to(dtype)
        q = torch.randn((b, h, d), generator=gen, device=dev, dtype=torch.float32).to(dtype)
        i32 = dict(dtype=torch.int32, device=dev)
        shared_ids = torch.arange(n_shared, **i32)
        priv_ids = [n_shared + i * n_priv + torch.arange(n_priv, **i32) for i in range(b)]
        full_indices = torch.cat([torch.cat([shared_ids, p]) for p in priv_ids])
        full_indptr = torch.arange(b + 1, **i32) * (n_shared + n_priv)
        last_len = torch.full((b,), c, **i32)

        impls = {}
        names = a.impls.split(",")
        for name in names:
            if name in ("fi_decode", "fi_decode_tc"):
                w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
                    workspace, "NHD", use_tensor_cores=(name == "fi_decode_tc"))
                w.plan(full_indptr, full_indices, last_len, h, kvh, d, c,
                       pos_encoding_mode="NONE", q_data_type=dtype, kv_data_type=dtype,
                       sm_scale=sm_scale)
                impls[name] = (lambda w=w: w.run(q, kv))
            elif name == "fi_cascade":
                levels = []
                if n_shared:
                    levels.append((torch.tensor([0, b], **i32), torch.tensor([0, n_shared], **i32),
                                   shared_ids, torch.tensor([c], **i32)))
                if n_priv:
                    levels.append((torch.arange(b + 1, **i32), torch.arange(b + 1, **i32) * n_priv,
                                   torch.cat(priv_ids), last_len))
                w = flashinfer.MultiLevelCascadeAttentionWrapper(len(levels), workspace, "NHD")
                w.plan([l[0] for l in levels], [l[1] for l in levels], [l[2] for l in levels],
                       [l[3] for l in levels], h, kvh, d, c, causal=False,
                       pos_encoding_mode="NONE", q_data_type=dtype, kv_data_type=dtype,
                       sm_scale=sm_scale)
                impls[name] = (lambda w=w: w.run(q, kv))
            else:
                print(f"flashinfer_attention: unknown impl {name}", file=sys.stderr)
                return 2

        # Correctness on a few sequences against float32 math.
        check = [0, b // 2, b - 1]
        for name, fn in impls.items():
            out = fn()
            torch.cuda.synchronize()
            for i in check:
                pages = torch.cat([shared_ids, priv_ids[i]]).long()
                k = kv[pages, 0].reshape(-1, kvh, d).float()  # [np, kvh, d]
                v = kv[pages, 1].reshape(-1, kvh, d).float()
                qi = q[i].float().reshape(kvh, group, d)
                s = torch.einsum("hgd,thd->hgt", qi, k) * sm_scale
                ref = torch.einsum("hgt,thd->hgd", torch.softmax(s, dim=-1), v).reshape(h, d)
                err = (out[i].float() - ref).abs().max().item()
                if not err <= 2e-2:
                    print(f"flashinfer_attention: {name} np={np_} ns={ns} seq {i}: "
                          f"max |diff| {err:.3g} > 2e-2", file=sys.stderr)
                    return 1

        times = {name: [] for name in impls}
        for _ in range(3):
            for fn in impls.values():
                fn()
        for _ in range(a.iters):
            for name, fn in impls.items():
                flush.max()  # reads 4x L2: a cold cache of clean lines, as chunkserve-bench
                # Keep the GPU busy while Python enqueues the run, so the events time the
                # kernels and not FlashInfer's host-side dispatch.
                torch.cuda._sleep(2_000_000)
                s, e = torch.cuda.Event(True), torch.cuda.Event(True)
                s.record()
                fn()
                e.record()
                e.synchronize()
                times[name].append(s.elapsed_time(e))
        esize = 2
        kv_bytes = 2 * (ns + b * (np_ - ns)) * kvh * d * esize
        min_bytes = kv_bytes + 2 * b * h * d * esize
        floor_ms = min_bytes / (bw * 1e9) * 1e3
        for name, t in times.items():
            med = statistics.median(t)
            print(json.dumps({
                "impl": name, "np": np_, "ns": ns, "batch": b, "heads": h, "kv_heads": kvh,
                "head_dim": d, "chunk": c, "kv_dtype": a.kv_dtype, "median_ms": med,
                "min_ms": min(t), "floor_ms": floor_ms, "efficiency": floor_ms / med,
                "bandwidth_gbs": bw, "bytes": min_bytes, "gpu": gpu,
                "flashinfer": flashinfer.__version__, "section": "flashinfer"}), flush=True)
        del kv, impls
    return 0


if __name__ == "__main__":
    sys.exit(main())
