"""What the GGUF tests share: finding the llama.cpp-written reference files, skipping when they
are absent, running rlx with a timeout, and the GGUF -> Hugging Face tensor names.

The name table is written here from llama.cpp's naming (gguf-py's tensor_mapping for qwen3), not
taken from rlx's C table (core/src/model/gguf_model.c), so a wrong entry on either side shows up
as a name mismatch in test_gguf_tensors.py instead of agreeing with itself.
"""
import json
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from ci_skip import missing_input  # noqa: E402

TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}


def hf_name(gguf_name):
    """The Hugging Face name of a dense qwen3 GGUF tensor; ValueError for one this table does not
    know (a test must not silently skip a tensor it cannot place)."""
    stem, dot, suffix = gguf_name.rpartition(".")
    if not dot:
        raise ValueError("tensor name %r has no .weight/.bias suffix" % gguf_name)
    m = re.fullmatch(r"blk\.(\d+)\.(\w+)", stem)
    if m and m.group(2) in LAYER_NAMES:
        return "model.layers.%s.%s.%s" % (m.group(1), LAYER_NAMES[m.group(2)], suffix)
    if stem in TOP_NAMES:
        return "%s.%s" % (TOP_NAMES[stem], suffix)
    raise ValueError("no Hugging Face name known for GGUF tensor %r" % gguf_name)


def shared_gguf_dir(path):
    """path (the tests' ${PROJECT_SOURCE_DIR}/../shared/gguf) if it holds the reference files;
    otherwise exits saying why: CI clones the repository next to `shared`, so there a missing
    file is a failure; a developer's checkout may not have it, and there it is a skip (77)."""
    ref = os.path.join(path, "reference", "llama.cpp.json")
    if not os.path.isfile(ref):
        sys.exit(missing_input("no llama.cpp reference files (%s is missing)" % ref))
    return path


def reference(path):
    with open(os.path.join(path, "reference", "llama.cpp.json")) as f:
        return json.load(f)["files"]


def gguf_files(path):
    """The .gguf files of the shared directory, sorted; every one must have a reference entry,
    else a file added there would go untested."""
    files = sorted(f for f in os.listdir(path) if f.endswith(".gguf"))
    if not files:
        raise SystemExit("FAIL: no .gguf files in %s" % path)
    return files


def run(cmd, timeout, **kw):
    """subprocess.run with captured text output; a timeout is returned as returncode None
    (with what was printed so far) so the caller can report it as a failure of that case."""
    try:
        return subprocess.run(cmd, capture_output=True, timeout=timeout, **kw)
    except subprocess.TimeoutExpired as e:
        e.returncode = None
        e.stdout = e.stdout or b""
        e.stderr = e.stderr or b""
        return e


def finish(test, failures, summary):
    """Prints the failures and the test's one-line verdict; returns the exit status."""
    for f in failures:
        print("FAIL: " + f)
    print("%s: %s, %s" % (test, summary, "%d failures" % len(failures) if failures else "PASS"))
    return 1 if failures else 0
