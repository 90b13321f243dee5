#!/usr/bin/python3
"""Sharing the machine: decode speed with another process busy, and the local 2-stage one-liner.

  share_bench.py --build BUILD_DIR [--model DIR] [-n 128] [--rounds 5] [--stage-runs 10]
                 [--backends cpu-blas,onednn] [--json FILE]

1. Busy neighbour: with one busy-looping process on the machine, `rlx generate --threads 2`
   against `--threads 1` for each backend, interleaved in rounds (the order alternates), and
   the same pair on the idle machine for reference. Reported: the median over rounds of the
   same-round ratio threads-2 / threads-1 decode tokens/s.
2. Local pipeline: `rlx --plugin P --transport T generate --stages 2` (the launched stages divide
   the cores), the same with every stage on all cores (--threads N), and the single process with
   --threads 1, each against the single process on all cores, `--stage-runs` times (the order
   alternates); each ratio is a decode speed over the single process's in the same run.
Greedy output must be identical in every run (a mismatch is an error). The host (lscpu) is part
of the record. Exit status: 0 when everything ran, 1 on a failing command or a mismatch.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROMPT = "In the morning, the people of the city"
SPEED = re.compile(r"generated (\d+) tokens at ([\d.]+) tokens/s")


def generate(rlx, model, n, args):
    cmd = [rlx] + (args if "generate" in args else ["generate"] + args)
    cmd += ["--model", model, "--prompt", PROMPT, "-n", str(n), "--greedy", "--stats"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    m = SPEED.search(p.stderr)
    if p.returncode != 0 or not m:
        raise RuntimeError(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stderr[-2000:]}")
    return p.stdout, float(m.group(2))


class Busy:
    """One process spinning on a core for as long as the block runs."""

    def __enter__(self):
        self.p = subprocess.Popen(["sh", "-c", "while :; do :; done"])
        return self

    def __exit__(self, *exc):
        self.p.kill()
        self.p.wait()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", required=True)
    ap.add_argument("--model", default=os.path.join(REPO, "share/models/brown/target"))
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--stage-runs", type=int, default=10)
    ap.add_argument("--backends", default="cpu-blas,onednn")
    ap.add_argument("--json")
    args = ap.parse_args()
    rlx = os.path.join(args.build, "bin", "rlx")
    cores = len(os.sched_getaffinity(0))
    record = {"host": subprocess.run(["lscpu"], capture_output=True, text=True).stdout, "model": args.model,
              "n": args.n, "busy": {}, "stages": {}}
    texts = set()
    try:
        for backend in args.backends.split(","):
            ratios = {"busy": [], "idle": []}
            for r in range(args.rounds):
                for mode in ("idle", "busy"):
                    tps = {}
                    order = (1, cores) if r % 2 == 0 else (cores, 1)
                    for threads in order:
                        run = ["--plugin", backend, "--threads", str(threads)]
                        if mode == "busy":
                            with Busy():
                                text, tps[threads] = generate(rlx, args.model, args.n, run)
                        else:
                            text, tps[threads] = generate(rlx, args.model, args.n, run)
                        texts.add(text)
                    ratios[mode].append(tps[cores] / tps[1])
                    print(f"{backend} {mode} round {r}: --threads 1 {tps[1]:.1f}, --threads {cores} "
                          f"{tps[cores]:.1f} tokens/s, ratio {ratios[mode][-1]:.2f}", flush=True)
            record["busy"][backend] = {m: {"ratios": v, "median": statistics.median(v)} for m, v in ratios.items()}
        for backend, transport in (("onednn", "grpc"), ("cpu-blas", "tcp")):
            if backend not in args.backends.split(",") or args.stage_runs == 0:
                continue
            kinds = ("single", "single-1", "stages", "stages-all")
            ratios = {k: [] for k in kinds[1:]}
            for r in range(args.stage_runs):
                speed = {}
                for kind in (kinds if r % 2 == 0 else kinds[::-1]):
                    run = {"single": ["--plugin", backend, "--threads", str(cores)],
                           "single-1": ["--plugin", backend, "--threads", "1"],
                           "stages": ["--plugin", backend, "--transport", transport, "generate", "--stages", "2"],
                           "stages-all": ["--plugin", backend, "--transport", transport, "generate", "--stages", "2",
                                          "--threads", str(cores)]}[kind]
                    text, speed[kind] = generate(rlx, args.model, args.n, run)
                    texts.add(text)
                for k in kinds[1:]:
                    ratios[k].append(speed[k] / speed["single"])
                print(f"{backend}/{transport} run {r}: single {speed['single']:.1f} (--threads 1: "
                      f"{speed['single-1']:.1f}), --stages 2 {speed['stages']:.1f} (each stage --threads {cores}: "
                      f"{speed['stages-all']:.1f}) tokens/s", flush=True)
            record["stages"][f"{backend}/{transport}"] = {
                k: {"ratios": v, "min": min(v), "median": statistics.median(v)} for k, v in ratios.items()}
    except RuntimeError as e:
        print(f"share_bench.py: {e}", file=sys.stderr)
        return 1
    if len(texts) != 1:
        print(f"share_bench.py: greedy output differs between runs: {len(texts)} variants", file=sys.stderr)
        return 1
    for backend, v in record["busy"].items():
        print(f"{backend}: threads {cores}/1 decode ratio, median: idle {v['idle']['median']:.2f}, "
              f"busy neighbour {v['busy']['median']:.2f}")
    for name, v in record["stages"].items():
        print(f"{name}, over the single process with --threads {cores}: --stages 2 min {v['stages']['min']:.2f} "
              f"median {v['stages']['median']:.2f}; each stage --threads {cores}: min {v['stages-all']['min']:.2f} "
              f"median {v['stages-all']['median']:.2f}; single process --threads 1: median "
              f"{v['single-1']['median']:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(record, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
