#!/usr/bin/python3
"""Hugging Face's GGUF parser (@huggingface/gguf, from npm) reads rlx quantize's files: for each
type, what it reports (architecture, metadata keys, tensor names, types and shapes, vocabulary
size) equals what the independent reader tests/gguf/gguf_ref.py finds.

  check_hf_gguf.py --rlx BIN --node NODE --npm DIR --model DIR --out DIR --type T [--type T ...]
"""
import argparse
import json
import os
import subprocess
import sys

from qutil import gguf_ref

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    ap = argparse.ArgumentParser()
    for a in ("--rlx", "--node", "--npm", "--model", "--out"):
        ap.add_argument(a, required=True)
    ap.add_argument("--type", action="append", required=True)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    pairs = []
    for t in args.type:
        out = os.path.join(args.out, f"hf-{t}.gguf")
        subprocess.run([args.rlx, "quantize", args.model, out, "--type", t, "-q"], check=True, stdout=subprocess.DEVNULL)
        g = gguf_ref.read(out)
        want = {"architecture": g.metadata["general.architecture"], "keys": list(g.metadata),
                "n_tokens": len(g.metadata["tokenizer.ggml.tokens"]),
                "tensors": {x.name: [x.type_name, list(x.dims)] for x in g.tensors}}
        exp = out + ".expect.json"
        with open(exp, "w") as f:
            json.dump(want, f)
        pairs += [out, exp]
    p = subprocess.run([args.node, os.path.join(HERE, "read_gguf.mjs"), "--npm", args.npm] + pairs)
    return p.returncode


if __name__ == "__main__":
    sys.exit(main())
