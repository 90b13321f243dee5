#!/usr/bin/python3
"""Sampling and output of `rlx generate` through the CLI, on the shipped Brown family:

- defaults from a model's generation_config.json (do_sample, temperature, top_k, top_p,
  repetition_penalty) equal the same settings given as flags, and flags override them;
- greedy decoding with --repeat-penalty / --presence-penalty / --frequency-penalty picks, step by
  step, the argmax of NumPy's penalised logits, where the logits come from `rlx logits` (so the
  sampler's history, prompt included, and the window are checked against an independent rule);
- the same penalties with --spec draft and mtp give the plain output token for token;
- --stop cuts the text before the stop string, wherever tokens split it, in the stream and in
  --json; the earliest of several wins;
- chat's replies are cut by --stop too;
- --json holds the streamed text, the ids, the finish reason and the seed; --logprobs K gives
  log-probabilities equal to NumPy's log-softmax of `rlx logits`' row, with the alternatives
  sorted.

  check_sampling.py --rlx BIN --workdir DIR
"""
import argparse
import json
import os
import subprocess
import sys

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BROWN = os.path.join(REPO, "share", "models", "brown")
TARGET = os.path.join(BROWN, "target")
PROMPT = "The jury said that the city of Atlanta"

failures = []


def expect(ok, what):
    if not ok:
        failures.append(what)


def run(rlx, *args, ok=True):
    p = subprocess.run([rlx, *args], capture_output=True, text=True, timeout=300)
    if ok and p.returncode != 0:
        failures.append(f"rlx {' '.join(args)}: exit {p.returncode}: {p.stderr.strip()}")
    return p


def model_with(work, name, generation):
    """The Brown target with another generation_config.json (the other files linked)."""
    d = os.path.join(work, name)
    os.makedirs(d, exist_ok=True)
    for f in os.listdir(TARGET):
        if f != "generation_config.json" and not os.path.exists(os.path.join(d, f)):
            os.symlink(os.path.join(TARGET, f), os.path.join(d, f))
    with open(os.path.join(d, "generation_config.json"), "w") as f:
        json.dump({"eos_token_id": 4093, **generation}, f)
    return d


def check_model_defaults(rlx, work):
    sampled = model_with(work, "do-sample", {"do_sample": True, "temperature": 0.7, "top_k": 20, "top_p": 0.9})
    gen = ["generate", "-p", PROMPT, "-n", "24"]
    by_file = run(rlx, *gen, "-m", sampled, "-s", "11").stdout
    by_flags = run(rlx, *gen, "-s", "11", "--temp", "0.7", "--top-k", "20", "--top-p", "0.9").stdout
    greedy = run(rlx, *gen).stdout
    expect(by_file == by_flags, f"generation_config sampling {by_file!r} != the same as flags {by_flags!r}")
    expect(by_file != greedy, "a do_sample model decoded greedily")
    expect(run(rlx, *gen, "-m", sampled, "--temp", "0").stdout == greedy, "--temp 0 did not override do_sample")
    expect(run(rlx, *gen, "-m", sampled, "--greedy").stdout == greedy, "--greedy did not override do_sample")
    other = run(rlx, *gen, "-m", sampled, "-s", "11", "--top-k", "2").stdout
    expect(other == run(rlx, *gen, "-s", "11", "--temp", "0.7", "--top-k", "2", "--top-p", "0.9").stdout,
           "a flag did not override one key and keep the others")
    penalised = model_with(work, "repetition", {"do_sample": False, "repetition_penalty": 1.4})
    by_file = run(rlx, *gen, "-m", penalised).stdout
    expect(by_file == run(rlx, *gen, "--repeat-penalty", "1.4", "--repeat-last-n", "-1").stdout,
           "generation_config's repetition_penalty is not --repeat-penalty over the whole context")
    expect(by_file != greedy, "repetition_penalty 1.4 changed nothing (the test would not see a broken penalty)")
    broken = model_with(work, "broken", {"do_sample": True, "temperature": "hot"})
    p = run(rlx, *gen, "-m", broken, ok=False)
    expect(p.returncode == 1 and "generation_config.json" in p.stderr and "temperature" in p.stderr,
           f"a malformed generation_config.json: {p.returncode} {p.stderr!r}")


def logits_rows(rlx, work, ids):
    """Every position's logits row of ids, from one `rlx logits --all`: row i follows ids[:i + 1]."""
    out = os.path.join(work, "rows.f32")
    run(rlx, "logits", "--tokens", ",".join(map(str, ids)), "--all", "--out", out)
    return np.fromfile(out, dtype=np.float32).astype(np.float64).reshape(len(ids), -1)


def token_pieces(ids):
    """Each id's text, from the Brown tokenizer.json's vocabulary and its ByteLevel decoder (GPT-2's
    byte alphabet) read here in Python, not by rlx."""
    with open(os.path.join(TARGET, "tokenizer.json")) as f:
        vocab = {i: s for s, i in json.load(f)["model"]["vocab"].items()}
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    byte_of = {chr(b): b for b in printable}
    byte_of.update({chr(256 + k): b for k, b in enumerate(b for b in range(256) if b not in printable)})
    return [bytes(byte_of[c] for c in vocab[int(i)]).decode("utf-8", "replace") for i in ids]


def penalised_argmax(row, history, window, repeat, presence, frequency):
    seen = history if window < 0 else history[-window:] if window else []
    row = row.copy()
    ids, counts = np.unique(np.array(seen, dtype=np.int64), return_counts=True)
    if len(ids):
        r = row[ids]
        row[ids] = np.where(r > 0, r / repeat, r * repeat)  # Hugging Face's RepetitionPenaltyLogitsProcessor
        row[ids] -= presence + frequency * counts  # OpenAI's presence and frequency penalties
    return int(np.argmax(row))


def check_penalties(rlx, work):
    prompt = [int(t) for t in run(rlx, "tokenize", "-p", PROMPT + " the city of Atlanta the").stdout.split()]
    for flags, window, rep, pres, freq in ((["--repeat-penalty", "1.5"], 64, 1.5, 0.0, 0.0),
                                           (["--repeat-penalty", "1.5", "--repeat-last-n", "4"], 4, 1.5, 0.0, 0.0),
                                           (["--presence-penalty", "1.2", "--repeat-last-n", "-1"], -1, 1.0, 1.2, 0.0),
                                           (["--frequency-penalty", "0.8"], 64, 1.0, 0.0, 0.8)):
        # greedy: the first steps of the 24 tokens the speculators must repeat are those of -n 4
        plain = run(rlx, "generate", "--tokens", ",".join(map(str, prompt)), "-n", "24", "--greedy", *flags).stdout
        steps = 4
        got = [int(t) for t in plain.split()[:steps]]
        # the rows after prompt + got[:s]: up to the first step where rlx and NumPy part, that is
        # the history NumPy's own choices make, so got == want holds exactly when it held with a
        # `rlx logits` call per step
        rows = logits_rows(rlx, work, prompt + got[:steps - 1])
        want = []
        for s in range(len(got)):
            history = prompt + got[:s]
            want.append(penalised_argmax(rows[len(history) - 1], history, window, rep, pres, freq))
        expect(len(got) == steps and got == want,
               f"greedy {' '.join(flags)}: rlx {got}, NumPy's penalised argmax {want}")
        for spec in (["--spec", "draft", "--draft-model", os.path.join(BROWN, "draft")], ["--spec", "mtp"]):
            fast = run(rlx, "generate", "--tokens", ",".join(map(str, prompt)), "-n", "24", "--greedy", *flags,
                       *spec).stdout
            expect(fast == plain, f"{' '.join(spec)} with {' '.join(flags)}: {fast!r} != plain {plain!r}")


def check_stop_and_json(rlx):
    gen = ["generate", "-p", PROMPT, "-n", "40", "--greedy"]
    text = run(rlx, *gen).stdout[:-1]
    ids = run(rlx, "generate", "--tokens", run(rlx, "tokenize", "-p", PROMPT).stdout.strip(), "-n", "40",
              "--greedy").stdout.split()
    pieces = token_pieces(ids)
    # a stop string that starts inside one token and ends inside a later one
    at, cut = 0, None
    for i, piece in enumerate(pieces[:-2]):
        if len(piece) >= 2 and len(pieces[i + 1]) >= 1 and at > 5:
            cut = (at + len(piece) - 1, at + len(piece) + 1)
            break
        at += len(piece)
    expect(cut is not None and "".join(pieces) == text, f"token pieces {pieces!r} do not make the text {text!r}")
    if cut is None:
        return
    stop = text[cut[0]:cut[1]]
    want = text[:text.index(stop)]
    got = run(rlx, *gen, "--stop", stop).stdout
    expect(got == want + "\n", f"--stop {stop!r}: {got!r}, want {want!r}")
    later = text[cut[1] + 3:cut[1] + 6]
    got2 = run(rlx, *gen, "--stop", later, "--stop", stop).stdout
    expect(got2 == want + "\n", f"--stop {later!r} --stop {stop!r}: the earliest must win, got {got2!r}")
    j = json.loads(run(rlx, *gen, "--stop", stop, "--json").stdout)
    expect(j["text"] == want and j["finish_reason"] == "stop" and j["stopped_by"] == "stop_string",
           f"--json with --stop: {j}")
    j = json.loads(run(rlx, *gen, "--json").stdout)
    expect(j["text"] == text and j["tokens"] == [int(i) for i in ids] and j["finish_reason"] == "length" and
           j["stopped_by"] == "max_tokens" and j["n_generated"] == 40 and j["greedy"] is True,
           f"--json: {j}")
    full = json.loads(run(rlx, "generate", "-p", PROMPT, "-n", "-1", "--ctx", "20", "--json").stdout)
    expect(full["stopped_by"] == "context" and full["finish_reason"] == "length", f"--json at a full context: {full}")
    s = json.loads(run(rlx, "generate", "-p", PROMPT, "-n", "8", "--temp", "0.9", "-s", "42", "--json").stdout)
    expect(s["seed"] == "42" and s["greedy"] is False, f"--json seed: {s}")
    p = run(rlx, *gen, "--logprobs", "2", ok=False)
    expect(p.returncode == 1 and "needs --json" in p.stderr, f"--logprobs without --json: {p.stderr!r}")
    p = run(rlx, "generate", "--tokens", "1,2", "--stop", "x", ok=False)
    expect(p.returncode == 1 and "--stop" in p.stderr, f"--stop with --tokens: {p.stderr!r}")


def check_logprobs(rlx, work):
    prompt = [int(t) for t in run(rlx, "tokenize", "-p", PROMPT).stdout.split()]
    j = json.loads(run(rlx, "generate", "--tokens", ",".join(map(str, prompt)), "-n", "3", "--temp", "0.8",
                       "-s", "3", "--json", "--logprobs", "5").stdout)
    rows = logits_rows(rlx, work, prompt + j["tokens"][:-1])
    for step, item in enumerate(j["logprobs"]):
        row = rows[len(prompt) - 1 + step]
        logp = row - row.max() - np.log(np.exp(row - row.max()).sum())
        token = item["id"]
        expect(token == j["tokens"][step], f"logprobs entry {step} is for {token}, not the generated token")
        expect(abs(item["logprob"] - logp[token]) < 1e-4, f"step {step}: logprob {item['logprob']} != NumPy {logp[token]}")
        top = [t["id"] for t in item["top_logprobs"]]
        expect(top == [int(t) for t in np.argsort(-logp, kind="stable")[:5]],
               f"step {step}: top ids {top} != NumPy's {np.argsort(-logp)[:5]}")
        expect(all(abs(t["logprob"] - logp[t["id"]]) < 1e-4 for t in item["top_logprobs"]),
               f"step {step}: top logprobs differ from NumPy")
        expect("token" in item and isinstance(item["bytes"], list), f"step {step}: no token text/bytes: {item}")


def check_chat_stop(rlx):
    """chat through a pipe: --stop cuts each reply, and the next turn still runs."""
    def chat(*flags):
        p = subprocess.run([rlx, "chat", "-n", "30", "--greedy", *flags], input="Tell me about the city\nAnd then?\n",
                           capture_output=True, text=True, timeout=300)
        expect(p.returncode == 0, f"chat {' '.join(flags)}: exit {p.returncode}: {p.stderr!r}")
        return p.stdout.splitlines()
    replies = chat()
    expect(len(replies) == 2 and len(replies[0]) > 8, f"chat replies {replies!r}")
    if len(replies) != 2 or len(replies[0]) <= 8:
        return
    stop = replies[0][4:7]
    cut = chat("--stop", stop)
    expect(len(cut) == 2 and cut[0] == replies[0][:replies[0].index(stop)] and stop not in cut[1],
           f"chat --stop {stop!r}: {cut!r} from {replies!r}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rlx", required=True)
    ap.add_argument("--workdir", required=True)
    args = ap.parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    check_model_defaults(args.rlx, args.workdir)
    check_penalties(args.rlx, args.workdir)
    check_stop_and_json(args.rlx)
    check_logprobs(args.rlx, args.workdir)
    check_chat_stop(args.rlx)
    for f in failures:
        print("FAIL:", f)
    print(f"sampling: {'FAIL' if failures else 'PASS'} ({len(failures)} failures)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
