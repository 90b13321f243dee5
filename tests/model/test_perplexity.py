#!/usr/bin/python3
"""rlx perplexity against llama.cpp's own figure for the same model and text.

  test_perplexity.py --rlx BIN --shared DIR [--workdir DIR]

DIR/gguf/reference/llama.cpp.json holds what llama-perplexity (-c 256) printed for the Brown
draft model converted to GGUF F32 and BF16, on DIR/gguf/brown-heldout.txt; rlx must give the
same perplexity within 0.5 % from the safetensors the GGUF files were converted from
(share/models/brown/draft), the same over a 2-stage pipeline, and clear errors for bad input.
Exits 77 (skipped) when the reference files are not there, 1 under CI=true (tests/ci_skip.py).
"""
import argparse
import json
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from ci_skip import missing_input  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DRAFT = os.path.join(REPO, "share", "models", "brown", "draft")
FINAL = re.compile(r"Final estimate: PPL = ([\d.]+) \+/- ([\d.]+)")
RUNNING = re.compile(r"\[(\d+)\]([\d.]+),")


def run(rlx, *args, ok=True):
    p = subprocess.run([rlx, "perplexity", "--model", DRAFT, *args], capture_output=True, text=True, timeout=600)
    if ok and p.returncode != 0:
        raise SystemExit(f"FAIL: rlx perplexity {' '.join(args)} exited {p.returncode}:\n{p.stderr}")
    return p


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rlx", required=True)
    ap.add_argument("--shared", required=True)
    ap.add_argument("--workdir", default=".")
    args = ap.parse_args()
    ref_path = os.path.join(args.shared, "gguf", "reference", "llama.cpp.json")
    text = os.path.join(args.shared, "gguf", "brown-heldout.txt")
    if not os.path.exists(ref_path) or not os.path.exists(text):
        return missing_input(f"no llama.cpp reference at {ref_path}")
    with open(ref_path) as f:
        ref = json.load(f)["files"]
    failures = []

    out = run(args.rlx, "-f", text, "-c", "256").stdout
    m = FINAL.search(out)
    if not m:
        raise SystemExit(f"FAIL: no final estimate in:\n{out[-500:]}")
    ppl, err = float(m.group(1)), float(m.group(2))
    for name in ("brown-draft-f32.gguf", "brown-draft-bf16.gguf"):
        want, want_err = ref[name]["perplexity"], ref[name]["perplexity_stderr"]
        if abs(ppl - want) > 0.005 * want:
            failures.append(f"PPL {ppl} differs from llama.cpp's {want} on {name} by more than 0.5 %")
        if abs(err - want_err) > 0.01 * want_err:
            failures.append(f"standard error {err} differs from llama.cpp's {want_err} on {name} by more than 1 %")
    running = dict((int(c), float(v)) for c, v in RUNNING.findall(out))

    # the same method over a pipeline: the running figure after 20 chunks matches
    piped = run(args.rlx, "-f", text, "-c", "256", "--chunks", "20", "--stages", "2").stdout
    got = dict((int(c), float(v)) for c, v in RUNNING.findall(piped))
    if sorted(got) != list(range(1, 21)) or abs(got[20] - running[20]) > 1e-3 * running[20]:
        failures.append(f"--stages 2 --chunks 20 printed {piped[-200:]!r}; one process had {running.get(20)}")

    # standard input, and bad input with a clear message
    with open(text, "rb") as f:
        stdin = subprocess.run([args.rlx, "perplexity", "--model", DRAFT, "-f", "-", "-c", "256", "--chunks", "2"],
                               input=f.read(), capture_output=True, timeout=600)
    if b"[2]" not in stdin.stdout or stdin.returncode != 0:
        failures.append(f"-f - did not read standard input: {stdin.stderr[-300:]!r}")
    short = os.path.join(args.workdir, "short.txt")
    with open(short, "w") as f:
        f.write("The jury said that the city")
    for argv, message in ((["-c", "256"], "-f FILE is required"),
                          (["-f", text, "-c", "2"], "a chunk of 2 tokens (-c) is too small"),
                          (["-f", short, "-c", "256"], "fewer than one chunk of 256"),
                          (["-f", text, "--ctx-size", "3"], "a chunk of 3 tokens (-c) is too small"),
                          (["-f", os.path.join(args.workdir, "missing.txt")], "cannot open"),
                          (["-f", text, "-c", "x"], "is not a non-negative integer")):
        p = run(args.rlx, *argv, ok=False)
        if p.returncode == 0 or message not in p.stderr or not p.stderr.startswith("rlx: "):
            failures.append(f"rlx perplexity {' '.join(argv)}: exit {p.returncode}, stderr {p.stderr!r}, "
                            f"expected {message!r}")
    for f in failures:
        print("FAIL:", f)
    print(f"rlx perplexity: PPL {ppl} +/- {err} (llama.cpp F32 GGUF: {ref['brown-draft-f32.gguf']['perplexity']} "
          f"+/- {ref['brown-draft-f32.gguf']['perplexity_stderr']}); {'FAIL' if failures else 'PASS'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
