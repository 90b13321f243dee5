#!/usr/bin/python3
"""rlx serve's reading of a request body, on the attacks issue 26 found:
  - temperatures down to the smallest float (1e-40, 1e-45) and a top_p of 1e-300 answer the
    greedy text, never the least likely tokens nor a refusal;
  - repeat_last_n 2^31 - 1 answers as -1 (the whole context) does, and the server's address
    space does not grow by the 8 GiB such a window would take;
  - a parse error names the byte of its own request, also under concurrent bad requests (the
    bad bodies are long arrays, so freeing cJSON's partial tree keeps a failing parse open
    while the others start theirs);
  - "\\u0000" in a string, data after the JSON value, a key given twice (named), a stop string
    over 256 bytes: 400, and the server serves on.

  check_request_body.py --rlx BIN
"""
import argparse
import json
import os
import re
import socket
import subprocess
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_util import BROWN, Checks, Server, main_guard  # noqa: E402

PROMPT = "The President said that"
THREADS = 8
ROUNDS = 5000  # bad requests per thread, each followed by a well-formed one


def post(s, path, body):
    """(status, parsed JSON or None, raw body) of one request; body is a dict or raw bytes."""
    status, _, raw = s.request("POST", path, body)
    try:
        return status, json.loads(raw), raw
    except ValueError:
        return status, None, raw


def completion(s, **fields):
    status, obj, raw = post(s, "/v1/completions", dict({"prompt": PROMPT, "max_tokens": 8}, **fields))
    return (obj["choices"][0]["text"] if status == 200 else None), status, raw


def vm_peak_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        return int(re.search(r"^VmPeak:\s+(\d+) kB", f.read(), re.M).group(1))


def bad_body(i):
    """A body whose JSON breaks at a byte of its own."""
    return ('{"prompt": "x",' + " " * i + "!}").encode()


def offset_of(raw):
    m = re.search(rb"error near byte (\d+)", raw)
    return int(m.group(1)) if m else None


def pipelined(port, bodies):
    """The (status, body) of each of bodies, POSTed one after another on one connection without
    waiting for the answers (HTTP/1.1 pipelining), so the server parses as fast as it can."""
    out = b"".join(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                   b"Content-Length: %d\r\n\r\n%s" % (len(b), b) for b in bodies)
    answers, buf = [], b""
    with socket.create_connection(("127.0.0.1", port), timeout=120) as sock:
        sender = threading.Thread(target=sock.sendall, args=(out,))
        sender.start()
        while len(answers) < len(bodies):
            head_end = buf.find(b"\r\n\r\n")
            if head_end >= 0:
                head = buf[:head_end].decode("latin-1")
                length = int(re.search(r"^content-length:\s*(\d+)", head, re.I | re.M).group(1))
                if len(buf) >= head_end + 4 + length:
                    answers.append((int(head.split()[1]), buf[head_end + 4:head_end + 4 + length]))
                    buf = buf[head_end + 4 + length:]
                    continue
            chunk = sock.recv(1 << 16)
            if not chunk:
                break
            buf += chunk
        sender.join()
    return answers


def concurrent_offsets(c, s):
    """Bad bodies on THREADS connections at once, each between well-formed ones (each parse
    resets cJSON's global error, each failing one sets it): every reply names its own body's
    byte. The race this checks for is narrow (a few in 10^4 replies went wrong), so the
    requests are many, pipelined."""
    alone = [bad_body(n) for n in range(7 * THREADS + 50)]
    expected = {b: offset_of(raw) for b, (_, raw) in zip(alone, pipelined(s.port, alone))}
    c.check(all(expected.get(b) is not None and b.index(b"!") <= expected[b] < len(b) for b in alone),
            f"bad bodies one at a time: their offsets {sorted(expected.values())[:5]}...")
    wrong, answered = [], [0]

    def client(i):
        bodies = []
        for r in range(ROUNDS):
            bodies += [bad_body(i * 7 + r % 50), b'{"prompt": 5}']
        try:
            answers = pipelined(s.port, bodies)
        except (OSError, ValueError, AttributeError) as e:
            wrong.append((i, "connection", repr(e)))
            return
        answered[0] += len(answers)
        for k, (status, raw) in enumerate(answers):
            if k % 2 == 0 and (status != 400 or offset_of(raw) != expected.get(bodies[k])):
                wrong.append((i, status, raw[:200]))
        if len(answers) != len(bodies):
            wrong.append((i, "answered", len(answers), "of", len(bodies)))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    c.check(not wrong, f"{len(wrong)} of {THREADS * ROUNDS} concurrent bad requests named another byte "
                       f"({answered[0]} answers), e.g. {wrong[:3]}")


def cli_tiny_temperature(c, rlx):
    """`rlx generate --temp 1e-40` goes through the same sampler: the greedy tokens."""
    runs = {}
    for temp in ("0", "1e-40", "1e-50"):
        p = subprocess.run([rlx, "generate", "-m", BROWN, "-t", "1", "--json", "-n", "8", "-p", PROMPT,
                            "--temp", temp], capture_output=True, text=True, timeout=300)
        runs[temp] = json.loads(p.stdout)["tokens"] if p.returncode == 0 else p.stderr.strip()
    c.check(runs["1e-40"] == runs["0"] == runs["1e-50"] and isinstance(runs["0"], list),
            f"rlx generate --temp 1e-40 and 1e-50 should give --temp 0's tokens: {runs}")
    p = subprocess.run([rlx, "generate", "-m", BROWN, "-p", PROMPT, "--temp", "1e39"], capture_output=True,
                       text=True, timeout=300)
    c.check(p.returncode != 0 and "beyond the float range" in p.stderr, f"--temp 1e39: {p.stderr!r}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rlx", required=True)
    args = ap.parse_args()
    c = Checks()
    cli_tiny_temperature(c, args.rlx)
    with Server(args.rlx, ["--slot-ctx", "256", "--parallel", "2", "--queue", "8"]) as s:
        greedy, st, raw = completion(s, temperature=0)
        c.check(greedy, f"the greedy reference: {st} {raw[:200]}")
        for fields in ({"temperature": 1e-40}, {"temperature": 1e-45}, {"temperature": 1.1754943508222875e-38},
                       {"temperature": 2e-38, "seed": 3}, {"temperature": 1e-30, "seed": 4},
                       {"top_p": 1e-300}, {"top_p": 1e-300, "temperature": 1.5}):
            text, st, raw = completion(s, **fields)
            c.check(text == greedy, f"{fields}: {st} {text!r}, expected the greedy {greedy!r}: {raw[:200]}")

        before = vm_peak_kib(s.proc.pid)
        penalised = {"temperature": 0, "repeat_penalty": 1.3}
        whole, st, raw = completion(s, repeat_last_n=-1, **penalised)
        c.check(whole is not None, f"repeat_last_n -1: {st} {raw[:200]}")
        huge, st, raw = completion(s, repeat_last_n=2**31 - 1, **penalised)
        c.check(huge == whole, f"repeat_last_n 2^31-1: {st} {huge!r}, expected -1's {whole!r}: {raw[:200]}")
        grown = vm_peak_kib(s.proc.pid) - before
        c.check(grown < 1 << 20, f"repeat_last_n 2^31-1 grew the server's address space by {grown} KiB")

        concurrent_offsets(c, s)

        refused = [
            ("a NUL in the prompt", "/v1/completions", b'{"prompt": "a\\u0000b"}', "NUL"),
            ("a raw NUL in the prompt", "/v1/completions", b'{"prompt": "a\x00b"}', "NUL"),
            ("a NUL in a message", "/v1/chat/completions",
             b'{"messages": [{"role": "user", "content": "hi\\u0000 there"}]}', "NUL"),
            ("a NUL in a key", "/v1/completions", b'{"prompt": "x", "temperature\\u0000x": 1}', "NUL"),
            ("data after the JSON", "/v1/completions", b'{"prompt": "x"} {"prompt": "y"}', "after its JSON value"),
            ("a NUL after the JSON", "/v1/completions", b'{"prompt": "x"}\x00', "after its JSON value"),
            ("a key twice", "/v1/completions", b'{"prompt": "x", "temperature": 0, "temperature": 1}',
             "'temperature' twice"),
            ("a key twice in a message", "/v1/chat/completions",
             b'{"messages": [{"role": "user", "role": "system", "content": "x"}]}', "'role' twice"),
            ("a stop string of 257 bytes", "/v1/completions",
             json.dumps({"prompt": "x", "stop": ["a" * 257]}).encode(), "at most 256 bytes"),
        ]
        for what, path, body, says in refused:
            st, obj, raw = post(s, path, body)
            message = obj["error"]["message"] if obj and "error" in obj else ""
            c.check(st == 400 and says in message, f"{what}: {st} {raw[:300]}")
        # what stays accepted: an escaped backslash before u0000, whitespace after the value,
        # the same key in two objects, a stop string of 256 bytes
        for what, body in (("an escaped backslash", b'{"prompt": "a\\\\u0000b", "max_tokens": 1}'),
                           ("whitespace after the JSON", b'{"prompt": "x", "max_tokens": 1} \r\n\t '),
                           ("one key in two objects", b'{"prompt": "x", "max_tokens": 1, '
                                                      b'"stream_options": {"max_tokens": 1}}'),
                           ("a stop string of 256 bytes",
                            json.dumps({"prompt": "x", "max_tokens": 1, "stop": ["a" * 256]}).encode())):
            st, _, raw = post(s, "/v1/completions", body)
            c.check(st == 200, f"{what}: {st} {raw[:300]}")
        text, st, raw = completion(s, temperature=0)
        c.check(text == greedy, f"the server serves on: {st} {raw[:200]}")
    c.check(s.proc.returncode == 0, f"exit status {s.proc.returncode} after SIGTERM: {s.stderr[-500:]}")
    return c.report()


if __name__ == "__main__":
    main_guard(main)
