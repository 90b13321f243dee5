#!/usr/bin/python3
"""NumPy expectations for rlx-conformance: one .rlxcase file per node.

  gen_expectations.py --out DIR

Each file holds a node's inputs (drawn here, stored in their dtype) and the output NumPy
computes in float64 from exactly those stored values, following the op definitions of
core/include/rlx/graph.h and the Hugging Face Qwen3 code, not rlx's C kernels. The file layout
is described in apps/rlx-conformance/fixtures.c. Output is deterministic; stale *.rlxcase
files in DIR are removed, and DIR/MANIFEST lists the cases.
"""
import argparse
import os
import struct
import sys

import numpy as np

OPS = {"embed": 1, "matmul": 2, "rms_norm": 3, "rope": 4, "attention": 5, "swiglu": 6, "add": 7,
       "gather_last": 8, "moe": 9, "concat": 10, "gather_rows": 11}
DTYPE_CODE = {"f32": 0, "bf16": 1, "f16": 2, "i32": 3}
DTYPES = ("f32", "bf16", "f16")
SEED = 20240601


# ---- storage: values as a backend sees them, and their exact float64 widening ----

def bf16_bits(x):
    """float32 -> bfloat16 bits, round to nearest even (inputs are finite)."""
    b = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)


class Tensor:
    """A stored tensor: raw little-endian bytes plus the float64 values they hold."""

    def __init__(self, values, dtype, weight=False):
        values = np.asarray(values)
        self.dtype, self.shape, self.weight = dtype, values.shape, weight
        if dtype == "f32":
            stored = values.astype("<f4")
            self.value = stored.astype(np.float64)
        elif dtype == "f16":
            stored = values.astype("<f2")
            self.value = stored.astype(np.float64)
        elif dtype == "bf16":
            stored = bf16_bits(values).astype("<u2")
            self.value = (stored.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
        elif dtype == "i32":
            stored = values.astype("<i4")
            self.value = stored.astype(np.int64)
        else:
            raise ValueError(dtype)
        self.raw = stored.tobytes()

    def record(self):
        shape = list(self.shape) + [1] * (4 - len(self.shape))
        head = struct.pack("<IIII4q", DTYPE_CODE[self.dtype], len(self.shape), 1 if self.weight else 0, 0,
                           *shape)
        return head + self.raw


def f32(values):
    return np.asarray(values, dtype=np.float32).astype("<f4")


# ---- the ops, in float64 ----

def silu(x):
    return x / (1.0 + np.exp(-x))


def op_rms_norm(x, w, eps):
    g = w.shape[0]
    rows = x.reshape(-1, g)
    out = rows / np.sqrt(np.mean(rows * rows, axis=1, keepdims=True) + eps) * w
    return out.reshape(x.shape)


def op_rope(x, pos, head_dim, theta, factors=None):
    """NeoX RoPE; pair i's frequency divided by factors[i] when given (ABI 1.5)."""
    t, cols = x.shape
    half = head_dim // 2
    inv_freq = theta ** (-np.arange(half, dtype=np.float64) * 2.0 / head_dim)
    if factors is not None:
        inv_freq = inv_freq / factors.astype(np.float64)
    angle = pos[:, None].astype(np.float64) * inv_freq[None, :]          # [T, half]
    cos, sin = np.cos(angle)[:, None, :], np.sin(angle)[:, None, :]
    h = x.reshape(t, cols // head_dim, head_dim)
    x1, x2 = h[..., :half], h[..., half:]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).reshape(t, cols)


def op_attention(q, k, v, pos, k_cache, v_cache, hq, hkv, d, window, scale):
    kc, vc = k_cache.copy(), v_cache.copy()
    kc[pos] = k
    vc[pos] = v
    t = q.shape[0]
    cap = kc.shape[0]
    j = np.arange(cap)[None, :]
    p = pos[:, None]
    visible = j <= p
    if window:
        visible &= (p - j) < window
    out = np.zeros((t, hq * d))
    group = hq // hkv
    for h in range(hq):
        kvh = h // group
        qh = q[:, h * d:(h + 1) * d]
        keys = kc[:, kvh * d:(kvh + 1) * d]
        vals = vc[:, kvh * d:(kvh + 1) * d]
        s = np.where(visible, (qh @ keys.T) * scale, -np.inf)
        s = np.exp(s - s.max(axis=1, keepdims=True))
        s /= s.sum(axis=1, keepdims=True)
        out[:, h * d:(h + 1) * d] = s @ vals
    return out, kc, vc


def op_attention_slots(q, k, v, pos, seq, k_cache, v_cache, cache_dtype, hq, hkv, d, window, scale):
    """ATTENTION of ABI 1.4: caches [S, C, Hkv*D] (or [C, Hkv*D] when seq is None) of cache_dtype;
    every row's k and v are stored first (as float16 when the cache is), then each query row
    attends to positions <= its own of its own slot only. Row by row, as the definition reads."""
    store = np.float16 if cache_dtype == "f16" else np.float32
    kc = (k_cache if seq is not None else k_cache[None]).copy()
    vc = (v_cache if seq is not None else v_cache[None]).copy()
    slot = seq if seq is not None else np.zeros(len(pos), dtype=np.int64)
    for t in range(len(pos)):
        kc[slot[t], pos[t]] = k[t].astype(store).astype(np.float64)
        vc[slot[t], pos[t]] = v[t].astype(store).astype(np.float64)
    out = np.zeros((len(pos), hq * d))
    group = hq // hkv
    for t in range(len(pos)):
        lo = max(0, pos[t] - window + 1) if window else 0
        for h in range(hq):
            kvh = h // group
            keys = kc[slot[t], lo:pos[t] + 1, kvh * d:(kvh + 1) * d]
            vals = vc[slot[t], lo:pos[t] + 1, kvh * d:(kvh + 1) * d]
            s = keys @ q[t, h * d:(h + 1) * d] * scale
            p = np.exp(s - s.max())
            out[t, h * d:(h + 1) * d] = (p / p.sum()) @ vals
    if seq is None:
        kc, vc = kc[0], vc[0]
    return out, kc, vc


def moe_top(logits, k):
    """Experts by descending logit, ties to the lower index (as torch.topk)."""
    return np.argsort(-logits, kind="stable")[:k]


def op_moe(x, router, experts, top_k, norm):
    out = np.zeros_like(x)
    for t in range(x.shape[0]):
        logits = router @ x[t]
        p = np.exp(logits - logits.max())
        p /= p.sum()
        chosen = moe_top(logits, top_k)
        weights = p[chosen] / p[chosen].sum() if norm else p[chosen]
        for e, wgt in zip(chosen, weights):
            gate, up, down = experts[e]
            out[t] += wgt * (down @ (silu(gate @ x[t]) * (up @ x[t])))
    return out


# ---- cases ----

class Case:
    def __init__(self, op, name, inputs, out, params=None, max_pos=0.0, states=()):
        self.op, self.name, self.inputs, self.out = op, name, inputs, out
        self.params = dict(params or {})
        self.max_pos, self.states = float(max_pos), states

    def encode(self):
        p = self.params
        name = self.name.encode()
        data = [b"RLXCASE\0", struct.pack("<IIII", 1, OPS[self.op], len(self.inputs), len(name)), name,
                struct.pack("<fffIIIIIII", p.get("eps", 0.0), p.get("rope_theta", 0.0), p.get("scale", 0.0),
                            p.get("head_dim", 0), p.get("n_heads", 0), p.get("n_kv_heads", 0),
                            p.get("window", 0), p.get("n_experts", 0), p.get("top_k", 0), p.get("norm_topk", 0)),
                struct.pack("<d", self.max_pos)]
        data += [t.record() for t in self.inputs]
        data.append(Tensor(f32(self.out), "f32").record())
        data.append(struct.pack("<I", len(self.states)))
        for index, values in self.states:
            stored = np.asarray(values).astype("<f2" if self.inputs[index].dtype == "f16" else "<f4")
            data.append(struct.pack("<I", index) + stored.tobytes())
        return b"".join(data)


def uniform(rng, shape, scale):
    return (rng.uniform(-1.0, 1.0, size=shape) * scale).astype(np.float32)


def cases():
    out = []
    rng = np.random.default_rng(SEED)

    for t, v, h in [(1, 37, 19), (9, 37, 19), (7, 1000, 64)]:
        for dt in DTYPES:
            ids = rng.integers(0, v, size=t)
            ids[0] = v - 1
            table = Tensor(uniform(rng, (v, h), 1.0), dt, weight=True)
            out.append(Case("embed", f"embed T={t} V={v} H={h} table={dt}", [Tensor(ids, "i32"), table],
                            table.value[ids]))

    for t, k, n in [(1, 64, 96), (1, 33, 17), (7, 130, 65), (3, 256, 128), (17, 64, 100), (64, 128, 96)]:
        for dt in DTYPES:
            for bias in (False, True):
                x = Tensor(uniform(rng, (t, k), 1.0), "f32")
                w = Tensor(uniform(rng, (n, k), 0.1), dt, weight=True)
                ins = [x, w]
                y = x.value @ w.value.T
                if bias:
                    b = Tensor(uniform(rng, (n,), 1.0), dt, weight=True)
                    ins.append(b)
                    y = y + b.value
                out.append(Case("matmul", f"matmul T={t} K={k} N={n} w={dt}{' +bias' if bias else ''}", ins, y))

    for t, c, g, eps in [(1, 1024, 1024, 1e-6), (5, 64, 16, 1e-6), (2, 7, 7, 1e-5), (4, 33, 11, 1e-6),
                         (3, 256, 128, 1e-6)]:
        for dt in DTYPES:
            x = Tensor(uniform(rng, (t, c), 3.0), "f32")
            w = Tensor(uniform(rng, (g,), 1.0), dt, weight=True)
            eps32 = float(np.float32(eps))
            out.append(Case("rms_norm", f"rms_norm T={t} C={c} G={g} eps={eps:g} w={dt}", [x, w],
                            op_rms_norm(x.value, w.value, eps32), {"eps": eps32}))

    for t, heads, d, first, theta in [(1, 2, 16, 0, 1e4), (6, 4, 128, 0, 1e6), (3, 3, 64, 1000, 1e6),
                                      (2, 1, 8, 5000, 1e4), (64, 2, 32, 0, 1e6), (1, 4, 64, 30000, 1e6)]:
        x = Tensor(uniform(rng, (t, heads * d), 1.0), "f32")
        pos = np.arange(first, first + t)
        theta32 = float(np.float32(theta))
        out.append(Case("rope", f"rope T={t} heads={heads} D={d} pos0={first} theta={theta:g}",
                        [x, Tensor(pos, "i32")], op_rope(x.value, pos, d, theta32),
                        {"head_dim": d, "rope_theta": theta32}, max_pos=first + t - 1))
    # with Llama 3.1-style frequency divisors (ABI 1.5), as F32 weights in [1, 8)
    for t, heads, d, first, theta in [(5, 4, 64, 0, 5e5), (3, 2, 128, 20000, 5e5)]:
        x = Tensor(uniform(rng, (t, heads * d), 1.0), "f32")
        factors = Tensor(4.5 + 3.5 * uniform(rng, (d // 2,), 1.0), "f32", weight=True)
        pos = np.arange(first, first + t)
        theta32 = float(np.float32(theta))
        out.append(Case("rope", f"rope T={t} heads={heads} D={d} pos0={first} theta={theta:g} factors",
                        [x, Tensor(pos, "i32"), factors], op_rope(x.value, pos, d, theta32, factors.value),
                        {"head_dim": d, "rope_theta": theta32}, max_pos=first + t - 1))

    for t, hq, hkv, d, cap, first, window in [
            (1, 4, 4, 16, 8, 0, 0), (5, 8, 4, 16, 32, 0, 0), (5, 8, 2, 16, 32, 0, 0), (17, 8, 1, 32, 40, 3, 0),
            (7, 3, 3, 12, 16, 2, 0), (6, 4, 2, 16, 32, 9, 3), (12, 6, 3, 8, 16, 0, 5),
            (1, 8, 1, 32, 2100, 2048, 0), (3, 4, 2, 16, 2100, 2000, 64), (512, 4, 1, 16, 512, 0, 0),
            (512, 8, 2, 16, 640, 100, 128)]:
        q = Tensor(uniform(rng, (t, hq * d), 2.0), "f32")
        k = Tensor(uniform(rng, (t, hkv * d), 2.0), "f32")
        v = Tensor(uniform(rng, (t, hkv * d), 1.0), "f32")
        kc = Tensor(uniform(rng, (cap, hkv * d), 2.0), "f32")
        vc = Tensor(uniform(rng, (cap, hkv * d), 1.0), "f32")
        pos = np.arange(first, first + t)
        scale = float(np.float32(1.0 / np.sqrt(d)))
        y, kc2, vc2 = op_attention(q.value, k.value, v.value, pos, kc.value, vc.value, hq, hkv, d, window, scale)
        out.append(Case("attention",
                        f"attention T={t} Hq={hq} Hkv={hkv} D={d} cache={cap} pos0={first} window={window}",
                        [q, k, v, Tensor(pos, "i32"), kc, vc], y,
                        {"head_dim": d, "n_heads": hq, "n_kv_heads": hkv, "window": window, "scale": scale},
                        max_pos=first + t - 1, states=((4, kc2), (5, vc2))))

    # ABI 1.4: slots (caches [S, C, Hkv*D], row t in slot seq[t]) and F16 caches. Rows of several
    # slots interleaved, decode rows of many slots, a window, a prompt chunk after a prefix
    # crossing positions 256 and 512, and both F16 forms; F16 inputs of magnitude up to 600 so
    # that their rounding is coarse (steps of 0.5) and shows in the output.
    for name, hq, hkv, d, slots, cap, rows, window, dt in [
            ("interleaved", 4, 2, 16, 3, 24, [(0, 5), (1, 0), (0, 6), (2, 10), (1, 1), (0, 7)], 0, "f32"),
            ("decode", 8, 1, 32, 4, 64, [(3, 63), (0, 0), (2, 31), (1, 17)], 0, "f32"),
            ("window", 6, 3, 8, 2, 40, [(1, 20), (0, 3), (1, 21), (1, 22), (0, 4)], 8, "f32"),
            ("chunk", 8, 2, 16, 2, 600, [(1, 599)] + [(0, p) for p in range(250, 530)], 0, "f32"),
            ("interleaved", 4, 2, 16, 3, 24, [(0, 5), (1, 0), (0, 6), (2, 10), (1, 1), (0, 7)], 0, "f16"),
            ("chunk", 8, 2, 16, 2, 600, [(0, p) for p in range(250, 290)] + [(1, 599)], 64, "f16"),
            ("one sequence", 8, 2, 16, None, 32, [(None, p) for p in range(3, 8)], 0, "f16")]:
        t = len(rows)
        seq = None if slots is None else np.array([r[0] for r in rows])
        pos = np.array([r[1] for r in rows])
        big = 600.0 if dt == "f16" else 2.0
        shape = (cap, hkv * d) if slots is None else (slots, cap, hkv * d)
        q = Tensor(uniform(rng, (t, hq * d), 2.0 / big), "f32")
        k = Tensor(uniform(rng, (t, hkv * d), big), "f32")
        v = Tensor(uniform(rng, (t, hkv * d), big), "f32")
        kc = Tensor(uniform(rng, shape, big), dt)
        vc = Tensor(uniform(rng, shape, big), dt)
        scale = float(np.float32(1.0 / np.sqrt(d)))
        y, kc2, vc2 = op_attention_slots(q.value, k.value, v.value, pos, seq, kc.value, vc.value, dt, hq, hkv, d,
                                         window, scale)
        ins = [q, k, v, Tensor(pos, "i32"), kc, vc] + ([] if seq is None else [Tensor(seq, "i32")])
        out.append(Case("attention",
                        f"attention {name} T={t} Hq={hq} Hkv={hkv} D={d} slots={slots or 0} cache={cap} "
                        f"window={window} kv={dt}",
                        ins, y, {"head_dim": d, "n_heads": hq, "n_kv_heads": hkv, "window": window, "scale": scale},
                        max_pos=int(pos.max()), states=((4, kc2), (5, vc2))))

    for t, c, idx in [(7, 17, [6, 0, 6, 3]), (1, 64, [0]), (130, 96, [129, 5, 64])]:
        x = Tensor(uniform(rng, (t, c), 4.0), "f32")
        out.append(Case("gather_rows", f"gather_rows T={t} C={c} R={len(idx)}", [x, Tensor(np.array(idx), "i32")],
                        x.value[idx]))

    for t, c in [(1, 3072), (5, 17), (64, 256), (1, 1)]:
        a = Tensor(uniform(rng, (t, c), 4.0), "f32")
        b = Tensor(uniform(rng, (t, c), 4.0), "f32")
        out.append(Case("swiglu", f"swiglu T={t} C={c}", [a, b], silu(a.value) * b.value))
        out.append(Case("add", f"add T={t} C={c}", [a, b], a.value + b.value))
        out.append(Case("gather_last", f"gather_last T={t} C={c}", [a], a.value[-1:]))

    for t, h, f, n_exp, top_k, norm in [(1, 32, 16, 4, 2, 1), (6, 48, 24, 8, 2, 0), (13, 64, 40, 8, 3, 1),
                                        (3, 16, 8, 2, 2, 1), (5, 32, 16, 16, 8, 1), (4, 16, 8, 4, 1, 0)]:
        for dt in DTYPES:
            router = Tensor(uniform(rng, (n_exp, h), 1.0), dt, weight=True)
            xs = uniform(rng, (t, h), 1.0)
            # A float32 implementation must pick the same experts: keep the k-th router logit
            # clear of the next one.
            for row in range(t):
                for _ in range(100):
                    s = np.sort(router.value @ xs[row].astype(np.float64))[::-1]
                    if top_k >= n_exp or s[top_k - 1] - s[top_k] >= 1e-3:
                        break
                    xs[row] = uniform(rng, (h,), 1.0)
            x = Tensor(xs, "f32")
            ins, experts = [x, router], []
            for _ in range(n_exp):
                gate = Tensor(uniform(rng, (f, h), 0.3), dt, weight=True)
                up = Tensor(uniform(rng, (f, h), 0.3), dt, weight=True)
                down = Tensor(uniform(rng, (h, f), 0.3), dt, weight=True)
                ins += [gate, up, down]
                experts.append((gate.value, up.value, down.value))
            out.append(Case("moe", f"moe T={t} H={h} F={f} E={n_exp} k={top_k} norm={norm} w={dt}", ins,
                            op_moe(x.value, router.value, experts, top_k, norm),
                            {"n_experts": n_exp, "top_k": top_k, "norm_topk": norm}))

    for t, wa, wb in [(1, 64, 64), (5, 17, 3), (64, 256, 256), (3, 1, 9)]:
        a = Tensor(uniform(rng, (t, wa), 4.0), "f32")
        b = Tensor(uniform(rng, (t, wb), 4.0), "f32")
        out.append(Case("concat", f"concat T={t} A={wa} B={wb}", [a, b], np.concatenate([a.value, b.value], axis=1)))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    for old in os.listdir(args.out):
        if old.endswith(".rlxcase"):
            os.remove(os.path.join(args.out, old))
    names = []
    for i, case in enumerate(cases()):
        fname = f"{i:03d}-{case.op}.rlxcase"
        tmp = os.path.join(args.out, fname + ".tmp")
        with open(tmp, "wb") as f:
            f.write(case.encode())
        os.replace(tmp, os.path.join(args.out, fname))
        names.append(f"{fname}\t{case.name}")
    with open(os.path.join(args.out, "MANIFEST"), "w") as f:
        f.write("\n".join(names) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
