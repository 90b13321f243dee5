#!/usr/bin/python3
"""rlx against llama.cpp on one architecture, from the Hugging Face checkpoint and from the GGUF
files llama.cpp's own converter and quantizer wrote from it.

  test_llamacpp.py --rlx BIN --model NAME --workdir DIR [--steps 32] [-- EXTRA_RLX_ARGS...]

ref/llama.cpp.json (make_refs.py; the commands are in it and in README.md) holds, for checkpoint
NAME of arch_models.py, the digests of the files llama.cpp converted, and for each GGUF file made
from it what llama-completion and llama-perplexity computed. This test
  1. writes the checkpoint again (arch_models.build) and checks that it hashes as the one
     llama.cpp converted, so the committed results belong to these weights;
  2. greedy: for each file, rlx generate -m FILE -p PROMPT -n 32 --temp 0 continues each prompt
     with llama.cpp's text (tests/gguf/test_gguf_greedy.py's rule, near ties included), and so
     does rlx on the checkpoint directory against llama.cpp on the F32 file (the same values).
     llama.cpp's text is the one it writes with attention in F32 (-fa off -ctk f32 -ctv f32),
     as rlx computes attention: its default flash attention over an F16 cache rounds Q, K and V
     to F16, which on these random-weight models (logits up to ~20, top-2 gaps often of
     hundredths) changes 8 of the 18 48-token continuations, at margins up to 0.05 (measured
     on rlx's logits where rlx left the default text within 32 tokens: 0.0058, 0.0132, 0.0319,
     0.0526); with F32 attention llama.cpp prints rlx's first 32 tokens in all of them (one
     file, llama-q8_0.gguf, leaves at token 29 on a tie of 0.0094: its 8-bit activations; the
     files with quantized matrices have a wider near tie, QUANT_NEAR_TIE, which says why);
  3. perplexity: rlx perplexity -m FILE -f ref/heldout.txt -c 256 within 0.3 % of llama.cpp's
     figure for each file, and on the checkpoint directory within 0.3 % of the F32 file's; the
     figure llama.cpp computes with attention in F32 where ref/llama.cpp.json has it (the
     checkpoints made since the MoE hybrids: on qwen35moe-q8_0.gguf llama.cpp's default F16
     attention moves it by 0.35 %, its rounding amplified by the 8-bit activations and the
     experts' routing), else its default figure;
  4. the NumPy reference (tests/model/qwen3_ref.py; qwen35_ref.py for the Qwen3.5 hybrid, through
     check_golden_hybrid.py, which adds the decode steps' log-probabilities) on the checkpoint:
     rlx logits and greedy ids on the checkpoint directory and on the F32 GGUF file within
     check_golden.py's bound, so a tensor llama.cpp's converter reorders (Llama's Q and K rows,
     Qwen3.5's value heads) must be read back exactly.
Steps 2 and 3 run on ref/llama.cpp.json's variants of NAME's files too: a copy with tokenizer
metadata changed (llama-bos-f32.gguf: its tokenizer adds a BOS, which llama-perplexity puts first
in every chunk and llama-completion before the prompt), which make_refs.py wrote with llama.cpp's
gguf-py and this test writes again with tests/gguf/gguf_ref.py, checking that the bytes hash alike.
"""
import argparse
import hashlib
import json
import os
import shutil
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path[:0] = [HERE, os.path.join(REPO, "tests", "gguf"), os.path.join(REPO, "tests", "model")]
import arch_models  # noqa: E402
import check_golden as golden  # noqa: E402
import check_golden_hybrid as golden_hybrid  # noqa: E402
import gguf_common as C  # noqa: E402
import gguf_ref  # noqa: E402
import qwen35_ref  # noqa: E402
import qwen3_ref  # noqa: E402
import surfaces  # noqa: E402
import test_gguf_greedy as greedy  # noqa: E402
import test_gguf_perplexity as perplexity  # noqa: E402

REF = os.path.join(HERE, "ref")
TEXT = os.path.join(REF, "heldout.txt")

# The near tie of a file with block-quantized matrices. Their matmuls round every activation to
# 8 bits (rlx and llama.cpp alike, kern_quant.h), and the bits those activations come in with
# are the norms', attention's and SwiGLU's, which each ISA level of rlx (and llama.cpp) rounds
# in its own way in the last place: where one such last bit moves an 8-bit rounding, later
# logits move by far more than an F32 rounding. Measured with rlx on these random models, its
# logits at RLX_ISA=c against avx2 over llama.cpp's continuations of the q8_0 files' 9 prompts:
# 3 of 423 positions moved, by 0.03, 0.11 and 0.11; over rlx's own continuation of mistral's
# first prompt, by 0.22 (an AVX2 machine left llama.cpp's text there at a margin of 0.11).
# Below this margin the token is the CPU's choice, not rlx's; the perplexity bound and the F32
# files' greedy text still hold every level to llama.cpp.
QUANT_NEAR_TIE = 0.3


def checkpoint(name, entry, workdir):
    """The checkpoint written again into workdir, or SystemExit if it is not the one converted."""
    path = os.path.join(workdir, name)
    shutil.rmtree(path, ignore_errors=True)
    got = arch_models.build(name, path)
    changed = sorted(f for f in set(got) | set(entry["sha256"]) if got.get(f) != entry["sha256"].get(f))
    if changed:
        raise SystemExit("FAIL: the %s checkpoint written now differs from the one llama.cpp converted in %s: "
                         "make_model.py or arch_models.py changed; run make_refs.py again (README.md)"
                         % (name, ", ".join(changed)))
    return path


def quantized(path):
    """Whether path is a GGUF file with block-quantized tensors (a directory is the F32 checkpoint)."""
    if os.path.isdir(path):
        return False
    return any(t.type not in (gguf_ref.F32, gguf_ref.F16, gguf_ref.BF16) for t in gguf_ref.read(path).tensors)


def variant(name, entry, workdir):
    """The variant written again into workdir (gguf_ref: the source file's metadata with entry's
    values replaced, and its tensors), or SystemExit if it is not the file llama.cpp ran."""
    src = gguf_ref.read(os.path.join(REF, entry["source"]))
    metadata = []
    for key, value in src.metadata.items():
        vtype = src.value_types[key]
        value = entry["metadata"].get(key, value)
        metadata.append((key, (gguf_ref.ARRAY, (vtype[1], value)) if isinstance(vtype, tuple) else (vtype, value)))
    tensors = [(t.name, t.dims, t.type, src.raw(t.name)) for t in src.tensors]
    path = os.path.join(workdir, name)
    digest = hashlib.sha256(gguf_ref.write(path, metadata, tensors, src.version, src.alignment)).hexdigest()
    if digest != entry["sha256"]:
        raise SystemExit("FAIL: %s written again from %s has sha256 %s, not the %s llama.cpp ran on: %s or "
                         "gguf_ref.py's writer changed; run make_refs.py again (README.md)"
                         % (name, entry["source"], digest, entry["sha256"], entry["source"]))
    return path


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rlx", required=True)
    ap.add_argument("--model", required=True, choices=sorted(arch_models.MODELS))
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--timeout", type=float, default=600, help="seconds per rlx command")
    ap.add_argument("--node", help="node, for step 5's chat check (with --npm)")
    ap.add_argument("--npm", help="the directory holding node_modules/@huggingface/jinja (tests/text's fetch)")
    ap.add_argument("--chat-template-of", metavar="TOKENIZER_CONFIG",
                    help="step 5's chat check renders the GGUF files with this tokenizer_config.json's chat_template")
    ap.add_argument("rlx_args", nargs="*", help="extra rlx arguments, after --")
    args = ap.parse_args()
    # rlx's cache in F32, not its F16 default: llama.cpp's figures here are its F32 attention's
    args.rlx_args = ["-ctk", "f32", *args.rlx_args]
    with open(os.path.join(REF, "llama.cpp.json")) as f:
        ref = json.load(f)
    if args.model not in ref["models"]:
        raise SystemExit("FAIL: ref/llama.cpp.json has no checkpoint %s: run make_refs.py --only %s"
                         % (args.model, args.model))
    files = sorted(n for n, e in ref["files"].items() if e["model"] == args.model)
    # A file added to ref/ without its llama.cpp results would otherwise go untested.
    unlisted = sorted(set(n for n in os.listdir(REF) if n.startswith(args.model + "-") and n.endswith(".gguf"))
                      - set(files))
    if unlisted:
        raise SystemExit("FAIL: ref/llama.cpp.json has no results for %s" % ", ".join(unlisted))
    f32 = "%s-f32.gguf" % args.model
    if f32 not in files:
        raise SystemExit("FAIL: ref/llama.cpp.json has no %s" % f32)
    os.makedirs(args.workdir, exist_ok=True)
    hf = checkpoint(args.model, ref["models"][args.model], args.workdir)

    # (what rlx reads, its label, the file whose llama.cpp results it must give, those results)
    subjects = [(hf, "%s (Hugging Face)" % args.model, f32, ref["files"][f32])]
    subjects += [(os.path.join(REF, n), n, n, ref["files"][n]) for n in files]
    subjects += [(variant(n, e, args.workdir), n, n, e)
                 for n, e in sorted(ref["variants"].items()) if e["model"] == args.model]
    failures, rows = [], []
    for path, label, against, want in subjects:
        near_tie = QUANT_NEAR_TIE if quantized(path) else greedy.NEAR_TIE
        for k, (case, default) in enumerate(zip(want["greedy_f32_attention"], want["greedy"])):
            verdict, detail, failure = greedy.check_case(args.rlx, path, case["prompt"], case["continuation"],
                                                         args.steps, args.rlx_args, near_tie)
            if default["continuation"] != case["continuation"]:
                detail += " (llama.cpp's default F16 attention leaves this text at character %d)" % len(
                    os.path.commonprefix([default["continuation"], case["continuation"]]))
            rows.append("%-22s greedy %d  %-5s %s" % (label, k, verdict, detail))
            if failure:
                failures.append("%s prompt %d %r: %s" % (label, k, case["prompt"], failure))
        ppl, took, error = perplexity.rlx_perplexity(args.rlx, path, TEXT, args.timeout, args.rlx_args)
        if error:
            failures.append("%s: %s" % (label, error))
            rows.append("%-22s perplexity FAIL no figure" % label)
            continue
        # llama.cpp's figure with attention in F32 where make_refs.py recorded it (as for greedy)
        want_ppl = want.get("perplexity_f32_attention", want["perplexity"])
        rel = (ppl - want_ppl) / want_ppl
        ok = abs(rel) <= perplexity.REL_TOL
        rows.append("%-22s perplexity %-5s rlx %.4f, llama.cpp %.4f (%s): %+.3f %% (%.1f s)" % (
            label, "pass" if ok else "FAIL", ppl, want_ppl, against, 100 * rel, took))
        if not ok:
            failures.append("%s: PPL %.4f differs from llama.cpp's %.4f on %s by %+.3f %% (limit %.1f %%)" % (
                label, ppl, want_ppl, against, 100 * rel, 100 * perplexity.REL_TOL))

    hybrid = arch_models.hybrid(args.model)
    model = (qwen35_ref if hybrid else qwen3_ref).load(hf)
    case = (golden_hybrid if hybrid else golden).golden_case(model)
    for path, label in ((hf, "%s (Hugging Face)" % args.model), (os.path.join(REF, f32), f32)):
        try:
            rlx = golden.Rlx(args.rlx, path, model.config["vocab_size"], args.rlx_args, args.timeout,
                             os.path.join(args.workdir, "out", os.path.basename(path)))
            weights, moe_layers = rlx.plan(len(case.sequence))
            if hybrid:
                # check_golden_hybrid.py's bound: with BF16 activations, ids only up to the
                # reference's first near tie
                tol, checked = golden.LOGITS_TOL, None
                if weights or moe_layers:
                    tol = golden.BF16_TOL_EXACT
                    margins = np.diff(np.sort(case.step_logits(), axis=-1)[:, -2:], axis=-1)[:, 0]
                    bound = 2 * tol * max(1.0, float(np.abs(case.logits).max()))
                    checked = next((i for i, m in enumerate(margins) if m <= bound), len(margins))
                detail = golden_hybrid.check(rlx, case, tol, checked)
            elif weights or moe_layers:
                detail = golden.check_bf16(rlx, model, case, weights, moe_layers)
            else:
                err_all, err_last = golden.check(rlx, case, golden.LOGITS_TOL)
                detail = "logits max|diff| %.2g (all), %.2g (last); %d greedy ids match" % (
                    err_all, err_last, len(case.generated))
            rows.append("%-22s numpy  pass  %s" % (label, detail))
        except golden.Failure as e:
            failures.append("%s against the NumPy reference: %s" % (label, e))
            rows.append("%-22s numpy  FAIL" % label)
    jinja = (args.node, args.npm) if args.node and args.npm else None
    template = None
    if args.chat_template_of:
        with open(args.chat_template_of) as f:
            template_text = json.load(f)["chat_template"]
        template = os.path.join(args.workdir, "chat_template.jinja")
        with open(template, "w") as f:
            f.write(template_text)
    # 5. the first prompt through a pipeline, speculative decoding, serve and chat (surfaces.py)
    prompt = ref["files"][f32]["greedy_f32_attention"][0]["prompt"]
    q8 = os.path.join(REF, "%s-q8_0.gguf" % args.model)
    # the Q8_0 file proposes the model's own tokens nearly always; a draft of another architecture
    # proposes tokens the model mostly rejects, so its KV cache must roll back
    other = "%s-f32.gguf" % ("qwen2" if args.model != "qwen2" else "llama")
    drafts = [("q8_0", q8), (other, os.path.join(REF, other))]
    checks = [(hf, "%s (Hugging Face)" % args.model, None), (os.path.join(REF, f32), f32, template)]
    for path, label, template_file in checks:
        got, failed = surfaces.check(args.rlx, path, prompt, args.steps, args.timeout, drafts, jinja,
                                      template_file)
        rows += ["%-22s %s" % (label, r) for r in got]
        failures += ["%s %s" % (label, f) for f in failed]
    for path, label, _, _ in subjects[len(files) + 1:] if jinja else ():  # variants: a tokenizer adding a BOS
        try:
            rows.append("%-22s chat     pass  %s" % (label, surfaces.check_chat(
                args.rlx, path, prompt, args.steps, args.timeout, jinja, template)))
        except surfaces.Failure as e:
            rows.append("%-22s chat     FAIL" % label)
            failures.append("%s chat: %s" % (label, e))
    for row in rows:
        print(row)
    return C.finish("llamacpp_%s" % args.model, failures, "%d checks" % len(rows))


if __name__ == "__main__":
    sys.exit(main())
