#!/usr/bin/python3
"""Speculative decoding benchmark: plain greedy decoding against --spec mtp and --spec draft for
k = 1..6 draft tokens, on the trained Brown family (share/models/brown).

  spec_bench.py --build BUILD_DIR [--model DIR] [--draft DIR] [-n 128] [--rounds 3]
                [--k 1,2,3,4,5,6] [--threads 2] [--plugin cpu-blas] [--json FILE]

Each round runs every configuration once per prompt, in one interleaved sequence, so plain and
speculative runs of a round see the same machine; a configuration's speedup is the median over
rounds and prompts of its decode tokens/s divided by plain decoding's in the same round on the
same prompt. Greedy speculative output must equal plain greedy output (the script checks it:
a mismatch is an error, not a slow run). Acceptance figures come from `rlx generate --stats`.
Exit status: 0 when everything ran, 1 on a failing command or a mismatch, 2 on bad usage.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROMPTS = ["The jury said that", "In the morning, the people of the city", "He was a man who"]
SPEED = re.compile(r"generated (\d+) tokens at ([\d.]+) tokens/s")
SPEC = re.compile(r"acceptance rate ([\d.]+)\), mean accepted length ([\d.]+) per round, ([\d.]+) tokens per "
                  r"target pass")


def run(rlx, model, prompt, n, threads, plugin, extra):
    cmd = [rlx, "generate", "--model", model, "--prompt", prompt, "-n", str(n), "--greedy", "--stats",
           "--threads", str(threads), "--plugin", plugin] + extra
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{p.stderr}")
    m = SPEED.search(p.stderr)
    if not m:
        raise RuntimeError(f"no speed in the output of {' '.join(cmd)}:\n{p.stderr}")
    out = {"text": p.stdout, "generated": int(m.group(1)), "tps": float(m.group(2))}
    s = SPEC.search(p.stderr)
    if s:
        out.update(acceptance=float(s.group(1)), mean_accepted=float(s.group(2)), tokens_per_pass=float(s.group(3)))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", required=True)
    ap.add_argument("--model", default=os.path.join(REPO, "share", "models", "brown", "target"))
    ap.add_argument("--draft", default=os.path.join(REPO, "share", "models", "brown", "draft"))
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--k", default="1,2,3,4,5,6")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--plugin", default="cpu-blas")
    ap.add_argument("--json")
    args = ap.parse_args()
    rlx = os.path.join(args.build, "bin", "rlx")
    if not os.access(rlx, os.X_OK):
        ap.error(f"{rlx} is not an executable (build first)")
    ks = [int(k) for k in args.k.split(",")]
    configs = [("plain", 0, [])]
    for k in ks:
        configs.append(("mtp", k, ["--spec", "mtp", "--draft-tokens", str(k)]))
        configs.append(("draft", k, ["--spec", "draft", "--draft-model", args.draft, "--draft-tokens", str(k)]))
    results = {(name, k): [] for name, k, _ in configs}
    try:
        for r in range(args.rounds):
            for prompt in PROMPTS:
                plain = None
                for name, k, extra in configs:
                    res = run(rlx, args.model, prompt, args.n, args.threads, args.plugin, extra)
                    if plain is None:
                        plain = res
                    elif res["text"] != plain["text"]:
                        raise RuntimeError(f"{name} k={k} on {prompt!r}: greedy output differs from plain decoding:\n"
                                           f"plain: {plain['text']!r}\n{name}:  {res['text']!r}")
                    res["speedup"] = res["tps"] / plain["tps"]
                    results[(name, k)].append(res)
            print(f"round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        print(f"spec_bench: {e}", file=sys.stderr)
        return 1

    def med(rows, key):
        return statistics.median(row[key] for row in rows)

    rows = []
    print(f"| speculator | k | decode tokens/s | speedup vs plain | acceptance rate | mean accepted | tokens per "
          f"target pass |\n|---|---|---|---|---|---|---|")
    for (name, k), res in results.items():
        row = {"speculator": name, "k": k, "tps": med(res, "tps"), "speedup": med(res, "speedup")}
        if name != "plain":
            row.update({key: med(res, key) for key in ["acceptance", "mean_accepted", "tokens_per_pass"]})
            print(f"| {name} | {k} | {row['tps']:.1f} | {row['speedup']:.2f} | {row['acceptance']:.3f} | "
                  f"{row['mean_accepted']:.2f} | {row['tokens_per_pass']:.2f} |")
        else:
            print(f"| plain | - | {row['tps']:.1f} | 1.00 | - | - | 1.00 |")
        rows.append(row)
    for name in ["mtp", "draft"]:
        best = max((r for r in rows if r["speculator"] == name), key=lambda r: r["speedup"], default=None)
        if best:
            print(f"best {name}: k={best['k']} at {best['speedup']:.2f}x plain decoding")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": args.model, "draft": args.draft, "n": args.n, "rounds": args.rounds,
                       "threads": args.threads, "plugin": args.plugin, "prompts": PROMPTS, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
