#!/usr/bin/python3
"""A context past the model's trained length, asked for, is allowed with a warning (llama.cpp's
behaviour) and computed right; unasked, the trained length stays the limit.

A random model is copied with max_position_embeddings 32 (its weights do not know the number:
RoPE gives every position its angles), then:
  - `rlx logits --all -c 64` over 48 ids warns that 64 is past the 32 trained positions, and its
    logits at every position, those past 32 included, are the NumPy reference's
    (qwen3_ref.forward, RoPE extrapolated as Hugging Face's code does), within check_golden's bound;
  - `-c 32` (the trained length) gives no warning, and 48 ids without -c are refused, naming the
    context;
  - `rlx serve --slot-ctx 64` (on the Brown model, for its tokenizer, copied the same way) warns,
    and a request of 40 prompt ids and 16 new tokens, which runs past position 32, answers as
    `rlx generate -c 64` does.

  check_beyond_trained.py --rlx BIN --model DIR --workdir DIR
"""
import argparse
import json
import os
import shutil
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(os.path.dirname(HERE), "serve")]
import check_golden as golden  # noqa: E402
import qwen3_ref  # noqa: E402
import serve_util  # noqa: E402

TRAINED = 32
WARNING = f"past the {TRAINED} the model was trained on"


def trained_on(source, path):
    """A copy of the model at source in path (its files linked) whose config.json says TRAINED
    positions; (path, that config)."""
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    for name in os.listdir(source):
        if name != "config.json":
            os.symlink(os.path.join(os.path.abspath(source), name), os.path.join(path, name))
    with open(os.path.join(source, "config.json")) as f:
        config = json.load(f)
    config["max_position_embeddings"] = TRAINED
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f)
    return path, config


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rlx", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--workdir", required=True)
    args = ap.parse_args()
    short, config = trained_on(args.model, os.path.join(args.workdir, "trained-32"))
    model = qwen3_ref.load(short)
    rng = np.random.default_rng(7)
    ids = [int(t) for t in rng.integers(0, config["vocab_size"] - 8, 48)]
    problems = []

    out = os.path.join(args.workdir, "logits.f32")
    # an F32 cache: the comparison with NumPy's F32 arithmetic is at golden.LOGITS_TOL
    p = subprocess.run([args.rlx, "logits", "-m", short, "-c", "64", "--all", "--tokens", ",".join(map(str, ids)),
                        "--out", out, "-ctk", "f32"], capture_output=True, text=True, timeout=300)
    if p.returncode != 0 or WARNING not in p.stderr:
        problems.append(f"logits -c 64 on a model trained on {TRAINED}: exit {p.returncode}, want a warning: "
                        f"{p.stderr[-400:]!r}")
    else:
        got = np.fromfile(out, dtype="<f4").reshape(len(ids), -1).astype(np.float64)
        want = qwen3_ref.forward(model, ids)
        try:
            err = golden.compare_logits("logits past the trained length", got, want, golden.LOGITS_TOL)
            print(f"ok: logits at positions 0-47 of a model trained on {TRAINED}: max|diff| {err:.2g} from NumPy")
        except golden.Failure as e:
            problems.append(str(e))
    p = subprocess.run([args.rlx, "logits", "-m", short, "-c", str(TRAINED), "--tokens", ",".join(map(str, ids[:8])),
                        "--out", out], capture_output=True, text=True, timeout=300)
    if p.returncode != 0 or "warning" in p.stderr:
        problems.append(f"-c {TRAINED}: exit {p.returncode}, want no warning: {p.stderr[-300:]!r}")
    p = subprocess.run([args.rlx, "logits", "-m", short, "--tokens", ",".join(map(str, ids)), "--out", out],
                       capture_output=True, text=True, timeout=300)
    if p.returncode == 0 or "context" not in p.stderr:
        problems.append(f"48 ids without -c on a model of {TRAINED} positions: exit {p.returncode}, want a refusal "
                        f"naming the context: {p.stderr[-300:]!r}")

    # the server needs a tokenizer: the Brown model's, trained on 32 positions the same way
    short, _ = trained_on(serve_util.BROWN, os.path.join(args.workdir, "brown-trained-32"))
    prompt = ids[:40]
    g = subprocess.run([args.rlx, "generate", "-m", short, "-c", "64", "--greedy", "--json", "-n", "16", "--tokens",
                        ",".join(map(str, prompt))], capture_output=True, text=True, timeout=300)
    if g.returncode != 0:
        problems.append(f"generate -c 64: exit {g.returncode}: {g.stderr[-300:]!r}")
    else:
        want = json.loads(g.stdout)["tokens"]
        with serve_util.Server(args.rlx, ["--slot-ctx", "64", "--parallel", "1"], model=short) as s:
            status, _, body = s.request("POST", "/v1/completions", {"prompt": prompt, "max_tokens": 16,
                                                                    "temperature": 0})
        reply = json.loads(body) if status == 200 else {}
        text = reply.get("choices", [{}])[0].get("text")
        if status != 200 or WARNING not in s.stderr or text != json.loads(g.stdout)["text"]:
            problems.append(f"serve --slot-ctx 64: {status} {body[:300]!r}, warned: {WARNING in s.stderr}; "
                            f"generate's {json.loads(g.stdout)['text']!r} ({len(want)} ids)")
        else:
            print(f"ok: serve --slot-ctx 64 ran 40 + 16 positions of a model trained on {TRAINED}, as generate")
    for m in problems:
        print(f"FAIL: {m}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
