#!/usr/bin/python3
"""rlx serve's refusals, with curl as the client: malformed JSON, wrong types (the error names
the field), a body over --max-body (declared or chunked), a missing or wrong API key, an unknown
path or method, max_tokens over --max-tokens-limit, a prompt longer than a slot, a full queue
(503 with Retry-After). Each answer has the right status and OpenAI's error body, and the
server keeps serving afterwards: a valid request succeeds and /metrics counted the refusals.

  check_errors.py --rlx BIN
"""
import argparse
import json
import os
import re
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_util import Checks, Server, main_guard  # noqa: E402

KEY = "sk-test-0123456789"
MAX_BODY = 16384


def curl(server, path, data=None, key=KEY, extra=()):
    """(status, headers text, body) of one curl request."""
    cmd = ["curl", "-s", "-D", "-", "-o", "-", "--max-time", "120", server.url() + path] + list(extra)
    if key is not None:
        cmd += ["-H", f"Authorization: Bearer {key}"]
    if data is not None:
        cmd += ["-H", "Content-Type: application/json", "--data-binary", "@-"]
    p = subprocess.run(cmd, input=data.encode() if isinstance(data, str) else data, capture_output=True, timeout=180)
    out = p.stdout.decode(errors="replace")
    while re.match(r"HTTP/1\.[01] 100", out):  # a 100 Continue block before the answer
        out = out.split("\r\n\r\n", 1)[1]
    head, _, body = out.partition("\r\n\r\n")
    m = re.match(r"HTTP/1\.[01] (\d{3})", head)
    return (int(m.group(1)) if m else 0), head, body


def error_of(body):
    try:
        e = json.loads(body)["error"]
    except (ValueError, KeyError, TypeError):
        return None
    return e if all(k in e for k in ("message", "type", "param", "code")) else None


def expect_error(c, server, what, path, data, status, param=None, key=KEY, extra=(), header=None):
    got, head, body = curl(server, path, data, key, extra)
    e = error_of(body)
    c.check(got == status, f"{what}: status {got}, expected {status}: {body[:200]}")
    c.check(e is not None, f"{what}: not an OpenAI error body: {body[:200]!r}")
    if e is not None and param is not None:
        c.check(e["param"] == param and param in e["message"],
                f"{what}: the error should name {param!r}: {e}")
    if header:
        c.check(re.search(header, head, re.I | re.M) is not None, f"{what}: no header {header!r} in {head!r}")
    return e


def count(metrics, code):
    return int(re.search(r'^rlx_http_responses_total\{code="%d"\} (\d+)$' % code, metrics, re.M).group(1))


def busy(c, s):
    """--parallel 1 --queue 1: one running, one queued, the third is turned away."""
    body = json.dumps({"prompt": "The President said that", "max_tokens": 1000, "temperature": 0,
                       "stream": True}).encode()
    request = (f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {KEY}\r\n"
               f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body
    held = []
    # one at a time: a request waits in the queue until the engine's next step admits it
    for running, queued in ((1, 0), (1, 1)):
        held.append(socket.create_connection(("127.0.0.1", s.port), timeout=120))
        held[-1].sendall(request)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            _, _, m = curl(s, "/metrics")
            gauges = re.findall(r"^rlx_requests_(?:running|queued) \d+$", m, re.M)
            if gauges == [f"rlx_requests_running {running}", f"rlx_requests_queued {queued}"]:
                break
            time.sleep(0.05)
        else:
            c.check(False, f"held request {len(held)}: {gauges}, expected {running} running and {queued} queued")
    expect_error(c, s, "a full queue", "/v1/completions", json.dumps({"prompt": "x", "max_tokens": 1}), 503,
                 header=r"^Retry-After: \d+")
    for sock in held:  # the held requests' clients go away, which cancels them
        sock.close()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # the cancels take effect at the engine's next step
        _, _, m = curl(s, "/metrics")
        if re.search(r"^rlx_requests_running 0$", m, re.M) and re.search(r"^rlx_requests_queued 0$", m, re.M):
            break
        time.sleep(0.05)
    else:
        c.check(False, "the held requests were not cancelled when their clients went away")


def too_many_connections(c, rlx):
    """--max-connections 2 with two silent clients: a third hears 503 too_many_connections with a
    Retry-After (not a reset connection), /health still answers, and once they go it is served."""
    with Server(rlx, ["--max-connections", "2", "--parallel", "1"]) as s:
        idle = [socket.create_connection(("127.0.0.1", s.port), timeout=30) for _ in range(2)]
        deadline, e = time.monotonic() + 30, None
        while time.monotonic() < deadline:  # the daemon counts a connection once it accepts it
            st, head, body = curl(s, "/v1/models", key=None)
            if st == 503:
                e = error_of(body)
                break
            time.sleep(0.05)
        c.check(e is not None and e["code"] == "too_many_connections" and "--max-connections" in e["message"] and
                re.search(r"^Retry-After: \d+", head, re.I | re.M) is not None,
                f"a connection over --max-connections: {st} {head!r} {body[:200]!r}")
        st, _, _ = curl(s, "/health", key=None)
        c.check(st == 200, f"/health over the connection limit: {st}")
        for sock in idle:
            sock.close()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and curl(s, "/v1/models", key=None)[0] != 200:
            time.sleep(0.05)
        st, _, body = curl(s, "/v1/models", key=None)
        c.check(st == 200, f"after the idle clients left: {st} {body[:200]}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rlx", required=True)
    args = ap.parse_args()
    c = Checks()
    for flags, says in ((["--spec", "mtp", "--parallel", "2"], "one slot"),
                        (["--api-key", "a", "--api-key-file", "/dev/null"], "not both"),
                        (["-c", "512", "--slot-ctx", "64"], "not both"), (["--port", "70000"], "--port")):
        p = subprocess.run([args.rlx, "serve"] + flags, capture_output=True, text=True, timeout=60)
        lines = p.stderr.splitlines()
        c.check(p.returncode == 1 and len(lines) == 1 and lines[0].startswith("rlx: serve: ") and says in lines[0],
                f"rlx serve {' '.join(flags)}: exit {p.returncode}, {p.stderr!r}")
    with Server(args.rlx, ["--api-key", KEY, "--max-body", str(MAX_BODY), "--max-tokens-limit", "1000",
                           "--slot-ctx", "1024", "--parallel", "1", "--queue", "1"]) as s:
        _, _, before = curl(s, "/metrics")
        st, _, body = curl(s, "/health", key=None)
        c.check(st == 200 and json.loads(body) == {"status": "ok"}, f"/health without a key: {st} {body}")
        expect_error(c, s, "no key", "/v1/models", None, 401, key=None, header=r"^WWW-Authenticate: Bearer")
        expect_error(c, s, "a wrong key", "/v1/models", None, 401, key=KEY + "x")
        expect_error(c, s, "a key's prefix", "/v1/models", None, 401, key=KEY[:-1])
        expect_error(c, s, "no key on a generation", "/v1/completions", '{"prompt":"x"}', 401, key=None)
        expect_error(c, s, "no key on /metrics", "/metrics", None, 401, key=None)
        st, _, body = curl(s, "/v1/models")
        c.check(st == 200 and json.loads(body)["data"][0]["id"] == "target", f"/v1/models: {st} {body}")
        expect_error(c, s, "an unknown path", "/v1/engines", None, 404)
        expect_error(c, s, "GET on a POST endpoint", "/v1/completions", None, 405, header=r"^Allow: POST")
        expect_error(c, s, "POST on a GET endpoint", "/v1/models", "{}", 405, header=r"^Allow: GET")
        for what, data in (("malformed JSON", '{"prompt": "x",'), ("not JSON", "hello"), ("a JSON array", "[1]"),
                           ("an empty body", "")):
            e = expect_error(c, s, what, "/v1/completions", data, 400)
            c.check(e is not None and e["type"] == "invalid_request_error", f"{what}: type {e}")
        wrong = [
            ("/v1/completions", {"prompt": "x", "temperature": "hot"}, "temperature"),
            ("/v1/completions", {"prompt": "x", "temperature": 2.5}, "temperature"),
            ("/v1/completions", {"prompt": "x", "top_p": 1.5}, "top_p"),
            ("/v1/completions", {"prompt": "x", "top_k": 2.5}, "top_k"),
            ("/v1/completions", {"prompt": "x", "min_p": -0.1}, "min_p"),
            ("/v1/completions", {"prompt": "x", "max_tokens": 0}, "max_tokens"),
            ("/v1/completions", {"prompt": "x", "max_tokens": "8"}, "max_tokens"),
            ("/v1/completions", {"prompt": "x", "max_tokens": 1001}, "max_tokens"),
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 1.5},
             "max_completion_tokens"),
            ("/v1/completions", {"prompt": "x", "stream": "yes"}, "stream"),
            ("/v1/completions", {"prompt": "x", "stream_options": 1}, "stream_options"),
            ("/v1/completions", {"prompt": "x", "stop": 7}, "stop"),
            ("/v1/completions", {"prompt": "x", "stop": ["a", 1]}, "stop"),
            ("/v1/completions", {"prompt": "x", "seed": "s"}, "seed"),
            ("/v1/completions", {"prompt": "x", "n": 2}, "n"),
            ("/v1/completions", {"prompt": "x", "presence_penalty": 3}, "presence_penalty"),
            ("/v1/completions", {"prompt": "x", "frequency_penalty": "1"}, "frequency_penalty"),
            ("/v1/completions", {"prompt": "x", "logprobs": True}, "logprobs"),
            ("/v1/completions", {"prompt": "x", "logprobs": 21}, "logprobs"),
            ("/v1/completions", {"prompt": {"text": "x"}}, "prompt"),
            ("/v1/completions", {"prompt": ["a", "b"]}, "prompt"),
            ("/v1/completions", {"prompt": [1, 99999]}, "prompt"),
            ("/v1/completions", {"prompt": "x", "model": 3}, "model"),
            ("/v1/chat/completions", {"messages": "hi"}, "messages"),
            ("/v1/chat/completions", {"messages": []}, "messages"),
            ("/v1/chat/completions", {"messages": [{"role": "wizard", "content": "x"}]}, "messages"),
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": 5}]}, "messages"),
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages"),
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "logprobs": 1}, "logprobs"),
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2},
             "top_logprobs"),
            ("/v1/completions", {"prompt": "x", "logit_bias": {"99999": 1}}, "logit_bias"),
            ("/v1/completions", {"prompt": "x", "logit_bias": {"5": 101}}, "logit_bias"),
            ("/v1/completions", {"prompt": "x", "logit_bias": {"five": 1}}, "logit_bias"),
            ("/v1/completions", {"prompt": "x", "logit_bias": {"0x10": 1}}, "logit_bias"),
            ("/v1/completions", {"prompt": "x", "logit_bias": {"1e2": 1}}, "logit_bias"),
            ("/v1/completions", {"prompt": "x", "logit_bias": {"5": "1"}}, "logit_bias"),
            ("/v1/completions", {"prompt": "x", "logit_bias": [[5]]}, "logit_bias"),
            ("/v1/completions", {"prompt": "x", "logit_bias": 5}, "logit_bias"),
            ("/v1/completions", {"prompt": "x", "logit_bias": {str(i): 1 for i in range(1025)}}, "logit_bias"),
            # known fields whose meaning rlx does not provide are refused, not ignored
            ("/v1/completions", {"prompt": "x", "echo": True}, "echo"),
            ("/v1/completions", {"prompt": "x", "best_of": 2}, "best_of"),
            ("/v1/completions", {"prompt": "x", "suffix": "y"}, "suffix"),
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                                      "response_format": {"type": "yaml"}}, "response_format"),
        ]
        for path, body, param in wrong:
            expect_error(c, s, f"{path} {json.dumps(body)}", path, json.dumps(body), 400, param=param)
        long_prompt = " ".join(["the"] * 1100)
        e = expect_error(c, s, "a prompt longer than a slot", "/v1/completions",
                         json.dumps({"prompt": long_prompt, "max_tokens": 1}), 400)
        c.check(e is not None and e["code"] == "context_length_exceeded", f"a long prompt: code {e}")
        big = json.dumps({"prompt": "a" * MAX_BODY, "max_tokens": 1})
        expect_error(c, s, "a declared body over --max-body", "/v1/completions", big, 413)
        expect_error(c, s, "a chunked body over --max-body", "/v1/completions", big, 413,
                     extra=["-H", "Transfer-Encoding: chunked"])
        busy(c, s)
        ok = {"prompt": "The President said that", "max_tokens": 3, "temperature": 0, "frobnicate": [1, 2],
              "top_p": None, "logit_bias": {}}
        st, _, body = curl(s, "/v1/completions", json.dumps(ok))
        c.check(st == 200 and json.loads(body)["choices"][0]["finish_reason"] == "length",
                f"a valid request (unknown fields and nulls ignored) after the refusals: {st} {body[:300]}")
        st, _, metrics = curl(s, "/metrics")
        counts = {code: count(metrics, code) - count(before, code) for code in (400, 401, 503)}
        c.check(st == 200 and counts == {400: 4 + len(wrong) + 1, 401: 5, 503: 1}, f"/metrics counted {counts}")
        c.check("# TYPE rlx_requests_total counter" in metrics and "rlx_kv_cache_usage_ratio" in metrics,
                f"/metrics is Prometheus text: {metrics[:300]}")
    c.check(s.proc.returncode == 0, f"exit status {s.proc.returncode} after SIGTERM: {s.stderr[-500:]}")
    too_many_connections(c, args.rlx)
    return c.report()


if __name__ == "__main__":
    main_guard(main)
