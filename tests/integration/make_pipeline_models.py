#!/usr/bin/python3
"""Deeper variants of the golden test models, for pipelines of up to 4 (and uneven) stages:
make_pipeline_models.py --out DIR writes DIR/deep-dense-f32 (5 layers, tied embeddings) and
DIR/deep-moe-f32 (4 layers, sparse and dense MLPs). Rewritten only when the generator changes."""
import argparse
import hashlib
import os
import shutil
import sys

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
GOLDEN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "golden")
sys.path.insert(0, GOLDEN)
import make_model  # noqa: E402

MODELS = {
    "deep-dense-f32": ("dense-tied", dict(num_hidden_layers=5, max_window_layers=5)),
    "deep-moe-f32": ("moe", dict(num_hidden_layers=4, max_window_layers=4, mlp_only_layers=[1])),
}
SEED = 11


def digest():
    h = hashlib.sha256()
    for path in (os.path.join(GOLDEN, "make_model.py"), os.path.join(GOLDEN, "st.py"), __file__):
        with open(path, "rb") as f:
            h.update(f.read())
    return h.hexdigest()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    want = digest() + "\n"
    for name, (base, changes) in MODELS.items():
        out = os.path.join(args.out, name)
        stamp = os.path.join(out, ".rlx-stamp")
        if os.path.exists(stamp) and open(stamp).read() == want:
            continue
        shutil.rmtree(out, ignore_errors=True)
        make_model.KINDS[name] = dict(make_model.KINDS[base], **changes)
        make_model.build(name, "f32", 1, SEED, out)
        with open(stamp, "w") as f:
            f.write(want)
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
