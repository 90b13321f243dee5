"""The part of Hugging Face `transformers` that llama.cpp's convert_hf_to_gguf.py touches when it
converts the checkpoints of tests/llamacpp: nothing more, and only on the converter's PYTHONPATH
(make_refs.py puts it there; nothing in rlx or its tests imports it).

Why it exists: the converter imports `transformers` at module level (AutoConfig) and reads a
byte-level BPE vocabulary through AutoTokenizer, but transformers is not packaged in Debian 12
and PyPI is not reachable from this machine. What the converter uses from them is plain data from
the checkpoint's own files, so this module reads those files directly:
  - AutoConfig.from_pretrained(dir).to_dict(): config.json as written. make_model.py writes every
    field transformers would fill in with a default, so the real to_dict() gives the same keys
    for these checkpoints.
  - AutoTokenizer.from_pretrained(dir): tokenizer.json's vocabulary with the added tokens
    (`vocab`), `get_added_vocab()`, `added_tokens_decoder` (id -> token with `content`,
    `special`, `normalized`), and encode/decode of an added token's own text, which the
    converter round-trips for every added token that is not normalized.
Encoding ordinary text is not provided: the converter uses it only to hash its pre-tokenizer
check string, and make_refs.py names the pre-tokenizer instead (see convert.py there). Any other
use raises NotImplementedError, so a converter that starts needing more fails loudly instead of
writing a file from made-up data.
"""
import json
import os


class AutoConfig:
    def __init__(self, config):
        self._config = config

    @classmethod
    def from_pretrained(cls, path, **_):
        with open(os.path.join(path, "config.json"), encoding="utf-8") as f:
            return cls(json.load(f))

    def to_dict(self):
        return dict(self._config)


class AddedToken:
    def __init__(self, entry):
        self.content = entry["content"]
        self.special = entry.get("special", False)
        self.normalized = entry.get("normalized", not self.special)
        self.lstrip = entry.get("lstrip", False)
        self.rstrip = entry.get("rstrip", False)
        self.single_word = entry.get("single_word", False)


class _Tokenizer:
    is_fast = True

    def __init__(self, tokenizer_json):
        model = tokenizer_json["model"]
        if model.get("type") != "BPE":
            raise NotImplementedError("this stand-in reads BPE tokenizer.json files only, not %r" % model.get("type"))
        self.vocab = dict(model["vocab"])
        self.added_tokens_decoder = {}
        for entry in tokenizer_json.get("added_tokens", []):
            self.vocab[entry["content"]] = entry["id"]
            self.added_tokens_decoder[entry["id"]] = AddedToken(entry)
        self._added = {t.content: i for i, t in self.added_tokens_decoder.items()}

    def get_vocab(self):
        return dict(self.vocab)

    def get_added_vocab(self):
        return dict(self._added)

    def encode(self, text, add_special_tokens=True):
        if text in self._added:
            return [self._added[text]]
        raise NotImplementedError("the transformers stand-in encodes added tokens only, not %r" % text[:40])

    def decode(self, ids, **_):
        by_id = {i: t.content for i, t in self.added_tokens_decoder.items()}
        if not all(i in by_id for i in ids):
            raise NotImplementedError("the transformers stand-in decodes added tokens only, not %r" % (ids,))
        return "".join(by_id[i] for i in ids)


class AutoTokenizer:
    @staticmethod
    def from_pretrained(path, **_):
        with open(os.path.join(path, "tokenizer.json"), encoding="utf-8") as f:
            return _Tokenizer(json.load(f))
