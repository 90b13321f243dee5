"""Writes a tiny valid qwen3 GGUF model and variations of it with one defect each, for testing
that a GGUF reader (rlx's C one) refuses broken files with a message that says what is wrong.

  python3 tests/gguf/make_bad_gguf.py OUT_DIR

OUT_DIR gets valid_tiny.gguf, one <defect>.gguf per case and bad_gguf_cases.json:
  {"<defect>.gguf": {"words": [...], "stage": "read" | "model", "defect": "..."}, ...}
"words" must all occur in the error message (compare case-insensitively): the key or tensor at
fault, and a word for the kind of fault. "stage" says who must refuse the file: "read" for a
file that breaks the GGUF format itself (any GGUF reader must refuse it), "model" for a
well-formed GGUF file that is not a loadable qwen3 model (the model loader must refuse it).

valid_tiny.gguf follows what llama.cpp writes for qwen3 (the metadata keys and tensor names of
the brown-*.gguf files in /work/shared/gguf): 2 layers, embedding 64, 4 heads of 16, 2 KV
heads, feed-forward 128, tied embeddings (no output.weight), all tensors F32 from a fixed seed;
a byte-level BPE vocabulary (tokenizer.ggml.model gpt2, pre qwen2): the 256 byte characters of
GPT-2's byte-to-unicode table (in the real files' order: token 0 is '!'), a few merges, and
<|endoftext|>, <|im_start|>, <|im_end|> as control tokens (token type 3).
"""
import json
import os
import struct
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gguf_ref as G  # noqa: E402

N_EMBD, N_LAYER, N_HEAD, N_KV, HEAD_DIM, N_FF = 64, 2, 4, 2, 16, 128
MERGES = ["Ġ t", "h e", "Ġt he", "i n", "Ġ a", "e r"]
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TOKEN_NORMAL, TOKEN_CONTROL = 1, 3


def byte_level_alphabet():
    """The 256 single-byte tokens of GPT-2's byte-to-unicode table, in the order llama.cpp's
    files list them (as /work/shared/gguf's do): first the bytes that stand for themselves ('!'
    to '~', '¡' to '¬', '®' to 'ÿ'), then the other 68 bytes in byte order as the characters
    from U+0100 upwards (space, byte 32, becomes 'Ġ' = U+0120)."""
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
                 + list(range(ord("®"), ord("ÿ") + 1)))
    others = [b for b in range(256) if b not in printable]
    return [chr(b) for b in printable] + [chr(256 + i) for i in range(len(others))]


def vocabulary():
    tokens = byte_level_alphabet()
    for m in MERGES:
        a, b = m.split(" ")
        assert a in tokens and b in tokens, m
        tokens.append(a + b)
    types = [TOKEN_NORMAL] * len(tokens)
    tokens += SPECIALS
    types += [TOKEN_CONTROL] * len(SPECIALS)
    return tokens, types


def tiny_metadata():
    tokens, types = vocabulary()
    eos = tokens.index("<|endoftext|>")
    return [
        ("general.architecture", (G.STRING, "qwen3")),
        ("general.type", (G.STRING, "model")),
        ("general.name", (G.STRING, "tiny")),
        ("qwen3.context_length", (G.UINT32, 256)),
        ("qwen3.embedding_length", (G.UINT32, N_EMBD)),
        ("qwen3.block_count", (G.UINT32, N_LAYER)),
        ("qwen3.feed_forward_length", (G.UINT32, N_FF)),
        ("qwen3.attention.head_count", (G.UINT32, N_HEAD)),
        ("qwen3.attention.head_count_kv", (G.UINT32, N_KV)),
        ("qwen3.attention.key_length", (G.UINT32, HEAD_DIM)),
        ("qwen3.attention.value_length", (G.UINT32, HEAD_DIM)),
        ("qwen3.rope.freq_base", (G.FLOAT32, 1000000.0)),
        ("qwen3.attention.layer_norm_rms_epsilon", (G.FLOAT32, 1e-6)),
        ("general.file_type", (G.UINT32, 0)),
        ("general.quantization_version", (G.UINT32, 2)),
        ("tokenizer.ggml.model", (G.STRING, "gpt2")),
        ("tokenizer.ggml.pre", (G.STRING, "qwen2")),
        ("tokenizer.ggml.tokens", (G.ARRAY, (G.STRING, tokens))),
        ("tokenizer.ggml.token_type", (G.ARRAY, (G.INT32, types))),
        ("tokenizer.ggml.merges", (G.ARRAY, (G.STRING, MERGES))),
        ("tokenizer.ggml.eos_token_id", (G.UINT32, eos)),
        ("tokenizer.ggml.padding_token_id", (G.UINT32, eos)),
        ("tokenizer.ggml.add_bos_token", (G.BOOL, False)),
    ]


def tiny_tensors(seed=20261201):
    """(name, GGUF dims, type, bytes) for every qwen3 tensor, F32, in llama.cpp's names."""
    rng = np.random.default_rng(seed)
    n_vocab = len(vocabulary()[0])
    out = []

    def add(name, dims, norm=False):
        n = int(np.prod(dims))
        v = 1.0 + 0.1 * rng.standard_normal(n) if norm else 0.05 * rng.standard_normal(n)
        out.append((name, list(dims), G.F32, v.astype("<f4").tobytes()))

    add("token_embd.weight", (N_EMBD, n_vocab))
    for i in range(N_LAYER):
        p = "blk.%d." % i
        add(p + "attn_norm.weight", (N_EMBD,), norm=True)
        add(p + "attn_q.weight", (N_EMBD, N_HEAD * HEAD_DIM))
        add(p + "attn_k.weight", (N_EMBD, N_KV * HEAD_DIM))
        add(p + "attn_v.weight", (N_EMBD, N_KV * HEAD_DIM))
        add(p + "attn_output.weight", (N_HEAD * HEAD_DIM, N_EMBD))
        add(p + "attn_q_norm.weight", (HEAD_DIM,), norm=True)
        add(p + "attn_k_norm.weight", (HEAD_DIM,), norm=True)
        add(p + "ffn_norm.weight", (N_EMBD,), norm=True)
        add(p + "ffn_gate.weight", (N_EMBD, N_FF))
        add(p + "ffn_up.weight", (N_EMBD, N_FF))
        add(p + "ffn_down.weight", (N_FF, N_EMBD))
    add("output_norm.weight", (N_EMBD,), norm=True)
    return out


def _replace_kv(md, key, val):
    return [(k, val if k == key else v) for k, v in md]


def _replace_tensor(ts, name, dims=None, ttype=None, data=None):
    out = []
    for n, d, t, b in ts:
        if n == name:
            d = d if dims is None else dims
            t = t if ttype is None else ttype
            b = b if data is None else data
        out.append((n, d, t, b))
    return out


def make_all(out_dir):
    """Write every file into out_dir; return the cases (as written to bad_gguf_cases.json)."""
    os.makedirs(out_dir, exist_ok=True)
    md, ts = tiny_metadata(), tiny_tensors()
    valid = G.write(os.path.join(out_dir, "valid_tiny.gguf"), md, ts)
    parsed = G.parse(valid)
    offset_of = {t.name: t.offset for t in parsed.tensors}
    last = parsed.tensors[-1]
    cases = {}

    def case(defect, words, stage, what, **kw):
        path = os.path.join(out_dir, defect + ".gguf")
        G.write(path, kw.pop("md", md), kw.pop("ts", ts), **kw)
        cases[defect + ".gguf"] = {"words": words, "stage": stage, "defect": what}

    case("bad_magic", ["magic"], "read", "the first 4 bytes are 'GGUX'", magic=b"GGUX")
    case("version_1", ["version"], "read", "version 1 (32-bit counts, unsupported)", version=1)
    case("version_99", ["version"], "read", "version 99", version=99)
    case("truncated_header", ["truncated"], "read", "the file ends inside the header's counts",
         truncate=20)
    case("truncated_data", ["truncated", last.name], "read",
         "the file ends 100 bytes before the end of the last tensor's data",
         truncate=last.data_offset + last.nbytes - 100)
    case("unknown_value_type", ["type", "qwen3.rope.freq_base"], "read",
         "qwen3.rope.freq_base has value type 13, which does not exist",
         md=_replace_kv(md, "qwen3.rope.freq_base", G.Raw(13, struct.pack("<f", 1e6))))
    case("huge_array_length", ["length", "tokenizer.ggml.merges"], "read",
         "tokenizer.ggml.merges claims 2^40 strings",
         md=_replace_kv(md, "tokenizer.ggml.merges", G.Raw(G.ARRAY, struct.pack("<IQ", G.STRING, 1 << 40))))
    case("huge_string_length", ["length", "general.name"], "read",
         "general.name claims a 2^40-byte string",
         md=_replace_kv(md, "general.name", G.Raw(G.STRING, struct.pack("<Q", 1 << 40))))
    case("duplicate_key", ["duplicate", "qwen3.block_count"], "read", "qwen3.block_count appears twice",
         md=md + [("qwen3.block_count", (G.UINT32, N_LAYER))])
    dup = [t for t in ts if t[0] == "blk.0.attn_norm.weight"][0]
    case("duplicate_tensor", ["duplicate", "blk.0.attn_norm.weight"], "read",
         "blk.0.attn_norm.weight appears twice", ts=ts + [dup])
    case("misaligned_offset", ["align", "blk.0.attn_q.weight"], "read",
         "blk.0.attn_q.weight's offset is 8 past a multiple of 32",
         offsets={"blk.0.attn_q.weight": offset_of["blk.0.attn_q.weight"] + 8})
    case("offset_beyond_file", ["offset", "blk.0.attn_k.weight"], "read",
         "blk.0.attn_k.weight's offset is 2^40", offsets={"blk.0.attn_k.weight": 1 << 40})
    case("unknown_tensor_type", ["type", "blk.0.ffn_gate.weight"], "read",
         "blk.0.ffn_gate.weight has ggml type 99", ts=_replace_tensor(ts, "blk.0.ffn_gate.weight", ttype=99))
    case("zero_dims", ["dimension", "blk.0.attn_norm.weight"], "read",
         "blk.0.attn_norm.weight has n_dims = 0", ts=_replace_tensor(ts, "blk.0.attn_norm.weight", dims=[]))
    case("too_many_dims", ["dimension", "blk.1.attn_norm.weight"], "read",
         "blk.1.attn_norm.weight has 5 dimensions [64, 1, 1, 1, 1]",
         ts=_replace_tensor(ts, "blk.1.attn_norm.weight", dims=[N_EMBD, 1, 1, 1, 1]))
    # 2^32 * 2^32 * 16 = 2^68: wraps to exactly 0 in unsigned 64-bit arithmetic, so a reader that
    # multiplies without checking sees an empty tensor
    case("dims_overflow", ["overflow", "blk.0.ffn_norm.weight"], "read",
         "blk.0.ffn_norm.weight dims [2^32, 2^32, 16]: 2^68 elements",
         ts=_replace_tensor(ts, "blk.0.ffn_norm.weight", dims=[1 << 32, 1 << 32, 16]))
    case("row_not_whole_blocks", ["block", "blk.0.attn_q.weight"], "read",
         "blk.0.attn_q.weight is Q8_0 with ne0 = 40, not a multiple of 32",
         ts=_replace_tensor(ts, "blk.0.attn_q.weight", dims=[40, 64], ttype=G.Q8_0, data=bytes(34 * 80)))
    case("missing_architecture", ["general.architecture"], "model", "no general.architecture key",
         md=[kv for kv in md if kv[0] != "general.architecture"])
    # an architecture rlx has no file for: named, with the ones it runs by their GGUF names
    case("unknown_architecture", ["'mamba'", "qwen3_moe", "qwen3moe"], "model",
         "general.architecture is 'mamba'",
         md=[(k, (G.STRING, "mamba")) if k == "general.architecture" else (k, v) for k, v in md])
    case("shape_mismatch_config", ["shape", "blk.0.attn_q.weight"], "model",
         "blk.0.attn_q.weight is [64, 32] but 4 heads of 16 need [64, 64]",
         ts=_replace_tensor(ts, "blk.0.attn_q.weight", dims=[N_EMBD, 32], data=bytes(4 * N_EMBD * 32)))
    # Llama 3.1's RoPE divisors (rope_freqs.weight) must be head_dim / 2 positive F32 values
    half = HEAD_DIM // 2
    case("rope_freqs_length", ["rope_freqs.weight", "head_dim"], "model",
         "rope_freqs.weight holds 3 values, head_dim / 2 is %d" % half,
         ts=ts + [("rope_freqs.weight", [3], G.F32, np.ones(3, "<f4").tobytes())])
    case("rope_freqs_zero", ["rope_freqs.weight", "positive"], "model", "rope_freqs.weight holds a 0",
         ts=ts + [("rope_freqs.weight", [half], G.F32, np.zeros(half, "<f4").tobytes())])
    # RoPE over an even part of each head is llama.cpp's n_rot (Qwen3.5 turns a quarter); more
    # values than the head has, or an odd number, cannot be pairs of one head
    case("rope_beyond_head", ["qwen3.rope.dimension_count", "head_dim"], "model", "RoPE over more than the head",
         md=md + [("qwen3.rope.dimension_count", (G.UINT32, HEAD_DIM + 2))])
    case("rope_odd", ["qwen3.rope.dimension_count", "even part"], "model", "RoPE over an odd number of values",
         md=md + [("qwen3.rope.dimension_count", (G.UINT32, HEAD_DIM // 2 + 1))])
    case("rope_scaling_yarn", ["qwen3.rope.scaling.type", "yarn"], "model", "a YaRN-scaled RoPE",
         md=md + [("qwen3.rope.scaling.type", (G.STRING, "yarn"))])

    with open(os.path.join(out_dir, "bad_gguf_cases.json"), "w") as f:
        json.dump(cases, f, indent=1, sort_keys=True)
        f.write("\n")
    return cases


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: make_bad_gguf.py OUT_DIR", file=sys.stderr)
        sys.exit(2)
    cases = make_all(sys.argv[1])
    print("wrote valid_tiny.gguf and %d broken files to %s" % (len(cases), sys.argv[1]))
