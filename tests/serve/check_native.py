#!/usr/bin/python3
"""llama-server's utility endpoints on `rlx serve` (the Brown model, its Qwen3-style tokenizer and
chat template), against Hugging Face's own code:
  /tokenize      ids of Hugging Face's `tokenizers` (Node binding) on tokenizer.json, special
                 tokens recognised (parse_special) or not; with_pieces pairs each id with
                 Hugging Face's decode of it
  /detokenize    Hugging Face's decode of the ids, special tokens written out
  /apply-template the prompt @huggingface/jinja renders from the model's template (as
                 apply_chat_template does, generation prompt added)
  /props         the slots and positions it was started with (--parallel 2 --slot-ctx 512), the
                 template and special tokens of tokenizer_config.json
  /v1/models/ID  the model under its id (what the openai client's models.retrieve asks), a 404
                 under another; HEAD on the GET endpoints
  /completion    llama-server's own: the text and log-probabilities of /v1/completions under
                 n_predict and n_probs, in its shape (stop_type limit or word), streamed as its
                 events without [DONE]
and the refusals: a missing or mistyped field, ids outside the vocabulary, the wrong method.

  check_native.py --rlx BIN --npm DIR   (DIR: tests/text's npm folder: tokenizers, @huggingface/jinja)
"""
import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from serve_util import BROWN, Server  # noqa: E402

TEXTS = ["Hello world", "The jury said  that\tthe city's 12,345 voters\n\n were 中文 and emoji 🤗 here",
         "before<|endoftext|>after", "   leading spaces and trailing   "]

REFERENCE_JS = r"""
const fs = require('fs');
const path = require('path');
const input = JSON.parse(fs.readFileSync(0, 'utf8'));
const { Tokenizer } = require(path.join(input.npm, 'node_modules', 'tokenizers'));
const { Template } = require(path.join(input.npm, 'node_modules', '@huggingface', 'jinja'));
(async () => {
  const hf = Tokenizer.fromFile(path.join(input.model, 'tokenizer.json'));
  const out = { encode: [], pieces: [], decode: null, template: null };
  for (const t of input.texts) {
    const ids = Array.from((await hf.encode(t, null, { addSpecialTokens: false })).getIds());
    out.encode.push(ids);
    const pieces = [];
    for (const id of ids) pieces.push(await hf.decode([id], false));
    out.pieces.push(pieces);
  }
  out.decode = await hf.decode(input.decode, false);
  out.template = new Template(input.template).render(input.vars);
  process.stdout.write(JSON.stringify(out));
})();
"""


def reference(args, template, messages, decode_ids):
    request = {"npm": args.npm, "model": BROWN, "texts": TEXTS, "decode": decode_ids, "template": template,
               "vars": {"messages": messages, "add_generation_prompt": True, "bos_token": ""}}
    p = subprocess.run([args.node, "-e", REFERENCE_JS], input=json.dumps(request), capture_output=True, text=True,
                       timeout=120)
    if p.returncode != 0:
        raise SystemExit(f"FAIL: the Hugging Face reference did not run: {p.stderr[-600:]}")
    return json.loads(p.stdout)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rlx", required=True)
    ap.add_argument("--npm", required=True)
    ap.add_argument("--node", default="node")
    args = ap.parse_args()
    with open(os.path.join(BROWN, "tokenizer_config.json")) as f:
        config = json.load(f)
    template = config["chat_template"]
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a city."},
                {"role": "assistant", "content": "Paris."}, {"role": "user", "content": "Another <|im_end|>"}]
    decode_ids = [9, 400, 1000, 2, 151643 % 4096, 77]
    ref = reference(args, template, messages, decode_ids)
    problems = []

    def expect(cond, what):
        if not cond:
            problems.append(what)

    with Server(args.rlx, ["--parallel", "2", "--slot-ctx", "512"]) as s:
        def post(path, body):
            status, _, text = s.request("POST", path, body)
            return status, json.loads(text) if text else None

        for text, ids, pieces in zip(TEXTS, ref["encode"], ref["pieces"]):
            status, got = post("/tokenize", {"content": text})
            expect(status == 200 and got == {"tokens": ids}, f"/tokenize {text!r}: {status} {got}, Hugging Face {ids}")
            status, got = post("/tokenize", {"content": text, "with_pieces": True})
            want = [{"id": i, "piece": p} for i, p in zip(ids, pieces)]
            expect(status == 200 and got == {"tokens": want}, f"/tokenize with_pieces {text!r}: {status} {got}, "
                                                              f"want {want}")
            status, got = post("/detokenize", {"tokens": ids})
            expect(status == 200 and got == {"content": text}, f"/detokenize of {text!r}'s ids: {status} {got}")
        # the special token's text stays text when parse_special is false: more ids, none the token's
        status, got = post("/tokenize", {"content": "<|endoftext|>"})
        expect(status == 200 and len(got["tokens"]) == 1, f"/tokenize '<|endoftext|>': {status} {got}, want one id")
        eot = got["tokens"][0]
        status, got = post("/tokenize", {"content": TEXTS[2], "parse_special": False})
        expect(status == 200 and eot not in got["tokens"] and len(got["tokens"]) > len(ref["encode"][2]),
               f"/tokenize parse_special false: {status} {got}, with it {ref['encode'][2]}")
        status, got = post("/detokenize", {"tokens": decode_ids})
        expect(status == 200 and got == {"content": ref["decode"]}, f"/detokenize {decode_ids}: {status} {got}, "
                                                                      f"Hugging Face {ref['decode']!r}")
        status, got = post("/apply-template", {"messages": messages})
        expect(status == 200 and got == {"prompt": ref["template"]},
               f"/apply-template: {status} {got}, @huggingface/jinja {ref['template']!r}")

        # llama-server's /completion: n_predict, n_probs, its stream (no [DONE]), its stop types
        prompt = "The jury said that"
        status, oai = post("/v1/completions", {"prompt": prompt, "max_tokens": 6, "temperature": 0, "logprobs": 2})
        status2, got = post("/completion", {"prompt": prompt, "n_predict": 6, "temperature": 0, "n_probs": 2})
        probs = got.get("completion_probabilities", []) if status2 == 200 else []
        expect(status == 200 and status2 == 200 and got["content"] == oai["choices"][0]["text"] and
               got["stop"] is True and got["tokens_predicted"] == 6 and got["stop_type"] == "limit" and
               got["tokens_evaluated"] == oai["usage"]["prompt_tokens"] and len(probs) == 6 and
               all(len(p["top_logprobs"]) == 2 and p["top_logprobs"][0]["id"] == p["id"] for p in probs) and
               [p["logprob"] for p in probs] == oai["choices"][0]["logprobs"]["token_logprobs"],
               f"/completion n_predict 6 n_probs 2: {status2} {got}; /v1/completions {oai}")
        status, _, body = s.request("POST", "/completion", {"prompt": prompt, "n_predict": 6, "temperature": 0,
                                                            "stream": True})
        events = [json.loads(b[len("data: "):]) for b in body.decode().split("\n\n") if b.startswith("data: ")]
        expect(status == 200 and b"[DONE]" not in body and events and events[-1]["stop"] is True and
               all(not e["stop"] for e in events[:-1]) and
               "".join(e["content"] for e in events) == oai["choices"][0]["text"],
               f"/completion stream: {status} {body[:400]!r}")
        word = oai["choices"][0]["text"][3:6]
        status, got = post("/completion", {"prompt": prompt, "n_predict": 32, "temperature": 0,
                                           "stop": ["never said", word]})
        expect(status == 200 and got["stop_type"] == "word" and got["stopping_word"] == word and
               oai["choices"][0]["text"].startswith(got["content"] + word),
               f"/completion with the stop string {word!r}: {status} {got}")
        for body in ({"prompt": prompt, "n_predict": 0}, {"prompt": prompt, "n_probs": 21},
                     {"prompt": prompt, "n_predict": "5"}):
            status, got = post("/completion", body)
            expect(status == 400 and got["error"]["param"] in ("n_predict", "n_probs"), f"/completion {body}: "
                                                                                        f"{status} {got}")

        status, _, text = s.request("GET", "/props")
        props = json.loads(text) if status == 200 else {}
        expect(props.get("total_slots") == 2 and props.get("default_generation_settings", {}).get("n_ctx") == 512 and
               props.get("chat_template") == template and props.get("eos_token") == config["eos_token"] and
               props.get("model_path", "").rstrip("/").endswith(os.path.join("brown", "target")) and
               props.get("build_info", "").startswith("rlx "), f"/props: {status} {props}")
        status, headers, text = s.request("HEAD", "/props")
        expect(status == 200 and not text, f"HEAD /props: {status} {text!r}")

        status, _, text = s.request("GET", "/v1/models")
        model_id = json.loads(text)["data"][0]["id"]
        for path in (f"/v1/models/{model_id}", f"/models/{model_id}"):
            status, _, text = s.request("GET", path)
            expect(status == 200 and json.loads(text).get("id") == model_id and
                   json.loads(text).get("object") == "model", f"GET {path}: {status} {text}")
        status, _, text = s.request("GET", "/v1/models/no-such-model")
        expect(status == 404 and json.loads(text)["error"]["code"] == "model_not_found",
               f"GET /v1/models/no-such-model: {status} {text}")

        for path, body, param in (("/tokenize", {}, "content"), ("/tokenize", {"content": 5}, "content"),
                                  ("/tokenize", {"content": "x", "with_pieces": "yes"}, "with_pieces"),
                                  ("/detokenize", {"tokens": "1 2"}, "tokens"),
                                  ("/detokenize", {"tokens": [1, -1]}, "tokens"),
                                  ("/detokenize", {"tokens": [1, 1e300]}, "tokens"),
                                  ("/detokenize", {"tokens": [4096]}, "tokens"),
                                  ("/detokenize", {"tokens": [1.5]}, "tokens"),
                                  ("/apply-template", {"messages": []}, "messages")):
            status, got = post(path, body)
            expect(status == 400 and got["error"]["param"] == param, f"{path} {body}: {status} {got}, want a 400 "
                                                                     f"naming {param}")
        status, _, text = s.request("GET", "/tokenize")
        expect(status == 405, f"GET /tokenize: {status} {text}")
    for m in problems:
        print(f"FAIL: {m}")
    if not problems:
        print(f"ok: /tokenize, /detokenize, /apply-template as Hugging Face on {len(TEXTS)} texts; /props, "
              "/v1/models/ID, HEAD and the refusals")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
