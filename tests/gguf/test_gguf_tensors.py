#!/usr/bin/python3
"""rlx's view of every tensor of every llama.cpp-written GGUF file against the independent NumPy
reader, bit for bit.

  test_gguf_tensors.py --dump PATH/gguf_dump --shared DIR/shared/gguf --workdir DIR

For each .gguf file of the shared directory, gguf_dump (public API only: rlx_weights_open,
rlx_weights_at, rlx_iface_dequant_row) writes every tensor rlx lists, widened to F32, and its
index (Hugging Face name, rlx dtype name, shape). Against gguf_ref.py, which parses the file and
dequantizes from the GGUF specification and ggml's reference dequantizers on its own:
- the set of names is the GGUF names mapped by this test's own table (gguf_common.hf_name);
- each shape is the GGUF dims reversed (rlx lists [out, in], GGUF ne0 first);
- each dtype name is the GGUF type's name in lower case (q4_k for Q4_K ...);
- each value is bitwise equal (the uint32 patterns, so -0.0 vs 0.0 or a NaN payload counts).
Bitwise and not within a tolerance: both sides claim to follow ggml's reference dequantizers
operation for operation in F32, so any difference at all is a decoding or layout error (a wrong
nibble order, scale unpacking, block offset or row order), which a tolerance could hide in the
low bits of small sub-block scales. Exits 77 (skipped) when the shared directory is absent.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import gguf_common as C  # noqa: E402
import gguf_ref as G  # noqa: E402


def check_file(dump, path, workdir):
    """The list of failures for one GGUF file, and a summary line."""
    out = os.path.join(workdir, os.path.basename(path) + ".dump")
    shutil.rmtree(out, ignore_errors=True)  # a stale dump must not pass for this run's
    os.makedirs(out)
    p = subprocess.run([dump, path, out], capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        return ["gguf_dump exited %d: %s" % (p.returncode, p.stderr.strip())], "not dumped"
    with open(os.path.join(out, "index.json")) as f:
        index = {e["name"]: e for e in json.load(f)}
    g = G.read(path)
    failures = []
    want = {}
    for t in g.tensors:
        try:
            want[C.hf_name(t.name)] = t
        except ValueError as e:
            failures.append(str(e))
    for name in sorted(set(want) - set(index)):
        failures.append("%s (GGUF %s) is not listed by rlx" % (name, want[name].name))
    for name in sorted(set(index) - set(want)):
        failures.append("rlx lists %s, which the file does not hold under any mapped name" % name)
    types, bits = {}, 0
    for name in sorted(set(want) & set(index)):
        t, e = want[name], index[name]
        if tuple(e["shape"]) != t.hf_shape:
            failures.append("%s: rlx shape %s, GGUF dims %s reversed are %s" % (name, e["shape"], list(t.dims),
                                                                                list(t.hf_shape)))
            continue
        if e["dtype"] != t.type_name.lower():
            failures.append("%s: rlx dtype %s for GGUF type %s" % (name, e["dtype"], t.type_name))
        got = np.fromfile(os.path.join(out, e["file"]), dtype="<f4")
        ref = g.tensor(t.name).ravel()
        if got.size != ref.size:
            failures.append("%s: rlx wrote %d values, the reference has %d" % (name, got.size, ref.size))
            continue
        diff = np.flatnonzero(got.view(np.uint32) != ref.view(np.uint32))
        if diff.size:
            i = int(diff[0])
            block = G.GGML_TYPES[t.type][1]
            failures.append("%s (%s): %d of %d values differ, first at flat index %d (row %d, block %d of the "
                            "row, element %d of the block): rlx %r, reference %r" % (
                                name, t.type_name, diff.size, ref.size, i, i // t.dims[0], (i % t.dims[0]) // block,
                                i % block, float(got[i]), float(ref[i])))
        types[t.type_name] = types.get(t.type_name, 0) + 1
        bits += ref.size
    shutil.rmtree(out, ignore_errors=True)
    summary = "%d tensors (%s), %d values" % (len(index), ", ".join("%s x%d" % kv for kv in sorted(types.items())),
                                              bits)
    return failures, summary


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dump", required=True, help="the gguf_dump probe")
    ap.add_argument("--shared", required=True, help="the shared/gguf directory")
    ap.add_argument("--workdir", required=True)
    args = ap.parse_args()
    shared = C.shared_gguf_dir(args.shared)
    os.makedirs(args.workdir, exist_ok=True)
    failed = 0
    for name in C.gguf_files(shared):
        start = time.time()
        failures, summary = check_file(args.dump, os.path.join(shared, name), args.workdir)
        verdict = "FAIL" if failures else "PASS"
        print("%s %s: %s (%.1f s)" % (verdict, name, summary, time.time() - start))
        for f in failures[:20]:
            print("  FAIL: " + f)
        if len(failures) > 20:
            print("  ... %d more" % (len(failures) - 20))
        failed += bool(failures)
    print("gguf_tensors: %s" % ("%d files FAIL" % failed if failed else "PASS"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
