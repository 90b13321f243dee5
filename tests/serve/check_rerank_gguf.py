#!/usr/bin/python3
"""`rlx serve --reranking` on a reranker GGUF as llama.cpp writes it, against llama-server on the
same file.

llama.cpp's converter (convert_hf_to_gguf.py, run unmodified through tests/llamacpp/convert.py)
takes a Qwen3 checkpoint for a Qwen3-Reranker when its folder is named so, and writes
`qwen3.pooling_type` rank, `qwen3.classifier.output_labels` ["yes", "no"], the prompt as
`tokenizer.chat_template.rerank`, and the LM head's rows of "yes" and "no" as `cls.output.weight`
in place of the head (the checkpoint here is untied, as Qwen3-Reranker-4B and -8B are, so the file
has no head at all: a reranker reading the token embeddings as the head scores wrong).
llama-server scores a document softmax(cls.output x the last final-normed row)[0]; rlx must give
its scores (F32 file, F32 activations on both: 1e-4) and its order, and refuse an `instruction`
(the template fixes it).

The checkpoint: tests/model/make_model.py's Qwen3 in tests/llamacpp's Brown shape, untied, with
the Brown tokenizer whose unused byte tokens 0xC0 and 0xC1 are renamed "yes" and "no" (as
check_embeddings.py does). Skips (77) when the llama.cpp checkout or its build is absent, or the
torch its converter imports: CI builds no llama.cpp, so this is a plain skip there too
(tests/ci_skip.py's rule for what CI is not meant to have).

  check_rerank_gguf.py --rlx BIN --workdir DIR [--llama-cpp DIR] [--llama-bin DIR]
"""
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(HERE, "..", "model"), os.path.join(HERE, "..", "llamacpp")]
import make_model  # noqa: E402
from serve_util import BROWN, Checks, Server, main_guard, write_yes_no_tokenizer  # noqa: E402
from ci_skip import SKIP  # noqa: E402

BODY = dict(vocab_size=4096, bos_token_id=4093, eos_token_id=4095, hidden_size=128, intermediate_size=256,
            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
            max_position_embeddings=1024, tie_word_embeddings=False, max_window_layers=2)
QUERY = "Machine learning is"
DOCS = ["A machine uses power.", "Learning is a process.", "Paris est une ville.", "The jury said"]
TOL = 1e-4

# The transformers stand-in (tests/llamacpp/hf_standin) lacks the one call the converter makes for
# a reranker, the ids of "yes", "no" and "|": a lookup in the vocabulary it reads anyway. And the
# converter's Qwen2 family imports sentencepiece (not in Debian's python3) before it looks for a
# tokenizer.model, whose absence sends it to the BPE tokenizer.json: a name stands in for the
# module, never called.
CONVERT = r"""
import os, runpy, sys, types
sys.path.insert(0, os.path.join(sys.argv[1], "hf_standin"))
import transformers
transformers._Tokenizer.convert_tokens_to_ids = lambda self, token: self.vocab.get(token)
sys.modules.setdefault("sentencepiece", types.SimpleNamespace(SentencePieceProcessor=None))
sys.argv = [os.path.join(sys.argv[1], "convert.py")] + sys.argv[2:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def make_checkpoint(out):
    shutil.rmtree(out, ignore_errors=True)
    make_model.KINDS["qwen3-reranker"] = dict(make_model.KINDS["dense-tied"], **BODY)
    make_model.build("qwen3-reranker", "f32", 1, 39, out)
    shutil.copyfile(os.path.join(BROWN, "tokenizer_config.json"), os.path.join(out, "tokenizer_config.json"))
    write_yes_no_tokenizer(os.path.join(out, "tokenizer.json"))


class LlamaServer:
    def __init__(self, binary, model):
        self.cmd = [binary, "-m", model, "--reranking", "--host", "127.0.0.1", "--port", "0", "-t", "1",
                    "-c", "512", "-np", "1", "--no-webui"]

    def __enter__(self):
        # llama-server takes no port 0: a free one from the kernel, then its own bind
        import socket
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.cmd[self.cmd.index("0")] = str(self.port)
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                if self.request({"query": "x", "documents": ["y"]})[0] == 200:
                    return self
            except OSError:
                pass
            time.sleep(0.2)
        self.__exit__()
        raise RuntimeError(f"llama-server did not become ready: {self.proc.stderr.read()[-2000:]}")

    def request(self, body):
        import http.client
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        try:
            c.request("POST", "/v1/rerank", body=json.dumps(body), headers={"Content-Type": "application/json"})
            r = c.getresponse()
            return r.status, json.loads(r.read())
        finally:
            c.close()

    def __exit__(self, *exc):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rlx", required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--llama-cpp", default="/work/llama.cpp", help="a llama.cpp checkout (its converter)")
    ap.add_argument("--llama-bin", default="/work/llama-build/bin", help="llama.cpp's built programs")
    args = ap.parse_args()
    server_bin = os.path.join(args.llama_bin, "llama-server")
    if not os.path.isfile(os.path.join(args.llama_cpp, "convert_hf_to_gguf.py")) or not os.access(server_bin, os.X_OK):
        print(f"SKIPPED: no llama.cpp checkout at {args.llama_cpp} or llama-server in {args.llama_bin}")
        return SKIP
    if subprocess.run([sys.executable, "-c", "import torch"], capture_output=True, timeout=120).returncode != 0:
        print(f"SKIPPED: llama.cpp's converter needs torch, which {sys.executable} lacks (Debian: python3-torch)")
        return SKIP
    os.makedirs(args.workdir, exist_ok=True)
    c = Checks()
    hf = os.path.join(args.workdir, "qwen3-reranker-tiny")  # the name is how the converter knows it
    gguf = os.path.join(args.workdir, "qwen3-reranker-tiny-f32.gguf")
    make_checkpoint(hf)
    p = subprocess.run([sys.executable, "-c", CONVERT, os.path.join(HERE, "..", "llamacpp"), "--llama-cpp",
                        args.llama_cpp, "--pre", "qwen2", "--", hf, "--outtype", "f32", "--outfile", gguf],
                       capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        print(f"FAIL llama.cpp's converter: {p.stdout[-2000:]}{p.stderr[-3000:]}")
        return 1
    body = {"query": QUERY, "documents": DOCS}
    with LlamaServer(server_bin, gguf) as ls:
        status, want = ls.request(body)
        c.check(status == 200, f"llama-server /v1/rerank: {status} {want}")
    with Server(args.rlx, ["--reranking", "--parallel", "1", "--slot-ctx", "512"], model=gguf) as s:
        status, _, raw = s.request("POST", "/v1/rerank", body)
        got = json.loads(raw)
        c.check(status == 200, f"rlx /v1/rerank: {status} {got}")
        w = {r["index"]: r["relevance_score"] for r in want["results"]}
        g = {r["index"]: r["relevance_score"] for r in got["results"]}
        c.check(sorted(g) == sorted(w) and all(abs(g[i] - w[i]) < TOL for i in w),
                f"rlx's scores are llama-server's: {g} vs {w}")
        c.check([r["index"] for r in got["results"]] == [r["index"] for r in want["results"]],
                f"in llama-server's order: {got['results']} vs {want['results']}")
        c.check(max(w.values()) - min(w.values()) > 10 * TOL, f"the documents' scores differ: {w}")
        status, _, raw = s.request("POST", "/v1/rerank", dict(body, instruction="Judge"))
        err = json.loads(raw)
        c.check(status == 400 and err["error"]["param"] == "instruction" and "template" in err["error"]["message"],
                f"an instruction against the GGUF's template: {status} {err}")
    c.check("ERROR" not in s.stderr, f"the server's stderr: {s.stderr[-2000:]}")
    return c.report()


if __name__ == "__main__":
    main_guard(main)
