#!/usr/bin/python3
"""Many streams at once: rlx serve against llama-server, side by side in one run.

  serve_bench.py --build BUILD_DIR --model MODEL [--llama-server PATH --llama-model FILE.gguf]
                 [--streams 1,2,4,8] [--tokens 64] [--prompt-tokens 32] [--threads 2] [--reps 3]
                 [--out FILE.json]

Starts `rlx serve --parallel MAX` on MODEL (a Hugging Face directory or a GGUF file) and, when
given, `llama-server --parallel MAX` on the GGUF file (llama.cpp is never built here: pass the
path of one built elsewhere). For each number of concurrent streams, each stream sends one
streaming /v1/completions request (greedy, `max_tokens` TOKENS, a prompt of its own so no
server can reuse another's prefix) and the script measures:
  - aggregate decode rate: the text chunks (one per token) all streams received while every
    stream was decoding (after the last first token, before the first stream ended) over that
    window, so prompt reading does not count; with one stream, its tokens over its decode time;
  - time to first token (TTFT): from sending to the first content chunk, the median of the streams.
Each figure is the median over REPS rounds. The servers run one after the other on the same
host, with `lscpu` stored in the JSON, and `rlx generate` gives the single-stream reference
(the goal: one stream through the server within 5 % of it).

Goals (docs/BENCHMARKS.md): 8 streams give at least 5x the single-stream aggregate; at every
concurrency rlx is at least 1.3x llama-server. A missed goal is a result, not an error: the exit
status is 0 when the measurement worked, 1 on errors.
"""
import argparse
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time

GOALS = {"scaling_8": 5.0, "vs_llama": 1.3, "single_vs_generate": 0.95}


class BenchError(Exception):
    pass


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(port, proc, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise BenchError(f"server exited with status {proc.returncode} before it was ready")
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            c.request("GET", "/health")
            if c.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.5)
    raise BenchError(f"server on port {port} not healthy after {timeout} s")


def prompt_for(i, n_words):
    """A prompt of about n_words words that no other stream shares from its first word."""
    words = ["stream", str(i), "reads"] + [f"w{(i * 7919 + k * 104729) % 9973}" for k in range(n_words)]
    return " ".join(words[:n_words])


def one_stream(port, prompt, tokens, out, timeout):
    body = json.dumps({"prompt": prompt, "max_tokens": tokens, "temperature": 0, "stream": True,
                       "ignore_eos": True, "stream_options": {"include_usage": True}})
    t0 = time.monotonic()
    first = last = None
    n = 0
    usage = None
    stamps = []
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        c.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        r = c.getresponse()
        if r.status != 200:
            out["error"] = f"HTTP {r.status}: {r.read()[:300]!r}"
            return
        for raw in r:
            line = raw.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                break
            chunk = json.loads(data)
            if chunk.get("usage"):
                usage = chunk["usage"]
            for ch in chunk.get("choices", []):
                if ch.get("text"):
                    now = time.monotonic()
                    first = first or now
                    last = now
                    stamps.append(now)
                    n += 1
    except (OSError, ValueError) as e:
        out["error"] = f"{type(e).__name__}: {e}"
        return
    out.update(t0=t0, first=first, last=last, chunks=n, stamps=stamps,
               tokens=(usage or {}).get("completion_tokens", n))


def round_of(port, streams, tokens, prompt_words, timeout, rep):
    outs = [dict() for _ in range(streams)]
    threads = [threading.Thread(target=one_stream,
                                args=(port, prompt_for(rep * 100 + i, prompt_words), tokens, outs[i], timeout))
               for i in range(streams)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for o in outs:
        if "error" in o:
            raise BenchError(o["error"])
        if o["first"] is None:
            raise BenchError("a stream produced no text")
    ttft = statistics.median(o["first"] - o["t0"] for o in outs)
    # Steady decode: the window in which every stream has its first token and none has ended,
    # so no prompt is being read; the text chunks stamped in it over its length.
    lo, hi = max(o["first"] for o in outs), min(o["last"] for o in outs)
    in_window = sum(1 for o in outs for t in o["stamps"] if lo < t <= hi)
    if hi - lo > 0.5 and in_window >= 2 * streams:
        tps = in_window / (hi - lo)
    else:  # too short a window (one stream, or staggered ends): everything over the whole span
        total = sum(o["tokens"] for o in outs)
        span = max(o["last"] for o in outs) - min(o["first"] for o in outs)
        tps = total / span if span > 0 else 0.0
        lo, hi = min(o["first"] for o in outs), max(o["last"] for o in outs)
    # window: the monotonic seconds the rate covers (callers line other figures up with it)
    return {"decode_tps": tps, "ttft_s": ttft, "window": [lo, hi]}


def stop_server(proc, grace=30):
    """SIGTERM (the server drains), then SIGKILL after grace seconds; always reaped."""
    if proc.poll() is None:
        proc.terminate()
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def measure_streams(port, args, log, streams=None, after_round=None):
    """The rounds on a server that answers on port: a warm-up, then for each number of streams
    (default args.streams) args.reps rounds and their medians. after_round(streams, result), when
    given, runs after each round and may add figures to its result."""
    round_of(port, 1, 4, args.prompt_tokens, args.timeout, 99)  # warm-up
    res = {}
    for s in args.streams if streams is None else streams:
        rounds = []
        for r in range(args.reps):
            rounds.append(round_of(port, s, args.tokens, args.prompt_tokens, args.timeout, r))
            if after_round:
                after_round(s, rounds[-1])
        res[s] = {"decode_tps": statistics.median(r["decode_tps"] for r in rounds),
                  "ttft_s": statistics.median(r["ttft_s"] for r in rounds), "rounds": rounds}
        log(f"  {s} streams: {res[s]['decode_tps']:8.2f} tok/s aggregate, TTFT {res[s]['ttft_s'] * 1000:7.1f} ms")
    return res


def measure(name, cmd, port, args, log):
    log(f"{name}: {' '.join(cmd)}")
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_healthy(port, proc, args.timeout)
        return measure_streams(port, args, log)
    finally:
        stop_server(proc)


def rlx_generate_tps(args, log):
    """Single-stream decode rate of `rlx generate` on the same model (its --json statistics)."""
    cmd = [args.rlx, "generate", "--model", args.model, "--greedy", "-n", str(args.tokens), "--threads",
           str(args.threads), "--ignore-eos", "--json", "-p", prompt_for(0, args.prompt_tokens)] + args.common.split()
    rates = []
    for _ in range(args.reps):
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
        if p.returncode != 0:
            raise BenchError(f"rlx generate failed: {p.stderr.strip()[-300:]}")
        stats = json.loads(p.stdout.strip().splitlines()[-1])
        rates.append(stats["timings"]["generate_tokens_per_second"])
    log(f"rlx generate: {statistics.median(rates):.2f} tok/s (single stream)")
    return statistics.median(rates)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", required=True)
    ap.add_argument("--model", required=True, help="the model rlx serves (HF directory or GGUF)")
    ap.add_argument("--llama-server", help="a llama-server built elsewhere")
    ap.add_argument("--llama-model", help="the GGUF file llama-server serves (default: --model)")
    ap.add_argument("--streams", default="1,2,4,8")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--common", default="", help="rlx flags for both rlx serve and rlx generate, e.g. "
                    "'--cache-type-k f16 --cache-type-v f16' (llama-server's default cache type)")
    ap.add_argument("--extra", default="", help="more rlx serve flags")
    ap.add_argument("--out")
    args = ap.parse_args()
    args.streams = [int(x) for x in args.streams.split(",")]
    args.rlx = os.path.join(args.build, "bin", "rlx")
    lines = []

    def log(msg):
        print(msg, flush=True)
        lines.append(msg)

    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        top = max(args.streams)
        ctx = top * (args.prompt_tokens * 4 + args.tokens + 64)
        result = {"lscpu": lscpu, "args": vars(args), "goals": GOALS}
        result["rlx_generate_tps"] = rlx_generate_tps(args, log)
        port = free_port()
        result["rlx"] = measure("rlx serve", [args.rlx, "serve", "--model", args.model, "--port", str(port),
                                              "--parallel", str(top), "--ctx-size", str(ctx), "--threads",
                                              str(args.threads)] + args.common.split() + args.extra.split(), port, args,
                             log)
        if args.llama_server:
            port = free_port()
            result["llama"] = measure("llama-server", [args.llama_server, "-m", args.llama_model or args.model,
                                                        "--port", str(port), "--parallel", str(top), "-c", str(ctx),
                                                        "-t", str(args.threads), "--no-webui"], port, args, log)
    except (BenchError, subprocess.SubprocessError, OSError, ValueError, KeyError) as e:
        print(f"serve_bench: {e}", file=sys.stderr)
        return 1
    one = result["rlx"][args.streams[0]]["decode_tps"]
    log("")
    log("| streams | rlx tok/s | rlx TTFT ms | llama-server tok/s | llama-server TTFT ms | rlx / llama-server | rlx scaling |")
    log("|---|---|---|---|---|---|---|")
    for s in args.streams:
        r = result["rlx"][s]
        l = result.get("llama", {}).get(s)
        ratio = f"{r['decode_tps'] / l['decode_tps']:.2f}" if l else "-"
        log(f"| {s} | {r['decode_tps']:.2f} | {r['ttft_s'] * 1000:.1f} | {l['decode_tps'] if l else '-':{'.2f' if l else ''}} | "
            f"{l['ttft_s'] * 1000 if l else '-':{'.1f' if l else ''}} | {ratio} | {r['decode_tps'] / one:.2f} |")
    log(f"single stream through the server / rlx generate: {one / result['rlx_generate_tps']:.3f} "
        f"(goal >= {GOALS['single_vs_generate']})")
    result["log"] = lines
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
