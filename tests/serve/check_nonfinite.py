#!/usr/bin/python3
"""rlx serve on a copy of the Brown draft model whose layer 1 mlp.down_proj holds an infinity:
every completion fails with HTTP 500 and OpenAI's error body naming the bad logit and the node
that first wrote a non-finite value (traced on the failure path, or stopped there with
--check-finite), never a 200 with text made of a bad row; the server stays up and answers
/health, and a second request fails the same way.

  check_nonfinite.py --rlx BIN --workdir DIR
"""
import argparse
import json
import os
import re
import shutil
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.dont_write_bytecode = True  # no __pycache__ in the source tree
from serve_util import SOURCE, Checks, Server, main_guard  # noqa: E402

DRAFT = os.path.join(SOURCE, "share", "models", "brown", "draft")
TENSOR = "model.layers.1.mlp.down_proj.weight"
NODE = re.compile(r"node 'layers\.1\.mlp\.down_proj' \(matmul on [a-z-]+\) wrote (NaN|\+Inf|-Inf)")
BF16_INF = b"\x80\x7f"  # 0x7f80 little-endian


def poisoned(workdir):
    """The draft model with the first row of TENSOR (BF16) set to +Inf."""
    out = os.path.join(workdir, "brown-draft-inf")
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(DRAFT, out)
    path = os.path.join(out, "model.safetensors")
    with open(path, "r+b") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        entry = json.loads(f.read(n))[TENSOR]
        if entry["dtype"] != "BF16":
            raise RuntimeError(f"{TENSOR} is {entry['dtype']}, the test writes BF16")
        f.seek(8 + n + entry["data_offsets"][0])
        f.write(BF16_INF * entry["shape"][1])
    return out


def run(args):
    c = Checks()
    model = poisoned(args.workdir)
    for flags in ([], ["--check-finite"]):
        what = " ".join(flags) or "default"
        with Server(args.rlx, ["--parallel", "2", *flags], model=model) as s:
            for attempt in range(2):
                status, _, body = s.request("POST", "/v1/completions",
                                            {"prompt": "The President said", "max_tokens": 4, "temperature": 0})
                text = body.decode(errors="replace")
                c.check(status == 500, f"{what}, request {attempt}: status {status}, expected 500: {text[:300]}")
                try:
                    message = json.loads(body)["error"]["message"]
                except (ValueError, KeyError, TypeError):
                    message = ""
                c.check(bool(NODE.search(message)),
                        f"{what}, request {attempt}: the error does not name the node: {text[:400]}")
                if not flags:
                    c.check("not finite" in message, f"default: the error does not name the logits: {message}")
                status, _, _ = s.request("GET", "/health")
                c.check(status == 200, f"{what}: /health after a failed request is {status}")
        c.check("Sanitizer" not in s.stderr and "runtime error" not in s.stderr, f"{what}: sanitizer report:\n{s.stderr}")
        print(f"ok: {what}: 2 requests refused naming the node, the server serving on", flush=True)
    return c.report()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rlx", required=True)
    ap.add_argument("--workdir", required=True)
    args = ap.parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    return run(args)


if __name__ == "__main__":
    main_guard(main)
