#!/usr/bin/python3
"""rlx perplexity on every llama.cpp-written GGUF file against llama.cpp's own figure.

  test_gguf_perplexity.py --rlx BIN --shared DIR/shared/gguf [--only NAME ...] [--chunks K] [-- EXTRA_RLX_ARGS...]

reference/llama.cpp.json (shared) holds what `llama-perplexity -m FILE -f brown-heldout.txt -c 256`
printed at the end for each file; `rlx perplexity -m FILE -f brown-heldout.txt -c 256` computes the
same statistic by the same method (whole text tokenized, chunks of 256 from an empty cache, second
half scored) and must land within 0.3 % of it. Perplexity averages the log-likelihood of some
14k scored tokens, so unlike greedy decoding it is insensitive to a near-tie here and there: a
0.3 % band holds an implementation that computes the same function with other rounding (such
as llama.cpp's 8-bit activations in its quantized kernels): llama.cpp's own figures for all
eight draft files lie within 0.02 % of each other, the four target files' within 0.04 %. A
wrong dequantizer, tensor or scoring rule is not a rounding difference and leaves the band.

--chunks K scores only the first K chunks (`rlx perplexity --chunks K`) and compares rlx's
figure with llama.cpp's running figure after chunk K, which tests/gguf/reference/llama.cpp-chunks.json
recorded (record_llama_chunks.py beside it; its final figures must equal the shared ones, or the
two references describe different files and the test fails). K chunks cost K/107 of the whole
text; CMakeLists.txt says why its K still separates right from wrong. The figures and run times
are printed per file. Exits 77 when the shared directory is absent.
"""
import argparse
import json
import os
import re
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import gguf_common as C  # noqa: E402

FINAL = re.compile(r"Final estimate: PPL = ([\d.]+) \+/- ([\d.]+)")
REL_TOL = 0.003
CHUNKS_REFERENCE = os.path.join(HERE, "reference", "llama.cpp-chunks.json")


def rlx_perplexity(rlx, model, text, timeout, rlx_args=()):
    """`rlx perplexity -m model -f text -c 256 [rlx_args]`: (PPL, seconds, None), or (None, seconds, why)."""
    start = time.time()
    p = C.run([rlx, "perplexity", "-m", model, "-f", text, "-c", "256", *rlx_args], timeout=timeout)
    took = time.time() - start
    out = p.stdout.decode(errors="replace")
    m = FINAL.search(out)
    if p.returncode != 0 or not m:
        return None, took, "rlx perplexity exited %s without a final estimate (%.0f s): %s" % (
            p.returncode, took, (p.stderr.decode(errors="replace") + out)[-400:])
    return float(m.group(1)), took, None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rlx", required=True)
    ap.add_argument("--shared", required=True)
    ap.add_argument("--only", nargs="*", help="file names to run (default: all)")
    ap.add_argument("--chunks", type=int, default=0,
                    help="compare after the first K chunks with llama.cpp's running figure (default: the whole text)")
    ap.add_argument("--timeout", type=float, default=7200, help="seconds per file")
    ap.add_argument("rlx_args", nargs="*", help="extra rlx arguments, after --")
    args = ap.parse_args()
    shared = C.shared_gguf_dir(args.shared)
    ref = C.reference(shared)
    text = os.path.join(shared, "brown-heldout.txt")
    names = C.gguf_files(shared)
    if args.only:
        unknown = sorted(set(args.only) - set(names))
        if unknown:
            raise SystemExit("FAIL: --only names files not in %s: %s" % (shared, unknown))
        names = [n for n in names if n in args.only]
    if args.chunks < 0:
        raise SystemExit("FAIL: --chunks %d is not a number of chunks" % args.chunks)
    if args.chunks:
        with open(CHUNKS_REFERENCE) as f:
            running = json.load(f)["files"]
    failures = []
    for name in names:
        if name not in ref or "perplexity" not in ref[name]:
            failures.append("%s has no perplexity in reference/llama.cpp.json" % name)
            continue
        want = ref[name]["perplexity"]
        rlx_args = list(args.rlx_args)
        if args.chunks:
            figures = running.get(name, {"final": None, "running": []})
            if figures["final"] is None or "%.4f" % figures["final"] != "%.4f" % want:
                failures.append("%s: %s records final PPL %s, the shared reference %.4f: not the same file" % (
                    name, os.path.basename(CHUNKS_REFERENCE), figures["final"], want))
                continue
            if args.chunks > len(figures["running"]):
                failures.append("%s has %d chunks, fewer than --chunks %d" % (name, len(figures["running"]), args.chunks))
                continue
            want = figures["running"][args.chunks - 1]
            rlx_args += ["--chunks", str(args.chunks)]
        ppl, took, error = rlx_perplexity(args.rlx, os.path.join(shared, name), text, args.timeout, rlx_args)
        if error:
            failures.append("%s: %s" % (name, error))
            print("FAIL %-26s no figure (%.0f s)" % (name, took))
            continue
        rel = (ppl - want) / want
        ok = abs(rel) <= REL_TOL
        print("%s %-26s %s: rlx %.4f, llama.cpp %.4f: %+.3f %% (%.0f s)" % (
            "PASS" if ok else "FAIL", name, "%d chunks" % args.chunks if args.chunks else "whole text",
            ppl, want, 100 * rel, took), flush=True)
        if not ok:
            failures.append("%s: PPL %.4f differs from llama.cpp's %.4f by %+.3f %% (limit %.1f %%)" % (
                name, ppl, want, 100 * rel, 100 * REL_TOL))
    return C.finish("gguf_perplexity", failures, "%d files" % len(names))


if __name__ == "__main__":
    sys.exit(main())
