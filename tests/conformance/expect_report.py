#!/usr/bin/python3
"""Runs a command and checks its exit status and output (stdout and stderr together).

  expect_report.py --exit N [--expect REGEX]... [--absent REGEX]... -- COMMAND...

Fails when the command died from a signal, exited otherwise than N, printed no match for an
--expect pattern (multi-line mode) or a match for an --absent one. Prints the output on failure.
"""
import argparse
import re
import subprocess
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--exit", type=int, required=True)
    ap.add_argument("--expect", action="append", default=[])
    ap.add_argument("--absent", action="append", default=[])
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("command", nargs="+")
    args = ap.parse_args()
    done = subprocess.run(args.command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          errors="replace", timeout=args.timeout)
    out = done.stdout
    problems = []
    if done.returncode < 0:
        problems.append(f"the command died from signal {-done.returncode}")
    elif done.returncode != args.exit:
        problems.append(f"exit status {done.returncode}, expected {args.exit}")
    problems += [f"no line matches {p!r}" for p in args.expect if not re.search(p, out, re.M)]
    problems += [f"a line matches {p!r}" for p in args.absent if re.search(p, out, re.M)]
    if problems:
        print(out[-20000:])
        print("expect_report: " + "; ".join(problems))
        return 1
    print(out[-4000:])
    print(f"expect_report: ok ({' '.join(args.command[:3])} ...)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
