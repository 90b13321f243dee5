#!/usr/bin/python3
"""Numbers that are not numbers, through the real CLI, on copies of a small model poisoned in
one known place of layer 2:

  - an infinity in mlp.down_proj's weight: `rlx generate` and `rlx logits` exit 1 naming the
    position and vocabulary index of the bad logit and, traced on the failure path, the node
    'layers.2.mlp.down_proj'; with --check-finite the forward stops at that node itself;
  - a row of mlp.up_proj so large that the matmul overflows: --check-finite names a node of
    layer 2 (the overflow, not the weight, is what it finds);
  - over a two-stage pipeline the last stage's message reaches the driver's exit status;
  - a healthy model generates the same ids with and without --check-finite.
Never a token printed from a bad row, never exit 0, never a sanitizer report.

  check_finite.py --rlx BIN --model GOOD_MODEL_DIR --workdir DIR
"""
import argparse
import json
import os
import re
import shutil
import struct
import subprocess
import sys

import numpy as np

TIMEOUT = 120
PROMPT = ["--tokens", "17,3,250,99,4,301,77,12", "-n", "6", "--greedy"]
BAD_LOGIT = re.compile(r"the logits of position 7 are not finite \((NaN|\+Inf|-Inf) at vocabulary index \d+\)")
DOWN_NODE = re.compile(r"node 'layers\.2\.mlp\.down_proj' \(matmul on cpu-blas\) wrote (NaN|\+Inf|-Inf) at element "
                       r"\d+ of its \[8, \d+\] output")
LAYER2_NODE = re.compile(r"node 'layers\.2\.[a-z_.]+' \([a-z_]+ on cpu-blas\) wrote (NaN|\+Inf|-Inf) at element")
failures = []


def poison(good, workdir, name, tensor, edit):
    """A copy of the good model whose tensor's float32 values go through edit(array) in place."""
    out = os.path.join(workdir, name)
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(good, out)
    path = os.path.join(out, "model.safetensors")
    with open(path, "r+b") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        entry = json.loads(f.read(n))[tensor]
        assert entry["dtype"] == "F32", entry
        begin, end = entry["data_offsets"]
        f.seek(8 + n + begin)
        values = np.frombuffer(f.read(end - begin), dtype="<f4").reshape(entry["shape"]).copy()
        edit(values)
        f.seek(8 + n + begin)
        f.write(values.tobytes())
    return out


def run(rlx, argv):
    p = subprocess.run([rlx] + argv, capture_output=True, text=True, timeout=TIMEOUT)
    if "Sanitizer" in p.stderr or "runtime error" in p.stderr:
        failures.append(f"{' '.join(argv)}: sanitizer report:\n{p.stderr}")
    return p


def expect_failure(rlx, what, argv, patterns, absent=()):
    p = run(rlx, argv)
    if p.returncode != 1:
        failures.append(f"{what}: exit {p.returncode}, want 1\nstdout: {p.stdout}\nstderr: {p.stderr}")
        return
    if p.stdout.strip():
        failures.append(f"{what}: printed tokens from a bad row: {p.stdout!r}")
    for pat in patterns:
        if not pat.search(p.stderr):
            failures.append(f"{what}: stderr lacks /{pat.pattern}/:\n{p.stderr}")
    for text in absent:
        if text in p.stderr:
            failures.append(f"{what}: stderr mentions {text!r}:\n{p.stderr}")
    print(f"ok: {what}: {p.stderr.strip().splitlines()[-1]}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rlx", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--workdir", required=True)
    args = ap.parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    rlx, good = args.rlx, args.model

    def inf_weight(w):
        w[5, 7] = np.inf

    def overflowing_row(w):
        w[3, :] = 1e38

    inf = poison(good, args.workdir, "inf-down", "model.layers.2.mlp.down_proj.weight", inf_weight)
    huge = poison(good, args.workdir, "huge-up", "model.layers.2.mlp.up_proj.weight", overflowing_row)

    expect_failure(rlx, "generate, inf in layers.2.mlp.down_proj", ["generate", "-m", inf] + PROMPT,
                   [BAD_LOGIT, DOWN_NODE])
    expect_failure(rlx, "generate --check-finite, inf in layers.2.mlp.down_proj",
                   ["generate", "-m", inf, "--check-finite"] + PROMPT, [DOWN_NODE], ["the logits of position"])
    out = os.path.join(args.workdir, "logits.bin")
    expect_failure(rlx, "logits, inf in layers.2.mlp.down_proj",
                   ["logits", "-m", inf, "--tokens", PROMPT[1], "--out", out], [BAD_LOGIT, DOWN_NODE])
    expect_failure(rlx, "generate --check-finite, overflowing layers.2.mlp.up_proj",
                   ["generate", "-m", huge, "--check-finite"] + PROMPT, [LAYER2_NODE])
    expect_failure(rlx, "generate over 2 stages, inf in layers.2.mlp.down_proj",
                   ["generate", "-m", inf, "--stages", "2"] + PROMPT, [BAD_LOGIT, DOWN_NODE])
    expect_failure(rlx, "generate --check-finite over 2 stages, inf in layers.2.mlp.down_proj",
                   ["generate", "-m", inf, "--stages", "2", "--check-finite"] + PROMPT, [DOWN_NODE],
                   ["the logits of position"])

    for backend in ("cpu-blas", "ref"):
        plain = run(rlx, ["generate", "-m", good, "--plugin", backend] + PROMPT)
        checked = run(rlx, ["generate", "-m", good, "--plugin", backend, "--check-finite"] + PROMPT)
        if plain.returncode or checked.returncode or not plain.stdout.split() or plain.stdout != checked.stdout:
            failures.append(f"healthy model on {backend}: ids {plain.stdout!r} (exit {plain.returncode}), with "
                            f"--check-finite {checked.stdout!r} (exit {checked.returncode}) {checked.stderr}")
        else:
            print(f"ok: healthy model on {backend}: same ids with --check-finite: {plain.stdout.strip()}")

    for f in failures:
        print("FAIL:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
