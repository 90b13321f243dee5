"""The random-weight checkpoints of the llama.cpp reference tests, one per architecture.

Each is a make_model.py kind (tests/model) reshaped around the Brown tokenizer
(share/models/brown/target/tokenizer.json: 4096 ids, `<|endoftext|>` 4093, `<|im_start|>` 4094,
`<|im_end|>` 4095), so that prompts are text, the files stay small and the same text measures
perplexity. make_refs.py converts them with llama.cpp and records what llama.cpp computes;
test_llamacpp.py writes them again at test time and checks they hash to what was converted, so
only llama.cpp's output needs to be committed.
"""
import hashlib
import os
import shutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "tests", "model"))
import make_model  # noqa: E402

BROWN = os.path.join(REPO, "share", "models", "brown", "target")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
SEED = 27

# What every checkpoint shares: the Brown vocabulary and special ids (as Qwen2.5 has them:
# bos = <|endoftext|>, eos = <|im_end|>), a body small enough that one F32 file is ~3-5 MB, and
# a context long enough for llama-perplexity's 256-token chunks and the 48-token continuations.
# Two layers, so a layer index mixed up anywhere shows; 4 query heads over 2 KV heads, so grouped
# attention (and llama.cpp's per-KV-head permutation of K) is exercised.
BROWN_BODY = dict(vocab_size=4096, bos_token_id=4093, eos_token_id=4095, hidden_size=128,
                  intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=1024)

# name -> (make_model kind, changes to it). The name is the stem of the GGUF files.
MODELS = {
    # Qwen2.5-0.5B's shape in miniature: q/k/v biases, tied embeddings, theta 1e6, a sliding
    # window stated but switched off (use_sliding_window false), as Qwen2.5 configs have it.
    "qwen2": ("qwen2-tied", dict(BROWN_BODY, sliding_window=32768, max_window_layers=2)),
    # Llama 3.2-1B's shape in miniature: tied embeddings, head_dim stated, theta 500000 and
    # rope_scaling "llama3" with an original context of 64, so that with head_dim 32 frequency
    # pairs 0-1 keep their frequency, 2 is smoothed and 3-15 are divided by the factor: every
    # branch of the rule shows within the test's positions. llama.cpp's converter writes the
    # factors as the rope_freqs tensor and permutes the Q and K rows for its RoPE layout.
    "llama": ("llama3-rope", dict(BROWN_BODY, head_dim=32, rope_theta=500000.0)),
    # Mistral 7B's layer in miniature: no biases, untied head. llama.cpp converts
    # MistralForCausalLM as its `llama` architecture, which has no sliding window, so the window
    # here is Mistral-7B-v0.1's 4096, longer than anything the test runs: llama.cpp can only
    # vouch for a window that never slides (the golden test checks a sliding one against NumPy).
    "mistral": ("mistral", dict(BROWN_BODY, sliding_window=4096)),
}


def build(name, out):
    """Writes checkpoint `name` to `out` (absent or empty): make_model's files plus the Brown
    tokenizer's. Returns its digests."""
    base, changes = MODELS[name]
    make_model.KINDS[name] = dict(make_model.KINDS[base], **changes)
    make_model.build(name, "f32", 1, SEED, out)
    for f in TOKENIZER_FILES:
        shutil.copyfile(os.path.join(BROWN, f), os.path.join(out, f))
    return digests(out)


def digests(path):
    """sha256 of every file of a checkpoint directory, by name."""
    out = {}
    for name in sorted(os.listdir(path)):
        if name.startswith("."):
            continue
        h = hashlib.sha256()
        with open(os.path.join(path, name), "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        out[name] = h.hexdigest()
    return out
