#!/bin/sh
# Runs a libFuzzer target for SECONDS on a corpus seeded from the SEED_DIRs (copied, since
# libFuzzer adds the inputs it finds to its first corpus directory), with the dictionary DICT
# when given (a file, or "-" for none). Any crash, leak, timeout (an input taking over 5 s) or
# sanitizer report fails, and the input that caused it is left in WORK_DIR as crash-*, leak-*,
# timeout-* or oom-* (docs/fuzzing.md).
# usage: run_fuzz.sh TARGET WORK_DIR SECONDS DICT SEED_DIR...
set -eu
target=$1 work=$2 seconds=$3 dict=$4
shift 4
rm -rf "$work" && mkdir -p "$work/corpus"
for seeds in "$@"; do
    cp "$seeds"/* "$work/corpus/"
done
set -- -max_total_time="$seconds" -timeout=5 -rss_limit_mb=2048 -malloc_limit_mb=1024 -print_final_stats=1 \
    -artifact_prefix="$work/"
[ "$dict" = - ] || set -- "$@" -dict="$dict"
exec "$target" "$@" "$work/corpus"
