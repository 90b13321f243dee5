#!/usr/bin/python3
"""Greedy decoding of every llama.cpp-written GGUF file continues each prompt as llama.cpp did.

  test_gguf_greedy.py --rlx BIN --shared DIR/shared/gguf [--steps 32] [-- EXTRA_RLX_ARGS...]

reference/llama.cpp.json holds, per file, three prompts and the text llama-completion printed
after each (-n 48 --temp 0, stopping early at the end-of-text token). For each file and prompt,
  rlx generate -m FILE -p PROMPT -n 32 --temp 0 --json --logprobs 5
(the same generation as without --json, which only adds the token ids) must print a prefix of
llama.cpp's continuation and either generate all 32 tokens or, when it stops at an
end-of-sequence token first, print llama.cpp's whole continuation: llama.cpp stopped there too.
So the first 32 tokens are llama.cpp's, compared as text because llama.cpp's ids are not
stored.

One exception, measured rather than assumed: a divergence at a near tie. llama.cpp wrote these
continuations with its default flash attention, whose CPU kernel rounds Q, K and V to F16 and
accumulates the weighted values in F16; rlx keeps attention in F32. Where two candidates are
within a few thousandths of a logit, that rounding decides, and llama.cpp itself, run with
-fa off, takes rlx's token there (on this data: llama.cpp d32676d77 with -fa off -ctk f32
-ctv f32 prints exactly rlx's text for all 36 pairs, and the two pairs that leave the default
run do so at gaps of 0.0014 and 0.0031). So when rlx's text leaves llama.cpp's at token k < 32,
the pair still passes if rlx's logit margin there, between its own token and the first token of
llama.cpp's remaining text, is below NEAR_TIE; any wider margin is a real difference and fails.
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

# A margin a difference of F16 against F32 attention can flip (the measured ties are 0.0014 and
# 0.0031; logits here are of size 10-30, and F16 keeps 11 bits), far below the margins of the
# tokens the models choose with conviction.
NEAR_TIE = 0.01


def detokenize(rlx, model, ids):
    if not ids:  # rlx's text of no tokens (when the first generated token already differs)
        return ""
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


def tie_margin(rlx, model, logprobs, ids, at, rest):
    """rlx's log-probability of its own token at generated position `at` minus that of the first
    token of llama.cpp's remaining text `rest` (a difference of log-softmax values is the
    difference of the logits), from the generation's own top log-probabilities, so the margin is
    the one the decode steps had; infinite when llama.cpp's token is not among them."""
    p = C.run([rlx, "tokenize", "-m", model, "-p", rest], timeout=60)
    theirs = int(p.stdout.split()[0])
    top = {e["id"]: e["logprob"] for e in logprobs[at]["top_logprobs"]}
    return top[ids[at]] - top[theirs] if theirs in top else float("inf")


def check_case(rlx, model, prompt, want, steps, rlx_args=(), near_tie=NEAR_TIE):
    """Greedy decoding of prompt by rlx on model (a GGUF file or a Hugging Face directory)
    against llama.cpp's continuation `want`, as the module's docstring says (near ties: margins
    below near_tie). Returns (verdict, detail, failure): verdict "pass", "tie", "error" or
    "FAIL"; failure is None or the message."""
    start = time.time()
    # rlx's cache in F32, not its F16 default: the near-tie rule above is about F32 attention
    p = C.run([rlx, "generate", "-m", model, "-p", prompt, "-n", str(steps), "--temp", "0",
               "--json", "--logprobs", "5", "-ctk", "f32", *rlx_args], timeout=300)
    took = time.time() - start
    if p.returncode != 0:
        return "error", "", "rlx generate exited %s: %s" % (p.returncode, p.stderr.decode(errors="replace")[-400:])
    out = json.loads(p.stdout)
    text, ids = out["text"], out["tokens"]
    complete = len(ids) == steps or text == want
    if want.startswith(text) and complete:
        return "pass", "%d tokens, %.1f s" % (len(ids), took), None
    at = first_wrong_token(rlx, model, ids, want)
    common = os.path.commonprefix([text, want])
    if not want.startswith(text):
        rest = want[len(detokenize(rlx, model, ids[:at])):]
        margin = tie_margin(rlx, model, out["logprobs"], ids, at, rest)
        if 0 <= margin < near_tie:
            return "tie", "leaves at token %d on a near tie (margin %.4f)" % (at, margin), None
        why = "diverges at token %d (character %d), margin %.4f" % (at, len(common), margin)
    else:
        why = "stopped after %d tokens (%s) before llama.cpp's end" % (len(ids), out.get("stopped_by"))
    return "FAIL", why, "%s\n    rlx:       %r\n    llama.cpp: %r" % (why, text, want[:len(text) + 20])


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
            verdict, detail, failure = check_case(args.rlx, model, case["prompt"], case["continuation"],
                                                  args.steps, args.rlx_args)
            rows.append((name, k, verdict, detail))
            if failure:
                failures.append("%s prompt %d %r: %s" % (name, k, case["prompt"], failure))
            else:
                passes += 1
    print("%-26s %-6s %-5s %s" % ("file", "prompt", "", "detail"))
    for name, k, verdict, detail in rows:
        print("%-26s %-6d %-5s %s" % (name, k, verdict, detail))
    return C.finish("gguf_greedy", failures, "%d of %d pairs pass" % (passes, len(rows)))


if __name__ == "__main__":
    sys.exit(main())
