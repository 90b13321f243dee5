/* The GBNF compiler and the token matcher.
 *
 * Languages: random regular grammars against Python's re (is the text a sentence) and the regex
 * module's partial matching (can it still become one), and two recursive languages against a
 * counter and regex's recursive patterns (make_gbnf_cases.py writes the cases); every text is
 * fed whole and byte by byte. Tokens: on the shipped Brown tokenizer, and on Qwen3's and a
 * SentencePiece vocabulary when given, the mask at many states equals a brute force over every
 * id (a copy of the matcher fed the token's bytes, as the test decodes them itself), allows()
 * and accept() agree with it, non-special added tokens match their text, special ones nothing,
 * end ids exactly when the text is complete, single-byte tokens of a UTF-8 lead byte only where
 * a character can start with it. Errors name line and column; bounds give errors, not hangs;
 * every allocation failing in turn gives RLX_E_NOMEM and leaks nothing.
 *
 * Usage: test_grammar [CASES [QWEN3_DIR [SENTENCEPIECE_DIR]]] (with the directories, only the
 * tests on those vocabularies run); RLX_GRAMMAR_BENCH=1 prints the mask's time at each state. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "rlx/private.h"
#include "testutil.h"

#define BROWN RLX_SOURCE_DIR "/share/models/brown/draft"

static const char *cases_path, *qwen_dir, *sp_dir;

static const char json_gbnf[] =
    "# any JSON value\n"
    "root ::= ws value ws\n"
    "value ::= object | array | string | number | \"true\" | \"false\" | \"null\"\n"
    "object ::= \"{\" ws ( member ( ws \",\" ws member )* )? ws \"}\"\n"
    "member ::= string ws \":\" ws value\n"
    "array ::= \"[\" ws ( value ( ws \",\" ws value )* )? ws \"]\"\n"
    "string ::= \"\\\"\" ( [^\"\\\\\\x00-\\x1F] | \"\\\\\" ( [\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4} ) )* \"\\\"\"\n"
    "number ::= \"-\"? ( \"0\" | [1-9] [0-9]* ) ( \".\" [0-9]+ )? ( [eE] [-+]? [0-9]+ )?\n"
    "ws ::= [ \\t\\n\\r]*\n";

static rlx_grammar *parse_ok(const char *gbnf) {
    rlx_grammar *g = NULL;
    if (rlx_grammar_parse(gbnf, strlen(gbnf), NULL, &g) != RLX_OK)
        fail_msg("cannot parse:\n%s\n%s", gbnf, rlx_last_error());
    return g;
}

static int hex_decode(const char *h, char *out, size_t cap, size_t *n) {
    size_t len = strlen(h), k = 0;
    while (len && (h[len - 1] == '\n' || h[len - 1] == '\r'))
        len--;
    if (len % 2 || len / 2 > cap)
        return 0;
    for (size_t i = 0; i < len; i += 2) {
        unsigned v;
        if (sscanf(h + i, "%2x", &v) != 1)
            return 0;
        out[k++] = (char)v;
    }
    *n = k;
    return 1;
}

// ---- languages against Python

static void test_languages_against_python(void **state) {
    (void)state;
    FILE *f = fopen(cases_path, "r");
    assert_non_null_msg(f, cases_path);
    rlx_tokenizer *tok;
    rlx_grammar_vocab *v;
    assert_ok(rlx_tokenizer_open(BROWN, &tok));
    assert_ok(rlx_grammar_vocab_create(tok, &v));
    static char line[1 << 16], text[1 << 15], gbnf[1 << 15];
    rlx_grammar *g = NULL;
    rlx_grammar_matcher *m = NULL;
    size_t n_grammars = 0, n_cases = 0, bad = 0, glen = 0;
    while (fgets(line, sizeof line, f)) {
        if (line[0] == 'G') {
            char root[64], hex[sizeof line];
            assert_int_equal(sscanf(line, "G %63s %s", root, hex), 2);
            assert_true(hex_decode(hex, gbnf, sizeof gbnf - 1, &glen));
            gbnf[glen] = 0;
            rlx_grammar_matcher_destroy(m);
            rlx_grammar_destroy(g);
            if (rlx_grammar_parse(gbnf, glen, root, &g) != RLX_OK)
                fail_msg("cannot parse:\n%s\n%s", gbnf, rlx_last_error());
            assert_ok(rlx_grammar_matcher_create(g, v, &m));
            n_grammars++;
            continue;
        }
        int full, prefix;
        char hex[sizeof line];
        hex[0] = 0;
        assert_true(sscanf(line, "C %d %d %s", &full, &prefix, hex) >= 2);
        size_t n = 0;
        assert_true(hex_decode(hex, text, sizeof text, &n));
        n_cases++;
        /* whole */
        rlx_grammar_matcher_reset(m);
        const int ok = rlx_grammar_matcher_accept_bytes(m, text, n) == RLX_OK;
        const int end = ok && rlx_grammar_matcher_can_end(m);
        /* byte by byte, then a copy taken halfway finishes the same */
        rlx_grammar_matcher_reset(m);
        int ok2 = 1;
        rlx_grammar_matcher *half = NULL;
        for (size_t i = 0; i < n && ok2; i++) {
            if (i == n / 2)
                assert_ok(rlx_grammar_matcher_clone(m, &half));
            ok2 = rlx_grammar_matcher_accept_bytes(m, text + i, 1) == RLX_OK;
        }
        const int end2 = ok2 && rlx_grammar_matcher_can_end(m);
        int ok3 = ok2, end3 = end2;
        if (half) {
            ok3 = rlx_grammar_matcher_accept_bytes(half, text + n / 2, n - n / 2) == RLX_OK;
            end3 = ok3 && rlx_grammar_matcher_can_end(half);
            rlx_grammar_matcher_destroy(half);
        }
        if (ok != prefix || end != full || ok2 != ok || end2 != end || ok3 != ok || end3 != end) {
            if (bad++ < 12)
                fprintf(stderr,
                        "grammar:\n%stext \"%.*s\" (hex %s): python prefix %d sentence %d; matcher whole %d/%d, "
                        "bytewise %d/%d, from a copy %d/%d\n",
                        gbnf, (int)n, text, hex, prefix, full, ok, end, ok2, end2, ok3, end3);
        }
    }
    fclose(f);
    rlx_grammar_matcher_destroy(m);
    rlx_grammar_destroy(g);
    rlx_grammar_vocab_destroy(v);
    rlx_tokenizer_close(tok);
    fprintf(stderr, "%zu grammars, %zu texts\n", n_grammars, n_cases);
    assert_true(n_grammars > 100 && n_cases > 2000);
    if (bad)
        fail_msg("%zu of %zu texts disagree with Python", bad, n_cases);
}

// ---- tokens against brute force

/* Every id's bytes in the middle of a text, as the test finds them: the tokenizer's decode of
 * [a, id] less its decode of [a] (so no start-of-text rule applies), or, where that is not
 * UTF-8 (a byte token), the vocabulary string read the way the tokenizer's kind spells bytes:
 * GPT-2's byte alphabet, or SentencePiece's <0xNN>. */
typedef struct oracle {
    rlx_tokenizer *tok;
    rlx_grammar_vocab *v;
    int32_t n;
    char **bytes;
    size_t *len;
    int *special;
} oracle;

static int byte_level_unmap(const char *s, char *out, size_t *n) {
    static int16_t cp_to_byte[324];
    static int ready;
    if (!ready) {
        int k = 0;
        for (int b = 0; b < 256; b++) {
            const int printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
            cp_to_byte[printable ? b : 256 + k++] = (int16_t)b;
        }
        ready = 1;
    }
    size_t k = 0;
    const uint8_t *u = (const uint8_t *)s;
    while (*u) {
        uint32_t cp;
        if (u[0] < 0x80) {
            cp = *u++;
        } else if ((u[0] & 0xE0) == 0xC0) {
            cp = (uint32_t)(u[0] & 0x1F) << 6 | (u[1] & 0x3F);
            u += 2;
        } else {
            return 0;
        }
        if (cp >= 324)
            return 0;
        out[k++] = (char)cp_to_byte[cp];
    }
    *n = k;
    return 1;
}

static void oracle_init(oracle *o, const char *dir, int byte_level) {
    assert_ok(rlx_tokenizer_open(dir, &o->tok));
    assert_ok(rlx_grammar_vocab_create(o->tok, &o->v));
    o->n = rlx_tokenizer_vocab_size(o->tok);
    o->bytes = calloc((size_t)o->n, sizeof *o->bytes);
    o->len = calloc((size_t)o->n, sizeof *o->len);
    o->special = calloc((size_t)o->n, sizeof *o->special);
    const int32_t a = rlx_tokenizer_token_id(o->tok, "a");
    assert_true(a >= 0);
    char *pre;
    size_t pre_len;
    assert_ok(rlx_tokenizer_decode(o->tok, &a, 1, 0, &pre, &pre_len));
    for (int32_t id = 0; id < o->n; id++) {
        const char *str = rlx_tokenizer_token_text(o->tok, id);
        if (!str)
            continue;
        o->special[id] = rlx_tokenizer_is_special(o->tok, id);
        const int32_t ids[2] = {a, id};
        char *text;
        size_t len;
        assert_ok(rlx_tokenizer_decode(o->tok, ids, 2, 0, &text, &len));
        assert_true(len >= pre_len && memcmp(text, pre, pre_len) == 0);
        o->bytes[id] = malloc(len - pre_len + strlen(str) + 1);
        if (!strstr(text + pre_len, "\xEF\xBF\xBD") || strstr(str, "\xEF\xBF\xBD")) {
            memcpy(o->bytes[id], text + pre_len, len - pre_len);
            o->len[id] = len - pre_len;
        } else if (byte_level) {
            assert_true(byte_level_unmap(str, o->bytes[id], &o->len[id]));
        } else {
            unsigned b;
            assert_int_equal(sscanf(str, "<0x%2X>", &b), 1);
            o->bytes[id][0] = (char)b;
            o->len[id] = 1;
        }
        free(text);
    }
    free(pre);
}

static void oracle_deinit(oracle *o) {
    for (int32_t i = 0; i < o->n; i++)
        free(o->bytes[i]);
    free(o->bytes);
    free(o->len);
    free(o->special);
    rlx_grammar_vocab_destroy(o->v);
    rlx_tokenizer_close(o->tok);
}

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

/* The mask at m against the brute force; returns the number of ids allowed. */
static int64_t check_state(rlx_grammar_matcher *m, const oracle *o, const int32_t *ends, size_t n_end,
                           const char *label) {
    const int64_t n = o->n + 3; /* ids past the tokenizer's: only end ids */
    float *logits = calloc((size_t)n, sizeof *logits);
    const double t0 = now_ms();
    const int64_t count = rlx_grammar_matcher_mask(m, logits, n, ends, n_end);
    const double ms = now_ms() - t0;
    if (getenv("RLX_GRAMMAR_BENCH")) {
        const int reps = 20;
        const double t1 = now_ms();
        for (int r = 0; r < reps; r++)
            rlx_grammar_matcher_mask(m, logits, n, ends, n_end);
        fprintf(stderr, "  mask %-40s %7lld allowed: first %.2f ms, then %.3f ms a call\n", label, (long long)count, ms,
                (now_ms() - t1) / reps);
    }
    assert_true(count >= 0);
    const int can_end = rlx_grammar_matcher_can_end(m);
    rlx_grammar_matcher *work;
    assert_ok(rlx_grammar_matcher_clone(m, &work));
    int64_t expected_count = 0, bad = 0, allowed_seen = 0;
    for (int64_t id = 0; id < n; id++) {
        int is_end = 0;
        for (size_t k = 0; k < n_end; k++)
            is_end |= ends[k] == id;
        int expect;
        if (is_end) {
            expect = can_end;
        } else if (id >= o->n || !o->bytes[id] || o->special[id] || o->len[id] == 0) {
            expect = 0;
        } else {
            expect = rlx_grammar_matcher_accept_bytes(work, o->bytes[id], o->len[id]) == RLX_OK;
            if (expect) {
                rlx_grammar_matcher_destroy(work);
                assert_ok(rlx_grammar_matcher_clone(m, &work));
            }
        }
        if (!is_end && id < o->n && (!expect || allowed_seen++ % 5 == 0)) {
            /* accept() agrees (every refusal, every fifth success) */
            const int acc = rlx_grammar_matcher_accept(work, (int32_t)id) == RLX_OK;
            if (acc) {
                rlx_grammar_matcher_destroy(work);
                assert_ok(rlx_grammar_matcher_clone(m, &work));
            }
            if (acc != expect && bad++ < 10)
                fprintf(stderr, "%s: token %lld: accept %d, brute force %d\n", label, (long long)id, acc, expect);
        }
        expected_count += expect;
        const int masked = logits[id] == 0.0f;
        const int allows = rlx_grammar_matcher_allows(m, (int32_t)id, ends, n_end);
        if ((masked != expect || allows != expect) && bad++ < 10)
            fprintf(stderr, "%s: token %lld %s: mask %d, allows %d, brute force %d\n", label, (long long)id,
                    id < o->n ? rlx_tokenizer_token_text(o->tok, (int32_t)id) : "(past the vocabulary)", masked, allows,
                    expect);
    }
    rlx_grammar_matcher_destroy(work);
    free(logits);
    if (bad)
        fail_msg("%s: %lld ids disagree", label, (long long)bad);
    assert_int_equal(count, expected_count);
    return count;
}

typedef struct token_case {
    const char *gbnf; /* NULL: the JSON grammar */
    const char *prefix;
    int64_t min_allowed, max_allowed; /* on Qwen3, what the count must lie in (a check of the case) */
} token_case;

static const token_case token_cases[] = {
    {NULL, "", 100, 5000},
    {NULL, "{", 2, 2000},
    {NULL, "{\"ke", 1000, 200000},
    {NULL, "{\"key\"", 2, 2000},
    {NULL, "{\"key\": ", 100, 5000},
    {NULL, "{\"key\": \"hel", 1000, 200000},
    {NULL, "{\"a\": [1, 2", 2, 5000},
    {NULL, "[tr", 1, 100},
    {NULL, "-0.5e", 1, 5000},
    {NULL, "\"\\u00", 1, 5000},
    {NULL, "\"\xE4\xB8", 1, 5000}, /* inside a character */
    {NULL, "{\"a\": 1} ", 1, 2000},
    {"root ::= [^\\n]*\n", "", 1000, 200000},
    {"root ::= [^\\n]*\n", "ab\xE4", 1, 5000},
    {"root ::= \"<tool_call>\" [^<]* \"</tool_call>\"\n", "", 1, 20},
    {"root ::= \"<tool_call>\" [^<]* \"</tool_call>\"\n", "<tool_call>{\"a\": 1}", 1000, 200000},
    {"root ::= \"<tool_call>\" [^<]* \"</tool_call>\"\n", "<tool_call>x</tool_call>", 2, 2}, /* the end ids */
    {"root ::= [^\\x00-\\x7F]+\n", "", 1000, 200000},
    {"root ::= [^\\x00-\\x7F]+\n", "\xE4", 1, 5000},
    {"root ::= [^\\x00-\\x7F]+\n", "\xF0\x9F", 1, 5000},
    {"root ::= [\\u4E00-\\u9FFF]{2} \"!\"\n", "", 1, 100000},
    /* a parse that remembers every letter: a state per trie node, the cache's worst case */
    {"root ::= [a-z ] root [a-z ] | [a-z ]?\n", "", 1000, 200000},
};

static void check_vocabulary(const char *dir, int byte_level, size_t n_cases) {
    oracle o = {0};
    oracle_init(&o, dir, byte_level);
    const int32_t end = rlx_tokenizer_eos_id(o.tok) >= 0 ? rlx_tokenizer_eos_id(o.tok) : 0;
    int32_t ends[2] = {end, o.n + 1};
    rlx_grammar *json = parse_ok(json_gbnf);
    for (size_t i = 0; i < n_cases; i++) {
        const token_case *c = &token_cases[i];
        rlx_grammar *g = c->gbnf ? parse_ok(c->gbnf) : json;
        rlx_grammar_matcher *m;
        assert_ok(rlx_grammar_matcher_create(g, o.v, &m));
        assert_ok(rlx_grammar_matcher_accept_bytes(m, c->prefix, strlen(c->prefix)));
        char label[96];
        snprintf(label, sizeof label, "%.24s.. after \"%s\"", c->gbnf ? c->gbnf : "json", c->prefix);
        for (char *p = label; *p; p++)
            *p = *p == '\n' ? ' ' : *p;
        const int64_t count = check_state(m, &o, ends, 2, label);
        if (o.n > 150000 && (count < c->min_allowed || count > c->max_allowed))
            fail_msg("%s: %lld allowed, expected %lld..%lld", label, (long long)count, (long long)c->min_allowed,
                     (long long)c->max_allowed);
        rlx_grammar_matcher_destroy(m);
        if (c->gbnf)
            rlx_grammar_destroy(g);
    }
    rlx_grammar_destroy(json);
    oracle_deinit(&o);
}

static void test_tokens_brown(void **state) {
    (void)state;
    check_vocabulary(BROWN, 1, sizeof token_cases / sizeof *token_cases);
}

static void test_tokens_qwen3(void **state) {
    (void)state;
    if (!qwen_dir)
        skip();
    check_vocabulary(qwen_dir, 1, sizeof token_cases / sizeof *token_cases);

    /* added tokens: <tool_call> is text, <|im_end|> is special */
    rlx_tokenizer *tok;
    rlx_grammar_vocab *v;
    assert_ok(rlx_tokenizer_open(qwen_dir, &tok));
    assert_ok(rlx_grammar_vocab_create(tok, &v));
    const int32_t call = rlx_tokenizer_token_id(tok, "<tool_call>"), im_end = rlx_tokenizer_token_id(tok, "<|im_end|>");
    assert_true(call > 151000 && im_end > 151000 && !rlx_tokenizer_is_special(tok, call));
    rlx_grammar *g = parse_ok("root ::= \"<tool_call>\" [^<]* \"</tool_call>\"\n");
    rlx_grammar_matcher *m;
    assert_ok(rlx_grammar_matcher_create(g, v, &m));
    assert_int_equal(rlx_grammar_matcher_allows(m, call, &im_end, 1), 1);
    assert_int_equal(rlx_grammar_matcher_allows(m, im_end, &im_end, 1), 0);
    assert_int_equal(rlx_grammar_matcher_allows(m, im_end, NULL, 0), 0);
    assert_int_equal(rlx_grammar_matcher_accept(m, im_end), RLX_E_INVALID);
    assert_error_mentions("special");
    assert_ok(rlx_grammar_matcher_accept(m, call));
    assert_ok(rlx_grammar_matcher_accept_bytes(m, "{}</tool_call>", 14));
    assert_true(rlx_grammar_matcher_is_done(m));
    assert_int_equal(rlx_grammar_matcher_allows(m, im_end, &im_end, 1), 1);
    /* the byte tokens of a lead byte: allowed by a class of non-ASCII characters, then only a
     * continuation byte may follow */
    rlx_grammar_matcher_destroy(m);
    rlx_grammar_destroy(g);
    g = parse_ok("root ::= [\\u4E00-\\u9FFF]+\n");
    assert_ok(rlx_grammar_matcher_create(g, v, &m));
    const int32_t e4 = rlx_tokenizer_token_id(tok, "\xC3\xA4"), /* byte 0xE4 in GPT-2's alphabet */
        c3 = rlx_tokenizer_token_id(tok, "\xC3\x83"), a = rlx_tokenizer_token_id(tok, "a");
    assert_true(e4 >= 0 && c3 >= 0);
    assert_int_equal(rlx_grammar_matcher_allows(m, e4, NULL, 0), 1);
    assert_int_equal(rlx_grammar_matcher_allows(m, c3, NULL, 0), 0); /* U+00C0..U+00FF are not CJK */
    assert_ok(rlx_grammar_matcher_accept(m, e4));
    assert_int_equal(rlx_grammar_matcher_allows(m, a, NULL, 0), 0);
    assert_int_equal(rlx_grammar_matcher_can_end(m), 0);
    assert_int_equal(rlx_grammar_matcher_accept(m, e4), RLX_E_INVALID);
    assert_ok(rlx_grammar_matcher_accept_bytes(m, "\xB8\xAD", 2)); /* 中 */
    assert_int_equal(rlx_grammar_matcher_can_end(m), 1);
    rlx_grammar_matcher_destroy(m);
    rlx_grammar_destroy(g);
    rlx_grammar_vocab_destroy(v);
    rlx_tokenizer_close(tok);
}

static void test_tokens_sentencepiece(void **state) {
    (void)state;
    if (!sp_dir)
        skip();
    check_vocabulary(sp_dir, 0, 14);
}

// ---- the API around the mask

static void test_matcher_api(void **state) {
    (void)state;
    rlx_tokenizer *tok;
    rlx_grammar_vocab *v;
    assert_ok(rlx_tokenizer_open(BROWN, &tok));
    assert_ok(rlx_grammar_vocab_create(tok, &v));
    const int32_t n = rlx_tokenizer_vocab_size(tok);
    rlx_grammar *g = parse_ok("root ::= \"ab\" \"c\"?\n");
    rlx_grammar_matcher *m, *k;
    assert_ok(rlx_grammar_matcher_create(g, v, &m));
    assert_int_equal(rlx_grammar_matcher_can_end(m), 0);
    assert_int_equal(rlx_grammar_matcher_accept_bytes(m, "ax", 2), RLX_E_INVALID);
    assert_error_mentions("byte 1");
    assert_ok(rlx_grammar_matcher_accept_bytes(m, "a", 1)); /* unchanged by the refusal */
    assert_ok(rlx_grammar_matcher_clone(m, &k));
    assert_ok(rlx_grammar_matcher_accept_bytes(m, "b", 1));
    assert_int_equal(rlx_grammar_matcher_can_end(m), 1);
    assert_int_equal(rlx_grammar_matcher_is_done(m), 0);
    assert_int_equal(rlx_grammar_matcher_can_end(k), 0); /* the copy stayed behind */
    assert_ok(rlx_grammar_matcher_accept_bytes(m, "c", 1));
    assert_int_equal(rlx_grammar_matcher_is_done(m), 1);
    /* done: only end ids, and ids past the vocabulary only as end ids */
    float *logits = calloc((size_t)n + 10, sizeof *logits);
    const int32_t ends[2] = {3, n + 5};
    assert_int_equal(rlx_grammar_matcher_mask(m, logits, n + 10, ends, 2), 2);
    for (int32_t i = 0; i < n + 10; i++)
        assert_true(i == 3 || i == n + 5 ? logits[i] == 0.0f : isinf(logits[i]) && logits[i] < 0);
    /* nothing can come: 0, and the message says so */
    memset(logits, 0, ((size_t)n + 10) * sizeof *logits);
    assert_int_equal(rlx_grammar_matcher_mask(m, logits, n, NULL, 0), 0);
    assert_error_mentions("no token");
    rlx_grammar_matcher_reset(m);
    assert_int_equal(rlx_grammar_matcher_can_end(m), 0);
    assert_ok(rlx_grammar_matcher_accept_bytes(m, "abc", 3));
    rlx_grammar_matcher_destroy(k);
    rlx_grammar_matcher_destroy(m);
    rlx_grammar_destroy(g);
    /* the empty text as the only sentence */
    g = parse_ok("root ::= \"\"\n");
    assert_ok(rlx_grammar_matcher_create(g, v, &m));
    assert_true(rlx_grammar_matcher_is_done(m));
    rlx_grammar_matcher_destroy(m);
    rlx_grammar_destroy(g);
    /* NULL handling */
    rlx_grammar_destroy(NULL);
    rlx_grammar_vocab_destroy(NULL);
    rlx_grammar_matcher_destroy(NULL);
    assert_int_equal(rlx_grammar_parse("root ::= \"a\"", 12, NULL, NULL), RLX_E_INVALID);
    assert_int_equal(rlx_grammar_matcher_create(NULL, v, &m), RLX_E_INVALID);
    assert_null(m);
    rlx_grammar_vocab_destroy(v);
    assert_int_equal(rlx_grammar_vocab_create(NULL, &v), RLX_E_INVALID);
    assert_null(v);
    assert_int_equal(rlx_grammar_matcher_allows(NULL, 1, NULL, 0), 0);
    free(logits);
    rlx_tokenizer_close(tok);
}

// ---- errors and bounds

typedef struct error_case {
    const char *gbnf;
    const char *root;
    const char *mentions[3];
} error_case;

static const error_case error_cases[] = {
    {"", NULL, {"line 1 column 1", "empty"}},
    {"  # only a comment\n\n", NULL, {"line 3 column 1", "empty"}},
    {"root ::= \"a\"\nroot ::= \"b\"\n", NULL, {"line 2 column 1", "already defined at line 1 column 1"}},
    {"root ::= \"abc\n", NULL, {"line 1 column 10", "unterminated string"}},
    {"root ::= [abc\n", NULL, {"line 1 column 10", "unterminated character class"}},
    {"root ::= (\"a\" | \"b\"\n", NULL, {"line 1 column 10", "unclosed '('"}},
    {"root ::= \"a\")\n", NULL, {"line 1 column 13", "')'"}},
    {"root ::= \"a\" x\nx ::= y\n", NULL, {"line 2 column 7", "undefined rule 'y'"}},
    {"start ::= \"a\"\n", NULL, {"no rule 'root'"}},
    {"root ::= \"a\"\n", "other", {"no rule 'other'"}},
    {"root ::= [z-a]\n", NULL, {"line 1 column 11", "reversed"}},
    {"root ::= \"\\q\"\n", NULL, {"line 1 column 11", "unknown escape"}},
    {"root ::= \"\\x4\"\n", NULL, {"line 1 column 11", "hexadecimal"}},
    {"root ::= \"\\uD800\"\n", NULL, {"line 1 column 11", "not a Unicode scalar value"}},
    {"root ::= \"\\U00110000\"\n", NULL, {"not a Unicode scalar value"}},
    {"root ::= \"a\"\n\xC3\x28 ::= \"b\"\n", NULL, {"line 2 column 1", "UTF-8"}},
    {"root ::= \"a\"\xE2\x82", NULL, {"line 1 column 13", "UTF-8"}},
    {"root ::= * \"a\"\n", NULL, {"line 1 column 10", "does not follow anything"}},
    {"root ::= \"a\"{3,1}\n", NULL, {"line 1 column 13", "maximum below its minimum"}},
    {"root ::= \"a\"{2\n", NULL, {"expected '}'"}},
    {"root ::= \"a\"{x}\n", NULL, {"line 1 column 14", "expected a number"}},
    {"root ::= \"a\"{1000001}\n", NULL, {"line 1 column 14", "at most"}},
    {"root ::= \"a\"\n| \"b\"\n", NULL, {"line 2 column 1", "'|'"}},
    {"root \"a\"\n", NULL, {"line 1 column 6", "'::='"}},
    {"root ::= <think>\n", NULL, {"line 1 column 10", "token references"}},
    {"root ::= expr\nexpr ::= expr \"+\" \"1\" | \"1\"\n", NULL, {"line 2 column 1", "'expr' is left-recursive"}},
    {"root ::= a\na ::= b? c\nb ::= \"x\"\nc ::= d \"y\"\nd ::= a | \"z\"\n",
     NULL,
     {"left-recursive", "'a' -> 'c' -> 'd' -> 'a'"}},
    {"root ::= (\"a\"?)*\n",
     NULL,
     {"left-recursive", "the repetition at line 1 column 16 of 'root' is left-recursive"}},
    {"root ::= [^\\x00-\\U0010FFFF]\n", NULL, {"can never match"}},
    {"root ::= x\nx ::= \"a\" x\n", NULL, {"can never match"}},
};

static void test_errors(void **state) {
    (void)state;
    for (size_t i = 0; i < sizeof error_cases / sizeof *error_cases; i++) {
        const error_case *c = &error_cases[i];
        rlx_grammar *g = (rlx_grammar *)&g;
        rlx_error_clear();
        const rlx_status st = rlx_grammar_parse(c->gbnf, strlen(c->gbnf), c->root, &g);
        if (st != RLX_E_INVALID || g)
            fail_msg("case %zu (%s): status %d, want RLX_E_INVALID", i, c->gbnf, st);
        for (int k = 0; k < 3 && c->mentions[k]; k++)
            if (!strstr(rlx_last_error(), c->mentions[k]))
                fail_msg("case %zu (%s): the error \"%s\" does not mention \"%s\"", i, c->gbnf, rlx_last_error(),
                         c->mentions[k]);
    }
    /* grammars the language allows that look odd */
    static const char *const fine[] = {
        "root ::= \"a\" | \n",
        "root ::=\n",
        "root ::= (\n  \"a\"   # a comment\n  | \"b\"\n)\nx-1_y ::= [\\]\\[\\x2D^] [-a] [a-] [] [^] .\n",
        "root ::= \"a\" |\n  \"b\"\r\nb ::= \"\"* \"x\"{0} \"y\"{2,} \"z\"{ 1 , 3 }\n",
        "root ::= [\\x00-\\U0010FFFF] \"\\t\\r\\n\\\\\\\"\\[\\]\" \"\xE4\xB8\xAD\"\n",
    };
    for (size_t i = 0; i < sizeof fine / sizeof *fine; i++) {
        rlx_grammar *g = NULL;
        if (rlx_grammar_parse(fine[i], strlen(fine[i]), NULL, &g) != RLX_OK)
            fail_msg("%s: %s", fine[i], rlx_last_error());
        rlx_grammar_destroy(g);
    }
}

static void test_bounds(void **state) {
    (void)state;
    rlx_grammar *g = NULL;
    /* groups nested past the parser's depth */
    char *deep = malloc(4096);
    size_t n = (size_t)sprintf(deep, "root ::= ");
    for (int i = 0; i < 1000; i++)
        deep[n++] = '(';
    deep[n++] = '"';
    deep[n++] = 'a';
    deep[n++] = '"';
    for (int i = 0; i < 1000; i++)
        deep[n++] = ')';
    assert_int_equal(rlx_grammar_parse(deep, n, NULL, &g), RLX_E_INVALID);
    assert_error_mentions("nest deeper");
    free(deep);
    /* a short text asking for a huge grammar */
    char *big = malloc(1024);
    n = (size_t)sprintf(big, "root ::=");
    for (int i = 0; i < 21; i++)
        n += (size_t)sprintf(big + n, " \"a\"{100000}");
    assert_int_equal(rlx_grammar_parse(big, n, NULL, &g), RLX_E_INVALID);
    assert_error_mentions("elements once repetitions are expanded");
    n = (size_t)sprintf(big, "root ::= \"b\"{0,100000} \"b\"{0,100000} \"b\"{0,100000}\n");
    assert_int_equal(rlx_grammar_parse(big, n, NULL, &g), RLX_E_INVALID);
    assert_error_mentions("more than 262144 rules");
    free(big);
    /* but a large repetition of a group is one rule */
    const char *wide = "root ::= (\"a\"{1000}){1000}\n";
    assert_ok(rlx_grammar_parse(wide, strlen(wide), NULL, &g));
    rlx_grammar_destroy(g);
    /* more text than the parser takes is refused before it is read */
    char *huge = calloc((size_t)17 << 20, 1);
    assert_int_equal(rlx_grammar_parse(huge, (size_t)17 << 20, NULL, &g), RLX_E_INVALID);
    assert_error_mentions("bytes of text");
    free(huge);
    /* a grammar whose parses double with every character: refused past the stack bound */
    rlx_tokenizer *tok;
    rlx_grammar_vocab *v;
    assert_ok(rlx_tokenizer_open(BROWN, &tok));
    assert_ok(rlx_grammar_vocab_create(tok, &v));
    g = parse_ok("root ::= \"a\" root \"b\" | \"a\" root \"c\" | \"\"\n");
    rlx_grammar_matcher *m;
    assert_ok(rlx_grammar_matcher_create(g, v, &m));
    assert_ok(rlx_grammar_matcher_accept_bytes(m, "aaaaaaaa", 8));
    rlx_status st = RLX_OK;
    for (int i = 0; i < 10 && st == RLX_OK; i++)
        st = rlx_grammar_matcher_accept_bytes(m, "a", 1);
    assert_int_equal(st, RLX_E_INVALID);
    assert_error_mentions("too ambiguous");
    rlx_grammar_matcher_destroy(m);
    rlx_grammar_destroy(g);
    /* a long text through a repetition keeps the stacks flat and the cache bounded */
    g = parse_ok("root ::= ( [a-z]+ \" \" )*\n");
    assert_ok(rlx_grammar_matcher_create(g, v, &m));
    for (int i = 0; i < 20000; i++)
        assert_ok(rlx_grammar_matcher_accept_bytes(m, "word ", 5));
    assert_true(rlx_grammar_matcher_can_end(m));
    rlx_grammar_matcher_destroy(m);
    rlx_grammar_destroy(g);
    /* nesting as deep as the text: fine */
    g = parse_ok(json_gbnf);
    assert_ok(rlx_grammar_matcher_create(g, v, &m));
    for (int i = 0; i < 5000; i++)
        assert_ok(rlx_grammar_matcher_accept_bytes(m, "[", 1));
    for (int i = 0; i < 5000; i++)
        assert_ok(rlx_grammar_matcher_accept_bytes(m, "]", 1));
    assert_true(rlx_grammar_matcher_can_end(m));
    rlx_grammar_matcher_destroy(m);
    rlx_grammar_destroy(g);
    rlx_grammar_vocab_destroy(v);
    rlx_tokenizer_close(tok);
}

// ---- allocation failures

static rlx_tokenizer *alloc_tok;

/* Parses, builds the vocabulary, follows a text and masks; out gets what it saw. */
static rlx_status alloc_scenario(char *out, size_t size) {
    rlx_grammar *g = NULL;
    rlx_grammar_vocab *v = NULL;
    rlx_grammar_matcher *m = NULL, *k = NULL;
    const int32_t n = rlx_tokenizer_vocab_size(alloc_tok);
    float *logits = calloc((size_t)n, sizeof *logits);
    rlx_status st;
    int64_t a = 0, b = 0;
    if ((st = rlx_grammar_parse(json_gbnf, strlen(json_gbnf), NULL, &g)) != RLX_OK ||
        (st = rlx_grammar_vocab_create(alloc_tok, &v)) != RLX_OK || (st = rlx_grammar_matcher_create(g, v, &m)) ||
        (st = rlx_grammar_matcher_accept_bytes(m, "{\"key\": [1, \"x", 14)) != RLX_OK)
        goto done;
    if ((a = rlx_grammar_matcher_mask(m, logits, n, NULL, 0)) < 0) {
        st = (rlx_status)a;
        goto done;
    }
    if ((st = rlx_grammar_matcher_clone(m, &k)) != RLX_OK ||
        (st = rlx_grammar_matcher_accept_bytes(k, "\"]}", 3)) != RLX_OK)
        goto done;
    if ((b = rlx_grammar_matcher_mask(k, logits, n, NULL, 0)) < 0) {
        st = (rlx_status)b;
        goto done;
    }
    snprintf(out, size, "%lld %lld %d", (long long)a, (long long)b, rlx_grammar_matcher_can_end(k));
done:
    rlx_grammar_matcher_destroy(k);
    rlx_grammar_matcher_destroy(m);
    rlx_grammar_vocab_destroy(v);
    rlx_grammar_destroy(g);
    free(logits);
    return st;
}

static void test_allocation_failures(void **state) {
    (void)state;
    assert_ok(rlx_tokenizer_open(BROWN, &alloc_tok));
    char want[128], got[128];
    rlx_debug_fail_alloc(0, 0);
    assert_ok(alloc_scenario(want, sizeof want));
    const uint64_t total = rlx_debug_fail_alloc(0, 0);
    assert_true(total > 20);
    uint64_t bad = 0;
    for (uint64_t n = 1;; n++) {
        rlx_debug_fail_alloc(n, 0);
        got[0] = 0;
        const rlx_status st = alloc_scenario(got, sizeof got);
        const uint64_t made = rlx_debug_fail_alloc(0, 0);
        if (made < n) {
            assert_ok(st);
            break;
        }
        const char *msg = rlx_last_error();
        if (st == RLX_OK ? strcmp(got, want) != 0
                         : st != RLX_E_NOMEM || (!strstr(msg, "allocate") && !strstr(msg, "memory"))) {
            if (bad++ < 10)
                fprintf(stderr, "allocation %llu: status %d (%s), text \"%s\" (want \"%s\")\n", (unsigned long long)n,
                        st, msg, got, want);
        }
    }
    rlx_tokenizer_close(alloc_tok);
    if (bad)
        fail_msg("%llu allocations fail badly", (unsigned long long)bad);
}

int main(int argc, char **argv) {
    cases_path = argc > 1 ? argv[1] : RLX_TEST_DATA "/gbnf_cases.txt";
    qwen_dir = argc > 2 ? argv[2] : NULL;
    sp_dir = argc > 3 ? argv[3] : NULL;
    const struct CMUnitTest vocab_tests[] = {
        cmocka_unit_test(test_tokens_qwen3),
        cmocka_unit_test(test_tokens_sentencepiece),
    };
    if (qwen_dir) /* the real vocabularies only: the rest runs without them */
        return cmocka_run_group_tests(vocab_tests, NULL, NULL);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_errors),       cmocka_unit_test(test_bounds),
        cmocka_unit_test(test_matcher_api),  cmocka_unit_test(test_languages_against_python),
        cmocka_unit_test(test_tokens_brown), cmocka_unit_test(test_allocation_failures),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
