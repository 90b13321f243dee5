#!/usr/bin/python3
"""Write random-weight Qwen3.5 (model_type qwen3_5) models in the real Hugging Face layout.

  make_hybrid.py --kind KIND [--dtype f32|bf16|f16] [--shards N] [--seed S] --out DIR

DIR (absent or empty) receives config.json, generation_config.json and model.safetensors (or N
shards plus the index), like make_model.py, whose scales and tensor seeding this follows:
weights depend only on (kind, seed, tensor name). Kinds (KINDS) cover both layouts:
  nested  Qwen3_5ForConditionalGeneration: config.json {"model_type": "qwen3_5", "text_config":
          {...}, "vision_config": {...}}, text weights model.language_model.*, lm_head.weight at
          the top, plus a few tiny vision tensors model.visual.* that a text-only loader must skip
  flat    Qwen3_5ForCausalLM: config.json is the text config ("qwen3_5_text"), weights model.*
and one kind carries an MTP layer under Qwen's names (mtp.fc, mtp.pre_fc_norm_embedding,
mtp.pre_fc_norm_hidden, mtp.layers.0.* a full-attention decoder layer, mtp.norm; config
text_config.mtp_num_hidden_layers = 1), which HF's text model ignores (_keys_to_ignore_on_load_
unexpected ^mtp.*) and llama.cpp's converter maps to its nextn block (fc -> eh_proj, the
embedding norm's output first in the concatenation).

Scales, as make_model.py: activations O(1), every (1 + w) norm weight w ~ N(0, NORM_STD) (HF
initialises them to 0; random w makes every element matter), the gated norm's weight ~ 1 +
N(0, NORM_STD) (it multiplies by w itself), mixer and MLP outputs gained RESIDUAL_GAIN, the LM
head scaled for logits of std ~LOGIT_STD. dt_bias is HF's init (ones). A_log is log A with A in
HF's init interval [0.01, 16], drawn log-uniformly rather than uniformly so that a few heads
already include slow decays (exp(g) ~ 0.99 per token) as well as fast ones: with HF's uniform
draw nearly every head of a small model forgets within a token or two, and the recurrent state
would barely be tested.
"""
import argparse
import json
import math
import os
import sys
import zlib

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_model  # noqa: E402
import st  # noqa: E402

from make_model import DTYPES, LOGIT_STD, NORM_STD, RESIDUAL_GAIN  # noqa: E402

A_RANGE = (0.01, 16.0)  # HF's init interval for A = exp(A_log)

TEXT = dict(vocab_size=512, hidden_size=64, intermediate_size=128, max_position_embeddings=256,
            rms_norm_eps=1e-6, bos_token_id=509, eos_token_id=511, hidden_act="silu",
            attention_bias=False, attention_dropout=0.0, linear_conv_kernel_dim=4,
            initializer_range=0.02, use_cache=True)

# The vision tower of the nested kinds: tiny, never run by a text model; only its tensors'
# presence matters (vision_config as Qwen3_5VisionConfig writes it).
VISION = dict(model_type="qwen3_5_vision", depth=1, hidden_size=16, intermediate_size=32, num_heads=2,
              in_channels=3, patch_size=2, spatial_merge_size=2, temporal_patch_size=2, out_hidden_size=64,
              num_position_embeddings=16, hidden_act="gelu_pytorch_tanh", initializer_range=0.02)

KINDS = {
    # Qwen3.5-2B-like: nested, tied embeddings, full_attention_interval 4 (layers 0-2 linear,
    # layer 3 full), 2 key heads serving 4 value heads, Dk 16 != Dv 8; attention 4 query heads
    # of 32 on 2 kv heads, q width 128 != hidden, rope in rope_parameters with mrope_section
    # and partial_rotary_factor 0.25 (8 of 32 values turn).
    "qwen35-tied": dict(layout="nested", mtp=False, tie=True, text=dict(
        TEXT, num_hidden_layers=4, full_attention_interval=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, linear_num_key_heads=2, linear_num_value_heads=4,
        linear_key_head_dim=16, linear_value_head_dim=8,
        rope_parameters=dict(rope_type="default", rope_theta=10000000, partial_rotary_factor=0.25,
                             mrope_section=[1, 1, 2], mrope_interleaved=True))),
    # Qwen3.5-9B-like: nested, untied, no layer_types nor interval (HF's default interval 4),
    # Hv = Hk = 4 of 16, an MTP layer; rope_theta 1e6 with partial 0.5 of head_dim 16.
    "qwen35-untied-mtp": dict(layout="nested", mtp=True, tie=False, text=dict(
        TEXT, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=1, head_dim=16,
        linear_num_key_heads=4, linear_num_value_heads=4, linear_key_head_dim=16,
        linear_value_head_dim=16, mtp_num_hidden_layers=1, mtp_use_dedicated_embeddings=False,
        rope_parameters=dict(rope_type="default", rope_theta=1000000.0, partial_rotary_factor=0.5))),
    # Qwen3_5ForCausalLM, flat: 2 layers from an explicit layer_types list (linear, full),
    # untied, 2 key heads of 8 serving 4 value heads of 16 (Dk < Dv), rope_theta and
    # partial_rotary_factor at the top level (older configs), head_dim 32, 8 values turn.
    "qwen35-flat": dict(layout="flat", mtp=False, tie=False, text=dict(
        TEXT, num_hidden_layers=2, layer_types=["linear_attention", "full_attention"],
        num_attention_heads=2, num_key_value_heads=2, head_dim=32, linear_num_key_heads=2,
        linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=16,
        rope_theta=10000.0, partial_rotary_factor=0.25)),
}
# What qwen35_ref.py self-test builds (all of them: they are small)
SELF_TEST_KINDS = tuple(KINDS)


def make_config(kind, dtype):
    """config.json as transformers writes it for the kind's layout, keys sorted."""
    k = KINDS[kind]
    dtype_name = DTYPES[dtype][1]
    text = dict(k["text"], tie_word_embeddings=k["tie"], dtype=dtype_name)
    if k["layout"] == "flat":
        return dict(text, model_type="qwen3_5_text", architectures=["Qwen3_5ForCausalLM"],
                    transformers_version="4.57.0.dev0")
    text["model_type"] = "qwen3_5_text"
    return dict(architectures=["Qwen3_5ForConditionalGeneration"], model_type="qwen3_5", text_config=text,
                vision_config=dict(VISION), tie_word_embeddings=k["tie"], image_token_id=505,
                video_token_id=506, vision_start_token_id=507, vision_end_token_id=508,
                dtype=dtype_name, transformers_version="4.57.0.dev0")


def text_config(config):
    return config["text_config"] if "text_config" in config else config


def tensor_specs(kind, config, seed):
    """(name, shape, produce) for every tensor, for st.write: vision (nested kinds), the text
    model, lm_head when untied, then the MTP layer (when the kind has one)."""
    specs = []
    k, c = KINDS[kind], text_config(config)

    def add(name, shape, draw):
        def produce():
            # One generator per tensor, keyed by name: values don't depend on write order.
            rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
            yield draw(rng, shape).astype(np.float32)
        specs.append((name, tuple(shape), produce))

    def normal(name, shape, std, mean=0.0):
        add(name, shape, lambda rng, s: mean + std * rng.standard_normal(s))

    def linear(name, n_out, n_in, gain=1.0, bias=False):
        normal(name + ".weight", (n_out, n_in), gain / math.sqrt(n_in))
        if bias:
            normal(name + ".bias", (n_out,), make_model.BIAS_STD)

    def norm_1p(name, n):  # Qwen3_5RMSNorm: the file holds w of (1 + w)
        normal(name, (n,), NORM_STD)

    H, V, inter = c["hidden_size"], c["vocab_size"], c["intermediate_size"]
    heads, kv, D = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    Hk, Hv = c["linear_num_key_heads"], c["linear_num_value_heads"]
    Dk, Dv, K = c["linear_key_head_dim"], c["linear_value_head_dim"], c["linear_conv_kernel_dim"]
    conv_dim = 2 * Hk * Dk + Hv * Dv
    bias = c.get("attention_bias", False)
    head_std = LOGIT_STD / math.sqrt(H)  # the final norm makes the hidden state RMS ~1
    nested = k["layout"] == "nested"
    prefix = "model.language_model." if nested else "model."

    if nested:
        v = config["vision_config"]
        vh, p = v["hidden_size"], v["patch_size"]
        normal("model.visual.patch_embed.proj.weight", (vh, v["in_channels"], v["temporal_patch_size"], p, p), 0.1)
        normal("model.visual.patch_embed.proj.bias", (vh,), 0.1)
        normal("model.visual.pos_embed.weight", (v["num_position_embeddings"], vh), 0.1)
        normal("model.visual.blocks.0.norm1.weight", (vh,), 0.1, 1.0)
        linear("model.visual.blocks.0.attn.qkv", 3 * vh, vh, bias=True)
        merged = vh * v["spatial_merge_size"] ** 2
        linear("model.visual.merger.linear_fc2", v["out_hidden_size"], merged, bias=True)

    # Tied: the embedding is the LM head and gets its scale; the first norm absorbs it.
    normal(prefix + "embed_tokens.weight", (V, H), head_std if k["tie"] else 1.0)

    def attention(p):
        linear(p + "self_attn.q_proj", 2 * heads * D, H, bias=bias)  # per head [query | gate]
        linear(p + "self_attn.k_proj", kv * D, H, bias=bias)
        linear(p + "self_attn.v_proj", kv * D, H, bias=bias)
        linear(p + "self_attn.o_proj", H, heads * D, RESIDUAL_GAIN, bias=bias)
        norm_1p(p + "self_attn.q_norm.weight", D)
        norm_1p(p + "self_attn.k_norm.weight", D)

    def dense_layer(p, full):
        norm_1p(p + "input_layernorm.weight", H)
        if full:
            attention(p)
        else:
            a = p + "linear_attn."
            linear(a + "in_proj_qkv", conv_dim, H)
            linear(a + "in_proj_z", Hv * Dv, H)
            linear(a + "in_proj_b", Hv, H)
            linear(a + "in_proj_a", Hv, H)
            normal(a + "conv1d.weight", (conv_dim, 1, K), 1 / math.sqrt(K))  # sum of K terms: O(1)
            add(a + "dt_bias", (Hv,), lambda rng, s: np.ones(s))
            add(a + "A_log", (Hv,), lambda rng, s: rng.uniform(*np.log(A_RANGE), s))
            normal(a + "norm.weight", (Dv,), NORM_STD, 1.0)  # RMSNormGated: w itself
            linear(a + "out_proj", H, Hv * Dv, RESIDUAL_GAIN)
        norm_1p(p + "post_attention_layernorm.weight", H)
        linear(p + "mlp.gate_proj", inter, H)
        linear(p + "mlp.up_proj", inter, H)
        linear(p + "mlp.down_proj", H, inter, RESIDUAL_GAIN)

    types = c.get("layer_types") or [
        "full_attention" if (i + 1) % c.get("full_attention_interval", 4) == 0 else "linear_attention"
        for i in range(c["num_hidden_layers"])]
    for i, t in enumerate(types):
        dense_layer(f"{prefix}layers.{i}.", t == "full_attention")
    norm_1p(prefix + "norm.weight", H)
    if not k["tie"]:
        normal("lm_head.weight", (V, H), head_std)
    if k["mtp"]:
        # Qwen's MTP block: fc([pre_fc_norm_embedding(embed(t)) ; pre_fc_norm_hidden(h)]) -> one
        # full-attention decoder layer -> norm -> the shared LM head
        norm_1p("mtp.pre_fc_norm_embedding.weight", H)
        norm_1p("mtp.pre_fc_norm_hidden.weight", H)
        linear("mtp.fc", H, 2 * H)
        for n in range(c["mtp_num_hidden_layers"]):
            dense_layer(f"mtp.layers.{n}.", True)
        norm_1p("mtp.norm.weight", H)
    return specs


def make_generation_config(config):
    return make_model.make_generation_config(text_config(config))


def build(kind, dtype, shards, seed, out):
    """Write the model; `out` must be absent or empty so no stale shard can be picked up."""
    if os.path.isdir(out) and os.listdir(out):
        raise FileExistsError(f"{out} is not empty")
    config = make_config(kind, dtype)
    specs = tensor_specs(kind, config, seed)
    st.write(out, specs, DTYPES[dtype][0], shards, metadata={"rlx_kind": kind, "rlx_seed": str(seed)})
    for name, obj in (("config.json", config), ("generation_config.json", make_generation_config(config))):
        with open(os.path.join(out, name), "w") as f:
            json.dump(obj, f, indent=2, sort_keys=True)
            f.write("\n")
    return config


def main(argv=None):
    ap = argparse.ArgumentParser(description="Write a random-weight Qwen3.5 model in HF layout.")
    ap.add_argument("--kind", required=True, choices=sorted(KINDS))
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="f32", help="storage dtype (default f32)")
    ap.add_argument("--shards", type=int, default=1, help="number of safetensors files")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True, help="output directory (absent or empty)")
    args = ap.parse_args(argv)
    if args.shards < 1:
        ap.error("--shards must be >= 1")
    try:
        build(args.kind, args.dtype, args.shards, args.seed, args.out)
    except (OSError, ValueError) as e:
        print(f"make_hybrid.py: error: {e}", file=sys.stderr)
        return 1
    print(f"wrote {args.kind} {args.dtype} shards={args.shards} seed={args.seed} to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
