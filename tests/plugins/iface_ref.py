"""Expected F16/BF16 conversions for test_iface, computed by NumPy and float64 arithmetic rather
than by the C under test.

Writes lines
  h HHHH FFFFFFFF          F16 bits -> the F32 bits NumPy widens them to (all 65536 values)
  f FFFFFFFF HHHH BBBB     F32 bits -> F16 bits (NumPy's astype(float16)) and BF16 bits
BF16 is rounded by choosing, in float64, the nearer of the two BF16 neighbours of x (ties to
the even one), which is the definition of round-to-nearest-even, not the bit trick the header
uses. NaN inputs are quiet NaNs only: for those every correct conversion agrees on the bits
(the header's NaN rule for signalling NaNs is checked by hand-written cases in test_iface.c)."""
import argparse
import os

import numpy as np


def f32_cases(rng):
    parts = [rng.integers(0, 1 << 32, 40000, dtype=np.uint64).astype(np.uint32)]
    # every F16 value, and the points halfway between F16 neighbours, plus or minus one F32 ulp
    h = np.arange(0, 0x7c00, dtype=np.uint16).view(np.float16).astype(np.float32)
    mid = ((h[:-1].astype(np.float64) + h[1:].astype(np.float64)) / 2).astype(np.float32)
    for v in (h, mid):
        b = v.view(np.uint32)
        near = rng.choice(b, 4000)
        parts += [b, near + 1, near - 1]
    # F32 values near the F16 limits: overflow to infinity, the subnormal range, underflow
    for lo, hi in ((0x477fe000, 0x47800100), (0x33000000 - 64, 0x33000000 + 64), (0x38800000 - 4096, 0x38800000 + 64)):
        parts.append(np.arange(lo, hi, 7, dtype=np.uint64).astype(np.uint32))
    # F32 values whose low 16 bits are exactly half a BF16 ulp (ties), both parities
    parts.append((rng.integers(0, 1 << 16, 4000, dtype=np.uint64).astype(np.uint32) << 16) | 0x8000)
    special = [0, 0x80000000, 1, 0x807fffff, 0x7f7fffff, 0xff7fffff, 0x7f800000, 0xff800000, 0x7fc00000, 0xffc12345,
               0x477ff000, 0x477fefff, 0x33000000, 0x33000001, 0x38800000, 0x387fffff]
    parts.append(np.array(special, dtype=np.uint32))
    b = np.unique(np.concatenate(parts).astype(np.uint32))
    nan = (b & 0x7f800000) == 0x7f800000
    nan &= (b & 0x7fffff) != 0
    return np.concatenate([b[~nan], b[nan] | 0x400000])


def to_bf16(b):
    x = b.view(np.float32).astype(np.float64)
    lo = b & np.uint32(0xffff0000)  # toward zero
    hi = lo + np.uint32(0x10000)    # away from zero (the next BF16 up in magnitude)
    lo_v = lo.view(np.float32).astype(np.float64)
    hi_v = hi.view(np.float32).astype(np.float64)
    inf_next = (hi & 0x7f800000) == 0x7f800000  # hi is infinity: its stand-in value is 2^128
    hi_v = np.where(inf_next, np.copysign(2.0**128, x), hi_v)
    d_lo, d_hi = np.abs(x - lo_v), np.abs(hi_v - x)
    lo_even = ((lo >> 16) & 1) == 0
    pick_hi = (d_hi < d_lo) | ((d_hi == d_lo) & ~lo_even)
    out = np.where(pick_hi, hi, lo) >> 16
    nan = np.isnan(x)
    return np.where(nan, b >> 16, out).astype(np.uint16)  # quiet NaNs: the upper half


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    rng = np.random.default_rng(12)
    h = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    widened = h.view(np.float16).astype(np.float32).view(np.uint32)
    b = f32_cases(rng)
    with np.errstate(over="ignore", invalid="ignore"):
        f16 = b.view(np.float32).astype(np.float16).view(np.uint16)
    with np.errstate(invalid="ignore"):
        bf16 = to_bf16(b)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        for x, y in zip(h, widened):
            f.write(f"h {x:04x} {y:08x}\n")
        for x, y, z in zip(b, f16, bf16):
            f.write(f"f {x:08x} {y:04x} {z:04x}\n")


if __name__ == "__main__":
    main()
