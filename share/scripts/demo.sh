#!/usr/bin/env bash
# One command from a fresh Debian 12 machine to a running rlx: installs the Debian packages,
# builds in Release and runs the Brown model that ships with rlx (a 34M-parameter Qwen3 trained
# on the Brown corpus, share/models/brown) through the cpu-blas backend plugin: text in,
# streamed text out, then the same with speculative decoding by its MTP head and its draft model.
# Usage: share/scripts/demo.sh [build-dir]   (default: build)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build}
"$root/share/scripts/install-deps"
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" -j"$(nproc)"
rlx=$build/bin/rlx
echo "== rlx plugins"
"$rlx" plugins
echo "== rlx generate --prompt (sampled)"
"$rlx" generate --prompt "The President said that" -n 48 --temp 0.8 --top-p 0.95 --seed 1 --stats
echo "== rlx generate --greedy, plain and with speculative decoding (same text, fewer target passes)"
"$rlx" generate --prompt "In the morning, the people of the city" -n 96 --greedy --stats
"$rlx" generate --prompt "In the morning, the people of the city" -n 96 --greedy --stats --spec mtp --draft-tokens 3
"$rlx" generate --prompt "In the morning, the people of the city" -n 96 --greedy --stats --spec draft \
    --draft-model "$root/share/models/brown/draft" --draft-tokens 3
echo "== rlx bench"
"$rlx" bench -p 64 -n 32 -r 3
echo "== next: $rlx generate --prompt \"...\"   (or --model DIR for a real Qwen3 checkpoint; see README.md)"
