#!/usr/bin/python3
"""`rlx plugins -v` prints each backend's describe line; for cpu-blas the OpenBLAS core it runs:
the user's OPENBLAS_CORETYPE wins, and left alone a CPU with AVX2 never gets a core without AVX2
kernels (OpenBLAS's fallback for CPUs newer than it knows).

  test_plugins_verbose.py --rlx BIN
"""
import argparse
import os
import re
import subprocess
import sys

AVX2_CORES = {"Haswell", "Zen", "SkylakeX", "Cooperlake", "SapphireRapids", "Excavator"}


def describe(rlx, env):
    p = subprocess.run([rlx, "plugins", "-v"], capture_output=True, text=True, timeout=60, env=env)
    if p.returncode != 0:
        raise SystemExit(f"FAIL: rlx plugins -v exited with {p.returncode}: {p.stderr}")
    lines = p.stdout.splitlines()
    rows = [i for i, l in enumerate(lines) if l.startswith("cpu-blas ")]
    if not rows or rows[0] + 1 >= len(lines):
        raise SystemExit(f"FAIL: no cpu-blas row with a describe line:\n{p.stdout}")
    return lines, lines[rows[0] + 1].strip()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rlx", required=True)
    args = ap.parse_args()
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_CORETYPE"}
    failures = []
    lines, line = describe(args.rlx, env)
    ref = lines[lines.index(next(l for l in lines if l.startswith("ref "))) + 1].strip()
    if not ref.startswith("portable C"):
        failures.append(f"ref's describe line is {ref!r}")
    m = re.search(r"OpenBLAS core (\S+) \(([^)]*)\)", line)
    if not m:
        failures.append(f"no OpenBLAS core in {line!r}")
    else:
        flags = next(l for l in open("/proc/cpuinfo") if l.startswith("flags")).split()
        if "avx2" in flags and "fma" in flags and m.group(1) not in AVX2_CORES:
            failures.append(f"a CPU with AVX2 runs OpenBLAS core {m.group(1)}: {line!r}")
        if "user" in m.group(2):
            failures.append(f"OPENBLAS_CORETYPE is unset, yet: {line!r}")
        if "no answer" in m.group(2):
            failures.append(f"rlx-blas-probe, beside the plugin, did not answer: {line!r}")
    if not re.search(r"^(avx512|avx2|c) kernels, \d+ threads?, ", line):
        failures.append(f"no kernel level and threads in {line!r}")
    _, user = describe(args.rlx, dict(env, OPENBLAS_CORETYPE="Prescott"))
    if "OpenBLAS core Prescott (OPENBLAS_CORETYPE=Prescott set by the user)" not in user:
        failures.append(f"the user's OPENBLAS_CORETYPE=Prescott did not win: {user!r}")
    for f in failures:
        print(f"FAIL: {f}")
    if not failures:
        print(f"ok: {line}\nok: {user}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
