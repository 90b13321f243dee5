#!/usr/bin/python3
"""rlx quantize on the Llama family: random llama (tied; untied with attention and MLP biases;
RoPE scaled as Llama 3.1), mistral (a sliding window shorter than the prompt) and qwen2 models
with the Brown tokenizer beside them become GGUF files laid out as llama.cpp's converter writes
them, and rlx reads each back to the logits of its Hugging Face directory.

What the independent reader (gguf_ref) checks against NumPy, from the converter's own formulas:
  - llama and mistral are written as architecture llama, their q and k weights and biases with
    the rows of each head permuted (LlamaModel.permute), qwen2's as they are;
  - rope_freqs.weight holds the Llama 3.1 divisors (LlamaModel.generate_extra_tensors) as F32;
  - a mistral file says llama.attention.sliding_window.
Then, for f32 and q8_0: `rlx logits --all` over a 12-token prompt from the GGUF file equals the
directory's (f32) or the directory's with --quant q8_0, bit for bit, since rlx undoes the
permutation exactly.

  check_arch_gguf.py --rlx BIN --brown DIR --workdir DIR
"""
import argparse
import math
import os
import subprocess
import sys

import numpy as np

from qutil import gguf_ref, random_models, verdict

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "model"))
import st  # noqa: E402

PROMPT = "1,5,3,7,11,13,17,19,23,29,31,37"  # 12 positions: past mistral's window of 4


def permute(w, n_head):
    """llama.cpp's LlamaModel.permute of a q/k weight [rows, cols] or bias [rows]."""
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def llama3_factors(config):
    """LlamaModel.generate_extra_tensors: the rope_freqs divisors."""
    s = config["rope_scaling"]
    dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    freqs = 1.0 / (config["rope_theta"] ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
    low_wavelen = s["original_max_position_embeddings"] / s["low_freq_factor"]
    high_wavelen = s["original_max_position_embeddings"] / s["high_freq_factor"]
    out = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < high_wavelen:
            out.append(1)
        elif wavelen > low_wavelen:
            out.append(s["factor"])
        else:
            smooth = (s["original_max_position_embeddings"] / wavelen - s["low_freq_factor"]) / (
                s["high_freq_factor"] - s["low_freq_factor"])
            out.append(1 / ((1 - smooth) / s["factor"] + smooth))
    return np.array(out, dtype=np.float32)


def check_layout(name, model, g, failures):
    """The f32 file g of directory model against the converter's layout."""
    import json
    with open(os.path.join(model, "config.json")) as f:
        config = json.load(f)
    md = g.metadata
    permuted = config["model_type"] in ("llama", "mistral")
    want_arch = "llama" if permuted else config["model_type"]
    if md["general.architecture"] != want_arch:
        failures.append(f"{name}: architecture {md['general.architecture']}, llama.cpp writes {want_arch}")
        return
    hf = st.Checkpoint(model)
    heads = {"q": config["num_attention_heads"], "k": config["num_key_value_heads"]}
    for which, n_head in heads.items():
        for kind in ("weight", "bias"):
            src = f"model.layers.0.self_attn.{which}_proj.{kind}"
            if src not in hf:
                continue
            want = permute(hf[src], n_head) if permuted else hf[src]
            got = g.tensor(f"blk.0.attn_{which}.{kind}")
            if not np.array_equal(got, want):
                failures.append(f"{name}: blk.0.attn_{which}.{kind} is not {'permuted ' if permuted else ''}"
                                f"as llama.cpp writes it")
    if (config.get("rope_scaling") or {}).get("rope_type") == "llama3":
        t = g.tensor_by_name.get("rope_freqs.weight")
        if t is None or t.type_name != "F32":
            failures.append(f"{name}: no F32 rope_freqs.weight")
        elif not np.allclose(g.tensor("rope_freqs.weight"), llama3_factors(config), rtol=1e-6, atol=0):
            failures.append(f"{name}: rope_freqs.weight {g.tensor('rope_freqs.weight')} differs from the "
                            f"converter's {llama3_factors(config)}")
    elif "rope_freqs.weight" in g.tensor_by_name:
        failures.append(f"{name}: rope_freqs.weight without rope_scaling")
    window = md.get("llama.attention.sliding_window")
    if config["model_type"] == "mistral" and window != config["sliding_window"]:
        failures.append(f"{name}: llama.attention.sliding_window is {window}, config says "
                        f"{config['sliding_window']}")


def logits(rlx, args, out):
    p = subprocess.run([rlx, "logits", *args, "--tokens", PROMPT, "--all", "--out", out], capture_output=True,
                       text=True)
    if p.returncode != 0:
        raise RuntimeError(f"logits {' '.join(args)}: {p.stderr.strip()}")
    return open(out, "rb").read()


def main():
    ap = argparse.ArgumentParser()
    for a in ("--rlx", "--brown", "--workdir"):
        ap.add_argument(a, required=True)
    args = ap.parse_args()
    kinds = ("llama-tied", "llama-untied-bias", "llama3-rope", "mistral", "qwen2-tied")
    models = random_models(args.workdir, {k: (k, {}) for k in kinds}, 7, args.brown, __file__)
    failures = []
    for name, model in models.items():
        for t in ("f32", "q8_0"):
            out = os.path.join(args.workdir, f"{name}-{t}.gguf")
            p = subprocess.run([args.rlx, "quantize", model, out, "--type", t, "-q"], capture_output=True, text=True)
            if p.returncode != 0:
                failures.append(f"{name} {t}: quantize: {p.stderr.strip()}")
                continue
            if t == "f32":
                check_layout(name, model, gguf_ref.read(out), failures)
            try:
                base = ["-m", model] + ([] if t == "f32" else ["--quant", t])
                a = logits(args.rlx, base, os.path.join(args.workdir, f"{name}-{t}-dir.f32"))
                b = logits(args.rlx, ["-m", out], os.path.join(args.workdir, f"{name}-{t}-gguf.f32"))
            except RuntimeError as e:
                failures.append(f"{name} {t}: {e}")
                continue
            same = a == b
            if not same:
                x, y = np.frombuffer(a, "<f4"), np.frombuffer(b, "<f4")
                failures.append(f"{name} {t}: the GGUF file's logits differ from the directory's (max "
                                f"{np.max(np.abs(x - y)) if x.size == y.size else 'size'} apart)")
            print(f"{name} {t}: logits {'identical' if same else 'DIFFER'}")
    return verdict(failures)


if __name__ == "__main__":
    sys.exit(main())
