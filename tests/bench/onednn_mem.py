#!/usr/bin/python3
"""Peak RSS of the onednn backend's packed weights against the model file's size.

  onednn_mem.py --build BUILD_DIR [--workdir DIR] [--layers 4]

Builds (once, in DIR) a Qwen3-0.6B-shaped F32 model cut to `--layers` layers: its tied
embedding table, also the LM head, is most of the file, the worst case for a backend that packs
each weight into a copy. Then runs `rlx logits` on three prompt tokens with
  onednn f32=blocked                       packs every F32 weight (any CPU), in 16 MiB chunks
  onednn f32=blocked,pack_kb=4194304       the same in one reorder per weight
  cpu-blas                                 no copy, the weights used from the mapping
and prints each run's peak RSS (wait4's ru_maxrss) over the safetensors bytes.
"""
import argparse
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "model"))
import make_model  # noqa: E402


def peak_mib(cmd):
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(p.pid, 0)
    err = p.stderr.read().decode()
    if status != 0:
        raise SystemExit(f"onednn_mem.py: {' '.join(cmd)} failed:\n{err}")
    return usage.ru_maxrss / 1024.0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", required=True)
    ap.add_argument("--workdir", default="/tmp/rlx-onednn-mem")
    ap.add_argument("--layers", type=int, default=4)
    args = ap.parse_args()
    model = os.path.join(args.workdir, f"bench-f32-{args.layers}-layers")
    if not os.path.isdir(model):
        make_model.KINDS["bench-cut"] = dict(make_model.KINDS["bench"], num_hidden_layers=args.layers)
        make_model.build("bench-cut", "f32", 1, 1, model)
    size = sum(os.path.getsize(os.path.join(model, f)) for f in os.listdir(model) if f.endswith(".safetensors"))
    rlx = os.path.join(args.build, "bin", "rlx")
    base = [rlx, "logits", "--model", model, "--tokens", "1,2,3", "--ctx", "64", "--threads", "2",
            "--out", os.path.join(args.workdir, "logits.f32")]
    print(f"model: {model}, {size / 2**20:.0f} MiB of safetensors")
    for name, extra in (("onednn f32=blocked (chunked packing)", ["--plugin", "onednn", "--backend-opts", "f32=blocked"]),
                        ("onednn f32=blocked,pack_kb=4194304 (whole weights)",
                         ["--plugin", "onednn", "--backend-opts", "f32=blocked,pack_kb=4194304"]),
                        ("cpu-blas (no copy)", ["--plugin", "cpu-blas"])):
        mib = peak_mib(base + extra)
        print(f"{name}: peak RSS {mib:.0f} MiB = {mib * 2**20 / size:.2f}x the file")
    return 0


if __name__ == "__main__":
    sys.exit(main())
