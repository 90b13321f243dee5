#!/usr/bin/python3
"""Generation through rlx serve on the shipped Brown model, greedy:
  - /v1/completions and /v1/chat/completions, streamed and not, give `rlx generate`'s text
    (with --chat for chat), finish_reason and token counts; a stop string cuts the text where
    `rlx generate --stop` does; completions' logprobs equal `rlx generate --logprobs`'s;
  - 8 concurrent clients each get exactly what they got alone;
  - a client killed mid-stream frees its slot: with one slot, the next request completes at
    once and /metrics counts the cancel;
  - a bounded load test: 200 short requests from 8 keep-alive clients over loopback, none lost;
  - SIGTERM during a stream exits 0 within --drain-timeout (plus start-up slack);
  - with a speculator (--spec draft) and over a pipeline of 2 launched stages (the engine runs the
    runtime's lm, one slot), completions streamed and not still give `rlx generate`'s text.

  check_generation.py --rlx BIN
"""
import argparse
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_util import BROWN, Checks, Server, generate, main_guard, stream_text  # noqa: E402

PROMPTS = ["The President said that", "In the morning the", "She looked at him and", "The city council voted",
           "It was a dark", "He had never seen", "The first thing to", "When the war ended"]
N = 12
LOAD_REQUESTS = 200
DRAIN_SECONDS = 2


def post(s, path, body, conn=None):
    if conn is None:
        status, _, data = s.request("POST", path, body)
        return status, data
    conn.request("POST", path, body=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    return r.status, r.read()


def completion(s, prompt, n=N, conn=None, **extra):
    status, data = post(s, "/v1/completions", dict(prompt=prompt, max_tokens=n, temperature=0, **extra), conn)
    if status != 200:
        raise RuntimeError(f"completion {prompt!r}: {status} {data[:300]}")
    return json.loads(data)


def chat(s, text, n=N, **extra):
    status, data = post(s, "/v1/chat/completions",
                        dict(messages=[{"role": "user", "content": text}], max_tokens=n, temperature=0, **extra))
    if status != 200:
        raise RuntimeError(f"chat {text!r}: {status} {data[:300]}")
    return json.loads(data)


def against_generate(c, s, rlx):
    ref = generate(rlx, ["-p", PROMPTS[0], "-n", str(N), "--logprobs", "2"])
    got = completion(s, PROMPTS[0], logprobs=2)
    ch = got["choices"][0]
    c.check(got["object"] == "text_completion" and ch["text"] == ref["text"],
            f"completions {ch['text']!r} != rlx generate {ref['text']!r}")
    c.check(ch["finish_reason"] == ref["finish_reason"] == "length", f"finish_reason {ch['finish_reason']}")
    u = got["usage"]
    c.check(u["prompt_tokens"] == ref["n_prompt"] and u["completion_tokens"] == ref["n_generated"] and
            u["total_tokens"] == ref["n_prompt"] + ref["n_generated"], f"usage {u} against {ref['n_prompt']}+"
            f"{ref['n_generated']}")
    lp = ch["logprobs"]
    want = [t["logprob"] for t in ref["logprobs"]]
    c.check(len(lp["token_logprobs"]) == len(want) and
            all(abs(a - b) < 1e-3 for a, b in zip(lp["token_logprobs"], want)),
            f"logprobs {lp['token_logprobs']} != rlx generate's {want}")
    c.check(all(len(t) == 2 for t in lp["top_logprobs"]) and "".join(lp["tokens"]) == ref["text"],
            f"logprobs tokens {lp['tokens']} / top {lp['top_logprobs'][:2]}")
    status, _, body = s.request("POST", "/v1/completions",
                                {"prompt": PROMPTS[0], "max_tokens": N, "temperature": 0, "stream": True})
    text, finish, _ = stream_text(body, chat=False)
    c.check(status == 200 and text == ref["text"] and finish == "length",
            f"streamed completions {text!r} ({finish}) != {ref['text']!r}")
    # logit_bias as OpenAI spells it (a ban of the greedy text's first two tokens, a nudge) and as
    # llama.cpp does (pairs, false bans): the text of rlx generate -l with the same biases
    first, second = ref["tokens"][0], ref["tokens"][1]
    biased = generate(rlx, ["-p", PROMPTS[0], "-n", str(N), "-l", f"{first}-inf", "-l", f"{second}-100",
                            "-l", "7+2.5"])
    got = completion(s, PROMPTS[0], logit_bias={str(first): -100, str(second): -100, "7": 2.5})
    pairs = completion(s, PROMPTS[0], logit_bias=[[first, False], [second, -100], [7, 2.5]])
    texts = [got["choices"][0]["text"], pairs["choices"][0]["text"]]
    c.check(biased["tokens"][0] != first and first not in biased["tokens"] and
            all(t == biased["text"] for t in texts),
            f"logit_bias: {texts} != rlx generate -l {biased['text']!r} (banned {first}, {second})")

    ref = generate(rlx, ["--chat", "-p", PROMPTS[1], "-n", str(N)])
    got = chat(s, PROMPTS[1])
    ch = got["choices"][0]
    c.check(got["object"] == "chat.completion" and ch["message"] == {"role": "assistant", "content": ref["text"],
                                                                     "refusal": None},
            f"chat {ch['message']} != rlx generate --chat {ref['text']!r}")
    c.check(got["usage"]["prompt_tokens"] == ref["n_prompt"], f"chat usage {got['usage']} vs {ref['n_prompt']}")
    status, headers, body = s.request("POST", "/v1/chat/completions",
                                      {"messages": [{"role": "user", "content": PROMPTS[1]}], "max_tokens": N,
                                       "temperature": 0, "stream": True, "stream_options": {"include_usage": True}})
    c.check(headers.get("content-type") == "text/event-stream", f"stream content type {headers}")
    text, finish, usage = stream_text(body, chat=True)
    first = json.loads(body.decode().split("\n\n")[0][len("data: "):])
    last = json.loads(body.decode().split("\n\n")[-3][len("data: "):])
    c.check(text == ref["text"] and finish == "length", f"streamed chat {text!r} ({finish}) != {ref['text']!r}")
    c.check(first["object"] == "chat.completion.chunk" and first["choices"][0]["delta"].get("role") == "assistant",
            f"the first chunk carries no role: {first}")
    counts = ("prompt_tokens", "completion_tokens", "total_tokens")  # cached_tokens: the 2nd run reuses the 1st's
    c.check(last["choices"] == [] and usage and all(usage[k] == got["usage"][k] for k in counts),
            f"the usage chunk: {last} vs {got['usage']}")
    c.check(usage and usage["prompt_tokens_details"]["cached_tokens"] > 0,
            f"the same chat again reused no cached prefix: {usage}")

    # a stop string from the middle of the reply: the text ends before it, as rlx generate's does
    full = completion(s, PROMPTS[0])["choices"][0]["text"]
    stop = full[len(full) // 2:len(full) // 2 + 3]
    ref = generate(rlx, ["-p", PROMPTS[0], "-n", str(N), "--stop", stop])
    for stream in (False, True):
        status, _, body = s.request("POST", "/v1/completions", {"prompt": PROMPTS[0], "max_tokens": N,
                                                                "temperature": 0, "stop": [stop, "\u00a7"],
                                                                "stream": stream})
        if stream:
            text, finish, _ = stream_text(body, chat=False)
        else:
            ch = json.loads(body)["choices"][0]
            text, finish = ch["text"], ch["finish_reason"]
        c.check(text == ref["text"] and stop not in text and finish == "stop",
                f"stop {stop!r} (stream {stream}): {text!r} ({finish}) != rlx generate --stop {ref['text']!r}")


def concurrent(c, s):
    solo = [completion(s, p)["choices"][0]["text"] for p in PROMPTS]
    got = [None] * len(PROMPTS)

    def client(i):
        try:
            got[i] = completion(s, PROMPTS[i], stream=False)["choices"][0]["text"]
        except Exception as e:  # reported below as a mismatch
            got[i] = repr(e)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(PROMPTS))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    for i, p in enumerate(PROMPTS):
        c.check(got[i] == solo[i], f"concurrent client {i} ({p!r}) got {got[i]!r}, alone {solo[i]!r}")


def load(c, s):
    done, lost = [0], []
    lock = threading.Lock()

    def client(k):
        conn = s.connect()
        try:
            for i in range(k, LOAD_REQUESTS, 8):
                try:
                    r = completion(s, PROMPTS[i % len(PROMPTS)], n=2, conn=conn)
                    ok = r["usage"]["completion_tokens"] >= 1 and r["choices"][0]["finish_reason"] in ("stop", "length")
                except Exception as e:
                    ok = False
                    r = e
                    conn.close()
                    conn = s.connect()
                with lock:
                    if ok:
                        done[0] += 1
                    else:
                        lost.append((i, repr(r)[:200]))
        finally:
            conn.close()

    start = time.monotonic()
    threads = [threading.Thread(target=client, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    c.check(done[0] == LOAD_REQUESTS and not lost,
            f"load test: {done[0]} of {LOAD_REQUESTS} answered in {time.monotonic() - start:.1f} s; lost {lost[:3]}")
    finished = sum(metric(s, 'rlx_requests_total{outcome="%s"}' % o) for o in ("completed", "cancelled", "failed"))
    counted = metric(s, 'rlx_request_stage_seconds_count{stage="decode"}')
    c.check(finished >= LOAD_REQUESTS and counted == finished and metric(s, "rlx_generated_tokens_total") > 0 and
            metric(s, 'rlx_request_stage_seconds_sum{stage="prompt"}') > 0,
            f"/metrics: {finished} requests finished, {counted} in the stage latencies")


def metric(s, name):
    _, _, body = s.request("GET", "/metrics")
    return float(re.search(r"^%s (\S+)$" % re.escape(name), body.decode(), re.M).group(1))


def killed_client(c, s):
    """One slot: a stream whose curl is killed after its first token must give the slot back."""
    before = metric(s, 'rlx_requests_total{outcome="cancelled"}')
    body = json.dumps({"prompt": PROMPTS[2], "max_tokens": 240, "temperature": 0, "stream": True})
    curl = subprocess.Popen(["curl", "-sN", "--max-time", "300", s.url() + "/v1/completions", "-H",
                             "Content-Type: application/json", "-d", body], stdout=subprocess.PIPE)
    seen = 0
    for line in curl.stdout:  # the first event with text: the request holds the slot and decodes
        seen += line.startswith(b"data: ") and b'"text":"' in line and b'"text":""' not in line
        if seen:
            break
    curl.kill()
    curl.wait()
    r = completion(s, PROMPTS[3], n=4)
    deadline = time.monotonic() + 30
    while metric(s, 'rlx_requests_total{outcome="cancelled"}') < before + 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    c.check(seen and r["usage"]["completion_tokens"] == 4, f"the request after the killed client: {r}")
    c.check(metric(s, 'rlx_requests_total{outcome="cancelled"}') == before + 1,
            "the killed client's request was not cancelled")


def sigterm(c, s):
    """SIGTERM with a stream running: exit 0 within the drain bound; the stream ends cleanly."""
    box = {}

    def client():
        try:
            status, _, body = s.request("POST", "/v1/completions", {"prompt": PROMPTS[4], "max_tokens": 240,
                                                                    "temperature": 0, "stream": True})
            box["body"] = body.decode()
        except Exception as e:
            box["body"] = repr(e)

    t = threading.Thread(target=client)
    t.start()
    deadline = time.monotonic() + 60
    while metric(s, "rlx_requests_running") < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    start = time.monotonic()
    s.proc.send_signal(signal.SIGTERM)
    try:
        rc = s.proc.wait(timeout=DRAIN_SECONDS + 30)
    except subprocess.TimeoutExpired:
        rc = None
    took = time.monotonic() - start
    t.join(timeout=30)
    c.check(rc == 0, f"exit status {rc} after SIGTERM")
    c.check(took < DRAIN_SECONDS + 5, f"SIGTERM took {took:.1f} s, the bound is {DRAIN_SECONDS} s")
    c.check(box.get("body", "").endswith("data: [DONE]\n\n"), f"the stream's end: {box.get('body', '')[-200:]!r}")


def stage_metrics(c, s, n_stages):
    """Per-stage latency over a pipeline: every stage answered each of the two requests' steps
    (N tokens each, the first with the prompt), in some time, with bytes both ways; none
    without a pipeline."""
    _, _, body = s.request("GET", "/metrics")
    body = body.decode()

    def series(name):
        return {int(m.group(1)): float(m.group(2)) for m in
                re.finditer(r'^%s\{stage="(\d+)",address="[^"]+",layers="\d+-\d+"[^}]*\} (\S+)$' % name, body, re.M)}
    steps, seconds = series("rlx_pipeline_stage_step_seconds_count"), series("rlx_pipeline_stage_step_seconds_sum")
    sent = series("rlx_pipeline_stage_bytes_total")
    c.check(sorted(steps) == list(range(n_stages)) and sorted(seconds) == list(range(n_stages)),
            f"per-stage series for {n_stages} stages: {steps} {seconds}")
    c.check(all(v >= 2 * N for v in steps.values()) and len(set(steps.values())) <= 1 and
            all(v > 0 for v in seconds.values()) and all(v > 0 for v in sent.values()),
            f"per-stage steps {steps}, seconds {seconds}, bytes {sent}")


def over_lm(c, rlx):
    ref = generate(rlx, ["-p", PROMPTS[5], "-n", str(N)])
    for flags in (["--spec", "draft", "--draft-model", os.path.join(os.path.dirname(BROWN), "draft")],
                  ["--stages", "2"]):
        with Server(rlx, flags + ["--slot-ctx", "128"]) as s:
            got = completion(s, PROMPTS[5])["choices"][0]["text"]
            status, _, body = s.request("POST", "/v1/completions", {"prompt": PROMPTS[5], "max_tokens": N,
                                                                    "temperature": 0, "stream": True})
            text, finish, _ = stream_text(body, chat=False)
            c.check(got == ref["text"] and text == ref["text"] and finish == "length",
                    f"{' '.join(flags)}: {got!r} / streamed {text!r} != rlx generate {ref['text']!r}")
            stage_metrics(c, s, 2 if "--stages" in flags else 0)
        c.check(s.proc.returncode == 0, f"{' '.join(flags)}: exit status {s.proc.returncode}: {s.stderr[-500:]}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rlx", required=True)
    args = ap.parse_args()
    c = Checks()
    with Server(args.rlx, ["--parallel", "8", "--queue", "64", "--slot-ctx", "256"]) as s:
        against_generate(c, s, args.rlx)
        concurrent(c, s)
        load(c, s)
    c.check(s.proc.returncode == 0, f"exit status {s.proc.returncode}: {s.stderr[-500:]}")
    with Server(args.rlx, ["--parallel", "1", "--slot-ctx", "256", "--drain-timeout", str(DRAIN_SECONDS)]) as s:
        killed_client(c, s)
        sigterm(c, s)
    over_lm(c, args.rlx)
    return c.report()


if __name__ == "__main__":
    main_guard(main)
