/* The vocabulary map, string -> id over tok->tokens: the loader (tokenizer.c) fills it, the
 * encoder (encode.c) and the loader look words up, so neither calls into the other for it. */
#include <stdlib.h>
#include <string.h>

#include "text_internal.h"
#include "util/alloc.h"

static uint64_t hash_bytes(const void *p, size_t n) {
    const uint8_t *s = p;
    uint64_t h = 0xcbf29ce484222325ULL;
    for (size_t i = 0; i < n; i++)
        h = (h ^ s[i]) * 0x100000001b3ULL;
    return h ^ (h >> 29);
}

/* A slot holds the high half of the string's hash beside id + 1 (0 = empty), so most probes that
 * miss are settled without touching the strings. */
static void place(uint64_t *slots, size_t cap, uint64_t h, int32_t id) {
    for (size_t i = h & (cap - 1);; i = (i + 1) & (cap - 1))
        if (slots[i] == 0) {
            slots[i] = (h & 0xFFFFFFFF00000000ULL) | ((uint64_t)id + 1);
            return;
        }
}

/* Twice the slots, each entry placed again by its string's hash (a slot keeps only its high half). */
static rlx_status grow(rlx_tokenizer *tok) {
    const size_t cap = tok->vocab_cap ? tok->vocab_cap * 2 : 16;
    uint64_t *slots = rlx__calloc(cap, sizeof *slots);
    if (!slots)
        return rlx_error(RLX_E_NOMEM, "cannot grow the vocabulary map to %zu slots", cap);
    for (size_t i = 0; i < tok->vocab_cap; i++) {
        if (!tok->vocab_slots[i])
            continue;
        const int32_t id = (int32_t)((uint32_t)tok->vocab_slots[i] - 1);
        const text_token *t = &tok->tokens[id];
        place(slots, cap, hash_bytes(tok->strings + t->str, t->str_len), id);
    }
    free(tok->vocab_slots);
    tok->vocab_slots = slots;
    tok->vocab_cap = cap;
    return RLX_OK;
}

/* At most two thirds full: linear probes stay short (about 2 for a hit, 5 for a miss) at 8 bytes
 * a slot, where a map kept half empty would take twice the memory for Qwen3's 151k tokens. */
rlx_status rlx__vocab_insert(rlx_tokenizer *tok, int32_t id) {
    if ((tok->vocab_used + 1) * 3 > tok->vocab_cap * 2) {
        rlx_status st = grow(tok);
        if (st != RLX_OK)
            return st;
    }
    const text_token *t = &tok->tokens[id];
    place(tok->vocab_slots, tok->vocab_cap, hash_bytes(tok->strings + t->str, t->str_len), id);
    tok->vocab_used++;
    return RLX_OK;
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

int rlx__token_bytes(const rlx_tokenizer *tok, int32_t id, const char **bytes, size_t *len) {
    if (id < 0 || id >= tok->n_tokens || !tok->tokens[id].present)
        return -1;
    const text_token *t = &tok->tokens[id];
    *bytes = tok->strings + t->bytes;
    *len = t->bytes_len;
    return t->special;
}
