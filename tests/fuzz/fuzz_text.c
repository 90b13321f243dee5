/* libFuzzer target: text through a real tokenizer (the one in RLX_FUZZ_TOKENIZER, a model folder
 * with tokenizer.json and a chat template in tokenizer_config.json, loaded once).
 * Input: one flag byte, then text. The text is encoded (with or without the special tokens,
 * by the flags) and the ids decoded back; its bytes are also decoded as little-endian ids; and
 * it is cut at NUL bytes into chat messages (each one's first byte picks the role, an 0x01
 * byte in it starts the assistant's reasoning) that the chat template renders, and the
 * rendering is encoded the way a prompt is. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rlx/text.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

enum { FLAG_SPECIAL = 1, FLAG_THINKING = 2, FLAG_GENERATION_PROMPT = 4, FLAG_SKIP_SPECIAL = 8, FLAG_STRICT = 16 };
enum { MAX_MESSAGES = 64 };

static rlx_tokenizer *tok;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    const char *dir = getenv("RLX_FUZZ_TOKENIZER");
    if (!dir || rlx_tokenizer_open(dir, &tok) != RLX_OK) {
        fprintf(stderr, "fuzz_text: set RLX_FUZZ_TOKENIZER to a model folder with a tokenizer: %s\n",
                dir ? rlx_last_error() : "not set");
        exit(2);
    }
    if (rlx_chat_template_of(tok) != RLX_CHAT_TEMPLATE_JINJA) {
        fprintf(stderr, "fuzz_text: %s has no chat template to fuzz\n", dir);
        exit(2);
    }
    return 0;
}

static void encode_decode(const char *text, size_t len, int special, unsigned decode_flags) {
    int32_t *ids = NULL;
    size_t n = 0;
    if (rlx_tokenizer_encode(tok, text, len, special, &ids, &n) != RLX_OK)
        return;
    char *back = NULL;
    size_t back_len = 0;
    if (rlx_tokenizer_decode(tok, ids, n, decode_flags & ~(unsigned)RLX_DECODE_STRICT, &back, &back_len) != RLX_OK) {
        fprintf(stderr, "decoding the %zu ids of encoded text failed: %s\n", n, rlx_last_error());
        abort();
    }
    free(back);
    free(ids);
}

/* The text's bytes as ids, so ids past the vocabulary, negative ones and gaps are decoded too. */
static void decode_bytes(const uint8_t *p, size_t len, unsigned flags) {
    const size_t n = len / sizeof(int32_t);
    int32_t *ids = malloc(n ? n * sizeof *ids : 1);
    if (!ids)
        return;
    memcpy(ids, p, n * sizeof *ids);
    char *text = NULL;
    size_t text_len = 0;
    if (rlx_tokenizer_decode(tok, ids, n, flags, &text, &text_len) == RLX_OK && strlen(text) > text_len) {
        fprintf(stderr, "decode: a %zu-byte result that is not NUL-terminated\n", text_len);
        abort();
    }
    free(text);
    free(ids);
}

static void render(const char *text, size_t len, unsigned flags) {
    static const char *const roles[] = {"system", "user", "assistant", "tool", "narrator"};
    char *copy = malloc(len + 1);
    rlx_chat_message msgs[MAX_MESSAGES];
    size_t n = 0;
    if (!copy)
        return;
    memcpy(copy, text, len);
    copy[len] = '\0';
    for (char *piece = copy; piece <= copy + len && n < MAX_MESSAGES; piece += strlen(piece) + 1) {
        rlx_chat_message *m = &msgs[n++];
        m->role = roles[(uint8_t)piece[0] % 5];
        m->content = piece[0] ? piece + 1 : piece;
        char *reasoning = strchr(m->content, '\x01');
        m->reasoning_content = reasoning ? reasoning + 1 : NULL;
        if (reasoning)
            *reasoning = '\0';
    }
    char *prompt = NULL;
    if (rlx_chat_render(tok, msgs, n, !!(flags & FLAG_GENERATION_PROMPT), !!(flags & FLAG_THINKING), &prompt) == RLX_OK)
        encode_decode(prompt, strlen(prompt), 1, 0);
    free(prompt);
    free(copy);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0)
        return 0;
    const unsigned flags = data[0];
    const char *text = (const char *)data + 1;
    const size_t len = size - 1;
    const unsigned decode_flags =
        (flags & FLAG_SKIP_SPECIAL ? RLX_DECODE_SKIP_SPECIAL : 0) | (flags & FLAG_STRICT ? RLX_DECODE_STRICT : 0);
    encode_decode(text, len, flags & FLAG_SPECIAL, decode_flags);
    decode_bytes(data + 1, len, decode_flags);
    render(text, len, flags);
    return 0;
}
