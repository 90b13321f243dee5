#!/usr/bin/python3
"""The tokenizer rlx reads from a GGUF file's tokenizer.ggml.* metadata equals the tokenizer.json
of the model the file was converted from.

  test_gguf_tokenizer.py --rlx BIN --shared DIR/shared/gguf --workdir DIR

llama.cpp converted the Brown models of share/models/brown (draft and target) to GGUF, turning
their tokenizer.json into a token list, token types, merges and a pre-tokenizer name; rlx turns
that back into a tokenizer (core/src/text/tokenizer_gguf.c), so `rlx tokenize` must give the
same ids from FILE.gguf as from the model directory, with special tokens parsed and with
--no-special. The text is the held-out Brown text plus lines that reach the parts a plain
English text does not: the chat markers <|im_start|>/<|im_end|> and <|endoftext|> (added
control tokens, matched only when special tokens are parsed), accented and non-Latin letters
and emoji (byte-level fallback, NFC normalisation), digit runs (split one by one), CRLF and
tabs (the whitespace rules of the split pattern). The special-token line must tokenize
differently with and without --no-special, else that half of the test would compare nothing.
Exits 77 when the shared directory is absent.
"""
import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import gguf_common as C  # noqa: E402

EXTRA = ("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
         "The end.<|endoftext|>After the end.\n"
         "na\u00efve caf\u00e9 cafe\u0301 \u00c5ngstr\u00f6m \u65e5\u672c\u8a9e \u0645\u0631\u062d\u0628\u0627 "
         "\u041f\u0440\u0438\u0432\u0435\u0442 \U0001f600\U0001f680 \u00a0non-breaking\u2003em space\n"
         "1234567890 3.14159 2026-12-01 1,000,000 x2y33z444\n"
         "line one\r\nline two\r\n\r\n\tindented\ttabs  double  spaces   \n")
SPECIAL_LINE = "<|im_start|>user\nhi<|im_end|>"


def tokenize(rlx, model, path, special):
    cmd = [rlx, "tokenize", "-m", model, "-f", path] + ([] if special else ["--no-special"])
    p = C.run(cmd, timeout=120)
    if p.returncode != 0:
        raise SystemExit("FAIL: %s exited %s: %s" % (" ".join(cmd), p.returncode, p.stderr.decode(errors="replace")))
    return [int(t) for t in p.stdout.split()]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rlx", required=True)
    ap.add_argument("--shared", required=True)
    ap.add_argument("--workdir", required=True)
    args = ap.parse_args()
    shared = C.shared_gguf_dir(args.shared)
    os.makedirs(args.workdir, exist_ok=True)
    with open(os.path.join(shared, "brown-heldout.txt"), encoding="utf-8", newline="") as f:
        heldout = f.read()
    texts = {}
    for label, body in (("heldout+extra", heldout + "\n" + EXTRA), ("extra", EXTRA), ("special", SPECIAL_LINE)):
        texts[label] = os.path.join(args.workdir, label + ".txt")
        with open(texts[label], "w", encoding="utf-8", newline="") as f:
            f.write(body)
    failures = []
    want = {}
    for kind in ("draft", "target"):
        model = os.path.join(REPO, "share", "models", "brown", kind)
        for label, path in texts.items():
            for special in (True, False):
                want[kind, label, special] = tokenize(args.rlx, model, path, special)
        if want[kind, "special", True] == want[kind, "special", False]:
            failures.append("%s: %r tokenizes the same with and without --no-special" % (kind, SPECIAL_LINE))
    for name in C.gguf_files(shared):
        kind = "draft" if "-draft-" in name else "target" if "-target-" in name else None
        if kind is None:
            failures.append("%s: cannot tell which Brown model it was converted from" % name)
            continue
        bad = []
        for label, path in texts.items():
            for special in (True, False):
                got = tokenize(args.rlx, os.path.join(shared, name), path, special)
                ref = want[kind, label, special]
                if got != ref:
                    i = next((i for i, (a, b) in enumerate(zip(got, ref)) if a != b), min(len(got), len(ref)))
                    bad.append("%s%s: %d ids vs %d, first difference at %d: gguf %s, tokenizer.json %s" % (
                        label, "" if special else " --no-special", len(got), len(ref), i, got[i:i + 5], ref[i:i + 5]))
        print("%s %s (against share/models/brown/%s: %d ids of the held-out text)" % (
            "FAIL" if bad else "PASS", name, kind, len(want[kind, "heldout+extra", True])))
        failures += ["%s: %s" % (name, b) for b in bad]
    return C.finish("gguf_tokenizer", failures, "%d files" % len(C.gguf_files(shared)))


if __name__ == "__main__":
    sys.exit(main())
