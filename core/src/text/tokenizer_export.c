/* The GGUF writer's view of a tokenizer (tokenizer_export.h). */
#include <stdlib.h>
#include <string.h>

#include "text_internal.h"
#include "tokenizer_export.h"
#include "util/alloc.h"

const char *rlx__tokenizer_token(const rlx_tokenizer *tok, int32_t id, size_t *len, int *type) {
    if (!tok || id < 0 || id >= tok->n_tokens || !tok->tokens[id].present)
        return NULL;
    const text_token *t = &tok->tokens[id];
    const char *s = tok->strings + t->str;
    *len = t->str_len;
    /* llama.cpp's converter also counts an added token that looks like one ("<|...|>") as control */
    const int looks_special = t->str_len >= 4 && memcmp(s, "<|", 2) == 0 && memcmp(s + t->str_len - 2, "|>", 2) == 0;
    *type = !t->added ? 1 : t->special || looks_special ? 3 : 4;
    return s;
}

typedef struct ranked {
    uint32_t rank;
    int32_t a, b;
} ranked;

static int cmp_rank(const void *x, const void *y) {
    const ranked *p = x, *q = y;
    return (p->rank > q->rank) - (p->rank < q->rank);
}

rlx_status rlx__tokenizer_merges(const rlx_tokenizer *tok, int32_t **pairs, size_t *n) {
    size_t count = 0;
    for (size_t i = 0; i < tok->merge_cap; i++)
        count += tok->merge_keys[i] != UINT64_MAX;
    ranked *r = rlx__malloc((count ? count : 1) * sizeof *r);
    int32_t *out = rlx__malloc((count ? count : 1) * 2 * sizeof *out);
    if (!r || !out) {
        free(r);
        free(out);
        return rlx_error(RLX_E_NOMEM, "cannot allocate the list of %zu merges", count);
    }
    size_t k = 0;
    for (size_t i = 0; i < tok->merge_cap; i++) {
        const uint64_t key = tok->merge_keys[i];
        if (key != UINT64_MAX)
            r[k++] = (ranked){tok->merge_rank[i], (int32_t)(key >> 32), (int32_t)(uint32_t)key};
    }
    qsort(r, count, sizeof *r, cmp_rank);
    for (size_t i = 0; i < count; i++) {
        out[2 * i] = r[i].a;
        out[2 * i + 1] = r[i].b;
    }
    free(r);
    *pairs = out;
    *n = count;
    return RLX_OK;
}

const char *rlx__tokenizer_chat_template(const rlx_tokenizer *tok) { return tok ? tok->chat_template : NULL; }
