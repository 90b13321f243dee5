#!/usr/bin/python3
"""Bad input through the real CLI: each broken model or argument must make `rlx` exit with
status 1 and exactly one clear line on stderr naming the file, tensor or value at fault —
no crash, no sanitizer report, no hang.

  test_bad_input.py --rlx BIN --model GOOD_MODEL_DIR --workdir DIR
"""
import argparse
import json
import os
import shutil
import struct
import subprocess
import sys

TIMEOUT = 60


def read_st(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    return header, data


def write_st(path, header, data):
    raw = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw + data)


def variant(good, workdir, name, mutate):
    """A copy of the good model, changed by mutate(directory)."""
    out = os.path.join(workdir, name)
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(good, out)
    mutate(out)
    return out


def edit_header(fn):
    def mutate(d):
        path = os.path.join(d, "model.safetensors")
        header, data = read_st(path)
        fn(header, data)
        write_st(path, header, data)
    return mutate


def edit_config(fn):
    def mutate(d):
        path = os.path.join(d, "config.json")
        with open(path) as f:
            cfg = json.load(f)
        fn(cfg)
        with open(path, "w") as f:
            json.dump(cfg, f)
    return mutate


def truncate_weights(d):
    path = os.path.join(d, "model.safetensors")
    os.truncate(path, os.path.getsize(path) // 2)


def huge_header(d):
    path = os.path.join(d, "model.safetensors")
    with open(path, "r+b") as f:
        f.write(struct.pack("<Q", 1 << 60))


def tiny_file(d):
    with open(os.path.join(d, "model.safetensors"), "wb") as f:
        f.write(b"\x01\x02\x03")


def offsets_beyond_file(h, data):
    h["model.norm.weight"]["data_offsets"][1] = len(data) + 4096


def reshape_q(h, data):
    entry = h["model.layers.0.self_attn.q_proj.weight"]
    rows, cols = entry["shape"]
    entry["shape"] = [rows // 2, cols * 2]  # same bytes, wrong shape


def int_dtype(h, data):
    h["model.layers.1.mlp.up_proj.weight"]["dtype"] = "I32"


def drop_norm(h, data):
    del h["model.norm.weight"]


def malformed_config(d):
    with open(os.path.join(d, "config.json"), "w") as f:
        f.write('{"hidden_size": 64, "vocab_size": ')


def no_hidden(cfg):
    del cfg["hidden_size"]


def fractional_layers(cfg):
    cfg["num_hidden_layers"] = 2.5


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rlx", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--workdir", required=True)
    args = ap.parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    good = args.model
    cfg = json.load(open(os.path.join(good, "config.json")))
    logits = ["logits", "--tokens", "1,2,3", "--out", os.path.join(args.workdir, "out.bin")]
    cases = [
        # (name, model dir or mutation, argv after the model, expected words in the message)
        ("truncated weights", truncate_weights, logits, ["model.safetensors"]),
        ("absurd header length", huge_header, logits, ["model.safetensors", "header"]),
        ("file shorter than a header", tiny_file, logits, ["model.safetensors"]),
        ("offsets beyond the file", edit_header(offsets_beyond_file), logits, ["model.norm.weight"]),
        ("shape not matching config", edit_header(reshape_q), logits,
         ["model.layers.0.self_attn.q_proj.weight", "config.json implies"]),
        ("unsupported dtype", edit_header(int_dtype), logits, ["model.layers.1.mlp.up_proj.weight", "I32"]),
        ("missing tensor", edit_header(drop_norm), logits, ["model.norm.weight", "missing"]),
        ("malformed config.json", malformed_config, logits, ["config.json"]),
        ("config without hidden_size", edit_config(no_hidden), logits, ["config.json", "hidden_size"]),
        ("fractional layer count", edit_config(fractional_layers), logits, ["config.json", "num_hidden_layers"]),
        ("token id beyond vocab", None, ["logits", "--tokens", f"1,{cfg['vocab_size']}", "--out",
                                         os.path.join(args.workdir, "o.bin")], [str(cfg["vocab_size"]), "vocabulary"]),
        ("negative token id", None, ["generate", "--tokens", "1,-4", "-n", "2"], ["--tokens"]),
        ("unknown backend", None, ["generate", "--tokens", "1", "--plugin", "no-such-backend"],
         ["no-such-backend"]),
        ("missing model directory", os.path.join(args.workdir, "does-not-exist"), logits,
         ["does-not-exist"]),
        ("unknown option", None, ["generate", "--tokens", "1", "--frobnicate"], ["--frobnicate"]),
        ("unwritable output", None, ["logits", "--tokens", "1", "--out", "/nonexistent/dir/x.bin"],
         ["/nonexistent/dir/x.bin"]),
        ("unknown reference option", None, logits + ["--plugin", "ref", "--backend-opts", "act=f16"],
         ["ref", "act=f16"]),
    ]
    # --backend-opts reaches the backend of every model command: the backend's own error names
    # the bad value
    bad_isa = ["--plugin", "cpu-blas", "--backend-opts", "isa=bogus"]
    for argv in (logits, ["generate", "--tokens", "1", "-n", "1"], ["bench", "-p", "2", "-n", "1", "-r", "1"],
                 ["graph"], ["chat"], ["stage", "--listen", "127.0.0.1:0", "--layers", "0-0"]):
        cases.append((f"bad backend option ({argv[0]})", None, argv + bad_isa, ["cpu-blas", "isa 'bogus'"]))
    failures = 0
    for name, model, argv, words in cases:
        if model is None:
            model_dir = good
        elif callable(model):
            model_dir = variant(good, args.workdir, name.replace(" ", "-"), model)
        else:
            model_dir = model
        cmd = [args.rlx, argv[0], "--model", model_dir] + argv[1:]
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            print(f"FAIL {name}: no answer within {TIMEOUT}s")
            failures += 1
            continue
        lines = p.stderr.strip().splitlines()
        problems = []
        if p.returncode != 1:
            problems.append(f"exit status {p.returncode}, expected 1")
        if len(lines) != 1 or not lines[0].startswith("rlx: "):
            problems.append(f"stderr is not one 'rlx: ' line: {p.stderr.strip()[:2000]!r}")
        missing = [w for w in words if w not in p.stderr]
        if missing:
            problems.append(f"message lacks {missing}")
        if problems:
            failures += 1
            print(f"FAIL {name}: " + "; ".join(problems))
        else:
            print(f"ok   {name}: {lines[0]}")
    # ... and good options are accepted, also by the reference backend
    good_runs = [logits + ["--plugin", "cpu-blas", "--backend-opts", "isa=c"],
                 ["generate", "--tokens", "1", "-n", "1", "--plugin", "cpu-blas", "--backend-opts", "isa=c"],
                 ["bench", "-p", "2", "-n", "1", "-r", "1", "--plugin", "cpu-blas", "--backend-opts", "isa=c"],
                 logits + ["--plugin", "ref", "--backend-opts", "act=bf16"]]
    for argv in good_runs:
        p = subprocess.run([args.rlx, argv[0], "--model", good] + argv[1:], capture_output=True, text=True,
                           timeout=TIMEOUT)
        if p.returncode != 0:
            failures += 1
            print(f"FAIL {' '.join(argv)}: exit status {p.returncode}: {p.stderr.strip()[:2000]!r}")
        else:
            print(f"ok   {' '.join(argv)}")
    cases += good_runs
    print(f"{len(cases) - failures} passed, {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
