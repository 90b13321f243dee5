#!/usr/bin/python3
"""librlx's ABI against the committed baseline tests/abi/librlx.abi.

  abi.py --lib build/core/librlx.so --headers core/include/rlx --baseline tests/abi/librlx.abi
  abi.py ... --write    (re)writes the baseline from the library

The baseline is what `abidw` (Debian's abigail-tools) reads from the library's DWARF, limited to
the types its public headers declare (--headers-dir, --drop-private-types), without paths,
source locations or DT_NEEDED, with type ids hashed from the types (--type-id-style hash), so
an ASan and a plain RelWithDebInfo build write the same file: the sanitizers add no public type
and no rlx_ symbol. A build without debug info has no types to compare and is refused.

The check fails when
  - the library's soname differs from the baseline's (an incompatible change moves the soname
    and the baseline together: rewrite the baseline with --write in the same commit), or
  - abidiff finds anything but added functions and variables: a removed symbol, a changed
    function or a changed public type (a struct's layout, an enum's values ...). A change that
    is compatible by the API's rules (a member appended to a struct that starts with its size
    and is passed by pointer) is reviewed and taken by rewriting the baseline.
Additions pass; the baseline then lacks them, so the check says to rewrite it.
The RLX_PRIVATE symbols (rlx/private.h) are the tree's own and are not compared.
Exit status: 0 pass, 1 fail, 77 skipped (abigail-tools missing, outside CI only).
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SUPPRESSIONS = os.path.join(HERE, "private.suppr")
ABIDW_FLAGS = ["--drop-private-types", "--no-corpus-path", "--no-comp-dir-path", "--no-show-locs",
               "--no-elf-needed", "--type-id-style", "hash"]
# abidiff's exit status is a bit field (abidiff(1)): 1 error, 2 usage error, 4 ABI change,
# 8 incompatible ABI change
ABIDIFF_ERROR, ABIDIFF_USAGE, ABIDIFF_CHANGE, ABIDIFF_INCOMPATIBLE = 1, 2, 4, 8


def skip_or_fail(message):
    if os.environ.get("CI") == "true":
        print(f"FAIL: {message} (CI=true: the ABI check must run)")
        return 1
    print(f"SKIPPED: missing input: {message}")
    return 77


def soname(abi_text):
    m = re.search(r"<abi-corpus [^>]*soname='([^']*)'", abi_text)
    return m.group(1) if m else None


def has_debug_info(lib):
    out = subprocess.run(["readelf", "-S", "-W", lib], capture_output=True, text=True, check=True).stdout
    return ".debug_info" in out


def abidw(lib, headers, out):
    subprocess.run(["abidw", "--headers-dir", headers, *ABIDW_FLAGS, "--out-file", out, lib], check=True)


def abidiff(baseline, current, *extra):
    return subprocess.run(["abidiff", "--suppressions", SUPPRESSIONS, *extra, baseline, current],
                          capture_output=True, text=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True, help="the built librlx.so")
    ap.add_argument("--headers", required=True, help="the public headers (core/include/rlx)")
    ap.add_argument("--baseline", required=True)
    ap.add_argument("--write", action="store_true", help="rewrite the baseline from --lib")
    args = ap.parse_args()
    for tool in ("abidw", "abidiff", "readelf"):
        if not shutil.which(tool):
            return skip_or_fail(f"{tool} is not installed (Debian: abigail-tools, binutils)")
    if not has_debug_info(args.lib):
        return skip_or_fail(f"{args.lib} has no debug info (build with -g: RelWithDebInfo or Debug)")
    if args.write:
        abidw(args.lib, args.headers, args.baseline)
        print(f"wrote {args.baseline}")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        current = os.path.join(tmp, "librlx.abi")
        abidw(args.lib, args.headers, current)
        with open(args.baseline) as f:
            want = soname(f.read())
        with open(current) as f:
            got = soname(f.read())
        if want != got:
            print(f"FAIL: the library's soname is {got}, the baseline's {want}: an incompatible change moves "
                  f"both; rewrite the baseline with {sys.argv[0]} --write")
            return 1
        # without the added symbols: anything left is a removal or a change
        r = abidiff(args.baseline, current, "--no-added-syms")
        if r.returncode & (ABIDIFF_ERROR | ABIDIFF_USAGE):
            print(f"FAIL: abidiff failed (status {r.returncode}):\n{r.stdout}{r.stderr}")
            return 1
        if r.returncode:
            kind = "an incompatible" if r.returncode & ABIDIFF_INCOMPATIBLE else "a"
            print(f"FAIL: {kind} change of librlx's ABI against {args.baseline} (abidiff status {r.returncode}):\n"
                  f"{r.stdout}\nAn incompatible change moves the soname (SOVERSION) and the baseline together; "
                  f"a compatible one by the API's rules is taken by rewriting the baseline: {sys.argv[0]} --write")
            return 1
        added = abidiff(args.baseline, current)
        if added.returncode:
            print(f"note: symbols added since the baseline; rewrite it to hold them ({sys.argv[0]} --write):\n"
                  f"{added.stdout}")
    print(f"librlx ABI ({got}) matches {os.path.basename(args.baseline)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
