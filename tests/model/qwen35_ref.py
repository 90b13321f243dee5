#!/usr/bin/python3
"""Independent NumPy reference of the Hugging Face Qwen3.5 text model (model_type qwen3_5), and
of Qwen3.5-MoE (qwen3_5_moe) and Qwen3-Next (qwen3_next), which differ from it only as listed
under "Mixture of experts" below.

Written from transformers' modeling_qwen3_5.py and configuration_qwen3_5.py (the text model of
Qwen3_5ForConditionalGeneration and Qwen3_5ForCausalLM, eager attention), modeling_qwen3_5_moe.py
and modeling_qwen3_next.py with their configurations, computing in float64
from the stored weights widened exactly. It shares no code with rlx, so rlx is checked against
it and never against itself. Vision weights (model.visual.*) in the checkpoint are ignored, as
HF's text path ignores them; so are the MTP weights (mtp.*) except by mtp_forward.

  qwen35_ref.py logits --model DIR --tokens 1,5,3 --out FILE.npy    # float64 [T, vocab]
  qwen35_ref.py greedy --model DIR --tokens 1,5,3 -n 8 [--eos 7,9]   # prints generated ids
  qwen35_ref.py self-test                                            # exits 1 on a failure

The layers (HF names under the text prefix, `model.language_model.` when config.json nests a
`text_config`, else `model.`):
  every layer   x += mixer(norm1(x)); x += mlp(norm2(x)), norms Qwen3_5RMSNorm: x/rms * (1 + w)
  full_attention (self_attn.*): q_proj gives per head [query D, gate D]; q_norm/k_norm (1 + w)
                per head; rotate-half RoPE on the first rotary_dim = D * partial_rotary_factor
                values; softmax(q k^T / sqrt(D)) v, times sigmoid(gate), then o_proj
  linear_attention (linear_attn.*): in_proj_qkv -> causal depthwise conv1d (kernel K, no bias)
                -> SiLU -> q (Hk x Dk) | k (Hk x Dk) | v (Hv x Dv); the gated delta rule with
                l2-normed q, k (eps 1e-6), q scaled by Dk^-0.5, beta = sigmoid(in_proj_b x),
                g = -exp(A_log) * softplus(in_proj_a x + dt_bias), value head h reading key
                head h // (Hv/Hk); then per value head norm.weight * rmsnorm(o) * silu(in_proj_z x)
                (Qwen3_5RMSNormGated: w, not 1 + w), then out_proj
  model.norm (1 + w), then lm_head (embed_tokens when tied)

The MTP (next-n) layer, which HF's modeling code does not run (it drops mtp.* on load): written
from vLLM's Qwen3_5MultiTokenPredictor (qwen3_5_mtp.py) and llama.cpp's graph_mtp (qwen35.cpp),
which agree. Over pairs (token x[t+1], the target's final-normed hidden row h[t], i.e. after
model.norm, what the target's LM head reads):
  x = mtp.fc(concat(pre_fc_norm_embedding(embed(x[t+1])), pre_fc_norm_hidden(h[t])))  embedding first
  x = mtp.layers.0(x)            a full-attention Qwen3.5 decoder layer (the same code as above),
                                 causal over the pairs, with a KV cache of its own
  out = mtp.norm(x), logits = the target's lm_head(out)
every norm (1 + w); out is the hidden row vLLM and llama.cpp chain into the next draft step. The
weights sit at the top level (mtp.*) in both layouts; the embedding is the target's (vLLM and
llama.cpp share it unless the checkpoint has its own, which mtp_use_dedicated_embeddings would
say: not implemented here).

Mixture of experts (Qwen3_5MoeSparseMoeBlock, Qwen3NextSparseMoeBlock): the MLP of a sparse
layer is
  p = softmax(x mlp.gate^T) over the experts, the top num_experts_per_tok kept (divided by their
  sum: always for qwen3_5_moe, when norm_topk_prob (default true) for qwen3_next)
  out = sum_k p_k down_e(silu(gate_e x) * up_e x)  +  sigmoid(x mlp.shared_expert_gate^T) *
        shared_expert(x), shared_expert a SwiGLU MLP of shared_expert_intermediate_size
the experts stored fused (mlp.experts.gate_up_proj [E, 2F, H], each expert's gate rows then its
up rows; mlp.experts.down_proj [E, H, F]) or one tensor each (mlp.experts.N.gate_proj.weight
...). Every qwen3_5_moe layer is sparse; a qwen3_next layer i is unless it is in mlp_only_layers
or (i + 1) % decoder_sparse_step != 0. The MTP layer's MLP is sparse too (vLLM's predictors).
Qwen3-Next's Gated DeltaNet projects with in_proj_qkvz and in_proj_ba, grouped per key head
(fix_query_key_value_ordering: head g's [q Dk | k Dk | v r*Dv | z r*Dv] and [b r | a r], r =
Hv/Hk, its r value heads in order), and its rotary embedding is plain partial RoPE (no M-RoPE).

The delta rule exists in both HF forms: recurrent (token by token, HF's decode path) and chunked
(torch_chunk_gated_delta_rule, HF's prefill path); they must agree, and `self-test` checks it.
Incremental use carries a State (each full-attention layer's keys and values, each linear
layer's last K-1 conv inputs and its Hv x Dk x Dv recurrent state), so a prompt can be run in
parts, or prefilled and then decoded token by token, giving one full pass's logits.
"""
import argparse
import json
import math
import os
import sys
import tempfile
import traceback

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import st  # noqa: E402

# HF's default chunk for torch_chunk_gated_delta_rule
CHUNK_SIZE = 64
# Weights are kept as float64 copies when the model is at most this big (the test models are
# a few MB); larger ones are re-read from the mapped files on every use.
CACHE_BYTES = 256 << 20
# The LM head is applied this many vocabulary rows at a time to bound memory (vocab 248320).
LM_HEAD_ROWS = 16384
# HF's l2norm eps for q and k inside the delta rule (use_qk_l2norm_in_kernel), fixed, not
# rms_norm_eps
L2NORM_EPS = 1e-6
# Qwen3_5TextRotaryEmbedding's mrope_section when rope_parameters has none
DEFAULT_MROPE_SECTION = (11, 11, 10)
# transformers' remap_legacy_layer_types
LEGACY_LAYER_TYPES = {"mamba": "linear_attention", "attention": "full_attention"}
# Where Qwen3.5 checkpoints keep the MTP layer (outside the text prefix, in both layouts)
MTP_PREFIX = "mtp."
# The families this reference knows, by config.json model_type
FAMILIES = {"qwen3_5": "qwen3_5", "qwen3_5_text": "qwen3_5", "qwen3_5_moe": "qwen3_5_moe",
            "qwen3_5_moe_text": "qwen3_5_moe", "qwen3_next": "qwen3_next"}


class Model:
    """A checkpoint directory: config.json plus safetensors, with the derived layer plan."""

    def __init__(self, directory, dtype=np.float64):
        with open(os.path.join(directory, "config.json")) as f:
            outer = json.load(f)
        mt = outer.get("model_type")
        if mt not in FAMILIES:
            raise ValueError(f"model_type {mt!r} is not one of {sorted(FAMILIES)}")
        self.family = FAMILIES[mt]
        self.directory, self.outer = directory, outer
        # float64 for the reference; float32 lets the self-test measure how far an f32
        # implementation drifts (every array then stays float32, which the self-test asserts)
        self.dtype = np.dtype(dtype)
        # Qwen3_5ForConditionalGeneration nests the text model's config under text_config and
        # its weights under model.language_model.; Qwen3_5ForCausalLM is flat, under model.
        self.nested = isinstance(outer.get("text_config"), dict)
        c = outer["text_config"] if self.nested else outer
        self.config = c
        self.prefix = "model.language_model." if self.nested else "model."
        # checkpoint names of weights whose matmul inputs are rounded to BF16, and MLP prefixes
        # of MoE blocks whose experts' inputs are (set_bf16_activations): the BF16 oracle
        self.act_bf16, self.act_bf16_moe = frozenset(), frozenset()
        # Qwen3_5Config (the outer one) declares tie_word_embeddings itself, default False;
        # a nested config without it falls back to the text config's.
        if self.nested:
            self.tied = bool(outer.get("tie_word_embeddings", c.get("tie_word_embeddings", False)))
        else:
            self.tied = bool(c.get("tie_word_embeddings", False))
        if c.get("hidden_act", "silu") != "silu":
            raise ValueError("only hidden_act silu is implemented")
        self.layers = c["num_hidden_layers"]
        self.hidden = c["hidden_size"]
        self.heads = c["num_attention_heads"]
        self.kv_heads = c["num_key_value_heads"]
        self.head_dim = c.get("head_dim") or 256  # Qwen3_5TextConfig's default, not hidden/heads
        self.eps = c.get("rms_norm_eps", 1e-6)
        self.attention_bias = bool(c.get("attention_bias", False))
        if self.heads % self.kv_heads:
            raise ValueError(f"{self.heads} attention heads are not a multiple of {self.kv_heads} kv heads")
        # Linear attention (Gated DeltaNet), HF's defaults as in Qwen3_5TextConfig
        self.k_heads = c.get("linear_num_key_heads", 16)
        self.v_heads = c.get("linear_num_value_heads", 32)
        self.dk = c.get("linear_key_head_dim", 128)
        self.dv = c.get("linear_value_head_dim", 128)
        self.conv_kernel = c.get("linear_conv_kernel_dim", 4)
        if self.v_heads % self.k_heads:
            raise ValueError(f"{self.v_heads} value heads are not a multiple of {self.k_heads} key heads")
        self.conv_dim = 2 * self.k_heads * self.dk + self.v_heads * self.dv
        # Mixture of experts (HF's config defaults; the dense family has none)
        self.experts = c.get("num_experts", 256 if self.family == "qwen3_5_moe" else 512) \
            if self.family != "qwen3_5" else 0
        self.top_k = c.get("num_experts_per_tok", 8 if self.family == "qwen3_5_moe" else 10)
        self.norm_topk = self.family == "qwen3_5_moe" or bool(c.get("norm_topk_prob", True))
        self.sparse_step = c.get("decoder_sparse_step", 1) if self.family == "qwen3_next" else 1
        self.mlp_only = set(c.get("mlp_only_layers") or []) if self.family == "qwen3_next" else set()
        self._rope_config(c)
        types = c.get("layer_types")
        if types is None:
            interval = c.get("full_attention_interval", 4)
            types = ["full_attention" if (i + 1) % interval == 0 else "linear_attention"
                     for i in range(self.layers)]
        types = [LEGACY_LAYER_TYPES.get(t, t) for t in types]
        if len(types) != self.layers or not set(types) <= {"full_attention", "linear_attention"}:
            raise ValueError(f"layer_types {types} is not {self.layers} of full_attention/linear_attention")
        self.layer_types = types
        self.ckpt = st.Checkpoint(directory)
        embed = self.prefix + "embed_tokens.weight"
        if embed not in self.ckpt:
            raise ValueError(f"{directory}: no {embed} (config {'nests' if self.nested else 'does not nest'} "
                             f"text_config)")
        self.vocab = self.ckpt.shape(embed)[0]
        total = sum(8 * math.prod(self.ckpt.shape(n)) for n in self.ckpt)
        self._cache = {} if total <= CACHE_BYTES else None

    def _rope_config(self, c):
        # Newer configs hold rope_theta, partial_rotary_factor and mrope_section in
        # rope_parameters; older ones at the top level (and mrope_section in rope_scaling).
        rp = dict(c.get("rope_scaling") or {})
        rp.update(c.get("rope_parameters") or {})
        rope_type = rp.get("rope_type", rp.get("type", "default"))
        if rope_type != "default":
            raise ValueError(f"rope_type {rope_type!r}: only default (M-)RoPE is implemented")
        theta = rp.get("rope_theta", c.get("rope_theta"))
        if theta is None:
            raise ValueError("config has no rope_theta (rope_parameters or top level)")
        self.rope_theta = float(theta)
        # configuration_qwen3_5 defaults partial_rotary_factor to 0.25 "for BC"
        factor = rp.get("partial_rotary_factor", c.get("partial_rotary_factor", 0.25))
        # compute_default_rope_parameters: dim = int(head_dim * factor), inv_freq over
        # arange(0, dim, 2): rotary_dim is 2 * len(inv_freq)
        dim = int(self.head_dim * factor)
        if dim <= 0 or dim % 2:
            raise ValueError(f"rotary dim {dim} (head_dim {self.head_dim} * {factor}) must be even and positive")
        self.rotary_dim = dim
        self.mrope_section = list(rp.get("mrope_section") or DEFAULT_MROPE_SECTION)

    def name(self, rel):
        """The checkpoint name of a text-model weight (`layers.0.mlp.up_proj.weight`)."""
        return self.prefix + rel

    def w(self, rel):
        """Text-model weight `rel` in the compute dtype (widened exactly from its stored dtype)."""
        return self.weight(self.prefix + rel)

    def weight(self, name):
        """Any weight by its checkpoint name, in the compute dtype."""
        if self._cache is None:
            return self.ckpt[name].astype(self.dtype)
        if name not in self._cache:
            self._cache[name] = self.ckpt[name].astype(self.dtype)
        return self._cache[name]

    def has(self, rel):
        return self.prefix + rel in self.ckpt

    def sparse(self, i):
        """Whether layer i's MLP is the mixture of experts (Qwen3NextDecoderLayer's rule)."""
        return self.experts > 0 and i not in self.mlp_only and (i + 1) % self.sparse_step == 0

    def mtp(self):
        """The MTP layer's weights seen as a one-layer text model (Prefixed), so that the decoder
        layer code reads mtp.layers.0.* as it reads model.layers.0.*."""
        if MTP_PREFIX + "fc.weight" not in self.ckpt:
            raise ValueError(f"{self.directory}: no MTP layer ({MTP_PREFIX}fc.weight)")
        if self.config.get("mtp_use_dedicated_embeddings"):
            raise ValueError("mtp_use_dedicated_embeddings: an MTP embedding of its own is not implemented")
        return Prefixed(self, MTP_PREFIX)


class Prefixed:
    """A Model whose weights `w(rel)` are read under another prefix; everything else (config,
    dtype, checkpoint) is the model's."""

    def __init__(self, model, prefix):
        self.model, self.prefix = model, prefix

    def __getattr__(self, attr):
        return getattr(self.model, attr)

    def w(self, rel):
        return self.model.weight(self.prefix + rel)

    def has(self, rel):
        return self.prefix + rel in self.model.ckpt

    def sparse(self, i):
        """The MTP layer's MLP is the model's mixture of experts when it has one."""
        return self.model.experts > 0


def load(directory, dtype=np.float64):
    return Model(directory, dtype)


class State:
    """What a layer keeps between calls: full attention its keys (normed and rotated) and
    values, linear attention its last K-1 conv inputs and recurrent state [Hv, Dk, Dv]."""

    def __init__(self, model, layer_types=None):
        self.pos = 0
        self.k, self.v, self.conv, self.rec = {}, {}, {}, {}
        dt = model.dtype
        for i, t in enumerate(model.layer_types if layer_types is None else layer_types):
            if t == "full_attention":
                self.k[i] = np.zeros((0, model.kv_heads, model.head_dim), dt)
                self.v[i] = np.zeros((0, model.kv_heads, model.head_dim), dt)
            else:
                # HF's cache starts the conv state at zeros: positions before 0 are zero inputs
                self.conv[i] = np.zeros((model.conv_kernel - 1, model.conv_dim), dt)
                self.rec[i] = np.zeros((model.v_heads, model.dk, model.dv), dt)

    def copy(self):
        other = object.__new__(State)
        other.pos = self.pos
        for field in ("k", "v", "conv", "rec"):
            setattr(other, field, {i: a.copy() for i, a in getattr(self, field).items()})
        return other


def rms_norm_1p(x, weight, eps):
    """Qwen3_5RMSNorm: x * rsqrt(mean(x^2) + eps) * (1 + weight); HF initialises weight to 0."""
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * (1.0 + weight)


def rms_norm_gated(x, z, weight, eps):
    """Qwen3_5RMSNormGated: weight * (x * rsqrt(mean(x^2) + eps)) * silu(z), weight as stored."""
    return weight * (x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)) * silu(z)


def l2norm(x, eps=L2NORM_EPS):
    """HF's l2norm (FLA's): x * rsqrt(sum(x^2) + eps) over the last axis."""
    return x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + eps)


def silu(x):
    return x / (1.0 + np.exp(-x))


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def softplus(x):
    """torch's F.softplus (beta 1, threshold 20: identity above it), stable for large |x|."""
    return np.where(x > 20.0, x, np.log1p(np.exp(np.minimum(x, 20.0))))


# rlx's parts of Qwen3-Next's fused linear-attention input projections
FUSED_PROJ = {"in_proj_qkv": "in_proj_qkvz", "in_proj_z": "in_proj_qkvz", "in_proj_b": "in_proj_ba",
              "in_proj_a": "in_proj_ba"}


def set_bf16_activations(model, weights=(), moe_layers=()):
    """Makes matmuls with these weights (checkpoint names) round their inputs to BF16, nearest
    even, as backends declaring bf16-act do, and the experts (not the router) of the MoE blocks
    of these layers likewise; returns the model, now the BF16 oracle."""
    def in_checkpoint(name):
        # rlx names text weights model.*, whatever the checkpoint's nesting, the halves of a
        # weight it splits NAME[part] (q_proj's queries and output gate), and Qwen3-Next's fused
        # in_proj_qkvz and in_proj_ba by the parts it cuts them into: each part reads the same x
        name = name.split("[", 1)[0]
        if name not in model.ckpt and name.startswith("model."):
            name = model.prefix + name[len("model."):]
        for part, fused in FUSED_PROJ.items():
            if name not in model.ckpt and name.endswith(f".{part}.weight"):
                name = name[:-len(f"{part}.weight")] + f"{fused}.weight"
        return name

    names = [in_checkpoint(n) for n in weights]
    unknown = sorted(n for n in names if n not in model.ckpt)
    if unknown:
        raise ValueError(f"no such weights: {', '.join(unknown[:4])}")
    model.act_bf16 = frozenset(names)
    model.act_bf16_moe = frozenset(f"{model.prefix}layers.{i}.mlp." for i in moe_layers)
    return model


def round_bf16(x):
    """x rounded to the nearest BF16 value (ties to even) from its float32 value, in x's dtype."""
    x = np.asarray(x)
    return st.bf16_bits_to_f32(st.f32_to_bf16_bits(x)).reshape(x.shape).astype(x.dtype)


def mm(model, x, rel):
    """x @ w(rel).T, x rounded to BF16 first where the oracle says so."""
    return (round_bf16(x) if model.prefix + rel in model.act_bf16 else x) @ model.w(rel).T


def linear(model, x, rel, bias=False):
    y = mm(model, x, rel + ".weight")
    return y + model.w(rel + ".bias") if bias else y


# ---------------------------------------------------------------- rotary embedding


def mrope_tables(position_ids, model):
    """cos/sin [T, rotary_dim] as Qwen3_5TextRotaryEmbedding computes them from position ids
    [3, T] (temporal, height, width): frequencies per row, then the interleaved M-RoPE
    recomposition (frequency j takes the height row when j % 3 == 1 and j < 3*section[1], the
    width row when j % 3 == 2 and j < 3*section[2], else the temporal row), then each half
    repeats the rotary_dim/2 frequencies.

    For text all three rows are the token positions (Qwen3_5TextModel.forward expands one
    arange to every row), so the recomposition picks equal values and this is plain rotate-half
    RoPE over rotary_dim; self-test checks that against rope_tables."""
    rd = model.rotary_dim
    inv_freq = 1.0 / (model.rope_theta ** (np.arange(0, rd, 2, dtype=np.float64) / rd))
    freqs = np.asarray(position_ids, dtype=np.float64)[:, :, None] * inv_freq[None, None, :]  # [3, T, rd/2]
    out = freqs[0].copy()
    for dim, offset in ((1, 1), (2, 2)):
        idx = slice(offset, model.mrope_section[dim] * 3, 3)
        out[..., idx] = freqs[dim][..., idx]
    angles = np.concatenate([out, out], axis=-1)
    return np.cos(angles).astype(model.dtype), np.sin(angles).astype(model.dtype)


def rope_tables(positions, rotary_dim, theta):
    """Plain NeoX rotate-half cos/sin [T, rotary_dim]: pair i (values i, i + rotary_dim/2)
    turns by pos * theta^(-2i/rotary_dim)."""
    inv_freq = 1.0 / (theta ** (np.arange(0, rotary_dim, 2, dtype=np.float64) / rotary_dim))
    angles = np.asarray(positions, dtype=np.float64)[:, None] * inv_freq[None, :]
    angles = np.concatenate([angles, angles], axis=-1)
    return np.cos(angles), np.sin(angles)


def rotate_half(x):
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def apply_partial_rope(x, cos, sin):
    """x [T, heads, D]; cos/sin [T, rd]: the first rd values of each head turn, the rest pass."""
    rd = cos.shape[-1]
    rot, rest = x[..., :rd], x[..., rd:]
    rot = rot * cos[:, None, :] + rotate_half(rot) * sin[:, None, :]
    return np.concatenate([rot, rest], axis=-1)


# ---------------------------------------------------------------- gated delta rule


def gated_delta_recurrent(q, k, v, g, beta, state):
    """torch_recurrent_gated_delta_rule, token by token, q/k already normalised, q scaled and
    repeated to the value heads. q, k [T, Hv, Dk]; v [T, Hv, Dv]; g, beta [T, Hv]; state
    [Hv, Dk, Dv]. Returns (out [T, Hv, Dv], final state)."""
    S = state.copy()
    out = np.zeros_like(v)
    for t in range(q.shape[0]):
        S = S * np.exp(g[t])[:, None, None]
        kv_mem = np.einsum("hkv,hk->hv", S, k[t])
        delta = (v[t] - kv_mem) * beta[t][:, None]
        S = S + k[t][:, :, None] * delta[:, None, :]
        out[t] = np.einsum("hkv,hk->hv", S, q[t])
    return out, S


def gated_delta_chunked(q, k, v, g, beta, state, chunk_size=CHUNK_SIZE):
    """torch_chunk_gated_delta_rule, the same arguments as gated_delta_recurrent: the sequence
    zero-padded to whole chunks; within a chunk the delta-rule updates are solved at once
    through the unit lower-triangular system (I + strictly_lower(beta_i k_i.k_j e^(G_i-G_j)))
    (HF's solve_triangular with unitriangular=True ignores the diagonal), then a scan over
    chunks carries the state."""
    T, H, Dk = q.shape
    Dv = v.shape[-1]
    pad = (chunk_size - T % chunk_size) % chunk_size
    # [H, T', ...] like HF's transpose(1, 2)
    q, k, v = (np.pad(x, ((0, pad), (0, 0), (0, 0))).transpose(1, 0, 2) for x in (q, k, v))
    beta, g = (np.pad(x, ((0, pad), (0, 0))).transpose(1, 0) for x in (beta, g))
    n = (T + pad) // chunk_size
    C = chunk_size
    v_beta, k_beta = v * beta[..., None], k * beta[..., None]
    q, k, k_beta, v_beta = (x.reshape(H, n, C, x.shape[-1]) for x in (q, k, k_beta, v_beta))
    g = g.reshape(H, n, C)
    dt = q.dtype
    upper = np.triu(np.ones((C, C), dtype=bool), 1)
    G = np.cumsum(g, axis=-1)  # log of the decay from the chunk start through position i
    pair = np.where(upper, -np.inf, G[..., :, None] - G[..., None, :])
    decay = np.exp(pair)  # decay[i, j] = exp(G_i - G_j) for j <= i, else 0
    ut = (k_beta @ k.transpose(0, 1, 3, 2)) * decay
    intra = (q @ k.transpose(0, 1, 3, 2)) * decay
    decayed_k_beta = k_beta * np.exp(G)[..., None]
    system = np.eye(C, dtype=dt) + np.tril(ut, -1)
    new_values = np.linalg.solve(system, v_beta)
    k_cumdecay = np.linalg.solve(system, decayed_k_beta)
    S = state.copy()
    out = np.zeros((H, n, C, Dv), dt)
    q_dec = q * np.exp(G)[..., None]
    k_dec = k * np.exp(G[..., -1:] - G)[..., None]
    chunk_decay = np.exp(G[..., -1])[..., None, None]  # [H, n, 1, 1]
    for i in range(n):
        v_new = new_values[:, i] - k_cumdecay[:, i] @ S
        out[:, i] = q_dec[:, i] @ S + intra[:, i] @ v_new
        S = S * chunk_decay[:, i] + k_dec[:, i].transpose(0, 2, 1) @ v_new
    out = out.reshape(H, n * C, Dv)[:, :T].transpose(1, 0, 2)
    return out, S


# ---------------------------------------------------------------- layers


def full_attention(model, i, h, state, positions):
    """Qwen3_5Attention (eager) over the new rows h [T, hidden] at `positions`, appending their
    keys and values to the state first (a query sees every cached row up to its own)."""
    p = f"layers.{i}.self_attn."
    T, D, H, KV = h.shape[0], model.head_dim, model.heads, model.kv_heads
    # q_proj rows are per head [query D | gate D]: view (T, H, 2D) and chunk the last axis
    qg = linear(model, h, p + "q_proj", model.attention_bias).reshape(T, H, 2 * D)
    q, gate = qg[..., :D], qg[..., D:].reshape(T, H * D)
    q = rms_norm_1p(q, model.w(p + "q_norm.weight"), model.eps)
    k = rms_norm_1p(linear(model, h, p + "k_proj", model.attention_bias).reshape(T, KV, D),
                    model.w(p + "k_norm.weight"), model.eps)
    v = linear(model, h, p + "v_proj", model.attention_bias).reshape(T, KV, D)
    if model.family == "qwen3_next":  # Qwen3NextRotaryEmbedding: plain (partial) RoPE
        cos, sin = (a.astype(model.dtype) for a in rope_tables(positions, model.rotary_dim, model.rope_theta))
    else:
        cos, sin = mrope_tables(np.broadcast_to(positions, (3, T)), model)
    q, k = apply_partial_rope(q, cos, sin), apply_partial_rope(k, cos, sin)
    state.k[i] = np.concatenate([state.k[i], k])
    state.v[i] = np.concatenate([state.v[i], v])
    keys, values = state.k[i], state.v[i]
    group = H // KV  # repeat_kv: query head h reads kv head h // group
    keys, values = np.repeat(keys, group, axis=1), np.repeat(values, group, axis=1)
    scores = np.einsum("thd,shd->hts", q, keys) * np.asarray(D ** -0.5, model.dtype)
    key_pos = np.arange(keys.shape[0])
    scores = np.where(key_pos[None, None, :] <= positions[None, :, None], scores, -np.inf)
    probs = np.exp(scores - scores.max(axis=-1, keepdims=True))
    probs /= probs.sum(axis=-1, keepdims=True)
    out = np.einsum("hts,shd->thd", probs, values).reshape(T, H * D)
    out = out * sigmoid(gate)
    return linear(model, out, p + "o_proj", model.attention_bias)


def causal_conv(x, weight, conv_state):
    """causal_conv1d_fn / causal_conv1d_update with SiLU: x [T, C] new inputs, weight [C, 1, K],
    conv_state [K-1, C] the previous inputs. y[t] = silu(sum_j w[:, j] * u[t - K + 1 + j]) over
    the inputs u; returns (y, new conv_state = the last K-1 inputs)."""
    K = weight.shape[-1]
    u = np.concatenate([conv_state, x])  # row r is input t = r - (K - 1)
    w = weight.reshape(weight.shape[0], K)
    y = sum(w[:, j] * u[j:j + x.shape[0]] for j in range(K))
    return silu(y), u[u.shape[0] - (K - 1):]


def gated_delta_net(model, i, h, state, mode, chunk_size):
    """Qwen3_5GatedDeltaNet over rows h [T, hidden], carrying the conv and recurrent states."""
    p = f"layers.{i}.linear_attn."
    T, Hk, Hv, Dk, Dv = h.shape[0], model.k_heads, model.v_heads, model.dk, model.dv
    if model.family == "qwen3_next":
        mixed, z, b, a = qkvz_ba(model, h, p)
    else:
        mixed = mm(model, h, p + "in_proj_qkv.weight")  # [T, conv_dim]
        z = mm(model, h, p + "in_proj_z.weight").reshape(T, Hv, Dv)
        b = mm(model, h, p + "in_proj_b.weight")
        a = mm(model, h, p + "in_proj_a.weight")
    mixed, state.conv[i] = causal_conv(mixed, model.w(p + "conv1d.weight"), state.conv[i])
    q = mixed[:, :Hk * Dk].reshape(T, Hk, Dk)
    k = mixed[:, Hk * Dk:2 * Hk * Dk].reshape(T, Hk, Dk)
    v = mixed[:, 2 * Hk * Dk:].reshape(T, Hv, Dv)
    beta = sigmoid(b)
    g = -np.exp(model.w(p + "A_log")) * softplus(a + model.w(p + "dt_bias"))
    # grouped heads: value head h uses key head h // (Hv / Hk) (repeat_interleave)
    q, k = np.repeat(q, Hv // Hk, axis=1), np.repeat(k, Hv // Hk, axis=1)
    q, k = l2norm(q) * Dk ** -0.5, l2norm(k)
    if mode == "recurrent":
        o, state.rec[i] = gated_delta_recurrent(q, k, v, g, beta, state.rec[i])
    elif mode == "chunked":
        o, state.rec[i] = gated_delta_chunked(q, k, v, g, beta, state.rec[i], chunk_size)
    else:
        raise ValueError(f"delta rule mode {mode!r} is not recurrent or chunked")
    o = rms_norm_gated(o, z, model.w(p + "norm.weight"), model.eps).reshape(T, Hv * Dv)
    return mm(model, o, p + "out_proj.weight")


def qkvz_ba(model, h, p):
    """Qwen3NextGatedDeltaNet.fix_query_key_value_ordering: in_proj_qkvz's output viewed as [T,
    Hk, 2Dk + 2rDv] split into q, k, v, z per key head; in_proj_ba's as [T, Hk, 2r] into b, a;
    then q, k, v flattened and concatenated as the conv's input. Returns (mixed [T, conv_dim],
    z [T, Hv, Dv], b [T, Hv], a [T, Hv])."""
    T, Hk, Hv, Dk, Dv = h.shape[0], model.k_heads, model.v_heads, model.dk, model.dv
    r = Hv // Hk
    qkvz = mm(model, h, p + "in_proj_qkvz.weight").reshape(T, Hk, 2 * Dk + 2 * r * Dv)
    ba = mm(model, h, p + "in_proj_ba.weight").reshape(T, Hk, 2 * r)
    q, k = qkvz[..., :Dk], qkvz[..., Dk:2 * Dk]
    v, z = qkvz[..., 2 * Dk:2 * Dk + r * Dv], qkvz[..., 2 * Dk + r * Dv:]
    mixed = np.concatenate([q.reshape(T, -1), k.reshape(T, -1), v.reshape(T, -1)], axis=-1)
    return mixed, z.reshape(T, Hv, Dv), ba[..., :r].reshape(T, Hv), ba[..., r:].reshape(T, Hv)


def swiglu_mlp(model, x, p):
    return linear(model, silu(linear(model, x, p + "gate_proj")) * linear(model, x, p + "up_proj"),
                  p + "down_proj")


def expert_weights(model, p, e):
    """Expert e's (gate [F, H], up [F, H], down [H, F]) under MLP prefix p, fused or one each."""
    if model.has(p + "experts.gate_up_proj"):
        gate_up = model.w(p + "experts.gate_up_proj")[e]  # Qwen3_5MoeExperts: gate rows, then up
        F = gate_up.shape[0] // 2
        return gate_up[:F], gate_up[F:], model.w(p + "experts.down_proj")[e]
    return tuple(model.w(f"{p}experts.{e}.{n}_proj.weight") for n in ("gate", "up", "down"))


def sparse_moe(model, x, p):
    """The sparse MoE block (router, top-k experts, gated shared expert) over rows x [T, H]."""
    logits = x @ model.w(p + "gate.weight").T  # the router stays exact
    probs = np.exp(logits - logits.max(axis=-1, keepdims=True))
    probs /= probs.sum(axis=-1, keepdims=True)
    out = np.zeros_like(x)
    xe = round_bf16(x) if model.prefix + p in model.act_bf16_moe else x
    for t in range(x.shape[0]):
        top = np.argsort(-probs[t], kind="stable")[:model.top_k]  # torch.topk: the largest
        weights = probs[t, top] / (probs[t, top].sum() if model.norm_topk else 1.0)
        for e, wgt in zip(top, weights):
            gate, up, down = expert_weights(model, p, int(e))
            act = silu(xe[t] @ gate.T) * (xe[t] @ up.T)
            out[t] += wgt * ((round_bf16(act) if xe is not x else act) @ down.T)
    shared = swiglu_mlp(model, x, p + "shared_expert.")
    return out + sigmoid(mm(model, x, p + "shared_expert_gate.weight")) * shared


def mlp(model, i, x):
    p = f"layers.{i}.mlp."
    return sparse_moe(model, x, p) if model.sparse(i) else swiglu_mlp(model, x, p)


def embed(model, ids):
    ids = np.asarray(ids, dtype=np.int64)
    if len(ids) == 0 or ids.min() < 0 or ids.max() >= model.vocab:
        raise ValueError(f"need at least one token id, all in [0, {model.vocab})")
    return model.ckpt.rows(model.name("embed_tokens.weight"), ids).astype(model.dtype)


def lm_head(model, x):
    """Logits of final-normed rows x; the head is embed_tokens when tied. A ConditionalGeneration
    checkpoint's lm_head.weight sits outside the language_model prefix."""
    head = model.name("embed_tokens.weight") if model.tied else "lm_head.weight"
    rows = model.ckpt.shape(head)[0]
    x = round_bf16(x) if head in model.act_bf16 else x
    return np.concatenate([x @ model.ckpt.rows(head, slice(r, r + LM_HEAD_ROWS)).astype(model.dtype).T
                           for r in range(0, rows, LM_HEAD_ROWS)], axis=-1)


def decoder_layer(model, i, kind, x, state, positions, rule="chunked", chunk_size=CHUNK_SIZE):
    """Qwen3_5DecoderLayer i of `kind` over rows x [T, hidden] at `positions`, through `state`."""
    p = f"layers.{i}."
    h = rms_norm_1p(x, model.w(p + "input_layernorm.weight"), model.eps)
    if kind == "full_attention":
        x = x + full_attention(model, i, h, state, positions)
    else:
        x = x + gated_delta_net(model, i, h, state, rule, chunk_size)
    return x + mlp(model, i, rms_norm_1p(x, model.w(p + "post_attention_layernorm.weight"), model.eps))


def final_hidden(model, ids, state=None, mode="chunked", chunk_size=CHUNK_SIZE, decode_mode="recurrent"):
    """The final-normed hidden rows [T, hidden] (after model.norm: what the LM head reads, and
    what the MTP layer takes) for token ids following what `state` has seen (a fresh State:
    positions 0..T-1); the state is updated in place. The delta rule runs in `mode`, except that
    a single token following earlier ones runs in decode_mode, as HF's cached decode takes the
    recurrent kernel for seq_len 1."""
    if state is None:
        state = State(model)
    x = embed(model, ids)
    positions = np.arange(state.pos, state.pos + len(x))
    rule = decode_mode if len(x) == 1 and state.pos > 0 else mode
    for i, kind in enumerate(model.layer_types):
        x = decoder_layer(model, i, kind, x, state, positions, rule, chunk_size)
    state.pos += len(x)
    return rms_norm_1p(x, model.w("norm.weight"), model.eps)


def forward(model, ids, state=None, **kw):
    """Logits [T, vocab] for token ids following what `state` has seen (final_hidden's
    arguments)."""
    return lm_head(model, final_hidden(model, ids, state, **kw))


def mtp_state(model):
    """The MTP layer's State: the KV cache of its one full-attention layer."""
    return State(model, ["full_attention"])


def mtp_forward(model, ids, hidden, state=None):
    """The MTP layer over the pairs (ids[i], hidden[i]): hidden [T, hidden] the target's final-
    normed rows of the positions before the ids (h[t] with x[t+1]), the pairs at the MTP
    layer's own positions following what `state` (mtp_state) has seen, 0..T-1 from a fresh one;
    causal over the pairs. Returns (logits [T, vocab], out [T, hidden]): out is mtp.norm's output,
    what the LM head reads and chained drafting feeds back as the next h."""
    mtp = model.mtp()
    if state is None:
        state = mtp_state(model)
    e = rms_norm_1p(embed(model, ids), mtp.w("pre_fc_norm_embedding.weight"), model.eps)
    g = rms_norm_1p(np.asarray(hidden, dtype=model.dtype), mtp.w("pre_fc_norm_hidden.weight"), model.eps)
    if g.shape != e.shape:
        raise ValueError(f"{len(e)} ids need hidden rows of shape {e.shape}, got {g.shape}")
    x = mm(mtp, np.concatenate([e, g], axis=-1), "fc.weight")  # vLLM: cat([embeds, hidden])
    positions = np.arange(state.pos, state.pos + len(x))
    x = decoder_layer(mtp, 0, "full_attention", x, state, positions)
    state.pos += len(x)
    out = rms_norm_1p(x, mtp.w("norm.weight"), model.eps)
    return lm_head(model, out), out


def forward_parts(model, parts, **kw):
    """Logits [sum T, vocab] of the parts' ids run one after another through one state."""
    state = State(model)
    return np.concatenate([forward(model, part, state, **kw) for part in parts])


def greedy(model, ids, n, eos=(), recompute=False):
    """Generate up to n ids by argmax: prefill, then one token per step through the state (or,
    with recompute, a full forward over the whole sequence each step). Stops after emitting an
    id in `eos` (included in the result)."""
    seq, out = list(ids), []
    state = State(model)
    logits = forward(model, seq, state)
    for _ in range(n):
        nxt = int(np.argmax(logits[-1]))
        seq.append(nxt)
        out.append(nxt)
        if nxt in eos or len(out) == n:
            break
        logits = forward(model, seq) if recompute else forward(model, [nxt], state)
    return out


def eos_ids(directory):
    """EOS ids as HF generate() uses them: generation_config.json, else config.json (its
    text_config when nested)."""
    for name in ("generation_config.json", "config.json"):
        path = os.path.join(directory, name)
        if os.path.exists(path):
            with open(path) as f:
                c = json.load(f)
            eos = c.get("eos_token_id")
            if eos is None and isinstance(c.get("text_config"), dict):
                eos = c["text_config"].get("eos_token_id")
            if eos is not None:
                return eos if isinstance(eos, list) else [eos]
    return []


# ---------------------------------------------------------------- self-test


def _close(got, want, rtol, what):
    err = float(np.abs(got - want).max() / max(1.0, np.abs(want).max()))
    if not err <= rtol:
        raise AssertionError(f"{what}: relative difference {err:.3g} > {rtol:g}")
    return err


def _random_rule_inputs(rng, T, H, Dk, Dv):
    q = l2norm(rng.standard_normal((T, H, Dk))) * Dk ** -0.5
    k = l2norm(rng.standard_normal((T, H, Dk)))
    v = rng.standard_normal((T, H, Dv))
    # decays from ~0.99 to ~1e-7 per step, as A_log in [log 0.01, log 16] gives
    g = -np.exp(rng.uniform(np.log(0.01), np.log(16), (1, H))) * softplus(rng.standard_normal((T, H)) + 1)
    beta = sigmoid(rng.standard_normal((T, H)))
    return q, k, v, g, beta


def check_delta_rule_forms():
    """The chunked rule equals the recurrent one: several chunk sizes (one chunk, whole chunks,
    a ragged last chunk, chunk 1), from a zero and from a random initial state; and a
    brute-force unrolled sum for the first tokens."""
    rng = np.random.default_rng(0)
    for T, H, Dk, Dv in ((1, 2, 8, 4), (13, 3, 8, 16), (70, 2, 16, 8), (64, 1, 4, 4)):
        q, k, v, g, beta = _random_rule_inputs(rng, T, H, Dk, Dv)
        for s0 in (np.zeros((H, Dk, Dv)), rng.standard_normal((H, Dk, Dv))):
            want, want_s = gated_delta_recurrent(q, k, v, g, beta, s0)
            for chunk in (1, 4, 5, 16, 64):
                got, got_s = gated_delta_chunked(q, k, v, g, beta, s0, chunk)
                _close(got, want, 1e-10, f"chunked({chunk}) vs recurrent T={T} out")
                _close(got_s, want_s, 1e-10, f"chunked({chunk}) vs recurrent T={T} state")
    # the rule written out: S_t = e^g_t S_{t-1} (I - b k k^T) + b k v^T, out = S_t^T q
    q, k, v, g, beta = _random_rule_inputs(rng, 3, 1, 4, 3)
    S = np.zeros((4, 3))
    for t in range(3):
        kt, qt = k[t, 0], q[t, 0]
        S = np.exp(g[t, 0]) * (np.eye(4) - beta[t, 0] * np.outer(kt, kt)) @ S + beta[t, 0] * np.outer(kt, v[t, 0])
        out, _ = gated_delta_recurrent(q[:t + 1], k[:t + 1], v[:t + 1], g[:t + 1], beta[:t + 1], np.zeros((1, 4, 3)))
        _close(out[-1, 0], S.T @ qt, 1e-12, f"recurrent vs unrolled t={t}")


def check_mrope_collapses(model):
    """Text positions (all three M-RoPE rows equal) make the interleaved recomposition plain
    partial RoPE; unequal rows would not (so the recomposition is really exercised)."""
    pos = np.arange(40)
    cos, sin = mrope_tables(np.stack([pos, pos, pos]), model)
    pcos, psin = rope_tables(pos, model.rotary_dim, model.rope_theta)
    _close(cos, pcos, 0, "mrope cos vs plain rope")
    _close(sin, psin, 0, "mrope sin vs plain rope")
    if model.rotary_dim >= 4:  # frequency 1 exists and takes the height row
        hcos, _ = mrope_tables(np.stack([pos, pos + 5, pos]), model)
        assert np.abs(hcos - pcos).max() > 1e-3, "the height row never reached the tables"


def check_rope_rotation(model):
    """Partial RoPE turns pair (i, i + rd/2) by pos * theta^(-2i/rd), leaves values past rd alone,
    and keeps scores relative."""
    rd, D = model.rotary_dim, model.head_dim
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, 1, D))
    pos = 11
    cos, sin = rope_tables(np.array([pos]), rd, model.rope_theta)
    y = apply_partial_rope(x, cos, sin)[0, 0]
    half = rd // 2
    z = (x[0, 0, :half] + 1j * x[0, 0, half:rd]) * np.exp(1j * pos * model.rope_theta ** (-np.arange(half) * 2 / rd))
    _close(y[:rd], np.concatenate([z.real, z.imag]), 1e-12, "rope as complex rotation")
    assert np.array_equal(y[rd:], x[0, 0, rd:]), "values past rotary_dim changed"


def check_model(directory):
    """On one checkpoint: recurrent vs chunked prefill, one pass vs parts vs prefill + token-by-
    token decode, causality, greedy through the state vs recomputed."""
    model = load(directory)
    check_mrope_collapses(model)
    check_rope_rotation(model)
    rng = np.random.default_rng(2)
    ids = [int(t) for t in rng.integers(0, model.vocab, 23)]
    full = forward(model, ids)  # chunked, chunk 64: one chunk
    errs = {}
    errs["recurrent"] = _close(forward(model, ids, mode="recurrent"), full, 1e-10, "recurrent vs chunked")
    errs["chunk 4"] = _close(forward(model, ids, chunk_size=4), full, 1e-10, "chunk 4 vs chunk 64")
    errs["parts 9+14"] = _close(forward_parts(model, [ids[:9], ids[9:]]), full, 1e-10, "parts 9+14 vs one pass")
    errs["parts 1+5+17"] = _close(forward_parts(model, [ids[:1], ids[1:6], ids[6:]], chunk_size=4), full,
                                  1e-10, "parts 1+5+17 (chunk 4) vs one pass")
    errs["prefill+decode"] = _close(forward_parts(model, [ids[:7]] + [[t] for t in ids[7:]]), full, 1e-10,
                                    "prefill 7 + decode vs one pass")
    errs["decode chunked"] = _close(forward_parts(model, [[t] for t in ids], decode_mode="chunked"), full,
                                    1e-10, "token by token (chunked rule) vs one pass")
    for t in (0, 5, 22):
        _close(forward(model, ids[:t + 1])[-1], full[t], 1e-12, f"causal prefix {t}")
    # the state really carries information: dropping the first part changes later logits
    later = forward_parts(model, [ids[9:]])
    assert np.abs(later - full[9:]).max() > 1e-3, "logits after 9 tokens do not depend on them"
    n = 6
    fast = greedy(model, ids[:8], n)
    slow = greedy(model, ids[:8], n, recompute=True)
    assert fast == slow, f"greedy through the state {fast} != recomputed {slow}"
    assert np.all(np.isfinite(full)) and 0.5 < float(np.std(full)) < 50, f"logits std {np.std(full):.3g}"
    if MTP_PREFIX + "fc.weight" in model.ckpt:
        errs.update(check_mtp(model, ids))
    return model, errs


def check_mtp(model, ids):
    """The MTP layer over the pairs (ids[t+1], h[t]): one pass == a prefill then one pair at a
    time through its KV cache, causal, and both of its inputs matter."""
    hidden = final_hidden(model, ids)
    pairs, rows = ids[1:], hidden[:-1]
    logits, out = mtp_forward(model, pairs, rows)
    state = mtp_state(model)
    parts = [mtp_forward(model, pairs[:9], rows[:9], state)]
    parts += [mtp_forward(model, pairs[t:t + 1], rows[t:t + 1], state) for t in range(9, len(pairs))]
    errs = {"mtp parts": _close(np.concatenate([p[0] for p in parts]), logits, 1e-10,
                                "MTP prefill + pairs vs one pass")}
    _close(np.concatenate([p[1] for p in parts]), out, 1e-10, "MTP hidden, prefill + pairs vs one pass")
    _close(mtp_forward(model, pairs[:4], rows[:4])[0], logits[:4], 1e-12, "MTP causal prefix")
    assert np.all(np.isfinite(logits)) and 0.5 < float(np.std(logits)) < 50, f"MTP logits std {np.std(logits):.3g}"
    for what, other in (("token", mtp_forward(model, pairs[::-1], rows)[0]),
                        ("hidden row", mtp_forward(model, pairs, rows[::-1])[0])):
        assert np.abs(other[-1] - logits[-1]).max() > 1e-3, f"the MTP logits do not depend on the {what}"
    return errs


def check_grouped_heads(directory, tmp):
    """Hv = 2 Hk equals Hv = Hk with every key head's q and k rows (in in_proj_qkv and conv1d)
    duplicated in place: value head h reads key head h // (Hv/Hk), HF's repeat_interleave (a
    tiled h % Hk reading would differ)."""
    model = load(directory)
    group = model.v_heads // model.k_heads
    if group == 1:
        return None
    tensors, _ = st.read(directory)
    qk = model.k_heads * model.dk

    def widen(w):  # rows [q | k | v] -> q and k rows repeated per key head
        q, k, v = w[:qk], w[qk:2 * qk], w[2 * qk:]
        rep = [np.repeat(x.reshape(model.k_heads, model.dk, *x.shape[1:]), group, axis=0)
               .reshape(group * qk, *x.shape[1:]) for x in (q, k)]
        return np.concatenate(rep + [v])

    def widen_qkvz(w):  # per key head [q|k|v|z] -> per value head [q|k|v_j|z_j], q and k repeated
        blocks = w.reshape(model.k_heads, -1, w.shape[-1])
        q, k = blocks[:, :model.dk], blocks[:, model.dk:2 * model.dk]
        v = blocks[:, 2 * model.dk:2 * model.dk + group * model.dv].reshape(model.k_heads, group, model.dv, -1)
        z = blocks[:, 2 * model.dk + group * model.dv:].reshape(model.k_heads, group, model.dv, -1)
        return np.concatenate([np.concatenate([q[g], k[g], v[g, j], z[g, j]])
                               for g in range(model.k_heads) for j in range(group)])

    def widen_ba(w):  # per key head [b_0..b_r-1 | a_0..a_r-1] -> per value head [b_j | a_j]
        blocks = w.reshape(model.k_heads, 2, group, -1)
        return np.concatenate([blocks[g, :, j] for g in range(model.k_heads) for j in range(group)])

    parts = {"in_proj_qkv.weight": widen, "conv1d.weight": widen}
    if model.family == "qwen3_next":
        parts = {"in_proj_qkvz.weight": widen_qkvz, "in_proj_ba.weight": widen_ba, "conv1d.weight": widen}
    for i, t in enumerate(model.layer_types):
        if t == "linear_attention":
            for part, fn in parts.items():
                name = model.name(f"layers.{i}.linear_attn.{part}")
                tensors[name] = fn(tensors[name])
    with open(os.path.join(directory, "config.json")) as f:
        config = json.load(f)
    (config["text_config"] if model.nested else config)["linear_num_key_heads"] = model.v_heads
    out = os.path.join(tmp, "ungrouped-" + os.path.basename(directory))
    os.makedirs(out)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f)
    st.write(out, [(n, a.shape, lambda a=a: [a]) for n, a in tensors.items()], "F32")
    ids = [3, 17, 100, 42, 7, 250, 300, 11, 64, 5]
    return _close(forward(load(out), ids), forward(model, ids), 1e-12, "Hv = 2 Hk vs duplicated key heads")


def check_expert_storage(directory, tmp):
    """Fused experts (gate_up_proj, down_proj) equal one tensor per expert cut from them: expert
    e's gate rows first, then its up rows."""
    model = load(directory)
    if not model.experts:
        return None
    tensors, _ = st.read(directory)
    changed = False
    for name in [n for n in tensors if n.endswith("mlp.experts.gate_up_proj")]:
        p = name[:-len("gate_up_proj")]
        gate_up, down = tensors.pop(name), tensors.pop(p + "down_proj")
        F = gate_up.shape[1] // 2
        for e in range(gate_up.shape[0]):
            tensors[f"{p}{e}.gate_proj.weight"] = gate_up[e, :F]
            tensors[f"{p}{e}.up_proj.weight"] = gate_up[e, F:]
            tensors[f"{p}{e}.down_proj.weight"] = down[e]
        changed = True
    if not changed:
        return None
    out = os.path.join(tmp, "split-" + os.path.basename(directory))
    os.makedirs(out)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(model.outer, f)
    st.write(out, [(n, a.shape, lambda a=a: [a]) for n, a in tensors.items()], "F32")
    ids = [3, 17, 100, 42, 7, 250, 300, 11, 64, 5]
    return _close(forward(load(out), ids), forward(model, ids), 0, "fused experts vs one tensor each")


def check_moe_block(model):
    """The sparse block against its definition written densely: every expert run on every row,
    weighted by the softmax masked to the top k (renormalised or not), plus the gated shared
    expert; and top k = all experts with renormalisation is the full softmax mixture."""
    if not model.experts:
        return
    i = next(i for i in range(model.layers) if model.sparse(i))
    p = f"layers.{i}.mlp."
    x = np.random.default_rng(3).standard_normal((5, model.hidden))
    logits = x @ model.w(p + "gate.weight").T
    probs = np.exp(logits) / np.exp(logits).sum(axis=-1, keepdims=True)
    kth = np.sort(probs, axis=-1)[:, -model.top_k][:, None]
    mask = np.where(probs >= kth, probs, 0.0)
    if model.norm_topk:
        mask /= mask.sum(axis=-1, keepdims=True)
    outs = []
    for e in range(model.experts):
        gate, up, down = expert_weights(model, p, e)
        outs.append((silu(x @ gate.T) * (x @ up.T)) @ down.T)
    shared = sigmoid(x @ model.w(p + "shared_expert_gate.weight").T) * swiglu_mlp(model, x, p + "shared_expert.")
    want = np.einsum("te,eth->th", mask, np.stack(outs)) + shared
    _close(sparse_moe(model, x, p), want, 1e-12, "MoE block vs its dense form")


def self_test(argv=None):
    ap = argparse.ArgumentParser(description="self-test of the Qwen3.5 reference")
    ap.add_argument("--model", action="append", default=[], help="also check this model directory")
    args = ap.parse_args(argv)
    import make_hybrid  # noqa: E402  (tests/model, beside this file)
    failed = 0
    checks = [("delta rule: chunked == recurrent == unrolled", check_delta_rule_forms)]
    with tempfile.TemporaryDirectory() as tmp:
        dirs = list(args.model)
        for kind in make_hybrid.SELF_TEST_KINDS:
            for dtype in ("f32", "bf16"):
                dirs.append((kind, dtype, os.path.join(tmp, f"{kind}-{dtype}")))
        for d in dirs:
            if isinstance(d, tuple):
                kind, dtype, out = d

                def run(kind=kind, dtype=dtype, out=out):
                    make_hybrid.build(kind, dtype, 1, 1, out)
                    model, errs = check_model(out)
                    grouped = check_grouped_heads(out, tmp)
                    if grouped is not None:
                        errs["grouped heads"] = grouped
                    check_moe_block(model)
                    storage = check_expert_storage(out, tmp)
                    if storage is not None:
                        errs["fused experts"] = storage
                    return f"{kind} {dtype} ({''.join(t[0] for t in model.layer_types)}): " + \
                        ", ".join(f"{k} {v:.1e}" for k, v in errs.items())
                checks.append((f"model {kind} {dtype}", run))
            else:
                checks.append((f"model {d}", lambda d=d: check_model(d)[1]))
        for what, fn in checks:
            try:
                note = fn()
                print(f"PASS {what}" + (f": {note}" if isinstance(note, str) else ""))
            except Exception:  # report every failing check, not just the first
                failed += 1
                print(f"FAIL {what}\n{traceback.format_exc()}")
    print(f"{len(checks) - failed}/{len(checks)} self-checks passed")
    return 1 if failed else 0


def _ids(text):
    return [int(t) for t in text.split(",") if t.strip()]


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["self-test"]:
        return self_test(argv[1:])
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    lg = sub.add_parser("logits", help="save float64 logits [T, vocab] as .npy")
    gr = sub.add_parser("greedy", help="print greedily generated ids")
    sub.add_parser("self-test", help="check the reference's forms against each other")
    for p in (lg, gr):
        p.add_argument("--model", required=True, help="model directory")
        p.add_argument("--tokens", required=True, type=_ids, help="comma-separated prompt ids")
    lg.add_argument("--out", required=True, help="output .npy file")
    lg.add_argument("--mode", choices=("chunked", "recurrent"), default="chunked", help="delta rule form")
    gr.add_argument("-n", type=int, required=True, help="number of ids to generate")
    gr.add_argument("--eos", type=_ids, default=[], help="comma-separated ids that stop generation")
    args = ap.parse_args(argv)
    try:
        model = load(args.model)
        if args.cmd == "logits":
            np.save(args.out, forward(model, args.tokens, mode=args.mode))
        else:
            print(" ".join(map(str, greedy(model, args.tokens, args.n, args.eos))))
    except (OSError, ValueError, KeyError) as e:
        print(f"qwen35_ref.py: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
