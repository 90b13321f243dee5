/* The compiled form of a GBNF grammar: grammar.c builds it, grammar_match.c runs it.
 *
 * A grammar is a flat array of elements. Each rule's alternatives are runs of elements ended by
 * GR_END; an element is a character set (a sorted list of disjoint code point ranges) or a
 * reference to a rule. Repetitions and groups were turned into generated rules by the compiler,
 * alternatives that can never match any text were dropped, and no rule can reach itself without
 * consuming a character (left recursion is refused), so a pushdown matcher over these elements
 * always makes progress. Elements 0 and 1 are `REF root` and `END`: the start. */
#ifndef RLX_GEN_GRAMMAR_INTERNAL_H
#define RLX_GEN_GRAMMAR_INTERNAL_H

#include <stdint.h>

#include "rlx/grammar.h"

/* The largest Unicode scalar value; surrogates (U+D800..U+DFFF) are never in a set. */
#define GR_MAX_CP 0x10FFFFu

typedef enum gr_kind { GR_END, GR_CHARS, GR_REF } gr_kind;

typedef struct gr_elem {
    uint32_t kind; /* gr_kind */
    uint32_t arg;  /* GR_CHARS: index into sets; GR_REF: rule index */
} gr_elem;

typedef struct gr_range {
    uint32_t lo, hi; /* inclusive */
} gr_range;

typedef struct gr_set {
    uint32_t off, n; /* ranges[off .. off + n): sorted, disjoint, not adjacent (n = 0: matches nothing) */
} gr_set;

struct rlx_grammar {
    gr_elem *elems;
    uint32_t n_elems;
    gr_set *sets;
    uint32_t n_sets;
    gr_range *ranges;
    uint32_t n_ranges;
    /* rule r's alternatives begin at elems[alts[i]] for i in [rule_alts[r], rule_alts[r + 1]) */
    uint32_t *rule_alts;
    uint32_t *alts;
    uint32_t n_rules;
};

/* ---- UTF-8, as the tokenizer's decoder validates it (no overlong forms, no surrogates) */

/* Continuation bytes a lead byte needs, or -1 for a byte that cannot start a character. */
static inline int gr_utf8_more(uint8_t b) {
    if (b < 0x80)
        return 0;
    if (b >= 0xC2 && b <= 0xDF)
        return 1;
    if (b >= 0xE0 && b <= 0xEF)
        return 2;
    if (b >= 0xF0 && b <= 0xF4)
        return 3;
    return -1;
}

/* Whether b may follow the n bytes pre[0, n) of a character (1 <= n <= 3, pre a valid start). */
static inline int gr_utf8_cont_ok(const uint8_t *pre, int n, uint8_t b) {
    uint8_t lo = 0x80, hi = 0xBF;
    if (n == 1) {
        if (pre[0] == 0xE0)
            lo = 0xA0;
        else if (pre[0] == 0xED)
            hi = 0x9F;
        else if (pre[0] == 0xF0)
            lo = 0x90;
        else if (pre[0] == 0xF4)
            hi = 0x8F;
    }
    return b >= lo && b <= hi;
}

/* The code points whose UTF-8 starts with the valid partial sequence pre[0, n) of a character of
 * need bytes in all: [*lo, *hi]. */
static inline void gr_utf8_span(const uint8_t *pre, int n, int need, uint32_t *lo, uint32_t *hi) {
    static const uint8_t lead_bits[5] = {0, 0x7F, 0x1F, 0x0F, 0x07};
    uint32_t a = pre[0] & lead_bits[need], b = a;
    for (int i = 1; i < need; i++) {
        uint32_t c = i < n ? (uint32_t)(pre[i] & 0x3F) : 0;
        a = a << 6 | c;
        b = b << 6 | (i < n ? c : 0x3F);
    }
    /* a lone lead byte leaves the overlong forms (E0, F0) and the surrogates (ED) to clamp away */
    static const uint32_t min_of[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (a < min_of[need])
        a = min_of[need];
    if (b > GR_MAX_CP)
        b = GR_MAX_CP;
    if (need == 3 && a < 0xD800 && b >= 0xD800)
        b = 0xD7FF;
    *lo = a;
    *hi = b;
}

#endif
