#!/usr/bin/python3
"""The trained Brown family (share/models/brown) as shipped: the target has learned English, and
its MTP head and draft model really predict it, so speculative decoding accepts drafts while
printing exactly what plain greedy decoding prints.

  test_brown_family.py --rlx BIN --family DIR --sample TEXT_FILE
  test_brown_family.py --rlx BIN --family DIR --rounds N

- held-out English (TEXT_FILE, Brown documents the training never saw): the target's mean
  next-token cross-entropy, from `rlx logits --all`, must be far below a uniform guess
  (ln 4096 = 8.3 nats); a wrongly exported or wrongly loaded model lands near or above it;
- greedy `--spec mtp` and `--spec draft` for k = 1, 3, 6, in one process and over 2 stages,
  print plain greedy's text and emit at least MIN_TOKENS_PER_PASS tokens per target forward
  (random heads, whose drafts are almost never accepted, stay at 1.0), so the accepted-draft
  paths of both speculators and the stages' rollback are exercised with real acceptance.

With --rounds N, only the single-process runs, for every k = 1..6, N times over and shorter
(REPEAT_N_NEW tokens): speculation alternates tiny pool jobs (verifying a few tokens) with large
ones, the pattern under which a cpu-blas worker once ran a chunk of a job that had already
returned (a SIGSEGV in about 1 run of 90), so repeating the runs lets such races show in CI.
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile

import numpy as np

TIMEOUT = 300
MAX_HELD_OUT_NATS = 6.5
MIN_TOKENS_PER_PASS = 1.25
PROMPT = "The jury said that"
N_NEW = "48"
REPEAT_N_NEW = "16"
PER_PASS = re.compile(r"([\d.]+) tokens per target pass")


def run(rlx, args):
    p = subprocess.run([rlx, *args], capture_output=True, text=True, timeout=TIMEOUT)
    if p.returncode != 0:
        raise RuntimeError(f"rlx {' '.join(args)} failed: {p.stderr.strip()}")
    return p.stdout.strip(), p.stderr.strip()


def held_out_nats(rlx, target, sample, workdir):
    ids = [int(t) for t in run(rlx, ["tokenize", "--model", target, "--file", sample])[0].split()][:256]
    out = os.path.join(workdir, "logits.f32")
    run(rlx, ["logits", "--model", target, "--tokens", ",".join(map(str, ids)), "--all", "--out", out])
    logits = np.fromfile(out, dtype="<f4").reshape(len(ids), -1).astype(np.float64)
    logits -= logits.max(axis=1, keepdims=True)
    logp = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    return float(-np.mean(logp[np.arange(len(ids) - 1), ids[1:]])), len(ids)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rlx", required=True)
    ap.add_argument("--family", required=True)
    ap.add_argument("--sample", help="held-out text (not with --rounds)")
    ap.add_argument("--rounds", type=int, default=0, help="repeat the single-process runs, every k")
    args = ap.parse_args()
    if not args.rounds and not args.sample:
        ap.error("--sample is required without --rounds")
    target, draft = os.path.join(args.family, "target"), os.path.join(args.family, "draft")
    failures = []
    if args.rounds:
        rounds, n_new, ks, places = args.rounds, REPEAT_N_NEW, [str(k) for k in range(1, 7)], [("single process", [])]
    else:
        rounds, n_new, ks, places = 1, N_NEW, ["1", "3", "6"], [("single process", []), ("2 stages", ["--stages", "2"])]
        with tempfile.TemporaryDirectory() as workdir:
            nats, n = held_out_nats(args.rlx, target, args.sample, workdir)
        line = f"held-out cross-entropy {nats:.3f} nats over {n} tokens (bound {MAX_HELD_OUT_NATS})"
        (failures.append if nats > MAX_HELD_OUT_NATS else print)(line)

    base = ["generate", "--model", target, "--prompt", PROMPT, "-n", n_new, "--greedy", "--threads", "2"]
    plain, _ = run(args.rlx, base)
    print(f"plain greedy: {plain!r}")
    for where, extra in [(f"{w}, round {r + 1}" if rounds > 1 else w, e) for r in range(rounds) for w, e in places]:
        for spec, spec_args in [("mtp", ["--spec", "mtp"]), ("draft", ["--spec", "draft", "--draft-model", draft])]:
            for k in ks:
                name = f"{spec} k={k} {where}"
                try:
                    out, err = run(args.rlx, base + extra + spec_args + ["--draft-tokens", k, "--stats"])
                except RuntimeError as e:
                    failures.append(f"{name}: {e}")
                    continue
                m = PER_PASS.search(err)
                per_pass = float(m.group(1)) if m else -1.0
                if out != plain:
                    failures.append(f"{name}: printed {out!r}, plain greedy printed {plain!r}")
                elif per_pass < MIN_TOKENS_PER_PASS:
                    failures.append(f"{name}: {per_pass} tokens per target pass, below {MIN_TOKENS_PER_PASS}; "
                                    f"stderr: {err}")
                else:
                    print(f"ok: {name}: same text, {per_pass:.2f} tokens per target pass")
    for f in failures:
        print(f"FAIL: {f}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
