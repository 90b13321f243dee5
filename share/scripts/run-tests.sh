#!/usr/bin/env bash
# Installs what rlx needs, builds it with AddressSanitizer and UndefinedBehaviorSanitizer, and
# runs every test (unit, plugin, conformance, golden against the NumPy reference, bad input).
# Usage: share/scripts/run-tests.sh [build-dir]   (default: build-asan)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build-asan}
"$root/share/scripts/install-deps"
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DRLX_SANITIZE=ON >/dev/null
cmake --build "$build" -j"$(nproc)"
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
# c-ares (under gRPC) leaks a few bytes per /etc/hosts lookup; nothing else is suppressed
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$root/tests/transport/lsan.supp}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
# NumPy's OpenBLAS runs a spinning thread per core: two NumPy references at once on two cores
# (ctest -j2) made a 6 s reference self-check take 150 s. rlx's backends and the benchmarks set
# their own OpenBLAS thread counts.
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}
cd "$build"
status=0
ctest --output-on-failure -j2 2>&1 || status=$?
# ctest lists skipped tests without their output: say why each was skipped (a CPU without an
# ISA level the suite would test, for example)
grep -h "^SKIPPED: " Testing/Temporary/LastTest.log 2>/dev/null | sort | uniq -c | sed 's/^ */skipped tests: /' || true
# a test skipped for want of something this script installs or builds (clang-format, tmux, the
# llama.cpp files beside the checkout, a plugin) tests nothing: in CI that is a failure
if [ "${CI:-}" = true ] && grep -q "^SKIPPED: missing input: " Testing/Temporary/LastTest.log 2>/dev/null; then
    echo "CI=true: tests were skipped for a missing input (above); CI must have every input" >&2
    status=1
fi
exit "$status"
