#!/bin/sh
# Runs a libFuzzer target for SECONDS on a corpus seeded with SEEDS (copied, since libFuzzer adds
# the inputs it finds to its first corpus directory). Any crash, leak or sanitizer report fails.
# usage: run_fuzz.sh TARGET SEEDS_DIR WORK_DIR SECONDS
set -eu
target=$1 seeds=$2 work=$3 seconds=$4
rm -rf "$work" && mkdir -p "$work/corpus"
cp "$seeds"/* "$work/corpus/"
exec "$target" -max_total_time="$seconds" -timeout=5 -rss_limit_mb=2048 -malloc_limit_mb=1024 \
    -print_final_stats=1 -artifact_prefix="$work/" "$work/corpus"
