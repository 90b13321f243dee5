#!/usr/bin/python3
"""rlx benchmark driver: measured speed against ceilings measured in the same run.

  run_bench.py --build BUILD_DIR [--model DIR] [--threads 2] [--plugin cpu-blas] [-r 5]
               [--rounds 1] [--out FILE]

Runs, back to back in one session: the probe (BUILD_DIR/tests/bench/rlx_probe --json), then
ROUNDS times `rlx bench` followed by the probe again. The probe gives the read bandwidth and
the OpenBLAS sgemm rate of the machine as it is right now; the model's config.json and
safetensors headers give the bytes read per decoded token and the FLOPs per prompt token.
From those it derives the ceilings, prints measured / ceiling ratios against the targets
(docs/BENCHMARKS.md) and writes everything as JSON.

Targets (see TARGETS): peak RSS <= 1.2 x safetensors bytes; tg >= 80 % of read_bw / bytes per
token; pp >= 80 % of sgemm rate / FLOPs per prompt token. A missed target is reported as
BELOW and is not an error: the exit status is 0 whenever the measurement itself worked, 1 on
errors (missing binary, a failing command, unparsable output, a broken model), 2 on bad usage.

Without --model the bench model (Qwen3-0.6B shape, random BF16, ~1.2 GB) is generated once at
BUILD_DIR/bench-model with tests/model/make_model.py; it is reused when config.json exists.
"""
import argparse
import datetime
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PYTHON = "/usr/bin/python3"  # Debian's, with python3-numpy (not whatever python3 is on PATH)
MAKE_MODEL = os.path.join(REPO, "tests", "model", "make_model.py")
INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"
DTYPE_BYTES = {"F64": 8, "F32": 4, "BF16": 2, "F16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1,
               "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}

# (key, label, comparison, limit): ratio = measured / reference.
TARGETS = [
    ("rss", "peak RSS / safetensors bytes", "<=", 1.2),
    ("tg", "decode / bandwidth ceiling", ">=", 0.8),
    ("pp", "prefill / sgemm bound", ">=", 0.8),
]


# Above this share of the CPUs used by other processes during a step, the run is flagged noisy.
NOISY_SHARE = 0.10


class BenchError(Exception):
    """A failure of the measurement itself (as opposed to a missed target)."""


# ------------------------------------------------------------------------------------ model

def read_header(path):
    """(header dict without __metadata__, metadata, data start offset) of one safetensors file."""
    try:
        with open(path, "rb") as f:
            raw_len = f.read(8)
            if len(raw_len) != 8:
                raise BenchError(f"{path}: too short for a safetensors header")
            n = int.from_bytes(raw_len, "little")
            if n > 100 << 20:
                raise BenchError(f"{path}: header length {n} is implausible")
            blob = f.read(n)
    except OSError as e:
        raise BenchError(f"cannot read {path}: {e}") from e
    if len(blob) != n:
        raise BenchError(f"{path}: truncated header ({len(blob)} of {n} bytes)")
    try:
        header = json.loads(blob)
    except ValueError as e:
        raise BenchError(f"{path}: header is not JSON: {e}") from e
    metadata = header.pop("__metadata__", {}) or {}
    return header, metadata, 8 + n


def model_files(model_dir):
    index = os.path.join(model_dir, INDEX_NAME)
    if os.path.exists(index):
        with open(index) as f:
            weight_map = json.load(f)["weight_map"]
        return [os.path.join(model_dir, name) for name in sorted(set(weight_map.values()))]
    single = os.path.join(model_dir, SINGLE_NAME)
    if not os.path.exists(single):
        raise BenchError(f"{model_dir}: neither {SINGLE_NAME} nor {INDEX_NAME}")
    return [single]


def model_stats(model_dir, prompt_tokens):
    """Everything the ceilings need, from config.json and the safetensors headers.

    bytes_per_token: every tensor a decode step reads in full = all layer tensors (matmul
      weights, norms, biases; for MoE only the top-k of E experts, pro rata) + final norm + the
      LM head (lm_head.weight, or the embedding table when tied). The one embedding row a step
      gathers is negligible and left out.
    flops_per_prompt_token: 2 * (2-D layer weights, i.e. the non-embedding matmul params) +
      LM-head FLOPs (2 * vocab * hidden) / prompt_tokens, because the LM head runs on the last
      prompt position only. Attention scores (QK^T, PV) are left out, as in the target.
    """
    cfg_path = os.path.join(model_dir, "config.json")
    try:
        with open(cfg_path) as f:
            config = json.load(f)
    except (OSError, ValueError) as e:
        raise BenchError(f"cannot read {cfg_path}: {e}") from e
    tensors, file_bytes, dtypes = {}, 0, set()
    for path in model_files(model_dir):
        header, _, data_start = read_header(path)
        size = os.path.getsize(path)
        file_bytes += size
        for name, info in header.items():
            dtype, shape = info["dtype"], list(info["shape"])
            begin, end = info["data_offsets"]
            numel = 1
            for d in shape:
                numel *= d
            if dtype not in DTYPE_BYTES or end - begin != numel * DTYPE_BYTES[dtype]:
                raise BenchError(f"{path}: {name}: {dtype} {shape} does not match data_offsets")
            if data_start + end > size:
                raise BenchError(f"{path}: {name} ends past the end of the file (incomplete model?)")
            tensors[name] = (shape, numel, end - begin)
            dtypes.add(dtype)

    try:
        hidden, vocab = config["hidden_size"], config["vocab_size"]
        layers = config["num_hidden_layers"]
    except KeyError as e:
        raise BenchError(f"{cfg_path}: missing {e}") from e
    embed, head = "model.embed_tokens.weight", "lm_head.weight"
    tied = head not in tensors
    if embed not in tensors:
        raise BenchError(f"{model_dir}: no {embed}")
    n_experts = config.get("num_experts") or 0
    top_k = config.get("num_experts_per_tok") or 0
    expert_re = re.compile(r"^model\.layers\.\d+\.mlp\.experts\.\d+\.")

    layer_bytes = other_bytes = 0.0
    matmul_params = 0.0
    for name, (shape, numel, nbytes) in tensors.items():
        if name in (embed, head):
            continue
        share = top_k / n_experts if n_experts and expert_re.match(name) else 1.0
        if name.startswith("model.layers."):
            layer_bytes += share * nbytes
            if len(shape) == 2:
                matmul_params += share * numel
        else:
            other_bytes += nbytes  # model.norm.weight
    head_bytes = tensors[embed if tied else head][2]
    head_flops = 2.0 * vocab * hidden
    matmul_bytes = sum(t[2] for n, t in tensors.items() if n.startswith("model.layers.") and len(t[0]) == 2)
    return {
        "dir": os.path.abspath(model_dir),
        "dtype": dtypes.pop() if len(dtypes) == 1 else "mixed",
        "hidden_size": hidden, "vocab_size": vocab, "num_hidden_layers": layers,
        "tie_word_embeddings": tied, "num_experts": n_experts, "num_experts_per_tok": top_k,
        "n_tensors": len(tensors),
        "safetensors_bytes": file_bytes,
        "tensor_bytes": sum(t[2] for t in tensors.values()),
        "layer_matmul_bytes": matmul_bytes,
        "layer_bytes": layer_bytes,
        "lm_head_bytes": head_bytes,
        "bytes_per_token": layer_bytes + other_bytes + head_bytes,
        "matmul_params_per_layer": matmul_params / layers,
        "lm_head_flops": head_flops,
        "prompt_tokens": prompt_tokens,
        "flops_per_prompt_token": 2.0 * matmul_params + head_flops / prompt_tokens,
    }


def ensure_model(build_dir):
    """The generated bench model at BUILD_DIR/bench-model, written once (atomically: into a
    .partial folder, renamed when complete, so an interrupted run is never mistaken for a model)."""
    out = os.path.join(build_dir, "bench-model")
    if os.path.exists(os.path.join(out, "config.json")):
        return out
    if os.path.isdir(out):
        if os.listdir(out):
            raise BenchError(f"{out} exists without config.json; delete it and rerun")
        os.rmdir(out)
    if not os.path.exists(MAKE_MODEL):
        raise BenchError(f"{MAKE_MODEL} not found")
    tmp = out + ".partial"
    shutil.rmtree(tmp, ignore_errors=True)
    cmd = [PYTHON, MAKE_MODEL, "--kind", "bench", "--dtype", "bf16", "--seed", "1", "--out", tmp]
    print("generating the bench model (once): " + " ".join(cmd), flush=True)
    t0 = time.monotonic()
    if subprocess.run(cmd, cwd=REPO).returncode != 0:
        raise BenchError("make_model.py failed")
    os.rename(tmp, out)
    print(f"  done in {time.monotonic() - t0:.0f} s", flush=True)
    return out


# ------------------------------------------------------------------------------------ runs

def cpu_busy_seconds():
    """CPU seconds spent busy by the whole machine so far (all CPUs, from /proc/stat), or None."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    # user nice system idle iowait irq softirq steal [guest guest_nice: already in user]
    busy = sum(fields[:8]) - fields[3] - fields[4]
    return busy / os.sysconf("SC_CLK_TCK")


def run(cmd, timeout):
    """Run cmd. Returns (stdout, wall seconds, child's peak RSS in MiB from wait4, others' share):
    others' share = CPU time the rest of the machine (other processes, the hypervisor's steal)
    used during the run, as a fraction of all CPUs x wall time; a contention indicator.
    Raises BenchError."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        busy0 = cpu_busy_seconds()
        t0 = time.monotonic()
        try:
            proc = subprocess.Popen(cmd, stdout=out, stderr=err, stdin=subprocess.DEVNULL)
        except OSError as e:
            raise BenchError(f"cannot run {cmd[0]}: {e}") from e
        # Reap with wait4 ourselves: it also gives the child's own rusage.
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() - t0 > timeout:
                proc.kill()
                os.wait4(proc.pid, 0)
                proc.returncode = -9
                raise BenchError(f"timed out after {timeout} s: {' '.join(cmd)}")
            time.sleep(0.02)
        wall = time.monotonic() - t0
        busy1 = cpu_busy_seconds()
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read().decode(errors="replace"), err.read().decode(errors="replace")
    if proc.returncode != 0:
        tail = "\n".join(stderr.strip().splitlines()[-15:])
        raise BenchError(f"exit status {proc.returncode}: {' '.join(cmd)}\n{tail}")
    others = None
    if busy0 is not None and busy1 is not None and wall > 0:
        own = usage.ru_utime + usage.ru_stime
        others = max(0.0, min(1.0, (busy1 - busy0 - own) / (wall * (os.cpu_count() or 1))))
    return stdout, wall, usage.ru_maxrss / 1024.0, others


def busy_note(others):
    return "" if others is None else f", others {100 * others:.0f}% CPU"


def last_json_object(text, what):
    for line in reversed(text.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                break
    raise BenchError(f"{what} printed no JSON object:\n{text[-2000:]}")


def run_probe(probe, threads, timeout, log):
    cmd = [probe, "--threads", str(threads), "--json"]
    stdout, wall, _, others = run(cmd, timeout)
    res = last_json_object(stdout, "rlx_probe")
    for key in ("read_gbps", "sgemm_gflops"):
        if not isinstance(res.get(key), (int, float)) or res[key] <= 0:
            raise BenchError(f"rlx_probe: bad or missing {key} in {res}")
    res["wall_s"] = round(wall, 2)
    res["others_cpu"] = None if others is None else round(others, 3)
    log(f"  probe: read {res['read_gbps']:.2f} GB/s, sgemm {res['sgemm_gflops']:.1f} GFLOP/s "
        f"(1024^3 {res.get('sgemm_1024_gflops', 0):.1f}) [{wall:.1f} s{busy_note(others)}]")
    return res


def run_rlx(rlx, model, args, log, plugin=None, extra=()):
    """One `rlx bench` of model with the settings in args, on plugin (default args.plugin), with
    extra flags. Returns (its JSON result with this run's wall time and wait4 peak RSS added, the
    command)."""
    cmd = [rlx, "bench", "--model", model, "-p", str(args.prompt), "-n", str(args.decode),
           "-r", str(args.reps), "--threads", str(args.threads), "--plugin", plugin or args.plugin, "--json",
           *extra]
    stdout, wall, wait4_rss, others = run(cmd, args.timeout)
    res = last_json_object(stdout, "rlx bench")
    for key in ("pp_tps", "tg_tps", "peak_rss_mb"):
        if not isinstance(res.get(key), (int, float)) or res[key] < 0:
            raise BenchError(f"rlx bench: bad or missing {key} in {res}")
    res["wait4_peak_rss_mb"] = round(wait4_rss, 1)
    res["wall_s"] = round(wall, 2)
    res["others_cpu"] = None if others is None else round(others, 3)
    log(f"  rlx bench ({res.get('backend', '?')}): pp{args.prompt} {res['pp_tps']:.2f} tok/s, tg{args.decode} {res['tg_tps']:.2f} tok/s, "
        f"peak RSS {res['peak_rss_mb']:.1f} MiB (wait4 {wait4_rss:.1f}) [{wall:.1f} s{busy_note(others)}]")
    return res, cmd


# ------------------------------------------------------------------------------------ report

def host_info():
    info = {"cpus": os.cpu_count()}
    try:
        with open("/proc/cpuinfo") as f:
            text = f.read()
        m = re.search(r"^model name\s*:\s*(.*)$", text, re.M)
        info["cpu"] = m.group(1) if m else "unknown"
        flags = re.search(r"^flags\s*:\s*(.*)$", text, re.M)
        flags = set(flags.group(1).split()) if flags else set()
        info["isa"] = [f for f in ("avx512f", "avx512_bf16", "avx2", "fma", "f16c") if f in flags]
        with open("/proc/loadavg") as f:
            info["loadavg_at_start"] = f.read().split()[:3]
    except OSError:
        pass
    return info


def evaluate(model, probes, benches):
    med = statistics.median
    read_gbps = med(p["read_gbps"] for p in probes)
    sgemm = med(p["sgemm_gflops"] for p in probes)
    pp = med(b["pp_tps"] for b in benches)
    tg = med(b["tg_tps"] for b in benches)
    # A peak is a peak: the largest over rounds, and the larger of rlx's and wait4's figure.
    rss_mib = max(max(b["peak_rss_mb"], b["wait4_peak_rss_mb"]) for b in benches)
    tg_ceiling = read_gbps * 1e9 / model["bytes_per_token"]
    pp_ceiling = sgemm * 1e9 / model["flops_per_prompt_token"]
    st_mib = model["safetensors_bytes"] / 1048576.0
    rows = {
        "rss": dict(measured=rss_mib, unit="MiB", reference=st_mib, reference_what="safetensors size",
                    ratio=rss_mib / st_mib),
        "tg": dict(measured=tg, unit="tok/s", reference=tg_ceiling, reference_what="bandwidth ceiling",
                   ratio=tg / tg_ceiling),
        "pp": dict(measured=pp, unit="tok/s", reference=pp_ceiling, reference_what="sgemm bound",
                   ratio=pp / pp_ceiling),
    }
    for key, label, op, limit in TARGETS:
        r = rows[key]
        ok = r["ratio"] <= limit if op == "<=" else r["ratio"] >= limit
        r.update(target=f"{op} {limit}", label=label, status="PASS" if ok else "BELOW" if op == ">=" else "ABOVE")
    ceilings = {"read_gbps": read_gbps, "sgemm_gflops": sgemm, "tg_ceiling_tps": tg_ceiling,
                "pp_ceiling_tps": pp_ceiling}
    return rows, ceilings


def print_report(model, probes, benches, rows, ceilings, args, log):
    log("")
    log(f"model {model['dir']}: {model['dtype']}, {model['safetensors_bytes'] / 1e9:.3f} GB safetensors, "
        f"{model['num_hidden_layers']} layers, {'tied' if model['tie_word_embeddings'] else 'untied'} LM head")
    log(f"  bytes read per decoded token   {model['bytes_per_token'] / 1e6:10.2f} MB "
        f"(layer matmuls {model['layer_matmul_bytes'] / 1e6:.2f} + LM head {model['lm_head_bytes'] / 1e6:.2f} + norms)")
    log(f"  FLOPs per prompt token (pp{args.prompt}) {model['flops_per_prompt_token'] / 1e9:10.4f} GFLOP "
        f"(2 x {model['matmul_params_per_layer'] / 1e6:.3f} M params x {model['num_hidden_layers']} layers "
        f"+ {model['lm_head_flops'] / 1e9:.4f} GFLOP LM head / {args.prompt})")
    reads = " / ".join(f"{p['read_gbps']:.2f}" for p in probes)
    gemms = " / ".join(f"{p['sgemm_gflops']:.1f}" for p in probes)
    log(f"  probe runs: read GB/s {reads} -> median {ceilings['read_gbps']:.2f}; "
        f"sgemm GFLOP/s {gemms} -> median {ceilings['sgemm_gflops']:.1f}")
    log("")
    head = f"{'metric':<16}{'measured':>16}  {'reference':>16}  {'':<18}{'ratio':>7}   {'target':<8}status"
    log(head)
    log("-" * len(head))
    names = {"rss": "peak RSS", "tg": f"decode tg{args.decode}", "pp": f"prefill pp{args.prompt}"}
    for key, _, _, _ in TARGETS:
        r = rows[key]
        measured, reference = f"{r['measured']:.2f} {r['unit']}", f"{r['reference']:.2f} {r['unit']}"
        log(f"{names[key]:<16}{measured:>16}  {reference:>16}  {r['reference_what']:<18}{r['ratio']:>7.3f}   "
            f"{r['target']:<8}{r['status']}")


def main(argv=None):
    ap = argparse.ArgumentParser(description="Benchmark rlx against ceilings measured in the same run.")
    ap.add_argument("--build", required=True, help="CMake build directory (Release)")
    ap.add_argument("--model", help="model directory (default: generate BUILD/bench-model)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--plugin", default="cpu-blas")
    ap.add_argument("-r", "--reps", type=int, default=5, help="rlx bench repetitions (median)")
    ap.add_argument("-p", "--prompt", type=int, default=128, help="prompt tokens (target: 128)")
    ap.add_argument("-n", "--decode", type=int, default=64, help="decode steps (target: 64)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="rlx bench + probe rounds after the first probe (default 1)")
    ap.add_argument("--timeout", type=float, default=600, help="seconds allowed per command")
    ap.add_argument("--out", help="results JSON (default: BUILD/bench-results.json)")
    args = ap.parse_args(argv)
    for name in ("threads", "reps", "prompt", "decode", "rounds"):
        if getattr(args, name) < 1:
            ap.error(f"--{name} must be at least 1")

    def log(msg):
        print(msg, flush=True)

    try:
        build = os.path.abspath(args.build)
        probe = os.path.join(build, "tests", "bench", "rlx_probe")
        rlx = os.path.join(build, "bin", "rlx")
        for path in (probe, rlx):
            if not os.access(path, os.X_OK):
                raise BenchError(f"{path} not found; build first (docs/BENCHMARKS.md)")
        model_dir = os.path.abspath(args.model) if args.model else ensure_model(build)
        model = model_stats(model_dir, args.prompt)

        started = datetime.datetime.now().astimezone()
        host = host_info()
        log(f"rlx benchmark {started.isoformat(timespec='seconds')}: {host.get('cpu', '?')}, "
            f"{host.get('cpus')} CPUs {','.join(host.get('isa', []))}, load {' '.join(host.get('loadavg_at_start', []))}; "
            f"threads {args.threads}, plugin {args.plugin}")
        t0 = time.monotonic()
        probes = [run_probe(probe, args.threads, args.timeout, log)]
        benches, rlx_cmd = [], None
        for _ in range(args.rounds):
            res, rlx_cmd = run_rlx(rlx, model_dir, args, log)
            benches.append(res)
            probes.append(run_probe(probe, args.threads, args.timeout, log))
        elapsed = time.monotonic() - t0

        if abs(benches[0].get("weights_mb", 0) * 1048576 - model["tensor_bytes"]) > 0.01 * model["tensor_bytes"]:
            log(f"note: rlx reports weights_mb {benches[0].get('weights_mb')}, the headers say "
                f"{model['tensor_bytes'] / 1048576:.1f} MiB")
        rows, ceilings = evaluate(model, probes, benches)
        print_report(model, probes, benches, rows, ceilings, args, log)
        log(f"\n(measured in {elapsed:.0f} s; ratios use the median of the probe runs around rlx bench)")
        busiest = max((r["others_cpu"] or 0) for r in probes + benches)
        if busiest > NOISY_SHARE:
            log(f"warning: other processes used up to {100 * busiest:.0f}% of the CPUs during a step: "
                f"the machine was shared, consider --rounds 3 or a quieter moment")

        result = {
            "date": started.isoformat(timespec="seconds"), "host": host,
            "settings": {"threads": args.threads, "plugin": args.plugin, "reps": args.reps,
                         "prompt": args.prompt, "decode": args.decode, "rounds": args.rounds},
            "rlx_command": rlx_cmd, "model": model, "probes": probes, "benches": benches,
            "ceilings": ceilings, "targets": rows,
            "all_pass": all(r["status"] == "PASS" for r in rows.values()),
            "elapsed_s": round(elapsed, 1),
        }
        out = args.out or os.path.join(build, "bench-results.json")
        with open(out, "w") as f:
            json.dump(result, f, indent=2)
            f.write("\n")
        log(f"results written to {out}")
        return 0
    except BenchError as e:
        print(f"run_bench.py: error: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"run_bench.py: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
