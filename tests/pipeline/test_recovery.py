#!/usr/bin/python3
"""Recovery of a lost pipeline stage over real processes: a stage killed, stopped or gone for
good mid-stream, and what the driver does about it (replace it and replay every stream into the
replacement, or fail naming it within its bounds), checked against the single-process run.

  test_recovery.py CASE --rlx BIN --data DIR --plugins DIR

CASE is one of
  restart-T   stages started here; each in turn SIGKILLed mid-stream and started again on its
              address (a supervisor's restart): rlx generate's greedy ids are the single process's,
              and the stages serve the next driver; then a stage rlx generate --launch started,
              which the driver restarts itself
  hybrid-T    the same restart on a Qwen3.5 hybrid (qwen35-tied: three Gated DeltaNet layers and
              one attention layer over 3 stages), the killed stage holding a linear layer: its
              replacement rebuilds the convolution's and the delta rule's states by the replay
  standby-T   a stage SIGSTOPped mid-stream while a `standby:` stage of the deployment file runs:
              the driver gives up on it after --timeout and goes on with the standby, same ids
  serve-T     rlx serve --parallel 4 over a --launch'ed pipeline, 4 concurrent greedy streams,
              a launched stage SIGKILLed while every stream runs: each response (HTTP 200) is the
              one-process server's, the launcher restarted the stage, /metrics counts a recovery
  serve-hybrid-T
              rlx serve --parallel 2 on the Brown hybrid over 2 launched stages: one request, one
              continuing all its slot holds (reused), one sharing a shorter prefix (reusing
              nothing), then 2 concurrent streams, stage 1 SIGKILLed mid-stream: text and ids the
              single process's, log-probabilities the one-process server's, the positions reused
              the engine's rule for recurrent states
  fail-T      a stage killed (or stopped) with no replacement: the driver ends within
              --recovery-timeout plus its deadlines with one rlx: line naming the stage and
              "not replaced"; with --no-recovery at once
for T = tcp or grpc (77, skipped, when that transport's plugin is not built).

A kill lands mid-stream by construction: rlx generate's stdout is one end of a Unix socket pair
with the smallest send buffer, where each of the driver's per-token writes takes a buffer of its
own, so the driver blocks after a few tokens the test has not read. The test reads some tokens,
leaves the driver blocked, breaks a stage and reads on. rlx serve is checked through /metrics
while the victim is stopped: all 4 requests running, none completed. Every process runs with a
timeout and is killed at the end, whatever happens; only processes this test started (and the
stages its own rlx serve launched, found as its children) are signalled."""
import argparse
import http.client
import json
import os
import re
import select
import signal
import socket
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "serve"))
sys.dont_write_bytecode = True  # no __pycache__ in the source tree
from ports import free_ports  # noqa: E402
from serve_util import sse_events, stream_text  # noqa: E402
from test_pipeline import Env, Fail, log, run_case  # noqa: E402

SOURCE = os.path.abspath(os.path.join(HERE, "..", ".."))
# rlx serve needs a tokenizer, which the generated test models have not: the small shipped model
BROWN_DRAFT = os.path.join(SOURCE, "share", "models", "brown", "draft")
TOKENS = "1,5,3,7,9,11,2"
N_GEN = 240  # the test models' context is 256 positions: 7 of prompt, 240 generated
BATCH_INVARIANT = "batch_invariant=1"  # a replay recomputes decoded positions as one prefill
SPLIT = ["0-1", "2-3", "4-4"]  # deep-dense-f32's 5 layers over 3 stages
HYBRID_SPLIT = ["0-1", "2-2", "3-3"]  # qwen35-tied's linear 0-2 and full 3 over 3 stages
COMPLETED = 'rlx_requests_total{outcome="completed"}'
SANITIZER = ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:")


def sanitizer_report(text):
    return any(s in text for s in SANITIZER)


# ---- processes ----

def start_stage(env, args, what, timeout=60):
    """Starts `rlx stage ARGS -v` and waits until it listens; returns (process, address). Its
    stderr goes to a file, read with env.stage_log."""
    r, w = os.pipe()
    cmd = [env.rlx, "stage", *args, "--ready-fd", str(w), "-v"]
    errf = open(os.path.join(env.tmp, f"stage-{len(env.procs)}.log"), "w+")
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=errf, pass_fds=(w,))
    p.log = errf
    os.close(w)
    env.procs.append(p)
    line = b""
    deadline = time.monotonic() + timeout
    try:
        while not line.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([r], [], [], left)[0]:
                raise Fail(f"{what} did not start listening within {timeout} s: {env.stage_log(p)}")
            chunk = os.read(r, 256)
            if not chunk:
                p.wait(10)
                raise Fail(f"{what} exited with {p.returncode} before listening: {env.stage_log(p)}")
            line += chunk
    finally:
        os.close(r)
    return p, line.decode().strip()


def wait_for_log(env, p, pattern, what, timeout=15):
    """Waits until a line of stage p's log matches the regular expression."""
    deadline = time.monotonic() + timeout
    while not re.search(pattern, env.stage_log(p), re.M):
        if time.monotonic() > deadline:
            raise Fail(f"{what}: no line matches /{pattern}/ in its log within {timeout} s:\n{env.stage_log(p)}")
        time.sleep(0.1)


SESSION_SERVED = r"session [0-9a-f]+ started(.|\n)*session [0-9a-f]+ ended"  # a session begun and ended
FREED = r"freed 1 session of driver connection"


class Lines(threading.Thread):
    """Reads a text stream line by line, keeping each line with the time it came."""

    def __init__(self, stream):
        super().__init__(daemon=True)
        self.stream, self.lines, self.cond = stream, [], threading.Condition()

    def run(self):
        for line in self.stream:
            with self.cond:
                self.lines.append((time.monotonic(), line.rstrip("\n")))
                self.cond.notify_all()
        with self.cond:
            self.lines.append((time.monotonic(), None))  # the end
            self.cond.notify_all()

    def text(self):
        with self.cond:
            return "\n".join(l for _, l in self.lines if l is not None)

    def wait_for(self, pattern, timeout):
        """(time, line) of the first line matching the regular expression, or None on timeout or
        at the end of the stream."""
        rx = re.compile(pattern)
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                for t, l in self.lines:
                    if l is not None and rx.search(l):
                        return t, l
                left = deadline - time.monotonic()
                if left <= 0 or (self.lines and self.lines[-1][1] is None):
                    return None
                self.cond.wait(left)


class BrakedDriver:
    """An rlx driver (generate --tokens) whose stdout is one end of a Unix stream socket pair with
    the smallest send buffer. The driver writes and flushes each token id on its own, and the
    kernel gives every write a buffer of its own, so only a few of them fit: the driver then
    blocks in its next write until the test reads. So it cannot finish (or get far) while the
    test does something to a stage."""

    def __init__(self, env, cmd, what):
        self.what = what
        self.ours, theirs = socket.socketpair()
        theirs.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1)  # the kernel's minimum
        self.proc = subprocess.Popen(cmd, stdout=theirs.fileno(), stderr=subprocess.PIPE, text=True)
        theirs.close()
        self.proc.log = open(os.devnull, "w+")  # for Env.cleanup
        env.procs.append(self.proc)
        self.err = Lines(self.proc.stderr)
        self.err.start()
        self.out = b""
        self.eof = False

    def tokens(self):
        """The ids read so far (each written and flushed whole, so none is read in part)."""
        return [int(t) for t in self.out.decode().split()]

    def _read(self, timeout):
        """Reads what the driver wrote, waiting up to timeout s for it."""
        if not self.eof and select.select([self.ours], [], [], max(0.0, timeout))[0]:
            chunk = self.ours.recv(65536)
            self.eof = not chunk
            self.out += chunk

    def read_tokens(self, n, timeout=60):
        """Reads until n ids came; fails if the driver ends or stalls first."""
        deadline = time.monotonic() + timeout
        while len(self.tokens()) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise Fail(f"{self.what}: {len(self.tokens())} of {n} ids after {timeout} s:\n{self.err.text()}")
            self._read(min(left, 0.5))
            if self.eof:
                self.proc.wait(30)
                raise Fail(f"{self.what}: the driver ended (status {self.proc.returncode}) after "
                           f"{len(self.tokens())} ids, before {n}:\n{self.err.text()}")
        return self.tokens()

    def held(self, n_total, settle=0.3):
        """After the reads stopped: waits a moment and checks the driver is blocked mid-stream, still
        running with fewer than n_total ids written (read or queued). Returns how many it wrote."""
        time.sleep(settle)
        try:
            queued = self.ours.recv(65536, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except BlockingIOError:
            queued = b""
        written = (self.out + queued).decode().split()
        if self.proc.poll() is not None or len(written) >= n_total:
            raise Fail(f"{self.what}: the driver was not held mid-stream (status {self.proc.poll()}, "
                       f"{len(written)} of {n_total} ids written): the socket did not block its writes")
        return len(written)

    def finish(self, timeout=90):
        """Reads to the end and waits for the driver: (status, stdout text, stderr text)."""
        deadline = time.monotonic() + timeout
        while not self.eof:
            left = deadline - time.monotonic()
            if left <= 0:
                self.proc.kill()
                raise Fail(f"{self.what}: the driver did not finish within {timeout} s ({len(self.tokens())} ids "
                           f"so far):\n{self.err.text()}")
            self._read(min(left, 0.5))
        try:
            self.proc.wait(max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise Fail(f"{self.what}: the driver closed its output but did not exit:\n{self.err.text()}")
        self.t_end = time.monotonic()
        self.err.join(10)
        self.ours.close()
        err = self.err.text()
        status = self.proc.returncode
        if sanitizer_report(err):
            raise Fail(f"{self.what}: a sanitizer report:\n{err}")
        return status, self.out.decode(), err


def children(pid):
    """{pid: argv} of the live child processes of process pid (a driver's launched stages)."""
    p = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True, timeout=10)
    out = {}
    for child in p.stdout.split():
        try:
            with open(f"/proc/{child}/cmdline", "rb") as f:
                out[int(child)] = [a.decode() for a in f.read().split(b"\0") if a]
        except OSError:
            pass
    return out


def launched_stage(pid, i, what):
    """The pid of stage i that driver process pid launched (`rlx stage ... --config F --stage i`)."""
    kids = children(pid)
    found = [c for c, argv in kids.items()
             if "stage" in argv and "--stage" in argv and argv[argv.index("--stage") + 1] == str(i)]
    if len(found) != 1:
        raise Fail(f"{what}: want one launched stage {i} among the driver's children, got {kids}")
    return found[0]


def still_running(pids):
    """The pids of pids that still run the command line they had ({pid: argv})."""
    left = []
    for pid, argv in pids.items():
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if [a.decode() for a in f.read().split(b"\0") if a] == argv:
                    left.append(pid)
        except OSError:
            pass
    return left


def deploy_file(env, name, model, transport, stages, standby=None, extra=""):
    """A deployment file: stages are (address, layers); standby maps a stage index to its
    standby addresses. Every stage runs cpu-blas batch-invariant on one thread."""
    lines = [f"model: {model}", f"transport: {transport}", "stages:"]
    for i, (addr, layers) in enumerate(stages):
        lines += [f"  - address: {addr}", f"    layers: {layers}", "    backend: cpu-blas",
                  f'    backend_options: "{BATCH_INVARIANT}"', "    threads: 1"]
        if standby and i in standby:
            lines.append(f"    standby: [{', '.join(standby[i])}]")
    path = os.path.join(env.tmp, name)
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n" + extra)
    return path


def reference_ids(env, model):
    """The single process's greedy ids for TOKENS, N_GEN of them, as a list of ints."""
    p, _ = env.run([env.rlx, "generate", "--model", model, "--tokens", TOKENS, "-n", str(N_GEN), "--ignore-eos",
                    "--greedy", "--threads", "1", "--backend-opts", BATCH_INVARIANT], timeout=120)
    ids = [int(t) for t in p.stdout.split()]
    if len(ids) != N_GEN:
        raise Fail(f"the single process gave {len(ids)} ids, want {N_GEN}: {p.stdout!r}")
    return ids


def driver_cmd(env, cfg, *extra):
    return [env.rlx, "generate", "--config", cfg, "--tokens", TOKENS, "-n", str(N_GEN), "--ignore-eos", "--greedy",
            "--threads", "1", *extra]


def same_ids(what, ref, status, out, err):
    ids = [int(t) for t in out.split()]
    if status != 0 or ids != ref:
        first = next((k for k, (a, b) in enumerate(zip(ids, ref)) if a != b), min(len(ids), len(ref)))
        raise Fail(f"{what}: exit {status}, {len(ids)} ids, first difference at {first}:\n  single process: {ref}\n"
                   f"  pipeline:       {ids}\n{err}")


def one_line(err, pattern, what):
    """The one line of err matching the regular expression; fails on none or several."""
    found = [l for l in err.splitlines() if re.search(pattern, l)]
    if len(found) != 1:
        raise Fail(f"{what}: {len(found)} lines match /{pattern}/, want 1:\n{err}")
    return found[0]


def stop_all(env, procs):
    for p in procs:
        env.stop(p)
        if sanitizer_report(env.stage_log(p)):
            raise Fail(f"stage {p.pid}: a sanitizer report:\n{env.stage_log(p)}")


# ---- cases ----

def case_restart(env, transport, model_name="deep-dense-f32", split=SPLIT, victims=None, launched=True):
    """A stage SIGKILLed mid-stream and started again on its address, as a supervisor would: the
    driver reconnects to it (retrying while nothing listens there), replays the session and
    goes on; the ids are the single process's. Each stage in turn (or the victims): the first
    (embeds ids), a middle one and the last (logits); then the stages, the restarted one among
    them, serve the next driver. Last (launched), a stage that rlx generate --launch started
    itself: the driver restarts it."""
    env.need_transport(transport)
    model = env.model(model_name)
    ref = reference_ids(env, model)
    for victim in range(len(split)) if victims is None else victims:
        addrs = [f"127.0.0.1:{p}" for p in free_ports(len(split))]
        cfg = deploy_file(env, f"restart-{victim}.yaml", model, transport, list(zip(addrs, split)))
        stages = [start_stage(env, ["--config", cfg, "--stage", str(i)], f"stage {i}")[0] for i in range(len(split))]
        what = f"stage {victim} of 3 of {model_name} killed and restarted on {addrs[victim]} ({transport})"
        drv = BrakedDriver(env, driver_cmd(env, cfg, "--timeout", "5000", "--recovery-timeout", "60000"), what)
        drv.read_tokens(20)
        written = drv.held(N_GEN)
        stages[victim].kill()
        stages[victim].wait(10)
        t_kill = time.monotonic()
        # the driver goes on, finds the stage gone and retries its address while nothing listens
        # there: the supervisor's restart comes only once the driver said it is replacing it
        drv.read_tokens(written)  # lets it write again: its next step meets the dead stage
        if not drv.err.wait_for(rf"stage {victim} \({re.escape(addrs[victim])}\).*; replacing stage {victim} ", 30):
            raise Fail(f"{what}: the driver never said it is replacing stage {victim}:\n{drv.err.text()}")
        time.sleep(0.3)
        stages[victim], _ = start_stage(env, ["--config", cfg, "--stage", str(victim)], f"restarted stage {victim}")
        status, out, err = drv.finish()
        same_ids(what, ref, status, out, err)
        done = check_replaced(err, victim, addrs[victim], written, what)
        # the replacement served the replay and the rest: a session started on it, then ended
        wait_for_log(env, stages[victim], SESSION_SERVED, f"{what}: the restarted stage")
        log(f"ok: {what}: the single process's {N_GEN} ids; killed after {written} ids, "
            f"{done.split('rlx: ', 1)[-1]} ({time.monotonic() - t_kill:.1f} s from the kill to the end)")
        # every stage freed the session and serves the next driver
        p, _ = env.run(driver_cmd(env, cfg), timeout=120)
        same_ids(f"{what}: the next driver", ref, p.returncode, p.stdout, p.stderr)
        stop_all(env, stages)
    if not launched:
        return
    # a stage the driver launched: the driver kills what is left of it and starts it again
    victim = 1
    addrs = [f"127.0.0.1:{p}" for p in free_ports(len(SPLIT))]
    cfg = deploy_file(env, "restart-launched.yaml", model, transport, list(zip(addrs, SPLIT)))
    what = f"launched stage {victim} of 3 killed, rlx generate --launch ({transport})"
    drv = BrakedDriver(env, driver_cmd(env, cfg, "--launch", "--recovery-timeout", "60000"), what)
    drv.read_tokens(20)
    written = drv.held(N_GEN)
    old = launched_stage(drv.proc.pid, victim, what)
    os.kill(old, signal.SIGKILL)  # a child of our driver; the driver reaps it
    drv.read_tokens(written)
    found = drv.err.wait_for(rf"^rlx: restarted stage {victim} \(pid \d+\) on ", 60)
    if not found:
        raise Fail(f"{what}: the driver did not restart stage {victim}:\n{drv.err.text()}")
    new = int(re.search(r"\(pid (\d+)\)", found[1]).group(1))
    # the driver is held by its output again: its stages now, the restarted one among them
    launched = children(drv.proc.pid)
    if new == old or launched_stage(drv.proc.pid, victim, what) != new or len(launched) != len(SPLIT) or \
            found[1].split(" on ")[-1] != addrs[victim]:
        raise Fail(f"{what}: {found[1]!r}: want a new process for stage {victim} (was {old}) on {addrs[victim]} "
                   f"among the driver's 3 stages, got {launched}")
    status, out, err = drv.finish()
    same_ids(what, ref, status, out, err)
    done = check_replaced(err, victim, addrs[victim], written, what)
    time.sleep(0.5)
    if still_running(launched):
        raise Fail(f"{what}: launched stages {still_running(launched)} outlived the driver")
    log(f"ok: {what}: the single process's {N_GEN} ids; killed after {written} ids; {found[1].split('rlx: ')[-1]}; "
        f"{done.split('rlx: ', 1)[-1]}")


def check_replaced(err, victim, addr, written, what):
    """The driver's one line saying stage victim was replaced at addr; the positions it replayed
    are the session's when the stage was lost: the 7 of the prompt and the ids fed back by then
    (at least the 20 read but the last, at most what it wrote, give or take a few queued)."""
    done = one_line(err, rf"^rlx: stage {victim} \({re.escape(addr)}\) replaced and \d+ positions replayed in", what)
    replayed = int(re.search(r"replaced and (\d+) positions", done).group(1))
    if not 7 + 20 - 1 <= replayed <= 7 + written + 8:
        raise Fail(f"{what}: {replayed} positions replayed; the driver had written {written} ids of a 7-id prompt:\n"
                   f"{err}")
    return done


def case_standby(env, transport):
    """A stage SIGSTOPped mid-stream (alive, its connection open, silent) while its standby of
    the deployment file runs: the driver waits --timeout plus a position's --compute-timeout, gives
    up on the stopped stage (its address too answers no handshake) and replays into the standby;
    the ids are the single process's. The stopped stage, continued, frees the session."""
    env.need_transport(transport)
    model = env.model("deep-dense-f32")
    ref = reference_ids(env, model)
    for victim in (1, 2):
        ports = free_ports(len(SPLIT) + 1)
        addrs = [f"127.0.0.1:{p}" for p in ports[:len(SPLIT)]]
        spare = f"127.0.0.1:{ports[-1]}"
        cfg = deploy_file(env, f"standby-{victim}.yaml", model, transport, list(zip(addrs, SPLIT)),
                          standby={victim: [spare]})
        stages = [start_stage(env, ["--config", cfg, "--stage", str(i)], f"stage {i}")[0] for i in range(len(SPLIT))]
        standby, bound = start_stage(env, ["--config", cfg, "--stage", str(victim), "--standby", "0"],
                                     f"standby of stage {victim}")
        if bound != spare:
            raise Fail(f"the standby of stage {victim} listens on {bound}, the file says {spare}")
        what = f"stage {victim} of 3 stopped, standby {spare} ({transport})"
        drv = BrakedDriver(env, driver_cmd(env, cfg, "--timeout", "1000", "--compute-timeout", "50"), what)
        stopped = stages[victim]
        try:
            drv.read_tokens(20)
            written = drv.held(N_GEN)
            stopped.send_signal(signal.SIGSTOP)
            t_stop = time.monotonic()
            drv.read_tokens(written)
            status, out, err = drv.finish()
            same_ids(what, ref, status, out, err)
            lost = one_line(err, rf"stage {victim} \({re.escape(addrs[victim])}\).*no answer.*; replacing stage "
                                 f"{victim} ", what)
            # the stall is noticed at the step's deadline, --timeout plus a position's --compute-timeout
            t_lost = drv.err.wait_for(re.escape(lost), 0)[0] - t_stop
            if not 1.0 <= t_lost <= 1.05 + 6:
                raise Fail(f"{what}: the stall was noticed {t_lost:.2f} s after the stop, want 1.05 s (and some slack)"
                           f":\n{err}")
            done = check_replaced(err, victim, spare, written, what)
            took = float(re.search(r"replayed in ([0-9.]+) s", done).group(1))
            wait_for_log(env, standby, SESSION_SERVED, f"{what}: the standby")
            log(f"ok: {what}: the single process's {N_GEN} ids; stopped after {written} ids; {lost.split('rlx: ')[-1]}"
                f" ({t_lost:.2f} s after the stop) / recovered in {took:.2f} s, {drv.t_end - t_stop:.1f} s from the "
                "stop to the end")
        finally:
            stopped.send_signal(signal.SIGCONT)
        # the stopped stage, continued, finds its driver gone and frees the session
        wait_for_log(env, stopped, FREED, f"{what}: the continued stage")
        stop_all(env, stages + [standby])


def case_fail(env, transport):
    """No replacement comes: the driver tries for --recovery-timeout and ends with one rlx: line
    naming the stage and "not replaced", within the recovery timeout plus its deadlines; the ids
    it wrote are the single process's first ones. A stalled stage the same, after its deadline.
    With --no-recovery the error comes at once. The stages left free the session either way."""
    env.need_transport(transport)
    model = env.model("deep-dense-f32")
    ref = reference_ids(env, model)
    recovery_ms, control_ms = 2000, 1000
    slack = 6.0  # a loaded 2-core machine, sanitizers
    runs = [("kill", ["--recovery-timeout", str(recovery_ms)]),
            ("stop", ["--recovery-timeout", str(recovery_ms)]),
            ("kill", ["--no-recovery"])]
    for fault, flags in runs:
        victim = 1
        addrs = [f"127.0.0.1:{p}" for p in free_ports(len(SPLIT))]
        cfg = deploy_file(env, f"fail-{fault}-{flags[0][2:]}.yaml", model, transport, list(zip(addrs, SPLIT)))
        stages = [start_stage(env, ["--config", cfg, "--stage", str(i)], f"stage {i}")[0] for i in range(len(SPLIT))]
        what = f"stage 1 {'killed' if fault == 'kill' else 'stopped'}, {' '.join(flags)} ({transport})"
        drv = BrakedDriver(env, driver_cmd(env, cfg, "--timeout", str(control_ms), "--compute-timeout", "50", *flags),
                           what)
        try:
            drv.read_tokens(20)
            written = drv.held(N_GEN)
            stages[victim].send_signal(signal.SIGKILL if fault == "kill" else signal.SIGSTOP)
            if fault == "kill":
                stages[victim].wait(10)
            t0 = time.monotonic()
            drv.read_tokens(written)
            status, out, err = drv.finish(timeout=60)
        finally:
            stages[victim].send_signal(signal.SIGCONT)
        elapsed = drv.t_end - t0
        ids = [int(t) for t in out.split()]
        if status == 0 or ids != ref[:len(ids)] or len(ids) < written:
            raise Fail(f"{what}: exit {status}; {len(ids)} ids (wrote {written} before the fault), want a failure "
                       f"after a prefix of the single process's:\n  {ref}\n  {ids}\n{err}")
        lines = err.splitlines()
        errors = [l for l in lines if l.startswith("rlx: ") and "replacing stage" not in l]
        name = f"stage {victim} ({addrs[victim]})"
        if len(errors) != 1 or name not in errors[0]:
            raise Fail(f"{what}: want one rlx: error naming {name}, got {len(errors)}:\n{err}")
        error = errors[0]
        t_error = drv.err.wait_for(re.escape(error), 0)[0] - t0
        deadline = control_ms / 1000 + 0.05 if fault == "stop" else 0  # noticing a stalled stage
        if "--no-recovery" in flags:
            if "not replaced" in err or "replacing stage" in err or t_error > 1.0 + slack / 3:
                raise Fail(f"{what}: want the error at once, without a replacement, got it after {t_error:.1f} s:\n"
                           f"{err}")
        else:
            if f"not replaced within {recovery_ms} ms" not in error:
                raise Fail(f"{what}: the error does not say the stage was not replaced within {recovery_ms} ms:\n{err}")
            if not any(f"; replacing stage {victim} " in l for l in lines):
                raise Fail(f"{what}: no line said the driver was replacing stage {victim}:\n{err}")
            # it tried for the whole recovery timeout, and not much longer
            low, high = deadline + recovery_ms / 1000 - 0.1, deadline + (recovery_ms + control_ms) / 1000 + slack
            if not low <= t_error <= high:
                raise Fail(f"{what}: the error came {t_error:.1f} s after the {fault}, want {low:.1f} to {high:.1f} s:"
                           f"\n{err}")
        # ending the session on the stages left takes a control answer at most; gRPC gives the
        # connection to a stopped stage its linger time (linger_ms, 5000) before the driver can exit
        linger = 5.0 if transport == "grpc" and fault == "stop" else 0
        if elapsed > max(t_error + control_ms / 1000, deadline + linger) + slack:
            raise Fail(f"{what}: the driver exited {elapsed:.1f} s after the {fault}, {elapsed - t_error:.1f} s after "
                       f"its error")
        log(f"ok: {what}: failed {t_error:.1f} s after the {fault} (exit {elapsed:.1f} s), {len(ids)} ids of the "
            f"single process's first: {error}")
        survivors = [s for i, s in enumerate(stages) if i != victim or fault == "stop"]
        for s in survivors:
            wait_for_log(env, s, FREED, f"{what}: stage {stages.index(s)}")
        stop_all(env, survivors)


# ---- rlx serve over a launched pipeline ----

class Serve:
    """rlx serve on a free loopback port, its stderr read by a thread."""

    def __init__(self, env, args, what, timeout=120):
        self.env, self.what = env, what
        self.proc = subprocess.Popen([env.rlx, "serve", "--host", "127.0.0.1", "--port", "0", "-t", "1", *args],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.proc.log = open(os.devnull, "w+")
        env.procs.append(self.proc)
        self.err = Lines(self.proc.stderr)
        self.err.start()
        found = self.err.wait_for(r"listening on http://127\.0\.0\.1:(\d+)", timeout)
        if not found:
            raise Fail(f"{what}: rlx serve did not listen:\n{self.err.text()}")
        self.port = int(re.search(r"127\.0\.0\.1:(\d+)", found[1]).group(1))
        if not self.err.wait_for(r"rlx serve: ready", timeout):
            raise Fail(f"{what}: rlx serve did not become ready:\n{self.err.text()}")

    def request(self, method, path, body=None, timeout=60):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            c.request(method, path, body=json.dumps(body) if body is not None else None,
                      headers={"Content-Type": "application/json"} if body is not None else {})
            r = c.getresponse()
            return r.status, r.read()
        finally:
            c.close()

    def metrics(self):
        status, body = self.request("GET", "/metrics")
        if status != 200:
            raise Fail(f"{self.what}: GET /metrics: {status}")
        out = {}
        for line in body.decode().splitlines():
            if line and not line.startswith("#"):
                key, value = line.rsplit(" ", 1)
                out[key] = float(value)
        return out

    def children(self):
        return children(self.proc.pid)

    def stage_pid(self, i):
        return launched_stage(self.proc.pid, i, self.what)

    def stop(self):
        """SIGTERM: the server drains, stops its stages and exits 0."""
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise Fail(f"{self.what}: rlx serve did not stop on SIGTERM:\n{self.err.text()}")
        self.err.join(10)
        err = self.err.text()
        if self.proc.returncode != 0:
            raise Fail(f"{self.what}: rlx serve exited with {self.proc.returncode} on SIGTERM:\n{err}")
        if sanitizer_report(err):
            raise Fail(f"{self.what}: a sanitizer report:\n{err}")
        return err


class Stream(threading.Thread):
    """One streamed greedy /v1/completions request (or, with path, that endpoint's); counts the
    events as they come."""

    def __init__(self, port, prompt, max_tokens, path="/v1/completions"):
        super().__init__(daemon=True)
        self.port, self.prompt, self.max_tokens, self.path = port, prompt, max_tokens, path
        self.events, self.status, self.body, self.error = 0, None, b"", None

    def run(self):
        try:
            c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
            c.request("POST", self.path,
                      json.dumps({"prompt": self.prompt, "max_tokens": self.max_tokens, "temperature": 0,
                                  "ignore_eos": True, "stream": True, "logprobs": 3, "n_probs": 1}),
                      {"Content-Type": "application/json"})
            r = c.getresponse()
            self.status = r.status
            while True:
                line = r.readline()
                if not line:
                    break
                self.body += line
                if line.startswith(b"data: {"):
                    self.events += 1
                if line.startswith(b"data: [DONE]"):
                    self.body += r.readline()
                    break
            c.close()
        except Exception as e:  # reported by the test
            self.error = e

    def result(self, what):
        """(text, finish_reason, the log-probabilities of every token and of its 3 alternatives)."""
        if self.error or self.status != 200:
            raise Fail(f"{what}: prompt {self.prompt}: status {self.status}, {self.error!r}: {self.body[-300:]!r}")
        try:
            text, finish, _ = stream_text(self.body, False)
            lps = []  # (token, its log-probability, the alternatives') of each token
            for e in sse_events(self.body)[:-1]:
                for c in json.loads(e)["choices"]:
                    if c["logprobs"]:  # a chunk may carry several tokens (text held back mid-character)
                        lp = c["logprobs"]
                        lps += zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"])
        except (ValueError, KeyError) as e:
            raise Fail(f"{what}: prompt {self.prompt}: {e}")
        if len(lps) != self.max_tokens:
            raise Fail(f"{what}: prompt {self.prompt}: log-probabilities of {len(lps)} tokens, want {self.max_tokens}")
        return text, finish, lps


def run_streams(port, prompts, max_tokens, path="/v1/completions"):
    streams = [Stream(port, p, max_tokens, path) for p in prompts]
    for s in streams:
        s.start()
    return streams


def end_streams(streams, what, timeout=120):
    deadline = time.monotonic() + timeout
    for s in streams:
        s.join(max(0.1, deadline - time.monotonic()))
        if s.is_alive():
            raise Fail(f"{what}: a stream did not end within {timeout} s ({s.events} events)")


def join_streams(streams, what, timeout=120):
    end_streams(streams, what, timeout)
    return [s.result(what) for s in streams]


def case_serve(env, transport):
    """rlx serve --parallel 4 over a deployment file's 2 stages it launched: 4 concurrent greedy
    streams; once each has tokens, stage 1 (a child of the server) is SIGSTOPped while /metrics
    shows all 4 running and none completed, then SIGKILLed. The launcher restarts it, the
    driver replays every slot into it, and each stream ends (HTTP 200, finish_reason length)
    with the one-process server's text; /metrics counts the recovery."""
    env.need_transport(transport)
    model = BROWN_DRAFT
    max_tokens = 400
    prompts = [[1, 5, 3, 7, 9, 11, 2], [42, 17, 99], [7, 7, 300, 1000, 12, 5], [2048, 3, 64, 900]]
    # the reference: one process, the same 4 requests at once (its slots are batch-invariant)
    one = Serve(env, ["-m", model, "--parallel", "4"], "one-process rlx serve")
    ref = join_streams(run_streams(one.port, prompts, max_tokens), "one-process rlx serve")
    one.stop()
    if len({t for t, _, _ in ref}) != len(prompts) or any(f != "length" for _, f, _ in ref):
        raise Fail(f"the reference streams should differ and run to max_tokens: {ref}")
    addrs = [f"127.0.0.1:{p}" for p in free_ports(2)]
    cfg = os.path.join(env.tmp, f"serve-{transport}.yaml")
    with open(cfg, "w") as f:
        f.write(f"model: {model}\ntransport: {transport}\nstages:\n  - address: {addrs[0]}\n"
                f"  - address: {addrs[1]}\n")
    what = f"rlx serve --parallel 4 over 2 launched stages, stage 1 killed ({transport})"
    srv = Serve(env, ["--config", cfg, "--launch", "--parallel", "4"], what)
    victim = None
    try:
        victim = srv.stage_pid(1)
        streams = run_streams(srv.port, prompts, max_tokens)
        deadline = time.monotonic() + 60
        while min(s.events for s in streams) < 3:
            if time.monotonic() > deadline or not all(s.is_alive() for s in streams):
                raise Fail(f"{what}: the streams did not all start: {[s.events for s in streams]}\n{srv.err.text()}")
            time.sleep(0.002)
        os.kill(victim, signal.SIGSTOP)
        m = srv.metrics()
        running, completed = m.get("rlx_requests_running"), m.get(COMPLETED)
        if running != 4 or completed != 0:
            raise Fail(f"{what}: with stage 1 stopped, {running} requests run and {completed} completed, want 4 and 0 "
                       f"(the kill would not land mid-stream)")
        events = [s.events for s in streams]
        os.kill(victim, signal.SIGKILL)
        t_kill = time.monotonic()
        got = join_streams(streams, what)
        t_done = time.monotonic()
        # the replayed slots hold the bits the one-process engine's held: every token's
        # log-probability (and its alternatives') is the one-process server's, to the last bit
        for k, ((text, finish, lps), (ref_text, _, ref_lps)) in enumerate(zip(got, ref)):
            if text != ref_text or finish != "length":
                raise Fail(f"{what}: stream {k} (prompt {prompts[k]}) finished '{finish}' with another text than the "
                           f"one-process server's:\n  one process: {ref_text!r}\n  pipeline:    {text!r}")
            if lps != ref_lps:
                at = next(i for i, (a, b) in enumerate(zip(lps, ref_lps)) if a != b)
                raise Fail(f"{what}: stream {k} (prompt {prompts[k]}): the log-probabilities of token {at} differ "
                           f"from the one-process server's (killed after {events[k]} events):\n  one process: "
                           f"{ref_lps[at]}\n  pipeline:    {lps[at]}")
        m = srv.metrics()
        recoveries, completed = m.get("rlx_pipeline_recovery_seconds_count"), m.get(COMPLETED)
        if recoveries != 1 or completed != 4:
            raise Fail(f"{what}: /metrics counts {recoveries} recoveries and {completed} completed requests, want 1 "
                       "and 4")
        err = srv.err.text()
        restarted = one_line(err, r"rlx: restarted stage 1 \(pid \d+\) on ", what)
        new_pid = int(re.search(r"\(pid (\d+)\)", restarted).group(1))
        if new_pid == victim or srv.stage_pid(1) != new_pid or restarted.split(" on ")[-1] != addrs[1]:
            raise Fail(f"{what}: {restarted!r}: want a new process for stage 1 (was {victim}) on {addrs[1]}, "
                       f"the server's children are {srv.children()}")
        done = one_line(err, rf"stage 1 \({re.escape(addrs[1])}\) replaced and its streams replayed in", what)
        victim = None
        launched = srv.children()
        err = srv.stop()
        time.sleep(0.5)
        if still_running(launched):
            raise Fail(f"{what}: launched stages {still_running(launched)} outlived the server")
        log(f"ok: {what}: 4 streams (killed after {events} events of {max_tokens}) each the one-process text, HTTP 200;"
            f" {restarted.split('rlx: ')[-1]}; {done.split('rlx: ')[-1]} ({t_done - t_kill:.1f} s from the kill to "
            f"the last stream's end)")
    finally:
        if victim is not None and srv.proc.poll() is None:
            try:
                os.kill(victim, signal.SIGCONT)  # a child of our server, maybe left stopped
            except ProcessLookupError:
                pass


BROWN_HYBRID = os.path.join(SOURCE, "share", "models", "brown", "hybrid")  # Qwen3.5: 6 linear, 2 full layers


def generate_json(env, model, ids, n):
    """The single process's greedy continuation of ids (one sequence, nothing cached): its text
    and its n token ids."""
    p, _ = env.run([env.rlx, "generate", "--model", model, "--tokens", ",".join(map(str, ids)), "-n", str(n),
                    "--ignore-eos", "--greedy", "--threads", "1", "--backend-opts", BATCH_INVARIANT, "--json"],
                   timeout=120)
    out = json.loads(p.stdout)
    if len(out["tokens"]) != n:
        raise Fail(f"the single process gave {len(out['tokens'])} ids for {ids}, want {n}: {p.stdout}")
    return out["text"], out["tokens"]


def llama_reply(what, events):
    """(text, ids, log-probabilities, tokens_cached) of llama-server's /completion objects (a
    reply, or a stream's events), the tokens' from their completion_probabilities."""
    text, ids, lps, cached = "", [], [], None
    for e in events:
        if "error" in e or "content" not in e:
            raise Fail(f"{what}: not a completion: {e}")
        text += e["content"]
        ids += [t["id"] for t in e.get("completion_probabilities", [])]
        lps += [t["logprob"] for t in e.get("completion_probabilities", [])]
        if e["stop"]:
            cached = e["tokens_cached"]
    return text, ids, lps, cached


def hybrid_requests(srv, what, singles, streamed, max_tokens, during=None):
    """Sends srv the (prompt, n) of singles one at a time, then the streamed prompts at once
    (during(streams) runs once each stream has 3 events): each reply's llama_reply."""
    out = []
    for prompt, n in singles:
        status, body = srv.request("POST", "/completion", {"prompt": prompt, "n_predict": n, "temperature": 0,
                                                           "ignore_eos": True, "n_probs": 1})
        if status != 200:
            raise Fail(f"{what}: a request of {len(prompt)} ids: HTTP {status}: {body[:300]!r}")
        out.append(llama_reply(what, [json.loads(body)]))
    streams = run_streams(srv.port, streamed, max_tokens, "/completion")
    deadline = time.monotonic() + 60
    while during and min(s.events for s in streams) < 3:
        if time.monotonic() > deadline or not all(s.is_alive() for s in streams):
            raise Fail(f"{what}: the streams did not all start: {[s.events for s in streams]}\n{srv.err.text()}")
        time.sleep(0.002)
    if during:
        during(streams)
    end_streams(streams, what)
    for s in streams:
        if s.error or s.status != 200:
            raise Fail(f"{what}: stream of {s.prompt}: status {s.status}, {s.error!r}: {s.body[-300:]!r}")
        try:
            out.append(llama_reply(what, [json.loads(e) for e in sse_events(s.body)]))
        except ValueError as e:
            raise Fail(f"{what}: stream of {s.prompt}: {e}")
    return out


def case_serve_hybrid(env, transport):
    """rlx serve --parallel 2 on the Brown hybrid (Gated DeltaNet layers beside attention) over
    the 2 stages of a deployment file it launched, each stage holding linear layers. First one
    request at a time: A; B continuing all A's slot holds, which reuses it; C sharing only A's
    first ids, which a recurrent state cannot be cut back to, so C reuses nothing. Then 2
    concurrent streams, which start both slots again at position 0, shorter than what they held;
    stage 1 (a child of the server) is SIGSTOPped while both run, then SIGKILLed. The launcher
    restarts it, and the driver replays every slot into it and brings stage 0's states back to
    where they were. Every reply's text and ids are the single process's (rlx generate: one
    sequence, nothing cached), its log-probabilities the one-process server's to the bit."""
    env.need_transport(transport)
    model = BROWN_HYBRID
    a = [200 + 37 * k for k in range(12)]
    ref = [generate_json(env, model, a, 8)]
    b = a + ref[0][1][:7] + [901, 17, 333, 42] + list(range(500, 530))
    c = a[:6] + list(range(1200, 1250))
    singles = [(a, 8), (b, 8), (c, 8)]
    streamed, max_tokens = [[31, 415, 92, 65], [2718, 28, 18, 284, 59]], 64
    cached = [0, len(a) + 7, 0, 0, 0]
    ref += [generate_json(env, model, p, n) for p, n in singles[1:]]
    ref += [generate_json(env, model, p, max_tokens) for p in streamed]
    one = Serve(env, ["-m", model, "--parallel", "2"], "one-process rlx serve")
    ref_lps = [lps for _, _, lps, _ in hybrid_requests(one, "one-process rlx serve", singles, streamed, max_tokens)]
    one.stop()
    addrs = [f"127.0.0.1:{p}" for p in free_ports(2)]
    cfg = deploy_file(env, f"serve-hybrid-{transport}.yaml", model, transport, list(zip(addrs, ["0-3", "4-7"])))
    what = f"rlx serve --parallel 2 on the hybrid over 2 launched stages ({transport})"
    srv = Serve(env, ["--config", cfg, "--launch", "--parallel", "2"], what)
    victim, events = srv.stage_pid(1), []

    def kill(streams):
        os.kill(victim, signal.SIGSTOP)
        m = srv.metrics()
        if m.get("rlx_requests_running") != 2 or m.get(COMPLETED) != len(singles):
            raise Fail(f"{what}: with stage 1 stopped, {m.get('rlx_requests_running')} requests run and "
                       f"{m.get(COMPLETED)} completed, want 2 and {len(singles)} (the kill would not land mid-stream)")
        events.extend(s.events for s in streams)
        os.kill(victim, signal.SIGKILL)

    try:
        got = hybrid_requests(srv, what, singles, streamed, max_tokens, kill)
    finally:
        if not events and srv.proc.poll() is None:
            try:
                os.kill(victim, signal.SIGCONT)  # a child of our server, maybe left stopped
            except ProcessLookupError:
                pass
    names = ["A", "B", "C", "stream 0 (killed after {} events)", "stream 1 (killed after {} events)"]
    for k, ((text, ids, lps, n_cached), (ref_text, ref_ids)) in enumerate(zip(got, ref)):
        name = names[k].format(*events[k - 3:k - 2]) if k >= 3 else names[k]
        if (text, ids) != (ref_text, ref_ids) or n_cached != cached[k]:
            raise Fail(f"{what}: {name} is not the single process's or took {n_cached} positions from the cache, want "
                       f"{cached[k]}:\n  single process: {ref_ids} {ref_text!r}\n  pipeline:       {ids} {text!r}")
        if lps != ref_lps[k]:
            at = next(i for i, (x, y) in enumerate(zip(lps, ref_lps[k])) if x != y)
            raise Fail(f"{what}: {name}: the log-probability of token {at} is {lps[at]!r}, the one-process server's "
                       f"{ref_lps[k][at]!r}")
    if srv.metrics().get("rlx_pipeline_recovery_seconds_count") != 1:
        raise Fail(f"{what}: /metrics does not count one recovery:\n{srv.err.text()}")
    err = srv.err.text()
    restarted = one_line(err, r"rlx: restarted stage 1 \(pid \d+\) on ", what)
    done = one_line(err, rf"stage 1 \({re.escape(addrs[1])}\) replaced and its streams replayed in", what)
    srv.stop()
    log(f"ok: {what}: A, B (reusing {cached[1]} positions) and C the single process's; 2 streams killed after "
        f"{events} events of {max_tokens} each the single process's; {restarted.split('rlx: ')[-1]}; "
        f"{done.split('rlx: ')[-1]}")


def case_hybrid(env, transport):
    """case_restart on the Qwen3.5 hybrid, killing the middle stage (layer 2, linear). The
    stages run cpu-blas batch-invariant, whose delta rule goes row by row in every form, so the
    replay (one prefill of the positions so far) rebuilds the states to the bit."""
    case_restart(env, transport, "qwen35-tied-f32-s1", HYBRID_SPLIT, victims=[1], launched=False)


CASES = {f"{name}-{t}": (lambda fn, t: lambda env: fn(env, t))(fn, t)
         for name, fn in (("restart", case_restart), ("standby", case_standby), ("serve", case_serve),
                          ("fail", case_fail), ("hybrid", case_hybrid), ("serve-hybrid", case_serve_hybrid))
         for t in ("tcp", "grpc")}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("case", choices=sorted(CASES))
    ap.add_argument("--rlx", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--plugins", required=True)
    args = ap.parse_args()
    args.probe = None
    env = Env(args)
    return run_case(env, args.case, lambda: CASES[args.case](env))


if __name__ == "__main__":
    sys.exit(main())
