#!/usr/bin/python3
"""Deeper variants of the golden test models, for pipelines of up to 4 (and uneven) stages:
make_pipeline_models.py --out DIR writes DIR/deep-dense-f32 (5 layers, tied embeddings) and
DIR/deep-moe-f32 (4 layers, sparse and dense MLPs). Rewritten only when the generator changes."""
import argparse
import os
import sys

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "model"))
import make_model  # noqa: E402

MODELS = {
    "deep-dense-f32": ("dense-tied", dict(num_hidden_layers=5, max_window_layers=5), None, 0),
    "deep-moe-f32": ("moe", dict(num_hidden_layers=4, max_window_layers=4, mlp_only_layers=[1]), None, 0),
}
SEED = 11


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    make_model.build_variants(args.out, MODELS, SEED, os.path.abspath(__file__))
    return 0


if __name__ == "__main__":
    sys.exit(main())
