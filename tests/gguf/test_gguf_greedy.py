#!/usr/bin/python3
"""Greedy decoding of every llama.cpp-written GGUF file continues each prompt as llama.cpp did.

  test_gguf_greedy.py --rlx BIN --shared DIR/shared/gguf [--steps 32] [-- EXTRA_RLX_ARGS...]

reference/llama.cpp.json holds, per file, three prompts and the text llama-completion printed
after each (-n 48 --temp 0, stopping early at the end-of-text token). For each file and prompt,
  rlx generate -m FILE -p PROMPT -n 32 --temp 0 --json
(the same generation as without --json, which only adds the token ids) must print a prefix of
llama.cpp's continuation and either generate all 32 tokens or, when it stops at an
end-of-sequence token first, print llama.cpp's whole continuation: llama.cpp stopped there too.
So the first 32 tokens are llama.cpp's, compared as text because llama.cpp's ids are not
stored. Greedy decoding amplifies any numerical difference into a different token once two
candidates are close, so this is an end-to-end check of the quantized matmuls, not of the
dequantization alone: llama.cpp's CPU kernels quantize the activations to 8 bits (Q8_0 for
Q4_0/Q8_0 weights, Q8_K for the K types) before the dot products and keep the KV cache in F16,
and a backend that does not will take the other token where the top two logits are that
close. The test states the requirement as it is, and prints for a failing pair the index (from
0) of rlx's first generated token whose text leaves llama.cpp's continuation.
Runs the default backend unless EXTRA_RLX_ARGS choose another. Exits 77 when the shared
directory is absent.
"""
import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import gguf_common as C  # noqa: E402


def detokenize(rlx, model, ids):
    p = C.run([rlx, "detokenize", "-m", model, "--ids", ",".join(map(str, ids))], timeout=60)
    if p.returncode != 0:
        raise SystemExit("FAIL: rlx detokenize exited %s: %s" % (p.returncode, p.stderr.decode(errors="replace")))
    return p.stdout.decode("utf-8", errors="replace")


def first_wrong_token(rlx, model, ids, want):
    """The index of rlx's first generated token whose text leaves llama.cpp's continuation: the
    smallest k with the text of ids[:k + 1] not a prefix of want (binary search; being a prefix
    is monotone in k)."""
    lo, hi = 0, len(ids)  # ids[:lo] is a prefix, ids[:hi] is not (when hi < len(ids) + 1)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if want.startswith(detokenize(rlx, model, ids[:mid])):
            lo = mid
        else:
            hi = mid - 1
    return lo


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rlx", required=True)
    ap.add_argument("--shared", required=True)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("rlx_args", nargs="*", help="extra rlx arguments, after --")
    args = ap.parse_args()
    shared = C.shared_gguf_dir(args.shared)
    ref = C.reference(shared)
    failures, passes, rows = [], 0, []
    for name in C.gguf_files(shared):
        if name not in ref:
            failures.append("%s has no entry in reference/llama.cpp.json" % name)
            continue
        model = os.path.join(shared, name)
        for k, case in enumerate(ref[name]["greedy"]):
            prompt, want = case["prompt"], case["continuation"]
            start = time.time()
            p = C.run([args.rlx, "generate", "-m", model, "-p", prompt, "-n", str(args.steps), "--temp", "0",
                       "--json", *args.rlx_args], timeout=300)
            took = time.time() - start
            label = "%s prompt %d %r" % (name, k, prompt)
            if p.returncode != 0:
                failures.append("%s: rlx generate exited %s: %s" % (label, p.returncode,
                                                                    p.stderr.decode(errors="replace")[-400:]))
                rows.append((name, k, "error", ""))
                continue
            out = json.loads(p.stdout)
            text, ids = out["text"], out["tokens"]
            complete = len(ids) == args.steps or text == want
            if want.startswith(text) and complete:
                passes += 1
                rows.append((name, k, "pass", "%d tokens, %.1f s" % (len(ids), took)))
                continue
            at = first_wrong_token(args.rlx, model, ids, want)
            common = os.path.commonprefix([text, want])
            why = ("stopped after %d tokens (%s) before llama.cpp's end" % (len(ids), out.get("stopped_by"))
                   if want.startswith(text) else "diverges at token %d (character %d)" % (at, len(common)))
            failures.append("%s: %s\n    rlx:       %r\n    llama.cpp: %r" % (label, why, text, want[:len(text) + 20]))
            rows.append((name, k, "FAIL", why))
    print("%-26s %-6s %-5s %s" % ("file", "prompt", "", "detail"))
    for name, k, verdict, detail in rows:
        print("%-26s %-6d %-5s %s" % (name, k, verdict, detail))
    return C.finish("gguf_greedy", failures, "%d of %d pairs pass" % (passes, len(rows)))


if __name__ == "__main__":
    sys.exit(main())
