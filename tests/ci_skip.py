"""A test's skip for want of an input CI installs or builds (clang-format, tmux, node and npm,
chromium, the llama.cpp files in ../shared beside the checkout, a transport plugin): outside CI
it is a skip, exit 77 (ctest's SKIP_RETURN_CODE), saying what is missing; under CI=true it is a
failure, since a CI run that skips such a test tests nothing there and must not pass.
share/scripts/install-deps installs the tools; ci_skip.sh is the same rule for shell tests.

A skip for what CI is not meant to have (an ISA level this CPU lacks, root for network
namespaces) stays a plain skip and does not come here.

    sys.path.insert(0, os.path.join(HERE, ".."))   # tests/
    from ci_skip import missing_input
    if not shutil.which("tmux"):
        return missing_input("tmux is not installed")
"""
import os

SKIP = 77


def under_ci():
    return os.environ.get("CI") == "true"


def missing_input(what):
    """Says what is missing and returns the exit status: 77 outside CI, 1 under CI=true."""
    if under_ci():
        print(f"FAIL missing input under CI=true: {what} (CI must have it: share/scripts/install-deps installs "
              "the tools, the build makes the plugins, CI clones the llama.cpp files into ../shared)", flush=True)
        return 1
    print(f"SKIPPED: missing input: {what}", flush=True)
    return SKIP
