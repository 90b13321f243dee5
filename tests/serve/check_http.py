#!/usr/bin/python3
"""rlx serve's connection side against clients that do not behave as curl does:
  - a client that half-closes (shutdown(SHUT_WR)) after its request still gets its answer,
    streamed or not, while a queued stream whose client closes is still cancelled;
  - a bounded slowloris (500 sockets from 127.0.0.2 sending a header byte a second, for at most
    40 s): /health and a completion from 127.0.0.1 still answer, and every slow socket is closed
    by the server (--max-connections-per-ip, --request-timeout) before the attack ends;
  - Host and Origin: a keyless server refuses a Host that is not its own (400) and a foreign
    Origin (403), serves the --cors-origin one with CORS headers and answers its preflight;
    --cors-origins takes a list and the word localhost (any port of localhost, 127.0.0.1, [::1]);
  - HEAD on the GET endpoints;
  - a request queued behind a long one is not timed out by --timeout while the engine progresses;
  - the flags: an empty --api-key, a key file others may read, out-of-range numbers and a
    keyless server beyond loopback are refused with one line naming the flag.

  check_http.py --rlx BIN
"""
import argparse
import json
import os
import re
import select
import socket
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_util import Checks, Server, main_guard  # noqa: E402

PROMPT = "The President said that"


def raw_request(port, body, path="/v1/completions", host=None):
    data = json.dumps(body).encode()
    return (f"POST {path} HTTP/1.1\r\nHost: {host or f'127.0.0.1:{port}'}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\n\r\n").encode() + data


def read_to_end(sock, seconds=120):
    """Everything the server sends until it closes (or seconds pass)."""
    sock.settimeout(seconds)
    data = b""
    try:
        while True:
            d = sock.recv(65536)
            if not d:
                break
            data += d
    except OSError:
        pass
    return data


def metric(s, name):
    _, _, body = s.request("GET", "/metrics")
    return float(re.search(r"^%s (\S+)$" % re.escape(name), body.decode(), re.M).group(1))


def half_close(c, s):
    """shutdown(SHUT_WR) after the request: the answer still comes, and nothing is cancelled."""
    before = metric(s, 'rlx_requests_total{outcome="cancelled"}')
    for stream in (False, True):
        sock = socket.create_connection(("127.0.0.1", s.port), timeout=120)
        sock.sendall(raw_request(s.port, {"prompt": PROMPT, "max_tokens": 6, "temperature": 0, "stream": stream}))
        sock.shutdown(socket.SHUT_WR)
        data = read_to_end(sock)
        sock.close()
        ok = data.startswith(b"HTTP/1.1 200") and (b"data: [DONE]" in data if stream else b'"finish_reason"' in data)
        c.check(ok, f"a half-closed client ({'streamed' if stream else 'not streamed'}) got {data[:300]!r}")
    c.check(metric(s, 'rlx_requests_total{outcome="cancelled"}') == before, "a half-closed request was cancelled")


def closed_queued_stream(c, s):
    """One slot: a stream queued behind a long one whose client reads the headers and closes
    (a FIN, no reset) is cancelled while the long one still runs."""
    before = metric(s, 'rlx_requests_total{outcome="cancelled"}')
    long_one = socket.create_connection(("127.0.0.1", s.port), timeout=300)
    long_one.sendall(raw_request(s.port, {"prompt": PROMPT, "max_tokens": 400, "temperature": 0,
                                          "ignore_eos": True, "stream": True}))
    long_one.recv(1)  # the long request runs
    queued = socket.create_connection(("127.0.0.1", s.port), timeout=120)
    queued.sendall(raw_request(s.port, {"prompt": PROMPT, "max_tokens": 4, "temperature": 0, "stream": True}))
    head = b""
    while b"\r\n\r\n" not in head:
        d = queued.recv(1)
        if not d:
            break
        head += d
    queued.close()
    deadline = time.monotonic() + 60
    while metric(s, 'rlx_requests_total{outcome="cancelled"}') < before + 1 and time.monotonic() < deadline:
        time.sleep(0.1)
    running = metric(s, "rlx_requests_running")
    c.check(head.startswith(b"HTTP/1.1 200") and metric(s, 'rlx_requests_total{outcome="cancelled"}') == before + 1
            and running == 1, f"a closed queued stream was not cancelled while the long one ran ({head[:100]!r})")
    long_one.close()
    deadline = time.monotonic() + 60
    while metric(s, "rlx_requests_running") > 0 and time.monotonic() < deadline:
        time.sleep(0.1)


def slowloris(c, rlx):
    """500 sockets from 127.0.0.2, each sending a header byte a second for at most 40 s."""
    with Server(rlx, ["--max-connections", "200", "--request-timeout", "3", "--parallel", "1"]) as s:
        n, bound = 500, 40.0
        socks, opened, closed_at = [], {}, {}
        for _ in range(n):
            sk = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sk.bind(("127.0.0.2", 0))
            sk.settimeout(10)
            sk.connect(("127.0.0.1", s.port))
            sk.setblocking(False)
            opened[sk] = time.monotonic()
            socks.append(sk)
        start = time.monotonic()
        header = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 100
        stop = threading.Event()

        def attack():
            sent = 0
            while not stop.is_set() and time.monotonic() - start < bound and len(closed_at) < n:
                live = [sk for sk in socks if sk not in closed_at]
                for sk in live:
                    try:
                        sk.send(header[sent % len(header):sent % len(header) + 1])
                    except OSError:
                        closed_at.setdefault(sk, time.monotonic())
                readable, _, _ = select.select([sk for sk in live if sk not in closed_at], [], [], 1.0)
                for sk in readable:
                    try:
                        if sk.recv(4096) == b"":
                            closed_at.setdefault(sk, time.monotonic())
                    except OSError:
                        closed_at.setdefault(sk, time.monotonic())
                sent += 1

        t = threading.Thread(target=attack)
        t.start()
        try:
            time.sleep(1)
            held = n - len(closed_at)
            for what, method, path, body in (("/health", "GET", "/health", None),
                                             ("a completion", "POST", "/v1/completions",
                                              {"prompt": PROMPT, "max_tokens": 2})):
                try:
                    st, _, answer = s.request(method, path, body, timeout=60)
                except OSError as e:  # a server full of slow sockets closes the connection
                    st, answer = 0, repr(e).encode()
                c.check(st == 200, f"{what} during the slowloris ({held} slow sockets open): {st} {answer[:200]}")
            c.check(held > 0, "no slow socket was held open at all")
        finally:
            t.join(bound + 10)
            stop.set()
        reaped = sum(1 for sk, at in closed_at.items() if at - opened[sk] >= 2)
        c.check(len(closed_at) == n and reaped > 0,
                f"the server closed {len(closed_at)} of {n} slow sockets within {bound:.0f} s "
                f"({reaped} after a while, by --request-timeout)")
        for sk in socks:
            sk.close()


def browsers(c, rlx):
    app = "http://app.example:3000"
    with Server(rlx, ["--parallel", "1", "--cors-origin", app]) as s:
        own = f"127.0.0.1:{s.port}"

        def req(method, path, headers, body=None):
            h = {"Host": own}
            h.update(headers)
            return s.request(method, path, body, headers=h)

        def refused(what, got, status, code):
            st, _, body = got
            try:
                e = json.loads(body)["error"]
            except (ValueError, KeyError):
                e = {}
            c.check(st == status and e.get("code") == code and e.get("type") == "invalid_request_error",
                    f"{what}: {st} {body[:200]!r}, expected {status} {code}")

        refused("a foreign Host (DNS rebinding)", req("GET", "/v1/models", {"Host": f"evil.example:{s.port}"}),
                400, "host_not_allowed")
        refused("a foreign Host on a completion", req("POST", "/v1/completions", {"Host": "evil.example"},
                                                      {"prompt": "x", "max_tokens": 1}), 400, "host_not_allowed")
        for host in (f"localhost:{s.port}", own, f"127.0.0.2:{s.port}", "localhost"):
            st, _, _ = req("GET", "/v1/models", {"Host": host})
            c.check(st == 200, f"Host {host}: {st}")
        # a page elsewhere POSTs text/plain, which browsers send without a preflight
        refused("a cross-origin text/plain POST", req("POST", "/v1/completions", {
            "Origin": "http://evil.example", "Content-Type": "text/plain"},
            json.dumps({"prompt": "x", "max_tokens": 1}).encode()), 403, "origin_not_allowed")
        refused("a cross-origin GET", req("GET", "/v1/models", {"Origin": "http://evil.example"}), 403,
                "origin_not_allowed")
        refused("a preflight from a foreign origin", req("OPTIONS", "/v1/completions", {
            "Origin": "http://evil.example", "Access-Control-Request-Method": "POST"}), 403, "origin_not_allowed")
        st, _, _ = req("GET", "/v1/models", {"Origin": f"http://{own}"})
        c.check(st == 200, f"a same-origin request: {st}")
        st, h, body = req("POST", "/v1/completions", {"Origin": app},
                          {"prompt": PROMPT, "max_tokens": 2, "temperature": 0})
        c.check(st == 200 and h.get("access-control-allow-origin") == app and h.get("vary") == "Origin",
                f"a request from --cors-origin: {st} {h}")
        st, h, body = req("POST", "/v1/completions", {"Origin": app},
                          {"prompt": PROMPT, "max_tokens": 2, "temperature": 0, "stream": True})
        c.check(st == 200 and h.get("access-control-allow-origin") == app and body.endswith(b"data: [DONE]\n\n"),
                f"a stream from --cors-origin: {st} {h}")
        st, h, body = req("OPTIONS", "/v1/chat/completions", {
            "Origin": app, "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type, x-stainless-lang"})
        c.check(st == 204 and h.get("access-control-allow-origin") == app and
                "POST" in h.get("access-control-allow-methods", "") and
                h.get("access-control-allow-headers") == "authorization, content-type, x-stainless-lang",
                f"a preflight from --cors-origin: {st} {h}")
        for path in ("/health", "/v1/models", "/metrics"):
            st, h, body = s.request("HEAD", path)
            c.check(st == 200 and body == b"", f"HEAD {path}: {st} {body[:100]!r}")
        st, h, _ = s.request("DELETE", "/health")
        c.check(st == 405 and "HEAD" in h.get("allow", ""), f"DELETE /health: {st} {h}")
    # llama-server's --cors-origins: a list, and the word localhost for a page on this machine
    with Server(rlx, ["--parallel", "1", "--cors-origins", "localhost, http://b.example"]) as s:
        for origin in ("http://localhost:5173", "http://127.0.0.1", "https://[::1]:3000", "http://b.example"):
            st, h, _ = s.request("GET", "/v1/models", headers={"Origin": origin})
            c.check(st == 200 and h.get("access-control-allow-origin") == origin,
                    f"--cors-origins localhost,...: {origin} is served with its origin: {st} {h}")
        for origin in ("http://localhost.evil.com", "http://notlocalhost", "http://[::1]x", "http://localhost:80x",
                       "http://127.0.0.1.evil.com:80", "ftp://localhost"):
            st, _, _ = s.request("GET", "/v1/models", headers={"Origin": origin})
            c.check(st == 403, f"--cors-origins localhost,...: {origin} is refused: {st}")
    with Server(rlx, ["--parallel", "1", "--api-key", "sk-test-0123456789"]) as s:
        # a page reaching the server under its own name still lacks the key: any Host will do
        st, _, _ = s.request("GET", "/v1/models", headers={"Host": "gpu-box.lan:8080",
                                                           "Authorization": "Bearer sk-test-0123456789"})
        c.check(st == 200, f"a keyed server under another name: {st}")
        st, _, _ = s.request("GET", "/v1/models", headers={"Origin": "http://evil.example",
                                                           "Authorization": "Bearer sk-test-0123456789"})
        c.check(st == 403, f"a keyed server, a foreign Origin: {st}")


def queued_not_timed_out(c, rlx):
    """--timeout 1, one slot: a request queued behind one that decodes for seconds is answered."""
    with Server(rlx, ["--parallel", "1", "--timeout", "1"]) as s:
        long_one = socket.create_connection(("127.0.0.1", s.port), timeout=300)
        long_one.sendall(raw_request(s.port, {"prompt": PROMPT, "max_tokens": 60, "temperature": 0,
                                              "ignore_eos": True, "stream": True}))
        long_one.recv(1)
        st, _, body = s.request("POST", "/v1/completions", {"prompt": PROMPT, "max_tokens": 2, "temperature": 0})
        data = read_to_end(long_one)
        long_one.close()
        c.check(st == 200, f"a request queued behind a long one with --timeout 1: {st} {body[:200]!r}")
        c.check(b"data: [DONE]" in data and b'"timeout"' not in data, f"the long stream: {data[-200:]!r}")


def flags(c, rlx):
    with tempfile.TemporaryDirectory() as tmp:
        loose = os.path.join(tmp, "loose.key")
        with open(loose, "w") as f:
            f.write("sk-loose-0123456789\n")
        os.chmod(loose, 0o644)
        cases = [
            (["--api-key", ""], "--api-key is empty"),
            (["--api-key-file", loose], "chmod 600"),
            (["--max-connections", "4294967295"], "--max-connections 4294967295 is out of range (1-65536)"),
            (["--drain-timeout", "4294968"], "--drain-timeout 4294968 is out of range (0-86400)"),
            (["--timeout", "86401"], "--timeout 86401 is out of range (1-86400)"),
            (["--request-timeout", "0"], "--request-timeout"),
            (["--parallel", "5000"], "--parallel 5000 is out of range"),
            (["--max-body", "2147483648"], "--max-body 2147483648 is out of range"),
            (["--max-connections-per-ip", "70000"], "--max-connections-per-ip 70000 is out of range"),
            (["--host", "0.0.0.0"], "--insecure-listen"),
            (["--host", "::"], "will not listen on :: without an API key"),
            (["--cors-origin", "http://a.example/path"], "is not an origin"),
            (["--cors-origins", "localhost,http://a.example/path"], "is not an origin"),
        ]
        for args, says in cases:
            p = subprocess.run([rlx, "serve"] + args, capture_output=True, text=True, timeout=60)
            lines = p.stderr.splitlines()
            c.check(p.returncode == 1 and len(lines) == 1 and lines[0].startswith("rlx: ") and says in lines[0],
                    f"rlx serve {' '.join(args)}: exit {p.returncode}, {p.stderr!r}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rlx", required=True)
    args = ap.parse_args()
    c = Checks()
    flags(c, args.rlx)
    with Server(args.rlx, ["--parallel", "1"]) as s:
        half_close(c, s)
        closed_queued_stream(c, s)
    browsers(c, args.rlx)
    queued_not_timed_out(c, args.rlx)
    slowloris(c, args.rlx)
    return c.report()


if __name__ == "__main__":
    main_guard(main)
