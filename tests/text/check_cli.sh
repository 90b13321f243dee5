#!/usr/bin/env bash
# `rlx tokenize` and `rlx detokenize` against Hugging Face's ids, and their errors.
# usage: check_cli.sh RLX MODEL_DIR CASES_DIR WORK_DIR   (CASES_DIR as make_cases.js writes it)
set -u
rlx=$1 model=$2 cases=$3 work=$4
mkdir -p "$work"
passed=0 failed=0
ok() { passed=$((passed + 1)); }
bad() { failed=$((failed + 1)); echo "FAIL: $*"; }

# expect_out NAME WANT CMD...: stdout must be WANT and the exit status 0
expect_out() {
    local name=$1 want=$2
    shift 2
    local got
    got=$("$@" 2>"$work/err") || { bad "$name: exit $? ($(cat "$work/err"))"; return; }
    [ "$got" = "$want" ] && ok || bad "$name: got '${got:0:200}', want '${want:0:200}'"
}

# expect_fail NAME PATTERN CMD...: exit 1 with one stderr line "rlx: ..." matching PATTERN
expect_fail() {
    local name=$1 pattern=$2
    shift 2
    "$@" >/dev/null 2>"$work/err"
    local rc=$?
    local lines
    lines=$(wc -l <"$work/err")
    if [ "$rc" -ne 1 ]; then bad "$name: exit $rc, want 1"; return; fi
    if [ "$lines" -ne 1 ] || ! grep -q "^rlx: .*$pattern" "$work/err"; then
        bad "$name: stderr '$(cat "$work/err")' is not one 'rlx: ...$pattern...' line"
        return
    fi
    ok
}

# The whole corpus through --file, and back through detokenize.
expect_out "tokenize --file corpus" "$(cat "$cases/corpus_all.ids")" "$rlx" tokenize --model "$model" --file "$cases/corpus_all.txt"
ids=$(tr ' ' ',' <"$cases/corpus_all.ids")
"$rlx" detokenize --model "$model" --ids "$ids" >"$work/roundtrip.txt" 2>"$work/err" &&
    cmp -s "$work/roundtrip.txt" "$cases/corpus_all.txt" && ok || bad "detokenize corpus: text differs ($(cat "$work/err"))"
# stdin, special tokens, --no-special, --skip-special (ids checked with Hugging Face's tokenizers)
expect_out "tokenize stdin" "14990 1879" sh -c "printf 'hello world' | '$rlx' tokenize --model '$model' --file -"
expect_out "tokenize special" "6023 151645 18532" "$rlx" tokenize --model "$model" --text "hi<|im_end|>there"
expect_out "tokenize --no-special" "6023 27 91 318 6213 91 29 18532" "$rlx" tokenize --model "$model" --no-special --text "hi<|im_end|>there"
expect_out "tokenize think" "151667 198 151668" "$rlx" tokenize --model "$model" --no-special --text $'<think>\n</think>'
expect_out "tokenize empty" "" "$rlx" tokenize --model "$model" --text ""
expect_out "detokenize" "hi<|im_end|>there" "$rlx" detokenize --model "$model" --ids 6023,151645,18532
expect_out "detokenize --skip-special" "hithere" "$rlx" detokenize --model "$model" --skip-special --ids 6023,151645,18532
expect_out "options before the verb" "6023" "$rlx" --model "$model" tokenize --text hi
# --add-special: the BOS the model's files ask for (Hugging Face's add_special_tokens=True): none for
# Qwen3, Llama 3.1's from its TemplateProcessing, the Llama 2-style one's from add_bos_token
expect_out "tokenize --add-special qwen3" "14990 1879" "$rlx" tokenize --model "$model" --add-special --text "hello world"
llama31="$model/../../tokenizer-llama3_1/models" llama2="$model/../../tokenizer-llama2/models"
expect_out "tokenize --add-special llama3.1" "128000 9906 1917" "$rlx" tokenize --model "$llama31" --add-special --text "Hello world"
expect_out "tokenize llama3.1" "9906 1917" "$rlx" tokenize --model "$llama31" --text "Hello world"
expect_out "tokenize --add-special llama2" "1 22557 1526" "$rlx" tokenize --model "$llama2" --add-special --text "Hello world"
expect_out "tokenize --help" "usage: rlx tokenize [-m PATH] (-p TEXT | -f FILE) [--no-special] [--add-special]" sh -c "'$rlx' tokenize --help | head -1"
expect_out "detokenize --help" "usage: rlx detokenize [-m PATH] --ids 1,2,3 [--skip-special]" sh -c "'$rlx' detokenize --help | head -1"

# Errors: one clear line, exit status 1.
mkdir -p "$work/empty-model" "$work/broken-model"
echo '{"model": ' >"$work/broken-model/tokenizer.json"
printf 'ab\xffcd' >"$work/invalid.txt"
expect_fail "no tokenizer.json" "empty-model/tokenizer.json: No such file" "$rlx" tokenize --model "$work/empty-model" --text hi
expect_fail "malformed tokenizer.json" "broken-model/tokenizer.json: malformed JSON" "$rlx" tokenize --model "$work/broken-model" --text hi
expect_fail "invalid UTF-8" "offset 2" "$rlx" tokenize --model "$model" --file "$work/invalid.txt"
expect_fail "missing file" "cannot open" "$rlx" tokenize --model "$model" --file "$work/nope.txt"
expect_fail "\$RLX_MODEL without a tokenizer" "/nonexistent-model" env RLX_MODEL=/nonexistent-model "$rlx" tokenize --text hi
expect_fail "no text" "exactly one of --prompt (or --text) and --file" "$rlx" tokenize --model "$model"
expect_fail "both text and file" "exactly one of --prompt (or --text) and --file" "$rlx" tokenize --model "$model" --text a --file b
expect_fail "unknown option" "unknown option '--bogus'" "$rlx" tokenize --model "$model" --bogus
expect_fail "unknown id" "token id 999999 is not in the vocabulary" "$rlx" detokenize --model "$model" --ids 1,999999
expect_fail "bad id list" "--ids: '1,x' is not a list of token ids" "$rlx" detokenize --model "$model" --ids 1,x
expect_fail "bad id list named as given" "--tokens: '1 x' is not a list of token ids" "$rlx" detokenize --model "$model" --tokens "1 x"
# what tokenize prints is taken as it is (spaces), and with commas, spaces and newlines mixed
"$rlx" detokenize --model "$model" --ids "$(cat "$cases/corpus_all.ids")" >"$work/roundtrip2.txt" 2>"$work/err" &&
    cmp -s "$work/roundtrip2.txt" "$cases/corpus_all.txt" && ok || bad "detokenize of tokenize's output: text differs ($(cat "$work/err"))"
expect_out "detokenize mixed separators" "hi<|im_end|>there" "$rlx" detokenize --model "$model" --ids "$(printf ' 6023, 151645\n18532 ')"

# generate takes its prompt from a file or standard input (one final newline dropped, as
# llama.cpp's -f does) and names the GGUF files it does not read yet; the default model
prompt="In the morning, the people of the city"
want=$("$rlx" generate --prompt "$prompt" -n 12 --greedy 2>/dev/null)
printf '%s\n' "$prompt" >"$work/prompt.txt"
expect_out "generate -f" "$want" "$rlx" generate -f "$work/prompt.txt" -n 12 --greedy
expect_out "generate -f -" "$want" sh -c "'$rlx' generate -f - -n 12 --greedy <'$work/prompt.txt'"
expect_out "generate -p" "$want" "$rlx" generate -p "$prompt" -n 12 --greedy
ids=$("$rlx" tokenize --text "$prompt")
expect_out "generate --tokens from tokenize" "$("$rlx" generate --tokens "$(echo "$ids" | tr ' ' ',')" -n 4 --greedy)" \
    "$rlx" generate --tokens "$ids" -n 4 --greedy
expect_fail "generate -f and --prompt" "exactly one of --tokens, --prompt and -f" "$rlx" generate -f "$work/prompt.txt" --prompt x
expect_fail "generate -f missing" "generate: cannot open $work/none.txt" "$rlx" generate -f "$work/none.txt"
printf 'GGUF\003\000\000\000' >"$work/model.gguf"
expect_fail "a truncated GGUF model" "model.gguf: truncated file: the tensor count at byte 8" \
    "$rlx" generate --model "$work/model.gguf" --prompt hi
expect_fail "a file as the model" "prompt.txt is a file, but neither a GGUF file nor a model directory" \
    "$rlx" generate --model "$work/prompt.txt" --prompt hi
expect_fail "no ids" "--ids is required" "$rlx" detokenize --model "$model"

echo "text cli: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
