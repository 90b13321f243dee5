#!/usr/bin/env bash
# One command from a fresh Debian 12 machine to a running rlx: installs the Debian packages,
# builds in Release, writes a small demo model with RANDOM weights in Hugging Face layout, and
# generates from it through the cpu-blas backend plugin.
# Usage: share/scripts/demo.sh [build-dir]   (default: build)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build}
"$root/share/scripts/install-deps"
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" -j"$(nproc)"
model=$build/demo-model
if [ ! -f "$model/config.json" ]; then
    /usr/bin/python3 "$root/tests/golden/make_model.py" --kind dense-tied --dtype bf16 --seed 1 --out "$model"
fi
echo "== plugins"
"$build/bin/rlx" plugins
echo "== greedy continuation of token ids 1,2,3 (the demo model's weights are random)"
"$build/bin/rlx" generate --model "$model" --tokens 1,2,3 -n 16 --greedy --stats
echo "== speed"
"$build/bin/rlx" bench --model "$model" -p 64 -n 32 -r 3
