"""What the quantize checks share: the independent GGUF reader, random models with a real
tokenizer beside them, and the verdict lines."""
import os
import shutil
import sys

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(TESTS, "gguf"))
sys.path.insert(0, os.path.join(TESTS, "model"))
import gguf_ref  # noqa: E402,F401
import make_model  # noqa: E402


def random_models(workdir, variants, seed, tokenizer_dir, generator):
    """The test generator's variants {name: (base kind, config changes)} as f32 models in
    workdir (rewritten only when the generator changed), each with tokenizer_dir's tokenizer.json
    and tokenizer_config.json; returns {name: path}."""
    os.makedirs(workdir, exist_ok=True)
    make_model.build_variants(workdir, {n: (base, changes, None, 0) for n, (base, changes) in variants.items()},
                              seed, os.path.abspath(generator))
    out = {}
    for name in variants:
        out[name] = os.path.join(workdir, name)
        for f in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(os.path.join(tokenizer_dir, f), os.path.join(out[name], f))
    return out


def verdict(failures):
    """Prints each failure and PASS or FAIL (n); returns the exit status."""
    for f in failures:
        print("FAIL:", f)
    print("PASS" if not failures else f"FAIL ({len(failures)})")
    return 1 if failures else 0
