#!/usr/bin/python3
"""The official `openai` npm client (fetched from the npm registry into the build tree, once)
against rlx serve with an API key: models.list and models.retrieve name the model; chat and
completions, streamed and not, give `rlx generate`'s greedy text, finish reasons and usage; n=2
gives two choices indexed 0 and 1, each that text; tool
calls (tool_choice required) whole and assembled by the client's stream helper are the same calls,
their arguments valid for the function's schema (Python's jsonschema); the client's parse() reads a
json_schema reply that validates; a bad field surfaces as the client's 400 error.
Skips (status 77) when node or npm is missing, saying which; under CI=true that is a failure.

  check_openai.py --rlx BIN --npm DIR
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

OPENAI = "openai@6.30.1"  # the last major that runs on Debian 12's and the image's Node 20
KEY = "sk-npm-test"
PROMPT = "The President said that"
N = 10


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rlx", required=True)
    ap.add_argument("--npm", required=True, help="folder to install the openai package into")
    args = ap.parse_args()
    missing = npm_client(args.npm, OPENAI, "the openai npm client")
    if missing is not None:
        return missing
    c = Checks()
    ref = generate(args.rlx, ["-p", PROMPT, "-n", str(N)])
    ref_chat = generate(args.rlx, ["--chat", "-p", PROMPT, "-n", str(N)])
    with Server(args.rlx, ["--api-key", KEY, "--parallel", "2", "--slot-ctx", "1024"]) as s:
        p = subprocess.run(["node", os.path.join(HERE, "openai_client.js"), args.npm, s.url() + "/v1", KEY, PROMPT,
                            str(N)], capture_output=True, text=True, timeout=300)
        c.check(p.returncode == 0, f"the openai client failed: {p.stderr[-2000:]}")
        if p.returncode != 0:
            return c.report()
        out = json.loads(p.stdout)
        c.check(out["models"] == ["target"], f"models.list: {out['models']}")
        c.check(out["retrieved"] == "target", f"models.retrieve('target'): {out['retrieved']}")
        want_usage = {"prompt_tokens": ref_chat["n_prompt"], "completion_tokens": ref_chat["n_generated"],
                      "total_tokens": ref_chat["n_prompt"] + ref_chat["n_generated"]}
        for name in ("chat", "chat_stream"):
            got = out[name]
            usage = {k: got["usage"][k] for k in want_usage} if got["usage"] else None
            c.check(got["text"] == ref_chat["text"] and got["finish"] == "length" and usage == want_usage,
                    f"{name}: {got} against rlx generate --chat {ref_chat['text']!r}, usage {want_usage}")
        c.check(out["chat_stream"]["role"] == "assistant", f"the stream's role: {out['chat_stream']}")
        two = out["chat_n"]
        c.check(two["indices"] == [0, 1] and two["texts"] == [ref_chat["text"]] * 2 and
                two["usage"]["prompt_tokens"] == ref_chat["n_prompt"] and
                two["usage"]["completion_tokens"] == 2 * ref_chat["n_generated"],
                f"n=2: two choices indexed 0 and 1, each the greedy text, the prompt counted once: {two}")
        for name in ("completion", "completion_stream"):
            got = out[name]
            c.check(got["text"] == ref["text"] and got["finish"] == "length",
                    f"{name}: {got} against rlx generate {ref['text']!r}")
        c.check(out["completion"]["usage"]["completion_tokens"] == ref["n_generated"],
                f"completion usage {out['completion']['usage']}")
        for name in ("tools", "tools_stream"):
            got = out[name]
            ok = got["finish"] == "tool_calls" and len(got["calls"]) >= 1
            for call in got["calls"]:
                try:
                    jsonschema.validate(json.loads(call["arguments"]), out["tool_schema"])
                except (ValueError, jsonschema.ValidationError):
                    ok = False
                ok = ok and call["name"] == "get_weather" and call["type"] == "function" and call["id"].startswith("call_")
            c.check(ok, f"{name}: {got}")
        strip = [{k: v for k, v in t.items() if k != "id"} for t in out["tools"]["calls"]]
        c.check(strip == [{k: v for k, v in t.items() if k != "id"} for t in out["tools_stream"]["calls"]],
                f"the stream helper's calls differ: {out['tools_stream']} against {out['tools']}")
        try:
            jsonschema.validate(out["parsed"]["value"], out["parsed"]["schema"])
        except jsonschema.ValidationError as ex:
            c.check(False, f"parse() with a json_schema: {out['parsed']}: {ex}")
        e = out["error"]
        c.check(e is not None and e["status"] == 400 and e["name"] == "BadRequestError" and "temperature" in e["message"],
                f"a bad temperature through the client: {e}")
    c.check(s.proc.returncode == 0, f"exit status {s.proc.returncode}: {s.stderr[-500:]}")
    return c.report()


if __name__ == "__main__":
    main_guard(main)
