#!/usr/bin/python3
"""Runs llama.cpp's own convert_hf_to_gguf.py, unmodified, on a checkpoint whose BPE
pre-tokenizer the converter cannot recognise, naming that pre-tokenizer instead.

  convert.py --llama-cpp DIR --pre NAME -- CONVERTER_ARGS...

The converter identifies a byte-level BPE pre-tokenizer by hashing the ids the model's tokenizer
gives a fixed check string, and knows only the hashes of the published models it was generated
for (get_vocab_base_pre, written by convert_hf_to_gguf_update.py from downloaded tokenizers).
The Brown tokenizer is trained here, so its hash is unknown and the converter stops with "BPE
pre-tokenizer was not recognized"; its pre-tokenizer is Qwen2's regex (tokenizer.json says so),
which llama.cpp calls `qwen2` (the Brown GGUF files in shared/gguf were written with it). The
smallest hook is that one method: this script replaces TextModel.get_vocab_base_pre, the
converter's per-tokenizer lookup, by one returning NAME, then runs the converter's main() as
`python3 convert_hf_to_gguf.py CONVERTER_ARGS` would. Everything else (tensor names, the Q/K
permutation, metadata, the vocabulary through the `transformers` stand-in in hf_standin/) is the
converter's own code. Run with Debian's /usr/bin/python3 (torch); make_refs.py does.
"""
import argparse
import os
import runpy
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


class AbsentDtype:
    """A torch dtype this torch does not have: equal only to itself, so no tensor has it."""

    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return "torch.%s (absent in torch %s)" % (self.name, sys.modules["torch"].__version__)


def name_missing_fp8_dtypes():
    """Debian 12's torch is 1.13, which predates the FP8 dtypes (torch 2.1). The converter names
    them at import, as keys of its dtype tables and in a test for FP8 checkpoints; an F32
    checkpoint never reaches either, so a placeholder no tensor can have stands in for each."""
    import torch
    for name in ("float8_e4m3fn", "float8_e5m2"):
        if not hasattr(torch, name):
            setattr(torch, name, AbsentDtype(name))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-cpp", required=True, help="a llama.cpp checkout")
    ap.add_argument("--pre", required=True, help="llama.cpp's name of the tokenizer's pre-tokenizer")
    ap.add_argument("converter_args", nargs="+", help="convert_hf_to_gguf.py's arguments, after --")
    args = ap.parse_args()
    converter = os.path.join(args.llama_cpp, "convert_hf_to_gguf.py")
    sys.path[:0] = [os.path.join(HERE, "hf_standin"), args.llama_cpp, os.path.join(args.llama_cpp, "gguf-py")]
    name_missing_fp8_dtypes()
    import conversion.base  # noqa: E402  (llama.cpp's, from the checkout)

    def named_pre(self, tokenizer):
        return args.pre

    conversion.base.TextModel.get_vocab_base_pre = named_pre
    sys.argv = [converter, *args.converter_args]
    runpy.run_path(converter, run_name="__main__")


if __name__ == "__main__":
    main()
