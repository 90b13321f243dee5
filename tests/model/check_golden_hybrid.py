#!/usr/bin/python3
"""Golden test of the Qwen3.5 hybrids (qwen3_5, qwen3_5_moe, qwen3_next): rlx logits, greedy ids
and decode log-probabilities against the NumPy reference (qwen35_ref.py).

  check_golden_hybrid.py --rlx PATH/rlx --workdir DIR [--kind K] [--dtype D] [--shards N]
                         [--seed S] [--tol T] [--timeout SEC] [-- EXTRA_RLX_ARGS...]
  check_golden_hybrid.py --rlx PATH/rlx --workdir DIR --model MODEL_DIR [...] [-- ...]
  check_golden_hybrid.py --self-test

Uses MODEL_DIR, or builds (and caches under DIR/models) the random-weight Qwen3.5 model of that
kind, dtype, shard count and seed (make_hybrid.py); picks a prompt whose float64 greedy path is
well conditioned (check_golden.py's margins); then runs, with EXTRA_RLX_ARGS appended:
  rlx logits   --model M --tokens SEQ --all --out F     every position of prompt + continuation
                                                        in one pass (prefill: the chunked form)
  rlx logits   --model M --tokens PROMPT --out F        the last position
  rlx generate --model M --tokens PROMPT -n 12 --greedy --ignore-eos --json --logprobs 20
               the greedy ids, and each step's log-probabilities (the chosen id's and the 20 most
               likely): the first from the prefill, the rest from decode steps that carry the
               conv and recurrent states and the KV rows, compared with log_softmax of the
               reference's one-pass logits
and exits 0 on pass, 1 on failure, one summary line either way. The CLI cannot run a prompt's
logits in two parts (rlx logits is one forward over --tokens); prefill-then-decode through the
states is what the generate check covers. Where `rlx graph` shows BF16-activation nodes the
logits bound is check_golden.BF16_TOL_EXACT and ids are compared while the reference's top-1
margin exceeds twice it (no BF16 oracle of the hybrid exists yet).

--self-test needs no rlx: the reference's own self-test (chunked == recurrent == unrolled delta
rule, one pass == parts == prefill + decode, M-RoPE == partial RoPE for text), every golden
model has a qualifying prompt, and this harness run against a stand-in rlx made of the
reference passes, and fails when the stand-in's logits are off by 1e-2 or its decode drops the
state.
"""
import argparse
import json
import os
import stat
import subprocess
import sys
import tempfile
import traceback

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import check_golden as cg  # noqa: E402
import make_hybrid  # noqa: E402
import qwen35_ref as ref  # noqa: E402
from check_golden import Failure, compare_logits  # noqa: E402

DEFAULT_KIND = "qwen35-tied"
TOP_LOGPROBS = 20  # rlx generate's maximum (APP_MAX_LOGPROBS)
# The float32 reference drifts from the float64 one by up to 1.0e-5 of max|logits| on these
# models (Qwen3's reach ~1e-6): a head with a fast decay (A near HF's upper bound 16) keeps
# little more than the current token, and where q.k nearly cancels its output o = S^T q is ~1e-4
# of its terms, so o carries the cancellation's relative error into the gated RMSNorm (whose eps
# 1e-6 is above |o|^2 there). check_golden's bound still leaves 4x room over that, checked here.
F32_ROOM = 4
# The golden models of ctest and the self-test: every kind in both storage dtypes
GOLDEN = [(kind, dtype) for kind in make_hybrid.SELF_TEST_KINDS for dtype in ("f32", "bf16")]


class Case:
    """A prompt, the reference greedy continuation and the float64 one-pass logits over both."""

    def __init__(self, prompt, generated, logits, rel_margin):
        self.prompt, self.generated, self.logits, self.rel_margin = prompt, generated, logits, rel_margin

    @property
    def sequence(self):
        return self.prompt + self.generated

    def step_logits(self):
        """The logits each generate step chose from: positions n_prompt-1 .. end-1."""
        return self.logits[len(self.prompt) - 1:-1]


def specials(model):
    """Ids prompts stay below: bos, eos and the nested config's image/video ids (all at the top of
    the vocabulary, as in Qwen3.5)."""
    c, outer = model.config, model.outer
    ids = [c.get("bos_token_id"), outer.get("image_token_id"), outer.get("video_token_id"),
           outer.get("vision_start_token_id"), outer.get("vision_end_token_id")] + ref.eos_ids(model.directory)
    return [i for i in ids if i is not None]


def condition(model, prompt, steps=cg.GEN_STEPS):
    generated = ref.greedy(model, prompt, steps)
    logits = ref.forward(model, prompt + generated)
    top2 = np.sort(logits[len(prompt) - 1:-1], axis=-1)[:, -2:]
    rel = (top2[:, 1] - top2[:, 0]) / np.maximum(1.0, np.abs(top2[:, 1]))
    return Case(list(prompt), generated, logits, float(rel.min()))


def golden_case(model, steps=cg.GEN_STEPS):
    """The first well-conditioned prompt among candidates drawn from (PROMPT_SEED, attempt), by
    check_golden's rules (top-1 margin, no special id, enough distinct ids)."""
    special = specials(model)
    low = min(special + [model.vocab])
    best = None
    for attempt in range(cg.PROMPT_ATTEMPTS):
        rng = np.random.default_rng([cg.PROMPT_SEED, attempt])
        case = condition(model, [int(t) for t in rng.integers(0, low, cg.PROMPT_LEN)], steps)
        if (case.rel_margin >= cg.MIN_REL_MARGIN and not set(case.generated) & set(special)
                and len(set(case.generated)) >= min(cg.MIN_DISTINCT, steps)):
            return case
        best = case if best is None or case.rel_margin > best.rel_margin else best
    raise Failure(f"no prompt qualified in {cg.PROMPT_ATTEMPTS} attempts (best top-1 margin {best.rel_margin:.2g})")


def model_dir(workdir, kind, dtype, shards, seed):
    """check_golden's cache of built models, with make_hybrid as the generator."""
    return cg.model_dir(workdir, kind, dtype, shards, seed, maker=make_hybrid,
                        sources=("make_hybrid.py", "make_model.py", "st.py"))


def log_softmax(x):
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def generate_json(rlx, prompt, steps):
    out = rlx.run("generate", prompt, "-n", str(steps), "--greedy", "--ignore-eos", "--json",
                  "--logprobs", str(TOP_LOGPROBS))
    lines = [line for line in out.splitlines() if line.strip()]
    try:
        result = json.loads(lines[-1])
        return [int(t) for t in result["tokens"]], result["logprobs"]
    except (IndexError, ValueError, KeyError, TypeError) as e:
        raise Failure(f"generate --json: cannot read the result ({e}): {out[-500:]!r}")


def check(rlx, case, tol, checked_steps=None):
    """The rlx checks against the case; returns a summary. checked_steps bounds the steps whose
    ids must match (BF16-activation plans); None = all."""
    seq, n_prompt = case.sequence, len(case.prompt)
    err_all = compare_logits(f"logits --all over {len(seq)} tokens", rlx.logits(seq, True), case.logits, tol)
    err_last = compare_logits("logits (last position)", rlx.logits(case.prompt, False),
                              case.logits[n_prompt - 1:n_prompt], tol)
    steps = len(case.generated)
    ids, logprobs = generate_json(rlx, case.prompt, steps)
    want_ids = case.generated[:checked_steps]
    if ids[:len(want_ids)] != want_ids:
        step = next((i for i, (a, b) in enumerate(zip(ids, want_ids)) if a != b), min(len(ids), len(want_ids)))
        raise Failure(f"generate --greedy: ids differ from step {step} (step 0 comes from the prefill, the "
                      f"rest from decode steps through the states)\n  rlx: {ids}\n  ref: {case.generated}")
    # log-probabilities: a log_softmax moves by at most twice the logits' error
    ref_lp = log_softmax(case.step_logits())
    bound = 2 * tol * max(1.0, float(np.abs(case.logits).max()))
    if len(logprobs) < len(want_ids):
        raise Failure(f"generate --json: {len(logprobs)} logprobs entries for {len(want_ids)} steps")
    err_lp = 0.0
    for step, entry in enumerate(logprobs[:len(want_ids)]):
        pairs = [(entry["id"], entry["logprob"])] + [(e["id"], e["logprob"]) for e in entry.get("top_logprobs", [])]
        if len(pairs) < 1 + min(TOP_LOGPROBS, ref_lp.shape[1]):
            raise Failure(f"generate --json: step {step} lists {len(pairs) - 1} alternatives, asked {TOP_LOGPROBS}")
        for token, lp in pairs:
            diff = abs(float(lp) - ref_lp[step, token])
            err_lp = max(err_lp, diff)
            if not diff <= bound:
                raise Failure(f"generate --logprobs: step {step} ({'prefill' if step == 0 else 'decode'}) "
                              f"token {token}: rlx {float(lp):.6g}, ref {ref_lp[step, token]:.6g}, "
                              f"|diff| {diff:.3g} > {bound:.3g}")
    ids_note = f"{len(want_ids)}/{steps} ids match" + ("" if len(want_ids) == steps else
                                                       " (the rest within the BF16 bound of a tie)")
    return (f"logits max|diff| {err_all:.2g} (all), {err_last:.2g} (last), tol {tol:g}*max(1,|ref|); "
            f"greedy {ids_note}; decode logprobs max|diff| {err_lp:.2g} (bound {bound:.2g})")


def run_golden(args):
    workdir = os.path.abspath(args.workdir)
    if args.model:
        name = f"golden-hybrid {os.path.basename(os.path.normpath(args.model))}"
    else:
        kind, dtype = args.kind or DEFAULT_KIND, args.dtype or "f32"
        shards, seed = args.shards or 1, cg.DEFAULT_SEED if args.seed is None else args.seed
        name = f"golden-hybrid {kind}/{dtype}/shards={shards} seed={seed}"
    try:
        path = args.model or model_dir(workdir, kind, dtype, shards, seed)
        model = ref.load(path)
        case = golden_case(model)
        rlx = cg.Rlx(args.rlx, path, model.vocab, args.rlx_args, args.timeout,
                     os.path.join(workdir, "out", os.path.basename(path)))
        weights, moe_layers = rlx.plan(len(case.sequence))
        tol, checked, exact_note = args.tol, None, ""
        if weights or moe_layers:
            # BF16 activations: judged against the BF16 oracle (the reference rounding the same
            # matmul inputs) on the same prompt, ids only while the oracle has no near-tie. The
            # recurrent layers carry the rounding from token to token, so the distance from the
            # exact reference is reported, not bounded: it grows with the sequence (a logit
            # moved by 1.9 at position 15 of 21 on qwen35-untied-mtp, identically on oneDNN's
            # BF16 matmuls and on AMX tiles).
            exact = case
            case = condition(ref.set_bf16_activations(ref.load(path), weights, moe_layers), case.prompt,
                             len(case.generated))
            tol = max(tol, cg.BF16_TOL_ORACLE)
            margins = np.diff(np.sort(case.step_logits(), axis=-1)[:, -2:], axis=-1)[:, 0]
            bound = 2 * tol * max(1.0, float(np.abs(case.logits).max()))
            checked = next((i for i, m in enumerate(margins) if m <= bound), len(margins))
            exact_note = (f"; bf16-act on {len(weights)} matmuls and {len(moe_layers)} MoE layers, against the "
                          f"BF16 oracle; the exact reference's logits differ by at most "
                          f"{float(np.abs(case.logits - exact.logits).max()):.2g}")
        summary = check(rlx, case, tol, checked) + exact_note
    except (Failure, OSError, ValueError, KeyError) as e:
        print(f"{name}: FAIL: {e}")
        return 1
    print(f"{name}: PASS prompt={','.join(map(str, case.prompt))} {summary}; ref top-1 margin {case.rel_margin:.2g}")
    return 0


# ---------------------------------------------------------------- stand-in rlx for --self-test


def fake_rlx(argv):
    """The rlx CLI verbs this harness uses, computed by the reference. RLX_FAKE_MODE: exact,
    noisy (logits off by 1e-2 of their range) or stateless (decode steps see only their own
    token: a lost state)."""
    mode = os.environ.get("RLX_FAKE_MODE", "exact")
    ap = argparse.ArgumentParser()
    ap.add_argument("verb")
    ap.add_argument("--model", required=True)
    ap.add_argument("--tokens", type=lambda s: [int(t) for t in s.split(",")])
    ap.add_argument("--all", action="store_true")
    ap.add_argument("--out")
    ap.add_argument("--positions")
    ap.add_argument("-n", type=int)
    ap.add_argument("--logprobs", type=int, default=0)
    ap.add_argument("-ctk")
    for flag in ("--greedy", "--ignore-eos", "--json"):
        ap.add_argument(flag, action="store_true")
    a = ap.parse_args(argv)
    if a.verb == "graph":
        return 0  # no BF16-activation nodes
    model = ref.load(a.model)
    if a.verb == "logits":
        logits = ref.forward(model, a.tokens)
        if mode == "noisy":
            logits = logits + 1e-2 * np.abs(logits).max() * np.sin(np.arange(logits.size)).reshape(logits.shape)
        (logits if a.all else logits[-1:]).astype("<f4").tofile(a.out)
        return 0
    state = ref.State(model)
    logits = ref.forward(model, a.tokens, state)[-1]
    ids, lps = [], []
    for step in range(a.n):
        lp = log_softmax(logits)
        nxt = int(np.argmax(lp))
        top = np.argsort(-lp)[:a.logprobs]
        ids.append(nxt)
        lps.append({"id": nxt, "logprob": float(lp[nxt]),
                    "top_logprobs": [{"id": int(t), "logprob": float(lp[t])} for t in top]})
        if step + 1 < a.n:
            logits = ref.forward(model, [nxt], ref.State(model) if mode == "stateless" else state)[-1]
    print(json.dumps({"tokens": ids, "logprobs": lps}))
    return 0


def check_conditioned(tmp):
    """Every golden model has a qualifying prompt (ctest's golden runs would fail otherwise), and
    the reference computed in float32 (a stand-in for rlx: chunked prefill, recurrent decode)
    stays F32_ROOM times inside the logits bound and reproduces the greedy ids."""
    notes = []
    for kind, dtype in GOLDEN:
        path = model_dir(tmp, kind, dtype, 1, cg.DEFAULT_SEED)
        case = golden_case(ref.load(path))
        f32 = condition(ref.load(path, np.float32), case.prompt)
        if f32.logits.dtype != np.float32:
            raise AssertionError(f"{kind}/{dtype}: the float32 reference computed in {f32.logits.dtype}")
        if f32.generated != case.generated:
            raise AssertionError(f"{kind}/{dtype}: float32 greedy {f32.generated} != float64 {case.generated}")
        err = compare_logits(f"{kind}/{dtype} float32 vs float64", f32.logits.astype(np.float64), case.logits,
                             cg.LOGITS_TOL / F32_ROOM)
        rel = err / max(1.0, float(np.abs(case.logits).max()))
        notes.append(f"{kind}/{dtype} margin {case.rel_margin:.2g}, f32 drift {rel:.1e}")
    return "; ".join(notes)


def check_harness(tmp):
    """The harness passes the reference itself and fails a noisy or stateless stand-in."""
    fake = os.path.join(tmp, "fake-rlx")
    with open(fake, "w") as f:
        f.write(f"#!/bin/sh\nexec {sys.executable} {os.path.abspath(__file__)} --fake-rlx \"$@\"\n")
    os.chmod(fake, os.stat(fake).st_mode | stat.S_IXUSR)
    notes = []
    for kind, want in (("qwen35-tied", {"exact": "PASS", "noisy": "FAIL: logits --all",
                                        "stateless": "FAIL: generate"}),
                       ("qwen35-flat", {"exact": "PASS", "stateless": "FAIL: generate"})):
        for mode, expect in want.items():
            cmd = [sys.executable, os.path.abspath(__file__), "--rlx", fake, "--workdir", tmp, "--kind", kind]
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                                  env=dict(os.environ, RLX_FAKE_MODE=mode))
            line = done.stdout.strip().splitlines()[0] if done.stdout.strip() else done.stderr[-500:]
            ok = (done.returncode == 0) == (expect == "PASS") and f": {expect}" in line
            if not ok:
                raise AssertionError(f"{kind} stand-in {mode}: expected {expect!r}, got rc {done.returncode}: {line}")
            notes.append(f"{kind} {mode} -> {expect.split(':')[0]}")
    return ", ".join(notes)


def self_test():
    failed = 0
    print("== qwen35_ref.py self-test")
    if ref.self_test([]) != 0:
        failed += 1
    with tempfile.TemporaryDirectory() as tmp:
        for what, fn in (("golden models conditioned", check_conditioned), ("harness vs stand-in rlx", check_harness)):
            try:
                print(f"PASS {what}: {fn(tmp)}")
            except Exception:
                failed += 1
                print(f"FAIL {what}\n{traceback.format_exc()}")
    print("self-test: " + ("FAIL" if failed else "PASS"))
    return 1 if failed else 0


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--fake-rlx"]:
        return fake_rlx(argv[1:])
    ap = argparse.ArgumentParser(description="Compare rlx with the NumPy Qwen3.5 reference.")
    ap.add_argument("--self-test", action="store_true", help="check the reference and this harness, no rlx")
    ap.add_argument("--rlx", help="path to the rlx binary")
    ap.add_argument("--workdir", help="cache for models and outputs")
    ap.add_argument("--model", help="an existing Qwen3.5 model directory, instead of building one")
    ap.add_argument("--kind", choices=sorted(make_hybrid.KINDS), help=f"default: {DEFAULT_KIND}")
    ap.add_argument("--dtype", choices=sorted(make_hybrid.DTYPES), help="default: f32")
    ap.add_argument("--shards", type=int, help="default: 1")
    ap.add_argument("--seed", type=int, help=f"model seed, default: {cg.DEFAULT_SEED}")
    ap.add_argument("--tol", type=float, default=cg.LOGITS_TOL,
                    help=f"logits bound relative to max(1, max|ref|), default {cg.LOGITS_TOL:g}")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per rlx command")
    ap.add_argument("rlx_args", nargs="*", help="extra rlx arguments, after --")
    args = ap.parse_args(argv)
    if args.self_test:
        return self_test()
    if not args.rlx or not args.workdir:
        ap.error("--rlx and --workdir are required (or --self-test)")
    if args.model and any(v is not None for v in (args.kind, args.dtype, args.shards, args.seed)):
        ap.error("--model excludes --kind, --dtype, --shards and --seed")
    return run_golden(args)


if __name__ == "__main__":
    sys.exit(main())
