#!/usr/bin/python3
"""Embeddings and rerank on `rlx serve --embedding / --reranking` (the Brown model, a Qwen3
shape), against NumPy's reference forward (tests/model/qwen3_ref.py, float64):
  /v1/embeddings  the final-normed hidden rows pooled (last, mean from a sentence-transformers
                  1_Pooling/config.json, cls, all rows with --pooling none on /embeddings) and
                  L2-normalized, as float and base64; a batch equals its inputs one by one; token
                  ids, text (ids of Hugging Face's tokenizers), ids and text mixed; dimensions,
                  embd_normalize (each of llama-server's norms, and --embd-normalize as the
                  default); usage; llama-server's /embeddings shape
  /v1/rerank      Qwen3-Reranker's prompt (tokenized as its model card does, by Hugging Face's
                  tokenizers) scored softmax([logit(no), logit(yes)])[1]: scores, best first,
                  top_n, TEI's texts/score/return_text
  the openai npm client's embeddings.create (one input, several, text; base64 by default)
  a chat request running beside a long embedding batch gives its solo text
and the refusals: empty, too long, too many, mistyped inputs, endpoints off (501), bad documents.
The model for rerank is Brown with two unused byte tokens renamed "yes" and "no" in its
tokenizer.json (bytes 0xC0 and 0xC1 never occur in UTF-8 text), and with the mean pooling config.

  check_embeddings.py --rlx BIN --workdir DIR --npm TEXT_NPM_DIR [--openai-npm DIR] [--node NODE]
"""
import argparse
import base64
import json
import os
import shutil
import struct
import subprocess
import sys
import threading

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "model"))
import qwen3_ref  # noqa: E402
from serve_util import fetch_npm, BROWN, Checks, Server, main_guard, write_yes_no_tokenizer  # noqa: E402
from ci_skip import under_ci  # noqa: E402 (serve_util put tests/ on the path)

OPENAI = "openai@6.30.1"  # as check_openai.py, which shares the folder
# f32 activations against float64 on bf16 weights: a vector's components (about 1/sqrt(512)
# each) agree to ~1e-5; a wrong pooling or norm moves them by ~1e-2
TOL = 1e-3
SYSTEM = ("<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the "
          "Instruct provided. Note that the answer can only be \"yes\" or \"no\".<|im_end|>\n<|im_start|>user\n")
END = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"
QUERY = "Machine learning is"
# short: each document's prompt holds the template's hundred tokens besides
DOCS = ["A machine uses power.", "Learning is a process.", "Paris est une ville."]
TEXTS = ["Hello world", "The jury said"]

TOKENIZE_JS = r"""
const fs = require('fs');
const path = require('path');
const input = JSON.parse(fs.readFileSync(0, 'utf8'));
const { Tokenizer } = require(path.join(input.npm, 'node_modules', 'tokenizers'));
(async () => {
  const hf = Tokenizer.fromFile(input.tokenizer);
  const out = [];
  for (const t of input.texts)
    out.push(Array.from((await hf.encode(t, null, { addSpecialTokens: true })).getIds()));
  process.stdout.write(JSON.stringify(out));
})();
"""


def make_rerank_model(workdir):
    """Brown with "yes"/"no" tokens and a sentence-transformers mean pooling config."""
    d = os.path.join(workdir, "rerank-model")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(os.path.join(d, "1_Pooling"))
    for f in ("config.json", "generation_config.json", "model.safetensors", "tokenizer_config.json"):
        os.symlink(os.path.join(BROWN, f), os.path.join(d, f))
    yes, no = write_yes_no_tokenizer(os.path.join(d, "tokenizer.json"))
    with open(os.path.join(d, "modules.json"), "w") as f:
        json.dump([{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
                   {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}], f)
    with open(os.path.join(d, "1_Pooling", "config.json"), "w") as f:
        json.dump({"word_embedding_dimension": 512, "pooling_mode_cls_token": False,
                   "pooling_mode_mean_tokens": True, "pooling_mode_max_tokens": False,
                   "pooling_mode_lasttoken": False}, f)
    return d, yes, no


def hf_encode(args, tokenizer, texts):
    p = subprocess.run([args.node, "-e", TOKENIZE_JS], capture_output=True, text=True, timeout=120,
                       input=json.dumps({"npm": args.npm, "tokenizer": tokenizer, "texts": texts}))
    if p.returncode != 0:
        raise RuntimeError(f"Hugging Face's tokenizers failed: {p.stderr}")
    return json.loads(p.stdout)


class Reference:
    """NumPy's final-normed hidden rows, cached per input."""

    def __init__(self):
        self.model = qwen3_ref.load(BROWN)
        self.cache = {}

    def hidden(self, ids):
        key = tuple(ids)
        if key not in self.cache:
            self.cache[key] = qwen3_ref.final_hidden(self.model, list(ids))
        return self.cache[key]

    def pooled(self, ids, pooling, norm=True):
        h = self.hidden(ids)
        v = {"last": h[-1], "mean": h.mean(axis=0), "cls": h[0]}[pooling]
        return v / np.linalg.norm(v) if norm else v

    def yes_score(self, ids, yes, no):
        logits = qwen3_ref.lm_head(self.model, self.hidden(ids)[-1:], np.float64)[0]
        return 1.0 / (1.0 + np.exp(logits[no] - logits[yes]))


def close(got, want, tol=TOL):
    got = np.asarray(got, dtype=np.float64)
    return got.shape == np.shape(want) and float(np.max(np.abs(got - want))) < tol


def post(s, path, body):
    status, _, raw = s.request("POST", path, body)
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw


def refused(c, s, path, body, status, words, what):
    got, out = post(s, path, body)
    msg = out.get("error", {}).get("message", "") if isinstance(out, dict) else ""
    c.check(got == status and all(w in msg for w in words), f"{what}: want {status} naming {words}, got {got} {out}")


def check_last(c, s, ref, ids_a, ids_b, ids_c, text_ids):
    status, out = post(s, "/v1/embeddings", {"input": ids_a})
    c.check(status == 200 and out["object"] == "list" and out["data"][0]["object"] == "embedding"
            and out["model"] == "target", f"one input: {status} {str(out)[:300]}")
    want = ref.pooled(ids_a, "last")
    c.check(close(out["data"][0]["embedding"], want), "last pooling: the vector is NumPy's last row, normalized")
    c.check(out["usage"] == {"prompt_tokens": len(ids_a), "total_tokens": len(ids_a)}, f"usage {out['usage']}")
    status, out64 = post(s, "/v1/embeddings", {"input": ids_a, "encoding_format": "base64"})
    raw = base64.b64decode(out64["data"][0]["embedding"])
    floats = struct.unpack(f"<{len(raw) // 4}f", raw)
    c.check(list(floats) == [float(np.float32(x)) for x in out["data"][0]["embedding"]],
            "base64 holds the float answer's float32 values, bit for bit")
    status, batch = post(s, "/v1/embeddings", {"input": [ids_a, ids_b, ids_c]})
    c.check(status == 200 and [d["index"] for d in batch["data"]] == [0, 1, 2], f"batch: {status}")
    for i, ids in enumerate((ids_a, ids_b, ids_c)):
        single = post(s, "/v1/embeddings", {"input": ids})[1]["data"][0]["embedding"]
        c.check(batch["data"][i]["embedding"] == single, f"batch input {i} equals the input alone")
        c.check(close(single, ref.pooled(ids, "last")), f"input {i} is NumPy's")
    c.check(batch["usage"]["prompt_tokens"] == len(ids_a) + len(ids_b) + len(ids_c), "batch usage sums the inputs")
    status, out = post(s, "/v1/embeddings", {"input": TEXTS})
    for i, ids in enumerate(text_ids):
        c.check(status == 200 and close(out["data"][i]["embedding"], ref.pooled(ids, "last")),
                f"text {TEXTS[i]!r}: the vector of Hugging Face's ids {ids}")
    status, out = post(s, "/v1/embeddings", {"input": text_ids[0] + [TEXTS[1]]})
    c.check(status == 200 and len(out["data"]) == 1 and
            close(out["data"][0]["embedding"], ref.pooled(text_ids[0] + text_ids[1], "last")),
            "ids and text mixed in one array are one input")
    status, out = post(s, "/v1/embeddings", {"input": ids_a, "dimensions": 8})
    v = ref.pooled(ids_a, "last", norm=False)[:8]
    c.check(status == 200 and close(out["data"][0]["embedding"], v / np.linalg.norm(v)),
            "dimensions 8: the first 8 components, normalized")
    status, out = post(s, "/v1/embeddings", {"input": ids_a, "embd_normalize": -1})
    c.check(status == 200 and close(out["data"][0]["embedding"], ref.pooled(ids_a, "last", norm=False), 1e-2),
            "embd_normalize -1: the vector as pooled")
    status, out = post(s, "/embeddings", {"input": [ids_a, ids_b]})
    c.check(status == 200 and isinstance(out, list) and out[1]["index"] == 1 and len(out[1]["embedding"]) == 1
            and close(out[1]["embedding"][0], ref.pooled(ids_b, "last")), "/embeddings: llama-server's shape")
    status, out = post(s, "/v1/embeddings", {"content": ids_a})
    c.check(status == 200 and isinstance(out, list) and close(out[0]["embedding"][0], want),
            "'content' gets llama-server's shape, as there")


def check_normalize(c, s, ref, ids):
    """--embd-normalize 3 is the server's default; a request's embd_normalize wins: llama-server's
    numbers against NumPy (-1 none, 0 max-abs scaled to 32760, 1 taxicab, 2 Euclidean, p-norms)."""
    v = ref.pooled(ids, "cls", norm=False)
    want = {-1: v, 0: v * 32760 / np.max(np.abs(v)), 1: v / np.sum(np.abs(v)), 2: v / np.linalg.norm(v),
            3: v / np.sum(np.abs(v) ** 3) ** (1 / 3), 7: v / np.sum(np.abs(v) ** 7) ** (1 / 7)}
    for how, w in [(None, want[3])] + sorted(want.items()):
        body = {"input": ids} if how is None else {"input": ids, "embd_normalize": how}
        status, out = post(s, "/v1/embeddings", body)
        scale = float(np.max(np.abs(w)))  # relative: max-abs's components are in the tens of thousands
        c.check(status == 200 and close(np.asarray(out["data"][0]["embedding"]) / scale, w / scale),
                f"embd_normalize {how if how is not None else 'absent (--embd-normalize 3)'}: NumPy's norm")
    status, out = post(s, "/embeddings", {"input": ids})
    c.check(status == 200 and close(out[0]["embedding"][0], want[3]), "/embeddings takes --embd-normalize too")


def check_errors(c, s, slot):
    for body, words, what in (
            ({"input": ""}, ["empty"], "an empty string"),
            ({"input": []}, ["0 inputs"], "an empty array"),
            ({"input": [[1, 2], []]}, ["input 1 is empty"], "an empty second input"),
            ({"input": 5}, ["'input' must be"], "a number"),
            ({"input": {"a": 1}}, ["'input' must be"], "an object"),
            ({"input": [[1, [2]]]}, ["'input' must be"], "a nested array"),
            ({"input": [1.5]}, ["not a token id"], "a fractional id"),
            ({"input": [-1]}, ["not a token id"], "a negative id"),
            ({"input": [4096]}, ["not a token id"], "an id past the vocabulary"),
            ({"input": [1] * (slot + 1)}, ["too large"], "an input over the context"),
            ({"input": "word " * (slot + 1)}, ["too large"], "a text over the context"),
            ({"input": [[1]] * 2049}, ["2049 inputs"], "2049 inputs"),
            ({"input": [1], "encoding_format": "int8"}, ["encoding_format"], "encoding_format int8"),
            ({"input": [1], "dimensions": 0}, ["dimensions"], "dimensions 0"),
            ({"input": [1], "dimensions": 513}, ["dimensions"], "dimensions past the hidden size"),
            ({"model": "x"}, ["'input' is required"], "no input")):
        refused(c, s, "/v1/embeddings", body, 400, words, what)
    refused(c, s, "/v1/rerank", {"query": "a", "documents": ["b"]}, 501, ["--reranking"], "rerank without the flag")


def check_beside_chat(c, s, long_ids):
    """A chat request's greedy text is the same alone and beside a long embedding batch."""
    chat = {"messages": [{"role": "user", "content": "The President said that"}], "max_tokens": 8,
            "temperature": 0}
    solo = post(s, "/v1/chat/completions", chat)[1]["choices"][0]["message"]["content"]
    got = {}

    def embed():
        got["embed"] = post(s, "/v1/embeddings", {"input": [long_ids] * 2})

    t = threading.Thread(target=embed)
    t.start()
    status, out = post(s, "/v1/chat/completions", chat)
    t.join()
    c.check(status == 200 and out["choices"][0]["message"]["content"] == solo,
            f"chat beside embeddings gives its solo text: {status} {str(out)[:200]}")
    c.check(got["embed"][0] == 200 and len(got["embed"][1]["data"]) == 2, "the embeddings beside chat answer")


def check_overlapping_long(c, s, ref):
    """Two requests at once whose inputs span two chunks each: the engine interleaves their turns
    on the one embedding session, so each input must hold it to its end to keep its vectors."""
    inputs = [[list(range(300 + 7 * r, 300 + 7 * r + 150)), list(range(2000 - 150 - r, 2000 - r))] for r in range(2)]
    got = [None, None]

    def embed(r):
        got[r] = post(s, "/v1/embeddings", {"input": inputs[r]})

    threads = [threading.Thread(target=embed, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for r in range(2):
        status, out = got[r]
        c.check(status == 200 and all(close(out["data"][i]["embedding"], ref.pooled(ids, "last"))
                                      for i, ids in enumerate(inputs[r])),
                f"request {r} of two overlapping ones with two-chunk inputs: NumPy's vectors")


def check_openai(c, s, args, ref, ids, text_ids):
    failed = fetch_npm(args.openai_npm, OPENAI)
    if failed:
        c.check(False, failed)
        return
    p = subprocess.run([args.node, os.path.join(HERE, "openai_embeddings.js"), args.openai_npm, s.url() + "/v1",
                        "sk-none", json.dumps(ids)], capture_output=True, text=True, timeout=300)
    c.check(p.returncode == 0, f"the openai client failed: {p.stderr[-2000:]}")
    if p.returncode != 0:
        return
    out = json.loads(p.stdout)
    c.check(close(out["single"]["data"][0], ref.pooled(ids[0], "last")), "openai client: one input (base64)")
    c.check(out["single"]["usage"]["prompt_tokens"] == len(ids[0]), f"openai client usage {out['single']['usage']}")
    c.check(out["many"]["index"] == list(range(len(ids))), "openai client: the indexes of several")
    for i, v in enumerate(out["many"]["data"]):
        c.check(close(v, ref.pooled(ids[i], "last")), f"openai client: input {i} of several (float)")
    for i, v in enumerate(out["text"]):
        c.check(close(v, ref.pooled(text_ids[i], "last")), f"openai client: text {i}")


def check_rerank(c, s, args, ref, model_dir, yes, no):
    parts = hf_encode(args, os.path.join(model_dir, "tokenizer.json"),
                      [SYSTEM, END] + [f"<Instruct>: {INSTRUCTION}\n<Query>: {QUERY}\n<Document>: {d}" for d in DOCS])
    prompts = [parts[0] + body + parts[1] for body in parts[2:]]
    want = [ref.yes_score(p, yes, no) for p in prompts]
    status, out = post(s, "/v1/rerank", {"query": QUERY, "documents": DOCS})
    c.check(status == 200 and out["object"] == "list" and len(out["results"]) == len(DOCS),
            f"rerank: {status} {str(out)[:300]}")
    if status != 200:
        return
    order = sorted(range(len(DOCS)), key=lambda i: -want[i])
    c.check([r["index"] for r in out["results"]] == order, f"best first: {out['results']} vs NumPy {want}")
    for r in out["results"]:
        c.check(abs(r["relevance_score"] - want[r["index"]]) < TOL,
                f"document {r['index']}: score {r['relevance_score']} is NumPy's {want[r['index']]}")
    c.check(out["usage"]["prompt_tokens"] == sum(len(p) for p in prompts), f"rerank usage {out['usage']}")
    status, tei = post(s, "/rerank", {"query": QUERY, "texts": DOCS, "return_text": True, "top_n": 2})
    c.check(status == 200 and isinstance(tei, list) and [t["index"] for t in tei] == order[:2]
            and all(t["text"] == DOCS[t["index"]] and abs(t["score"] - want[t["index"]]) < TOL for t in tei),
            f"TEI's texts, top_n 2: the two best {str(tei)[:300]}")
    for body, words, what in (({"query": QUERY, "documents": []}, ["documents"], "no documents"),
                              ({"query": QUERY, "documents": None}, ["documents"], "documents null"),
                              ({"query": QUERY, "documents": 123}, ["documents"], "documents a number"),
                              ({"query": QUERY, "documents": [1, 2, 3]}, ["documents"], "documents of numbers"),
                              ({"documents": DOCS}, ["'query' is required"], "no query"),
                              ({"query": QUERY, "documents": DOCS, "top_n": -1}, ["top_n"], "top_n -1"),
                              ({"query": QUERY, "documents": DOCS, "top_n": 1.5}, ["top_n"], "top_n 1.5"),
                              ({"query": QUERY, "documents": ["x"] * 2049}, ["documents"], "2049 documents"),
                              ({"query": QUERY, "documents": ["word " * 2000]}, ["too large"], "a long document")):
        refused(c, s, "/v1/rerank", body, 400, words, what)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rlx", required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--npm", required=True, help="tests/text's npm folder (Hugging Face's tokenizers)")
    ap.add_argument("--openai-npm", help="folder of the openai package (fetched once); none: not run")
    ap.add_argument("--node", default="node")
    args = ap.parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    c = Checks()
    ref = Reference()
    model_dir, yes, no = make_rerank_model(args.workdir)
    ids_a, ids_b, ids_c = [9, 400, 17, 2051, 33, 700, 5], [1200, 3], list(range(100, 240, 3))
    text_ids = hf_encode(args, os.path.join(BROWN, "tokenizer.json"), TEXTS)
    slot = 160  # a chunk of 128 and a rest: inputs longer than a chunk run in two turns
    with Server(args.rlx, ["--embedding", "--pooling", "last", "--parallel", "2", "--slot-ctx", str(slot)]) as s:
        check_last(c, s, ref, ids_a, ids_b, ids_c, text_ids)
        check_errors(c, s, slot)
        check_beside_chat(c, s, list(range(50, 190)))
        check_overlapping_long(c, s, ref)
        if args.openai_npm and shutil.which("npm"):
            check_openai(c, s, args, ref, [ids_a, ids_b, ids_c], text_ids)
        else:
            # CI installs npm (share/scripts/install-deps): there this part may not go unrun
            c.check(not under_ci(), "the openai npm client is not run (no --openai-npm, or npm missing) under CI=true")
            print("note: the openai npm client is not run (no --openai-npm, or npm missing)")
    with Server(args.rlx, ["--embedding", "--reranking", "--parallel", "1"], model=model_dir) as s:
        status, out = post(s, "/v1/embeddings", {"input": [ids_a, ids_c]})
        c.check(status == 200 and close(out["data"][0]["embedding"], ref.pooled(ids_a, "mean"))
                and close(out["data"][1]["embedding"], ref.pooled(ids_c, "mean")),
                "mean pooling: the mean of NumPy's rows, normalized")
        check_rerank(c, s, args, ref, model_dir, yes, no)
    c.check("embeddings pooled by mean" in s.stderr, f"the mean pooling of 1_Pooling/config.json: {s.stderr}")
    with Server(args.rlx, ["--embedding", "--pooling", "cls", "--parallel", "1", "--embd-normalize", "3"]) as s:
        status, out = post(s, "/v1/embeddings", {"input": [ids_a, ids_c], "embd_normalize": 2})
        c.check(status == 200 and close(out["data"][0]["embedding"], ref.pooled(ids_a, "cls"))
                and close(out["data"][1]["embedding"], ref.pooled(ids_c, "cls")),
                "cls pooling (--pooling cls): NumPy's first row, normalized")
        check_normalize(c, s, ref, ids_a)
    for bad in ("-2", "65", "2.5", "x"):
        p = subprocess.run([args.rlx, "serve", "--embedding", "--embd-normalize", bad], capture_output=True,
                           text=True, timeout=60)
        c.check(p.returncode != 0 and "--embd-normalize" in p.stderr, f"--embd-normalize {bad}: {p.stderr[-300:]}")
    with Server(args.rlx, ["--embedding", "--pooling", "none", "--parallel", "1"]) as s:
        status, out = post(s, "/embeddings", {"input": [ids_a, ids_c]})
        c.check(status == 200 and close(out[0]["embedding"], ref.hidden(ids_a))
                and close(out[1]["embedding"], ref.hidden(ids_c)),
                "--pooling none: every position's row, as NumPy's, not normalized")
        refused(c, s, "/v1/embeddings", {"input": ids_a}, 400, ["not OAI compatible"], "/v1/embeddings under none")
    with Server(args.rlx, ["--reranking", "--parallel", "1"], model=model_dir) as s:
        refused(c, s, "/v1/embeddings", {"input": ids_a}, 501, ["--embeddings"], "embeddings without the flag")
    return c.report()


if __name__ == "__main__":
    main_guard(main)
