#!/usr/bin/python3
"""Byte-level BPE tokenizer for the small trained Qwen3 family, in Hugging Face's tokenizer.json
format with Qwen3's structure (pre-tokenizer, ByteLevel mapping, BPE model), so rlx and Hugging
Face load it like any Qwen3 tokenizer. Training is ours and deterministic: the same text and
vocabulary size give byte-identical files.

  bpe.py train --input train.txt --vocab 4096 --out DIR
      writes DIR/tokenizer.json and DIR/tokenizer_config.json; the vocabulary size includes
      the special tokens <|endoftext|>, <|im_start|>, <|im_end|>, which take the last ids
  bpe.py encode --tokenizer DIR FILE.txt...
      writes FILE.npy next to each file: its token ids as uint16

Only ASCII text is accepted: on ASCII, Python's `re` reproduces Qwen3's pre-tokenizer regex
exactly (\\p{L} is [A-Za-z], \\p{N} is [0-9]); beyond it, it would not.
"""
import argparse
import collections
import heapq
import json
import os
import re
import sys
import time

import numpy as np

# Qwen3's pre-tokenizer regex, as its tokenizer.json declares it.
QWEN3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")
# Its ASCII equivalent for Python's re. \s is spelled out: Python's also matches \x1c-\x1f,
# which are not Unicode White_Space and so not \s for Hugging Face's (Rust) regex.
_S, _NS = r"[\t\n\v\f\r ]", r"[^\t\n\v\f\r ]"
PRE_TOKEN = re.compile(
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\nA-Za-z0-9]?[A-Za-z]+|[0-9]"
    rf"| ?[^\t\n\v\f\r A-Za-z0-9]+[\r\n]*|{_S}*[\r\n]+|{_S}+(?!{_NS})|{_S}+")

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
BYTE_LEVEL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}


def bytes_to_unicode():
    """GPT-2's byte -> printable character table, in GPT-2's order (printable bytes first): the
    order of the first 256 ids, as in Qwen3's vocabulary."""
    bs = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


BYTE_CHAR = bytes_to_unicode()
CHAR_BYTE = {c: b for b, c in BYTE_CHAR.items()}


def pre_tokens(text):
    if not text.isascii():
        raise ValueError("bpe.py handles ASCII text only (its pre-tokenizer emulation is exact only there)")
    return PRE_TOKEN.findall(text)


# ---- training

def train(text, vocab_size):
    """(vocab, merges) of byte-level BPE on text: vocab maps token strings to ids (256 bytes,
    then merge results in merge order), merges is a list of (left, right) token strings."""
    n_merged = vocab_size - len(SPECIALS) - 256
    if n_merged < 0:
        raise ValueError(f"--vocab must be at least {256 + len(SPECIALS)}")
    vocab = {BYTE_CHAR[b]: i for i, b in enumerate(BYTE_CHAR)}
    names = list(vocab)  # symbol id -> token string
    counts = collections.Counter(pre_tokens(text))
    words = [[vocab[BYTE_CHAR[b]] for b in w.encode("ascii")] for w in counts]
    freqs = list(counts.values())

    pair_count = collections.Counter()
    where = collections.defaultdict(set)  # pair -> words that held it (possibly no longer)
    for i, w in enumerate(words):
        for p in zip(w, w[1:]):
            pair_count[p] += freqs[i]
            where[p].add(i)

    # Max-heap of (count, pair) with ties to the lexicographically smallest (left, right)
    # strings; entries go stale when counts change and are skipped when popped.
    def entry(p):
        return (-pair_count[p], names[p[0]], names[p[1]], p)
    heap = [entry(p) for p in pair_count]
    heapq.heapify(heap)

    merges = []
    while len(vocab) < 256 + n_merged and heap:
        neg, _, _, pair = heapq.heappop(heap)
        if pair_count.get(pair) != -neg:
            continue
        a, b = pair
        name = names[a] + names[b]
        # two different merges can spell the same token: it keeps its first id
        if name not in vocab:
            vocab[name] = len(names)
            names.append(name)
        new = vocab[name]
        merges.append((names[a], names[b]))
        changed = set()
        for i in where.pop(pair):
            w = words[i]
            merged, j = [], 0
            while j < len(w):
                if j + 1 < len(w) and w[j] == a and w[j + 1] == b:
                    merged.append(new)
                    j += 2
                else:
                    merged.append(w[j])
                    j += 1
            if len(merged) == len(w):  # a stale entry of where
                continue
            f = freqs[i]
            for p in zip(w, w[1:]):
                pair_count[p] -= f
                changed.add(p)
            for p in zip(merged, merged[1:]):
                pair_count[p] += f
                where[p].add(i)
                changed.add(p)
            words[i] = merged
        for p in changed:
            if pair_count[p] <= 0:
                del pair_count[p]
            else:
                heapq.heappush(heap, entry(p))
    if len(vocab) < 256 + n_merged:
        raise ValueError(f"the text allows only {len(vocab) + len(SPECIALS)} tokens, not {vocab_size}")
    return vocab, merges


def tokenizer_json(vocab, merges):
    first = len(vocab)
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [{"id": first + k, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True} for k, s in enumerate(SPECIALS)],
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": QWEN3_SPLIT}, "behavior": "Isolated", "invert": False},
            dict(BYTE_LEVEL)]},
        "post_processor": dict(BYTE_LEVEL),
        "decoder": dict(BYTE_LEVEL),
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": [list(m) for m in merges]},
    }


# Qwen3's chat template, byte for byte as Qwen3's tokenizer_config.json holds it: rlx recognises
# that exact text, and so renders conversations for these models as for any Qwen3.
CHAT_TEMPLATE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "qwen3_chat_template.jinja")


def tokenizer_config(first_special):
    with open(CHAT_TEMPLATE, encoding="utf-8", newline="") as f:
        chat_template = f.read()
    return {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": {str(first_special + k): {"content": s, "lstrip": False, "normalized": False,
                                                          "rstrip": False, "single_word": False, "special": True}
                                 for k, s in enumerate(SPECIALS)},
        "additional_special_tokens": SPECIALS[1:],
        "bos_token": None,
        "chat_template": chat_template,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|endoftext|>",
        "errors": "replace",
        "model_max_length": 131072,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }


def write_json(path, obj):
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        json.dump(obj, f, indent=2, ensure_ascii=False)
        f.write("\n")


# ---- encoding

class Tokenizer:
    """Byte-level BPE encoding and decoding of plain text (special tokens in the text are not
    recognised) with a tokenizer.json written by `train`."""

    def __init__(self, tokenizer_json_path):
        with open(tokenizer_json_path, encoding="utf-8") as f:
            model = json.load(f)
        self.vocab = model["model"]["vocab"]
        self.rank = {tuple(m): r for r, m in enumerate(model["model"]["merges"])}
        self.names = {i: s for s, i in self.vocab.items()}
        for t in model["added_tokens"]:
            self.names[t["id"]] = t["content"]
        self.cache = {}

    def bpe(self, word):
        """ids of one pre-token"""
        symbols = [BYTE_CHAR[b] for b in word.encode("ascii")]
        while len(symbols) > 1:
            ranked = [(self.rank.get(p, len(self.rank)), j) for j, p in enumerate(zip(symbols, symbols[1:]))]
            best = min(ranked)[0]
            if best == len(self.rank):
                break
            merged, j = [], 0
            while j < len(symbols):
                if j + 1 < len(symbols) and self.rank.get((symbols[j], symbols[j + 1])) == best:
                    merged.append(symbols[j] + symbols[j + 1])
                    j += 2
                else:
                    merged.append(symbols[j])
                    j += 1
            symbols = merged
        return [self.vocab[s] for s in symbols]

    def encode(self, text):
        ids = []
        for w in pre_tokens(text):
            got = self.cache.get(w)
            if got is None:
                got = self.cache[w] = self.bpe(w)
            ids += got
        return ids

    def decode(self, ids):
        return bytes(CHAR_BYTE[c] for i in ids for c in self.names[i]).decode("utf-8", errors="replace")


def encode(tokenizer_json_path, text):
    return Tokenizer(tokenizer_json_path).encode(text)


# ---- command line

def cmd_train(args):
    t0 = time.time()
    with open(args.input, encoding="ascii") as f:
        text = f.read()
    vocab, merges = train(text, args.vocab)
    os.makedirs(args.out, exist_ok=True)
    write_json(os.path.join(args.out, "tokenizer.json"), tokenizer_json(vocab, merges))
    write_json(os.path.join(args.out, "tokenizer_config.json"), tokenizer_config(len(vocab)))
    print(f"{args.out}: {len(vocab) + len(SPECIALS)} tokens, {len(merges)} merges, {time.time() - t0:.1f} s")


def cmd_encode(args):
    tok = Tokenizer(os.path.join(args.tokenizer, "tokenizer.json"))
    if max(tok.names) >= 1 << 16:
        sys.exit("bpe.py: the vocabulary does not fit uint16")
    for path in args.files:
        t0 = time.time()
        with open(path, encoding="ascii") as f:
            text = f.read()
        ids = np.array(tok.encode(text), dtype=np.uint16)
        out = os.path.splitext(path)[0] + ".npy"
        np.save(out, ids)
        print(f"{out}: {len(ids)} tokens from {len(text)} bytes, {len(text.split())} words, "
              f"{len(ids) / max(1, len(text.split())):.3f} tokens/word, {time.time() - t0:.1f} s")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("train", help="train a tokenizer on a text file")
    t.add_argument("--input", required=True)
    t.add_argument("--vocab", type=int, required=True, help="vocabulary size, special tokens included")
    t.add_argument("--out", required=True, help="directory for tokenizer.json and tokenizer_config.json")
    e = sub.add_parser("encode", help="token ids of text files as FILE.npy (uint16)")
    e.add_argument("--tokenizer", required=True, help="directory holding tokenizer.json")
    e.add_argument("files", nargs="+")
    args = ap.parse_args()
    {"train": cmd_train, "encode": cmd_encode}[args.cmd](args)


if __name__ == "__main__":
    main()
