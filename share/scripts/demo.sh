#!/usr/bin/env bash
# One command from a fresh Debian 12 machine to a running rlx: installs the Debian packages,
# builds in Release, writes the demo model (a small Qwen3 with RANDOM weights and the real Qwen3
# tokenizer) and runs it through the cpu-blas backend plugin: text in, streamed text out.
# Usage: share/scripts/demo.sh [build-dir]   (default: build)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build}
"$root/share/scripts/install-deps"
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" -j"$(nproc)"
"$root/share/scripts/make-demo-model.sh" "$build/demo-model"
rlx=$build/bin/rlx
echo "== rlx plugins"
"$rlx" plugins
echo "== rlx generate --prompt (the demo model's weights are random: expect gibberish, not language)"
"$rlx" generate --prompt "The capital of France is" -n 24 --temp 0.8 --top-p 0.95 --seed 1 --stats
echo "== rlx generate --tokens (token ids in, ids out)"
"$rlx" generate --tokens 785,6722,315,9625,374 -n 12 --greedy
echo "== rlx bench"
"$rlx" bench -p 64 -n 32 -r 3
echo "== next: $rlx chat   (or --model DIR for a real Qwen3 checkpoint; see README.md)"
