#!/usr/bin/python3
"""NumPy expectations for test_hybrid_ops: the ops of ABI 1.6 (SIGMOID_MUL, SSM_CONV,
GATED_DELTA, partial ROPE) and 1.7 (their state rows) in float64, written from their contract in
core/include/rlx/backend_iface.h and from Hugging Face's Qwen3-Next / Qwen3.5 code
(torch_recurrent_gated_delta_rule, the causal_conv1d fallback, apply_rotary_pos_emb with a
partial rotary dimension), never from rlx's C kernels.

  hybrid_ops_ref.py --out FILE

A case is one node run over a sequence of calls that share its weights and its state: each
call gives its activations, positions and slots, and either the output expected or the status
expected (the call then leaves the state as it was). The final state is expected too. A case
with state_rows gives each call an input more, the state after each row, expected as well. GATED_DELTA
is computed row by row (the recurrent definition) whatever the length of a call, so the C
kernel's chunk-parallel form is checked against the recurrence.

File layout (little-endian):
  "RLXHYB3\\0" u32 n_cases, then per case:
    u32 op, u32 name_len, name, f32 eps, rope_theta, scale, u32 head_dim, n_heads, n_kv_heads,
    head_dim_v, rope_dims, kv_tiled, state_rows
    u32 n_weights, tensors; u32 has_state, [tensor]
    u32 n_calls, per call: u32 n_inputs, per input u32 kind (0 activation, 1 weight, 2 state,
      3 state rows) and u32 index; u32 n_acts, tensors; i32 status; [expected output tensor
      when status 0]; [with state_rows: the expected rows tensor (zeros when status != 0)]
    [expected final state tensor when has_state]
  tensor: u32 dtype, u32 n_dims, i64 shape[4], raw data
"""
import argparse
import os
import struct
import sys

import numpy as np

OPS = {"rope": 4, "sigmoid_mul": 12, "ssm_conv": 13, "gated_delta": 14}
DTYPE = {"f32": 0, "bf16": 1, "f16": 2, "i32": 3}
ACT, WEIGHT, STATE, ROWS = 0, 1, 2, 3
E_INVALID, E_RANGE = -1, -10  # rlx/status.h: RLX_E_INVALID, RLX_E_RANGE
SEED = 2026_0528


def bf16_round(x):
    """float32 values as BF16 holds them: round to nearest even on the float32 bits."""
    b = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return (((b + 0x7FFF + ((b >> 16) & 1)) >> 16) << 16).astype(np.uint32).view(np.float32)


class Tensor:
    """Stored values (rounded to the dtype) and their exact float64 widening."""

    def __init__(self, values, dtype="f32"):
        values = np.asarray(values)
        self.dtype, self.shape = dtype, values.shape
        if dtype == "f32":
            stored = values.astype("<f4")
            self.value = stored.astype(np.float64)
        elif dtype == "f16":
            stored = values.astype("<f2")
            self.value = stored.astype(np.float64)
        elif dtype == "bf16":
            rounded = bf16_round(values)
            stored = (rounded.view(np.uint32) >> 16).astype("<u2")
            self.value = rounded.astype(np.float64)
        else:
            stored = values.astype("<i4")
            self.value = stored.astype(np.int64)
        self.raw = stored.tobytes()

    def record(self):
        shape = list(self.shape) + [1] * (4 - len(self.shape))
        return struct.pack("<II4q", DTYPE[self.dtype], len(self.shape), *shape) + self.raw


# ---- the ops, in float64 ----

def softplus(x):
    return np.logaddexp(0.0, x)


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def l2norm(x, eps):
    """HF's l2norm: x * rsqrt(sum(x^2) + eps)."""
    return x / np.sqrt(np.sum(x * x) + eps)


def gated_delta(qkv, a, b, A, dt_bias, pos, seq, state, p):
    """torch_recurrent_gated_delta_rule, one row at a time, each row on its own slot's state;
    a row at position 0 starts from a zero state. qkv's rows hold q (Hk heads), k (Hk heads) and v
    (Hv heads) side by side. Value head h reads key head h // (Hv/Hk) (HF's repeat_interleave) or,
    with kv_tiled, h % Hk (llama.cpp's tiled order). Returns the output, the new state and the
    state of each row's sequence after that row."""
    hv, hk, dk, dv = p["n_heads"], p["n_kv_heads"], p["head_dim"], p["head_dim_v"]
    group = hv // hk
    q, k, v = qkv[:, :hk * dk], qkv[:, hk * dk:2 * hk * dk], qkv[:, 2 * hk * dk:]
    st = state.copy() if seq is not None else state.copy()[None]
    out = np.zeros((len(pos), hv * dv))
    rows = np.zeros((len(pos), hv, dk, dv))
    for t in range(len(pos)):
        s = seq[t] if seq is not None else 0
        if pos[t] == 0:
            st[s] = 0.0
        for h in range(hv):
            kh = h % hk if p.get("kv_tiled") else h // group
            qh = l2norm(q[t, kh * dk:(kh + 1) * dk], p["eps"]) * p["scale"]
            kvec = l2norm(k[t, kh * dk:(kh + 1) * dk], p["eps"])
            g = np.exp(A[h] * softplus(a[t, h] + dt_bias[h]))
            beta = sigmoid(b[t, h])
            S = st[s, h] * g                              # [Dk, Dv]
            kv_mem = (S * kvec[:, None]).sum(axis=0)      # S^T k
            delta = (v[t, h * dv:(h + 1) * dv] - kv_mem) * beta
            S = S + kvec[:, None] * delta[None, :]
            st[s, h] = S
            out[t, h * dv:(h + 1) * dv] = (S * qh[:, None]).sum(axis=0)
        rows[t] = st[s]
    return out, (st if seq is not None else st[0]), rows


def ssm_conv(x, w, pos, seq, state):
    """Causal depthwise conv1d with SiLU over each sequence's inputs, the K-1 before a call's
    first row of a sequence taken from the state (zeros when that row is at position 0), as HF's
    causal_conv1d_update fallback concatenates its conv_state with the new inputs."""
    t_len, c = x.shape
    k = w.shape[1]
    st = state.copy() if seq is not None else state.copy()[None]
    slot = seq if seq is not None else np.zeros(t_len, dtype=np.int64)
    out = np.zeros((t_len, c))
    rows = np.zeros((t_len, k - 1, c))
    for t in range(t_len):
        s = slot[t]
        if pos[t] == 0:
            st[s] = 0.0
        window = np.concatenate([st[s], x[t][None, :]], axis=0)   # [K, C]: u[p-K+1 .. p]
        out[t] = silu(np.sum(w.T * window, axis=0))
        st[s] = window[1:]
        rows[t] = st[s]
    return out, (st if seq is not None else st[0]), rows


def silu(x):
    return x / (1.0 + np.exp(-x))


def rope(x, pos, head_dim, rope_dims, theta, factors=None):
    """NeoX rotate-half on the first rope_dims values of each head (HF's partial rotary:
    q_rot, q_pass = q[..., :rotary_dim], q[..., rotary_dim:]), the rest passed through."""
    t, cols = x.shape
    rd = rope_dims or head_dim
    half = rd // 2
    inv_freq = theta ** (-np.arange(half, dtype=np.float64) * 2.0 / rd)
    if factors is not None:
        inv_freq = inv_freq / factors
    ang = pos[:, None].astype(np.float64) * inv_freq[None, :]
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    h = x.reshape(t, cols // head_dim, head_dim)
    x1, x2, rest = h[..., :half], h[..., half:rd], h[..., rd:]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest], axis=-1).reshape(t, cols)


# ---- cases ----

class Case:
    def __init__(self, op, name, params, weights, state):
        self.op, self.name, self.params = op, name, params
        self.weights, self.state = weights, state
        self.calls = []

    def encode(self):
        p = self.params
        name = self.name.encode()
        out = [struct.pack("<II", OPS[self.op], len(name)), name,
               struct.pack("<fffIIIIII", p.get("eps", 0.0), p.get("rope_theta", 0.0), p.get("scale", 0.0),
                           p.get("head_dim", 0), p.get("n_heads", 0), p.get("n_kv_heads", 0),
                           p.get("head_dim_v", 0), p.get("rope_dims", 0), p.get("kv_tiled", 0)),
               struct.pack("<I", p.get("state_rows", 0)),
               struct.pack("<I", len(self.weights))]
        out += [w.record() for w in self.weights]
        out.append(struct.pack("<I", 1 if self.state is not None else 0))
        if self.state is not None:
            out.append(self.state.record())
        out.append(struct.pack("<I", len(self.calls)))
        for order, acts, status, expect, rows in self.calls:
            out.append(struct.pack("<I", len(order)))
            out += [struct.pack("<II", kind, index) for kind, index in order]
            out.append(struct.pack("<I", len(acts)))
            out += [a.record() for a in acts]
            out.append(struct.pack("<i", status))
            if status == 0:
                out.append(Tensor(expect).record())
            if p.get("state_rows"):
                out.append(Tensor(rows).record())
        if self.state is not None:
            out.append(Tensor(self.final).record())
        return b"".join(out)


def uniform(rng, shape, lo=-1.0, hi=1.0):
    return rng.uniform(lo, hi, size=shape).astype(np.float32)


def gd_case(rng, name, hv, hk, dk, dv, slots, calls, wdt="f32", init_scale=0.5, tiled=0, state_rows=0):
    """calls: per call a list of (slot, position) rows, or (rows, status) for a call that must
    fail; slots None: one sequence (a state [Hv,Dk,Dv], no seq input)."""
    p = {"n_heads": hv, "n_kv_heads": hk, "head_dim": dk, "head_dim_v": dv, "eps": float(np.float32(1e-6)),
         "scale": float(np.float32(1.0 / np.sqrt(dk))), "kv_tiled": tiled, "state_rows": state_rows}
    # A = -exp(A_log) with A_log in [log 1, log 16] as Qwen3-Next draws it; dt_bias near 0
    A = Tensor(-np.exp(uniform(rng, (hv,), 0.0, np.log(16.0))), wdt)
    dt_bias = Tensor(uniform(rng, (hv,), -1.0, 1.0), wdt)
    shape = (hv, dk, dv) if slots is None else (slots, hv, dk, dv)
    state = Tensor(uniform(rng, shape) * init_scale)
    case = Case("gated_delta", name, p, [A, dt_bias], state)
    cur = state.value
    for call in calls:
        rows, status = (call, 0) if not isinstance(call, tuple) else call
        t = len(rows)
        qkv = Tensor(uniform(rng, (t, 2 * hk * dk + hv * dv)))
        a = Tensor(uniform(rng, (t, hv), -3.0, 3.0))
        b = Tensor(uniform(rng, (t, hv), -3.0, 3.0))
        pos = Tensor(np.array([r[1] for r in rows]), "i32")
        acts = [qkv, a, b, pos]
        order = [(ACT, 0), (ACT, 1), (ACT, 2), (WEIGHT, 0), (WEIGHT, 1), (ACT, 3), (STATE, 0)]
        seq = None
        if slots is not None:
            seq = np.array([r[0] for r in rows])
            acts.append(Tensor(seq, "i32"))
            order.append((ACT, 4))
        expect, rows_after = None, np.zeros((t, hv, dk, dv))
        if status == 0:
            expect, cur, rows_after = gated_delta(qkv.value, a.value, b.value, A.value, dt_bias.value, pos.value, seq,
                                                  cur, p)
        if state_rows:
            order.append((ROWS, 0))
        case.calls.append((order, acts, status, expect, rows_after))
    case.final = cur
    return case


def conv_case(rng, name, c, k, slots, calls, wdt="f32", state_rows=0):
    w = Tensor(uniform(rng, (c, k)), wdt)
    shape = (k - 1, c) if slots is None else (slots, k - 1, c)
    init = uniform(rng, shape).reshape(-1, k - 1, c)
    # A state holds zeros for positions below 0 (u there is zero, and an engine's state says so):
    # zero them for a slot whose first row comes at a position p0 in (0, K-1).
    first = {}
    for call in calls:
        for slot, p0 in (call if not isinstance(call, tuple) else call[0]):
            first.setdefault(slot or 0, p0)
    for slot, p0 in first.items():
        if 0 < p0 < k - 1 and 0 <= slot < len(init):
            init[slot, :k - 1 - p0] = 0.0
    state = Tensor(init.reshape(shape))
    case = Case("ssm_conv", name, {"state_rows": state_rows}, [w], state)
    cur = state.value
    for call in calls:
        rows, status = (call, 0) if not isinstance(call, tuple) else call
        x = Tensor(uniform(rng, (len(rows), c), -2.0, 2.0))
        pos = Tensor(np.array([r[1] for r in rows]), "i32")
        acts, order, seq = [x, pos], [(ACT, 0), (WEIGHT, 0), (ACT, 1), (STATE, 0)], None
        if slots is not None:
            seq = np.array([r[0] for r in rows])
            acts.append(Tensor(seq, "i32"))
            order.append((ACT, 2))
        expect, rows_after = None, np.zeros((len(rows), k - 1, c))
        if status == 0:
            expect, cur, rows_after = ssm_conv(x.value, w.value, pos.value, seq, cur)
        if state_rows:
            order.append((ROWS, 0))
        case.calls.append((order, acts, status, expect, rows_after))
    case.final = cur
    return case


def one(start, n, slot=None):
    return [(slot, p) for p in range(start, start + n)]


def cases():
    rng = np.random.default_rng(SEED)
    out = []
    # One sequence: a prompt in one call (40 rows: the chunk-parallel form, one short chunk), then
    # decode rows, then a prompt chunk of 150 rows (64 + 64 + 22) continuing the state.
    out.append(gd_case(rng, "gd one call T=40, decode, T=150", 4, 2, 16, 24, None,
                       [one(0, 40), one(40, 1), one(41, 1), one(42, 150)]))
    # The same kind of prompt split over calls of 7, 1, 13 and 19 rows, state carried
    out.append(gd_case(rng, "gd split 7+1+13+19", 4, 2, 16, 24, None,
                       [one(0, 7), one(7, 1), one(8, 13), one(21, 19)]))
    # Starting from a given state at position 37 (no reset), the chunked form over 130 rows;
    # Dk = Dv = 128 as the models have, GQA 2:1
    out.append(gd_case(rng, "gd from state p0=37 T=130 Dk=Dv=128", 2, 1, 128, 128, None, [one(37, 130)]))
    # A row at position 0 resets a non-zero state
    out.append(gd_case(rng, "gd reset at 0", 2, 2, 8, 8, None, [one(0, 3), one(0, 2)], init_scale=3.0))
    # Slots: rows of three slots interleaved in any order (slot 2 starts over at position 0, the
    # others continue), then one slot's prompt of 70 rows among decode rows of others (the slot
    # form runs it row by row, whatever its length)
    inter = [(2, 0), (0, 5), (2, 1), (1, 9), (0, 6), (0, 7), (2, 2)]
    mixed = [(1, 10)] + one(3, 35, 2)[:20] + [(0, 8)] + one(3, 35, 2)[20:] + one(38, 35, 2) + [(1, 11)]
    out.append(gd_case(rng, "gd slots interleaved", 4, 1, 16, 8, 3, [inter, mixed]))
    # llama.cpp's tiled order of value heads (value head h reads key head h % Hk): 6 value heads
    # over 3 key heads, where the two mappings differ for every head but 0 and 5, in both forms
    out.append(gd_case(rng, "gd kv_tiled 6 over 3", 6, 3, 16, 16, None, [one(0, 20), one(20, 1)], tiled=1))
    # BF16 and F16 weights A and dt_bias
    out.append(gd_case(rng, "gd bf16 weights", 4, 2, 16, 16, 2, [[(0, 0), (1, 4), (0, 1)] + one(2, 20, 0)],
                       wdt="bf16"))
    out.append(gd_case(rng, "gd f16 weights", 2, 1, 16, 16, None, [one(0, 5)], wdt="f16"))
    # Bad calls change nothing: positions not consecutive within a slot (a gap, a repeat, a
    # step back), a slot out of range, a negative position; then a good call
    out.append(gd_case(rng, "gd bad calls", 2, 1, 8, 8, 2,
                       [([(0, 4), (1, 0), (0, 6)], E_INVALID), ([(0, 4), (0, 4)], E_INVALID),
                        ([(1, 3), (1, 2)], E_INVALID), ([(0, 1), (2, 0)], E_RANGE), ([(0, 1), (-1, 0)], E_RANGE),
                        ([(1, -1)], E_RANGE), [(0, 4), (1, 0), (0, 5)]]))
    out.append(gd_case(rng, "gd bad call one sequence", 2, 1, 8, 8, None,
                       [([(None, 3), (None, 5)], E_INVALID), one(3, 2)]))

    # SSM_CONV: prompt in one call then decode, the same split over calls, slots interleaved,
    # a first row at position 1 and 2 (< K-1: the state's rows for negative positions are zero
    # there, as an engine leaves them), BF16 and F16 kernels, bad calls.
    out.append(conv_case(rng, "conv one call T=20, decode", 24, 4, None, [one(0, 20), one(20, 1), one(21, 1)]))
    out.append(conv_case(rng, "conv split 3+1+2+9", 24, 4, None, [one(0, 3), one(3, 1), one(4, 2), one(6, 9)],
                         wdt="bf16"))
    out.append(conv_case(rng, "conv slots interleaved", 16, 4, 3,
                         [[(1, 7), (0, 0), (2, 30), (1, 8), (0, 1), (2, 31), (2, 32)], [(0, 2), (1, 0), (1, 1)]],
                         wdt="f16"))
    out.append(conv_case(rng, "conv K=2 from p0=5", 8, 2, None, [one(5, 4)]))
    out.append(conv_case(rng, "conv bad calls", 8, 3, 2,
                         [([(0, 3), (0, 5)], E_INVALID), ([(3, 0)], E_RANGE), ([(0, -2)], E_RANGE), one(3, 2, 0)]))
    out.append(conv_case(rng, "conv first rows at p=1, 2 (< K-1)", 8, 4, 2, [[(0, 1), (1, 2), (0, 2)]]))

    # ABI 1.7 state rows: each row's state as it is after that row, one sequence (a verification
    # of 4 rows, a decode row, and 20 rows, which without state rows would be chunk-parallel) and
    # slots interleaved, with a reset at position 0 inside a call and a call that must fail
    out.append(gd_case(rng, "gd state rows one sequence", 4, 2, 16, 24, None,
                       [one(0, 4), one(4, 1), one(5, 20)], state_rows=1))
    out.append(gd_case(rng, "gd state rows slots", 4, 1, 16, 8, 3,
                       [[(2, 0), (0, 5), (2, 1), (1, 9), (0, 6)], ([(0, 7), (0, 9)], E_INVALID),
                        [(1, 10), (0, 0), (0, 1), (2, 2)]], state_rows=1))
    out.append(conv_case(rng, "conv state rows one sequence", 24, 4, None, [one(0, 3), one(3, 1), one(4, 9)],
                         state_rows=1))
    out.append(conv_case(rng, "conv state rows slots", 16, 4, 3,
                         [[(1, 7), (0, 0), (2, 30), (1, 8), (0, 1)], ([(3, 0)], E_RANGE), [(0, 2), (1, 0)]],
                         wdt="bf16", state_rows=1))
    return out + rope_cases(rng) + [sigmoid_case(rng)]


def rope_cases(rng):
    out = []
    for t, heads, d, rd, theta, with_ff in [(3, 2, 32, 8, 1e4, False), (4, 3, 64, 16, 1e7, True),
                                            (2, 2, 16, 16, 1e4, False), (5, 1, 256, 64, 1e7, False)]:
        x = Tensor(uniform(rng, (t, heads * d)))
        pos = Tensor(np.array([0, 7, 1000, 65535, 3][:t]), "i32")
        theta32 = float(np.float32(theta))
        p = {"head_dim": d, "rope_dims": rd, "rope_theta": theta32}
        acts, order, ff = [x, pos], [(ACT, 0), (ACT, 1)], None
        weights = []
        if with_ff:
            ff = Tensor(uniform(rng, (rd // 2,), 1.0, 8.0))
            weights.append(ff)
            order.append((WEIGHT, 0))
        case = Case("rope", f"rope T={t} heads={heads} D={d} rope_dims={rd}{' factors' if with_ff else ''}", p,
                    weights, None)
        case.calls.append((order, acts, 0, rope(x.value, pos.value, d, rd, theta32, ff.value if ff else None), None))
        out.append(case)
    return out


def sigmoid_case(rng):
    x = Tensor(uniform(rng, (5, 48), -4.0, 4.0))
    g = Tensor(uniform(rng, (5, 48), -12.0, 12.0))
    case = Case("sigmoid_mul", "sigmoid_mul T=5 C=48", {}, [], None)
    case.calls.append(([(ACT, 0), (ACT, 1)], [x, g], 0, x.value * sigmoid(g.value), None))
    return case


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    data = [b"RLXHYB3\0"]
    all_cases = cases()
    data.append(struct.pack("<I", len(all_cases)))
    data += [c.encode() for c in all_cases]
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    tmp = args.out + ".tmp"
    with open(tmp, "wb") as f:
        f.write(b"".join(data))
    os.replace(tmp, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
