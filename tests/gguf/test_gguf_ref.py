"""Self-test of gguf_ref.py on the llama.cpp-written files of GGUF_DIR (/work/shared/gguf), and
on the broken files of make_bad_gguf.py.

  python3 tests/gguf/test_gguf_ref.py GGUF_DIR     exit 0 when every check passes, 77 (skipped)
                                                   when GGUF_DIR does not exist (1 under CI=true)

What is checked, and why it is evidence:
1. Every file parses and passes gguf_ref.check_model (qwen3, shapes from the metadata); the draft
   files agree on tensor names and dims; every tensor of every file dequantizes to finite values.
2. The BF16 draft widened equals the F32 draft exactly where the F32 value is a BF16 value
   (the test reports how many are; for these files all are, the models were trained in BF16).
3. Each quantized draft tensor against the BF16 draft, which is what llama-quantize read (its
   README): llama.cpp's reference quantizers pick, for every element, the grid point nearest to
   the input among the grid the block's own scales define (Q4_K: d*sc*k - dmin*m, k in 0..15;
   Q6_K: d*sc*k, k in -32..31; Q8_0: d*k ...), clamping at the ends. So with g the nearest grid
   point computed here from the block's scales, |dequant - x| <= |g - x| + tol must hold for
   every element, where tol covers float rounding and, for Q4_0/Q4_1/Q5_0/Q5_1/Q8_0 whose
   quantizers round with the unrounded f32 scale but store it as f16, 2*qmax*half-ulp(f16 d)
   (+ 2*half-ulp(f16 m)). This is a per-element form of "half a step of the sub-block", which
   also covers values the quantizer had to clamp (a sub-block min or scale rounded to 6 bits).
   Tensors stored F32 or BF16 in a quantized file must equal the BF16 draft exactly; F16 ones
   within half an f16 ulp.
   gguf_ref.quantize must reproduce llama.cpp's bytes for every Q4_0, Q8_0 and BF16 tensor, and
   it makes Q4_1/Q5_0/Q5_1 copies of a few tensors so that those decoders (no file here has
   them) go through the same bound.
4. Relative RMS error (rms(dequant - x) / rms(x)) per tensor below a per-type threshold; a table
   per type is printed.
5. Mutation check: copies of gguf_ref's source with one detail flipped (nibble order, scale
   unpacking, high-bit positions, signedness, zero point, sign of the min) are loaded as modules
   and must FAIL check 3 on some tensor of the affected type. A check that passes a wrong
   decoder would prove nothing.
6. Every file of make_bad_gguf.py is rejected by read() or check_model() with a message holding
   the words bad_gguf_cases.json lists, and valid_tiny.gguf is accepted.
"""
import importlib.util
import os
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import gguf_ref as G  # noqa: E402
import make_bad_gguf  # noqa: E402
from gguf_common import missing_input  # noqa: E402

DRAFT_QUANTS = ["q8_0", "q6_k", "q5_k_m", "q4_k_m", "q4_k_s", "q4_0"]
# relative RMS limits, a little above what llama.cpp's quantizers reach on these models
RMS_LIMIT = {"Q8_0": 0.006, "Q6_K": 0.02, "Q5_K": 0.04, "Q5_0": 0.05, "Q5_1": 0.045,
             "Q4_K": 0.08, "Q4_0": 0.10, "Q4_1": 0.09, "F16": 0.001, "BF16": 0.0, "F32": 0.0}
# quantizers that round with the f32 scale but store it as f16 (ggml's quantize_row_*_ref)
UNROUNDED_SCALE = {G.Q4_0, G.Q4_1, G.Q5_0, G.Q5_1, G.Q8_0}

failures = []


def fail(msg):
    failures.append(msg)
    print("FAIL: " + msg)


def f16_half_ulp(v):
    """Half an f16 ulp at |v| (2^-25 in the subnormal range): how far an f32 scale can be from
    the f16 it was stored as."""
    a = np.abs(v).astype(np.float64)
    return np.maximum(a * 2.0 ** -11, 2.0 ** -25)


def grid_excess(type_id, raw, x, y, module=G):
    """Per element: |y - x| - (|g - x| + tol), g the grid point nearest to x (see docstring 3);
    positive means y is farther from x than the quantizer's choice can be. Also returns how far
    y is from x in steps, and which elements lie outside the grid's range."""
    step, off, qlo, qhi = module.quant_grid(type_id, raw)
    step = step.astype(np.float64)
    off = off.astype(np.float64)
    x = x.astype(np.float64).ravel()
    y = y.astype(np.float64).ravel()
    with np.errstate(divide="ignore", invalid="ignore"):
        k = np.where(step != 0, np.rint((x - off) / np.where(step != 0, step, 1)), qlo)
    k = np.clip(k, qlo, qhi)
    g = step * k + off
    qmax = max(abs(qlo), abs(qhi))
    tol = 2.0 ** -21 * (np.abs(x) + np.abs(off) + np.abs(step) * qmax)
    if type_id in UNROUNDED_SCALE:
        tol += 2 * qmax * f16_half_ulp(step)
        if type_id in (G.Q4_1, G.Q5_1):
            tol += 2 * f16_half_ulp(off)
    lo = np.minimum(step * qlo, step * qhi) + off
    hi = np.maximum(step * qlo, step * qhi) + off
    outside = (x < lo - tol) | (x > hi + tol)
    with np.errstate(divide="ignore", invalid="ignore"):
        in_steps = np.where(step != 0, np.abs(y - x) / np.abs(step), 0)
    return np.abs(y - x) - (np.abs(g - x) + tol), in_steps, outside


def check_tensor(type_id, raw, x, y, name, module=G, quiet=False):
    """True when y (the dequantized tensor) is within the block-derived bound of x."""
    if type_id in (G.F32, G.BF16):
        ok = np.array_equal(x.ravel(), y.ravel())
        if not ok and not quiet:
            fail("%s: %s tensor differs from the BF16 source" % (name, G.type_name(type_id)))
        return ok, None
    if type_id == G.F16:
        ok = bool(np.all(np.abs(y.ravel().astype(np.float64) - x.ravel()) <= f16_half_ulp(x.ravel()) * 1.0000001))
        if not ok and not quiet:
            fail("%s: F16 tensor is more than half an f16 ulp from the source" % name)
        return ok, None
    excess, in_steps, outside = grid_excess(type_id, raw, x, y, module)
    bad = excess > 0
    if bad.any() and not quiet:
        i = int(np.argmax(excess))
        fail("%s (%s): %d elements beyond the bound, worst at flat index %d: x=%r y=%r excess %.3g" % (
            name, G.type_name(type_id), int(bad.sum()), i, float(x.ravel()[i]), float(y.ravel()[i]), float(excess[i])))
    inside = ~outside
    stats = {"max_steps_inside": float(in_steps[inside].max()) if inside.any() else 0.0,
             "outside": int(outside.sum()), "n": int(x.size)}
    return not bad.any(), stats


def rel_rms(x, y):
    x = x.astype(np.float64)
    den = np.sqrt(np.mean(x * x))
    return float(np.sqrt(np.mean((y.astype(np.float64) - x) ** 2)) / den) if den else 0.0


def load_mutant(old, new):
    """A copy of gguf_ref with one source detail changed, as a separate module."""
    src = open(os.path.join(HERE, "gguf_ref.py")).read()
    if src.count(old) != 1:
        raise AssertionError("mutation anchor not found exactly once in gguf_ref.py: %r" % old)
    spec = importlib.util.spec_from_loader("gguf_mutant", loader=None)
    mod = importlib.util.module_from_spec(spec)
    exec(compile(src.replace(old, new), "gguf_mutant", "exec"), mod.__dict__)
    return mod


MUTATIONS = [
    ("nibble order swapped (element j in the high nibble)",
     "return qs & 0x0F, qs >> 4", "return qs >> 4, qs & 0x0F",
     {G.Q4_0, G.Q4_1, G.Q5_0, G.Q5_1, G.Q4_K, G.Q5_K, G.Q6_K}),
    ("K scales 4-7: top bits taken from the min bytes",
     "sc[..., 4:] = (s[..., 8:12] & 0x0F) | ((s[..., 0:4] >> 6) << 4)",
     "sc[..., 4:] = (s[..., 8:12] & 0x0F) | ((s[..., 4:8] >> 6) << 4)", {G.Q4_K, G.Q5_K}),
    ("K mins 4-7: low bits from the low nibble",
     "mn[..., 4:] = (s[..., 8:12] >> 4)", "mn[..., 4:] = (s[..., 8:12] & 0x0F)", {G.Q4_K, G.Q5_K}),
    ("K scales: each sub-block uses its neighbour's scale",
     "return d * sc.astype(np.float32), dmin", "return d * np.roll(sc, 1, axis=-1).astype(np.float32), dmin",
     {G.Q4_K, G.Q5_K}),
    ("K types: sub-block min added instead of subtracted",
     "q.astype(np.float32) - m1[:, :, None]", "q.astype(np.float32) + m1[:, :, None]", {G.Q4_K, G.Q5_K}),
    ("Q5_K: fifth bits of sub-block pairs swapped",
     ">> np.arange(8, dtype=np.uint8)[None, :, None]) & 1",
     ">> (np.arange(8, dtype=np.uint8)[None, :, None] ^ 1)) & 1", {G.Q5_K}),
    ("Q6_K: second quarter takes qh bits 6-7",
     "lo[..., 32:] | (((qh >> 2) & 3) << 4)", "lo[..., 32:] | (((qh >> 6) & 3) << 4)", {G.Q6_K}),
    ("Q6_K: scales read unsigned",
     "sc = b[:, 192:208].view(np.int8)", "sc = b[:, 192:208].view(np.uint8)", {G.Q6_K}),
    ("Q8_0: quants read unsigned",
     "q = b[:, 2:34].view(np.int8)", "q = b[:, 2:34].view(np.uint8)", {G.Q8_0}),
    ("Q5_0/Q5_1: element j takes the fifth bit of element j+16",
     "return ((qh >> np.arange(32, dtype=np.uint32)) & 1)",
     "return ((qh >> (np.arange(32, dtype=np.uint32) ^ 16)) & 1)", {G.Q5_0, G.Q5_1}),
    ("Q4_1: min subtracted instead of added",
     "return (q * d + m).ravel()\n\n\ndef _q5_high_bits",
     "return (q * d - m).ravel()\n\n\ndef _q5_high_bits", {G.Q4_1}),
    ("Q4_0: zero point 7 instead of 8",
     "q = np.concatenate([lo, hi], axis=1).astype(np.int32) - 8",
     "q = np.concatenate([lo, hi], axis=1).astype(np.int32) - 7", {G.Q4_0}),
]


def main(gguf_dir):
    if not os.path.isdir(gguf_dir):
        # the llama.cpp files live beside the checkout (CI clones it next to `shared`); without
        # them there is nothing to check the reference against: a skip, a failure in CI
        return missing_input("no llama.cpp GGUF files (%s is missing)" % gguf_dir)
    paths = sorted(os.path.join(gguf_dir, f) for f in os.listdir(gguf_dir) if f.endswith(".gguf"))
    needed = ["brown-draft-%s.gguf" % q for q in ["f32", "bf16"] + DRAFT_QUANTS]
    missing = [n for n in needed if not os.path.exists(os.path.join(gguf_dir, n))]
    if missing:
        print("FAIL: %s lacks %s" % (gguf_dir, ", ".join(missing)))
        return 1
    files = {}
    for p in paths:
        try:
            g = G.read(p)
            G.check_model(g)
        except ValueError as e:
            fail("%s: %s" % (os.path.basename(p), e))
            continue
        files[os.path.basename(p)] = g
        for t in g.tensors:
            v = g.tensor(t.name)
            if not np.all(np.isfinite(v)):
                fail("%s: %s has non-finite values" % (p, t.name))
    print("parsed %d files; metadata keys of the draft q4_k_m: %s" % (
        len(files), ", ".join(files["brown-draft-q4_k_m.gguf"].metadata)))

    f32 = files["brown-draft-f32.gguf"]
    bf16 = files["brown-draft-bf16.gguf"]
    names = [t.name for t in f32.tensors]
    for name, g in files.items():
        if not name.startswith("brown-draft-"):
            continue
        if sorted(t.name for t in g.tensors) != sorted(names):
            fail("%s: tensor names differ from the F32 draft" % name)
        for t in g.tensors:
            if t.name in f32.tensor_by_name and t.dims != f32.tensor_by_name[t.name].dims:
                fail("%s: %s dims %s differ from the F32 draft" % (name, t.name, t.dims))

    # 2. BF16 against F32
    n_repr = n_all = 0
    for name in names:
        x = f32.tensor(name)
        y = bf16.tensor(name)
        repr_ = (x.view(np.uint32) & 0xFFFF) == 0
        n_repr += int(repr_.sum())
        n_all += x.size
        if not np.array_equal(x[repr_], y[repr_]):
            fail("BF16 draft %s differs from F32 where F32 is a BF16 value" % name)
    print("BF16 vs F32 draft: %d of %d F32 values are BF16 values; all of those equal after widening: %s" % (
        n_repr, n_all, "yes" if not any("BF16 draft" in f for f in failures) else "NO"))
    source = {name: bf16.tensor(name) for name in names}

    # gguf_ref's own quantizers (for crafting files) must reproduce llama-quantize's bytes
    n_exact = 0
    for q in DRAFT_QUANTS + ["bf16"]:
        g = files["brown-draft-%s.gguf" % q]
        for t in g.tensors:
            if t.type in (G.Q4_0, G.Q8_0, G.BF16):
                n_exact += 1
                if G.quantize(t.type, f32.tensor(t.name)) != g.raw(t.name):
                    fail("gguf_ref.quantize(%s) of %s differs from llama.cpp's bytes in %s" % (t.type_name, t.name, q))
    print("gguf_ref.quantize reproduces llama.cpp's bytes for all %d Q4_0/Q8_0/BF16 draft tensors: %s" % (
        n_exact, "yes" if not any("llama.cpp's bytes" in f for f in failures) else "NO"))

    # 3, 4. quantized drafts against the BF16 source; plus the types no file here holds
    # (Q4_1, Q5_0, Q5_1), made by gguf_ref.quantize from a few source tensors
    cases = []  # (label, type id, raw bytes, source values)
    for q in DRAFT_QUANTS:
        g = files["brown-draft-%s.gguf" % q]
        for t in g.tensors:
            cases.append(("%s %s" % (q, t.name), t.type, g.raw(t.name), source[t.name], q))
    for name in ("token_embd.weight", "blk.0.ffn_down.weight", "blk.3.attn_q.weight", "blk.1.attn_v.weight"):
        for ty in (G.Q4_1, G.Q5_0, G.Q5_1):
            raw = G.quantize(ty, source[name])
            cases.append(("made %s %s" % (G.type_name(ty), name), ty, raw, source[name], "made"))
    rms_by_type, step_stats = {}, {}
    for label, ty, raw, x, origin in cases:
        tn = G.type_name(ty)
        info = G.TensorInfo(label, tuple(reversed(x.shape)), ty, 0, len(raw), 0)
        y = G.dequantize(info, raw)
        ok, stats = check_tensor(ty, raw, x, y, label)
        r = rel_rms(x, y)
        rms_by_type.setdefault(tn, []).append((r, origin, label))
        if r > RMS_LIMIT[tn]:
            fail("%s (%s): relative RMS error %.4g above %.4g" % (label, tn, r, RMS_LIMIT[tn]))
        if stats:
            s = step_stats.setdefault(tn, {"max_steps_inside": 0.0, "outside": 0, "n": 0})
            s["max_steps_inside"] = max(s["max_steps_inside"], stats["max_steps_inside"])
            s["outside"] += stats["outside"]
            s["n"] += stats["n"]
    print("\nrelative RMS error per type (quantized tensors against the BF16 draft; Q4_1/Q5_0/Q5_1 made here)")
    print("%-5s %7s %10s %10s %10s %8s %14s %16s" % ("type", "tensors", "min", "mean", "max", "limit",
                                                   "max|err|/step", "outside grid"))
    for tn in sorted(rms_by_type):
        rs = np.array([r for r, _, _ in rms_by_type[tn]])
        s = step_stats.get(tn)
        print("%-5s %7d %10.3g %10.3g %10.3g %8.3g %14s %16s" % (
            tn, len(rs), rs.min(), rs.mean(), rs.max(), RMS_LIMIT[tn],
            "%.4f" % s["max_steps_inside"] if s else "-",
            "%d/%d" % (s["outside"], s["n"]) if s else "-"))
    per_file = {}
    for tn, lst in rms_by_type.items():
        for r, origin, _ in lst:
            per_file.setdefault(origin, []).append(r)
    print("mean relative RMS over all tensors of each file: " + ", ".join(
        "%s %.4g" % (q, np.mean(per_file[q])) for q in DRAFT_QUANTS))

    # 5. mutants must fail check 3
    print("\nmutation check (each wrong decoder must fail the bound on some tensor)")
    for label, old, new, types in MUTATIONS:
        mod = load_mutant(old, new)
        caught = tried = 0
        for clabel, ty, raw, x, _ in cases:
            if ty not in types:
                continue
            tried += 1
            info = mod.TensorInfo(clabel, tuple(reversed(x.shape)), ty, 0, len(raw), 0)
            ok, _ = check_tensor(ty, raw, x, mod.dequantize(info, raw), clabel, quiet=True)
            caught += not ok
        verdict = "caught" if caught else "NOT CAUGHT"
        print("  %-58s %s on %d of %d tensors" % (label, verdict, caught, tried))
        if not tried or not caught:
            fail("mutation '%s' passes the bound check" % label)

    # 6. broken files
    print("\nbroken files (make_bad_gguf.py)")
    with tempfile.TemporaryDirectory() as tmp:
        cases = make_bad_gguf.make_all(tmp)
        try:
            G.check_model(G.read(os.path.join(tmp, "valid_tiny.gguf")))
        except ValueError as e:
            fail("valid_tiny.gguf rejected: %s" % e)
        # version 2 has version 3's layout: the same bytes with version 2 must read the same
        blob = bytearray(open(os.path.join(tmp, "valid_tiny.gguf"), "rb").read())
        g3 = G.parse(bytes(blob))
        blob[4:8] = (2).to_bytes(4, "little")
        g2 = G.parse(bytes(blob))
        if (g2.version, g2.metadata, [repr(t) for t in g2.tensors]) != (2, g3.metadata, [repr(t) for t in g3.tensors]):
            fail("valid_tiny.gguf marked version 2 does not read the same as version 3")
        for fname, case in cases.items():
            try:
                G.check_model(G.read(os.path.join(tmp, fname)))
                fail("%s accepted" % fname)
                continue
            except ValueError as e:
                msg = str(e)
            missing = [w for w in case["words"] if w.lower() not in msg.lower()]
            if missing:
                fail("%s: message %r lacks %s" % (fname, msg, missing))
            print("  %-30s %s" % (fname, msg))

    if failures:
        print("\n%d FAILURES" % len(failures))
        return 1
    print("\nall checks passed")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: test_gguf_ref.py GGUF_DIR", file=sys.stderr)
        sys.exit(2)
    sys.exit(main(sys.argv[1]))
