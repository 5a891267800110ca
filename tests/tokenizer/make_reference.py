#!/usr/bin/env python3
"""Regenerates the tokenizer test data under tests/tokenizer/data/ with HF `tokenizers` and
transformers, the implementations chunkserve's tokenizer must agree with.

  python3 tests/tokenizer/make_reference.py            # references from the committed files
  python3 tests/tokenizer/make_reference.py --train    # also retrain the two small tokenizers

Writes, per tokenizer (bytelevel_bpe, sentencepiece_bpe, smollm2), reference_<name>.json: for
every line of corpus.jsonl the ids without and with special tokens, and Decode of the latter with
and without skip_special_tokens. smollm2 is the tokenizer transformers converts from the GGUF in
the model cache (.ci/fetch-models); it is skipped when the GGUF is absent. chat_reference.json
holds apply_chat_template renderings of the templates in data/chat/.
"""
import argparse
import json
import os
import random
import sys
from pathlib import Path

from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, decoders, processors
from tokenizers import trainers, AddedToken, Regex

HERE = Path(__file__).resolve().parent
DATA = HERE / "data"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                  r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def corpus():
    with open(HERE / "corpus.jsonl", encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f if line.strip()]


def training_text():
    """Deterministic text: the corpus plus generated English-like and code-like sentences."""
    rng = random.Random(1234)
    words = ("the of and to in is that it for on with as was be by this are or from at which "
             "have an not they but had one all were we when your can said there use each she do "
             "how their if will up other about out many then them these so some her would make "
             "like him into time has look two more write go see number no way could people my "
             "than first water been call who oil its now find long down day did get come made "
             "may part token model serve chunk cache server request batch kernel tensor").split()
    code = ["def f(x):\n    return x + 1\n", "for i in range(10):\n\tprint(i)\n",
            "int main() { return 0; }\n", "let v = vec![1, 2, 3];\n", "if (a && b) { c(); }\n"]
    lines = corpus() * 3
    for _ in range(4000):
        n = rng.randint(3, 14)
        s = " ".join(rng.choice(words) for _ in range(n))
        s = s[0].upper() + s[1:] + rng.choice([".", "!", "?", ",", ":"])
        if rng.random() < 0.2:
            s += " " + str(rng.randint(0, 99999))
        lines.append(s)
        if rng.random() < 0.1:
            lines.append(rng.choice(code))
    return lines


def train_bytelevel():
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|begin_of_text|>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(vocab_size=1800, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(training_text(), trainer)
    tok.add_tokens([AddedToken("<tool>", lstrip=True, rstrip=False, normalized=False),
                    AddedToken("[SEP]", single_word=True, normalized=False)])
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                      pair="<|begin_of_text|> $A $B:1",
                                      special_tokens=[("<|begin_of_text|>", bos)]),
    ])
    tok.save(str(DATA / "bytelevel_bpe.tokenizer.json"))


def train_sentencepiece():
    # Trained with a Metaspace pre-tokenizer, then rebuilt the way Llama 2's tokenizer.json is:
    # <unk> <s> </s>, the 256 byte tokens <0x00>..<0xFF>, then the learned pieces; a
    # Prepend + Replace normalizer and no pre-tokenizer.
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    trainer = trainers.BpeTrainer(vocab_size=1500, special_tokens=["<unk>", "<s>", "</s>"],
                                  limit_alphabet=120, show_progress=False)
    tok.train_from_iterator(training_text(), trainer)
    j = json.loads(tok.to_str())
    learned = sorted(j["model"]["vocab"].items(), key=lambda kv: kv[1])
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab["<0x%02X>" % b] = len(vocab)
    for piece, _ in learned:
        if piece not in vocab:
            vocab[piece] = len(vocab)
    j["model"]["vocab"] = vocab
    j["model"]["ignore_merges"] = False
    j["added_tokens"] = [
        {"id": vocab[t], "content": t, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": True} for t in ("<unk>", "<s>", "</s>")]
    j["normalizer"] = {"type": "Sequence", "normalizers": [
        {"type": "Prepend", "prepend": "▁"},
        {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]}
    j["pre_tokenizer"] = None
    j["decoder"] = {"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
        {"type": "ByteFallback"}, {"type": "Fuse"},
        {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}
    j["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                   {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                 {"Sequence": {"id": "A", "type_id": 0}},
                 {"SpecialToken": {"id": "<s>", "type_id": 1}},
                 {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}}
    tok = Tokenizer.from_str(json.dumps(j))
    tok.save(str(DATA / "sentencepiece_bpe.tokenizer.json"))


def smollm2_tokenizer():
    """The GGUF's tokenizer as transformers converts it, or None without the model file."""
    cache = Path(os.environ.get("CHUNKSERVE_MODEL_CACHE",
                                Path.home() / ".cache" / "chunkserve" / "models"))
    if not (cache / GGUF_NAME).exists():
        print(f"skipping smollm2: {cache / GGUF_NAME} not found", file=sys.stderr)
        return None
    from transformers import AutoTokenizer
    t = AutoTokenizer.from_pretrained(str(cache), gguf_file=GGUF_NAME)
    return Tokenizer.from_str(t.backend_tokenizer.to_str())


def write_reference(name, tok):
    rows = []
    for text in corpus():
        plain = tok.encode(text, add_special_tokens=False).ids
        special = tok.encode(text, add_special_tokens=True).ids
        rows.append({"text": text, "ids": plain, "ids_special": special,
                     "decoded": tok.decode(special, skip_special_tokens=False),
                     "decoded_skip": tok.decode(special, skip_special_tokens=True)})
    with open(DATA / f"reference_{name}.json", "w", encoding="utf-8") as f:
        json.dump(rows, f, ensure_ascii=False, indent=0)
        f.write("\n")


def smollm2_original(tok):
    """SmolLM2's original tokenizer.json splits digits individually (Digits + ByteLevel); the
    GGUF conversion by transformers uses ByteLevel alone, llama.cpp's `smollm` pre-tokenizer splits
    \\p{N} first. The reference is the original; this prints where the conversion differs."""
    j = json.loads(tok.to_str())
    j["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": True},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}]}
    orig = Tokenizer.from_str(json.dumps(j))
    diff = [t for t in corpus() if tok.encode(t).ids != orig.encode(t).ids]
    print(f"smollm2: GGUF conversion vs original Digits+ByteLevel differ on {len(diff)} of "
          f"{len(corpus())} lines: {diff[:5]!r}")
    return orig


CONVERSATIONS = {
    "user_only": [{"role": "user", "content": "Hello!"}],
    "system_user": [{"role": "system", "content": "You are terse."},
                    {"role": "user", "content": "What is 2+2?"}],
    "multi_turn": [{"role": "user", "content": "Hi there"},
                   {"role": "assistant", "content": "Hello! How can I help?"},
                   {"role": "user", "content": "  Tell me a joke.  "}],
    "system_multi_turn": [{"role": "system", "content": "Be kind."},
                          {"role": "user", "content": "Hi"},
                          {"role": "assistant", "content": " Hey "},
                          {"role": "user", "content": "Bye\n"}],
    "unicode": [{"role": "user", "content": "你好 👋 <|im_end|> [INST]"}],
}
TEMPLATES = {  # file -> (bos_token, eos_token)
    "smollm2": ("<|im_start|>", "<|im_end|>"),
    "qwen2": ("<|endoftext|>", "<|im_end|>"),
    "chatml": ("<s>", "</s>"),
    "llama3": ("<|begin_of_text|>", "<|eot_id|>"),
    "llama2": ("<s>", "</s>"),
    "mistral": ("<s>", "</s>"),
}


def write_chat_reference():
    from transformers import PreTrainedTokenizerFast
    base = PreTrainedTokenizerFast(
        tokenizer_file=str(DATA / "bytelevel_bpe.tokenizer.json"))
    out = []
    for name, (bos, eos) in TEMPLATES.items():
        template = (DATA / "chat" / f"{name}.jinja").read_text(encoding="utf-8")
        base.bos_token, base.eos_token = bos, eos
        for conv_name, conv in CONVERSATIONS.items():
            for gen in (False, True):
                row = {"template": name, "bos_token": bos, "eos_token": eos,
                       "conversation": conv_name, "messages": conv,
                       "add_generation_prompt": gen}
                try:
                    row["rendered"] = base.apply_chat_template(
                        conv, chat_template=template, tokenize=False,
                        add_generation_prompt=gen)
                except Exception as e:  # noqa: BLE001 - the template's raise_exception
                    row["error"] = str(e)
                out.append(row)
    with open(DATA / "chat_reference.json", "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--train", action="store_true", help="retrain the two small tokenizers")
    args = ap.parse_args()
    if args.train:
        train_bytelevel()
        train_sentencepiece()
    for name in ("bytelevel_bpe", "sentencepiece_bpe"):
        write_reference(name, Tokenizer.from_file(str(DATA / f"{name}.tokenizer.json")))
    smol = smollm2_tokenizer()
    if smol is not None:
        write_reference("smollm2", smollm2_original(smol))
    write_chat_reference()


if __name__ == "__main__":
    main()
