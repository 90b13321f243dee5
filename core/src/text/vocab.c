/* The vocabulary map, string -> id over tok->tokens: the loader (tokenizer.c) fills it, the
 * encoder (encode.c) and the loader look words up, so neither calls into the other for it. */
#include <string.h>

#include "text_internal.h"

static uint64_t hash_bytes(const void *p, size_t n) {
    const uint8_t *s = p;
    uint64_t h = 0xcbf29ce484222325ULL;
    for (size_t i = 0; i < n; i++)
        h = (h ^ s[i]) * 0x100000001b3ULL;
    return h ^ (h >> 29);
}

/* A slot holds the high half of the string's hash beside id + 1 (0 = empty), so most probes that
 * miss are settled without touching the strings. */
rlx_status rlx__vocab_insert(rlx_tokenizer *tok, int32_t id) {
    const text_token *t = &tok->tokens[id];
    uint64_t h = hash_bytes(tok->strings + t->str, t->str_len);
    size_t mask = tok->vocab_cap - 1;
    for (size_t i = h & mask;; i = (i + 1) & mask) {
        if (tok->vocab_slots[i] == 0) {
            tok->vocab_slots[i] = (h & 0xFFFFFFFF00000000ULL) | ((uint64_t)id + 1);
            return RLX_OK;
        }
    }
}

int32_t rlx__vocab_find(const rlx_tokenizer *tok, const char *s, size_t len) {
    uint64_t h = hash_bytes(s, len), tag = h & 0xFFFFFFFF00000000ULL;
    size_t mask = tok->vocab_cap - 1;
    for (size_t i = h & mask;; i = (i + 1) & mask) {
        uint64_t slot = tok->vocab_slots[i];
        if (slot == 0)
            return -1;
        if ((slot & 0xFFFFFFFF00000000ULL) != tag)
            continue;
        uint32_t id = (uint32_t)slot - 1;
        const text_token *t = &tok->tokens[id];
        if (t->str_len == len && memcmp(tok->strings + t->str, s, len) == 0)
            return (int32_t)id;
    }
}
