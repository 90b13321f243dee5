#!/usr/bin/python3
"""rlx quantize's GGUF files against llama.cpp's for the same model and type, read with the
independent reader tests/gguf/gguf_ref.py: the same metadata keys (rlx adds general.alignment),
values of the hyperparameter and tokenizer keys, the same tensor names, shapes and per-tensor
types; tensors of the simple types byte-identical where llama.cpp's source was the same, and for
the K types the RMS error against the F32 file within 3 % of llama.cpp's, per tensor type (the
blocks that are byte-identical to llama.cpp's are counted and shown, not required).

  compare_gguf.py --rlx BIN --model DIR --shared DIR --out DIR --type T [--type T ...] [--rms]

Exits 77 (skip) when the llama.cpp files are absent, 1 under CI=true (tests/ci_skip.py).
"""
import argparse
import os
import subprocess
import sys

import numpy as np

from qutil import gguf_ref, verdict

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from ci_skip import missing_input  # noqa: E402


SAME_VALUES = [
    "general.architecture", "general.type", "general.file_type", "general.quantization_version",
    "tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens", "tokenizer.ggml.token_type",
    "tokenizer.ggml.merges", "tokenizer.ggml.eos_token_id", "tokenizer.ggml.padding_token_id",
    "tokenizer.ggml.add_bos_token", "tokenizer.chat_template",
]


def compare(ours, ref, failures, what):
    ko, kr = set(ours.metadata) - {"general.alignment"}, set(ref.metadata)
    if ko != kr:
        failures.append(f"{what}: metadata keys differ: only rlx {sorted(ko - kr)}, only llama.cpp {sorted(kr - ko)}")
    for k in SAME_VALUES + [k for k in kr if k.startswith(ref.metadata["general.architecture"] + ".")]:
        if k in ours.metadata and k in kr and ours.metadata[k] != ref.metadata[k]:
            a, b = ours.metadata[k], ref.metadata[k]
            if isinstance(a, float) and abs(a - b) <= 1e-6 * abs(b):
                continue
            failures.append(f"{what}: metadata {k}: rlx {str(a)[:80]} llama.cpp {str(b)[:80]}")
    if ours.value_types != {k: v for k, v in ref.value_types.items()} | {"general.alignment": gguf_ref.UINT32}:
        diff = [k for k in kr if ours.value_types.get(k) != ref.value_types[k]]
        if diff:
            failures.append(f"{what}: value types differ for {diff}")
    to, tr = ours.tensor_by_name, ref.tensor_by_name
    if set(to) != set(tr):
        failures.append(f"{what}: tensor names differ: only rlx {sorted(set(to) - set(tr))}, "
                        f"only llama.cpp {sorted(set(tr) - set(to))}")
    for name in sorted(set(to) & set(tr)):
        a, b = to[name], tr[name]
        if a.dims != b.dims or a.type != b.type:
            failures.append(f"{what}: {name}: rlx {a.type_name} {a.dims}, llama.cpp {b.type_name} {b.dims}")
        elif a.type in (gguf_ref.Q8_0, gguf_ref.Q4_0, gguf_ref.F32, gguf_ref.BF16) and ours.raw(name) != ref.raw(name):
            failures.append(f"{what}: {name}: {a.type_name} bytes differ from llama.cpp's")


def rms_table(ours, ref, f32):
    """Per tensor type: (rlx RMS, llama.cpp RMS, blocks byte-identical, blocks) over the tensors
    both hold in that type."""
    acc = {}
    for name, a in ours.tensor_by_name.items():
        b = ref.tensor_by_name.get(name)
        if b is None or a.type != b.type or a.type not in (gguf_ref.Q4_K, gguf_ref.Q5_K, gguf_ref.Q6_K):
            continue
        x = f32.tensor(name).astype(np.float64)
        e_ours = ((ours.tensor(name) - x) ** 2).sum()
        e_ref = ((ref.tensor(name) - x) ** 2).sum()
        s = acc.setdefault(a.type_name, [0.0, 0.0, 0, 0, 0])
        s[0] += e_ours
        s[1] += e_ref
        s[2] += x.size
        bs = gguf_ref.GGML_TYPES[a.type][2]
        ra = np.frombuffer(ours.raw(name), np.uint8).reshape(-1, bs)
        rb = np.frombuffer(ref.raw(name), np.uint8).reshape(-1, bs)
        s[3] += int((ra == rb).all(axis=1).sum())
        s[4] += ra.shape[0]
    return {k: (np.sqrt(v[0] / v[2]), np.sqrt(v[1] / v[2]), v[3], v[4]) for k, v in acc.items()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rlx", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--shared", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--type", action="append", required=True)
    ap.add_argument("--rms", action="store_true")
    args = ap.parse_args()
    base = os.path.basename(os.path.normpath(args.model))
    if not os.path.isdir(args.shared):
        return missing_input(f"no llama.cpp files in {args.shared}")
    os.makedirs(args.out, exist_ok=True)
    failures = []
    f32_path = os.path.join(args.shared, f"brown-{base}-f32.gguf")
    f32 = gguf_ref.read(f32_path) if args.rms and os.path.exists(f32_path) else None
    for t in args.type:
        out = os.path.join(args.out, f"{base}-{t}.gguf")
        p = subprocess.run([args.rlx, "quantize", args.model, out, "--type", t, "-q"], capture_output=True, text=True)
        if p.returncode != 0:
            failures.append(f"{t}: rlx quantize failed: {p.stderr.strip()}")
            continue
        ours = gguf_ref.read(out)
        gguf_ref.check_model(ours)
        ref_path = os.path.join(args.shared, f"brown-{base}-{t}.gguf")
        if not os.path.exists(ref_path):
            print(f"{t}: parsed ({len(ours.tensors)} tensors); no llama.cpp file to compare with")
            continue
        ref = gguf_ref.read(ref_path)
        compare(ours, ref, failures, t)
        if f32 is not None:
            for k, (a, b, same, blocks) in sorted(rms_table(ours, ref, f32).items()):
                ok = a <= 1.03 * b
                print(f"{t}: {k}: RMS error rlx {a:.6g}, llama.cpp {b:.6g} ({100 * (a / b - 1):+.2f} %); "
                      f"{same} of {blocks} blocks byte-identical")
                if not ok:
                    failures.append(f"{t}: {k} RMS {a:.6g} is more than 3 % above llama.cpp's {b:.6g}")
        print(f"{t}: compared with {os.path.basename(ref_path)}")
    return verdict(failures)


if __name__ == "__main__":
    sys.exit(main())
