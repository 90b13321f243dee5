#!/usr/bin/python3
"""Models for the speculative decoding tests: make_spec_models.py --out DIR writes

  DIR/spec-target     the target: dense, tied embeddings, 4 layers, vocab 512, and one MTP layer
                      in its safetensors for the MTP speculator
  DIR/spec-draft      its first layer alone (same seed, so the embedding, layer 0, the final
                      norm and the LM head are the target's): a draft that often agrees
  DIR/spec-vocab256   a draft with another vocabulary, which the draft plugin must refuse
  DIR/spec-tiny       vocab 16 with flatter logits, for the chi-square test of the sampled
                      distribution (every token has a probability worth counting)

Rewritten only when the generator changes."""
import argparse
import hashlib
import os
import shutil
import sys

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
GOLDEN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "golden")
sys.path.insert(0, GOLDEN)
import make_model  # noqa: E402

TARGET = dict(num_hidden_layers=4, max_window_layers=4)
# name: (base kind, changes, LM head logit std, MTP layers)
MODELS = {
    "spec-target": ("dense-tied", TARGET, make_model.LOGIT_STD, 1),
    "spec-draft": ("dense-tied", dict(num_hidden_layers=1, max_window_layers=1), make_model.LOGIT_STD, 0),
    "spec-vocab256": ("dense-tied", dict(vocab_size=256, bos_token_id=253, eos_token_id=255), make_model.LOGIT_STD,
                      0),
    "spec-tiny": ("dense-tied", dict(vocab_size=16, bos_token_id=14, eos_token_id=15, num_hidden_layers=2,
                                     max_window_layers=2), 1.5, 0),
}
SEED = 23


def digest():
    h = hashlib.sha256()
    for path in (os.path.join(GOLDEN, "make_model.py"), os.path.join(GOLDEN, "st.py"), __file__):
        with open(path, "rb") as f:
            h.update(f.read())
    return h.hexdigest()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    want = digest() + "\n"
    for name, (base, changes, logit_std, mtp_layers) in MODELS.items():
        out = os.path.join(args.out, name)
        stamp = os.path.join(out, ".rlx-stamp")
        if os.path.exists(stamp) and open(stamp).read() == want:
            continue
        shutil.rmtree(out, ignore_errors=True)
        make_model.KINDS[name] = dict(make_model.KINDS[base], **changes)
        make_model.LOGIT_STD = logit_std
        make_model.build(name, "f32", 1, SEED, out, mtp_layers)
        with open(stamp, "w") as f:
            f.write(want)
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
