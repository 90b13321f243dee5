/* libFuzzer target: the tokenizer loader (core/src/text/tokenizer.c) on arbitrary bytes as a
 * model's tokenizer.json. A tokenizer that loads then encodes a fixed text (with and without the
 * special tokens recognised), decodes the ids back at once and one id at a time, and looks up
 * every id's text, so a vocabulary, merge list or added token that the loader accepted but the
 * encoder or decoder trips over is caught. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_files.h"
#include "rlx/text.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Words, digits, spaces of every kind, contractions, special tokens and multi-byte UTF-8:
 * something for every part of Qwen3's pre-tokenizer pattern, and for SentencePiece-style
 * tokenizers the U+2581 space mark, <s>, and characters only byte fallback can spell. */
static const char sample[] = "Hello, world! It's 2024: the\tquick  brown fox's 3 dogs \n\n"
                             "<|im_start|>user\nCafé naïve — 日本語 🤖 <think>\n</think><|im_end|>  "
                             "<s> hello\u2581world</s>\U0010FFFF\xEF\xBB\xBF  ";

/* Decodes ids in one call and through the streaming decoder; both must give the same text. */
static void decode_both(const rlx_tokenizer *tok, const int32_t *ids, size_t n, unsigned flags) {
    char *text = NULL;
    size_t len = 0;
    if (rlx_tokenizer_decode(tok, ids, n, flags, &text, &len) != RLX_OK)
        return;
    rlx_detok *d;
    if (rlx_detok_create(tok, flags, &d) != RLX_OK) {
        free(text);
        return;
    }
    char *streamed = malloc(len + 1);
    size_t got = 0;
    int ok = streamed != NULL;
    const char *piece;
    size_t piece_len;
    for (size_t i = 0; ok && i < n; i++) {
        ok = rlx_detok_push(d, ids[i], &piece, &piece_len) == RLX_OK && got + piece_len <= len;
        if (ok)
            memcpy(streamed + got, piece, piece_len), got += piece_len;
    }
    if (ok && rlx_detok_flush(d, &piece, &piece_len) == RLX_OK && got + piece_len <= len) {
        memcpy(streamed + got, piece, piece_len);
        got += piece_len;
    }
    if (got != len || memcmp(streamed, text, len) != 0) {
        fprintf(stderr, "streamed decoding (%zu bytes) differs from decode (%zu bytes)\n", got, len);
        abort();
    }
    free(streamed);
    rlx_detok_destroy(d);
    free(text);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_write("tokenizer.json", data, size);
    rlx_tokenizer *tok;
    if (rlx_tokenizer_open(fuzz_dir_path(), &tok) != RLX_OK)
        return 0;
    for (int mode = 0; mode < 3; mode++) { /* special tokens as text, parsed, and BOS/EOS added too */
        int32_t *ids = NULL;
        size_t n = 0;
        rlx_encode_options eo = {.size = sizeof eo, .parse_special = mode > 0, .add_special = mode == 2};
        if (rlx_tokenizer_encode_ex(tok, sample, sizeof sample - 1, &eo, &ids, &n, NULL) != RLX_OK)
            continue;
        decode_both(tok, ids, n, 0);
        decode_both(tok, ids, n, RLX_DECODE_SKIP_SPECIAL);
        free(ids);
    }
    const int32_t vocab = rlx_tokenizer_vocab_size(tok);
    volatile size_t sink = 0;
    for (int32_t id = -1; id <= vocab && id < 1 << 16; id++) {
        const char *t = rlx_tokenizer_token_text(tok, id);
        sink += t ? strlen(t) + (size_t)rlx_tokenizer_is_special(tok, id) : 0;
        if (t && rlx_tokenizer_token_id(tok, t) < 0) {
            fprintf(stderr, "token %d '%s' has no id\n", id, t);
            abort();
        }
    }
    (void)sink;
    rlx_tokenizer_close(tok);
    return 0;
}
