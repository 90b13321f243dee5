#!/usr/bin/python3
"""rlx chat through a pipe on a random-weight Qwen3 model with the real tokenizer: each reply
arrives, the second turn reuses the KV cache of the first (only the new tokens run), /reset
forgets it, and a closed stdin ends the program cleanly. --chat-template-file renders with the
given template instead of the model's (chat and generate --chat), and its errors name the line.

  check_chat.py --rlx BIN --tokenizer DIR --workdir DIR
"""
import argparse
import os
import re
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "model"))
import make_model  # noqa: E402

STATS = re.compile(r"rlx chat: (\d+) prompt tokens reused from the cache, (\d+) run at .*; (\d+) generated")


def check_template_file(args, model, default_run):
    """A template that adds a system turn makes the first prompt longer; one that raises stops
    generate --chat with its message and line."""
    problems = []
    custom = os.path.join(args.workdir, "custom.jinja")
    with open(custom, "w") as f:
        f.write("<|im_start|>system\nCustom template.<|im_end|>\n"
                "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    p = subprocess.run([args.rlx, "chat", "--model", model, "-n", "2", "--greedy", "--stats",
                        "--chat-template-file", custom], input="Hello there\n", capture_output=True, text=True,
                       timeout=120)
    stats = [tuple(map(int, m.groups())) for m in STATS.finditer(p.stderr)]
    if p.returncode != 0 or len(stats) != 1:
        problems.append(f"chat --chat-template-file: exit {p.returncode}, stats {stats}: {p.stderr.strip()}")
    elif stats[0][1] <= default_run:
        problems.append(f"chat --chat-template-file ran {stats[0][1]} prompt tokens, not more than the model's "
                        f"template's {default_run}: the file was not used")
    raising = os.path.join(args.workdir, "raising.jinja")
    with open(raising, "w") as f:
        f.write("ok\n{{ raise_exception('custom template used') }}")
    p = subprocess.run([args.rlx, "generate", "--model", model, "-n", "2", "--chat", "-p", "hi",
                        "--chat-template-file", raising], capture_output=True, text=True, timeout=120)
    if p.returncode != 1 or "line 2 column 4: raise_exception: custom template used" not in p.stderr:
        problems.append(f"generate --chat-template-file with raise_exception: exit {p.returncode}: {p.stderr.strip()}")
    p = subprocess.run([args.rlx, "generate", "--model", model, "-n", "2", "-p", "hi", "--chat-template-file", raising],
                       capture_output=True, text=True, timeout=120)
    if p.returncode != 1 or "needs --chat" not in p.stderr:
        problems.append(f"generate --chat-template-file without --chat: exit {p.returncode}: {p.stderr.strip()}")
    return problems


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rlx", required=True)
    ap.add_argument("--tokenizer", required=True, help="folder with tokenizer.json and tokenizer_config.json")
    ap.add_argument("--workdir", required=True)
    args = ap.parse_args()
    model = os.path.join(args.workdir, "chat-model")
    if not os.path.exists(os.path.join(model, "tokenizer.json")):
        shutil.rmtree(model, ignore_errors=True)
        make_model.build("demo", "bf16", 1, 3, model)
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(os.path.join(args.tokenizer, name), model)
    turns = "Hello there\nWhat did I just say?\n/reset\nStart again\n"
    p = subprocess.run([args.rlx, "chat", "--model", model, "-n", "6", "--greedy", "--stats"],
                       input=turns, capture_output=True, text=True, timeout=120)
    stats = [tuple(map(int, m.groups())) for m in STATS.finditer(p.stderr)]
    problems = []
    if p.returncode != 0:
        problems.append(f"exit status {p.returncode}: {p.stderr.strip()}")
    if len(stats) != 3:
        problems.append(f"expected 3 turns of statistics, got {stats}: {p.stderr.strip()}")
    else:
        (reused1, run1, gen1), (reused2, run2, _), (reused3, _, _) = stats
        if reused1 != 0:
            problems.append(f"the first turn reused {reused1} tokens of an empty cache")
        # the cache holds turn 1's prompt and all but the last reply token; turn 2 must reuse
        # at least the prompt and run far less than the whole conversation
        if reused2 < run1:
            problems.append(f"turn 2 reused {reused2} tokens, less than turn 1's prompt of {run1}")
        if reused2 > run1 + gen1:
            problems.append(f"turn 2 reused {reused2} tokens, more than the cache holds ({run1 + gen1 - 1})")
        if reused3 != 0:
            problems.append(f"after /reset the cache still supplied {reused3} tokens")
    if "conversation cleared" not in p.stderr:
        problems.append("/reset was not acknowledged")
    if len([line for line in p.stdout.split("\n") if line]) < 1:
        problems.append("no reply text on stdout")
    problems += check_template_file(args, model, stats[0][1] if stats else 0)
    for problem in problems:
        print("FAIL", problem)
    print(f"{0 if problems else 1} passed, {1 if problems else 0} failed")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
