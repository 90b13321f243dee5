#!/usr/bin/python3
"""The tokenizer metadata rlx quantize writes, for Qwen3's real vocabulary (the npm copy of its
tokenizer.json beside a one-layer random model with Qwen3's 151936 embedding rows), against
tokenizer.json read here with plain json: every token string in id order, ids without a token
as [PAD<id>] of type 5 up to the embedding's rows, types 1 / 3 (special added, or added and
spelled <|...|> as llama.cpp's converter decides) / 4 (other added), the merges as "a b" in
rank order, the EOS and padding ids; and rlx tokenizes texts to the same ids from the GGUF file
as from the directory.

  check_vocab.py --rlx BIN --tokenizer DIR --workdir DIR
"""
import argparse
import json
import os
import subprocess
import sys

from qutil import gguf_ref, random_models, verdict

TEXTS = ["Hello 世界, it's 3.14!", "<think>\nx</think><|fim_prefix|>def f():\n    return 1<|im_end|>",
         "  spaces\tand\nnewlines  "]


def main():
    ap = argparse.ArgumentParser()
    for a in ("--rlx", "--tokenizer", "--workdir"):
        ap.add_argument(a, required=True)
    args = ap.parse_args()
    model = random_models(args.workdir, {"qwen3-vocab": ("dense-tied", {"vocab_size": 151936, "num_hidden_layers": 1})},
                          7, args.tokenizer, __file__)["qwen3-vocab"]
    out = os.path.join(args.workdir, "qwen3-vocab-q8_0.gguf")
    subprocess.run([args.rlx, "quantize", model, out, "--type", "q8_0", "-q"], check=True, stdout=subprocess.DEVNULL)
    md = gguf_ref.read(out).metadata
    with open(os.path.join(args.tokenizer, "tokenizer.json")) as f:
        tj = json.load(f)
    rows = 151936
    strings, types = ["[PAD%d]" % i for i in range(rows)], [5] * rows
    for s, i in tj["model"]["vocab"].items():
        strings[i], types[i] = s, 1
    for a in tj["added_tokens"]:
        c = a["content"]
        strings[a["id"]] = c
        types[a["id"]] = 3 if a["special"] or (c.startswith("<|") and c.endswith("|>")) else 4
    merges = [m if isinstance(m, str) else " ".join(m) for m in tj["model"]["merges"]]
    failures = []
    if md["tokenizer.ggml.tokens"] != strings:
        bad = next(i for i, (a, b) in enumerate(zip(md["tokenizer.ggml.tokens"], strings)) if a != b)
        failures.append(f"tokens differ first at id {bad}: {md['tokenizer.ggml.tokens'][bad]!r} vs {strings[bad]!r}")
    if md["tokenizer.ggml.token_type"] != types:
        bad = [i for i, (a, b) in enumerate(zip(md["tokenizer.ggml.token_type"], types)) if a != b]
        failures.append(f"token types differ at {len(bad)} ids, first {bad[:5]}")
    if md["tokenizer.ggml.merges"] != merges:
        failures.append(f"merges differ ({len(md['tokenizer.ggml.merges'])} written, {len(merges)} in tokenizer.json)")
    eos = tj["model"]["vocab"].get("<|im_end|>") or next(a["id"] for a in tj["added_tokens"]
                                                         if a["content"] == "<|im_end|>")
    if md.get("tokenizer.ggml.eos_token_id") != eos:
        failures.append(f"eos id {md.get('tokenizer.ggml.eos_token_id')}, tokenizer_config.json says {eos}")
    if "tokenizer.ggml.padding_token_id" not in md or "tokenizer.chat_template" not in md:
        failures.append("no padding id or chat template")
    for text in TEXTS:
        ids = [subprocess.run([args.rlx, "tokenize", "-m", m, "-p", text], capture_output=True, text=True).stdout
               for m in (model, out)]
        if ids[0] != ids[1] or not ids[0].strip():
            failures.append(f"{text!r}: ids from the GGUF file {ids[1].strip()} differ from the directory's "
                            f"{ids[0].strip()}")
    print(f"{len(strings)} tokens, {len(merges)} merges, {types.count(3)} control, {types.count(4)} user-defined, "
          f"{types.count(5)} unused")
    return verdict(failures)


if __name__ == "__main__":
    sys.exit(main())
