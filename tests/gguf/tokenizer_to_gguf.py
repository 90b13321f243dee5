#!/usr/bin/python3
"""Converts a Hugging Face BPE tokenizer (tokenizer.json, plus tokenizer_config.json for the
special tokens and the chat template) into a vocabulary-only GGUF file, the way llama.cpp's
convert_hf_to_gguf.py writes a gpt2-style BPE vocabulary or a SentencePiece ('llama')
vocabulary, so that rlx's GGUF tokenizer can be checked against Hugging Face's ids on a real
tokenizer (Qwen3's 151k tokens, Llama 3's 128k, a 32k SentencePiece one) without a model.

  tokenizer_to_gguf.py --tokenizer DIR --out FILE.gguf [--vocab-size N] [--pre qwen2]
                       [--looks-special] [--arch NAME]

A tokenizer.json whose BPE model has byte_fallback (Llama 2, Mistral) is a SentencePiece
vocabulary: llama.cpp writes it as tokenizer.ggml.model "llama" with tokenizer.ggml.scores and
token types (BYTE for <0xNN>, UNKNOWN for the unk token, CONTROL / USER_DEFINED for added
tokens) and no merges, from the model's tokenizer.model. The npm packages ship no
tokenizer.model, so the scores are recovered from the merges, which Hugging Face's converter
ranks by the SentencePiece score of the piece they make: a piece scores -r for the first merge
r that makes it; pieces no merge makes (characters), bytes and control tokens score 0 (nothing
merges into them, so their scores do not take part in merging).

What llama.cpp writes (its get_vocab_base and SpecialVocab, restated here, not copied):
- tokenizer.ggml.tokens: one string per id from 0 to the vocabulary size (config.json's
  vocab_size, which may exceed the tokenizer's ids: Qwen3 pads 151669 tokens to 151936), the
  model vocabulary and the added tokens at their ids; an id with no token is "[PAD<id>]".
- tokenizer.ggml.token_type (INT32 per id): UNUSED = 5 for those padding ids, CONTROL = 3 for an
  added token marked special, USER_DEFINED = 4 for another added token, NORMAL = 1 for the rest.
  llama.cpp also promotes a non-special added token whose text looks special (<|...|>, among
  others) to CONTROL; --looks-special does that too (for Qwen3 it turns <|fim_prefix|> ...
  <|file_sep|> into control tokens, which Hugging Face does not treat as special).
- tokenizer.ggml.model "gpt2", tokenizer.ggml.pre the pre-tokenizer's llama.cpp name (qwen2 for
  Qwen2/Qwen3's split pattern; llama.cpp finds it by hashing the ids of a probe text),
  tokenizer.ggml.merges as "left right" strings in rank order (tokenizer.json holds either
  such strings or [left, right] pairs).
- the special ids tokenizer_config.json names (eos_token, pad_token, bos_token, unk_token) as
  tokenizer.ggml.<eos|padding|bos|unknown>_token_id (UINT32), its add_bos_token/add_eos_token
  as BOOLs, and its chat_template as tokenizer.chat_template.
llama.cpp also re-encodes added tokens marked "normalized": false to pre-normalise them; that
changes nothing for byte-level BPE tokens like Qwen's and is not reproduced.
"""
import argparse
import json
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import gguf_ref as G  # noqa: E402

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6


def looks_special(text):
    """llama.cpp's test for added tokens that ought to be control tokens though not marked so."""
    return (text in ("<pad>", "<mask>", "<2mass>", "[@BOS@]")
            or (text.startswith("<|") and text.endswith("|>"))
            or (text.startswith("<\uff5c") and text.endswith("\uff5c>"))
            or (text.startswith("<unused") and text.endswith(">")))


def special_text(value):
    """A tokenizer_config.json special token: a string, an AddedToken dict, or null."""
    if isinstance(value, dict):
        return value.get("content")
    return value


def template_adds(tj, cfg):
    """SpecialVocab's reading of the post-processor: whether its single template starts with the
    BOS token and ends with the EOS token (None where it says nothing)."""
    pp = tj.get("post_processor") or {}
    add = {}
    for proc in pp.get("processors", [pp]):
        single = proc.get("single", []) if proc.get("type") == "TemplateProcessing" else []
        if len(single) > 1:
            first = single[0].get("SpecialToken", {}).get("id")
            last = single[-1].get("SpecialToken", {}).get("id")
            if first:
                add["bos"] = first == special_text(cfg.get("bos_token"))
            if last:
                add["eos"] = last == special_text(cfg.get("eos_token"))
    return add


def convert(tokenizer_dir, vocab_size=None, pre="qwen2", promote_looks_special=False, arch="qwen3"):
    """(metadata list for gguf_ref.write, summary dict)."""
    with open(os.path.join(tokenizer_dir, "tokenizer.json"), encoding="utf-8") as f:
        tj = json.load(f)
    cfg_path = os.path.join(tokenizer_dir, "tokenizer_config.json")
    cfg = {}
    if os.path.exists(cfg_path):
        with open(cfg_path, encoding="utf-8") as f:
            cfg = json.load(f)
    model = tj["model"]
    if model.get("type") != "BPE":
        raise ValueError("tokenizer.json model type %r is not BPE" % model.get("type"))
    by_id = {i: t for t, i in model["vocab"].items()}
    added = {a["id"]: a for a in tj.get("added_tokens", [])}
    for i, a in added.items():
        if i in by_id and by_id[i] != a["content"]:
            raise ValueError("id %d is %r in the vocabulary and %r as an added token" % (i, by_id[i], a["content"]))
        by_id[i] = a["content"]
    n = max(by_id) + 1
    if vocab_size is None:
        vocab_size = n
    if vocab_size < n:
        raise ValueError("vocab size %d is below the tokenizer's largest id %d" % (vocab_size, n - 1))
    spm = bool(model.get("byte_fallback"))
    unk = model.get("unk_token")
    model_ids = set(model["vocab"].values())
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    first_rank = {}
    for r, m in enumerate(merges):
        first_rank.setdefault(m.replace(" ", "", 1), r)
    tokens, types, scores = [], [], []
    for i in range(vocab_size):
        if i not in by_id:
            tokens.append("[PAD%d]" % i)
            types.append(UNUSED)
        elif spm and i in model_ids and re.fullmatch(r"<0x[0-9A-Fa-f]{2}>", by_id[i]):
            tokens.append(by_id[i])
            types.append(BYTE)
        elif spm and by_id[i] == unk:
            tokens.append(by_id[i])
            types.append(UNKNOWN)
        elif i in added:
            tokens.append(by_id[i])
            special = added[i]["special"] or (promote_looks_special and looks_special(by_id[i]))
            types.append(CONTROL if special else USER_DEFINED)
        else:
            tokens.append(by_id[i])
            types.append(NORMAL)
        scores.append(-float(first_rank[by_id[i]]) if types[-1] == NORMAL and by_id[i] in first_rank else 0.0)
    ids = {t: i for i, t in enumerate(tokens) if types[i] != UNUSED}
    md = [
        ("general.architecture", (G.STRING, arch)),
        ("general.type", (G.STRING, "vocab")),
        ("general.name", (G.STRING, os.path.basename(os.path.normpath(tokenizer_dir)))),
    ]
    if spm:
        md += [
            ("tokenizer.ggml.model", (G.STRING, "llama")),
            ("tokenizer.ggml.pre", (G.STRING, "default")),
            ("tokenizer.ggml.tokens", (G.ARRAY, (G.STRING, tokens))),
            ("tokenizer.ggml.scores", (G.ARRAY, (G.FLOAT32, scores))),
            ("tokenizer.ggml.token_type", (G.ARRAY, (G.INT32, types))),
        ]
        merges = []
    else:
        md += [
            ("tokenizer.ggml.model", (G.STRING, "gpt2")),
            ("tokenizer.ggml.pre", (G.STRING, pre)),
            ("tokenizer.ggml.tokens", (G.ARRAY, (G.STRING, tokens))),
            ("tokenizer.ggml.token_type", (G.ARRAY, (G.INT32, types))),
            ("tokenizer.ggml.merges", (G.ARRAY, (G.STRING, merges))),
        ]
    for key, name in (("bos_token", "bos"), ("eos_token", "eos"), ("unk_token", "unknown"), ("pad_token", "padding")):
        text = special_text(cfg.get(key))
        if text is None:
            continue
        if text not in ids:
            raise ValueError("tokenizer_config.json's %s %r is not a token" % (key, text))
        md.append(("tokenizer.ggml.%s_token_id" % name, (G.UINT32, ids[text])))
    add = template_adds(tj, cfg)
    for name in ("bos", "eos"):
        if isinstance(cfg.get("add_%s_token" % name), bool):
            add[name] = cfg["add_%s_token" % name]
        if name in add:
            md.append(("tokenizer.ggml.add_%s_token" % name, (G.BOOL, add[name])))
    if isinstance(cfg.get("chat_template"), str):
        md.append(("tokenizer.chat_template", (G.STRING, cfg["chat_template"])))
    summary = {"tokens": len(tokens), "merges": len(merges),
               "types": {name: types.count(v) for name, v in (("normal", NORMAL), ("unknown", UNKNOWN),
                                                               ("control", CONTROL), ("user_defined", USER_DEFINED),
                                                               ("unused", UNUSED), ("byte", BYTE))}}
    return md, summary


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokenizer", required=True, help="directory with tokenizer.json (+ tokenizer_config.json)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--vocab-size", type=int, help="config.json's vocab_size (default: largest id + 1)")
    ap.add_argument("--pre", default="qwen2", help="tokenizer.ggml.pre (default qwen2)")
    ap.add_argument("--looks-special", action="store_true",
                    help="also mark added tokens that look special as CONTROL, as llama.cpp does")
    ap.add_argument("--arch", default="qwen3", help="general.architecture (default qwen3)")
    args = ap.parse_args()
    try:
        md, summary = convert(args.tokenizer, args.vocab_size, args.pre, args.looks_special, args.arch)
    except (OSError, ValueError, KeyError) as e:
        print("tokenizer_to_gguf: %s" % e, file=sys.stderr)
        return 1
    G.write(args.out, md, [])
    print("wrote %s: %s" % (args.out, json.dumps(summary)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
