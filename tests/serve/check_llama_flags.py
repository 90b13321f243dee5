#!/usr/bin/python3
"""`rlx serve` started as llama.cpp's server tests start llama-server (tools/server/tests/utils.py:
--temp, --seed, --no-slots, --jinja, -n, -np, -fa, ...), on the Brown model:
  - it starts, and the flags mean what they mean to llama-server: --n-predict is the max_tokens of
    requests that give none (chat and completions); --temp and --seed are the defaults of
    requests that leave them out, so two such requests give one text, the text of a request that
    names --temp and --seed itself, and not the greedy text; -np sets the slots (/props);
    --chat-template TEXT renders chats (/apply-template shows it); --reasoning off renders chats
    that do not say with enable_thinking false, one that says true keeps it;
  - the flags for what rlx lacks are refused, naming the flag: --no-cont-batching,
    --reasoning-format deepseek-legacy and unknown formats, --chat-template NAME (llama.cpp's built-in names), --stop,
    --threads-http abc, --reasoning maybe; and --chat-template with --chat-template-file.

  check_llama_flags.py --rlx BIN
"""
import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from serve_util import BROWN, Server  # noqa: E402

TEMPLATE = "{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}{% if add_generation_prompt %}<a>{% endif %}"
LLAMA_ARGS = ["--temp", "0.8", "--seed", "42", "--no-slots", "--jinja", "--ctx-size", "512", "-np", "2", "-n", "8",
              "--metrics", "-cb", "--no-ui", "-fa", "on", "--threads-http", "2", "--reasoning-format", "none",
              "--n-gpu-layers", "0", "--batch-size", "32", "--reasoning", "on", "--chat-template", TEMPLATE]
# Qwen3's switch of its thinking mode
THINK_TEMPLATE = "{% if enable_thinking is defined and enable_thinking is false %}off{% else %}on{% endif %}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rlx", required=True)
    args = ap.parse_args()
    problems = []

    def expect(cond, what):
        if not cond:
            problems.append(what)

    prompt = "The jury said that"
    with Server(args.rlx, LLAMA_ARGS) as s:
        def completion(body):
            status, _, text = s.request("POST", "/v1/completions", {"prompt": prompt, **body})
            got = json.loads(text)
            if status != 200:
                raise SystemExit(f"FAIL: /v1/completions {body}: {status} {got}")
            return got["choices"][0]["text"], got["usage"]["completion_tokens"]

        a, n_a = completion({})
        b, _ = completion({})
        named, _ = completion({"temperature": 0.8, "seed": 42, "max_tokens": 8})
        greedy, _ = completion({"temperature": 0, "max_tokens": 8})
        other_seed, _ = completion({"seed": 7})
        expect(n_a == 8, f"--n-predict 8: a completion without max_tokens made {n_a} tokens")
        expect(a == b == named, f"--temp 0.8 --seed 42 as defaults: {a!r}, {b!r}; named in the request {named!r}")
        expect(a != greedy or a != other_seed, f"the defaults sample: {a!r} is both the greedy text and seed 7's")
        status, _, text = s.request("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}]})
        chat = json.loads(text)
        expect(status == 200 and chat["usage"]["completion_tokens"] <= 8 and
               (chat["usage"]["completion_tokens"] == 8 or chat["choices"][0]["finish_reason"] == "stop"),
               f"--n-predict 8 on chat: {status} {chat}")
        status, _, text = s.request("POST", "/apply-template", {"messages": [{"role": "user", "content": "Hi"}]})
        expect(status == 200 and json.loads(text) == {"prompt": "<user>Hi\n<a>"},
               f"--chat-template: /apply-template gave {status} {text}")
        status, _, text = s.request("GET", "/props")
        props = json.loads(text)
        expect(props.get("total_slots") == 2 and props["default_generation_settings"]["n_ctx"] == 256 and
               props.get("chat_template") == TEMPLATE, f"-np 2 --ctx-size 512: /props {props}")
        params = props["default_generation_settings"].get("params", {})
        expect(params.get("seed") == 42 and abs(params.get("temperature", 0) - 0.8) < 1e-6 and
               params.get("n_predict") == 8, f"/props default params from --seed 42 --temp 0.8 -n 8: {params}")
        status, _, text = s.request("POST", "/completion", {"prompt": prompt, "n_predict": 3, "seed": 5,
                                                            "top_k": 7})
        gen = json.loads(text).get("generation_settings", {}) if status == 200 else {}
        expect(gen.get("n_predict") == 3 and gen.get("seed") == 5 and gen.get("top_k") == 7 and
               abs(gen.get("temperature", 0) - 0.8) < 1e-6,
               f"/completion's generation_settings: the request's and the defaults: {status} {gen}")
    with Server(args.rlx, ["--reasoning", "off", "--chat-template", THINK_TEMPLATE]) as s:
        for kwargs, want in ((None, "off"), ({"enable_thinking": True}, "on")):
            body = {"messages": [{"role": "user", "content": "Hi"}]}
            if kwargs:
                body["chat_template_kwargs"] = kwargs
            status, _, text = s.request("POST", "/apply-template", body)
            expect(status == 200 and json.loads(text) == {"prompt": want},
                   f"--reasoning off, chat_template_kwargs {kwargs}: want {want!r}, got {status} {text}")
    refusals = [(["--no-cont-batching"], "--no-cont-batching"), (["--reasoning", "maybe"], "--reasoning"),
                (["-nocb"], "--no-cont-batching"), (["--reasoning-format", "deepseek-legacy"], "--reasoning-format"),
                (["--reasoning-format", "think"], "--reasoning-format"),
                (["--chat-template", "chatml"], "--chat-template"), (["--stop", "x"], "--stop"),
                (["--threads-http", "abc"], "--threads-http"),
                (["--chat-template", TEMPLATE, "--chat-template-file", __file__], "--chat-template")]
    for extra, flag in refusals:
        p = subprocess.run([args.rlx, "serve", "-m", BROWN, "--port", "0", *extra], capture_output=True, text=True,
                           timeout=120)
        expect(p.returncode != 0 and flag in p.stderr and "listening" not in p.stderr,
               f"rlx serve {' '.join(extra)}: exit {p.returncode}, want a refusal naming {flag}: {p.stderr[-300:]!r}")
    for m in problems:
        print(f"FAIL: {m}")
    if not problems:
        print(f"ok: llama-server's flags ({' '.join(LLAMA_ARGS[:-2])} --chat-template ...) taken with their meaning; "
              f"{len(refusals)} refused by name")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
