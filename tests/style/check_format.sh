#!/usr/bin/env bash
# The tree's one C style: every tracked C source, header and .inc is as .clang-format lays it
# out, except the headers frozen on purpose (tests/plugins/abi-1.0, tests/spec/frozen), which
# must stay byte for byte what older plugins were built against. Lists each file that differs.
#   check_format.sh SOURCE_DIR
set -euo pipefail
# shellcheck source=../ci_skip.sh
source "$(dirname "$0")/../ci_skip.sh"
cd "$1"
command -v clang-format >/dev/null || missing_input "clang-format is not installed"
mapfile -t files < <(git ls-files '*.c' '*.h' '*.inc' | grep -v '^tests/plugins/abi-1.0/\|^tests/spec/frozen/')
[ "${#files[@]}" -gt 100 ] || { echo "only ${#files[@]} C files found under $1: not a checkout of rlx?"; exit 1; }
bad=0
for f in "${files[@]}"; do
    if ! clang-format --dry-run --Werror "$f" >/dev/null 2>&1; then
        echo "not formatted: $f (clang-format -i $f)"
        bad=$((bad + 1))
    fi
done
[ "$bad" -eq 0 ] || { echo "$bad of ${#files[@]} files differ from .clang-format"; exit 1; }
echo "ok: ${#files[@]} files as .clang-format lays them out"
