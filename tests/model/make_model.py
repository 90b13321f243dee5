#!/usr/bin/python3
"""Write random-weight Qwen3 / Qwen3-MoE / Qwen2 / Llama / Mistral models in the real Hugging
Face layout.

  make_model.py --kind KIND [--dtype f32|bf16|f16] [--shards N] [--seed S]
                [--mtp-layers N [--mtp-file PATH]] --out DIR

DIR (absent or empty) receives config.json, generation_config.json and model.safetensors,
or N shards plus model.safetensors.index.json. Kinds are listed in KINDS. Weights depend
only on (kind, seed, tensor name), so dtypes and shard counts of one seed hold the same
values up to rounding. There is no tokenizer: tests pass token ids directly.

--mtp-layers N adds N multi-token-prediction layers under MiMo's names (model.mtp_layers.i.*,
see core/include/rlx/model.h) to the model's safetensors, or with --mtp-file to that separate
safetensors file instead; config.json then states num_nextn_predict_layers. Even layers have
their own final_layernorm and odd ones do not (they use model.norm), so both cases get tested.

The scales are chosen so greedy decoding is well conditioned (a float32 implementation
must pick the same argmax as the float64 reference): activations stay O(1), the final
hidden state is RMS-normalised, and the LM head is scaled for logits of std ~LOGIT_STD,
which typically leaves gaps of tenths between the top two logits. Random logits still
produce a near-tie now and then, so check_golden.py also picks a prompt whose greedy path
has no near-tie (see MIN_REL_MARGIN there).
"""
import argparse
import hashlib
import json
import math
import os
import shutil
import sys
import zlib

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import st  # noqa: E402

DTYPES = {"f32": ("F32", "float32"), "bf16": ("BF16", "bfloat16"), "f16": ("F16", "float16")}

LOGIT_STD = 4.0     # std of the logits (max ~15): typical top-1 margins far above f32 error
NORM_STD = 0.2      # RMSNorm weights are 1 + NORM_STD * N(0,1): near 1 but each element matters
BIAS_STD = 0.2      # attention biases: visible in the output, small next to the projections
ROUTER_STD = 2.0    # router logits of std ~2 give distinct expert choices, still mixed weights
# o_proj and down_proj outputs are scaled up so the layers, not the token's own embedding,
# dominate the residual stream: with tied embeddings the embedding term e.e otherwise wins
# the logits and greedy decoding repeats one token, which would barely test decoding.
RESIDUAL_GAIN = 3.0
CHUNK_VALUES = 1 << 22  # big tensors are produced in ~16 MB float32 row chunks

SMALL = dict(vocab_size=512, hidden_size=64, intermediate_size=128,
             max_position_embeddings=256, rms_norm_eps=1e-6, bos_token_id=509, eos_token_id=511)

# Each kind isolates a feature; real Qwen3 traits are spread over them (head_dim * heads
# != hidden, rope_theta written as an int or a float, sliding_window null or a number).
KINDS = {
    # Tied embeddings, like Qwen3-0.6B; q width equals hidden here.
    "dense-tied": dict(SMALL, model_type="qwen3", num_hidden_layers=3, num_attention_heads=4,
                       num_key_value_heads=2, head_dim=16, rope_theta=1000000,
                       tie_word_embeddings=True, attention_bias=False, use_sliding_window=False,
                       sliding_window=None, max_window_layers=3),
    # Separate lm_head, biases on q/k/v/o, q width 128 != hidden 64. sliding_window is set but
    # use_sliding_window is false: HF ignores the window, so an implementation must too.
    "dense-untied-bias": dict(SMALL, model_type="qwen3", num_hidden_layers=2,
                              num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                              rope_theta=10000, tie_word_embeddings=False, attention_bias=True,
                              use_sliding_window=False, sliding_window=4, max_window_layers=0),
    # Layers 0 and 2 are sparse (8 experts, top 2, renormalised), layer 1 is a dense MLP;
    # 8 query heads share 2 kv heads; q width 128 != hidden 64.
    "moe": dict(SMALL, model_type="qwen3_moe", num_hidden_layers=3, num_attention_heads=8,
                num_key_value_heads=2, head_dim=16, rope_theta=1000000.0,
                tie_word_embeddings=False, attention_bias=False, use_sliding_window=False,
                sliding_window=None, max_window_layers=3, num_experts=8, num_experts_per_tok=2,
                moe_intermediate_size=32, decoder_sparse_step=1, norm_topk_prob=True,
                mlp_only_layers=[1], output_router_logits=False, router_aux_loss_coef=0.001),
    # Layer 0 attends to everything, layers 1 and 2 see only the last 4 positions.
    "sliding": dict(SMALL, model_type="qwen3", num_hidden_layers=3, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=16, rope_theta=10000,
                    tie_word_embeddings=False, attention_bias=False, use_sliding_window=True,
                    sliding_window=4, max_window_layers=1),
    # Qwen2.5-shaped (Qwen2ForCausalLM): q/k/v biases, no o bias, no q/k norms, tied embeddings
    # like Qwen2.5-0.5B, head_dim hidden / heads (not stated, as Qwen2 configs leave it out).
    "qwen2-tied": dict(SMALL, model_type="qwen2", num_hidden_layers=3, num_attention_heads=4,
                       num_key_value_heads=2, rope_theta=1000000.0, tie_word_embeddings=True,
                       use_sliding_window=False, sliding_window=4, max_window_layers=2),
    # Llama 3.2-shaped (LlamaForCausalLM): no biases, no q/k norms, tied embeddings like
    # Llama-3.2-1B, head_dim hidden / heads (not stated), rope_theta 500000, no rope_scaling.
    "llama-tied": dict(SMALL, model_type="llama", num_hidden_layers=3, num_attention_heads=4,
                       num_key_value_heads=2, rope_theta=500000.0, tie_word_embeddings=True,
                       attention_bias=False, mlp_bias=False, rope_scaling=None),
    # Separate lm_head; attention_bias (q/k/v/o) and mlp_bias (gate/up/down) on, which
    # LlamaConfig allows; head_dim 32 stated and 4 * 32 != hidden 64; 4 query heads share 1 kv head.
    "llama-untied-bias": dict(SMALL, model_type="llama", num_hidden_layers=2,
                              num_attention_heads=4, num_key_value_heads=1, head_dim=32,
                              rope_theta=10000.0, tie_word_embeddings=False, attention_bias=True,
                              mlp_bias=True, rope_scaling=None),
    # Llama 3.1/3.2 RoPE scaling ("llama3"): with head_dim 16, theta 10000 and an original
    # context of 64, frequency pair 0 keeps its frequency, pairs 1-2 are smoothed and the rest
    # divided by factor, so all three branches of the rule show in the logits.
    "llama3-rope": dict(SMALL, model_type="llama", num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=2, head_dim=16, rope_theta=10000.0,
                        tie_word_embeddings=True, attention_bias=False, mlp_bias=False,
                        rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                                          high_freq_factor=4.0,
                                          original_max_position_embeddings=64)),
    # Mistral 7B-shaped (MistralForCausalLM): the Llama layer without biases, untied, every
    # layer attends to the last sliding_window (4) positions: shorter than the test prompts.
    "mistral": dict(SMALL, model_type="mistral", num_hidden_layers=3, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=None, rope_theta=10000.0,
                    tie_word_embeddings=False, sliding_window=4),
    # The demo model: the real Qwen3 vocabulary and special ids (it ships with the real
    # tokenizer.json), a small body: ~40 MB in BF16.
    "demo": dict(model_type="qwen3", vocab_size=151936, hidden_size=128, intermediate_size=384,
                 num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                 max_position_embeddings=4096, rms_norm_eps=1e-6, rope_theta=1000000,
                 tie_word_embeddings=True, attention_bias=False, use_sliding_window=False,
                 sliding_window=None, max_window_layers=4, bos_token_id=151643,
                 eos_token_id=151645),
    # The shape of Qwen3-0.6B (config.json as released), for benchmarks: ~1.2 GB in BF16.
    "bench": dict(model_type="qwen3", vocab_size=151936, hidden_size=1024,
                  intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                  num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
                  rms_norm_eps=1e-6, rope_theta=1000000, tie_word_embeddings=True,
                  attention_bias=False, use_sliding_window=False, sliding_window=None,
                  max_window_layers=28, bos_token_id=151643, eos_token_id=151645),
    # The shape of Llama-3.2-1B (config.json as released: GQA 32/8 heads of 64, tied embeddings,
    # llama3 RoPE scaling), for benchmarks beside llama-bench: ~2.5 GB in BF16.
    "bench-llama": dict(model_type="llama", vocab_size=128256, hidden_size=2048, intermediate_size=8192,
                        num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8, head_dim=64,
                        max_position_embeddings=131072, rms_norm_eps=1e-5, rope_theta=500000.0,
                        rope_scaling=dict(rope_type="llama3", factor=32.0, low_freq_factor=1.0,
                                          high_freq_factor=4.0, original_max_position_embeddings=8192),
                        tie_word_embeddings=True, attention_bias=False, mlp_bias=False,
                        bos_token_id=128000, eos_token_id=128001),
}
# Real-size shapes for benchmarks (gigabytes): never built by the tests
BENCH_KINDS = ("bench", "bench-llama")
DEFAULT_DTYPE = {"bench": "bf16", "bench-llama": "bf16", "demo": "bf16"}  # the rest default to f32


def make_config(kind, dtype):
    """config.json as transformers writes it: every field explicit, keys sorted."""
    k = KINDS[kind]
    architecture = {"qwen3": "Qwen3ForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM",
                    "qwen2": "Qwen2ForCausalLM", "llama": "LlamaForCausalLM",
                    "mistral": "MistralForCausalLM"}[k["model_type"]]
    return dict(dict(rope_scaling=None), **k, architectures=[architecture],
                attention_dropout=0.0, hidden_act="silu", initializer_range=0.02,
                torch_dtype=DTYPES[dtype][1], transformers_version="4.51.0", use_cache=True)


def make_generation_config(config):
    """Like Qwen3's: generation stops on <|im_end|> (eos) or <|endoftext|> (bos)."""
    return {"bos_token_id": config["bos_token_id"], "do_sample": True,
            "eos_token_id": [config["eos_token_id"], config["bos_token_id"]],
            "pad_token_id": config["bos_token_id"], "temperature": 0.6, "top_k": 20,
            "top_p": 0.95, "transformers_version": "4.51.0"}


def tensor_specs(config, seed, mtp_layers=0):
    """(name, shape, produce) for every tensor, in HF state-dict order, for st.write; then
    (mtp_specs) those of the MTP layers, in MiMo's order."""
    specs, mtp_specs = [], []

    def normal(name, shape, std, mean=0.0, into=specs):
        def produce():
            # One generator per tensor, keyed by name: values don't depend on write order.
            rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
            rows = max(1, CHUNK_VALUES // math.prod(shape[1:]))
            for r in range(0, shape[0], rows):
                chunk = rng.standard_normal((min(rows, shape[0] - r), *shape[1:]), dtype=np.float32)
                yield np.float32(mean) + np.float32(std) * chunk
        into.append((name, tuple(shape), produce))

    def linear(name, n_out, n_in, bias=False, gain=1.0, into=specs):
        normal(name + ".weight", (n_out, n_in), gain / math.sqrt(n_in), into=into)  # 1/sqrt(in): outputs O(1)
        if bias:
            normal(name + ".bias", (n_out,), BIAS_STD, into=into)

    def norm(name, n, into=specs):
        normal(name, (n,), NORM_STD, mean=1.0, into=into)

    c = config
    mt = c["model_type"]
    H, V = c["hidden_size"], c["vocab_size"]
    D = c.get("head_dim") or H // c["num_attention_heads"]
    # Qwen3 and Llama: a bias on every projection iff attention_bias; Qwen2: q/k/v biases only;
    # Mistral: none. Only Qwen3's have q/k norms; only Llama has mlp_bias.
    qkv_bias = mt == "qwen2" or c.get("attention_bias", False)
    o_bias = mt != "qwen2" and c.get("attention_bias", False)
    qk_norm = mt in ("qwen3", "qwen3_moe")
    mlp_bias = c.get("mlp_bias", False)
    q_dim, kv_dim = c["num_attention_heads"] * D, c["num_key_value_heads"] * D
    head_std = LOGIT_STD / math.sqrt(H)  # the final norm makes the hidden state RMS ~1
    # Tied: the embedding is the LM head and gets its scale; RMSNorm absorbs it on the way in.
    normal("model.embed_tokens.weight", (V, H), head_std if c["tie_word_embeddings"] else 1.0)

    def decoder_layer(p, sparse, into):
        norm(p + "input_layernorm.weight", H, into)
        for proj, n_out in (("q_proj", q_dim), ("k_proj", kv_dim), ("v_proj", kv_dim)):
            linear(p + "self_attn." + proj, n_out, H, qkv_bias, into=into)
        linear(p + "self_attn.o_proj", H, q_dim, o_bias, RESIDUAL_GAIN, into)
        if qk_norm:
            norm(p + "self_attn.q_norm.weight", D, into)
            norm(p + "self_attn.k_norm.weight", D, into)
        norm(p + "post_attention_layernorm.weight", H, into)
        if sparse:
            normal(p + "mlp.gate.weight", (c["num_experts"], H), ROUTER_STD / math.sqrt(H), into=into)
            mlps = [(f"{p}mlp.experts.{e}.", c["moe_intermediate_size"])
                    for e in range(c["num_experts"])]
        else:
            mlps = [(p + "mlp.", c["intermediate_size"])]
        for prefix, inter in mlps:
            linear(prefix + "gate_proj", inter, H, mlp_bias, into=into)
            linear(prefix + "up_proj", inter, H, mlp_bias, into=into)
            linear(prefix + "down_proj", H, inter, mlp_bias, RESIDUAL_GAIN, into)

    for i in range(c["num_hidden_layers"]):
        sparse = (c["model_type"] == "qwen3_moe" and i not in c["mlp_only_layers"]
                  and c["num_experts"] > 0 and (i + 1) % c["decoder_sparse_step"] == 0)
        decoder_layer(f"model.layers.{i}.", sparse, specs)
    norm("model.norm.weight", H)
    if not c["tie_word_embeddings"]:
        normal("lm_head.weight", (V, H), head_std)
    for n in range(mtp_layers):
        p = f"model.mtp_layers.{n}."
        norm(p + "token_layernorm.weight", H, mtp_specs)
        norm(p + "hidden_layernorm.weight", H, mtp_specs)
        linear(p + "input_proj", H, 2 * H, into=mtp_specs)
        decoder_layer(p + "mtp_block.", False, mtp_specs)  # rlx builds MTP layers dense
        if n % 2 == 0:
            norm(p + "final_layernorm.weight", H, mtp_specs)
    return specs, mtp_specs


def build(kind, dtype, shards, seed, out, mtp_layers=0, mtp_file=None):
    """Write the model; `out` must be absent or empty so no stale shard can be picked up."""
    if os.path.isdir(out) and os.listdir(out):
        raise FileExistsError(f"{out} is not empty")
    config = make_config(kind, dtype)
    if mtp_layers:
        config["num_nextn_predict_layers"] = mtp_layers
    specs, mtp_specs = tensor_specs(config, seed, mtp_layers)
    metadata = {"rlx_kind": kind, "rlx_seed": str(seed)}
    # Tensors first: st.write checks the shard split before it creates anything.
    st.write(out, specs if mtp_file else specs + mtp_specs, DTYPES[dtype][0], shards, metadata=metadata)
    if mtp_file:
        st.write(os.path.dirname(os.path.abspath(mtp_file)), mtp_specs, DTYPES[dtype][0], 1, metadata=metadata,
                 single_name=os.path.basename(mtp_file))
    for name, obj in (("config.json", config),
                      ("generation_config.json", make_generation_config(config))):
        with open(os.path.join(out, name), "w") as f:
            json.dump(obj, f, indent=2, sort_keys=True)
            f.write("\n")
    return config


def build_variants(out_dir, variants, seed, generator):
    """Writes variants of the kinds, {name: (base kind, config changes, LM head logit std, MTP
    layers)}, as f32 models out_dir/name, each rewritten only when make_model.py, st.py or the
    calling generator script changed (a stamp in the model holds their digest)."""
    h = hashlib.sha256()
    for path in (os.path.abspath(__file__), os.path.join(os.path.dirname(os.path.abspath(__file__)), "st.py"),
                 generator):
        with open(path, "rb") as f:
            h.update(f.read())
    want = h.hexdigest() + "\n"
    global LOGIT_STD
    default_std = LOGIT_STD
    for name, (base, changes, logit_std, mtp_layers) in variants.items():
        out = os.path.join(out_dir, name)
        stamp = os.path.join(out, ".rlx-stamp")
        if os.path.exists(stamp) and open(stamp).read() == want:
            continue
        shutil.rmtree(out, ignore_errors=True)
        KINDS[name] = dict(KINDS[base], **changes)
        LOGIT_STD = logit_std or default_std
        try:
            build(name, "f32", 1, seed, out, mtp_layers)
        finally:
            LOGIT_STD = default_std
        with open(stamp, "w") as f:
            f.write(want)
        print(f"wrote {out}")


def main(argv=None):
    ap = argparse.ArgumentParser(description="Write a random-weight model in HF layout.")
    ap.add_argument("--kind", required=True, choices=sorted(KINDS))
    ap.add_argument("--dtype", choices=sorted(DTYPES),
                    help="storage dtype (default: bf16 for bench, f32 otherwise)")
    ap.add_argument("--shards", type=int, default=1, help="number of safetensors files")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--mtp-layers", type=int, default=0, help="MTP layers to add (MiMo's names)")
    ap.add_argument("--mtp-file", help="write the MTP layers to this safetensors file, not the model's")
    ap.add_argument("--out", required=True, help="output directory (absent or empty)")
    args = ap.parse_args(argv)
    if args.shards < 1:
        ap.error("--shards must be >= 1")
    if args.mtp_layers < 0 or (args.mtp_file and not args.mtp_layers):
        ap.error("--mtp-layers must be >= 0, and >= 1 with --mtp-file")
    dtype = args.dtype or DEFAULT_DTYPE.get(args.kind, "f32")
    try:
        build(args.kind, dtype, args.shards, args.seed, args.out, args.mtp_layers, args.mtp_file)
    except (OSError, ValueError) as e:
        print(f"make_model.py: error: {e}", file=sys.stderr)
        return 1
    mtp = (f" mtp_layers={args.mtp_layers}" + (f" in {args.mtp_file}" if args.mtp_file else "")
           if args.mtp_layers else "")
    print(f"wrote {args.kind} {dtype} shards={args.shards} seed={args.seed}{mtp} to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
