#!/usr/bin/python3
"""Anthropic's official npm client (@anthropic-ai/sdk, fetched from the npm registry into the
build tree, once) against rlx serve's /v1/messages with an API key (sent as x-api-key):
a message and a streamed one give `rlx generate --chat`'s greedy text and token counts, with
stop_reason max_tokens; the stream has Anthropic's events in order; a stop sequence ends the
text before it with stop_reason stop_sequence and names it; count_tokens counts the prompt as
generate does; tools with tool_choice any give a tool_use block whose input the input_schema
validates (Python's jsonschema), the same whole and through the SDK's stream accumulation, with
stop_reason tool_use, and a tool_use / tool_result history reaches the prompt; a bad temperature
surfaces as the client's 400 invalid_request_error.

  check_anthropic.py --rlx BIN --npm DIR
"""
import argparse
import json
import os
import subprocess
import sys

import jsonschema

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from serve_util import npm_client, Checks, Server, generate, main_guard  # noqa: E402

SDK = "@anthropic-ai/sdk@1.17.0"
KEY = "sk-ant-test"
PROMPT = "The President said that"
N = 10
EVENTS = ["message_start", "content_block_start", "content_block_delta", "content_block_stop", "message_delta",
          "message_stop"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rlx", required=True)
    ap.add_argument("--npm", required=True, help="folder to install the SDK into")
    args = ap.parse_args()
    missing = npm_client(args.npm, SDK, "the Anthropic SDK")
    if missing is not None:
        return missing
    c = Checks()
    ref = generate(args.rlx, ["--chat", "-p", PROMPT, "-n", str(N)])
    longer = generate(args.rlx, ["--chat", "-p", PROMPT, "-n", "64"])
    stop = longer["text"][4:8]
    with Server(args.rlx, ["--api-key", KEY, "--parallel", "2", "--slot-ctx", "1024"]) as s:
        p = subprocess.run(["node", os.path.join(HERE, "anthropic_client.js"), args.npm, s.url(), KEY, PROMPT, str(N),
                            stop], capture_output=True, text=True, timeout=300)
        c.check(p.returncode == 0, f"the Anthropic client failed: {p.stderr[-2000:]}")
        if p.returncode != 0:
            return c.report()
        out = json.loads(p.stdout)
        want_usage = {"input_tokens": ref["n_prompt"], "output_tokens": ref["n_generated"]}
        for name in ("message", "stream"):
            got = out[name]
            usage = {k: got["usage"][k] for k in want_usage}
            c.check(got["text"] == ref["text"] and got["stop_reason"] == "max_tokens" and usage == want_usage,
                    f"{name}: {got} against rlx generate --chat {ref['text']!r}, usage {want_usage}")
        seen = [e for e in out["stream"]["events"] if e != "ping"]
        order = [e for i, e in enumerate(seen) if i == 0 or e != seen[i - 1]]
        c.check(order == EVENTS, f"the stream's events: {out['stream']['events']}")
        st = out["stopped"]
        c.check(st["stop_reason"] == "stop_sequence" and st["stop_sequence"] == stop and
                longer["text"].startswith(st["text"] + stop), f"stop sequence {stop!r}: {st}, generate "
                                                                 f"{longer['text']!r}")
        c.check(out["count"] == ref["n_prompt"], f"count_tokens {out['count']}, generate ran {ref['n_prompt']}")
        for name in ("tools", "tools_stream"):
            got = out[name]
            ok = got["stop_reason"] == "tool_use" and len(got["uses"]) == 1
            for use in got["uses"]:
                try:
                    jsonschema.validate(use["input"], out["tools"]["schema"])
                except jsonschema.ValidationError:
                    ok = False
                ok = ok and use["name"] == "get_weather" and use["id"].startswith("toolu_")
            c.check(ok, f"{name}: {got}")
        c.check([(u["name"], u["input"]) for u in out["tools"]["uses"]] ==
                [(u["name"], u["input"]) for u in out["tools_stream"]["uses"]],
                f"the stream's tool_use differs: {out['tools_stream']} against {out['tools']}")
        c.check(out["count_with_result"] > out["count_with_tools"] + 5,
                f"tool_use and tool_result did not reach the prompt: {out['count_with_result']} against "
                f"{out['count_with_tools']}")
        e = out["error"]
        c.check(e is not None and e["status"] == 400 and e["type"] == "invalid_request_error" and
                "temperature" in e["message"], f"a bad temperature through the client: {e}")
    c.check(s.proc.returncode == 0, f"exit status {s.proc.returncode}: {s.stderr[-500:]}")
    return c.report()


if __name__ == "__main__":
    main_guard(main)
