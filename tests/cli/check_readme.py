#!/usr/bin/python3
"""Every README example runs as written on the default model: the `rlx ...` examples of the
commands table and the shell blocks, from the source tree, with the build's rlx. Skipped: the
blocks about a checkpoint the reader downloads (~/models) and the first commands (demo.sh and
run-tests.sh, which install packages and run this suite). Each must exit 0.

  check_readme.py --rlx BIN
"""
import argparse
import os
import re
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def examples(readme):
    """(what, shell text) for the table's examples and the sh blocks."""
    out = []
    for line in readme.splitlines():
        if line.startswith("| `") and line.count("|") >= 4:
            cell = line.split("|")[2]
            out += [(f"table: {c}", c) for c in re.findall(r"`(rlx [^`]*)`", cell)]
    for block in re.findall(r"^```sh\n(.*?)^```", readme, re.S | re.M):
        if "~/models" in block or "share/scripts/" in block:
            continue
        out.append((f"block: {block.splitlines()[0]} ...", block))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rlx", required=True)
    args = ap.parse_args()
    with open(os.path.join(REPO, "README.md")) as f:
        found = examples(f.read())
    failures = []
    if len(found) < 10:
        failures.append(f"only {len(found)} examples found: the README's layout changed under this test")
    for what, text in found:
        script = re.sub(r"(^|\$\(|\s)(?:build/bin/)?rlx ", lambda m: f"{m.group(1)}{args.rlx} ", text, flags=re.M)
        p = subprocess.run(["bash", "-c", script], cwd=REPO, input="", capture_output=True, text=True, timeout=900)
        if p.returncode != 0:
            failures.append(f"{what}: exit {p.returncode}: {p.stderr.strip()[-400:]}")
    for f in failures:
        print("FAIL:", f)
    print(f"README examples: {len(found)} run, {'FAIL' if failures else 'PASS'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
