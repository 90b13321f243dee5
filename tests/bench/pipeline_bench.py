#!/usr/bin/python3
"""Streams in flight through a pipeline: `rlx serve` over S stages against one process, in one run.

  pipeline_bench.py --build BUILD_DIR [--model DIR] [--tokenizer DIR] [--stages 1,2,3,4]
                    [--cores 2] [--streams 1,4] [--parallel P] [--transport tcp|grpc|mpi]
                    [--tokens 64] [--prompt-tokens 32] [--reps 3] [--rounds 1] [--out FILE.json]

For each S in --stages, starts S `rlx stage` processes on loopback (layers split as rlx splits
them by default, balancing the weights each stage reads, or evenly with --split even; each with
--cores / S threads, at least 1, so S > cores oversubscribes the cores), writes a deployment file naming them and runs
`rlx serve --config FILE --parallel P` as their driver; with --transport mpi the stages are
instead ranks 1..S of `mpirun -n S+1 rlx serve --config FILE` (the file's stage entries carry
their threads and backend options). Then the reference: one process, `rlx serve --parallel
max(streams) -t cores`. Every server gets the same backend options: cpu-blas's
batch_invariant=1 by default, which `rlx serve` turns on by itself in one process.

Each server is measured by serve_bench.py's code: a warm-up, then for each number of
concurrent streams (skipping, over a pipeline, more streams than its P slots) REPS rounds of
streaming greedy /v1/completions requests of TOKENS tokens; the aggregate decode rate counts
the tokens all streams received while every stream was decoding, over that window. While the
rounds run, a thread reads the server's /metrics every --poll seconds; the pipeline series
(rlx_pipeline_stage_step_seconds_{sum,count} and rlx_pipeline_stage_bytes_total{direction},
labelled stage, address, layers) between the first and the last reading inside each round's
decode window give, per stage (hop i = driver <-> stage i; stages never talk to each other):
milliseconds per step, tokens per step (generated tokens / the stage's steps), busy share
(its step seconds, send to answer as the driver sees it, over the wall time) and bytes per
generated token each way. Figures are medians over all rounds (REPS per server start, ROUNDS
server starts per configuration, the configurations taking turns within a round).

Goals (issue 15, at --goal-stages S = 2, P streams): aggregate decode >= 1.8x the same pipeline
with 1 stream, and >= 0.9x the one process serving the same streams. A missed goal is a result:
the exit status is 0 when everything ran, 1 when something failed, 2 on bad usage.

The model: without --model, the Qwen3-0.6B-shaped bench model (random BF16; run_bench.py
writes it once to BUILD/bench-model) with a tokenizer linked beside it as quant_bench.py does
(rlx serve needs one): Qwen3's own from --tokenizer DIR (default: the npm copy the text tests
install into the build tree), else the Brown tokenizer padded with plain tokens up to the
model's vocabulary (ids 4096 and up decode to text like " t4096"), so every generated token
still makes a text chunk; the tokenizer changes prompt lengths, not the decode work.
The JSON record (--out) holds `lscpu`, every command and deployment file, every round and the
per-stage figures.
"""
import argparse
import ctypes
import datetime
import http.client
import json
import os
import re
import select
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import run_bench  # noqa: E402
import serve_bench  # noqa: E402
from quant_bench import NPM_TOKENIZER, TOKENIZER_FILES, lscpu, source_model  # noqa: E402

GOALS = {"vs_one_stream": 1.8, "vs_one_process": 0.9}
BROWN = os.path.join(REPO, "share", "models", "brown", "target")
ERRORS = (run_bench.BenchError, serve_bench.BenchError, subprocess.SubprocessError, OSError, ValueError, KeyError)

# ------------------------------------------------------------------------------- processes

_libc = ctypes.CDLL(None, use_errno=True)


def _die_with_parent():
    """In the child: SIGTERM when this script dies, however it dies (PR_SET_PDEATHSIG)."""
    _libc.prctl(1, signal.SIGTERM)


class Processes:
    """Every process this script starts, each in its own process group, stopped by its id at the
    end: SIGTERM, then SIGKILL to its group after a grace period (mpirun's ranks included)."""

    def __init__(self):
        self.procs = []

    def start(self, cmd, log_path, **kw):
        f = open(log_path, "ab")
        f.write(("$ " + " ".join(cmd) + "\n").encode())
        f.flush()
        offset = f.tell()
        try:
            p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT,
                                 start_new_session=True, preexec_fn=_die_with_parent, **kw)
        finally:
            f.close()
        p.log_path, p.log_offset = log_path, offset  # logs are appended to: this start's output begins there
        self.procs.append(p)
        return p

    def stop(self, procs, grace=20):
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        for p in procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            try:  # whatever is left of its group (a rank mpirun did not stop)
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            if p.poll() is None:
                p.wait()
            if p in self.procs:
                self.procs.remove(p)

    def stop_all(self):
        self.stop(list(reversed(self.procs)))


def log_text(proc):
    """What proc wrote to its log so far."""
    try:
        with open(proc.log_path, "rb") as f:
            f.seek(proc.log_offset)
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def log_tail(proc, n=15):
    return "\n".join(log_text(proc).strip().splitlines()[-n:])


RANK0_LISTENING = re.compile(r"\[\d+,0\]<stderr>:.*listening on http://127\.0\.0\.1:(\d+)")


def rank0_port(proc, timeout):
    """The HTTP port rank 0 of `mpirun --tag-output rlx serve --port 0` reports in its log."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        m = RANK0_LISTENING.search(log_text(proc))
        if m:
            return int(m.group(1))
        if proc.poll() is not None:
            raise serve_bench.BenchError(f"mpirun exited with status {proc.returncode}:\n{log_tail(proc)}")
        time.sleep(0.2)
    raise serve_bench.BenchError(f"rank 0 reported no HTTP port within {timeout:.0f} s")


def session_cpu_seconds(sids):
    """CPU seconds used so far by the live processes of these sessions (each started process
    leads its own: this counts mpirun's ranks and every stage's threads)."""
    total, tick = 0.0, os.sysconf("SC_CLK_TCK")
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[3]) in sids:  # fields after the command: state ppid pgrp session ... utime stime
            total += (int(fields[11]) + int(fields[12])) / tick
    return total


class CpuShare:
    """Over a stretch of time: the share of all CPUs this script's processes used (own) and the
    share the rest of the machine used (others, run_bench.py's contention indicator)."""

    def __init__(self, procs):
        self.sids = {p.pid for p in procs}
        self.t0, self.busy0, self.own0 = time.monotonic(), run_bench.cpu_busy_seconds(), session_cpu_seconds(self.sids)

    def result(self):
        wall, busy, own = time.monotonic() - self.t0, run_bench.cpu_busy_seconds(), session_cpu_seconds(self.sids)
        cpus = os.cpu_count() or 1
        if wall <= 0 or busy is None or self.busy0 is None:
            return {"own_cpu": None, "others_cpu": None}
        own_share = max(0.0, (own - self.own0) / (wall * cpus))
        others = max(0.0, min(1.0, (busy - self.busy0) / (wall * cpus) - own_share))
        return {"own_cpu": round(own_share, 3), "others_cpu": round(others, 3)}


def wait_ready_fd(proc, fd, timeout, what):
    """The address line a stage writes to its --ready-fd once it listens."""
    deadline, buf = time.monotonic() + timeout, b""
    while b"\n" not in buf:
        left = deadline - time.monotonic()
        if left <= 0:
            raise serve_bench.BenchError(f"{what} did not listen within {timeout:.0f} s")
        r, _, _ = select.select([fd], [], [], min(left, 1.0))
        if r:
            chunk = os.read(fd, 300)
            if not chunk:
                raise serve_bench.BenchError(f"{what} exited with status {proc.wait()} before listening:\n"
                                             f"{log_tail(proc)}")
            buf += chunk
    return buf.split(b"\n", 1)[0].decode()


# ---------------------------------------------------------------------------------- model

def padded_brown_tokenizer(workdir, vocab_size):
    """WORKDIR/tokenizer-padded: the Brown tokenizer with plain vocabulary entries ' tN' for every
    id from its last one up to vocab_size (no merges make them; only decoding meets them)."""
    out = os.path.join(workdir, "tokenizer-padded")
    if os.path.exists(os.path.join(out, "tokenizer.json")):
        return out
    with open(os.path.join(BROWN, "tokenizer.json")) as f:
        tok = json.load(f)
    used = set(tok["model"]["vocab"].values()) | {t["id"] for t in tok["added_tokens"]}
    for i in range(vocab_size):
        if i not in used:
            tok["model"]["vocab"][f"\u0120t{i}"] = i  # byte-level spelling of " t<i>"
    tmp = out + ".partial"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    with open(os.path.join(tmp, "tokenizer.json"), "w") as f:
        json.dump(tok, f, ensure_ascii=False)
    shutil.copy(os.path.join(BROWN, "tokenizer_config.json"), tmp)
    os.rename(tmp, out)
    return out


def prepare_model(args, build, log):
    """(model directory rlx serve can run, which tokenizer it has)."""
    if args.model and os.path.exists(os.path.join(args.model, "tokenizer.json")):
        return os.path.abspath(args.model), "the model's own"
    bench = os.path.abspath(args.model) if args.model else run_bench.ensure_model(build)
    tok_dir = os.path.abspath(args.tokenizer or os.path.join(build, NPM_TOKENIZER))
    if all(os.path.exists(os.path.join(tok_dir, n)) for n in TOKENIZER_FILES):
        # quant_bench.py's folder of links when it is the bench model with the npm tokenizer
        workdir = os.path.join(build, "bench-gguf") if not args.model and not args.tokenizer else \
            os.path.join(args.workdir, "qwen3-tokenizer")
        return source_model(bench, workdir, tok_dir), tok_dir
    if args.tokenizer:
        raise serve_bench.BenchError(f"{tok_dir} has no {' and '.join(TOKENIZER_FILES)}")
    with open(os.path.join(bench, "config.json")) as f:
        vocab = json.load(f)["vocab_size"]
    log(f"no Qwen3 tokenizer at {tok_dir}: using the Brown tokenizer padded to {vocab} ids")
    pad = padded_brown_tokenizer(args.workdir, vocab)
    return source_model(bench, os.path.join(args.workdir, "padded-tokenizer"), pad), "brown-padded"


def split_even(n_layers, n_stages):
    """Inclusive (first, last) layer of each stage, as rlx_dist_split_even (core/src/dist/split.c)."""
    base, extra, start, out = n_layers // n_stages, n_layers % n_stages, 0, []
    for i in range(n_stages):
        n = base + (i < extra)
        out.append((start, start + n - 1))
        start += n
    return out


# -------------------------------------------------------------------------------- metrics

SERIES = re.compile(r"^([A-Za-z_:][\w:]*)(?:\{(.*)\})?\s+(\S+)$")
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def parse_metrics(text):
    """{"tokens", "engine_busy", "stages": {i: {steps, seconds, sent, received, layers, address}}}."""
    out = {"stages": {}}
    for line in text.splitlines():
        m = SERIES.match(line)
        if not m or line.startswith("#"):
            continue
        name, labels, value = m.group(1), dict(LABEL.findall(m.group(2) or "")), float(m.group(3))
        if name == "rlx_generated_tokens_total":
            out["tokens"] = value
        elif name == "rlx_engine_busy_seconds_total":
            out["engine_busy"] = value
        elif name.startswith("rlx_pipeline_stage_") and "stage" in labels:
            st = out["stages"].setdefault(int(labels["stage"]), {"layers": labels.get("layers"),
                                                                 "address": labels.get("address")})
            key = {"rlx_pipeline_stage_step_seconds_sum": "seconds",
                   "rlx_pipeline_stage_step_seconds_count": "steps"}.get(name)
            if name == "rlx_pipeline_stage_bytes_total":
                key = labels.get("direction")
            if key:
                st[key] = value
    return out


class MetricsPoller:
    """Reads /metrics every interval seconds on a thread of its own: (monotonic time, parsed)."""

    def __init__(self, port, interval):
        self.port, self.interval = port, interval
        self.snaps, self.errors = [], 0
        self.halt = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def read(self):
        t0 = time.monotonic()
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            c.request("GET", "/metrics")
            r = c.getresponse()
            body = r.read().decode(errors="replace")
            if r.status != 200:
                raise OSError(f"/metrics answered {r.status}")
        finally:
            c.close()
        return ((t0 + time.monotonic()) / 2, parse_metrics(body))

    def run(self):
        while not self.halt.is_set():
            try:
                self.snaps.append(self.read())
            except OSError:
                self.errors += 1
            self.halt.wait(self.interval)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.halt.set()
        self.thread.join(timeout=15)

    def window_figures(self, lo, hi):
        """Per-stage figures between the first and the last reading inside [lo, hi], or None."""
        inside = [s for s in self.snaps if lo <= s[0] <= hi]
        if len(inside) < 2:
            return None
        (t0, a), (t1, b) = inside[0], inside[-1]
        dt, tokens = t1 - t0, b.get("tokens", 0) - a.get("tokens", 0)
        if dt <= 0 or tokens <= 0:
            return None
        fig = {"seconds": dt, "tokens": tokens, "engine_busy": (b.get("engine_busy", 0) - a.get("engine_busy", 0)) / dt,
               "stages": []}
        for i in sorted(b["stages"]):
            sa, sb = a["stages"].get(i, {}), b["stages"][i]
            d = {k: sb.get(k, 0) - sa.get(k, 0) for k in ("steps", "seconds", "sent", "received")}
            fig["stages"].append({
                "stage": i, "layers": sb.get("layers"), "address": sb.get("address"), "steps": d["steps"],
                "ms_per_step": 1e3 * d["seconds"] / d["steps"] if d["steps"] else None,
                "tokens_per_step": tokens / d["steps"] if d["steps"] else None,
                "busy": d["seconds"] / dt,
                "bytes_sent_per_token": d["sent"] / tokens, "bytes_received_per_token": d["received"] / tokens})
        return fig


# ---------------------------------------------------------------------------------- runs

def backend_args(args):
    return ["--plugin", args.plugin] + (["--backend-opts", args.backend_opts] if args.backend_opts else [])


def serve_common(args, port, parallel):
    return ["--host", "127.0.0.1", "--port", str(port), "--parallel", str(parallel), "--slot-ctx",
            str(args.slot_ctx)] + args.extra.split()


def write_deployment(path, model, transport, stages):
    """A deployment file (README.md, "The deployment file") for these stages."""
    lines = ["# written by tests/bench/pipeline_bench.py", f"model: {json.dumps(model)}", f"transport: {transport}",
             "stages:"]
    for st in stages:
        lines.append(f"  - address: {json.dumps(st['address'])}")
        if st.get("listen"):
            lines.append(f"    listen: {json.dumps(st['listen'])}")
        if st["layers"]:
            lines.append(f"    layers: {st['layers'][0]}-{st['layers'][1]}")
        lines.append(f"    backend: {st['backend']}")
        if st.get("backend_options"):
            lines.append(f"    backend_options: {json.dumps(st['backend_options'])}")
        lines.append(f"    threads: {st['threads']}")
    text = "\n".join(lines) + "\n"
    with open(path, "w") as f:
        f.write(text)
    return text


def measure_server(proc, port, args, streams, procs, log):
    """serve_bench's rounds on a running server, with the /metrics figures of each round's window
    and the CPU shares of the measurement (procs: every process of this configuration)."""
    serve_bench.wait_healthy(port, proc, args.timeout)
    share = CpuShare(procs)
    with MetricsPoller(port, args.poll) as poller:
        def after_round(_streams, rnd):
            rnd["metrics"] = poller.window_figures(*rnd["window"])
        res = serve_bench.measure_streams(port, args, log, streams=streams, after_round=after_round)
    cpu = share.result()
    log(f"  CPU: this configuration {pct(cpu['own_cpu'])} of the cores"
        f"{run_bench.busy_note(cpu['others_cpu'])}")
    for r in res.values():
        r.update(cpu)
    for s, r in res.items():
        fig = [rnd["metrics"] for rnd in r["rounds"] if rnd.get("metrics")]
        for f in fig[:1]:
            for st in f["stages"]:
                log(f"    stage {st['stage']} ({st['layers']}): {st['ms_per_step'] or 0:.1f} ms/step, "
                    f"{st['tokens_per_step'] or 0:.2f} tok/step, busy {100 * st['busy']:.0f} %, "
                    f"{st['bytes_sent_per_token']:.0f} B/token sent, {st['bytes_received_per_token']:.0f} received")
    return res


def run_pipeline(n_stages, args, procs, log):
    threads = max(1, args.cores // n_stages)
    # None: rlx's own split, which balances the weights each stage reads (rlx_dist_split_balanced);
    # the stages take it from a deployment file without layers, as the driver does
    layers = split_even(args.n_layers, n_stages) if args.split == "even" else [None] * n_stages
    run_dir = os.path.join(args.workdir, f"s{n_stages}-{args.transport}")
    os.makedirs(run_dir, exist_ok=True)
    stages = [{"layers": layers[i], "threads": threads, "backend": args.plugin, "backend_options": args.backend_opts}
              for i in range(n_stages)]
    port = serve_bench.free_port()
    started, commands, server = [], [], None
    try:
        if args.transport == "mpi":
            for i, st in enumerate(stages):
                st["address"] = f"rank:{i + 1}"
            cfg = os.path.join(run_dir, "deploy.yaml")
            deploy = write_deployment(cfg, args.serve_model, args.transport, stages)
            # every rank starts as rlx serve and opens its HTTP port before ranks 1..S become
            # stages: port 0 keeps them apart, and rank 0's tagged line says which port is its
            port = 0
            cmd = args.mpirun + ["--tag-output", "-n", str(n_stages + 1), args.rlx, "serve", "--config", cfg] + \
                serve_common(args, port, args.parallel)
        else:
            # the stages read their entries from a file of their own: every one binds a free port
            # (the address is a placeholder), and the driver's file then names the ports they took
            for st in stages:
                st["address"], st["listen"] = "127.0.0.1:1", "127.0.0.1:0"
            stage_cfg = os.path.join(run_dir, "stages.yaml")
            write_deployment(stage_cfg, args.serve_model, args.transport, stages)
            for st in stages:
                del st["listen"]
            for i, st in enumerate(stages):
                r, w = os.pipe()
                cmd = [args.rlx, "stage", "--config", stage_cfg, "--stage", str(i), "--transport", args.transport,
                       "--ready-fd", str(w)] + backend_args(args) + args.stage_extra.split()
                commands.append(cmd)
                try:
                    p = procs.start(cmd, os.path.join(run_dir, f"stage{i}.log"), pass_fds=(w,))
                finally:
                    os.close(w)
                started.append(p)
                try:
                    st["address"] = wait_ready_fd(p, r, args.timeout, f"stage {i}")
                finally:
                    os.close(r)
            cfg = os.path.join(run_dir, "deploy.yaml")
            deploy = write_deployment(cfg, args.serve_model, args.transport, stages)
            cmd = [args.rlx, "serve", "--config", cfg] + serve_common(args, port, args.parallel)
        commands.append(cmd)
        name = f"{n_stages} stage{'s' if n_stages > 1 else ''} x {threads} thread{'s' if threads > 1 else ''}"
        log(f"{name} ({args.transport}), --parallel {args.parallel}: {' '.join(cmd)}")
        server = procs.start(cmd, os.path.join(run_dir, "serve.log"))
        started.append(server)
        if not port:
            port = rank0_port(server, args.timeout)
        streams = [s for s in args.streams if s <= args.parallel]
        skipped = [s for s in args.streams if s > args.parallel]
        if skipped:
            log(f"  skipped {','.join(map(str, skipped))} streams: more than the {args.parallel} slot(s)")
        try:
            res = measure_server(server, port, args, streams, started, log)
        except ERRORS as e:
            raise serve_bench.BenchError(f"{name}: {e}\n{log_tail(server)}") from e
    finally:
        if server:
            procs.stop([server])  # the driver first: it ends its session with the stages
        procs.stop(started)
    return {"stages": n_stages, "threads": threads, "layers": layers, "parallel": args.parallel,
            "oversubscribed": n_stages * threads > args.cores, "commands": commands, "deployment": deploy,
            "streams": res}


def run_reference(args, procs, log):
    port = serve_bench.free_port()
    top = max(args.streams)
    cmd = [args.rlx, "serve", "--model", args.serve_model, "--threads", str(args.cores)] + backend_args(args) + \
        serve_common(args, port, top)
    log(f"one process x {args.cores} threads, --parallel {top}: {' '.join(cmd)}")
    run_dir = os.path.join(args.workdir, "reference")
    os.makedirs(run_dir, exist_ok=True)
    server = procs.start(cmd, os.path.join(run_dir, "serve.log"))
    try:
        res = measure_server(server, port, args, args.streams, [server], log)
    except ERRORS as e:
        raise serve_bench.BenchError(f"reference: {e}\n{log_tail(server)}") from e
    finally:
        procs.stop([server])
    return {"stages": 0, "threads": args.cores, "parallel": top, "oversubscribed": False, "commands": [cmd],
            "streams": res}


# -------------------------------------------------------------------------------- summary

def med(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def summarize(runs):
    """Medians over every round of every start of a configuration: {streams: {...}}."""
    out = {}
    for s in sorted({s for r in runs for s in r["streams"]}):
        rounds = [rnd for r in runs if s in r["streams"] for rnd in r["streams"][s]["rounds"]]
        figs = [rnd["metrics"] for rnd in rounds if rnd.get("metrics")]
        stages = []
        for i in sorted({st["stage"] for f in figs for st in f["stages"]}):
            per = [st for f in figs for st in f["stages"] if st["stage"] == i]
            keys = ("ms_per_step", "tokens_per_step", "busy", "bytes_sent_per_token", "bytes_received_per_token")
            stages.append({"stage": i, "layers": per[0]["layers"], **{k: med(st[k] for st in per) for k in keys}})
        cpu = {k: med(r["streams"][s].get(k) for r in runs if s in r["streams"]) for k in ("own_cpu", "others_cpu")}
        out[s] = {"decode_tps": med(r["decode_tps"] for r in rounds), "ttft_s": med(r["ttft_s"] for r in rounds),
                  "rounds": len(rounds), "windows_with_metrics": len(figs),
                  "engine_busy": med(f["engine_busy"] for f in figs), "stages": stages, **cpu}
    return out


def fmt(v, spec, none="-"):
    return none if v is None else format(v, spec)


def pct(v):
    return fmt(None if v is None else 100 * v, ".0f", "?") + " %"


def ratio(a, b):
    return a / b if a and b else None


def run_label(r):
    if not r["stages"]:
        return "one process"
    return f"{r['stages']} stage{'s' if r['stages'] > 1 else ''}" + (" (oversubscribed)" if r["oversubscribed"] else "")


def report(results, args, log):
    ref = results.get("reference")
    log("")
    log("| run | threads per stage | slots | streams | decode t/s (aggregate) | TTFT ms | vs 1 stream | "
        "vs one process, same streams | CPU: run / others |")
    log("|---|---|---|---|---|---|---|---|---|")
    for key, r in results.items():
        one = r["summary"].get(1, {}).get("decode_tps")
        for s, f in r["summary"].items():
            vs_ref = ref["summary"].get(s, {}).get("decode_tps") if ref and key != "reference" else None
            log(f"| {run_label(r)} | {r['threads']} | {r['parallel']} | {s} | {fmt(f['decode_tps'], '.2f')} | "
                f"{fmt(f['ttft_s'] and f['ttft_s'] * 1000, '.0f')} | {fmt(ratio(f['decode_tps'], one), '.2f')} | "
                f"{fmt(ratio(f['decode_tps'], vs_ref), '.2f')} | {pct(f['own_cpu'])} / {pct(f['others_cpu'])} |")
    pipes = [(k, r) for k, r in results.items() if k != "reference"]
    if any(f["stages"] for _, r in pipes for f in r["summary"].values()):
        log("")
        log("Per hop (driver <-> stage i), in the decode window; bytes per generated token:")
        log("")
        log("| run | streams | stage | layers | ms per step | tokens per step | busy | bytes to stage | "
            "bytes from stage |")
        log("|---|---|---|---|---|---|---|---|---|")
        for _, r in pipes:
            for s, f in r["summary"].items():
                for st in f["stages"]:
                    log(f"| {run_label(r)} | {s} | {st['stage']} | {st['layers']} | {fmt(st['ms_per_step'], '.1f')} | "
                        f"{fmt(st['tokens_per_step'], '.2f')} | {pct(st['busy'])} | "
                        f"{fmt(st['bytes_sent_per_token'], ',.0f')} | {fmt(st['bytes_received_per_token'], ',.0f')} |")
    goals = {}
    g = results.get(f"s{args.goal_stages}")
    top = max(args.streams)
    if g:
        many, one = g["summary"].get(top, {}).get("decode_tps"), g["summary"].get(1, {}).get("decode_tps")
        refm = ref["summary"].get(top, {}).get("decode_tps") if ref else None
        goals["vs_one_stream"] = ratio(many, one) if top > 1 else None
        goals["vs_one_process"] = ratio(many, refm)
    log("")
    for k, what in (("vs_one_stream", f"{args.goal_stages} stages, {top} streams / 1 stream"),
                    ("vs_one_process", f"{args.goal_stages} stages / one process, {top} streams")):
        v = goals.get(k)
        verdict = "not measured" if v is None else ("met" if v >= GOALS[k] else "missed")
        log(f"goal {what}: {fmt(v, '.2f')} (>= {GOALS[k]}): {verdict}")
    return goals


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", required=True, help="CMake build directory (Release)")
    ap.add_argument("--model", help="model directory (default: BUILD/bench-model with a tokenizer linked in)")
    ap.add_argument("--tokenizer", help="directory with Qwen3's tokenizer.json and tokenizer_config.json "
                    "(default: the npm copy in the build tree, else the padded Brown tokenizer)")
    ap.add_argument("--workdir", help="deployment files, logs, tokenizer links (default BUILD/pipeline-bench)")
    ap.add_argument("--stages", default="1,2,3,4", help="stage counts S, comma-separated")
    ap.add_argument("--cores", type=int, default=2, help="cores to divide: each of S stages gets cores/S threads "
                    "(at least 1); the one process gets all")
    ap.add_argument("--streams", default="1,4", help="concurrent streams, comma-separated")
    ap.add_argument("--parallel", type=int, help="slots of the pipeline server (default: the most streams; "
                    "1 is what a pipeline takes before issue 15)")
    ap.add_argument("--transport", default="tcp", choices=("tcp", "grpc", "mpi"))
    ap.add_argument("--plugin", default="cpu-blas")
    ap.add_argument("--backend-opts", help="backend options of every stage and of the one process "
                    "(default for cpu-blas: batch_invariant=1, what rlx serve turns on by itself)")
    ap.add_argument("--no-reference", action="store_true", help="skip the one-process server")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--prompt-tokens", type=int, default=32, help="words per prompt (serve_bench.py's)")
    ap.add_argument("--reps", type=int, default=3, help="rounds per server start")
    ap.add_argument("--rounds", type=int, default=1, help="server starts per configuration, taking turns")
    ap.add_argument("--goal-stages", type=int, default=2)
    ap.add_argument("--split", default="weights", choices=("weights", "even"),
                    help="layers per stage: rlx's own split, which balances the weights each stage reads (the "
                    "last holds the LM head), or an even split by layer count")
    ap.add_argument("--poll", type=float, default=0.25, help="seconds between /metrics readings")
    ap.add_argument("--timeout", type=float, default=600, help="seconds allowed for a start and a request")
    ap.add_argument("--extra", default="", help="more rlx serve flags (every server)")
    ap.add_argument("--stage-extra", default="", help="more rlx stage flags (tcp, grpc)")
    ap.add_argument("--out", help="results JSON")
    args = ap.parse_args(argv)
    try:
        args.stages = [int(x) for x in args.stages.split(",") if x.strip()]
        args.streams = sorted({int(x) for x in args.streams.split(",") if x.strip()})
    except ValueError:
        ap.error("--stages and --streams take comma-separated numbers")
    if not args.stages or not args.streams or min(args.stages + args.streams) < 1 or args.cores < 1:
        ap.error("--stages, --streams and --cores need numbers of at least 1")
    for name in ("tokens", "prompt_tokens", "reps", "rounds"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be at least 1")
    args.parallel = args.parallel or max(args.streams)
    if args.backend_opts is None:
        args.backend_opts = "batch_invariant=1" if args.plugin == "cpu-blas" else ""
    build = os.path.abspath(args.build)
    args.rlx = os.path.join(build, "bin", "rlx")
    args.workdir = os.path.abspath(args.workdir or os.path.join(build, "pipeline-bench"))
    args.slot_ctx = args.prompt_tokens * 4 + args.tokens + 64  # serve_bench.py's room per stream
    lines = []

    def log(msg):
        print(msg, flush=True)
        lines.append(msg)

    procs = Processes()
    previous = {sig: signal.signal(sig, lambda *_: sys.exit(1)) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        if not os.access(args.rlx, os.X_OK):
            raise serve_bench.BenchError(f"{args.rlx} is not an executable")
        os.makedirs(args.workdir, exist_ok=True)
        if args.transport == "mpi":
            sys.path.insert(0, os.path.join(REPO, "tests", "pipeline"))
            from types import SimpleNamespace
            import test_pipeline  # its Mpirun: the flags Open MPI needs on one machine
            try:
                args.mpirun = test_pipeline.Mpirun(SimpleNamespace(rlx=args.rlx)).base
            except test_pipeline.Skip as e:
                raise serve_bench.BenchError(str(e)) from e
        args.serve_model, tokenizer = prepare_model(args, build, log)
        with open(os.path.join(args.serve_model, "config.json")) as f:
            args.n_layers = json.load(f)["num_hidden_layers"]
        if max(args.stages) > args.n_layers:
            raise serve_bench.BenchError(f"{max(args.stages)} stages for {args.n_layers} layers")
        cpu = lscpu()
        started = datetime.datetime.now().astimezone()
        log(f"pipeline benchmark {started.isoformat(timespec='seconds')}: "
            f"{next((ln.split(':', 1)[1].strip() for ln in cpu.splitlines() if ln.startswith('Model name')), '?')}, "
            f"{os.cpu_count()} CPUs, load {' '.join(open('/proc/loadavg').read().split()[:3])}; model "
            f"{args.serve_model} (tokenizer: {tokenizer}); {args.cores} cores divided; transport {args.transport}")
        configs = [f"s{s}" for s in args.stages] + ([] if args.no_reference else ["reference"])
        runs = {c: [] for c in configs}
        for rnd in range(args.rounds):
            if args.rounds > 1:
                log(f"round {rnd + 1} of {args.rounds}")
            for c in configs:
                runs[c].append(run_reference(args, procs, log) if c == "reference"
                               else run_pipeline(int(c[1:]), args, procs, log))
        results = {}
        for c in configs:
            first = runs[c][0]
            results[c] = {k: v for k, v in first.items() if k != "streams"}
            results[c]["summary"] = summarize(runs[c])
            results[c]["runs"] = [r["streams"] for r in runs[c]]
        goals = report(results, args, log)
        if args.out:
            record = {"lscpu": cpu, "host": run_bench.host_info(), "started": started.isoformat(timespec="seconds"),
                      "args": {k: v for k, v in vars(args).items()}, "tokenizer": tokenizer, "goals": GOALS,
                      "goal_ratios": goals, "results": results, "log": lines}
            with open(args.out, "w") as f:
                json.dump(record, f, indent=1, default=str)
    except ERRORS as e:
        print(f"pipeline_bench: {e}", file=sys.stderr)
        return 1
    finally:
        procs.stop_all()
        for sig, h in previous.items():
            signal.signal(sig, h)
    return 0


if __name__ == "__main__":
    sys.exit(main())
