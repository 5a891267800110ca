#!/usr/bin/env python3
"""Writes tests/model/reference/smollm2_reference.json: what transformers computes for
SmolLM2-135M-Instruct loaded from the same Q4_1 GGUF file chunkserve loads.

Needs (pip): torch, transformers, gguf, tokenizers, accelerate (transformers requires it for
GGUF; the GGUF loader dequantizes with `gguf`).
Needs the model file that .ci/fetch-models puts in $CHUNKSERVE_MODEL_CACHE or
~/.cache/chunkserve/models. Run from anywhere (CPU, ~1 minute):

    python3 tests/model/reference/make_smollm2_reference.py

For each chat prompt (rendered with the GGUF's chat template, add_generation_prompt=True) it
records the prompt token ids, exactly 40 greedy new tokens (EOS does not stop it), the first
step's top 64 logits as (id, value) and the logsumexp of all first-step logits. Everything runs
in float32 (torch_dtype=torch.float32), deterministic on one machine.

Three prompts share one long system prompt, so the engine's prefix sharing is exercised.
"""
import json
import os

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
CACHE = os.environ.get("CHUNKSERVE_MODEL_CACHE") or os.path.expanduser("~/.cache/chunkserve/models")
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "smollm2_reference.json")
NEW_TOKENS = 40
TOP_K = 64

SYSTEM = (
    "You are a careful assistant for a small public library. You answer questions about opening "
    "hours, borrowing rules and events. Opening hours: Monday to Friday 9:00 to 18:00, Saturday "
    "10:00 to 14:00, closed on Sunday. Members may borrow up to eight items at once for three "
    "weeks; items can be renewed twice online unless someone has reserved them. Late returns cost "
    "20 cents per item per day. The reading group meets on the first Thursday of each month at "
    "18:30. Answer briefly and politely, and say so when you do not know."
)

CONVERSATIONS = [
    [{"role": "system", "content": SYSTEM},
     {"role": "user", "content": "Are you open on Saturday afternoon?"}],
    [{"role": "system", "content": SYSTEM},
     {"role": "user", "content": "How many books can I borrow, and for how long?"}],
    [{"role": "system", "content": SYSTEM},
     {"role": "user", "content": "When does the reading group meet?"}],
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "user", "content": "Write a haiku about the sea."}],
    [{"role": "user", "content": "List three prime numbers greater than 10."}],
]


def main():
    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(CACHE, gguf_file=NAME)
    model = AutoModelForCausalLM.from_pretrained(CACHE, gguf_file=NAME, torch_dtype=torch.float32)
    model.eval()
    prompts = []
    for conv in CONVERSATIONS:
        ids = tok.apply_chat_template(conv, add_generation_prompt=True, tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        ids = [int(i) for i in ids]
        with torch.no_grad():
            x = torch.tensor([ids])
            logits = model(x).logits[0, -1].float()
            top = torch.topk(logits, TOP_K)
            lse = torch.logsumexp(logits, dim=0).item()
            # Greedy decoding by hand (no generation config, no EOS stop, no sampling knobs).
            out = model(x, use_cache=True)
            past = out.past_key_values
            nxt = int(out.logits[0, -1].argmax())
            generated = [nxt]
            for _ in range(NEW_TOKENS - 1):
                out = model(torch.tensor([[nxt]]), past_key_values=past, use_cache=True)
                past = out.past_key_values
                nxt = int(out.logits[0, -1].argmax())
                generated.append(nxt)
        prompts.append({
            "messages": conv,
            "prompt_ids": ids,
            "greedy_ids": generated,
            "greedy_text": tok.decode(generated),
            "first_top_ids": [int(i) for i in top.indices],
            "first_top_logits": [round(float(v), 5) for v in top.values],
            "first_logsumexp": round(lse, 5),
        })
        print(len(ids), repr(tok.decode(generated)))
    meta = {
        "model": NAME,
        "transformers": __import__("transformers").__version__,
        "torch": torch.__version__,
        "new_tokens": NEW_TOKENS,
        "top_k": TOP_K,
        "system_prompt": SYSTEM,
    }
    with open(OUT, "w") as f:
        json.dump({"meta": meta, "prompts": prompts}, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
