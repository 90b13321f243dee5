#!/usr/bin/python3
"""rlx chat over a pipeline (--stages 2, the Brown model): the replies equal the single-process
ones, and when a stage dies mid-conversation the next message ends chat with exit status 1 and
one line naming the stage, instead of answering every later message with the same error and
exiting 0.

  check_chat_pipeline.py --rlx BIN
"""
import argparse
import os
import signal
import subprocess
import sys
import time

MESSAGES = ["Tell me about the city", "And then?"]


def start(rlx, *extra):
    return subprocess.Popen([rlx, "chat", "-n", "12", "--greedy", *extra], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def say(p, message):
    p.stdin.write(message + "\n")
    p.stdin.flush()
    return p.stdout.readline().rstrip("\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rlx", required=True)
    args = ap.parse_args()
    failures = []
    local = subprocess.run([args.rlx, "chat", "-n", "12", "--greedy"], input="\n".join(MESSAGES) + "\n",
                           capture_output=True, text=True, timeout=120).stdout.splitlines()
    p = start(args.rlx, "--stages", "2")
    try:
        piped = [say(p, m) for m in MESSAGES]
        if piped != local or len(local) != 2:
            failures.append(f"replies over 2 stages {piped!r} differ from one process's {local!r}")
        stages = open(f"/proc/{p.pid}/task/{p.pid}/children").read().split()
        if len(stages) != 2:
            failures.append(f"expected 2 launched stages, found {stages}")
        else:
            os.kill(int(stages[-1]), signal.SIGKILL)
            time.sleep(0.5)
            p.stdin.write("One more thing\nAnd another\n")
            p.stdin.flush()
            out, err = p.communicate(timeout=60)
            lines = err.splitlines()
            if p.returncode != 1 or len(lines) != 1 or not lines[0].startswith("rlx: chat: stage 1 ("):
                failures.append(f"after a stage died: exit {p.returncode}, stderr {err!r} (want exit 1 and one "
                                f"line naming stage 1)")
    except subprocess.TimeoutExpired:
        failures.append("chat hangs after a stage died")
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    for f in failures:
        print("FAIL:", f)
    print(f"chat over a pipeline: {'FAIL' if failures else 'PASS'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
