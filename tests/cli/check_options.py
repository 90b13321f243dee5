#!/usr/bin/python3
"""The command line a llama.cpp user expects, through the CLI on the shipped Brown model:
llama.cpp's spellings (-m, -p, -f, -n, -t, -c, -s, --ctx-size, --temp 0), --version on every
command, --help generated from the same table that parses (every option it lists is accepted),
random seeds by default and fixed by --seed (-1: random), -ctk/-ctv cache types (either alone sets
both), llama.cpp's single-dash spellings of several letters (-ngl, -fa, -ub, -sys, ...) taken or
refused by name, one clear line for bad or pointless options and for a model path that is wrong,
`rlx` alone and --json -n 0, `rlx stage --standby` listening on the deployment file's standby address,
the pipeline credentials and stage limits: listed, checked, and inherited by launched stages, and the
line a stage started by hand prints once listening (the bound port, who may connect).

  check_options.py --rlx BIN --conformance BIN --workdir DIR
"""
import argparse
import array
import concurrent.futures
import json
import os
import re
import select
import socket
import subprocess
import sys
import time

COMMANDS = ["generate", "chat", "tokenize", "detokenize", "logits", "bench", "perplexity", "graph", "plugins",
            "stage", "quantize"]

failures = []
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run(argv, stdin="", timeout=300):
    return subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=timeout)


def expect(ok, what):
    if not ok:
        failures.append(what)


def expect_error(p, pattern, what):
    """Exit 1 and exactly one stderr line 'rlx: ...' matching pattern."""
    lines = p.stderr.splitlines()
    expect(p.returncode == 1 and len(lines) == 1 and lines[0].startswith("rlx: ") and re.search(pattern, lines[0]),
           f"{what}: exit {p.returncode}, stderr {p.stderr!r}, want one 'rlx: ' line matching {pattern!r}")


def check_version_and_help(rlx, conformance):
    version = run([rlx, "--version"])
    m = re.fullmatch(r"rlx (\d+\.\d+\.\d+) \(librlx \1; plugin ABI \d+\.\d+\)\n", version.stdout)
    expect(version.returncode == 0 and m, f"rlx --version: {version.stdout!r} {version.stderr!r}")
    for cmd in COMMANDS:
        p = run([rlx, cmd, "--version"])
        expect(p.returncode == 0 and p.stdout == version.stdout, f"rlx {cmd} --version: {p.stdout!r} {p.stderr!r}")
    kit = run([conformance, "--version"])
    expect(kit.returncode == 0 and kit.stdout.startswith("rlx-conformance ") and "plugin ABI" in kit.stdout,
           f"rlx-conformance --version: {kit.stdout!r}")
    listed = []
    for cmd in COMMANDS:
        p = run([rlx, cmd, "--help"])
        expect(p.returncode == 0 and p.stdout.startswith(f"usage: rlx {cmd}"), f"rlx {cmd} --help: {p.stderr!r}")
        listed += [(cmd, opt) for opt in
                   sorted(set(re.findall(r"^  (?:-\w, )?(--[\w-]+)", p.stdout, re.M)) - {"--help", "--version"})]
    # every long option the help lists is one the parser knows. Two unknown options after it stop
    # the command before it runs (an option's value takes the first), so the error must be about
    # them or the option's value, never the option. Hundreds of short runs, most of each one the
    # sanitizer's start and exit: a few at once.
    stop = ["--no-such-option", "--no-such-option"]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        runs = pool.map(lambda c: run([rlx, c[0], c[1]] + stop, timeout=60), listed)
        for (cmd, opt), q in zip(listed, runs):
            expect(q.returncode == 1 and f"unknown option '{opt}'" not in q.stderr and q.stderr.startswith("rlx: "),
                   f"rlx {cmd} --help lists {opt}, which is refused: {q.stderr!r}")
    helps = {cmd: run([rlx, cmd, "--help"]).stdout for cmd in ("generate", "bench", "perplexity")}
    for cmd, spellings in (("generate", ["-m, --model", "-p, --prompt", "-f, --file", "-n, --n-predict",
                                         "-t, --threads", "-c, --ctx-size", "-s, --seed", "--temp", "--top-k",
                                         "--top-p", "--min-p", "--repeat-penalty", "--repeat-last-n",
                                         "--presence-penalty", "--frequency-penalty", "--stop"]),
                           ("bench", ["-p, --n-prompt", "-n, --n-gen", "-t, --threads", "-r, --repetitions",
                                      "-o, --output"]),
                           ("perplexity", ["-f, --file", "-c, --ctx-size"])):
        for s in spellings:
            expect(s in helps[cmd], f"rlx {cmd} --help lacks {s!r}")


def check_spellings(rlx, work):
    prompt = "The city of"
    want = run([rlx, "generate", "--prompt", prompt, "-n", "10", "--greedy"])
    expect(want.returncode == 0 and want.stdout.strip(), f"generate --greedy: {want.stderr!r}")
    path = os.path.join(work, "prompt.txt")
    with open(path, "w") as f:
        f.write(prompt + "\n")
    model = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                         "share", "models", "brown", "target")
    for argv in (["-m", model, "-p", prompt, "-n", "10"], ["-f", path, "--n-predict", "10", "-t", "1", "-c", "64"],
                 ["-p", prompt, "-n", "10", "--ctx-size", "64", "--temp", "0"],
                 ["--prompt", prompt, "-n", "10", "--ctx", "64", "--threads", "2"]):
        p = run([rlx, "generate"] + argv)
        expect(p.returncode == 0 and p.stdout == want.stdout,
               f"generate {' '.join(argv)}: {p.stdout!r} (want the greedy {want.stdout!r}) {p.stderr!r}")
    # before the verb too
    p = run([rlx, "-m", model, "-c", "64", "generate", "-p", prompt, "-n", "10"])
    expect(p.returncode == 0 and p.stdout == want.stdout, f"options before the verb: {p.stdout!r} {p.stderr!r}")


def check_seeds(rlx):
    base = [rlx, "generate", "-p", "The", "-n", "24", "--temp", "1.0", "--stats"]
    a, b = run(base), run(base)
    seeds = [re.search(r"^rlx: seed (\d+) \(drawn", p.stderr, re.M) for p in (a, b)]
    expect(all(seeds), f"--stats without --seed does not print a drawn seed: {a.stderr!r}")
    if not all(seeds):
        return
    expect(seeds[0].group(1) != seeds[1].group(1), "two runs without --seed drew the same seed")
    expect(a.stdout != b.stdout, f"two runs without --seed sampled the same text {a.stdout!r}")
    again = run(base + ["-s", seeds[0].group(1)])
    expect(again.returncode == 0 and again.stdout == a.stdout,
           f"--seed {seeds[0].group(1)} does not repeat the run: {again.stdout!r} vs {a.stdout!r}")
    x, y = run(base + ["--seed", "7"]), run(base + ["--seed", "7"])
    expect(x.stdout == y.stdout and re.search(r"^rlx: seed 7$", x.stderr, re.M),
           f"--seed 7 twice: {x.stdout!r} {y.stdout!r} {x.stderr!r}")


def check_kv_cache_types(rlx, work):
    """-ctk/-ctv (llama.cpp's spellings) choose the cache type, F16 when not given: F32 and Q8_0
    move the logits from F16's by about the rounding of the one that rounds more, and a
    mismatched pair or an unknown type is one clear line."""
    tokens = "785,3283,315,279,1879,572,264,2632,13,576"
    rows = {}
    for kv, extra in (("default", []), ("f32", ["-ctk", "f32", "-ctv", "f32"]),
                      ("f16", ["-ctk", "f16", "-ctv", "f16"]),
                      ("f16-long", ["--cache-type-k", "f16", "--cache-type-v", "f16"]),
                      ("q8_0", ["-ctk", "q8_0", "-ctv", "q8_0"])):
        out = os.path.join(work, f"logits-{kv}.bin")
        p = run([rlx, "logits", "--tokens", tokens, "--all", "--out", out] + extra)
        expect(p.returncode == 0, f"logits with {extra}: {p.stderr!r}")
        with open(out, "rb") as f:
            rows[kv] = f.read()
    expect(rows["default"] == rows["f16"], "the default cache is not the F16 one of -ctk f16 -ctv f16")
    ref = array.array("f", rows["f32"])
    scale = max(abs(x) for x in ref)
    # the first position attends only to itself, so a cache round trip moves later rows only;
    # Q8_0 keeps about 8 bits per value to F16's 11, so it may move them about 8x as far
    for kv, most in (("f16", 0.02), ("q8_0", 0.16)):
        a = array.array("f", rows[kv])
        diff = max(abs(x - y) for x, y in zip(ref, a)) if len(a) == len(ref) else float("inf")
        expect(0 < diff < most * scale, f"{kv} cache: logits moved by {diff} (scale {scale}); want > 0, < {most}")
    expect(rows["q8_0"] != rows["f16"], "-ctk q8_0 gives the F16 cache's logits")
    expect(rows["f16"] == rows["f16-long"], "-ctk/-ctv and --cache-type-k/-v give different logits")
    # rlx keeps one type: either spelling alone sets both, and a pair that differs is refused
    for alone in (["-ctk", "q8_0"], ["-ctv", "q8_0"]):
        out = os.path.join(work, "logits-alone.bin")
        p = run([rlx, "logits", "--tokens", tokens, "--all", "--out", out] + alone)
        expect(p.returncode == 0 and open(out, "rb").read() == rows["q8_0"],
               f"{' '.join(alone)} alone does not give the Q8_0 cache of -ctk q8_0 -ctv q8_0: {p.stderr!r}")
    gen = [rlx, "generate", "-p", "hi", "-n", "2"]
    expect_error(run(gen + ["-ctk", "f16", "-ctv", "f32"]), r"--cache-type-k f16 and --cache-type-v f32 differ",
                 "-ctk and -ctv that differ")
    expect_error(run(gen + ["-ctk", "q4_1", "-ctv", "q4_1"]),
                 r"'q4_1' is not a KV cache type rlx has: f32, f16 or q8_0", "a cache type rlx lacks")


def check_logit_bias(rlx):
    """-l/--logit-bias as llama.cpp spells it: ID-inf bans a token, ID+B favours one; bad values
    and ids outside the vocabulary are one clear line."""
    base = [rlx, "generate", "-p", "The President said that", "-n", "6", "--greedy", "--json"]

    def tokens(extra):
        p = run(base + extra)
        expect(p.returncode == 0, f"generate {extra}: {p.stderr!r}")
        return json.loads(p.stdout.strip().splitlines()[-1])["tokens"] if p.returncode == 0 else []
    ref = tokens([])
    banned = tokens(["-l", f"{ref[0]}-inf"])
    expect(banned and ref[0] not in banned, f"-l {ref[0]}-inf: {banned} still has the token (greedy {ref})")
    expect(tokens(["--logit-bias", f"{ref[0]}-inf"]) == banned, "--logit-bias and -l differ")
    forced = tokens(["-l", "500+100"])
    expect(forced == [500] * 6, f"-l 500+100: {forced}, want token 500 every time")
    gen = [rlx, "generate", "-p", "hi", "-n", "2"]
    expect_error(run(gen + ["-l", "x"]), r"-l: 'x' is not TOKEN_ID\+BIAS or TOKEN_ID-BIAS", "-l x")
    expect_error(run(gen + ["-l", "5+nan"]), r"the bias '\+nan' is not a finite number", "-l 5+nan")
    expect_error(run(gen + ["-l", "99999999-inf"]), r"logit bias on token 99999999, outside the vocabulary",
                 "-l beyond the vocabulary")


def check_errors(rlx):
    gen = [rlx, "generate", "-p", "hi", "-n", "2"]
    expect_error(run(gen + ["--ctx", "0"]), r"--ctx must be at least 1 \(got 0\)", "--ctx 0")
    expect_error(run(gen + ["-c", "0"]), r"-c must be at least 1", "-c 0")
    expect_error(run(gen + ["--threads", "0"]), r"--threads must be at least 1", "--threads 0")
    expect_error(run(gen + ["--no-think"]), r"--no-think .* needs --chat", "--no-think without --chat")
    expect_error(run(gen + ["--top", "3"]), r"'--top' is ambiguous: --top-k, --top-p", "an ambiguous abbreviation")
    expect_error(run(gen + ["--bogus"]), r"generate: unknown option '--bogus' \(see rlx generate --help\)",
                 "an unknown option")
    expect_error(run(gen + ["-n"]), r"option -n needs a value", "a missing value")
    expect_error(run(gen + ["--stats=1"]), r"option --stats takes no value", "a value for a flag")
    expect_error(run(gen + ["extra"]), r"unexpected argument 'extra'", "an operand")
    expect_error(run(gen + ["--temp", "x"]), r"--temp: 'x' is not a number", "a bad number")
    expect_error(run(gen + ["--temp", "nan"]), r"--temp: 'nan' is not a finite number", "a NaN")
    expect_error(run(gen + ["--greedy", "--temp", "0.5"]), r"--greedy cannot be combined", "--greedy with --temp")
    expect_error(run([rlx, "graph", "-t", "x"]), r"-t: 'x' is not a non-negative integer", "graph -t is threads")
    many = run(gen + ["--threads", "999"])
    cores = len(os.sched_getaffinity(0))
    expect(many.returncode == 0 and re.search(rf"^rlx: warning: --threads 999 is more than the {cores} cores",
                                              many.stderr, re.M),
           f"--threads 999: exit {many.returncode}, stderr {many.stderr!r}")
    idle = run(gen + ["--temp", "0", "--top-k", "5", "--seed", "3"])
    expect(idle.returncode == 0 and re.search(r"^rlx: warning: --top-k --seed has no effect: decoding is greedy "
                                              r"\(--temp 0\)$", idle.stderr, re.M),
           f"--top-k and --seed with --temp 0: exit {idle.returncode}, stderr {idle.stderr!r}")
    graph = run([rlx, "graph", "--positions", "3"])
    expect(graph.returncode == 0 and "f32[3," in graph.stdout, f"graph --positions 3: {graph.stderr!r}")


def check_llama_spellings(rlx):
    """llama.cpp's options of several letters after one dash are read as llama.cpp means them, not
    as clusters of short options (-ngl 99 was -n with the value 'gl'): those with a meaning in rlx
    work, -ngl and its long names go on with a warning, and the others are refused by name."""
    base = [rlx, "generate", "-p", "The city of", "-n", "6", "--greedy"]
    want = run(base)
    expect(want.returncode == 0 and want.stdout.strip(), f"generate --greedy: {want.stderr!r}")
    for extra, note in ((["-ngl", "99"], r"^rlx: warning: --n-gpu-layers 99: rlx has no GPU offload"),
                        (["--n-gpu-layers", "all"], r"^rlx: warning: --n-gpu-layers all: rlx has no GPU offload"),
                        (["--gpu-layers", "0"], None),
                        (["-fa"], r"^rlx: note: --flash-attn has no effect"),
                        (["-fa", "off"], r"^rlx: note: --flash-attn has no effect"),
                        (["-ub", "128", "-b", "512"], r"^rlx: note: --ubatch-size has no effect"),
                        (["-no-cnv"], None), (["--seed", "-1"], None)):
        p = run(base + extra)
        expect(p.returncode == 0 and p.stdout == want.stdout and
               (re.search(note, p.stderr, re.M) if note else "warning" not in p.stderr),
               f"generate {' '.join(extra)}: exit {p.returncode}, {p.stdout!r} (want {want.stdout!r}), "
               f"stderr {p.stderr!r} (want {note!r})")
    # before the command too, and -fa without a value does not take the next option as one
    p = run([rlx, "-ngl", "99", "-fa", "generate", "-p", "The city of", "-n", "6", "--greedy"])
    expect(p.returncode == 0 and p.stdout == want.stdout, f"-ngl 99 -fa before the command: {p.stderr!r}")
    p = run([rlx, "generate", "-fa", "-p", "The city of", "-n", "6", "--greedy"])
    expect(p.returncode == 0 and p.stdout == want.stdout, f"-fa before -p: {p.stderr!r}")
    expect_error(run(base + ["-ngl", "x"]), r"--n-gpu-layers: 'x' is not a number of layers, auto or all", "-ngl x")
    p = run(base + ["-fa", "maybe"])  # -fa alone is on: "maybe" is no value of it
    expect(p.returncode == 1 and p.stderr.splitlines()[-1:] == ["rlx: generate: unexpected argument 'maybe' (see rlx "
                                                               "generate --help)"], f"-fa maybe: {p.stderr!r}")
    expect_error(run(base + ["-dev", "none"]), r"generate: '-dev' is llama.cpp's --device, which rlx generate does "
                 r"not take; instead: --plugin NAME", "-dev")
    expect_error(run(base + ["-np", "4"]), r"'-np' is llama.cpp's --parallel, which rlx generate does not take; "
                 r"instead: rlx serve --parallel N", "-np on generate")
    expect_error(run(base + ["-cnv"]), r"'-cnv' is llama.cpp's --conversation, which rlx generate does not take; "
                 r"instead: rlx chat", "-cnv on generate")
    expect_error(run([rlx, "chat", "-no-cnv"]), r"chat: '-no-cnv' is llama.cpp's --no-conversation", "-no-cnv on chat")
    expect_error(run([rlx, "-sys", "x", "chat"]), r"^rlx: '-sys' is llama.cpp's --system-prompt, which rlx before a "
                 r"command does not take", "-sys before the command")
    expect_error(run(base + ["-xyz"]), r"unknown option '-x' in '-xyz' \(one dash takes one letter", "a cluster")
    # a value that looks like llama.cpp's spelling stays a value
    p = run(base + ["--stop", "-ngl"])
    expect(p.returncode == 0 and "warning" not in p.stderr, f"--stop -ngl: {p.stderr!r}")
    # -sys and -sysf are chat's --system
    chat = [rlx, "chat", "-n", "6", "--greedy"]
    ref = run(chat + ["--system", "Be brief."], stdin="Tell me about the city\n")
    expect(ref.returncode == 0 and ref.stdout.strip(), f"chat --system: {ref.stderr!r}")
    for extra in (["-sys", "Be brief."], ["--system-prompt", "Be brief."], ["-cnv", "-sys", "Be brief."]):
        p = run(chat + extra, stdin="Tell me about the city\n")
        expect(p.returncode == 0 and p.stdout == ref.stdout, f"chat {' '.join(extra)}: {p.stdout!r} (want "
               f"{ref.stdout!r}) {p.stderr!r}")


def check_seed_minus_one(rlx):
    """--seed -1 is llama.cpp's random seed: a new one each run."""
    base = [rlx, "generate", "-p", "The", "-n", "24", "--temp", "1.0", "--stats", "--seed", "-1"]
    a, b = run(base), run(base)
    seeds = [re.search(r"^rlx: seed (\d+) \(drawn", p.stderr, re.M) for p in (a, b)]
    expect(all(seeds) and seeds[0].group(1) != seeds[1].group(1),
           f"--seed -1 twice: {a.stderr!r} {b.stderr!r}")
    expect_error(run(base[:-1] + ["-2"]), r"--seed: '-2' is not a seed \(a non-negative integer, or -1",
                 "--seed -2")


def check_usage_and_outputs(rlx, work):
    """`rlx` alone lists the commands and points to --help (it ended mid-sentence); rlx's own
    errors say "rlx:" once; --json -n 0 keeps its tokens key."""
    p = run([rlx])
    expect(p.returncode == 1 and "  generate " in p.stderr and p.stderr.endswith("before the command too.\n"),
           f"rlx alone: exit {p.returncode}, {p.stderr!r}")
    full = run([rlx, "--help"])
    expect(full.returncode == 0 and re.search(r"may also come before the command:\n\noptions:\n  -m, --model",
                                              full.stdout), f"rlx --help: {full.stdout[:600]!r}")
    p = run([rlx, "-x"])
    expect(p.returncode == 1 and p.stderr == "rlx: unknown option '-x' (see rlx --help)\n", f"rlx -x: {p.stderr!r}")
    p = run([rlx, "--bogus"])
    expect(p.stderr == "rlx: unknown option '--bogus' (see rlx --help)\n", f"rlx --bogus: {p.stderr!r}")
    p = run([rlx, "generate", "-p", "hi", "-n", "0", "--json"])
    out = json.loads(p.stdout) if p.returncode == 0 and p.stdout.strip() else {}
    expect(out.get("tokens") == [] and out.get("n_generated") == 0 and out.get("text") == "",
           f"generate --json -n 0: {p.stdout!r} {p.stderr!r}")


def check_model_paths(rlx, work):
    """-m names what is wrong with a path: that it does not exist, that a file is no model, that a
    folder holds GGUF files (to be given as files) but no checkpoint; all said "no model.safetensors"."""
    gen = [rlx, "generate", "-p", "hi", "-n", "2", "-m"]
    missing = os.path.join(work, "nowhere")
    expect_error(run(gen + [missing]), re.escape(f"{missing}: No such file or directory (the model is a GGUF file "
                                                  "or a directory with config.json and *.safetensors)"),
                 "a model path that does not exist")
    typo = os.path.join(work, "x.gguf.nope")
    expect_error(run(gen + [typo]), re.escape(f"{typo}: No such file or directory"), "a misspelled GGUF file")
    junk = os.path.join(work, "notes.txt")
    with open(junk, "w") as f:
        f.write("not a model\n")
    expect_error(run(gen + [junk]), re.escape(f"{junk} is a file, but neither a GGUF file nor a model directory"),
                 "a file that is no model")
    folder = os.path.join(work, "gguf-folder")
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "Qwen3-0.6B-Q4_K_M.gguf"), "wb") as f:
        f.write(b"GGUF")
    expect_error(run(gen + [folder]), re.escape(f"{folder} is a directory with GGUF files (Qwen3-0.6B-Q4_K_M.gguf) "
                                                "but no config.json or *.safetensors: give the GGUF file itself as "
                                                f"the model, e.g. -m {folder}/Qwen3-0.6B-Q4_K_M.gguf"),
                 "a folder of GGUF files")
    empty = os.path.join(work, "empty-folder")
    os.makedirs(empty, exist_ok=True)
    expect_error(run(gen + [empty]), re.escape(f"{empty}: no model.safetensors or model.safetensors.index.json (a "
                                               "model directory holds config.json and *.safetensors"),
                 "an empty folder")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check_stage_standby(rlx, work):
    """rlx stage --config FILE --stage I --standby K serves entry I at its K-th standby address
    (0 = first); a K the entry lacks, --standby without --config and --stage, and the drivers'
    recovery options are one clear line each."""
    model = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                         "share", "models", "brown", "target")
    ports = [free_port() for _ in range(4)]
    cfg = os.path.join(work, "standby.yaml")
    with open(cfg, "w") as f:
        f.write(f"model: {model}\nstages:\n"
                f"  - address: 127.0.0.1:{ports[0]}\n"
                f"    standby: [127.0.0.1:{ports[1]}, 127.0.0.1:{ports[2]}]\n"
                f"  - address: 127.0.0.1:{ports[3]}\n")
    stage = [rlx, "stage", "--config", cfg]
    expect_error(run([rlx, "stage", "--standby", "0", "--listen", "127.0.0.1:0", "--layers", "0-3"]),
                 r"stage: --standby K needs --config FILE --stage I", "--standby without --config")
    expect_error(run(stage + ["--standby", "0"]), r"stage: --standby K needs --config FILE --stage I",
                 "--standby without --stage")
    expect_error(run(stage + ["--stage", "0", "--standby", "2"]),
                 re.escape(f"{cfg}:3: stage 0 has 2 standby addresses; --standby 2 is not one of them (0-1)"),
                 "--standby past the entry's list")
    expect_error(run(stage + ["--stage", "1", "--standby", "0"]),
                 re.escape(f"{cfg}:5: stage 1 has no standby addresses"), "--standby on an entry without any")
    expect_error(run([rlx, "--no-recovery", "stage"] + stage[2:] + ["--stage", "0"]),
                 r"--recovery-timeout, --no-recovery and --tls-name are for drivers", "--no-recovery before `stage`")
    gen = [rlx, "generate", "-p", "hi", "-n", "2"]
    expect_error(run(gen + ["--no-recovery"]), r"--no-recovery apply to pipelines: add --config FILE or --stages N",
                 "--no-recovery without a pipeline")
    expect_error(run(gen + ["--recovery-timeout", "1000"]), r"apply to pipelines", "--recovery-timeout alone")
    expect_error(run(gen + ["--stages", "2", "--recovery-timeout", "1000", "--no-recovery"]),
                 r"--recovery-timeout bounds the recovery --no-recovery turns off", "both recovery options")
    expect_error(run(gen + ["--stages", "2", "--recovery-timeout", "0"]), r"--recovery-timeout must be at least 1",
                 "--recovery-timeout 0")
    # standby 1 of stage 0: bound where the file says, and named so in the stage's log
    r, w = os.pipe()
    errf = open(os.path.join(work, "standby-stage.log"), "w+")
    p = subprocess.Popen(stage + ["--stage", "0", "--standby", "1", "--threads", "1", "--ready-fd", str(w), "-v"],
                         stdout=subprocess.DEVNULL, stderr=errf, pass_fds=(w,))
    os.close(w)
    try:
        ready = select.select([r], [], [], 60)[0]
        line = os.read(r, 256).decode().strip() if ready else "(nothing within 60 s)"
        expect(line == f"127.0.0.1:{ports[2]}", f"stage 0 --standby 1 listens on {line!r}, want 127.0.0.1:{ports[2]}")
    finally:
        os.close(r)
        p.terminate()
        p.wait(30)
        errf.seek(0)
        log = errf.read()
        errf.close()
    expect(p.returncode == 0, f"stage 0 --standby 1 exited {p.returncode} on SIGTERM: {log!r}")
    # the entry's layers: the Brown model's 8 split evenly over the file's 2 stages
    expect(f"rlx stage 0 standby 1 (127.0.0.1:{ports[2]}): serving layers 0-3," in log,
           f"the standby's log does not name it and stage 0's layers: {log!r}")


def stage_start_line(argv, work, name):
    """Starts a stage by hand (no --ready-fd) and returns (process, its log file, the line it prints
    once listening, "" when none came within 60 s)."""
    errf = open(os.path.join(work, f"{name}.log"), "w+")
    p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=errf)
    line = ""
    for _ in range(600):  # 60 s
        errf.seek(0)
        line = next((l for l in errf.read().splitlines() if ": listening (" in l), "")
        if line or p.poll() is not None:
            break
        time.sleep(0.1)
    return p, errf, line


def check_stage_start_line(rlx, work):
    """A stage started by hand says once, on stderr, where it listens (the port the kernel chose
    for port 0) and who may connect; with -v its log lines carry that address, not the one asked."""
    token = os.path.join(work, "start.token")
    with open(os.open(token, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
        f.write(os.urandom(16).hex() + "\n")
    base = [rlx, "stage", "--listen", "127.0.0.1:0", "--layers", "0-3", "--threads", "1", "--no-prefetch"]
    for extra, mode in (([], "no credentials: drivers on this machine only (loopback)"),
                        (["--auth-token-file", token, "-v"], "drivers must authenticate: the auth token")):
        p, errf, line = stage_start_line(base + extra, work, "start-" + str(len(extra)))
        try:
            m = re.fullmatch(r"rlx stage 127\.0\.0\.1:(\d+): listening \(tcp, layers 0-3\); (.*)", line)
            expect(m and m.group(1) != "0" and m.group(2) == mode,
                   f"rlx stage {' '.join(extra)}: start line {line!r}, want the bound port and {mode!r}")
            if m and "-v" in extra:  # a connection, logged under the bound address
                socket.create_connection(("127.0.0.1", int(m.group(1))), timeout=10).close()
                want = f"rlx stage 127.0.0.1:{m.group(1)}: driver connection 1 accepted"
                for _ in range(300):
                    errf.seek(0)
                    log = errf.read()
                    if want in log:
                        break
                    time.sleep(0.1)
                expect(want in log and "127.0.0.1:0:" not in log.split(line)[-1],
                       f"rlx stage -v: the log after the start line does not use the bound address: {log!r}")
        finally:
            p.terminate()
            p.wait(30)
            errf.close()


SECURITY_FLAGS = ["--auth-token-file", "--tls-ca", "--tls-cert", "--tls-key"]
CHAT = ["-n", "6", "--greedy", "--threads", "1", "--backend-opts", "batch_invariant=1"]


def launched_stages(p):
    """The argv of each stage process p launched, in launch order."""
    children = open(f"/proc/{p.pid}/task/{p.pid}/children").read().split()
    return [open(f"/proc/{c}/cmdline", "rb").read().decode().split("\0")[:-1] for c in children]


def chat_over_stages(rlx, extra, want_reply):
    """One turn of rlx chat over launched stages: its reply (which must be want_reply, what one
    process answers) and the launched stages' command lines; the chat must end with status 0."""
    p = subprocess.Popen([rlx, "chat", *CHAT, *extra], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    stages = []
    try:
        p.stdin.write("Tell me about the city\n")
        p.stdin.flush()
        reply = p.stdout.readline().rstrip("\n")
        if p.poll() is None:
            stages = launched_stages(p)
        p.stdin.close()
        p.wait(120)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    err = p.stderr.read()
    expect(p.returncode == 0 and reply == want_reply,
           f"chat {' '.join(extra)}: exit {p.returncode}, reply {reply!r} (want {want_reply!r}), stderr {err!r}")
    return stages


def flag_value(argv, flag):
    return argv[argv.index(flag) + 1] if flag in argv else None


def check_stage_security(rlx, work):
    """The credentials (--auth-token-file, --tls-*) on drivers and rlx stage, and a stage's limits:
    listed in --help, refused where they mean nothing, and passed to the stages a driver launches,
    with the pipeline still answering what one process answers (end to end once the core checks
    them)."""
    stage_help = run([rlx, "stage", "--help"]).stdout
    for flag, words in (("--auth-token-file FILE", "FILE's first line (kept out of ps"),
                        ("--tls-ca FILE", "chain to this"), ("--tls-cert FILE", "its entry's"),
                        ("--tls-key FILE", "of --tls-cert"), ("--insecure-listen", "with no credentials"),
                        ("--idle-timeout MS", "timeouts: idle_ms"), ("--max-connections N", "limits:"),
                        ("--max-sessions N", "limits: sessions"), ("--max-positions N", "limits:")):
        at = stage_help.find("  " + flag)
        expect(at >= 0 and words in stage_help[at:at + 300], f"rlx stage --help: {flag} missing or without {words!r}")
    expect("--tls-name" not in stage_help, "rlx stage --help lists the driver's --tls-name")
    gen_help = run([rlx, "generate", "--help"]).stdout
    for flag in SECURITY_FLAGS + ["--tls-name"]:
        expect(re.search(rf"^  {flag} (FILE|NAME)", gen_help, re.M), f"rlx generate --help lacks {flag}")
    expect("--insecure-listen" not in gen_help and "--max-sessions" not in gen_help,
           "rlx generate --help lists a stage's own options")

    gen = [rlx, "generate", "-p", "hi", "-n", "2"]
    expect_error(run(gen + ["--auth-token-file", "t"]), r"the credentials \(--auth-token-file, --tls-\*\) and "
                 r"--no-recovery apply to pipelines", "--auth-token-file without a pipeline")
    expect_error(run(gen + ["--tls-name", "n"]), r"apply to pipelines", "--tls-name without a pipeline")
    layers = ["--listen", "127.0.0.1:0", "--layers", "0-3"]
    expect_error(run([rlx, "--tls-name", "n", "stage"] + layers), r"--tls-name are for drivers",
                 "--tls-name before `stage`")
    expect_error(run([rlx, "stage", "--tls-name", "n"] + layers), r"unknown option '--tls-name'",
                 "--tls-name on a stage")
    for flag in ("--max-positions", "--max-connections", "--max-sessions", "--idle-timeout"):
        expect_error(run([rlx, "stage", flag, "0"] + layers), rf"{flag} must be at least 1 \(got 0\)", f"{flag} 0")
    bad = os.path.join(work, "bad-tls.yaml")
    with open(bad, "w") as f:
        f.write("stages:\n  - address: 127.0.0.1:7101\n    tls: {cert: s.pem, key: s.key}\n")
    expect_error(run([rlx, "stage", "--config", bad, "--stage", "0"]),
                 re.escape(f"{bad}:3: stage 0's tls: gives its certificate, but the file has no top-level tls:"),
                 "a stage's tls: without the file's")

    # credentials for a launched pipeline: a token (0600, 32 bytes) and mutual TLS certificates
    certs = os.path.join(work, "certs")
    made = subprocess.run(["sh", os.path.join(REPO, "tests", "transport", "make_certs.sh"), certs],
                          capture_output=True, text=True)
    if made.returncode != 0:
        expect(False, f"make_certs.sh: {made.stderr!r}")
        return
    token = os.path.join(work, "pipeline.token")
    with open(os.open(token, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
        f.write(os.urandom(16).hex() + "\n")
    os.chmod(token, 0o600)
    local = run([rlx, "chat", *CHAT], stdin="Tell me about the city\n")
    want = local.stdout.splitlines()[0] if local.returncode == 0 and local.stdout else None
    expect(want, f"one-process chat: exit {local.returncode}, {local.stderr!r}")
    given = {"--auth-token-file": token, "--tls-ca": f"{certs}/ca.pem", "--tls-cert": f"{certs}/driver.pem",
             "--tls-key": f"{certs}/driver.key"}
    extra = ["--stages", "2", "--tls-name", "localhost"] + [x for kv in given.items() for x in kv]
    stages = chat_over_stages(rlx, extra, want)
    expect(len(stages) == 2, f"--stages 2 launched {len(stages)} stages: {stages}")
    for argv in stages:
        got = {flag: flag_value(argv, flag) for flag in SECURITY_FLAGS}
        expect(got == given and "--tls-name" not in argv and "--insecure-listen" not in argv,
               f"a launched stage's credentials are {got} (want {given}, no --tls-name): {argv}")
    # a deployment file's credentials: a launched stage reads them from the file; a command-line
    # value overrides the file's for the driver and the stages alike
    ports = [free_port() for _ in range(2)]
    cfg = os.path.join(certs, "secure.yaml")
    with open(cfg, "w") as f:
        f.write(f"model: {os.path.join(REPO, 'share', 'models', 'brown', 'target')}\nstages:\n"
                f"  - address: localhost:{ports[0]}\n    listen: 127.0.0.1:{ports[0]}\n"
                f"    tls: {{cert: stage.pem, key: stage.key}}\n"
                f"  - address: localhost:{ports[1]}\n    listen: 127.0.0.1:{ports[1]}\n"
                f"auth: {{token_file: ../pipeline.token}}\n"
                f"tls: {{ca: ca.pem, cert: driver.pem, key: driver.key}}\n"
                f"limits: {{connections: 2, sessions: 8, positions: 4096}}\ntimeouts: {{idle_ms: 60000}}\n")
    stages = chat_over_stages(rlx, ["--config", cfg, "--launch"], want)
    expect(len(stages) == 2 and all(flag_value(a, "--config") == cfg and not set(SECURITY_FLAGS) & set(a)
                                    for a in stages),
           f"the file's stages were launched with credentials of their own: {stages}")
    stages = chat_over_stages(rlx, ["--config", cfg, "--launch", "--tls-cert", f"{certs}/stage.pem",
                                    "--tls-key", f"{certs}/stage.key"], want)
    expect(len(stages) == 2 and all(flag_value(a, "--tls-cert") == f"{certs}/stage.pem" and
                                    flag_value(a, "--tls-key") == f"{certs}/stage.key" and
                                    "--auth-token-file" not in a for a in stages),
           f"--tls-cert and --tls-key did not reach the file's launched stages alone: {stages}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rlx", required=True)
    ap.add_argument("--conformance", required=True)
    ap.add_argument("--workdir", required=True)
    args = ap.parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    check_version_and_help(args.rlx, args.conformance)
    check_spellings(args.rlx, args.workdir)
    check_seeds(args.rlx)
    check_kv_cache_types(args.rlx, args.workdir)
    check_logit_bias(args.rlx)
    check_errors(args.rlx)
    check_llama_spellings(args.rlx)
    check_seed_minus_one(args.rlx)
    check_usage_and_outputs(args.rlx, args.workdir)
    check_model_paths(args.rlx, args.workdir)
    check_stage_standby(args.rlx, args.workdir)
    check_stage_security(args.rlx, args.workdir)
    check_stage_start_line(args.rlx, args.workdir)
    for f in failures:
        print("FAIL:", f)
    print(f"options: {'FAIL' if failures else 'PASS'} ({len(failures)} failures)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
