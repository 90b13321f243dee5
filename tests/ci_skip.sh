# Sourced by shell tests: missing_input WHAT ends the test for want of an input CI installs, as
# tests/ci_skip.py does for Python tests: a skip (exit 77) outside CI, a failure under CI=true.
missing_input() {
    if [ "${CI:-}" = true ]; then
        echo "FAIL missing input under CI=true: $1 (CI must have it: share/scripts/install-deps installs the tools)"
        exit 1
    fi
    echo "SKIPPED: missing input: $1"
    exit 77
}
