#!/usr/bin/python3
"""OpenAI's Responses API (POST /v1/responses) through the official `openai` npm client (the
one serve_openai fetches into the build tree) against rlx serve with an API key, greedy:
- text: the output_text is /v1/chat/completions' content for the same prompt, with its prompt
  tokens; cut by max_output_tokens it is status incomplete with reason max_output_tokens;
- streaming: the events come in the Responses API's order with sequence_number 0, 1, 2, ...,
  every item event names the message's id, the deltas concatenate to the whole text, and the
  client's stream helper assembles the same response;
- tools (flat function definitions) with tool_choice required, streamed or not: one function_call
  item whose arguments parse and validate against the function's schema (Python's
  jsonschema), the streamed arguments' deltas concatenating to them; the call and its
  function_call_output fed back reach the prompt as the same messages through chat completions do;
- text.format json_schema: the output_text parses and validates; reasoning.effort none renders
  the prompt chat's enable_thinking false does (longer: the template's empty think block);
- refusals as the client's 400s naming the field: input of the wrong type, store true,
  previous_response_id, a hosted tool type, an unknown field, an image part, a named tool_choice of
  a function not among the tools (a valid one is accepted);
- a client that hangs up mid-stream frees its slot (GET /slots).

  check_responses.py --rlx BIN --npm DIR
"""
import argparse
import json
import os
import socket
import subprocess
import sys
import time

import jsonschema

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from serve_util import npm_client, Checks, Server, main_guard  # noqa: E402

OPENAI = "openai@6.30.1"  # serve_openai's: both tests share the fetched package
KEY = "sk-responses-test"
PROMPT = "The President said that"
N = 10
TEXT_EVENTS = ["response.created", "response.in_progress", "response.output_item.added",
               "response.content_part.added", "response.output_text.delta", "response.output_text.done",
               "response.content_part.done", "response.output_item.done", "response.incomplete"]
CALL_EVENTS = ["response.created", "response.in_progress", "response.output_item.added",
               "response.function_call_arguments.delta", "response.function_call_arguments.done",
               "response.output_item.done", "response.completed"]


def collapsed(events):
    types = [e["type"] for e in events]
    return [t for i, t in enumerate(types) if i == 0 or t != types[i - 1]]


def valid(args, schema):
    try:
        jsonschema.validate(json.loads(args), schema)
        return True
    except (ValueError, jsonschema.ValidationError):
        return False


def check_text(c, out):
    text, chat = out["text"], out["chat"]
    c.check(text["id"].startswith("resp_") and text["object"] == "response", f"the response's id/object: {text}")
    c.check(text["output_text"] == chat["text"] and len(text["output"]) == 1 and
            text["output"][0]["type"] == "message" and text["output"][0]["id"].startswith("msg_"),
            f"text {text} against chat completions' {chat['text']!r}")
    c.check(text["status"] == "incomplete" and text["incomplete"] == {"reason": "max_output_tokens"} and
            text["output"][0]["status"] == "incomplete", f"cut by max_output_tokens: {text}")
    u = text["usage"]
    c.check(u["input_tokens"] == chat["usage"]["prompt_tokens"] and u["output_tokens"] == N and
            u["total_tokens"] == u["input_tokens"] + N, f"usage {u} against chat's {chat['usage']}")


def check_stream(c, out):
    ev = out["events"]
    c.check([e["sequence_number"] for e in ev] == list(range(len(ev))), f"sequence numbers: {ev}")
    c.check(collapsed(ev) == TEXT_EVENTS, f"the stream's events: {collapsed(ev)}")
    msg = next((e["item"]["id"] for e in ev if e["type"] == "response.output_item.added"), None)
    c.check(all(e.get("item_id", msg) == msg for e in ev), f"events of another item than {msg}: {ev}")
    deltas = "".join(e["delta"] for e in ev if e["type"] == "response.output_text.delta")
    done = next((e["text"] for e in ev if e["type"] == "response.output_text.done"), None)
    final = ev[-1]["response"]
    c.check(deltas == out["text"]["output_text"] and done == deltas and
            final["output"][0]["content"][0]["text"] == deltas and final["usage"]["output_tokens"] == N,
            f"the deltas {deltas!r}, done {done!r}, final {final} against {out['text']['output_text']!r}")
    no_think = out["no_think"]["input_tokens"]
    c.check(no_think == out["no_think_chat"]["prompt_tokens"] and no_think > out["text"]["usage"]["input_tokens"],
            f"reasoning effort none: {no_think} prompt tokens, chat without thinking {out['no_think_chat']}, "
            f"with it {out['text']['usage']['input_tokens']}")
    # the helper takes its final response from response.completed alone (an incomplete one is its
    # accumulated snapshot, without output_text)
    c.check([o.get("text") for o in out["helper"]["output"]] == [out["text"]["output_text"]],
            f"the stream helper: {out['helper']} against {out['text']}")


def check_tools(c, out):
    schema = out["tool_schema"]
    r = out["tools"]
    calls = [o for o in r["output"] if o["type"] == "function_call"]
    c.check(r["status"] == "completed" and len(calls) == 1 and calls[0]["name"] == "get_weather" and
            calls[0]["call_id"].startswith("call_") and calls[0]["id"].startswith("fc_") and
            calls[0]["status"] == "completed" and valid(calls[0]["arguments"], schema), f"tools: {r}")
    named = out["named"]
    c.check(named["status"] == "incomplete" and named["usage"]["input_tokens"] == r["usage"]["input_tokens"],
            f"a named tool_choice: {named}")
    ev = out["tools_events"]
    c.check([e["sequence_number"] for e in ev] == list(range(len(ev))) and collapsed(ev) == CALL_EVENTS,
            f"the tool stream's events: {collapsed(ev)}")
    deltas = "".join(e["delta"] for e in ev if e["type"] == "response.function_call_arguments.delta")
    done = next((e for e in ev if e["type"] == "response.function_call_arguments.done"), {})
    final = [o for o in ev[-1]["response"]["output"] if o["type"] == "function_call"]
    whole = [o for o in out["tools"]["output"] if o["type"] == "function_call"]
    c.check(len(final) == 1 and deltas == done.get("arguments") == final[0]["arguments"] and
            valid(deltas, schema) and whole and final[0]["arguments"] == whole[0]["arguments"],
            f"streamed arguments {deltas!r}, done {done}, final {final} against {whole}")
    fed, fed_chat = out["fed"], out["fed_chat"]
    c.check(fed["usage"]["input_tokens"] == fed_chat["usage"]["prompt_tokens"] and
            fed["usage"]["input_tokens"] > out["tools"]["usage"]["input_tokens"] and
            fed["output_text"] == fed_chat["text"],
            f"a function_call_output fed back: {fed} against chat completions' {fed_chat}")


def check_errors(c, out):
    want = {"input": "input", "store": "store", "previous": "previous_response_id", "tool_type": "web_search",
            "unknown": "frequency_penalty", "content": "input_image", "named": "tool_choice"}
    for name, word in want.items():
        e = out["errors"][name]
        c.check(e is not None and e["status"] == 400 and e["name"] == "BadRequestError" and word in e["message"],
                f"refusal {name}: {e}")


def busy_slots(s):
    status, _, raw = s.request("GET", "/slots", headers={"Authorization": f"Bearer {KEY}"})
    return sum(1 for sl in json.loads(raw) if sl["is_processing"]) if status == 200 else -1


def check_hangup(c, s):
    """A stream whose client goes away mid-reply: its slot is free again."""
    body = json.dumps({"input": PROMPT, "max_output_tokens": 900, "temperature": 0, "stream": True}).encode()
    sock = socket.create_connection(("127.0.0.1", s.port), timeout=120)
    sock.sendall(b"POST /v1/responses HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 b"Authorization: Bearer " + KEY.encode() + b"\r\nContent-Length: " + str(len(body)).encode() +
                 b"\r\n\r\n" + body)
    got = b""
    while b"response.output_text.delta" not in got:
        chunk = sock.recv(65536)
        if not chunk:
            break
        got += chunk
    busy = busy_slots(s)
    sock.close()
    deadline = time.monotonic() + 60
    while busy_slots(s) != 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    c.check(busy == 1 and busy_slots(s) == 0, f"a hung-up stream: {busy} busy while it ran, {busy_slots(s)} after")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rlx", required=True)
    ap.add_argument("--npm", required=True, help="folder to install the openai package into")
    args = ap.parse_args()
    missing = npm_client(args.npm, OPENAI, "the openai npm client")
    if missing is not None:
        return missing
    c = Checks()
    with Server(args.rlx, ["--api-key", KEY, "--parallel", "2", "--slot-ctx", "1024", "--slots"]) as s:
        p = subprocess.run(["node", os.path.join(HERE, "responses_client.js"), args.npm, s.url() + "/v1", KEY, PROMPT,
                            str(N)], capture_output=True, text=True, timeout=300)
        c.check(p.returncode == 0, f"the openai client failed: {p.stderr[-2000:]}")
        if p.returncode != 0:
            return c.report()
        out = json.loads(p.stdout)
        check_text(c, out)
        check_stream(c, out)
        check_tools(c, out)
        r = out["json"]
        try:
            jsonschema.validate(json.loads(r["output_text"]), r["schema"])
        except (ValueError, jsonschema.ValidationError) as ex:
            c.check(False, f"text.format json_schema: {r}: {ex}")
        check_errors(c, out)
        check_hangup(c, s)
    c.check(s.proc.returncode == 0, f"exit status {s.proc.returncode}: {s.stderr[-500:]}")
    return c.report()


if __name__ == "__main__":
    main_guard(main)
