#!/usr/bin/python3
"""The end of the context through the CLI, on the shipped Brown target (1024 positions).

generate: `-n -1` and an -n beyond the room stop at the context's end with exit status 0, one
notice line on stderr and ctx - prompt tokens, the same tokens as an unbounded run; a prompt
longer than the context fails with one line naming --ctx and --truncate, unless --truncate
keeps its last tokens (ctx - min(n, ctx/2) of them); speculative decoding and a 2-stage
pipeline stop at the same token. chat through a pipe with a small context: no reply is reserved
(the first turn of -n 512 in 128 positions is answered), a reply stops at the context's end, a
message that does not fit drops the oldest turns but keeps the system prompt, and one that does
not fit even alone is refused while the conversation goes on.

  check_context.py --rlx BIN --family share/models/brown
"""
import argparse
import os
import re
import subprocess
import sys

TIMEOUT = 600  # a loaded machine and a sanitizer build
PROMPT = "In the morning, the people of the city"
SYSTEM = "You are a helpful assistant who knows the Brown corpus."
FULL = re.compile(r"^rlx: context full \((\d+) positions; --ctx raises it up to 1024\): stopped after (\d+) tokens$")
STATS = re.compile(r"^rlx chat: (\d+) prompt tokens reused from the cache, (\d+) run at .*; (\d+) generated at")
REPLY_FULL = re.compile(r"^rlx chat: context full \((\d+) positions; --ctx raises it up to 1024\): the reply "
                        r"stopped after (\d+) tokens?$")
DROPPED = re.compile(r"^rlx chat: dropped the oldest (turn|\d+ turns) to fit the context of (\d+) positions$")

failures = []


def check(cond, what, detail):
    """Records what as passed or failed; detail (what was seen) is printed on failure only."""
    if cond:
        print(f"ok: {what}")
    else:
        failures.append(what)
        print(f"FAIL: {what}: {detail}")
    return cond


def run(rlx, args, stdin=None):
    p = subprocess.run([rlx, *args], input=stdin, capture_output=True, text=True, timeout=TIMEOUT)
    return p.returncode, p.stdout.strip(), [line for line in p.stderr.split("\n") if line]


def ids_of(rlx, text):
    rc, out, err = run(rlx, ["tokenize", "--text", text])
    if rc != 0:
        raise RuntimeError(f"rlx tokenize failed: {err}")
    return out.split()


def generate(rlx, ids, *extra):
    """(status, generated ids, stderr lines) of greedy `rlx generate --tokens ids`."""
    rc, out, err = run(rlx, ["generate", "--tokens", ",".join(ids), "--greedy", *extra])
    return rc, out.split(), err


def check_generate(rlx, draft):
    ids = ids_of(rlx, PROMPT)
    n = len(ids)
    ctx = n + 23
    rc, unbounded, err = generate(rlx, ids, "-n", str(ctx - n))
    if not check(rc == 0 and len(unbounded) == ctx - n, f"plain generation of {ctx - n} tokens", err):
        return

    def stops_at_end(name, *extra):
        rc, got, err = generate(rlx, ids, "--ctx", str(ctx), *extra)
        m = FULL.match(err[0]) if len(err) == 1 else None
        check(rc == 0 and m and m.groups() == (str(ctx), str(ctx - n)),
              f"{name}: exit 0 and one line 'context full ({ctx} positions; ...): stopped after {ctx - n} tokens'",
              f"status {rc}, stderr {err}")
        check(got == unbounded, f"{name}: the {ctx - n} tokens of an unbounded run", f"{got} vs {unbounded}")

    stops_at_end("-n -1", "-n", "-1")
    stops_at_end("-n beyond the room", "-n", "100")
    # the speculators verify up to k + 1 positions a round: the last ones must not overrun
    for k in ("1", "4"):
        stops_at_end(f"--spec draft k={k}", "-n", "-1", "--spec", "draft", "--draft-model", draft, "--draft-tokens", k)
        stops_at_end(f"--spec mtp k={k}", "-n", "-1", "--spec", "mtp", "--draft-tokens", k)
    stops_at_end("2 stages", "-n", "-1", "--stages", "2")

    rc, got, err = generate(rlx, ids, "--ctx", str(ctx), "-n", str(ctx - n))
    check(rc == 0 and got == unbounded and err == [], "an -n that exactly fills the context: no notice", err)
    rc, out, err = run(rlx, ["generate", "-p", PROMPT, "-n", "-1", "--ctx", str(ctx), "--greedy"])
    check(rc == 0 and out and len(err) == 1 and FULL.match(err[0]), "a text prompt with -n -1", err)

    # one token short of the model's 1024 positions: no notice suggests a larger --ctx
    long_ids = (ids * (1024 // n + 1))[:1023]
    rc, got, err = generate(rlx, long_ids, "-n", "-1")
    check(rc == 0 and len(got) == 1
          and err == ["rlx: context full (1024 positions, the model's maximum): stopped after 1 token"],
          "a full context at the model's maximum says so", err)
    rc, _, err = generate(rlx, long_ids + ids, "-n", "4")
    check(rc == 1 and len(err) == 1 and "--ctx" not in err[0] and "--truncate" in err[0],
          "a prompt beyond the model's maximum: the error names --truncate, not --ctx", err)

    # a prompt longer than the context
    rc, _, err = generate(rlx, ids, "-n", "8", "--ctx", "8")
    check(rc == 1 and len(err) == 1 and err[0].startswith("rlx: ") and "--ctx" in err[0] and "--truncate" in err[0],
          "a prompt beyond --ctx fails with one line naming --ctx and --truncate", err)
    # --truncate keeps ctx - min(8, 8/2) = 4 prompt tokens, which leaves 4 for the reply
    rc_tail, tail, _ = generate(rlx, ids[-4:], "-n", "4")
    rc, got, err = generate(rlx, ids, "-n", "8", "--ctx", "8", "--truncate")
    check(rc == 0 and rc_tail == 0 and got == tail and len(err) == 2
          and err[0] == f"rlx: prompt truncated to its last 4 of {n} tokens" and FULL.match(err[1]),
          "--truncate -n 8 --ctx 8: the last 4 prompt tokens, continued to the context's end",
          f"{got} vs {tail}; {err}")
    # a prompt that fits but leaves less than min(n, ctx/2) loses its start too
    rc_tail, tail, _ = generate(rlx, ids[-(n - 2):], "-n", "3")
    rc, got, err = generate(rlx, ids, "-n", "3", "--ctx", str(n + 1), "--truncate")
    check(rc == 0 and got == tail and err == [f"rlx: prompt truncated to its last {n - 2} of {n} tokens"],
          "--truncate makes room for -n, up to half the context", f"{got} vs {tail}; {err}")
    rc, _, err = generate(rlx, ids, "-n", "-2")
    check(rc == 1 and len(err) == 1 and "-n: '-2'" in err[0], "-n -2 is refused", err)


def chat(rlx, lines, *extra):
    """Status, stderr lines and per reply (reused, run, generated, the notices before its statistics)."""
    rc, _, err = run(rlx, ["chat", "--greedy", "--stats", *extra], stdin="".join(f"{s}\n" for s in lines))
    replies, notices = [], []
    for line in err:
        m = STATS.match(line)
        if m:
            replies.append((*map(int, m.groups()), notices))
            notices = []
        else:
            notices.append(line)
    return rc, err, replies


def check_chat(rlx):
    turns = ["Tell me about the city.", "What happened in the morning?", "And then?", "Who was there?",
             "What did they say?", "Where did they go?"]
    system_ids = len(ids_of(rlx, f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n"))

    rc, err, replies = chat(rlx, turns, "--ctx", "128", "-n", "40", "--system", SYSTEM)
    check(rc == 0 and len(replies) == len(turns), f"--ctx 128 -n 40: all {len(turns)} turns answered, exit 0",
          f"status {rc}; {err}")
    after_drop = [r for r in replies if any(DROPPED.match(line) for line in r[3])]
    check(after_drop != [], "--ctx 128 -n 40: the oldest turns are dropped, and a line says so", err)
    # a turn after a drop reuses the system prompt from the cache: it was kept
    check(after_drop and all(r[0] >= system_ids for r in after_drop),
          f"after a drop the system prompt ({system_ids} tokens) still opens the conversation", after_drop)
    check(all(r[0] + r[1] + r[2] <= 128 for r in replies), "no turn goes past 128 positions", replies)

    # nothing reserved: -n 512 in 128 positions answers, stops at the end, and the next turn drops
    rc, err, replies = chat(rlx, turns[:3], "--ctx", "128", "-n", "512")
    check(rc == 0 and len(replies) == 3, "-n 512 --ctx 128: three turns answered", err)
    cut = [(r, m) for r in replies for m in map(REPLY_FULL.match, r[3]) if m]
    check(cut != [], "-n 512 --ctx 128: a reply stops at the end of the context, and a line says so", err)
    check(all(r[0] + r[1] + r[2] == 128 and m.groups() == ("128", str(r[2])) for r, m in cut),
          "a reply cut by the context fills it exactly", replies)
    check(any(DROPPED.match(line) for line in err), "-n 512 --ctx 128: the next message drops a turn", err)

    # a message that does not fit even alone is refused; the conversation goes on
    long_message = " ".join(["What happened in the morning?"] * 12)
    rc, err, replies = chat(rlx, ["Tell me about the city.", long_message, "Who was there?"], "--ctx", "80", "-n", "8",
                            "--system", SYSTEM)
    refused = [line for line in err if line.startswith("rlx: chat: the system prompt and this message take")]
    check(rc == 0 and len(replies) == 2 and len(refused) == 1 and "--ctx raises it up to 1024" in refused[0]
          and replies[1][0] > system_ids, "a message too long for the context is refused, the conversation goes on",
          err)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rlx", required=True)
    ap.add_argument("--family", required=True, help="share/models/brown: target/ is the default model")
    args = ap.parse_args()
    check_generate(args.rlx, os.path.join(args.family, "draft"))
    check_chat(args.rlx)
    print(f"context: {len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
