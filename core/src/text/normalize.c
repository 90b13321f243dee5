/* The normalizer steps of a tokenizer.json (NFC, Prepend, Replace), and Replace for the decoder.
 * Each step rewrites the whole text, as tokenizers' NormalizedString does; the encoder applies
 * them to each piece of text between added tokens. */
#include <stdlib.h>
#include <string.h>

#include "text_internal.h"
#include "util/alloc.h"

rlx_status rlx__replace_all(const char *s, size_t len, const char *from, size_t from_len, const char *to, size_t to_len,
                            char **out, size_t *out_len) {
    size_t count = 0;
    for (size_t i = 0; from_len && i + from_len <= len;) {
        if (memcmp(s + i, from, from_len) == 0) {
            count++;
            i += from_len;
        } else {
            i++;
        }
    }
    size_t n = len - count * from_len + count * to_len;
    char *buf = rlx__malloc(n + 1);
    if (!buf)
        return rlx_error(RLX_E_NOMEM, "cannot allocate %zu bytes of normalized text", n);
    size_t o = 0;
    for (size_t i = 0; i < len;) {
        if (count && i + from_len <= len && memcmp(s + i, from, from_len) == 0) {
            memcpy(buf + o, to, to_len);
            o += to_len;
            i += from_len;
        } else {
            buf[o++] = s[i++];
        }
    }
    buf[o] = '\0';
    *out = buf;
    *out_len = o;
    return RLX_OK;
}

static rlx_status apply_step(const rlx_tokenizer *tok, const text_norm_step *step, const char *s, size_t len,
                             char **out, size_t *out_len) {
    const char *a = tok->strings + step->a, *b = tok->strings + step->b;
    switch (step->kind) {
    case TEXT_NORM_NFC:
        return rlx__nfc(s, len, out, out_len);
    case TEXT_NORM_PREPEND: {
        size_t n = len ? step->a_len + len : 0; /* empty text stays empty */
        char *buf = rlx__malloc(n + 1);
        if (!buf)
            return rlx_error(RLX_E_NOMEM, "cannot allocate %zu bytes of normalized text", n);
        if (len) {
            memcpy(buf, a, step->a_len);
            memcpy(buf + step->a_len, s, len);
        }
        buf[n] = '\0';
        *out = buf;
        *out_len = n;
        return RLX_OK;
    }
    case TEXT_NORM_REPLACE:
        return rlx__replace_all(s, len, a, step->a_len, b, step->b_len, out, out_len);
    }
    return rlx_error(RLX_E_INTERNAL, "unknown normalizer step %d", (int)step->kind);
}

rlx_status rlx__normalize(const rlx_tokenizer *tok, const char *s, size_t len, char **out, size_t *out_len) {
    char *cur = NULL;
    size_t cur_len = len;
    *out = NULL;
    *out_len = 0;
    for (int i = 0; i < tok->n_norm; i++) {
        char *next;
        size_t next_len;
        rlx_status st = apply_step(tok, &tok->norm[i], cur ? cur : s, cur_len, &next, &next_len);
        free(cur);
        if (st != RLX_OK)
            return st;
        cur = next;
        cur_len = next_len;
    }
    if (!cur) { /* no steps: a copy, so that the caller always owns the result */
        if (!(cur = rlx__malloc(len + 1)))
            return rlx_error(RLX_E_NOMEM, "cannot allocate %zu bytes of normalized text", len);
        memcpy(cur, s, len);
        cur[len] = '\0';
    }
    *out = cur;
    *out_len = cur_len;
    return RLX_OK;
}
