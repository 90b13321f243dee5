"""What the quantize checks share: the independent GGUF reader and the verdict lines."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "gguf"))
import gguf_ref  # noqa: E402,F401


def verdict(failures):
    """Prints each failure and PASS or FAIL (n); returns the exit status."""
    for f in failures:
        print("FAIL:", f)
    print("PASS" if not failures else f"FAIL ({len(failures)})")
    return 1 if failures else 0
