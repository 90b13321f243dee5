#!/usr/bin/python3
"""Concurrent streams through every pipeline stage: `rlx serve --parallel 4` over stages that run
as separate processes, many completions at once, each checked against the single-process run.

  test_streams.py CASE --rlx BIN --data DIR --plugins DIR [--parallel N]

CASE is one of
  streams-tcp, streams-grpc  `rlx stage` processes started by hand (deep-dense-f32 over 2, 3 and 4
                             stages, deep-moe-f32 over 2 and 4), then `rlx serve --config FILE`;
                             and `rlx serve --stages 3`, which launches its own;
  streams-mpi                mpirun -n 3 rlx serve --config FILE: the server on rank 0, two stages
                             on ranks 1 and 2, transport mpi; then once more on a port given
                             (--port P, as a server is run), which the stage ranks must leave
                             to rank 0 (all three run on this machine): one request.
Exit status 0 passed, 1 failed, 77 skipped (the reason is printed). --parallel (default 4) is for
trying the harness on a server with one slot: with 1, the checks that need several (requests
running beside one another, a prefix copied from a running stream) are left out and said so.

The test models have no tokenizer and rlx serve needs one: each model is used from a directory
of links to the fixture's files beside a tokenizer.json that spells id i "[i]", so an answer's
text is its ids. The stages, the servers and the references all open that directory.

References, once per model, each request alone: `rlx generate --tokens IDS -n K --greedy --json`
(cpu-blas with batch_invariant=1, the mode rlx serve puts its backends and launched stages in, and
which the hand-started stages are given): the ids, finish_reason and token counts; and a
one-process `rlx serve`: the log-probabilities (3 alternatives a token), which a pipeline
computing the one-process engine's bits reproduces exactly (stages without the invariant mode
do not).

Each server gets two rounds of ten requests, all greedy, with token-id prompts:
  - an anchor: streamed, 220 tokens (ignore_eos), its prompt a 24-token prefix P and 4 more;
  - once its first token is back, three streamed requests sharing P (two with different tails,
    one P alone): the first round finds P in the anchor's slot only, which is busy, so the engine
    copies it into theirs in every stage (CopySlot) and they must report exactly P as cached
    (when the server held them while the anchor ran, see below);
  - once their first tokens are back, six more: 150 prompt tokens (over the engine's 128 prompt
    rows a step) and one sharing its first 140, prompts of 1, 3 and 37 tokens, and one whose
    greedy answer is the EOS id (on deep-dense-f32), streamed and not.
Every answer must carry the references' ids, finish_reason, usage and log-probabilities, and no
request may report a longer cached prefix than some sequence the server ran held. With several
slots the P requests' first tokens must come while the anchor still runs, once the server holds
them with 32 or more anchor tokens to go (a round where the test's requests reached the server
later, on a loaded machine, cannot tell, and up to two more rounds run). The second round meets
the first round's sequences in the slots (prefixes reused in place, old rows overwritten).
/metrics must then show every stage, labelled with its address and layers, with the same number
of steps (> 0), time, bytes both ways; the slots asked for; every request completed and counted
(prompt, cached and generated tokens); none running; no stage recovered. SIGTERM must drain the
server to exit 0 (under mpirun: rank 0's, and the job ends with it), and the stages must stop
cleanly on theirs.
Every process runs with a timeout and is killed at the end, whatever happens."""
import argparse
import http.client
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "serve"))
from ports import free_ports  # noqa: E402
from test_pipeline import Env, Fail, MissingInput, Mpirun, even, log, run_case, split_text  # noqa: E402
from serve_util import sse_events  # noqa: E402

LISTENING = re.compile(r"listening on http://127\.0\.0\.1:(\d+)")
# under mpirun --tag-output, rank 0's: every rank starts as rlx serve, and the stage ranks may
# say where they listen before they become stages
RANK0_LISTENING = re.compile(r"\[\d+,0\]<stderr>:rlx serve: listening on http://127\.0\.0\.1:(\d+)")
IDS_TEXT = re.compile(r"(?:\[\d+\])*")
# a generous bound for a server's load under AddressSanitizer on a busy machine
START_SECONDS = 60
HTTP_SECONDS = 60
DRAIN_SECONDS = 5
# the backend options under which a row's bits do not depend on the rows beside it: what rlx serve
# gives its own backends and the stages it launches; stages started by hand need them given
INVARIANT = "batch_invariant=1"
PREFIX = 24        # the anchor's prefix the P requests share (the engine copies from 16 positions)
STEP_BUDGET = 128  # the engine's prompt rows per step (rlx_engine_options.step_tokens' default)
ANCHOR_TOKENS = 220  # with its prompt of PREFIX + 4, within the test models' 256 positions
TOP_LOGPROBS = 3   # alternatives per token in the answers' log-probabilities
MIN_LEFT = 32      # anchor tokens still to go that leave the requests beside it ample time to start
# a prompt whose greedy answer on deep-dense-f32 is the EOS id (511) at once, found by search: a
# request that ends at its first token while the others run (if the fixture's weights change, the
# request is still compared with the reference; the run says whether any request ended on EOS)
EOS_PROMPT = [229, 46, 333, 294, 329, 173, 481, 116, 199, 494, 157, 21, 167, 95, 162, 405, 433, 296, 457, 471,
              155, 125, 171, 51, 278]


class Request:
    def __init__(self, name, prompt, max_tokens, stream=False, ignore_eos=False, shares=0):
        self.name, self.prompt, self.max_tokens = name, prompt, max_tokens
        self.stream, self.ignore_eos = stream, ignore_eos
        self.shares = shares  # the prefix copied from the running anchor: its cached tokens
        self.ref = None       # rlx generate --json's object
        self.ref_lp = None    # the log-probabilities a one-process rlx serve gives the request alone
        self.conn = None
        self.result = None    # (ids, finish_reason, usage, log-probabilities) or an error text
        self.first, self.first_at, self.done_at = None, None, None

    def copy(self):
        """The same request with its references, not yet sent."""
        c = Request(self.name, self.prompt, self.max_tokens, self.stream, self.ignore_eos, self.shares)
        c.ref, c.ref_lp = self.ref, self.ref_lp
        return c

    def body(self, stream=None):
        stream = self.stream if stream is None else stream
        b = {"prompt": self.prompt, "max_tokens": self.max_tokens, "temperature": 0, "stream": stream,
             "logprobs": TOP_LOGPROBS}
        if stream:
            b["stream_options"] = {"include_usage": True}
        if self.ignore_eos:
            b["ignore_eos"] = True
        return json.dumps(b).encode()


def make_requests(vocab, eos_ids):
    """The anchor and the nine that follow it. Prompts that share nothing start with different ids,
    and the tails after a shared prefix differ in their first id, so the prefix any request may
    take from another is known exactly."""
    rng = random.Random(15)
    usable = [i for i in range(vocab) if i not in eos_ids and i != EOS_PROMPT[0]]
    firsts = rng.sample(usable, 8)
    tails = rng.sample(usable, 4)

    def ids(n, first):
        return [first] + [rng.choice(usable) for _ in range(n - 1)]

    p = ids(PREFIX, firsts[0])
    long_prompt = ids(150, firsts[1])
    sibling_tail = ids(12, next(t for t in usable if t != long_prompt[140]))
    anchor = Request("anchor", p + ids(4, tails[0]), ANCHOR_TOKENS, stream=True, ignore_eos=True)
    burst = [
        Request("P+5", p + ids(5, tails[1]), 12, stream=True, shares=PREFIX),
        Request("P+11", p + ids(11, tails[2]), 7, stream=True, shares=PREFIX),
        Request("P alone", list(p), 10, stream=True, shares=PREFIX - 1),  # its last token is computed
        Request("1 token", [firsts[2]], 16),
        Request("3 tokens", ids(3, firsts[3]), 1),
        Request(f"150 tokens (> {STEP_BUDGET} a step)", long_prompt, 6),
        Request("the 150's first 140 + 12", long_prompt[:140] + sibling_tail, 9, stream=True),
        Request("EOS at once", list(EOS_PROMPT), 20),
        Request("37 tokens", ids(37, firsts[4]), 20, stream=True),
    ]
    return anchor, burst


# ---- the model and its reference ----

def id_model(env, name):
    """The fixture model NAME in a directory of its own beside a tokenizer.json that spells id i
    "[i]" (the test models have none, and rlx serve needs one): the text of an answer is its ids,
    nothing is special, and the stages, the server and the reference all open this directory."""
    src = env.model(name)
    dst = os.path.join(env.tmp, name)
    os.makedirs(dst)
    for f in os.listdir(src):
        os.symlink(os.path.join(src, f), os.path.join(dst, f))
    with open(os.path.join(src, "config.json")) as f:
        vocab = json.load(f)["vocab_size"]
    tokenizer = {"version": "1.0", "added_tokens": [], "normalizer": None,
                 "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                                   "use_regex": True},
                 "post_processor": None, "decoder": {"type": "ByteLevel"},
                 "model": {"type": "BPE", "dropout": None, "unk_token": None, "byte_fallback": False,
                           "vocab": {f"[{i}]": i for i in range(vocab)}, "merges": []}}
    with open(os.path.join(dst, "tokenizer.json"), "w") as f:
        json.dump(tokenizer, f)
    return dst


_REQUESTS = {}


def model_requests(env, model):
    """The requests for model, with their single-process references (made once per model)."""
    if model in _REQUESTS:
        return _REQUESTS[model]
    with open(os.path.join(model, "config.json")) as f:
        config = json.load(f)
    with open(os.path.join(model, "generation_config.json")) as f:
        eos = json.load(f).get("eos_token_id", config["eos_token_id"])
    eos = set(eos if isinstance(eos, list) else [eos]) | {config["eos_token_id"]}
    anchor, burst = make_requests(config["vocab_size"], eos)
    references(env, model, [anchor] + burst)
    one_process_logprobs(env, model, [anchor] + burst)
    _REQUESTS[model] = anchor, burst
    return anchor, burst


def one_process_logprobs(env, model, requests):
    """Each request alone on a one-process rlx serve (cpu-blas in its batch-invariant mode, as the
    stages): its log-probabilities, the bits a pipeline must reproduce whatever runs beside the
    request. Its ids must be rlx generate's."""
    s = Serve(env, serve_cmd(env, 4, "--model", model))
    for r in requests:
        c = s.connect()
        try:
            c.request("POST", "/v1/completions", body=r.body(stream=False),
                      headers={"Content-Type": "application/json"})
            resp = c.getresponse()
            ids, finish, _, r.ref_lp = parse_answer(r, resp.status, resp.read(), stream=False)
        except (OSError, http.client.HTTPException, ValueError, KeyError, TypeError) as e:
            raise Fail(f"one-process rlx serve, {r.name}: {type(e).__name__}: {e}")
        finally:
            c.close()
        if ids != r.ref["tokens"] or finish != r.ref["finish_reason"] or len(r.ref_lp[0]) != len(ids):
            raise Fail(f"one-process rlx serve, {r.name}: ids {ids} ({finish}), rlx generate {r.ref['tokens']} "
                       f"({r.ref['finish_reason']}), {len(r.ref_lp[0])} log-probabilities")
    s.stop()
    log("one-process rlx serve: the same ids as rlx generate, and the log-probabilities the pipelines must match")


def references(env, model, requests):
    """Each request's `rlx generate --tokens IDS -n K --greedy --json` on one process, with the
    backend options the stages get."""
    def one(r):
        args = [env.rlx, "generate", "--model", model, "--tokens", ",".join(map(str, r.prompt)),
                "-n", str(r.max_tokens), "--greedy", "--threads", "1", "--backend-opts", INVARIANT, "--json"]
        p, _ = env.run(args + (["--ignore-eos"] if r.ignore_eos else []), timeout=60)
        try:
            r.ref = json.loads(p.stdout)
            assert isinstance(r.ref["tokens"], list) and r.ref["finish_reason"] in ("stop", "length")
        except (ValueError, KeyError, AssertionError) as e:
            raise Fail(f"rlx generate --json for {r.name}: {e}: {p.stdout[:300]!r}")

    with ThreadPoolExecutor(2) as pool:
        list(pool.map(one, requests))
    n_eos = sum(r.ref["finish_reason"] == "stop" for r in requests)
    log(f"single-process references of {len(requests)} requests ({n_eos} ending on EOS)")


# ---- the server ----

class Serve:
    """rlx serve (or mpirun starting it) with stderr in a file: up when it says where it listens
    and /health answers 200."""

    def __init__(self, env, cmd, environ=None, listening=LISTENING):
        self.env = env
        self.log = open(os.path.join(env.tmp, f"serve-{len(env.procs)}.log"), "w+")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=self.log, env=environ)
        self.proc.log = self.log
        env.procs.append(self.proc)
        self.port = None
        deadline = time.monotonic() + START_SECONDS
        while True:
            if self.port is None:
                m = listening.search(self.text())
                self.port = int(m.group(1)) if m else None
            if self.port is not None:
                try:
                    if self.request("GET", "/health", timeout=5)[0] == 200:
                        return
                except (OSError, http.client.HTTPException):
                    pass
            if self.proc.poll() is not None:
                raise Fail(f"rlx serve ended (status {self.proc.returncode}) before it was ready:\n{self.text()}")
            if time.monotonic() > deadline:
                raise Fail(f"rlx serve was not ready within {START_SECONDS} s:\n{self.text()}")
            time.sleep(0.05)

    def text(self):
        self.log.flush()
        with open(self.log.name) as f:
            return f.read()

    def connect(self, timeout=HTTP_SECONDS):
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)

    def request(self, method, path, timeout=HTTP_SECONDS):
        c = self.connect(timeout)
        try:
            c.request(method, path)
            r = c.getresponse()
            return r.status, r.read().decode()
        finally:
            c.close()

    def stop(self, pid=None):
        """SIGTERM (to pid, else the process started): it must drain and exit 0 in bounded time."""
        if self.proc.poll() is None:
            os.kill(pid or self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(DRAIN_SECONDS + 30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise Fail(f"rlx serve did not exit within {DRAIN_SECONDS + 30} s of SIGTERM:\n{self.text()}")
        text = self.text()
        if self.proc.returncode != 0:
            raise Fail(f"rlx serve exited with {self.proc.returncode} after SIGTERM:\n{text}")
        if "ERROR: AddressSanitizer" in text or "runtime error" in text or "detected memory leaks" in text:
            raise Fail(f"rlx serve: a sanitizer report:\n{text}")


def parse_ids(r, text):
    if not IDS_TEXT.fullmatch(text):
        raise ValueError(f"the text is not ids spelled [i]: {text[:200]!r}")
    return [int(i) for i in re.findall(r"\[(\d+)\]", text)]


def parse_answer(r, status, data, stream=None):
    """(ids, finish_reason, usage, (token log-probabilities, top alternatives)) of the answer to r:
    a text_completion object, or the stream of them ending in [DONE], whose last carries the usage."""
    stream = r.stream if stream is None else stream
    if status != 200:
        raise ValueError(f"HTTP {status}: {data[:300]!r}")
    if not stream:
        obj = json.loads(data)
        ch = obj["choices"][0]
        lp = ch["logprobs"]
        return parse_ids(r, ch["text"]), ch["finish_reason"], obj["usage"], (lp["token_logprobs"], lp["top_logprobs"])
    events = sse_events(data)
    if events[-1] != "[DONE]":
        raise ValueError(f"the stream does not end with [DONE]: {events[-1]!r}")
    text, finish, usage, token_lps, top_lps = "", None, None, [], []
    for e in events[:-1]:
        obj = json.loads(e)
        if "error" in obj:
            raise ValueError(f"an error event: {obj}")
        usage = obj.get("usage") or usage
        for ch in obj["choices"]:
            text += ch["text"]
            finish = ch["finish_reason"] or finish
            if ch["logprobs"]:
                token_lps += ch["logprobs"]["token_logprobs"]
                top_lps += ch["logprobs"]["top_logprobs"]
    return parse_ids(r, text), finish, usage, (token_lps, top_lps)


def send_headers(s, r):
    """Opens r's connection and sends its request line and headers; the body waits."""
    body = r.body()
    r.conn = s.connect()
    r.conn.putrequest("POST", "/v1/completions")
    r.conn.putheader("Content-Type", "application/json")
    r.conn.putheader("Content-Length", str(len(body)))
    r.conn.endheaders()
    return body


def start_reader(r):
    """Reads r's answer on a thread: r.first_at when its first token's event arrives (streams),
    r.done_at and r.result at the end; r.first is set by then at the latest."""
    r.first = threading.Event()

    def read():
        try:
            resp = r.conn.getresponse()
            if not r.stream:
                raw = resp.read()
            else:
                raw = b""
                while True:
                    line = resp.readline()
                    if not line:
                        break
                    raw += line
                    if r.first_at is None and line.startswith(b"data: {") and b'"text":"[' in line:
                        r.first_at = time.monotonic()
                        r.first.set()
            r.done_at = time.monotonic()
            r.result = parse_answer(r, resp.status, raw)
        except Exception as e:  # reported with the answers
            r.result = f"{type(e).__name__}: {e}"
        finally:
            r.done_at = r.done_at or time.monotonic()
            r.first.set()

    t = threading.Thread(target=read, daemon=True)
    t.start()
    return t


COMPLETED = 'rlx_requests_total{outcome="completed"}'


def counts(s):
    """The engine's request and token counters, as /metrics has them now."""
    status, body = s.request("GET", "/metrics", timeout=10)
    if status != 200:
        raise Fail(f"/metrics answered {status}")
    return {k: metric(body, k) for k in ("rlx_requests_running", "rlx_requests_queued", COMPLETED,
                                         "rlx_generated_tokens_total")}


def run_traffic(s, anchor, burst):
    """The anchor; once its first token is back the requests sharing its prefix, and once theirs
    are back the rest (so the prefix is copied from a running stream, and whatever the order
    the HTTP threads submit in). Fills each request's result, first_at and done_at. Returns how
    many tokens the anchor had still to go, at least, when the server held every request sharing
    its prefix (running, queued or done), or None when that was not seen before it had fewer than
    MIN_LEFT left (the test's requests reached the server late: a loaded machine)."""
    shared = [r for r in burst if r.shares]
    rest = [r for r in burst if not r.shares]
    bodies = {r.name: send_headers(s, r) for r in burst}
    before = counts(s)
    anchor.conn = s.connect()
    anchor.conn.request("POST", "/v1/completions", body=anchor.body(), headers={"Content-Type": "application/json"})
    readers = [start_reader(anchor)]
    deadline = time.monotonic() + HTTP_SECONDS
    left = None
    for group in ([anchor], shared, rest):
        for r in group:
            if r is not anchor:
                r.conn.send(bodies[r.name])
                readers.append(start_reader(r))
        if group is shared:
            # the round's generated tokens count the anchor's and more: it has at least the rest to go
            while time.monotonic() < deadline:
                c = counts(s)
                done = c["rlx_generated_tokens_total"] - before["rlx_generated_tokens_total"]
                if ANCHOR_TOKENS - done < MIN_LEFT:
                    break
                held = c["rlx_requests_running"] + c["rlx_requests_queued"] + c[COMPLETED] - before[COMPLETED]
                if held >= 1 + len(shared):
                    left = int(ANCHOR_TOKENS - done)
                    break
                time.sleep(0.002)
        for r in group:
            if r.stream and not r.first.wait(max(0, deadline - time.monotonic())):
                raise Fail(f"{r.name}: no first token within {HTTP_SECONDS} s")
    for t in readers:
        t.join(max(0, deadline - time.monotonic()))
        if t.is_alive():
            raise Fail(f"a request got no answer within {HTTP_SECONDS} s")
    for r in [anchor] + burst:
        r.conn.close()
    return left


# ---- the checks ----

def common_prefix(a, b):
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def check_answers(what, requests, earlier, copies):
    """requests: one round's; earlier: those the same server answered before, whose sequences its
    slots may still hold. copies: the requests sharing the anchor's prefix were admitted while it
    ran and no other slot held any of it, so each took exactly the prefix it shares (a copy);
    otherwise (a slot reused in place, holding part of it) only the bound is checked."""
    failures = []
    for r in requests:
        if isinstance(r.result, str):
            failures.append(f"{r.name}: {r.result}")
            continue
        ids, finish, usage, (token_lps, top_lps) = r.result
        want = r.ref["tokens"]
        if ids != want:
            first = common_prefix(ids, want)
            failures.append(f"{r.name} ({len(r.prompt)} prompt ids, max_tokens {r.max_tokens}): ids differ from "
                            f"the single process's at token {first}:\n    served:         {ids}\n"
                            f"    single process: {want}")
        elif (token_lps, top_lps) != r.ref_lp:
            at = next((i for i, (a, b) in enumerate(zip(zip(token_lps, top_lps), zip(*r.ref_lp))) if a != b),
                      min(len(token_lps), len(r.ref_lp[0])))
            failures.append(f"{r.name}: the log-probabilities are not the one-process engine's bits from token {at} "
                            f"(of {len(token_lps)}, want {len(r.ref_lp[0])}): {token_lps[at:at + 2]} "
                            f"{top_lps[at:at + 1]}, one process {r.ref_lp[0][at:at + 2]} {r.ref_lp[1][at:at + 1]}")
        if finish != r.ref["finish_reason"]:
            failures.append(f"{r.name}: finish_reason {finish!r}, the single process's {r.ref['finish_reason']!r}")
        if not usage or usage.get("prompt_tokens") != len(r.prompt) or usage.get("completion_tokens") != len(want):
            failures.append(f"{r.name}: usage {usage}, want {len(r.prompt)} prompt and {len(want)} completion tokens")
            continue
        # a cached prefix is one that another sequence held: no request may claim more
        cached = usage.get("prompt_tokens_details", {}).get("cached_tokens")
        held = max((common_prefix(o.prompt + o.ref["tokens"], r.prompt) for o in requests + earlier if o is not r),
                   default=0)
        bound = min(held, len(r.prompt) - 1)
        if not isinstance(cached, int) or not 0 <= cached <= bound:
            failures.append(f"{r.name}: {cached} cached prompt tokens; no other sequence held more than {bound}")
        elif r.shares and copies and cached != r.shares:
            failures.append(f"{r.name}: {cached} cached prompt tokens, want the {r.shares} it shares with the "
                            "running anchor (copied from the anchor's slot)")
    if failures:
        cached = ", ".join(f"{r.name} {r.result[2]['prompt_tokens_details']['cached_tokens']}" for r in requests
                           if not isinstance(r.result, str) and r.result[2])
        raise Fail(f"{what}:\n  " + "\n  ".join(failures) + f"\n  (cached prompt tokens: {cached})")


def check_overlap(what, anchor, burst, parallel, left):
    """With several slots the requests sharing the anchor's prefix start beside it: once the server
    holds them with the anchor MIN_LEFT or more tokens from its end, their first tokens come before
    it ends (one slot would queue them behind it). Returns whether the round could tell (see
    run_traffic)."""
    shared = [r for r in burst if r.shares]
    late = [r.name for r in shared if r.first_at is None or r.first_at >= anchor.done_at]
    margin = anchor.done_at - max(r.first_at or anchor.done_at for r in shared)
    span = f"the anchor ended {abs(margin):.3f} s {'after' if margin >= 0 else 'before'} their last first token"
    if parallel == 1:
        log(f"note: --parallel 1: not checking that requests run beside the anchor ({span})")
        return True
    if left is None:
        log(f"note: {what}: the requests sharing the anchor's prefix reached the server only when it had fewer "
            f"than {MIN_LEFT} tokens to go; this round cannot tell whether they run beside it ({span})")
        return False
    if late:
        raise Fail(f"{what}: the server held {late} while the {ANCHOR_TOKENS}-token anchor had {left} or more "
                   "tokens to go, but their first tokens came only after it ended: they did not run beside it")
    log(f"ok: {what}: the requests sharing its prefix started while the anchor ran ({span}; held with {left}+ "
        "of its tokens to go)")
    return True


STAGE_SERIES = re.compile(r'^(rlx_pipeline_stage_\w+)\{stage="(\d+)",address="([^"]*)",layers="(\d+-\d+)"'
                          r'(?:,direction="(\w+)")?\} (\S+)$', re.M)


def metric(body, name):
    m = re.search(r"^%s (\S+)$" % re.escape(name), body, re.M)
    return float(m.group(1)) if m else None


def check_metrics(what, s, stages, parallel, requests):
    """stages: [(address, layers)] in order."""
    status, body = s.request("GET", "/metrics")
    if status != 200:
        raise Fail(f"{what}: /metrics answered {status}")
    seen = {}
    for name, stage, address, layers, direction, value in STAGE_SERIES.findall(body):
        seen.setdefault(int(stage), {"address": address, "layers": layers})
        seen[int(stage)][name + (f"_{direction}" if direction else "")] = float(value)
    problems = []
    if sorted(seen) != list(range(len(stages))):
        problems.append(f"per-stage series for stages {sorted(seen)}, want 0-{len(stages) - 1}")
    for i, (address, layers) in enumerate(stages):
        st = seen.get(i, {})
        if st.get("address") != address or st.get("layers") != layers:
            problems.append(f"stage {i} is labelled {st.get('address')} {st.get('layers')}, want {address} {layers}")
        for key in ("rlx_pipeline_stage_step_seconds_count", "rlx_pipeline_stage_step_seconds_sum",
                    "rlx_pipeline_stage_max_step_seconds", "rlx_pipeline_stage_bytes_total_sent",
                    "rlx_pipeline_stage_bytes_total_received"):
            if not st.get(key, 0) > 0:
                problems.append(f"stage {i}: {key} is {st.get(key)}, want > 0")
    steps = {i: st.get("rlx_pipeline_stage_step_seconds_count") for i, st in seen.items()}
    if len(set(steps.values())) != 1:
        problems.append(f"every step goes through every stage, but the stages count {steps}")
    n = len(requests)
    want = {"rlx_slots": parallel, 'rlx_requests_total{outcome="completed"}': n,
            'rlx_requests_total{outcome="failed"}': 0, 'rlx_requests_total{outcome="cancelled"}': 0,
            "rlx_prompt_tokens_total": sum(len(r.prompt) for r in requests),
            "rlx_generated_tokens_total": sum(len(r.ref["tokens"]) for r in requests),
            "rlx_prompt_tokens_cached_total": sum(r.result[2]["prompt_tokens_details"]["cached_tokens"]
                                                  for r in requests),
            "rlx_requests_running": 0}
    for name, value in want.items():
        if metric(body, name) != value:
            problems.append(f"{name} is {metric(body, name)}, want {value}")
    # no stage was lost, so none was replaced (a build without recovery has no such series)
    if metric(body, "rlx_pipeline_recovery_seconds_count") not in (None, 0):
        problems.append(f"{metric(body, 'rlx_pipeline_recovery_seconds_count')} recoveries of a lost stage, want 0")
    if problems:
        raise Fail(f"{what}: /metrics:\n  " + "\n  ".join(problems) + "\n" +
                   "\n".join(l for l in body.splitlines() if l.startswith("rlx_")))
    log(f"ok: {what}: /metrics: {len(stages)} stages, {int(steps[0])} steps each, "
        f"{int(metric(body, 'rlx_prompt_tokens_cached_total'))} prompt tokens from cached prefixes")


def exercise(what, s, reqs, stages, parallel, rounds=2, max_rounds=4):
    """The traffic and every check on a server that is up; stages: [(address, layers)]. The second
    round finds the slots holding the first round's sequences: prompts reuse them in place, and
    new rows overwrite old ones in every stage. More rounds (up to max_rounds) while none could
    tell whether the requests run beside the anchor."""
    answered, told, n = [], False, 0
    while n < rounds or (not told and n < max_rounds):
        n += 1
        anchor, burst = reqs[0].copy(), [r.copy() for r in reqs[1]]
        label = f"{what}, round {n}"
        t0 = time.monotonic()
        left = run_traffic(s, anchor, burst)
        check_answers(label, [anchor] + burst, answered, copies=parallel > 1 and not answered and left is not None)
        shared = sum(1 for r in burst if r.shares)
        log(f"ok: {label}: {len(burst) + 1} requests (a streaming anchor, {shared} beside it, then "
            f"{len(burst) - shared} at once) carry the single-process ids and log-probabilities, in "
            f"{time.monotonic() - t0:.2f} s")
        told = check_overlap(label, anchor, burst, parallel, left) or told
        answered += [anchor] + burst
    if not told:
        raise Fail(f"{what}: in {n} rounds the requests sharing the anchor's prefix never reached the server "
                   f"while it had {MIN_LEFT} tokens to go: cannot tell whether requests run side by side")
    check_metrics(what, s, stages, parallel, answered)


# ---- cases ----

def serve_cmd(env, parallel, *args):
    return [env.rlx, "serve", "--host", "127.0.0.1", "--port", "0", "--parallel", str(parallel), "--threads", "1",
            "--drain-timeout", str(DRAIN_SECONDS), *args]


def case_streams(env, transport, parallel):
    env.need_transport(transport)
    for name, depths in (("deep-dense-f32", (2, 3, 4)), ("deep-moe-f32", (2, 4))):
        model = id_model(env, name)
        n = env.n_layers(model)
        requests = model_requests(env, model)
        for k in depths:
            split = split_text(even(n, k))
            what = f"{name} over {k} stages {split} ({transport}, --parallel {parallel})"
            t0 = time.monotonic()
            stages = [env.stage(model, r, transport, extra=["--backend-opts", INVARIANT]) for r in split]
            addresses = [a for _, a in stages]
            cfg = env.config(f"{name}-{transport}-{k}.yaml", model, transport,
                             [(a, r, None) for a, r in zip(addresses, split)])
            s = Serve(env, serve_cmd(env, parallel, "--config", cfg))
            exercise(what, s, requests, list(zip(addresses, split)), parallel)
            s.stop()
            for p, _ in stages:
                env.stop(p)
            log(f"ok: {what} in {time.monotonic() - t0:.1f} s")
    # the one-liner: rlx serve launches its stages, which inherit its batch-invariant default
    model = os.path.join(env.tmp, "deep-dense-f32")
    requests = model_requests(env, model)
    what = f"deep-dense-f32 over --stages 3 launched by rlx serve ({transport}, --parallel {parallel})"
    s = Serve(env, serve_cmd(env, parallel, "--model", model, "--stages", "3", "--transport", transport))
    status, body = s.request("GET", "/metrics")
    labelled = sorted(set(re.findall(r'stage="(\d+)",address="([^"]+)",layers="(\d+-\d+)"', body)))
    want = split_text(even(env.n_layers(model), 3))
    if status != 200 or [int(i) for i, _, _ in labelled] != [0, 1, 2] or [r for _, _, r in labelled] != want:
        raise Fail(f"{what}: /metrics names stages {labelled}, want layers {want}")
    exercise(what, s, requests, [(a, r) for _, a, r in labelled], parallel)
    s.stop()


def case_streams_mpi(env, parallel):
    mpirun = Mpirun(env)
    if not env.has_plugin("transport", "mpi"):
        raise MissingInput(f"transport plugin 'mpi' is not built (no MPI library when configured; {env.plugins})")
    model = id_model(env, "deep-dense-f32")
    n = env.n_layers(model)
    requests = model_requests(env, model)
    split = split_text(even(n, 2))
    addresses = ["rank:1", "rank:2"]
    # the stages' backend options from the file (rlx serve would pass its default on to the ranks too)
    cfg = env.config("streams-mpi.yaml", model, "mpi", [(a, r, None) for a, r in zip(addresses, split)])
    with open(cfg) as f:
        text = f.read()
    with open(cfg, "w") as f:
        f.write(text.replace("    layers:", f"    backend_options: {INVARIANT}\n    threads: 1\n    layers:"))

    def job(what, port, run):
        """mpirun -n 3 rlx serve --config FILE --port PORT; run(server) once it is up, then SIGTERM to
        rank 0: it drains and exits 0, the stage ranks end with their driver, and mpirun with them."""
        tag = str(random.getrandbits(48))
        cmd = mpirun.cmd(3, serve_cmd(env, parallel, "--config", cfg)[1:])
        cmd.insert(len(mpirun.base), "--tag-output")
        cmd[cmd.index("--port") + 1] = str(port)
        t0 = time.monotonic()
        try:
            try:
                s = Serve(env, cmd, environ=mpirun.env_for(tag), listening=RANK0_LISTENING)
            except Fail as e:
                raise Fail(f"{what}: {e}")
            run(s)
            server = mpirun.ranks(tag).get(0)
            if not server:
                raise Fail(f"{what}: no process of rank 0 found")
            s.stop(pid=server)
            left = mpirun.ranks(tag)
            if left:
                raise Fail(f"{what}: processes still run after mpirun returned: {left}")
        finally:
            for pid in mpirun.ranks(tag).values():  # a failure above may leave ranks behind mpirun
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        log(f"ok: {what} in {time.monotonic() - t0:.1f} s")

    what = f"mpirun -n 3: the server on rank 0, stages {split} on ranks 1-2 (mpi, --parallel {parallel})"
    job(what, 0, lambda s: exercise(what, s, requests, list(zip(addresses, split)), parallel))

    # as a server is run: on a port given. Every rank starts as rlx serve, so ranks that will be
    # stages must not take the port on their way (all three run on this machine)
    def one_request(s):
        r = requests[1][-1].copy()
        c = s.connect()
        try:
            c.request("POST", "/v1/completions", body=r.body(), headers={"Content-Type": "application/json"})
            resp = c.getresponse()
            ids, _, _, lps = parse_answer(r, resp.status, resp.read())
        finally:
            c.close()
        if ids != r.ref["tokens"] or lps != r.ref_lp:
            raise Fail(f"mpirun -n 3 rlx serve --port P: {r.name}: ids {ids}, want {r.ref['tokens']}, or other "
                       "log-probabilities")

    port, = free_ports(1)
    job(f"mpirun -n 3 rlx serve --config FILE --port {port} (a port given, every rank on this machine)", port,
        one_request)


CASES = {
    "streams-tcp": lambda env, parallel: case_streams(env, "tcp", parallel),
    "streams-grpc": lambda env, parallel: case_streams(env, "grpc", parallel),
    "streams-mpi": case_streams_mpi,
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("case", choices=sorted(CASES))
    ap.add_argument("--rlx", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--plugins", required=True)
    ap.add_argument("--parallel", type=int, default=4, choices=range(1, 65), metavar="N")
    args = ap.parse_args()
    args.probe = None
    env = Env(args)
    return run_case(env, args.case, lambda: CASES[args.case](env, args.parallel))


if __name__ == "__main__":
    sys.exit(main())
