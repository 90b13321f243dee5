#!/usr/bin/python3
"""Write random-weight Qwen3.5 (model_type qwen3_5), Qwen3.5-MoE (qwen3_5_moe) and Qwen3-Next
(qwen3_next) models in the real Hugging Face layout.

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

The MoE kinds (MOE: 4 experts, top 2, a shared expert) give every MLP of a qwen3_5_moe model,
and the sparse layers of a qwen3_next one (decoder_sparse_step, mlp_only_layers), a router
mlp.gate, the experts (fused or one tensor each, the kind's `experts`), mlp.shared_expert.* and
mlp.shared_expert_gate; their MTP layer's MLP too. qwen3_next's Gated DeltaNet layers hold
in_proj_qkvz and in_proj_ba (grouped per key head) instead of Qwen3.5's four projections, and its
config is flat, without mtp_num_hidden_layers (the checkpoint says how many MTP layers it has).

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
# Mixture-of-experts kinds: 4 experts, top 2, a shared expert with its sigmoid gate. `arch` picks
# the model family (default qwen3_5), `experts` how the checkpoint stores the routed experts:
# "fused" as transformers 5 saves them (mlp.experts.gate_up_proj [E, 2F, H], each expert's gate
# rows then up rows, and mlp.experts.down_proj [E, H, F]), "split" one tensor per expert
# (mlp.experts.N.{gate,up,down}_proj.weight, as the released Qwen3-Next checkpoints have them).
MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
           shared_expert_intermediate_size=48)
KINDS.update({
    # Qwen3.5-35B-A3B-like: nested Qwen3_5MoeForConditionalGeneration (model_type qwen3_5_moe),
    # fused experts, untied, layers linear, full, linear, full; 2 key heads serving 4 value
    # heads (llama.cpp tiles them); an MTP layer whose MLP is a mixture of experts too.
    "qwen35moe-mtp": dict(layout="nested", arch="qwen3_5_moe", experts="fused", mtp=True, tie=False,
                          text=dict(TEXT, **MOE, num_hidden_layers=4, full_attention_interval=2,
                                    num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                                    linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
                                    linear_value_head_dim=16, mtp_num_hidden_layers=1,
                                    mtp_use_dedicated_embeddings=False,
                                    rope_parameters=dict(rope_type="default", rope_theta=10000000,
                                                         partial_rotary_factor=0.25,
                                                         mrope_section=[1, 1, 2], mrope_interleaved=True))),
    # Qwen3_5MoeForCausalLM, flat (qwen3_5_moe_text): experts one tensor each, tied, 2 layers.
    "qwen35moe-flat": dict(layout="flat", arch="qwen3_5_moe", experts="split", mtp=False, tie=True,
                           text=dict(TEXT, **MOE, num_hidden_layers=2, layer_types=["linear_attention",
                                                                               "full_attention"],
                                     num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                                     linear_num_key_heads=2, linear_num_value_heads=2, linear_key_head_dim=8,
                                     linear_value_head_dim=16, rope_theta=10000.0, partial_rotary_factor=0.5)),
    # Qwen3-Next-80B-A3B-like: flat Qwen3NextForCausalLM, in_proj_qkvz / in_proj_ba grouped per
    # key head (2 key heads of 16 serving 4 value heads of 16), experts one tensor each, untied,
    # an MTP layer (mixture of experts), interval 2.
    "qwen3next-mtp": dict(layout="flat", arch="qwen3_next", experts="split", mtp=True, tie=False,
                          text=dict(TEXT, **MOE, num_hidden_layers=4, full_attention_interval=2,
                                    num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                                    linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
                                    linear_value_head_dim=16, norm_topk_prob=True, decoder_sparse_step=1,
                                    mlp_only_layers=[],
                                    rope_parameters=dict(rope_type="default", rope_theta=10000000,
                                                         partial_rotary_factor=0.25))),
    # Qwen3-Next with what Qwen3-Next's config allows beyond it: layer 0 a dense MLP
    # (mlp_only_layers), the top 2 not renormalised (norm_topk_prob false), fused experts,
    # tied, Dk 8 < Dv 16, 3 layers from layer_types.
    "qwen3next-dense-layer": dict(layout="flat", arch="qwen3_next", experts="fused", mtp=False, tie=True,
                                  text=dict(TEXT, **MOE, num_hidden_layers=3,
                                            layer_types=["linear_attention", "full_attention", "linear_attention"],
                                            num_attention_heads=2, num_key_value_heads=2, head_dim=16,
                                            linear_num_key_heads=2, linear_num_value_heads=4,
                                            linear_key_head_dim=8, linear_value_head_dim=16, norm_topk_prob=False,
                                            decoder_sparse_step=1, mlp_only_layers=[0], rope_theta=10000.0,
                                            partial_rotary_factor=0.5)),
})
# The config.json names of each family: (model_type flat, architectures flat, model_type
# nested, architectures nested, the nested text config's model_type)
FAMILIES = {
    "qwen3_5": ("qwen3_5_text", "Qwen3_5ForCausalLM", "qwen3_5", "Qwen3_5ForConditionalGeneration", "qwen3_5_text"),
    "qwen3_5_moe": ("qwen3_5_moe_text", "Qwen3_5MoeForCausalLM", "qwen3_5_moe", "Qwen3_5MoeForConditionalGeneration",
                    "qwen3_5_moe_text"),
    "qwen3_next": ("qwen3_next", "Qwen3NextForCausalLM", None, None, None),
}
# The shape of Qwen3.5-0.8B (config.json as released: 24 layers, 18 Gated DeltaNet and 6 gated
# attention, 16 linear heads of 128, attention 8 query / 2 KV heads of 256, tied embeddings,
# 248k vocabulary, its MTP layer), for benchmarks beside llama-bench: ~1.8 GB in BF16. The
# benchmarks pair it with Qwen3's tokenizer (npm has no Qwen3.5 one), hence Qwen3's BOS and EOS.
KINDS["bench-qwen35"] = dict(layout="nested", mtp=True, tie=True, text=dict(
    TEXT, vocab_size=248320, hidden_size=1024, intermediate_size=3584, max_position_embeddings=262144,
    bos_token_id=151643, eos_token_id=151645, num_hidden_layers=24, full_attention_interval=4,
    num_attention_heads=8, num_key_value_heads=2, head_dim=256, linear_num_key_heads=16,
    linear_num_value_heads=16, linear_key_head_dim=128, linear_value_head_dim=128,
    mtp_num_hidden_layers=1, mtp_use_dedicated_embeddings=False,
    rope_parameters=dict(rope_type="default", rope_theta=10000000, partial_rotary_factor=0.25,
                         mrope_section=[11, 11, 10], mrope_interleaved=True)))
# Real-size shapes for benchmarks (gigabytes): never built by the tests
BENCH_KINDS = ("bench-qwen35",)
DEFAULT_DTYPE = {"bench-qwen35": "bf16"}  # the rest default to f32
# What qwen35_ref.py self-test builds (all the others: they are small)
SELF_TEST_KINDS = tuple(k for k in KINDS if k not in BENCH_KINDS)


def make_config(kind, dtype):
    """config.json as transformers writes it for the kind's layout, keys sorted."""
    k = KINDS[kind]
    dtype_name = DTYPES[dtype][1]
    text = dict(k["text"], tie_word_embeddings=k["tie"], dtype=dtype_name)
    flat_type, flat_arch, nested_type, nested_arch, text_type = FAMILIES[k.get("arch", "qwen3_5")]
    if k.get("arch") == "qwen3_5_moe":
        text.pop("intermediate_size", None)  # Qwen3_5MoeTextConfig has no dense MLP size
    if k["layout"] == "flat":
        return dict(text, model_type=flat_type, architectures=[flat_arch], transformers_version="4.57.0.dev0")
    text["model_type"] = text_type
    return dict(architectures=[nested_arch], model_type=nested_type, text_config=text,
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

    H, V, inter = c["hidden_size"], c["vocab_size"], c.get("intermediate_size")
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

    family = k.get("arch", "qwen3_5")
    E, F, SF = c.get("num_experts", 0), c.get("moe_intermediate_size"), c.get("shared_expert_intermediate_size")

    def moe(p):
        # the router's logits O(1): softmax spreads over the experts, top-k picks vary by token
        linear(p + "mlp.gate", E, H)
        if k["experts"] == "fused":
            normal(p + "mlp.experts.gate_up_proj", (E, 2 * F, H), 1 / math.sqrt(H))
            normal(p + "mlp.experts.down_proj", (E, H, F), RESIDUAL_GAIN / math.sqrt(F))
        else:
            for e in range(E):
                linear(f"{p}mlp.experts.{e}.gate_proj", F, H)
                linear(f"{p}mlp.experts.{e}.up_proj", F, H)
                linear(f"{p}mlp.experts.{e}.down_proj", H, F, RESIDUAL_GAIN)
        linear(p + "mlp.shared_expert.gate_proj", SF, H)
        linear(p + "mlp.shared_expert.up_proj", SF, H)
        linear(p + "mlp.shared_expert.down_proj", H, SF, RESIDUAL_GAIN)
        linear(p + "mlp.shared_expert_gate", 1, H)

    def sparse(i):  # Qwen3NextDecoderLayer's rule; Qwen3.5-MoE has experts in every layer
        return E > 0 and i not in (c.get("mlp_only_layers") or []) and (i + 1) % c.get("decoder_sparse_step", 1) == 0

    def dense_layer(p, full, experts=False):
        norm_1p(p + "input_layernorm.weight", H)
        if full:
            attention(p)
        elif family == "qwen3_next":
            # per key head [q Dk | k Dk | v (Hv/Hk)Dv | z (Hv/Hk)Dv] and [b Hv/Hk | a Hv/Hk]
            a = p + "linear_attn."
            linear(a + "in_proj_qkvz", 2 * Hk * Dk + 2 * Hv * Dv, H)
            linear(a + "in_proj_ba", 2 * Hv, H)
        else:
            a = p + "linear_attn."
            linear(a + "in_proj_qkv", conv_dim, H)
            linear(a + "in_proj_z", Hv * Dv, H)
            linear(a + "in_proj_b", Hv, H)
            linear(a + "in_proj_a", Hv, H)
        if not full:
            normal(a + "conv1d.weight", (conv_dim, 1, K), 1 / math.sqrt(K))  # sum of K terms: O(1)
            add(a + "dt_bias", (Hv,), lambda rng, s: np.ones(s))
            add(a + "A_log", (Hv,), lambda rng, s: rng.uniform(*np.log(A_RANGE), s))
            normal(a + "norm.weight", (Dv,), NORM_STD, 1.0)  # RMSNormGated: w itself
            linear(a + "out_proj", H, Hv * Dv, RESIDUAL_GAIN)
        norm_1p(p + "post_attention_layernorm.weight", H)
        if experts:
            moe(p)
            return
        linear(p + "mlp.gate_proj", inter, H)
        linear(p + "mlp.up_proj", inter, H)
        linear(p + "mlp.down_proj", H, inter, RESIDUAL_GAIN)

    types = c.get("layer_types") or [
        "full_attention" if (i + 1) % c.get("full_attention_interval", 4) == 0 else "linear_attention"
        for i in range(c["num_hidden_layers"])]
    for i, t in enumerate(types):
        dense_layer(f"{prefix}layers.{i}.", t == "full_attention", sparse(i))
    norm_1p(prefix + "norm.weight", H)
    if not k["tie"]:
        normal("lm_head.weight", (V, H), head_std)
    if k["mtp"]:
        # Qwen's MTP block: fc([pre_fc_norm_embedding(embed(t)) ; pre_fc_norm_hidden(h)]) -> one
        # full-attention decoder layer -> norm -> the shared LM head
        norm_1p("mtp.pre_fc_norm_embedding.weight", H)
        norm_1p("mtp.pre_fc_norm_hidden.weight", H)
        linear("mtp.fc", H, 2 * H)
        for n in range(c.get("mtp_num_hidden_layers", 1)):  # Qwen3-Next's config has no such field
            dense_layer(f"mtp.layers.{n}.", True, E > 0)  # the model's MLP, experts and all
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
    ap = argparse.ArgumentParser(description="Write a random-weight Qwen3.5, Qwen3.5-MoE or Qwen3-Next model.")
    ap.add_argument("--kind", required=True, choices=sorted(KINDS))
    ap.add_argument("--dtype", choices=sorted(DTYPES), help="storage dtype (default bf16 for the bench kinds, else f32)")
    ap.add_argument("--shards", type=int, default=1, help="number of safetensors files")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True, help="output directory (absent or empty)")
    args = ap.parse_args(argv)
    if args.shards < 1:
        ap.error("--shards must be >= 1")
    args.dtype = args.dtype or DEFAULT_DTYPE.get(args.kind, "f32")
    try:
        build(args.kind, args.dtype, args.shards, args.seed, args.out)
    except (OSError, ValueError) as e:
        print(f"make_hybrid.py: error: {e}", file=sys.stderr)
        return 1
    print(f"wrote {args.kind} {args.dtype} shards={args.shards} seed={args.seed} to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
