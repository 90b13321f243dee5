#!/usr/bin/python3
"""Speculative decoding through the real CLI: `rlx generate --spec draft` and `--spec mtp` print
exactly the tokens of plain greedy decoding, in one process and over a 2-stage pipeline
(--stages, and deployment files whose speculator section names the draft by a relative path or
says plugin: mtp, with --launch); the MTP speculator over a pipeline makes the driver ask the
last stage for the hidden states from the start. Bad speculator arguments make `rlx` exit with
status 1 and one clear line on stderr.

  test_spec_cli.py --rlx BIN --data TESTDATA --workdir DIR
"""
import argparse
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pipeline"))
from ports import free_ports  # noqa: E402

TIMEOUT = 120
TOKENS = "17,3,250,99,4,301,77,12"
N_NEW = "32"


def run(rlx, args):
    p = subprocess.run([rlx, *args], capture_output=True, text=True, timeout=TIMEOUT)
    return p.returncode, p.stdout.strip(), p.stderr.strip()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rlx", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--workdir", required=True)
    args = ap.parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    target, draft = os.path.join(args.data, "spec-target"), os.path.join(args.data, "spec-draft")
    base = ["generate", "--model", target, "--tokens", TOKENS, "-n", N_NEW, "--greedy", "--threads", "1"]
    failures = []

    rc, plain, err = run(args.rlx, base)
    if rc != 0:
        print(f"plain greedy failed: {err}")
        return 1

    def same(name, extra):
        rc, out, err = run(args.rlx, base + extra)
        if rc != 0 or out != plain:
            failures.append(f"{name}: status {rc}, output {out!r} instead of {plain!r}; stderr: {err}")
        else:
            print(f"ok: {name}")

    for k in ("1", "4", "6"):
        same(f"single process, k={k}", ["--spec", "draft", "--draft-model", draft, "--draft-tokens", k])
    same("--spec-opts model=", ["--spec", "draft", "--spec-opts", f"model={target}"])
    same("2 stages, k=3", ["--stages", "2", "--spec", "draft", "--draft-model", draft, "--draft-tokens", "3"])
    same("2 stages, the target as draft", ["--stages", "2", "--spec", "draft", "--draft-model", target])
    same("mtp, single process", ["--spec", "mtp", "--draft-tokens", "3"])
    same("mtp, 2 stages", ["--stages", "2", "--spec", "mtp", "--draft-tokens", "3"])

    # deployment files (the draft named relative to the file) whose stages the driver launches
    for name, speculator, stats in (
            ("draft", f"{{plugin: draft, draft_tokens: 2, draft_model: {os.path.relpath(draft, args.workdir)}}}",
             "speculator draft, 2 draft tokens"),
            ("mtp", "{plugin: mtp, draft_tokens: 3}", "speculator mtp, 3 draft tokens")):
        ports = free_ports(2)
        cfg = os.path.join(args.workdir, f"spec-{name}.yaml")
        with open(cfg, "w") as f:
            f.write(f"model: {os.path.relpath(target, args.workdir)}\n"
                    "stages:\n"
                    f"  - address: 127.0.0.1:{ports[0]}\n"
                    f"  - address: 127.0.0.1:{ports[1]}\n"
                    f"speculator: {speculator}\n")
        rc, out, err = run(args.rlx, ["generate", "--config", cfg, "--launch", "--tokens", TOKENS, "-n", N_NEW,
                                      "--greedy", "--threads", "1", "--stats"])
        if rc != 0 or out != plain or stats not in err:
            failures.append(f"deployment file speculator {name}: status {rc}, output {out!r}; stderr: {err}")
        else:
            print(f"ok: deployment file speculator {name} over 2 launched stages")

    bad_yaml = os.path.join(args.workdir, "bad.yaml")
    with open(bad_yaml, "w") as f:
        f.write("stages:\n  - address: 127.0.0.1:9\nspeculator:\n  plugin: draft\n  draft_depth: 3\n")
    tok = ["generate", "--model", target, "--tokens", "1,2", "-n", "4"]
    cases = [
        # (name, argv, words the one error line must contain)
        ("unknown speculator", tok + ["--spec", "no-such-spec"], ["no-such-spec", "available: draft"]),
        ("draft with another vocabulary", tok + ["--spec", "draft", "--draft-model",
                                                 os.path.join(args.data, "spec-vocab256")],
         ["speculator 'draft'", "vocabulary of 256"]),
        ("no draft model", tok + ["--spec", "draft"], ["speculator 'draft'", "model=DIR"]),
        ("missing draft model", tok + ["--spec", "draft", "--draft-model", "/nonexistent/draft"],
         ["/nonexistent/draft"]),
        ("unknown speculator option", tok + ["--spec", "draft", "--draft-model", draft, "--spec-opts", "depth=2"],
         ["unknown option 'depth'"]),
        ("zero draft tokens", tok + ["--spec", "draft", "--draft-model", draft, "--draft-tokens", "0"],
         ["--draft-tokens", "from 1 to 64"]),
        ("huge draft tokens", tok + ["--spec", "draft", "--draft-model", draft, "--draft-tokens", "100000"],
         ["--draft-tokens", "from 1 to 64"]),
        ("draft options without --spec", tok + ["--draft-model", draft], ["need --spec"]),
        ("unknown key in the file's speculator", ["generate", "--config", bad_yaml, "--tokens", "1", "-n", "2"],
         [f"{bad_yaml}:5", "draft_depth", "draft_model"]),
    ]
    for name, argv, words in cases:
        rc, out, err = run(args.rlx, argv)
        lines = err.splitlines()
        if rc != 1 or len(lines) != 1 or not lines[0].startswith("rlx: ") or any(w not in err for w in words):
            failures.append(f"{name}: status {rc}, stderr {err!r}, expected one line with {words}")
        else:
            print(f"ok: {name}: {err}")

    for f in failures:
        print(f"FAIL: {f}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
