#!/usr/bin/python3
"""Tool calls and structured output of rlx serve on the shipped Brown model (its Qwen3 chat
template writes Hermes <tool_call> blocks), with Python's jsonschema as the judge of every
constrained reply:
  - tool_choice "required", a named function and parallel_tool_calls false give calls whose
    arguments validate against the function's schema, finish_reason "tool_calls"; the tools
    reach the prompt (more prompt tokens) and tool_choice "none" keeps them out of it
  - the same request streamed gives the same calls, its arguments over several deltas
  - "auto": a reply that writes a call (forced here by a grammar) is parsed into content and
    tool_calls, streamed or not; a block that is no call stays text
  - a tool call and its result fed back through the template
  - response_format json_schema / json_object, llama-server's json_schema and grammar on
    /completion and /v1/completions: replies the schema validates, or the grammar's words
  - the same constrained replies with a speculator (--spec draft) and two requests at once
  - Qwen3.5's XML call format, from a template that writes it (--chat-template-file)
  - rlx generate --json-schema (with and without a speculator, the same text) and --grammar
  - refusals: unsupported schema keywords (named), bad GBNF (line and column), two constraints,
    tool_choice without tools or naming an unknown function, a template without a call format

  check_tools.py --rlx BIN --workdir DIR
"""
import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time

import jsonschema

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from serve_util import BROWN, Checks, Server, main_guard, sse_events  # noqa: E402

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {
        "location": {"type": "string", "maxLength": 16},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["location", "unit"], "additionalProperties": False}}}
SEARCH = {"type": "function", "function": {
    "name": "search",
    "parameters": {"type": "object", "properties": {
        "query": {"type": "string", "maxLength": 24},
        "limit": {"type": "integer", "minimum": 1, "maximum": 10}},
        "required": ["query", "limit"], "additionalProperties": False}}}
TOOLS = [WEATHER, SEARCH]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]
PERSON = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 12},
    "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b"]}, "maxItems": 3}},
    "required": ["name", "age", "tags"], "additionalProperties": False}
# a minimal template in Qwen3.5's call format: it writes <tool_call> and <function=
XML_TEMPLATE = """{%- if tools %}<|im_start|>system
# Tools
{% for tool in tools %}{{ tool | tojson }}
{% endfor %}Call a tool as <tool_call>
<function=NAME>
<parameter=KEY>
VALUE
</parameter>
</function>
</tool_call><|im_end|>
{% endif %}{%- for m in messages %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endfor %}{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""


def lit(text):
    """text as a GBNF string literal."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def post(s, path, body):
    status, _, data = s.request("POST", path, body, timeout=300)
    try:
        return status, json.loads(data)
    except ValueError:
        return status, data


def chat(s, **extra):
    body = {"messages": MESSAGES, "max_tokens": 160, "temperature": 0}
    body.update(extra)
    return post(s, "/v1/chat/completions", body)


def stream_calls(body):
    """The content, calls (by index: id, name, arguments, how many argument deltas) and finish
    reason of a chat stream."""
    content, calls, finish = "", {}, None
    for e in sse_events(body):
        if e == "[DONE]":
            break
        obj = json.loads(e)
        if "error" in obj:
            raise ValueError(f"error event: {obj}")
        for ch in obj["choices"]:
            d = ch["delta"]
            content += d.get("content") or ""
            for tc in d.get("tool_calls") or []:
                call = calls.setdefault(tc["index"], {"id": None, "name": None, "arguments": "", "deltas": 0})
                if tc.get("id"):
                    call["id"] = tc["id"]
                fn = tc.get("function") or {}
                if fn.get("name"):
                    call["name"] = fn["name"]
                if fn.get("arguments"):
                    call["arguments"] += fn["arguments"]
                    call["deltas"] += 1
            finish = ch["finish_reason"] or finish
    return content, [calls[i] for i in sorted(calls)], finish


def valid_calls(c, what, calls, names=None):
    """Each call names a tool (of names) and its arguments validate against the tool's schema."""
    c.check(bool(calls), f"{what}: no tool calls")
    for call in calls:
        fn = call["function"] if "function" in call else call
        name = fn["name"]
        c.check(name in (names or SCHEMAS), f"{what}: call of {name!r}")
        try:
            args = json.loads(fn["arguments"])
            jsonschema.validate(args, SCHEMAS.get(name, {}))
        except (ValueError, jsonschema.ValidationError) as e:
            c.check(False, f"{what}: arguments {fn['arguments']!r} of {name}: {e}")
        if "id" in call:
            c.check(isinstance(call["id"], str) and call["id"].startswith("call_") and len(call["id"]) > 10,
                    f"{what}: call id {call['id']!r}")


def message(reply):
    return reply["choices"][0]["message"], reply["choices"][0]["finish_reason"]


def check_required(c, s, suffix="", full=True):
    """tool_choice required (and, when full, named, parallel and streamed). Returns the calls and
    the reply's usage (check_prompt_sizes compares its prompt with one without tools)."""
    status, r = chat(s, tools=TOOLS, tool_choice="required", parallel_tool_calls=False)
    c.check(status == 200, f"required{suffix}: {status} {r}")
    if status != 200:
        return None, None
    msg, finish = message(r)
    c.check(finish == "tool_calls" and msg["content"] is None and len(msg.get("tool_calls") or []) == 1,
            f"required{suffix}: {finish} {msg}")
    valid_calls(c, f"required{suffix}", msg.get("tool_calls") or [])
    if not full:
        return msg.get("tool_calls"), r["usage"]
    # parallel calls: as many as the model writes (this one goes on to max_tokens); only whole ones count
    status, rp = chat(s, tools=TOOLS, tool_choice="required", max_tokens=130)
    if status == 200:
        msgp, finishp = message(rp)
        c.check(finishp in ("tool_calls", "length") and msgp["content"] is None, f"parallel{suffix}: {finishp} {msgp}")
        valid_calls(c, f"parallel{suffix}", msgp.get("tool_calls") or [])
    else:
        c.check(False, f"parallel{suffix}: {status} {rp}")
    status, r1 = chat(s, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "search"}},
                      parallel_tool_calls=False)
    c.check(status == 200, f"named{suffix}: {status} {r1}")
    if status == 200:
        msg1, finish1 = message(r1)
        calls1 = msg1.get("tool_calls") or []
        c.check(finish1 == "tool_calls" and len(calls1) == 1, f"named, single{suffix}: {finish1} {msg1}")
        valid_calls(c, f"named{suffix}", calls1, names={"search"})
    status, _, body = s.request("POST", "/v1/chat/completions",
                                {"messages": MESSAGES, "max_tokens": 160, "temperature": 0, "tools": TOOLS,
                                 "tool_choice": "required", "parallel_tool_calls": False, "stream": True},
                                timeout=300)
    c.check(status == 200, f"required, streamed{suffix}: {status}")
    if status == 200:
        content, calls, finish = stream_calls(body)
        whole = [(t["function"]["name"], t["function"]["arguments"]) for t in msg["tool_calls"]]
        c.check([(t["name"], t["arguments"]) for t in calls] == whole and content == "" and finish == "tool_calls",
                f"required, streamed{suffix}: {content!r} {calls} {finish} against {whole}")
        c.check(any(t["deltas"] > 1 for t in calls), f"required, streamed{suffix}: arguments came whole: {calls}")
        c.check(all(t["id"] and t["id"].startswith("call_") for t in calls), f"streamed ids{suffix}: {calls}")
    return msg.get("tool_calls"), r["usage"]


def check_auto(c, s):
    forced = ('root ::= "Let me check.\\n<tool_call>\\n{\\"name\\": \\"get_weather\\", \\"arguments\\": '
              '{\\"location\\": \\"Paris\\", \\"unit\\": \\"celsius\\"}}\\n</tool_call>"')
    want = [("get_weather", {"location": "Paris", "unit": "celsius"})]
    status, r = chat(s, tools=TOOLS, grammar=forced)
    c.check(status == 200, f"auto: {status} {r}")
    if status == 200:
        msg, finish = message(r)
        got = [(t["function"]["name"], json.loads(t["function"]["arguments"])) for t in msg.get("tool_calls") or []]
        c.check(msg["content"] == "Let me check." and got == want and finish == "tool_calls",
                f"auto: {msg} {finish}")
    status, _, body = s.request("POST", "/v1/chat/completions",
                                {"messages": MESSAGES, "max_tokens": 160, "temperature": 0, "tools": TOOLS,
                                 "grammar": forced, "stream": True}, timeout=300)
    if status == 200:
        content, calls, finish = stream_calls(body)
        got = [(t["name"], json.loads(t["arguments"])) for t in calls]
        c.check(content == "Let me check." and got == want and finish == "tool_calls",
                f"auto, streamed: {content!r} {calls} {finish}")
    else:
        c.check(False, f"auto, streamed: {status}")
    # a thinking model's block goes to reasoning_content (llama-server's default, auto), before the calls
    thought = "root ::= " + lit("<think>\nI should look it up.\n</think>\n\n<tool_call>\n" +
                                json.dumps({"name": "search", "arguments": {"query": "Paris", "limit": 2}}) +
                                "\n</tool_call>")
    status, r = chat(s, tools=TOOLS, grammar=thought)
    msg = message(r)[0] if status == 200 else {}
    c.check(msg.get("reasoning_content") == "I should look it up." and msg.get("content") is None
            and [t["function"]["name"] for t in msg.get("tool_calls") or []] == ["search"],
            f"reasoning and a call: {status} {r}")
    # a block that is no call is the reply's text, and no call
    status, r = chat(s, tools=TOOLS, grammar='root ::= "<tool_call>\\nnot json\\n</tool_call>"')
    if status == 200:
        msg, finish = message(r)
        c.check(not msg.get("tool_calls") and "not json" in msg["content"] and finish == "stop",
                f"auto, no call: {msg} {finish}")
    else:
        c.check(False, f"auto, no call: {status} {r}")


def check_reasoning(c, s):
    """A thinking block without tools: reasoning_content in a stream, left in the text by
    reasoning_format none."""
    words = "root ::= " + lit("<think>\nHm.\n</think>\n\nIt is sunny.")
    status, _, body = s.request("POST", "/v1/chat/completions",
                                {"messages": MESSAGES, "max_tokens": 40, "temperature": 0, "grammar": words,
                                 "stream": True}, timeout=300)
    reasoning = "".join(json.loads(e)["choices"][0]["delta"].get("reasoning_content") or ""
                        for e in sse_events(body)[:-1] if json.loads(e)["choices"]) if status == 200 else None
    content = stream_calls(body)[0] if status == 200 else None
    c.check(reasoning == "Hm." and content == "It is sunny.", f"reasoning, streamed: {reasoning!r} {content!r}")
    status, r = chat(s, grammar=words, reasoning_format="none")
    c.check(status == 200 and message(r)[0]["content"] == "<think>\nHm.\n</think>\n\nIt is sunny."
            and "reasoning_content" not in message(r)[0], f"reasoning_format none: {status} {r}")


def check_prompt_sizes(c, s, required_usage):
    """The tools reach the prompt of a tool_choice required request (required_usage, from
    check_required) and tool_choice none keeps them out of it: prompt sizes against a chat
    without tools."""
    status, plain = chat(s, max_tokens=1)
    c.check(status == 200 and required_usage is not None and
            required_usage["prompt_tokens"] > plain["usage"]["prompt_tokens"] + 40,
            f"required: the tools did not reach the prompt ({required_usage} against {plain})")
    status, r = chat(s, tools=TOOLS, tool_choice="none", max_tokens=1)
    c.check(status == 200 and plain.get("usage") and r["usage"]["prompt_tokens"] == plain["usage"]["prompt_tokens"]
            and "tool_calls" not in r["choices"][0]["message"], f"tool_choice none: {r} against {plain}")


def check_round_trip(c, s, calls):
    """A call and its result fed back: the template renders both after the user's turn."""
    history = MESSAGES + [{"role": "assistant", "content": None, "tool_calls": calls},
                          {"role": "tool", "tool_call_id": calls[0]["id"], "content": "18 degrees and sunny"}]
    status, r = post(s, "/apply-template", {"messages": history, "tools": TOOLS})
    tail = r.get("prompt", "").split(MESSAGES[0]["content"])[-1] if status == 200 else ""
    c.check("<tool_call>" in tail and calls[0]["function"]["name"] in tail and "18 degrees and sunny" in tail,
            f"tool round trip: {status} {r}")


def check_structured(c, s):
    status, r = chat(s, response_format={"type": "json_schema",
                                         "json_schema": {"name": "person", "strict": True, "schema": PERSON}})
    c.check(status == 200, f"json_schema: {status} {r}")
    if status == 200:
        text = r["choices"][0]["message"]["content"]
        try:
            jsonschema.validate(json.loads(text), PERSON)
            c.check(r["choices"][0]["finish_reason"] == "stop", f"json_schema: finish {r['choices'][0]}")
        except (ValueError, jsonschema.ValidationError) as e:
            c.check(False, f"json_schema: {text!r}: {e}")
    status, r = chat(s, response_format={"type": "json_object"}, max_tokens=60)
    if status == 200:
        text = r["choices"][0]["message"]["content"]
        try:
            c.check(isinstance(json.loads(text), dict), f"json_object: {text!r}")
        except ValueError as e:
            c.check(r["choices"][0]["finish_reason"] == "length", f"json_object: {text!r}: {e}")
    else:
        c.check(False, f"json_object: {status} {r}")
    status, r = post(s, "/completion", {"prompt": "The answer is", "n_predict": 64, "temperature": 0,
                                        "json_schema": PERSON})
    if status == 200:
        try:
            jsonschema.validate(json.loads(r["content"]), PERSON)
        except (ValueError, jsonschema.ValidationError) as e:
            c.check(False, f"/completion json_schema: {r['content']!r}: {e}")
    else:
        c.check(False, f"/completion json_schema: {status} {r}")
    for path, field in (("/completion", "content"), ("/v1/completions", None)):
        status, r = post(s, path, {"prompt": "Is it", "max_tokens": 8, "temperature": 0.9, "seed": 3,
                                   "grammar": 'root ::= ("yes" | "no") " " [0-9]{2}'})
        text = (r[field] if field else r["choices"][0]["text"]) if status == 200 else None
        c.check(status == 200 and text is not None and text[:3] in ("yes", "no ") and text[-2:].isdigit()
                and len(text) in (5, 6), f"{path} grammar: {status} {r}")


def check_refusals(c, s):
    cases = [
        ("unsupported keyword", {"response_format": {"type": "json_schema", "json_schema": {
            "name": "x", "schema": {"type": "array", "uniqueItems": True}}}}, "uniqueItems"),
        ("bad GBNF", {"grammar": 'root ::= "a"\nx ::= (\n'}, "line 2"),
        ("undefined rule", {"grammar": "root ::= thing"}, "thing"),
        ("two constraints", {"grammar": 'root ::= "a"', "response_format": {"type": "json_object"}}, "grammar"),
        ("tool_choice without tools", {"tool_choice": "required"}, "tool_choice"),
        ("unknown function", {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
         "tool_choice"),
        ("bad tools", {"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools"),
        ("tools and json_schema", {"tools": TOOLS, "tool_choice": "required", "json_schema": PERSON}, "tool_choice"),
        ("bad response_format", {"response_format": {"type": "yaml"}}, "response_format"),
    ]
    for name, extra, needle in cases:
        status, r = chat(s, **extra)
        err = r.get("error", {}) if isinstance(r, dict) else {}
        c.check(status == 400 and needle in (err.get("message", "") + " " + str(err.get("param"))),
                f"{name}: {status} {r}")
    status, _, _ = s.request("GET", "/health")
    c.check(status == 200, "the server serves on after the refusals")


def requests_running(s):
    status, _, body = s.request("GET", "/metrics")
    m = re.search(r"^rlx_requests_running (\d+)$", body.decode(), re.M) if status == 200 else None
    if not m:
        raise RuntimeError(f"/metrics: {status} without rlx_requests_running: {body[:300]!r}")
    return int(m.group(1))


def check_concurrent(c, s):
    """Two requests at once, each with its own grammar: each reply its own grammar's. The tools
    request holds its slot before the other is sent, so it reuses the slot whose cache holds the
    tools prompt (over 500 tokens, many seconds of prefill under the sanitizers) while the other
    takes the free slot; sent the other way round, the request without tools would take that
    slot, its first token being the same."""
    out = {}

    def run(key, extra):
        out[key] = chat(s, **extra)
    tools = threading.Thread(target=run, args=("tools", {"tools": TOOLS, "tool_choice": "required",
                                                         "parallel_tool_calls": False}))
    json_ = threading.Thread(target=run, args=("json", {"response_format": {
        "type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}}}))
    tools.start()
    deadline = time.monotonic() + 300
    while tools.is_alive() and requests_running(s) == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    json_.start()
    tools.join()
    json_.join()
    status, r = out["tools"]
    c.check(status == 200, f"concurrent tools: {status} {r}")
    if status == 200:
        valid_calls(c, "concurrent tools", r["choices"][0]["message"].get("tool_calls") or [])
    status, r = out["json"]
    try:
        jsonschema.validate(json.loads(r["choices"][0]["message"]["content"]), PERSON)
    except (ValueError, KeyError, TypeError, jsonschema.ValidationError) as e:
        c.check(False, f"concurrent json: {status} {r}: {e}")


def check_generate(c, rlx):
    """rlx generate's --json-schema, --grammar and their refusals; with a speculator, the same text."""
    def run(extra):
        return subprocess.run([rlx, "generate", "-m", BROWN, "-t", "1", "-p", "My record:", "-n", "120", "--json"]
                              + extra, capture_output=True, text=True, timeout=300)
    base = None
    for extra in ([], ["--spec", "draft", "--draft-model", os.path.join(os.path.dirname(BROWN), "draft")]):
        p = run(["--greedy", "--json-schema", json.dumps(PERSON)] + extra)
        try:
            out = json.loads(p.stdout)
            jsonschema.validate(json.loads(out["text"]), PERSON)
            c.check(out["stopped_by"] == "eos", f"generate --json-schema {extra}: {out}")
            c.check(base is None or out["text"] == base, f"generate --json-schema {extra}: {out['text']!r} != {base!r}")
            base = base or out["text"]
        except (ValueError, KeyError, jsonschema.ValidationError) as e:
            c.check(False, f"generate --json-schema {extra}: {p.returncode} {p.stdout[-300:]} {p.stderr[-300:]}: {e}")
    p = run(["--temp", "1.5", "--seed", "9", "--grammar", 'root ::= ("cat" | "dog") "s"?'])
    text = json.loads(p.stdout)["text"] if p.returncode == 0 else None
    c.check(text in ("cat", "cats", "dog", "dogs"), f"generate --grammar: {p.returncode} {text!r} {p.stderr[-300:]}")
    for extra, needle in ((["--json-schema", '{"type": "string", "format": "hostname"}'], "format"),
                          (["--grammar", "root ::= [b-a]"], "column"),
                          (["--grammar", 'root ::= "a"', "--json-schema", "{}"], "one of")):
        p = run(extra)
        c.check(p.returncode != 0 and needle in p.stderr, f"generate {extra}: {p.returncode} {p.stderr[-300:]!r}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rlx", required=True)
    ap.add_argument("--workdir", required=True)
    args = ap.parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    c = Checks()
    check_generate(c, args.rlx)
    # The requests with tools come first, one after another, then the others: a free slot is
    # picked by the longest prefix its cache holds, so the tools prompt is computed once, not
    # again after each request without tools (whose prompt shares its first token) took its slot.
    with Server(args.rlx, ["--parallel", "2", "--slot-ctx", "1024"]) as s:
        calls, usage = check_required(c, s)
        check_auto(c, s)
        check_concurrent(c, s)
        check_prompt_sizes(c, s, usage)
        check_reasoning(c, s)
        if calls:
            check_round_trip(c, s, calls)
        check_structured(c, s)
        check_refusals(c, s)
    # a speculator proposes freely; the target's grammar decides: the same calls as without it
    spec = ["--spec", "draft", "--draft-model", os.path.join(os.path.dirname(BROWN), "draft")]
    with Server(args.rlx, spec + ["--slot-ctx", "1024"]) as s:
        spec_calls, _ = check_required(c, s, " (--spec draft)", full=False)
        c.check(spec_calls is not None and calls is not None and
                [t["function"] for t in spec_calls] == [t["function"] for t in calls],
                f"--spec draft: {spec_calls} against {calls}")
    template = os.path.join(args.workdir, "xml_template.jinja")
    with open(template, "w") as f:
        f.write(XML_TEMPLATE)
    with Server(args.rlx, ["--chat-template-file", template, "--slot-ctx", "1024"]) as s:
        status, r = chat(s, tools=TOOLS, tool_choice="required", parallel_tool_calls=False)
        c.check(status == 200, f"XML calls: {status} {r}")
        if status == 200:
            msg, finish = message(r)
            c.check(finish == "tool_calls", f"XML calls: {finish} {msg}")
            valid_calls(c, "XML calls", msg.get("tool_calls") or [])
        for name, params in (("a required name not among the properties",
                              {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["b"]}),
                             ("parameters that are no object", {"type": "array"})):
            bad = [{"type": "function", "function": {"name": "f", "parameters": params}}]
            status, r = chat(s, tools=bad, tool_choice="required")
            c.check(status == 400 and r["error"]["param"] == "tools", f"XML calls, {name}: {status} {r}")
        forced = ('root ::= "<tool_call>\\n<function=search>\\n<parameter=query>\\nrain in\\nParis\\n</parameter>\\n'
                  '<parameter=limit>\\n3\\n</parameter>\\n</function>\\n</tool_call>"')
        status, r = chat(s, tools=TOOLS, grammar=forced)
        got = message(r)[0].get("tool_calls") if status == 200 else None
        c.check(got and got[0]["function"]["name"] == "search" and
                json.loads(got[0]["function"]["arguments"]) == {"query": "rain in\nParis", "limit": 3},
                f"XML auto: {status} {r}")
    with Server(args.rlx, ["--chat-template", "{% for m in messages %}{{ m.content }}{% endfor %}"]) as s:
        status, r = chat(s, tools=TOOLS)
        c.check(status == 400 and "tool-call format" in r.get("error", {}).get("message", ""),
                f"a template without a call format: {status} {r}")
        status, r = chat(s, tools=TOOLS, tool_choice="none", max_tokens=2)
        c.check(status == 200, f"a template without a call format, tool_choice none: {status} {r}")
    return c.report()


if __name__ == "__main__":
    main_guard(main)
