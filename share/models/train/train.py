#!/usr/bin/python3
"""Trains rlx's Brown family: a Qwen3 target, a smaller Qwen3 draft and an MTP head, together.

Why one run: the draft and the MTP head exist to predict what the target will say, so both are
distilled from the target's own next-token distributions (plus a little of the corpus), and
the MTP head reads the target's final hidden states (detached, so it never changes the
target). Computing the target's forward once per batch feeds all three.

The models follow Hugging Face's Qwen3 exactly (RMSNorm, per-head q/k norms, NeoX RoPE, GQA,
SwiGLU, tied embeddings), so the exported safetensors load in transformers and in rlx. The MTP
head is the MiMo layout (model.mtp_layers.0.*): RMSNorm the target's hidden h[t] and the
embedding of x[t+1], project their concatenation 2h -> h, one Qwen3 decoder layer, then the
target's final norm and LM head predict x[t+2]. It is trained at two chained depths (the second
reads its own output hidden), which is how rlx drafts k > 1 tokens with one head.

Everything is seeded and single-process; torch's CPU kernels are deterministic for a fixed
thread count, so a rerun with the same --threads reproduces the weights.

Usage: train.py --data DIR --out DIR [--steps N] [--threads 2] [--init DIR --lr L --warmup W --seed S]
  --data holds train.npy / valid.npy (uint16 token ids) and tokenizer.json from bpe.py;
  --init continues from a family exported by an earlier run (a second, shorter schedule).
"""
import argparse
import json
import math
import os
import shutil
import struct
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

TARGET = dict(hidden_size=512, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=4, head_dim=64,
              intermediate_size=2048)
DRAFT = dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
             intermediate_size=768)
COMMON = dict(rms_norm_eps=1e-6, rope_theta=10000.0, max_position_embeddings=1024, tie_word_embeddings=True,
              attention_bias=False, hidden_act="silu", use_sliding_window=False)


class RMSNorm(nn.Module):
    def __init__(self, n, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope_tables(head_dim, theta, n):
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    freqs = torch.outer(torch.arange(n, dtype=torch.float32), inv)
    emb = torch.cat([freqs, freqs], -1)
    return emb.cos(), emb.sin()


def rotate_half(x):
    a, b = x.chunk(2, -1)
    return torch.cat([-b, a], -1)


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        h, d = c["hidden_size"], c["head_dim"]
        self.nh, self.nkv, self.d = c["num_attention_heads"], c["num_key_value_heads"], d
        self.q_proj = nn.Linear(h, self.nh * d, bias=False)
        self.k_proj = nn.Linear(h, self.nkv * d, bias=False)
        self.v_proj = nn.Linear(h, self.nkv * d, bias=False)
        self.o_proj = nn.Linear(self.nh * d, h, bias=False)
        self.q_norm = RMSNorm(d, c["rms_norm_eps"])
        self.k_norm = RMSNorm(d, c["rms_norm_eps"])

    def forward(self, x, cos, sin, mask):
        B, T, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(B, T, self.nh, self.d)).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(B, T, self.nkv, self.d)).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.nkv, self.d).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        rep = self.nh // self.nkv
        k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
        att = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(self.d)) + mask
        y = att.softmax(-1) @ v
        return self.o_proj(y.transpose(1, 2).reshape(B, T, self.nh * self.d))


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
    def __init__(self, c):
        super().__init__()
        self.input_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.self_attn = Attention(c)
        self.post_attention_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.mlp = MLP(c)

    def forward(self, x, cos, sin, mask):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class Qwen3(nn.Module):
    """Returns (final-normed hidden states, logits) like Qwen3ForCausalLM with tied embeddings."""

    def __init__(self, c):
        super().__init__()
        self.c = c
        self.embed_tokens = nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.layers = nn.ModuleList([DecoderLayer(c) for _ in range(c["num_hidden_layers"])])
        self.norm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])

    def forward(self, ids, cos, sin, mask):
        x = self.embed_tokens(ids)
        for layer in self.layers:
            x = layer(x, cos, sin, mask)
        h = self.norm(x)
        return h, h @ self.embed_tokens.weight.t()


class MTPLayer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.token_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.hidden_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.input_proj = nn.Linear(2 * c["hidden_size"], c["hidden_size"], bias=False)
        self.mtp_block = DecoderLayer(c)

    def forward(self, hidden, next_ids, target, cos, sin, mask):
        """hidden[t] (the target's or a previous depth's) with x[t+1] -> (normed out, logits).
        The target's embedding, final norm and LM head are used detached: the head is trained
        on the target, never the other way round, so the target is what plain training makes."""
        table = target.embed_tokens.weight.detach()
        e = self.token_layernorm(F.embedding(next_ids, table))
        x = self.input_proj(torch.cat([self.hidden_layernorm(hidden), e], -1))
        y = self.mtp_block(x, cos, sin, mask)
        out = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + target.norm.eps) * target.norm.weight.detach()
        return out, out @ table.t()


def init_weights(module, n_layers):
    """GPT-2 style: N(0, 0.02), residual output projections scaled by 1/sqrt(2 * layers)."""
    for name, p in module.named_parameters():
        if p.dim() == 2:
            std = 0.02 / math.sqrt(2 * n_layers) if name.endswith(("o_proj.weight", "down_proj.weight")) else 0.02
            nn.init.normal_(p, 0.0, std)


def distill_loss(student_logits, teacher_logits, labels, corpus_weight):
    """KL(teacher || student) plus a little corpus cross-entropy, averaged over positions."""
    v = student_logits.shape[-1]
    s = student_logits.reshape(-1, v).log_softmax(-1)
    t = teacher_logits.reshape(-1, v).log_softmax(-1)
    kl = (t.exp() * (t - s)).sum(-1).mean()
    ce = F.nll_loss(s, labels.reshape(-1))
    return (1 - corpus_weight) * kl + corpus_weight * ce, ce


def batches(tokens, batch, seq, seed):
    rng = np.random.default_rng(seed)
    n = len(tokens) - seq - 3
    while True:
        starts = rng.integers(0, n, size=batch)
        yield torch.from_numpy(np.stack([tokens[s:s + seq + 3] for s in starts]).astype(np.int64))


def lr_at(step, steps, peak, warmup):
    if step < warmup:
        return peak * (step + 1) / warmup
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup))))


def causal_mask(t):
    return torch.triu(torch.full((t, t), float("-inf")), 1)


def save_safetensors(path, tensors, metadata):
    """tensors: name -> float tensor, stored as BF16 (round to nearest even, as torch does)."""
    header, blobs, offset = {"__metadata__": metadata}, [], 0
    for name in sorted(tensors):
        data = tensors[name].detach().to(torch.bfloat16).contiguous().view(torch.int16).numpy().tobytes()
        header[name] = {"dtype": "BF16", "shape": list(tensors[name].shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for b in blobs:
            f.write(b)


def load_safetensors(path):
    """name -> float32 tensor, from a file save_safetensors wrote (BF16)."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        assert info["dtype"] == "BF16", f"{path}: {name} is {info['dtype']}"
        begin, end = info["data_offsets"]
        bits = torch.from_numpy(np.frombuffer(data[begin:end], dtype=np.int16).copy())
        out[name] = bits.view(torch.bfloat16).float().reshape(info["shape"])
    return out


def load_family(target, draft, mtp, init):
    """Continues from a previous run's exported family (its BF16 weights)."""
    strip = lambda d, prefix: {k[len(prefix):]: v for k, v in d.items()}
    target.load_state_dict(strip(load_safetensors(os.path.join(init, "target", "model.safetensors")), "model."))
    draft.load_state_dict(strip(load_safetensors(os.path.join(init, "draft", "model.safetensors")), "model."))
    mtp.load_state_dict(strip(load_safetensors(os.path.join(init, "target", "mtp.safetensors")),
                              "model.mtp_layers.0."))


def hf_config(c, eos):
    cfg = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "torch_dtype": "bfloat16",
           "bos_token_id": None, "eos_token_id": eos}
    cfg.update({k: c[k] for k in ["vocab_size", *TARGET.keys(), *COMMON.keys()]})
    cfg.update(sliding_window=None, max_window_layers=c["num_hidden_layers"], rope_scaling=None,
               attention_dropout=0.0, initializer_range=0.02, use_cache=True, transformers_version="4.51.0")
    return cfg


def export_model(model, out, c, eos, data_dir):
    os.makedirs(out, exist_ok=True)
    tensors = {("model." + k if not k.startswith("lm_head") else k): v for k, v in model.state_dict().items()}
    save_safetensors(os.path.join(out, "model.safetensors"), tensors, {"format": "pt"})
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(hf_config(c, eos), f, indent=2)
        f.write("\n")
    with open(os.path.join(out, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": None, "eos_token_id": eos, "do_sample": False,
                   "transformers_version": "4.51.0"}, f, indent=2)
        f.write("\n")
    for name in ["tokenizer.json", "tokenizer_config.json"]:
        shutil.copy(os.path.join(data_dir, name), os.path.join(out, name))


@torch.no_grad()
def evaluate(target, draft, mtp, tokens, seq, cos, sin, mask, n_batches=8):
    """Mean corpus cross-entropy of each model and the greedy agreement of draft and MTP with the
    target (the figure speculative decoding's acceptance follows)."""
    it = batches(tokens, 8, seq, 12345)
    sums = np.zeros(5)
    for _ in range(n_batches):
        b = next(it)
        ids, nxt, nxt2 = b[:, :seq], b[:, 1:seq + 1], b[:, 2:seq + 2]
        h, logits = target(ids, cos, sin, mask)
        _, dlogits = draft(ids, cos, sin, mask)
        _, m1 = mtp(h, nxt, target, cos, sin, mask)
        t_arg = logits.argmax(-1)
        sums += [F.cross_entropy(logits.reshape(-1, logits.shape[-1]), nxt.reshape(-1)).item(),
                 F.cross_entropy(dlogits.reshape(-1, logits.shape[-1]), nxt.reshape(-1)).item(),
                 F.cross_entropy(m1[:, :-1].reshape(-1, logits.shape[-1]), nxt2[:, :-1].reshape(-1)).item(),
                 (dlogits.argmax(-1) == t_arg).float().mean().item(),
                 (m1[:, :-1].argmax(-1) == t_arg[:, 1:]).float().mean().item()]
    return sums / n_batches


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=360)
    ap.add_argument("--batch", type=int, default=6)
    ap.add_argument("--seq", type=int, default=192)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--init", help="continue from the family a previous run exported to this directory")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)

    with open(os.path.join(args.data, "tokenizer.json")) as f:
        tok = json.load(f)
    vocab = len(tok["model"]["vocab"]) + len(tok["added_tokens"])
    eos = next(t["id"] for t in tok["added_tokens"] if t["content"] == "<|endoftext|>")
    train_tokens = np.load(os.path.join(args.data, "train.npy"))
    valid_tokens = np.load(os.path.join(args.data, "valid.npy"))
    tc = dict(COMMON, **TARGET, vocab_size=vocab)
    dc = dict(COMMON, **DRAFT, vocab_size=vocab)
    target, draft, mtp = Qwen3(tc), Qwen3(dc), MTPLayer(tc)
    init_weights(target, tc["num_hidden_layers"])
    init_weights(draft, dc["num_hidden_layers"])
    init_weights(mtp, 1)
    if args.init:
        load_family(target, draft, mtp, args.init)
    params = list(target.parameters()) + list(draft.parameters()) + list(mtp.parameters())
    decay = [p for p in params if p.dim() == 2]
    no_decay = [p for p in params if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8)
    n_params = {name: sum(p.numel() for p in m.parameters()) for name, m in
                [("target", target), ("draft", draft), ("mtp", mtp)]}
    print(f"params {n_params}; {len(train_tokens)} train tokens, {len(valid_tokens)} valid", flush=True)

    seq = args.seq
    tcos, tsin = rope_tables(tc["head_dim"], tc["rope_theta"], seq)
    dcos, dsin = rope_tables(dc["head_dim"], dc["rope_theta"], seq)
    mask = causal_mask(seq)
    it = batches(train_tokens, args.batch, seq, args.seed)
    t0 = time.time()
    for step in range(args.steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, args.steps, args.lr, warmup=args.warmup)
        b = next(it)
        ids, nxt, nxt2, nxt3 = b[:, :seq], b[:, 1:seq + 1], b[:, 2:seq + 2], b[:, 3:seq + 3]
        h, logits = target(ids, tcos, tsin, mask)
        loss_t = F.cross_entropy(logits.reshape(-1, vocab), nxt.reshape(-1))
        teacher = logits.detach()
        _, dlogits = draft(ids, dcos, dsin, mask)
        loss_d, ce_d = distill_loss(dlogits, teacher, nxt, 0.3)
        # MTP pair t = (h[t], x[t+1]) predicts x[t+2], which the target predicts at t + 1
        out1, m1 = mtp(h.detach(), nxt, target, tcos, tsin, mask)
        loss_m1, ce_m1 = distill_loss(m1[:, :-1], teacher[:, 1:], nxt2[:, :-1], 0.3)
        # depth 2 reads depth 1's output as its hidden and x[t+2], predicting x[t+3]
        _, m2 = mtp(out1, nxt2, target, tcos, tsin, mask)
        loss_m2, _ = distill_loss(m2[:, :-2], teacher[:, 2:], nxt3[:, :-2], 0.3)
        loss = loss_t + loss_d + loss_m1 + 0.5 * loss_m2
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        if step % 20 == 0 or step == args.steps - 1:
            el = time.time() - t0
            print(f"step {step} lr {opt.param_groups[0]['lr']:.2e} target {loss_t.item():.3f} "
                  f"draft {ce_d.item():.3f} mtp {ce_m1.item():.3f} | {el:.0f}s "
                  f"{(step + 1) * args.batch * seq / el:.0f} tok/s", flush=True)
    ev = evaluate(target, draft, mtp, valid_tokens, seq, tcos, tsin, mask)
    print("valid: ce target %.3f draft %.3f mtp %.3f; greedy agreement with target: draft %.3f mtp %.3f" % tuple(ev))
    export_model(target, os.path.join(args.out, "target"), tc, eos, args.data)
    export_model(draft, os.path.join(args.out, "draft"), dc, eos, args.data)
    save_safetensors(os.path.join(args.out, "target", "mtp.safetensors"),
                     {"model.mtp_layers.0." + k: v for k, v in mtp.state_dict().items()}, {"format": "pt"})


if __name__ == "__main__":
    main()
