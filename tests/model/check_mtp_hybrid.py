#!/usr/bin/python3
"""Golden test of Qwen3.5's own MTP layer in rlx (and Qwen3.5-MoE's and Qwen3-Next's): against
qwen35_ref.py and across formats.

  check_mtp_hybrid.py --probe PATH/rlx_mtp_probe --rlx PATH/rlx --workdir DIR [--plugin NAME]
                      [--kind KIND --gguf-name NAME]

KIND is make_hybrid.py's kind with an MTP layer (default qwen35-untied-mtp; qwen35moe-mtp and
qwen3next-mtp carry one whose MLP is a mixture of experts), NAME the arch_models.py checkpoint
whose llama.cpp GGUF file step 3 reads (default qwen35; qwen35moe, qwen3next).
1. On make_hybrid.py's KIND checkpoint (qwen35-untied-mtp: nested layout, untied head, an MTP layer
   under Qwen's names: mtp.fc, mtp.pre_fc_norm_*, mtp.layers.0.*, mtp.norm), in F32 and in BF16:
   rlx_mtp_probe (tests/model/mtp_probe.c) writes the target's final-normed hidden rows (prefill
   then two more positions), its last three logits rows, and the MTP layer's logits and hidden
   output over the pairs (tokens[t+1], hidden[t]) (a prefill of half the pairs, then one at a
   time through the MTP layer's KV cache). Each must match qwen35_ref.py (final_hidden, lm_head,
   mtp_forward; float64, the pairs built from its own hidden rows) within check_golden.py's
   LOGITS_TOL relative to max(1, max|ref|). Asking for an MTP layer 1 is an error naming it.
2. `rlx generate --spec mtp --draft-tokens 3` (greedy, ids through --tokens: these directories
   have no tokenizer) gives plain greedy's ids, on both, and every step's log-probabilities
   (the chosen id's and the TOP_LOGPROBS most likely) match log_softmax of qwen35_ref.py's logits
   over the same ids within twice the logits bound: a recurrent or KV state left wrong after a
   rejected draft shows there even where it does not flip an argmax. A random MTP layer's drafts
   are all rejected, so this also runs on a predictable variant (predictable()) whose drafts
   are accepted part of the time (asserted: some accepted, some rejected), which exercises
   accepting drafts and cutting back into a verified forward. On a Qwen3.5 checkpoint without an
   MTP layer --spec mtp fails naming the missing tensor and the weights option.
3. tests/llamacpp/ref/NAME-f32.gguf (qwen35-f32.gguf), whose MTP layer llama.cpp's converter wrote as the nextn
   block blk.4 (rlx renames it to the mtp.* names): the probe's four outputs on the GGUF file
   equal those on the checkpoint it was converted from (written again by
   tests/llamacpp/arch_models.py and checked against the digests llama.cpp converted) within
   GGUF_TOL (both F32: they differ by F32 rounding, in sums the converter's value-head order
   takes in another order); that checkpoint's probe outputs are also checked against
   qwen35_ref.py as in 1; and `rlx generate -p TEXT --spec mtp` on the GGUF file (its tokenizer)
   gives plain greedy's ids, with log-probabilities checked as in 2 (the prompt's ids from
   `rlx tokenize`).
Exits 0 on pass, 1 on failure, with one summary line.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
LLAMACPP = os.path.join(REPO, "tests", "llamacpp")
sys.path.insert(0, HERE)
sys.path.insert(0, LLAMACPP)
import arch_models  # noqa: E402
import check_golden  # noqa: E402
import make_hybrid  # noqa: E402
import qwen35_ref as ref  # noqa: E402
import st  # noqa: E402

LOGITS_TOL = check_golden.LOGITS_TOL
# The GGUF file against its source checkpoint, both run by rlx in F32: measured 2.3e-6 relative at
# most (2.4e-6 with RLX_ISA=c), the size of either's own F32 error against NumPy (~5e-6): the
# linear layers sum over value heads in llama.cpp's tiled order instead of HF's grouped one, and
# the converter, not rlx, computed 1 + w and -exp(A_log). A wrong tensor or order shows as O(1).
GGUF_TOL = 1e-5
SEED = 3
TOKENS = [17, 3, 250, 99, 4, 301, 77, 12, 140, 66, 205, 8, 480]  # < make_hybrid's vocab of 512
GGUF_PROMPT = "The jury said that the city"
GGUF_TOKENS = [52, 3001, 7, 910, 88, 4000, 2, 640, 1200, 33, 2048]  # < the Brown vocabulary's 4096
GEN_STEPS = 16
DRAFT_TOKENS = 3
TOP_LOGPROBS = 5
# predictable(): the target's mixer and MLP outputs (and the MTP layer's, and fc's hidden half)
# scaled by this, so the residual stream stays near the token's embedding and the target nearly
# a bigram model, which an MTP layer that passes its token's embedding through predicts; the
# rest still moves the argmax: greedy ids depart from the pure bigram chain within a few steps.
# Measured: 7 of 21 drafts accepted at 0.05 (10 of 14 at 0.02, 3 of 32 at 0.1, none at 0.5, all at 0).
PREDICTABLE_SCALE = 0.05
OUTPUTS = ("hidden", "logits", "mtp_logits", "mtp_hidden")


class Failure(Exception):
    pass


def compare(what, got, want, tol):
    """max|got - want| within tol * max(1, max|want|); returns the error relative to that."""
    got = np.asarray(got, dtype=np.float64).reshape(want.shape)
    scale = max(1.0, float(np.max(np.abs(want))))
    err = float(np.max(np.abs(got - want))) / scale
    if not np.all(np.isfinite(got)) or not err <= tol:
        raise Failure(f"{what}: max error {err:.3g} x max(1, max|ref|) > {tol:g} x")
    return err


def probe(args, model, tokens, out, layer=0):
    cmd = [args.probe, "--model", model, "--layer", str(layer), "--plugin", args.plugin,
           "--tokens", ",".join(map(str, tokens)), "--out", out]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600)


def probe_outputs(args, model, tokens, out):
    r = probe(args, model, tokens, out)
    if r.returncode != 0:
        raise Failure(f"rlx_mtp_probe on {model} failed (exit {r.returncode}): {r.stderr.strip()}")
    return {name: np.fromfile(f"{out}.{name}.f32", dtype="<f4") for name in OUTPUTS}


def check_reference(what, model_dir, got, tokens):
    """The probe's outputs against the NumPy reference; returns the largest relative error."""
    model = ref.load(model_dir)
    hidden = ref.final_hidden(model, tokens)
    logits = ref.lm_head(model, hidden)
    mtp_logits, mtp_hidden = ref.mtp_forward(model, tokens[1:], hidden[:-1])
    want = {"hidden": hidden, "logits": logits[-3:], "mtp_logits": mtp_logits, "mtp_hidden": mtp_hidden}
    return max(compare(f"{what}: {name}", got[name], want[name], LOGITS_TOL) for name in OUTPUTS)


def rlx_generate(args, model, inputs, *extra):
    # an F32 cache: the log-probabilities are compared with NumPy's F32 arithmetic
    cmd = [args.rlx, "generate", "--model", model, "--plugin", args.plugin, *inputs, "-n", str(GEN_STEPS),
           "--greedy", "--ignore-eos", "-ctk", "f32", *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600)


def generate_json(args, what, model, inputs, *extra):
    r = rlx_generate(args, model, inputs, "--json", "--logprobs", str(TOP_LOGPROBS), *extra)
    lines = [line for line in r.stdout.splitlines() if line.strip()]
    try:
        if r.returncode:
            raise ValueError(f"exit {r.returncode}")
        result = json.loads(lines[-1])
        return [int(t) for t in result["tokens"]], result["logprobs"], int(result["n_prompt"]), r.stderr
    except (IndexError, ValueError, KeyError, TypeError) as e:
        raise Failure(f"{what}: rlx generate {' '.join(extra)} --json: no result ({e}): {r.stderr.strip()[-800:]}")


def log_softmax(x):
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def check_logprobs(what, logprobs, model, prompt, ids):
    """Each step's log-probabilities (the chosen id's and the alternatives') against log_softmax
    of the reference's logits over prompt + ids; returns the largest difference."""
    logits = ref.forward(model, prompt + ids)[len(prompt) - 1:-1]
    want = log_softmax(logits)
    # a log_softmax moves by at most twice the logits' error
    bound = 2 * LOGITS_TOL * max(1.0, float(np.abs(logits).max()))
    if len(logprobs) != len(ids):
        raise Failure(f"{what}: {len(logprobs)} logprobs entries for {len(ids)} ids")
    worst = 0.0
    for step, entry in enumerate(logprobs):
        pairs = [(entry["id"], entry["logprob"])] + [(e["id"], e["logprob"]) for e in entry.get("top_logprobs", [])]
        if entry["id"] != ids[step] or len(pairs) != 1 + TOP_LOGPROBS:
            raise Failure(f"{what}: step {step} lists id {entry['id']} and {len(pairs) - 1} alternatives, want id "
                          f"{ids[step]} and {TOP_LOGPROBS}")
        for token, lp in pairs:
            diff = abs(float(lp) - want[step, token])
            worst = max(worst, diff)
            if not diff <= bound:
                raise Failure(f"{what}: step {step} token {token}: log-probability {float(lp):.6g}, reference "
                              f"{want[step, token]:.6g}, |diff| {diff:.3g} > {bound:.3g}")
    return worst


def check_spec_greedy(args, what, model, inputs, ref_model, prompt=None):
    """--spec mtp's greedy ids against plain greedy's, and both runs' log-probabilities against
    the reference (prompt: the ids of a text prompt). Returns ((proposed, accepted) from
    --stats, the largest log-probability difference)."""
    ids, plain_lp, n_prompt, _ = generate_json(args, what, model, inputs)
    spec_ids, spec_lp, _, stderr = generate_json(args, what, model, inputs, "--spec", "mtp", "--draft-tokens",
                                                 str(DRAFT_TOKENS), "--stats")
    if spec_ids != ids or len(ids) != GEN_STEPS:
        raise Failure(f"{what}: rlx generate --spec mtp gives {spec_ids}, plain greedy {ids}")
    prompt = prompt if prompt is not None else [int(t) for t in inputs[1].split(",")]
    if n_prompt != len(prompt):
        raise Failure(f"{what}: rlx ran a prompt of {n_prompt} ids, want {len(prompt)} ({prompt})")
    err = max(check_logprobs(f"{what}: greedy", plain_lp, ref_model, prompt, ids),
              check_logprobs(f"{what}: --spec mtp", spec_lp, ref_model, prompt, ids))
    m = re.search(r"speculator mtp, \d+ draft tokens: (\d+) proposed, (\d+) accepted", stderr)
    if not m or int(m.group(1)) == 0:
        raise Failure(f"{what}: --spec mtp --stats reports no proposals: {stderr.strip()!r}")
    return (int(m.group(1)), int(m.group(2))), err


def predictable(src, out):
    """A copy of checkpoint src whose MTP drafts the target often accepts (PREDICTABLE_SCALE):
    the target's o_proj, out_proj and down_proj (every expert's, the shared expert's) scaled,
    and the MTP layer made to pass its
    token's embedding through (fc the identity on the normed embedding, pre_fc_norm_embedding
    1, mtp.norm the target's norm) with its hidden half and its decoder layer's outputs scaled
    the same: its logits are then near the target's at the token it is given."""
    tensors, _ = st.read(src)
    text = ref.load(src).prefix
    for name in tensors:
        # mlp.experts.down_proj: fused experts
        if name.startswith((text + "layers.", "mtp.layers.")) and \
                name.endswith(("o_proj.weight", "out_proj.weight", "down_proj.weight", "experts.down_proj")):
            tensors[name] = tensors[name] * np.float32(PREDICTABLE_SCALE)
    h = tensors[text + "embed_tokens.weight"].shape[1]
    fc = tensors["mtp.fc.weight"] * np.float32(PREDICTABLE_SCALE)
    fc[:, :h] = np.eye(h, dtype=np.float32)  # the embedding half (vLLM: cat([embeds, hidden]))
    tensors["mtp.fc.weight"] = fc
    tensors["mtp.pre_fc_norm_embedding.weight"] = np.zeros(h, np.float32)  # (1 + w) = 1
    tensors["mtp.norm.weight"] = tensors[text + "norm.weight"]
    os.makedirs(out)
    for f in ("config.json", "generation_config.json"):
        shutil.copyfile(os.path.join(src, f), os.path.join(out, f))
    st.write(out, [(n, a.shape, lambda a=a: [a]) for n, a in tensors.items()], "F32")
    return out


def prompt_ids(args, model, text):
    r = subprocess.run([args.rlx, "tokenize", "-m", model, "-p", text], capture_output=True, text=True, timeout=600)
    try:
        if r.returncode:
            raise ValueError(f"exit {r.returncode}")
        return [int(t) for t in r.stdout.split()]
    except ValueError as e:
        raise Failure(f"rlx tokenize -m {model} failed ({e}): {r.stderr.strip()}")


def check_errors(args):
    """An MTP layer Qwen3.5 checkpoints do not have, and --spec mtp on a checkpoint without one."""
    model = os.path.join(args.workdir, f"{args.kind}-f32")
    r = probe(args, model, TOKENS, os.path.join(args.workdir, "error"), layer=1)
    if r.returncode != 1 or "one MTP layer, not layer 1" not in r.stderr:
        raise Failure(f"MTP layer 1: want exit 1 and an error naming it, got exit {r.returncode}: "
                      f"{r.stderr.strip()!r}")
    plain = os.path.join(args.workdir, "qwen35-tied-f32")
    make_hybrid.build("qwen35-tied", "f32", 1, SEED, plain)
    r = rlx_generate(args, plain, ["--tokens", ",".join(map(str, TOKENS))], "--spec", "mtp")
    if r.returncode != 1 or "'mtp.pre_fc_norm_embedding.weight'" not in r.stderr or "weights=FILE" not in r.stderr:
        raise Failure(f"rlx generate --spec mtp without an MTP layer: exit {r.returncode}: {r.stderr.strip()!r}")


def source_checkpoint(workdir, name):
    """The checkpoint NAME-f32.gguf was converted from, written again and checked against the
    digests recorded when llama.cpp converted it."""
    with open(os.path.join(LLAMACPP, "ref", "llama.cpp.json")) as f:
        recorded = json.load(f)["models"][name]["sha256"]
    path = os.path.join(workdir, name)
    got = arch_models.build(name, path)
    changed = sorted(f for f in set(got) | set(recorded) if got.get(f) != recorded.get(f))
    if changed:
        raise Failure(f"the {name} checkpoint written now differs from the one llama.cpp converted in "
                      f"{', '.join(changed)} (tests/llamacpp/README.md: run make_refs.py again)")
    return path


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--probe", required=True)
    ap.add_argument("--rlx", required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--plugin", default="cpu-blas")
    ap.add_argument("--kind", default="qwen35-untied-mtp", help="make_hybrid.py's kind, with an MTP layer")
    ap.add_argument("--gguf-name", default="qwen35", help="the arch_models.py checkpoint of step 3's GGUF file")
    args = ap.parse_args(argv)
    kind, gguf_name = args.kind, args.gguf_name
    gguf = os.path.join(LLAMACPP, "ref", f"{gguf_name}-f32.gguf")
    shutil.rmtree(args.workdir, ignore_errors=True)
    os.makedirs(args.workdir)
    tokens = ["--tokens", ",".join(map(str, TOKENS))]
    try:
        worst, lp_err, counts = 0.0, 0.0, {}

        def spec(what, model, inputs, ref_model, prompt=None):
            nonlocal lp_err
            counts[what], err = check_spec_greedy(args, what, model, inputs, ref_model, prompt)
            lp_err = max(lp_err, err)

        for dtype in ("f32", "bf16"):
            model = os.path.join(args.workdir, f"{kind}-{dtype}")
            make_hybrid.build(kind, dtype, 1, SEED, model)
            got = probe_outputs(args, model, TOKENS, os.path.join(args.workdir, f"{kind}-{dtype}"))
            worst = max(worst, check_reference(f"{kind} {dtype}", model, got, TOKENS))
            spec(f"{kind} {dtype}", model, tokens, ref.load(model))
        model = predictable(os.path.join(args.workdir, f"{kind}-f32"), os.path.join(args.workdir, "predictable"))
        spec("predictable", model, tokens, ref.load(model))
        proposed, accepted = counts["predictable"]
        if not 0 < accepted < proposed:
            raise Failure(f"the predictable model's MTP drafts: {accepted} of {proposed} accepted; the check needs "
                          f"some accepted and some rejected (PREDICTABLE_SCALE)")
        check_errors(args)
        hf = source_checkpoint(args.workdir, gguf_name)
        got_hf = probe_outputs(args, hf, GGUF_TOKENS, os.path.join(args.workdir, "hf"))
        worst = max(worst, check_reference(f"{gguf_name} checkpoint", hf, got_hf, GGUF_TOKENS))
        got_gguf = probe_outputs(args, gguf, GGUF_TOKENS, os.path.join(args.workdir, "gguf"))
        gguf_err = max(compare(f"{os.path.basename(gguf)} vs its checkpoint: {name}", got_gguf[name],
                               got_hf[name].astype(np.float64), GGUF_TOL) for name in OUTPUTS)
        spec(os.path.basename(gguf), gguf, ["-p", GGUF_PROMPT], ref.load(hf), prompt_ids(args, gguf, GGUF_PROMPT))
    except Failure as e:
        print(f"FAIL {e}")
        return 1
    notes = ", ".join(f"{what} {a}/{p}" for what, (p, a) in counts.items())
    print(f"PASS {kind} MTP layer: target hidden rows and logits, MTP logits and hidden output against NumPy "
          f"(F32, BF16 and the GGUF's source; max error {worst:.3g} x max(1,|ref|)); the GGUF file equals its "
          f"checkpoint (max {gguf_err:.3g}); --spec mtp gives greedy's ids and log-probabilities (max |diff| "
          f"{lp_err:.2g}; drafts accepted: {notes}); errors named")
    return 0


if __name__ == "__main__":
    sys.exit(main())
