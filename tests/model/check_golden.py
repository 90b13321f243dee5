#!/usr/bin/python3
"""Golden test: rlx logits and greedy ids against the NumPy reference (qwen3_ref.py).

  check_golden.py --rlx PATH/rlx --workdir DIR [--kind K] [--dtype D] [--shards N]
                  [--seed S] [--timeout SEC] [-- EXTRA_RLX_ARGS...]
  check_golden.py --rlx PATH/rlx --workdir DIR --model MODEL_DIR [--timeout SEC] [-- ...]

Uses MODEL_DIR, or builds (and caches under DIR/models) the random-weight model of that kind,
dtype, shard count and seed (make_model.py); picks a prompt whose float64 greedy path is well
conditioned; then runs, with EXTRA_RLX_ARGS appended to each command:
  rlx logits   --model M --tokens SEQ --all --out F  -> T*vocab LE float32, row after row
  rlx logits   --model M --tokens PROMPT --out F     -> vocab LE float32 (last position)
  rlx generate --model M --tokens PROMPT -n 12 --greedy  -> generated ids on one stdout line
where SEQ is the prompt followed by the reference's greedy continuation. Exits 0 on pass,
1 on any mismatch or failure, printing one summary line either way.

The tolerance follows the precision the backends declare for each node (`rlx graph` shows it):
where matmul inputs are rounded to BF16 ("bf16-act"), the logits must stay within the stated
BF16 bound of the exact reference and close to a second NumPy oracle that rounds the same
matmuls' inputs (qwen3_ref.set_bf16_activations); greedy ids are compared with that oracle's
path only as long as its top-1 margin exceeds twice the bound (the rest are reported skipped).
"""
import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import make_model  # noqa: E402
import qwen3_ref as ref  # noqa: E402

DEFAULT_SEED = 1  # model seed when check_golden.py builds the model itself
PROMPT_SEED = 1   # prompt candidates are drawn from (PROMPT_SEED, attempt)
PROMPT_LEN = 9    # longer than the sliding kind's window (4), so prefill already slides
GEN_STEPS = 12
# Logits must satisfy max|rlx - ref| <= LOGITS_TOL * max(1, max|ref|). An f32 implementation
# lands near 1e-6 relative (the self-check measures it), so this leaves ~100x room for any
# summation order, fused kernels or vectorised exp. Backends that round activations (bf16
# matmul inputs) pass their own bound with --tol. The same bound holds for BF16/F16
# checkpoints: both sides compute from the stored half values widened exactly (to f64 here,
# f32 in rlx), so storage precision adds no difference; only rlx's f32 arithmetic does.
LOGITS_TOL = 1e-4
# A prompt is used only if, along its float64 greedy path, every top-1 logit beats the
# runner-up by this much (relative to max(1, |top-1|)) and every MoE router's k-th expert beats
# the (k+1)-th by MIN_ROUTER_MARGIN (logit units), ~1000x an f32 implementation's error, so
# a correct rlx cannot flip an argmax or an expert choice. The path must not hit an EOS id, so
# the test does not depend on how generate reports a stop, and must hold MIN_DISTINCT ids:
# random models tend to repeat one token, which would barely exercise the decode steps.
MIN_REL_MARGIN = 1e-3
MIN_ROUTER_MARGIN = 1e-3
# BF16-activation backends, relative to max(1, max|ref|), as the conformance kit's stated bounds
# (apps/rlx-conformance/kit.h): against the exact reference (measured up to 1.3e-2 on the test
# models), and against the BF16 oracle, from which a correct F32-summing backend still drifts
# when it rounds an activation near a BF16 tie the other way (F32 vs F64 emulations: up to 4e-3).
BF16_TOL_EXACT = 5e-2
BF16_TOL_ORACLE = 1.2e-2
MIN_DISTINCT = GEN_STEPS // 3
PROMPT_ATTEMPTS = 32


class Failure(Exception):
    pass


class Case:
    """A prompt, the reference greedy continuation, the float64 logits over both and the
    forward's trace (router logits of MoE layers)."""

    def __init__(self, prompt, generated, logits, rel_margin, router_margin, trace):
        self.prompt, self.generated, self.logits = prompt, generated, logits
        self.rel_margin, self.router_margin, self.trace = rel_margin, router_margin, trace

    @property
    def sequence(self):
        return self.prompt + self.generated


def condition(model, prompt, steps=GEN_STEPS, dtype=np.float64):
    """Greedy-decode `prompt` and measure how decisive the path is (see MIN_REL_MARGIN)."""
    generated = ref.greedy(model, prompt, steps, dtype=dtype)
    trace = {}
    # One causal forward over prompt + continuation gives every step's logits at once.
    logits = ref.forward(model, prompt + generated, dtype=dtype, trace=trace)
    step_logits = logits[len(prompt) - 1:-1]
    top2 = np.sort(step_logits, axis=-1)[:, -2:]
    rel = (top2[:, 1] - top2[:, 0]) / np.maximum(1.0, np.abs(top2[:, 1]))
    router = np.inf
    k = model.config.get("num_experts_per_tok", 0)
    for r in trace.get("router", {}).values():
        s = np.sort(r, axis=-1)
        router = min(router, float(np.min(s[:, -k] - s[:, -k - 1])))
    return Case(list(prompt), generated, logits, float(rel.min()), router, trace)


def golden_case(model, steps=GEN_STEPS):
    """The first well-conditioned prompt among candidates drawn from (PROMPT_SEED, attempt).

    Prompt ids stay below the special ids (bos/eos sit at the top of the vocabulary, as in
    Qwen3). Raises Failure if no candidate qualifies: the model init needs attention then.
    """
    bos = model.config.get("bos_token_id")
    specials = ([] if bos is None else [bos]) + ref.eos_ids(model.directory)
    low = min(specials + [model.config["vocab_size"]])
    best = None
    for attempt in range(PROMPT_ATTEMPTS):
        rng = np.random.default_rng([PROMPT_SEED, attempt])
        case = condition(model, [int(t) for t in rng.integers(0, low, PROMPT_LEN)], steps)
        if (case.rel_margin >= MIN_REL_MARGIN and case.router_margin >= MIN_ROUTER_MARGIN
                and not set(case.generated) & set(specials)
                and len(set(case.generated)) >= min(MIN_DISTINCT, steps)):
            return case
        best = case if best is None or case.rel_margin > best.rel_margin else best
    raise Failure(f"no prompt qualified in {PROMPT_ATTEMPTS} attempts (best top-1 margin "
                  f"{best.rel_margin:.2g}, router margin {best.router_margin:.2g})")


def model_dir(workdir, kind, dtype, shards, seed, maker=None, sources=("make_model.py", "st.py")):
    """Build the model once per generator version; the name carries a hash of the generator
    sources so an edited init never reuses a stale cache. maker: the generator module (its
    build(kind, dtype, shards, seed, out)), make_model by default."""
    maker = maker or make_model
    digest = hashlib.sha256()
    for name in sources:
        with open(os.path.join(HERE, name), "rb") as f:
            digest.update(f.read())
    root = os.path.join(workdir, "models")
    stem = f"{kind}-{dtype}-s{shards}-seed{seed}-"
    path = os.path.join(root, stem + digest.hexdigest()[:10])
    if os.path.isdir(path):
        return path
    os.makedirs(root, exist_ok=True)
    for old in os.listdir(root):  # the same case from an older generator version
        if old.startswith(stem) and "." not in old:
            shutil.rmtree(os.path.join(root, old), ignore_errors=True)
    # Build aside and rename, so an interrupted build or a parallel ctest never sees half a model.
    tmp = tempfile.mkdtemp(prefix=os.path.basename(path) + ".tmp", dir=root)
    try:
        maker.build(kind, dtype, shards, seed, tmp)
        os.rename(tmp, path)
    except OSError:
        if not os.path.isdir(path):
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return path


class Rlx:
    """Runs the rlx CLI on one model; outputs go to out_dir."""

    def __init__(self, binary, model, vocab, extra, timeout, out_dir):
        self.binary, self.model, self.vocab = binary, model, vocab
        self.extra, self.timeout, self.out_dir = extra, timeout, out_dir
        os.makedirs(out_dir, exist_ok=True)

    def run(self, verb, tokens, *flags):
        ids = ["--tokens", ",".join(map(str, tokens))] if verb != "graph" else []
        # an F32 cache: the check is of the model's F32 arithmetic against the reference's, at
        # 1e-4; the F16 default would round every cached key and value (about 5e-4 relative)
        cmd = [self.binary, verb, "--model", self.model, *ids, *flags, "-ctk", "f32", *self.extra]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=self.timeout)
        except subprocess.TimeoutExpired:
            raise Failure(f"timed out after {self.timeout}s: {' '.join(cmd)}")
        if done.returncode != 0:
            raise Failure(f"exit status {done.returncode}: {' '.join(cmd)}\n{done.stderr[-2000:]}")
        return done.stdout

    def logits(self, tokens, all_rows):
        """[rows, vocab] float64 from the raw little-endian float32 file rlx writes."""
        out = os.path.join(self.out_dir, "logits-all.f32" if all_rows else "logits-last.f32")
        if os.path.exists(out):
            os.remove(out)  # a stale file must not pass for this run's output
        self.run("logits", tokens, *(["--all"] if all_rows else []), "--out", out)
        if not os.path.exists(out):
            raise Failure(f"logits: rlx wrote no {out}")
        data = np.fromfile(out, dtype="<f4")
        rows = len(tokens) if all_rows else 1
        if data.size != rows * self.vocab:
            raise Failure(f"{out}: {data.size} floats, expected {rows} x {self.vocab}")
        return data.reshape(rows, self.vocab).astype(np.float64)

    def plan(self, n_tokens):
        """The BF16-activation nodes of the plan for n_tokens positions (`rlx graph`): the
        weights of such matmuls and the layers of such MoE blocks (experts rounded)."""
        weights, names, moe_layers = {}, set(), set()
        for line in self.run("graph", [0], "--positions", str(n_tokens)).splitlines():
            m = re.match(r"\s*%(\d+) = weight \S+ (\S+)$", line)
            if m:
                weights[m.group(1)] = m.group(2)
                continue
            m = re.match(r"\s*%\d+ = (\w+)\(([^)]*)\) -> .*@(\S+)(?: (\S+))?$", line)
            if not m or m.group(4) is None:
                continue
            if m.group(4) != "bf16-act" or m.group(1) not in ("matmul", "moe"):
                raise Failure(f"rlx graph: node with precision {m.group(4)!r} this check cannot bound: {line.strip()}")
            args = [a.strip().lstrip("%") for a in m.group(2).split(",")]
            weight = weights.get(args[1], "")
            if m.group(1) == "matmul":
                names.add(weight)
            else:
                layer = re.match(r"model\.layers\.(\d+)\.mlp\.gate\.weight$", weight)
                if not layer:
                    raise Failure(f"rlx graph: cannot tell the layer of MoE node: {line.strip()}")
                moe_layers.add(int(layer.group(1)))
        return names, moe_layers

    def generate(self, tokens, steps):
        lines = [line for line in self.run("generate", tokens, "-n", str(steps),
                                           "--greedy").splitlines() if line.strip()]
        try:
            return [int(t) for t in lines[-1].split()] if lines else []
        except ValueError:
            raise Failure(f"generate: last stdout line is not token ids: {lines[-1]!r}")


def compare_logits(what, got, want, tol):
    """Returns the max abs difference; raises Failure past tol * max(1, max|want|)."""
    if not np.all(np.isfinite(got)):
        raise Failure(f"{what}: rlx logits contain NaN or Inf")
    diff = np.abs(got - want)
    bound = tol * max(1.0, float(np.abs(want).max()))
    if diff.max() > bound:
        t, v = np.unravel_index(np.argmax(diff), diff.shape)
        raise Failure(f"{what}: max|diff| {diff.max():.3g} > {bound:.3g} at position {t} "
                      f"token {v} (rlx {got[t, v]:.6g}, ref {want[t, v]:.6g}); "
                      f"first bad position {int(np.argmax((diff > bound).any(axis=1)))}")
    return float(diff.max())


def check(rlx, case, tol):
    """All three rlx checks against the case; returns the two max logits differences."""
    seq, n_prompt = case.sequence, len(case.prompt)
    err_all = compare_logits(f"logits --all over {len(seq)} tokens", rlx.logits(seq, True),
                             case.logits, tol)
    err_last = compare_logits("logits (last position)", rlx.logits(case.prompt, False),
                              case.logits[n_prompt - 1:n_prompt], tol)
    ids = rlx.generate(case.prompt, len(case.generated))
    if ids != case.generated:
        step = next((i for i, (a, b) in enumerate(zip(ids, case.generated)) if a != b),
                    min(len(ids), len(case.generated)))
        raise Failure(f"generate --greedy: ids differ from step {step}\n  rlx: {ids}\n"
                      f"  ref: {case.generated}")
    return err_all, err_last


def chosen_experts(trace, k):
    """Per MoE layer of a traced forward: the sorted ids of the k experts each position uses."""
    return {layer: np.sort(np.argsort(-r, axis=-1, kind="stable")[:, :k], axis=-1)
            for layer, r in trace.get("router", {}).items()}


def check_bf16(rlx, model, case, weights, moe_layers):
    """The checks for a plan with BF16-activation nodes; returns a summary."""
    seq, n_prompt = case.sequence, len(case.prompt)
    oracle = ref.set_bf16_activations(ref.load(model.directory), weights, moe_layers)
    trace_bf16 = {}
    want = ref.forward(oracle, seq, trace=trace_bf16)
    got = rlx.logits(seq, True)
    # Rounded activations may move a MoE router's k-th and (k+1)-th experts past each other;
    # from there the exact model is another function, so only the BF16 oracle can judge.
    chosen_exact = chosen_experts(case.trace, model.config.get("num_experts_per_tok", 0))
    chosen_bf16 = chosen_experts(trace_bf16, model.config.get("num_experts_per_tok", 0))
    rerouted = [(layer, int(np.argmax(np.any(chosen_exact[layer] != chosen_bf16[layer], axis=-1))))
                for layer in chosen_exact if not np.array_equal(chosen_exact[layer], chosen_bf16[layer])]
    if rerouted:
        err_exact, exact_note = None, (f"not compared with the exact reference: BF16 rounding changes the "
                                       f"experts of layer {rerouted[0][0]} at position {rerouted[0][1]}")
    else:
        err_exact = compare_logits(f"bf16-act logits --all over {len(seq)} tokens vs the exact reference",
                                   got, case.logits, BF16_TOL_EXACT)
        exact_note = f"{err_exact:.2g} vs exact (tol {BF16_TOL_EXACT:g}*max(1,|ref|))"
    err_oracle = compare_logits(f"bf16-act logits --all over {len(seq)} tokens vs the BF16 oracle",
                                got, want, BF16_TOL_ORACLE)
    compare_logits("bf16-act logits (last position) vs the BF16 oracle", rlx.logits(case.prompt, False),
                   want[n_prompt - 1:n_prompt], BF16_TOL_ORACLE)
    # the oracle's own greedy path, step by step, with its top-1 margin at each step
    steps, path, margins, ctx = len(case.generated), [], [], list(case.prompt)
    for _ in range(steps):
        row = ref.forward(oracle, ctx)[-1]
        top2 = np.sort(row)[-2:]
        margins.append((top2[1] - top2[0], 2 * BF16_TOL_ORACLE * max(1.0, float(np.abs(row).max()))))
        path.append(int(np.argmax(row)))
        ctx.append(path[-1])
    ids = rlx.generate(case.prompt, steps)
    checked = 0
    for step, (margin, bound) in enumerate(margins):
        if margin <= bound:
            break
        if step >= len(ids) or ids[step] != path[step]:
            raise Failure(f"bf16-act generate --greedy: ids differ from the BF16 oracle's at step {step}, "
                          f"where its top-1 margin {margin:.3g} exceeds twice the bound ({bound:.3g})\n"
                          f"  rlx: {ids}\n  ref: {path}")
        checked += 1
    skipped = "" if checked == steps else (
        f", {steps - checked} skipped from step {checked} (oracle top-1 margin {margins[checked][0]:.3g} "
        f"within twice the bound, {margins[checked][1]:.3g})")
    return (f"bf16-act on {len(weights)} matmuls and {len(moe_layers)} MoE layers: logits max|diff| "
            f"{exact_note}, {err_oracle:.2g} vs the BF16 oracle (tol {BF16_TOL_ORACLE:g}); greedy "
            f"{checked}/{steps} ids match the oracle{skipped}")


def main(argv=None):
    ap = argparse.ArgumentParser(description="Compare rlx with the NumPy Qwen3 reference.")
    ap.add_argument("--rlx", required=True, help="path to the rlx binary")
    ap.add_argument("--workdir", required=True, help="cache for models and outputs")
    ap.add_argument("--model", help="an existing model directory, instead of building one")
    ap.add_argument("--kind", choices=sorted(make_model.KINDS), help="default: dense-tied")
    ap.add_argument("--dtype", choices=sorted(make_model.DTYPES),
                    help="default: bf16 for bench, f32 otherwise")
    ap.add_argument("--shards", type=int, help="default: 1")
    ap.add_argument("--seed", type=int, help=f"model seed, default: {DEFAULT_SEED}")
    ap.add_argument("--tol", type=float, default=LOGITS_TOL,
                    help=f"logits bound relative to max(1, max|ref|), default {LOGITS_TOL:g}")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per rlx command")
    ap.add_argument("rlx_args", nargs="*", help="extra rlx arguments, after --")
    args = ap.parse_args(argv)
    build = (args.kind, args.dtype, args.shards, args.seed)
    if args.model and any(v is not None for v in build):
        ap.error("--model excludes --kind, --dtype, --shards and --seed")
    workdir = os.path.abspath(args.workdir)
    if args.model:
        name = f"golden {os.path.basename(os.path.normpath(args.model))}"
    else:
        kind = args.kind or "dense-tied"
        dtype = args.dtype or make_model.DEFAULT_DTYPE.get(kind, "f32")
        shards = args.shards or 1
        seed = DEFAULT_SEED if args.seed is None else args.seed
        name = f"golden {kind}/{dtype}/shards={shards} seed={seed}"
    try:
        path = args.model or model_dir(workdir, kind, dtype, shards, seed)
        model = ref.load(path)
        case = golden_case(model)
        rlx = Rlx(args.rlx, path, model.config["vocab_size"], args.rlx_args, args.timeout,
                  os.path.join(workdir, "out", os.path.basename(path)))
        weights, moe_layers = rlx.plan(len(case.sequence))
        if weights or moe_layers:
            print(f"{name}: PASS prompt={','.join(map(str, case.prompt))} "
                  f"{check_bf16(rlx, model, case, weights, moe_layers)}")
            return 0
        err_all, err_last = check(rlx, case, args.tol)
    except (Failure, OSError, ValueError) as e:
        print(f"{name}: FAIL: {e}")
        return 1
    router = f", router {case.router_margin:.2g}" if model.moe else ""
    print(f"{name}: PASS prompt={','.join(map(str, case.prompt))} logits max|diff| "
          f"{err_all:.2g} (all), {err_last:.2g} (last), tol {args.tol:g}*max(1,|ref|); "
          f"greedy {GEN_STEPS}/{GEN_STEPS} ids match; ref margins: top-1 {case.rel_margin:.2g}"
          f"{router}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
