#!/usr/bin/python3
"""rlx chat over a pipeline (--stages 2, the Brown model): the replies equal the single-process
ones; when a stage dies mid-conversation the driver restarts it, replays the conversation into it
and the later replies are still the single-process ones; with --no-recovery the next message
instead ends chat with exit status 1 and one line naming the stage (not an error for every later
message and exit 0).

  check_chat_pipeline.py --rlx BIN
"""
import argparse
import os
import signal
import subprocess
import sys
import time

MESSAGES = ["Tell me about the city", "And then?"]
LATER = ["One more thing", "And another"]
# the replay recomputes the conversation in one pass: the same bits only in the invariant mode
COMMON = ["-n", "12", "--greedy", "--backend-opts", "batch_invariant=1"]


def start(rlx, *extra):
    return subprocess.Popen([rlx, "chat", *COMMON, *extra], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def kill_stage_1(p, failures):
    """SIGKILLs the second of p's two launched stages; False when they are not there."""
    stages = open(f"/proc/{p.pid}/task/{p.pid}/children").read().split()
    if len(stages) != 2:
        failures.append(f"expected 2 launched stages, found {stages}")
        return False
    os.kill(int(stages[-1]), signal.SIGKILL)
    time.sleep(0.5)
    return True


def say(p, message):
    p.stdin.write(message + "\n")
    p.stdin.flush()
    return p.stdout.readline().rstrip("\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rlx", required=True)
    args = ap.parse_args()
    failures = []
    local = subprocess.run([args.rlx, "chat", *COMMON], input="\n".join(MESSAGES + LATER) + "\n",
                           capture_output=True, text=True, timeout=120).stdout.splitlines()
    if len(local) != 4:
        failures.append(f"the single process gave {len(local)} replies to 4 messages: {local!r}")
    for recovery in (True, False):
        p = start(args.rlx, "--stages", "2", *([] if recovery else ["--no-recovery"]))
        try:
            piped = [say(p, m) for m in MESSAGES]
            if piped != local[:2]:
                failures.append(f"replies over 2 stages {piped!r} differ from one process's {local[:2]!r}")
            if not kill_stage_1(p, failures):
                continue
            p.stdin.write("\n".join(LATER) + "\n")
            p.stdin.flush()
            out, err = p.communicate(timeout=60)
            lines = err.splitlines()
            if recovery and (p.returncode != 0 or out.splitlines() != local[2:] or
                             not any("restarted stage 1" in line for line in lines) or
                             not any("stage 1 (" in line and "replayed in" in line for line in lines)):
                failures.append(f"after a stage died: exit {p.returncode}, replies {out.splitlines()!r} (want "
                                f"{local[2:]!r}), stderr {err!r} (want the restart and the replay)")
            if not recovery and (p.returncode != 1 or len(lines) != 1 or
                                 not lines[0].startswith("rlx: chat: stage 1 (")):
                failures.append(f"after a stage died (--no-recovery): exit {p.returncode}, stderr {err!r} (want "
                                f"exit 1 and one line naming stage 1)")
        except subprocess.TimeoutExpired:
            failures.append(f"chat hangs after a stage died ({'recovery' if recovery else '--no-recovery'})")
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
