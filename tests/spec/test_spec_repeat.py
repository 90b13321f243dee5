#!/usr/bin/python3
"""Speculative decoding in a loop on the shipped Brown family, 2 threads: `rlx generate --spec mtp`
and `--spec draft` for every k = 1..6, ROUNDS times each, must all exit 0 and print plain greedy's
text. Speculation alternates tiny pool jobs (verifying a few tokens) with large ones, the pattern
under which a cpu-blas worker once ran a chunk of a job that had already returned (a SIGSEGV in
about 1 run of 90); repeating the runs gives such races a chance to show in CI.

  test_spec_repeat.py --rlx BIN --family DIR
"""
import argparse
import os
import subprocess
import sys

TIMEOUT = 120
ROUNDS = 2
PROMPT = "The jury said that"
N_NEW = "16"


def run(rlx, args):
    p = subprocess.run([rlx, *args], capture_output=True, text=True, timeout=TIMEOUT)
    return p.returncode, p.stdout.strip(), p.stderr.strip()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rlx", required=True)
    ap.add_argument("--family", required=True)
    args = ap.parse_args()
    target, draft = os.path.join(args.family, "target"), os.path.join(args.family, "draft")
    base = ["generate", "--model", target, "--prompt", PROMPT, "-n", N_NEW, "--greedy", "--threads", "2"]
    rc, plain, err = run(args.rlx, base)
    if rc != 0:
        print(f"FAIL: plain greedy: status {rc}; stderr: {err}")
        return 1
    failures = []
    for r in range(ROUNDS):
        for spec, spec_args in [("mtp", ["--spec", "mtp"]), ("draft", ["--spec", "draft", "--draft-model", draft])]:
            for k in range(1, 7):
                name = f"round {r + 1}, {spec} k={k}"
                rc, out, err = run(args.rlx, base + spec_args + ["--draft-tokens", str(k)])
                if rc != 0 or out != plain:
                    failures.append(f"{name}: status {rc}, printed {out!r} instead of {plain!r}; stderr: {err}")
                else:
                    print(f"ok: {name}")
    for f in failures:
        print(f"FAIL: {f}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
