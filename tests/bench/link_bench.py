#!/usr/bin/python3
"""What link security costs a pipeline: plaintext, a shared token and mutual TLS, over tcp and grpc.

  link_bench.py --build BUILD_DIR [--model DIR] [--transports tcp,grpc] [--modes plain,token,tls]
                [--rounds 3] [-p 128] [-n 64] [-r 3] [--threads 1] [--connect-reps 8]
                [--quant TYPE] [--workdir DIR] [--timeout 600] [--out FILE.json]

For every transport T and mode M (a configuration), starts 2 `rlx stage` processes on loopback
(layers split as rlx splits them by default; --threads backend threads each), all of them at
the start, and writes a deployment file naming them:
  plain  no credentials (stages on loopback need none)
  token  `auth: {token_file: ...}`: a fresh 64-character token in a mode-600 file, on both sides
  tls    `tls: {ca, cert, key}`: certificates from tests/transport/make_certs.sh (the stages show
         stage.pem, the driver driver.pem; both chain to ca.pem and name 127.0.0.1)
Each stage's log must say the mode it was started in ("no credentials" or "drivers must
authenticate: ..."), so a configuration cannot silently run another mode.

Then ROUNDS rounds; in each, every configuration in turn (the order rotated by one each round,
so no configuration always runs first or last after the same neighbour):
  connect  CONNECT_REPS times `rlx generate --config FILE --tokens 1 -n 1 --greedy --ctx-size 16`,
           wall time: a driver process that connects and authenticates to both stages, opens a
           session (16 positions: a KV cache too small to weigh) and computes one position. Its
           difference to plain is what the handshakes cost.
  bench    `rlx bench --config FILE --json -p P -n N -r R -t 1`: medians of R repetitions of
           prefill (ppP) and decode (tgN) tokens/s, and per stage ms per step and bytes per token.
Reported per configuration: medians over the rounds of pp and tg tokens/s, the ratios token/plain
and tls/plain per transport (of those medians, and the median of the per-round ratios: the
configurations of a round ran within a minute of each other, so a paired ratio cancels slower
drift of the machine), the median connect wall time, and the CPU share the rest of the machine
used during the bench runs (others; the stages' CPU is not counted as others).

The model: without --model, the Qwen3-0.6B-shaped bench model (random BF16; run_bench.py writes
it once to BUILD/bench-model). --quant q4_k_m quantizes it in memory on the stages (as
pipeline_bench.py does). The JSON record (--out) holds `lscpu`, the host, every command and
deployment file, and every round. Exit status: 0 when everything ran, 1 when something failed,
2 on bad usage. Every process this script starts is stopped when it ends, however it ends.
"""
import argparse
import datetime
import json
import os
import secrets
import signal
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.dont_write_bytecode = True  # no __pycache__ in the source tree
import run_bench  # noqa: E402
from pipeline_bench import Processes, log_tail, log_text, session_cpu_seconds, wait_ready_fd  # noqa: E402
from quant_bench import lscpu  # noqa: E402

MAKE_CERTS = os.path.join(REPO, "tests", "transport", "make_certs.sh")
MODES = ("plain", "token", "tls")
TRANSPORTS = ("tcp", "grpc")
# what a stage logs on start in each mode (core/src/dist/stage.c, check_listen_address)
MODE_LOG = {"plain": "no credentials", "token": "drivers must authenticate: the auth token",
            "tls": "drivers must authenticate: TLS with a certificate of the CA"}
BenchError = run_bench.BenchError
ERRORS = (BenchError, subprocess.SubprocessError, OSError, ValueError, KeyError)


# ---------------------------------------------------------------------------------- credentials

def write_token(path):
    """A fresh token of 64 hex characters in a file only its owner may read (rlx refuses others)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, (secrets.token_hex(32) + "\n").encode())
    finally:
        os.close(fd)
    os.chmod(path, 0o600)  # an existing file keeps its mode through O_CREAT
    return path


def make_certs(out):
    res = subprocess.run(["sh", MAKE_CERTS, out], capture_output=True, text=True, timeout=120)
    if res.returncode != 0:
        raise BenchError(f"{MAKE_CERTS} failed:\n{res.stderr[-2000:]}")
    return out


def credentials(mode, side, workdir):
    """The deployment file's auth:/tls: lines of mode for side ('stage' or 'driver')."""
    if mode == "token":
        return ["auth:", f"  token_file: {json.dumps(os.path.join(workdir, 'pipeline.token'))}"]
    if mode == "tls":
        certs = os.path.join(workdir, "certs")
        return ["tls:", f"  ca: {json.dumps(os.path.join(certs, 'ca.pem'))}",
                f"  cert: {json.dumps(os.path.join(certs, side + '.pem'))}",
                f"  key: {json.dumps(os.path.join(certs, side + '.key'))}"]
    return []


def write_deployment(path, args, transport, mode, side, addresses, listen=None):
    """A deployment file (README.md, "The deployment file") without layers: rlx's default split."""
    lines = ["# written by tests/bench/link_bench.py", f"model: {json.dumps(args.model)}", f"transport: {transport}"]
    lines += credentials(mode, side, args.workdir)
    lines.append("stages:")
    for addr in addresses:
        lines.append(f"  - address: {json.dumps(addr)}")
        if listen:
            lines.append(f"    listen: {json.dumps(listen)}")
        lines.append(f"    backend: {args.plugin}")
        if args.backend_opts:
            lines.append(f"    backend_options: {json.dumps(args.backend_opts)}")
        lines.append(f"    threads: {args.threads}")
    text = "\n".join(lines) + "\n"
    with open(path, "w") as f:
        f.write(text)
    return text


# ----------------------------------------------------------------------------------------- stages

def start_stages(transport, mode, args, procs, log):
    """The 2 stages of one configuration, listening; returns its record (commands, files, procs)."""
    run_dir = os.path.join(args.workdir, f"{transport}-{mode}")
    os.makedirs(run_dir, exist_ok=True)
    # the stages read their entries from a file of their own: every one binds a free port (the
    # address is a placeholder), and the driver's file then names the ports they took
    stage_cfg = os.path.join(run_dir, "stages.yaml")
    stage_file = write_deployment(stage_cfg, args, transport, mode, "stage", ["127.0.0.1:1"] * 2, "127.0.0.1:0")
    cfg = {"transport": transport, "mode": mode, "stage_commands": [], "stage_file": stage_file, "procs": [],
           "addresses": []}
    ready = []
    try:
        # both load (and with --quant, quantize) at once: the start is not what is measured
        for i in range(2):
            r, w = os.pipe()
            ready.append(r)
            cmd = [args.rlx, "stage", "--config", stage_cfg, "--stage", str(i), "--ready-fd", str(w), "-v"] + \
                args.quant_flags
            cfg["stage_commands"].append(cmd)
            try:
                cfg["procs"].append(procs.start(cmd, os.path.join(run_dir, f"stage{i}.log"), pass_fds=(w,)))
            finally:
                os.close(w)
        for i, (p, r) in enumerate(zip(cfg["procs"], ready)):
            cfg["addresses"].append(wait_ready_fd(p, r, args.timeout, f"{transport}/{mode} stage {i}"))
    finally:
        for r in ready:
            os.close(r)
    for i, p in enumerate(cfg["procs"]):
        if MODE_LOG[mode] not in log_text(p):
            raise BenchError(f"{transport}/{mode} stage {i} does not say '{MODE_LOG[mode]}':\n{log_tail(p)}")
    cfg["config"] = os.path.join(run_dir, "deploy.yaml")
    cfg["deployment"] = write_deployment(cfg["config"], args, transport, mode, "driver", cfg["addresses"])
    cfg["connect_command"] = [args.rlx, "generate", "--config", cfg["config"], "--tokens", "1", "-n", "1",
                              "--greedy", "--ctx-size", "16"] + args.quant_flags
    cfg["bench_command"] = [args.rlx, "bench", "--config", cfg["config"], "--json", "-p", str(args.prompt), "-n",
                            str(args.decode), "-r", str(args.reps), "-t", "1"] + args.quant_flags
    log(f"{transport}/{mode}: stages at {', '.join(cfg['addresses'])}")
    return cfg


def run_beside_stages(cmd, cfg, args):
    """run_bench.run of cmd, with the stages' CPU taken out of its others' share."""
    sids = {p.pid for p in cfg["procs"]}
    stage0 = session_cpu_seconds(sids)
    stdout, wall, _, others = run_bench.run(cmd, args.timeout)
    stage_cpu = session_cpu_seconds(sids) - stage0
    if others is not None:
        others = max(0.0, others - stage_cpu / (wall * (os.cpu_count() or 1)))
    return stdout, wall, others


def connect_wall(cmd, timeout):
    """Wall seconds of one minimal driver run. A blocking wait: run_bench.run polls every 20 ms,
    coarser than the handshakes' difference."""
    t0 = time.monotonic()
    res = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout)
    wall = time.monotonic() - t0
    if res.returncode != 0:
        raise BenchError(f"exit status {res.returncode}: {' '.join(cmd)}\n{res.stderr[-2000:]}")
    if not res.stdout.strip():
        raise BenchError(f"{' '.join(cmd)} printed no token id")
    return wall


def measure(cfg, args, log):
    """One round of one configuration: connect wall times, then rlx bench."""
    for p in cfg["procs"]:
        if p.poll() is not None:
            raise BenchError(f"{cfg['transport']}/{cfg['mode']}: a stage exited ({p.returncode}):\n{log_tail(p)}")
    connect = [round(connect_wall(cfg["connect_command"], args.timeout), 4) for _ in range(args.connect_reps)]
    stdout, wall, others = run_beside_stages(cfg["bench_command"], cfg, args)
    res = run_bench.last_json_object(stdout, "rlx bench")
    for key in ("pp_tps", "tg_tps"):
        if not isinstance(res.get(key), (int, float)) or res[key] <= 0:
            raise BenchError(f"rlx bench: bad or missing {key} in {res}")
    if len(res.get("tg_stages", [])) != 2:
        raise BenchError(f"rlx bench over 2 stages reported {len(res.get('tg_stages', []))} stages' figures")
    rnd = {"connect_s": connect, "pp_tps": res["pp_tps"], "tg_tps": res["tg_tps"], "wall_s": round(wall, 2),
           "others_cpu": None if others is None else round(others, 3), "bench": res}
    log(f"  {cfg['transport']:4} {cfg['mode']:5}: pp{args.prompt} {res['pp_tps']:7.2f} t/s, tg{args.decode} "
        f"{res['tg_tps']:6.2f} t/s, connect {1e3 * statistics.median(connect):.0f} ms "
        f"[{wall:.0f} s{run_bench.busy_note(others)}]")
    return rnd


# ---------------------------------------------------------------------------------------- summary

def med(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def ratio(a, b):
    return a / b if a and b else None


def fmt(v, spec, none="-"):
    return none if v is None else format(v, spec)


def summarize(configs, rounds):
    """Per configuration: medians over the rounds, and ratios to the same transport's plain."""
    out = {}
    for key, cfg in configs.items():
        rs = [rnd[key] for rnd in rounds]
        stages = []
        for i in range(2):
            per = [r["bench"]["tg_stages"][i] for r in rs]
            stages.append({k: med(s.get(k) for s in per) for k in
                           ("ms_per_step", "busy", "bytes_sent_per_token", "bytes_received_per_token")})
        out[key] = {"transport": cfg["transport"], "mode": cfg["mode"], "rounds": len(rs),
                    "pp_tps": med(r["pp_tps"] for r in rs), "tg_tps": med(r["tg_tps"] for r in rs),
                    "connect_s": med(c for r in rs for c in r["connect_s"]),
                    "others_cpu": med(r["others_cpu"] for r in rs), "tg_stages": stages}
    for key, s in out.items():
        plain = f"{s['transport']}-plain"
        if plain not in out:
            continue
        p = out[plain]
        for test in ("pp", "tg"):
            s[f"{test}_vs_plain"] = ratio(s[f"{test}_tps"], p[f"{test}_tps"])
            s[f"{test}_vs_plain_paired"] = med(ratio(rnd[key][f"{test}_tps"], rnd[plain][f"{test}_tps"])
                                               for rnd in rounds)
        s["connect_extra_s"] = s["connect_s"] - p["connect_s"]
    return out


def report(summary, args, log):
    log("")
    log(f"| transport | mode | pp{args.prompt} t/s | tg{args.decode} t/s | pp vs plain (paired) | "
        f"tg vs plain (paired) | connect ms | vs plain ms | others CPU |")
    log("|---|---|---|---|---|---|---|---|---|")
    for s in summary.values():
        pp = f"{fmt(s.get('pp_vs_plain'), '.3f')} ({fmt(s.get('pp_vs_plain_paired'), '.3f')})"
        tg = f"{fmt(s.get('tg_vs_plain'), '.3f')} ({fmt(s.get('tg_vs_plain_paired'), '.3f')})"
        extra = s.get("connect_extra_s")
        log(f"| {s['transport']} | {s['mode']} | {s['pp_tps']:.2f} | {s['tg_tps']:.2f} | {pp} | {tg} | "
            f"{1e3 * s['connect_s']:.0f} | {fmt(extra and 1e3 * extra, '+.0f')} | "
            f"{fmt(s['others_cpu'] and 100 * s['others_cpu'], '.0f')} % |")
    log("")
    log(f"Per stage in tg{args.decode} (medians): ms per step, busy, bytes per token to / from the stage:")
    for s in summary.values():
        parts = [f"stage {i} {st['ms_per_step']:.1f} ms, {100 * st['busy']:.0f} %, "
                 f"{st['bytes_sent_per_token']:,.0f} / {st['bytes_received_per_token']:,.0f} B"
                 for i, st in enumerate(s["tg_stages"])]
        log(f"  {s['transport']}/{s['mode']}: " + "; ".join(parts))


# ------------------------------------------------------------------------------------------- main

def parse_list(value, allowed, what, ap):
    items = [x.strip() for x in value.split(",") if x.strip()]
    bad = [x for x in items if x not in allowed]
    if bad or not items:
        ap.error(f"--{what} takes a comma-separated list of {', '.join(allowed)}")
    return list(dict.fromkeys(items))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", required=True, help="CMake build directory (Release)")
    ap.add_argument("--model", help="model directory (default: BUILD/bench-model, generated once)")
    ap.add_argument("--transports", default="tcp,grpc", help="comma-separated: tcp, grpc")
    ap.add_argument("--modes", default="plain,token,tls", help="comma-separated: plain, token, tls")
    ap.add_argument("--rounds", type=int, default=3, help="rounds, the configurations taking turns in each")
    ap.add_argument("-p", "--prompt", type=int, default=128, help="prompt length of the pp test")
    ap.add_argument("-n", "--decode", type=int, default=64, help="decode steps of the tg test")
    ap.add_argument("-r", "--reps", type=int, default=3, help="rlx bench repetitions")
    ap.add_argument("--threads", type=int, default=1, help="backend threads of each stage")
    ap.add_argument("--connect-reps", type=int, default=8, help="timed minimal generate runs per round")
    ap.add_argument("--plugin", default="cpu-blas", help="the stages' backend plugin")
    ap.add_argument("--backend-opts", default="", help="the stages' backend options")
    ap.add_argument("--quant", help="quantize the weights in memory on the stages (e.g. q4_k_m)")
    ap.add_argument("--workdir", help="deployment files, credentials, logs (default BUILD/link-bench)")
    ap.add_argument("--timeout", type=float, default=600, help="seconds allowed for a start and a command")
    ap.add_argument("--out", help="results JSON")
    args = ap.parse_args(argv)
    args.transports = parse_list(args.transports, TRANSPORTS, "transports", ap)
    args.modes = parse_list(args.modes, MODES, "modes", ap)
    for name in ("rounds", "prompt", "decode", "reps", "threads", "connect_reps"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be at least 1")
    build = os.path.abspath(args.build)
    args.rlx = os.path.join(build, "bin", "rlx")
    args.workdir = os.path.abspath(args.workdir or os.path.join(build, "link-bench"))
    args.quant_flags = ["--quant", args.quant] if args.quant else []
    lines = []

    def log(msg):
        print(msg, flush=True)
        lines.append(msg)

    procs = Processes()
    previous = {sig: signal.signal(sig, lambda *_: sys.exit(1)) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        if not os.access(args.rlx, os.X_OK):
            raise BenchError(f"{args.rlx} is not an executable (build the rlx_cli target)")
        for t in args.transports:
            plugin = os.path.join(build, "plugins", f"rlx-transport-{t}.so")
            if not os.path.exists(plugin):
                raise BenchError(f"{plugin} is missing (build the rlx_transport_{t} target)")
        args.model = os.path.abspath(args.model) if args.model else run_bench.ensure_model(build)
        os.makedirs(args.workdir, exist_ok=True)
        if "token" in args.modes:
            write_token(os.path.join(args.workdir, "pipeline.token"))
        if "tls" in args.modes:
            make_certs(os.path.join(args.workdir, "certs"))
        cpu = lscpu()
        started = datetime.datetime.now().astimezone()
        log(f"link benchmark {started.isoformat(timespec='seconds')}: "
            f"{next((ln.split(':', 1)[1].strip() for ln in cpu.splitlines() if ln.startswith('Model name')), '?')}, "
            f"{os.cpu_count()} CPUs, load {' '.join(open('/proc/loadavg').read().split()[:3])}; model {args.model}"
            f"{' quantized to ' + args.quant if args.quant else ''}; 2 stages x {args.threads} thread(s)")
        configs = {}
        for t in args.transports:
            for m in args.modes:
                configs[f"{t}-{m}"] = start_stages(t, m, args, procs, log)
        keys, rounds = list(configs), []
        for rnd in range(args.rounds):
            order = keys[rnd % len(keys):] + keys[:rnd % len(keys)]
            log(f"round {rnd + 1} of {args.rounds} (load {' '.join(open('/proc/loadavg').read().split()[:3])})")
            rounds.append({k: measure(configs[k], args, log) for k in order})
        summary = summarize(configs, rounds)
        report(summary, args, log)
        if args.out:
            record = {"lscpu": cpu, "host": run_bench.host_info(), "started": started.isoformat(timespec="seconds"),
                      "args": {k: v for k, v in vars(args).items()},
                      "configurations": {k: {n: v for n, v in c.items() if n != "procs"} for k, c in configs.items()},
                      "rounds": rounds, "summary": summary, "log": lines}
            with open(args.out, "w") as f:
                json.dump(record, f, indent=1, default=str)
    except ERRORS as e:
        print(f"link_bench: {e}", file=sys.stderr)
        return 1
    finally:
        procs.stop_all()
        for sig, h in previous.items():
            signal.signal(sig, h)
    return 0


if __name__ == "__main__":
    sys.exit(main())
