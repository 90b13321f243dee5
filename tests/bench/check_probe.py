#!/usr/bin/python3
"""rlx_probe's JSON (docs/BENCHMARKS.md's ceilings) holds what the benchmark reads from it: the
options it ran with, positive finite rates, the read kernel the CPU's flags call for, every
matmul shape of the Qwen3-0.6B layer, and an aggregate sgemm rate that is what its definition
(total FLOPs over total time) makes of the per-shape rates: between the slowest and the fastest.
The figures themselves mean nothing on a shared machine; this checks the record, not the speed.

  check_probe.py PROBE
"""
import json
import math
import subprocess
import sys

SHAPES = {"q_proj 2048x1024", "k_proj 1024x1024", "v_proj 1024x1024", "gate_proj 3072x1024", "up_proj 3072x1024",
          "down_proj 1024x3072", "o_proj 1024x2048"}


def main():
    probe = sys.argv[1]
    p = subprocess.run([probe, "--threads", "2", "--json", "--mib", "32", "--passes", "1", "--reps", "1"],
                       capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        print(f"FAIL: rlx_probe exited with {p.returncode}: {p.stderr}")
        return 1
    r = json.loads(p.stdout)
    problems = []
    for key, want in (("threads", 2), ("read_mib", 32), ("read_passes", 1), ("sgemm_reps", 1), ("sgemm_m", 128),
                      ("thp", False)):
        if r.get(key) != want:
            problems.append(f"{key} is {r.get(key)!r}, not the {want!r} asked for")
    rates = {k: r.get(k) for k in ("read_gbps", "read_best_gbps", "sgemm_gflops", "sgemm_1024_gflops")}
    rates.update({f"sgemm_shapes[{k}]": v for k, v in r.get("sgemm_shapes", {}).items()})
    for key, v in rates.items():
        if not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
            problems.append(f"{key} is {v!r}, not a positive rate")
    if set(r.get("sgemm_shapes", {})) != SHAPES:
        problems.append(f"sgemm_shapes has {sorted(r.get('sgemm_shapes', {}))}, want {sorted(SHAPES)}")
    elif not problems:
        shapes = r["sgemm_shapes"].values()
        # a rate of total work over total time lies between its parts' rates (3 decimals printed)
        if not min(shapes) - 1e-3 <= r["sgemm_gflops"] <= max(shapes) + 1e-3:
            problems.append(f"sgemm_gflops {r['sgemm_gflops']} is outside its shapes' rates {sorted(shapes)}")
        if r["read_best_gbps"] < r["read_gbps"]:
            problems.append(f"read_best_gbps {r['read_best_gbps']} is below the median {r['read_gbps']}")
    flags = next(line for line in open("/proc/cpuinfo") if line.startswith("flags")).split(":", 1)[1].split()
    kernel = "avx512" if "avx512f" in flags else "avx2" if "avx2" in flags else "portable"
    if r.get("read_kernel") != kernel:
        problems.append(f"read_kernel is {r.get('read_kernel')!r}; this CPU's flags call for {kernel!r}")
    if not isinstance(r.get("openblas_core"), str) or not r["openblas_core"].strip():
        problems.append(f"openblas_core is {r.get('openblas_core')!r}")
    for m in problems:
        print(f"FAIL: {m}")
    if not problems:
        print(f"ok: {p.stdout.strip()}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
