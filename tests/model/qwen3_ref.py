#!/usr/bin/python3
"""Independent NumPy reference of the Hugging Face Qwen3 / Qwen3-MoE / Qwen2 / Llama / Mistral
forward pass.

Follows transformers' Qwen3ForCausalLM, Qwen3MoeForCausalLM, Qwen2ForCausalLM, LlamaForCausalLM
(with rope_scaling type llama3) and MistralForCausalLM (eager attention, no KV cache:
every call recomputes the whole sequence), computing in float64 by default from the stored
weights widened exactly. It shares no code with rlx, so rlx is checked against it and never
against itself.

  qwen3_ref.py logits --model DIR --tokens 1,5,3 --out FILE.npy   # float64 [T, vocab]
  qwen3_ref.py greedy --model DIR --tokens 1,5,3 -n 8 [--eos 7,9]  # prints generated ids

A model's `act_bf16` set names weights whose matmul inputs are rounded to BF16 (nearest even)
before the product, as backends declaring RLX_PRECISION_BF16_ACT compute them: the second
oracle, which checks such a backend tightly (round_bf16, set_bf16_activations).

mtp_forward() adds the multi-token-prediction head of MiMo / DeepSeek-V3 (the formula and
tensor names of core/include/rlx/model.h), whose weights may sit in extra safetensors files.
"""
import argparse
import json
import math
import os
import sys
from collections.abc import Mapping

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import st  # noqa: E402

# Weights are kept as float32 copies (exact) when the model is at most this big; larger
# models (the 0.6B benchmark shape) are re-read from the mapped files on every use instead.
CACHE_BYTES = 256 << 20
# The LM head is applied this many vocabulary rows at a time to bound memory (vocab 151936).
LM_HEAD_ROWS = 16384


class Checkpoints(Mapping):
    """Several checkpoints read as one: the model's plus separately shipped MTP weights."""

    def __init__(self, parts):
        self._owner = {}
        for part in parts:
            for name in part:
                if name in self._owner:
                    raise ValueError(f"tensor {name} is in two weight files")
                self._owner[name] = part

    def shape(self, name):
        return self._owner[name].shape(name)

    def rows(self, name, index):
        return self._owner[name].rows(name, index)

    def __getitem__(self, name):
        return self._owner[name][name]

    def __iter__(self):
        return iter(self._owner)

    def __len__(self):
        return len(self._owner)


class Model:
    """A checkpoint directory: config.json plus safetensors, with the derived layer plan."""

    # What __init__ derives beyond Qwen3's, at their plain values for a Model built without it
    rope_scaling = None  # config.json's rope_scaling (type llama3 scales the frequencies)
    mlp_bias = False  # Llama's mlp_bias: gate, up and down have biases

    def __init__(self, directory, extra_weights=()):
        with open(os.path.join(directory, "config.json")) as f:
            c = json.load(f)
        mt = c["model_type"]
        if mt not in ("qwen3", "qwen3_moe", "qwen2", "llama", "mistral"):
            raise ValueError(f"model_type {mt!r} is not qwen3, qwen3_moe, qwen2, llama or mistral")
        self.config = c
        self.directory = directory
        self.moe = mt == "qwen3_moe"
        if c.get("hidden_act", "silu") != "silu":
            raise ValueError("only silu is implemented")
        self.rope_scaling = c.get("rope_scaling")
        if self.rope_scaling and self.rope_scaling.get("rope_type", self.rope_scaling.get("type")) not in (
                "default", "llama3"):
            raise ValueError("only plain RoPE and rope_scaling type llama3 are implemented")
        self.layers = c["num_hidden_layers"]
        self.hidden = c["hidden_size"]
        self.heads = c["num_attention_heads"]
        self.kv_heads = c["num_key_value_heads"]
        # Qwen3Config defaults head_dim to 128; Qwen3MoeConfig has no default and attention
        # falls back to hidden/heads. Released checkpoints always state it.
        # Qwen2 (Qwen2.5), Llama and Mistral attention use head_dim when stated, else hidden/heads.
        qwen2 = mt == "qwen2"
        self.head_dim = c.get("head_dim") or (self.hidden // self.heads if mt != "qwen3" else 128)
        self.eps = c["rms_norm_eps"]
        theta = c.get("rope_theta")  # newer transformers write rope_parameters instead
        self.rope_theta = theta if theta is not None else c["rope_parameters"]["rope_theta"]
        # Qwen3: all four projections have a bias iff attention_bias, and q/k are RMS-normed per
        # head. Qwen2: q, k and v always have a bias, o none, and there are no q/k norms. Llama:
        # all four iff attention_bias, gate/up/down iff mlp_bias, no q/k norms. Mistral: none.
        self.qkv_bias = True if qwen2 else c.get("attention_bias", False)
        self.o_bias = False if qwen2 else c.get("attention_bias", False)
        self.mlp_bias = mt == "llama" and c.get("mlp_bias", False)
        self.qk_norm = mt in ("qwen3", "qwen3_moe")
        self.tied = c.get("tie_word_embeddings", False)
        if mt == "llama":
            self.window = [None] * self.layers
        elif mt == "mistral":  # MistralConfig: sliding_window (default 4096) on every layer
            self.window = [c.get("sliding_window", 4096)] * self.layers
        else:
            self.window = self._sliding_windows(c)
        self.sparse = [self.moe and i not in (c.get("mlp_only_layers") or [])
                       and c["num_experts"] > 0 and (i + 1) % c.get("decoder_sparse_step", 1) == 0
                       for i in range(self.layers)]
        self.ckpt = Checkpoints([st.Checkpoint(directory)] + [st.Checkpoint(p) for p in extra_weights])
        total = sum(4 * math.prod(self.ckpt.shape(n)) for n in self.ckpt)
        self._cache = {} if total <= CACHE_BYTES else None
        self.act_bf16 = frozenset()  # weight names whose matmul inputs are rounded to BF16

    def _sliding_windows(self, c):
        """Per layer: the sliding window size, or None for full causal attention.

        Qwen3Config drops sliding_window unless use_sliding_window, then layer_types (when the
        config does not list it) is sliding for layers i >= max_window_layers.
        """
        window = c.get("sliding_window") if c.get("use_sliding_window") else None
        if self.moe:
            # Qwen3-MoE's rule differs between transformers versions (all layers vs. from
            # max_window_layers on); no released MoE checkpoint slides, so refuse to guess.
            if window is not None:
                raise ValueError("qwen3_moe with use_sliding_window is not implemented")
            return [None] * self.layers
        types = c.get("layer_types") or [  # max_window_layers defaults to 28 in Qwen3Config
            "sliding_attention" if window is not None and i >= c.get("max_window_layers", 28)
            else "full_attention" for i in range(self.layers)]
        if len(types) != self.layers:
            raise ValueError(f"layer_types has {len(types)} entries for {self.layers} layers")
        # Like transformers: a layer_types entry only slides when a window survived above.
        return [window if t == "sliding_attention" else None for t in types]

    def w(self, name, dtype):
        """Weight `name` in the compute dtype (from the exact float32 widening of the file)."""
        if self._cache is None:
            return self.ckpt[name].astype(dtype)
        if name not in self._cache:
            self._cache[name] = self.ckpt[name]
        return self._cache[name].astype(dtype)


def load(directory, extra_weights=()):
    return Model(directory, extra_weights)


def round_bf16(x):
    """x rounded to the nearest BF16 value (ties to even) from its float32 value, as BF16
    hardware rounds an f32 activation, returned in x's dtype."""
    x = np.asarray(x)
    return st.bf16_bits_to_f32(st.f32_to_bf16_bits(x)).reshape(x.shape).astype(x.dtype)


def set_bf16_activations(model, weights=(), moe_layers=()):
    """Makes matmuls with these weights round their inputs to BF16, and the experts (not the
    router) of these MoE layers likewise; returns the model."""
    names = set(weights)
    for layer in moe_layers:
        for e in range(model.config["num_experts"]):
            for proj in ("gate_proj", "up_proj", "down_proj"):
                names.add(f"model.layers.{layer}.mlp.experts.{e}.{proj}.weight")
    unknown = sorted(n for n in names if n not in model.ckpt)
    if unknown:
        raise ValueError(f"no such weights: {', '.join(unknown[:4])}")
    model.act_bf16 = frozenset(names)
    return model


def _matmul_input(model, x, weight):
    return round_bf16(x) if weight in model.act_bf16 else x


def rms_norm(x, weight, eps):
    """HF Qwen3RMSNorm over the last axis: x * rsqrt(mean(x^2) + eps) * weight."""
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight


def linear(model, x, prefix, dtype, bias=False):
    """nn.Linear with an HF [out, in] weight (and `prefix.bias` if bias)."""
    y = _matmul_input(model, x, prefix + ".weight") @ model.w(prefix + ".weight", dtype).T
    return y + model.w(prefix + ".bias", dtype) if bias else y


def llama3_inv_freq(inv_freq, scaling):
    """transformers' _compute_llama3_parameters: frequencies whose wavelength exceeds
    original_max_position_embeddings / low_freq_factor are divided by factor, those below
    original / high_freq_factor kept, and those between interpolated (smoothed)."""
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_context = scaling["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old_context / low, old_context / high
    wavelen = 2 * math.pi / inv_freq
    scaled = np.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return np.where(medium, smoothed, scaled)


def rope_tables(positions, head_dim, theta, dtype, scaling=None):
    """cos/sin [T, head_dim] for NeoX rotate-half RoPE; each half repeats the D/2 frequencies
    (scaled as rope_scaling type llama3 says, when given)."""
    inv_freq = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
    if scaling and scaling.get("rope_type", scaling.get("type")) == "llama3":
        inv_freq = llama3_inv_freq(inv_freq, scaling)
    angles = np.asarray(positions, dtype=np.float64)[:, None] * inv_freq[None, :]
    angles = np.concatenate([angles, angles], axis=-1)
    return np.cos(angles).astype(dtype), np.sin(angles).astype(dtype)


def rotate_half(x):
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def apply_rope(x, cos, sin):
    """x: [T, heads, D]; cos/sin: [T, D]."""
    return x * cos[:, None, :] + rotate_half(x) * sin[:, None, :]


def attention_mask(T, window):
    """allowed[i, j]: query i sees key j (causal; within the window when sliding)."""
    i, j = np.arange(T)[:, None], np.arange(T)[None, :]
    allowed = j <= i
    if window is not None:
        allowed &= i - j < window
    return allowed


def attention(model, layer_prefix, window, h, cos, sin, dtype):
    p = layer_prefix + "self_attn."
    T, D = h.shape[0], model.head_dim
    # q_norm / k_norm (Qwen3) are RMSNorms over each head's D values, applied before RoPE.
    q = linear(model, h, p + "q_proj", dtype, model.qkv_bias).reshape(T, model.heads, D)
    k = linear(model, h, p + "k_proj", dtype, model.qkv_bias).reshape(T, model.kv_heads, D)
    if model.qk_norm:
        q = rms_norm(q, model.w(p + "q_norm.weight", dtype), model.eps)
        k = rms_norm(k, model.w(p + "k_norm.weight", dtype), model.eps)
    v = linear(model, h, p + "v_proj", dtype, model.qkv_bias).reshape(T, model.kv_heads, D)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    # GQA as HF repeat_kv: query head h reads kv head h // (heads / kv_heads).
    group = model.heads // model.kv_heads
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    scores = np.einsum("thd,shd->hts", q, k) / np.sqrt(np.asarray(D, dtype=dtype))
    scores = np.where(attention_mask(T, window)[None], scores, -np.inf)
    probs = np.exp(scores - scores.max(axis=-1, keepdims=True))
    probs /= probs.sum(axis=-1, keepdims=True)
    out = np.einsum("hts,shd->thd", probs, v).reshape(T, model.heads * D)
    return linear(model, out, p + "o_proj", dtype, model.o_bias)


def silu(x):
    return x / (1.0 + np.exp(-x))


def swiglu(model, x, prefix, dtype, bias=False):
    """down(silu(gate(x)) * up(x)), the Qwen3 MLP and each MoE expert (Llama's mlp_bias: each
    projection with its bias)."""
    gate = linear(model, x, prefix + "gate_proj", dtype, bias)
    return linear(model, silu(gate) * linear(model, x, prefix + "up_proj", dtype, bias),
                  prefix + "down_proj", dtype, bias)


def moe(model, layer, x, dtype, trace):
    """Qwen3MoeSparseMoeBlock: softmax router, top-k experts, optional renormalisation."""
    c, p = model.config, f"model.layers.{layer}.mlp."
    logits = x @ model.w(p + "gate.weight", dtype).T  # [T, E]
    if trace is not None:
        trace.setdefault("router", {})[layer] = logits
    probs = np.exp(logits - logits.max(axis=-1, keepdims=True))
    probs /= probs.sum(axis=-1, keepdims=True)
    # Highest probability first; a stable sort breaks exact ties toward the lower expert id.
    top = np.argsort(-probs, axis=-1, kind="stable")[:, :c["num_experts_per_tok"]]
    weights = np.take_along_axis(probs, top, axis=-1)
    if c.get("norm_topk_prob", False):
        weights /= weights.sum(axis=-1, keepdims=True)
    out = np.zeros_like(x)
    for e in np.unique(top):
        rows, slot = np.nonzero(top == e)
        out[rows] += weights[rows, slot][:, None] * swiglu(model, x[rows], f"{p}experts.{e}.", dtype)
    return out


def decoder_layer(model, p, x, cos, sin, window, mlp, dtype):
    """Qwen3DecoderLayer: pre-norm attention and MLP (`mlp(h)`), each added to the residual."""
    h = rms_norm(x, model.w(p + "input_layernorm.weight", dtype), model.eps)
    x = x + attention(model, p, window, h, cos, sin, dtype)
    h = rms_norm(x, model.w(p + "post_attention_layernorm.weight", dtype), model.eps)
    return x + mlp(h)


def embed(model, ids, dtype):
    ids = np.asarray(ids, dtype=np.int64)
    vocab = model.ckpt.shape("model.embed_tokens.weight")[0]
    if len(ids) == 0 or ids.min() < 0 or ids.max() >= vocab:
        raise ValueError(f"need at least one token id, all in [0, {vocab})")
    return model.ckpt.rows("model.embed_tokens.weight", ids).astype(dtype)


def lm_head(model, x, dtype):
    """Logits of final-normed hidden rows x; the head is embed_tokens when tied."""
    head = "model.embed_tokens.weight" if model.tied else "lm_head.weight"
    vocab = model.ckpt.shape(head)[0]
    x = _matmul_input(model, x, head)
    return np.concatenate([x @ model.ckpt.rows(head, slice(r, r + LM_HEAD_ROWS)).astype(dtype).T
                           for r in range(0, vocab, LM_HEAD_ROWS)], axis=-1)


def final_hidden(model, ids, dtype=np.float64, trace=None):
    """The hidden states after the final norm [T, hidden], which the LM head reads, for token
    ids at positions 0..T-1 (see forward for dtype and trace)."""
    x = embed(model, ids, dtype)
    cos, sin = rope_tables(np.arange(len(x)), model.head_dim, model.rope_theta, dtype, model.rope_scaling)
    for i in range(model.layers):
        p = f"model.layers.{i}."
        if model.sparse[i]:
            def mlp(h, i=i):
                return moe(model, i, h, dtype, trace)
        else:
            def mlp(h, p=p):
                return swiglu(model, h, p + "mlp.", dtype, model.mlp_bias)
        x = decoder_layer(model, p, x, cos, sin, model.window[i], mlp, dtype)
    return rms_norm(x, model.w("model.norm.weight", dtype), model.eps)


def forward(model, ids, dtype=np.float64, trace=None):
    """Logits [T, vocab] for token ids at positions 0..T-1.

    dtype is the compute precision: float64 for the reference; float32 lets the self-check
    measure how far an f32 implementation may drift. If `trace` is a dict, it receives
    trace["router"][layer] = router logits [T, E] of each MoE layer.
    """
    return lm_head(model, final_hidden(model, ids, dtype, trace), dtype)


def mtp_forward(model, layer, ids, hidden, dtype=np.float64):
    """MTP layer `layer` over pairs (token ids[i], the target's final hidden row hidden[i] of the
    position before it), the pairs at positions 0..T-1, causal over the pairs:
        e = token_layernorm(embed(id)), g = hidden_layernorm(h)
        y = decoder_layer(input_proj(concat(g, e)))       (MiMo's order: hidden half first)
        out = final_layernorm(y), or the target's model.norm when the layer has none
    Returns (logits [T, vocab], out [T, hidden]); out is what chained drafting feeds back as
    the next h. The decoder layer is dense with full attention.
    """
    p = f"model.mtp_layers.{layer}."
    e = rms_norm(embed(model, ids, dtype), model.w(p + "token_layernorm.weight", dtype), model.eps)
    g = rms_norm(np.asarray(hidden, dtype=dtype), model.w(p + "hidden_layernorm.weight", dtype), model.eps)
    if g.shape != e.shape:
        raise ValueError(f"{len(e)} ids need hidden rows of shape {e.shape}, got {g.shape}")
    x = np.concatenate([g, e], axis=-1) @ model.w(p + "input_proj.weight", dtype).T
    cos, sin = rope_tables(np.arange(len(x)), model.head_dim, model.rope_theta, dtype, model.rope_scaling)
    block = p + "mtp_block."
    x = decoder_layer(model, block, x, cos, sin, None, lambda h: swiglu(model, h, block + "mlp.", dtype), dtype)
    norm = p + "final_layernorm.weight" if p + "final_layernorm.weight" in model.ckpt else "model.norm.weight"
    out = rms_norm(x, model.w(norm, dtype), model.eps)
    return lm_head(model, out, dtype), out


def greedy(model, ids, n, eos=(), dtype=np.float64):
    """Generate up to n ids by argmax, recomputing the full forward each step.

    Stops after emitting an id in `eos` (which is included in the result); no stop by default.
    """
    seq, out = list(ids), []
    for _ in range(n):
        # the head on the last row only: the step reads no other, and the head is most of a
        # forward of a model with a real vocabulary (the rows above are the same function)
        nxt = int(np.argmax(lm_head(model, final_hidden(model, seq, dtype)[-1:], dtype)[-1]))
        seq.append(nxt)
        out.append(nxt)
        if nxt in eos:
            break
    return out


def eos_ids(directory):
    """EOS ids as HF generate() uses them: generation_config.json, else config.json."""
    for name in ("generation_config.json", "config.json"):
        path = os.path.join(directory, name)
        if os.path.exists(path):
            with open(path) as f:
                eos = json.load(f).get("eos_token_id")
            if eos is not None:
                return eos if isinstance(eos, list) else [eos]
    return []


def _ids(text):
    return [int(t) for t in text.split(",") if t.strip()]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    lg = sub.add_parser("logits", help="save float64 logits [T, vocab] as .npy")
    gr = sub.add_parser("greedy", help="print greedily generated ids")
    for p in (lg, gr):
        p.add_argument("--model", required=True, help="model directory")
        p.add_argument("--tokens", required=True, type=_ids, help="comma-separated prompt ids")
    lg.add_argument("--out", required=True, help="output .npy file")
    gr.add_argument("-n", type=int, required=True, help="number of ids to generate")
    gr.add_argument("--eos", type=_ids, default=[], help="comma-separated ids that stop generation")
    args = ap.parse_args(argv)
    try:
        model = load(args.model)
        if args.cmd == "logits":
            np.save(args.out, forward(model, args.tokens))
        else:
            print(" ".join(map(str, greedy(model, args.tokens, args.n, args.eos))))
    except (OSError, ValueError, KeyError) as e:
        print(f"qwen3_ref.py: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
