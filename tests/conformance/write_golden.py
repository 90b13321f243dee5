#!/usr/bin/python3
"""Writes NumPy golden logits into a model directory for `rlx-conformance --model-dir`.

  write_golden.py --model DIR
  write_golden.py --make KIND[/DTYPE] --out DIR     (builds the random model first)

Uses the independent NumPy reference of the Hugging Face forward (tests/model/qwen3_ref.py)
and check_golden.py's choice of a well-conditioned prompt, then writes:
  DIR/rlx-golden.txt   "prompt N", "tokens a,b,...", "tol X" (prompt, then NumPy's greedy path)
  DIR/rlx-golden.f32   float32 logits of every position of `tokens`, row after row
"""
import argparse
import os
import shutil
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "model"))
import check_golden  # noqa: E402
import make_model  # noqa: E402
import qwen3_ref as ref  # noqa: E402


def write(model_dir):
    model = ref.load(model_dir)
    case = check_golden.golden_case(model)
    tmp = os.path.join(model_dir, "rlx-golden.f32.tmp")
    np.asarray(case.logits, dtype="<f4").tofile(tmp)
    os.replace(tmp, os.path.join(model_dir, "rlx-golden.f32"))
    with open(os.path.join(model_dir, "rlx-golden.txt.tmp"), "w") as f:
        f.write("# NumPy golden logits for rlx-conformance (tests/conformance/write_golden.py)\n")
        f.write(f"prompt {len(case.prompt)}\n")
        f.write("tokens " + ",".join(str(t) for t in case.sequence) + "\n")
        f.write(f"tol {check_golden.LOGITS_TOL:g}\n")
    os.replace(os.path.join(model_dir, "rlx-golden.txt.tmp"), os.path.join(model_dir, "rlx-golden.txt"))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="existing model directory")
    ap.add_argument("--make", help="KIND[/DTYPE] of tests/model/make_model.py to build into --out")
    ap.add_argument("--out", help="model directory to build (with --make)")
    args = ap.parse_args(argv)
    if bool(args.model) == bool(args.make) or (args.make and not args.out):
        ap.error("give --model DIR, or --make KIND[/DTYPE] --out DIR")
    path = args.model
    if args.make:
        kind, _, dtype = args.make.partition("/")
        path = args.out
        if not os.path.exists(os.path.join(path, "config.json")):
            shutil.rmtree(path, ignore_errors=True)  # an interrupted earlier build
            os.makedirs(path)
            make_model.build(kind, dtype or "f32", 1, check_golden.DEFAULT_SEED, path)
    write(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
