#!/usr/bin/python3
"""rlx quantize on Qwen3-MoE: a random model with experts in every layer (the test generator's
moe kind without mlp_only_layers, the Brown tokenizer beside it) becomes a qwen3moe GGUF file with
stacked [experts, rows, cols] expert tensors and an F32 router as the independent reader reads
them, and whose logits equal those of --quant on the directory (8 experts: attn_k and attn_v
get Q8_0 as llama-quantize gives them; 64-wide rows fall back from the K types). A MoE model with
a dense layer, which llama.cpp's qwen3moe cannot hold, is refused naming the layer.

  check_moe.py --rlx BIN --brown DIR --workdir DIR
"""
import argparse
import os
import subprocess
import sys

from qutil import gguf_ref, random_models, verdict


def main():
    ap = argparse.ArgumentParser()
    for a in ("--rlx", "--brown", "--workdir"):
        ap.add_argument(a, required=True)
    args = ap.parse_args()
    models = random_models(args.workdir, {"moe-all": ("moe", {"mlp_only_layers": []}), "moe-dense1": ("moe", {})}, 5,
                           args.brown, __file__)
    failures = []
    model = models["moe-all"]
    # q4_k_m on 3 layers: use_more_bits picks layer 2 for ffn_down (Q6_K, whose 32-wide rows fall
    # back to Q8_0); the other layers' Q4_K falls back to Q5_0
    for t, want in (("q8_0", {"blk.0.attn_v": "Q8_0", "blk.1.ffn_down_exps": "Q8_0"}),
                    ("q4_k_m", {"blk.0.attn_v": "Q8_0", "blk.1.attn_k": "Q8_0", "blk.2.ffn_up_exps": "Q5_0",
                                "blk.0.ffn_down_exps": "Q5_0", "blk.2.ffn_down_exps": "Q8_0"})):
        out = os.path.join(args.workdir, f"moe-{t}.gguf")
        p = subprocess.run([args.rlx, "quantize", model, out, "--type", t, "-q"], capture_output=True, text=True)
        if p.returncode != 0:
            failures.append(f"{t}: {p.stderr.strip()}")
            continue
        g = gguf_ref.read(out)
        md = g.metadata  # (gguf_ref.check_model checks qwen3 only)
        if md["general.architecture"] != "qwen3moe" or md["qwen3moe.expert_count"] != 8:
            failures.append(f"{t}: architecture {md['general.architecture']}")
        for i in range(md["qwen3moe.block_count"]):
            router = g.tensor_by_name[f"blk.{i}.ffn_gate_inp.weight"]
            up = g.tensor_by_name[f"blk.{i}.ffn_up_exps.weight"]
            if router.type_name != "F32" or up.dims != (64, 32, 8):
                failures.append(f"{t}: layer {i}: router {router.type_name}, up experts {up.dims}")
        for part, ty in want.items():
            got = g.tensor_by_name[f"{part}.weight"].type_name
            if got != ty:
                failures.append(f"{t}: {part}.weight is {got}, llama-quantize gives {ty}")
        logits = []
        for extra in (["-m", model, "--quant", t], ["-m", out]):
            f = os.path.join(args.workdir, f"logits-{t}-{len(logits)}.f32")
            p = subprocess.run([args.rlx, "logits", *extra, "--tokens", "1,5,3,7,11", "--all", "--out", f],
                               capture_output=True, text=True)
            if p.returncode != 0:
                failures.append(f"{t}: logits: {p.stderr.strip()}")
                break
            logits.append(open(f, "rb").read())
        if len(logits) == 2 and logits[0] != logits[1]:
            failures.append(f"{t}: --quant logits differ from the GGUF file's")
        print(f"{t}: {len(g.tensors)} tensors, --quant logits {'identical' if len(set(logits)) == 1 else 'DIFFER'}")
    p = subprocess.run([args.rlx, "quantize", models["moe-dense1"],
                        os.path.join(args.workdir, "dense1.gguf"), "--type", "q8_0"], capture_output=True, text=True)
    if p.returncode == 0 or "layer 1 has a dense MLP" not in p.stderr:
        failures.append(f"a MoE model with a dense layer: exit {p.returncode}, {p.stderr.strip()}")
    return verdict(failures)


if __name__ == "__main__":
    sys.exit(main())
