#!/usr/bin/python3
"""Broken GGUF files end rlx quickly with one clear error line, not a crash, a hang or output.

  test_gguf_bad_files.py --rlx BIN --workdir DIR

make_bad_gguf.py writes a tiny valid qwen3 GGUF model and copies of it with one defect each
(bad magic, unsupported versions, truncations, unknown types, absurd lengths, duplicates,
misaligned or out-of-file offsets, bad dimensions, a tensor whose shape contradicts the
metadata, ...) and bad_gguf_cases.json with the words each error message must contain: the key
or tensor at fault and a word for the kind of fault. For every case,
  rlx generate -m FILE -p hi -n 1
must exit with status 1 (not 0, not a signal: a crash or sanitizer abort is a failure too),
print exactly one non-empty line on stderr that names the file and holds every word
(case-insensitive), nothing on stdout, and finish within 5 s (a reader that trusts a 2^40 length
would allocate or loop for much longer). For the "read" cases, broken at the GGUF level, the
same holds for `rlx tokenize -m FILE -p hi`, because the tokenizer parses the file itself
before any model is built, and for a file that is not GGUF at all. The valid file must run:
`rlx generate -m valid_tiny.gguf -p hi -n 4 --temp 0` exits 0, so the cases fail for their
defect and not for something all of them share.
"""
import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import gguf_common as C  # noqa: E402
import make_bad_gguf  # noqa: E402

TIME_LIMIT = 5.0


def check(rlx, argv, path, words):
    """The failures of one run that must be refused."""
    start = time.time()
    p = C.run([rlx, *argv], timeout=30)
    took = time.time() - start
    what = "rlx %s" % " ".join(argv)
    if p.returncode is None:
        return ["%s: still running after 30 s" % what]
    out, err = p.stdout.decode(errors="replace"), p.stderr.decode(errors="replace")
    lines = [line for line in err.splitlines() if line.strip()]
    problems = []
    if p.returncode != 1:
        problems.append("exit status %s (%s), not 1" % (
            p.returncode, "killed by signal %d" % -p.returncode if p.returncode < 0 else "expected 1"))
    if took > TIME_LIMIT:
        problems.append("took %.1f s (limit %g s)" % (took, TIME_LIMIT))
    if len(lines) != 1:
        problems.append("%d lines on stderr, not 1" % len(lines))
    if out.strip():
        problems.append("printed %r on stdout" % out[:100])
    msg = " ".join(lines)
    if path not in msg:
        problems.append("the message does not name the file %s" % path)
    missing = [w for w in words if w.lower() not in msg.lower()]
    if missing:
        problems.append("the message lacks %s" % missing)
    return ["%s: %s; stderr: %r" % (what, "; ".join(problems), err[-400:])] if problems else []


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rlx", required=True)
    ap.add_argument("--workdir", required=True)
    args = ap.parse_args()
    cases = make_bad_gguf.make_all(args.workdir)
    failures = []
    for name, case in sorted(cases.items()):
        path = os.path.join(args.workdir, name)
        got = check(args.rlx, ["generate", "-m", path, "-p", "hi", "-n", "1"], path, case["words"])
        if case["stage"] == "read":
            got += check(args.rlx, ["tokenize", "-m", path, "-p", "hi"], path, case["words"])
        print("%s %-28s %s" % ("FAIL" if got else "PASS", name, case["defect"]))
        failures += got
    # a file that is not GGUF at all, under a .gguf name: the model and the tokenizer say so
    text = os.path.join(args.workdir, "not_gguf.gguf")
    with open(text, "w") as f:
        f.write("{\"model\": \"this is JSON\"}\n")
    for verb in (["generate", "-m", text, "-p", "hi", "-n", "1"], ["tokenize", "-m", text, "-p", "hi"]):
        failures += check(args.rlx, verb, text, ["magic", "GGUF"])
    valid = os.path.join(args.workdir, "valid_tiny.gguf")
    p = C.run([args.rlx, "generate", "-m", valid, "-p", "hi", "-n", "4", "--temp", "0"], timeout=60)
    if p.returncode != 0:
        failures.append("valid_tiny.gguf: rlx generate exited %s: %s" % (
            p.returncode, p.stderr.decode(errors="replace")[-400:]))
    return C.finish("gguf_bad_files", failures, "%d cases" % len(cases))


if __name__ == "__main__":
    sys.exit(main())
