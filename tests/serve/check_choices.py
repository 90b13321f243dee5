#!/usr/bin/python3
"""n > 1 choices and GET /slots of rlx serve, on the Brown model with --parallel 3:
  - n=3 completions and chats, whole and streamed: choices indexed 0..2, each with its own
    finish_reason (and its own log-probabilities), usage counting the prompt once and the tokens
    of every choice; in a stream each chunk names its choice, each choice ends once, one usage
    chunk, one [DONE] at the end; the streamed choices are the whole ones' text;
  - the prompt runs once for all n: /metrics' prompt tokens computed (admitted less cached) grow
    by what choice 0 computed alone, and llama-server's timings give choices 1.. prompt_n 0
    (cache_n the whole prompt);
  - greedy choices all equal one greedy request's text; at temperature 1 with a seed, choice i
    is the request alone with seed + i, the same on every run, and the choices differ;
  - n over the slots, or 0, is a 400 naming n (n_cmpl on llama-server's /completion, which
    answers an array of its objects);
  - /slots: one object per slot as llama-server's (id, id_task, n_ctx, is_processing; params
    and next_token while busy) behind the API key; busy while a long request runs, idle after,
    and a client that hangs up mid-stream frees all n slots of its choices; --no-slots -> 501.

  check_choices.py --rlx BIN
"""
import argparse
import json
import os
import socket
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from serve_util import Checks, Server, main_guard, sse_events  # noqa: E402

KEY = "sk-choices"
AUTH = {"Authorization": f"Bearer {KEY}"}
PROMPT = "The President said that"
SLOTS = 3
N_TOKENS = 8


def post(s, path, body):
    status, _, raw = s.request("POST", path, body, headers=AUTH)
    return status, json.loads(raw) if not body.get("stream") or status != 200 else raw


def slots(s):
    status, _, raw = s.request("GET", "/slots", headers=AUTH)
    return status, json.loads(raw)


def wait_slots(s, want_busy, seconds=30):
    """/slots once its busy count is want_busy (a callable of the count), or the last answer."""
    deadline = time.monotonic() + seconds
    while True:
        _, body = slots(s)
        if want_busy(sum(1 for sl in body if sl["is_processing"])) or time.monotonic() > deadline:
            return body
        time.sleep(0.05)


def prompt_counters(s):
    """/metrics' prompt tokens admitted and taken from a cache."""
    status, _, raw = s.request("GET", "/metrics", headers=AUTH)
    values = dict(line.split() for line in raw.decode().splitlines() if line and not line.startswith("#"))
    return int(values["rlx_prompt_tokens_total"]), int(values["rlx_prompt_tokens_cached_total"])


def check_one_pass(c, s):
    """n choices compute their prompt once: choices 1.. start from choice 0's prompt pass."""
    body = {"prompt": "One prompt pass for every choice of this request", "max_tokens": 2, "n": SLOTS,
            "temperature": 1, "seed": 3}
    before = prompt_counters(s)
    status, r = post(s, "/v1/completions", body)
    after = prompt_counters(s)
    c.check(status == 200, f"n=3 completion: {status} {r}")
    n_prompt, cached0 = r["usage"]["prompt_tokens"], r["usage"]["prompt_tokens_details"]["cached_tokens"]
    admitted, cached = after[0] - before[0], after[1] - before[1]
    c.check(admitted == SLOTS * n_prompt and admitted - cached == n_prompt - cached0,
            f"n={SLOTS}: {admitted} prompt tokens admitted, {cached} cached, so {admitted - cached} computed; "
            f"want the prompt's {n_prompt} less choice 0's cached {cached0} computed once")
    status, arr = post(s, "/completion", {"prompt": "Computed once, shared twice", "n_predict": 2, "n_cmpl": 2})
    c.check(status == 200 and arr[1]["timings"]["prompt_n"] == 0 and
            arr[1]["timings"]["cache_n"] == arr[1]["tokens_evaluated"] and arr[0]["timings"]["prompt_n"] > 0,
            f"/completion n_cmpl=2: choice 1 computes no prompt token: {status} {arr}")


def stream_choices(c, raw, chat):
    """Per-index text, finish chunks and roles of a stream; checks its frame."""
    events = sse_events(raw)
    c.check(events.count("[DONE]") == 1 and events[-1] == "[DONE]", f"one [DONE], last: {events[-3:]}")
    texts, finishes, roles, usages = {}, {}, {}, []
    for e in events[:-1]:
        obj = json.loads(e)
        c.check("error" not in obj, f"an error event: {obj}")
        if obj.get("usage"):
            usages.append(obj["usage"])
        for ch in obj.get("choices", []):
            i = ch["index"]
            c.check(i not in finishes, f"choice {i} has a chunk after its finish: {obj}")
            texts[i] = texts.get(i, "") + ((ch["delta"].get("content") or "") if chat else ch["text"])
            if chat and "role" in ch["delta"]:
                roles[i] = roles.get(i, 0) + 1
            if ch["finish_reason"]:
                finishes[i] = ch["finish_reason"]
    return texts, finishes, roles, usages


def check_whole(c, s):
    # completions: n=3 at temperature 1 with a seed, the chosen tokens' log-probabilities per choice
    body = {"prompt": PROMPT, "max_tokens": N_TOKENS, "n": SLOTS, "seed": 7, "temperature": 1, "logprobs": 0}
    status, r = post(s, "/v1/completions", body)
    c.check(status == 200, f"n=3 completion: {status} {r}")
    ch = r["choices"]
    c.check([x["index"] for x in ch] == [0, 1, 2], f"indices {[x['index'] for x in ch]}")
    c.check(all(x["finish_reason"] in ("length", "stop") for x in ch), f"finish reasons {ch}")
    lengths = [len(x["logprobs"]["tokens"]) for x in ch]
    _, one = post(s, "/v1/completions", {"prompt": PROMPT, "max_tokens": 1})
    c.check(r["usage"]["completion_tokens"] == sum(lengths) and
            r["usage"]["prompt_tokens"] == one["usage"]["prompt_tokens"] and
            r["usage"]["total_tokens"] == r["usage"]["prompt_tokens"] + sum(lengths),
            f"usage {r['usage']}: tokens per choice {lengths}, the prompt alone {one['usage']}")
    texts = [x["text"] for x in ch]
    c.check(len(set(texts)) > 1, f"the choices at temperature 1 differ: {texts}")
    # the same seed again: the same choices; choice i is the request alone with seed + i
    _, again = post(s, "/v1/completions", body)
    c.check([x["text"] for x in again["choices"]] == texts, f"seeded choices again: {again['choices']} vs {texts}")
    for i in range(SLOTS):
        _, alone = post(s, "/v1/completions", dict(body, n=1, seed=7 + i))
        c.check(alone["choices"][0]["text"] == texts[i], f"choice {i} against seed {7 + i} alone: "
                f"{alone['choices'][0]['text']!r} vs {texts[i]!r}")
    # the same request streamed: the same choices, framed per index
    status, raw = post(s, "/v1/completions", dict(body, stream=True, stream_options={"include_usage": True}))
    got, finishes, _, usages = stream_choices(c, raw, chat=False)
    c.check([got.get(i) for i in range(SLOTS)] == texts, f"streamed completions {got} vs {texts}")
    c.check(sorted(finishes) == [0, 1, 2], f"one finish per choice: {finishes}")
    c.check(len(usages) == 1 and usages[0]["completion_tokens"] == r["usage"]["completion_tokens"],
            f"one usage chunk summing the choices: {usages}")

    # greedy: every choice is the greedy text of one request
    greedy = {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": N_TOKENS, "temperature": 0}
    _, ref = post(s, "/v1/chat/completions", greedy)
    _, many = post(s, "/v1/chat/completions", dict(greedy, n=SLOTS))
    want = ref["choices"][0]["message"]["content"]
    c.check([x["message"]["content"] for x in many["choices"]] == [want] * SLOTS and
            [x["index"] for x in many["choices"]] == [0, 1, 2], f"greedy choices {many['choices']} vs {want!r}")
    c.check(many["usage"]["prompt_tokens"] == ref["usage"]["prompt_tokens"] and
            many["usage"]["completion_tokens"] == SLOTS * ref["usage"]["completion_tokens"],
            f"greedy usage {many['usage']} vs one {ref['usage']}")
    # a seeded chat, whole and streamed
    chat = dict(greedy, temperature=1, seed=11, n=SLOTS)
    _, whole = post(s, "/v1/chat/completions", chat)
    whole_texts = [x["message"]["content"] for x in whole["choices"]]
    status, raw = post(s, "/v1/chat/completions", dict(chat, stream=True, stream_options={"include_usage": True}))
    got, finishes, roles, usages = stream_choices(c, raw, chat=True)
    c.check([got.get(i) for i in range(SLOTS)] == whole_texts, f"streamed chat {got} vs whole {whole_texts}")
    c.check(roles == {0: 1, 1: 1, 2: 1}, f"one role delta per choice: {roles}")
    c.check(finishes == {i: x["finish_reason"] for i, x in enumerate(whole["choices"])},
            f"stream finishes {finishes} vs whole {whole['choices']}")
    c.check(len(usages) == 1 and usages[0]["completion_tokens"] == whole["usage"]["completion_tokens"],
            f"chat usage chunks {usages} vs {whole['usage']}")

    # llama-server's /completion: n_cmpl (or n) gives an array of its objects
    status, arr = post(s, "/completion", {"prompt": PROMPT, "n_predict": 4, "n_cmpl": 2, "temperature": 0})
    c.check(status == 200 and isinstance(arr, list) and [x["index"] for x in arr] == [0, 1] and
            arr[0]["content"] == arr[1]["content"], f"/completion n_cmpl=2: {status} {arr}")

    # the bounds
    for path, field, value in (("/v1/completions", "n", SLOTS + 1), ("/v1/chat/completions", "n", 0),
                               ("/completion", "n_cmpl", SLOTS + 1), ("/v1/completions", "n", 1.5)):
        req = {"prompt": PROMPT, "messages": greedy["messages"], "max_tokens": 2, field: value}
        status, err = post(s, path, req)
        c.check(status == 400 and err["error"]["param"] == field and f"'{field}'" in err["error"]["message"],
                f"{path} {field}={value}: {status} {err}")


def check_slots(c, s):
    status, _, raw = s.request("GET", "/slots")
    c.check(status == 401, f"/slots without the key: {status}")
    body = wait_slots(s, lambda busy: busy == 0)
    c.check(len(body) == SLOTS and [sl["id"] for sl in body] == list(range(SLOTS)),
            f"/slots: one object per slot: {body}")
    for sl in body:
        c.check(sl["n_ctx"] == 1024 and sl["is_processing"] is False and isinstance(sl["id_task"], int) and
                "params" not in sl, f"an idle slot: {sl}")
    # a long request: its slot is busy, with its parameters and progress
    conn = s.connect()
    conn.request("POST", "/v1/completions", body=json.dumps(
        {"prompt": PROMPT, "max_tokens": 400, "ignore_eos": True, "seed": 3, "temperature": 0.5, "top_k": 9}),
        headers=dict(AUTH, **{"Content-Type": "application/json"}))
    busy = wait_slots(s, lambda n: n == 1)
    running = [sl for sl in busy if sl["is_processing"]]
    ok = len(running) == 1
    if ok:
        p, nt = running[0]["params"], running[0]["next_token"]
        ok = (p["n_predict"] == 400 and p["seed"] == 3 and p["top_k"] == 9 and abs(p["temperature"] - 0.5) < 1e-6 and
              nt["has_next_token"] is True and nt["n_decoded"] + nt["n_remain"] == 400 and
              running[0]["id_task"] > 0)
    c.check(ok, f"a busy slot while a long request runs: {busy}")
    r = conn.getresponse()
    done = json.loads(r.read())
    conn.close()
    c.check(r.status == 200 and done["usage"]["completion_tokens"] == 400, f"the long request: {r.status}")
    after = wait_slots(s, lambda n: n == 0)
    c.check(all(not sl["is_processing"] for sl in after), f"idle after it: {after}")
    # a client that hangs up mid-stream frees every slot of its choices
    sock = socket.create_connection(("127.0.0.1", s.port), timeout=60)
    req = json.dumps({"prompt": PROMPT, "max_tokens": 1000, "ignore_eos": True, "n": SLOTS, "stream": True})
    sock.sendall((f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {KEY}\r\n"
                  f"Content-Type: application/json\r\nContent-Length: {len(req)}\r\n\r\n{req}").encode())
    seen = b""
    while seen.count(b"data: ") < 2 * SLOTS:
        chunk = sock.recv(4096)
        if not chunk:
            break
        seen += chunk
    full = wait_slots(s, lambda n: n == SLOTS, seconds=5)
    c.check(sum(1 for sl in full if sl["is_processing"]) == SLOTS, f"n=3 streaming holds 3 slots: {full}")
    sock.close()
    t0 = time.monotonic()
    freed = wait_slots(s, lambda n: n == 0, seconds=20)
    c.check(all(not sl["is_processing"] for sl in freed),
            f"a hung-up stream's choices are all cancelled: {freed} after {time.monotonic() - t0:.1f} s")
    status, _, _ = s.request("GET", "/slots?fail_on_no_slot=1", headers=AUTH)
    c.check(status == 200, f"fail_on_no_slot with idle slots: {status}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rlx", required=True)
    args = ap.parse_args()
    c = Checks()
    with Server(args.rlx, ["--api-key", KEY, "--parallel", str(SLOTS), "--slot-ctx", "1024", "--slots"]) as s:
        check_one_pass(c, s)
        check_whole(c, s)
        check_slots(c, s)
    c.check("ERROR" not in s.stderr, f"the server's stderr: {s.stderr[-3000:]}")
    with Server(args.rlx, ["--parallel", "1", "--slot-ctx", "256", "--no-slots"]) as s:
        status, _, raw = s.request("GET", "/slots")
        c.check(status == 501 and "--no-slots" in json.loads(raw)["error"]["message"], f"--no-slots: {status} {raw}")
    return c.report()


if __name__ == "__main__":
    main_guard(main)
