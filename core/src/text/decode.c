/* Decoding ids to UTF-8, whole or one token at a time.
 *
 * tokenizers' decode passes every token (added ones too) through the decoder. ByteLevel
 * concatenates the tokens' bytes and turns them into a string with String::from_utf8_lossy,
 * which replaces each maximal invalid subsequence by one U+FFFD; a byte-at-a-time UTF-8 decoder
 * with the same replacement rule (the WHATWG one) gives the same text whether the bytes arrive
 * at once or token by token, which is what the streaming decoder relies on. The other decoders
 * (TEXT) work on token strings: Replace (or Metaspace) is precomputed into each token's bytes,
 * ByteFallback turns a run of <0xNN> tokens into its bytes when they are UTF-8 and into one
 * U+FFFD per byte when not, and Strip (after Fuse) drops leading characters of the whole text. */
#include <stdlib.h>
#include <string.h>

#include "text_internal.h"
#include "util/alloc.h"

typedef struct strbuf {
    char *v;
    size_t n, cap;
} strbuf;

static rlx_status sb_reserve(strbuf *b, size_t more) {
    if (b->n + more + 1 <= b->cap)
        return RLX_OK;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->n + more + 1)
        cap *= 2;
    char *grown = rlx__realloc(b->v, cap);
    if (!grown)
        return rlx_error(RLX_E_NOMEM, "cannot allocate %zu bytes of decoded text", cap);
    b->v = grown;
    b->cap = cap;
    return RLX_OK;
}

static rlx_status sb_add(strbuf *b, const void *p, size_t n) {
    rlx_status st = sb_reserve(b, n);
    if (st == RLX_OK) {
        memcpy(b->v + b->n, p, n);
        b->n += n;
        b->v[b->n] = '\0';
    }
    return st;
}

static const char replacement[3] = {(char)0xEF, (char)0xBF, (char)0xBD}; /* U+FFFD */

// ---- UTF-8 assembly

typedef struct utf8_state {
    uint8_t pending[4];
    uint8_t n_pending; /* bytes of the current sequence seen so far */
    uint8_t needed;    /* continuation bytes still expected */
    uint8_t lo, hi;    /* bounds of the next continuation byte */
} utf8_state;

static rlx_status utf8_feed(utf8_state *u, uint8_t b, strbuf *out) {
    if (u->needed) {
        if (b >= u->lo && b <= u->hi) {
            u->pending[u->n_pending++] = b;
            u->lo = 0x80;
            u->hi = 0xBF;
            if (--u->needed == 0) {
                rlx_status st = sb_add(out, u->pending, u->n_pending);
                u->n_pending = 0;
                return st;
            }
            return RLX_OK;
        }
        /* the sequence so far is a maximal invalid subpart; b starts afresh */
        u->needed = 0;
        u->n_pending = 0;
        rlx_status st = sb_add(out, replacement, 3);
        if (st != RLX_OK)
            return st;
    }
    if (b < 0x80)
        return sb_add(out, &b, 1);
    u->lo = 0x80;
    u->hi = 0xBF;
    if (b >= 0xC2 && b <= 0xDF) {
        u->needed = 1;
    } else if (b >= 0xE0 && b <= 0xEF) {
        u->needed = 2;
        if (b == 0xE0)
            u->lo = 0xA0;
        else if (b == 0xED)
            u->hi = 0x9F;
    } else if (b >= 0xF0 && b <= 0xF4) {
        u->needed = 3;
        if (b == 0xF0)
            u->lo = 0x90;
        else if (b == 0xF4)
            u->hi = 0x8F;
    } else {
        return sb_add(out, replacement, 3);
    }
    u->pending[0] = b;
    u->n_pending = 1;
    return RLX_OK;
}

static rlx_status utf8_finish(utf8_state *u, strbuf *out) {
    if (!u->needed)
        return RLX_OK;
    u->needed = 0;
    u->n_pending = 0;
    return sb_add(out, replacement, 3);
}

/* The decoder's state across the ids of one text. */
typedef struct dec_state {
    utf8_state u; /* ByteLevel: the UTF-8 sequence being assembled */
    uint8_t *run; /* ByteFallback: the bytes of the current run of <0xNN> tokens */
    size_t run_n, run_cap;
    uint32_t strip_left; /* Strip: leading characters that may still be dropped */
    size_t n_tokens;     /* tokens the decoder has seen (Metaspace treats the first apart) */
} dec_state;

static void dec_reset(const rlx_tokenizer *tok, dec_state *d) {
    memset(&d->u, 0, sizeof d->u);
    d->run_n = 0;
    d->strip_left = tok->dec_strip;
    d->n_tokens = 0;
}

/* Appends text, less what Strip still drops from the start of the whole text. */
static rlx_status emit(const rlx_tokenizer *tok, dec_state *d, const char *p, size_t n, strbuf *out) {
    const size_t cl = tok->dec_strip_len;
    while (d->strip_left && n >= cl && memcmp(p, tok->dec_strip_char, cl) == 0) {
        p += cl;
        n -= cl;
        d->strip_left--;
    }
    if (n)
        d->strip_left = 0;
    return sb_add(out, p, n);
}

/* ByteFallback ends a run of byte tokens: its bytes if they are UTF-8, else one U+FFFD a byte. */
static rlx_status flush_run(const rlx_tokenizer *tok, dec_state *d, strbuf *out) {
    rlx_status st = RLX_OK;
    if (d->run_n && rlx__utf8_check(d->run, d->run_n) == d->run_n)
        st = emit(tok, d, (const char *)d->run, d->run_n, out);
    else
        for (size_t i = 0; i < d->run_n && st == RLX_OK; i++)
            st = emit(tok, d, replacement, 3, out);
    d->run_n = 0;
    return st;
}

/* What the end of the ids adds: a held run or UTF-8 sequence. */
static rlx_status dec_finish(const rlx_tokenizer *tok, dec_state *d, strbuf *out) {
    return tok->decode_kind == TEXT_DECODE_TEXT ? flush_run(tok, d, out) : utf8_finish(&d->u, out);
}

/* A TEXT decoder's token: Replace (or Metaspace) already applied to its bytes, ByteFallback
 * runs collected, Strip on what is emitted. */
static rlx_status decode_text(const rlx_tokenizer *tok, dec_state *d, const text_token *t, strbuf *out) {
    const int first = d->n_tokens++ == 0;
    if (t->fallback) {
        if (d->run_n == d->run_cap) {
            size_t cap = d->run_cap ? d->run_cap * 2 : 16;
            uint8_t *grown = rlx__realloc(d->run, cap);
            if (!grown)
                return rlx_error(RLX_E_NOMEM, "cannot allocate %zu bytes of byte tokens", cap);
            d->run = grown;
            d->run_cap = cap;
        }
        d->run[d->run_n++] = (uint8_t)tok->strings[t->bytes];
        return RLX_OK;
    }
    rlx_status st = flush_run(tok, d, out);
    if (st != RLX_OK)
        return st;
    if (first && tok->dec_metaspace_first) { /* the first token's replacement characters vanish */
        char *text;
        size_t len;
        if ((st = rlx__replace_all(tok->strings + t->str, t->str_len, tok->dec_ms_rep, tok->dec_ms_rep_len, "", 0,
                                   &text, &len)) != RLX_OK)
            return st;
        st = emit(tok, d, text, len, out);
        free(text);
        return st;
    }
    return emit(tok, d, tok->strings + t->bytes, t->bytes_len, out);
}

/* Appends what id adds to the text. */
static rlx_status decode_one(const rlx_tokenizer *tok, unsigned flags, dec_state *d, int32_t id, strbuf *out) {
    if (id < 0 || id >= tok->n_tokens || !tok->tokens[id].present) {
        if (flags & RLX_DECODE_STRICT)
            return rlx_error(RLX_E_RANGE, "token id %d is not in the vocabulary (%d ids)", id, tok->n_tokens);
        return RLX_OK;
    }
    const text_token *t = &tok->tokens[id];
    if (t->added && t->special && (flags & RLX_DECODE_SKIP_SPECIAL))
        return RLX_OK;
    if (tok->decode_kind == TEXT_DECODE_TEXT)
        return decode_text(tok, d, t, out);
    if (t->added) {
        rlx_status st = utf8_finish(&d->u, out);
        return st == RLX_OK ? sb_add(out, tok->strings + t->bytes, t->bytes_len) : st;
    }
    const uint8_t *p = (const uint8_t *)tok->strings + t->bytes;
    rlx_status st = sb_reserve(out, t->bytes_len + 3);
    for (uint32_t i = 0; i < t->bytes_len && st == RLX_OK; i++)
        st = utf8_feed(&d->u, p[i], out);
    return st;
}

rlx_status rlx_tokenizer_decode(const rlx_tokenizer *tok, const int32_t *ids, size_t n, unsigned flags, char **text,
                                size_t *len) {
    if (text)
        *text = NULL;
    if (len)
        *len = 0;
    if (!tok || !text || (!ids && n))
        return rlx_error(RLX_E_INVALID, "rlx_tokenizer_decode: NULL argument");
    strbuf out = {0};
    dec_state d = {0};
    dec_reset(tok, &d);
    rlx_status st = sb_reserve(&out, n * 4);
    for (size_t i = 0; i < n && st == RLX_OK; i++)
        st = decode_one(tok, flags, &d, ids[i], &out);
    if (st == RLX_OK)
        st = dec_finish(tok, &d, &out);
    free(d.run);
    if (st != RLX_OK) {
        free(out.v);
        return st;
    }
    out.v[out.n] = '\0';
    *text = out.v;
    if (len)
        *len = out.n;
    return RLX_OK;
}

// ---- streaming

struct rlx_detok {
    const rlx_tokenizer *tok;
    unsigned flags;
    dec_state d;
    strbuf out;
};

rlx_status rlx_detok_create(const rlx_tokenizer *tok, unsigned flags, rlx_detok **out) {
    if (!out)
        return rlx_error(RLX_E_INVALID, "rlx_detok_create: out is NULL");
    *out = NULL;
    if (!tok)
        return rlx_error(RLX_E_INVALID, "rlx_detok_create: tokenizer is NULL");
    rlx_detok *d = rlx__calloc(1, sizeof *d);
    if (!d || sb_reserve(&d->out, 64) != RLX_OK) {
        free(d);
        return rlx_error(RLX_E_NOMEM, "cannot allocate a streaming decoder");
    }
    d->tok = tok;
    d->flags = flags;
    dec_reset(tok, &d->d);
    *out = d;
    return RLX_OK;
}

void rlx_detok_destroy(rlx_detok *d) {
    if (!d)
        return;
    free(d->out.v);
    free(d->d.run);
    free(d);
}

rlx_status rlx_detok_push(rlx_detok *d, int32_t id, const char **text, size_t *len) {
    if (!d || !text || !len)
        return rlx_error(RLX_E_INVALID, "rlx_detok_push: NULL argument");
    d->out.n = 0;
    d->out.v[0] = '\0';
    rlx_status st = decode_one(d->tok, d->flags, &d->d, id, &d->out);
    *text = d->out.v;
    *len = st == RLX_OK ? d->out.n : 0;
    if (st != RLX_OK)
        d->out.v[0] = '\0';
    return st;
}

rlx_status rlx_detok_flush(rlx_detok *d, const char **text, size_t *len) {
    if (!d || !text || !len)
        return rlx_error(RLX_E_INVALID, "rlx_detok_flush: NULL argument");
    d->out.n = 0;
    d->out.v[0] = '\0';
    rlx_status st = dec_finish(d->tok, &d->d, &d->out);
    dec_reset(d->tok, &d->d);
    *text = d->out.v;
    *len = st == RLX_OK ? d->out.n : 0;
    return st;
}
