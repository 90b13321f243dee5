/* JSON schema to GBNF (rlx_json_schema_to_gbnf): a grammar that accepts only JSON texts the schema
 * validates, and every valid text written with object members in the schema's order (listed
 * properties first, others after) with the bounded whitespace between tokens. A keyword or a
 * combination that cannot be turned into such a grammar is refused as unsupported, naming it and
 * where it is; docs/grammars.md ("JSON schema") lists what is supported and the choices made.
 *
 * The design is llama.cpp's json_schema_to_grammar: one rule per $ref target (so recursion is
 * recursive rules), objects as chains of optional members, integer bounds as digit ranges,
 * shared primitive rules emitted once when used. Beyond it: additional keys exclude the listed
 * names (a duplicate of a listed key with another value would pass otherwise), strings under a
 * pattern or used as keys have one encoding per character, and every regex feature, $ref cycle or
 * size outside what is handled is an error rather than a looser grammar. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "rlx/grammar.h"
#include "util/alloc.h"
#include "util/json.h"

/* Schema text: tool and response schemas are kilobytes; 4 MiB leaves room for generated ones. */
#define SCHEMA_MAX_TEXT (4u << 20)
/* Schemas nested in schemas (properties, items, anyOf, ...) and JSON values nested in enum and
 * const: bounds the converter's recursion. */
#define SCHEMA_MAX_DEPTH 64
/* GBNF text (and any one expression while it is built): a request's grammar beyond 512 KiB is a
 * mistake or an attack; with SCHEMA_MAX_EXPANSION it keeps the compiled grammar far inside
 * rlx_grammar_parse's bounds (2^18 rules, 2^21 elements), so every output compiles. */
#define SCHEMA_MAX_OUTPUT (512u << 10)
/* Copies that the {m,n} repetitions of one grammar expand to when compiled, summed. */
#define SCHEMA_MAX_EXPANSION 100000
/* Work units (schema objects visited, JSON nodes copied by allOf merging): merging can copy the
 * same $ref target many times over, so time is bounded apart from the output. */
#define SCHEMA_MAX_STEPS 200000
/* Values of one enum and members of one anyOf, oneOf or allOf. */
#define SCHEMA_MAX_BRANCHES 1024
/* minItems, maxItems, minLength, maxLength, prefixItems entries and regex {m,n}: each becomes that
 * many copies of an item in the compiled grammar. */
#define SCHEMA_MAX_REPEAT 1000
/* Schema levels, object members and prefixItems written inline in one rule before a new rule
 * starts: keeps the groups of one rule nested well inside rlx_grammar_parse's 256. */
#define SCHEMA_INLINE_LEVELS 4
#define SCHEMA_INLINE_MEMBERS 8
/* Distinct $ref targets, each a rule (found by a linear search). */
#define SCHEMA_MAX_REFS 4096
/* Names of one properties or required (checked against each other by pairs). */
#define SCHEMA_MAX_MEMBERS 4096
/* $ref and allOf resolved into one schema (a longer chain is a cycle or an attack). */
#define SCHEMA_MAX_CHAIN 32
/* rule_prefix length: rule names stay readable and short. */
#define SCHEMA_MAX_PREFIX 64
/* Regex source bytes, and its size once every repetition is counted out. */
#define SCHEMA_MAX_PATTERN 1024
#define SCHEMA_MAX_PATTERN_SIZE 4096
/* Digits a number may have: integer part (below 10^15 every integer is exact in a double, so the
 * bounds of a range are exact), fraction (a double's shortest form has up to 17 significant
 * digits after at most 3 zeros), exponent. Bounded so a model cannot loop on digits. */
#define SCHEMA_INT_DIGITS 15
#define SCHEMA_FRAC_DIGITS 20
#define SCHEMA_EXP_DIGITS 3
#define SCHEMA_INT_MAX 999999999999999LL /* the largest integer of SCHEMA_INT_DIGITS digits */
/* A double holds every integer up to 2^53, so enum and const numbers beyond it are not exact. */
#define SCHEMA_EXACT_INT 9007199254740992.0
/* Bytes of a property name (the key grammar recurses once per character). */
#define SCHEMA_MAX_NAME 512
/* Code points of one regex character class once ranges are merged. */
#define SCHEMA_MAX_RANGES 512
#define CP_MAX 0x10FFFF

/* JSON kinds, for type sets and for telling oneOf branches apart. */
enum {
    K_NULL = 1,
    K_BOOLEAN = 2,
    K_OBJECT = 4,
    K_ARRAY = 8,
    K_NUMBER = 16, /* a number that is not an integer */
    K_INTEGER = 32,
    K_STRING = 64,
    K_ALL = 127,
};

/* Shared rules, emitted once when used; '@' in a body stands for the rule prefix. */
enum {
    P_SPACE,
    P_VALUE,
    P_OBJECT,
    P_ARRAY,
    P_STRING,
    P_CHAR,
    P_PCHAR,
    P_NUMBER,
    P_INTEGER,
    P_BOOLEAN,
    P_NULL,
    P_DATE,
    P_TIME,
    P_DATE_TIME,
    P_UUID,
    P_IPV4,
    P_COUNT,
};

typedef struct prim {
    const char *name;
    const char *body;
    unsigned deps; /* bit set of the primitives the body names */
} prim;

#define B(p) (1u << (p))
#define DIGIT2 "[0-9] [0-9]"
static const prim prims[P_COUNT] = {
    /* whitespace after a token: bounded, so a model cannot loop on it */
    [P_SPACE] = {"space", "( \" \" | \"\\n\" [ \\t]{0,20} )?", 0},
    [P_VALUE] = {"value", "@object | @array | @string | @number | @boolean | @null",
                 B(P_OBJECT) | B(P_ARRAY) | B(P_STRING) | B(P_NUMBER) | B(P_BOOLEAN) | B(P_NULL)},
    [P_OBJECT] = {"object",
                  "\"{\" @space ( @string \":\" @space @value ( \",\" @space @string \":\" @space @value )* )? \"}\" "
                  "@space",
                  B(P_SPACE) | B(P_STRING) | B(P_VALUE)},
    [P_ARRAY] = {"array", "\"[\" @space ( @value ( \",\" @space @value )* )? \"]\" @space", B(P_SPACE) | B(P_VALUE)},
    [P_STRING] = {"string", "\"\\\"\" @char* \"\\\"\" @space", B(P_CHAR) | B(P_SPACE)},
    /* any character of a JSON string, one code point each: \u escapes of surrogates are left out,
     * since a pair would be two escapes for one code point (a lone one is no character at all) */
    [P_CHAR] = {"char",
                "[^\"\\\\\\x00-\\x1F] | \"\\\\\" ( [\"\\\\/bfnrt] | \"u\" ( [0-9a-cA-Ce-fE-F] [0-9a-fA-F]{3} | [dD] "
                "[0-7] [0-9a-fA-F]{2} ) )",
                0},
    /* a character as Python's json.dumps(ensure_ascii=False) writes it: one encoding each */
    [P_PCHAR] = {"pchar",
                 "[^\"\\\\\\x00-\\x1F] | \"\\\\\" [\"\\\\bfnrt] | \"\\\\u00\" ( \"0\" [0-7bef] | \"1\" [0-9a-f] )", 0},
    [P_NUMBER] = {"number",
                  "\"-\"? ( \"0\" | [1-9] [0-9]{0,14} ) ( \".\" [0-9]{1,20} )? ( [eE] [-+]? [0-9]{1,3} )? @space",
                  B(P_SPACE)},
    [P_INTEGER] = {"integer", "\"-\"? ( \"0\" | [1-9] [0-9]{0,14} ) @space", B(P_SPACE)},
    [P_BOOLEAN] = {"boolean", "( \"true\" | \"false\" ) @space", B(P_SPACE)},
    [P_NULL] = {"null", "\"null\" @space", B(P_SPACE)},
    /* RFC 3339 full-date that is a real day (Python's date.fromisoformat agrees): years 0001-9999,
     * February 29 only in leap years */
    [P_DATE] = {"date",
                "( \"000\" [1-9] | \"00\" [1-9] [0-9] | \"0\" [1-9] " DIGIT2 " | [1-9] [0-9]{3} ) \"-\" ( ( \"01\" | "
                "\"03\" | \"05\" | \"07\" | \"08\" | \"10\" | \"12\" ) \"-\" ( \"0\" [1-9] | [12] [0-9] | \"3\" [01] ) "
                "| ( \"04\" | \"06\" | \"09\" | \"11\" ) \"-\" ( \"0\" [1-9] | [12] [0-9] | \"30\" ) | \"02-\" ( \"0\" "
                "[1-9] | \"1\" [0-9] | \"2\" [0-8] ) ) | ( " DIGIT2 " ( \"0\" [48] | [2468] [048] | [13579] [26] ) | ( "
                "\"0\" [48] | [2468] [048] | [13579] [26] ) \"00\" ) \"-02-29\"",
                0},
    /* RFC 3339 full-time without leap seconds, the offset required, up to 9 fraction digits */
    [P_TIME] =
        {"time",
         "( [01] [0-9] | \"2\" [0-3] ) \":\" [0-5] [0-9] \":\" [0-5] [0-9] ( \".\" [0-9]{1,9} )? ( \"Z\" | [-+] ( "
         "[01] [0-9] | \"2\" [0-3] ) \":\" [0-5] [0-9] )",
         0},
    [P_DATE_TIME] = {"date-time", "@date \"T\" @time", B(P_DATE) | B(P_TIME)},
    [P_UUID] = {"uuid",
                "[0-9a-fA-F]{8} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{12}",
                0},
    /* dotted quad without leading zeros (Python's ipaddress refuses them) */
    [P_IPV4] = {"ipv4",
                "( \"25\" [0-5] | \"2\" [0-4] [0-9] | \"1\" [0-9] [0-9] | [1-9] [0-9] | [0-9] ) ( \".\" ( \"25\" [0-5] "
                "| \"2\" [0-4] [0-9] | \"1\" [0-9] [0-9] | [1-9] [0-9] | [0-9] ) ){3}",
                0},
};

/* Keywords with no effect on which texts are valid. $id is one only at the document's root
 * (elsewhere it would move the base of $ref); discriminator is OpenAPI's note beside a oneOf
 * whose branches the oneOf check tells apart on its own. */
static const char *const annotation_keywords[] = {
    "title",    "description", "default", "examples",    "$schema",       "$comment", "deprecated",
    "readOnly", "writeOnly",   "$defs",   "definitions", "discriminator", "$id",
};

static const char *const type_names[] = {"null", "boolean", "object", "array", "number", "integer", "string"};
static const int type_kinds[] = {K_NULL, K_BOOLEAN, K_OBJECT, K_ARRAY, K_NUMBER | K_INTEGER, K_INTEGER, K_STRING};

typedef struct sbuf {
    char *p;
    size_t len, cap;
} sbuf;

typedef struct rule {
    char *name;
    sbuf body;
} rule;

/* A $ref target: its rule, and the targets its rule can start with (for the left-recursion check). */
typedef struct ref_target {
    const cJSON *node;
    char *path; /* JSON pointer, for messages */
    size_t rule;
    int *left;
    size_t n_left, cap_left;
} ref_target;

typedef struct conv {
    const cJSON *doc;
    const char *prefix;
    rule *rules;
    size_t n_rules, cap_rules;
    ref_target *refs;
    size_t n_refs, cap_refs;
    size_t cur_ref; /* the target whose rule is being written */
    unsigned prims; /* bit set of primitives used */
    sbuf path;      /* JSON pointer of the schema being converted */
    int depth;
    size_t steps;
    long expanded; /* copies the repetitions written so far expand to */
    int in_rule;   /* gen_value is starting the rule of a deep schema */
    int err;       /* the first failure; everything after it is a no-op */
} conv;

// --- errors, buffers, names

/* Records the first failure, with the place in the schema, and returns it. */
__attribute__((format(printf, 3, 4))) static int fail(conv *cv, int status, const char *fmt, ...) {
    if (cv->err)
        return cv->err;
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    const char *path = cv->path.p ? cv->path.p : "";
    cv->err = rlx_error(status, "%s at #%.200s%s", msg, path, strlen(path) > 200 ? "..." : "");
    return cv->err;
}

static int nomem(conv *cv) { return fail(cv, RLX_E_NOMEM, "out of memory converting a JSON schema"); }

static void sb_free(sbuf *b) {
    free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
}

static void put(conv *cv, sbuf *b, const char *s, size_t n) {
    if (cv->err)
        return;
    if (b->len + n + 1 > SCHEMA_MAX_OUTPUT) {
        fail(cv, RLX_E_UNSUPPORTED, "the grammar would exceed %u bytes", SCHEMA_MAX_OUTPUT);
        return;
    }
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *p = rlx__realloc(b->p, cap);
        if (!p) {
            nomem(cv);
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

static void puts_(conv *cv, sbuf *b, const char *s) { put(cv, b, s, strlen(s)); }

__attribute__((format(printf, 3, 4))) static void putf(conv *cv, sbuf *b, const char *fmt, ...) {
    char tmp[256];
    va_list ap, again;
    va_start(ap, fmt);
    va_copy(again, ap);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n >= 0 && (size_t)n < sizeof tmp) {
        put(cv, b, tmp, (size_t)n);
    } else if (n >= 0) {
        char *big = rlx__malloc((size_t)n + 1);
        if (!big) {
            nomem(cv);
        } else {
            vsnprintf(big, (size_t)n + 1, fmt, again);
            put(cv, b, big, (size_t)n);
            free(big);
        }
    }
    va_end(again);
}

/* A primitive's name (prefixed), marked used. */
static void prim_ref(conv *cv, sbuf *b, int p) {
    cv->prims |= 1u << p;
    puts_(cv, b, cv->prefix);
    puts_(cv, b, prims[p].name);
}

/* Text, then the bounded whitespace the grammar allows after a JSON token. */
static void put_spaced(conv *cv, sbuf *b, const char *text) {
    puts_(cv, b, text);
    prim_ref(cv, b, P_SPACE);
}

/* Appends "/seg" (escaped as a JSON pointer) to the path; returns the length to pop back to. */
static size_t path_push(conv *cv, const char *seg) {
    size_t old = cv->path.len;
    /* the path is not part of the output, but it is bounded by the same cap */
    put(cv, &cv->path, "/", 1);
    for (const char *s = seg; *s && !cv->err; s++) {
        if (*s == '~')
            put(cv, &cv->path, "~0", 2);
        else if (*s == '/')
            put(cv, &cv->path, "~1", 2);
        else
            put(cv, &cv->path, s, 1);
    }
    return old;
}

static size_t path_push_index(conv *cv, int i) {
    char num[16];
    snprintf(num, sizeof num, "%d", i);
    return path_push(cv, num);
}

static void path_pop(conv *cv, size_t old) {
    if (cv->path.p && old <= cv->path.len) {
        cv->path.len = old;
        cv->path.p[old] = '\0';
    }
}

/* A new rule named prefix + hint (letters, digits and '-' kept, the rest '-') + "-" + its index:
 * the index makes names unique, and no primitive ends in "-digits". */
static size_t new_rule(conv *cv, const char *hint) {
    if (cv->err)
        return 0;
    if (cv->n_rules == cv->cap_rules) {
        size_t cap = cv->cap_rules ? cv->cap_rules * 2 : 32;
        rule *r = rlx__realloc(cv->rules, cap * sizeof *r);
        if (!r) {
            nomem(cv);
            return 0;
        }
        cv->rules = r;
        cv->cap_rules = cap;
    }
    char name[64];
    size_t n = 0;
    for (const char *h = hint; *h && n < 40; h++) {
        char c = *h;
        int word = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
        if (word)
            name[n++] = c;
        else if (n && name[n - 1] != '-')
            name[n++] = '-';
    }
    while (n && name[n - 1] == '-')
        n--;
    if (!n)
        name[n++] = 'r';
    snprintf(name + n, sizeof name - n, "-%zu", cv->n_rules);
    size_t plen = strlen(cv->prefix);
    char *full = rlx__malloc(plen + strlen(name) + 1);
    if (!full) {
        nomem(cv);
        return 0;
    }
    memcpy(full, cv->prefix, plen);
    strcpy(full + plen, name);
    cv->rules[cv->n_rules] = (rule){.name = full};
    return cv->n_rules++;
}

/* The last segment of the path, as a hint for rule names. */
static const char *path_hint(conv *cv) {
    if (!cv->path.p || !cv->path.len)
        return "root";
    const char *s = strrchr(cv->path.p, '/');
    return s && s[1] ? s + 1 : "r";
}

/* Moves expr into a new rule and writes its name into out. */
static void make_rule(conv *cv, const char *tag, sbuf *expr, sbuf *out) {
    char hint[96];
    snprintf(hint, sizeof hint, "%.40s-%.40s", path_hint(cv), tag);
    size_t r = new_rule(cv, hint);
    if (cv->err)
        return;
    if (!expr->len) /* matches the empty text only (a pattern "^$", say): GBNF needs an expression */
        puts_(cv, expr, "\"\"");
    cv->rules[r].body = *expr;
    *expr = (sbuf){0};
    puts_(cv, out, cv->rules[r].name);
}

static int step(conv *cv, size_t n) {
    cv->steps += n;
    if (cv->steps > SCHEMA_MAX_STEPS)
        return fail(cv, RLX_E_UNSUPPORTED, "the schema takes more than %u steps to convert (allOf and $ref merging)",
                    SCHEMA_MAX_STEPS);
    return cv->err;
}

// --- GBNF text of characters and JSON values

static int utf8_decode(const unsigned char *s, size_t n, uint32_t *cp) {
    if (!n)
        return 0;
    unsigned c = s[0];
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    int len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC2 ? 2 : 0;
    if (!len || c > 0xF4 || (size_t)len > n)
        return 0;
    uint32_t v = c & (0x3Fu >> (len - 1));
    for (int i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80)
            return 0;
        v = v << 6 | (s[i] & 0x3F);
    }
    static const uint32_t min[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (v < min[len] || v > CP_MAX || (v >= 0xD800 && v <= 0xDFFF))
        return 0;
    *cp = v;
    return len;
}

static size_t utf8_encode(uint32_t cp, char *out) {
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | cp >> 6);
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | cp >> 12);
        out[1] = (char)(0x80 | (cp >> 6 & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | cp >> 18);
    out[1] = (char)(0x80 | (cp >> 12 & 0x3F));
    out[2] = (char)(0x80 | (cp >> 6 & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* The bytes of a GBNF string literal for text (without the quotes): '"' and '\' escaped, control
 * characters as \xHH, the rest as it is. */
static void lit_bytes(conv *cv, sbuf *b, const char *s, size_t n) {
    for (size_t i = 0; i < n && !cv->err; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') {
            char e[2] = {'\\', (char)c};
            put(cv, b, e, 2);
        } else if (c < 0x20 || c == 0x7F) {
            putf(cv, b, "\\x%02X", c);
        } else {
            put(cv, b, s + i, 1);
        }
    }
}

/* How json.dumps(ensure_ascii=False) writes code point cp inside a string. */
static size_t json_char(uint32_t cp, char *out) {
    static const char shorts[0x20] = {['\b'] = 'b', ['\f'] = 'f', ['\n'] = 'n', ['\r'] = 'r', ['\t'] = 't'};
    if (cp == '"' || cp == '\\') {
        out[0] = '\\';
        out[1] = (char)cp;
        return 2;
    }
    if (cp < 0x20) {
        if (shorts[cp]) {
            out[0] = '\\';
            out[1] = shorts[cp];
            return 2;
        }
        snprintf(out, 8, "\\u%04x", (unsigned)cp);
        return 6;
    }
    return utf8_encode(cp, out);
}

/* A GBNF literal matching the JSON string of s (valid UTF-8, checked on input), quotes included. */
static void json_string_lit(conv *cv, sbuf *b, const char *s) {
    sbuf tmp = {0};
    put(cv, &tmp, "\"", 1);
    size_t n = strlen(s);
    for (size_t i = 0; i < n && !cv->err;) {
        uint32_t cp = 0;
        int k = utf8_decode((const unsigned char *)s + i, n - i, &cp);
        if (k <= 0) {
            fail(cv, RLX_E_INVALID, "a string of the schema is not valid UTF-8");
            break;
        }
        char enc[8];
        put(cv, &tmp, enc, json_char(cp, enc));
        i += (size_t)k;
    }
    put(cv, &tmp, "\"", 1);
    put(cv, b, "\"", 1);
    if (!cv->err)
        lit_bytes(cv, b, tmp.p, tmp.len);
    put(cv, b, "\"", 1);
    sb_free(&tmp);
}

/* x as Python's repr writes a float: the shortest digits that read back as x, positional for
 * exponents -4..15 (with ".0" when integral), else d.ddde+XX. */
static void repr_double(double x, char *out, size_t size) {
    char tmp[40];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*e", prec - 1, x);
        if (strtod(tmp, NULL) == x)
            break;
    }
    const char *p = tmp;
    char digits[24];
    size_t nd = 0;
    int neg = *p == '-';
    if (neg)
        p++;
    for (; *p && *p != 'e'; p++)
        if (*p >= '0' && *p <= '9' && nd < sizeof digits - 1)
            digits[nd++] = *p;
    digits[nd] = '\0';
    int e = *p == 'e' ? atoi(p + 1) : 0;
    while (nd > 1 && digits[nd - 1] == '0')
        digits[--nd] = '\0';
    char *o = out;
    size_t left = size;
#define OUT(...)                                                                                                       \
    do {                                                                                                               \
        int w_ = snprintf(o, left, __VA_ARGS__);                                                                       \
        if (w_ > 0 && (size_t)w_ < left) {                                                                             \
            o += w_;                                                                                                   \
            left -= (size_t)w_;                                                                                        \
        }                                                                                                              \
    } while (0)
    if (neg)
        OUT("-");
    if (e >= -4 && e < 16) {
        if (e < 0) {
            OUT("0.");
            for (int i = 0; i < -e - 1; i++)
                OUT("0");
            OUT("%s", digits);
        } else {
            for (int i = 0; i <= e; i++)
                OUT("%c", (size_t)i < nd ? digits[i] : '0');
            OUT(".");
            if ((size_t)e + 1 < nd)
                OUT("%s", digits + e + 1);
            else
                OUT("0");
        }
    } else {
        OUT("%c", digits[0]);
        if (nd > 1)
            OUT(".%s", digits + 1);
        OUT("e%c%02d", e < 0 ? '-' : '+', e < 0 ? -e : e);
    }
#undef OUT
}

/* GBNF for the JSON value v exactly (with the bounded whitespace between its tokens): an enum or
 * const member. */
static int gen_literal(conv *cv, const cJSON *v, sbuf *out, int depth) {
    if (depth > SCHEMA_MAX_DEPTH)
        return fail(cv, RLX_E_UNSUPPORTED, "an enum or const value nested deeper than %d", SCHEMA_MAX_DEPTH);
    if (cJSON_IsNull(v)) {
        puts_(cv, out, "\"null\"");
    } else if (cJSON_IsTrue(v)) {
        puts_(cv, out, "\"true\"");
    } else if (cJSON_IsFalse(v)) {
        puts_(cv, out, "\"false\"");
    } else if (cJSON_IsString(v)) {
        json_string_lit(cv, out, v->valuestring);
    } else if (cJSON_IsNumber(v)) {
        double x = v->valuedouble;
        if (!isfinite(x))
            return fail(cv, RLX_E_UNSUPPORTED, "an enum or const number that is not finite");
        char r[48];
        if (x == 0) {
            /* 0 == -0 == 0.0 for JSON schema's equality */
            puts_(cv, out, "( \"0\" | \"0.0\" | \"-0\" | \"-0.0\" )");
        } else if (floor(x) == x) {
            if (fabs(x) >= SCHEMA_EXACT_INT)
                return fail(cv, RLX_E_UNSUPPORTED, "an enum or const number beyond 2^53 (not exact in a double)");
            repr_double(x, r, sizeof r);
            putf(cv, out, "( \"%.0f\" | \"%s\" )", x, r);
        } else {
            repr_double(x, r, sizeof r);
            putf(cv, out, "\"%s\"", r);
        }
    } else if (cJSON_IsArray(v)) {
        put_spaced(cv, out, "\"[\" ");
        for (const cJSON *e = v->child; e && !cv->err; e = e->next) {
            if (e != v->child)
                put_spaced(cv, out, " \",\" ");
            puts_(cv, out, " ");
            gen_literal(cv, e, out, depth + 1);
        }
        puts_(cv, out, " \"]\"");
    } else if (cJSON_IsObject(v)) {
        put_spaced(cv, out, "\"{\" ");
        for (const cJSON *e = v->child; e && !cv->err; e = e->next) {
            if (e != v->child)
                put_spaced(cv, out, " \",\" ");
            puts_(cv, out, " ");
            json_string_lit(cv, out, e->string);
            put_spaced(cv, out, " ");
            put_spaced(cv, out, " \":\" ");
            puts_(cv, out, " ");
            gen_literal(cv, e, out, depth + 1);
        }
        puts_(cv, out, " \"}\"");
    }
    put_spaced(cv, out, " ");
    return cv->err;
}

// --- sets of code points, written as JSON string characters

typedef struct cpset {
    uint32_t lo[SCHEMA_MAX_RANGES], hi[SCHEMA_MAX_RANGES];
    int n;
    int overflow;
} cpset;

static void set_add(cpset *s, uint32_t lo, uint32_t hi) {
    if (s->n == SCHEMA_MAX_RANGES) {
        s->overflow = 1;
        return;
    }
    s->lo[s->n] = lo;
    s->hi[s->n] = hi;
    s->n++;
}

/* Sorts and merges the ranges (insertion sort: a class has few). */
static void set_norm(cpset *s) {
    for (int i = 1; i < s->n; i++) {
        uint32_t lo = s->lo[i], hi = s->hi[i];
        int j = i;
        for (; j > 0 && s->lo[j - 1] > lo; j--) {
            s->lo[j] = s->lo[j - 1];
            s->hi[j] = s->hi[j - 1];
        }
        s->lo[j] = lo;
        s->hi[j] = hi;
    }
    int m = 0;
    for (int i = 0; i < s->n; i++) {
        if (m && s->lo[i] <= s->hi[m - 1] + 1) {
            if (s->hi[i] > s->hi[m - 1])
                s->hi[m - 1] = s->hi[i];
        } else {
            s->lo[m] = s->lo[i];
            s->hi[m] = s->hi[i];
            m++;
        }
    }
    s->n = m;
}

static void set_complement(const cpset *s, cpset *out) {
    cpset t = *s;
    set_norm(&t);
    out->n = 0;
    out->overflow = t.overflow;
    uint32_t next = 0;
    for (int i = 0; i < t.n; i++) {
        if (t.lo[i] > next)
            set_add(out, next, t.lo[i] - 1);
        next = t.hi[i] + 1;
    }
    if (next <= CP_MAX)
        set_add(out, next, CP_MAX);
}

static void set_union(cpset *dst, const cpset *src) {
    for (int i = 0; i < src->n; i++)
        set_add(dst, src->lo[i], src->hi[i]);
    dst->overflow |= src->overflow;
    set_norm(dst);
}

/* s minus the code points of [lo, hi]. */
static void set_remove(cpset *s, uint32_t lo, uint32_t hi) {
    cpset c = {.n = 0};
    set_add(&c, lo, hi);
    cpset keep;
    set_complement(&c, &keep);
    cpset out = {.n = 0, .overflow = s->overflow};
    set_norm(s);
    for (int i = 0; i < s->n; i++)
        for (int j = 0; j < keep.n; j++) {
            uint32_t a = s->lo[i] > keep.lo[j] ? s->lo[i] : keep.lo[j];
            uint32_t b = s->hi[i] < keep.hi[j] ? s->hi[i] : keep.hi[j];
            if (a <= b)
                set_add(&out, a, b);
        }
    *s = out;
}

static int set_has(const cpset *s, uint32_t cp) {
    for (int i = 0; i < s->n; i++)
        if (cp >= s->lo[i] && cp <= s->hi[i])
            return 1;
    return 0;
}

/* One code point inside a GBNF character class. */
static void class_char(conv *cv, sbuf *b, uint32_t cp) {
    if ((cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') || (cp >= '0' && cp <= '9'))
        putf(cv, b, "%c", (char)cp);
    else if (cp < 0x80)
        putf(cv, b, "\\x%02X", (unsigned)cp);
    else if (cp < 0x10000)
        putf(cv, b, "\\u%04X", (unsigned)cp);
    else
        putf(cv, b, "\\U%08X", (unsigned)cp);
}

static void class_text(conv *cv, sbuf *b, const cpset *s, int negated) {
    puts_(cv, b, negated ? "[^" : "[");
    for (int i = 0; i < s->n; i++) {
        class_char(cv, b, s->lo[i]);
        if (s->hi[i] != s->lo[i]) {
            puts_(cv, b, "-");
            class_char(cv, b, s->hi[i]);
        }
    }
    puts_(cv, b, "]");
}

/* GBNF matching the characters of set (normalized, not empty), each written the one way
 * json.dumps(ensure_ascii=False) writes it: raw, except '"', '\' and control characters. */
static void emit_set(conv *cv, sbuf *b, const cpset *set) {
    cpset raw = *set;
    set_remove(&raw, 0, 0x1F);
    set_remove(&raw, '"', '"');
    set_remove(&raw, '\\', '\\');
    int parts = 0;
    sbuf t = {0};
    if (raw.n == 1 && raw.lo[0] == raw.hi[0]) {
        char enc[4];
        put(cv, &t, "\"", 1);
        lit_bytes(cv, &t, enc, utf8_encode(raw.lo[0], enc));
        put(cv, &t, "\"", 1);
        parts++;
    } else if (raw.n) {
        cpset comp;
        set_complement(&raw, &comp);
        if (comp.n < raw.n)
            class_text(cv, &t, &comp, 1);
        else
            class_text(cv, &t, &raw, 0);
        parts++;
    }
    static const char short_cp[] = {'"', '\\', '\b', '\f', '\n', '\r', '\t'};
    static const char short_letter[] = {'"', '\\', 'b', 'f', 'n', 'r', 't'};
    cpset letters = {.n = 0};
    for (size_t i = 0; i < sizeof short_cp; i++)
        if (set_has(set, (unsigned char)short_cp[i]))
            set_add(&letters, (unsigned char)short_letter[i], (unsigned char)short_letter[i]);
    if (letters.n) {
        set_norm(&letters);
        puts_(cv, &t, parts ? " | \"\\\\\" " : "\"\\\\\" ");
        class_text(cv, &t, &letters, 0);
        parts++;
    }
    for (uint32_t hi = 0; hi < 2; hi++) {
        cpset digits = {.n = 0};
        for (uint32_t lo = 0; lo < 16; lo++) {
            uint32_t cp = hi << 4 | lo;
            if (cp == '\b' || cp == '\f' || cp == '\n' || cp == '\r' || cp == '\t' || !set_has(set, cp))
                continue;
            uint32_t d = lo < 10 ? '0' + lo : 'a' + lo - 10;
            set_add(&digits, d, d);
        }
        if (!digits.n)
            continue;
        set_norm(&digits);
        putf(cv, &t, "%s\"\\\\u00%u\" ", parts ? " | " : "", (unsigned)hi);
        class_text(cv, &t, &digits, 0);
        parts++;
    }
    if (parts > 1)
        puts_(cv, b, "( ");
    if (t.p)
        put(cv, b, t.p, t.len);
    if (parts > 1)
        puts_(cv, b, " )");
    sb_free(&t);
}

// --- regular expressions (a subset of ECMA 262 on which Python's re, jsonschema's engine, agrees)

typedef struct rx {
    conv *cv;
    const unsigned char *s;
    size_t n, i;
    int depth;
} rx;

/* The size past which a pattern is refused; sizes saturate there. */
#define RX_TOO_BIG (SCHEMA_MAX_PATTERN_SIZE + 1L)

static long rx_mul(long a, long b) { return a && b > RX_TOO_BIG / a ? RX_TOO_BIG : a * b; }
static long rx_add(long a, long b) { return a + b > RX_TOO_BIG ? RX_TOO_BIG : a + b; }

/* The next code point (0 at the end). */
static int rx_peek(rx *r, uint32_t *cp) {
    if (r->i >= r->n)
        return 0;
    return utf8_decode(r->s + r->i, r->n - r->i, cp);
}

static int rx_at(rx *r, char c) { return r->i < r->n && r->s[r->i] == (unsigned char)c; }

/* Both engines' classes for \d \w \s and their negations, as two sets: the code points it surely
 * holds in both (what a class may allow) and those it may hold in either (what a negated class
 * must leave out). Python's \d, \w and \s also match non-ASCII digits, letters and spaces, and its
 * \s takes \x1C-\x1F; ECMA's differ outside ASCII, so only ASCII is sure. */
static void shorthand(char c, cpset *sure, cpset *maybe) {
    cpset base = {.n = 0};
    switch (c == 'D' ? 'd' : c == 'W' ? 'w' : c == 'S' ? 's' : c) {
    case 'd':
        set_add(&base, '0', '9');
        break;
    case 'w':
        set_add(&base, '0', '9');
        set_add(&base, 'A', 'Z');
        set_add(&base, '_', '_');
        set_add(&base, 'a', 'z');
        break;
    default:
        set_add(&base, '\t', '\r');
        set_add(&base, ' ', ' ');
        break;
    }
    set_norm(&base);
    cpset grey = {.n = 0}; /* where the engines differ */
    set_add(&grey, 0x80, CP_MAX);
    if (c == 's' || c == 'S')
        set_add(&grey, 0x1C, 0x1F);
    set_norm(&grey);
    if (c >= 'a') { /* \d \w \s */
        *sure = base;
        *maybe = base;
        set_union(maybe, &grey);
    } else { /* the complement of base, less the grey code points when sure */
        set_complement(&base, maybe);
        cpset sure_set = *maybe;
        for (int i = 0; i < grey.n; i++)
            set_remove(&sure_set, grey.lo[i], grey.hi[i]);
        *sure = sure_set;
    }
}

static int rx_hex(rx *r, int digits, uint32_t *out) {
    uint32_t v = 0;
    for (int k = 0; k < digits; k++) {
        if (r->i >= r->n)
            return 0;
        unsigned char c = r->s[r->i];
        int d = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                       : -1;
        if (d < 0)
            return 0;
        v = v << 4 | (uint32_t)d;
        r->i++;
    }
    *out = v;
    return 1;
}

/* An escape after '\': a single code point (*cp, returns 1) or a class escape (sure/maybe set,
 * returns 2). in_class: inside [...], where \b is a backspace. */
static int rx_escape(rx *r, int in_class, uint32_t *cp, cpset *sure, cpset *maybe) {
    conv *cv = r->cv;
    if (r->i >= r->n)
        return fail(cv, RLX_E_INVALID, "pattern ends with '\\'");
    unsigned char c = r->s[r->i++];
    switch (c) {
    case 'd':
    case 'D':
    case 'w':
    case 'W':
    case 's':
    case 'S':
        shorthand((char)c, sure, maybe);
        return 2;
    case 'n':
        *cp = '\n';
        return 1;
    case 'r':
        *cp = '\r';
        return 1;
    case 't':
        *cp = '\t';
        return 1;
    case 'f':
        *cp = '\f';
        return 1;
    case 'v':
        *cp = '\v';
        return 1;
    case '0':
        if (r->i < r->n && r->s[r->i] >= '0' && r->s[r->i] <= '9')
            return fail(cv, RLX_E_UNSUPPORTED, "unsupported regex escape '\\0%c' (octal)", r->s[r->i]);
        *cp = 0;
        return 1;
    case 'x':
        if (!rx_hex(r, 2, cp))
            return fail(cv, RLX_E_UNSUPPORTED, "unsupported regex escape '\\x' without two hex digits");
        return 1;
    case 'u':
        if (!rx_hex(r, 4, cp))
            return fail(cv, RLX_E_UNSUPPORTED, "unsupported regex escape '\\u' without four hex digits");
        if (*cp >= 0xD800 && *cp <= 0xDFFF)
            return fail(cv, RLX_E_UNSUPPORTED, "unsupported regex escape of a surrogate '\\u%04X'", (unsigned)*cp);
        return 1;
    case 'b':
        if (in_class) {
            *cp = '\b';
            return 1;
        }
        return fail(cv, RLX_E_UNSUPPORTED, "unsupported regex word boundary '\\b'");
    default:
        break;
    }
    if (c >= 0x80 || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'))
        return fail(cv, RLX_E_UNSUPPORTED, "unsupported regex escape '\\%c'", c >= 0x80 ? '?' : c);
    *cp = c; /* an escaped punctuation character is itself */
    return 1;
}

/* [...] into set. */
static int rx_class(rx *r, cpset *set) {
    conv *cv = r->cv;
    r->i++; /* '[' */
    int negated = rx_at(r, '^');
    if (negated)
        r->i++;
    if (rx_at(r, ']'))
        return fail(cv, RLX_E_UNSUPPORTED, "unsupported regex class '[]' or '[^]' (the engines differ on it)");
    cpset sure = {.n = 0}, maybe = {.n = 0};
    for (;;) {
        if (r->i >= r->n)
            return fail(cv, RLX_E_INVALID, "regex class without its ']'");
        if (rx_at(r, ']')) {
            r->i++;
            break;
        }
        if (rx_at(r, '['))
            return fail(cv, RLX_E_UNSUPPORTED, "unsupported '[' inside a regex class");
        uint32_t lo = 0, hi = 0;
        cpset es, em;
        int kind = 1;
        if (rx_at(r, '\\')) {
            r->i++;
            kind = rx_escape(r, 1, &lo, &es, &em);
            if (kind < 0)
                return kind;
        } else {
            int k = rx_peek(r, &lo);
            if (k <= 0)
                return fail(cv, RLX_E_INVALID, "a pattern that is not valid UTF-8");
            r->i += (size_t)k;
        }
        if (kind == 2) {
            if (rx_at(r, '-') && r->i + 1 < r->n && r->s[r->i + 1] != ']')
                return fail(cv, RLX_E_UNSUPPORTED, "unsupported regex range from a class escape");
            set_union(&sure, &es);
            set_union(&maybe, &em);
            continue;
        }
        hi = lo;
        if (rx_at(r, '-') && r->i + 1 < r->n && r->s[r->i + 1] != ']') {
            r->i++;
            if (rx_at(r, '\\')) {
                r->i++;
                kind = rx_escape(r, 1, &hi, &es, &em);
                if (kind < 0)
                    return kind;
                if (kind == 2)
                    return fail(cv, RLX_E_UNSUPPORTED, "unsupported regex range to a class escape");
            } else if (rx_at(r, '[')) {
                return fail(cv, RLX_E_UNSUPPORTED, "unsupported '[' inside a regex class");
            } else {
                int k = rx_peek(r, &hi);
                if (k <= 0)
                    return fail(cv, RLX_E_INVALID, "a pattern that is not valid UTF-8");
                r->i += (size_t)k;
            }
            if (hi < lo)
                return fail(cv, RLX_E_INVALID, "regex range out of order");
        }
        set_add(&sure, lo, hi);
        set_add(&maybe, lo, hi);
        set_norm(&sure);
        set_norm(&maybe);
    }
    if (negated)
        set_complement(&maybe, set);
    else
        *set = sure;
    set_norm(set);
    if (set->overflow || sure.overflow || maybe.overflow)
        return fail(cv, RLX_E_UNSUPPORTED, "a regex class of more than %d ranges", SCHEMA_MAX_RANGES);
    if (!set->n)
        return fail(cv, RLX_E_UNSUPPORTED, "a regex class that matches nothing");
    return 0;
}

/* {m}, {m,}, {m,n} after '{'; 0 when the text is not one. */
static int rx_braces(rx *r, long *lo, long *hi) {
    size_t i = r->i + 1;
    long a = 0, b = -1;
    int nd = 0;
    for (; i < r->n && r->s[i] >= '0' && r->s[i] <= '9'; i++, nd++)
        a = a > 100000 ? a : a * 10 + (r->s[i] - '0');
    if (!nd)
        return 0;
    b = a;
    if (i < r->n && r->s[i] == ',') {
        i++;
        b = -1;
        int nd2 = 0;
        long v = 0;
        for (; i < r->n && r->s[i] >= '0' && r->s[i] <= '9'; i++, nd2++)
            v = v > 100000 ? v : v * 10 + (r->s[i] - '0');
        if (nd2)
            b = v;
    }
    if (i >= r->n || r->s[i] != '}')
        return 0;
    r->i = i + 1;
    *lo = a;
    *hi = b;
    return 1;
}

/* a repeated lo..hi times (hi < 0: no upper bound); a is a primary expression */
static void rep(conv *cv, sbuf *out, const char *a, long lo, long hi) {
    if (hi == 0 || !*a)
        return;
    cv->expanded += hi < 0 ? lo + 1 : hi;
    if (cv->expanded > SCHEMA_MAX_EXPANSION) {
        fail(cv, RLX_E_UNSUPPORTED, "repetitions (lengths, item counts, regex counts) that add up to more than %d",
             SCHEMA_MAX_EXPANSION);
        return;
    }
    if (lo == 1 && hi == 1) {
        puts_(cv, out, a);
        return;
    }
    puts_(cv, out, a);
    if (lo == 0 && hi < 0)
        puts_(cv, out, "*");
    else if (lo == 1 && hi < 0)
        puts_(cv, out, "+");
    else if (lo == 0 && hi == 1)
        puts_(cv, out, "?");
    else if (hi < 0)
        putf(cv, out, "{%ld,}", lo);
    else if (lo == hi)
        putf(cv, out, "{%ld}", lo);
    else
        putf(cv, out, "{%ld,%ld}", lo, hi);
}

static int rx_alt(rx *r, sbuf *out, int *nullable, long *size, int top);

/* One atom into a (a primary expression, or "" for an empty group). */
static int rx_atom(rx *r, sbuf *a, int *nullable, long *size) {
    conv *cv = r->cv;
    uint32_t cp = 0;
    cpset set = {.n = 0}, maybe;
    *nullable = 0;
    *size = 1;
    unsigned char c = r->s[r->i];
    if (c == '(') {
        r->i++;
        if (rx_at(r, '?')) {
            if (r->i + 1 < r->n && r->s[r->i + 1] == ':')
                r->i += 2;
            else
                return fail(cv, RLX_E_UNSUPPORTED, "unsupported regex group '(?%c' (lookaround, named group or flags)",
                            r->i + 1 < r->n ? r->s[r->i + 1] : ' ');
        }
        if (++r->depth > SCHEMA_MAX_DEPTH)
            return fail(cv, RLX_E_UNSUPPORTED, "regex groups nested deeper than %d", SCHEMA_MAX_DEPTH);
        sbuf inner = {0};
        rx_alt(r, &inner, nullable, size, 0);
        r->depth--;
        if (!cv->err && !rx_at(r, ')'))
            fail(cv, RLX_E_INVALID, "regex group without its ')'");
        r->i++;
        if (inner.len) {
            puts_(cv, a, "( ");
            put(cv, a, inner.p, inner.len);
            puts_(cv, a, " )");
        } else {
            *nullable = 1;
            *size = 0;
        }
        sb_free(&inner);
        return cv->err;
    }
    if (c == '*' || c == '+' || c == '?')
        return fail(cv, RLX_E_INVALID, "regex '%c' with nothing to repeat", c);
    if (c == '{')
        return fail(cv, RLX_E_UNSUPPORTED, "unsupported regex '{' that is not a repetition");
    if (c == '[') {
        if (rx_class(r, &set) < 0)
            return cv->err;
    } else if (c == '.') {
        r->i++;
        set_add(&set, 0, CP_MAX);
        set_remove(&set, '\n', '\n');
        set_remove(&set, '\r', '\r');
        set_remove(&set, 0x2028, 0x2029);
    } else if (c == '\\') {
        r->i++;
        int kind = rx_escape(r, 0, &cp, &set, &maybe);
        if (kind < 0)
            return kind;
        if (kind == 1)
            set_add(&set, cp, cp);
    } else {
        int k = rx_peek(r, &cp);
        if (k <= 0)
            return fail(cv, RLX_E_INVALID, "a pattern that is not valid UTF-8");
        r->i += (size_t)k;
        set_add(&set, cp, cp);
    }
    set_norm(&set);
    if (!set.n)
        return fail(cv, RLX_E_UNSUPPORTED, "a regex class that matches nothing");
    emit_set(cv, a, &set);
    return cv->err;
}

/* A sequence up to '|', ')' or the end. At the top level '^' may open it and '$' close it. */
static int rx_cat(rx *r, sbuf *out, int *nullable, long *size, int top, int *bol, int *eol) {
    conv *cv = r->cv;
    *nullable = 1;
    *size = 0;
    int first = 1;
    while (r->i < r->n && !cv->err) {
        unsigned char c = r->s[r->i];
        if (c == '|' || c == ')')
            break;
        if (c == '^') {
            if (!top || !first)
                return fail(cv, RLX_E_UNSUPPORTED, "unsupported regex anchor '^' inside the pattern");
            r->i++;
            *bol = 1;
            first = 0;
            continue;
        }
        if (c == '$') {
            r->i++;
            if (!top || (r->i < r->n && r->s[r->i] != '|'))
                return fail(cv, RLX_E_UNSUPPORTED, "unsupported regex anchor '$' inside the pattern");
            *eol = 1;
            break;
        }
        first = 0;
        sbuf a = {0};
        int an = 0;
        long as = 0;
        rx_atom(r, &a, &an, &as);
        long lo = 1, hi = 1;
        int quantified = 1;
        if (rx_at(r, '*') || rx_at(r, '+') || rx_at(r, '?')) {
            lo = rx_at(r, '+');
            hi = rx_at(r, '?') ? 1 : -1;
            r->i++;
        } else if (rx_at(r, '{')) {
            if (!rx_braces(r, &lo, &hi))
                fail(cv, RLX_E_UNSUPPORTED, "unsupported regex '{' that is not a repetition");
        } else {
            quantified = 0;
        }
        if (quantified && !cv->err) {
            if (rx_at(r, '?')) /* lazy: the same language */
                r->i++;
            if (rx_at(r, '*') || rx_at(r, '+') || rx_at(r, '?') || rx_at(r, '{'))
                fail(cv, RLX_E_INVALID, "regex with a repetition of a repetition");
            else if (hi >= 0 && hi < lo)
                fail(cv, RLX_E_INVALID, "regex repetition {%ld,%ld} out of order", lo, hi);
            else if (lo > SCHEMA_MAX_REPEAT || hi > SCHEMA_MAX_REPEAT)
                fail(cv, RLX_E_UNSUPPORTED, "a regex repetition beyond %d", SCHEMA_MAX_REPEAT);
            else if (an && hi < 0)
                fail(cv, RLX_E_UNSUPPORTED, "unsupported regex repetition of something that can match nothing");
        }
        if (!cv->err) {
            if (out->len && a.len && hi != 0)
                puts_(cv, out, " ");
            if (quantified && a.len && !(lo == 1 && hi == 1)) {
                sbuf g = {0};
                puts_(cv, &g, "( ");
                puts_(cv, &g, a.p);
                puts_(cv, &g, " )");
                rep(cv, out, g.p ? g.p : "", lo, hi);
                sb_free(&g);
            } else if (a.len && hi != 0) {
                put(cv, out, a.p, a.len);
            }
            *nullable &= an || lo == 0;
            *size = rx_add(*size, rx_mul(as, hi < 0 ? lo + 1 : (hi > 1 ? hi : 1)));
        }
        sb_free(&a);
    }
    return cv->err;
}

static int rx_alt(rx *r, sbuf *out, int *nullable, long *size, int top) {
    conv *cv = r->cv;
    *nullable = 0;
    *size = 0;
    int n = 0;
    sbuf all = {0};
    for (;;) {
        sbuf br = {0};
        int bn = 0, bol = 0, eol = 0;
        long bs = 0;
        rx_cat(r, &br, &bn, &bs, top, &bol, &eol);
        if (top && !cv->err) {
            /* an unanchored side lets any text come before or after the match */
            sbuf w = {0};
            if (!bol && !eol && bn) {
                prim_ref(cv, &w, P_CHAR);
                puts_(cv, &w, "*");
            } else {
                if (!bol) {
                    prim_ref(cv, &w, P_CHAR);
                    puts_(cv, &w, br.len ? "* " : "*");
                }
                if (br.p)
                    put(cv, &w, br.p, br.len);
                if (!eol) {
                    puts_(cv, &w, br.len || !bol ? " " : "");
                    prim_ref(cv, &w, P_CHAR);
                    puts_(cv, &w, "*");
                }
            }
            sb_free(&br);
            br = w;
        }
        if (n)
            puts_(cv, &all, " | ");
        if (br.p)
            put(cv, &all, br.p, br.len);
        sb_free(&br);
        n++;
        *nullable |= bn;
        *size = rx_add(*size, bs);
        if (cv->err || !rx_at(r, '|'))
            break;
        r->i++;
    }
    if (!cv->err && top && r->i < r->n)
        fail(cv, RLX_E_INVALID, "regex with an unmatched ')'");
    if (!cv->err && n > 1)
        puts_(cv, out, "( ");
    if (all.p)
        put(cv, out, all.p, all.len);
    if (!cv->err && n > 1)
        puts_(cv, out, " )");
    sb_free(&all);
    return cv->err;
}

/* GBNF of the JSON strings whose value matches pattern somewhere (anchors pin it). */
static int gen_pattern(conv *cv, const char *pattern, sbuf *out) {
    size_t n = strlen(pattern);
    if (n > SCHEMA_MAX_PATTERN)
        return fail(cv, RLX_E_UNSUPPORTED, "a pattern longer than %d bytes", SCHEMA_MAX_PATTERN);
    rx r = {.cv = cv, .s = (const unsigned char *)pattern, .n = n};
    sbuf body = {0};
    int nullable = 0;
    long size = 0;
    rx_alt(&r, &body, &nullable, &size, 1);
    if (!cv->err && size > SCHEMA_MAX_PATTERN_SIZE)
        fail(cv, RLX_E_UNSUPPORTED, "a pattern of more than %d characters once its repetitions are counted out",
             SCHEMA_MAX_PATTERN_SIZE);
    /* a rule of its own: its groups nest as deep as the pattern's */
    puts_(cv, out, "\"\\\"\" ");
    make_rule(cv, "pattern", &body, out);
    put_spaced(cv, out, " \"\\\"\" ");
    sb_free(&body);
    return cv->err;
}

// --- keywords

/* The members of a schema that hold schemas: by name (properties, and $defs/definitions where $ref
 * leads) and in a list (prefixItems and the combinators). */
static int schema_map_key(const char *k) {
    return !strcmp(k, "properties") || !strcmp(k, "$defs") || !strcmp(k, "definitions");
}
static int schema_list_key(const char *k) {
    return !strcmp(k, "prefixItems") || !strcmp(k, "anyOf") || !strcmp(k, "oneOf") || !strcmp(k, "allOf");
}

static const char *const handled_keywords[] = {
    "type",    "enum",        "const",    "properties", "required",         "additionalProperties",
    "items",   "prefixItems", "minItems", "maxItems",   "minLength",        "maxLength",
    "pattern", "format",      "minimum",  "maximum",    "exclusiveMinimum", "exclusiveMaximum",
    "anyOf",   "oneOf",       "allOf",    "$ref",       "uniqueItems",      "minProperties",
};

static int in_list(const char *k, const char *const *list, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (strcmp(k, list[i]) == 0)
            return 1;
    return 0;
}

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))
static int is_annotation(const char *k) { return in_list(k, annotation_keywords, N_OF(annotation_keywords)); }

static const cJSON *kw(const cJSON *s, const char *name) { return cJSON_GetObjectItemCaseSensitive(s, name); }

static int is_schema(const cJSON *v) { return cJSON_IsObject(v) || cJSON_IsBool(v); }

/* The kinds a "type" value allows. */
static int type_kinds_of(conv *cv, const cJSON *t, int *out) {
    *out = 0;
    const cJSON *single = cJSON_IsString(t) ? t : NULL;
    if (!single && (!cJSON_IsArray(t) || !t->child))
        return fail(cv, RLX_E_INVALID, "'type' must be a type name or a non-empty array of them");
    for (const cJSON *e = single ? single : t->child; e; e = single ? NULL : e->next) {
        size_t i = 0;
        while (i < N_OF(type_names) && !(cJSON_IsString(e) && strcmp(e->valuestring, type_names[i]) == 0))
            i++;
        if (i == N_OF(type_names))
            return fail(cv, RLX_E_INVALID, "'type' names a type JSON schema does not have");
        *out |= type_kinds[i];
    }
    return 0;
}

static int nonneg(conv *cv, const cJSON *s, const char *name, int64_t *out) {
    const cJSON *v = kw(s, name);
    uint64_t u = 0;
    if (!v)
        return 0;
    if (!rlx__json_u64(v, &u))
        return fail(cv, RLX_E_INVALID, "'%s' must be a non-negative integer", name);
    *out = u > (uint64_t)INT64_MAX / 2 ? INT64_MAX / 2 : (int64_t)u;
    return 1;
}

static int schema_array(conv *cv, const cJSON *v, const char *name) {
    if (!cJSON_IsArray(v) || !v->child)
        return fail(cv, RLX_E_INVALID, "'%s' must be a non-empty array of schemas", name);
    int n = 0;
    for (const cJSON *e = v->child; e; e = e->next, n++)
        if (!is_schema(e))
            return fail(cv, RLX_E_INVALID, "'%s' must be a non-empty array of schemas", name);
    if (n > SCHEMA_MAX_BRANCHES)
        return fail(cv, RLX_E_UNSUPPORTED, "'%s' with more than %d members", name, SCHEMA_MAX_BRANCHES);
    return 0;
}

/* Every keyword of s is known and well formed. */
static int check_keywords(conv *cv, const cJSON *s) {
    for (const cJSON *e = s->child; e && !cv->err; e = e->next) {
        const char *k = e->string;
        if (is_annotation(k)) {
            if (strcmp(k, "$id") == 0 && s != cv->doc)
                fail(cv, RLX_E_UNSUPPORTED,
                     "unsupported JSON schema keyword '$id' below the root (it moves the base "
                     "of $ref)");
            else if ((strcmp(k, "$defs") == 0 || strcmp(k, "definitions") == 0) && !cJSON_IsObject(e))
                fail(cv, RLX_E_INVALID, "'%s' must be an object of schemas", k);
            continue;
        }
        if (!in_list(k, handled_keywords, N_OF(handled_keywords))) {
            fail(cv, RLX_E_UNSUPPORTED, "unsupported JSON schema keyword '%.64s'", k);
            break;
        }
        int64_t n = 0;
        int mask = 0;
        if (strcmp(k, "type") == 0) {
            type_kinds_of(cv, e, &mask);
        } else if (strcmp(k, "enum") == 0) {
            if (!cJSON_IsArray(e))
                fail(cv, RLX_E_INVALID, "'enum' must be an array");
            else if (cJSON_GetArraySize(e) > SCHEMA_MAX_BRANCHES)
                fail(cv, RLX_E_UNSUPPORTED, "'enum' with more than %d values", SCHEMA_MAX_BRANCHES);
        } else if (strcmp(k, "properties") == 0) {
            if (!cJSON_IsObject(e))
                fail(cv, RLX_E_INVALID, "'properties' must be an object of schemas");
            else if (cJSON_GetArraySize(e) > SCHEMA_MAX_MEMBERS)
                fail(cv, RLX_E_UNSUPPORTED, "'properties' with more than %d names", SCHEMA_MAX_MEMBERS);
            for (const cJSON *p = e->child; p && !cv->err; p = p->next)
                if (!is_schema(p))
                    fail(cv, RLX_E_INVALID, "'properties' must be an object of schemas");
        } else if (strcmp(k, "required") == 0) {
            if (!cJSON_IsArray(e))
                fail(cv, RLX_E_INVALID, "'required' must be an array of strings");
            else if (cJSON_GetArraySize(e) > SCHEMA_MAX_MEMBERS)
                fail(cv, RLX_E_UNSUPPORTED, "'required' with more than %d names", SCHEMA_MAX_MEMBERS);
            for (const cJSON *p = e->child; p && !cv->err; p = p->next) {
                if (!cJSON_IsString(p))
                    fail(cv, RLX_E_INVALID, "'required' must be an array of strings");
                for (const cJSON *q = e->child; q != p && !cv->err; q = q->next)
                    if (strcmp(q->valuestring, p->valuestring) == 0)
                        fail(cv, RLX_E_INVALID, "'required' lists '%.64s' twice", p->valuestring);
            }
        } else if (strcmp(k, "additionalProperties") == 0) {
            if (!is_schema(e))
                fail(cv, RLX_E_INVALID, "'additionalProperties' must be a schema");
        } else if (strcmp(k, "items") == 0) {
            if (!is_schema(e))
                fail(cv, RLX_E_INVALID, "'items' must be a schema");
        } else if (schema_list_key(k)) {
            schema_array(cv, e, k);
        } else if (strcmp(k, "minItems") == 0 || strcmp(k, "maxItems") == 0 || strcmp(k, "minLength") == 0 ||
                   strcmp(k, "maxLength") == 0 || strcmp(k, "minProperties") == 0) {
            if (nonneg(cv, s, k, &n) && n > 0 && strcmp(k, "minProperties") == 0)
                fail(cv, RLX_E_UNSUPPORTED, "unsupported JSON schema keyword 'minProperties' (above 0)");
        } else if (strcmp(k, "pattern") == 0 || strcmp(k, "format") == 0 || strcmp(k, "$ref") == 0) {
            if (!cJSON_IsString(e))
                fail(cv, RLX_E_INVALID, "'%s' must be a string", k);
        } else if (strcmp(k, "minimum") == 0 || strcmp(k, "maximum") == 0 || strcmp(k, "exclusiveMinimum") == 0 ||
                   strcmp(k, "exclusiveMaximum") == 0) {
            if (!cJSON_IsNumber(e) || !isfinite(e->valuedouble))
                fail(cv, RLX_E_INVALID, "'%s' must be a finite number", k);
        } else if (strcmp(k, "uniqueItems") == 0) {
            if (!cJSON_IsBool(e))
                fail(cv, RLX_E_INVALID, "'uniqueItems' must be a boolean");
            else if (cJSON_IsTrue(e))
                fail(cv, RLX_E_UNSUPPORTED, "unsupported JSON schema keyword 'uniqueItems' (true)");
        }
    }
    return cv->err;
}

// --- $ref

/* The node a local $ref names, and its JSON pointer (percent-decoded) in *ptr. */
static int resolve_ref(conv *cv, const char *ref, const cJSON **node, sbuf *ptr) {
    if (ref[0] != '#')
        return fail(cv, RLX_E_UNSUPPORTED, "unsupported remote $ref '%.100s' (only '#...' within the schema)", ref);
    if (ref[1] && ref[1] != '/')
        return fail(cv, RLX_E_UNSUPPORTED, "unsupported $ref to an anchor '%.100s'", ref);
    for (const char *p = ref + 1; *p && !cv->err; p++) {
        if (*p != '%') {
            put(cv, ptr, p, 1);
            continue;
        }
        unsigned v = 0;
        for (int k = 1; k <= 2; k++) {
            char c = p[k];
            int d = c >= '0' && c <= '9'   ? c - '0'
                    : c >= 'a' && c <= 'f' ? c - 'a' + 10
                    : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                           : -1;
            if (d < 0)
                return fail(cv, RLX_E_INVALID, "$ref '%.100s' with a bad %%-escape", ref);
            v = v << 4 | (unsigned)d;
        }
        if (v == 0)
            return fail(cv, RLX_E_INVALID, "$ref '%.100s' with a bad %%-escape", ref);
        char c = (char)v;
        put(cv, ptr, &c, 1);
        p += 2;
    }
    if (cv->err)
        return cv->err;
    const cJSON *at = cv->doc;
    const char *p = ptr->p ? ptr->p : "";
    sbuf seg = {0};
    while (*p && !cv->err) {
        p++; /* '/' */
        seg.len = 0;
        put(cv, &seg, "", 0);
        for (; *p && *p != '/' && !cv->err; p++) {
            char c = *p;
            if (c == '~') {
                if (p[1] != '0' && p[1] != '1') {
                    fail(cv, RLX_E_INVALID, "$ref '%.100s' with a bad ~-escape", ref);
                    break;
                }
                c = p[1] == '0' ? '~' : '/';
                p++;
            }
            put(cv, &seg, &c, 1);
        }
        if (cv->err)
            break;
        const char *name = seg.p ? seg.p : "";
        const cJSON *next = NULL;
        if (cJSON_IsObject(at)) {
            next = cJSON_GetObjectItemCaseSensitive(at, name);
        } else if (cJSON_IsArray(at) && name[0] >= '0' && name[0] <= '9' && (name[0] != '0' || !name[1]) &&
                   strlen(name) < 9) {
            size_t i = 0;
            while (name[i] >= '0' && name[i] <= '9')
                i++;
            if (!name[i])
                next = cJSON_GetArrayItem(at, atoi(name));
        }
        if (!next)
            fail(cv, RLX_E_INVALID, "$ref '%.100s' names nothing in the schema", ref);
        at = next;
    }
    sb_free(&seg);
    *node = at;
    return cv->err;
}

/* The rule name of a $ref target, its rule queued for writing when new; left: the reference
 * comes before any text of the current rule. */
static int emit_ref(conv *cv, const char *ref, sbuf *out, int left) {
    const cJSON *node = NULL;
    sbuf ptr = {0};
    if (resolve_ref(cv, ref, &node, &ptr) < 0) {
        sb_free(&ptr);
        return cv->err;
    }
    size_t t = 0;
    while (t < cv->n_refs && cv->refs[t].node != node)
        t++;
    if (t == cv->n_refs) {
        if (cv->n_refs == SCHEMA_MAX_REFS) {
            sb_free(&ptr);
            return fail(cv, RLX_E_UNSUPPORTED, "more than %d schemas named by $ref", SCHEMA_MAX_REFS);
        }
        if (cv->n_refs == cv->cap_refs) {
            size_t cap = cv->cap_refs ? cv->cap_refs * 2 : 16;
            ref_target *r = rlx__realloc(cv->refs, cap * sizeof *r);
            if (!r) {
                sb_free(&ptr);
                return nomem(cv);
            }
            cv->refs = r;
            cv->cap_refs = cap;
        }
        const char *hint = ptr.p && strrchr(ptr.p, '/') ? strrchr(ptr.p, '/') + 1 : "ref";
        size_t rl = new_rule(cv, hint);
        if (cv->err) {
            sb_free(&ptr);
            return cv->err;
        }
        cv->refs[t] = (ref_target){.node = node, .path = ptr.p, .rule = rl};
        ptr = (sbuf){0};
        if (!cv->refs[t].path && !(cv->refs[t].path = rlx__strdup(""))) {
            return nomem(cv);
        }
        cv->n_refs++;
    }
    sb_free(&ptr);
    puts_(cv, out, cv->rules[cv->refs[t].rule].name);
    if (left && !cv->err) {
        ref_target *cur = &cv->refs[cv->cur_ref];
        if (cur->n_left == cur->cap_left) {
            size_t cap = cur->cap_left ? cur->cap_left * 2 : 4;
            int *l = rlx__realloc(cur->left, cap * sizeof *l);
            if (!l)
                return nomem(cv);
            cur->left = l;
            cur->cap_left = cap;
        }
        cur->left[cur->n_left++] = (int)t;
    }
    return cv->err;
}

// --- allOf and $ref beside other keywords: one schema that is their conjunction

static size_t count_nodes(const cJSON *v, size_t limit) {
    size_t n = 1;
    for (const cJSON *c = v->child; c && n <= limit; c = c->next)
        n += count_nodes(c, limit - n);
    return n;
}

static cJSON *dup(conv *cv, const cJSON *v) {
    if (step(cv, count_nodes(v, SCHEMA_MAX_STEPS)) < 0)
        return NULL;
    cJSON *c = cJSON_Duplicate(v, 1);
    if (!c)
        nomem(cv);
    return c;
}

static int add_dup(conv *cv, cJSON *obj, const char *key, const cJSON *v) {
    cJSON *c = dup(cv, v);
    if (c && !cJSON_AddItemToObject(obj, key, c)) {
        cJSON_Delete(c);
        return nomem(cv);
    }
    return cv->err;
}

static int has_props_beyond(const cJSON *a, const cJSON *b) {
    const cJSON *pa = kw(a, "properties"), *pb = kw(b, "properties");
    for (const cJSON *p = pa ? pa->child : NULL; p; p = p->next)
        if (!pb || !cJSON_GetObjectItemCaseSensitive(pb, p->string))
            return 1;
    return 0;
}

static int same_or_absent(const cJSON *a, const cJSON *b) { return (!a && !b) || (a && b && cJSON_Compare(a, b, 1)); }

/* Adds the keywords of src (checked, without $ref and allOf taken) to dst, as a conjunction. */
static int merge_into(conv *cv, cJSON *dst, const cJSON *src) {
    const cJSON *da = kw(dst, "additionalProperties"), *sa = kw(src, "additionalProperties");
    if (((da && !cJSON_IsTrue(da)) && has_props_beyond(src, dst)) ||
        ((sa && !cJSON_IsTrue(sa)) && has_props_beyond(dst, src)))
        return fail(cv, RLX_E_UNSUPPORTED,
                    "unsupported allOf: a member's additionalProperties would govern another member's properties");
    int d_arr = kw(dst, "items") || kw(dst, "prefixItems"), s_arr = kw(src, "items") || kw(src, "prefixItems");
    if ((kw(dst, "prefixItems") || kw(src, "prefixItems")) && d_arr && s_arr &&
        !(same_or_absent(kw(dst, "prefixItems"), kw(src, "prefixItems")) &&
          same_or_absent(kw(dst, "items"), kw(src, "items"))))
        return fail(cv, RLX_E_UNSUPPORTED, "unsupported allOf: members with different prefixItems and items");
    for (const cJSON *e = src->child; e && !cv->err; e = e->next) {
        const char *k = e->string;
        if (is_annotation(k) || strcmp(k, "$ref") == 0 || strcmp(k, "allOf") == 0)
            continue;
        cJSON *d = cJSON_GetObjectItemCaseSensitive(dst, k);
        if (!d) {
            add_dup(cv, dst, k, e);
            continue;
        }
        if (cJSON_Compare(d, e, 1))
            continue;
        if (strcmp(k, "type") == 0) {
            int a = 0, b = 0;
            type_kinds_of(cv, d, &a);
            type_kinds_of(cv, e, &b);
            int m = a & b;
            if (!cv->err && !m)
                return fail(cv, RLX_E_UNSUPPORTED, "unsupported allOf whose members have no type in common");
            cJSON *t = cJSON_CreateArray();
            if (!t)
                return nomem(cv);
            for (size_t i = 0; i < N_OF(type_names); i++) {
                /* number is integer and the rest; when only integers remain, name integer alone */
                int tk = type_kinds[i];
                if ((m & tk) != tk || (tk == K_INTEGER && (m & K_NUMBER)))
                    continue;
                cJSON *name = cJSON_CreateString(type_names[i]);
                if (!name || !cJSON_AddItemToArray(t, name)) {
                    cJSON_Delete(name);
                    cJSON_Delete(t);
                    return nomem(cv);
                }
            }
            cJSON_ReplaceItemInObjectCaseSensitive(dst, k, t);
        } else if (strcmp(k, "required") == 0) {
            for (const cJSON *r = e->child; r && !cv->err; r = r->next) {
                const cJSON *q = d->child;
                while (q && strcmp(q->valuestring, r->valuestring) != 0)
                    q = q->next;
                cJSON *c = q ? NULL : cJSON_CreateString(r->valuestring);
                if (!q && (!c || !cJSON_AddItemToArray(d, c))) {
                    cJSON_Delete(c);
                    return nomem(cv);
                }
            }
        } else if (strcmp(k, "properties") == 0) {
            for (const cJSON *p = e->child; p && !cv->err; p = p->next) {
                cJSON *q = cJSON_GetObjectItemCaseSensitive(d, p->string);
                if (!q) {
                    add_dup(cv, d, p->string, p);
                } else if (!cJSON_Compare(q, p, 1)) {
                    /* both members constrain the property: the conjunction, converted in turn */
                    cJSON *all = cJSON_CreateObject(), *arr = cJSON_CreateArray(), *qc = dup(cv, q), *pc = dup(cv, p);
                    int ok = all && arr && qc && pc && cJSON_AddItemToArray(arr, qc);
                    if (ok)
                        qc = NULL;
                    ok = ok && cJSON_AddItemToArray(arr, pc);
                    if (ok)
                        pc = NULL;
                    ok = ok && cJSON_AddItemToObject(all, "allOf", arr);
                    if (ok)
                        arr = NULL;
                    cJSON_Delete(qc);
                    cJSON_Delete(pc);
                    cJSON_Delete(arr);
                    if (!ok) {
                        cJSON_Delete(all);
                        return cv->err ? cv->err : nomem(cv);
                    }
                    cJSON_ReplaceItemInObjectCaseSensitive(d, p->string, all);
                }
            }
        } else if (cJSON_IsNumber(d) && cJSON_IsNumber(e) &&
                   (strcmp(k, "minLength") == 0 || strcmp(k, "minItems") == 0 || strcmp(k, "minimum") == 0 ||
                    strcmp(k, "exclusiveMinimum") == 0)) {
            if (e->valuedouble > d->valuedouble)
                cJSON_SetNumberValue(d, e->valuedouble);
        } else if (cJSON_IsNumber(d) && cJSON_IsNumber(e) &&
                   (strcmp(k, "maxLength") == 0 || strcmp(k, "maxItems") == 0 || strcmp(k, "maximum") == 0 ||
                    strcmp(k, "exclusiveMaximum") == 0)) {
            if (e->valuedouble < d->valuedouble)
                cJSON_SetNumberValue(d, e->valuedouble);
        } else {
            return fail(cv, RLX_E_UNSUPPORTED, "unsupported allOf whose members have different '%.64s'", k);
        }
    }
    return cv->err;
}

static int flatten(conv *cv, const cJSON *s, int chain, cJSON **out);

/* Merges one conjunct (a schema) into dst. */
static int merge_part(conv *cv, cJSON *dst, const cJSON *part, int chain) {
    if (cJSON_IsTrue(part))
        return 0;
    if (!cJSON_IsObject(part))
        return fail(cv, RLX_E_UNSUPPORTED, "a schema false (nothing is valid) in allOf or beside $ref");
    if (check_keywords(cv, part) < 0)
        return cv->err;
    if (!kw(part, "$ref") && !kw(part, "allOf"))
        return merge_into(cv, dst, part);
    cJSON *f = NULL;
    if (flatten(cv, part, chain + 1, &f) == 0)
        merge_into(cv, dst, f);
    cJSON_Delete(f);
    return cv->err;
}

/* s's own keywords, its $ref's target and its allOf members as one schema without $ref or allOf
 * at its top (the caller frees *out). */
static int flatten(conv *cv, const cJSON *s, int chain, cJSON **out) {
    *out = NULL;
    if (chain > SCHEMA_MAX_CHAIN)
        return fail(cv, RLX_E_UNSUPPORTED, "a chain of $ref and allOf longer than %d (a cycle?)", SCHEMA_MAX_CHAIN);
    if (step(cv, 1) < 0)
        return cv->err;
    cJSON *res = cJSON_CreateObject();
    if (!res)
        return nomem(cv);
    merge_into(cv, res, s);
    const cJSON *ref = kw(s, "$ref");
    if (ref && !cv->err) {
        const cJSON *t = NULL;
        sbuf ptr = {0};
        size_t old = path_push(cv, "$ref");
        if (resolve_ref(cv, ref->valuestring, &t, &ptr) == 0)
            merge_part(cv, res, t, chain);
        path_pop(cv, old);
        sb_free(&ptr);
    }
    const cJSON *all = kw(s, "allOf");
    int i = 0;
    for (const cJSON *m = all ? all->child : NULL; m && !cv->err; m = m->next, i++) {
        size_t old = path_push(cv, "allOf");
        path_push_index(cv, i);
        merge_part(cv, res, m, chain);
        path_pop(cv, old);
    }
    if (cv->err) {
        cJSON_Delete(res);
        return cv->err;
    }
    *out = res;
    return 0;
}

// --- telling oneOf branches apart

static int value_kind(const cJSON *v) {
    if (cJSON_IsNull(v))
        return K_NULL;
    if (cJSON_IsBool(v))
        return K_BOOLEAN;
    if (cJSON_IsNumber(v))
        return floor(v->valuedouble) == v->valuedouble ? K_INTEGER : K_NUMBER;
    if (cJSON_IsString(v))
        return K_STRING;
    return cJSON_IsArray(v) ? K_ARRAY : K_OBJECT;
}

/* The kinds of value s may accept (more, never fewer). */
static int kinds_of(conv *cv, const cJSON *s, int chain) {
    if (cJSON_IsFalse(s))
        return 0;
    if (!cJSON_IsObject(s) || chain > SCHEMA_MAX_CHAIN || step(cv, 1) < 0)
        return K_ALL;
    int m = K_ALL, t = 0;
    const cJSON *v;
    if ((v = kw(s, "type")) && type_kinds_of(cv, v, &t) == 0)
        m &= t;
    if ((v = kw(s, "const")))
        m &= value_kind(v);
    if ((v = kw(s, "enum")) && cJSON_IsArray(v)) {
        int e = 0;
        for (const cJSON *x = v->child; x; x = x->next)
            e |= value_kind(x);
        m &= e;
    }
    if ((v = kw(s, "$ref")) && cJSON_IsString(v)) {
        const cJSON *t2 = NULL;
        sbuf ptr = {0};
        if (resolve_ref(cv, v->valuestring, &t2, &ptr) == 0)
            m &= kinds_of(cv, t2, chain + 1);
        sb_free(&ptr);
    }
    const char *unions[] = {"anyOf", "oneOf"};
    for (int u = 0; u < 2; u++)
        if ((v = kw(s, unions[u])) && cJSON_IsArray(v)) {
            int e = 0;
            for (const cJSON *x = v->child; x; x = x->next)
                e |= kinds_of(cv, x, chain + 1);
            m &= e;
        }
    if ((v = kw(s, "allOf")) && cJSON_IsArray(v))
        for (const cJSON *x = v->child; x; x = x->next)
            m &= kinds_of(cv, x, chain + 1);
    return m;
}

/* The values s allows when it is an enum or const (beside only type and annotations), following
 * plain $refs; NULL otherwise. *single: the result is the const value itself. */
static const cJSON *consts_of(conv *cv, const cJSON *s, int chain, int *single) {
    while (cJSON_IsObject(s) && chain++ <= SCHEMA_MAX_CHAIN && step(cv, 1) == 0) {
        const cJSON *ref = kw(s, "$ref"), *res = NULL;
        int others = 0;
        for (const cJSON *e = s->child; e; e = e->next)
            if (!is_annotation(e->string) && strcmp(e->string, "type") != 0 && strcmp(e->string, "enum") != 0 &&
                strcmp(e->string, "const") != 0 && strcmp(e->string, "$ref") != 0)
                others = 1;
        if (others)
            return NULL;
        if (ref) {
            if (kw(s, "enum") || kw(s, "const") || kw(s, "type") || !cJSON_IsString(ref))
                return NULL;
            sbuf ptr = {0};
            const cJSON *t = NULL;
            resolve_ref(cv, ref->valuestring, &t, &ptr);
            sb_free(&ptr);
            if (cv->err)
                return NULL;
            s = t;
            continue;
        }
        if ((res = kw(s, "const"))) {
            *single = 1;
            return res;
        }
        if ((res = kw(s, "enum")) && cJSON_IsArray(res)) {
            *single = 0;
            return res;
        }
        return NULL;
    }
    return NULL;
}

static int values_disjoint(conv *cv, const cJSON *a, int a_single, const cJSON *b, int b_single) {
    int nb = b_single ? 1 : cJSON_GetArraySize(b);
    for (const cJSON *x = a_single ? a : a->child; x && step(cv, (size_t)nb) == 0; x = a_single ? NULL : x->next)
        for (const cJSON *y = b_single ? b : b->child; y; y = b_single ? NULL : y->next)
            if (cJSON_Compare(x, y, 1))
                return 0;
    return 1;
}

static int required_has(const cJSON *s, const char *name) {
    const cJSON *r = kw(s, "required");
    for (const cJSON *q = cJSON_IsArray(r) ? r->child : NULL; q; q = q->next)
        if (cJSON_IsString(q) && strcmp(q->valuestring, name) == 0)
            return 1;
    return 0;
}

/* Whether no value can match both a and b: different kinds, different constants, or objects that
 * both require a property whose constants differ (a discriminated union). */
static int disjoint(conv *cv, const cJSON *a, const cJSON *b) {
    int ka = kinds_of(cv, a, 0), kb = kinds_of(cv, b, 0);
    if (!(ka & kb))
        return 1;
    int sa = 0, sb = 0;
    const cJSON *ca = consts_of(cv, a, 0, &sa), *cb = consts_of(cv, b, 0, &sb);
    if (ca && cb)
        return values_disjoint(cv, ca, sa, cb, sb);
    if ((ka | kb) != K_OBJECT || cv->err)
        return 0;
    cJSON *fa = NULL, *fb = NULL;
    int result = 0;
    if (cJSON_IsObject(a) && (kw(a, "$ref") || kw(a, "allOf")))
        flatten(cv, a, 1, &fa);
    if (cJSON_IsObject(b) && (kw(b, "$ref") || kw(b, "allOf")))
        flatten(cv, b, 1, &fb);
    const cJSON *va = fa ? fa : a, *vb = fb ? fb : b;
    const cJSON *pa = kw(va, "properties"), *pb = kw(vb, "properties");
    for (const cJSON *p = pa ? pa->child : NULL; p && !result && !cv->err; p = p->next) {
        const cJSON *q = pb ? cJSON_GetObjectItemCaseSensitive(pb, p->string) : NULL;
        if (!q || !required_has(va, p->string) || !required_has(vb, p->string))
            continue;
        ca = consts_of(cv, p, 0, &sa);
        cb = consts_of(cv, q, 0, &sb);
        result = ca && cb && values_disjoint(cv, ca, sa, cb, sb);
    }
    cJSON_Delete(fa);
    cJSON_Delete(fb);
    return result;
}

// --- numbers

static void digit_class(conv *cv, sbuf *b, int lo, int hi) {
    if (lo == hi)
        putf(cv, b, "\"%d\"", lo);
    else
        putf(cv, b, "[%d-%d]", lo, hi);
}

static void any_digits(conv *cv, sbuf *b, int n) {
    if (n == 1)
        puts_(cv, b, "[0-9]");
    else if (n > 1)
        putf(cv, b, "[0-9]{%d}", n);
}

/* The n-digit strings >= x (ge) or <= x (!ge); x has n >= 1 digits. */
static void bound_digits(conv *cv, sbuf *b, const char *x, int n, int ge) {
    int full = 1;
    for (int i = 0; i < n; i++)
        full &= x[i] == (ge ? '0' : '9');
    int d = x[0] - '0';
    if (full) {
        any_digits(cv, b, n);
    } else if (n == 1) {
        digit_class(cv, b, ge ? d : 0, ge ? 9 : d);
    } else {
        putf(cv, b, "( \"%c\" ", x[0]);
        bound_digits(cv, b, x + 1, n - 1, ge);
        if (ge ? d < 9 : d > 0) {
            puts_(cv, b, " | ");
            digit_class(cv, b, ge ? d + 1 : 0, ge ? 9 : d - 1);
            puts_(cv, b, " ");
            any_digits(cv, b, n - 1);
        }
        puts_(cv, b, " )");
    }
}

/* The n-digit strings from x to y (x <= y). */
static void same_length(conv *cv, sbuf *b, const char *x, const char *y, int n) {
    int i = 0;
    while (i < n && x[i] == y[i])
        i++;
    if (i == n) {
        putf(cv, b, "\"%.*s\"", n, x);
        return;
    }
    if (i)
        putf(cv, b, "\"%.*s\" ", i, x);
    int rest = n - i - 1, xi = x[i] - '0', yi = y[i] - '0';
    if (!rest) {
        digit_class(cv, b, xi, yi);
        return;
    }
    int low_full = 1, high_full = 1;
    for (int k = i + 1; k < n; k++) {
        low_full &= x[k] == '0';
        high_full &= y[k] == '9';
    }
    int from = low_full ? xi : xi + 1, to = high_full ? yi : yi - 1, alts = 0;
    puts_(cv, b, "( ");
    if (!low_full) {
        putf(cv, b, "\"%d\" ", xi);
        bound_digits(cv, b, x + i + 1, rest, 1);
        alts++;
    }
    if (from <= to) {
        puts_(cv, b, alts++ ? " | " : "");
        digit_class(cv, b, from, to);
        puts_(cv, b, " ");
        any_digits(cv, b, rest);
    }
    if (!high_full) {
        putf(cv, b, "%s\"%d\" ", alts++ ? " | " : "", yi);
        bound_digits(cv, b, y + i + 1, rest, 0);
    }
    puts_(cv, b, " )");
}

/* The decimal integers lo..hi (0 <= lo <= hi <= SCHEMA_INT_MAX), without leading zeros. */
static void uint_range(conv *cv, sbuf *b, int64_t lo, int64_t hi) {
    char x[24], y[24];
    int dl = snprintf(x, sizeof x, "%lld", (long long)lo), dh = snprintf(y, sizeof y, "%lld", (long long)hi);
    if (dl != dh)
        puts_(cv, b, "( ");
    int64_t p = 1;
    for (int d = 1; d < dl; d++)
        p *= 10;
    for (int d = dl; d <= dh; d++, p *= 10) {
        int64_t a = lo > (d == 1 ? 0 : p) ? lo : (d == 1 ? 0 : p), z = hi < p * 10 - 1 ? hi : p * 10 - 1;
        snprintf(x, sizeof x, "%lld", (long long)a);
        snprintf(y, sizeof y, "%lld", (long long)z);
        if (d > dl)
            puts_(cv, b, " | ");
        same_length(cv, b, x, y, d);
    }
    if (dl != dh)
        puts_(cv, b, " )");
}

typedef struct bounds {
    int has_lo, has_hi, lo_ex, hi_ex;
    double lo, hi;
} bounds;

static bounds get_bounds(const cJSON *s) {
    bounds b = {0};
    const cJSON *v;
    if ((v = kw(s, "minimum")))
        b = (bounds){.has_lo = 1, .lo = v->valuedouble};
    if ((v = kw(s, "exclusiveMinimum")) && (!b.has_lo || v->valuedouble >= b.lo)) {
        b.has_lo = b.lo_ex = 1;
        b.lo = v->valuedouble;
    }
    if ((v = kw(s, "maximum"))) {
        b.has_hi = 1;
        b.hi = v->valuedouble;
    }
    if ((v = kw(s, "exclusiveMaximum")) && (!b.has_hi || v->valuedouble <= b.hi)) {
        b.has_hi = b.hi_ex = 1;
        b.hi = v->valuedouble;
    }
    return b;
}

static int gen_integer(conv *cv, const cJSON *s, sbuf *out) {
    bounds bd = get_bounds(s);
    if (!bd.has_lo && !bd.has_hi) {
        prim_ref(cv, out, P_INTEGER);
        return cv->err;
    }
    /* the integers of the bounds, within the SCHEMA_INT_DIGITS digits the grammar writes */
    const double top = (double)SCHEMA_INT_MAX;
    double lo = !bd.has_lo ? -top : bd.lo_ex ? floor(bd.lo) + 1 : ceil(bd.lo);
    double hi = !bd.has_hi ? top : bd.hi_ex ? ceil(bd.hi) - 1 : floor(bd.hi);
    lo = lo < -top ? -top : lo;
    hi = hi > top ? top : hi;
    if (lo > hi)
        return fail(cv, RLX_E_UNSUPPORTED, "integer bounds that no integer of up to %d digits meets",
                    SCHEMA_INT_DIGITS);
    int64_t a = (int64_t)lo, z = (int64_t)hi;
    puts_(cv, out, "( ");
    if (a < 0) {
        puts_(cv, out, "\"-\" ");
        uint_range(cv, out, z < 0 ? -z : 1, -a);
    }
    if (z >= 0) {
        puts_(cv, out, a < 0 ? " | " : "");
        uint_range(cv, out, a > 0 ? a : 0, z);
    }
    put_spaced(cv, out, " ) ");
    return cv->err;
}

/* Non-negative decimals y without exponent, a <= y (a < y when a_ex) and y <= b (y < b when
 * b_ex; b < 0: no upper bound), a and b integers. */
static void decimal_range(conv *cv, sbuf *out, int64_t a, int a_ex, int64_t b, int b_ex) {
    int64_t lo_any = a + a_ex, hi_any = b < 0 ? SCHEMA_INT_MAX : b - 1;
    int alts = 0;
    puts_(cv, out, "( ");
    if (lo_any <= hi_any) {
        uint_range(cv, out, lo_any, hi_any);
        putf(cv, out, " ( \".\" [0-9]{1,%d} )?", SCHEMA_FRAC_DIGITS);
        alts++;
    }
    if (a_ex && (b < 0 || a < b)) { /* a itself, with a fraction that is not zero */
        putf(cv, out, "%s\"%lld.\" \"0\"{0,%d} [1-9] [0-9]{0,%d}", alts++ ? " | " : "", (long long)a,
             SCHEMA_FRAC_DIGITS - 1, SCHEMA_FRAC_DIGITS - 1);
    }
    if (b >= 0 && !b_ex && (a_ex ? b > a : b >= a)) /* b itself, with a zero fraction at most */
        putf(cv, out, "%s\"%lld\" ( \".\" \"0\"{1,%d} )?", alts++ ? " | " : "", (long long)b, SCHEMA_FRAC_DIGITS);
    puts_(cv, out, " )");
}

/* A number with bounds: integer bounds only (then the ranges are exact), written without exponent. */
static int gen_number(conv *cv, const cJSON *s, sbuf *out) {
    bounds bd = get_bounds(s);
    if (!bd.has_lo && !bd.has_hi) {
        prim_ref(cv, out, P_NUMBER);
        return cv->err;
    }
    if ((bd.has_lo && floor(bd.lo) != bd.lo) || (bd.has_hi && floor(bd.hi) != bd.hi))
        return fail(cv, RLX_E_UNSUPPORTED, "unsupported bound %g on a number (only integer bounds)",
                    bd.has_lo && floor(bd.lo) != bd.lo ? bd.lo : bd.hi);
    const double top = (double)SCHEMA_INT_MAX;
    if (bd.has_lo && bd.lo <= -(top + 1)) /* below every number the grammar writes */
        bd.has_lo = 0;
    if (bd.has_hi && bd.hi >= top + 1)
        bd.has_hi = 0;
    if ((bd.has_lo && bd.lo > top) || (bd.has_hi && bd.hi < -top))
        return fail(cv, RLX_E_UNSUPPORTED, "number bounds beyond the %d-digit integer part the grammar writes",
                    SCHEMA_INT_DIGITS);
    int64_t lo = (int64_t)bd.lo, hi = (int64_t)bd.hi;
    int alts = 0;
    puts_(cv, out, "( ");
    if (!bd.has_lo || lo < 0) { /* x = -y, y > 0 */
        int64_t ya = bd.has_hi && hi < 0 ? -hi : 0;
        int ya_ex = bd.has_hi && hi < 0 ? bd.hi_ex : 1;
        int64_t yb = bd.has_lo ? -lo : -1;
        if (yb < 0 || ya < yb || (ya == yb && !ya_ex && !bd.lo_ex)) {
            puts_(cv, out, "\"-\" ");
            decimal_range(cv, out, ya, ya_ex, yb, bd.lo_ex);
            alts++;
        }
    }
    if (!bd.has_hi || hi > 0 || (hi == 0 && !bd.hi_ex)) {
        int64_t a = bd.has_lo && lo >= 0 ? lo : 0;
        int a_ex = bd.has_lo && lo >= 0 ? bd.lo_ex : 0;
        int64_t b = bd.has_hi ? hi : -1;
        if (b < 0 || a < b || (a == b && !a_ex && !bd.hi_ex)) {
            puts_(cv, out, alts ? " | " : "");
            decimal_range(cv, out, a, a_ex, b, bd.hi_ex);
            alts++;
        }
    }
    if (!alts)
        return fail(cv, RLX_E_UNSUPPORTED, "number bounds that no number meets");
    put_spaced(cv, out, " ) ");
    return cv->err;
}

// --- strings

static int gen_string(conv *cv, const cJSON *s, sbuf *out) {
    int64_t lo = 0, hi = -1;
    nonneg(cv, s, "minLength", &lo);
    nonneg(cv, s, "maxLength", &hi);
    const cJSON *pattern = kw(s, "pattern"), *format = kw(s, "format");
    int lengths = lo > 0 || hi >= 0;
    if (pattern && (format || lengths))
        return fail(cv, RLX_E_UNSUPPORTED, "unsupported 'pattern' beside '%s'",
                    format ? "format" : "minLength/maxLength");
    if (format && lengths)
        return fail(cv, RLX_E_UNSUPPORTED, "unsupported 'format' beside 'minLength/maxLength'");
    if (pattern)
        return gen_pattern(cv, pattern->valuestring, out);
    if (format) {
        static const char *const names[] = {"date", "time", "date-time", "uuid", "ipv4"};
        static const int rules[] = {P_DATE, P_TIME, P_DATE_TIME, P_UUID, P_IPV4};
        size_t i = 0;
        while (i < N_OF(names) && strcmp(names[i], format->valuestring) != 0)
            i++;
        if (i == N_OF(names))
            return fail(cv, RLX_E_UNSUPPORTED,
                        "unsupported format '%.64s' (supported: date, time, date-time, uuid, "
                        "ipv4)",
                        format->valuestring);
        puts_(cv, out, "\"\\\"\" ");
        prim_ref(cv, out, rules[i]);
        put_spaced(cv, out, " \"\\\"\" ");
        return cv->err;
    }
    if (!lengths) {
        prim_ref(cv, out, P_STRING);
        return cv->err;
    }
    if (hi >= 0 && lo > hi)
        return fail(cv, RLX_E_UNSUPPORTED, "minLength above maxLength (nothing is valid)");
    if (lo > SCHEMA_MAX_REPEAT || hi > SCHEMA_MAX_REPEAT)
        return fail(cv, RLX_E_UNSUPPORTED, "a string length bound beyond %d", SCHEMA_MAX_REPEAT);
    puts_(cv, out, "\"\\\"\" ");
    sbuf c = {0};
    prim_ref(cv, &c, P_CHAR);
    rep(cv, out, c.p ? c.p : "", lo, hi);
    sb_free(&c);
    put_spaced(cv, out, hi == 0 ? "\"\\\"\" " : " \"\\\"\" ");
    return cv->err;
}

// --- objects

/* The names an additional key must not be, as a tree of code points. */
typedef struct tnode {
    uint32_t cp;
    int child, sibling, terminal;
} tnode;

typedef struct trie {
    tnode *n;
    size_t len, cap;
} trie;

static int trie_node(conv *cv, trie *t, uint32_t cp) {
    if (t->len == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 16;
        tnode *n = rlx__realloc(t->n, cap * sizeof *n);
        if (!n)
            return nomem(cv);
        t->n = n;
        t->cap = cap;
    }
    t->n[t->len] = (tnode){.cp = cp, .child = -1, .sibling = -1};
    return (int)t->len++;
}

static int trie_add(conv *cv, trie *t, const char *name) {
    int at = 0;
    size_t n = strlen(name);
    if (n > SCHEMA_MAX_NAME)
        return fail(cv, RLX_E_UNSUPPORTED, "a property name longer than %d bytes", SCHEMA_MAX_NAME);
    for (size_t i = 0; i < n && !cv->err;) {
        uint32_t cp = 0;
        int k = utf8_decode((const unsigned char *)name + i, n - i, &cp);
        if (k <= 0)
            return fail(cv, RLX_E_INVALID, "a property name that is not valid UTF-8");
        i += (size_t)k;
        int c = t->n[at].child;
        while (c >= 0 && t->n[c].cp != cp)
            c = t->n[c].sibling;
        if (c < 0) {
            c = trie_node(cv, t, cp);
            if (c < 0)
                return cv->err;
            t->n[c].sibling = t->n[at].child;
            t->n[at].child = c;
        }
        at = c;
    }
    t->n[at].terminal = 1;
    return cv->err;
}

/* The characters that start no listed name after the node's prefix, then any characters. */
__attribute__((noinline)) static void trie_other(conv *cv, const trie *t, int at, sbuf *out) {
    cpset other = {.n = 0};
    set_add(&other, 0, CP_MAX);
    for (int c = t->n[at].child; c >= 0; c = t->n[c].sibling)
        set_remove(&other, t->n[c].cp, t->n[c].cp);
    if (other.overflow) {
        fail(cv, RLX_E_UNSUPPORTED, "more than %d property names that differ first at one place", SCHEMA_MAX_RANGES);
    } else if (other.n) {
        puts_(cv, out, " | ");
        emit_set(cv, out, &other);
        puts_(cv, out, " ");
        prim_ref(cv, out, P_PCHAR);
        puts_(cv, out, "*");
    }
}

/* The key characters after the node's prefix that make a name outside the node's set (the
 * recursion is as deep as the longest name, SCHEMA_MAX_NAME). */
static void trie_expr(conv *cv, trie *t, int at, sbuf *out) {
    tnode *node = &t->n[at];
    if (node->child < 0) {
        prim_ref(cv, out, P_PCHAR);
        puts_(cv, out, node->terminal ? "+" : "*");
        return;
    }
    puts_(cv, out, "( ");
    int alts = 0;
    for (int c = node->child; c >= 0 && !cv->err; c = t->n[c].sibling) {
        char enc[8];
        sbuf lit = {0};
        put(cv, &lit, "\"", 1);
        lit_bytes(cv, &lit, enc, json_char(t->n[c].cp, enc));
        put(cv, &lit, "\" ", 2);
        puts_(cv, out, alts++ ? " | " : "");
        if (lit.p)
            put(cv, out, lit.p, lit.len);
        sb_free(&lit);
        if (t->n[c].child < 0) {
            trie_expr(cv, t, c, out);
        } else {
            sbuf sub = {0};
            trie_expr(cv, t, c, &sub);
            make_rule(cv, "key", &sub, out);
            sb_free(&sub);
        }
    }
    trie_other(cv, t, at, out);
    if (!t->n[at].terminal) /* the prefix itself is a name to allow */
        puts_(cv, out, " | ");
    puts_(cv, out, " )");
}

typedef struct member {
    const char *name;
    const cJSON *schema; /* NULL: the additionalProperties schema, or any value */
    int required;
} member;

static int gen_value(conv *cv, const cJSON *s, sbuf *out, int left);

/* kv of one member: "name" space ":" space value. */
static void gen_member(conv *cv, const member *m, const cJSON *addl, sbuf *out) {
    json_string_lit(cv, out, m->name);
    put_spaced(cv, out, " ");
    put_spaced(cv, out, " \":\" ");
    puts_(cv, out, " ");
    size_t old = path_push(cv, m->schema ? "properties" : "additionalProperties");
    if (m->schema)
        path_push(cv, m->name);
    if (m->schema)
        gen_value(cv, m->schema, out, 0);
    else if (addl && cJSON_IsObject(addl))
        gen_value(cv, addl, out, 0);
    else
        prim_ref(cv, out, P_VALUE);
    path_pop(cv, old);
}

/* Moves expr into a rule when it is long enough that naming it twice beats writing it twice. */
static void share(conv *cv, const char *hint, sbuf *expr) {
    if (expr->len <= 48 || cv->err)
        return;
    sbuf name = {0};
    make_rule(cv, hint, expr, &name);
    sb_free(expr);
    *expr = name;
}

static void cat3(conv *cv, sbuf *out, const char *a, const sbuf *b, const sbuf *c) {
    puts_(cv, out, a);
    if (b->p)
        put(cv, out, b->p, b->len);
    if (c->len) {
        puts_(cv, out, " ");
        put(cv, out, c->p, c->len);
    }
}

/* The members of an object schema in the order the grammar writes them (properties, then the
 * required names it does not list), and every name an additional key must not be in t. */
static size_t collect_members(conv *cv, const cJSON *s, member *m, trie *t) {
    const cJSON *props = kw(s, "properties"), *req = kw(s, "required"), *addl = kw(s, "additionalProperties");
    size_t n = 0;
    for (const cJSON *p = props ? props->child : NULL; p && !cv->err; p = p->next) {
        int r = required_has(s, p->string);
        trie_add(cv, t, p->string);
        if (cJSON_IsFalse(p)) { /* never present: only its name matters, as one additional keys avoid */
            if (r) {
                size_t old = path_push(cv, "properties");
                path_push(cv, p->string);
                fail(cv, RLX_E_UNSUPPORTED, "required property '%.64s' has the schema false (nothing is valid)",
                     p->string);
                path_pop(cv, old);
            }
            continue;
        }
        m[n++] = (member){.name = p->string, .schema = p, .required = r};
    }
    for (const cJSON *r = req ? req->child : NULL; r && !cv->err; r = r->next) {
        if (props && cJSON_GetObjectItemCaseSensitive(props, r->valuestring))
            continue;
        if (cJSON_IsFalse(addl))
            fail(cv, RLX_E_UNSUPPORTED, "required property '%.64s' is not allowed by additionalProperties false",
                 r->valuestring);
        trie_add(cv, t, r->valuestring);
        m[n++] = (member){.name = r->valuestring, .required = 1};
    }
    return n;
}

/* The additional members' tail: A_n = ("," space kv)* and F_n = (kv A_n)?. */
static void gen_additional(conv *cv, const cJSON *addl, trie *t, sbuf *A, sbuf *F) {
    sbuf key = {0}, kv = {0};
    puts_(cv, &key, "\"\\\"\" ");
    trie_expr(cv, t, 0, &key);
    put_spaced(cv, &key, " \"\\\"\" ");
    put_spaced(cv, &key, " \":\" ");
    puts_(cv, &key, " ");
    size_t old = path_push(cv, "additionalProperties");
    if (addl && cJSON_IsObject(addl))
        gen_value(cv, addl, &key, 0);
    else
        prim_ref(cv, &key, P_VALUE);
    path_pop(cv, old);
    make_rule(cv, "additional", &key, &kv);
    put_spaced(cv, A, "( \",\" ");
    putf(cv, A, " %s )*", kv.p ? kv.p : "");
    share(cv, "more", A);
    putf(cv, F, "( %s ", kv.p ? kv.p : "");
    if (A->p)
        put(cv, F, A->p, A->len);
    puts_(cv, F, " )?");
    sb_free(&key);
    sb_free(&kv);
}

/* Members in order, the required ones required, then additional members: two chains of rules,
 * F_i (nothing written yet) and A_i (a member written before, so a comma first), from the end. */
static int gen_object(conv *cv, const cJSON *s, sbuf *out) {
    const cJSON *props = kw(s, "properties"), *req = kw(s, "required"), *addl = kw(s, "additionalProperties");
    size_t n = 0, cap = (size_t)cJSON_GetArraySize(props) + (size_t)cJSON_GetArraySize(req);
    member *m = cap ? rlx__calloc(cap, sizeof *m) : NULL;
    trie t = {0};
    sbuf A = {0}, F = {0}, kv = {0}, na = {0}, nf = {0};
    if ((cap && !m) || trie_node(cv, &t, 0) < 0) {
        nomem(cv);
        goto done;
    }
    n = collect_members(cv, s, m, &t);
    if (!cv->err && !cJSON_IsFalse(addl))
        gen_additional(cv, addl, &t, &A, &F);
    if (cv->err)
        goto done;
    size_t first_req = n;
    for (size_t i = 0; i < n; i++)
        if (m[i].required) {
            first_req = i;
            break;
        }
    for (size_t i = n; i-- > 0 && !cv->err;) {
        int need_f = i <= first_req, need_a = i >= 1;
        sb_free(&kv);
        gen_member(cv, &m[i], addl, &kv);
        if (need_f && need_a)
            share(cv, m[i].name, &kv);
        sbuf comma = {0};
        put_spaced(cv, &comma, "\",\" ");
        puts_(cv, &comma, " ");
        na.len = nf.len = 0;
        if (need_a) {
            if (m[i].required) {
                cat3(cv, &na, comma.p ? comma.p : "", &kv, &A);
            } else {
                puts_(cv, &na, "( ");
                cat3(cv, &na, comma.p ? comma.p : "", &kv, &A);
                if (A.len) {
                    puts_(cv, &na, " | ");
                    put(cv, &na, A.p, A.len);
                    puts_(cv, &na, " )");
                } else {
                    puts_(cv, &na, " )?");
                }
            }
        }
        if (need_f) {
            if (m[i].required) {
                cat3(cv, &nf, "", &kv, &A);
            } else {
                puts_(cv, &nf, "( ");
                cat3(cv, &nf, "", &kv, &A);
                if (F.len) {
                    puts_(cv, &nf, " | ");
                    put(cv, &nf, F.p, F.len);
                    puts_(cv, &nf, " )");
                } else {
                    puts_(cv, &nf, " )?");
                }
            }
        }
        sb_free(&comma);
        sbuf tmp = A;
        A = na;
        na = tmp;
        tmp = F;
        F = nf;
        nf = tmp;
        if ((n - i) % SCHEMA_INLINE_MEMBERS == 0)
            share(cv, "first", &F);
        /* A_i is named by A_{i-1} and F_{i-1} (twice by A_{i-1} when member i-1 is optional) */
        if (i >= 1 && (i - 1 <= first_req || !m[i - 1].required))
            share(cv, "more", &A);
    }
    put_spaced(cv, out, "\"{\" ");
    if (F.len) {
        puts_(cv, out, " ");
        put(cv, out, F.p, F.len);
    }
    put_spaced(cv, out, " \"}\" ");
done:
    free(m);
    free(t.n);
    sb_free(&A);
    sb_free(&F);
    sb_free(&kv);
    sb_free(&na);
    sb_free(&nf);
    return cv->err;
}

// --- arrays

static int gen_array(conv *cv, const cJSON *s, sbuf *out) {
    const cJSON *prefix = kw(s, "prefixItems"), *items = kw(s, "items");
    int64_t lo = 0, hi = -1;
    nonneg(cv, s, "minItems", &lo);
    nonneg(cv, s, "maxItems", &hi);
    int64_t k = cJSON_GetArraySize(prefix);
    if (k > SCHEMA_MAX_REPEAT)
        return fail(cv, RLX_E_UNSUPPORTED, "more than %d prefixItems", SCHEMA_MAX_REPEAT);
    int i = 0;
    for (const cJSON *p = prefix ? prefix->child : NULL; p; p = p->next, i++)
        if (cJSON_IsFalse(p) && (hi < 0 || hi > i)) /* nothing can stand at position i */
            hi = i;
    if (cJSON_IsFalse(items) && (hi < 0 || hi > k))
        hi = k;
    if (hi >= 0 && lo > hi)
        return fail(cv, RLX_E_UNSUPPORTED, "an array that needs %lld items but can hold %lld (nothing is valid)",
                    (long long)lo, (long long)hi);
    if (lo > SCHEMA_MAX_REPEAT || hi > SCHEMA_MAX_REPEAT)
        return fail(cv, RLX_E_UNSUPPORTED, "an array length bound beyond %d", SCHEMA_MAX_REPEAT);
    int64_t np = hi >= 0 && hi < k ? hi : k;
    sbuf tail = {0}, item = {0}, seq = {0}, comma = {0};
    put_spaced(cv, &comma, "\",\" ");
    puts_(cv, &comma, " ");
    if (hi < 0 || hi > k) { /* positions from k on: items */
        size_t old = path_push(cv, "items");
        if (items)
            gen_value(cv, items, &item, 0);
        else
            prim_ref(cv, &item, P_VALUE);
        path_pop(cv, old);
        int64_t rlo = lo > k ? lo - k : 0, rhi = hi < 0 ? -1 : hi - k;
        if (k == 0) {
            share(cv, "item", &item);
            sbuf more = {0};
            putf(cv, &more, "( %s%s )", comma.p ? comma.p : "", item.p ? item.p : "");
            putf(cv, &tail, "%s%s", rlo == 0 ? "( " : "", item.p ? item.p : "");
            if (rhi != 1 && more.p) {
                puts_(cv, &tail, " ");
                rep(cv, &tail, more.p, rlo > 0 ? rlo - 1 : 0, rhi < 0 ? -1 : rhi - 1);
            }
            puts_(cv, &tail, rlo == 0 ? " )?" : "");
            sb_free(&more);
        } else {
            sbuf more = {0};
            putf(cv, &more, "( %s%s )", comma.p ? comma.p : "", item.p ? item.p : "");
            if (more.p)
                rep(cv, &tail, more.p, rlo, rhi);
            sb_free(&more);
        }
    }
    for (int64_t p = np; p-- > 0 && !cv->err;) {
        item.len = 0;
        seq.len = 0;
        size_t old = path_push(cv, "prefixItems");
        path_push_index(cv, (int)p);
        gen_value(cv, cJSON_GetArrayItem(prefix, (int)p), &item, 0);
        path_pop(cv, old);
        puts_(cv, &seq, p < lo ? "" : "( ");
        if (p > 0 && comma.p)
            put(cv, &seq, comma.p, comma.len);
        if (item.p)
            put(cv, &seq, item.p, item.len);
        if (tail.len) {
            puts_(cv, &seq, " ");
            put(cv, &seq, tail.p, tail.len);
        }
        puts_(cv, &seq, p < lo ? "" : " )?");
        sbuf tmp = tail;
        tail = seq;
        seq = tmp;
        if (p % SCHEMA_INLINE_MEMBERS == 0)
            share(cv, "items", &tail);
    }
    put_spaced(cv, out, "\"[\" ");
    if (tail.len) {
        puts_(cv, out, " ");
        put(cv, out, tail.p, tail.len);
    }
    put_spaced(cv, out, " \"]\" ");
    sb_free(&tail);
    sb_free(&item);
    sb_free(&seq);
    sb_free(&comma);
    return cv->err;
}

// --- enum, const, anyOf, oneOf

static int gen_enum(conv *cv, const cJSON *s, sbuf *out) {
    for (const cJSON *e = s->child; e; e = e->next)
        if (!is_annotation(e->string) && strcmp(e->string, "type") != 0 && strcmp(e->string, "enum") != 0 &&
            strcmp(e->string, "const") != 0)
            return fail(cv, RLX_E_UNSUPPORTED, "unsupported '%.64s' beside enum or const", e->string);
    int mask = K_ALL;
    const cJSON *t = kw(s, "type"), *en = kw(s, "enum"), *c = kw(s, "const");
    if (t && type_kinds_of(cv, t, &mask) < 0)
        return cv->err;
    int n = 0;
    sbuf alts = {0};
    for (const cJSON *v = en ? en->child : c; v && !cv->err; v = en ? v->next : NULL) {
        if (!(value_kind(v) & mask) || (en && c && !cJSON_Compare(v, c, 1)))
            continue;
        puts_(cv, &alts, n++ ? " | " : "");
        gen_literal(cv, v, &alts, 0);
    }
    if (!n && !cv->err)
        fail(cv, RLX_E_UNSUPPORTED, "an enum or const with no value the schema allows (nothing is valid)");
    puts_(cv, out, n > 1 ? "( " : "");
    if (alts.p)
        put(cv, out, alts.p, alts.len);
    puts_(cv, out, n > 1 ? " )" : "");
    sb_free(&alts);
    return cv->err;
}

static int gen_union(conv *cv, const cJSON *s, sbuf *out, int left) {
    const char *key = kw(s, "anyOf") ? "anyOf" : "oneOf";
    if (kw(s, "anyOf") && kw(s, "oneOf"))
        return fail(cv, RLX_E_UNSUPPORTED, "unsupported 'anyOf' beside 'oneOf'");
    const cJSON *list = kw(s, key);
    int others = 0;
    for (const cJSON *e = s->child; e; e = e->next)
        others |= !is_annotation(e->string) && strcmp(e->string, key) != 0;
    int n = cJSON_GetArraySize(list), kept = 0;
    const cJSON **br = rlx__calloc((size_t)n, sizeof *br);
    cJSON **owned = rlx__calloc((size_t)n, sizeof *owned);
    int *at = rlx__calloc((size_t)n, sizeof *at);
    sbuf alts = {0};
    if (!br || !owned || !at) {
        nomem(cv);
        goto done;
    }
    /* the keywords beside anyOf apply to every branch: merged into each */
    cJSON *siblings = NULL;
    if (others) {
        siblings = cJSON_CreateObject();
        for (const cJSON *e = s->child; siblings && e && !cv->err; e = e->next)
            if (!is_annotation(e->string) && strcmp(e->string, key) != 0)
                add_dup(cv, siblings, e->string, e);
        if (!siblings)
            nomem(cv);
    }
    int i = 0;
    for (const cJSON *b = list->child; b && !cv->err; b = b->next, i++) {
        if (cJSON_IsFalse(b))
            continue;
        size_t old = path_push(cv, key);
        path_push_index(cv, i);
        if (siblings) {
            cJSON *m = dup(cv, siblings);
            if (m && merge_part(cv, m, b, 0) < 0)
                cJSON_Delete(m);
            else
                owned[kept] = m;
            br[kept] = owned[kept];
        } else {
            br[kept] = b;
        }
        path_pop(cv, old);
        at[kept++] = i;
    }
    cJSON_Delete(siblings);
    if (!cv->err && !kept)
        fail(cv, RLX_E_UNSUPPORTED, "'%s' whose branches are all false (nothing is valid)", key);
    if (!cv->err && strcmp(key, "oneOf") == 0)
        for (int a = 0; a < kept && !cv->err; a++)
            for (int b = a + 1; b < kept && !cv->err; b++)
                if (!disjoint(cv, br[a], br[b]) && !cv->err)
                    fail(cv, RLX_E_UNSUPPORTED,
                         "unsupported oneOf whose branches %d and %d may both match (anyOf if either may)", at[a],
                         at[b]);
    for (int k = 0; k < kept && !cv->err; k++) {
        size_t old = path_push(cv, key);
        path_push_index(cv, at[k]);
        puts_(cv, &alts, k ? " | " : "");
        gen_value(cv, br[k], &alts, left);
        path_pop(cv, old);
    }
    puts_(cv, out, kept > 1 ? "( " : "");
    if (alts.p)
        put(cv, out, alts.p, alts.len);
    puts_(cv, out, kept > 1 ? " )" : "");
done:
    for (int k = 0; owned && k < n; k++)
        cJSON_Delete(owned[k]);
    free(br);
    free(owned);
    free(at);
    sb_free(&alts);
    return cv->err;
}

// --- any schema

static int gen_value(conv *cv, const cJSON *s, sbuf *out, int left) {
    int starts_rule = cv->in_rule;
    cv->in_rule = 0;
    if (cv->err)
        return cv->err;
    if (cv->depth >= SCHEMA_MAX_DEPTH)
        return fail(cv, RLX_E_UNSUPPORTED, "schemas nested deeper than %d", SCHEMA_MAX_DEPTH);
    if (step(cv, 1) < 0)
        return cv->err;
    if (cJSON_IsTrue(s)) {
        prim_ref(cv, out, P_VALUE);
        return cv->err;
    }
    if (cJSON_IsFalse(s))
        return fail(cv, RLX_E_UNSUPPORTED, "a schema false (nothing is valid)");
    if (!cJSON_IsObject(s))
        return fail(cv, RLX_E_INVALID, "a schema must be an object or a boolean");
    if (check_keywords(cv, s) < 0)
        return cv->err;
    if (cv->depth && cv->depth % SCHEMA_INLINE_LEVELS == 0 && !starts_rule) {
        /* deep enough: the rest goes into a rule of its own */
        sbuf body = {0};
        cv->in_rule = 1;
        gen_value(cv, s, &body, left);
        make_rule(cv, "value", &body, out);
        sb_free(&body);
        return cv->err;
    }
    cv->depth++;
    int assertions = 0;
    for (const cJSON *e = s->child; e; e = e->next)
        assertions += !is_annotation(e->string);
    const cJSON *ref = kw(s, "$ref");
    if (!assertions) { /* only annotations: any value */
        prim_ref(cv, out, P_VALUE);
    } else if (ref && assertions == 1) {
        emit_ref(cv, ref->valuestring, out, left);
    } else if (ref || kw(s, "allOf")) {
        cJSON *f = NULL;
        if (flatten(cv, s, 0, &f) == 0)
            gen_value(cv, f, out, left);
        cJSON_Delete(f);
    } else if (kw(s, "enum") || kw(s, "const")) {
        gen_enum(cv, s, out);
    } else if (kw(s, "anyOf") || kw(s, "oneOf")) {
        gen_union(cv, s, out, left);
    } else {
        int mask = K_ALL;
        const cJSON *t = kw(s, "type");
        if (t)
            type_kinds_of(cv, t, &mask);
        int n = 0;
        sbuf alts = {0};
        for (int k = K_NULL; k <= K_STRING && !cv->err; k <<= 1) {
            if (!(mask & k) || (k == K_INTEGER && (mask & K_NUMBER)))
                continue;
            puts_(cv, &alts, n++ ? " | " : "");
            switch (k) {
            case K_NULL:
                prim_ref(cv, &alts, P_NULL);
                break;
            case K_BOOLEAN:
                prim_ref(cv, &alts, P_BOOLEAN);
                break;
            case K_OBJECT:
                gen_object(cv, s, &alts);
                break;
            case K_ARRAY:
                gen_array(cv, s, &alts);
                break;
            case K_NUMBER:
                gen_number(cv, s, &alts);
                break;
            case K_INTEGER:
                gen_integer(cv, s, &alts);
                break;
            default:
                gen_string(cv, s, &alts);
                break;
            }
        }
        puts_(cv, out, n > 1 ? "( " : "");
        if (alts.p)
            put(cv, out, alts.p, alts.len);
        puts_(cv, out, n > 1 ? " )" : "");
        sb_free(&alts);
    }
    cv->depth--;
    return cv->err;
}

// --- the document

/* A $ref cycle that writes no text before coming back (left recursion) has no grammar. */
static int check_cycles(conv *cv) {
    size_t n = cv->n_refs;
    int *state = rlx__calloc(n, sizeof *state); /* 0 new, 1 on the path, 2 done */
    size_t *stack = rlx__calloc(n, sizeof *stack), *edge = rlx__calloc(n, sizeof *edge);
    if (!state || !stack || !edge) {
        nomem(cv);
        goto done;
    }
    for (size_t root = 0; root < n && !cv->err; root++) {
        if (state[root])
            continue;
        size_t sp = 0;
        stack[sp] = root;
        edge[sp++] = 0;
        state[root] = 1;
        while (sp && !cv->err) {
            ref_target *r = &cv->refs[stack[sp - 1]];
            if (edge[sp - 1] == r->n_left) {
                state[stack[--sp]] = 2;
                continue;
            }
            size_t next = (size_t)r->left[edge[sp - 1]++];
            if (state[next] == 1) {
                cv->path.len = 0;
                put(cv, &cv->path, cv->refs[next].path, strlen(cv->refs[next].path));
                fail(cv, RLX_E_UNSUPPORTED, "a $ref cycle that comes back before any text (left recursion)");
            } else if (!state[next]) {
                state[next] = 1;
                stack[sp] = next;
                edge[sp++] = 0;
            }
        }
    }
done:
    free(state);
    free(stack);
    free(edge);
    return cv->err;
}

/* Rules, then the primitives used (and those they name), into one text. */
static int assemble(conv *cv, sbuf *out) {
    for (size_t i = 0; i < cv->n_rules && !cv->err; i++) {
        puts_(cv, out, cv->rules[i].name);
        puts_(cv, out, " ::= ");
        if (cv->rules[i].body.p)
            put(cv, out, cv->rules[i].body.p, cv->rules[i].body.len);
        puts_(cv, out, "\n");
    }
    unsigned used = cv->prims;
    for (int changed = 1; changed;) {
        changed = 0;
        for (int p = 0; p < P_COUNT; p++)
            if ((used & 1u << p) && (used | prims[p].deps) != used) {
                used |= prims[p].deps;
                changed = 1;
            }
    }
    for (int p = 0; p < P_COUNT && !cv->err; p++) {
        if (!(used & 1u << p))
            continue;
        puts_(cv, out, cv->prefix);
        puts_(cv, out, prims[p].name);
        puts_(cv, out, " ::= ");
        for (const char *c = prims[p].body; *c; c++) {
            if (*c == '@')
                puts_(cv, out, cv->prefix);
            else
                put(cv, out, c, 1);
        }
        puts_(cv, out, "\n");
    }
    return cv->err;
}

/* The schema text is UTF-8, its strings hold no raw control character (JSON forbids them; cJSON
 * would take them, Python's json refuses) and no \u0000 (cJSON's strings end at a NUL, which
 * would cut a name or a constant short of what Python reads). */
static int check_text(const char *s, size_t len) {
    int in_string = 0;
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        int k = utf8_decode((const unsigned char *)s + i, len - i, &cp);
        if (k <= 0 || cp == 0)
            return rlx_error(RLX_E_INVALID, "JSON schema: not UTF-8 text (byte %zu)", i);
        if (in_string && cp < 0x20)
            return rlx_error(RLX_E_INVALID, "JSON schema is not JSON: a control character in a string (byte %zu)", i);
        if (cp == '"')
            in_string = !in_string;
        if (in_string && cp == '\\' && i + 1 < len) {
            if (s[i + 1] == 'u' && i + 6 <= len && memcmp(s + i + 2, "0000", 4) == 0)
                return rlx_error(RLX_E_UNSUPPORTED, "JSON schema: unsupported \\u0000 in a string (byte %zu)", i);
            i += 2;
            continue;
        }
        i += (size_t)k;
    }
    return RLX_OK;
}

static int cmp_names(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

/* No object of the document has a key twice: Python keeps the last, cJSON finds the first. */
static int check_duplicates(conv *cv, const cJSON *v, int depth) {
    if (depth > CJSON_NESTING_LIMIT + 1)
        return 0;
    if (cJSON_IsObject(v)) {
        int n = cJSON_GetArraySize(v);
        if (n > 1) {
            const char **names = rlx__malloc((size_t)n * sizeof *names);
            if (!names)
                return nomem(cv);
            int i = 0;
            for (const cJSON *c = v->child; c; c = c->next)
                names[i++] = c->string;
            qsort(names, (size_t)n, sizeof *names, cmp_names);
            for (i = 1; i < n && !cv->err; i++)
                if (strcmp(names[i - 1], names[i]) == 0)
                    fail(cv, RLX_E_INVALID, "JSON schema: an object with the key '%.64s' twice", names[i]);
            free(names);
        }
    }
    for (const cJSON *c = v->child; c && !cv->err; c = c->next)
        check_duplicates(cv, c, depth + 1);
    return cv->err;
}

/* Moves item, a member of object s, to the key `to`, its value unchanged. */
static int rename_member(conv *cv, cJSON *s, cJSON *item, const char *to) {
    cJSON_DetachItemViaPointer(s, item);
    if (!cJSON_AddItemToObject(s, to, item)) {
        cJSON_Delete(item);
        return nomem(cv);
    }
    return 0;
}

/* Draft-07's (and earlier drafts') tuples, `items: [A, B]` with `additionalItems: C`, are draft
 * 2020-12's `prefixItems: [A, B]` with `items: C`: rewritten so in place, everywhere the converter
 * reads a schema, before conversion; an `additionalItems` beside a single `items` schema means
 * nothing in draft-07 and goes. A $ref into such a tuple ("#/items/0") is not rewritten. */
static int draft07_tuples(conv *cv, cJSON *s, int depth) {
    if (!cJSON_IsObject(s) || depth > CJSON_NESTING_LIMIT + 1 || cv->err)
        return cv->err;
    cJSON *items = cJSON_GetObjectItemCaseSensitive(s, "items");
    cJSON *more = cJSON_GetObjectItemCaseSensitive(s, "additionalItems");
    if (cJSON_IsArray(items)) {
        if (cJSON_GetObjectItemCaseSensitive(s, "prefixItems"))
            return fail(cv, RLX_E_INVALID, "'prefixItems' beside 'items' as an array (a draft-07 tuple): use one");
        if (rename_member(cv, s, items, "prefixItems") < 0 || (more && rename_member(cv, s, more, "items") < 0))
            return cv->err;
    } else if (more) {
        cJSON_Delete(cJSON_DetachItemViaPointer(s, more));
    }
    for (cJSON *c = s->child; c && !cv->err; c = c->next)
        if ((schema_map_key(c->string) && cJSON_IsObject(c)) || (schema_list_key(c->string) && cJSON_IsArray(c)))
            for (cJSON *m = c->child; m && !cv->err; m = m->next)
                draft07_tuples(cv, m, depth + 2);
        else if (!strcmp(c->string, "items") || !strcmp(c->string, "additionalProperties"))
            draft07_tuples(cv, c, depth + 1);
    return cv->err;
}

RLX_API rlx_status rlx_json_schema_to_gbnf(const char *schema, size_t len, const rlx_json_schema_options *opts,
                                           char **gbnf, size_t *gbnf_len) {
    if (gbnf)
        *gbnf = NULL;
    if (gbnf_len)
        *gbnf_len = 0;
    if (!schema || !gbnf || !gbnf_len)
        return rlx_error(RLX_E_INVALID, "rlx_json_schema_to_gbnf: schema, gbnf and gbnf_len must not be NULL");
    if (opts && opts->size < offsetof(rlx_json_schema_options, rule_prefix) + sizeof opts->rule_prefix)
        return rlx_error(RLX_E_INVALID,
                         "rlx_json_schema_to_gbnf: options of size %u (start from "
                         "rlx_json_schema_options_default())",
                         opts->size);
    const char *prefix = opts && opts->rule_prefix ? opts->rule_prefix : "";
    size_t plen = strlen(prefix);
    if (plen > SCHEMA_MAX_PREFIX)
        return rlx_error(RLX_E_INVALID, "JSON schema rule prefix longer than %d characters", SCHEMA_MAX_PREFIX);
    for (size_t i = 0; i < plen; i++) {
        char c = prefix[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-'))
            return rlx_error(RLX_E_INVALID,
                             "JSON schema rule prefix '%.64s' has a character other than letters, "
                             "digits and '-'",
                             prefix);
    }
    if (len > SCHEMA_MAX_TEXT)
        return rlx_error(RLX_E_UNSUPPORTED, "JSON schema of %zu bytes is larger than %u", len, SCHEMA_MAX_TEXT);
    int st = check_text(schema, len);
    if (st < 0)
        return st;
    const char *end = NULL;
    cJSON *doc = cJSON_ParseWithLengthOpts(schema, len, &end, 0);
    if (!doc) {
        /* cJSON sets end to the error on failure (its global cJSON_GetErrorPtr is not thread-safe) */
        size_t off = end && end >= schema && end <= schema + len ? (size_t)(end - schema) : 0;
        return rlx_error(RLX_E_INVALID, "JSON schema is not JSON (error near byte %zu)", off);
    }
    for (const char *p = end; p && p < schema + len; p++)
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
            cJSON_Delete(doc);
            return rlx_error(RLX_E_INVALID, "JSON schema has text after its JSON value (byte %zu)",
                             (size_t)(p - schema));
        }
    conv cv = {.doc = doc, .prefix = prefix};
    sbuf text = {0};
    if (check_duplicates(&cv, doc, 0) < 0 || draft07_tuples(&cv, doc, 0) < 0)
        goto done;
    /* the root is the first $ref target, so "#" names it */
    size_t root = new_rule(&cv, "root");
    cv.refs = rlx__calloc(1, sizeof *cv.refs);
    char *root_path = rlx__strdup("");
    char *root_name = rlx__malloc(plen + 5);
    if (cv.err || !cv.refs || !root_path || !root_name) {
        free(root_path);
        free(root_name);
        nomem(&cv);
        goto done;
    }
    memcpy(root_name, prefix, plen);
    memcpy(root_name + plen, "root", 5);
    free(cv.rules[root].name);
    cv.rules[root].name = root_name;
    cv.refs[0] = (ref_target){.node = doc, .path = root_path, .rule = root};
    cv.n_refs = cv.cap_refs = 1;
    for (size_t i = 0; i < cv.n_refs && !cv.err; i++) {
        cv.cur_ref = i;
        cv.path.len = 0;
        put(&cv, &cv.path, cv.refs[i].path, strlen(cv.refs[i].path));
        cv.depth = 0;
        sbuf body = {0};
        gen_value(&cv, cv.refs[i].node, &body, 1);
        cv.rules[cv.refs[i].rule].body = body;
    }
    if (!cv.err)
        check_cycles(&cv);
    cv.path.len = 0;
    if (cv.path.p)
        cv.path.p[0] = '\0';
    if (!cv.err)
        assemble(&cv, &text);
done:
    for (size_t i = 0; i < cv.n_rules; i++) {
        free(cv.rules[i].name);
        sb_free(&cv.rules[i].body);
    }
    for (size_t i = 0; i < cv.n_refs; i++) {
        free(cv.refs[i].path);
        free(cv.refs[i].left);
    }
    free(cv.rules);
    free(cv.refs);
    sb_free(&cv.path);
    cJSON_Delete(doc);
    if (cv.err) {
        sb_free(&text);
        return cv.err;
    }
    *gbnf = text.p;
    *gbnf_len = text.len;
    return RLX_OK;
}
