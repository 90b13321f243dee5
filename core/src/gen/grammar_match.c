/* The token matcher: which tokens may come next under a compiled grammar.
 *
 * A parse is a stack of grammar positions, kept as a node (position, parent) whose parent is
 * the position to return to when the rule ends; nodes are hash-consed, so a stack is one node
 * id and two equal stacks are the same id. The matcher's place in the text is a state: the
 * sorted set of stacks alive, each with a character set on top (node 0 is the empty stack: the
 * text may end there). Going past a character c keeps the stacks whose top set holds c, moves
 * each to the next position and expands rule references (a reference at the end of an
 * alternative returns straight to its parent, so `x*`, `[^\n]*` and the like never grow the
 * stacks).
 *
 * States are interned and their transitions are cached: a state splits the code points into
 * intervals over which the same stacks advance, and each interval's next state is computed on
 * first use. The token mask walks a prefix tree of the vocabulary's bytes in preorder; a byte
 * the state refuses skips its whole subtree. Most steps of the walk are a binary search among a
 * state's few intervals and a cached id, so the mask costs about one step a trie node visited.
 * A token whose bytes end inside a UTF-8 character is allowed when some character the state
 * allows starts with those bytes; the matcher then holds the partial character and the next
 * bytes must complete it.
 *
 * The cache is bounded: past GR_CACHE_BYTES the states and nodes still in use (the matcher's
 * place, its start, and the mask walk's path) are copied into a fresh cache and the rest is
 * dropped, as a copying collector does. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gen/grammar_internal.h"
#include "text/text_internal.h"
#include "util/alloc.h"

/* Bounds. A token longer than GR_MAX_TOKEN_BYTES is refused by the vocabulary (real ones are at
 * most a few hundred bytes). GR_MAX_STACKS parses alive at once, or GR_MAX_CLOSURE positions
 * visited while expanding one character's step, mean a grammar so ambiguous that following it
 * would cost unbounded time and memory: that step is refused with an error naming the bound.
 * GR_CACHE_BYTES is what one matcher's cache of states may hold before it is collected. */
#define GR_MAX_TOKEN_BYTES 65535u
#define GR_MAX_STACKS 4096u
#define GR_MAX_CLOSURE (1u << 18)
#define GR_CACHE_BYTES ((size_t)32 << 20)
/* Masks remembered per matcher, by the place they were computed at: generation inside a string
 * or free text comes back to the same state token after token, and its mask (the widest, nearly
 * the whole vocabulary) is then a copy. Each costs a bit an id (19 KB for Qwen3). */
#define GR_MASK_CACHE 8

#define NONE UINT32_MAX
/* interval transitions: a state id, or one of these */
#define T_UNKNOWN (-1)
#define T_DEAD (-2)
#define T_AMBIGUOUS (-3)

/* what a step returns besides errors (negative statuses) */
#define STEP_NO 0
#define STEP_OK 1
#define STEP_AMBIGUOUS 2

// ---- the vocabulary

struct rlx_grammar_vocab {
    const rlx_tokenizer *tok;
    int32_t n_tokens;
    /* the prefix tree of every non-special token's bytes, in preorder: node i stands for byte[i]
     * at depth[i] (1 for a first byte); its subtree ends before node skip[i]; the tokens whose
     * bytes end there are ids[tok_off[i] .. tok_off[i + 1]) */
    uint8_t *byte;
    uint16_t *depth;
    uint32_t *skip;
    uint32_t *tok_off;
    int32_t *ids;
    uint32_t n_nodes;
    uint32_t max_depth;
};

typedef struct vtok {
    const uint8_t *b;
    uint32_t len;
    int32_t id;
} vtok;

static int vtok_cmp(const void *a, const void *b) {
    const vtok *x = a, *y = b;
    uint32_t n = x->len < y->len ? x->len : y->len;
    int c = memcmp(x->b, y->b, n);
    if (c)
        return c;
    if (x->len != y->len)
        return x->len < y->len ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

rlx_status rlx_grammar_vocab_create(const rlx_tokenizer *tok, rlx_grammar_vocab **out) {
    if (!out)
        return rlx_error(RLX_E_INVALID, "rlx_grammar_vocab_create: out is NULL");
    *out = NULL;
    if (!tok)
        return rlx_error(RLX_E_INVALID, "rlx_grammar_vocab_create: tokenizer is NULL");
    const int32_t n = rlx_tokenizer_vocab_size(tok);
    rlx_grammar_vocab *v = rlx__calloc(1, sizeof *v);
    vtok *t = rlx__malloc((n ? (size_t)n : 1) * sizeof *t);
    uint32_t *path = NULL;
    rlx_status st = RLX_OK;
    if (!v || !t) {
        st = rlx_error(RLX_E_NOMEM, "cannot allocate the grammar vocabulary of %d tokens", n);
        goto fail;
    }
    v->tok = tok;
    v->n_tokens = n;
    size_t n_t = 0, total = 0;
    for (int32_t id = 0; id < n; id++) {
        const char *b;
        size_t len;
        if (rlx__token_bytes(tok, id, &b, &len) != 0 || len == 0)
            continue;
        if (len > GR_MAX_TOKEN_BYTES) {
            st = rlx_error(RLX_E_INVALID, "token %d has %zu bytes, more than the %u a grammar vocabulary takes", id,
                           len, GR_MAX_TOKEN_BYTES);
            goto fail;
        }
        t[n_t++] = (vtok){(const uint8_t *)b, (uint32_t)len, id};
        total += len;
    }
    qsort(t, n_t, sizeof *t, vtok_cmp);
    /* at most one node a byte; shrunk below */
    v->byte = rlx__malloc(total + 1);
    v->depth = rlx__malloc((total + 1) * sizeof *v->depth);
    v->skip = rlx__malloc((total + 1) * sizeof *v->skip);
    v->tok_off = rlx__malloc((total + 2) * sizeof *v->tok_off);
    v->ids = rlx__malloc((n_t + 1) * sizeof *v->ids);
    path = rlx__malloc((GR_MAX_TOKEN_BYTES + 1) * sizeof *path);
    if (!v->byte || !v->depth || !v->skip || !v->tok_off || !v->ids || !path) {
        st = rlx_error(RLX_E_NOMEM, "cannot allocate the prefix tree of %zu token bytes", total);
        goto fail;
    }
    /* sorted, a token comes right after the tokens it extends, so each adds the nodes past its
     * common prefix with the one before, and its id goes to the node made last */
    uint32_t nodes = 0, n_ids = 0, open = 0; /* open: depth of the path still being built */
    const vtok *prev = NULL;
    for (size_t k = 0; k < n_t; k++) {
        const vtok *x = &t[k];
        uint32_t lcp = 0;
        if (prev)
            while (lcp < x->len && lcp < prev->len && x->b[lcp] == prev->b[lcp])
                lcp++;
        for (; open > lcp; open--)
            v->skip[path[open - 1]] = nodes;
        for (uint32_t d = lcp; d < x->len; d++) {
            v->byte[nodes] = x->b[d];
            v->depth[nodes] = (uint16_t)(d + 1);
            v->tok_off[nodes] = n_ids;
            path[d] = nodes++;
        }
        open = x->len;
        v->ids[n_ids++] = x->id;
        if (x->len > v->max_depth)
            v->max_depth = x->len;
        prev = x;
    }
    for (; open > 0; open--)
        v->skip[path[open - 1]] = nodes;
    v->tok_off[nodes] = n_ids;
    v->n_nodes = nodes;
    free(path);
    free(t);
    *out = v;
    return RLX_OK;
fail:
    free(path);
    free(t);
    rlx_grammar_vocab_destroy(v);
    return st;
}

void rlx_grammar_vocab_destroy(rlx_grammar_vocab *v) {
    if (!v)
        return;
    free(v->byte);
    free(v->depth);
    free(v->skip);
    free(v->tok_off);
    free(v->ids);
    free(v);
}

// ---- the cache of stacks and states

typedef struct gstate {
    uint32_t set_off, set_n; /* its stacks (top node ids, sorted) in sets */
    uint32_t ivl_off, ivl_n; /* its intervals in ivl_*; ivl_live has ivl_n + 1 entries */
    uint64_t lead_ok;        /* bit b - 0xC0: some character it allows starts with byte b */
    uint32_t hash;
    uint8_t can_end;
} gstate;

typedef struct gcache {
    uint32_t *node_pos, *node_parent; /* node 0: the empty stack */
    uint32_t n_nodes, cap_nodes;
    uint32_t *node_tab; /* open addressing over (pos, parent): node id + 1, 0 = empty */
    uint32_t node_tab_cap;
    gstate *states;
    uint32_t n_states, cap_states;
    uint32_t *state_tab; /* open addressing over the stack sets: state id + 1 */
    uint32_t state_tab_cap;
    uint32_t *sets;
    uint32_t n_sets, cap_sets;
    /* interval k of a state starts at code point ivl_lo[k] and goes on to the next one's start;
     * ivl_next[k] is the state after one of its characters (T_*); ivl_live[k] counts the
     * intervals before k where some stack advances */
    uint32_t *ivl_lo;
    int32_t *ivl_next;
    uint32_t *ivl_live;
    uint32_t n_ivl, cap_ivl;
    /* state s's interval of each ASCII byte b at ascii[s * 128 + b] (ASCII_NONE: search) */
    uint16_t *ascii;
    uint32_t cap_ascii;
} gcache;

#define ASCII_NONE 0xFFFF

/* where the matcher is: a state, and the bytes of a character it has begun */
typedef struct gctx {
    uint32_t state;
    uint8_t pre[3];
    uint8_t n_pre;
} gctx;

typedef struct mask_entry {
    gctx at;
    uint64_t *bits;
    uint64_t used; /* the clock when last used; 0 = empty */
    int ambiguous;
} mask_entry;

typedef struct ivl_event {
    uint32_t at;
    int32_t delta;
} ivl_event;

struct rlx_grammar_matcher {
    const rlx_grammar *g;
    const rlx_grammar_vocab *v;
    gcache c;
    uint32_t start;
    gctx cur;
    size_t kept;   /* the cache's size after its last collection */
    int ambiguous; /* a step of the latest mask went past GR_MAX_STACKS or GR_MAX_CLOSURE */
    /* scratch of a step: positions to expand, those seen, the stacks found, interval events */
    uint64_t *work;
    uint32_t n_work, cap_work;
    uint64_t *seen;
    uint32_t *seen_gen;
    uint32_t seen_cap, n_seen, gen;
    uint32_t *tops;
    uint32_t n_tops, cap_tops;
    ivl_event *ev;
    uint32_t n_ev, cap_ev;
    gctx *path;     /* the mask walk's contexts by depth */
    uint64_t *bits; /* the mask's allowed ids (made by the first mask) */
    size_t n_bits;  /* words */
    mask_entry masks[GR_MASK_CACHE];
    uint64_t clock;
};

static int grow(void **v, uint32_t *cap, size_t need, size_t elem) {
    if (need <= *cap)
        return 1;
    if (need > UINT32_MAX / 2)
        return 0;
    uint32_t c = *cap ? *cap : 16;
    while (c < need)
        c *= 2;
    void *g = rlx__realloc(*v, (size_t)c * elem);
    if (!g)
        return 0;
    *v = g;
    *cap = c;
    return 1;
}

static rlx_status nomem(void) { return rlx_error(RLX_E_NOMEM, "cannot allocate the grammar matcher's states"); }

static void cache_free(gcache *c) {
    free(c->node_pos);
    free(c->node_parent);
    free(c->node_tab);
    free(c->states);
    free(c->state_tab);
    free(c->sets);
    free(c->ivl_lo);
    free(c->ivl_next);
    free(c->ivl_live);
    free(c->ascii);
    memset(c, 0, sizeof *c);
}

static size_t cache_bytes(const gcache *c) {
    return (size_t)c->cap_nodes * 8 + (size_t)c->node_tab_cap * 4 + (size_t)c->cap_states * sizeof(gstate) +
           (size_t)c->state_tab_cap * 4 + (size_t)c->cap_sets * 4 + (size_t)c->cap_ivl * 12 + (size_t)c->cap_ascii * 2;
}

static uint32_t mix(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    return (uint32_t)x;
}

static rlx_status cache_init(gcache *c) {
    memset(c, 0, sizeof *c);
    if (!grow((void **)&c->node_pos, &c->cap_nodes, 64, 4))
        return nomem();
    c->node_parent = rlx__malloc((size_t)c->cap_nodes * 4);
    c->node_tab = rlx__calloc(128, 4);
    c->state_tab = rlx__calloc(64, 4);
    if (!c->node_parent || !c->node_tab || !c->state_tab) {
        cache_free(c);
        return nomem();
    }
    c->node_tab_cap = 128;
    c->state_tab_cap = 64;
    c->node_pos[0] = c->node_parent[0] = NONE;
    c->n_nodes = 1;
    return RLX_OK;
}

/* The node (pos, parent), made if new. */
static rlx_status cons(gcache *c, uint32_t pos, uint32_t parent, uint32_t *out) {
    const uint32_t mask = c->node_tab_cap - 1;
    uint32_t j = mix((uint64_t)pos << 32 | parent) & mask;
    for (; c->node_tab[j]; j = (j + 1) & mask) {
        const uint32_t id = c->node_tab[j] - 1;
        if (c->node_pos[id] == pos && c->node_parent[id] == parent) {
            *out = id;
            return RLX_OK;
        }
    }
    if ((size_t)(c->n_nodes + 1) * 2 > c->node_tab_cap) { /* at most half full */
        const uint32_t cap = c->node_tab_cap * 2;
        uint32_t *t = rlx__calloc(cap, 4);
        if (!t)
            return nomem();
        for (uint32_t i = 1; i < c->n_nodes; i++) {
            uint32_t k = mix((uint64_t)c->node_pos[i] << 32 | c->node_parent[i]) & (cap - 1);
            while (t[k])
                k = (k + 1) & (cap - 1);
            t[k] = i + 1;
        }
        free(c->node_tab);
        c->node_tab = t;
        c->node_tab_cap = cap;
        j = mix((uint64_t)pos << 32 | parent) & (cap - 1);
        while (c->node_tab[j])
            j = (j + 1) & (cap - 1);
    }
    if (c->n_nodes + 1 > c->cap_nodes) {
        uint32_t cap = c->cap_nodes;
        if (!grow((void **)&c->node_pos, &cap, (size_t)c->n_nodes + 1, 4))
            return nomem();
        uint32_t *p = rlx__realloc(c->node_parent, (size_t)cap * 4);
        if (!p)
            return nomem(); /* node_pos grew alone; its capacity stays as it was */
        c->node_parent = p;
        c->cap_nodes = cap;
    }
    const uint32_t id = c->n_nodes++;
    c->node_pos[id] = pos;
    c->node_parent[id] = parent;
    c->node_tab[j] = id + 1;
    *out = id;
    return RLX_OK;
}

static int set_has(const rlx_grammar *g, uint32_t set, uint32_t cp) {
    const gr_range *r = g->ranges + g->sets[set].off;
    uint32_t lo = 0, hi = g->sets[set].n;
    while (lo < hi) {
        uint32_t mid = (lo + hi) / 2;
        if (r[mid].hi < cp)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < g->sets[set].n && r[lo].lo <= cp;
}

static int ev_cmp(const void *a, const void *b) {
    const ivl_event *x = a, *y = b;
    return x->at < y->at ? -1 : x->at > y->at;
}

/* The interval of state s holding code point cp. */
static inline uint32_t ivl_find(const gcache *c, const gstate *s, uint32_t cp) {
    const uint32_t *lo = c->ivl_lo + s->ivl_off;
    uint32_t a = 0, b = s->ivl_n; /* lo[0] = 0 <= cp */
    while (b - a > 1) {
        uint32_t mid = (a + b) / 2;
        if (lo[mid] <= cp)
            a = mid;
        else
            b = mid;
    }
    return a;
}

/* Whether state s allows some character in [lo, hi]. */
static int span_live(const gcache *c, const gstate *s, uint32_t lo, uint32_t hi) {
    const uint32_t a = ivl_find(c, s, lo), b = ivl_find(c, s, hi);
    const uint32_t *live = c->ivl_live + s->ivl_off;
    return live[b + 1] - live[a] > 0;
}

/* The state of the sorted stacks m->tops[0, n_tops), made if new. */
static rlx_status intern(rlx_grammar_matcher *m, gcache *c, uint32_t *out) {
    const rlx_grammar *g = m->g;
    const uint32_t *tops = m->tops, n = m->n_tops;
    uint64_t h = 0x9E3779B97F4A7C15ULL * (n + 1);
    for (uint32_t i = 0; i < n; i++)
        h = (h ^ tops[i]) * 0x100000001b3ULL;
    const uint32_t hash = mix(h), mask = c->state_tab_cap - 1;
    uint32_t j = hash & mask;
    for (; c->state_tab[j]; j = (j + 1) & mask) {
        const gstate *s = &c->states[c->state_tab[j] - 1];
        if (s->hash == hash && s->set_n == n && memcmp(c->sets + s->set_off, tops, (size_t)n * 4) == 0) {
            *out = c->state_tab[j] - 1;
            return RLX_OK;
        }
    }
    if ((size_t)(c->n_states + 1) * 2 > c->state_tab_cap) { /* at most half full */
        const uint32_t cap = c->state_tab_cap * 2;
        uint32_t *t = rlx__calloc(cap, 4);
        if (!t)
            return nomem();
        for (uint32_t i = 0; i < c->n_states; i++) {
            uint32_t q = c->states[i].hash & (cap - 1);
            while (t[q])
                q = (q + 1) & (cap - 1);
            t[q] = i + 1;
        }
        free(c->state_tab);
        c->state_tab = t;
        c->state_tab_cap = cap;
        j = hash & (cap - 1);
        while (c->state_tab[j])
            j = (j + 1) & (cap - 1);
    }
    /* intervals: a boundary wherever some stack's top set starts or stops */
    m->n_ev = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (tops[i] == 0)
            continue;
        const gr_set *set = &g->sets[g->elems[c->node_pos[tops[i]]].arg];
        if (!grow((void **)&m->ev, &m->cap_ev, (size_t)m->n_ev + 2 * set->n + 1, sizeof *m->ev))
            return nomem();
        for (uint32_t k = 0; k < set->n; k++) {
            const gr_range r = g->ranges[set->off + k];
            m->ev[m->n_ev++] = (ivl_event){r.lo, 1};
            if (r.hi < GR_MAX_CP)
                m->ev[m->n_ev++] = (ivl_event){r.hi + 1, -1};
        }
    }
    if (m->n_ev)
        qsort(m->ev, m->n_ev, sizeof *m->ev, ev_cmp);
    uint32_t n_ivl = 1;
    for (uint32_t i = 0; i < m->n_ev; i++)
        n_ivl += m->ev[i].at > 0 && (i == 0 || m->ev[i].at != m->ev[i - 1].at);
    if (!grow((void **)&c->states, &c->cap_states, (size_t)c->n_states + 1, sizeof *c->states) ||
        !grow((void **)&c->sets, &c->cap_sets, (size_t)c->n_sets + n, 4) ||
        !grow((void **)&c->ascii, &c->cap_ascii, ((size_t)c->n_states + 1) * 128, 2))
        return nomem();
    if (c->n_ivl + n_ivl + 1 > c->cap_ivl) {
        uint32_t cap = c->cap_ivl;
        if (!grow((void **)&c->ivl_lo, &cap, (size_t)c->n_ivl + n_ivl + 1, 4))
            return nomem();
        int32_t *next = rlx__realloc(c->ivl_next, (size_t)cap * 4);
        if (next)
            c->ivl_next = next;
        uint32_t *live = next ? rlx__realloc(c->ivl_live, (size_t)cap * 4) : NULL;
        if (!live)
            return nomem(); /* ivl_lo grew alone; the capacity stays as it was */
        c->ivl_live = live;
        c->cap_ivl = cap;
    }
    gstate *s = &c->states[c->n_states];
    *s = (gstate){.set_off = c->n_sets, .set_n = n, .ivl_off = c->n_ivl, .ivl_n = n_ivl, .hash = hash};
    s->can_end = n > 0 && tops[0] == 0;
    memcpy(c->sets + c->n_sets, tops, (size_t)n * 4);
    uint32_t *lo = c->ivl_lo + s->ivl_off, *live = c->ivl_live + s->ivl_off;
    int32_t *next = c->ivl_next + s->ivl_off;
    int32_t depth = 0;
    uint32_t k = 0, e = 0;
    lo[0] = 0;
    while (e < m->n_ev && m->ev[e].at == 0)
        depth += m->ev[e++].delta;
    live[0] = 0;
    next[0] = depth > 0 ? T_UNKNOWN : T_DEAD;
    while (e < m->n_ev) {
        const uint32_t at = m->ev[e].at;
        while (e < m->n_ev && m->ev[e].at == at)
            depth += m->ev[e++].delta;
        live[k + 1] = live[k] + (next[k] != T_DEAD);
        k++;
        lo[k] = at;
        next[k] = depth > 0 ? T_UNKNOWN : T_DEAD;
    }
    live[k + 1] = live[k] + (next[k] != T_DEAD);
    uint16_t *ascii = c->ascii + (size_t)c->n_states * 128;
    for (uint32_t b = 0, q = 0; b < 128; b++) {
        while (q + 1 < n_ivl && lo[q + 1] <= b)
            q++;
        ascii[b] = n_ivl < ASCII_NONE ? (uint16_t)q : ASCII_NONE;
    }
    for (uint32_t b = 0xC2; b <= 0xF4; b++) {
        uint32_t a, z;
        const uint8_t pre = (uint8_t)b;
        gr_utf8_span(&pre, 1, gr_utf8_more(pre) + 1, &a, &z);
        if (span_live(c, s, a, z))
            s->lead_ok |= 1ULL << (b - 0xC0);
    }
    c->n_sets += n;
    c->n_ivl += n_ivl + 1;
    const uint32_t id = c->n_states++;
    c->state_tab[j] = id + 1;
    *out = id;
    return RLX_OK;
}

// ---- expanding a step

static rlx_status work_push(rlx_grammar_matcher *m, uint32_t pos, uint32_t parent) {
    if (!grow((void **)&m->work, &m->cap_work, (size_t)m->n_work + 1, sizeof *m->work))
        return nomem();
    m->work[m->n_work++] = (uint64_t)pos << 32 | parent;
    return RLX_OK;
}

/* Adds key to the positions this expansion has seen: 1 if new, 0 if seen, negative on error. */
static int seen_add(rlx_grammar_matcher *m, uint64_t key) {
    if ((size_t)(m->n_seen + 1) * 2 > m->seen_cap) {
        const uint32_t cap = m->seen_cap ? m->seen_cap * 2 : 256;
        uint64_t *k = rlx__malloc((size_t)cap * sizeof *k);
        uint32_t *gen = rlx__calloc(cap, sizeof *gen);
        if (!k || !gen) {
            free(k);
            free(gen);
            return nomem();
        }
        for (uint32_t i = 0; i < m->seen_cap; i++)
            if (m->seen_gen[i] == m->gen) {
                uint32_t q = mix(m->seen[i]) & (cap - 1);
                while (gen[q] == m->gen)
                    q = (q + 1) & (cap - 1);
                k[q] = m->seen[i];
                gen[q] = m->gen;
            }
        free(m->seen);
        free(m->seen_gen);
        m->seen = k;
        m->seen_gen = gen;
        m->seen_cap = cap;
    }
    const uint32_t mask = m->seen_cap - 1;
    uint32_t q = mix(key) & mask;
    for (; m->seen_gen[q] == m->gen; q = (q + 1) & mask)
        if (m->seen[q] == key)
            return 0;
    m->seen[q] = key;
    m->seen_gen[q] = m->gen;
    m->n_seen++;
    return 1;
}

static int u32_cmp(const void *a, const void *b) {
    const uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

/* Expands m->work (positions, each with the stack to return to) into the state of the stacks
 * they lead to: STEP_OK with *out, STEP_AMBIGUOUS past the bounds, or an error. */
static int expand(rlx_grammar_matcher *m, gcache *c, uint32_t *out) {
    const rlx_grammar *g = m->g;
    if (++m->gen == 0) { /* the generation wrapped: every slot is stale */
        if (m->seen_gen)
            memset(m->seen_gen, 0, (size_t)m->seen_cap * sizeof *m->seen_gen);
        m->gen = 1;
    }
    m->n_seen = 0;
    m->n_tops = 0;
    rlx_status st;
    while (m->n_work) {
        const uint64_t item = m->work[--m->n_work];
        const int fresh = seen_add(m, item);
        if (fresh < 0)
            return fresh;
        if (!fresh)
            continue;
        if (m->n_seen > GR_MAX_CLOSURE)
            return STEP_AMBIGUOUS;
        const uint32_t pos = (uint32_t)(item >> 32), parent = (uint32_t)item;
        const gr_elem e = g->elems[pos];
        if (e.kind == GR_END) {
            if (parent == 0) {
                if (!grow((void **)&m->tops, &m->cap_tops, (size_t)m->n_tops + 1, 4))
                    return nomem();
                m->tops[m->n_tops++] = 0;
            } else if ((st = work_push(m, c->node_pos[parent], c->node_parent[parent])) != RLX_OK) {
                return st;
            }
        } else if (e.kind == GR_CHARS) {
            uint32_t id;
            if ((st = cons(c, pos, parent, &id)) != RLX_OK)
                return st;
            if (m->n_tops >= GR_MAX_STACKS)
                return STEP_AMBIGUOUS;
            if (!grow((void **)&m->tops, &m->cap_tops, (size_t)m->n_tops + 1, 4))
                return nomem();
            m->tops[m->n_tops++] = id;
        } else {
            uint32_t cont = parent;
            if (g->elems[pos + 1].kind != GR_END && (st = cons(c, pos + 1, parent, &cont)) != RLX_OK)
                return st;
            for (uint32_t a = g->rule_alts[e.arg]; a < g->rule_alts[e.arg + 1]; a++)
                if ((st = work_push(m, g->alts[a], cont)) != RLX_OK)
                    return st;
        }
    }
    if (m->n_tops)
        qsort(m->tops, m->n_tops, 4, u32_cmp);
    uint32_t n = 0;
    for (uint32_t i = 0; i < m->n_tops; i++) /* only the empty stack can come twice */
        if (n == 0 || m->tops[i] != m->tops[n - 1])
            m->tops[n++] = m->tops[i];
    m->n_tops = n;
    if (n == 0)
        return STEP_NO;
    st = intern(m, c, out);
    return st != RLX_OK ? st : STEP_OK;
}

// ---- collection

/* Which nodes of the old cache were copied, and as what: open addressing over old id + 1,
 * sized for every node under the states kept (a copy touches no others). */
typedef struct node_map {
    uint32_t *old, *now;
    uint32_t cap;
} node_map;

static uint32_t *map_slot(node_map *nm, uint32_t id) {
    uint32_t j = mix(id) & (nm->cap - 1);
    while (nm->old[j] && nm->old[j] != id + 1)
        j = (j + 1) & (nm->cap - 1);
    return &nm->old[j];
}

/* The node in dst for node id of src (and the stack under it), made if new. */
static rlx_status copy_stack(gcache *dst, const gcache *src, node_map *nm, uint32_t id, uint32_t *out) {
    /* up the stack to a node already copied, then back down making each */
    uint32_t n = 0, x = id;
    while (x != 0 && !*map_slot(nm, x)) {
        n++;
        x = src->node_parent[x];
    }
    uint32_t below = x == 0 ? 0 : nm->now[map_slot(nm, x) - nm->old];
    rlx_status st;
    for (; n > 0; n--) {
        uint32_t y = id;
        for (uint32_t k = 1; k < n; k++)
            y = src->node_parent[y];
        if ((st = cons(dst, src->node_pos[y], below, &below)) != RLX_OK)
            return st;
        uint32_t *slot = map_slot(nm, y);
        *slot = y + 1;
        nm->now[slot - nm->old] = below;
    }
    *out = below;
    return RLX_OK;
}

/* The cache with only the states of the given ids kept (each renumbered in place): a fresh
 * cache is filled from the old one, which is then dropped. On failure nothing changes. */
static rlx_status collect_into(rlx_grammar_matcher *m, gcache *dst, const gcache *src, uint32_t *const *ids,
                               size_t n_ids) {
    rlx_status st = cache_init(dst);
    if (st != RLX_OK)
        return st;
    size_t nodes = 1;
    for (size_t i = 0; i < n_ids; i++) {
        const gstate *s = &src->states[*ids[i]];
        for (uint32_t k = 0; k < s->set_n; k++)
            for (uint32_t x = src->sets[s->set_off + k]; x != 0; x = src->node_parent[x])
                nodes++;
    }
    node_map nm = {0};
    nm.cap = 16;
    while (nm.cap < 2 * nodes)
        nm.cap *= 2;
    nm.old = rlx__calloc(nm.cap, 4);
    nm.now = rlx__malloc((size_t)nm.cap * 4);
    uint32_t *new_ids = rlx__malloc((n_ids ? n_ids : 1) * 4);
    if (!nm.old || !nm.now || !new_ids) {
        st = nomem();
        goto fail;
    }
    for (size_t i = 0; i < n_ids; i++) {
        const gstate *s = &src->states[*ids[i]];
        m->n_tops = 0;
        if (!grow((void **)&m->tops, &m->cap_tops, s->set_n, 4)) {
            st = nomem();
            goto fail;
        }
        for (uint32_t k = 0; k < s->set_n; k++)
            if ((st = copy_stack(dst, src, &nm, src->sets[s->set_off + k], &m->tops[m->n_tops++])) != RLX_OK)
                goto fail;
        if (m->n_tops)
            qsort(m->tops, m->n_tops, 4, u32_cmp);
        if ((st = intern(m, dst, &new_ids[i])) != RLX_OK)
            goto fail;
    }
    for (size_t i = 0; i < n_ids; i++)
        *ids[i] = new_ids[i];
    free(nm.old);
    free(nm.now);
    free(new_ids);
    return RLX_OK;
fail:
    free(nm.old);
    free(nm.now);
    free(new_ids);
    cache_free(dst);
    return st;
}

/* Collects the cache when it has grown past its bound (and to twice what the last collection
 * kept), keeping the matcher's place and start and the contexts path[0, n_path) and *extra. */
static rlx_status maybe_collect(rlx_grammar_matcher *m, gctx *path, uint32_t n_path, gctx *extra) {
    const size_t bytes = cache_bytes(&m->c);
    if (bytes <= GR_CACHE_BYTES || bytes <= 2 * m->kept)
        return RLX_OK;
    uint32_t **ids = rlx__malloc(((size_t)n_path + 3) * sizeof *ids);
    if (!ids)
        return nomem();
    size_t n = 0;
    ids[n++] = &m->start;
    ids[n++] = &m->cur.state;
    ids[n++] = &extra->state;
    for (uint32_t i = 0; i < n_path; i++)
        ids[n++] = &path[i].state;
    gcache fresh;
    rlx_status st = collect_into(m, &fresh, &m->c, ids, n);
    free(ids);
    if (st != RLX_OK)
        return st;
    cache_free(&m->c);
    m->c = fresh;
    m->kept = cache_bytes(&m->c);
    for (int i = 0; i < GR_MASK_CACHE; i++) /* their keys are the old state ids */
        m->masks[i].used = 0;
    return RLX_OK;
}

// ---- stepping

/* The state after one character of interval k of *c's state, computed on first use. */
static int transition(rlx_grammar_matcher *m, gctx *c, uint32_t k, gctx *path, uint32_t n_path) {
    rlx_status st = maybe_collect(m, path, n_path, c);
    if (st != RLX_OK)
        return st;
    gcache *gc = &m->c;
    const gstate *s = &gc->states[c->state];
    const uint32_t cp = gc->ivl_lo[s->ivl_off + k];
    m->n_work = 0;
    for (uint32_t i = 0; i < s->set_n; i++) {
        const uint32_t top = gc->sets[s->set_off + i];
        if (top != 0 && set_has(m->g, m->g->elems[gc->node_pos[top]].arg, cp) &&
            (st = work_push(m, gc->node_pos[top] + 1, gc->node_parent[top])) != RLX_OK)
            return st;
    }
    const uint32_t from = c->state;
    uint32_t next = NONE;
    const int r = expand(m, gc, &next);
    if (r < 0)
        return r;
    const gstate *f = &m->c.states[from];
    m->c.ivl_next[f->ivl_off + k] = r == STEP_OK ? (int32_t)next : r == STEP_AMBIGUOUS ? T_AMBIGUOUS : T_DEAD;
    return r;
}

/* Moves *c past byte b: STEP_OK, STEP_NO when the grammar refuses it, STEP_AMBIGUOUS past the
 * bounds, or an error. path[0, n_path) are contexts a collection must keep. */
static inline int step(rlx_grammar_matcher *m, gctx *c, uint8_t b, gctx *path, uint32_t n_path) {
    const gstate *s = &m->c.states[c->state];
    uint32_t cp;
    if (c->n_pre == 0) {
        if (b >= 0x80) {
            if (b < 0xC2 || b > 0xF4 || !(s->lead_ok >> (b - 0xC0) & 1))
                return STEP_NO;
            c->pre[0] = b;
            c->n_pre = 1;
            return STEP_OK;
        }
        cp = b;
    } else {
        const int need = gr_utf8_more(c->pre[0]) + 1;
        if (!gr_utf8_cont_ok(c->pre, c->n_pre, b))
            return STEP_NO;
        if (c->n_pre + 1 < need) {
            uint8_t pre[3] = {c->pre[0], c->pre[1], c->pre[2]};
            pre[c->n_pre] = b;
            uint32_t lo, hi;
            gr_utf8_span(pre, c->n_pre + 1, need, &lo, &hi);
            if (!span_live(&m->c, s, lo, hi))
                return STEP_NO;
            c->pre[c->n_pre++] = b;
            return STEP_OK;
        }
        static const uint8_t lead_bits[5] = {0, 0x7F, 0x1F, 0x0F, 0x07};
        cp = c->pre[0] & lead_bits[need];
        for (int i = 1; i < c->n_pre; i++)
            cp = cp << 6 | (c->pre[i] & 0x3F);
        cp = cp << 6 | (b & 0x3F);
    }
    uint32_t k = cp < 128 ? m->c.ascii[(size_t)c->state * 128 + cp] : ASCII_NONE;
    if (k == ASCII_NONE)
        k = ivl_find(&m->c, s, cp);
    int32_t next = m->c.ivl_next[s->ivl_off + k];
    if (next == T_UNKNOWN) {
        const int r = transition(m, c, k, path, n_path);
        if (r < 0)
            return r;
        const gstate *now = &m->c.states[c->state]; /* renumbered if the cache was collected */
        next = m->c.ivl_next[now->ivl_off + ivl_find(&m->c, now, cp)];
    }
    if (next == T_DEAD)
        return STEP_NO;
    if (next == T_AMBIGUOUS)
        return STEP_AMBIGUOUS;
    c->state = (uint32_t)next;
    c->n_pre = 0;
    return STEP_OK;
}

/* Walks bytes from *c: STEP_OK with *c past them, or why not; *at is where it stopped. */
static int walk(rlx_grammar_matcher *m, gctx *c, const uint8_t *bytes, size_t len, size_t *at) {
    for (size_t i = 0; i < len; i++) {
        const int r = step(m, c, bytes[i], NULL, 0);
        if (r != STEP_OK) {
            *at = i;
            return r;
        }
    }
    return STEP_OK;
}

// ---- the matcher

rlx_status rlx_grammar_matcher_create(const rlx_grammar *g, const rlx_grammar_vocab *v, rlx_grammar_matcher **out) {
    if (!out)
        return rlx_error(RLX_E_INVALID, "rlx_grammar_matcher_create: out is NULL");
    *out = NULL;
    if (!g || !v)
        return rlx_error(RLX_E_INVALID, "rlx_grammar_matcher_create: %s is NULL", g ? "the vocabulary" : "the grammar");
    rlx_grammar_matcher *m = rlx__calloc(1, sizeof *m);
    if (!m)
        return nomem();
    m->g = g;
    m->v = v;
    rlx_status st = cache_init(&m->c);
    if (st != RLX_OK) {
        free(m);
        return st;
    }
    m->path = rlx__malloc(((size_t)v->max_depth + 1) * sizeof *m->path);
    m->n_bits = ((size_t)v->n_tokens + 63) / 64;
    if (!m->path) {
        rlx_grammar_matcher_destroy(m);
        return nomem();
    }
    int r = work_push(m, 0, 0);
    if (r == RLX_OK)
        r = expand(m, &m->c, &m->start);
    if (r != STEP_OK) {
        rlx_grammar_matcher_destroy(m);
        if (r == STEP_AMBIGUOUS)
            return rlx_error(RLX_E_INVALID,
                             "grammar: more than %u parses are alive at the start (or %u positions "
                             "expanded): the grammar is too ambiguous",
                             GR_MAX_STACKS, GR_MAX_CLOSURE);
        return r < 0 ? r : rlx_error(RLX_E_INTERNAL, "grammar: no parse at the start");
    }
    m->cur = (gctx){.state = m->start};
    m->kept = cache_bytes(&m->c);
    *out = m;
    return RLX_OK;
}

void rlx_grammar_matcher_destroy(rlx_grammar_matcher *m) {
    if (!m)
        return;
    cache_free(&m->c);
    free(m->work);
    free(m->seen);
    free(m->seen_gen);
    free(m->tops);
    free(m->ev);
    free(m->path);
    free(m->bits);
    for (int i = 0; i < GR_MASK_CACHE; i++)
        free(m->masks[i].bits);
    free(m);
}

static int is_end(int32_t token, const int32_t *end_ids, size_t n_end) {
    for (size_t i = 0; i < n_end; i++)
        if (end_ids && end_ids[i] == token)
            return 1;
    return 0;
}

int rlx_grammar_matcher_can_end(const rlx_grammar_matcher *m) {
    return m && m->cur.n_pre == 0 && m->c.states[m->cur.state].can_end;
}

int rlx_grammar_matcher_is_done(const rlx_grammar_matcher *m) {
    if (!rlx_grammar_matcher_can_end(m))
        return 0;
    const gstate *s = &m->c.states[m->cur.state];
    return m->c.ivl_live[s->ivl_off + s->ivl_n] == 0;
}

int rlx_grammar_matcher_allows(const rlx_grammar_matcher *cm, int32_t token, const int32_t *end_ids, size_t n_end) {
    if (!cm)
        return 0;
    if (is_end(token, end_ids, n_end))
        return rlx_grammar_matcher_can_end(cm);
    const char *bytes;
    size_t len, at;
    if (rlx__token_bytes(cm->v->tok, token, &bytes, &len) != 0 || len == 0)
        return 0;
    /* the walk fills the cache: logically const, and a matcher is one thread's */
    rlx_grammar_matcher *m = (rlx_grammar_matcher *)cm;
    gctx c = m->cur;
    return walk(m, &c, (const uint8_t *)bytes, len, &at) == STEP_OK;
}

/* The ids whose bytes the grammar allows from the matcher's place, into m->bits: the prefix
 * tree in preorder, a refused byte skipping its subtree. */
static int64_t walk_trie(rlx_grammar_matcher *m) {
    const rlx_grammar_vocab *v = m->v;
    memset(m->bits, 0, m->n_bits * 8);
    m->ambiguous = 0;
    gctx *ctx = m->path;
    ctx[0] = m->cur;
    for (uint32_t i = 0; i < v->n_nodes;) {
        const uint32_t d = v->depth[i];
        gctx c = ctx[d - 1];
        const int r = step(m, &c, v->byte[i], ctx, d);
        if (r < 0)
            return r;
        if (r != STEP_OK) {
            m->ambiguous |= r == STEP_AMBIGUOUS;
            i = v->skip[i];
            continue;
        }
        ctx[d] = c;
        for (uint32_t k = v->tok_off[i]; k < v->tok_off[i + 1]; k++)
            m->bits[v->ids[k] >> 6] |= 1ULL << (v->ids[k] & 63);
        i++;
    }
    return 0;
}

int64_t rlx_grammar_matcher_mask(rlx_grammar_matcher *m, float *logits, int64_t n_vocab, const int32_t *end_ids,
                                 size_t n_end) {
    if (!m || (!logits && n_vocab > 0) || n_vocab < 0)
        return rlx_error(RLX_E_INVALID, "rlx_grammar_matcher_mask: %s", !m ? "matcher is NULL" : "bad logits");
    const rlx_grammar_vocab *v = m->v;
    if (!m->bits && !(m->bits = rlx__malloc((m->n_bits ? m->n_bits : 1) * 8)))
        return rlx_error(RLX_E_NOMEM, "cannot allocate the grammar mask of %d ids", v->n_tokens);
    const uint64_t *bits = m->bits;
    mask_entry *hit = NULL, *slot = &m->masks[0];
    for (int i = 0; i < GR_MASK_CACHE; i++) {
        mask_entry *e = &m->masks[i];
        if (e->used && e->at.state == m->cur.state && e->at.n_pre == m->cur.n_pre &&
            memcmp(e->at.pre, m->cur.pre, m->cur.n_pre) == 0)
            hit = e;
        if (e->used < slot->used)
            slot = e;
    }
    if (hit) {
        hit->used = ++m->clock;
        bits = hit->bits;
        m->ambiguous = hit->ambiguous;
    } else {
        const int64_t r = walk_trie(m);
        if (r < 0)
            return r;
        /* remembered when there is memory for it (a cache: nothing fails without it) */
        if (!slot->bits)
            slot->bits = rlx__malloc((m->n_bits ? m->n_bits : 1) * 8);
        if (slot->bits) {
            memcpy(slot->bits, m->bits, m->n_bits * 8);
            slot->at = m->cur;
            slot->used = ++m->clock;
            slot->ambiguous = m->ambiguous;
        }
    }
    /* the end ids' bits say can_end, whatever their bytes; then each word of 64 ids at once */
    const int can_end = rlx_grammar_matcher_can_end(m);
    if (bits != m->bits)
        memcpy(m->bits, bits, m->n_bits * 8);
    for (size_t k = 0; k < n_end && end_ids; k++)
        if (end_ids[k] >= 0 && end_ids[k] < v->n_tokens) {
            const uint64_t bit = 1ULL << (end_ids[k] & 63);
            m->bits[end_ids[k] >> 6] = can_end ? m->bits[end_ids[k] >> 6] | bit : m->bits[end_ids[k] >> 6] & ~bit;
        }
    const int64_t in_vocab = n_vocab < v->n_tokens ? n_vocab : v->n_tokens;
    int64_t allowed = 0;
    for (int64_t w = 0; w * 64 < in_vocab; w++) {
        const int64_t n = in_vocab - w * 64 < 64 ? in_vocab - w * 64 : 64;
        const uint64_t word = m->bits[w] & (n == 64 ? ~0ULL : (1ULL << n) - 1);
        allowed += __builtin_popcountll(word);
        if (word == ~0ULL)
            continue;
        float *l = logits + w * 64;
        for (int64_t i = 0; i < n; i++)
            if (!(word >> i & 1))
                l[i] = -INFINITY;
    }
    for (int64_t i = in_vocab; i < n_vocab; i++) { /* past the tokenizer: only end ids */
        if (can_end && is_end((int32_t)i, end_ids, n_end))
            allowed++;
        else
            logits[i] = -INFINITY;
    }
    if (allowed == 0) { /* the count says it; the message says why */
        if (m->ambiguous)
            rlx_error(RLX_E_INVALID,
                      "grammar: every token that could come next would keep more than %u parses alive (or expand "
                      "%u positions): the grammar is too ambiguous",
                      GR_MAX_STACKS, GR_MAX_CLOSURE);
        else
            rlx_error(RLX_E_INVALID, "grammar: no token of the vocabulary can come next");
    }
    return allowed;
}

static rlx_status refused(int r, const char *what, size_t at) {
    if (r < 0)
        return r;
    if (r == STEP_AMBIGUOUS)
        return rlx_error(RLX_E_INVALID,
                         "grammar: %s at byte %zu would keep more than %u parses alive (or expand %u positions): the "
                         "grammar is too ambiguous",
                         what, at, GR_MAX_STACKS, GR_MAX_CLOSURE);
    return rlx_error(RLX_E_INVALID, "grammar: %s is not allowed here (refused at its byte %zu)", what, at);
}

rlx_status rlx_grammar_matcher_accept(rlx_grammar_matcher *m, int32_t token) {
    if (!m)
        return rlx_error(RLX_E_INVALID, "rlx_grammar_matcher_accept: matcher is NULL");
    const char *bytes;
    size_t len, at = 0;
    const int kind = rlx__token_bytes(m->v->tok, token, &bytes, &len);
    if (kind < 0)
        return rlx_error(RLX_E_INVALID, "grammar: token %d is not in the vocabulary", token);
    if (kind > 0 || len == 0)
        return rlx_error(RLX_E_INVALID, "grammar: token %d is %s, which matches no grammar text", token,
                         kind > 0 ? "a special token" : "empty");
    gctx c = m->cur;
    const int r = walk(m, &c, (const uint8_t *)bytes, len, &at);
    if (r != STEP_OK) {
        char what[64];
        snprintf(what, sizeof what, "token %d", token);
        return refused(r, what, at);
    }
    m->cur = c;
    return RLX_OK;
}

rlx_status rlx_grammar_matcher_accept_bytes(rlx_grammar_matcher *m, const char *text, size_t len) {
    if (!m || (!text && len))
        return rlx_error(RLX_E_INVALID, "rlx_grammar_matcher_accept_bytes: NULL argument");
    gctx c = m->cur;
    size_t at = 0;
    const int r = walk(m, &c, (const uint8_t *)text, len, &at);
    if (r != STEP_OK)
        return refused(r, "the text", at);
    m->cur = c;
    return RLX_OK;
}

rlx_status rlx_grammar_matcher_clone(const rlx_grammar_matcher *m, rlx_grammar_matcher **out) {
    if (!out)
        return rlx_error(RLX_E_INVALID, "rlx_grammar_matcher_clone: out is NULL");
    *out = NULL;
    if (!m)
        return rlx_error(RLX_E_INVALID, "rlx_grammar_matcher_clone: matcher is NULL");
    rlx_grammar_matcher *k = rlx__calloc(1, sizeof *k);
    if (!k)
        return nomem();
    k->g = m->g;
    k->v = m->v;
    k->start = m->start;
    k->cur = m->cur;
    k->path = rlx__malloc(((size_t)m->v->max_depth + 1) * sizeof *k->path);
    k->n_bits = m->n_bits;
    rlx_status st = k->path ? RLX_OK : nomem();
    uint32_t *ids[2] = {&k->start, &k->cur.state};
    if (st == RLX_OK)
        st = collect_into(k, &k->c, &m->c, ids, 2);
    if (st != RLX_OK) {
        rlx_grammar_matcher_destroy(k);
        return st;
    }
    k->kept = cache_bytes(&k->c);
    *out = k;
    return RLX_OK;
}

void rlx_grammar_matcher_reset(rlx_grammar_matcher *m) {
    if (m)
        m->cur = (gctx){.state = m->start};
}
