/* A Jinja engine for chat templates (see jinja.h): lexer -> parser -> AST -> evaluator.
 *
 * The reference is @huggingface/jinja, which renders the templates of the Hugging Face Hub in
 * transformers.js and whose rendering the tests compare against byte for byte: the same
 * preprocessing (apply_chat_template's trim_blocks and lstrip_blocks, done on the source text),
 * the same tokens, the same operator precedence, the same printing of values (true, not True)
 * and the same tojson. Where that engine has no answer (it throws) and Python's Jinja has one,
 * Python's is taken (strip('\n') strips only newlines, iterating a string gives characters).
 *
 * Errors unwind with longjmp to the entry points (rlx__jinja_parse, rlx__jinja_render): every
 * allocation in between comes from an arena that the entry point frees, so nothing can leak. */
#include "text/jinja.h"

#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <utf8proc.h>

#include "text_internal.h"

#define ARENA_CHUNK 65536
/* The parser's own recursion (nested blocks and expressions) is bounded by this. */
#define PARSE_MAX_DEPTH 200

rlx__jinja_limits rlx__jinja_limits_default(void) {
    return (rlx__jinja_limits){
        .max_output = 16u << 20,
        .max_memory = 256u << 20,
        .max_steps = 1000000,
        .max_depth = 500,
    };
}

// ---- errors and the arena

typedef struct jerr {
    jmp_buf jb;
    rlx_status st;
    char msg[512];
    const char *src; /* the original template, to turn an offset into a line and column */
    size_t src_len;
    uint32_t at; /* the statement being run: where errors without a position of their own are */
} jerr;

static void line_col(const jerr *e, uint32_t pos, unsigned *line, unsigned *col) {
    *line = 1;
    *col = 1;
    for (uint32_t i = 0; i < pos && i < e->src_len; i++) {
        if (e->src[i] == '\n') {
            ++*line;
            *col = 1;
        } else if (((unsigned char)e->src[i] & 0xC0) != 0x80) {
            ++*col;
        }
    }
}

/* Fails with a message naming the template position pos (UINT32_MAX: no position). */
static _Noreturn __attribute__((format(printf, 4, 5))) void fail(jerr *e, rlx_status st, uint32_t pos, const char *fmt,
                                                                 ...) {
    char detail[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    if (pos == UINT32_MAX)
        pos = e->at;
    if (pos == UINT32_MAX) {
        snprintf(e->msg, sizeof e->msg, "chat template: %s", detail);
    } else {
        unsigned line, col;
        line_col(e, pos, &line, &col);
        snprintf(e->msg, sizeof e->msg, "chat template line %u column %u: %s", line, col, detail);
    }
    e->st = st;
    longjmp(e->jb, 1);
}

typedef struct chunk {
    struct chunk *next;
    size_t used, cap;
    _Alignas(16) unsigned char data[];
} chunk;

typedef struct arena {
    chunk *head;
    size_t total, limit;
    jerr *err;
} arena;

static void *arena_alloc(arena *a, size_t n) {
    if (n > a->limit)
        fail(a->err, RLX_E_RANGE, UINT32_MAX, "the template needs more than %zu MiB of memory", a->limit >> 20);
    n = (n + 15) & ~(size_t)15;
    if (!a->head || a->head->cap - a->head->used < n) {
        size_t cap = n > ARENA_CHUNK ? n : ARENA_CHUNK;
        if (a->total + cap > a->limit)
            fail(a->err, RLX_E_RANGE, UINT32_MAX, "the template needs more than %zu MiB of memory", a->limit >> 20);
        chunk *c = malloc(sizeof *c + cap);
        if (!c)
            fail(a->err, RLX_E_NOMEM, UINT32_MAX, "out of memory");
        c->next = a->head;
        c->used = 0;
        c->cap = cap;
        a->head = c;
        a->total += cap;
    }
    void *p = a->head->data + a->head->used;
    a->head->used += n;
    return p;
}

static void *arena_zalloc(arena *a, size_t n) { return memset(arena_alloc(a, n), 0, n); }

static void arena_free(arena *a) {
    for (chunk *c = a->head, *next; c; c = next) {
        next = c->next;
        free(c);
    }
    a->head = NULL;
    a->total = 0;
}

/* n * size, failing instead of overflowing */
static size_t mul_size(arena *a, size_t n, size_t size) {
    if (size && n > SIZE_MAX / size)
        fail(a->err, RLX_E_RANGE, UINT32_MAX, "the template needs more than %zu MiB of memory", a->limit >> 20);
    return n * size;
}

// ---- UTF-8 and JavaScript's whitespace

/* Length of the code point at s[i] (1 for a byte that does not start valid UTF-8) and its value. */
static size_t cp_at(const char *s, size_t n, size_t i, uint32_t *cp) {
    utf8proc_int32_t c;
    utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s + i, (utf8proc_ssize_t)(n - i), &c);
    if (k <= 0) {
        *cp = (unsigned char)s[i];
        return 1;
    }
    *cp = (uint32_t)c;
    return (size_t)k;
}

/* JavaScript's \s (and String.prototype.trim's whitespace). */
static int js_space(uint32_t c) {
    return c == ' ' || (c >= 0x09 && c <= 0x0D) || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) ||
           c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000 || c == 0xFEFF;
}

/* Byte length of the whitespace character at s[i], or 0. */
static size_t space_at(const char *s, size_t n, size_t i) {
    if (i >= n)
        return 0;
    uint32_t c;
    size_t k = cp_at(s, n, i, &c);
    return js_space(c) ? k : 0;
}

/* Byte length of the whitespace character that ends at s[i], or 0. */
static size_t space_before(const char *s, size_t i) {
    for (size_t k = 1; k <= 3 && k <= i; k++) {
        if (k > 1 && ((unsigned char)s[i - k] & 0xC0) == 0x80)
            continue;
        uint32_t c;
        return cp_at(s, i, i - k, &c) == k && js_space(c) ? k : 0;
    }
    return 0;
}

static void put_utf8(char *out, size_t *n, uint32_t c) {
    *n += (size_t)utf8proc_encode_char((utf8proc_int32_t)c, (utf8proc_uint8_t *)out + *n);
}

// ---- preprocessing: what @huggingface/jinja does to the source before lexing

/* Text with, for each byte, its offset in the original template (for error positions). */
typedef struct ptext {
    char *s;
    uint32_t *o;
    size_t n;
} ptext;

static ptext ptext_new(arena *a, size_t cap) {
    return (ptext){arena_alloc(a, cap + 1), arena_alloc(a, mul_size(a, cap + 1, sizeof(uint32_t))), 0};
}

static void ptext_put(ptext *p, const ptext *from, size_t i) {
    p->s[p->n] = from->s[i];
    p->o[p->n++] = from->o[i];
}

static int line_start(const ptext *t, size_t i) {
    if (i == 0)
        return 1;
    char c = t->s[i - 1];
    if (c == '\n' || c == '\r')
        return 1;
    /* U+2028 and U+2029 end lines for a JavaScript regex too */
    return i >= 3 && (unsigned char)t->s[i - 3] == 0xE2 && (unsigned char)t->s[i - 2] == 0x80 &&
           ((unsigned char)c == 0xA8 || (unsigned char)c == 0xA9);
}

/* template.replace(/^[ \t]*({[#%-])/gm, "$1"): lstrip_blocks, as that engine does it */
static ptext lstrip_blocks(arena *a, const ptext *t) {
    ptext p = ptext_new(a, t->n);
    for (size_t i = 0; i < t->n;) {
        if (line_start(t, i)) {
            size_t j = i;
            while (j < t->n && (t->s[j] == ' ' || t->s[j] == '\t'))
                j++;
            if (j + 1 < t->n && t->s[j] == '{' && t->s[j + 1] && strchr("#%-", t->s[j + 1]))
                i = j;
        }
        ptext_put(&p, t, i++);
    }
    return p;
}

/* template.replace(/([#%-]})\n/g, "$1"): trim_blocks */
static ptext trim_blocks(arena *a, const ptext *t) {
    ptext p = ptext_new(a, t->n);
    for (size_t i = 0; i < t->n;) {
        if (i + 2 < t->n && t->s[i] && strchr("#%-", t->s[i]) && t->s[i + 1] == '}' && t->s[i + 2] == '\n') {
            ptext_put(&p, t, i);
            ptext_put(&p, t, i + 1);
            i += 3;
            continue;
        }
        ptext_put(&p, t, i++);
    }
    return p;
}

static size_t skip_spaces(const ptext *t, size_t i) {
    for (size_t k; (k = space_at(t->s, t->n, i)) > 0;)
        i += k;
    return i;
}

/* End of a {% generation %} / {% endgeneration %} tag (with its - modifiers) that starts at i,
 * or 0. transformers' own tag, which that engine drops. */
static size_t generation_tag(const ptext *t, size_t i, int *lstrip, int *rstrip) {
    if (i + 1 >= t->n || t->s[i] != '{' || t->s[i + 1] != '%')
        return 0;
    size_t q = i + 2;
    *lstrip = q < t->n && t->s[q] == '-';
    q = skip_spaces(t, q + (size_t)*lstrip);
    if (t->n - q >= 3 && memcmp(t->s + q, "end", 3) == 0 && t->n - q >= 13 &&
        memcmp(t->s + q + 3, "generation", 10) == 0)
        q += 3;
    if (t->n - q < 10 || memcmp(t->s + q, "generation", 10) != 0)
        return 0;
    q = skip_spaces(t, q + 10);
    *rstrip = q < t->n && t->s[q] == '-';
    q += (size_t)*rstrip;
    if (t->n - q < 2 || t->s[q] != '%' || t->s[q + 1] != '}')
        return 0;
    return q + 2;
}

static ptext drop_generation_tags(arena *a, const ptext *t) {
    ptext p = ptext_new(a, t->n);
    size_t mark = 0; /* output length at the end of the last tag: whitespace before it stays */
    for (size_t i = 0; i < t->n;) {
        int lstrip, rstrip;
        size_t end = generation_tag(t, i, &lstrip, &rstrip);
        if (!end) {
            ptext_put(&p, t, i++);
            continue;
        }
        if (lstrip)
            for (size_t k; p.n > mark && (k = space_before(p.s, p.n)) > 0 && p.n - k >= mark;)
                p.n -= k;
        size_t after = skip_spaces(t, end);
        if (!rstrip)
            for (size_t k = end; k < after; k++)
                ptext_put(&p, t, k);
        i = after;
        mark = p.n;
    }
    return p;
}

static ptext preprocess(arena *a, const char *src, size_t len) {
    ptext t = ptext_new(a, len);
    for (size_t i = 0; i < len; i++) {
        t.s[i] = src[i];
        t.o[i] = (uint32_t)i;
    }
    t.n = len;
    if (t.n && t.s[t.n - 1] == '\n') /* a single trailing newline is dropped */
        t.n--;
    ptext l = lstrip_blocks(a, &t);
    ptext r = trim_blocks(a, &l);
    ptext g = drop_generation_tags(a, &r);
    g.s[g.n] = '\0';
    g.o[g.n] = (uint32_t)len;
    return g;
}

// ---- lexer

typedef enum tok_type {
    T_TEXT,
    T_NUM,
    T_STR,
    T_IDENT,
    T_EQUALS,
    T_LPAREN,
    T_RPAREN,
    T_OPEN_STMT,
    T_CLOSE_STMT,
    T_OPEN_EXPR,
    T_CLOSE_EXPR,
    T_LBRACKET,
    T_RBRACKET,
    T_LBRACE,
    T_RBRACE,
    T_COMMA,
    T_DOT,
    T_COLON,
    T_PIPE,
    T_ADD,   /* + - ~ */
    T_MUL,   /* * / // % */
    T_POW,   /* ** */
    T_CMP,   /* < > <= >= == != */
    T_UNARY, /* a sign before an operand */
    T_COMMENT,
} tok_type;

typedef struct token {
    tok_type type;
    const char *v; /* the text of the token (a string literal's value, unescaped) */
    size_t n;
    uint32_t pos; /* offset in the original template */
} token;

typedef struct lexer {
    arena *a;
    jerr *err;
    ptext src;
    size_t at;
    token *toks;
    size_t n, cap;
} lexer;

static void push_tok(lexer *L, tok_type type, const char *v, size_t n, size_t at) {
    if (L->n == L->cap) {
        size_t cap = L->cap ? 2 * L->cap : 256;
        token *t = arena_alloc(L->a, mul_size(L->a, cap, sizeof *t));
        if (L->n)
            memcpy(t, L->toks, L->n * sizeof *t);
        L->toks = t;
        L->cap = cap;
    }
    L->toks[L->n++] = (token){type, v, n, L->src.o[at < L->src.n ? at : L->src.n]};
}

static _Noreturn void lex_fail(lexer *L, const char *what) {
    fail(L->err, RLX_E_FORMAT, L->src.o[L->at < L->src.n ? L->at : L->src.n], "%s", what);
}

/* {%- / {{- / {#-: the text before loses its trailing whitespace (an empty text token goes) */
static void strip_trailing(lexer *L) {
    if (!L->n || L->toks[L->n - 1].type != T_TEXT)
        return;
    token *t = &L->toks[L->n - 1];
    for (size_t k; (k = space_before(t->v, t->n)) > 0;)
        t->n -= k;
    if (t->n == 0)
        L->n--;
}

static void skip_leading(lexer *L) { L->at = skip_spaces(&L->src, L->at); }

static int hexval(char c) {
    return c >= '0' && c <= '9'   ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : -1;
}

/* A string literal's body up to the closing quote q, with that engine's escapes. */
static void lex_string(lexer *L, char q) {
    const ptext *s = &L->src;
    size_t start = L->at - 1;
    char *out = arena_alloc(L->a, s->n - L->at + 1);
    size_t n = 0;
    uint32_t pending_high = 0; /* a \uD800-\uDBFF waiting for its low surrogate */
    for (;;) {
        if (L->at >= s->n)
            lex_fail(L, "unterminated string literal");
        char c = s->s[L->at];
        if (c == q)
            break;
        if (c != '\\') {
            if (pending_high)
                lex_fail(L, "\\u escape of a lone surrogate");
            out[n++] = c;
            L->at++;
            continue;
        }
        if (++L->at >= s->n)
            lex_fail(L, "unterminated string literal");
        char e = s->s[L->at++];
        if (e == 'x' || e == 'u') {
            int len = e == 'x' ? 2 : 4;
            uint32_t v = 0;
            for (int k = 0; k < len; k++) {
                int h = L->at < s->n ? hexval(s->s[L->at]) : -1;
                if (h < 0)
                    lex_fail(L, "invalid hexadecimal escape sequence");
                v = v * 16 + (uint32_t)h;
                L->at++;
            }
            if (v >= 0xDC00 && v <= 0xDFFF && pending_high) {
                v = 0x10000 + ((pending_high - 0xD800) << 10) + (v - 0xDC00);
                pending_high = 0;
            } else if (v >= 0xD800 && v <= 0xDBFF && !pending_high) {
                pending_high = v;
                continue;
            } else if ((v >= 0xD800 && v <= 0xDFFF) || pending_high) {
                lex_fail(L, "\\u escape of a lone surrogate");
            }
            put_utf8(out, &n, v);
            continue;
        }
        if (pending_high)
            lex_fail(L, "\\u escape of a lone surrogate");
        static const char from[] = "ntrbfv'\"\\", to[] = "\n\t\r\b\f\v'\"\\";
        const char *k = e ? strchr(from, e) : NULL;
        if (!k)
            lex_fail(L, "unknown escape sequence in a string literal");
        out[n++] = to[k - from];
    }
    if (pending_high)
        lex_fail(L, "\\u escape of a lone surrogate");
    L->at++; /* the closing quote */
    push_tok(L, T_STR, out, n, start);
}

static int is_digit(char c) { return c >= '0' && c <= '9'; }
static int is_word(char c) { return is_digit(c) || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }

/* That engine's consumeWhile fails when a token runs into the end of the template. */
static size_t lex_while(lexer *L, int (*pred)(char)) {
    size_t start = L->at;
    while (L->at < L->src.n && pred(L->src.s[L->at])) {
        if (++L->at >= L->src.n)
            lex_fail(L, "unexpected end of the template");
    }
    return L->at - start;
}

static const struct {
    const char *seq;
    tok_type type;
} op_table[] = {
    {"{%", T_OPEN_STMT}, {"%}", T_CLOSE_STMT}, {"{{", T_OPEN_EXPR}, {"}}", T_CLOSE_EXPR}, {"(", T_LPAREN},
    {")", T_RPAREN},     {"{", T_LBRACE},      {"}", T_RBRACE},     {"[", T_LBRACKET},    {"]", T_RBRACKET},
    {",", T_COMMA},      {".", T_DOT},         {":", T_COLON},      {"|", T_PIPE},        {"<=", T_CMP},
    {">=", T_CMP},       {"==", T_CMP},        {"!=", T_CMP},       {"<", T_CMP},         {">", T_CMP},
    {"+", T_ADD},        {"-", T_ADD},         {"~", T_ADD},        {"**", T_POW},        {"*", T_MUL},
    {"//", T_MUL},       {"/", T_MUL},         {"%", T_MUL},        {"=", T_EQUALS},
};

static void lex(lexer *L) {
    const ptext *s = &L->src;
    int curly = 0;
    while (L->at < s->n) {
        tok_type last = L->n ? L->toks[L->n - 1].type : T_TEXT;
        int after_tag = !L->n || last == T_CLOSE_STMT || last == T_CLOSE_EXPR || last == T_COMMENT;
        if (after_tag) {
            size_t start = L->at;
            while (L->at < s->n &&
                   !(s->s[L->at] == '{' && L->at + 1 < s->n && strchr("%{#", s->s[L->at + 1]) && s->s[L->at + 1]))
                L->at++;
            if (L->at > start) {
                push_tok(L, T_TEXT, s->s + start, L->at - start, start);
                continue;
            }
        }
        const char *p = s->s + L->at;
        size_t left = s->n - L->at;
        if (left >= 2 && p[0] == '{' && p[1] == '#') {
            size_t start = L->at;
            L->at += 2;
            int strip_before = L->at < s->n && s->s[L->at] == '-';
            L->at += (size_t)strip_before;
            size_t body = L->at;
            while (!(L->at + 1 < s->n && s->s[L->at] == '#' && s->s[L->at + 1] == '}')) {
                if (L->at + 2 >= s->n)
                    lex_fail(L, "missing the end of a comment (#})");
                L->at++;
            }
            int strip_after = L->at > body && s->s[L->at - 1] == '-';
            if (strip_before)
                strip_trailing(L);
            push_tok(L, T_COMMENT, s->s + body, L->at - body, start);
            L->at += 2;
            if (strip_after)
                skip_leading(L);
            continue;
        }
        if (left >= 3 && p[0] == '{' && (p[1] == '%' || p[1] == '{') && p[2] == '-') {
            strip_trailing(L);
            push_tok(L, p[1] == '%' ? T_OPEN_STMT : T_OPEN_EXPR, p, 2, L->at);
            if (p[1] == '{')
                curly = 0;
            L->at += 3;
            continue;
        }
        while (L->at < s->n) { /* whitespace inside a tag */
            size_t k = space_at(s->s, s->n, L->at);
            if (!k)
                break;
            L->at += k;
            if (L->at >= s->n)
                lex_fail(L, "unexpected end of the template");
        }
        p = s->s + L->at;
        left = s->n - L->at;
        if (left >= 3 && p[0] == '-' && (p[1] == '%' || p[1] == '}') && p[2] == '}') {
            push_tok(L, p[1] == '%' ? T_CLOSE_STMT : T_CLOSE_EXPR, p + 1, 2, L->at);
            L->at += 3;
            skip_leading(L);
            continue;
        }
        char c = *p;
        if (c == '-' || c == '+') {
            tok_type prev = L->n ? L->toks[L->n - 1].type : T_TEXT;
            if (!L->n || prev == T_TEXT)
                lex_fail(L, "unexpected character");
            if (prev != T_IDENT && prev != T_NUM && prev != T_STR && prev != T_RPAREN && prev != T_RBRACKET) {
                size_t start = L->at++;
                size_t digits = lex_while(L, is_digit);
                if (digits && L->at + 1 < s->n && s->s[L->at] == '.' && is_digit(s->s[L->at + 1])) {
                    L->at++;
                    lex_while(L, is_digit);
                }
                push_tok(L, digits ? T_NUM : T_UNARY, s->s + start, L->at - start, start);
                continue;
            }
        }
        int matched = 0;
        for (size_t k = 0; k < sizeof op_table / sizeof op_table[0]; k++) {
            size_t len = strlen(op_table[k].seq);
            if (op_table[k].type == T_CLOSE_EXPR && curly > 0)
                continue;
            if (left >= len && memcmp(p, op_table[k].seq, len) == 0) {
                push_tok(L, op_table[k].type, p, len, L->at);
                if (op_table[k].type == T_OPEN_EXPR)
                    curly = 0;
                else if (op_table[k].type == T_LBRACE)
                    curly++;
                else if (op_table[k].type == T_RBRACE)
                    curly--;
                L->at += len;
                matched = 1;
                break;
            }
        }
        if (matched)
            continue;
        if (c == '\'' || c == '"') {
            L->at++;
            lex_string(L, c);
            continue;
        }
        if (is_digit(c)) {
            size_t start = L->at;
            lex_while(L, is_digit);
            if (!(L->n && L->toks[L->n - 1].type == T_DOT) && L->at + 1 < s->n && s->s[L->at] == '.' &&
                is_digit(s->s[L->at + 1])) {
                L->at++;
                lex_while(L, is_digit);
            }
            push_tok(L, T_NUM, s->s + start, L->at - start, start);
            continue;
        }
        if (is_word(c)) {
            size_t start = L->at;
            lex_while(L, is_word);
            push_tok(L, T_IDENT, s->s + start, L->at - start, start);
            continue;
        }
        lex_fail(L, "unexpected character");
    }
}

// ---- AST

typedef enum node_kind {
    /* statements */
    N_TEXT,
    N_OUTPUT,       /* {{ a }} */
    N_IF,           /* a: test, body, alt */
    N_FOR,          /* a: target, b: iterable, c: filter (or NULL), body, alt */
    N_SET,          /* a: target, b: value (NULL: body is a block set) */
    N_MACRO,        /* s: name, args: parameters (N_IDENT, N_KWARG with a default), body */
    N_CALL_BLOCK,   /* a: the N_CALL of the macro, args: caller's parameters, body */
    N_FILTER_BLOCK, /* a: an N_FILTER whose operand is the body */
    N_BREAK,
    N_CONTINUE,
    /* expressions */
    N_STR,
    N_INT,
    N_FLOAT,
    N_IDENT,
    N_LIST,
    N_TUPLE,
    N_DICT,   /* args: key, value, key, value ... */
    N_MEMBER, /* a: object, b: property */
    N_SLICE,  /* a: object, args[3]: start, stop, step (each may be NULL) */
    N_CALL,   /* a: callee, args (N_KWARG for keywords) */
    N_FILTER, /* a: operand (NULL in a filter block), s: name, args */
    N_TEST,   /* a: operand, s: name, flag: negated, args */
    N_NEG,
    N_POS,
    N_NOT,
    N_AND,
    N_OR,
    N_BIN,     /* op, a, b */
    N_TERNARY, /* b if a else c (c NULL: undefined) */
    N_KWARG,   /* s: name, a: value */
} node_kind;

typedef enum bin_op {
    OP_ADD,
    OP_SUB,
    OP_CONCAT,
    OP_MUL,
    OP_DIV,
    OP_FLOORDIV,
    OP_MOD,
    OP_POW,
    OP_EQ,
    OP_NE,
    OP_LT,
    OP_GT,
    OP_LE,
    OP_GE,
    OP_IN,
    OP_NOT_IN,
} bin_op;

typedef struct node node;

typedef struct node_list {
    node **v;
    size_t n, cap;
} node_list;

struct node {
    node_kind kind;
    bin_op op;
    int flag;
    uint32_t pos;
    const char *s; /* text, string value or name */
    size_t n;
    int64_t i;
    double f;
    node *a, *b, *c;
    node_list args, body, alt;
};

struct rlx__jinja {
    arena mem; /* the AST */
    node_list body;
    char *src; /* the original text, for error positions */
    size_t src_len;
};

// ---- parser: @huggingface/jinja's grammar and precedence

typedef struct parser {
    arena *a;
    jerr *err;
    token *t;
    size_t n, at;
    unsigned depth;
} parser;

static void list_push(arena *a, node_list *l, node *x) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 4;
        node **v = arena_alloc(a, mul_size(a, cap, sizeof *v));
        if (l->n)
            memcpy(v, l->v, l->n * sizeof *v);
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n++] = x;
}

static uint32_t here(const parser *p) { return p->at < p->n ? p->t[p->at].pos : (p->n ? p->t[p->n - 1].pos : 0); }

static _Noreturn __attribute__((format(printf, 2, 3))) void syntax(parser *p, const char *fmt, ...) {
    char detail[300];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    fail(p->err, RLX_E_FORMAT, here(p), "%s", detail);
}

static node *new_node(parser *p, node_kind kind, uint32_t pos) {
    node *x = arena_zalloc(p->a, sizeof *x);
    x->kind = kind;
    x->pos = pos;
    return x;
}

static int is(const parser *p, tok_type type) { return p->at < p->n && p->t[p->at].type == type; }

static int tok_is(const token *t, const char *word) { return t->n == strlen(word) && memcmp(t->v, word, t->n) == 0; }

static int is_ident(const parser *p, size_t ahead, const char *word) {
    return p->at + ahead < p->n && p->t[p->at + ahead].type == T_IDENT && tok_is(&p->t[p->at + ahead], word);
}

/* {% name ... for one of the names (a NULL-terminated list) */
static int is_statement(const parser *p, const char *const *names) {
    if (!(p->at + 1 < p->n && p->t[p->at].type == T_OPEN_STMT && p->t[p->at + 1].type == T_IDENT))
        return 0;
    for (; *names; names++)
        if (tok_is(&p->t[p->at + 1], *names))
            return 1;
    return 0;
}

static const token *expect(parser *p, tok_type type, const char *what) {
    if (!is(p, type))
        syntax(p, "expected %s", what);
    return &p->t[p->at++];
}

static void expect_word(parser *p, const char *word) {
    if (!is_ident(p, 0, word))
        syntax(p, "expected '%s'", word);
    p->at++;
}

static void enter(parser *p) {
    if (++p->depth > PARSE_MAX_DEPTH)
        syntax(p, "the template nests deeper than %d levels", PARSE_MAX_DEPTH);
}

static node *parse_expression(parser *p);
static node *parse_primary(parser *p);
static node *parse_any(parser *p);

/* Statements up to one of names (a NULL-terminated list), which block names the statement. */
static void parse_block(parser *p, node_list *into, const char *const *names, const char *block) {
    while (!is_statement(p, names)) {
        if (p->at >= p->n)
            syntax(p, "unexpected end of the template: {%% %s %%} is not closed", block);
        node *x = parse_any(p);
        if (x)
            list_push(p->a, into, x);
    }
}

static void end_tag(parser *p, const char *word) {
    expect(p, T_OPEN_STMT, "{%");
    expect_word(p, word);
    expect(p, T_CLOSE_STMT, "%}");
}

/* a, b, c as a tuple; one expression alone */
static node *parse_sequence(parser *p, int primary) {
    uint32_t pos = here(p);
    node *first = primary ? parse_primary(p) : parse_expression(p);
    if (!is(p, T_COMMA))
        return first;
    node *tuple = new_node(p, N_TUPLE, pos);
    list_push(p->a, &tuple->args, first);
    while (is(p, T_COMMA)) {
        p->at++;
        list_push(p->a, &tuple->args, primary ? parse_primary(p) : parse_expression(p));
    }
    return tuple;
}

/* (a, b=c, ...) of a call (parameters: a macro's declaration) */
static void parse_args(parser *p, node_list *into, int parameters) {
    expect(p, T_LPAREN, "(");
    int saw_keyword = 0;
    while (!is(p, T_RPAREN)) {
        if (p->at >= p->n)
            syntax(p, "unexpected end of the template in an argument list");
        if (is(p, T_POW) || (is(p, T_MUL) && tok_is(&p->t[p->at], "*")))
            syntax(p, "argument unpacking (* and **) is not supported");
        uint32_t pos = here(p);
        node *arg = parse_expression(p);
        if (is(p, T_EQUALS)) {
            p->at++;
            if (arg->kind != N_IDENT)
                syntax(p, "expected a name before '='");
            node *kw = new_node(p, N_KWARG, pos);
            kw->s = arg->s;
            kw->n = arg->n;
            kw->a = parse_expression(p);
            arg = kw;
            saw_keyword = 1;
        } else if (saw_keyword) {
            syntax(p, parameters ? "a parameter without a default follows one with a default"
                                 : "a positional argument follows a keyword argument");
        }
        if (parameters && arg->kind != N_IDENT && arg->kind != N_KWARG)
            syntax(p, "expected a parameter name");
        list_push(p->a, into, arg);
        if (is(p, T_COMMA))
            p->at++;
    }
    p->at++;
}

static node *parse_member(parser *p, node *object);

static node *parse_call(parser *p, node *callee) {
    node *call = new_node(p, N_CALL, callee->pos);
    call->a = callee;
    parse_args(p, &call->args, 0);
    node *x = parse_member(p, call);
    return is(p, T_LPAREN) ? parse_call(p, x) : x;
}

/* [i], [a:b:c] */
static node *parse_subscript(parser *p, node *object, uint32_t pos) {
    node *parts[3] = {0};
    size_t n = 0;
    int slice = 0;
    while (!is(p, T_RBRACKET)) {
        if (p->at >= p->n)
            syntax(p, "unexpected end of the template in a subscript");
        if (n == 3)
            syntax(p, "a slice has at most 3 parts");
        if (is(p, T_COLON)) {
            parts[n++] = NULL;
            p->at++;
            slice = 1;
        } else {
            parts[n++] = parse_expression(p);
            if (is(p, T_COLON)) {
                p->at++;
                slice = 1;
            }
        }
    }
    if (n == 0)
        syntax(p, "empty subscript []");
    node *x = new_node(p, slice ? N_SLICE : N_MEMBER, pos);
    x->a = object;
    if (slice)
        for (size_t k = 0; k < 3; k++)
            list_push(p->a, &x->args, k < n ? parts[k] : NULL);
    else
        x->b = parts[0];
    return x;
}

static node *parse_member(parser *p, node *object) {
    while (is(p, T_DOT) || is(p, T_LBRACKET)) {
        uint32_t pos = here(p);
        int computed = is(p, T_LBRACKET);
        p->at++;
        if (computed) {
            object = parse_subscript(p, object, pos);
            expect(p, T_RBRACKET, "]");
            continue;
        }
        node *prop = parse_primary(p);
        if (prop->kind == N_IDENT)
            prop->kind = N_STR; /* .name is the key "name" */
        else if (prop->kind != N_INT)
            syntax(p, "expected a name or an integer after '.'");
        node *x = new_node(p, N_MEMBER, pos);
        x->a = object;
        x->b = prop;
        object = x;
    }
    return object;
}

static node *parse_call_member(parser *p) {
    node *x = parse_member(p, parse_primary(p));
    return is(p, T_LPAREN) ? parse_call(p, x) : x;
}

static node *parse_unary_sign(parser *p) {
    if (p->at < p->n && (p->t[p->at].type == T_UNARY || p->t[p->at].type == T_ADD) &&
        (tok_is(&p->t[p->at], "-") || tok_is(&p->t[p->at], "+"))) {
        node *x = new_node(p, tok_is(&p->t[p->at], "-") ? N_NEG : N_POS, here(p));
        p->at++;
        enter(p);
        x->a = parse_unary_sign(p);
        p->depth--;
        return x;
    }
    return parse_call_member(p);
}

static node *parse_filter(parser *p) {
    node *operand = parse_unary_sign(p);
    while (is(p, T_PIPE)) {
        p->at++;
        uint32_t pos = here(p);
        node *name = parse_primary(p);
        if (name->kind != N_IDENT)
            syntax(p, "expected a filter name after '|'");
        node *f = new_node(p, N_FILTER, pos);
        f->a = operand;
        f->s = name->s;
        f->n = name->n;
        if (is(p, T_LPAREN)) {
            f->flag = 1;
            parse_args(p, &f->args, 0);
        }
        operand = f;
    }
    return operand;
}

static node *parse_test(parser *p) {
    node *operand = parse_filter(p);
    while (is_ident(p, 0, "is")) {
        p->at++;
        int negate = is_ident(p, 0, "not");
        p->at += (size_t)negate;
        uint32_t pos = here(p);
        /* == and friends name tests too (is ==(2), selectattr("x", "==", 2)) */
        const token *t = p->at < p->n ? &p->t[p->at] : NULL;
        node *x = new_node(p, N_TEST, pos);
        if (t && (t->type == T_IDENT || t->type == T_CMP)) {
            x->s = t->v;
            x->n = t->n;
            p->at++;
        } else {
            syntax(p, "expected a test name after 'is'");
        }
        x->a = operand;
        x->flag = negate;
        if (is(p, T_LPAREN))
            parse_args(p, &x->args, 0);
        operand = x;
    }
    return operand;
}

static node *binary(parser *p, bin_op op, node *a, node *b, uint32_t pos) {
    node *x = new_node(p, N_BIN, pos);
    x->op = op;
    x->a = a;
    x->b = b;
    return x;
}

static node *parse_power(parser *p) {
    node *left = parse_test(p);
    while (is(p, T_POW)) {
        uint32_t pos = here(p);
        p->at++;
        left = binary(p, OP_POW, left, parse_test(p), pos);
    }
    return left;
}

static node *parse_multiplicative(parser *p) {
    node *left = parse_power(p);
    while (is(p, T_MUL)) {
        const token *t = &p->t[p->at++];
        bin_op op = tok_is(t, "*") ? OP_MUL : tok_is(t, "/") ? OP_DIV : tok_is(t, "//") ? OP_FLOORDIV : OP_MOD;
        left = binary(p, op, left, parse_power(p), t->pos);
    }
    return left;
}

static node *parse_additive(parser *p) {
    node *left = parse_multiplicative(p);
    while (is(p, T_ADD)) {
        const token *t = &p->t[p->at++];
        bin_op op = tok_is(t, "+") ? OP_ADD : tok_is(t, "-") ? OP_SUB : OP_CONCAT;
        left = binary(p, op, left, parse_multiplicative(p), t->pos);
    }
    return left;
}

static node *parse_comparison(parser *p) {
    node *left = parse_additive(p);
    for (;;) {
        uint32_t pos = here(p);
        bin_op op;
        if (is_ident(p, 0, "not") && is_ident(p, 1, "in")) {
            op = OP_NOT_IN;
            p->at += 2;
        } else if (is_ident(p, 0, "in")) {
            op = OP_IN;
            p->at++;
        } else if (is(p, T_CMP)) {
            const token *t = &p->t[p->at++];
            op = tok_is(t, "==")   ? OP_EQ
                 : tok_is(t, "!=") ? OP_NE
                 : tok_is(t, "<")  ? OP_LT
                 : tok_is(t, ">")  ? OP_GT
                 : tok_is(t, "<=") ? OP_LE
                                   : OP_GE;
        } else {
            return left;
        }
        left = binary(p, op, left, parse_additive(p), pos);
    }
}

static node *parse_not(parser *p) {
    if (!is_ident(p, 0, "not"))
        return parse_comparison(p);
    node *x = new_node(p, N_NOT, here(p));
    p->at++;
    enter(p);
    x->a = parse_not(p);
    p->depth--;
    return x;
}

static node *parse_logical(parser *p, int or) {
    node *left = or ? parse_logical(p, 0) : parse_not(p);
    while (is_ident(p, 0, or ? "or" : "and")) {
        node *x = new_node(p, or ? N_OR : N_AND, here(p));
        p->at++;
        x->a = left;
        x->b = or ? parse_logical(p, 0) : parse_not(p);
        left = x;
    }
    return left;
}

static node *parse_if_expression(parser *p) {
    node *a = parse_logical(p, 1);
    if (!is_ident(p, 0, "if"))
        return a;
    node *x = new_node(p, N_TERNARY, here(p));
    p->at++;
    x->b = a;
    x->a = parse_logical(p, 1);
    if (is_ident(p, 0, "else")) {
        p->at++;
        enter(p);
        x->c = parse_if_expression(p);
        p->depth--;
    }
    return x;
}

static node *parse_expression(parser *p) {
    enter(p);
    node *x = parse_if_expression(p);
    p->depth--;
    return x;
}

static node *parse_primary(parser *p) {
    if (p->at >= p->n)
        syntax(p, "unexpected end of the template in an expression");
    const token *t = &p->t[p->at++];
    node *x;
    switch (t->type) {
    case T_NUM: {
        char buf[64];
        if (t->n >= sizeof buf)
            syntax(p, "number literal too long");
        memcpy(buf, t->v, t->n);
        buf[t->n] = '\0';
        if (memchr(t->v, '.', t->n)) {
            x = new_node(p, N_FLOAT, t->pos);
            x->f = strtod(buf, NULL);
        } else {
            x = new_node(p, N_INT, t->pos);
            char *end;
            x->i = strtoll(buf, &end, 10);
            if (x->i == LLONG_MAX || x->i == LLONG_MIN) {
                x->kind = N_FLOAT; /* past int64: a JavaScript number */
                x->f = strtod(buf, NULL);
            }
        }
        return x;
    }
    case T_STR: {
        x = new_node(p, N_STR, t->pos);
        size_t n = t->n;
        size_t k = p->at;
        while (k < p->n && p->t[k].type == T_STR) /* 'a' 'b' is 'ab' */
            n += p->t[k++].n;
        char *s = arena_alloc(p->a, n + 1);
        memcpy(s, t->v, t->n);
        size_t at = t->n;
        for (; p->at < k; p->at++) {
            memcpy(s + at, p->t[p->at].v, p->t[p->at].n);
            at += p->t[p->at].n;
        }
        s[n] = '\0';
        x->s = s;
        x->n = n;
        return x;
    }
    case T_IDENT:
        x = new_node(p, N_IDENT, t->pos);
        x->s = t->v;
        x->n = t->n;
        return x;
    case T_LPAREN:
        x = parse_sequence(p, 0);
        expect(p, T_RPAREN, ")");
        return x;
    case T_LBRACKET:
        x = new_node(p, N_LIST, t->pos);
        while (!is(p, T_RBRACKET)) {
            if (p->at >= p->n)
                syntax(p, "unexpected end of the template in a list");
            list_push(p->a, &x->args, parse_expression(p));
            if (is(p, T_COMMA))
                p->at++;
        }
        p->at++;
        return x;
    case T_LBRACE:
        x = new_node(p, N_DICT, t->pos);
        while (!is(p, T_RBRACE)) {
            if (p->at >= p->n)
                syntax(p, "unexpected end of the template in a dict");
            list_push(p->a, &x->args, parse_expression(p));
            expect(p, T_COLON, "':' between a key and its value");
            list_push(p->a, &x->args, parse_expression(p));
            if (is(p, T_COMMA))
                p->at++;
        }
        p->at++;
        return x;
    default:
        p->at--;
        syntax(p, "unexpected '%.*s' in an expression", (int)(t->n < 20 ? t->n : 20), t->v);
    }
}

static node *parse_if(parser *p, uint32_t pos) {
    static const char *const branch_end[] = {"elif", "else", "endif", NULL};
    static const char *const endif[] = {"endif", NULL};
    node *x = new_node(p, N_IF, pos);
    x->a = parse_expression(p);
    expect(p, T_CLOSE_STMT, "%}");
    parse_block(p, &x->body, branch_end, "if");
    if (is_statement(p, (const char *const[]){"elif", NULL})) {
        uint32_t elif = here(p);
        p->at += 2;
        enter(p);
        list_push(p->a, &x->alt, parse_if(p, elif));
        p->depth--;
    } else if (is_statement(p, (const char *const[]){"else", NULL})) {
        p->at += 2;
        expect(p, T_CLOSE_STMT, "%}");
        parse_block(p, &x->alt, endif, "if");
    }
    return x;
}

static node *parse_statement(parser *p) {
    uint32_t pos = here(p);
    expect(p, T_OPEN_STMT, "{%");
    if (!is(p, T_IDENT))
        syntax(p, "expected a statement name after {%%");
    const token *name = &p->t[p->at++];
    node *x;
    if (tok_is(name, "set")) {
        x = new_node(p, N_SET, pos);
        x->a = parse_sequence(p, 0);
        if (is(p, T_EQUALS)) {
            p->at++;
            x->b = parse_sequence(p, 0);
        } else {
            expect(p, T_CLOSE_STMT, "'=' or %}");
            parse_block(p, &x->body, (const char *const[]){"endset", NULL}, "set");
            p->at++;
            expect_word(p, "endset");
        }
        expect(p, T_CLOSE_STMT, "%}");
    } else if (tok_is(name, "if")) {
        x = parse_if(p, pos);
        end_tag(p, "endif");
    } else if (tok_is(name, "macro")) {
        x = new_node(p, N_MACRO, pos);
        node *id = parse_primary(p);
        if (id->kind != N_IDENT)
            syntax(p, "expected the macro's name");
        x->s = id->s;
        x->n = id->n;
        parse_args(p, &x->args, 1);
        expect(p, T_CLOSE_STMT, "%}");
        parse_block(p, &x->body, (const char *const[]){"endmacro", NULL}, "macro");
        end_tag(p, "endmacro");
    } else if (tok_is(name, "for")) {
        x = new_node(p, N_FOR, pos);
        x->a = parse_sequence(p, 1);
        if (x->a->kind != N_IDENT && x->a->kind != N_TUPLE)
            syntax(p, "expected a name or names to loop over");
        for (size_t k = 0; x->a->kind == N_TUPLE && k < x->a->args.n; k++)
            if (x->a->args.v[k]->kind != N_IDENT)
                syntax(p, "expected names to unpack the items into");
        expect_word(p, "in");
        node *iterable = parse_expression(p);
        if (iterable->kind == N_TERNARY && !iterable->c) { /* for x in xs if cond */
            x->b = iterable->b;
            x->c = iterable->a;
        } else {
            x->b = iterable;
        }
        expect(p, T_CLOSE_STMT, "%}");
        parse_block(p, &x->body, (const char *const[]){"endfor", "else", NULL}, "for");
        if (is_statement(p, (const char *const[]){"else", NULL})) {
            p->at += 2;
            expect(p, T_CLOSE_STMT, "%}");
            parse_block(p, &x->alt, (const char *const[]){"endfor", NULL}, "for");
        }
        end_tag(p, "endfor");
    } else if (tok_is(name, "call")) {
        x = new_node(p, N_CALL_BLOCK, pos);
        if (is(p, T_LPAREN))
            parse_args(p, &x->args, 1);
        node *callee = parse_primary(p);
        if (callee->kind != N_IDENT)
            syntax(p, "expected a macro name after call");
        x->a = new_node(p, N_CALL, callee->pos);
        x->a->a = callee;
        parse_args(p, &x->a->args, 0);
        expect(p, T_CLOSE_STMT, "%}");
        parse_block(p, &x->body, (const char *const[]){"endcall", NULL}, "call");
        end_tag(p, "endcall");
    } else if (tok_is(name, "filter")) {
        x = new_node(p, N_FILTER_BLOCK, pos);
        uint32_t fpos = here(p);
        node *id = parse_primary(p);
        if (id->kind != N_IDENT)
            syntax(p, "expected a filter name");
        x->a = new_node(p, N_FILTER, fpos);
        x->a->s = id->s;
        x->a->n = id->n;
        if (is(p, T_LPAREN)) {
            x->a->flag = 1;
            parse_args(p, &x->a->args, 0);
        }
        expect(p, T_CLOSE_STMT, "%}");
        parse_block(p, &x->body, (const char *const[]){"endfilter", NULL}, "filter");
        end_tag(p, "endfilter");
    } else if (tok_is(name, "break") || tok_is(name, "continue")) {
        x = new_node(p, tok_is(name, "break") ? N_BREAK : N_CONTINUE, pos);
        expect(p, T_CLOSE_STMT, "%}");
    } else {
        p->at--;
        syntax(p, "unknown tag {%% %.*s %%}", (int)(name->n < 40 ? name->n : 40), name->v);
    }
    return x;
}

static node *parse_any(parser *p) {
    const token *t = &p->t[p->at];
    enter(p);
    node *x = NULL;
    switch (t->type) {
    case T_COMMENT:
        p->at++;
        break;
    case T_TEXT:
        x = new_node(p, N_TEXT, t->pos);
        x->s = t->v;
        x->n = t->n;
        p->at++;
        break;
    case T_OPEN_STMT:
        x = parse_statement(p);
        break;
    case T_OPEN_EXPR:
        x = new_node(p, N_OUTPUT, t->pos);
        p->at++;
        x->a = parse_expression(p);
        expect(p, T_CLOSE_EXPR, "}}");
        break;
    default:
        syntax(p, "unexpected '%.*s' outside {{ }} and {%% %%}", (int)(t->n < 20 ? t->n : 20), t->v);
    }
    p->depth--;
    return x;
}

void rlx__jinja_free(rlx__jinja *t) {
    if (!t)
        return;
    arena_free(&t->mem);
    free(t->src);
    free(t);
}

rlx_status rlx__jinja_parse(const char *src, size_t len, rlx__jinja **out) {
    if (out)
        *out = NULL;
    if (!src || !out)
        return rlx_error(RLX_E_INVALID, "rlx__jinja_parse: NULL argument");
    if (len > RLX_JINJA_MAX_SOURCE)
        return rlx_error(RLX_E_FORMAT, "chat template: larger than %u bytes", RLX_JINJA_MAX_SOURCE);
    rlx__jinja *t = calloc(1, sizeof *t);
    jerr *err = malloc(sizeof *err);
    char *copy = malloc(len + 1);
    if (!t || !err || !copy) {
        free(t);
        free(err);
        free(copy);
        return rlx_error(RLX_E_NOMEM, "out of memory");
    }
    memcpy(copy, src, len);
    copy[len] = '\0';
    t->src = copy;
    t->src_len = len;
    err->src = copy;
    err->src_len = len;
    err->at = UINT32_MAX;
    /* scratch holds the preprocessing's intermediate texts and offsets, t->mem the AST */
    arena scratch = {.limit = 64 * (size_t)RLX_JINJA_MAX_SOURCE + (16u << 20), .err = err};
    t->mem = (arena){.limit = 64 * (size_t)RLX_JINJA_MAX_SOURCE + (16u << 20), .err = err};
    if (setjmp(err->jb)) {
        rlx_status st = rlx_error(err->st, "%s", err->msg);
        arena_free(&scratch);
        rlx__jinja_free(t);
        free(err);
        return st;
    }
    ptext pre = preprocess(&scratch, src, len);
    char *kept = arena_alloc(&t->mem, pre.n + 1); /* the AST points into it */
    memcpy(kept, pre.s, pre.n + 1);
    pre.s = kept;
    lexer L = {.a = &t->mem, .err = err, .src = pre};
    lex(&L);
    parser p = {.a = &t->mem, .err = err, .t = L.toks, .n = L.n};
    while (p.at < p.n) {
        node *x = parse_any(&p);
        if (x)
            list_push(p.a, &t->body, x);
    }
    t->mem.err = NULL;
    arena_free(&scratch);
    free(err);
    *out = t;
    return RLX_OK;
}

// ---- values

typedef enum vtype { V_UNDEF, V_NONE, V_BOOL, V_INT, V_FLOAT, V_STR, V_LIST, V_DICT, V_NS, V_FUNC } vtype;

/* A string: bytes, and for each byte whether it is the caller's data (m NULL: none is). */
typedef struct jstr {
    const char *s;
    const uint8_t *m;
    size_t n;
} jstr;

typedef struct jlist jlist;
typedef struct jdict jdict;
typedef struct jfunc jfunc;

typedef struct value {
    vtype t;
    int tuple; /* a list written as a tuple: (a, b), dict items */
    union {
        int b;
        int64_t i;
        double f;
        jstr s;
        jlist *l;
        jdict *d; /* V_DICT and V_NS */
        jfunc *fn;
    };
} value;

struct jlist {
    value *v;
    size_t n, cap;
};

struct jdict { /* insertion-ordered */
    jstr *k;
    value *v;
    size_t n, cap;
    /* past a few keys, a hash index (entry + 1, 0 empty; at most half full), so that a dict of
     * many keys (a client's JSON) is built in linear time */
    uint32_t *slots;
    size_t n_slots;
};

typedef struct scope scope;

typedef enum fn_kind { F_MACRO, F_CALLER, F_NAMESPACE, F_RAISE, F_RANGE, F_STRFTIME, F_METHOD } fn_kind;

struct jfunc {
    fn_kind kind;
    const node *def;    /* F_MACRO, F_CALLER */
    scope *env;         /* F_CALLER: where the call block is */
    value self;         /* F_METHOD */
    const char *method; /* F_METHOD */
};

struct scope {
    scope *parent;
    const char **names;
    size_t *lens;
    value *vals;
    size_t n, cap;
};

typedef struct ctx {
    arena a;
    jerr *err;
    const rlx__jinja_limits *lim;
    uint64_t steps;
    unsigned depth;
    unsigned loops; /* loops being run, for break and continue */
    enum { FLOW_NONE, FLOW_BREAK, FLOW_CONTINUE } flow;
    struct obuf *out; /* the rendering (heap memory: freed by the entry point on failure) */
} ctx;

static const value undef = {.t = V_UNDEF};
static const value none = {.t = V_NONE};

static value vbool(int b) { return (value){.t = V_BOOL, .b = !!b}; }
static value vint(int64_t i) { return (value){.t = V_INT, .i = i}; }
static value vfloat(double f) { return (value){.t = V_FLOAT, .f = f}; }
static value vstr(jstr s) { return (value){.t = V_STR, .s = s}; }
static jstr lit(const char *s) { return (jstr){s, NULL, strlen(s)}; }

static _Noreturn __attribute__((format(printf, 3, 4))) void rt_fail(ctx *c, const node *at, const char *fmt, ...) {
    char detail[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    fail(c->err, RLX_E_FORMAT, at ? at->pos : UINT32_MAX, "%s", detail);
}

static const char *type_name(const value *v) {
    static const char *const names[] = {"undefined", "none", "boolean", "integer",   "float",
                                        "string",    "list", "dict",    "namespace", "function"};
    return v->t == V_LIST && v->tuple ? "tuple" : names[v->t];
}

/* Counts work that allocates nothing, which the memory limit would not stop: a loop iteration or
 * macro call is one step, a scan of a list one per item, of a string one per KiB. */
static void charge(ctx *c, const node *at, uint64_t steps) {
    c->steps += steps;
    if (c->steps > c->lim->max_steps)
        fail(c->err, RLX_E_RANGE, at->pos,
             "more than %" PRIu64 " steps of work (loop iterations, macro calls, "
             "scans of long lists and strings)",
             c->lim->max_steps);
}

static void step(ctx *c, const node *at) { charge(c, at, 1); }

static void enter_rt(ctx *c, const node *at) {
    if (++c->depth > c->lim->max_depth)
        fail(c->err, RLX_E_RANGE, at ? at->pos : UINT32_MAX, "recursion deeper than %u levels", c->lim->max_depth);
}

static jlist *list_new(ctx *c, size_t cap) {
    jlist *l = arena_alloc(&c->a, sizeof *l);
    l->n = 0;
    l->cap = cap ? cap : 1;
    l->v = arena_alloc(&c->a, mul_size(&c->a, l->cap, sizeof *l->v));
    return l;
}

static void list_add(ctx *c, jlist *l, value v) {
    if (l->n == l->cap) {
        size_t cap = 2 * l->cap;
        value *nv = arena_alloc(&c->a, mul_size(&c->a, cap, sizeof *nv));
        memcpy(nv, l->v, l->n * sizeof *nv);
        l->v = nv;
        l->cap = cap;
    }
    l->v[l->n++] = v;
}

static value vlist(jlist *l) { return (value){.t = V_LIST, .l = l}; }

static jdict *dict_new(ctx *c) {
    jdict *d = arena_alloc(&c->a, sizeof *d);
    *d = (jdict){0};
    return d;
}

static int str_eq(jstr a, jstr b) { return a.n == b.n && (a.n == 0 || memcmp(a.s, b.s, a.n) == 0); }

static size_t key_hash(jstr k) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < k.n; i++)
        h = (h ^ (unsigned char)k.s[i]) * 1099511628211ull;
    return (size_t)(h ^ (h >> 29));
}

static value *dict_get(const jdict *d, jstr k) {
    if (!d->slots) {
        for (size_t i = 0; i < d->n; i++)
            if (str_eq(d->k[i], k))
                return &d->v[i];
        return NULL;
    }
    for (size_t at = key_hash(k) & (d->n_slots - 1); d->slots[at]; at = (at + 1) & (d->n_slots - 1))
        if (str_eq(d->k[d->slots[at] - 1], k))
            return &d->v[d->slots[at] - 1];
    return NULL;
}

static void dict_index(uint32_t *slots, size_t n_slots, jstr k, size_t entry) {
    size_t at = key_hash(k) & (n_slots - 1);
    while (slots[at])
        at = (at + 1) & (n_slots - 1);
    slots[at] = (uint32_t)entry + 1;
}

static void dict_set(ctx *c, jdict *d, jstr k, value v) {
    value *at = dict_get(d, k);
    if (at) {
        *at = v;
        return;
    }
    if (d->n == d->cap) {
        size_t cap = d->cap ? 2 * d->cap : 8;
        jstr *nk = arena_alloc(&c->a, mul_size(&c->a, cap, sizeof *nk));
        value *nv = arena_alloc(&c->a, mul_size(&c->a, cap, sizeof *nv));
        if (d->n) {
            memcpy(nk, d->k, d->n * sizeof *nk);
            memcpy(nv, d->v, d->n * sizeof *nv);
        }
        d->k = nk;
        d->v = nv;
        d->cap = cap;
    }
    if (d->n >= 8 && 2 * (d->n + 1) > d->n_slots) {
        if (d->n >= UINT32_MAX / 4)
            fail(c->err, RLX_E_RANGE, UINT32_MAX, "a dict of more than %u keys", UINT32_MAX / 4);
        size_t n_slots = d->n_slots ? 2 * d->n_slots : 32;
        uint32_t *slots = arena_zalloc(&c->a, mul_size(&c->a, n_slots, sizeof *slots));
        for (size_t i = 0; i < d->n; i++)
            dict_index(slots, n_slots, d->k[i], i);
        d->slots = slots;
        d->n_slots = n_slots;
    }
    if (d->slots)
        dict_index(d->slots, d->n_slots, k, d->n);
    d->k[d->n] = k;
    d->v[d->n++] = v;
}

static value *scope_find(scope *s, const char *name, size_t n) {
    for (; s; s = s->parent)
        for (size_t i = 0; i < s->n; i++)
            if (s->lens[i] == n && memcmp(s->names[i], name, n) == 0)
                return &s->vals[i];
    return NULL;
}

static scope *scope_new(ctx *c, scope *parent) {
    scope *s = arena_alloc(&c->a, sizeof *s);
    *s = (scope){.parent = parent};
    return s;
}

static void scope_set(ctx *c, scope *s, const char *name, size_t n, value v) {
    for (size_t i = 0; i < s->n; i++)
        if (s->lens[i] == n && memcmp(s->names[i], name, n) == 0) {
            s->vals[i] = v;
            return;
        }
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 8;
        const char **nn = arena_alloc(&c->a, mul_size(&c->a, cap, sizeof *nn));
        size_t *nl = arena_alloc(&c->a, mul_size(&c->a, cap, sizeof *nl));
        value *nv = arena_alloc(&c->a, mul_size(&c->a, cap, sizeof *nv));
        if (s->n) {
            memcpy(nn, s->names, s->n * sizeof *nn);
            memcpy(nl, s->lens, s->n * sizeof *nl);
            memcpy(nv, s->vals, s->n * sizeof *nv);
        }
        s->names = nn;
        s->lens = nl;
        s->vals = nv;
        s->cap = cap;
    }
    s->names[s->n] = name;
    s->lens[s->n] = n;
    s->vals[s->n++] = v;
}

static int truthy(const value *v) {
    switch (v->t) {
    case V_UNDEF:
    case V_NONE:
        return 0;
    case V_BOOL:
        return v->b;
    case V_INT:
        return v->i != 0;
    case V_FLOAT:
        return v->f != 0 && !isnan(v->f);
    case V_STR:
        return v->s.n > 0;
    case V_LIST:
        return v->l->n > 0;
    case V_DICT:
        return v->d->n > 0;
    default:
        return 1;
    }
}

static int is_num(const value *v) { return v->t == V_INT || v->t == V_FLOAT; }
static double num(const value *v) { return v->t == V_INT ? (double)v->i : v->t == V_FLOAT ? v->f : v->b; }

// ---- output buffers

typedef struct obuf {
    char *s;
    uint8_t *m; /* NULL until a byte of the caller's data arrives */
    size_t n, cap;
    int heap; /* the rendering itself: malloc'd, handed to the caller without a copy */
} obuf;

static void obuf_reserve(ctx *c, obuf *b, size_t more) {
    if (more > c->lim->max_output || b->n + more > c->lim->max_output)
        fail(c->err, RLX_E_RANGE, UINT32_MAX, "the rendered text would be larger than %zu MiB",
             c->lim->max_output >> 20);
    if (b->n + more + 1 <= b->cap)
        return;
    size_t cap = b->cap ? 2 * b->cap : 64;
    while (cap < b->n + more + 1)
        cap *= 2;
    if (b->heap) {
        char *s = realloc(b->s, cap);
        if (s)
            b->s = s;
        uint8_t *m = s && b->m ? realloc(b->m, cap) : NULL;
        if (m)
            b->m = m;
        if (!s || (b->m && !m))
            fail(c->err, RLX_E_NOMEM, UINT32_MAX, "out of memory");
        b->cap = cap;
        return;
    }
    char *s = arena_alloc(&c->a, cap);
    if (b->n)
        memcpy(s, b->s, b->n);
    b->s = s;
    if (b->m) {
        uint8_t *m = arena_alloc(&c->a, cap);
        memcpy(m, b->m, b->n);
        b->m = m;
    }
    b->cap = cap;
}

static void obuf_put(ctx *c, obuf *b, jstr s) {
    if (!s.n)
        return;
    obuf_reserve(c, b, s.n);
    memcpy(b->s + b->n, s.s, s.n);
    if (s.m && !b->m) {
        if (!(b->m = b->heap ? malloc(b->cap) : arena_alloc(&c->a, b->cap)))
            fail(c->err, RLX_E_NOMEM, UINT32_MAX, "out of memory");
        memset(b->m, 0, b->n);
    }
    if (b->m) {
        if (s.m)
            memcpy(b->m + b->n, s.m, s.n);
        else
            memset(b->m + b->n, 0, s.n);
    }
    b->n += s.n;
    b->s[b->n] = '\0';
}

static void obuf_raw(ctx *c, obuf *b, const char *s, size_t n) { obuf_put(c, b, (jstr){s, NULL, n}); }
static void obuf_lit(ctx *c, obuf *b, const char *s) { obuf_raw(c, b, s, strlen(s)); }

/* n bytes of s, all marked data when data is set */
static void obuf_marked(ctx *c, obuf *b, const char *s, size_t n, int data) {
    static const uint8_t ones[64] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
                                     1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
                                     1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
    for (size_t at = 0; at < n; at += 64) {
        size_t k = n - at < 64 ? n - at : 64;
        obuf_put(c, b, (jstr){s + at, data ? ones : NULL, k});
    }
}

static jstr obuf_str(const obuf *b) { return (jstr){b->s ? b->s : "", b->m, b->n}; }

static int str_has_data(jstr s) {
    for (size_t i = 0; s.m && i < s.n; i++)
        if (s.m[i])
            return 1;
    return 0;
}

static jstr sub(jstr s, size_t from, size_t n) { return (jstr){s.s + from, s.m ? s.m + from : NULL, n}; }

static jstr concat(ctx *c, jstr a, jstr b) {
    obuf o = {0};
    obuf_put(c, &o, a);
    obuf_put(c, &o, b);
    return obuf_str(&o);
}

// ---- printing values as @huggingface/jinja does (JavaScript's number formatting, JSON)

/* Number.prototype.toString */
static void js_number(double d, char *out, size_t cap) {
    if (isnan(d)) {
        snprintf(out, cap, "NaN");
        return;
    }
    if (isinf(d)) {
        snprintf(out, cap, d < 0 ? "-Infinity" : "Infinity");
        return;
    }
    if (d == 0) {
        snprintf(out, cap, "0");
        return;
    }
    char e[40];
    int prec = 1;
    for (; prec <= 17; prec++) { /* the shortest digits that read back as d */
        snprintf(e, sizeof e, "%.*e", prec - 1, d);
        if (strtod(e, NULL) == d)
            break;
    }
    char digits[24];
    size_t k = 0;
    const char *p = e;
    int neg = *p == '-';
    p += neg;
    for (; *p && *p != 'e'; p++)
        if (is_digit(*p))
            digits[k++] = *p;
    while (k > 1 && digits[k - 1] == '0')
        k--;
    digits[k] = '\0';
    int n = atoi(p + 1) + 1; /* d = 0.digits * 10^n */
    size_t at = 0;
    char *o = out;
#define OUT(ch)                                                                                                        \
    do {                                                                                                               \
        if (at + 1 < cap)                                                                                              \
            o[at++] = (ch);                                                                                            \
    } while (0)
    if (neg)
        OUT('-');
    if ((int)k <= n && n <= 21) {
        for (size_t i = 0; i < k; i++)
            OUT(digits[i]);
        for (int i = (int)k; i < n; i++)
            OUT('0');
    } else if (0 < n && n <= 21) {
        for (size_t i = 0; i < k; i++) {
            if ((int)i == n)
                OUT('.');
            OUT(digits[i]);
        }
    } else if (-6 < n && n <= 0) {
        OUT('0');
        OUT('.');
        for (int i = 0; i < -n; i++)
            OUT('0');
        for (size_t i = 0; i < k; i++)
            OUT(digits[i]);
    } else {
        OUT(digits[0]);
        if (k > 1) {
            OUT('.');
            for (size_t i = 1; i < k; i++)
                OUT(digits[i]);
        }
        char ex[16];
        snprintf(ex, sizeof ex, "e%c%d", n - 1 >= 0 ? '+' : '-', abs(n - 1));
        for (char *x = ex; *x; x++)
            OUT(*x);
    }
#undef OUT
    o[at] = '\0';
}

/* FloatValue.toString: integral values keep a ".0" */
static void float_text(double d, char *out, size_t cap) {
    if (d == 0 && signbit(d))
        snprintf(out, cap, "-0.0");
    else if (isfinite(d) && d == floor(d) && fabs(d) < 1e21)
        snprintf(out, cap, "%.1f", d);
    else
        js_number(d, out, cap);
}

typedef struct json_opts {
    int indent; /* < 0: none */
    int ensure_ascii, sort_keys, undefined_as_null;
    jstr item_sep, key_sep;
} json_opts;

static void json_string(ctx *c, obuf *b, jstr s, int ensure_ascii) {
    int data = str_has_data(s);
    obuf_marked(c, b, "\"", 1, data);
    for (size_t i = 0; i < s.n;) {
        uint32_t cp;
        size_t k = cp_at(s.s, s.n, i, &cp);
        char esc[16];
        const char *rep = NULL;
        switch (cp) {
        case '"':
            rep = "\\\"";
            break;
        case '\\':
            rep = "\\\\";
            break;
        case '\b':
            rep = "\\b";
            break;
        case '\f':
            rep = "\\f";
            break;
        case '\n':
            rep = "\\n";
            break;
        case '\r':
            rep = "\\r";
            break;
        case '\t':
            rep = "\\t";
            break;
        default:
            if (cp < 0x20 || (ensure_ascii && cp >= 0x7F)) {
                if (cp >= 0x10000)
                    snprintf(esc, sizeof esc, "\\u%04x\\u%04x", 0xD800 + ((cp - 0x10000) >> 10),
                             0xDC00 + ((cp - 0x10000) & 0x3FF));
                else
                    snprintf(esc, sizeof esc, "\\u%04x", cp);
                rep = esc;
            }
        }
        if (rep)
            obuf_marked(c, b, rep, strlen(rep), s.m && s.m[i]);
        else
            obuf_put(c, b, sub(s, i, k));
        i += k;
    }
    obuf_marked(c, b, "\"", 1, data);
}

static void json_newline(ctx *c, obuf *b, const json_opts *o, unsigned depth) {
    obuf_lit(c, b, "\n");
    for (unsigned i = 0; i < depth * (unsigned)o->indent; i++)
        obuf_lit(c, b, " ");
}

static int key_cmp(jstr a, jstr b) {
    int r = memcmp(a.s, b.s, a.n < b.n ? a.n : b.n);
    return r ? r : (a.n > b.n) - (a.n < b.n);
}

static void json_value(ctx *c, obuf *b, const value *v, const json_opts *o, unsigned depth, const node *at) {
    char num_text[64];
    switch (v->t) {
    case V_UNDEF:
        obuf_lit(c, b, o->undefined_as_null ? "null" : "undefined");
        return;
    case V_NONE:
        obuf_lit(c, b, "null");
        return;
    case V_BOOL:
        obuf_lit(c, b, v->b ? "true" : "false");
        return;
    case V_INT:
        snprintf(num_text, sizeof num_text, "%" PRId64, v->i);
        obuf_lit(c, b, num_text);
        return;
    case V_FLOAT:
        if (isfinite(v->f))
            js_number(v->f, num_text, sizeof num_text);
        else
            snprintf(num_text, sizeof num_text, "null");
        obuf_lit(c, b, num_text);
        return;
    case V_STR:
        json_string(c, b, v->s, o->ensure_ascii);
        return;
    case V_FUNC:
        rt_fail(c, at, "cannot convert a macro or function to JSON");
    default:
        break;
    }
    enter_rt(c, at);
    int pretty = o->indent > 0;
    if (v->t == V_LIST) {
        obuf_lit(c, b, "[");
        for (size_t i = 0; i < v->l->n; i++) {
            if (i)
                obuf_put(c, b, o->item_sep);
            if (pretty)
                json_newline(c, b, o, depth + 1);
            json_value(c, b, &v->l->v[i], o, depth + 1, at);
        }
        if (pretty && v->l->n)
            json_newline(c, b, o, depth);
        obuf_lit(c, b, "]");
    } else {
        const jdict *d = v->d;
        size_t *order = arena_alloc(&c->a, mul_size(&c->a, d->n + 1, sizeof *order));
        for (size_t i = 0; i < d->n; i++) {
            order[i] = i;
            for (size_t j = i; o->sort_keys && j > 0 && key_cmp(d->k[order[j - 1]], d->k[order[j]]) > 0; j--) {
                size_t t = order[j];
                order[j] = order[j - 1];
                order[j - 1] = t;
            }
        }
        obuf_lit(c, b, "{");
        for (size_t i = 0; i < d->n; i++) {
            if (i)
                obuf_put(c, b, o->item_sep);
            if (pretty)
                json_newline(c, b, o, depth + 1);
            json_string(c, b, d->k[order[i]], o->ensure_ascii);
            obuf_put(c, b, o->key_sep);
            json_value(c, b, &d->v[order[i]], o, depth + 1, at);
        }
        if (pretty && d->n)
            json_newline(c, b, o, depth);
        obuf_lit(c, b, "}");
    }
    c->depth--;
}

static json_opts json_defaults(int indent) {
    return (json_opts){.indent = indent, .item_sep = lit(indent > 0 ? "," : ", "), .key_sep = lit(": ")};
}

/* toString of a value: what {{ }} prints (none and undefined print nothing there) */
static void print_value(ctx *c, obuf *b, const value *v, const node *at) {
    char text[64];
    switch (v->t) {
    case V_UNDEF:
    case V_NONE:
        return;
    case V_BOOL:
        obuf_lit(c, b, v->b ? "true" : "false");
        return;
    case V_INT:
        snprintf(text, sizeof text, "%" PRId64, v->i);
        obuf_lit(c, b, text);
        return;
    case V_FLOAT:
        float_text(v->f, text, sizeof text);
        obuf_lit(c, b, text);
        return;
    case V_STR:
        obuf_put(c, b, v->s);
        return;
    case V_FUNC:
        rt_fail(c, at, "cannot print a macro or function");
    default: {
        json_opts o = json_defaults(-1);
        json_value(c, b, v, &o, 0, at);
    }
    }
}

static jstr to_str(ctx *c, const value *v, const node *at) {
    if (v->t == V_STR)
        return v->s;
    obuf b = {0};
    print_value(c, &b, v, at);
    return obuf_str(&b);
}

// ---- equality and ordering

static int nullish(const value *v) { return v->t == V_UNDEF || v->t == V_NONE; }

/* JavaScript's ToNumber of a string */
static double js_to_number(jstr s) {
    size_t a = 0, b = s.n;
    for (size_t k; (k = space_at(s.s, s.n, a)) > 0;)
        a += k;
    for (size_t k; b > a && (k = space_before(s.s, b)) > 0;)
        b -= k;
    if (a == b)
        return 0;
    char buf[64];
    if (b - a >= sizeof buf)
        return NAN;
    memcpy(buf, s.s + a, b - a);
    buf[b - a] = '\0';
    if (strcmp(buf, "Infinity") == 0 || strcmp(buf, "+Infinity") == 0)
        return INFINITY;
    if (strcmp(buf, "-Infinity") == 0)
        return -INFINITY;
    for (const char *p = buf; *p; p++)
        if (!is_digit(*p) && !strchr("+-.eE", *p))
            return NAN;
    char *end;
    double d = strtod(buf, &end);
    return *end ? NAN : d;
}

/* ==: JavaScript's loose equality of the values, as that engine compares them */
static int loose_eq(value a, value b) {
    if (nullish(&a) || nullish(&b))
        return nullish(&a) && nullish(&b);
    if (a.t == V_BOOL)
        a = vint(a.b);
    if (b.t == V_BOOL)
        b = vint(b.b);
    if (is_num(&a) && is_num(&b))
        return num(&a) == num(&b);
    if (a.t == V_STR && b.t == V_STR)
        return str_eq(a.s, b.s);
    if (is_num(&a) && b.t == V_STR)
        return num(&a) == js_to_number(b.s);
    if (a.t == V_STR && is_num(&b))
        return js_to_number(a.s) == num(&b);
    if (a.t != b.t)
        return 0;
    return a.t == V_LIST ? a.l == b.l : a.t == V_DICT || a.t == V_NS ? a.d == b.d : a.fn == b.fn;
}

/* ===: membership (in), unique, equalto */
static int strict_eq(const value *a, const value *b) {
    if (is_num(a) && is_num(b))
        return num(a) == num(b);
    if (a->t != b->t)
        return 0;
    switch (a->t) {
    case V_UNDEF:
    case V_NONE:
        return 1;
    case V_BOOL:
        return a->b == b->b;
    case V_STR:
        return str_eq(a->s, b->s);
    case V_LIST:
        return a->l == b->l;
    case V_DICT:
    case V_NS:
        return a->d == b->d;
    default:
        return a->fn == b->fn;
    }
}

static uint32_t fold(uint32_t cp, int lower) {
    return (uint32_t)(lower ? utf8proc_tolower((utf8proc_int32_t)cp) : utf8proc_toupper((utf8proc_int32_t)cp));
}

/* code point order, optionally case-insensitive (lower-cased) */
static int str_cmp(jstr a, jstr b, int case_sensitive) {
    size_t i = 0, j = 0;
    while (i < a.n && j < b.n) {
        uint32_t x, y;
        i += cp_at(a.s, a.n, i, &x);
        j += cp_at(b.s, b.n, j, &y);
        if (!case_sensitive) {
            x = fold(x, 1);
            y = fold(y, 1);
        }
        if (x != y)
            return x < y ? -1 : 1;
    }
    return (i < a.n) - (j < b.n);
}

/* compareRuntimeValues: the order of sort and dictsort */
static int compare(ctx *c, const value *a, const value *b, int case_sensitive, const node *at) {
    if (a->t == V_NONE && b->t == V_NONE)
        return 0;
    if (a->t == V_UNDEF && b->t == V_UNDEF)
        return 0;
    int an = is_num(a) || a->t == V_BOOL, bn = is_num(b) || b->t == V_BOOL;
    if (an && bn) {
        double x = num(a), y = num(b);
        return x < y ? -1 : x > y ? 1 : 0;
    }
    if (a->t == V_STR && b->t == V_STR)
        return str_cmp(a->s, b->s, case_sensitive);
    rt_fail(c, at, "cannot compare %s with %s", type_name(a), type_name(b));
}

// ---- strings by code point

static size_t cp_count(jstr s) {
    size_t n = 0;
    for (size_t i = 0; i < s.n; n++) {
        uint32_t cp;
        i += cp_at(s.s, s.n, i, &cp);
    }
    return n;
}

/* the byte offsets of each code point, and the end */
static size_t *cp_offsets(ctx *c, jstr s, size_t *count) {
    size_t n = cp_count(s);
    size_t *o = arena_alloc(&c->a, mul_size(&c->a, n + 1, sizeof *o));
    size_t k = 0;
    for (size_t i = 0; i < s.n; k++) {
        o[k] = i;
        uint32_t cp;
        i += cp_at(s.s, s.n, i, &cp);
    }
    o[k] = s.n;
    *count = n;
    return o;
}

static jstr char_at(ctx *c, jstr s, int64_t idx, int *found) {
    size_t n;
    size_t *o = cp_offsets(c, s, &n);
    if (idx < 0)
        idx += (int64_t)n;
    *found = idx >= 0 && (uint64_t)idx < n;
    return *found ? sub(s, o[idx], o[idx + 1] - o[idx]) : lit("");
}

static int has_char(jstr chars, uint32_t cp) {
    for (size_t i = 0; i < chars.n;) {
        uint32_t x;
        i += cp_at(chars.s, chars.n, i, &x);
        if (x == cp)
            return 1;
    }
    return 0;
}

/* Python's strip family: chars NULL strips whitespace */
static jstr strip(jstr s, const jstr *chars, int left, int right) {
    size_t a = 0, b = s.n;
    while (left && a < b) {
        uint32_t cp;
        size_t k = cp_at(s.s, b, a, &cp);
        if (chars ? !has_char(*chars, cp) : !js_space(cp))
            break;
        a += k;
    }
    while (right && b > a) {
        size_t k = 1;
        while (k < b - a && k < 4 && ((unsigned char)s.s[b - k] & 0xC0) == 0x80)
            k++;
        uint32_t cp;
        if (cp_at(s.s, b, b - k, &cp) != k)
            k = 1, cp = (unsigned char)s.s[b - 1];
        if (chars ? !has_char(*chars, cp) : !js_space(cp))
            break;
        b -= k;
    }
    return sub(s, a, b - a);
}

/* memmem: linear time, whatever the strings (a naive search is quadratic on repetitive text) */
static const char *find_in(jstr hay, jstr needle, size_t from) {
    if (from > hay.n)
        return NULL;
    if (needle.n == 0)
        return hay.s + from;
    return memmem(hay.s + from, hay.n - from, needle.s, needle.n);
}

static int starts(jstr s, jstr p) { return s.n >= p.n && memcmp(s.s, p.s, p.n) == 0; }
static int ends(jstr s, jstr p) { return s.n >= p.n && memcmp(s.s + s.n - p.n, p.s, p.n) == 0; }

/* Maps each code point through f (upper, lower, title ...): each output character is the
 * caller's data when the character it came from was. */
static jstr map_case(ctx *c, jstr s, int mode /* 0 lower, 1 upper, 2 capitalize, 3 title */) {
    obuf o = {0};
    int word_start = 1;
    for (size_t i = 0; i < s.n;) {
        uint32_t cp;
        size_t k = cp_at(s.s, s.n, i, &cp);
        uint32_t to;
        if (mode == 0 || mode == 1)
            to = fold(cp, mode == 0);
        else if (mode == 2)
            to = fold(cp, i != 0);
        else
            to = fold(cp, !word_start);
        if (mode == 3) {
            utf8proc_category_t cat = utf8proc_category((utf8proc_int32_t)cp);
            word_start = !(cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LL || cat == UTF8PROC_CATEGORY_LT ||
                           cat == UTF8PROC_CATEGORY_LM || cat == UTF8PROC_CATEGORY_LO);
        }
        char buf[4];
        size_t n = 0;
        if (k == 1 && cp >= 0x80) /* a byte of invalid UTF-8 stays as it is */
            buf[n++] = s.s[i];
        else
            put_utf8(buf, &n, to);
        obuf_marked(c, &o, buf, n, s.m && s.m[i]);
        i += k;
    }
    return obuf_str(&o);
}

static jstr replace_str(ctx *c, jstr s, jstr from, jstr to, int64_t count) {
    obuf o = {0};
    size_t at = 0;
    int64_t done = 0;
    if (from.n == 0) { /* between every character, as Python */
        for (size_t i = 0; i <= s.n; done++) {
            if (count < 0 || done < count)
                obuf_put(c, &o, to);
            if (i == s.n)
                break;
            uint32_t cp;
            size_t k = cp_at(s.s, s.n, i, &cp);
            obuf_put(c, &o, sub(s, i, k));
            i += k;
        }
        return obuf_str(&o);
    }
    for (const char *hit; (count < 0 || done < count) && (hit = find_in(s, from, at)) != NULL; done++) {
        size_t h = (size_t)(hit - s.s);
        obuf_put(c, &o, sub(s, at, h - at));
        obuf_put(c, &o, to);
        at = h + from.n;
    }
    obuf_put(c, &o, sub(s, at, s.n - at));
    return obuf_str(&o);
}

/* Python's str.split / rsplit; sep NULL splits on runs of whitespace */
static value split_str(ctx *c, jstr s, const jstr *sep, int64_t maxsplit, int from_right, const node *at) {
    jlist *l = list_new(c, 4);
    if (sep && sep->n == 0)
        rt_fail(c, at, "split: empty separator");
    if (!sep) {
        /* words, left to right (rsplit with a limit: right to left) */
        size_t a = 0, b = s.n;
        jlist *rev = list_new(c, 4);
        for (int64_t done = 0;;) {
            if (!from_right) {
                s = strip(sub(s, a, b - a), NULL, 1, 0);
                a = 0;
                b = s.n;
                if (!b)
                    break;
                if (maxsplit >= 0 && done >= maxsplit) {
                    list_add(c, l, vstr(s));
                    break;
                }
                size_t e = 0;
                while (e < b && !space_at(s.s, b, e))
                    e++;
                list_add(c, l, vstr(sub(s, 0, e)));
                s = sub(s, e, b - e);
                b = s.n;
            } else {
                s = strip(s, NULL, 0, 1);
                if (!s.n)
                    break;
                if (maxsplit >= 0 && done >= maxsplit) {
                    list_add(c, rev, vstr(s));
                    break;
                }
                size_t e = s.n, k;
                while (e > 0 && !(k = space_before(s.s, e)))
                    e--;
                list_add(c, rev, vstr(sub(s, e, s.n - e)));
                s = sub(s, 0, e);
            }
            done++;
        }
        for (size_t i = rev->n; i-- > 0;)
            list_add(c, l, rev->v[i]);
        return vlist(l);
    }
    if (!from_right) {
        size_t at_ = 0;
        int64_t done = 0;
        for (const char *hit; (maxsplit < 0 || done < maxsplit) && (hit = find_in(s, *sep, at_)) != NULL; done++) {
            size_t h = (size_t)(hit - s.s);
            list_add(c, l, vstr(sub(s, at_, h - at_)));
            at_ = h + sep->n;
        }
        list_add(c, l, vstr(sub(s, at_, s.n - at_)));
        return vlist(l);
    }
    /* rightmost matches first: the leftmost ones of the reversed separator in the reversed text */
    char *rs = arena_alloc(&c->a, s.n + 1), *rsep = arena_alloc(&c->a, sep->n);
    for (size_t i = 0; i < s.n; i++)
        rs[i] = s.s[s.n - 1 - i];
    for (size_t i = 0; i < sep->n; i++)
        rsep[i] = sep->s[sep->n - 1 - i];
    jlist *rev = list_new(c, 4);
    size_t end = s.n;
    int64_t done = 0;
    while (maxsplit < 0 || done < maxsplit) {
        const char *hit = find_in((jstr){rs, NULL, s.n}, (jstr){rsep, NULL, sep->n}, s.n - end);
        if (!hit)
            break;
        size_t h = s.n - (size_t)(hit - rs) - sep->n; /* where the match starts in s */
        list_add(c, rev, vstr(sub(s, h + sep->n, end - h - sep->n)));
        end = h;
        done++;
    }
    list_add(c, rev, vstr(sub(s, 0, end)));
    for (size_t i = rev->n; i-- > 0;)
        list_add(c, l, rev->v[i]);
    return vlist(l);
}

/* Python's slice of n items: the indexes, in order, into idx */
static size_t slice_indexes(ctx *c, size_t n, const value *start, const value *stop, const value *stepv, size_t **idx,
                            const node *at) {
    for (const value *v = start; v; v = v == start ? stop : v == stop ? stepv : NULL)
        if (v->t != V_INT && v->t != V_UNDEF && v->t != V_NONE)
            rt_fail(c, at, "slice bounds must be integers");
    int64_t step = stepv->t == V_INT ? stepv->i : 1;
    if (step == 0)
        rt_fail(c, at, "slice step cannot be zero");
    int64_t len = (int64_t)n, a, b;
    if (step > 0) {
        a = start->t == V_INT ? start->i : 0;
        b = stop->t == V_INT ? stop->i : len;
        a = a < 0 ? (a + len < 0 ? 0 : a + len) : (a > len ? len : a);
        b = b < 0 ? (b + len < 0 ? 0 : b + len) : (b > len ? len : b);
    } else {
        a = start->t == V_INT ? start->i : len - 1;
        b = stop->t == V_INT ? stop->i : -1;
        a = a < 0 ? (a + len < -1 ? -1 : a + len) : (a > len - 1 ? len - 1 : a);
        if (stop->t == V_INT)
            b = b < 0 ? (b + len < -1 ? -1 : b + len) : (b > len - 1 ? len - 1 : b);
    }
    *idx = arena_alloc(&c->a, mul_size(&c->a, n + 1, sizeof **idx));
    size_t k = 0;
    for (int64_t i = a; step > 0 ? i < b : i > b;) {
        (*idx)[k++] = (size_t)i;
        if (step > 0 ? step >= b - i : step <= b - i) /* the next index would pass the end (or overflow) */
            break;
        i += step;
    }
    return k;
}

// ---- evaluation

typedef struct args {
    value *pos;
    size_t n;
    const node **kw; /* the N_KWARG nodes (their names) */
    value *kwv;
    size_t n_kw;
} args;

static value eval(ctx *c, scope *sc, const node *x);
static void exec_block(ctx *c, scope *sc, const node_list *body, obuf *out);
static int run_test(ctx *c, const char *name, size_t name_n, const value *v, const args *a, const node *at);
static value apply_filter(ctx *c, const char *name, size_t name_n, value v, const args *a, const node *at);

static args eval_args(ctx *c, scope *sc, const node_list *list) {
    args a = {0};
    a.pos = arena_alloc(&c->a, mul_size(&c->a, list->n + 1, sizeof *a.pos));
    a.kw = arena_alloc(&c->a, mul_size(&c->a, list->n + 1, sizeof *a.kw));
    a.kwv = arena_alloc(&c->a, mul_size(&c->a, list->n + 1, sizeof *a.kwv));
    for (size_t i = 0; i < list->n; i++)
        if (list->v[i]->kind != N_KWARG)
            a.pos[a.n++] = eval(c, sc, list->v[i]);
    for (size_t i = 0; i < list->n; i++)
        if (list->v[i]->kind == N_KWARG) {
            for (size_t k = 0; k < a.n_kw; k++)
                if (a.kw[k]->n == list->v[i]->n && memcmp(a.kw[k]->s, list->v[i]->s, a.kw[k]->n) == 0)
                    rt_fail(c, list->v[i], "keyword argument '%.*s' given twice", (int)a.kw[k]->n, a.kw[k]->s);
            a.kw[a.n_kw] = list->v[i];
            a.kwv[a.n_kw++] = eval(c, sc, list->v[i]->a);
        }
    return a;
}

/* Argument k by position, else by keyword name, else NULL. */
static const value *arg(const args *a, size_t k, const char *name) {
    if (k < a->n)
        return &a->pos[k];
    for (size_t i = 0; name && i < a->n_kw; i++)
        if (a->kw[i]->n == strlen(name) && memcmp(a->kw[i]->s, name, a->kw[i]->n) == 0)
            return &a->kwv[i];
    return NULL;
}

/* Fails on arguments a builtin does not take: more than max_pos positional ones, or a keyword
 * not in names (a NULL-terminated list). */
static void check_args(ctx *c, const args *a, size_t max_pos, const char *const *names, const char *what,
                       const node *at) {
    if (a->n > max_pos)
        rt_fail(c, at, "%s takes at most %zu positional arguments, got %zu", what, max_pos, a->n);
    for (size_t i = 0; i < a->n_kw; i++) {
        int known = 0;
        for (const char *const *nm = names; nm && *nm && !known; nm++)
            known = a->kw[i]->n == strlen(*nm) && memcmp(a->kw[i]->s, *nm, a->kw[i]->n) == 0;
        if (!known)
            rt_fail(c, at, "%s takes no argument '%.*s'", what, (int)a->kw[i]->n, a->kw[i]->s);
    }
}

static jstr want_str(ctx *c, const value *v, const char *what, const node *at) {
    if (!v || v->t != V_STR)
        rt_fail(c, at, "%s must be a string, not %s", what, v ? type_name(v) : "missing");
    return v->s;
}

static int64_t want_int(ctx *c, const value *v, int64_t dflt, const char *what, const node *at) {
    if (!v || v->t == V_NONE)
        return dflt;
    if (v->t != V_INT && v->t != V_BOOL)
        rt_fail(c, at, "%s must be an integer, not %s", what, type_name(v));
    return v->t == V_INT ? v->i : v->b;
}

static int want_bool(ctx *c, const value *v, int dflt, const char *what, const node *at) {
    if (!v)
        return dflt;
    if (v->t != V_BOOL)
        rt_fail(c, at, "%s must be a boolean, not %s", what, type_name(v));
    return v->b;
}

static value list_of_chars(ctx *c, jstr s) {
    size_t n;
    size_t *o = cp_offsets(c, s, &n);
    jlist *l = list_new(c, n);
    for (size_t i = 0; i < n; i++)
        list_add(c, l, vstr(sub(s, o[i], o[i + 1] - o[i])));
    return vlist(l);
}

/* What a for loop walks: a list's items, a dict's keys, a string's characters. */
static jlist *iterate(ctx *c, const value *v, const node *at) {
    if (v->t == V_LIST)
        return v->l;
    if (v->t == V_STR)
        return list_of_chars(c, v->s).l;
    if (v->t == V_UNDEF)
        return list_new(c, 1);
    if (v->t == V_DICT) {
        jlist *l = list_new(c, v->d->n);
        for (size_t i = 0; i < v->d->n; i++)
            list_add(c, l, vstr(v->d->k[i]));
        return l;
    }
    rt_fail(c, at, "cannot iterate over %s", type_name(v));
}

static value dict_items(ctx *c, const jdict *d) {
    jlist *l = list_new(c, d->n);
    for (size_t i = 0; i < d->n; i++) {
        jlist *pair = list_new(c, 2);
        list_add(c, pair, vstr(d->k[i]));
        list_add(c, pair, d->v[i]);
        value p = vlist(pair);
        p.tuple = 1;
        list_add(c, l, p);
    }
    return vlist(l);
}

/* item.a.b (a dotted path; integers index lists) */
static value attribute_of(jstr path, const value *item) {
    value v = *item;
    for (size_t a = 0; a <= path.n;) {
        size_t e = a;
        while (e < path.n && path.s[e] != '.')
            e++;
        jstr part = sub(path, a, e - a);
        if (v.t == V_DICT || v.t == V_NS) {
            value *got = dict_get(v.d, part);
            v = got ? *got : undef;
        } else if (v.t == V_LIST) {
            char buf[24];
            if (part.n == 0 || part.n >= sizeof buf)
                return undef;
            memcpy(buf, part.s, part.n);
            buf[part.n] = '\0';
            char *end;
            long long i = strtoll(buf, &end, 10);
            if (*end || i < 0 || (size_t)i >= v.l->n)
                return undef;
            v = v.l->v[i];
        } else {
            return undef;
        }
        a = e + 1;
    }
    return v;
}

/* stable merge sort of n values by compare (with an attribute path, by that attribute) */
typedef struct sort_spec {
    int reverse, case_sensitive, by_value_of_pair;
    const jstr *attribute;
} sort_spec;

static int sort_less(ctx *c, const value *x, const value *y, const sort_spec *s, const node *at) {
    value a = *x, b = *y;
    if (s->attribute) {
        a = attribute_of(*s->attribute, x);
        b = attribute_of(*s->attribute, y);
    } else if (s->by_value_of_pair >= 0) {
        a = x->l->v[s->by_value_of_pair];
        b = y->l->v[s->by_value_of_pair];
    }
    int r = compare(c, &a, &b, s->case_sensitive, at);
    return s->reverse ? r > 0 : r < 0;
}

static void sort_values(ctx *c, value *v, size_t n, const sort_spec *s, const node *at) {
    value *tmp = arena_alloc(&c->a, mul_size(&c->a, n + 1, sizeof *tmp));
    for (size_t width = 1; width < n; width *= 2) {
        for (size_t lo = 0; lo < n; lo += 2 * width) {
            size_t mid = lo + width < n ? lo + width : n, hi = lo + 2 * width < n ? lo + 2 * width : n;
            size_t i = lo, j = mid, k = lo;
            while (i < mid && j < hi)
                tmp[k++] = sort_less(c, &v[j], &v[i], s, at) ? v[j++] : v[i++];
            while (i < mid)
                tmp[k++] = v[i++];
            while (j < hi)
                tmp[k++] = v[j++];
        }
        memcpy(v, tmp, n * sizeof *v);
    }
}

static jstr html_escape(ctx *c, jstr s) {
    obuf o = {0};
    for (size_t i = 0; i < s.n; i++) {
        const char *rep = s.s[i] == '&'    ? "&amp;"
                          : s.s[i] == '<'  ? "&lt;"
                          : s.s[i] == '>'  ? "&gt;"
                          : s.s[i] == '"'  ? "&#34;"
                          : s.s[i] == '\'' ? "&#39;"
                                           : NULL;
        if (rep)
            obuf_marked(c, &o, rep, strlen(rep), s.m && s.m[i]);
        else
            obuf_put(c, &o, sub(s, i, 1));
    }
    return obuf_str(&o);
}

static jstr indent_str(ctx *c, jstr s, jstr pad, int first, int blank) {
    obuf o = {0};
    size_t line = 0;
    for (size_t a = 0; a <= s.n; line++) {
        size_t e = a;
        while (e < s.n && s.s[e] != '\n')
            e++;
        if (line)
            obuf_lit(c, &o, "\n");
        if ((first || line) && (blank || e > a))
            obuf_put(c, &o, pad);
        obuf_put(c, &o, sub(s, a, e - a));
        a = e + 1;
    }
    return obuf_str(&o);
}

/* parseInt / parseFloat of the start of a string; 0 when there is no number */
static int parse_number(jstr s, int want_float, double *out) {
    s = strip(s, NULL, 1, 0);
    char buf[80];
    size_t n = s.n < sizeof buf - 1 ? s.n : sizeof buf - 1;
    memcpy(buf, s.s, n);
    buf[n] = '\0';
    char *end;
    if (want_float) {
        *out = strtod(buf, &end);
    } else {
        long long v = strtoll(buf, &end, 10);
        *out = (double)v;
    }
    return end != buf;
}

static value to_int(ctx *c, const value *v, const value *dflt, const node *at) {
    switch (v->t) {
    case V_INT:
        return *v;
    case V_BOOL:
        return vint(v->b);
    case V_FLOAT:
        if (!isfinite(v->f) || fabs(v->f) >= 9.2e18)
            rt_fail(c, at, "cannot convert %g to an integer", v->f);
        return vint((int64_t)v->f);
    case V_STR: {
        double d;
        return parse_number(v->s, 0, &d) ? vint((int64_t)d) : dflt ? *dflt : vint(0);
    }
    default:
        rt_fail(c, at, "filter 'int' does not apply to %s", type_name(v));
    }
}

static value to_float(ctx *c, const value *v, const value *dflt, const node *at) {
    switch (v->t) {
    case V_INT:
        return vfloat((double)v->i);
    case V_BOOL:
        return vfloat(v->b);
    case V_FLOAT:
        return *v;
    case V_STR: {
        double d;
        return parse_number(v->s, 1, &d) ? vfloat(d) : dflt ? *dflt : vfloat(0);
    }
    default:
        rt_fail(c, at, "filter 'float' does not apply to %s", type_name(v));
    }
}

static jstr join_values(ctx *c, const jlist *l, jstr sep, const jstr *attribute, const node *at) {
    obuf o = {0};
    for (size_t i = 0; i < l->n; i++) {
        if (i)
            obuf_put(c, &o, sep);
        value v = attribute ? attribute_of(*attribute, &l->v[i]) : l->v[i];
        if (!nullish(&v)) /* Array.prototype.join prints null and undefined as nothing */
            obuf_put(c, &o, to_str(c, &v, at));
    }
    return obuf_str(&o);
}

static int name_is(const char *name, size_t n, const char *word) { return n == strlen(word) && !memcmp(name, word, n); }

static value filter_select(ctx *c, const value *v, const args *a, int select, int by_attr, const node *at) {
    if (v->t != V_LIST)
        rt_fail(c, at, "%s applies to a list, not %s", by_attr ? "selectattr/rejectattr" : "select/reject",
                type_name(v));
    size_t first = by_attr ? 1 : 0;
    jstr attr = by_attr ? want_str(c, arg(a, 0, NULL), "the attribute", at) : lit("");
    const value *test = arg(a, first, NULL);
    jstr test_name = test ? want_str(c, test, "the test name", at) : lit("");
    args rest = {.pos = a->pos + (a->n > first + 1 ? first + 1 : a->n), .n = a->n > first + 1 ? a->n - first - 1 : 0};
    jlist *out = list_new(c, v->l->n);
    for (size_t i = 0; i < v->l->n; i++) {
        value item = by_attr ? attribute_of(attr, &v->l->v[i]) : v->l->v[i];
        int ok = test ? run_test(c, test_name.s, test_name.n, &item, &rest, at) : truthy(&item);
        if (ok == select)
            list_add(c, out, v->l->v[i]);
    }
    return vlist(out);
}

static value apply_filter(ctx *c, const char *name, size_t name_n, value v, const args *a, const node *at) {
#define IS(word) name_is(name, name_n, word)
#define WRONG() rt_fail(c, at, "filter '%.*s' does not apply to %s", (int)name_n, name, type_name(&v))
    if (IS("safe"))
        return v;
    if (IS("tojson")) {
        check_args(c, a, 1, (const char *const[]){"indent", "ensure_ascii", "sort_keys", "separators", NULL}, "tojson",
                   at);
        const value *indent = arg(a, 0, "indent");
        json_opts o = json_defaults((int)want_int(c, indent, -1, "tojson indent", at));
        if (o.indent > 64)
            rt_fail(c, at, "tojson indent larger than 64");
        o.ensure_ascii = want_bool(c, arg(a, SIZE_MAX, "ensure_ascii"), 0, "tojson ensure_ascii", at);
        o.sort_keys = want_bool(c, arg(a, SIZE_MAX, "sort_keys"), 0, "tojson sort_keys", at);
        o.undefined_as_null = 1;
        const value *seps = arg(a, SIZE_MAX, "separators");
        if (seps && seps->t != V_NONE) {
            if (seps->t != V_LIST || seps->l->n != 2 || seps->l->v[0].t != V_STR || seps->l->v[1].t != V_STR)
                rt_fail(c, at, "tojson separators must be two strings");
            o.item_sep = seps->l->v[0].s;
            o.key_sep = seps->l->v[1].s;
        }
        obuf b = {0};
        json_value(c, &b, &v, &o, 0, at);
        return vstr(obuf_str(&b));
    }
    if (IS("default") || IS("d")) {
        check_args(c, a, 2, (const char *const[]){"default_value", "boolean", NULL}, "default", at);
        const value *dflt = arg(a, 0, "default_value");
        int boolean = want_bool(c, arg(a, 1, "boolean"), 0, "default boolean", at);
        if (v.t == V_UNDEF || (boolean && !truthy(&v)))
            return dflt ? *dflt : vstr(lit(""));
        return v;
    }
    if (IS("length") || IS("count")) {
        if (v.t == V_STR) {
            charge(c, at, v.s.n >> 10);
            return vint((int64_t)cp_count(v.s));
        }
        if (v.t == V_LIST)
            return vint((int64_t)v.l->n);
        if (v.t == V_DICT)
            return vint((int64_t)v.d->n);
        WRONG();
    }
    if (IS("string")) {
        if (v.t == V_STR)
            return v;
        if (v.t == V_NONE)
            return vstr(lit("None"));
        return vstr(to_str(c, &v, at));
    }
    if (IS("items")) {
        if (v.t == V_UNDEF)
            return vlist(list_new(c, 1));
        if (v.t != V_DICT)
            WRONG();
        return dict_items(c, v.d);
    }
    if (IS("dictsort")) {
        if (v.t != V_DICT)
            WRONG();
        check_args(c, a, 3, (const char *const[]){"case_sensitive", "by", "reverse", NULL}, "dictsort", at);
        sort_spec s = {.case_sensitive = want_bool(c, arg(a, 0, "case_sensitive"), 0, "case_sensitive", at),
                       .reverse = want_bool(c, arg(a, 2, "reverse"), 0, "reverse", at)};
        const value *by = arg(a, 1, "by");
        jstr b = by ? want_str(c, by, "by", at) : lit("key");
        if (!str_eq(b, lit("key")) && !str_eq(b, lit("value")))
            rt_fail(c, at, "dictsort by must be 'key' or 'value'");
        s.by_value_of_pair = str_eq(b, lit("value"));
        value items = dict_items(c, v.d);
        sort_values(c, items.l->v, items.l->n, &s, at);
        return items;
    }
    if (IS("first") || IS("last")) {
        if (v.t == V_LIST)
            return v.l->n ? v.l->v[IS("first") ? 0 : v.l->n - 1] : undef;
        if (v.t == V_STR) {
            int found;
            jstr ch = char_at(c, v.s, IS("first") ? 0 : -1, &found);
            return found ? vstr(ch) : undef;
        }
        WRONG();
    }
    if (IS("list")) {
        if (v.t == V_LIST)
            return v;
        if (v.t == V_STR)
            return list_of_chars(c, v.s);
        if (v.t == V_DICT)
            return vlist(iterate(c, &v, at));
        WRONG();
    }
    if (IS("reverse")) {
        if (v.t == V_STR) {
            size_t n;
            size_t *o = cp_offsets(c, v.s, &n);
            obuf b = {0};
            for (size_t i = n; i-- > 0;)
                obuf_put(c, &b, sub(v.s, o[i], o[i + 1] - o[i]));
            return vstr(obuf_str(&b));
        }
        if (v.t != V_LIST)
            WRONG();
        jlist *l = list_new(c, v.l->n);
        for (size_t i = v.l->n; i-- > 0;)
            list_add(c, l, v.l->v[i]);
        return vlist(l);
    }
    if (IS("sort")) {
        if (v.t != V_LIST)
            WRONG();
        check_args(c, a, 3, (const char *const[]){"reverse", "case_sensitive", "attribute", NULL}, "sort", at);
        sort_spec s = {.reverse = want_bool(c, arg(a, 0, "reverse"), 0, "reverse", at),
                       .case_sensitive = want_bool(c, arg(a, 1, "case_sensitive"), 0, "case_sensitive", at),
                       .by_value_of_pair = -1};
        const value *attr = arg(a, 2, "attribute");
        jstr path;
        char num_path[24];
        if (attr && attr->t == V_INT) {
            snprintf(num_path, sizeof num_path, "%" PRId64, attr->i);
            path = lit(num_path);
            s.attribute = &path;
        } else if (attr && attr->t != V_NONE) {
            path = want_str(c, attr, "sort attribute", at);
            s.attribute = &path;
        }
        jlist *l = list_new(c, v.l->n);
        for (size_t i = 0; i < v.l->n; i++)
            list_add(c, l, v.l->v[i]);
        sort_values(c, l->v, l->n, &s, at);
        return vlist(l);
    }
    if (IS("unique")) {
        if (v.t != V_LIST)
            WRONG();
        jlist *l = list_new(c, v.l->n);
        for (size_t i = 0; i < v.l->n; i++) {
            charge(c, at, l->n);
            int seen = 0;
            for (size_t k = 0; k < l->n && !seen; k++)
                seen = strict_eq(&l->v[k], &v.l->v[i]);
            if (!seen)
                list_add(c, l, v.l->v[i]);
        }
        return vlist(l);
    }
    if (IS("join")) {
        check_args(c, a, 2, (const char *const[]){"d", "attribute", NULL}, "join", at);
        const value *sepv = arg(a, 0, "d");
        jstr sep = sepv ? want_str(c, sepv, "the join separator", at) : lit("");
        const value *attr = arg(a, 1, "attribute");
        jstr path = attr ? want_str(c, attr, "join attribute", at) : lit("");
        if (v.t == V_STR)
            v = list_of_chars(c, v.s);
        if (v.t != V_LIST)
            WRONG();
        return vstr(join_values(c, v.l, sep, attr ? &path : NULL, at));
    }
    if (IS("map")) {
        if (v.t != V_LIST)
            WRONG();
        const value *attr = arg(a, SIZE_MAX, "attribute");
        jlist *l = list_new(c, v.l->n);
        if (attr) {
            check_args(c, a, 0, (const char *const[]){"attribute", "default", NULL}, "map", at);
            jstr path = want_str(c, attr, "map attribute", at);
            const value *dflt = arg(a, SIZE_MAX, "default");
            for (size_t i = 0; i < v.l->n; i++) {
                value got = attribute_of(path, &v.l->v[i]);
                list_add(c, l, got.t == V_UNDEF && dflt ? *dflt : got);
            }
            return vlist(l);
        }
        jstr filter = want_str(c, arg(a, 0, NULL), "the map filter name", at);
        args rest = *a;
        rest.pos++;
        rest.n--;
        for (size_t i = 0; i < v.l->n; i++)
            list_add(c, l, apply_filter(c, filter.s, filter.n, v.l->v[i], &rest, at));
        return vlist(l);
    }
    if (IS("select") || IS("reject"))
        return filter_select(c, &v, a, IS("select"), 0, at);
    if (IS("selectattr") || IS("rejectattr"))
        return filter_select(c, &v, a, IS("selectattr"), 1, at);
    if (IS("int")) {
        check_args(c, a, 1, (const char *const[]){"default", NULL}, "int", at);
        return to_int(c, &v, arg(a, 0, "default"), at);
    }
    if (IS("float")) {
        check_args(c, a, 1, (const char *const[]){"default", NULL}, "float", at);
        return to_float(c, &v, arg(a, 0, "default"), at);
    }
    if (IS("abs")) {
        if (v.t == V_INT)
            return vint(v.i < 0 ? -v.i : v.i);
        if (v.t == V_FLOAT)
            return vfloat(fabs(v.f));
        WRONG();
    }
    if (IS("bool"))
        return vbool(truthy(&v));
    if (IS("escape") || IS("e"))
        return vstr(html_escape(c, to_str(c, &v, at)));
    if (v.t != V_STR) {
        static const char *const string_filters[] = {"upper", "lower",  "capitalize", "title",
                                                     "trim",  "indent", "replace",    NULL};
        for (const char *const *f = string_filters; *f; f++)
            if (IS(*f))
                WRONG();
        rt_fail(c, at, "unknown filter '%.*s'", (int)name_n, name);
    }
    if (IS("upper") || IS("lower") || IS("capitalize") || IS("title"))
        return vstr(map_case(c, v.s, IS("lower") ? 0 : IS("upper") ? 1 : IS("capitalize") ? 2 : 3));
    if (IS("trim")) {
        const value *chars = arg(a, 0, "chars");
        jstr set = chars && chars->t != V_NONE ? want_str(c, chars, "trim chars", at) : lit("");
        return vstr(strip(v.s, chars && chars->t != V_NONE ? &set : NULL, 1, 1));
    }
    if (IS("indent")) {
        check_args(c, a, 3, (const char *const[]){"width", "first", "blank", NULL}, "indent", at);
        const value *w = arg(a, 0, "width");
        jstr pad;
        if (w && w->t == V_STR) {
            pad = w->s;
        } else {
            int64_t width = want_int(c, w, 4, "indent width", at);
            if (width < 0 || width > 256)
                rt_fail(c, at, "indent width must be between 0 and 256");
            char *spaces = arena_alloc(&c->a, (size_t)width + 1);
            memset(spaces, ' ', (size_t)width);
            pad = (jstr){spaces, NULL, (size_t)width};
        }
        return vstr(indent_str(c, v.s, pad, truthy(arg(a, 1, "first") ? arg(a, 1, "first") : &none),
                               truthy(arg(a, 2, "blank") ? arg(a, 2, "blank") : &none)));
    }
    if (IS("replace")) {
        check_args(c, a, 3, (const char *const[]){"count", NULL}, "replace", at);
        jstr from = want_str(c, arg(a, 0, NULL), "replace's first argument", at);
        jstr to = want_str(c, arg(a, 1, NULL), "replace's second argument", at);
        return vstr(replace_str(c, v.s, from, to, want_int(c, arg(a, 2, "count"), -1, "replace count", at)));
    }
    rt_fail(c, at, "unknown filter '%.*s'", (int)name_n, name);
#undef WRONG
#undef IS
}

static int run_test(ctx *c, const char *name, size_t name_n, const value *v, const args *a, const node *at) {
#define IS(word) name_is(name, name_n, word)
    const value *other = arg(a, 0, NULL);
    if (IS("defined"))
        return v->t != V_UNDEF;
    if (IS("undefined"))
        return v->t == V_UNDEF;
    if (IS("none"))
        return v->t == V_NONE;
    if (IS("boolean"))
        return v->t == V_BOOL;
    if (IS("true") || IS("false"))
        return v->t == V_BOOL && v->b == IS("true");
    if (IS("string"))
        return v->t == V_STR;
    if (IS("number"))
        return is_num(v);
    if (IS("integer"))
        return v->t == V_INT;
    if (IS("float"))
        return v->t == V_FLOAT;
    if (IS("mapping"))
        return v->t == V_DICT;
    if (IS("iterable") || IS("sequence"))
        return v->t == V_LIST || v->t == V_STR || v->t == V_DICT;
    if (IS("callable"))
        return v->t == V_FUNC;
    if (IS("odd") || IS("even")) {
        if (v->t != V_INT)
            rt_fail(c, at, "test '%.*s' applies to an integer, not %s", (int)name_n, name, type_name(v));
        return (v->i % 2 != 0) == IS("odd");
    }
    if (IS("lower") || IS("upper")) {
        if (v->t != V_STR)
            return 0;
        return str_eq(map_case(c, v->s, IS("upper")), v->s);
    }
    static const char *const with_argument[] = {"divisibleby", "equalto", "eq", "==", "sameas", "ne", "!=", "lt", "<",
                                                "le",          "<=",      "gt", ">",  "ge",     ">=", "in", NULL};
    int known = 0;
    for (const char *const *t = with_argument; *t && !known; t++)
        known = IS(*t);
    if (!known)
        rt_fail(c, at, "unknown test '%.*s'", (int)name_n, name);
    if (!other)
        rt_fail(c, at, "test '%.*s' needs an argument", (int)name_n, name);
    if (IS("divisibleby")) {
        int64_t d = want_int(c, other, 0, "divisibleby", at);
        if (d == 0 || v->t != V_INT)
            rt_fail(c, at, "divisibleby needs integers and a non-zero divisor");
        return v->i % d == 0;
    }
    if (IS("equalto") || IS("eq") || IS("==") || IS("sameas"))
        return strict_eq(v, other);
    if (IS("ne") || IS("!="))
        return !strict_eq(v, other);
    if (IS("lt") || IS("<") || IS("le") || IS("<=") || IS("gt") || IS(">") || IS("ge") || IS(">=")) {
        int r = compare(c, v, other, 1, at);
        return IS("lt") || IS("<") ? r < 0 : IS("le") || IS("<=") ? r <= 0 : IS("gt") || IS(">") ? r > 0 : r >= 0;
    }
    if (IS("in")) {
        charge(c, at, other->t == V_LIST ? other->l->n : other->t == V_STR ? other->s.n >> 10 : 0);
        if (other->t == V_LIST) {
            for (size_t i = 0; i < other->l->n; i++)
                if (strict_eq(v, &other->l->v[i]))
                    return 1;
            return 0;
        }
        if (other->t == V_STR && v->t == V_STR)
            return find_in(other->s, v->s, 0) != NULL;
        if (other->t == V_DICT && v->t == V_STR)
            return dict_get(other->d, v->s) != NULL;
        rt_fail(c, at, "test 'in' needs a list, a string or a dict");
    }
    rt_fail(c, at, "unknown test '%.*s'", (int)name_n, name);
#undef IS
}

// ---- methods: Python's str and dict methods that templates call

static const char *const str_methods[] = {"upper",      "lower",      "strip",    "lstrip", "rstrip",  "title",
                                          "capitalize", "startswith", "endswith", "split",  "rsplit",  "replace",
                                          "find",       "rfind",      "count",    "join",   "isdigit", "isalpha",
                                          "isspace",    "islower",    "isupper",  NULL};
static const char *const dict_methods[] = {"get", "items", "keys", "values", NULL};

static const char *method_named(const char *const *table, jstr name) {
    for (; *table; table++)
        if (str_eq(lit(*table), name))
            return *table;
    return NULL;
}

static int prefix_test(ctx *c, jstr s, const value *p, int at_end, const node *at) {
    if (p && p->t == V_STR)
        return at_end ? ends(s, p->s) : starts(s, p->s);
    if (p && p->t == V_LIST) {
        for (size_t i = 0; i < p->l->n; i++)
            if (prefix_test(c, s, &p->l->v[i], at_end, at))
                return 1;
        return 0;
    }
    rt_fail(c, at, "%s takes a string or a tuple of strings", at_end ? "endswith" : "startswith");
}

static int all_chars(jstr s, int (*pred)(uint32_t)) {
    if (!s.n)
        return 0;
    for (size_t i = 0; i < s.n;) {
        uint32_t cp;
        i += cp_at(s.s, s.n, i, &cp);
        if (!pred(cp))
            return 0;
    }
    return 1;
}

static int cp_digit(uint32_t cp) { return utf8proc_category((utf8proc_int32_t)cp) == UTF8PROC_CATEGORY_ND; }
static int cp_alpha(uint32_t cp) {
    utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)cp);
    return k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO;
}

static value call_method(ctx *c, const jfunc *f, const args *a, const node *at) {
    const char *m = f->method;
    const value *self = &f->self;
    if (self->t == V_DICT) {
        const jdict *d = self->d;
        if (!strcmp(m, "get")) {
            check_args(c, a, 2, NULL, "get", at);
            value *got = dict_get(d, want_str(c, arg(a, 0, NULL), "the key", at));
            return got ? *got : a->n > 1 ? a->pos[1] : none;
        }
        check_args(c, a, 0, NULL, m, at);
        if (!strcmp(m, "items"))
            return dict_items(c, d);
        jlist *l = list_new(c, d->n);
        for (size_t i = 0; i < d->n; i++)
            list_add(c, l, !strcmp(m, "keys") ? vstr(d->k[i]) : d->v[i]);
        return vlist(l);
    }
    jstr s = self->s;
    if (!strcmp(m, "upper") || !strcmp(m, "lower") || !strcmp(m, "title") || !strcmp(m, "capitalize")) {
        check_args(c, a, 0, NULL, m, at);
        return vstr(map_case(c, s,
                             !strcmp(m, "lower")        ? 0
                             : !strcmp(m, "upper")      ? 1
                             : !strcmp(m, "capitalize") ? 2
                                                        : 3));
    }
    if (!strcmp(m, "strip") || !strcmp(m, "lstrip") || !strcmp(m, "rstrip")) {
        check_args(c, a, 1, NULL, m, at);
        const value *chars = arg(a, 0, NULL);
        jstr set = chars && chars->t != V_NONE ? want_str(c, chars, "the characters to strip", at) : lit("");
        return vstr(strip(s, chars && chars->t != V_NONE ? &set : NULL, m[0] != 'r', m[0] != 'l'));
    }
    if (!strcmp(m, "startswith") || !strcmp(m, "endswith")) {
        check_args(c, a, 1, NULL, m, at);
        return vbool(prefix_test(c, s, arg(a, 0, NULL), m[0] == 'e', at));
    }
    if (!strcmp(m, "split") || !strcmp(m, "rsplit")) {
        check_args(c, a, 2, (const char *const[]){"sep", "maxsplit", NULL}, m, at);
        const value *sep = arg(a, 0, "sep");
        jstr sepv = sep && sep->t != V_NONE ? want_str(c, sep, "the separator", at) : lit("");
        return split_str(c, s, sep && sep->t != V_NONE ? &sepv : NULL,
                         want_int(c, arg(a, 1, "maxsplit"), -1, "maxsplit", at), m[0] == 'r', at);
    }
    if (!strcmp(m, "replace")) {
        check_args(c, a, 3, (const char *const[]){"count", NULL}, m, at);
        jstr from = want_str(c, arg(a, 0, NULL), "replace's first argument", at);
        jstr to = want_str(c, arg(a, 1, NULL), "replace's second argument", at);
        return vstr(replace_str(c, s, from, to, want_int(c, arg(a, 2, "count"), -1, "replace count", at)));
    }
    if (!strcmp(m, "find") || !strcmp(m, "rfind") || !strcmp(m, "count")) {
        check_args(c, a, 1, NULL, m, at);
        jstr needle = want_str(c, arg(a, 0, NULL), "the substring", at);
        charge(c, at, s.n >> 10);
        if (needle.n == 0) /* Python: found at 0 (rfind: at the end), counted between every character */
            return vint(m[0] == 'f' ? 0 : (int64_t)cp_count(s) + (m[0] == 'c'));
        int64_t found = -1, count = 0, cp = 0;
        size_t counted = 0; /* the characters before byte counted are in cp */
        for (size_t from = 0; from <= s.n;) {
            const char *hit = find_in(s, needle, from);
            if (!hit)
                break;
            size_t byte = (size_t)(hit - s.s);
            cp += (int64_t)cp_count(sub(s, counted, byte - counted));
            counted = byte;
            if (found < 0 || m[0] == 'r')
                found = cp;
            count++;
            if (m[0] == 'f')
                break;
            from = byte + needle.n;
        }
        return vint(m[0] == 'c' ? count : found);
    }
    if (!strcmp(m, "join")) {
        check_args(c, a, 1, NULL, m, at);
        const value *items = arg(a, 0, NULL);
        if (!items || (items->t != V_LIST && items->t != V_STR))
            rt_fail(c, at, "join takes a list");
        value l = items->t == V_STR ? list_of_chars(c, items->s) : *items;
        return vstr(join_values(c, l.l, s, NULL, at));
    }
    check_args(c, a, 0, NULL, m, at);
    if (!strcmp(m, "isdigit"))
        return vbool(all_chars(s, cp_digit));
    if (!strcmp(m, "isalpha"))
        return vbool(all_chars(s, cp_alpha));
    if (!strcmp(m, "isspace"))
        return vbool(all_chars(s, js_space));
    /* islower / isupper */
    return vbool(s.n && str_eq(map_case(c, s, m[2] == 'u'), s) && !str_eq(map_case(c, s, m[2] != 'u'), s));
}

static value method(ctx *c, const value *self, const char *name) {
    jfunc *f = arena_zalloc(&c->a, sizeof *f);
    f->kind = F_METHOD;
    f->self = *self;
    f->method = name;
    return (value){.t = V_FUNC, .fn = f};
}

// ---- expressions

static value member(ctx *c, const value *obj, const value *prop, const node *at) {
    if (obj->t == V_DICT || obj->t == V_NS) {
        if (prop->t != V_STR)
            rt_fail(c, at, "a %s is indexed by strings, not %s", type_name(obj), type_name(prop));
        value *got = dict_get(obj->d, prop->s);
        if (got)
            return *got;
        const char *m = obj->t == V_DICT ? method_named(dict_methods, prop->s) : NULL;
        return m ? method(c, obj, m) : undef;
    }
    if (obj->t == V_LIST || obj->t == V_STR) {
        if (prop->t == V_INT) {
            if (obj->t == V_STR) {
                int found;
                jstr ch = char_at(c, obj->s, prop->i, &found);
                return found ? vstr(ch) : undef;
            }
            int64_t i = prop->i < 0 ? prop->i + (int64_t)obj->l->n : prop->i;
            return i >= 0 && (uint64_t)i < obj->l->n ? obj->l->v[i] : undef;
        }
        if (prop->t != V_STR)
            rt_fail(c, at, "a %s is indexed by integers, not %s", type_name(obj), type_name(prop));
        if (str_eq(prop->s, lit("length"))) {
            charge(c, at, obj->t == V_STR ? obj->s.n >> 10 : 0);
            return vint((int64_t)(obj->t == V_STR ? cp_count(obj->s) : obj->l->n));
        }
        const char *m = obj->t == V_STR ? method_named(str_methods, prop->s) : NULL;
        return m ? method(c, obj, m) : undef;
    }
    if (prop->t != V_STR)
        rt_fail(c, at, "cannot index %s with %s", type_name(obj), type_name(prop));
    return undef;
}

static value slice(ctx *c, scope *sc, const node *x) {
    value obj = eval(c, sc, x->a);
    value parts[3];
    for (size_t k = 0; k < 3; k++)
        parts[k] = x->args.v[k] ? eval(c, sc, x->args.v[k]) : undef;
    size_t n, *idx, count;
    size_t *offsets = NULL;
    if (obj.t == V_LIST)
        n = obj.l->n;
    else if (obj.t == V_STR)
        offsets = cp_offsets(c, obj.s, &n);
    else
        rt_fail(c, x, "cannot slice %s", type_name(&obj));
    count = slice_indexes(c, n, &parts[0], &parts[1], &parts[2], &idx, x);
    if (obj.t == V_LIST) {
        jlist *l = list_new(c, count);
        for (size_t i = 0; i < count; i++)
            list_add(c, l, obj.l->v[idx[i]]);
        return vlist(l);
    }
    obuf b = {0};
    for (size_t i = 0; i < count; i++)
        obuf_put(c, &b, sub(obj.s, offsets[idx[i]], offsets[idx[i] + 1] - offsets[idx[i]]));
    return vstr(obuf_str(&b));
}

static value arithmetic(ctx *c, bin_op op, const value *l, const value *r, const node *at) {
    if (op == OP_POW) {
        double a = num(l), b = num(r);
        if (a == 0 && b < 0)
            rt_fail(c, at, "0 cannot be raised to a negative power");
        double p = pow(a, b);
        if (!isfinite(p))
            rt_fail(c, at, "the power is not a finite number");
        if (l->t == V_FLOAT || r->t == V_FLOAT || b < 0 || fabs(p) >= 9.2e18)
            return vfloat(p);
        return vint((int64_t)p);
    }
    int ints = l->t != V_FLOAT && r->t != V_FLOAT;
    int64_t a = l->t == V_INT ? l->i : l->b, b = r->t == V_INT ? r->i : r->b, out;
    double x = num(l), y = num(r);
    switch (op) {
    case OP_ADD:
    case OP_SUB:
    case OP_MUL: {
        if (!ints)
            return vfloat(op == OP_ADD ? x + y : op == OP_SUB ? x - y : x * y);
        int overflow = op == OP_ADD   ? __builtin_add_overflow(a, b, &out)
                       : op == OP_SUB ? __builtin_sub_overflow(a, b, &out)
                                      : __builtin_mul_overflow(a, b, &out);
        if (overflow)
            rt_fail(c, at, "integer overflow");
        return vint(out);
    }
    case OP_DIV:
        if (y == 0)
            rt_fail(c, at, "division by zero");
        return vfloat(x / y);
    case OP_FLOORDIV:
    case OP_MOD:
        if (y == 0)
            rt_fail(c, at, "division by zero");
        if (ints) {
            if (a == INT64_MIN && b == -1)
                rt_fail(c, at, "integer overflow");
            int64_t q = a / b, m = a % b;
            if (m != 0 && ((m < 0) != (b < 0))) { /* Python rounds towards negative infinity */
                q--;
                m += b;
            }
            return vint(op == OP_MOD ? m : q);
        }
        if (op == OP_FLOORDIV)
            return vfloat(floor(x / y));
        {
            double m = fmod(x, y);
            if (m != 0 && ((m < 0) != (y < 0)))
                m += y;
            return vfloat(m);
        }
    default:
        break;
    }
    rt_fail(c, at, "unsupported operator");
}

static int contains(ctx *c, const value *item, const value *in, const node *at) {
    if (in->t == V_UNDEF)
        return 0;
    args a = {.pos = (value *)in, .n = 1};
    if (in->t != V_LIST && !(in->t == V_STR && item->t == V_STR) && !(in->t == V_DICT && item->t == V_STR))
        rt_fail(c, at, "'in' needs a list, a string or a dict on its right, not %s (with %s on its left)",
                type_name(in), type_name(item));
    return run_test(c, "in", 2, item, &a, at);
}

static value binary_values(ctx *c, const node *x, value l, value r) {
    switch (x->op) {
    case OP_EQ:
        return vbool(loose_eq(l, r));
    case OP_NE:
        return vbool(!loose_eq(l, r));
    case OP_IN:
    case OP_NOT_IN:
        return vbool(contains(c, &l, &r, x) == (x->op == OP_IN));
    default:
        break;
    }
    if (nullish(&l) || nullish(&r))
        rt_fail(c, x, "operator applied to %s and %s", type_name(&l), type_name(&r));
    if (x->op == OP_CONCAT)
        return vstr(concat(c, to_str(c, &l, x), to_str(c, &r, x)));
    int ln = is_num(&l) || l.t == V_BOOL, rn = is_num(&r) || r.t == V_BOOL;
    if (x->op == OP_POW && ln && rn)
        return arithmetic(c, x->op, &l, &r, x);
    if (is_num(&l) && is_num(&r)) {
        double a = num(&l), b = num(&r);
        switch (x->op) {
        case OP_LT:
            return vbool(a < b);
        case OP_GT:
            return vbool(a > b);
        case OP_LE:
            return vbool(a <= b);
        case OP_GE:
            return vbool(a >= b);
        default:
            return arithmetic(c, x->op, &l, &r, x);
        }
    }
    if (x->op == OP_ADD && l.t == V_LIST && r.t == V_LIST) {
        jlist *out = list_new(c, l.l->n + r.l->n);
        for (size_t i = 0; i < l.l->n; i++)
            list_add(c, out, l.l->v[i]);
        for (size_t i = 0; i < r.l->n; i++)
            list_add(c, out, r.l->v[i]);
        return vlist(out);
    }
    if (x->op == OP_ADD && (l.t == V_STR || r.t == V_STR))
        return vstr(concat(c, to_str(c, &l, x), to_str(c, &r, x)));
    if (l.t == V_STR && r.t == V_STR && x->op >= OP_LT && x->op <= OP_GE) {
        int k = str_cmp(l.s, r.s, 1);
        return vbool(x->op == OP_LT ? k < 0 : x->op == OP_GT ? k > 0 : x->op == OP_LE ? k <= 0 : k >= 0);
    }
    if (x->op == OP_MUL && ((l.t == V_STR && r.t == V_INT) || (l.t == V_INT && r.t == V_STR))) {
        jstr s = l.t == V_STR ? l.s : r.s;
        int64_t times = l.t == V_INT ? l.i : r.i;
        if (s.n == 0 || times <= 0)
            return vstr(lit(""));
        if ((uint64_t)times > c->lim->max_output / s.n)
            fail(c->err, RLX_E_RANGE, x->pos, "the rendered text would be larger than %zu MiB",
                 c->lim->max_output >> 20);
        obuf b = {0};
        for (int64_t i = 0; i < times; i++)
            obuf_put(c, &b, s);
        return vstr(obuf_str(&b));
    }
    rt_fail(c, x, "unsupported operand types %s and %s", type_name(&l), type_name(&r));
}

static int concatenates(bin_op op, const value *l, const value *r) {
    return (op == OP_ADD || op == OP_CONCAT) && !nullish(l) && !nullish(r) &&
           (op == OP_CONCAT || l->t == V_STR || r->t == V_STR);
}

/* a + b ~ c + ...: a chain of + and ~ is built in one buffer once it becomes a string, rather
 * than copying the text so far at every step (a message's content is copied once, not once per
 * operator after it). With into, a chain that becomes a string is written there instead (what
 * {{ }} prints), and undefined is returned. */
static value binary_chain(ctx *c, scope *sc, const node *x, obuf *into) {
    size_t n = 0;
    for (const node *k = x; k->kind == N_BIN && (k->op == OP_ADD || k->op == OP_CONCAT); k = k->a)
        n++;
    const node **spine = arena_alloc(&c->a, mul_size(&c->a, n, sizeof *spine));
    size_t i = n;
    for (const node *k = x; i > 0; k = k->a)
        spine[--i] = k;
    value acc = eval(c, sc, spine[0]->a);
    obuf built = {0};
    int building = 0;
    for (i = 0; i < n; i++) {
        value r = eval(c, sc, spine[i]->b);
        if (!concatenates(spine[i]->op, &acc, &r)) {
            if (building) /* a string and none or undefined: an error */
                binary_values(c, spine[i], vstr(lit("")), r);
            acc = binary_values(c, spine[i], acc, r);
            building = 0;
            built = (obuf){0};
            continue;
        }
        if (!building) {
            obuf_put(c, into ? into : &built, to_str(c, &acc, spine[i]));
            building = 1;
        }
        obuf_put(c, into ? into : &built, to_str(c, &r, spine[i]));
        acc = vstr(lit("")); /* a string: what concatenates() needs to know */
    }
    return !building ? acc : into ? undef : vstr(obuf_str(&built));
}

static value binary_op(ctx *c, scope *sc, const node *x) {
    if (x->op != OP_ADD && x->op != OP_CONCAT)
        return binary_values(c, x, eval(c, sc, x->a), eval(c, sc, x->b));
    return binary_chain(c, sc, x, NULL);
}

static value call_macro(ctx *c, const jfunc *f, const args *a, scope *caller_scope, const node *at);

static value strftime_now(ctx *c, const args *a, const node *at) {
    jstr fmt = want_str(c, arg(a, 0, NULL), "strftime_now's format", at);
    time_t now = time(NULL);
    struct tm tm;
    localtime_r(&now, &tm);
    obuf b = {0};
    for (size_t i = 0; i < fmt.n; i++) {
        if (fmt.s[i] != '%' || i + 1 >= fmt.n || !strchr("YmdbBHM%", fmt.s[i + 1]) || !fmt.s[i + 1]) {
            obuf_raw(c, &b, fmt.s + i, 1);
            continue;
        }
        char spec[3] = {'%', fmt.s[++i], '\0'}, out[64];
        size_t n = strftime(out, sizeof out, spec, &tm);
        obuf_raw(c, &b, out, n);
    }
    return vstr(obuf_str(&b));
}

static value call(ctx *c, scope *sc, const node *x) {
    args a = eval_args(c, sc, &x->args);
    value fn = eval(c, sc, x->a);
    if (fn.t != V_FUNC) {
        if (x->a->kind == N_MEMBER && x->a->b->kind == N_STR)
            rt_fail(c, x, "no method '%.*s' on this %s", (int)x->a->b->n, x->a->b->s, "value");
        if (x->a->kind == N_IDENT)
            rt_fail(c, x, "'%.*s' is not a macro or function", (int)x->a->n, x->a->s);
        rt_fail(c, x, "cannot call %s", type_name(&fn));
    }
    const jfunc *f = fn.fn;
    switch (f->kind) {
    case F_MACRO:
    case F_CALLER:
        return call_macro(c, f, &a, sc, x);
    case F_METHOD:
        return call_method(c, f, &a, x);
    case F_RAISE: {
        jstr msg = a.n ? to_str(c, &a.pos[0], x) : lit("");
        fail(c->err, RLX_E_INVALID, x->pos, "raise_exception: %.*s", (int)(msg.n < 300 ? msg.n : 300), msg.s);
    }
    case F_STRFTIME:
        return strftime_now(c, &a, x);
    case F_RANGE: {
        check_args(c, &a, 3, NULL, "range", x);
        if (a.n == 0)
            rt_fail(c, x, "range needs at least one argument");
        int64_t start = a.n > 1 ? want_int(c, &a.pos[0], 0, "range start", x) : 0;
        int64_t stop = want_int(c, &a.pos[a.n > 1 ? 1 : 0], 0, "range stop", x);
        int64_t stepv = a.n > 2 ? want_int(c, &a.pos[2], 1, "range step", x) : 1;
        if (stepv == 0)
            rt_fail(c, x, "range step must not be zero");
        jlist *l = list_new(c, 8);
        for (int64_t i = start; stepv > 0 ? i < stop : i > stop;) {
            step(c, x);
            list_add(c, l, vint(i));
            if (__builtin_add_overflow(i, stepv, &i))
                break;
        }
        return vlist(l);
    }
    case F_NAMESPACE: {
        if (a.n > 1)
            rt_fail(c, x, "namespace takes at most one positional argument");
        jdict *d = dict_new(c);
        if (a.n) {
            if (a.pos[0].t != V_DICT)
                rt_fail(c, x, "namespace takes a dict and keyword arguments");
            for (size_t i = 0; i < a.pos[0].d->n; i++)
                dict_set(c, d, a.pos[0].d->k[i], a.pos[0].d->v[i]);
        }
        for (size_t i = 0; i < a.n_kw; i++)
            dict_set(c, d, (jstr){a.kw[i]->s, NULL, a.kw[i]->n}, a.kwv[i]);
        return (value){.t = V_NS, .d = d};
    }
    }
    rt_fail(c, x, "cannot call this value");
}

static value eval(ctx *c, scope *sc, const node *x) {
    enter_rt(c, x);
    value v;
    switch (x->kind) {
    case N_STR:
        v = vstr((jstr){x->s, NULL, x->n});
        break;
    case N_INT:
        v = vint(x->i);
        break;
    case N_FLOAT:
        v = vfloat(x->f);
        break;
    case N_IDENT: {
        value *got = scope_find(sc, x->s, x->n);
        v = got ? *got : undef;
        break;
    }
    case N_LIST:
    case N_TUPLE: {
        jlist *l = list_new(c, x->args.n);
        for (size_t i = 0; i < x->args.n; i++)
            list_add(c, l, eval(c, sc, x->args.v[i]));
        v = vlist(l);
        v.tuple = x->kind == N_TUPLE;
        break;
    }
    case N_DICT: {
        jdict *d = dict_new(c);
        for (size_t i = 0; i + 1 < x->args.n; i += 2) {
            value k = eval(c, sc, x->args.v[i]);
            if (k.t != V_STR)
                rt_fail(c, x->args.v[i], "dict keys must be strings, not %s", type_name(&k));
            dict_set(c, d, k.s, eval(c, sc, x->args.v[i + 1]));
        }
        v = (value){.t = V_DICT, .d = d};
        break;
    }
    case N_MEMBER: {
        value obj = eval(c, sc, x->a);
        value prop = eval(c, sc, x->b);
        v = member(c, &obj, &prop, x);
        break;
    }
    case N_SLICE:
        v = slice(c, sc, x);
        break;
    case N_CALL:
        v = call(c, sc, x);
        break;
    case N_FILTER: {
        value operand = eval(c, sc, x->a);
        args a = eval_args(c, sc, &x->args);
        v = apply_filter(c, x->s, x->n, operand, &a, x);
        break;
    }
    case N_TEST: {
        value operand = eval(c, sc, x->a);
        args a = eval_args(c, sc, &x->args);
        v = vbool(run_test(c, x->s, x->n, &operand, &a, x) != x->flag);
        break;
    }
    case N_NEG:
    case N_POS: {
        value a = eval(c, sc, x->a);
        if (a.t == V_FLOAT)
            v = vfloat(x->kind == N_NEG ? -a.f : a.f);
        else if (a.t == V_INT && a.i == INT64_MIN && x->kind == N_NEG)
            rt_fail(c, x, "integer overflow");
        else if (a.t == V_INT || a.t == V_BOOL)
            v = vint((x->kind == N_NEG ? -1 : 1) * (a.t == V_INT ? a.i : a.b));
        else
            rt_fail(c, x, "unary %c applied to %s", x->kind == N_NEG ? '-' : '+', type_name(&a));
        break;
    }
    case N_NOT: {
        value a = eval(c, sc, x->a);
        v = vbool(!truthy(&a));
        break;
    }
    case N_AND:
    case N_OR: {
        value a = eval(c, sc, x->a);
        v = truthy(&a) == (x->kind == N_OR) ? a : eval(c, sc, x->b);
        break;
    }
    case N_BIN:
        v = binary_op(c, sc, x);
        break;
    case N_TERNARY: {
        value cond = eval(c, sc, x->a);
        v = truthy(&cond) ? eval(c, sc, x->b) : x->c ? eval(c, sc, x->c) : undef;
        break;
    }
    default:
        rt_fail(c, x, "unexpected statement in an expression");
    }
    c->depth--;
    return v;
}

// ---- statements

static void assign(ctx *c, scope *sc, const node *target, value v) {
    switch (target->kind) {
    case N_IDENT:
        scope_set(c, sc, target->s, target->n, v);
        return;
    case N_TUPLE:
        if (v.t != V_LIST)
            rt_fail(c, target, "cannot unpack %s into %zu names", type_name(&v), target->args.n);
        if (v.l->n != target->args.n)
            rt_fail(c, target, "cannot unpack %zu items into %zu names", v.l->n, target->args.n);
        for (size_t i = 0; i < target->args.n; i++) {
            if (target->args.v[i]->kind != N_IDENT)
                rt_fail(c, target->args.v[i], "can only unpack into names");
            scope_set(c, sc, target->args.v[i]->s, target->args.v[i]->n, v.l->v[i]);
        }
        return;
    case N_MEMBER: {
        value obj = eval(c, sc, target->a);
        if (obj.t != V_NS)
            rt_fail(c, target, "only a namespace() takes attribute assignment, not %s", type_name(&obj));
        if (target->b->kind != N_STR)
            rt_fail(c, target, "a namespace attribute must be a name");
        dict_set(c, obj.d, (jstr){target->b->s, NULL, target->b->n}, v);
        return;
    }
    default:
        rt_fail(c, target, "cannot assign to this expression");
    }
}

static value render_block(ctx *c, scope *sc, const node_list *body) {
    obuf b = {0};
    exec_block(c, sc, body, &b);
    return vstr(obuf_str(&b));
}

static value call_macro(ctx *c, const jfunc *f, const args *a, scope *caller_scope, const node *at) {
    step(c, at);
    enter_rt(c, at);
    const node *def = f->def;
    const node_list *params = &def->args;
    scope *ms = scope_new(c, f->kind == F_CALLER ? f->env : caller_scope);
    uint8_t *bound = arena_zalloc(&c->a, params->n + 1);
    for (size_t i = 0; i < params->n; i++) {
        const node *p = params->v[i];
        const value *given = i < a->n ? &a->pos[i] : NULL;
        for (size_t k = 0; !given && k < a->n_kw; k++)
            if (a->kw[k]->n == p->n && memcmp(a->kw[k]->s, p->s, p->n) == 0) {
                given = &a->kwv[k];
                bound[i] = 1;
            }
        scope_set(c, ms, p->s, p->n, given ? *given : undef);
        bound[i] |= given != NULL;
    }
    jlist *varargs = list_new(c, 1);
    for (size_t i = params->n; i < a->n; i++)
        list_add(c, varargs, a->pos[i]);
    jdict *kwargs = dict_new(c);
    for (size_t k = 0; k < a->n_kw; k++) {
        int is_param = 0;
        for (size_t i = 0; i < params->n && !is_param; i++)
            is_param = a->kw[k]->n == params->v[i]->n && memcmp(a->kw[k]->s, params->v[i]->s, params->v[i]->n) == 0;
        if (!is_param)
            dict_set(c, kwargs, (jstr){a->kw[k]->s, NULL, a->kw[k]->n}, a->kwv[k]);
    }
    scope_set(c, ms, "varargs", 7, vlist(varargs));
    scope_set(c, ms, "kwargs", 6, (value){.t = V_DICT, .d = kwargs});
    for (size_t i = 0; i < params->n; i++)
        if (!bound[i] && params->v[i]->kind == N_KWARG)
            scope_set(c, ms, params->v[i]->s, params->v[i]->n, eval(c, ms, params->v[i]->a));
    unsigned loops = c->loops;
    c->loops = 0; /* break and continue do not cross a macro */
    value out = render_block(c, ms, &def->body);
    c->loops = loops;
    c->depth--;
    return out;
}

static value loop_info(ctx *c, const jlist *items, size_t i) {
    jdict *d = dict_new(c);
    size_t n = items->n;
    dict_set(c, d, lit("index"), vint((int64_t)i + 1));
    dict_set(c, d, lit("index0"), vint((int64_t)i));
    dict_set(c, d, lit("revindex"), vint((int64_t)(n - i)));
    dict_set(c, d, lit("revindex0"), vint((int64_t)(n - i - 1)));
    dict_set(c, d, lit("first"), vbool(i == 0));
    dict_set(c, d, lit("last"), vbool(i + 1 == n));
    dict_set(c, d, lit("length"), vint((int64_t)n));
    dict_set(c, d, lit("previtem"), i > 0 ? items->v[i - 1] : undef);
    dict_set(c, d, lit("nextitem"), i + 1 < n ? items->v[i + 1] : undef);
    return (value){.t = V_DICT, .d = d};
}

static void exec_for(ctx *c, scope *sc, const node *x, obuf *out) {
    scope *ls = scope_new(c, sc);
    value iterable = eval(c, ls, x->b);
    jlist *items = iterate(c, &iterable, x->b);
    if (x->c) { /* for ... if cond: the items the condition keeps, before loop.* counts them */
        jlist *kept = list_new(c, items->n);
        for (size_t i = 0; i < items->n; i++) {
            step(c, x);
            scope *test = scope_new(c, ls);
            assign(c, test, x->a, items->v[i]);
            value keep = eval(c, test, x->c);
            if (truthy(&keep))
                list_add(c, kept, items->v[i]);
        }
        items = kept;
    }
    c->loops++;
    for (size_t i = 0; i < items->n; i++) {
        step(c, x);
        scope_set(c, ls, "loop", 4, loop_info(c, items, i));
        assign(c, ls, x->a, items->v[i]);
        exec_block(c, ls, &x->body, out);
        int stop = c->flow == FLOW_BREAK;
        c->flow = FLOW_NONE;
        if (stop)
            break;
    }
    c->loops--;
    if (items->n == 0)
        exec_block(c, ls, &x->alt, out);
}

static void exec_stmt(ctx *c, scope *sc, const node *x, obuf *out) {
    enter_rt(c, x);
    uint32_t outer = c->err->at;
    c->err->at = x->pos;
    switch (x->kind) {
    case N_TEXT:
        obuf_raw(c, out, x->s, x->n);
        break;
    case N_OUTPUT: {
        int chain = x->a->kind == N_BIN && (x->a->op == OP_ADD || x->a->op == OP_CONCAT);
        value v = chain ? binary_chain(c, sc, x->a, out) : eval(c, sc, x->a);
        print_value(c, out, &v, x);
        break;
    }
    case N_IF: {
        value test = eval(c, sc, x->a);
        exec_block(c, sc, truthy(&test) ? &x->body : &x->alt, out);
        break;
    }
    case N_FOR:
        exec_for(c, sc, x, out);
        break;
    case N_SET:
        assign(c, sc, x->a, x->b ? eval(c, sc, x->b) : render_block(c, sc, &x->body));
        break;
    case N_MACRO: {
        jfunc *f = arena_zalloc(&c->a, sizeof *f);
        f->kind = F_MACRO;
        f->def = x;
        scope_set(c, sc, x->s, x->n, (value){.t = V_FUNC, .fn = f});
        break;
    }
    case N_CALL_BLOCK: {
        jfunc *caller = arena_zalloc(&c->a, sizeof *caller);
        caller->kind = F_CALLER;
        caller->def = x;
        caller->env = sc;
        args a = eval_args(c, sc, &x->a->args);
        value fn = eval(c, sc, x->a->a);
        if (fn.t != V_FUNC || fn.fn->kind != F_MACRO)
            rt_fail(c, x, "{%% call %%} needs a macro, not %s", type_name(&fn));
        scope *with_caller = scope_new(c, sc);
        scope_set(c, with_caller, "caller", 6, (value){.t = V_FUNC, .fn = caller});
        value v = call_macro(c, fn.fn, &a, with_caller, x);
        print_value(c, out, &v, x);
        break;
    }
    case N_FILTER_BLOCK: {
        value body = render_block(c, sc, &x->body);
        args a = eval_args(c, sc, &x->a->args);
        value v = apply_filter(c, x->a->s, x->a->n, body, &a, x->a);
        print_value(c, out, &v, x);
        break;
    }
    case N_BREAK:
    case N_CONTINUE:
        if (!c->loops)
            rt_fail(c, x, "{%% %s %%} outside a loop", x->kind == N_BREAK ? "break" : "continue");
        c->flow = x->kind == N_BREAK ? FLOW_BREAK : FLOW_CONTINUE;
        break;
    default: { /* an expression statement cannot occur: the parser only makes {{ }} outputs */
        value v = eval(c, sc, x);
        print_value(c, out, &v, x);
    }
    }
    c->err->at = outer;
    c->depth--;
}

static void exec_block(ctx *c, scope *sc, const node_list *body, obuf *out) {
    for (size_t i = 0; i < body->n && c->flow == FLOW_NONE; i++)
        exec_stmt(c, sc, body->v[i], out);
}

// ---- input: JSON to values, as JSON.parse and convertToRuntimeValues would give them

/* an array index in JavaScript's sense ("0", "17", not "01"): such keys come first, in order */
static int index_key(const char *k, uint32_t *out) {
    if (!*k || (k[0] == '0' && k[1]) || strlen(k) > 10)
        return 0;
    uint64_t v = 0;
    for (; *k; k++) {
        if (!is_digit(*k))
            return 0;
        v = v * 10 + (uint64_t)(*k - '0');
    }
    if (v >= 0xFFFFFFFFu)
        return 0;
    *out = (uint32_t)v;
    return 1;
}

/* stable merge sort of n entries by their index keys */
static void sort_index_keys(ctx *c, const cJSON **e, uint32_t *k, size_t n) {
    const cJSON **te = arena_alloc(&c->a, mul_size(&c->a, n + 1, sizeof *te));
    uint32_t *tk = arena_alloc(&c->a, mul_size(&c->a, n + 1, sizeof *tk));
    for (size_t width = 1; width < n; width *= 2) {
        for (size_t lo = 0; lo < n; lo += 2 * width) {
            size_t mid = lo + width < n ? lo + width : n, hi = lo + 2 * width < n ? lo + 2 * width : n;
            size_t i = lo, m = mid, o = lo;
            while (i < mid || m < hi) {
                int left = m >= hi || (i < mid && k[i] <= k[m]);
                te[o] = left ? e[i] : e[m];
                tk[o++] = left ? k[i++] : k[m++];
            }
        }
        memcpy(e, te, n * sizeof *e);
        memcpy(k, tk, n * sizeof *k);
    }
}

static jstr json_str(ctx *c, const char *s, int data) {
    size_t n = strlen(s);
    uint8_t *m = NULL;
    if (data && n) {
        m = arena_alloc(&c->a, n);
        memset(m, 1, n);
    }
    return (jstr){s, m, n};
}

static value from_json(ctx *c, const cJSON *j, int data, unsigned depth) {
    if (depth > c->lim->max_depth)
        fail(c->err, RLX_E_RANGE, UINT32_MAX, "the input nests deeper than %u levels", c->lim->max_depth);
    if (cJSON_IsNull(j) || !j)
        return none;
    if (cJSON_IsBool(j))
        return vbool(cJSON_IsTrue(j));
    if (cJSON_IsNumber(j)) {
        double d = j->valuedouble;
        return d == floor(d) && fabs(d) < 9.2e18 ? vint((int64_t)d) : vfloat(d);
    }
    if (cJSON_IsString(j))
        return vstr(json_str(c, j->valuestring ? j->valuestring : "", data));
    if (cJSON_IsArray(j)) {
        jlist *l = list_new(c, 4);
        for (const cJSON *e = j->child; e; e = e->next)
            list_add(c, l, from_json(c, e, data, depth + 1));
        return vlist(l);
    }
    if (!cJSON_IsObject(j))
        fail(c->err, RLX_E_INVALID, UINT32_MAX, "the input holds a JSON value of an unknown type");
    /* JSON.parse's order: array-index keys ascending, then the others as written; a key given
     * twice keeps its first place and its last value */
    size_t n = 0, n_index = 0;
    for (const cJSON *e = j->child; e; e = e->next)
        n++;
    const cJSON **index = arena_alloc(&c->a, mul_size(&c->a, n + 1, sizeof *index));
    uint32_t *keys = arena_alloc(&c->a, mul_size(&c->a, n + 1, sizeof *keys));
    for (const cJSON *e = j->child; e; e = e->next) {
        uint32_t k;
        if (index_key(e->string ? e->string : "", &k)) {
            index[n_index] = e;
            keys[n_index++] = k;
        }
    }
    sort_index_keys(c, index, keys, n_index);
    jdict *d = dict_new(c);
    for (size_t i = 0; i < n_index; i++)
        dict_set(c, d, json_str(c, index[i]->string, data), from_json(c, index[i], data, depth + 1));
    for (const cJSON *e = j->child; e; e = e->next) {
        uint32_t k;
        if (!index_key(e->string ? e->string : "", &k))
            dict_set(c, d, json_str(c, e->string ? e->string : "", data), from_json(c, e, data, depth + 1));
    }
    return (value){.t = V_DICT, .d = d};
}

// ---- render

static void set_global_fn(ctx *c, scope *s, const char *name, fn_kind kind) {
    jfunc *f = arena_zalloc(&c->a, sizeof *f);
    f->kind = kind;
    scope_set(c, s, name, strlen(name), (value){.t = V_FUNC, .fn = f});
}

static void set_vars(ctx *c, scope *s, const cJSON *vars, int data) {
    if (!vars)
        return;
    if (!cJSON_IsObject(vars))
        fail(c->err, RLX_E_INVALID, UINT32_MAX, "the template variables must be a JSON object");
    for (const cJSON *e = vars->child; e; e = e->next)
        if (e->string)
            scope_set(c, s, e->string, strlen(e->string), from_json(c, e, data, 0));
}

rlx_status rlx__jinja_render(const rlx__jinja *t, const cJSON *data, const cJSON *trusted,
                             const rlx__jinja_limits *limits, char **out, size_t *out_len, rlx_text_span **markup,
                             size_t *n_markup) {
    if (out)
        *out = NULL;
    if (out_len)
        *out_len = 0;
    if (markup)
        *markup = NULL;
    if (n_markup)
        *n_markup = 0;
    if (!t || !out || (!markup) != (!n_markup))
        return rlx_error(RLX_E_INVALID, "rlx__jinja_render: NULL argument");
    rlx__jinja_limits dflt = rlx__jinja_limits_default();
    const rlx__jinja_limits *lim = limits ? limits : &dflt;
    /* everything the error path frees hangs off these two, which setjmp does not see change */
    jerr *err = malloc(sizeof *err);
    ctx *c = calloc(1, sizeof *c);
    obuf *o = calloc(1, sizeof *o);
    if (!err || !c || !o) {
        free(err);
        free(c);
        free(o);
        return rlx_error(RLX_E_NOMEM, "out of memory");
    }
    err->src = t->src;
    err->src_len = t->src_len;
    err->at = UINT32_MAX;
    *c = (ctx){.a = {.limit = lim->max_memory, .err = err}, .err = err, .lim = lim, .out = o};
    o->heap = 1;
    if (setjmp(err->jb)) {
        rlx_status st = rlx_error(err->st, "%s", err->msg);
        free(c->out->s);
        free(c->out->m);
        free(c->out);
        arena_free(&c->a);
        free(c);
        free(err);
        return st;
    }
    scope *root = scope_new(c, NULL);
    scope_set(c, root, "true", 4, vbool(1));
    scope_set(c, root, "false", 5, vbool(0));
    scope_set(c, root, "none", 4, none);
    scope_set(c, root, "True", 4, vbool(1));
    scope_set(c, root, "False", 5, vbool(0));
    scope_set(c, root, "None", 4, none);
    set_global_fn(c, root, "namespace", F_NAMESPACE);
    set_global_fn(c, root, "raise_exception", F_RAISE);
    set_global_fn(c, root, "range", F_RANGE);
    set_global_fn(c, root, "strftime_now", F_STRFTIME);
    set_vars(c, root, data, 1);
    set_vars(c, root, trusted, 0);
    exec_block(c, scope_new(c, root), &t->body, o);
    obuf_reserve(c, o, 0); /* a buffer even for an empty rendering */
    o->s[o->n] = '\0';
    if (markup) {
        size_t n_spans = 0;
        for (size_t i = 0; i < o->n; i++)
            if ((!o->m || !o->m[i]) && (i == 0 || (o->m && o->m[i - 1])))
                n_spans++;
        rlx_text_span *spans = n_spans ? malloc(n_spans * sizeof *spans) : NULL;
        if (n_spans && !spans)
            fail(err, RLX_E_NOMEM, UINT32_MAX, "out of memory");
        size_t k = 0;
        for (size_t i = 0; i < o->n;) {
            if (o->m && o->m[i]) {
                i++;
                continue;
            }
            size_t start = i;
            while (i < o->n && (!o->m || !o->m[i]))
                i++;
            spans[k++] = (rlx_text_span){start, i - start};
        }
        *markup = spans;
        *n_markup = n_spans;
    }
    *out = o->s;
    if (out_len)
        *out_len = o->n;
    free(o->m);
    free(o);
    arena_free(&c->a);
    free(c);
    free(err);
    return RLX_OK;
}
