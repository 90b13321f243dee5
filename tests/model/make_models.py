#!/usr/bin/python3
"""Write the golden test models once: make_models.py --out DIR "KIND DTYPE SHARDS" ...

Each spec becomes DIR/KIND-DTYPE-sSHARDS. A model directory is rewritten only when its spec
or the generator changed (a stamp file records both), so repeated ctest runs are cheap. Kinds of
make_hybrid.py (Qwen3.5) are written by it, the others by make_model.py.
"""
import argparse
import hashlib
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_hybrid  # noqa: E402
import make_model  # noqa: E402

SEED = 7


def generator_digest():
    h = hashlib.sha256()
    for name in ("make_model.py", "make_hybrid.py", "st.py"):
        with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), name), "rb") as f:
            h.update(f.read())
    return h.hexdigest()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("specs", nargs="+", help='"KIND DTYPE SHARDS"')
    args = ap.parse_args()
    digest = generator_digest()
    for spec in args.specs:
        kind, dtype, shards = spec.split()
        out = os.path.join(args.out, f"{kind}-{dtype}-s{shards}")
        stamp = os.path.join(out, ".rlx-stamp")
        want = f"{spec} seed={SEED} {digest}\n"
        if os.path.exists(stamp) and open(stamp).read() == want:
            continue
        shutil.rmtree(out, ignore_errors=True)
        maker = make_hybrid if kind in make_hybrid.KINDS else make_model
        maker.build(kind, dtype, int(shards), SEED, out)
        with open(stamp, "w") as f:
            f.write(want)
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
