#!/usr/bin/env python3
"""Writes the seed corpus of the GGUF fuzz target into tests/model/gguf_fuzz_corpus/.

Needs only the standard library. Seeds named valid_* must parse; every other seed must be rejected
(gguf_fuzz_replay_test.cc checks both). Deterministic: rerunning rewrites the same bytes.

    python3 tests/model/make_gguf_fuzz_corpus.py
"""
import os
import struct

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gguf_fuzz_corpus")

U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)
FMT = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f", BOOL: "<?",
       U64: "<Q", I64: "<q", F64: "<d"}
# ggml type: (id, block size, bytes per block)
GGML = {"F32": (0, 1, 4), "F16": (1, 1, 2), "Q4_0": (2, 32, 18), "Q4_1": (3, 32, 20),
        "Q8_0": (8, 32, 34), "Q4_K": (12, 256, 144), "Q6_K": (14, 256, 210), "BF16": (30, 1, 2)}


def s(text):
    b = text.encode()
    return struct.pack("<Q", len(b)) + b


def value(t, v):
    if t == STRING:
        return s(v)
    if t == ARRAY:
        et, items = v
        out = struct.pack("<IQ", et, len(items))
        return out + b"".join(value(et, x) for x in items)
    return struct.pack(FMT[t], v)


def gguf(kvs, tensors=(), version=3, alignment=32, counts=None, offsets=None):
    """kvs: [(key, type, value)]; tensors: [(name, ggml name, dims)], data filled with a pattern."""
    n_t, n_kv = counts or (len(tensors), len(kvs))
    out = b"GGUF" + struct.pack("<IQQ", version, n_t, n_kv)
    for key, t, v in kvs:
        out += s(key) + struct.pack("<I", t) + value(t, v)
    data = b""
    infos = b""
    for i, (name, ggml, dims) in enumerate(tensors):
        tid, block, size = GGML[ggml]
        nbytes = dims[0] // block * size
        for d in dims[1:]:
            nbytes *= d
        data += b"\0" * (-len(data) % alignment)
        off = offsets[i] if offsets else len(data)
        data += bytes((j * 37 + i) % 251 for j in range(nbytes))
        infos += s(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        infos += struct.pack("<IQ", tid, off)
    out += infos
    if tensors:
        out += b"\0" * (-len(out) % alignment)
    return out + data


def write(name, data):
    with open(os.path.join(OUT, name), "wb") as f:
        f.write(data)


def main():
    os.makedirs(OUT, exist_ok=True)
    every = [("u8", U8, 7), ("i8", I8, -7), ("u16", U16, 700), ("i16", I16, -700),
             ("u32", U32, 70000), ("i32", I32, -70000), ("f32", F32, 0.5), ("b", BOOL, True),
             ("s", STRING, "text"), ("u64", U64, 2**40), ("i64", I64, -2**40), ("f64", F64, 0.25),
             ("tokens", ARRAY, (STRING, ["<s>", "a", "b"])), ("scores", ARRAY, (F32, [0.0, -1.0])),
             ("ids", ARRAY, (I32, [1, 2, 3])), ("empty", ARRAY, (U8, []))]
    llama = [("general.architecture", STRING, "llama"), ("llama.block_count", U32, 1),
             ("llama.embedding_length", U32, 64), ("llama.feed_forward_length", U32, 128),
             ("llama.attention.head_count", U32, 2), ("llama.attention.head_count_kv", U32, 1),
             ("llama.attention.layer_norm_rms_epsilon", F32, 1e-5),
             ("llama.rope.freq_base", F32, 10000.0), ("llama.context_length", U32, 128),
             ("tokenizer.ggml.eos_token_id", U32, 2)]
    quant = [("f32", "F32", [8]), ("f16", "F16", [8, 2]), ("bf16", "BF16", [4]),
             ("q4_0", "Q4_0", [32]), ("q4_1", "Q4_1", [64]), ("q8_0", "Q8_0", [32, 2]),
             ("q4_k", "Q4_K", [256]), ("q6_k", "Q6_K", [256])]
    write("valid_empty.gguf", gguf([]))
    write("valid_v2.gguf", gguf([("general.name", STRING, "v2")], version=2))
    write("valid_every_type.gguf", gguf(every))
    write("valid_tensors.gguf", gguf(llama, quant))
    write("valid_alignment_64.gguf",
          gguf([("general.alignment", U32, 64)], quant[:3], alignment=64))
    write("bad_magic.gguf", b"GGUX" + gguf(every)[4:])
    write("bad_version_1.gguf", gguf([], version=1))
    write("bad_truncated.gguf", gguf(llama, quant)[:-5])
    write("bad_huge_kv_count.gguf", gguf([], counts=(0, 2**62)))
    write("bad_huge_array.gguf", gguf([("a", ARRAY, (U32, [1]))]).replace(
        struct.pack("<IQ", U32, 1), struct.pack("<IQ", U32, 2**61)))
    write("bad_nested_array.gguf", gguf([("a", ARRAY, (ARRAY, []))]))
    write("bad_overlap.gguf", gguf([], quant[:2], offsets=[0, 0]))
    write("bad_misaligned.gguf", gguf([], quant[:1], offsets=[4]))
    write("bad_alignment_3.gguf", gguf([("general.alignment", U32, 3)]))


if __name__ == "__main__":
    main()
