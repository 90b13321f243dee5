#!/usr/bin/python3
"""Golden test of the MTP head and of emitted hidden states: rlx against qwen3_ref.py.

  check_mtp.py --probe PATH/rlx_mtp_probe --rlx PATH/rlx --workdir DIR [--plugin NAME]

Builds two random models with two MTP layers each (make_model.py; layer 0 has its own
final_layernorm, layer 1 falls back to model.norm): dense-tied f32 with the MTP tensors in its
own safetensors, and dense-untied-bias bf16 with them in a separate file outside the model
directory. For each model and MTP layer, rlx_mtp_probe (tests/model/mtp_probe.c) writes the
target's final-normed hidden rows and logits and the MTP layer's logits and hidden output over
the pairs (tokens[t+1], hidden[t]); all must match NumPy within LOGITS_TOL relative, NumPy
computing the pairs from its own float64 hidden states. Then the errors: MTP tensors missing
(the error names the tensor and the weights option), a weights file that repeats the model's
tensors, a missing weights file. Last, the speculator through the command line: `rlx generate
--spec mtp` finds the weights in the model, by --spec-opts weights=FILE and as mtp.safetensors in
the model directory (greedy output equal to plain greedy's), and on a model without them fails
naming the tensor and the option. Exits 0 on pass, 1 on failure, with one summary line.
"""
import argparse
import os
import shutil
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import make_model  # noqa: E402
import qwen3_ref as ref  # noqa: E402

LOGITS_TOL = 1e-4  # as check_golden.py: ~100x an f32 implementation's error
MTP_LAYERS = 2
TOKENS = [17, 3, 250, 99, 4, 301, 77, 12, 140, 66, 205]
MODELS = [  # (name, kind, dtype, MTP weights in a separate file)
    ("inline", "dense-tied", "f32", False),
    ("separate", "dense-untied-bias", "bf16", True),
]


class Failure(Exception):
    pass


def compare(what, got, want):
    got = np.asarray(got, dtype=np.float64).reshape(want.shape)
    err = float(np.max(np.abs(got - want)))
    limit = LOGITS_TOL * max(1.0, float(np.max(np.abs(want))))
    if not np.all(np.isfinite(got)) or err > limit:
        raise Failure(f"{what}: max error {err:.3g} > {limit:.3g}")
    return err


def run_probe(args, model, weights, layer, out):
    cmd = [args.probe, "--model", model, "--layer", str(layer), "--plugin", args.plugin,
           "--tokens", ",".join(map(str, TOKENS)), "--out", out]
    if weights:
        cmd += ["--weights", weights]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


def read(prefix, suffix):
    return np.fromfile(f"{prefix}.{suffix}", dtype="<f4")


def check_model(args, name, kind, dtype, separate):
    model_dir = os.path.join(args.workdir, name)
    weights = os.path.join(args.workdir, name + "-mtp.safetensors") if separate else None
    make_model.build(kind, dtype, 1, 1, model_dir, MTP_LAYERS, weights)
    model = ref.load(model_dir, [weights] if weights else [])
    hidden = ref.final_hidden(model, TOKENS)
    logits = ref.lm_head(model, hidden, np.float64)
    worst = 0.0
    for layer in range(MTP_LAYERS):
        out = os.path.join(args.workdir, f"{name}-layer{layer}")
        r = run_probe(args, model_dir, weights, layer, out)
        if r.returncode != 0:
            raise Failure(f"{name} layer {layer}: rlx_mtp_probe failed: {r.stderr.strip()}")
        mtp_logits, mtp_hidden = ref.mtp_forward(model, layer, TOKENS[1:], hidden[:-1])
        worst = max(worst,
                    compare(f"{name}: emitted hidden rows", read(out, "hidden.f32"), hidden),
                    compare(f"{name}: target logits with emit_hidden", read(out, "logits.f32"), logits[-3:]),
                    compare(f"{name} MTP layer {layer}: logits", read(out, "mtp_logits.f32"), mtp_logits),
                    compare(f"{name} MTP layer {layer}: hidden output", read(out, "mtp_hidden.f32"), mtp_hidden))
    return model_dir, weights, worst


def expect_error(args, what, model, weights, layer, *needles):
    r = run_probe(args, model, weights, layer, os.path.join(args.workdir, "error"))
    if r.returncode != 1 or not all(n in r.stderr for n in needles):
        raise Failure(f"{what}: want exit 1 and an error with {needles}, got exit {r.returncode}: "
                      f"{r.stderr.strip()!r}")


def rlx_generate(args, model, *extra):
    cmd = [args.rlx, "generate", "--model", model, "--plugin", args.plugin, "--tokens", ",".join(map(str, TOKENS)),
           "-n", "16", "--greedy", *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


def check_cli(args, inline_dir, separate_dir, separate_weights):
    beside_dir = os.path.join(args.workdir, "beside")
    make_model.build("dense-tied", "f32", 1, 2, beside_dir, 1, os.path.join(beside_dir, "mtp.safetensors"))
    for what, model, extra in (("weights in the model", inline_dir, ["--spec-opts", "layer=1"]),
                               ("--spec-opts weights=FILE", separate_dir, ["--spec-opts", f"weights={separate_weights}"]),
                               ("mtp.safetensors beside the model", beside_dir, [])):
        plain, spec = rlx_generate(args, model), rlx_generate(args, model, "--spec", "mtp", "--draft-tokens", "3", *extra)
        if plain.returncode or spec.returncode or plain.stdout != spec.stdout:
            raise Failure(f"rlx generate --spec mtp ({what}): exit {spec.returncode}, output {spec.stdout.strip()!r}, "
                          f"plain greedy {plain.stdout.strip()!r}: {spec.stderr.strip()}")
    r = rlx_generate(args, separate_dir, "--spec", "mtp")
    if r.returncode != 1 or "'model.mtp_layers.0.token_layernorm.weight'" not in r.stderr or "weights=FILE" not in r.stderr:
        raise Failure(f"rlx generate --spec mtp without MTP weights: exit {r.returncode}: {r.stderr.strip()!r}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--probe", required=True)
    ap.add_argument("--rlx", required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--plugin", default="cpu-blas")
    args = ap.parse_args(argv)
    shutil.rmtree(args.workdir, ignore_errors=True)
    os.makedirs(args.workdir)
    try:
        worst, dirs = 0.0, {}
        for name, kind, dtype, separate in MODELS:
            model_dir, weights, err = check_model(args, name, kind, dtype, separate)
            dirs[name] = (model_dir, weights)
            worst = max(worst, err)
        inline_dir, _ = dirs["inline"]
        separate_dir, separate_weights = dirs["separate"]
        expect_error(args, "MTP weights not given", separate_dir, None, 0,
                     "'model.mtp_layers.0.token_layernorm.weight'", "weights=FILE")
        expect_error(args, "an MTP layer the model lacks", inline_dir, None, MTP_LAYERS,
                     f"'model.mtp_layers.{MTP_LAYERS}.token_layernorm.weight'")
        expect_error(args, "weights repeating the model's tensors", inline_dir,
                     os.path.join(inline_dir, "model.safetensors"), 0, "is in both")
        missing = os.path.join(args.workdir, "absent.safetensors")
        expect_error(args, "a missing weights file", separate_dir, missing, 0, missing)
        check_cli(args, inline_dir, separate_dir, separate_weights)
    except Failure as e:
        print(f"FAIL {e}")
        return 1
    print(f"PASS MTP logits and hidden rows, emitted hidden rows (max error {worst:.3g}); errors named; "
          "rlx generate --spec mtp equals greedy with each weight location")
    return 0


if __name__ == "__main__":
    sys.exit(main())
