/* Encoding: added-token splitting, the normalizer, the pre-tokenizer and BPE.
 *
 * The order of steps and every tie-break follow tokenizers' TokenizerImpl::encode_single_sequence:
 * AddedVocabulary::extract_and_normalize, then the pre-tokenizer (Split regex, Metaspace, or the
 * piece whole), then BPE::merge_word with its priority queue (lowest rank first, then leftmost;
 * stale entries dropped when the pair at their position no longer yields the same token). With
 * ByteLevel, words are BPE'd from their raw bytes: the alphabet is a bijection, so byte i of a
 * word is the symbol "bytes_to_unicode(i)". Without it a word's symbols are its characters, as
 * the vocabulary spells them, with byte fallback or the unknown token for the others. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <utf8proc.h>

#include "text_internal.h"
#include "util/alloc.h"
#include "util/sized.h"

// ---- output ids

typedef struct ids_buf {
    int32_t *v;
    size_t n, cap;
} ids_buf;

static rlx_status ids_reserve(ids_buf *b, size_t more) {
    if (b->n + more <= b->cap)
        return RLX_OK;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->n + more)
        cap *= 2;
    int32_t *grown = rlx__realloc(b->v, cap * sizeof *grown);
    if (!grown)
        return rlx_error(RLX_E_NOMEM, "cannot allocate %zu token ids", cap);
    b->v = grown;
    b->cap = cap;
    return RLX_OK;
}

static rlx_status ids_push(ids_buf *b, int32_t id) {
    rlx_status st = ids_reserve(b, 1);
    if (st == RLX_OK)
        b->v[b->n++] = id;
    return st;
}

// ---- word cache

static uint64_t hash_word(const uint8_t *s, size_t n) {
    uint64_t h = 0xcbf29ce484222325ULL ^ n;
    for (size_t i = 0; i < n; i++)
        h = (h ^ s[i]) * 0x100000001b3ULL;
    return h ^ (h >> 32);
}

rlx_status rlx__cache_init(text_cache *c) {
    memset(c, 0, sizeof *c);
    if (pthread_mutex_init(&c->lock, NULL) != 0)
        return rlx_error(RLX_E_INTERNAL, "cannot create the word cache lock");
    c->cap = TEXT_CACHE_MAX_ENTRIES * 2;
    c->hashes = rlx__calloc(c->cap, sizeof *c->hashes);
    c->entries = rlx__calloc(c->cap, sizeof *c->entries);
    if (!c->hashes || !c->entries) {
        rlx__cache_deinit(c);
        return rlx_error(RLX_E_NOMEM, "cannot allocate the word cache");
    }
    return RLX_OK;
}

void rlx__cache_deinit(text_cache *c) {
    if (c->cap)
        pthread_mutex_destroy(&c->lock);
    free(c->hashes);
    free(c->entries);
    free(c->key_off);
    free(c->key_len);
    free(c->n_ids);
    free(c->data);
    memset(c, 0, sizeof *c);
}

/* Appends the cached ids of word w to out; returns 1 on a hit. */
static int cache_get(text_cache *c, uint64_t h, const uint8_t *w, size_t n, ids_buf *out, rlx_status *st) {
    int hit = 0;
    pthread_mutex_lock(&c->lock);
    size_t mask = c->cap - 1;
    for (size_t i = h & mask; c->entries[i]; i = (i + 1) & mask) {
        uint32_t e = c->entries[i] - 1;
        if (c->hashes[i] == h && c->key_len[e] == n && memcmp(c->data + c->key_off[e], w, n) == 0) {
            uint32_t k = c->n_ids[e];
            if ((*st = ids_reserve(out, k)) == RLX_OK) {
                memcpy(out->v + out->n, c->data + c->key_off[e] + ((n + 3) & ~(size_t)3), k * sizeof(int32_t));
                out->n += k;
            }
            hit = 1;
            break;
        }
    }
    pthread_mutex_unlock(&c->lock);
    return hit;
}

/* Remembers ids[0, k) for word w; a full cache or a failed allocation just skips it. */
static void cache_put(text_cache *c, uint64_t h, const uint8_t *w, size_t n, const int32_t *ids, size_t k) {
    pthread_mutex_lock(&c->lock);
    if (c->n >= TEXT_CACHE_MAX_ENTRIES)
        goto out;
    size_t mask = c->cap - 1, i = h & mask;
    for (; c->entries[i]; i = (i + 1) & mask) {
        uint32_t e = c->entries[i] - 1;
        if (c->hashes[i] == h && c->key_len[e] == n && memcmp(c->data + c->key_off[e], w, n) == 0)
            goto out; /* another thread was first */
    }
    size_t key_padded = (n + 3) & ~(size_t)3, need = key_padded + k * sizeof(int32_t);
    if (c->data_len + need > c->data_cap) {
        size_t cap = c->data_cap ? c->data_cap * 2 : 1 << 16;
        while (cap < c->data_len + need)
            cap *= 2;
        uint8_t *grown = rlx__realloc(c->data, cap);
        if (!grown)
            goto out;
        c->data = grown;
        c->data_cap = cap;
    }
    if (c->n == c->n_alloc) {
        size_t na = c->n_alloc ? c->n_alloc * 2 : 1024;
        uint32_t *ko = rlx__realloc(c->key_off, na * sizeof *ko);
        if (ko)
            c->key_off = ko;
        uint32_t *kl = rlx__realloc(c->key_len, na * sizeof *kl);
        if (kl)
            c->key_len = kl;
        uint32_t *ni = rlx__realloc(c->n_ids, na * sizeof *ni);
        if (ni)
            c->n_ids = ni;
        if (!ko || !kl || !ni)
            goto out;
        c->n_alloc = na;
    }
    uint32_t e = (uint32_t)c->n++;
    c->key_off[e] = (uint32_t)c->data_len;
    c->key_len[e] = (uint32_t)n;
    c->n_ids[e] = (uint32_t)k;
    memcpy(c->data + c->data_len, w, n);
    memcpy(c->data + c->data_len + key_padded, ids, k * sizeof(int32_t));
    c->data_len += need;
    c->hashes[i] = h;
    c->entries[i] = e + 1;
out:
    pthread_mutex_unlock(&c->lock);
}

// ---- BPE

typedef struct bpe_symbol {
    int32_t c;
    int32_t prev, next; /* -1 at the ends */
    uint32_t len;       /* 0 once merged into its left neighbour */
} bpe_symbol;

typedef struct bpe_merge {
    uint32_t rank;
    uint32_t pos;
    int32_t new_id;
} bpe_merge;

typedef struct encoder {
    const rlx_tokenizer *tok;
    ids_buf out;
    int parse_special;
    /* With spans: special tokens count only inside spans[0, n_spans), offsets from span_base,
     * the start of the text the current matcher splits. */
    const rlx_text_span *spans;
    size_t n_spans;
    const char *span_base;
    int norm_special; /* special tokens among the normalized added tokens (then spans need NFC'd) */
    size_t limit;     /* max_ids, or SIZE_MAX */
    int over;         /* the limit was passed: unwinding with ENCODE_STOP */
    pcre2_match_data *md;
    pcre2_match_context *mctx;
    pcre2_jit_stack *jit_stack;
    bpe_symbol *syms;
    size_t syms_cap;
    bpe_merge *heap;
    size_t heap_n, heap_cap;
    char *buf; /* byte-level spelling of a word for ignore_merges; Metaspace's rewritten piece */
    size_t buf_cap;
    const char *text;      /* the text being encoded */
    const char *norm_base; /* the normalized piece being split, and whether it starts the text */
    int norm_at_origin;
} encoder;

/* What the encoding steps return to unwind once the limit is passed (e->over says so); not an
 * error, so no message is set. */
#define ENCODE_STOP RLX_E_RANGE

static rlx_status check_limit(encoder *e) {
    if (e->out.n <= e->limit)
        return RLX_OK;
    e->over = 1;
    return ENCODE_STOP;
}

static int merge_find(const rlx_tokenizer *tok, int32_t a, int32_t b, uint32_t *rank, int32_t *id) {
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    size_t mask = tok->merge_cap - 1;
    for (size_t i = rlx__merge_hash(key) & mask;; i = (i + 1) & mask) {
        uint64_t k = tok->merge_keys[i];
        if (k == key) {
            *rank = tok->merge_rank[i];
            *id = tok->merge_id[i];
            return 1;
        }
        if (k == UINT64_MAX)
            return 0;
    }
}

static int merge_less(const bpe_merge *a, const bpe_merge *b) {
    return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

static void heap_push(encoder *e, bpe_merge m) {
    size_t i = e->heap_n++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!merge_less(&m, &e->heap[parent]))
            break;
        e->heap[i] = e->heap[parent];
        i = parent;
    }
    e->heap[i] = m;
}

static bpe_merge heap_pop(encoder *e) {
    bpe_merge top = e->heap[0], last = e->heap[--e->heap_n];
    size_t i = 0, n = e->heap_n;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        const bpe_merge *best = &last;
        if (l < n && merge_less(&e->heap[l], best)) {
            m = l;
            best = &e->heap[l];
        }
        if (r < n && merge_less(&e->heap[r], best))
            m = r;
        if (m == i)
            break;
        e->heap[i] = e->heap[m];
        i = m;
    }
    if (n > 0)
        e->heap[i] = last;
    return top;
}

static void push_pair(encoder *e, int32_t pos) {
    uint32_t rank;
    int32_t id;
    const bpe_symbol *s = &e->syms[pos];
    if (s->next >= 0 && merge_find(e->tok, s->c, e->syms[s->next].c, &rank, &id))
        heap_push(e, (bpe_merge){.rank = rank, .pos = (uint32_t)pos, .new_id = id});
}

static rlx_status grow(void **p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap)
        return RLX_OK;
    size_t c = *cap ? *cap : 64;
    while (c < need)
        c *= 2;
    void *grown = rlx__realloc(*p, c * elem);
    if (!grown)
        return rlx_error(RLX_E_NOMEM, "cannot allocate BPE scratch space for a %zu-byte word", need);
    *p = grown;
    *cap = c;
    return RLX_OK;
}

/* The symbols of a word spelled as the vocabulary is (no ByteLevel): one per character that is a
 * model token, else its <0xNN> tokens (byte_fallback), else the unknown token (runs fused with
 * fuse_unk), else nothing, as BPE::merge_word makes them. *ns is the count. */
static int32_t init_chars(encoder *e, const uint8_t *w, size_t n) {
    const rlx_tokenizer *tok = e->tok;
    int32_t ns = 0, unk_pending = 0;
    for (size_t i = 0; i < n;) {
        size_t cl;
        rlx__utf8_decode(w + i, &cl);
        int32_t id = rlx__vocab_find(tok, (const char *)w + i, cl);
        if (id >= 0 && tok->tokens[id].in_model) {
            if (unk_pending)
                e->syms[ns++] = (bpe_symbol){.c = tok->unk_id, .len = 1};
            unk_pending = 0;
            e->syms[ns++] = (bpe_symbol){.c = id, .len = 1};
        } else {
            size_t k = 0;
            while (tok->byte_fallback && k < cl && tok->fallback_token[w[i + k]] >= 0)
                k++;
            if (tok->byte_fallback && k == cl) { /* a pending unknown token stays pending, as there */
                for (k = 0; k < cl; k++)
                    e->syms[ns++] = (bpe_symbol){.c = tok->fallback_token[w[i + k]], .len = 1};
            } else if (tok->unk_id >= 0) {
                if (unk_pending && !tok->fuse_unk)
                    e->syms[ns++] = (bpe_symbol){.c = tok->unk_id, .len = 1};
                unk_pending = 1;
            }
        }
        i += cl;
    }
    if (unk_pending)
        e->syms[ns++] = (bpe_symbol){.c = tok->unk_id, .len = 1};
    for (int32_t i = 0; i < ns; i++) {
        e->syms[i].prev = i - 1;
        e->syms[i].next = i + 1;
    }
    return ns;
}

/* Appends the BPE ids of one pre-tokenized word (raw bytes, or characters without ByteLevel) to
 * e->out. */
static rlx_status bpe_word(encoder *e, const uint8_t *w, size_t n) {
    const rlx_tokenizer *tok = e->tok;
    if (tok->ignore_merges && !tok->byte_level) {
        int32_t id = rlx__vocab_find(tok, (const char *)w, n);
        if (id >= 0 && tok->tokens[id].in_model)
            return ids_push(&e->out, id);
    } else if (tok->ignore_merges) { /* a word that is a whole vocabulary token is taken as it is */
        rlx_status st = grow((void **)&e->buf, &e->buf_cap, n * 2 + 1, 1);
        if (st != RLX_OK)
            return st;
        size_t k = 0, i = 0;
        for (; i < n && tok->byte_token[w[i]] >= 0; i++) {
            const text_token *t = &tok->tokens[tok->byte_token[w[i]]];
            memcpy(e->buf + k, tok->strings + t->str, t->str_len);
            k += t->str_len;
        }
        int32_t id = i == n ? rlx__vocab_find(tok, e->buf, k) : -1;
        if (id >= 0 && tok->tokens[id].in_model)
            return ids_push(&e->out, id);
    }
    if (n == 1 && tok->byte_level)
        return tok->byte_token[w[0]] >= 0 ? ids_push(&e->out, tok->byte_token[w[0]]) : RLX_OK;
    rlx_status st = grow((void **)&e->syms, &e->syms_cap, n, sizeof *e->syms);
    if (st == RLX_OK)
        st = grow((void **)&e->heap, &e->heap_cap, 3 * n + 4, sizeof *e->heap); /* n-1 pairs + 2 per merge */
    if (st != RLX_OK)
        return st;
    int32_t ns = 0;
    if (!tok->byte_level) {
        ns = init_chars(e, w, n);
    } else {
        for (size_t i = 0; i < n; i++) {
            int32_t c = tok->byte_token[w[i]];
            if (c < 0) /* no token for this byte and no unk: tokenizers drops it */
                continue;
            e->syms[ns] = (bpe_symbol){.c = c, .prev = ns - 1, .next = ns + 1, .len = 1};
            ns++;
        }
    }
    if (ns == 0)
        return RLX_OK;
    e->syms[ns - 1].next = -1;
    e->heap_n = 0;
    for (int32_t i = 0; i + 1 < ns; i++)
        push_pair(e, i);
    while (e->heap_n > 0) {
        bpe_merge top = heap_pop(e);
        bpe_symbol *cur = &e->syms[top.pos];
        if (cur->len == 0 || cur->next < 0)
            continue;
        int32_t next_pos = cur->next;
        bpe_symbol right = e->syms[next_pos];
        uint32_t rank;
        int32_t id;
        if (!merge_find(tok, cur->c, right.c, &rank, &id) || id != top.new_id)
            continue; /* stale: the pair at this position has changed */
        cur->c = top.new_id;
        cur->len += right.len;
        cur->next = right.next;
        e->syms[next_pos].len = 0;
        if (right.next >= 0)
            e->syms[right.next].prev = (int32_t)top.pos;
        if (cur->prev >= 0)
            push_pair(e, cur->prev);
        push_pair(e, (int32_t)top.pos);
    }
    if ((st = ids_reserve(&e->out, (size_t)ns)) != RLX_OK)
        return st;
    for (int32_t i = 0; i < ns; i++)
        if (e->syms[i].len)
            e->out.v[e->out.n++] = e->syms[i].c;
    return RLX_OK;
}

static rlx_status encode_word(encoder *e, const uint8_t *w, size_t n) {
    if (n == 0)
        return RLX_OK;
    rlx_status st = RLX_OK;
    if (n > TEXT_CACHE_MAX_WORD) {
        size_t most = e->tok->max_token_bytes;
        if (e->limit != SIZE_MAX && most && (n + most - 1) / most > e->limit - e->out.n) {
            e->over = 1; /* this word alone passes the limit: spare its merges (a long run costs n log n) */
            return ENCODE_STOP;
        }
        return (st = bpe_word(e, w, n)) != RLX_OK ? st : check_limit(e);
    }
    text_cache *cache = (text_cache *)&e->tok->cache; /* the cache is the one mutable part, under its lock */
    uint64_t h = hash_word(w, n);
    if (cache_get(cache, h, w, n, &e->out, &st))
        return st != RLX_OK ? st : check_limit(e);
    size_t before = e->out.n;
    if ((st = bpe_word(e, w, n)) != RLX_OK)
        return st;
    cache_put(cache, h, w, n, e->out.v + before, e->out.n - before);
    return check_limit(e);
}

// ---- pre-tokenizer

static size_t char_len(uint8_t b) { return b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4; }

static int regex_match(encoder *e, const char *s, size_t len, size_t at) {
    const rlx_tokenizer *tok = e->tok;
    int rc = pcre2_match(tok->re, (PCRE2_SPTR)s, len, at, PCRE2_NO_UTF_CHECK, e->md, e->mctx);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT && !e->jit_stack) {
        /* very long runs of one class can outgrow the default 32 KiB JIT stack */
        if (!(e->jit_stack = pcre2_jit_stack_create(32 * 1024, 256 * 1024 * 1024, NULL)))
            return PCRE2_ERROR_NOMEMORY;
        pcre2_jit_stack_assign(e->mctx, NULL, e->jit_stack);
        rc = pcre2_match(tok->re, (PCRE2_SPTR)s, len, at, PCRE2_NO_UTF_CHECK, e->md, e->mctx);
    }
    return rc;
}

/* Metaspace: spaces become the replacement, which is prepended unless there already (always, or
 * first: only to the piece that starts the text); with split, each replacement starts a word
 * (SplitDelimiterBehavior::MergedWithNext). */
static rlx_status metaspace(encoder *e, const char *s, size_t len, int at_origin) {
    const rlx_tokenizer *tok = e->tok;
    const char *rep = tok->ms_rep;
    const size_t rl = tok->ms_rep_len;
    char *w;
    size_t n;
    rlx_status st = rlx__replace_all(s, len, " ", 1, rep, rl, &w, &n);
    if (st != RLX_OK)
        return st;
    int prepend = tok->ms_prepend == TEXT_PREPEND_ALWAYS || (tok->ms_prepend == TEXT_PREPEND_FIRST && at_origin);
    if (prepend && !(n >= rl && memcmp(w, rep, rl) == 0)) {
        char *grown = rlx__realloc(w, n + rl + 1);
        if (!grown) {
            free(w);
            return rlx_error(RLX_E_NOMEM, "cannot allocate %zu bytes of pre-tokenized text", n + rl);
        }
        w = grown;
        memmove(w + rl, w, n + 1);
        memcpy(w, rep, rl);
        n += rl;
    }
    size_t start = 0;
    for (size_t i = 1; tok->ms_split && st == RLX_OK && i + rl <= n; i++)
        if (memcmp(w + i, rep, rl) == 0) {
            st = encode_word(e, (const uint8_t *)w + start, i - start);
            start = i;
            i += rl - 1;
        }
    if (st == RLX_OK && start < n)
        st = encode_word(e, (const uint8_t *)w + start, n - start);
    free(w);
    return st;
}

/* Split(Isolated): every match and every gap between matches is a word; empty matches are
 * skipped (the search resumes a character later), as onig's find_iter does. Without a regex the
 * piece is one word, or Metaspace's words. */
static rlx_status pre_tokenize(encoder *e, const char *s, size_t len) {
    if (!e->tok->re) {
        if (e->tok->metaspace)
            return metaspace(e, s, len, e->norm_at_origin && s == e->norm_base);
        return encode_word(e, (const uint8_t *)s, len);
    }
    size_t prev = 0, at = 0;
    rlx_status st;
    while (at < len) {
        int rc = regex_match(e, s, len, at);
        if (rc == PCRE2_ERROR_NOMATCH)
            break;
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return rlx_error(rc == PCRE2_ERROR_NOMEMORY ? RLX_E_NOMEM : RLX_E_INTERNAL,
                             "pre-tokenizer regex failed at byte %zu: %s", at, (const char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(e->md);
        size_t ms = ov[0], me = ov[1];
        if (me <= ms) {
            at = ms + char_len((uint8_t)s[ms]);
            continue;
        }
        if (ms > prev && (st = encode_word(e, (const uint8_t *)s + prev, ms - prev)) != RLX_OK)
            return st;
        if ((st = encode_word(e, (const uint8_t *)s + ms, me - ms)) != RLX_OK)
            return st;
        prev = at = me;
    }
    return prev < len ? encode_word(e, (const uint8_t *)s + prev, len - prev) : RLX_OK;
}

// ---- added tokens

static int is_alnum(uint32_t c) {
    utf8proc_category_t cat = utf8proc_category((utf8proc_int32_t)c);
    return (cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO) ||
           (cat >= UTF8PROC_CATEGORY_ND && cat <= UTF8PROC_CATEGORY_NO);
}

/* Start of the character that ends s[0, end). */
static size_t char_start_before(const char *s, size_t end) {
    size_t i = end - 1;
    while (i > 0 && ((uint8_t)s[i] & 0xC0) == 0x80)
        i--;
    return i;
}

typedef rlx_status (*text_fn)(encoder *e, const char *s, size_t len);

/* Where a special token at s[start, stop) stands: 1 inside the markup spans (it is a token),
 * 0 outside them all (it is text), -1 across a span's edge (neither: its first byte is text and
 * matching resumes at the next one, as if the text were split there). */
static int special_place(const encoder *e, const char *s, size_t start, size_t stop) {
    if (!e->spans)
        return e->parse_special ? 1 : 0;
    size_t a = (size_t)(s - e->span_base) + start, z = (size_t)(s - e->span_base) + stop;
    size_t lo = 0, hi = e->n_spans; /* the first span that ends after a */
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (e->spans[mid].off + e->spans[mid].len <= a)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == e->n_spans || e->spans[lo].off >= z)
        return 0;
    return e->spans[lo].off <= a && z <= e->spans[lo].off + e->spans[lo].len ? 1 : -1;
}

/* AddedVocabulary::split_with_indices over s with one matcher: matched tokens go to the output,
 * the text around them to on_text. */
static rlx_status split_added(encoder *e, const text_matcher *m, const char *s, size_t len, text_fn on_text) {
    const rlx_tokenizer *tok = e->tok;
    size_t start_offset = 0, i = 0;
    rlx_status st;
    while (i < len && m->n) {
        uint8_t b = (uint8_t)s[i];
        const text_added *found = NULL;
        for (uint32_t k = m->first[b]; k < m->first[b + 1]; k++) {
            const text_added *a = &tok->added[m->items[k]];
            if (a->len <= len - i && memcmp(s + i, tok->strings + a->off, a->len) == 0) {
                found = a; /* candidates are sorted longest first: leftmost-longest */
                break;
            }
        }
        if (!found) {
            i++;
            continue;
        }
        size_t start = i, stop = i + found->len;
        i = stop;
        if (found->special) {
            int place = special_place(e, s, start, stop);
            if (place < 0)
                i = start + 1;
            if (place <= 0)
                continue;
        }
        if (found->single_word) {
            size_t cl;
            int word_before =
                start > 0 && is_alnum(rlx__utf8_decode((const uint8_t *)s + char_start_before(s, start), &cl));
            int word_after = stop < len && is_alnum(rlx__utf8_decode((const uint8_t *)s + stop, &cl));
            if (word_before || word_after)
                continue;
        }
        if (found->lstrip) {
            size_t ns = start;
            while (ns > 0) {
                size_t cs = char_start_before(s, ns), cl;
                if (!rlx__unicode_is_space(rlx__utf8_decode((const uint8_t *)s + cs, &cl)))
                    break;
                ns = cs;
            }
            start = ns > start_offset ? ns : start_offset;
        }
        if (found->rstrip) {
            while (stop < len) {
                size_t cl;
                if (!rlx__unicode_is_space(rlx__utf8_decode((const uint8_t *)s + stop, &cl)))
                    break;
                stop += cl;
            }
            if (i < stop)
                i = stop;
        }
        if (start > start_offset && (st = on_text(e, s + start_offset, start - start_offset)) != RLX_OK)
            return st;
        if ((st = ids_push(&e->out, found->id)) != RLX_OK || (st = check_limit(e)) != RLX_OK)
            return st;
        start_offset = stop;
    }
    return start_offset < len ? on_text(e, s + start_offset, len - start_offset) : RLX_OK;
}

static rlx_status on_normalized_text(encoder *e, const char *s, size_t len) { return pre_tokenize(e, s, len); }

/* The normalized added tokens over s[0, len) normalized span by span, for special tokens that
 * match on normalized text and may only count inside spans: the NFC'd pieces are joined and the
 * spans moved onto them. (Hugging Face normalizes the text between non-normalized added tokens
 * whole; the pieces differ from that only where a markup edge falls inside a sequence that
 * composes, which a template's markup, ending in a newline or a token, does not make.) */
static rlx_status split_normalized_by_span(encoder *e, const char *s, size_t len) {
    const size_t at = (size_t)(s - e->span_base);
    const rlx_text_span *spans = e->spans;
    const size_t n_spans = e->n_spans;
    const char *base = e->span_base;
    char *joined = NULL;
    size_t joined_len = 0, n_local = 0;
    rlx_text_span *local = rlx__malloc((n_spans + 1) * sizeof *local);
    rlx_status st = local ? RLX_OK : rlx_error(RLX_E_NOMEM, "cannot allocate the spans of a text");
    size_t k = 0;
    while (k < n_spans && spans[k].off + spans[k].len <= at)
        k++;
    for (size_t p = 0; p < len && st == RLX_OK;) {
        /* the piece from p to the next span edge, and whether it is inside a span */
        size_t abs = at + p, end;
        int inside = k < n_spans && spans[k].off <= abs;
        if (inside)
            end = spans[k].off + spans[k].len - at;
        else
            end = k < n_spans ? spans[k].off - at : len;
        if (end > len)
            end = len;
        char *norm;
        size_t norm_len;
        if ((st = rlx__nfc(s + p, end - p, &norm, &norm_len)) != RLX_OK)
            break;
        char *grown = rlx__realloc(joined, joined_len + norm_len + 1);
        if (!grown) {
            free(norm);
            st = rlx_error(RLX_E_NOMEM, "cannot allocate %zu bytes of normalized text", joined_len + norm_len);
            break;
        }
        joined = grown;
        memcpy(joined + joined_len, norm, norm_len);
        free(norm);
        if (inside && norm_len)
            local[n_local++] = (rlx_text_span){joined_len, norm_len};
        joined_len += norm_len;
        if (inside)
            k++;
        p = end;
    }
    if (st == RLX_OK) {
        e->spans = local;
        e->n_spans = n_local;
        e->span_base = joined;
        st = split_added(e, &e->tok->norm_matcher, joined ? joined : "", joined_len, on_normalized_text);
        e->spans = spans;
        e->n_spans = n_spans;
        e->span_base = base;
    }
    free(joined);
    free(local);
    return st;
}

/* A piece of raw text between non-normalized added tokens: normalize it, then split off the
 * normalized added tokens. */
static rlx_status on_raw_text(encoder *e, const char *s, size_t len) {
    const rlx_tokenizer *tok = e->tok;
    e->norm_base = s;
    e->norm_at_origin = s == e->text;
    if (!tok->n_norm)
        return split_added(e, &tok->norm_matcher, s, len, on_normalized_text);
    if (!tok->nfc) { /* Prepend, Replace: the piece whole, as tokenizers normalizes it */
        if (e->spans && e->norm_special)
            return rlx_error(RLX_E_UNSUPPORTED, "special spans with special tokens that are normalized by a Prepend or "
                                                "Replace normalizer are not supported");
        char *norm;
        size_t norm_len;
        rlx_status st = rlx__normalize(tok, s, len, &norm, &norm_len);
        if (st != RLX_OK)
            return st;
        e->norm_base = norm;
        st = split_added(e, &tok->norm_matcher, norm, norm_len, on_normalized_text);
        free(norm);
        return st;
    }
    /* Code points below U+0300 (lead bytes below 0xCC) are NFC-stable and never compose with a
     * preceding character, so text made only of them needs no normalisation. */
    size_t i = 0;
    while (i < len && (uint8_t)s[i] < 0xCC)
        i++;
    if (i == len)
        return split_added(e, &tok->norm_matcher, s, len, on_normalized_text);
    if (e->spans && e->norm_special)
        return split_normalized_by_span(e, s, len);
    char *norm;
    size_t norm_len;
    rlx_status st = rlx__nfc(s, len, &norm, &norm_len);
    if (st != RLX_OK)
        return st;
    e->norm_base = norm;
    st = split_added(e, &tok->norm_matcher, norm, norm_len, on_normalized_text);
    free(norm);
    return st;
}

rlx_status rlx_tokenizer_encode_ex(const rlx_tokenizer *tok, const char *text, size_t len,
                                   const rlx_encode_options *opts, int32_t **ids, size_t *n_ids, int *truncated) {
    if (ids)
        *ids = NULL;
    if (n_ids)
        *n_ids = 0;
    if (truncated)
        *truncated = 0;
    if (!tok || !ids || !n_ids || (!text && len))
        return rlx_error(RLX_E_INVALID, "rlx_tokenizer_encode: NULL argument");
    rlx_encode_options o = {.size = sizeof o};
    if (opts && rlx__read_sized(&o, sizeof o, opts, offsetof(rlx_encode_options, size) + sizeof o.size,
                                "rlx_encode_options") != RLX_OK)
        return RLX_E_INVALID;
    if (o.n_special_spans && !o.special_spans)
        return rlx_error(RLX_E_INVALID, "rlx_tokenizer_encode: %zu special spans but no array", o.n_special_spans);
    for (size_t k = 0; o.special_spans && k < o.n_special_spans; k++) {
        const rlx_text_span *sp = &o.special_spans[k];
        size_t floor = k ? o.special_spans[k - 1].off + o.special_spans[k - 1].len : 0;
        if (sp->off < floor || sp->off > len || sp->len > len - sp->off)
            return rlx_error(RLX_E_INVALID,
                             "rlx_tokenizer_encode: special span %zu (%zu bytes at %zu) is out of order or past "
                             "the text's %zu bytes",
                             k, sp->len, sp->off, len);
    }
    size_t bad = rlx__utf8_check((const uint8_t *)text, len);
    if (bad < len)
        return rlx_error(RLX_E_INVALID, "text is not valid UTF-8: byte 0x%02X at offset %zu", (uint8_t)text[bad], bad);
    if (len == 0 && !(o.add_special && tok->n_prefix + tok->n_suffix))
        return RLX_OK;
    encoder e = {.tok = tok,
                 .text = text,
                 .parse_special = o.parse_special,
                 .spans = o.special_spans,
                 .n_spans = o.n_special_spans,
                 .span_base = text,
                 .limit = o.max_ids ? o.max_ids : SIZE_MAX};
    for (size_t k = 0; k < tok->norm_matcher.n; k++)
        e.norm_special |= tok->added[tok->norm_matcher.items[k]].special;
    rlx_status st = RLX_OK;
    if (tok->re && (!(e.md = pcre2_match_data_create_from_pattern(tok->re, NULL)) ||
                    !(e.mctx = pcre2_match_context_create(NULL)))) {
        st = rlx_error(RLX_E_NOMEM, "cannot allocate regex match data");
        goto done;
    }
    /* PCRE2's default limits stop `\s*[\r\n]+` on a run of 10^7 spaces (Oniguruma's retry limit
     * makes Hugging Face panic there); backtracking here is linear in the run, so lift them. */
    if (e.mctx) {
        pcre2_set_match_limit(e.mctx, UINT32_MAX);
        pcre2_set_depth_limit(e.mctx, UINT32_MAX);
        pcre2_set_heap_limit(e.mctx, 4u << 20); /* KiB: 4 GiB, only the interpreter without JIT uses it */
    }
    size_t guess = len / 3 + 16;
    if ((st = ids_reserve(&e.out, guess < e.limit ? guess : e.limit + 1)) != RLX_OK)
        goto done;
    /* the post-processor's template around the one sequence (TemplateProcessing "single") */
    for (int i = 0; o.add_special && i < tok->n_prefix && st == RLX_OK; i++)
        if ((st = ids_push(&e.out, tok->prefix_ids[i])) == RLX_OK)
            st = check_limit(&e);
    if (st == RLX_OK)
        st = split_added(&e, &tok->raw_matcher, text, len, on_raw_text);
    for (int i = 0; o.add_special && i < tok->n_suffix && st == RLX_OK; i++)
        if ((st = ids_push(&e.out, tok->suffix_ids[i])) == RLX_OK)
            st = check_limit(&e);
    if (e.over) {
        st = RLX_OK;
        if (e.out.n > e.limit)
            e.out.n = e.limit;
        if (truncated)
            *truncated = 1;
    }
done:
    pcre2_match_data_free(e.md);
    pcre2_match_context_free(e.mctx);
    pcre2_jit_stack_free(e.jit_stack);
    free(e.syms);
    free(e.heap);
    free(e.buf);
    if (st != RLX_OK) {
        free(e.out.v);
        return st;
    }
    if (e.out.n == 0) {
        free(e.out.v);
        e.out.v = NULL;
    }
    *ids = e.out.v;
    *n_ids = e.out.n;
    return RLX_OK;
}

rlx_status rlx_tokenizer_encode(const rlx_tokenizer *tok, const char *text, size_t len, int parse_special,
                                int32_t **ids, size_t *n_ids) {
    rlx_encode_options o = {.size = sizeof o, .parse_special = parse_special};
    return rlx_tokenizer_encode_ex(tok, text, len, &o, ids, n_ids, NULL);
}
