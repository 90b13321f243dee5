#!/usr/bin/python3
"""rlx quantize on the hybrids (qwen35, qwen35moe, qwen3next) against the files llama.cpp's own
converter and llama-quantize wrote from the same checkpoints (tests/llamacpp/ref, make_refs.py):
nothing compared here was written by rlx's code but the files under test.

  check_hybrid_gguf.py --rlx BIN --workdir DIR [--model NAME ...]

For each checkpoint NAME:
  1. it is written again (tests/llamacpp/arch_models.py) and must hash as the one llama.cpp
     converted, so ref/NAME-*.gguf belong to these weights;
  2. `rlx quantize DIR out --type f32` against ref/NAME-f32.gguf (convert_hf_to_gguf.py
     --outtype f32): the same metadata keys, value types and values but those of LEGIT (each
     says why), the same tensor names, dims and types, and the same bytes, but ssm_a: there rlx
     writes -exp(A_log) correctly rounded to F32, which NumPy checks in float64 with the value
     heads tiled by the converter's formula (_reorder_v_heads, written again here), and
     llama.cpp's (torch's float32 exp) must be within one unit in the last place of it;
  3. `--type q8_0` against ref/NAME-q8_0.gguf (llama-quantize NAME-f32.gguf Q8_0): the same
     tensor types (dims alike but for trailing 1s: llama-quantize writes the [128, 1] shared-
     expert gate as [128]), every Q8_0 tensor's bytes identical, the F32 ones as in step 2; and
     `rlx generate` on rlx's Q8_0 file continues the prompts as llama-completion did on
     llama.cpp's (its F32-attention text, test_gguf_greedy.py's rule with test_llamacpp.py's
     near tie for quantized files);
  4. `rlx generate -n 32 --temp 0` gives the same ids on rlx's F32 file as on the directory;
  5. a GGUF source: `rlx quantize ref/NAME-f32.gguf` to f32 and q8_0 gives llama.cpp's F32 file
     and llama-quantize's Q8_0 file again, every tensor's bytes (ssm_a too: its values pass
     through) and the metadata but LEGIT_GGUF.
Then a qwen35 checkpoint whose full-attention layer is not every n-th (layer_types linear, full,
linear, linear), which llama.cpp's full_attention_interval cannot state, is refused, naming the
key, and no file is left.

Tensor order is not compared: rlx writes a layer's tensors in its table's order, the converter
in the checkpoint's name order, and GGUF readers find tensors by name.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.dirname(HERE)
sys.path[:0] = [HERE, os.path.join(TESTS, "llamacpp"), os.path.join(TESTS, "gguf"), os.path.join(TESTS, "model")]
import arch_models  # noqa: E402
import make_hybrid  # noqa: E402
import st  # noqa: E402
import test_gguf_greedy as greedy  # noqa: E402
from qutil import gguf_ref, verdict  # noqa: E402

REF = os.path.join(TESTS, "llamacpp", "ref")
MODELS = ("qwen35", "qwen35moe", "qwen3next")
QUANT_NEAR_TIE = 0.3  # test_llamacpp.py's, for files with block-quantized matrices (it says why)
PROMPT_STEPS = 32

# Metadata that legitimately differs between rlx's file from the directory and the converter's.
LEGIT = {
    "general.name": "the converter was given --model-name rlx-test-NAME; rlx names the file after the "
                    "directory (step 5: a GGUF source keeps its name)",
    "general.size_label": "the converter's display label ('1.3M'), not read by llama.cpp's programs",
    "general.sampling.top_k": "the converter copies generation_config.json's sampling defaults; rlx's writer "
                              "writes none, for any architecture",
    "general.sampling.top_p": "as general.sampling.top_k",
    "general.sampling.temp": "as general.sampling.top_k",
    "tokenizer.ggml.bos_token_id": "the converter takes config.json's bos_token_id, rlx's writer the tokenizer's "
                                   "BOS, which the Brown tokenizer has not (add_bos_token is false, so neither "
                                   "runs one), for every architecture (step 5: a GGUF source keeps it)",
    "general.alignment": "rlx states GGUF's default alignment, 32",
}
LEGIT_GGUF = ("general.size_label", "general.sampling.top_k", "general.sampling.top_p", "general.sampling.temp",
              "general.alignment")


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError("%s exited %d: %s" % (" ".join(cmd[:2]), p.returncode, p.stderr.strip()[-600:]))
    return p.stdout


def same_value(a, b):
    if isinstance(a, (list, tuple, np.ndarray)) or isinstance(b, (list, tuple, np.ndarray)):
        return len(a) == len(b) and all(x == y for x, y in zip(a, b))
    return a == b


def compare_metadata(ours, ref, legit, what, failures):
    ko = set(ours.metadata) - set(legit)
    kr = set(ref.metadata) - set(legit)
    if ko != kr:
        failures.append("%s: metadata keys differ: only rlx %s, only llama.cpp %s"
                        % (what, sorted(ko - kr), sorted(kr - ko)))
    for k in sorted(ko & kr):
        if ours.value_types[k] != ref.value_types[k]:
            failures.append("%s: metadata %s is %s, llama.cpp's %s" % (what, k, ours.value_types[k],
                                                                       ref.value_types[k]))
        elif not same_value(ours.metadata[k], ref.metadata[k]):
            failures.append("%s: metadata %s: rlx %s, llama.cpp %s" % (what, k, str(ours.metadata[k])[:80],
                                                                      str(ref.metadata[k])[:80]))


def trimmed(dims):
    """dims without trailing 1s, as ggml_n_dims counts them."""
    dims = list(dims)
    while len(dims) > 1 and dims[-1] == 1:
        dims.pop()
    return dims


def ulps(a, b):
    """Units in the last place between float32 arrays of one sign."""
    return np.abs(a.view(np.int32).astype(np.int64) - b.view(np.int32).astype(np.int64))


def tiled(v, config):
    """A vector over value heads in llama.cpp's tiled order: its converter's _reorder_v_heads
    views the heads as [key heads, value heads per key head] and swaps the two."""
    kh, vh = config["linear_num_key_heads"], config["linear_num_value_heads"]
    return v.reshape(kh, vh // kh).T.reshape(-1)


def expected_ssm_a(hf, config, layer, tile):
    """-exp(A_log) of a layer in float64, rounded once to float32, in the file's head order."""
    a = (-np.exp(hf["model.layers.%d.linear_attn.A_log" % layer].astype(np.float64))).astype(np.float32)
    return tiled(a, config) if tile else a


def compare_tensors(ours, ref, what, failures, ssm_a=None, trim=False):
    """Names, dims, types and bytes; ssm_a(name) gives rlx's expected values of an ssm_a tensor,
    whose bytes may then differ from llama.cpp's by one unit in the last place."""
    to, tr = ours.tensor_by_name, ref.tensor_by_name
    if set(to) != set(tr):
        failures.append("%s: tensor names differ: only rlx %s, only llama.cpp %s"
                        % (what, sorted(set(to) - set(tr)), sorted(set(tr) - set(to))))
    checked = 0
    for name in sorted(set(to) & set(tr)):
        a, b = to[name], tr[name]
        dims_a, dims_b = (trimmed(a.dims), trimmed(b.dims)) if trim else (list(a.dims), list(b.dims))
        if dims_a != dims_b or a.type != b.type:
            failures.append("%s: %s: rlx %s %s, llama.cpp %s %s" % (what, name, a.type_name, a.dims, b.type_name,
                                                                    b.dims))
            continue
        if ours.raw(name) == ref.raw(name):
            checked += 1
            continue
        if ssm_a and name.endswith(".ssm_a"):
            want = ssm_a(name)
            got, theirs = ours.tensor(name), ref.tensor(name)
            if not np.array_equal(got, want):
                failures.append("%s: %s is %s, not -exp(A_log) rounded to F32 %s" % (what, name, got, want))
            elif ulps(theirs, want).max() > 1:
                failures.append("%s: %s: llama.cpp's %s is more than 1 ulp from %s" % (what, name, theirs, want))
            else:
                checked += 1
            continue
        failures.append("%s: %s: %s bytes differ from llama.cpp's" % (what, name, a.type_name))
    return checked


def generate_ids(rlx, model, prompt):
    out = json.loads(run([rlx, "generate", "-m", model, "-p", prompt, "-n", str(PROMPT_STEPS), "--temp", "0",
                          "--json"]))
    return out["tokens"]


def check_model(rlx, name, ref, workdir, failures):
    hf = os.path.join(workdir, name)
    shutil.rmtree(hf, ignore_errors=True)
    digests = arch_models.build(name, hf)
    if digests != ref["models"][name]["sha256"]:
        failures.append("%s: the checkpoint written now differs from the one llama.cpp converted: run "
                        "tests/llamacpp/make_refs.py again" % name)
        return
    with open(os.path.join(hf, "config.json")) as f:
        config = json.load(f)
    config = config.get("text_config", config)
    checkpoint = st.Checkpoint(hf)
    tile = name != "qwen3next"  # the converter tiles the value heads of qwen35 and qwen35moe only

    def ssm_a(tensor):
        return expected_ssm_a(checkpoint, config, int(tensor.split(".")[1]), tile)

    ref_f32 = gguf_ref.read(os.path.join(REF, "%s-f32.gguf" % name))
    ref_q8 = gguf_ref.read(os.path.join(REF, "%s-q8_0.gguf" % name))
    out = {}
    for t in ("f32", "q8_0"):
        out[t] = os.path.join(workdir, "%s-%s.gguf" % (name, t))
        try:
            run([rlx, "quantize", hf, out[t], "--type", t, "-q"])
        except RuntimeError as e:
            failures.append("%s %s: %s" % (name, t, e))
            return
    ours = gguf_ref.read(out["f32"])
    compare_metadata(ours, ref_f32, LEGIT, name + " f32", failures)
    n = compare_tensors(ours, ref_f32, name + " f32", failures, ssm_a)
    print("%s f32: %d of %d tensors as llama.cpp's converter writes them" % (name, n, len(ref_f32.tensors)))

    ours = gguf_ref.read(out["q8_0"])
    compare_metadata(ours, ref_q8, LEGIT, name + " q8_0", failures)
    n = compare_tensors(ours, ref_q8, name + " q8_0", failures, ssm_a, trim=True)
    print("%s q8_0: %d of %d tensors as llama-quantize writes them" % (name, n, len(ref_q8.tensors)))
    want = ref["files"]["%s-q8_0.gguf" % name]["greedy_f32_attention"]
    for k, case in enumerate(want):
        result, detail, failure = greedy.check_case(rlx, out["q8_0"], case["prompt"], case["continuation"],
                                                    PROMPT_STEPS, near_tie=QUANT_NEAR_TIE)
        print("%s q8_0 greedy %d: %s %s" % (name, k, result, detail))
        if failure:
            failures.append("%s q8_0 prompt %d: %s" % (name, k, failure))

    prompt = want[0]["prompt"]
    try:
        a, b = generate_ids(rlx, hf, prompt), generate_ids(rlx, out["f32"], prompt)
        print("%s: ids on the directory and on rlx's f32 file %s" % (name, "agree" if a == b else "DIFFER"))
        if a != b:
            failures.append("%s: rlx generate gives %s on the directory, %s on its f32 file" % (name, a, b))
    except RuntimeError as e:
        failures.append("%s: %s" % (name, e))

    for t, ref_file in (("f32", ref_f32), ("q8_0", ref_q8)):
        path = os.path.join(workdir, "%s-from-gguf-%s.gguf" % (name, t))
        try:
            run([rlx, "quantize", os.path.join(REF, "%s-f32.gguf" % name), path, "--type", t, "-q"])
        except RuntimeError as e:
            failures.append("%s from GGUF %s: %s" % (name, t, e))
            continue
        ours = gguf_ref.read(path)
        compare_metadata(ours, ref_file, LEGIT_GGUF, "%s from GGUF %s" % (name, t), failures)
        n = compare_tensors(ours, ref_file, "%s from GGUF %s" % (name, t), failures, trim=t != "f32")
        print("%s from GGUF %s: %d of %d tensors identical" % (name, t, n, len(ref_file.tensors)))


def check_refused(rlx, workdir, failures):
    """A layer pattern llama.cpp cannot state is refused."""
    base, changes = arch_models.MODELS["qwen35"]
    text = dict(changes["text"], layer_types=["linear_attention", "full_attention", "linear_attention",
                                              "linear_attention"])
    make_hybrid.KINDS["qwen35-irregular"] = dict(make_hybrid.KINDS[base], **dict(changes, text=text))
    hf = os.path.join(workdir, "qwen35-irregular")
    shutil.rmtree(hf, ignore_errors=True)
    make_hybrid.build("qwen35-irregular", "f32", 1, arch_models.SEED, hf)
    for f in arch_models.TOKENIZER_FILES:
        shutil.copyfile(os.path.join(arch_models.BROWN, f), os.path.join(hf, f))
    out = os.path.join(workdir, "qwen35-irregular.gguf")
    p = subprocess.run([rlx, "quantize", hf, out, "--type", "q8_0", "-q"], capture_output=True, text=True)
    left = [f for f in (out, out + ".tmp") if os.path.exists(f)]
    if p.returncode == 0 or "full_attention_interval" not in p.stderr or left:
        failures.append("an irregular layer pattern: exit %d, %r, files left %s" % (p.returncode, p.stderr.strip(),
                                                                                  left))
    else:
        print("irregular layer pattern refused: %s" % p.stderr.strip())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rlx", required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--model", action="append", choices=MODELS)
    args = ap.parse_args()
    with open(os.path.join(REF, "llama.cpp.json")) as f:
        ref = json.load(f)
    os.makedirs(args.workdir, exist_ok=True)
    failures = []
    for name in args.model or MODELS:
        check_model(args.rlx, name, ref, args.workdir, failures)
    check_refused(args.rlx, args.workdir, failures)
    return verdict(failures)


if __name__ == "__main__":
    sys.exit(main())
