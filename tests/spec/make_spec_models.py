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
import os
import sys

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "model"))
import make_model  # noqa: E402

TARGET = dict(num_hidden_layers=4, max_window_layers=4)
# name: (base kind, changes, LM head logit std (None: the default), MTP layers)
MODELS = {
    "spec-target": ("dense-tied", TARGET, None, 1),
    "spec-draft": ("dense-tied", dict(num_hidden_layers=1, max_window_layers=1), None, 0),
    "spec-vocab256": ("dense-tied", dict(vocab_size=256, bos_token_id=253, eos_token_id=255), None, 0),
    "spec-tiny": ("dense-tied", dict(vocab_size=16, bos_token_id=14, eos_token_id=15, num_hidden_layers=2,
                                     max_window_layers=2), 1.5, 0),
}
SEED = 23


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    make_model.build_variants(args.out, MODELS, SEED, os.path.abspath(__file__))
    return 0


if __name__ == "__main__":
    sys.exit(main())
