#!/usr/bin/env python3
"""Writes block_trace_sample.jsonl: a small block-hash trace (the Mooncake trace format:
timestamp in ms, input_length, output_length, hash_ids of 512-token blocks) for the router
tests. Deterministic (no randomness): 8 conversations of 4-6 turns; every prompt starts with
block 0 (a shared system prompt); each turn's prompt extends the previous turn's blocks, so
equal ids mean equal prefixes. Run: python3 make_block_trace.py > block_trace_sample.jsonl"""
import json

BLOCK = 512
next_id = 1  # 0 is the shared first block
records = []
for conv in range(8):
    blocks = [0]
    length = BLOCK + 100 + 37 * conv  # system block + a first message, partial last block
    turns = 4 + conv % 3
    for turn in range(turns):
        need = (length + BLOCK - 1) // BLOCK
        while len(blocks) < need:
            blocks.append(next_id)
            next_id += 1
        # the partial last block changes identity when the next turn fills it up
        ts = 1000 * conv + 2500 * turn
        records.append({"timestamp": ts, "input_length": length,
                        "output_length": 40 + 13 * ((conv + turn) % 5), "hash_ids": list(blocks)})
        # next turn: previous prompt + answer + new message; a partial last block gets a new id
        if length % BLOCK:
            blocks[-1] = next_id
            next_id += 1
        length += 300 + 97 * ((conv * 7 + turn) % 4)
records.sort(key=lambda r: r["timestamp"])
for r in records:
    print(json.dumps(r))
