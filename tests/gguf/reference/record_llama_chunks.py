#!/usr/bin/python3
"""Records llama.cpp's running perplexity per chunk on the shared GGUF files (llama.cpp-chunks.json).

  record_llama_chunks.py --llama-perplexity PATH/llama-perplexity --shared DIR/shared/gguf [--out FILE]

llama-perplexity prints the running figure after every chunk ([1]x,[2]y,...); the shared
reference (shared/gguf/reference/llama.cpp.json) keeps only the final one. test_gguf_perplexity.py
compares `rlx perplexity --chunks K` with the running figure at chunk K, which costs a fraction of
the whole text. Each file is run with the command the shared README names (plus its 2 threads),
and its final figure must equal the shared reference to the printed digits: that shows this
build computes what the one that wrote the reference computed, so its running figures can stand
beside the shared final ones. Takes an already built llama-perplexity; builds nothing.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import gguf_common as C  # noqa: E402

RUNNING = re.compile(r"\[(\d+)\]([\d.]+),")
FINAL = re.compile(r"Final estimate: PPL = ([\d.]+) \+/- ([\d.]+)")
VERSION = re.compile(r"version: (\d+) \(([0-9a-f]+)\)")
ARGS = ["-c", "256", "-t", "2"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-perplexity", required=True, help="path of an already built llama-perplexity")
    ap.add_argument("--shared", required=True)
    ap.add_argument("--out", default=os.path.join(HERE, "llama.cpp-chunks.json"))
    args = ap.parse_args()
    shared = C.shared_gguf_dir(args.shared)
    ref = C.reference(shared)
    version = subprocess.run([args.llama_perplexity, "--version"], capture_output=True, text=True)
    v = VERSION.search(version.stdout + version.stderr)
    if not v:
        raise SystemExit("FAIL: %s --version printed no build and commit" % args.llama_perplexity)
    files = {}
    for name in C.gguf_files(shared):
        cmd = [args.llama_perplexity, "-m", os.path.join(shared, name), "-f",
               os.path.join(shared, "brown-heldout.txt"), *ARGS]
        # into a file: through a pipe, llama-perplexity (its logging thread) has been seen to exit
        # before writing its last lines
        with tempfile.TemporaryFile() as log:
            p = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, timeout=3600)
            log.seek(0)
            out = log.read().decode(errors="replace")
        final = FINAL.search(out)
        if p.returncode != 0 or not final:
            raise SystemExit("FAIL: %s exited %s without a final estimate: %s" % (name, p.returncode, out[-400:]))
        running = [(int(i), float(x)) for i, x in RUNNING.findall(out)]
        if [i for i, _ in running] != list(range(1, len(running) + 1)) or not running:
            raise SystemExit("FAIL: %s: running figures are not [1]..[n] in order" % name)
        want = "%.4f" % ref[name]["perplexity"]
        if final.group(1) != want or "%.4f" % running[-1][1] != want:
            raise SystemExit("FAIL: %s: this build's final PPL %s is not the shared reference's %s" %
                             (name, final.group(1), want))
        files[name] = {"final": float(final.group(1)), "running": [x for _, x in running]}
        print("%-26s %d chunks, final %s = reference" % (name, len(running), want), flush=True)
    doc = {
        "producer": "llama.cpp build %s (commit %s), CPU, 2 threads" % (v.group(1), v.group(2)),
        "command": "llama-perplexity -m FILE -f brown-heldout.txt " + " ".join(ARGS),
        "note": "running[k-1] is the figure llama-perplexity prints as [k] after chunk k; every file's "
                "final figure equals shared/gguf/reference/llama.cpp.json's (written by "
                "tests/gguf/reference/record_llama_chunks.py)",
        "files": files,
    }
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
