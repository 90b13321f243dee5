#!/usr/bin/python3
"""rlx's row quantizers (through quant_probe) against tests/gguf/gguf_ref.py:
- Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 (and F16, BF16): the same bytes as gguf_ref.quantize, which
  reproduces ggml's reference quantizers, on random rows (normal, uniform, heavy-tailed, with
  zero blocks and ties) and on real rows of the Brown draft (its F32 GGUF when present);
- Q4_K, Q5_K, Q6_K: every value dequantizes to within half a step of its block's own grid (plus
  how far it lies outside the grid's range), and the RMS error is far below the simple types'.

  check_quantizers.py --probe BIN --workdir DIR [--shared DIR]
"""
import argparse
import os
import subprocess
import sys

import numpy as np

from qutil import gguf_ref as g, verdict

SIMPLE = {"q4_0": g.Q4_0, "q4_1": g.Q4_1, "q5_0": g.Q5_0, "q5_1": g.Q5_1, "q8_0": g.Q8_0, "f16": g.F16,
          "bf16": g.BF16}
K = {"q4_k": g.Q4_K, "q5_k": g.Q5_K, "q6_k": g.Q6_K}


def probe(args, name, x):
    src, dst = os.path.join(args.workdir, "in.f32"), os.path.join(args.workdir, "out.bin")
    x.astype("<f4").tofile(src)
    subprocess.run([args.probe, name, src, dst], check=True)
    with open(dst, "rb") as f:
        return f.read()


def rows(args):
    rng = np.random.default_rng(7)
    out = [("normal", rng.standard_normal(256 * 64).astype(np.float32) * 0.02),
           ("uniform", rng.uniform(-1, 1, 256 * 64).astype(np.float32)),
           ("heavy", (rng.standard_t(2, 256 * 64) * 0.01).astype(np.float32))]
    z = rng.standard_normal(256 * 8).astype(np.float32)
    z[:256] = 0  # a zero block
    z[256:512] = 0.5  # a constant block (ties everywhere)
    z[512:768] = np.abs(z[512:768])  # all positive
    z[768:1024] = -np.abs(z[768:1024])  # all negative
    out.append(("edge", z))
    f32 = os.path.join(args.shared or "", "brown-draft-f32.gguf")
    if args.shared and os.path.exists(f32):
        gf = g.read(f32)
        for name in ("blk.0.attn_q.weight", "blk.1.ffn_down.weight", "token_embd.weight"):
            out.append((name, gf.tensor(name).ravel()[: 256 * 256].astype(np.float32)))
    else:
        print("note: no brown-draft-f32.gguf; real rows skipped")
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--probe", required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--shared")
    args = ap.parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    failures = []
    for what, x in rows(args):
        for name, tid in SIMPLE.items():
            ours, ref = probe(args, name, x), g.quantize(tid, x)
            if ours != ref:
                a, b = np.frombuffer(ours, np.uint8), np.frombuffer(ref, np.uint8)
                bad = np.flatnonzero(a != b) if len(a) == len(b) else [-1]
                failures.append(f"{what}: {name}: bytes differ from gguf_ref.quantize (first at byte {bad[0]})")
        simple_rms = np.sqrt(np.mean((g.DEQUANTIZERS[g.Q4_0](g.quantize(g.Q4_0, x)) - x) ** 2))
        for name, tid in K.items():
            raw = probe(args, name, x)
            y = g.DEQUANTIZERS[tid](raw)
            step, off, lo, hi = g.quant_grid(tid, raw)
            lo_v, hi_v = off + step * lo, off + step * hi
            outside = np.maximum(0, np.maximum(lo_v - x, x - hi_v))
            bound = 0.5 * np.abs(step) + outside
            err = np.abs(y - x)
            over = err > bound * (1 + 1e-4) + 1e-7 * (np.abs(x) + 1e-30)
            if over.any():
                i = int(np.flatnonzero(over)[0])
                failures.append(f"{what}: {name}: element {i} error {err[i]:.3g} exceeds its bound {bound[i]:.3g}")
            rms = np.sqrt(np.mean((y - x) ** 2))
            if what != "edge" and not rms < simple_rms:
                failures.append(f"{what}: {name}: RMS {rms:.3g} not below Q4_0's {simple_rms:.3g}")
            print(f"{what:24s} {name}: RMS {rms:.4g} (Q4_0 {simple_rms:.4g}), max error/bound {np.max(err / np.maximum(bound, 1e-30)):.3f}")
    return verdict(failures)


if __name__ == "__main__":
    sys.exit(main())
