#!/usr/bin/python3
"""`rlx bench --json` says what it ran on: the host's CPU and cores and the backend's own
description, in a valid JSON object; the plain output has a host line too.

  check_bench_json.py --rlx BIN --model DIR
"""
import argparse
import json
import os
import subprocess
import sys

FLAGS = {"sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_bf16", "avx512_fp16",
         "avx_vnni", "avx512_vnni"}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rlx", required=True)
    ap.add_argument("--model", required=True)
    args = ap.parse_args()
    base = [args.rlx, "bench", "--model", args.model, "-p", "4", "-n", "2", "-r", "1", "--plugin", "cpu-blas"]
    p = subprocess.run(base + ["--json"], capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        print(f"FAIL: rlx bench --json exited with {p.returncode}: {p.stderr}")
        return 1
    res = json.loads(p.stdout)
    host = res["host"]
    problems = []
    if not host["cpu"].strip():
        problems.append("empty cpu model name")
    if not host["vendor"].strip():
        problems.append("empty vendor")
    if not (isinstance(host["family"], int) and isinstance(host["model"], int)):
        problems.append("family/model are not integers")
    if not isinstance(host["flags"], list) or not set(host["flags"]) <= FLAGS | {f for f in host["flags"]
                                                                             if f.startswith("amx_")}:
        problems.append(f"flags {host['flags']!r} is not a list of the ISA flags rlx cares about")
    cpuinfo = open("/proc/cpuinfo").read()
    first = next(l for l in cpuinfo.splitlines() if l.startswith("flags")).split(":", 1)[1].split()
    if "avx2" in first and "avx2" not in host["flags"]:
        problems.append("avx2 is in /proc/cpuinfo but not in flags")
    if not 1 <= host["cores_usable"] <= host["cores_online"]:
        problems.append(f"cores usable {host['cores_usable']}, online {host['cores_online']}")
    if host["cores_usable"] != len(os.sched_getaffinity(0)):
        problems.append(f"cores_usable {host['cores_usable']} is not the affinity mask's {len(os.sched_getaffinity(0))}")
    if "OpenBLAS core" not in res["backend_describe"] or "thread" not in res["backend_describe"]:
        problems.append(f"backend_describe {res['backend_describe']!r} lacks the OpenBLAS core or threads")
    plain = subprocess.run(base, capture_output=True, text=True, timeout=120)
    if plain.returncode != 0 or not plain.stdout.startswith(f"host: {host['cpu']} "):
        problems.append(f"plain output has no host line: {plain.stdout!r} {plain.stderr!r}")
    for m in problems:
        print(f"FAIL: {m}")
    if not problems:
        print(f"ok: {json.dumps(host)}; {res['backend_describe']}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
