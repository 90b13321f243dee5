#!/usr/bin/python3
"""rlx chat on a terminal: a tmux pane (on a private tmux server) runs it on the shipped Brown
model. Keys typed while a reply streams are neither echoed into it nor read as the next message
(a note says they were discarded); Ctrl-C stops a reply and typing echoes again; Ctrl-D at the
prompt ends the program with status 0 and leaves the cursor on a new line; SIGTERM during a
reply leaves the terminal echoing. Messages reach the model whole, as the same messages through a
pipe do (--stats and the context's refusal give their token counts): a line of 10000 bytes (a
terminal's canonical mode cut it at 4095), a multi-line paste (bracketed, and as bare lines
arriving at once), a line continued with a trailing backslash. Without tmux: skipped (77), a failure
under CI=true (tests/ci_skip.py).

  check_chat_tty.py --rlx BIN --workdir DIR
"""
import argparse
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from ci_skip import missing_input  # noqa: E402

DEADLINE = 300  # seconds for any one thing to show: a sanitizer build on a loaded machine
KEYS = "QZXJVQ"  # typed during a reply; not something the Brown model writes
DISCARDED = "rlx chat: what you typed during the reply was discarded"
MESSAGE = "Tell me about the city."
ATTEMPTS = 3  # a reply that ends before the keys arrive proves nothing: ask again

failures = []


def check(cond, what, detail):
    if cond:
        print(f"ok: {what}")
    else:
        failures.append(what)
        print(f"FAIL: {what}\n--- pane ---\n{detail}\n------------")
    return cond


class Pane:
    def __init__(self, socket, name, command):
        self.tmux = ["tmux", "-S", socket]
        self.name = name
        subprocess.run(self.tmux + ["-f", "/dev/null", "new-session", "-d", "-s", name, "-x", "200", "-y", "50",
                                    command], check=True)

    def lines(self):
        """The whole pane and its history, wrapped lines joined, trailing blanks dropped."""
        out = subprocess.run(self.tmux + ["capture-pane", "-p", "-J", "-S", "-", "-t", self.name],
                             capture_output=True, text=True, check=True).stdout
        lines = [line.rstrip() for line in out.split("\n")]
        while lines and not lines[-1]:
            lines.pop()
        return lines

    def keys(self, *keys, literal=False):
        subprocess.run(self.tmux + ["send-keys", "-t", self.name, *(["-l"] if literal else []), *keys], check=True)

    def wait(self, what, cond):
        """Polls until cond(lines) is true; fails the test with what after DEADLINE."""
        end = time.monotonic() + DEADLINE
        while time.monotonic() < end:
            lines = self.lines()
            if cond(lines):
                return lines
            time.sleep(0.05)
        raise TimeoutError(f"{what} did not show in {DEADLINE} s:\n" + "\n".join(self.lines()))


def at_prompt(lines):
    """rlx chat waits for a line: its last line is the prompt, with whatever was typed."""
    return bool(lines) and (lines[-1] == ">" or lines[-1].startswith("> "))


def asked(lines):
    """The indices of the lines where MESSAGE was sent."""
    return [i for i, line in enumerate(lines) if line == f"> {MESSAGE}"]


def streaming(n):
    """The reply to the n-th MESSAGE has begun and not ended."""
    def cond(lines):
        a = asked(lines)
        return len(a) >= n and len(lines) > a[n - 1] + 1 and not at_prompt(lines[a[n - 1] + 1:])
    return cond


def replied(n):
    """The reply to the n-th MESSAGE has ended: the prompt is back after it."""
    def cond(lines):
        a = asked(lines)
        return len(a) >= n and len(lines) > a[n - 1] + 1 and at_prompt(lines[a[n - 1] + 1:])
    return cond


def send(pane):
    """Sends MESSAGE and waits until its reply streams; returns how many were sent so far."""
    n = len(asked(pane.lines())) + 1
    pane.keys(MESSAGE, literal=True)
    pane.keys("Enter")
    pane.wait("the reply", streaming(n))
    return n


def reply_with_keys(pane):
    """Types KEYS while a reply streams; the pane once the prompt is back, or None when the reply
    ended before the keys arrived (they then sit at the prompt, echoed, and are cleared)."""
    n = send(pane)
    pane.keys(KEYS, literal=True)
    lines = pane.wait("the prompt after the reply", replied(n))
    if lines[-1] == f"> {KEYS}" and DISCARDED not in lines[asked(lines)[n - 1]:]:
        pane.keys("C-u")
        pane.wait("the cleared prompt", lambda lines: lines[-1] == ">")
        return None
    return lines[asked(lines)[n - 1]:]


def check_typing_and_eof(rlx, socket, log):
    pane = Pane(socket, "keys", f"{shlex.quote(rlx)} chat --greedy -n 300; printf 'exit=%d\\n' $?; "
                                f"exec sleep {DEADLINE * 4}")
    pane.wait("rlx chat's prompt", at_prompt)
    turn = None
    for _ in range(ATTEMPTS):
        turn = reply_with_keys(pane)
        if turn:
            break
    if not check(turn is not None, "keys typed while a reply streams (a reply outlasted the typing)",
                 "\n".join(pane.lines())):
        return
    check(not any(KEYS in line for line in turn), "keys typed during the reply are not echoed into it",
          "\n".join(turn))
    check(DISCARDED in turn and turn[-1] == ">", "nor read as the next message; a note says they were discarded",
          "\n".join(turn))

    # Ctrl-C stops the next reply, and what is typed at the prompt echoes again
    n = send(pane)
    pane.keys("C-c")
    pane.wait("the prompt after Ctrl-C", replied(n))
    pane.keys("abc", literal=True)
    pane.wait("typing at the prompt", lambda lines: lines[-1] == "> abc")
    print("ok: after Ctrl-C stops a reply, typing echoes again")
    pane.keys("C-u")
    pane.wait("the cleared prompt", lambda lines: lines[-1] == ">")

    pane.keys("C-d")
    lines = pane.wait("the exit status", lambda lines: any("exit=" in line for line in lines))
    log.write("\n".join(lines) + "\n")
    check(lines[-2:] == [">", "exit=0"], "Ctrl-D at the prompt: exit status 0, and what follows starts a new line",
          "\n".join(lines))


# a message longer than the Brown model's context (1024 positions), so the chat refuses it and
# says how many tokens it takes (its tokenization stops past the context: "more than 1023"), and a
# message cut short of the context anywhere takes fewer
LONG = ("The jury said it did not find any evidence that the election was conducted badly. " * 130)[:10000]
PASTED = ["a pasted message", "of three lines", "sent as one"]
CONTINUED = ["a message typed on two lines", "thanks to a backslash"]
# "rlx: chat: this message takes [more than] N tokens, ..." or "rlx chat: 0 prompt tokens reused ..., N run ..."
COUNT = re.compile(r"^rlx:? chat: (?:this message takes (?:more than )?(\d+) tokens|\d+ prompt tokens reused from the cache, (\d+) run)")


def counts(lines):
    return [int(m.group(1) or m.group(2)) for m in map(COUNT.match, lines) if m]


def check_whole_messages(rlx, socket, workdir, log):
    """Each message (after /reset, so each is counted alone) takes as many tokens typed or pasted on a
    terminal as it does through a pipe, where the same text comes as lines."""
    argv = [rlx, "chat", "--greedy", "-n", "1", "--stats"]
    piped = "\n".join([LONG, "/reset", '"""', *PASTED, '"""', "/reset", '"""', *PASTED, '"""', "/reset",
                       CONTINUED[0] + "\\", CONTINUED[1]]) + "\n"
    p = subprocess.run(argv, input=piped, capture_output=True, text=True, timeout=DEADLINE)
    want = counts(p.stderr.splitlines())
    if not check(p.returncode == 0 and len(want) == 4 and len(set(want[1:3])) == 1,
                 "the messages through a pipe (a long line, a \"\"\" block, a backslash continuation)",
                 f"exit {p.returncode}, counts {want}, stderr:\n{p.stderr}"):
        return
    pane = Pane(socket, "whole", " ".join(map(shlex.quote, argv)) + f"; exec sleep {DEADLINE * 4}")
    pane.wait("rlx chat's prompt", at_prompt)

    def sent(n, what):
        lines = pane.wait(what, lambda lines: len(counts(lines)) >= n and at_prompt(lines))
        return counts(lines)[n - 1], lines

    def reset():
        done = sum(line == "rlx chat: conversation cleared" for line in pane.lines())
        pane.keys("/reset", literal=True)
        pane.keys("Enter")
        pane.wait("/reset", lambda lines: sum(line == "rlx chat: conversation cleared" for line in lines) > done
                  and at_prompt(lines))

    pane.keys(LONG, literal=True)
    pane.keys("Enter")
    got, lines = sent(1, "the answer to the long line")
    check(got == want[0] and f"> {LONG}" in lines, f"a line of {len(LONG)} bytes on a terminal reaches the model "
          f"whole: {got} tokens (through a pipe {want[0]}) and echoed whole", "\n".join(lines[-8:]))
    buffer = os.path.join(workdir, "paste.txt")
    with open(buffer, "w") as f:
        f.write("\n".join(PASTED))
    for n, bracketed in ((2, True), (3, False)):
        reset()
        subprocess.run(pane.tmux + ["load-buffer", buffer], check=True)
        # -p: the paste is marked, as a terminal marks it for a program that asks (bracketed paste);
        # without it the lines arrive bare, at once, with carriage returns as typed Enter keys would
        subprocess.run(pane.tmux + ["paste-buffer", "-t", pane.name] + (["-p"] if bracketed else []), check=True)
        pane.wait("the pasted lines", lambda lines: lines[-1] == f"... {PASTED[-1]}")
        pane.keys("Enter")
        got, lines = sent(n, "the answer to the paste")
        shown = [f"> {PASTED[0]}"] + [f"... {line}" for line in PASTED[1:]]
        check(got == want[n - 1] and "\n".join(shown) in "\n".join(lines),
              f"a {'bracketed' if bracketed else 'bare'} paste of {len(PASTED)} lines is one message: {got} tokens "
              f"(a \"\"\" block through a pipe {want[n - 1]})", "\n".join(lines[-12:]))
    reset()
    pane.keys(CONTINUED[0] + "\\", literal=True)
    pane.keys("Enter")
    pane.wait("the continuation prompt", lambda lines: lines[-1] == "...")
    pane.keys(CONTINUED[1], literal=True)
    pane.keys("Enter")
    got, lines = sent(4, "the answer to the continued line")
    check(got == want[3], f"a line ending in a backslash goes on on the next: {got} tokens (through a pipe {want[3]})",
          "\n".join(lines[-8:]))
    log.write("\n".join(pane.lines()) + "\n")


def check_sigterm(rlx, socket, workdir, log):
    """SIGTERM while a reply streams: the program dies of it, and the terminal echoes again."""
    pid_file = os.path.join(workdir, "chat.pid")
    for attempt in range(ATTEMPTS):
        if os.path.exists(pid_file):
            os.unlink(pid_file)
        # the inner shell writes its pid and becomes rlx; the outer one reports what rlx left
        inner = f"echo $$ > {shlex.quote(pid_file)}; exec {shlex.quote(rlx)} chat --greedy -n 300"
        command = (f"sh -c {shlex.quote(inner)}; printf '\\nexit=%d\\n' $?; "
                   "if stty -a | tr ' ;' '\\n\\n' | grep -qx -- -echo; then echo echo=off; else echo echo=on; fi; "
                   f"exec sleep {DEADLINE * 4}")
        pane = Pane(socket, f"term{attempt}", command)
        pane.wait("rlx chat's prompt", at_prompt)
        send(pane)
        with open(pid_file) as f:
            os.kill(int(f.read()), signal.SIGTERM)
        lines = pane.wait("the terminal's state", lambda lines: lines[-1].startswith("echo="))
        log.write("\n".join(lines) + "\n")
        after = lines[asked(lines)[0] + 1:]
        if any(line == ">" or line.startswith("> ") for line in after):
            continue  # the reply ended before the signal came, at the prompt: try again
        check("exit=143" in after and after[-1] == "echo=on", "SIGTERM during a reply ends rlx and leaves the "
              "terminal echoing", "\n".join(lines))
        return
    check(False, "SIGTERM during a reply (the reply outlasted the signal)", "every reply ended first")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rlx", required=True)
    ap.add_argument("--workdir", required=True)
    args = ap.parse_args()
    if not shutil.which("tmux"):
        return missing_input("tmux is not installed")
    os.makedirs(args.workdir, exist_ok=True)
    socket = os.path.join(args.workdir, "tmux.socket")
    try:
        with open(os.path.join(args.workdir, "panes.log"), "w") as log:
            check_typing_and_eof(os.path.abspath(args.rlx), socket, log)
            check_whole_messages(os.path.abspath(args.rlx), socket, args.workdir, log)
            check_sigterm(os.path.abspath(args.rlx), socket, args.workdir, log)
    except TimeoutError as e:
        failures.append(str(e))
        print(f"FAIL: {e}")
    finally:
        subprocess.run(["tmux", "-S", socket, "kill-server"], capture_output=True)
    print(f"chat on a terminal: {len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
