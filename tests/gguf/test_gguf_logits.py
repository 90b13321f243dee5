#!/usr/bin/python3
"""Logits of rlx on quantized GGUF files against the NumPy forward on the same weights.

  test_gguf_logits.py --rlx BIN --shared DIR/shared/gguf --workdir DIR [-- EXTRA_RLX_ARGS...]

For the draft Q4_K_M and Q4_0 files and the target Q8_0 (the block formats Q4_K, Q6_K, Q4_0
and Q8_0, a tied and the embedding as the LM head), the model is built in memory from the file
alone: every tensor dequantized by gguf_ref.py (the independent reader, itself checked bit for
bit against rlx's dequantization by test_gguf_tensors.py and against llama.cpp's quantizer by
test_gguf_ref.py) under its Hugging Face name, and the configuration from the qwen3.* metadata
(hidden size, layers, heads, KV heads, head size, RMS epsilon, RoPE base; tied embeddings when
there is no output.weight). tests/model/qwen3_ref.py, the float64 NumPy forward the golden
tests use, computes the logits of a Brown text prompt at every position, and
  rlx logits -m FILE --tokens IDS --all --out F --plugin ref
must agree everywhere within check_golden.py's F32 bound, max|rlx - ref| <= 1e-4 * max(1,
max|ref|): the reference kernels dequantize the weights and compute in F32 (no 8-bit
activations), so both compute the same function and only F32 rounding separates them (about
1e-6 relative). This checks what test_gguf_tensors.py cannot: that the quantized weights are
wired into the graph in the right places (names, transposition, the tied head), and that the
metadata is read into the right configuration. Exits 77 when the shared directory is absent.
"""
import argparse
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(REPO, "tests", "model"))
import check_golden  # noqa: E402
import gguf_common as C  # noqa: E402
import gguf_ref as G  # noqa: E402
import qwen3_ref as ref  # noqa: E402

FILES = ["brown-draft-q4_k_m.gguf", "brown-draft-q4_0.gguf", "brown-target-q8_0.gguf"]
TOL = check_golden.LOGITS_TOL
N_TOKENS = 40


class Tensors:
    """The checkpoint interface qwen3_ref reads (shape, rows, item access) over arrays in memory."""

    def __init__(self, arrays):
        self.arrays = arrays

    def shape(self, name):
        return self.arrays[name].shape

    def rows(self, name, index):
        return self.arrays[name][index]

    def __getitem__(self, name):
        return self.arrays[name]

    def __iter__(self):
        return iter(self.arrays)

    def __len__(self):
        return len(self.arrays)


def model_from_gguf(path):
    """A qwen3_ref.Model of a dense qwen3 GGUF file, from its metadata and dequantized tensors."""
    g = G.read(path)
    md = g.metadata
    if md.get("general.architecture") != "qwen3":
        raise ValueError("%s: architecture %r, not qwen3" % (path, md.get("general.architecture")))

    def key(name, default=None):
        value = md.get("qwen3." + name, default)
        if value is None:
            raise ValueError("%s: no qwen3.%s" % (path, name))
        return value

    arrays = {C.hf_name(t.name): g.tensor(t.name) for t in g.tensors}
    hidden, heads = key("embedding_length"), key("attention.head_count")
    config = {
        "model_type": "qwen3", "hidden_size": hidden, "num_hidden_layers": key("block_count"),
        "num_attention_heads": heads, "num_key_value_heads": key("attention.head_count_kv", heads),
        "head_dim": key("attention.key_length", hidden // heads), "rms_norm_eps": key("attention.layer_norm_rms_epsilon"),
        "rope_theta": key("rope.freq_base"), "intermediate_size": key("feed_forward_length"),
        "vocab_size": arrays["model.embed_tokens.weight"].shape[0],
        "tie_word_embeddings": "lm_head.weight" not in arrays, "attention_bias": False,
    }
    m = ref.Model.__new__(ref.Model)  # Model.__init__ reads a directory; set what it derives
    m.config, m.directory, m.moe = config, path, False
    m.layers, m.hidden, m.heads = config["num_hidden_layers"], hidden, heads
    m.kv_heads, m.head_dim, m.eps = config["num_key_value_heads"], config["head_dim"], config["rms_norm_eps"]
    m.rope_theta, m.tied = config["rope_theta"], config["tie_word_embeddings"]
    m.qkv_bias, m.o_bias, m.qk_norm = False, False, True
    m.window, m.sparse = [None] * m.layers, [False] * m.layers
    m.ckpt, m._cache, m.act_bf16 = Tensors(arrays), {}, frozenset()
    return m


def prompt_ids(rlx, model, text_path):
    """The first N_TOKENS ids of the held-out Brown text: ordinary text, unlike random ids."""
    with open(text_path, encoding="utf-8") as f:
        text = f.read(4000)
    p = C.run([rlx, "tokenize", "-m", model, "-p", text], timeout=60)
    if p.returncode != 0:
        raise check_golden.Failure("rlx tokenize exited %s: %s" % (p.returncode, p.stderr.decode(errors="replace")))
    ids = [int(t) for t in p.stdout.split()][:N_TOKENS]
    if len(ids) < N_TOKENS:
        raise check_golden.Failure("only %d tokens in the prompt text" % len(ids))
    return ids


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rlx", required=True)
    ap.add_argument("--shared", required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("rlx_args", nargs="*", help="extra rlx arguments, after -- (default: --plugin ref)")
    args = ap.parse_args()
    shared = C.shared_gguf_dir(args.shared)
    extra = args.rlx_args or ["--plugin", "ref"]
    failed = 0
    for name in FILES:
        path = os.path.join(shared, name)
        start = time.time()
        try:
            model = model_from_gguf(path)
            ids = prompt_ids(args.rlx, path, os.path.join(shared, "brown-heldout.txt"))
            want = ref.forward(model, ids)
            rlx = check_golden.Rlx(args.rlx, path, model.config["vocab_size"], extra, 600,
                                   os.path.join(args.workdir, name))
            err = check_golden.compare_logits("%s logits --all over %d tokens" % (name, len(ids)),
                                              rlx.logits(ids, True), want, TOL)
            types = sorted({t.type_name for t in G.read(path).tensors})
            print("PASS %s: max|diff| %.3g, bound %.3g (%g * max(1, max|ref| = %.3g)); types %s; %.1f s" % (
                name, err, TOL * max(1.0, float(np.abs(want).max())), TOL, float(np.abs(want).max()),
                "/".join(types), time.time() - start))
        except (check_golden.Failure, OSError, ValueError, KeyError) as e:
            print("FAIL %s: %s" % (name, e))
            failed += 1
    print("gguf_logits: %s" % ("%d of %d files FAIL" % (failed, len(FILES)) if failed else "PASS"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
