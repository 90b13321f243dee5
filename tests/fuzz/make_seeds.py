#!/usr/bin/python3
"""Write the binary seed corpora of the fuzz targets (the text ones are committed in seeds/).

  make_seeds.py OUT_DIR

OUT_DIR/<target>/ receives, for each target, valid inputs and inputs that each hit one error
the parser reports:
  safetensors  headers with one tensor of each dtype, padding, metadata, several tensors; a
               short file, a length past the end, bad JSON, a non-object, bad dtypes, shapes
               and offsets that disagree, overlapping tensors, trailing bytes, no tensors
  tokenizer    byte-level BPE tokenizers like the ones tests/text/test_text.c writes (string
               and pair merges, added tokens, normalizers) and broken variants; SentencePiece-style
               ones (Prepend/Replace normalizer or Metaspace, byte fallback, an unknown token,
               Replace/ByteFallback/Fuse/Strip or Metaspace decoders, TemplateProcessing)
  text         a flag byte then text: plain, special tokens, invalid UTF-8, NUL-separated
               chat messages with roles and reasoning
  tcp_frames   a mode byte then frames: empty, small and several messages, no-checksum
               frames, a frame over the 1M limit, frames around a lowered limit, a bad magic, version, flags and checksums,
               a stream cut in a header and in a payload
"""
import json
import os
import struct
import sys


def crc32c(data):
    c = 0xFFFFFFFF
    for b in data:
        c ^= b
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
    return c ^ 0xFFFFFFFF


def frame(payload, flags=0, version=1, magic=b"RLXT", length=None, crc=None, hcrc=None):
    length = len(payload) if length is None else length
    pcrc = 0 if flags & 1 else crc32c(payload)
    head = magic + struct.pack("<HHQI", version, flags, length, pcrc if crc is None else crc)
    return head + struct.pack("<I", crc32c(head) if hcrc is None else hcrc) + payload


def safetensors(header, data=b"", pad=0, length=None):
    text = (header if isinstance(header, str) else json.dumps(header)).encode() + b" " * pad
    return struct.pack("<Q", len(text) if length is None else length) + text + data


def tensor(dtype, shape, begin, end):
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


SAFETENSORS = {
    "f32": safetensors({"w": tensor("F32", [2, 2], 0, 16)}, bytes(range(16))),
    "bf16-f16-meta": safetensors({"__metadata__": {"format": "pt"}, "a": tensor("BF16", [3], 0, 6),
                                  "b": tensor("F16", [1, 2], 6, 10)}, bytes(10), pad=5),
    "scalar-and-empty": safetensors({"s": tensor("F32", [], 0, 4), "e": tensor("F32", [0, 4], 4, 4)}, bytes(4)),
    "no-tensors": safetensors({"__metadata__": {}}),
    "short": b"\x10\x00\x00",
    "length-past-end": safetensors({"w": tensor("F32", [1], 0, 4)}, bytes(4), length=1000),
    "length-huge": struct.pack("<Q", 1 << 62) + b"{}",
    "bad-json": safetensors('{"w": {"dtype": "F32",'),
    "not-object": safetensors("[1, 2]"),
    "trailing": safetensors('{} x'),
    "bad-dtype": safetensors({"w": tensor("I64", [1], 0, 8)}, bytes(8)),
    "shape-mismatch": safetensors({"w": tensor("F32", [3], 0, 8)}, bytes(8)),
    "negative-shape": safetensors({"w": tensor("F32", [-1], 0, 4)}, bytes(4)),
    "offsets-past-end": safetensors({"w": tensor("F32", [4], 0, 16)}, bytes(8)),
    "offsets-reversed": safetensors({"w": tensor("F32", [1], 8, 4)}, bytes(8)),
    "overlap": safetensors({"a": tensor("F32", [2], 0, 8), "b": tensor("F32", [2], 4, 12)}, bytes(12)),
    "entry-not-object": safetensors({"w": [1, 2]}),
    "missing-offsets": safetensors({"w": {"dtype": "F32", "shape": [1]}}, bytes(4)),
    "huge-shape": safetensors({"w": tensor("F32", [1 << 40, 1 << 40], 0, 4)}, bytes(4)),
}


def byte_char(b):
    """The ByteLevel pre-tokenizer's character for byte b (GPT-2's bytes_to_unicode)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    if b in printable:
        return chr(b)
    return chr(256 + sorted(set(range(256)) - set(printable)).index(b))


QWEN_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
              r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def tokenizer(pair_merges=False, normalizer=None, extra_merge=None, added=True, model_type="BPE", decoder=True):
    merges = [("l", "l"), ("e", "ll"), ("h", "ell"), ("hell", "o"), ("\u0120", "t"), ("h", "e"), ("\u0120t", "he")]
    vocab = {byte_char(b): b for b in range(256)}
    for i, (a, b) in enumerate(merges):
        vocab[a + b] = 256 + i
    listed = [[a, b] if pair_merges else f"{a} {b}" for a, b in merges]
    if extra_merge is not None:
        listed.append(extra_merge)
    special = [("<|im_start|>", True), ("<|im_end|>", True), ("<think>", False), ("</think>", False)]
    return {
        "version": "1.0",
        "added_tokens": [{"id": 263 + i, "content": c, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": s} for i, (c, s) in enumerate(special)] if added else [],
        "normalizer": normalizer if normalizer is not None else {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": QWEN_REGEX}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]},
        "post_processor": None,
        "decoder": {"type": "ByteLevel"} if decoder else None,
        "model": {"type": model_type, "dropout": None, "unk_token": None, "byte_fallback": False,
                  "vocab": vocab, "merges": listed},
    }


def sp_tokenizer(metaspace=False, unk=True, strip=1):
    """A SentencePiece-style BPE: characters and <0xNN> byte tokens, merges of U+2581 words."""
    sp = "\u2581"
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab["<0x%02X>" % b] = 3 + b
    for c in [sp, "h", "e", "l", "o", "w", "r", "d", "t", "\u00e9", "\u65e5"]:
        vocab[c] = len(vocab)
    merges = [(sp, "h"), ("e", "l"), (sp + "h", "el"), ("l", "o"), (sp + "hel", "lo"), (sp, sp), (sp, "w")]
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    specials = [{"id": i, "content": c, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
                 "special": True} for c, i in (("<unk>", 0), ("<s>", 1), ("</s>", 2))]
    if metaspace:
        normalizer = None
        pre = {"type": "Metaspace", "replacement": sp, "prepend_scheme": "first", "split": True}
        decoder = {"type": "Metaspace", "replacement": sp, "prepend_scheme": "first", "split": True}
    else:
        normalizer = {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": sp},
                                                          {"type": "Replace", "pattern": {"String": " "},
                                                           "content": sp}]}
        pre = None
        decoder = {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": sp}, "content": " "}, {"type": "ByteFallback"},
            {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": strip, "stop": 0}]}
    return {
        "version": "1.0", "added_tokens": specials, "normalizer": normalizer, "pre_tokenizer": pre,
        "post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                                                                    {"Sequence": {"id": "A", "type_id": 0}}],
                           "pair": [], "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}},
        "decoder": decoder,
        "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>" if unk else None, "fuse_unk": True,
                  "byte_fallback": True, "vocab": vocab, "merges": [f"{a} {b}" for a, b in merges]},
    }


TOKENIZERS = {
    "sp-bpe": sp_tokenizer(),
    "sp-metaspace": sp_tokenizer(metaspace=True),
    "sp-no-unk-strip-2": sp_tokenizer(unk=False, strip=2),
    "bpe": tokenizer(),
    "bpe-pair-merges": tokenizer(pair_merges=True),
    "bpe-no-normalizer": tokenizer(normalizer={"type": "Sequence", "normalizers": []}),
    "bpe-no-added": tokenizer(added=False),
    "bpe-no-decoder": tokenizer(decoder=False),
    "bad-merge-unknown": tokenizer(extra_merge="zz qq"),
    "bad-merge-shape": tokenizer(extra_merge=["a"]),
    "unsupported-model": tokenizer(model_type="WordPiece"),
    "unsupported-normalizer": tokenizer(normalizer={"type": "Lowercase"}),
}

TEXT = {
    "plain": b"\x00Hello world, it's 42 degrees.\n",
    "special": b"\x01<|im_start|>user\nhi<|im_end|><think>x</think>",
    "invalid-utf8": b"\x00ok \xff\xfe \xc3( \xe2\x82",
    "ids": b"\x08" + struct.pack("<6i", 1, 2, 4092, 4093, -5, 1 << 30),
    "chat": b"\x04\x00you are terse\x00\x01hello\x00\x02hi there\x01hmm, a greeting\x00\x01and now?",
    "chat-thinking": b"\x06\x01question\x00\x02<think>\nold\n</think>\n\nanswer\x00\x03tool says\x00\x01more",
    "chat-unknown-role": b"\x04\x04narration\x00\x01\x00\x02",
    "strict": b"\x18\xff\xff\xff\xff\x00\x10\x00\x00",
}

TCP_FRAMES = {
    "empty-message": b"\x00" + frame(b""),
    "one": b"\x00" + frame(b"hello"),
    "several": b"\x00" + frame(b"a" * 10) + frame(b"") + frame(bytes(range(256)) * 3),
    "no-crc": b"\x00" + frame(b"unchecked", flags=1),
    "over-limit": b"\x01" + frame(b"", length=(1 << 20) + 1),
    "at-limit-cut": b"\x01" + frame(b"x" * 100, length=1 << 20),
    "bad-magic": b"\x00" + frame(b"x", magic=b"PRI "),
    "http2-settings": b"\x00\x00\x00\x00\x04\x00" + bytes(30),
    "bad-version": b"\x00" + frame(b"x", version=2),
    "bad-flags": b"\x00" + frame(b"x", flags=0x8000),
    "bad-header-crc": b"\x00" + frame(b"x", hcrc=0),
    "bad-payload-crc": b"\x00" + frame(b"payload", crc=1),
    "cut-header": b"\x00" + frame(b"abc")[:10],
    "cut-payload": b"\x00" + frame(b"abcdef")[:27],
    "fix-checksums": b"\x01" + frame(b"one") + frame(b"two", flags=1) + frame(b"three"),
    "lowered-limit": b"\x03" + frame(b"small") + frame(b"x" * 4096) + frame(b"y" * 4097) + frame(b"z"),
}


def main():
    out = sys.argv[1]
    for target, seeds in (("safetensors", SAFETENSORS), ("text", TEXT), ("tcp_frames", TCP_FRAMES)):
        os.makedirs(os.path.join(out, target), exist_ok=True)
        for name, data in seeds.items():
            with open(os.path.join(out, target, name), "wb") as f:
                f.write(data)
    os.makedirs(os.path.join(out, "tokenizer"), exist_ok=True)
    for name, tok in TOKENIZERS.items():
        with open(os.path.join(out, "tokenizer", name + ".json"), "w", encoding="utf-8") as f:
            json.dump(tok, f, ensure_ascii=False)


if __name__ == "__main__":
    main()
