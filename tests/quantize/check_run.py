#!/usr/bin/python3
"""rlx runs the GGUF files rlx quantize writes, and --quant gives the same model in memory:
- for each type: `rlx generate -m OUT.gguf` produces text, and `rlx perplexity -m OUT.gguf -f
  brown-heldout.txt -c 256 --chunks 4` is within 1 % of the same command on llama.cpp's file of
  that type (when /work/shared/gguf is there);
- `--quant T` on the safetensors directory gives bit-identical logits (and so the same greedy
  text) as the GGUF file of type T (the same weights in the same kernels);
- errors: an unknown type, --quant on a GGUF model, an output directory that does not exist,
  a write that fails half way (a file size limit standing in for a full disk): the message
  names the file, and no partial file is left.

  check_run.py --rlx BIN --model DIR --shared DIR --workdir DIR --type T [--type T ...] --quant T [--quant T ...]
"""
import argparse
import os
import re
import resource
import signal
import subprocess
import sys
import time

from qutil import verdict

PROMPT = "The jury said that the city of Atlanta had"


def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


def ppl(args, model, text):
    p = run([args.rlx, "perplexity", "-m", model, "-f", text, "-c", "256", "--chunks", "4", "-t", "2"])
    m = re.search(r"Final estimate: PPL = ([0-9.]+)", p.stdout + p.stderr)
    if p.returncode != 0 or not m:
        raise RuntimeError(f"perplexity on {model} failed: {p.stderr.strip()[-300:]}")
    return float(m.group(1))


def main():
    ap = argparse.ArgumentParser()
    for a in ("--rlx", "--model", "--shared", "--workdir"):
        ap.add_argument(a, required=True)
    ap.add_argument("--type", action="append", default=[])
    ap.add_argument("--quant", action="append", default=[])
    args = ap.parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    base = os.path.basename(os.path.normpath(args.model))
    text = os.path.join(args.shared, "brown-heldout.txt")
    failures = []
    out = {}
    for t in sorted(set(args.type) | set(args.quant)):
        out[t] = os.path.join(args.workdir, f"{base}-{t}.gguf")
        p = run([args.rlx, "quantize", args.model, out[t], "--type", t, "-q"])
        if p.returncode != 0:
            failures.append(f"{t}: rlx quantize: {p.stderr.strip()}")
    for t in args.type:
        p = run([args.rlx, "generate", "-m", out[t], "-p", PROMPT, "-n", "16", "--greedy"])
        if p.returncode != 0 or not p.stdout.strip():
            failures.append(f"{t}: generate failed: {p.stderr.strip()[-300:]}")
        ref = os.path.join(args.shared, f"brown-{base}-{t}.gguf")
        if os.path.exists(ref) and os.path.exists(text):
            t0 = time.time()
            a, b = ppl(args, out[t], text), ppl(args, ref, text)
            rel = abs(a / b - 1)
            print(f"{t}: perplexity rlx file {a:.4f}, llama.cpp file {b:.4f} ({100 * (a / b - 1):+.3f} %, "
                  f"{time.time() - t0:.1f} s)")
            if rel > 0.01:
                failures.append(f"{t}: perplexity {a} is not within 1 % of llama.cpp's file's {b}")
        else:
            print(f"{t}: generate ok; no llama.cpp file or held-out text for the perplexity comparison")
    toks = run([args.rlx, "tokenize", "-m", args.model, "-p", PROMPT]).stdout.strip()
    for t in args.quant:
        logits = []
        for extra in (["-m", args.model, "--quant", t], ["-m", out[t]]):
            f = os.path.join(args.workdir, f"logits-{t}-{len(logits)}.f32")
            p = run([args.rlx, "logits", *extra, "--tokens", toks, "--all", "--out", f])
            if p.returncode != 0:
                failures.append(f"--quant {t}: logits failed: {p.stderr.strip()}")
                break
            with open(f, "rb") as fh:
                logits.append(fh.read())
        if len(logits) == 2 and logits[0] != logits[1]:
            failures.append(f"--quant {t}: logits differ from the {t} GGUF file's")
        gens = [run([args.rlx, "generate", *extra, "-p", PROMPT, "-n", "24", "--greedy", "--json"]).stdout
                for extra in (["-m", args.model, "--quant", t], ["-m", out[t]])]
        tok_lists = [re.search(r'"tokens":\[([^\]]*)\]', g) for g in gens]
        if not all(tok_lists) or tok_lists[0].group(1) != tok_lists[1].group(1):
            failures.append(f"--quant {t}: greedy tokens differ from the {t} GGUF file's")
        else:
            print(f"--quant {t}: logits and greedy tokens identical to the GGUF file's")

    # errors
    checks = [
        ([args.rlx, "quantize", args.model, os.path.join(args.workdir, "x.gguf"), "--type", "q3_k"], "unknown type"),
        ([args.rlx, "logits", "-m", next(iter(out.values())), "--quant", "q8_0", "--tokens", "1", "--out",
          os.path.join(args.workdir, "x.f32")], "rlx quantize"),
        ([args.rlx, "quantize", args.model, os.path.join(args.workdir, "no-such-dir", "x.gguf"), "--type", "q8_0"],
         os.path.join(args.workdir, "no-such-dir", "x.gguf")),
        ([args.rlx, "generate", "-m", args.model, "--quant", "q9", "-p", "a", "-n", "1"], "q9"),
    ]
    for cmd, needle in checks:
        p = run(cmd)
        if p.returncode == 0 or needle not in p.stderr:
            failures.append(f"{' '.join(cmd[1:3])}: expected a failure naming '{needle}', got {p.returncode}: "
                            f"{p.stderr.strip()}")
    if os.path.exists(os.path.join(args.workdir, "no-such-dir")):
        failures.append("a partial output was left behind")
    # a full disk, as a file size limit (SIGXFSZ ignored, so writes fail with EFBIG)
    full = os.path.join(args.workdir, "full.gguf")

    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (500000, 500000))

    p = subprocess.run([args.rlx, "quantize", args.model, full, "--type", "q8_0", "-q"], capture_output=True,
                       text=True, preexec_fn=limit)
    if p.returncode == 0 or full + ".tmp" not in p.stderr or "File too large" not in p.stderr:
        failures.append(f"a write failure: exit {p.returncode}, {p.stderr.strip()}")
    if os.path.exists(full) or os.path.exists(full + ".tmp"):
        failures.append("a failed write left a file behind")
    print(f"write failure: {p.stderr.strip()}")
    return verdict(failures)


if __name__ == "__main__":
    sys.exit(main())
