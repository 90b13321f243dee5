/* GBNF into the compiled form of grammar_internal.h.
 *
 * The language is llama.cpp's (its grammars/README.md): `name ::= alternatives` rules, string
 * literals, character classes, `.`, rule references, groups, `* + ?` and `{m}`, `{m,}`,
 * `{m,n}` repetitions, `#` comments; a rule ends at a newline unless the newline is inside a
 * group or follows `|` or `::=`. Groups and repetitions become generated rules: `x*` is
 * `s ::= x s |`, `x{m,n}` is m copies of x followed by n - m nested optional rules, so the
 * matcher only ever sees sequences, alternatives and references.
 *
 * After parsing, the compiler drops every alternative that can never match a finite text (it
 * refers to a rule that cannot end, or to an empty character class), so a matcher never lets a
 * sequence into a dead end, and refuses left recursion, where a rule can reach itself without
 * consuming a character, since a pushdown matcher would expand it forever. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gen/grammar_internal.h"
#include "util/alloc.h"

/* Bounds on what one grammar may cost. The text cap keeps every count below in 32 bits; the
 * rule and element caps bound the compiled size (8 bytes an element) after repetitions are
 * expanded, which is where a short text can ask for a large grammar; the repetition cap is far
 * above any real {m,n} (JSON schema lengths) and keeps the expansion of one of them cheap to
 * refuse; the nesting cap bounds the parser's recursion on groups. */
#define GR_MAX_TEXT (16u << 20)
#define GR_MAX_RULES (1u << 18)
#define GR_MAX_ELEMS (1u << 21)
#define GR_MAX_REPEAT 100000u
#define GR_MAX_NESTING 256

#define NONE UINT32_MAX
#define AT_NONE SIZE_MAX

typedef enum { RULE_NAMED, RULE_GROUP, RULE_REPEAT } rule_origin;

typedef struct prule {
    const char *name; /* in the text; NULL for a generated rule */
    uint32_t name_len;
    rule_origin origin;
    uint32_t parent; /* generated: the named rule it is written in */
    size_t def_at;   /* named: where it is defined (AT_NONE: not yet); generated: where it comes from */
    size_t ref_at;   /* named: its first reference */
    gr_elem *body;   /* alternatives, each ended by GR_END */
    uint32_t n_body, cap_body;
} prule;

typedef struct parser {
    const char *s;
    size_t len, pos;
    prule *rules;
    uint32_t n_rules, cap_rules;
    uint32_t *names; /* open addressing: rule index + 1, 0 = empty */
    uint32_t names_cap;
    uint32_t n_named;
    size_t n_elems; /* over every body */
    gr_set *sets;
    uint32_t n_sets, cap_sets;
    gr_range *ranges;
    uint32_t n_ranges, cap_ranges;
    gr_range *tmp; /* a character class's ranges before normalizing */
    uint32_t n_tmp, cap_tmp;
    uint32_t current; /* the named rule being parsed */
} parser;

// ---- errors

/* Line and column (1-based; the column counts characters) of byte offset at. */
static void line_col(const parser *p, size_t at, size_t *line, size_t *col) {
    size_t l = 1, start = 0;
    for (size_t i = 0; i < at && i < p->len; i++)
        if (p->s[i] == '\n') {
            l++;
            start = i + 1;
        }
    size_t c = 1;
    for (size_t i = start; i < at && i < p->len; i++)
        c += ((uint8_t)p->s[i] & 0xC0) != 0x80;
    *line = l;
    *col = c;
}

__attribute__((format(printf, 3, 4))) static rlx_status perr(const parser *p, size_t at, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    size_t line, col;
    line_col(p, at, &line, &col);
    return rlx_error(RLX_E_INVALID, "grammar: line %zu column %zu: %s", line, col, msg);
}

static rlx_status nomem(const char *what) { return rlx_error(RLX_E_NOMEM, "grammar: cannot allocate %s", what); }

/* A rule as messages name it: 'name', or where a generated one comes from. */
static void rule_label(const parser *p, uint32_t r, char *buf, size_t size) {
    const prule *x = &p->rules[r];
    if (x->name) {
        snprintf(buf, size, "'%.*s'", (int)(x->name_len < 64 ? x->name_len : 64), x->name);
        return;
    }
    size_t line, col;
    line_col(p, x->def_at, &line, &col);
    const prule *in = &p->rules[x->parent];
    snprintf(buf, size, "the %s at line %zu column %zu of '%.*s'", x->origin == RULE_GROUP ? "group" : "repetition",
             line, col, (int)(in->name_len < 64 ? in->name_len : 64), in->name);
}

// ---- growable arrays

static int grow(void **v, uint32_t *cap, uint32_t need, size_t elem) {
    if (need <= *cap)
        return 1;
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

static rlx_status new_rule(parser *p, rule_origin origin, size_t at, uint32_t *out) {
    if (p->n_rules >= GR_MAX_RULES)
        return perr(p, at, "the grammar needs more than %u rules (groups and repetitions count)", GR_MAX_RULES);
    if (!grow((void **)&p->rules, &p->cap_rules, p->n_rules + 1, sizeof *p->rules))
        return nomem("grammar rules");
    prule *r = &p->rules[p->n_rules];
    memset(r, 0, sizeof *r);
    r->origin = origin;
    r->parent = p->current;
    r->def_at = at;
    r->ref_at = AT_NONE;
    *out = p->n_rules++;
    return RLX_OK;
}

static rlx_status push(parser *p, uint32_t r, gr_kind kind, uint32_t arg, size_t at) {
    if (p->n_elems >= GR_MAX_ELEMS)
        return perr(p, at, "the grammar is larger than %u elements once repetitions are expanded", GR_MAX_ELEMS);
    prule *x = &p->rules[r];
    if (!grow((void **)&x->body, &x->cap_body, x->n_body + 1, sizeof *x->body))
        return nomem("grammar elements");
    x->body[x->n_body++] = (gr_elem){kind, arg};
    p->n_elems++;
    return RLX_OK;
}

// ---- names

static uint32_t hash_name(const char *s, size_t n) {
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (uint8_t)s[i]) * 16777619u;
    return h;
}

/* The named rule called s[0, n), created (undefined) if new. */
static rlx_status rule_named(parser *p, const char *s, size_t n, size_t at, uint32_t *out) {
    if ((p->n_named + 1) * 3 > p->names_cap * 2) {
        uint32_t cap = p->names_cap ? p->names_cap * 2 : 64;
        uint32_t *t = rlx__calloc(cap, sizeof *t);
        if (!t)
            return nomem("the rule names");
        for (uint32_t i = 0; i < p->names_cap; i++)
            if (p->names[i]) {
                const prule *r = &p->rules[p->names[i] - 1];
                uint32_t j = hash_name(r->name, r->name_len) & (cap - 1);
                while (t[j])
                    j = (j + 1) & (cap - 1);
                t[j] = p->names[i];
            }
        free(p->names);
        p->names = t;
        p->names_cap = cap;
    }
    uint32_t j = hash_name(s, n) & (p->names_cap - 1);
    for (; p->names[j]; j = (j + 1) & (p->names_cap - 1)) {
        const prule *r = &p->rules[p->names[j] - 1];
        if (r->name_len == n && memcmp(r->name, s, n) == 0) {
            *out = p->names[j] - 1;
            return RLX_OK;
        }
    }
    rlx_status st = new_rule(p, RULE_NAMED, AT_NONE, out);
    if (st != RLX_OK)
        return st;
    prule *r = &p->rules[*out];
    r->name = s;
    r->name_len = (uint32_t)n;
    r->ref_at = at;
    p->names[j] = *out + 1;
    p->n_named++;
    return RLX_OK;
}

static const prule *find_named(const parser *p, const char *s, size_t n) {
    if (!p->names_cap)
        return NULL;
    for (uint32_t j = hash_name(s, n) & (p->names_cap - 1); p->names[j]; j = (j + 1) & (p->names_cap - 1)) {
        const prule *r = &p->rules[p->names[j] - 1];
        if (r->name_len == n && memcmp(r->name, s, n) == 0)
            return r;
    }
    return NULL;
}

// ---- character sets

static int range_cmp(const void *a, const void *b) {
    const gr_range *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

static int add_range(parser *p, uint32_t lo, uint32_t hi) {
    if (!grow((void **)&p->ranges, &p->cap_ranges, p->n_ranges + 1, sizeof *p->ranges))
        return 0;
    p->ranges[p->n_ranges++] = (gr_range){lo, hi};
    return 1;
}

/* [lo, hi] less the surrogates. */
static int add_scalar_range(parser *p, uint32_t lo, uint32_t hi) {
    if (lo < 0xD800 && !add_range(p, lo, hi < 0xD800 ? hi : 0xD7FF))
        return 0;
    if (hi > 0xDFFF && !add_range(p, lo > 0xDFFF ? lo : 0xE000, hi))
        return 0;
    return 1;
}

/* The set of p->tmp's ranges (negated: of every other character) as a new set. */
static rlx_status make_set(parser *p, int negate, uint32_t *out) {
    if (!grow((void **)&p->sets, &p->cap_sets, p->n_sets + 1, sizeof *p->sets))
        return nomem("character sets");
    gr_range *t = p->tmp;
    uint32_t n = 0;
    if (p->n_tmp)
        qsort(t, p->n_tmp, sizeof *t, range_cmp);
    for (uint32_t i = 0; i < p->n_tmp; i++) { /* merged where they overlap or touch */
        if (n && t[i].lo <= t[n - 1].hi + 1) {
            if (t[i].hi > t[n - 1].hi)
                t[n - 1].hi = t[i].hi;
        } else {
            t[n++] = t[i];
        }
    }
    const uint32_t off = p->n_ranges;
    int ok = 1;
    if (negate) {
        uint32_t next = 0;
        for (uint32_t i = 0; i < n && ok; i++) {
            if (t[i].lo > next)
                ok = add_scalar_range(p, next, t[i].lo - 1);
            next = t[i].hi + 1;
        }
        if (ok && next <= GR_MAX_CP)
            ok = add_scalar_range(p, next, GR_MAX_CP);
    } else {
        for (uint32_t i = 0; i < n && ok; i++)
            ok = add_scalar_range(p, t[i].lo, t[i].hi);
    }
    if (!ok)
        return nomem("character ranges");
    p->sets[p->n_sets] = (gr_set){off, p->n_ranges - off};
    *out = p->n_sets++;
    p->n_tmp = 0;
    return RLX_OK;
}

static rlx_status tmp_add(parser *p, uint32_t lo, uint32_t hi) {
    if (!grow((void **)&p->tmp, &p->cap_tmp, p->n_tmp + 1, sizeof *p->tmp))
        return nomem("a character class");
    p->tmp[p->n_tmp++] = (gr_range){lo, hi};
    return RLX_OK;
}

// ---- lexing

static int is_name_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

/* Spaces, tabs and comments, and line ends when newline_ok. */
static void skip_space(parser *p, int newline_ok) {
    while (p->pos < p->len) {
        char c = p->s[p->pos];
        if (c == '#') {
            while (p->pos < p->len && p->s[p->pos] != '\n' && p->s[p->pos] != '\r')
                p->pos++;
        } else if (c == ' ' || c == '\t' || (newline_ok && (c == '\n' || c == '\r'))) {
            p->pos++;
        } else {
            break;
        }
    }
}

/* The character at p->pos (the text is valid UTF-8). */
static uint32_t next_utf8(parser *p) {
    const uint8_t *s = (const uint8_t *)p->s + p->pos;
    int more = gr_utf8_more(s[0]);
    static const uint8_t lead_bits[4] = {0x7F, 0x1F, 0x0F, 0x07};
    uint32_t c = s[0] & lead_bits[more];
    for (int i = 1; i <= more; i++)
        c = c << 6 | (s[i] & 0x3F);
    p->pos += (size_t)more + 1;
    return c;
}

static int hex_digit(char c) {
    return c >= '0' && c <= '9'   ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : -1;
}

/* One character of a literal or class, an escape or itself, into *c. */
static rlx_status parse_char(parser *p, uint32_t *c) {
    const size_t at = p->pos;
    if (p->s[at] != '\\') {
        *c = next_utf8(p);
        return RLX_OK;
    }
    if (at + 1 >= p->len)
        return perr(p, at, "unfinished escape at the end of the grammar");
    const char e = p->s[at + 1];
    int digits = e == 'x' ? 2 : e == 'u' ? 4 : e == 'U' ? 8 : 0;
    if (!digits) {
        static const char plain[] = "nrt\\\"[]", value[] = "\n\r\t\\\"[]";
        const char *k = strchr(plain, e);
        if (!e || !k)
            return perr(p, at, "unknown escape '\\%c' (known: \\n \\r \\t \\\\ \\\" \\[ \\] \\xHH \\uHHHH \\UHHHHHHHH)",
                        e ? e : '0');
        *c = (uint8_t)value[k - plain];
        p->pos += 2;
        return RLX_OK;
    }
    uint32_t v = 0;
    for (int i = 0; i < digits; i++) {
        int d = at + 2 + (size_t)i < p->len ? hex_digit(p->s[at + 2 + (size_t)i]) : -1;
        if (d < 0)
            return perr(p, at, "'\\%c' needs %d hexadecimal digits", e, digits);
        v = v << 4 | (uint32_t)d;
    }
    if (v > GR_MAX_CP || (v >= 0xD800 && v <= 0xDFFF))
        return perr(p, at, "'\\%c%.*s' is not a Unicode scalar value", e, digits, p->s + at + 2);
    *c = v;
    p->pos = at + 2 + (size_t)digits;
    return RLX_OK;
}

static rlx_status parse_count(parser *p, uint32_t *out) {
    const size_t at = p->pos;
    uint64_t v = 0;
    while (p->pos < p->len && p->s[p->pos] >= '0' && p->s[p->pos] <= '9') {
        v = v * 10 + (uint64_t)(p->s[p->pos++] - '0');
        if (v > GR_MAX_REPEAT)
            return perr(p, at, "a repetition count is at most %u", GR_MAX_REPEAT);
    }
    if (p->pos == at)
        return perr(p, at, "expected a number in the repetition");
    *out = (uint32_t)v;
    return RLX_OK;
}

// ---- rules

static rlx_status parse_alternates(parser *p, uint32_t r, int nested, int depth);
static rlx_status unexpected(const parser *p);

/* Repeats the term body[term ..] of rule r between min and max times (NONE: unbounded). */
static rlx_status repeat(parser *p, uint32_t r, uint32_t term, uint32_t min, uint32_t max, size_t at) {
    const uint32_t n_term = p->rules[r].n_body - term;
    if (n_term == 0) /* "" repeated is still the empty text */
        return RLX_OK;
    uint64_t cost = (uint64_t)min + (max == NONE ? 4 : 4 * (uint64_t)(max - min)) + n_term;
    if (p->n_elems + cost > GR_MAX_ELEMS)
        return perr(p, at, "the grammar is larger than %u elements once repetitions are expanded", GR_MAX_ELEMS);
    rlx_status st;
    gr_elem x = p->rules[r].body[term];
    if (n_term > 1) { /* a sequence repeats as one generated rule */
        uint32_t g;
        if ((st = new_rule(p, RULE_REPEAT, at, &g)) != RLX_OK)
            return st;
        for (uint32_t i = 0; i < n_term; i++) {
            gr_elem e = p->rules[r].body[term + i];
            if ((st = push(p, g, (gr_kind)e.kind, e.arg, at)) != RLX_OK)
                return st;
        }
        if ((st = push(p, g, GR_END, 0, at)) != RLX_OK)
            return st;
        x = (gr_elem){GR_REF, g};
    }
    p->rules[r].n_body = term;
    p->n_elems -= n_term;
    for (uint32_t i = 0; i < min; i++)
        if ((st = push(p, r, (gr_kind)x.kind, x.arg, at)) != RLX_OK)
            return st;
    if (max == NONE) { /* s ::= x s | */
        uint32_t s;
        if ((st = new_rule(p, RULE_REPEAT, at, &s)) != RLX_OK || (st = push(p, s, (gr_kind)x.kind, x.arg, at)) ||
            (st = push(p, s, GR_REF, s, at)) || (st = push(p, s, GR_END, 0, at)) || (st = push(p, s, GR_END, 0, at)) ||
            (st = push(p, r, GR_REF, s, at)))
            return st;
        return RLX_OK;
    }
    if (max == min)
        return RLX_OK;
    /* o1 ::= x o2 | ; o2 ::= x o3 | ; ... ; ok ::= x | */
    const uint32_t first = p->n_rules, k = max - min;
    for (uint32_t i = 0; i < k; i++) {
        uint32_t o;
        if ((st = new_rule(p, RULE_REPEAT, at, &o)) != RLX_OK)
            return st;
    }
    for (uint32_t i = 0; i < k; i++) {
        const uint32_t o = first + i;
        if ((st = push(p, o, (gr_kind)x.kind, x.arg, at)) != RLX_OK ||
            (i + 1 < k && (st = push(p, o, GR_REF, o + 1, at)) != RLX_OK) || (st = push(p, o, GR_END, 0, at)) ||
            (st = push(p, o, GR_END, 0, at)))
            return st;
    }
    return push(p, r, GR_REF, first, at);
}

static rlx_status parse_sequence(parser *p, uint32_t r, int nested, int depth) {
    uint32_t term = NONE; /* where the last term's elements begin in r's body */
    rlx_status st;
    while (p->pos < p->len) {
        const size_t at = p->pos;
        const char c = p->s[at];
        uint32_t set;
        if (c == '"') {
            term = p->rules[r].n_body;
            p->pos++;
            while (p->pos < p->len && p->s[p->pos] != '"') {
                uint32_t ch;
                if ((st = parse_char(p, &ch)) != RLX_OK || (st = tmp_add(p, ch, ch)) != RLX_OK ||
                    (st = make_set(p, 0, &set)) != RLX_OK || (st = push(p, r, GR_CHARS, set, at)) != RLX_OK)
                    return st;
            }
            if (p->pos >= p->len)
                return perr(p, at, "unterminated string literal");
            p->pos++;
        } else if (c == '[') {
            term = p->rules[r].n_body;
            p->pos++;
            const int negate = p->pos < p->len && p->s[p->pos] == '^';
            p->pos += (size_t)negate;
            while (p->pos < p->len && p->s[p->pos] != ']') {
                const size_t range_at = p->pos;
                uint32_t lo, hi;
                if ((st = parse_char(p, &lo)) != RLX_OK)
                    return st;
                hi = lo;
                if (p->pos + 1 < p->len && p->s[p->pos] == '-' && p->s[p->pos + 1] != ']') {
                    p->pos++;
                    if ((st = parse_char(p, &hi)) != RLX_OK)
                        return st;
                    if (hi < lo)
                        return perr(p, range_at, "character range is reversed (U+%04X after U+%04X)", hi, lo);
                }
                if ((st = tmp_add(p, lo, hi)) != RLX_OK)
                    return st;
            }
            if (p->pos >= p->len)
                return perr(p, at, "unterminated character class");
            p->pos++;
            if ((st = make_set(p, negate, &set)) != RLX_OK || (st = push(p, r, GR_CHARS, set, at)) != RLX_OK)
                return st;
        } else if (c == '.') {
            term = p->rules[r].n_body;
            p->pos++;
            if ((st = make_set(p, 1, &set)) != RLX_OK || (st = push(p, r, GR_CHARS, set, at)) != RLX_OK)
                return st;
        } else if (is_name_char(c)) {
            term = p->rules[r].n_body;
            while (p->pos < p->len && is_name_char(p->s[p->pos]))
                p->pos++;
            uint32_t ref;
            if ((st = rule_named(p, p->s + at, p->pos - at, at, &ref)) != RLX_OK ||
                (st = push(p, r, GR_REF, ref, at)) != RLX_OK)
                return st;
        } else if (c == '(') {
            if (depth >= GR_MAX_NESTING)
                return perr(p, at, "groups nest deeper than %d", GR_MAX_NESTING);
            term = p->rules[r].n_body;
            p->pos++;
            skip_space(p, 1);
            uint32_t g;
            if ((st = new_rule(p, RULE_GROUP, at, &g)) != RLX_OK ||
                (st = parse_alternates(p, g, 1, depth + 1)) != RLX_OK)
                return st;
            if (p->pos >= p->len)
                return perr(p, at, "unclosed '('");
            if (p->s[p->pos] != ')')
                return unexpected(p);
            p->pos++;
            if ((st = push(p, r, GR_REF, g, at)) != RLX_OK)
                return st;
        } else if (c == '*' || c == '+' || c == '?' || c == '{') {
            if (term == NONE)
                return perr(p, at, "'%c' does not follow anything it could repeat", c);
            uint32_t min = c == '+', max = c == '?' ? 1 : NONE;
            p->pos++;
            if (c == '{') {
                skip_space(p, nested);
                if ((st = parse_count(p, &min)) != RLX_OK)
                    return st;
                max = min;
                skip_space(p, nested);
                if (p->pos < p->len && p->s[p->pos] == ',') {
                    p->pos++;
                    skip_space(p, nested);
                    max = NONE;
                    if (p->pos < p->len && p->s[p->pos] != '}' && (st = parse_count(p, &max)) != RLX_OK)
                        return st;
                    skip_space(p, nested);
                }
                if (p->pos >= p->len || p->s[p->pos] != '}')
                    return perr(p, p->pos, "expected '}' to end the repetition");
                p->pos++;
                if (max < min)
                    return perr(p, at, "repetition {%u,%u} has its maximum below its minimum", min, max);
            }
            if ((st = repeat(p, r, term, min, max, at)) != RLX_OK)
                return st;
        } else {
            break;
        }
        skip_space(p, nested);
    }
    return RLX_OK;
}

static rlx_status parse_alternates(parser *p, uint32_t r, int nested, int depth) {
    rlx_status st;
    if ((st = parse_sequence(p, r, nested, depth)) != RLX_OK || (st = push(p, r, GR_END, 0, p->pos)) != RLX_OK)
        return st;
    while (p->pos < p->len && p->s[p->pos] == '|') {
        p->pos++;
        skip_space(p, 1);
        if ((st = parse_sequence(p, r, nested, depth)) != RLX_OK || (st = push(p, r, GR_END, 0, p->pos)) != RLX_OK)
            return st;
    }
    return RLX_OK;
}

/* What stopped a rule: a clear word on the unexpected character. */
static rlx_status unexpected(const parser *p) {
    const char c = p->s[p->pos];
    if (c == ')')
        return perr(p, p->pos, "')' without a matching '('");
    if (c == '<')
        return perr(p, p->pos, "token references (<...>) are not supported");
    if ((uint8_t)c < 0x20 || (uint8_t)c >= 0x7F)
        return perr(p, p->pos, "unexpected character (byte 0x%02X)", (uint8_t)c);
    return perr(p, p->pos, "unexpected '%c'", c);
}

static rlx_status parse_rules(parser *p) {
    rlx_status st;
    skip_space(p, 1);
    if (p->pos >= p->len)
        return perr(p, p->pos, "the grammar is empty (no rules)");
    while (p->pos < p->len) {
        const size_t at = p->pos;
        while (p->pos < p->len && is_name_char(p->s[p->pos]))
            p->pos++;
        if (p->pos == at)
            return p->s[at] == '|' ? perr(p, at, "'|' must be on the line of the alternative before it")
                                   : perr(p, at, "expected a rule name");
        const size_t name_end = p->pos;
        skip_space(p, 0);
        if (p->len - p->pos < 3 || memcmp(p->s + p->pos, "::=", 3) != 0)
            return perr(p, p->pos, "expected '::=' after the rule name '%.*s'",
                        (int)(name_end - at < 64 ? name_end - at : 64), p->s + at);
        uint32_t r;
        if ((st = rule_named(p, p->s + at, name_end - at, AT_NONE, &r)) != RLX_OK)
            return st;
        prule *x = &p->rules[r];
        if (x->def_at != AT_NONE) {
            size_t line, col;
            line_col(p, x->def_at, &line, &col);
            return perr(p, at, "rule '%.*s' is already defined at line %zu column %zu", (int)x->name_len, x->name, line,
                        col);
        }
        x->def_at = at;
        p->current = r;
        p->pos += 3;
        skip_space(p, 1);
        if ((st = parse_alternates(p, r, 0, 0)) != RLX_OK)
            return st;
        if (p->pos < p->len && p->s[p->pos] != '\n' && p->s[p->pos] != '\r')
            return unexpected(p);
        skip_space(p, 1);
    }
    return RLX_OK;
}

// ---- analysis of the flattened grammar

/* Marks the rules with property P: a rule has it when one of its alternatives has all its
 * elements with it; a character set has it when set_has[set] (counted per element, so a rule
 * met twice in an alternative counts twice). Work is linear in the grammar's size. */
typedef struct flat {
    gr_elem *elems;
    uint32_t n_elems;
    uint32_t *alt_start, *alt_rule; /* per alternative: first element, rule */
    uint8_t *alt_live;
    uint32_t n_alts;
    uint32_t *rule_first_alt; /* [n_rules + 1] */
    uint32_t *ref_off, *refs; /* the positions that refer to rule r: refs[ref_off[r] .. ref_off[r + 1]) */
    uint32_t *alt_of;         /* per element: its alternative */
} flat;

static rlx_status fixpoint(const parser *p, const flat *f, const uint8_t *set_has, uint8_t *has) {
    uint32_t *missing = rlx__calloc(f->n_alts ? f->n_alts : 1, sizeof *missing);
    uint32_t *queue = rlx__malloc(((size_t)p->n_rules + 1) * sizeof *queue);
    if (!missing || !queue) {
        free(missing);
        free(queue);
        return nomem("the grammar analysis");
    }
    uint32_t head = 0, tail = 0;
    memset(has, 0, p->n_rules);
    missing[0] = NONE; /* the start belongs to no rule */
    for (uint32_t a = 1; a < f->n_alts; a++) {
        if (!f->alt_live[a]) {
            missing[a] = NONE;
            continue;
        }
        for (uint32_t i = f->alt_start[a]; f->elems[i].kind != GR_END; i++) {
            const gr_elem e = f->elems[i];
            if (e.kind == GR_REF)
                missing[a]++;
            else if (!set_has[e.arg])
                missing[a] = NONE;
            if (missing[a] == NONE)
                break;
        }
        const uint32_t r = f->alt_rule[a];
        if (missing[a] == 0 && !has[r]) {
            has[r] = 1;
            queue[tail++] = r;
        }
    }
    while (head < tail) {
        const uint32_t r = queue[head++];
        for (uint32_t k = f->ref_off[r]; k < f->ref_off[r + 1]; k++) {
            const uint32_t a = f->alt_of[f->refs[k]];
            if (missing[a] == NONE || --missing[a] != 0)
                continue;
            const uint32_t owner = f->alt_rule[a];
            if (!has[owner]) {
                has[owner] = 1;
                queue[tail++] = owner;
            }
        }
    }
    free(missing);
    free(queue);
    return RLX_OK;
}

/* Refuses a rule that can reach itself through the first element of an alternative, or
 * through elements after a prefix that can match the empty text. */
static rlx_status check_left_recursion(const parser *p, const flat *f, const uint8_t *nullable) {
    typedef struct frame {
        uint32_t rule, alt, elem; /* the next edge to look at */
    } frame;
    uint8_t *color = rlx__calloc(p->n_rules, 1); /* 0 new, 1 on the path, 2 done */
    frame *stack = rlx__malloc(((size_t)p->n_rules + 1) * sizeof *stack);
    if (!color || !stack) {
        free(color);
        free(stack);
        return nomem("the grammar analysis");
    }
    rlx_status st = RLX_OK;
    for (uint32_t start = 0; start < p->n_rules && st == RLX_OK; start++) {
        if (color[start])
            continue;
        uint32_t depth = 0;
        stack[depth++] = (frame){start, f->rule_first_alt[start], NONE};
        color[start] = 1;
        while (depth && st == RLX_OK) {
            frame *fr = &stack[depth - 1];
            /* the next rule this frame's rule reaches without consuming, if any */
            uint32_t next = NONE;
            while (next == NONE && fr->alt < f->rule_first_alt[fr->rule + 1]) {
                if (!f->alt_live[fr->alt]) {
                    fr->alt++;
                    continue;
                }
                uint32_t i = fr->elem == NONE ? f->alt_start[fr->alt] : fr->elem;
                const gr_elem e = f->elems[i];
                if (e.kind == GR_REF) {
                    next = e.arg;
                    fr->elem = nullable[e.arg] ? i + 1 : NONE;
                    if (fr->elem == NONE)
                        fr->alt++;
                } else {
                    fr->alt++;
                    fr->elem = NONE;
                }
            }
            if (next == NONE) {
                color[fr->rule] = 2;
                depth--;
                continue;
            }
            if (color[next] == 1) {
                char msg[480], label[160];
                size_t n = 0;
                uint32_t k = depth;
                while (k > 0 && stack[k - 1].rule != next)
                    k--;
                rule_label(p, next, label, sizeof label);
                n += (size_t)snprintf(msg, sizeof msg, "%s", label);
                for (uint32_t j = k; j < depth && n < sizeof msg; j++) {
                    rule_label(p, stack[j].rule, label, sizeof label);
                    n += (size_t)snprintf(msg + n, sizeof msg - n, " -> %s", label);
                }
                if (n < sizeof msg) {
                    rule_label(p, next, label, sizeof label);
                    snprintf(msg + n, sizeof msg - n, " -> %s", label);
                }
                rule_label(p, next, label, sizeof label);
                st = perr(p, p->rules[next].def_at,
                          "%s%s is left-recursive: it can reach itself without consuming text (%s)",
                          p->rules[next].name ? "rule " : "", label, msg);
            } else if (color[next] == 0) {
                color[next] = 1;
                stack[depth++] = (frame){next, f->rule_first_alt[next], NONE};
            }
        }
    }
    free(color);
    free(stack);
    return st;
}

/* Everything after parsing: references resolved, the elements laid out, dead alternatives
 * dropped, left recursion refused; the grammar built into *out. */
static rlx_status compile(parser *p, const char *root, rlx_grammar **out) {
    for (uint32_t r = 0; r < p->n_rules; r++) {
        const prule *x = &p->rules[r];
        if (x->name && x->def_at == AT_NONE)
            return perr(p, x->ref_at, "undefined rule '%.*s'", (int)(x->name_len < 64 ? x->name_len : 64), x->name);
    }
    const prule *root_rule = find_named(p, root, strlen(root));
    if (!root_rule)
        return rlx_error(RLX_E_INVALID, "grammar: there is no rule '%.64s' to start from", root);
    const uint32_t root_id = (uint32_t)(root_rule - p->rules);

    flat f = {0};
    uint8_t *set_has = NULL, *productive = NULL, *nullable = NULL;
    rlx_grammar *g = rlx__calloc(1, sizeof *g);
    rlx_status st = RLX_OK;
    f.n_elems = (uint32_t)p->n_elems + 2;
    f.n_alts = 1;
    for (uint32_t r = 0; r < p->n_rules; r++)
        for (uint32_t i = 0; i < p->rules[r].n_body; i++)
            f.n_alts += p->rules[r].body[i].kind == GR_END;
    f.elems = rlx__malloc((size_t)f.n_elems * sizeof *f.elems);
    f.alt_start = rlx__malloc((size_t)f.n_alts * sizeof *f.alt_start);
    f.alt_rule = rlx__malloc((size_t)f.n_alts * sizeof *f.alt_rule);
    f.alt_live = rlx__malloc(f.n_alts);
    f.rule_first_alt = rlx__malloc(((size_t)p->n_rules + 1) * sizeof *f.rule_first_alt);
    f.ref_off = rlx__calloc((size_t)p->n_rules + 2, sizeof *f.ref_off);
    f.refs = rlx__malloc((size_t)f.n_elems * sizeof *f.refs);
    f.alt_of = rlx__malloc((size_t)f.n_elems * sizeof *f.alt_of);
    set_has = rlx__malloc(p->n_sets ? p->n_sets : 1);
    productive = rlx__malloc(p->n_rules);
    nullable = rlx__malloc(p->n_rules);
    if (!g || !f.elems || !f.alt_start || !f.alt_rule || !f.alt_live || !f.rule_first_alt || !f.ref_off || !f.refs ||
        !f.alt_of || !set_has || !productive || !nullable) {
        st = nomem("the compiled grammar");
        goto done;
    }
    /* elements 0, 1: the start (REF root, END), an alternative of no rule */
    f.elems[0] = (gr_elem){GR_REF, root_id};
    f.elems[1] = (gr_elem){GR_END, 0};
    f.alt_start[0] = 0;
    f.alt_rule[0] = NONE;
    f.alt_live[0] = 1;
    f.alt_of[0] = f.alt_of[1] = 0;
    uint32_t n = 2, a = 1;
    for (uint32_t r = 0; r < p->n_rules; r++) {
        const prule *x = &p->rules[r];
        f.rule_first_alt[r] = a;
        int at_start = 1;
        for (uint32_t i = 0; i < x->n_body; i++) {
            if (at_start) {
                f.alt_start[a] = n;
                f.alt_rule[a] = r;
                f.alt_live[a] = 1;
                at_start = 0;
            }
            f.elems[n] = x->body[i];
            f.alt_of[n] = a;
            if (x->body[i].kind == GR_REF)
                f.ref_off[x->body[i].arg + 2]++;
            if (x->body[i].kind == GR_END) {
                a++;
                at_start = 1;
            }
            n++;
        }
    }
    f.rule_first_alt[p->n_rules] = a;
    f.ref_off[root_id + 2]++; /* element 0 */
    for (uint32_t r = 0; r < p->n_rules; r++)
        f.ref_off[r + 2] += f.ref_off[r + 1];
    for (uint32_t i = 0; i < f.n_elems; i++)
        if (f.elems[i].kind == GR_REF)
            f.refs[f.ref_off[f.elems[i].arg + 1]++] = i;

    /* productive: can end having matched a finite text; alternatives that cannot are dropped */
    for (uint32_t s = 0; s < p->n_sets; s++)
        set_has[s] = p->sets[s].n > 0;
    if ((st = fixpoint(p, &f, set_has, productive)) != RLX_OK)
        goto done;
    if (!productive[root_id]) {
        st = rlx_error(RLX_E_INVALID,
                       "grammar: rule '%.64s' can never match a whole text (each of its alternatives "
                       "needs an empty character class or a rule that never ends)",
                       root);
        goto done;
    }
    for (uint32_t k = 1; k < f.n_alts; k++)
        for (uint32_t i = f.alt_start[k]; f.elems[i].kind != GR_END; i++) {
            const gr_elem e = f.elems[i];
            if (e.kind == GR_REF ? !productive[e.arg] : !set_has[e.arg]) {
                f.alt_live[k] = 0;
                break;
            }
        }
    /* nullable: can match the empty text */
    memset(set_has, 0, p->n_sets ? p->n_sets : 1);
    if ((st = fixpoint(p, &f, set_has, nullable)) != RLX_OK || (st = check_left_recursion(p, &f, nullable)) != RLX_OK)
        goto done;

    g->rule_alts = rlx__malloc(((size_t)p->n_rules + 1) * sizeof *g->rule_alts);
    g->alts = rlx__malloc((size_t)f.n_alts * sizeof *g->alts);
    g->sets = rlx__malloc((p->n_sets ? p->n_sets : 1) * sizeof *g->sets);
    g->ranges = rlx__malloc((p->n_ranges ? p->n_ranges : 1) * sizeof *g->ranges);
    if (!g->rule_alts || !g->alts || !g->sets || !g->ranges) {
        st = nomem("the compiled grammar");
        goto done;
    }
    uint32_t live = 0;
    for (uint32_t r = 0; r < p->n_rules; r++) {
        g->rule_alts[r] = live;
        for (uint32_t k = f.rule_first_alt[r]; k < f.rule_first_alt[r + 1]; k++)
            if (f.alt_live[k])
                g->alts[live++] = f.alt_start[k];
    }
    g->rule_alts[p->n_rules] = live;
    g->n_rules = p->n_rules;
    if (p->n_sets)
        memcpy(g->sets, p->sets, p->n_sets * sizeof *g->sets);
    if (p->n_ranges)
        memcpy(g->ranges, p->ranges, p->n_ranges * sizeof *g->ranges);
    g->n_sets = p->n_sets;
    g->n_ranges = p->n_ranges;
    g->elems = f.elems;
    g->n_elems = f.n_elems;
    f.elems = NULL;
    *out = g;
    g = NULL;
done:
    free(f.elems);
    free(f.alt_start);
    free(f.alt_rule);
    free(f.alt_live);
    free(f.rule_first_alt);
    free(f.ref_off);
    free(f.refs);
    free(f.alt_of);
    free(set_has);
    free(productive);
    free(nullable);
    rlx_grammar_destroy(g);
    return st;
}

/* Offset of the first byte that is not valid UTF-8 in s[0, n), or n. */
static size_t utf8_invalid_at(const char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        const uint8_t *u = (const uint8_t *)s + i;
        const int more = gr_utf8_more(u[0]);
        if (more < 0 || (size_t)more >= n - i)
            return i;
        for (int k = 1; k <= more; k++)
            if (k == 1 ? !gr_utf8_cont_ok(u, 1, u[1]) : (u[k] & 0xC0) != 0x80)
                return i;
        i += (size_t)more + 1;
    }
    return n;
}

rlx_status rlx_grammar_parse(const char *gbnf, size_t len, const char *root, rlx_grammar **out) {
    if (!out)
        return rlx_error(RLX_E_INVALID, "rlx_grammar_parse: out is NULL");
    *out = NULL;
    if (!gbnf && len)
        return rlx_error(RLX_E_INVALID, "rlx_grammar_parse: the grammar text is NULL");
    if (len > GR_MAX_TEXT)
        return rlx_error(RLX_E_INVALID, "grammar: %zu bytes of text, more than the %u accepted", len, GR_MAX_TEXT);
    if (!root)
        root = "root";
    parser p = {.s = gbnf ? gbnf : "", .len = len, .current = NONE};
    size_t bad = utf8_invalid_at(p.s, len);
    if (bad < len)
        return perr(&p, bad, "the text is not valid UTF-8 (byte 0x%02X)", (uint8_t)p.s[bad]);
    rlx_status st = parse_rules(&p);
    if (st == RLX_OK)
        st = compile(&p, root, out);
    for (uint32_t r = 0; r < p.n_rules; r++)
        free(p.rules[r].body);
    free(p.rules);
    free(p.names);
    free(p.sets);
    free(p.ranges);
    free(p.tmp);
    return st;
}

void rlx_grammar_destroy(rlx_grammar *g) {
    if (!g)
        return;
    free(g->elems);
    free(g->sets);
    free(g->ranges);
    free(g->rule_alts);
    free(g->alts);
    free(g);
}
