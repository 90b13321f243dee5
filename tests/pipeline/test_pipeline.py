#!/usr/bin/python3
"""Pipeline-parallel inference over real processes: rlx stage processes and an rlx driver (or
pipeline_probe) talking through a transport plugin, checked against the single-process run.

  test_pipeline.py CASE --rlx BIN --probe BIN --data DIR --plugins DIR

CASE is one of parity-tcp, parity-grpc, mixed-backends, kv-cache, options-threads, protocol, faults-tcp,
faults-grpc, netns, gguf-header, mpi. Exit status 0 passed, 1 failed, 77 skipped (the reason is printed).
Every process runs with a timeout and is killed at the end, whatever happens."""
import argparse
import json
import os
import random
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ports import free_ports  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from ci_skip import SKIP, missing_input  # noqa: E402

BROWN_DRAFT = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                           "share", "models", "brown", "draft")
TOKENS = "1,5,3,7,9,11,2"
N_NEW = 12



class Skip(Exception):
    pass


class MissingInput(Skip):
    """A skip for a tool or build product that CI installs or builds: a failure under CI=true
    (tests/ci_skip.py)."""


class Fail(Exception):
    pass


def log(msg):
    print(msg, flush=True)


class Env:
    def __init__(self, args):
        self.rlx, self.probe, self.data, self.plugins = args.rlx, args.probe, args.data, args.plugins
        self.procs = []
        self.tmp = tempfile.mkdtemp(prefix="rlx-pipeline-")
        self.netns = []

    def model(self, name):
        path = os.path.abspath(os.path.join(self.data, name))
        if not os.path.exists(os.path.join(path, "config.json")):
            raise Fail(f"test model {path} is missing (the models fixtures write it)")
        return path

    def n_layers(self, model):
        import json
        with open(os.path.join(model, "config.json")) as f:
            return json.load(f)["num_hidden_layers"]

    def has_plugin(self, kind, name):
        return os.path.exists(os.path.join(self.plugins, f"rlx-{kind}-{name}.so"))

    def need_transport(self, name):
        if not self.has_plugin("transport", name):
            raise MissingInput(f"transport plugin '{name}' is not built (no rlx-transport-{name}.so in {self.plugins})")

    # ---- processes ----

    def run(self, cmd, timeout=60, ns=None, check=True):
        if ns:
            cmd = ["ip", "netns", "exec", ns] + cmd
        t0 = time.monotonic()
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise Fail(f"timed out after {timeout} s: {' '.join(cmd)}")
        elapsed = time.monotonic() - t0
        if check and p.returncode != 0:
            raise Fail(f"exit {p.returncode}: {' '.join(cmd)}\n{p.stderr}")
        return p, elapsed

    def stage(self, model, layers, transport, plugin="cpu-blas", listen="127.0.0.1:0", ns=None, extra=(),
              environ=None):
        """Starts `rlx stage` (in environ, default this process's environment) and waits until it
        listens; returns (process, address)."""
        r, w = os.pipe()
        cmd = [self.rlx, "stage", "--listen", listen, "--model", model, "--layers", layers,
               "--transport", transport, "--plugin", plugin, "--threads", "1", "--ready-fd", str(w), "-v",
               *extra]
        if ns:
            cmd = ["ip", "netns", "exec", ns] + cmd
        errf = open(os.path.join(self.tmp, f"stage-{len(self.procs)}.log"), "w+")
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=errf, pass_fds=(w,), env=environ)
        p.log = errf
        os.close(w)
        self.procs.append(p)
        line = b""
        deadline = time.monotonic() + 30
        while not line.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([r], [], [], left)[0]:
                os.close(r)
                raise Fail(f"stage {layers} did not start listening: {self.stage_log(p)}")
            chunk = os.read(r, 256)
            if not chunk:
                os.close(r)
                p.wait(5)
                raise Fail(f"stage {layers} exited before listening: {self.stage_log(p)}")
            line += chunk
        os.close(r)
        return p, line.decode().strip()

    def stage_log(self, p):
        p.log.flush()
        p.log.seek(0)
        return p.log.read()

    def stop(self, p, expect_clean=True):
        if p.poll() is None:
            p.send_signal(signal.SIGCONT)
            p.terminate()
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
                raise Fail(f"stage {p.pid} ignored SIGTERM for 10 s")
        if expect_clean and p.returncode != 0:
            text = self.stage_log(p)
            raise Fail(f"stage {p.pid} exited with {p.returncode} on SIGTERM: {text}")

    def cleanup(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()
            p.log.close()
        for ns in self.netns:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        subprocess.run(["rm", "-rf", self.tmp])

    def config(self, name, model, transport, stages, extra=""):
        """A deployment file; stages are (address, layers or None, backend or None)."""
        lines = [f"model: {model}", f"transport: {transport}", "stages:"]
        for addr, layers, backend in stages:
            lines.append(f"  - address: {addr}")
            if layers:
                lines.append(f"    layers: {layers}")
            if backend:
                lines.append(f"    backend: {backend}")
        path = os.path.join(self.tmp, name)
        with open(path, "w") as f:
            f.write("\n".join(lines) + "\n" + extra)
        return path

    # ---- what a run produces ----

    def generate(self, args, ns=None, timeout=60):
        p, _ = self.run([self.rlx, "generate", "--tokens", TOKENS, "-n", str(N_NEW), "--greedy", *args], timeout,
                        ns=ns)
        return p.stdout.strip()

    def logits(self, args, ns=None, timeout=60):
        out = os.path.join(self.tmp, f"logits-{random.getrandbits(32)}.f32")
        self.run([self.rlx, "logits", "--tokens", TOKENS, "--all", "--out", out, *args], timeout, ns=ns)
        data = np.fromfile(out, dtype="<f4")
        os.unlink(out)
        return data

    def reference(self, model, plugin="cpu-blas", extra=()):
        return (self.generate(["--model", model, "--plugin", plugin, *extra]),
                self.logits(["--model", model, "--plugin", plugin, *extra]))

    def same(self, what, ref, ids, logits, tol=1e-4):
        ref_ids, ref_logits = ref
        if ids != ref_ids:
            raise Fail(f"{what}: greedy ids differ:\n  single process: {ref_ids}\n  pipeline:       {ids}")
        if logits.shape != ref_logits.shape:
            raise Fail(f"{what}: logits shape {logits.shape}, single process {ref_logits.shape}")
        diff = float(np.max(np.abs(logits - ref_logits)))
        if not diff <= tol:
            raise Fail(f"{what}: logits differ by {diff} (> {tol})")
        log(f"ok: {what}: same ids, logits within {diff:.2g}")


def split_text(ranges):
    return [f"{a}-{b}" for a, b in ranges]


def even(n_layers, n):
    base, extra, out, start = n_layers // n, n_layers % n, [], 0
    for i in range(n):
        ln = base + (i < extra)
        out.append((start, start + ln - 1))
        start += ln
    return out


# ---- cases ----

def case_parity(env, transport):
    env.need_transport(transport)
    models = ["dense-tied-f32-s1", "dense-untied-bias-f32-s1", "moe-f32-s1", "sliding-f32-s1", "deep-dense-f32",
              "deep-moe-f32"]
    for name in models:
        model = env.model(name)
        n = env.n_layers(model)
        ref = env.reference(model)
        splits = [even(n, k) for k in range(1, min(n, 4) + 1)]
        if name == "deep-dense-f32":
            splits += [[(0, 0), (1, 3), (4, 4)], [(0, 3), (4, 4)], [(0, 0), (1, 4)]]
        if name == "deep-moe-f32":
            splits += [[(0, 2), (3, 3)]]
        for split in splits:
            stages = [env.stage(model, r, transport) for r in split_text(split)]
            cfg = env.config(f"{name}-{len(split)}.yaml", model, transport,
                             [(addr, r, None) for (_, addr), r in zip(stages, split_text(split))])
            what = f"{name} over {len(split)} stage(s) {split_text(split)} ({transport})"
            # generate and logits are two drivers in turn: the stages serve one after the other
            env.same(what, ref, env.generate(["--config", cfg]), env.logits(["--config", cfg]))
            for p, _ in stages:
                env.stop(p)
    # the one-liner: --stages N launches its own stages (and stops them)
    model = env.model("deep-dense-f32")
    ref = env.reference(model)
    for k in (2, 4):
        args = ["--model", model, "--stages", str(k), "--transport", transport]
        env.same(f"--stages {k} ({transport})", ref, env.generate(args), env.logits(args))
    # --launch starts the local stages of a file with uneven explicit ranges
    ports = free_ports(3)
    cfg = env.config("launch.yaml", model, transport,
                     [(f"127.0.0.1:{ports[0]}", "0-1", None), (f"127.0.0.1:{ports[1]}", "2-2", "ref"),
                      (f"127.0.0.1:{ports[2]}", "3-4", None)])
    env.same(f"--config --launch ({transport})", ref, env.generate(["--config", cfg, "--launch"]),
             env.logits(["--config", cfg, "--launch"]), tol=1e-4)
    out, _ = env.run(["pgrep", "-f", f"stage --config {cfg}"], check=False)
    if out.stdout.strip():
        raise Fail(f"launched stages still running after the driver exited: {out.stdout}")


def case_mixed_backends(env):
    """Stages on different backends give the single process's logits. Every cache is F32 here:
    the backends' products differ in their last bits, which an F16 cache's rounding turns into
    differences of ~1e-3, above this comparison's 1e-4."""
    env.need_transport("tcp")
    f32 = ["-ctk", "f32"]
    backends = ["cpu-blas", "ref"] + (["oneDNN"] if env.has_plugin("backend", "onednn") else [])
    if len(backends) < 3:
        log("note: the oneDNN backend is not built; mixing cpu-blas and ref only")

    for name in ("deep-dense-f32", "deep-moe-f32"):
        model = env.model(name)
        n = env.n_layers(model)
        ref = env.reference(model, extra=f32)
        for k in (2, 3):
            split = split_text(even(n, k))
            for rot in range(len(backends)):
                chosen = [backends[(rot + i) % len(backends)] for i in range(k)]
                stages = [env.stage(model, r, "tcp", plugin=b, extra=f32) for r, b in zip(split, chosen)]
                cfg = env.config("mixed.yaml", model, "tcp", [(a, r, None) for (_, a), r in zip(stages, split)])
                env.same(f"{name} stages on {chosen}", ref, env.generate(["--config", cfg, *f32]),
                         env.logits(["--config", cfg, *f32]))
                for p, _ in stages:
                    env.stop(p)
    # a file naming a backend per stage, launched by the driver (which gives them its cache type)
    model = env.model("deep-dense-f32")
    ports = free_ports(2)
    cfg = env.config("backends.yaml", model, "tcp", [(f"127.0.0.1:{ports[0]}", None, "ref"),
                                                      (f"127.0.0.1:{ports[1]}", None, backends[-1])])
    env.same(f"--launch with backends ref, {backends[-1]} from the file", env.reference(model, extra=f32),
             env.generate(["--config", cfg, "--launch", *f32]), env.logits(["--config", cfg, "--launch", *f32]))


def case_stage_place(env):
    """rlx stage --place pins an op of the stage's block to another backend: the stage opens it
    (its -v describe line), the pipeline's logits are bit-identical to one process with the same
    placement, and differ from the plain reference kernels when cpu-blas rounds otherwise."""
    env.need_transport("tcp")
    model = env.model("deep-dense-f32")
    split = split_text(even(env.n_layers(model), 2))
    placed = (env.generate(["--model", model, "--plugin", "ref", "--place", "matmul=cpu-blas"]),
              env.logits(["--model", model, "--plugin", "ref", "--place", "matmul=cpu-blas"]))
    stages = [env.stage(model, r, "tcp", plugin="ref", extra=["--place", "matmul=cpu-blas"]) for r in split]
    cfg = env.config("place.yaml", model, "tcp", [(a, r, None) for (_, a), r in zip(stages, split)])
    env.same("stages on ref with --place matmul=cpu-blas", placed, env.generate(["--config", cfg]),
             env.logits(["--config", cfg]), tol=0)
    for p, _ in stages:
        env.stop(p)
        text = env.stage_log(p)
        if not any(": backend cpu-blas: " in l for l in text.splitlines()):
            raise Fail(f"a stage with --place matmul=cpu-blas did not open cpu-blas:\n{text}")
    # stages the driver launches take its --place as they take --plugin
    args = ["--model", model, "--stages", "2", "--plugin", "ref", "--place", "matmul=cpu-blas"]
    p, _ = env.run([env.rlx, "-v", "generate", "--tokens", TOKENS, "-n", str(N_NEW), "--greedy", *args])
    if len([l for l in stage_lines(p.stderr) if ": backend cpu-blas: " in l]) != 2:
        raise Fail(f"--stages 2 --place matmul=cpu-blas: the launched stages did not open cpu-blas:\n{p.stderr}")
    env.same("--stages 2 --place matmul=cpu-blas", placed, p.stdout.strip(), env.logits(args), tol=0)
    plain = env.reference(model, plugin="ref")
    if float(np.max(np.abs(plain[1] - placed[1]))) == 0:
        log("note: cpu-blas's matmuls round as the reference kernels do here; placement shown by the describe lines")
    else:
        log("ok: the placed stages' logits are the placed single process's, not the plain reference kernels'")
    expect_failure(env, "a stage with a bad --place",
                   [env.rlx, "stage", "--listen", "127.0.0.1:0", "--model", model, "--layers", split[0],
                    "--place", "matmul"], ["stage: place: 'matmul' is not OP=BACKEND"], 30)


def stage_lines(stderr):
    """The describe lines launched stages print with -v: {label: line}."""
    return [l for l in stderr.splitlines() if l.startswith("rlx stage ") and ": backend " in l]


def check_bench_stages(env, model):
    """rlx bench over stages reports each stage's steps, time and bytes per token: a step of each
    repetition through every stage, ids into stage 0, hidden states between, logits out of the last."""
    with open(os.path.join(model, "config.json")) as f:
        cfg = json.load(f)
    hidden, vocab = 4 * cfg["hidden_size"], 4 * cfg["vocab_size"]
    p, _ = env.run([env.rlx, "bench", "--model", model, "--stages", "2", "-p", "8", "-n", "4", "-r", "2", "--json"])
    try:
        got = json.loads(p.stdout)
        pp, tg = got["pp_stages"], got["tg_stages"]
    except (ValueError, KeyError) as e:
        raise Fail(f"bench --stages 2 --json: {e}: {p.stdout!r} {p.stderr[-400:]!r}")
    ok = [s["stage"] for s in pp] == [0, 1] and [s["stage"] for s in tg] == [0, 1]
    ok = ok and all(s["steps"] == 2 for s in pp) and all(s["steps"] == 8 for s in tg)
    ok = ok and all(s["ms_per_step"] > 0 and 0 < s["busy"] <= 1 for s in pp + tg)
    # a decode token: its id (plus framing) to stage 0, its hidden state back and on to stage 1, the
    # logits of the vocabulary out of stage 1
    ok = ok and tg[0]["bytes_sent_per_token"] < hidden and hidden <= tg[0]["bytes_received_per_token"] < 2 * hidden
    ok = ok and hidden <= tg[1]["bytes_sent_per_token"] < 2 * hidden and vocab <= tg[1]["bytes_received_per_token"]
    if not ok:
        raise Fail(f"bench --stages 2: per-stage figures {pp} {tg} (hidden {hidden} B, logits {vocab} B)")
    log("ok: rlx bench --stages 2 reports each stage's steps, time and bytes per token")


def case_options_and_threads(env):
    env.need_transport("tcp")
    model = env.model("deep-dense-f32")
    ref = env.reference(model)
    cores = len(os.sched_getaffinity(0))
    # local stages divide the cores; the describe line of each says how many threads it got
    for k in (2, 3):
        p, _ = env.run([env.rlx, "-v", "generate", "--model", model, "--stages", str(k), "--tokens", TOKENS,
                        "-n", str(N_NEW), "--greedy"])
        share = max(1, cores // k)
        want = f"{share} thread{'s' if share != 1 else ''},"
        lines = stage_lines(p.stderr)
        if len(lines) != k or not all(want in l for l in lines):
            raise Fail(f"--stages {k} on {cores} cores: wanted {k} stages with '{want}', got:\n{p.stderr}")
        if p.stdout.strip() != ref[0]:
            raise Fail(f"--stages {k}: ids differ from the single process")
        log(f"ok: --stages {k} on {cores} cores: {want} each")
    # --threads wins over the share, and --backend-opts reaches every launched stage
    p, _ = env.run([env.rlx, "-v", "generate", "--model", model, "--stages", "2", "--threads", "3",
                    "--backend-opts", "isa=c", "--tokens", TOKENS, "-n", str(N_NEW), "--greedy"])
    lines = stage_lines(p.stderr)
    if len(lines) != 2 or not all("c kernels, 3 threads," in l for l in lines):
        raise Fail(f"--threads 3 --backend-opts isa=c did not reach both stages:\n{p.stderr}")
    log("ok: --threads and --backend-opts reach launched stages")
    check_bench_stages(env, model)
    expect_failure(env, "--stages 2 --backend-opts isa=bogus",
                   [env.rlx, "generate", "--model", model, "--stages", "2", "--backend-opts", "isa=bogus",
                    "--tokens", TOKENS, "-n", "2"], ["cpu-blas", "isa 'bogus'", "before listening"], 60)
    # a deployment file's backend_options and threads reach its stage; the other gets the share
    ports = free_ports(2)
    cfg = env.config("options.yaml", model, "tcp", [(f"127.0.0.1:{ports[0]}", None, "cpu-blas"),
                                                     (f"127.0.0.1:{ports[1]}", None, "ref")])
    with open(cfg) as f:
        text = f.read().replace("    backend: cpu-blas\n", "    backend: cpu-blas\n    backend_options: isa=c\n"
                                "    threads: 1\n", 1).replace("    backend: ref\n",
                                                              "    backend: ref\n    backend_options: act=bf16\n")
    with open(cfg, "w") as f:
        f.write(text)
    p, _ = env.run([env.rlx, "-v", "generate", "--config", cfg, "--launch", "--tokens", TOKENS, "-n", "2"])
    lines = stage_lines(p.stderr)
    if len(lines) != 2 or "c kernels, 1 thread," not in lines[0] + lines[1] or "BF16" not in lines[0] + lines[1]:
        raise Fail(f"the file's backend_options and threads did not reach its stages:\n{p.stderr}")
    log("ok: backend_options and threads of a deployment file reach its launched stages")
    with open(cfg, "w") as f:
        f.write(text.replace("isa=c", "isa=bogus"))
    expect_failure(env, "backend_options: isa=bogus in a file", [env.rlx, "generate", "--config", cfg, "--launch",
                                                                  "--tokens", TOKENS, "-n", "2"],
                   ["cpu-blas", "isa 'bogus'"], 60)


def case_kv_cache(env):
    env.need_transport("tcp")
    transports = ["tcp"] + (["grpc"] if env.has_plugin("transport", "grpc") else [])
    for transport in transports:
        for name in ("deep-dense-f32", "deep-moe-f32"):
            model = env.model(name)
            n = env.n_layers(model)
            for k in (1, 2, 3, 4):
                if k > n:
                    continue
                split = split_text(even(n, k))
                # F32 caches: the probe compares decode with a full prefill at 1e-4, and an F16
                # cache's rounding turns the two matmul paths' last-bit differences into ~1e-3
                stages = [env.stage(model, r, transport, extra=("-ctk", "f32")) for r in split]
                args = [env.probe, "kv", "--model", model, "--transport", transport]
                for (_, addr), r in zip(stages, split):
                    args += ["--stage", f"{addr}={r}"]
                p, _ = env.run(args, timeout=60)
                log(f"ok: {name}, {k} stage(s), {transport}: {p.stdout.strip()}")
                for s, _ in stages:
                    env.stop(s)


class FakeTcpStage(threading.Thread):
    """Accepts one connection, reads what comes, then answers with bytes that are no rlx frame
    (`random`) or with a frame header promising more payload than it sends (`truncated`)."""

    def __init__(self, mode):
        super().__init__(daemon=True)
        self.mode = mode
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(4)
        self.address = "127.0.0.1:%d" % self.sock.getsockname()[1]

    def run(self):
        self.sock.settimeout(30)
        try:
            conn, _ = self.sock.accept()
        except OSError:
            return
        conn.settimeout(5)
        try:
            conn.recv(65536)
            if self.mode == "random":
                conn.sendall(bytes(random.getrandbits(8) for _ in range(200)))
            else:  # the tcp transport's 24-byte header: magic, version, flags, length, crcs
                head = b"RLXT" + struct.pack("<HHQI", 1, 0, 1000, 0)  # its payload checksum is never reached
                head += struct.pack("<I", crc32c(head))
                conn.sendall(head + b"only ten b")
            time.sleep(1)
        except OSError:
            pass
        conn.close()
        self.sock.close()


def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def expect_failure(env, what, cmd, needles, limit_s, ns=None, one_line=False):
    """Runs cmd, which must fail within limit_s with every needle in its stderr; with one_line,
    stderr must be that single "rlx: ..." line and nothing else."""
    p, elapsed = env.run(cmd, timeout=limit_s + 30, ns=ns, check=False)
    if p.returncode == 0:
        raise Fail(f"{what}: succeeded, expected a failure\n{p.stdout}")
    lines = p.stderr.splitlines()
    for needle in needles:
        if needle not in p.stderr:
            raise Fail(f"{what}: the error does not mention '{needle}':\n{p.stderr}")
    if elapsed > limit_s:
        raise Fail(f"{what}: failed only after {elapsed:.1f} s (limit {limit_s} s)")
    if "AddressSanitizer" in p.stderr or "runtime error" in p.stderr or p.returncode < 0:
        raise Fail(f"{what}: crashed (status {p.returncode}):\n{p.stderr}")
    if one_line and (len(lines) != 1 or not lines[0].startswith("rlx: ")):
        raise Fail(f"{what}: stderr should be one 'rlx: ' line, got {len(lines)}:\n{p.stderr}")
    log(f"ok: {what}: failed in {elapsed:.1f} s: {lines[-1] if lines else ''}")
    return p


def case_protocol(env):
    env.need_transport("tcp")
    model = env.model("deep-dense-f32")
    transports = ["tcp"] + (["grpc"] if env.has_plugin("transport", "grpc") else [])
    ref = env.reference(model)
    for transport in transports:
        # by hand: unknown sessions, replayed steps, bad handshakes, garbage; then it serves on
        s0, a0 = env.stage(model, "0-2", transport)
        p, _ = env.run([env.probe, "raw", a0, "0-2", "--model", model, "--transport", transport])
        log(p.stdout.strip())
        # fake second stages that misbehave; the driver's error names stage 1 and its address
        modes = {"version": ["speaks protocol version 99"], "model": ["serves another model"],
                 "garbage": ["not an rlx message"], "silent": ["never answered the handshake", "within 1500 ms"],
                 "rows": ["rows of 3 F32 values"], "hangup": ["stage 1"]}
        for mode, needles in modes.items():
            fake = subprocess.Popen([env.probe, "fake", mode, "--model", model, "--transport", transport],
                                    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            env.procs.append(fake)
            fake.log = open(os.devnull, "w+")
            line = fake.stdout.readline().split()
            if len(line) != 2 or line[0] != "LISTENING":
                raise Fail(f"fake stage {mode} did not start")
            addr = line[1]
            cfg = env.config(f"fake-{mode}.yaml", model, transport, [(a0, "0-2", None), (addr, "3-4", None)])
            expect_failure(env, f"fake stage 1 ({mode}, {transport})",
                           [env.rlx, "generate", "--config", cfg, "--tokens", TOKENS, "-n", "4", "--timeout", "1500"],
                           [f"stage 1 ({addr})"] + needles, 12)
            fake.kill()
            fake.wait()
        # frames that break the transport itself (a raw socket speaking garbage)
        for mode in ("random", "truncated"):
            fake = FakeTcpStage(mode)
            fake.start()
            cfg = env.config(f"raw-{mode}.yaml", model, transport, [(a0, "0-2", None), (fake.address, "3-4", None)])
            expect_failure(env, f"{mode} bytes from stage 1 ({transport})",
                           [env.rlx, "generate", "--config", cfg, "--tokens", TOKENS, "-n", "4", "--timeout", "1500",
                            "--connect-timeout", "3000"], [f"stage 1 ({fake.address})"], 12)
            fake.join(10)
        # stage 0 survived all of it and serves a real pipeline
        s1, a1 = env.stage(model, "3-4", transport)
        cfg = env.config("good.yaml", model, transport, [(a0, "0-2", None), (a1, "3-4", None)])
        env.same(f"stage 0 after the abuse ({transport})", ref, env.generate(["--config", cfg]),
                 env.logits(["--config", cfg]))
        env.stop(s0)
        env.stop(s1)
        # a model mismatch is refused on both sides with a clear message
        other = env.model("dense-tied-f32-s1")
        s2, a2 = env.stage(other, "0-2", transport)
        cfg = env.config("mismatch.yaml", model, transport, [(a2, "0-4", None)])
        expect_failure(env, f"a stage serving another model ({transport})",
                       [env.rlx, "generate", "--config", cfg, "--tokens", TOKENS], [f"stage 0 ({a2})"], 12)
        env.stop(s2)
        if "refused" not in env.stage_log(s2):
            raise Fail("the stage did not log the refused handshake")
    # deployment files with mistakes: file and line in the message
    bad = env.config("bad.yaml", model, "tcp", [("127.0.0.1:1", "0-1", None), ("127.0.0.1:2", "3-4", None)])
    expect_failure(env, "a gap in the layer ranges", [env.rlx, "generate", "--config", bad, "--tokens", TOKENS],
                   [f"{bad}:6:", "gap"], 10)


def pause_and_break(env, model, transport, stages, ns, breaker, limit=4, extra=()):
    """Runs pipeline_probe pause over stages [(address, layers)], calls breaker() after the
    prefill and returns the probe's output, which must report a pipeline error within limit s."""
    args = [env.probe, "pause", "--model", model, "--transport", transport, "--timeout", "1000", "-n", "50", *extra]
    for addr, r in stages:
        args += ["--stage", f"{addr}={r}"]
    if ns:
        args = ["ip", "netns", "exec", ns] + args
    probe = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    env.procs.append(probe)
    probe.log = open(os.devnull, "w+")
    if probe.stdout.readline().strip() != "PREFILLED":
        raise Fail(f"probe did not prefill: {probe.stderr.read()}")
    breaker()
    t0 = time.monotonic()
    probe.stdin.write("go\n")
    probe.stdin.flush()
    try:
        out, err = probe.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        raise Fail("the driver hangs")
    elapsed = time.monotonic() - t0
    if probe.returncode != 3:
        raise Fail(f"expected a pipeline error, got status {probe.returncode}:\n{out}{err}")
    # the error itself must come within limit; closing the transport afterwards may linger a little
    # (gRPC gives a stalled peer its linger time), but the process must still end in bounded time
    reported = float(out.split("ERROR after ")[1].split(" ms")[0]) / 1000 if "ERROR after " in out else 1e9
    if reported > limit or elapsed > limit + 8:
        raise Fail(f"the error took {reported:.1f} s, the driver's exit {elapsed:.1f} s (limit {limit} s):\n{out}")
    if "AGAIN failed" not in out:
        raise Fail(f"a call after the failure did not fail at once:\n{out}")
    return out


class SilentPeer(threading.Thread):
    """Accepts every connection on a loopback port and never says a word."""

    def __init__(self):
        super().__init__(daemon=True)
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.address = "127.0.0.1:%d" % self.sock.getsockname()[1]
        self.held = []

    def run(self):
        try:
            while True:
                self.held.append(self.sock.accept()[0])
        except OSError:
            pass

    def close(self):
        for c in self.held:
            c.close()
        self.sock.close()


def case_port_in_use(env, model, transport):
    """A stage whose port another process holds: one rlx line naming the address and that it is
    in use; gRPC's own account of the failed bind only with -v."""
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen(1)
    addr = "127.0.0.1:%d" % holder.getsockname()[1]
    cmd = [env.rlx, "stage", "--listen", addr, "--model", model, "--layers", "0-4", "--transport", transport,
           "--threads", "1"]
    expect_failure(env, f"a stage on a port in use ({transport})", cmd, [addr, "the port is in use"], 30,
                   one_line=True)
    p = expect_failure(env, f"a stage on a port in use, -v ({transport})", cmd + ["-v"], [addr, "the port is in use"],
                       30)
    lines = p.stderr.splitlines()
    if not lines[-1].startswith("rlx: ") or "in use" not in lines[-1]:
        raise Fail(f"-v: the last line should be rlx's error:\n{p.stderr}")
    if transport == "grpc" and not any(": libgrpc E " in l for l in lines):
        raise Fail(f"-v: gRPC's own log of the failed bind is missing (want a 'libgrpc E' line):\n{p.stderr}")
    holder.close()


def case_faults(env, transport):
    env.need_transport(transport)
    model = env.model("deep-dense-f32")
    ref = env.reference(model)
    case_port_in_use(env, model, transport)
    # a stage that never starts: refused until the connect timeout, one line naming the file's
    # line, the stage, its address and that no rlx stage listens there
    port, = free_ports(1)
    s0, a0 = env.stage(model, "0-2", transport)
    cfg = env.config("absent.yaml", model, transport, [(a0, "0-2", None), (f"127.0.0.1:{port}", "3-4", None)])
    expect_failure(env, f"a stage that never starts ({transport})",
                   [env.rlx, "generate", "--config", cfg, "--tokens", TOKENS, "--connect-timeout", "1500"],
                   [f"{cfg}:6: stage 1 (127.0.0.1:{port})", "connection refused", "no rlx stage is listening there"],
                   6, one_line=True)
    # something that accepts and never answers: the silent wording, by the handshake's deadline
    # (tcp: --timeout, after an instant connect; grpc: HTTP/2's handshake is part of connecting)
    silent = SilentPeer()
    silent.start()
    cfg = env.config("silent.yaml", model, transport, [(a0, "0-2", None), (silent.address, "3-4", None)])
    deadline = ["--timeout", "1500"] if transport == "tcp" else ["--connect-timeout", "2500"]
    expect_failure(env, f"a peer that accepts and says nothing ({transport})",
                   [env.rlx, "generate", "--config", cfg, "--tokens", TOKENS, *deadline],
                   [f"{cfg}:6: stage 1 ({silent.address})", "accepted the connection but never answered",
                    "handshake"], 5, one_line=True)
    silent.close()
    env.stop(s0)
    # a stage that comes up after the others gave up waiting for a Hello (--timeout 1000) still
    # makes a pipeline: each stage is greeted as soon as it is connected
    s0, a0 = env.stage(model, "0-2", transport, extra=("--timeout", "1000"))
    port, = free_ports(1)
    cfg = env.config("late.yaml", model, transport, [(a0, "0-2", None), (f"127.0.0.1:{port}", "3-4", None)])
    driver = subprocess.Popen([env.rlx, "generate", "--config", cfg, "--tokens", TOKENS, "-n", str(N_NEW), "--greedy"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    env.procs.append(driver)
    driver.log = open(os.devnull, "w+")
    time.sleep(2.5)
    s1, _ = env.stage(model, "3-4", transport, listen=f"127.0.0.1:{port}")
    try:
        out, err = driver.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        raise Fail("late stage: the driver hangs")
    if driver.returncode != 0 or out.strip() != ref[0]:
        raise Fail(f"late stage ({transport}): exit {driver.returncode}, ids {out.strip()!r}, want {ref[0]!r}:\n{err}")
    log(f"ok: stage 1 listening 2.5 s after stage 0 gave up on a Hello ({transport}): same ids")
    env.stop(s0)
    env.stop(s1)
    # the driver dies mid-session: every stage frees the session and serves the next driver
    split = ["0-1", "2-3", "4-4"]
    stages = [env.stage(model, r, transport) for r in split]
    args = [env.probe, "pause", "--model", model, "--transport", transport]
    for (_, addr), r in zip(stages, split):
        args += ["--stage", f"{addr}={r}"]
    driver = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    env.procs.append(driver)
    driver.log = open(os.devnull, "w+")
    if driver.stdout.readline().strip() != "PREFILLED":
        raise Fail("probe did not prefill")
    driver.kill()
    driver.wait()
    deadline = time.monotonic() + 10
    while not all("freed 1 session" in env.stage_log(s) for s, _ in stages):
        if time.monotonic() > deadline:
            raise Fail("a stage did not free the session of a killed driver:\n" +
                       "\n".join(env.stage_log(s) for s, _ in stages))
        time.sleep(0.1)
    cfg = env.config("after-driver-kill.yaml", model, transport, [(a, r, None) for (_, a), r in zip(stages, split)])
    env.same(f"a new driver after the previous one was killed ({transport})", ref, env.generate(["--config", cfg]),
             env.logits(["--config", cfg]))
    for s, _ in stages:
        env.stop(s)
    for fault in ("kill", "stop"):
        split = ["0-1", "2-3", "4-4"]
        stages = [env.stage(model, r, transport) for r in split]
        victim, vaddr = stages[1]
        out = pause_and_break(env, model, transport, [(a, r) for (_, a), r in zip(stages, split)], None,
                              lambda: victim.send_signal(signal.SIGKILL if fault == "kill" else signal.SIGSTOP),
                              limit=4 if fault == "stop" else 3)
        if f"stage 1 ({vaddr})" not in out:
            raise Fail(f"{fault}: the error does not name stage 1 ({vaddr}):\n{out}")
        log(f"ok: stage 1 {'killed' if fault == 'kill' else 'stopped'} mid-generation ({transport}): "
            f"{out.strip().splitlines()[0]}")
        if fault == "stop":
            victim.send_signal(signal.SIGCONT)
        # the surviving stages freed the session and serve a new pipeline
        deadline = time.monotonic() + 10
        survivors = [stages[0][0], stages[2][0]] + ([victim] if fault == "stop" else [])
        while not all("freed 1 session" in env.stage_log(s) for s in survivors):
            if time.monotonic() > deadline:
                raise Fail(f"{fault}: a surviving stage did not free the session:\n" +
                           "\n".join(env.stage_log(s) for s in survivors))
            time.sleep(0.1)
        if fault == "kill":
            victim, vaddr = env.stage(model, "2-3", transport)
        cfg = env.config(f"after-{fault}.yaml", model, transport,
                         [(stages[0][1], "0-1", None), (vaddr, "2-3", None), (stages[2][1], "4-4", None)])
        env.same(f"a new session after the {fault} ({transport})", ref, env.generate(["--config", cfg]),
                 env.logits(["--config", cfg]))
        for s in (stages[0][0], victim, stages[2][0]):
            env.stop(s)


def case_netns(env):
    env.need_transport("tcp")
    if os.geteuid() != 0:
        raise Skip("network namespaces need root")
    probe = subprocess.run(["ip", "netns", "list"], capture_output=True)
    if probe.returncode != 0:
        raise Skip("iproute2 cannot manage network namespaces here: " + probe.stderr.decode().strip())
    tag = f"{os.getpid() % 100000}"
    ns_a, ns_b = f"rlx-pl-a-{tag}", f"rlx-pl-b-{tag}"

    def ip(*args, ns=None):
        cmd = (["ip", "netns", "exec", ns] if ns else []) + ["ip", *args]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise Skip(f"cannot set up the veth pair ({' '.join(cmd)}): {r.stderr.strip()}")

    for ns in (ns_a, ns_b):
        ip("netns", "add", ns)
        env.netns.append(ns)
    ip("link", "add", "veth0", "netns", ns_a, "type", "veth", "peer", "name", "veth1", "netns", ns_b)
    ip("addr", "add", "10.77.0.1/24", "dev", "veth0", ns=ns_a)
    ip("addr", "add", "10.77.0.2/24", "dev", "veth1", ns=ns_b)
    for ns, dev in ((ns_a, "veth0"), (ns_b, "veth1")):
        ip("link", "set", dev, "up", ns=ns)
        ip("link", "set", "lo", "up", ns=ns)
    model = env.model("deep-dense-f32")
    ref = env.reference(model)
    # beyond loopback a stage wants credentials, or to be told it may go without
    expect_failure(env, "a stage without credentials on 10.77.0.1",
                   [env.rlx, "stage", "--listen", "10.77.0.1:0", "--model", model, "--layers", "0-4"],
                   ["will not listen on 10.77.0.1:0 without credentials", "--insecure-listen"], 30, ns=ns_a)
    bare, _ = env.stage(model, "0-4", "tcp", listen="10.77.0.1:0", ns=ns_a, extra=["--insecure-listen"])
    if "without authentication (--insecure-listen)" not in env.stage_log(bare):
        raise Fail(f"a stage with --insecure-listen does not warn:\n{env.stage_log(bare)}")
    env.stop(bare)
    log("ok: without credentials a stage binds 10.77.0.1 only when told --insecure-listen, and warns")
    token = os.path.join(env.tmp, "netns.token")
    with open(os.open(token, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
        f.write("a token for the namespaces' stages, 0123456789abcdef\n")
    auth = ["--auth-token-file", token]
    transports = ["tcp"] + (["grpc"] if env.has_plugin("transport", "grpc") else [])
    for transport in transports:
        # stage 0 beside the driver in namespace a, stage 1 across the veth pair in namespace b,
        # both requiring the deployment's token
        s0, a0 = env.stage(model, "0-2", transport, listen="10.77.0.1:0", ns=ns_a, extra=auth)
        s1, a1 = env.stage(model, "3-4", transport, listen="10.77.0.2:0", ns=ns_b, extra=auth)
        cfg = env.config(f"netns-{transport}.yaml", model, transport, [(a0, "0-2", None), (a1, "3-4", None)],
                         extra=f"auth: {{token_file: {token}}}\n")
        env.same(f"driver in {ns_a}, stage 1 at {a1} in {ns_b} ({transport})", ref,
                 env.generate(["--config", cfg], ns=ns_a), env.logits(["--config", cfg], ns=ns_a))
        # the link goes down mid-session: the driver's wait for stage 1 ends in a bounded, named failure
        out = pause_and_break(env, model, transport, [(a0, "0-2"), (a1, "3-4")], ns_a,
                              lambda: ip("link", "set", "veth0", "down", ns=ns_a), extra=auth)
        if f"stage 1 ({a1})" not in out or "no answer" not in out:
            raise Fail(f"veth down mid-session: expected a timeout naming stage 1 ({a1}):\n{out}")
        log(f"ok: veth down mid-session ({transport}): {out.splitlines()[0]}")
        ip("link", "set", "veth0", "up", ns=ns_a)
        # once the link is back, both stages have freed the session and serve again
        deadline = time.monotonic() + 15
        while "freed 1 session" not in env.stage_log(s1):
            if time.monotonic() > deadline:
                raise Fail(f"stage 1 did not free the session after the link came back:\n{env.stage_log(s1)}")
            time.sleep(0.2)
        env.same(f"after the link came back ({transport})", ref, env.generate(["--config", cfg], ns=ns_a),
                 env.logits(["--config", cfg], ns=ns_a))
        env.stop(s0)
        env.stop(s1)


def case_gguf_header(env):
    """A GGUF model's header is parsed once per process over a pipeline, each parse a mapping of
    the file: a stage's at load (its model id hashes that parse); the driver's by the model the
    command opens to split the layers, which its tokenizer and sampling defaults are read from,
    and by rlx_driver_create, which takes a path and reads the configuration and the model id
    from one parse. A text prompt, so the tokenizer is read; the same text as the local run."""
    strace = shutil.which("strace")
    if not strace:
        raise MissingInput("strace is not installed")
    gguf = os.path.join(env.tmp, "brown-draft-q8_0.gguf")
    env.run([env.rlx, "quantize", BROWN_DRAFT, gguf, "--type", "q8_0", "-q"], timeout=120)
    trace = os.path.join(env.tmp, "mmap.trace")
    cmd = [env.rlx, "generate", "--model", gguf, "-p", "The old man", "-n", str(N_NEW), "--seed", "3"]
    # LeakSanitizer cannot run under ptrace; the untraced local run below still checks for leaks
    no_lsan = "ASAN_OPTIONS=" + ":".join(filter(None, [os.environ.get("ASAN_OPTIONS"), "detect_leaks=0"]))
    traced, _ = env.run(["env", no_lsan, strace, "-f", "-y", "-e", "trace=mmap", "-o", trace, *cmd, "--stages", "2"],
                        check=False)
    if traced.returncode != 0 and "ptrace" in traced.stderr.lower():
        raise Skip(f"strace cannot trace here: {traced.stderr.strip()}")
    if traced.returncode != 0:
        raise Fail(f"exit {traced.returncode}: strace ... {' '.join(cmd)} --stages 2\n{traced.stderr}")
    local, _ = env.run(cmd)
    if traced.stdout != local.stdout:
        raise Fail(f"over 2 stages: {traced.stdout!r}\n  single process: {local.stdout!r}")
    maps, driver = {}, None
    with open(trace) as f:
        for line in f:
            pid = line.split(None, 1)[0]
            driver = driver or pid
            if " mmap(" in line and f"<{gguf}>" in line:
                maps[pid] = maps.get(pid, 0) + 1
    stages = sorted(n for pid, n in maps.items() if pid != driver)
    if maps.get(driver) != 2 or stages != [1, 1]:
        raise Fail(f"mappings of {gguf}: driver {maps.get(driver, 0)} (want 2), stages {stages} (want 1 each)")
    log("ok: a GGUF header parsed twice in the driver, once in each stage; the same text as one process")


class Mpirun:
    """mpirun (Open MPI) with what it needs on one machine: --oversubscribe (more ranks than cores),
    --allow-run-as-root as root, no binding (ranks share the cores), and the shared-memory and
    loopback transports only, so no InfiniBand or UCX probing of a container's devices. Each run is
    tagged through the environment, so its processes can be found (and one killed)."""

    def __init__(self, env):
        self.env = env
        self.path = shutil.which("mpirun")
        if not self.path:
            raise MissingInput("mpirun is not installed (Debian: apt-get install openmpi-bin libopenmpi-dev)")
        self.base = [self.path, "--oversubscribe", "--bind-to", "none", "--mca", "btl", "self,vader,tcp",
                     "--mca", "pml", "ob1", "--mca", "btl_vader_single_copy_mechanism", "none"]
        if os.geteuid() == 0:
            self.base.append("--allow-run-as-root")
        # Open MPI is built without frame pointers: only the slow unwinder reaches the frames of
        # its own leaks, which the suppressions name (tests/transport/lsan.supp)
        asan = os.environ.get("ASAN_OPTIONS", "")
        self.environ = {**os.environ, "ASAN_OPTIONS": ":".join(filter(None, [asan, "fast_unwind_on_malloc=0"]))}

    def env_for(self, tag):
        return {**self.environ, "RLX_TEST_MPI_TAG": tag}

    def cmd(self, n, args, recovery=False):
        return self.base + (["--enable-recovery"] if recovery else []) + ["-n", str(n), self.env.rlx, *args]

    def ranks(self, tag):
        """{rank: pid} of the live processes of the run tagged tag."""
        found = {}
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    environ = f.read().split(b"\0")
            except OSError:
                continue
            if f"RLX_TEST_MPI_TAG={tag}".encode() in environ:
                for item in environ:
                    if item.startswith(b"OMPI_COMM_WORLD_RANK="):
                        found[int(item.split(b"=", 1)[1])] = int(pid)
        return found


def case_mpi(env):
    """mpirun -n S+1 rlx ... --config FILE: rank 0 drives, rank k runs stage k-1, on every transport;
    the ids equal the single-process run's, a wrong world size is refused by the ranks, and a stage
    rank that dies ends the driver with an error naming the stage, within its deadline."""
    mpirun = Mpirun(env)
    model = env.model("deep-dense-f32")
    n = env.n_layers(model)
    ref = env.reference(model)[0]
    transports = [t for t in ("mpi", "tcp", "grpc") if env.has_plugin("transport", t)]
    if "mpi" not in transports:
        raise MissingInput(f"transport plugin 'mpi' is not built (no MPI library when configured; {env.plugins})")
    if len(transports) < 3:
        log(f"note: only {', '.join(transports)} are built")

    def addresses(transport, k):
        return [f"rank:{i + 1}" for i in range(k)] if transport == "mpi" else \
            [f"127.0.0.1:{port}" for port in free_ports(k)]

    def run(n_ranks, args, timeout=90):
        tag = str(random.getrandbits(48))
        p = subprocess.run(mpirun.cmd(n_ranks, args), capture_output=True, text=True, timeout=timeout,
                           env=mpirun.env_for(tag))
        if mpirun.ranks(tag):
            raise Fail(f"processes of `{' '.join(args)}` still run after mpirun returned: {mpirun.ranks(tag)}")
        return p

    gen = ["--tokens", TOKENS, "-n", str(N_NEW), "--greedy", "--threads", "1"]
    for transport in transports:
        for k in (2, 3):
            split = split_text(even(n, k))
            cfg = env.config(f"mpi-{transport}-{k}.yaml", model, transport,
                             [(a, r, None) for a, r in zip(addresses(transport, k), split)])
            t0 = time.monotonic()
            p = run(k + 1, ["generate", "--config", cfg, *gen])
            if p.returncode != 0 or p.stdout.strip() != ref:
                raise Fail(f"mpirun -n {k + 1} over {split} ({transport}): exit {p.returncode}, ids "
                           f"{p.stdout.strip()!r}, want {ref!r}:\n{p.stderr}")
            log(f"ok: mpirun -n {k + 1} generate over {k} stages {split} ({transport}): the single-process ids "
                f"in {time.monotonic() - t0:.1f} s")
    # a world that does not match the file: every rank refuses it with the same one-line error.
    # mpirun ends the job at the first rank's exit, so the others may be killed before they print
    # (and with --enable-recovery it would exit 0): at least one says it, and none says another thing
    cfg = env.config("mpi-size.yaml", model, "mpi", [(a, r, None) for a, r in zip(addresses("mpi", 2),
                                                                                    split_text(even(n, 2)))])
    for n_ranks in (2, 4):
        p = run(n_ranks, ["generate", "--config", cfg, *gen])
        want = f"mpirun started {n_ranks} processes; the file's 2 stages need 3"
        errors = [line for line in p.stderr.splitlines() if line.startswith("rlx: ")]
        if p.returncode == 0 or not errors or any(want not in line for line in errors) or \
                "AddressSanitizer" in p.stderr:
            raise Fail(f"mpirun -n {n_ranks} for 2 stages: exit {p.returncode}, want only '{want}' errors:\n"
                       f"{p.stderr}")
        log(f"ok: mpirun -n {n_ranks} for a file of 2 stages: refused ({len(errors)} of {n_ranks} ranks printed "
            f"the error before mpirun ended the job)")
    # a stage's address that is not its rank
    bad = env.config("mpi-bad-rank.yaml", model, "mpi", [("rank:2", "0-2", None), ("rank:1", "3-4", None)])
    p = run(3, ["generate", "--config", bad, *gen])
    if p.returncode == 0 or f"{bad}:4: stage 0 has address rank:2" not in p.stderr:
        raise Fail(f"stage addresses out of rank order: exit {p.returncode}:\n{p.stderr}")
    log("ok: a stage address that is not its rank is refused, naming the file's line")
    # a stage rank dies mid-generation: the driver names it within its deadline (mpirun would end
    # the job at the death; --enable-recovery lets the driver see it, as on a cluster it would).
    # Only on mpi: tcp and grpc finish the tiny model's 240 tokens before a kill can land, and
    # their dead stages are the faults-tcp/faults-grpc cases'
    for transport in [t for t in transports if t == "mpi"]:
        cfg = env.config(f"mpi-kill-{transport}.yaml", model, transport,
                         [(a, r, None) for a, r in zip(addresses(transport, 3), split_text(even(n, 3)))])
        tag = str(random.getrandbits(48))
        # 240 tokens (the test models' context is 256): killed at its first step, stage 1 has many left
        args = ["generate", "--config", cfg, "--tokens", TOKENS, "-n", "240", "--ignore-eos", "--greedy",
                "--threads", "1", "--timeout", "2000", "--compute-timeout", "100", "-v"]
        proc = subprocess.Popen(mpirun.cmd(4, args, recovery=True), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env=mpirun.env_for(tag))
        env.procs.append(proc)
        proc.log = open(os.devnull, "w+")
        lines, seen = [], threading.Event()

        def read_stderr():
            for line in proc.stderr:
                lines.append(line)
                if "session" in line and "started" in line and "rlx stage 1" in line:
                    seen.set()

        reader = threading.Thread(target=read_stderr, daemon=True)
        reader.start()
        if not seen.wait(60):
            proc.kill()
            raise Fail(f"{transport}: stage 1 never started a session:\n{''.join(lines)}")
        victim = mpirun.ranks(tag).get(2)
        if not victim:
            raise Fail(f"{transport}: no process of rank 2 found")
        os.kill(victim, signal.SIGKILL)
        t0 = time.monotonic()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise Fail(f"{transport}: the job hangs after stage 1 (rank 2) was killed:\n{''.join(lines)}")
        elapsed = time.monotonic() - t0
        reader.join(10)
        text = "".join(lines)
        stage_addr = cfg_address(cfg, 1)
        errors = [l for l in lines if l.startswith("rlx: ") and f"stage 1 ({stage_addr})" in l]
        if not errors or elapsed > 15 or "AddressSanitizer" in text or "runtime error" in text:
            raise Fail(f"{transport}: after killing stage 1, exit {proc.returncode} in {elapsed:.1f} s, "
                       f"no error naming stage 1 ({stage_addr}):\n{text}")
        left = mpirun.ranks(tag)
        if left:
            raise Fail(f"{transport}: processes still run after the job ended: {left}")
        # the stages left alive end well, but must not wait in MPI_Finalize for the dead rank (which
        # under --enable-recovery is forever): they say so and exit with status 1
        gave_up = sum("not every rank of the job ended" in l for l in lines)
        if not gave_up:
            raise Fail(f"{transport}: no stage said it left without MPI_Finalize after rank 2 died:\n{text}")
        log(f"ok: stage 1 killed mid-generation under mpirun ({transport}): the job ended in {elapsed:.1f} s "
            f"({gave_up} ranks left without MPI_Finalize): {errors[0].strip()}")


def cfg_address(cfg, i):
    """The address of stage i in a deployment file env.config wrote."""
    with open(cfg) as f:
        return [l.split("address:", 1)[1].strip() for l in f if "address:" in l][i]


CASES = {
    "parity-tcp": lambda env: case_parity(env, "tcp"),
    "parity-grpc": lambda env: case_parity(env, "grpc"),
    "mixed-backends": case_mixed_backends,
    "kv-cache": case_kv_cache,
    "options-threads": case_options_and_threads,
    "stage-place": case_stage_place,
    "protocol": case_protocol,
    "faults-tcp": lambda env: case_faults(env, "tcp"),
    "faults-grpc": lambda env: case_faults(env, "grpc"),
    "netns": case_netns,
    "gguf-header": case_gguf_header,
    "mpi": case_mpi,
}


def run_case(env, name, fn):
    """Runs case `name` (fn) and cleans up whatever happens: 0 passed, 1 failed, SKIP skipped,
    each said on stdout."""
    t0 = time.monotonic()
    try:
        fn()
    except MissingInput as e:
        return missing_input(f"{e.args[0]} ({name})")
    except Skip as e:
        log(f"SKIPPED: {e} ({name})")
        return SKIP
    except Fail as e:
        log(f"FAIL: {name}: {e}")
        return 1
    finally:
        env.cleanup()
    log(f"passed: {name} in {time.monotonic() - t0:.1f} s")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("case", choices=sorted(CASES))
    ap.add_argument("--rlx", required=True)
    ap.add_argument("--probe", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--plugins", required=True)
    args = ap.parse_args()
    env = Env(args)
    return run_case(env, args.case, lambda: CASES[args.case](env))


if __name__ == "__main__":
    sys.exit(main())
