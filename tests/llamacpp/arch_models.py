"""The random-weight checkpoints of the llama.cpp reference tests, one per architecture.

Each is a make_model.py kind (tests/model; make_hybrid.py's for the Qwen3.5 hybrid) reshaped
around the Brown tokenizer (share/models/brown/target/tokenizer.json: 4096 ids, `<|endoftext|>`
4093, `<|im_start|>` 4094, `<|im_end|>` 4095), so that prompts are text, the files stay small and
the same text measures perplexity. make_refs.py converts them with llama.cpp and records what llama.cpp computes;
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
import make_hybrid  # noqa: E402
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
    # Qwen3.5's text model in miniature (make_hybrid.py's kinds, whose changes are to the kind,
    # the text config replaced whole): Qwen3_5ForCausalLM, the flat layout, as llama.cpp's
    # converter takes it without vision weights (it registers the nested
    # Qwen3_5ForConditionalGeneration for the same text model and drops model.visual.*). Four
    # layers at full_attention_interval 4 (layer_types stated too, as Qwen3.5 configs have
    # both): three Gated DeltaNet layers, then one gated full-attention layer. 2 key heads
    # serve 4 value heads, so the converter reorders the value heads from grouped to tiled
    # order; key and value heads both of 24 (llama.cpp's qwen35 loader takes both from
    # ssm.state_size), a size no other width of the model has (q/k 48, v 96, conv 192, hidden
    # 128, attention heads 32), so a width taken for another shows as a shape error. Attention:
    # 4 query heads over 2 KV heads of 32, partial_rotary_factor 0.25 (8 values turn), rope in
    # rope_parameters with Qwen3.5's theta 1e7 and an mrope_section for those 8 values. Tied,
    # as the small Qwen3.5 models. An MTP layer, as Qwen's published checkpoints have: llama.cpp's
    # converter stops on a Qwen3.5 checkpoint without one unless told --no-mtp, and with it
    # writes it as the nextn block blk.4 (qwen35.nextn_predict_layers 1), which llama.cpp's
    # programs do not run.
    "qwen35": ("qwen35-flat", dict(mtp=True, tie=True, text=dict(
        dict(make_hybrid.TEXT, **BROWN_BODY), num_hidden_layers=4, full_attention_interval=4,
        layer_types=["linear_attention"] * 3 + ["full_attention"], head_dim=32, linear_num_key_heads=2,
        linear_num_value_heads=4, linear_key_head_dim=24, linear_value_head_dim=24, linear_conv_kernel_dim=4,
        mtp_num_hidden_layers=1, mtp_use_dedicated_embeddings=False,
        rope_parameters=dict(rope_type="default", rope_theta=10000000.0, partial_rotary_factor=0.25,
                             mrope_section=[1, 1, 2], mrope_interleaved=True)))),
    # Qwen3.5-MoE's text model in miniature (make_hybrid.py's qwen35moe-mtp, made flat:
    # Qwen3_5MoeForCausalLM, as qwen35 above): qwen35's layers at full_attention_interval 2
    # (linear, full, linear, full) with every MLP a mixture of 4 experts of 32, top 2, stored
    # fused as transformers saves them (the converter splits gate_up_proj), and a shared expert
    # of 160 with its sigmoid gate (llama.cpp's ffn_gate_inp_shexp, a vector); 160 is a width no
    # other tensor has, so a width taken for another shows as a shape error (both multiples of
    # 32, as Q8_0 needs of a down projection's rows). Tied, as qwen35. Its MTP layer,
    # whose MLP is a mixture of experts too, becomes the nextn block blk.4.
    "qwen35moe": ("qwen35moe-mtp", dict(layout="flat", experts="fused", mtp=True, tie=True, text=dict(
        dict(make_hybrid.TEXT, **BROWN_BODY), num_hidden_layers=4, full_attention_interval=2,
        layer_types=["linear_attention", "full_attention"] * 2, head_dim=32, linear_num_key_heads=2,
        linear_num_value_heads=4, linear_key_head_dim=24, linear_value_head_dim=24, linear_conv_kernel_dim=4,
        num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=160,
        mtp_num_hidden_layers=1, mtp_use_dedicated_embeddings=False,
        rope_parameters=dict(rope_type="default", rope_theta=10000000.0, partial_rotary_factor=0.25,
                             mrope_section=[1, 1, 2], mrope_interleaved=True)))),
    # Qwen3-Next in miniature (make_hybrid.py's qwen3next-mtp): Qwen3NextForCausalLM with
    # in_proj_qkvz and in_proj_ba grouped per key head (the converter splits the first into
    # attn_qkv and attn_gate and keeps the value heads in Hugging Face's order; the second stays
    # whole as ssm_ba), 2 key heads over 4 value heads, both of 24 (llama.cpp's qwen3next takes
    # both from ssm.state_size), three Gated DeltaNet layers then a gated full-attention one,
    # plain partial RoPE, experts one tensor each as the released checkpoints store them (4 of
    # 32, top 2, renormalised, a shared expert of 160), tied. An MTP layer (mtp.*, no
    # mtp_num_hidden_layers in Qwen3-Next's config: the converter counts the layers) as blk.4.
    "qwen3next": ("qwen3next-mtp", dict(layout="flat", experts="split", mtp=True, tie=True, text=dict(
        dict(make_hybrid.TEXT, **BROWN_BODY), num_hidden_layers=4, full_attention_interval=4,
        layer_types=["linear_attention"] * 3 + ["full_attention"], head_dim=32, linear_num_key_heads=2,
        linear_num_value_heads=4, linear_key_head_dim=24, linear_value_head_dim=24, linear_conv_kernel_dim=4,
        num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=160,
        norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
        rope_parameters=dict(rope_type="default", rope_theta=10000000.0, partial_rotary_factor=0.25)))),
}


def build(name, out):
    """Writes checkpoint `name` to `out` (absent or empty): make_model's files plus the Brown
    tokenizer's. Returns its digests."""
    base, changes = MODELS[name]
    generator = make_hybrid if base in make_hybrid.KINDS else make_model
    generator.KINDS[name] = dict(generator.KINDS[base], **changes)
    generator.build(name, "f32", 1, SEED, out)
    for f in TOKENIZER_FILES:
        shutil.copyfile(os.path.join(BROWN, f), os.path.join(out, f))
    return digests(out)


def hybrid(name):
    """Whether checkpoint `name` is a recurrent hybrid (make_hybrid.py's: Qwen3.5, Qwen3.5-MoE,
    Qwen3-Next)."""
    return MODELS[name][0] in make_hybrid.KINDS


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
