#!/usr/bin/python3
"""`rlx bench --json` says what it ran on: the host's CPU and cores and the backend's own
description, in a valid JSON object; the plain output is llama-bench's markdown table with a host
line under it; llama-bench's list forms (-p 4,8 -t 1,2) give one row per test and thread count in
every output format (md, json, jsonl); a backend's description with quotes, backslashes and
control characters comes through every JSON format exactly; the memory of one sequence, KV rows
and recurrent state, is the arithmetic of the model's shape (a Qwen3.5 hybrid's with --hybrid).

  check_bench_json.py --rlx BIN --model DIR --test-plugins DIR [--hybrid DIR]
"""
import argparse
import json
import os
import subprocess
import sys

FLAGS = {"sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_bf16", "avx512_fp16",
         "avx_vnni", "avx512_vnni"}


def check_lists(args):
    """-p 4,8 -n 2 -t 1,2 -r 2: the tests pp4, pp8, tg2 at 1 and 2 threads, two samples each."""
    base = [args.rlx, "bench", "--model", args.model, "-p", "4,8", "-n", "2", "-t", "1,2", "-r", "2"]
    want = {(t, p, n) for t in (1, 2) for p, n in ((4, 0), (8, 0), (0, 2))}
    problems = []
    runs = {fmt: subprocess.run(base + ["-o", fmt], capture_output=True, text=True, timeout=300)
            for fmt in ("json", "jsonl", "md")}
    for fmt, p in runs.items():
        if p.returncode != 0:
            return [f"rlx bench -o {fmt} exited with {p.returncode}: {p.stderr}"]
    rows = {"json": json.loads(runs["json"].stdout),
            "jsonl": [json.loads(line) for line in runs["jsonl"].stdout.splitlines()]}
    for fmt, objs in rows.items():
        got = {(o["n_threads"], o["n_prompt"], o["n_gen"]) for o in objs}
        if got != want or len(objs) != len(want):
            problems.append(f"-o {fmt}: tests {sorted(got)}, want {sorted(want)}")
        for o in objs:
            s = o["samples_ts"]
            if len(s) != 2 or not min(s) <= o["median_ts"] <= max(s) or abs(o["avg_ts"] - sum(s) / 2) > 1e-3 * o["avg_ts"]:
                problems.append(f"-o {fmt}: samples {s} do not give median {o['median_ts']} / mean {o['avg_ts']}")
            if len(o["samples_ns"]) != 2 or o["model_n_params"] <= 0 or o["model_size"] <= 0:
                problems.append(f"-o {fmt}: incomplete row {o}")
    table = [line.split("|")[1:-1] for line in runs["md"].stdout.splitlines() if line.startswith("| ")][2:]
    cells = {(int(r[4]), r[5].strip()) for r in table if len(r) == 7}
    if cells != {(t, name) for t in (1, 2) for name in ("pp4", "pp8", "tg2")} or len(table) != 6:
        problems.append(f"-o md: rows {sorted(cells)} from {runs['md'].stdout!r}")
    refused = subprocess.run(base + ["--json"], capture_output=True, text=True, timeout=60)
    if refused.returncode == 0 or "-o json" not in refused.stderr:
        problems.append(f"--json with lists was not refused: {refused.returncode} {refused.stderr!r}")
    return problems


def check_depth(args):
    """-d 0,6 -p 4 -n 2: pp4 and tg2 from an empty context and after 6 tokens (n_depth, "pp4 @ d6");
    the depth really fills the context: with -c 8 the 6 + 4 positions of pp4 @ d6 do not fit."""
    base = [args.rlx, "bench", "--model", args.model, "-p", "4", "-n", "2", "-d", "0,6", "-r", "1"]
    problems = []
    p = subprocess.run(base + ["-o", "json"], capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        return [f"rlx bench -d exited with {p.returncode}: {p.stderr}"]
    got = sorted((o["n_depth"], o["n_prompt"], o["n_gen"]) for o in json.loads(p.stdout))
    if got != sorted([(0, 4, 0), (0, 0, 2), (6, 4, 0), (6, 0, 2)]):
        problems.append(f"-d 0,6: tests {got}")
    md = subprocess.run(base, capture_output=True, text=True, timeout=300)
    names = [line.split("|")[6].strip() for line in md.stdout.splitlines() if line.startswith("| ")][2:]
    if md.returncode != 0 or names != ["pp4", "tg2", "pp4 @ d6", "tg2 @ d6"]:
        problems.append(f"-d 0,6 -o md: tests {names} ({md.returncode}: {md.stderr!r})")
    small = subprocess.run(base[:-4] + ["-d", "6", "-r", "1", "-c", "8"], capture_output=True, text=True, timeout=120)
    if small.returncode == 0:
        problems.append("-d 6 -p 4 ran in a context of 8 positions: the depth was not prefilled")
    return problems


def check_escaping(args):
    """A backend describing itself with a quote, a backslash, a tab and a newline (the conformance
    kit's broken-describe plugin): every output format's JSON holds that string exactly."""
    want = 'a "quoted" name, a back\\slash,\ta tab and\na newline'
    base = [args.rlx, "bench", "--model", args.model, "-p", "4", "-n", "2", "-r", "1", "--plugin-dir",
            args.test_plugins, "--plugin", "broken-describe"]
    problems = []
    for fmt in (["--json"], ["-o", "json"], ["-o", "jsonl"]):
        p = subprocess.run(base + fmt, capture_output=True, text=True, timeout=120)
        if p.returncode != 0:
            problems.append(f"rlx bench {' '.join(fmt)} on broken-describe exited with {p.returncode}: {p.stderr}")
            continue
        try:
            objs = [json.loads(p.stdout)] if fmt[0] == "--json" else \
                json.loads(p.stdout) if fmt[1] == "json" else [json.loads(line) for line in p.stdout.splitlines()]
        except ValueError as e:
            problems.append(f"rlx bench {' '.join(fmt)}: not JSON ({e}): {p.stdout!r}")
            continue
        got = {o.get("backend_describe") for o in objs}
        if got != {want}:
            problems.append(f"rlx bench {' '.join(fmt)}: backend_describe {got}, want {want!r}")
    return problems


def expected_memory(model_dir, capacity, kv_value_bytes):
    """F32 KV rows of the full-attention layers and F32 recurrent states of the linear ones
    (the convolution's last kernel-1 inputs, a key x value matrix per value head), per sequence."""
    with open(os.path.join(model_dir, "config.json")) as f:
        config = json.load(f)
    c = config.get("text_config", config)
    layers = c["num_hidden_layers"]
    types = c.get("layer_types") or (
        ["linear_attention" if (i + 1) % c.get("full_attention_interval", 4) else "full_attention"
         for i in range(layers)] if "linear_num_value_heads" in c else ["full_attention"] * layers)
    head_dim = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    kv_row = c.get("num_key_value_heads", c["num_attention_heads"]) * head_dim
    kv = sum(2 * capacity * kv_row * kv_value_bytes for t in types if t == "full_attention")
    state = 0
    for t in types:
        if t == "linear_attention":
            hk, hv = c["linear_num_key_heads"], c["linear_num_value_heads"]
            dk, dv = c["linear_key_head_dim"], c["linear_value_head_dim"]
            channels = 2 * hk * dk + hv * dv
            state += ((c.get("linear_conv_kernel_dim", 4) - 1) * channels + hv * dk * dv) * 4
    return kv, state


def check_memory(args, model_dir):
    """kv_cache_bytes, state_bytes and type_k of --json and -o json at a context of 100 positions,
    with the default F16 cache and with -ctk f32."""
    problems = []
    for fmt, cache, kv_value_bytes in ((["--json"], [], 2), (["-o", "json"], [], 2), (["--json"], ["-ctk", "f32"], 4)):
        want = expected_memory(model_dir, 100, kv_value_bytes)
        p = subprocess.run([args.rlx, "bench", "--model", model_dir, "-p", "4", "-n", "2", "-r", "1", "-c", "100"] + fmt +
                           cache, capture_output=True, text=True, timeout=120)
        if p.returncode != 0:
            problems.append(f"rlx bench {' '.join(fmt)} on {model_dir} exited with {p.returncode}: {p.stderr}")
            continue
        objs = json.loads(p.stdout)
        for o in objs if isinstance(objs, list) else [objs]:
            if o["type_k"] != ("f32" if cache else "f16"):
                problems.append(f"{model_dir} {' '.join(fmt + cache)}: type_k {o['type_k']}")
            if (o["kv_cache_bytes"], o["state_bytes"]) != want:
                problems.append(f"{model_dir} {' '.join(fmt + cache)}: KV {o['kv_cache_bytes']} and state {o['state_bytes']} "
                                f"bytes, the shape gives {want}")
    return problems


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rlx", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--test-plugins", required=True, help="the conformance kit's test backends (broken-describe)")
    ap.add_argument("--hybrid", help="a Qwen3.5 model directory, for the recurrent state's memory")
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
    lines = plain.stdout.splitlines()
    if plain.returncode != 0 or not lines or not lines[0].startswith("| model ") or \
            not any(line.startswith(f"host: {host['cpu']} ") for line in lines):
        problems.append(f"plain output is not a table with a host line: {plain.stdout!r} {plain.stderr!r}")
    problems += check_lists(args)
    problems += check_depth(args)
    problems += check_escaping(args)
    problems += check_memory(args, args.model)
    if args.hybrid:
        problems += check_memory(args, args.hybrid)
    for m in problems:
        print(f"FAIL: {m}")
    if not problems:
        print(f"ok: {json.dumps(host)}; {res['backend_describe']}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
