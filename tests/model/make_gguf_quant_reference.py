#!/usr/bin/env python3
"""Writes tests/model/gguf_quant_reference.json: random ggml blocks and what the `gguf` Python
package's gguf.quants.dequantize makes of them, for gguf_quant_test.cc.

Needs: pip install gguf numpy. Run from anywhere:

    python3 tests/model/make_gguf_quant_reference.py

Blocks are random bytes except the fp16 scale fields, which are set to finite values of a
realistic size (random bytes would often be NaN or inf there, which says nothing about the
layout). Values are stored as the hex of their float32 bits so the comparison can be exact.
Deterministic (fixed seed).
"""
import json
import os

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gguf_quant_reference.json")

# type -> (number of blocks, byte offsets of fp16 scale fields inside a block)
CASES = {
    T.F32: (8, []),
    T.F16: (8, []),
    T.BF16: (8, []),
    T.Q8_0: (2, [0]),
    T.Q4_0: (2, [0]),
    T.Q4_1: (2, [0, 2]),
    T.Q5_0: (2, [0]),
    T.Q5_1: (2, [0, 2]),
    T.Q4_K: (1, [0, 2]),
    T.Q5_K: (1, [0, 2]),
    T.Q6_K: (1, [208]),
}


def main():
    rng = np.random.default_rng(20250101)
    out = []
    for t, (n_blocks, scale_offsets) in CASES.items():
        block, size = GGML_QUANT_SIZES[t]
        if t == T.F32:
            raw = rng.standard_normal(n_blocks).astype(np.float32).tobytes()
        elif t == T.F16:
            raw = rng.standard_normal(n_blocks).astype(np.float16).tobytes()
        elif t == T.BF16:
            f = rng.standard_normal(n_blocks).astype(np.float32).view(np.uint32)
            raw = (f >> 16).astype(np.uint16).tobytes()
        else:
            b = bytearray(rng.integers(0, 256, n_blocks * size, dtype=np.uint8).tobytes())
            for i in range(n_blocks):
                for off in scale_offsets:
                    scale = np.float16(rng.uniform(0.001, 0.05) * rng.choice([-1, 1]))
                    b[i * size + off:i * size + off + 2] = scale.tobytes()
            raw = bytes(b)
        values = dequantize(np.frombuffer(raw, dtype=np.uint8), t).astype(np.float32).reshape(-1)
        assert values.size == n_blocks * block
        out.append({
            "type": t.name,
            "bytes": raw.hex(),
            "values": ["%08x" % v for v in values.view(np.uint32)],
        })
    with open(OUT, "w") as f:
        json.dump(out, f, indent=0)
        f.write("\n")


if __name__ == "__main__":
    main()
