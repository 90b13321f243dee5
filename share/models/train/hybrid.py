#!/usr/bin/python3
"""Trains rlx's Brown hybrid: a small Qwen3.5 text model (Gated DeltaNet and gated attention,
3 : 1) with Qwen3.5's own MTP layer, on the Brown corpus, so that MTP speculation is measured
on a model that predicts something.

The model follows Hugging Face's Qwen3.5 text model (modeling_qwen3_5.py), written here from
tests/model/qwen35_ref.py's description of it:
  every layer    x += mixer(norm1(x)); x += mlp(norm2(x)), every RMSNorm x/rms * (1 + w)
  linear layers  Qwen3_5GatedDeltaNet: in_proj_qkv -> depthwise causal conv1d (SiLU) -> q, k, v;
                 beta = sigmoid(in_proj_b x), g = -exp(A_log) softplus(in_proj_a x + dt_bias);
                 the gated delta rule on l2-normed q (scaled by Dk^-0.5) and k, value head h
                 reading key head h // (Hv/Hk); norm.weight * rmsnorm(o) * silu(in_proj_z x)
                 (weight itself, not 1 + w), out_proj
  full layers    q_proj gives per head [query | gate]; q/k norms; rotate-half RoPE on the first
                 quarter of each head (text positions make M-RoPE plain RoPE); softmax attention
                 times sigmoid(gate), o_proj
  MLP SwiGLU, tied embeddings.
The delta rule runs in the chunked form (HF's torch_chunk_gated_delta_rule, rewritten): within
a chunk the updates are solved at once through a unit lower-triangular system, and a loop over
the few chunks of a training sequence carries the state; that is what makes training fast.

The MTP layer is Qwen3.5's (mtp.*): over pairs (h[t], x[t+1]), h the target's final-normed
hidden row, x = mtp.fc(cat(pre_fc_norm_embedding(embed(x[t+1])), pre_fc_norm_hidden(h[t]))),
one full-attention decoder layer, mtp.norm, then the target's LM head predicts x[t+2]. As in
train.py it reads the target's hidden states detached and uses the target's embedding (= LM
head) detached, so it never changes the target; it is distilled from the target's own next-
token distributions and trained at two chained depths (the second reads the first's mtp.norm
output), which is how rlx drafts k > 1 tokens with one layer.

Export: Hugging Face's flat Qwen3_5ForCausalLM layout (config.json model_type qwen3_5_text,
weights model.*, the MTP layer at the top level mtp.*), BF16 safetensors, the tokenizer files
copied beside it. A text-only model has no vision tower, so the nested
Qwen3_5ForConditionalGeneration layout would only add fake tensors.

  hybrid.py train --data DIR --out DIR [--steps N --decay-steps D | --time-budget SEC]
                  [--batch B --seq T --lr L --warmup W --seed S --threads 2]
  hybrid.py check --model DIR    the exported files through this module in float64 against
                                 tests/model/qwen35_ref.py: logits, MTP logits, state form
--data holds train.npy / valid.npy (uint16 token ids) and the tokenizer files from bpe.py.
Seeded and single-process, and torch's CPU kernels are deterministic for a fixed thread count,
so a rerun with the same --threads and --steps/--decay-steps should reproduce the weights (a run
with --time-budget prints the pair that repeats it).
"""
import argparse
import json
import math
import os
import shutil
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train import batches, distill_loss, load_safetensors, save_safetensors  # noqa: E402

# 8 layers (linear, linear, linear, full) x 2, narrower than the Brown target (hidden 384): two
# shared CPU cores see few tokens in the budget, and a smaller model learns more from few. The
# linear layers' 3 key heads of 64 serve 6 value heads of 64, grouped as Qwen3.5's larger models.
SHAPE = dict(hidden_size=384, num_hidden_layers=8, intermediate_size=1152, full_attention_interval=4,
             num_attention_heads=6, num_key_value_heads=2, head_dim=64,
             linear_num_key_heads=3, linear_num_value_heads=6, linear_key_head_dim=64,
             linear_value_head_dim=64, linear_conv_kernel_dim=4)
COMMON = dict(rms_norm_eps=1e-6, hidden_act="silu", attention_bias=False, attention_dropout=0.0,
              max_position_embeddings=1024, tie_word_embeddings=True, mtp_num_hidden_layers=1,
              mtp_use_dedicated_embeddings=False,
              rope_parameters=dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.25))
# --time-budget: the run keeps the peak learning rate until this share of the budget has passed,
# then decays over DECAY_SHARE more steps than it has done (at least MIN_DECAY), so it ends near
# the budget whatever speed the shared machine gives it; the log says which --steps and
# --decay-steps reproduce it exactly.
DECIDE_AT = 0.8
DECAY_SHARE = 0.25
MIN_DECAY = 10
# HF's chunk length for torch_chunk_gated_delta_rule
CHUNK = 64
# HF's l2norm eps for q and k in the delta rule (fixed, not rms_norm_eps)
L2NORM_EPS = 1e-6


def lr_at(step, peak, warmup, stable_end, total):
    """Warmup, constant peak until stable_end, then a cosine down to a tenth of the peak at total
    (warmup-stable-decay: the length of the run can be chosen while it runs, see --time-budget)."""
    if step < warmup:
        return peak * (step + 1) / warmup
    if step < stable_end:
        return peak
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (step - stable_end) / max(1, total - stable_end))))


def layer_types(c):
    return ["full_attention" if (i + 1) % c["full_attention_interval"] == 0 else "linear_attention"
            for i in range(c["num_hidden_layers"])]


class RMSNorm1p(nn.Module):
    """Qwen3_5RMSNorm: x/rms * (1 + w), w starting at 0."""

    def __init__(self, n, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(n))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * (1.0 + self.weight)


def rope_tables(c, n, dtype=torch.float32):
    """cos/sin [n, rotary_dim] of plain rotate-half RoPE over the first rotary_dim values."""
    rp = c["rope_parameters"]
    rd = int(c["head_dim"] * rp["partial_rotary_factor"])
    inv = 1.0 / (rp["rope_theta"] ** (torch.arange(0, rd, 2, dtype=torch.float64) / rd))
    ang = torch.outer(torch.arange(n, dtype=torch.float64), inv)
    ang = torch.cat([ang, ang], -1)
    return ang.cos().to(dtype), ang.sin().to(dtype)


def partial_rope(x, cos, sin):
    """x [B, H, T, D]: the first cos.shape[-1] values of each head turn, the rest pass."""
    rd = cos.shape[-1]
    rot, rest = x[..., :rd], x[..., rd:]
    a, b = rot.chunk(2, -1)
    return torch.cat([rot * cos + torch.cat([-b, a], -1) * sin, rest], -1)


class GatedAttention(nn.Module):
    def __init__(self, c):
        super().__init__()
        h, d = c["hidden_size"], c["head_dim"]
        self.nh, self.nkv, self.d = c["num_attention_heads"], c["num_key_value_heads"], d
        self.q_proj = nn.Linear(h, 2 * self.nh * d, bias=False)  # per head [query D | gate D]
        self.k_proj = nn.Linear(h, self.nkv * d, bias=False)
        self.v_proj = nn.Linear(h, self.nkv * d, bias=False)
        self.o_proj = nn.Linear(self.nh * d, h, bias=False)
        self.q_norm = RMSNorm1p(d, c["rms_norm_eps"])
        self.k_norm = RMSNorm1p(d, c["rms_norm_eps"])

    def forward(self, x, cos, sin, mask):
        B, T, _ = x.shape
        qg = self.q_proj(x).view(B, T, self.nh, 2 * self.d)
        q, gate = qg[..., :self.d], qg[..., self.d:].reshape(B, T, self.nh * self.d)
        q = self.q_norm(q).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(B, T, self.nkv, self.d)).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.nkv, self.d).transpose(1, 2)
        q, k = partial_rope(q, cos, sin), partial_rope(k, cos, sin)
        rep = self.nh // self.nkv
        k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
        att = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(self.d)) + mask
        y = (att.softmax(-1) @ v).transpose(1, 2).reshape(B, T, self.nh * self.d)
        return self.o_proj(y * torch.sigmoid(gate))


def l2norm(x):
    return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + L2NORM_EPS)


def chunk_gated_delta(q, k, v, g, beta, chunk=CHUNK):
    """The gated delta rule from a zero state, S_t = e^g_t S_{t-1} (I - b_t k_t k_t^T) + b_t k_t v_t^T,
    out_t = S_t^T q_t, solved chunk by chunk. q, k [B, H, T, Dk] (normed, q scaled); v [B, H, T, Dv];
    g, beta [B, H, T]. Returns out [B, H, T, Dv].

    Within a chunk, with G the cumulative log decay from its start, the corrected values u
    solve (I + strictly_lower(b_i k_i.k_j e^(G_i - G_j))) u = b v - (b k e^G) S0, i.e. two
    unit-lower-triangular solves; each query reads the chunk's start state decayed to it plus
    the chunk's own rows; the state moves to the chunk's end."""
    B, H, T, Dk = q.shape
    Dv = v.shape[-1]
    pad = (-T) % chunk
    if pad:
        q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
        g, beta = (F.pad(x, (0, pad)) for x in (g, beta))
    n = (T + pad) // chunk
    q, k, v = (x.reshape(B, H, n, chunk, x.shape[-1]) for x in (q, k, v))
    g, beta = (x.reshape(B, H, n, chunk) for x in (g, beta))
    G = g.cumsum(-1)
    upper = torch.triu(torch.ones(chunk, chunk, dtype=torch.bool, device=q.device), 1)
    decay = (G[..., :, None] - G[..., None, :]).masked_fill(upper, float("-inf")).exp()
    k_beta = k * beta[..., None]
    kk = (k_beta @ k.transpose(-1, -2)) * decay
    system = torch.eye(chunk, dtype=q.dtype, device=q.device) + kk.tril(-1)
    rhs = torch.cat([v * beta[..., None], k_beta * G.exp()[..., None]], -1)
    sol = torch.linalg.solve_triangular(system, rhs, upper=False, unitriangular=True)
    u0, w = sol[..., :Dv], sol[..., Dv:]
    qk = (q @ k.transpose(-1, -2)) * decay
    q_dec = q * G.exp()[..., None]
    k_dec = k * (G[..., -1:] - G).exp()[..., None]
    last = G[..., -1].exp()
    S = q.new_zeros(B, H, Dk, Dv)
    outs = []
    for i in range(n):
        u = u0[:, :, i] - w[:, :, i] @ S
        outs.append(q_dec[:, :, i] @ S + qk[:, :, i] @ u)
        S = S * last[:, :, i, None, None] + k_dec[:, :, i].transpose(-1, -2) @ u
    return torch.cat(outs, 2)[:, :, :T]


class GatedDeltaNet(nn.Module):
    def __init__(self, c):
        super().__init__()
        h = c["hidden_size"]
        self.hk, self.hv = c["linear_num_key_heads"], c["linear_num_value_heads"]
        self.dk, self.dv = c["linear_key_head_dim"], c["linear_value_head_dim"]
        self.kernel = c["linear_conv_kernel_dim"]
        self.conv_dim = 2 * self.hk * self.dk + self.hv * self.dv
        self.eps = c["rms_norm_eps"]
        self.in_proj_qkv = nn.Linear(h, self.conv_dim, bias=False)
        self.in_proj_z = nn.Linear(h, self.hv * self.dv, bias=False)
        self.in_proj_b = nn.Linear(h, self.hv, bias=False)
        self.in_proj_a = nn.Linear(h, self.hv, bias=False)
        self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, self.kernel, groups=self.conv_dim, bias=False,
                                padding=self.kernel - 1)
        self.dt_bias = nn.Parameter(torch.ones(self.hv))
        # HF's init: A uniform in (0, 16)
        self.A_log = nn.Parameter(torch.empty(self.hv).uniform_(0, 16).log())
        self.norm = nn.Module()
        self.norm.weight = nn.Parameter(torch.ones(self.dv))  # Qwen3_5RMSNormGated: w itself
        self.out_proj = nn.Linear(self.hv * self.dv, h, bias=False)

    def forward(self, x, chunk=CHUNK):
        B, T, _ = x.shape
        mixed = F.silu(self.conv1d(self.in_proj_qkv(x).transpose(1, 2))[..., :T]).transpose(1, 2)
        kd = self.hk * self.dk
        q = mixed[..., :kd].reshape(B, T, self.hk, self.dk)
        k = mixed[..., kd:2 * kd].reshape(B, T, self.hk, self.dk)
        v = mixed[..., 2 * kd:].reshape(B, T, self.hv, self.dv)
        z = self.in_proj_z(x).reshape(B, T, self.hv, self.dv)
        beta = torch.sigmoid(self.in_proj_b(x))
        g = -self.A_log.exp() * F.softplus(self.in_proj_a(x) + self.dt_bias)
        rep = self.hv // self.hk
        q, k = q.repeat_interleave(rep, 2), k.repeat_interleave(rep, 2)
        q, k = l2norm(q) * self.dk ** -0.5, l2norm(k)
        o = chunk_gated_delta(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), g.transpose(1, 2),
                              beta.transpose(1, 2), chunk).transpose(1, 2)
        o = self.norm.weight * (o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + self.eps)) * F.silu(z)
        return self.out_proj(o.reshape(B, T, self.hv * self.dv))


class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        h, f = c["hidden_size"], c["intermediate_size"]
        self.gate_proj = nn.Linear(h, f, bias=False)
        self.up_proj = nn.Linear(h, f, bias=False)
        self.down_proj = nn.Linear(f, h, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, c, kind):
        super().__init__()
        self.kind = kind
        self.input_layernorm = RMSNorm1p(c["hidden_size"], c["rms_norm_eps"])
        if kind == "full_attention":
            self.self_attn = GatedAttention(c)
        else:
            self.linear_attn = GatedDeltaNet(c)
        self.post_attention_layernorm = RMSNorm1p(c["hidden_size"], c["rms_norm_eps"])
        self.mlp = MLP(c)

    def forward(self, x, cos, sin, mask, chunk=CHUNK):
        h = self.input_layernorm(x)
        x = x + (self.self_attn(h, cos, sin, mask) if self.kind == "full_attention" else self.linear_attn(h, chunk))
        return x + self.mlp(self.post_attention_layernorm(x))


class Qwen35(nn.Module):
    """The text model: returns (final-normed hidden rows, logits), tied embeddings."""

    def __init__(self, c):
        super().__init__()
        self.embed_tokens = nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.layers = nn.ModuleList([DecoderLayer(c, t) for t in layer_types(c)])
        self.norm = RMSNorm1p(c["hidden_size"], c["rms_norm_eps"])

    def forward(self, ids, cos, sin, mask, chunk=CHUNK):
        x = self.embed_tokens(ids)
        for layer in self.layers:
            x = layer(x, cos, sin, mask, chunk)
        h = self.norm(x)
        return h, h @ self.embed_tokens.weight.t()


class MTP(nn.Module):
    """Qwen3.5's MTP layer (mtp.*), the target's embedding and LM head used detached."""

    def __init__(self, c):
        super().__init__()
        h, eps = c["hidden_size"], c["rms_norm_eps"]
        self.pre_fc_norm_embedding = RMSNorm1p(h, eps)
        self.pre_fc_norm_hidden = RMSNorm1p(h, eps)
        self.fc = nn.Linear(2 * h, h, bias=False)  # [embedding | hidden], the embedding first
        self.layers = nn.ModuleList([DecoderLayer(c, "full_attention")])
        self.norm = RMSNorm1p(h, eps)

    def forward(self, hidden, next_ids, table, cos, sin, mask):
        """hidden[t] (the target's final-normed row, or a previous depth's output) with x[t+1]
        -> (out = mtp.norm's output, logits of x[t+2])."""
        e = self.pre_fc_norm_embedding(F.embedding(next_ids, table))
        x = self.fc(torch.cat([e, self.pre_fc_norm_hidden(hidden)], -1))
        out = self.norm(self.layers[0](x, cos, sin, mask))
        return out, out @ table.t()


def init_weights(module, n_layers):
    """GPT-2 style for matrices: N(0, 0.02), the residual output projections scaled by
    1/sqrt(2 * layers); norms, conv, A_log and dt_bias keep HF's initialisation."""
    for name, p in module.named_parameters():
        if p.dim() == 2:
            residual = name.endswith(("o_proj.weight", "down_proj.weight", "out_proj.weight"))
            nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * n_layers) if residual else 0.02)


def causal_mask(t, dtype=torch.float32):
    return torch.triu(torch.full((t, t), float("-inf"), dtype=dtype), 1)


def text_config(vocab, eos):
    c = dict(SHAPE, **COMMON, vocab_size=vocab, eos_token_id=eos, bos_token_id=None)
    c["layer_types"] = layer_types(c)
    return c


def hf_config(c):
    return dict(c, architectures=["Qwen3_5ForCausalLM"], model_type="qwen3_5_text", dtype="bfloat16",
                initializer_range=0.02, use_cache=True, transformers_version="4.57.0.dev0")


def export(target, mtp, c, out, data_dir):
    os.makedirs(out, exist_ok=True)
    tensors = {"model." + k: v for k, v in target.state_dict().items()}
    tensors.update({"mtp." + k: v for k, v in mtp.state_dict().items()})
    save_safetensors(os.path.join(out, "model.safetensors"), tensors, {"format": "pt"})
    for name, obj in (("config.json", hf_config(c)),
                      ("generation_config.json", {"bos_token_id": None, "eos_token_id": c["eos_token_id"],
                                                  "do_sample": False, "transformers_version": "4.57.0.dev0"})):
        with open(os.path.join(out, name), "w") as f:
            json.dump(obj, f, indent=2, sort_keys=True)
            f.write("\n")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(data_dir, name), os.path.join(out, name))


def load_model(directory, dtype=torch.float32):
    """(config, target, mtp) from an exported directory, in dtype."""
    with open(os.path.join(directory, "config.json")) as f:
        c = json.load(f)
    target, mtp = Qwen35(c), MTP(c)
    w = load_safetensors(os.path.join(directory, "model.safetensors"))
    target.load_state_dict({k[len("model."):]: v for k, v in w.items() if k.startswith("model.")})
    mtp.load_state_dict({k[len("mtp."):]: v for k, v in w.items() if k.startswith("mtp.")})
    return c, target.to(dtype), mtp.to(dtype)


@torch.no_grad()
def evaluate(target, mtp, tokens, seq, cos, sin, mask, n_batches=8):
    """Held-out cross-entropy of the target and of the MTP layer at depths 1 and 2 (against the
    corpus), and the MTP layer's greedy agreement with the target's own next token at both
    depths (what speculative acceptance follows)."""
    it = batches(tokens, 8, seq, 12345)
    sums = np.zeros(5)
    table = target.embed_tokens.weight
    for _ in range(n_batches):
        b = next(it)
        ids, nxt, nxt2, nxt3 = b[:, :seq], b[:, 1:seq + 1], b[:, 2:seq + 2], b[:, 3:seq + 3]
        h, logits = target(ids, cos, sin, mask)
        out1, m1 = mtp(h, nxt, table, cos, sin, mask)
        # depth 2 chains on the target's choice, as a draft that was accepted so far would
        _, m2 = mtp(out1, nxt2, table, cos, sin, mask)
        t_arg = logits.argmax(-1)
        v = logits.shape[-1]
        sums += [F.cross_entropy(logits.reshape(-1, v), nxt.reshape(-1)).item(),
                 F.cross_entropy(m1[:, :-1].reshape(-1, v), nxt2[:, :-1].reshape(-1)).item(),
                 F.cross_entropy(m2[:, :-2].reshape(-1, v), nxt3[:, :-2].reshape(-1)).item(),
                 (m1[:, :-1].argmax(-1) == t_arg[:, 1:]).float().mean().item(),
                 (m2[:, :-2].argmax(-1) == t_arg[:, 2:]).float().mean().item()]
    return sums / n_batches


def train(args):
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    with open(os.path.join(args.data, "tokenizer.json")) as f:
        tok = json.load(f)
    vocab = len(tok["model"]["vocab"]) + len(tok["added_tokens"])
    eos = next(t["id"] for t in tok["added_tokens"] if t["content"] == "<|endoftext|>")
    train_tokens = np.load(os.path.join(args.data, "train.npy"))
    valid_tokens = np.load(os.path.join(args.data, "valid.npy"))
    c = text_config(vocab, eos)
    target, mtp = Qwen35(c), MTP(c)
    init_weights(target, c["num_hidden_layers"])
    init_weights(mtp, 1)
    params = list(target.parameters()) + list(mtp.parameters())
    decay = [p for p in params if p.dim() == 2]
    no_decay = [p for p in params if p.dim() != 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8)
    n_target = sum(p.numel() for p in target.parameters())
    n_mtp = sum(p.numel() for p in mtp.parameters())
    print(f"params target {n_target} mtp {n_mtp}; {len(train_tokens)} train tokens, {len(valid_tokens)} valid",
          flush=True)
    seq = args.seq
    cos, sin = rope_tables(c, seq)
    mask = causal_mask(seq)
    it = batches(train_tokens, args.batch, seq, args.seed)
    table = target.embed_tokens.weight
    total, decay_steps = args.steps, args.decay_steps
    if args.time_budget:
        total = None  # fixed once DECIDE_AT of the budget has passed
    t0 = time.time()
    step = 0
    while total is None or step < total:
        if total is None and time.time() - t0 >= DECIDE_AT * args.time_budget:
            decay_steps = max(MIN_DECAY, round(DECAY_SHARE * step))
            total = step + decay_steps
            print(f"schedule fixed at step {step}: --steps {total} --decay-steps {decay_steps} reproduces this run",
                  flush=True)
        stable_end = step + 1 if total is None else total - decay_steps
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args.lr, args.warmup, stable_end, total or step + 1)
        b = next(it)
        ids, nxt, nxt2, nxt3 = b[:, :seq], b[:, 1:seq + 1], b[:, 2:seq + 2], b[:, 3:seq + 3]
        h, logits = target(ids, cos, sin, mask)
        loss_t = F.cross_entropy(logits.reshape(-1, vocab), nxt.reshape(-1))
        teacher = logits.detach()
        # pair t = (h[t], x[t+1]) predicts x[t+2], which the target predicts at t + 1
        out1, m1 = mtp(h.detach(), nxt, table.detach(), cos, sin, mask)
        loss_m1, ce_m1 = distill_loss(m1[:, :-1], teacher[:, 1:], nxt2[:, :-1], 0.3)
        # depth 2 reads depth 1's output with x[t+2], predicting x[t+3]
        _, m2 = mtp(out1, nxt2, table.detach(), cos, sin, mask)
        loss_m2, _ = distill_loss(m2[:, :-2], teacher[:, 2:], nxt3[:, :-2], 0.3)
        loss = loss_t + loss_m1 + 0.5 * loss_m2
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        if step % 20 == 0 or step + 1 == total:
            el = time.time() - t0
            print(f"step {step} lr {opt.param_groups[0]['lr']:.2e} target {loss_t.item():.3f} "
                  f"mtp {ce_m1.item():.3f} | {el:.0f}s {(step + 1) * args.batch * seq / el:.0f} tok/s", flush=True)
        step += 1
    ev = evaluate(target, mtp, valid_tokens, seq, cos, sin, mask)
    print("valid: ce target %.3f mtp %.3f mtp2 %.3f; greedy agreement with target: mtp %.3f mtp2 %.3f" % tuple(ev),
          flush=True)
    export(target, mtp, c, args.out, args.data)


# ---------------------------------------------------------------- check against the reference


def check(args):
    """Exported files, read back here in float64, against qwen35_ref.py (float64 from the same
    BF16 values): target logits, MTP logits at depth 1, and the chunk length not mattering."""
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, os.path.join(here, "..", "..", "..", "tests", "model"))
    import qwen35_ref as ref
    torch.set_num_threads(args.threads)
    c, target, mtp = load_model(args.model, torch.float64)
    model = ref.load(args.model)
    rng = np.random.default_rng(7)
    T = args.tokens
    ids = [int(t) for t in rng.integers(0, c["vocab_size"], T)]
    cos, sin = rope_tables(c, T, torch.float64)
    mask = causal_mask(T, torch.float64)
    with torch.no_grad():
        x = torch.tensor([ids])
        h, logits = target(x, cos, sin, mask)
        _, logits8 = target(x, cos, sin, mask, chunk=8)  # several chunks: the state is carried
        _, mlogits = mtp(h[:, :-1], x[:, 1:], target.embed_tokens.weight, cos[:T - 1], sin[:T - 1],
                         mask[:T - 1, :T - 1])
    want = ref.forward(model, ids)
    want_h = ref.final_hidden(model, ids)
    want_m, _ = ref.mtp_forward(model, ids[1:], want_h[:-1])
    worst = 0.0
    for what, got, ref_val in (("logits", logits[0].numpy(), want), ("chunk 8 logits", logits8[0].numpy(), want),
                               ("mtp logits", mlogits[0].numpy(), want_m)):
        err = float(np.abs(got - ref_val).max() / max(1.0, np.abs(ref_val).max()))
        print(f"{what}: max relative difference {err:.3g} (logit std {np.std(ref_val):.3g})")
        worst = max(worst, err)
    if not worst < 1e-9:
        print("hybrid.py check: FAILED", file=sys.stderr)
        return 1
    print("hybrid.py check: ok")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("train")
    t.add_argument("--data", required=True)
    t.add_argument("--out", required=True)
    t.add_argument("--steps", type=int, default=400)
    t.add_argument("--decay-steps", type=int, default=100, help="the last steps, where the learning rate decays")
    t.add_argument("--time-budget", type=float, help="seconds: choose --steps while running (see DECIDE_AT)")
    t.add_argument("--batch", type=int, default=6)
    t.add_argument("--seq", type=int, default=192)
    t.add_argument("--lr", type=float, default=2e-3)
    t.add_argument("--threads", type=int, default=2)
    t.add_argument("--seed", type=int, default=1)
    t.add_argument("--warmup", type=int, default=30)
    k = sub.add_parser("check")
    k.add_argument("--model", required=True)
    k.add_argument("--tokens", type=int, default=150, help="sequence length (more than two chunks of 64)")
    k.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    if args.cmd == "train":
        train(args)
        return 0
    return check(args)


if __name__ == "__main__":
    sys.exit(main())
