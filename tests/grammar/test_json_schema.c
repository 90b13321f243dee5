/* rlx_json_schema_to_gbnf against Python's jsonschema (make_schema_cases.py): every schema of the
 * corpus converts and compiles, and over its candidate texts the grammar accepts no text the
 * validator refuses (soundness) and every valid text written in the schema's order within the
 * documented bounds (completeness); the schemas it must refuse fail with the status and a message
 * naming the keyword. Then random walks through each grammar (a random allowed byte sequence at a
 * time) write texts that check_schema_walks.py validates, so soundness is also checked on texts
 * no one wrote by hand. Also: rule prefixes, several schemas in one grammar, bounded whitespace,
 * argument errors and allocation failures. */
#include <stdio.h>
#include <stdlib.h>

#include "rlx/private.h"
#include "testutil.h"

#define CASES RLX_TEST_DATA "/schema_cases.txt"
#define WALKS RLX_TEST_DATA "/schema_walks.txt"
#define TOKENIZER RLX_SOURCE_DIR "/share/models/brown/draft"
/* Walks per schema, and the bytes one may take before it is dropped (a recursive schema can
 * wander); at least half must finish. */
#define WALKS_PER_SCHEMA 100
#define WALK_MAX 1500
#define MAX_REPORTS 10

static rlx_tokenizer *tok;
static rlx_grammar_vocab *vocab;

static int setup(void **state) {
    (void)state;
    if (rlx_tokenizer_open(TOKENIZER, &tok) != RLX_OK || rlx_grammar_vocab_create(tok, &vocab) != RLX_OK) {
        fprintf(stderr, "tokenizer %s: %s\n", TOKENIZER, rlx_last_error());
        return -1;
    }
    return 0;
}

static int teardown(void **state) {
    (void)state;
    rlx_grammar_vocab_destroy(vocab);
    rlx_tokenizer_close(tok);
    return 0;
}

/* Reads "<len bytes>\n" after a header into a malloc'd NUL-terminated buffer. */
static char *read_bytes(FILE *f, size_t len) {
    char *b = malloc(len + 1);
    assert_non_null(b);
    assert_int_equal(fread(b, 1, len, f), len);
    b[len] = '\0';
    assert_int_equal(fgetc(f), '\n');
    return b;
}

static uint64_t rng_state = 0x9E3779B97F4A7C15ull; /* tu_rand's */
static uint32_t rnd(uint32_t n) { return tu_rand(&rng_state) % n; }

/* Whether g accepts text whole. A fresh matcher each time, so the verdict cannot depend on what a
 * matcher's cache saw before. */
static int accepts(const rlx_grammar *g, const char *text, size_t len) {
    rlx_grammar_matcher *m = NULL;
    assert_ok(rlx_grammar_matcher_create(g, vocab, &m));
    int ok = rlx_grammar_matcher_accept_bytes(m, text, len) == RLX_OK && rlx_grammar_matcher_can_end(m);
    rlx_grammar_matcher_destroy(m);
    return ok;
}

static const char *const utf8_extra[] = {"\n", "\t", "\xc3\xa9", "\xe2\x82\xac", "\xf0\x9f\x98\x80", "\xe2\x80\xa8"};
static const char prefer[] = "\"}]01ntfe";
#define MAX_CAND (95 + 6 + 32)
#define MAX_WORDS 64

/* The JSON strings of the schema text (quotes included, at most 40 bytes), tried whole now and
 * then so walks also take the listed keys and constants, not only characters at random. */
typedef struct words {
    char w[MAX_WORDS][48];
    int n;
} words;

static void find_words(const char *schema, words *ws) {
    ws->n = 0;
    for (const char *p = schema; *p && ws->n < MAX_WORDS; p++) {
        if (*p != '"')
            continue;
        const char *q = p + 1;
        while (*q && *q != '"')
            q += q[0] == '\\' && q[1] ? 2 : 1;
        if (!*q)
            break;
        if (q - p + 1 <= 40) {
            memcpy(ws->w[ws->n], p, (size_t)(q - p + 1));
            ws->w[ws->n][q - p + 1] = '\0';
            ws->n++;
        }
        p = q;
    }
}

/* The candidates of a walk: printable ASCII, a few other characters, and the non-ASCII
 * characters of the schema (up to 32), which a key or a constant may need. */
static int candidates(const char *schema, char (*store)[5], const char **cand) {
    int n = 0;
    for (int i = 0; i < 95; i++) {
        store[n][0] = (char)(0x20 + i);
        store[n][1] = '\0';
        cand[n] = store[n];
        n++;
    }
    for (int i = 0; i < 6; i++)
        cand[n++] = utf8_extra[i];
    for (const unsigned char *p = (const unsigned char *)schema; *p && n < MAX_CAND; p++) {
        if (*p < 0xC0)
            continue;
        size_t k = *p >= 0xF0 ? 4 : *p >= 0xE0 ? 3 : 2;
        memcpy(store[n], p, k);
        store[n][k] = '\0';
        int seen = 0;
        for (int j = 0; j < n && !seen; j++)
            seen = strcmp(cand[j], store[n]) == 0;
        if (!seen) {
            cand[n] = store[n];
            n++;
        }
    }
    return n;
}

static size_t walk_from(rlx_grammar_matcher *m, const char **cand, int n_cand, const words *ws, char *out);

/* One random text of g: at each step a random candidate the matcher takes (closing characters
 * tried first now and then, so walks end), stopping at a complete text half the time. Returns
 * the length, or 0 when the walk ran past WALK_MAX or needs a character no candidate has. */
static size_t walk(const rlx_grammar *g, const char **cand, int n_cand, const words *ws, char *out) {
    rlx_grammar_matcher *m = NULL;
    assert_ok(rlx_grammar_matcher_create(g, vocab, &m));
    size_t len = walk_from(m, cand, n_cand, ws, out);
    rlx_grammar_matcher_destroy(m);
    return len;
}

static size_t walk_from(rlx_grammar_matcher *m, const char **cand, int n_cand, const words *ws, char *out) {
    size_t len = 0;
    for (;;) {
        if (rlx_grammar_matcher_can_end(m) && (rnd(3) == 0 || rlx_grammar_matcher_is_done(m)))
            return len;
        if (len >= WALK_MAX)
            return 0;
        int moved = 0;
        for (int k = 0; k < 3 && ws->n && rnd(2) && !moved; k++) {
            const char *wd = ws->w[rnd((uint32_t)ws->n)];
            size_t n = strlen(wd);
            if (len + n < WALK_MAX && rlx_grammar_matcher_accept_bytes(m, wd, n) == RLX_OK) {
                memcpy(out + len, wd, n);
                len += n;
                moved = 1;
            }
        }
        if (!moved && (len > 200 || rnd(3) == 0))
            for (const char *p = prefer; *p && !moved; p++)
                if (rnd(2) && rlx_grammar_matcher_accept_bytes(m, p, 1) == RLX_OK) {
                    out[len++] = *p;
                    moved = 1;
                }
        for (int i = n_cand - 1; i > 0 && !moved; i--) { /* a shuffle, tried as it goes */
            int j = (int)rnd((uint32_t)i + 1);
            const char *t = cand[i];
            cand[i] = cand[j];
            cand[j] = t;
            size_t n = strlen(cand[i]);
            if (rlx_grammar_matcher_accept_bytes(m, cand[i], n) == RLX_OK) {
                memcpy(out + len, cand[i], n);
                len += n;
                moved = 1;
            }
        }
        if (!moved && rlx_grammar_matcher_accept_bytes(m, cand[0], strlen(cand[0])) == RLX_OK) {
            memcpy(out + len, cand[0], strlen(cand[0]));
            len += strlen(cand[0]);
            moved = 1;
        }
        if (!moved)
            return rlx_grammar_matcher_can_end(m) ? len : 0;
    }
}

static void test_schema_cases(void **state) {
    (void)state;
    FILE *f = fopen(CASES, "rb");
    if (!f)
        fail_msg("%s is missing: run the grammar_schema_cases test first", CASES);
    FILE *w = fopen(WALKS, "wb");
    assert_non_null(w);
    char *walked = malloc(WALK_MAX + 8);
    assert_non_null(walked);
    char word[16], name[256] = "";
    size_t n_schemas = 0, n_texts = 0, n_accepted = 0, n_required = 0, n_refusals = 0, n_walks = 0, n_dropped = 0;
    size_t unsound = 0, incomplete = 0;
    rlx_grammar *g = NULL;
    for (;;) {
        assert_int_equal(fscanf(f, "%15s", word), 1);
        if (strcmp(word, "end") == 0)
            break;
        size_t len = 0;
        if (strcmp(word, "schema") == 0) {
            rlx_grammar_destroy(g);
            g = NULL;
            assert_int_equal(fscanf(f, "%255s %zu", name, &len), 2);
            assert_int_equal(fgetc(f), '\n');
            char *schema = read_bytes(f, len);
            char *gbnf = NULL;
            size_t gbnf_len = 0;
            rlx_json_schema_options o = rlx_json_schema_options_default();
            if (rlx_json_schema_to_gbnf(schema, len, &o, &gbnf, &gbnf_len) != RLX_OK)
                fail_msg("%s: %s", name, rlx_last_error());
            assert_int_equal(strlen(gbnf), gbnf_len);
            if (rlx_grammar_parse(gbnf, gbnf_len, NULL, &g) != RLX_OK)
                fail_msg("%s: the grammar does not compile: %s\n%s", name, rlx_last_error(), gbnf);
            n_schemas++;
            free(gbnf);
            char store[MAX_CAND][5];
            const char *cand[MAX_CAND];
            int n_cand = candidates(schema, store, cand);
            static words ws;
            find_words(schema, &ws);
            free(schema);
            size_t done = 0;
            for (int k = 0; k < WALKS_PER_SCHEMA; k++) {
                size_t n = walk(g, cand, n_cand, &ws, walked);
                if (!n) {
                    n_dropped++;
                    continue;
                }
                /* a fresh pass over the whole text agrees with the walk */
                if (!accepts(g, walked, n))
                    fail_msg("%s: the walked text %.*s is not accepted whole", name, (int)n, walked);
                fprintf(w, "walk %s %zu\n", name, n);
                fwrite(walked, 1, n, w);
                fputc('\n', w);
                done++;
            }
            if (done < WALKS_PER_SCHEMA / 2)
                fail_msg("%s: only %zu of %d walks ended", name, done, WALKS_PER_SCHEMA);
            n_walks += done;
        } else if (strcmp(word, "text") == 0) {
            int valid = 0, required = 0;
            assert_int_equal(fscanf(f, "%d %d %zu", &valid, &required, &len), 3);
            assert_int_equal(fgetc(f), '\n');
            char *text = read_bytes(f, len);
            int ok = accepts(g, text, len);
            n_texts++;
            n_accepted += (size_t)ok;
            n_required += (size_t)required;
            if (ok && !valid && unsound++ < MAX_REPORTS)
                print_error("%s: accepts the invalid text %s\n", name, text);
            if (required && !ok && incomplete++ < MAX_REPORTS)
                print_error("%s: refuses the valid text %s\n", name, text);
            free(text);
        } else {
            assert_string_equal(word, "refuse");
            char status[32];
            size_t needle_len = 0;
            assert_int_equal(fscanf(f, "%31s %zu %zu", status, &needle_len, &len), 3);
            assert_int_equal(fgetc(f), '\n');
            char *needle = malloc(needle_len + 1);
            assert_non_null(needle);
            assert_int_equal(fread(needle, 1, needle_len, f), needle_len);
            needle[needle_len] = '\0';
            char *schema = read_bytes(f, len);
            char *gbnf = (char *)&gbnf;
            size_t gbnf_len = 1;
            int st = rlx_json_schema_to_gbnf(schema, len, NULL, &gbnf, &gbnf_len);
            int want = strcmp(status, "unsupported") == 0 ? RLX_E_UNSUPPORTED : RLX_E_INVALID;
            if (st != want || !strstr(rlx_last_error(), needle))
                fail_msg("schema %s: got %d (%s), want %s naming \"%s\"", schema, st, rlx_last_error(), status, needle);
            assert_null(gbnf);
            assert_int_equal(gbnf_len, 0);
            n_refusals++;
            free(needle);
            free(schema);
        }
    }
    rlx_grammar_destroy(g);
    fclose(f);
    fclose(w);
    free(walked);
    print_message("%zu schemas, %zu texts (%zu accepted, %zu required), %zu refusals, %zu walks (%zu dropped)\n",
                  n_schemas, n_texts, n_accepted, n_required, n_refusals, n_walks, n_dropped);
    if (unsound || incomplete)
        fail_msg("%zu invalid texts accepted, %zu required texts refused", unsound, incomplete);
    assert_true(n_schemas >= 40 && n_refusals >= 40 && n_texts >= 2000);
}

static char *convert(const char *schema, const char *prefix) {
    rlx_json_schema_options o = rlx_json_schema_options_default();
    o.rule_prefix = prefix;
    char *gbnf = NULL;
    size_t len = 0;
    assert_ok(rlx_json_schema_to_gbnf(schema, strlen(schema), &o, &gbnf, &len));
    return gbnf;
}

static int grammar_accepts(const char *gbnf, const char *root, const char *text) {
    rlx_grammar *g = NULL;
    assert_ok(rlx_grammar_parse(gbnf, strlen(gbnf), root, &g));
    int ok = accepts(g, text, strlen(text));
    rlx_grammar_destroy(g);
    return ok;
}

/* Every rule carries the prefix; two prefixed schemas live in one grammar. */
static void test_prefix(void **state) {
    (void)state;
    const char *a =
        "{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"integer\",\"minimum\":0}},\"required\":[\"x\"]}";
    const char *b = "{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/s\"},\"$defs\":{\"s\":{\"type\":\"string\"}}}";
    char *ga = convert(a, "t1-"), *gb = convert(b, "T2");
    const char *g[2] = {ga, gb}, *p[2] = {"t1-", "T2"};
    for (int k = 0; k < 2; k++) {
        int lines = 0;
        for (const char *line = g[k]; *line; line = strchr(line, '\n') + 1, lines++) {
            assert_non_null(strchr(line, '\n'));
            if (strncmp(line, p[k], strlen(p[k])) != 0)
                fail_msg("a rule without the prefix %s: %.60s", p[k], line);
        }
        assert_true(lines > 2);
    }
    size_t n = strlen(ga) + strlen(gb) + 64;
    char *both = malloc(n);
    assert_non_null(both);
    snprintf(both, n, "root ::= t1-root | T2root\n%s%s", ga, gb);
    assert_true(grammar_accepts(both, NULL, "{\"x\": 5}"));
    assert_true(grammar_accepts(both, NULL, "[\"a\",\"b\"]"));
    assert_false(grammar_accepts(both, NULL, "{\"x\": -5}"));
    assert_false(grammar_accepts(both, NULL, "[1]"));
    assert_true(grammar_accepts(ga, "t1-root", "{\"x\":0}"));
    free(both);
    free(ga);
    free(gb);
    /* NULL and "" mean no prefix */
    char *plain = convert(a, "");
    assert_int_equal(strncmp(plain, "root ::= ", 9), 0);
    free(plain);
    rlx_json_schema_options o = rlx_json_schema_options_default();
    char *out = (char *)&out;
    size_t len = 1;
    const char *bad[] = {"a_b", "a b", "é", "x.y"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        o.rule_prefix = bad[i];
        assert_int_equal(rlx_json_schema_to_gbnf(a, strlen(a), &o, &out, &len), RLX_E_INVALID);
        assert_error_mentions("prefix");
        assert_null(out);
        assert_int_equal(len, 0);
    }
}

/* Whitespace between tokens is bounded: one space, or a newline and up to 20 spaces or tabs. */
static void test_whitespace(void **state) {
    (void)state;
    char *g = convert("{\"type\":\"array\",\"items\":{\"type\":\"integer\"}}", NULL);
    assert_true(grammar_accepts(g, NULL, "[1, 2]"));
    assert_true(grammar_accepts(g, NULL, "[\n  1,\n  2\n]\n"));
    assert_true(grammar_accepts(g, NULL, "[\n\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t1]"));
    assert_false(grammar_accepts(g, NULL, "[\n\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t1]"));
    assert_false(grammar_accepts(g, NULL, "[1,  2]"));
    assert_false(grammar_accepts(g, NULL, " [1]"));
    assert_false(grammar_accepts(g, NULL, "[1]\n\n"));
    free(g);
}

static void test_arguments(void **state) {
    (void)state;
    char *out = NULL;
    size_t len = 0;
    assert_int_equal(rlx_json_schema_to_gbnf(NULL, 0, NULL, &out, &len), RLX_E_INVALID);
    assert_int_equal(rlx_json_schema_to_gbnf("{}", 2, NULL, NULL, &len), RLX_E_INVALID);
    assert_int_equal(rlx_json_schema_to_gbnf("{}", 2, NULL, &out, NULL), RLX_E_INVALID);
    rlx_json_schema_options o = rlx_json_schema_options_default();
    o.size = 4;
    assert_int_equal(rlx_json_schema_to_gbnf("{}", 2, &o, &out, &len), RLX_E_INVALID);
    /* len, not the NUL, ends the schema */
    assert_ok(rlx_json_schema_to_gbnf("{\"type\":\"null\"} garbage", 15, NULL, &out, &len));
    assert_int_equal(strlen(out), len);
    assert_true(grammar_accepts(out, NULL, "null"));
    free(out);
    assert_int_equal(rlx_json_schema_to_gbnf("{\"type\":\"null\"}\0x", 17, NULL, &out, &len), RLX_E_INVALID);
    assert_int_equal(rlx_json_schema_to_gbnf("\"\xff\"", 3, NULL, &out, &len), RLX_E_INVALID);
    assert_error_mentions("UTF-8");
}

/* Each allocation failing in turn is RLX_E_NOMEM with nothing leaked (AddressSanitizer's leak
 * check), until the conversion succeeds. */
static void test_allocation_failures(void **state) {
    (void)state;
    const char *schema =
        "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\",\"pattern\":\"^[a-z]+\\\\d?$\"},"
        "\"b\":{\"$ref\":\"#/$defs/b\"},\"c\":{\"allOf\":[{\"$ref\":\"#/$defs/b\"},{\"minItems\":1}]},"
        "\"d\":{\"oneOf\":[{\"const\":1},{\"type\":\"string\",\"format\":\"date\"}]},\"e\":{\"type\":\"number\","
        "\"minimum\":0}},"
        "\"required\":[\"a\",\"z\"],\"$defs\":{\"b\":{\"type\":\"array\",\"items\":{\"type\":\"integer\",\"maximum\":9}"
        "}}}";
    char *want = convert(schema, "p-");
    int succeeded = 0;
    for (uint64_t nth = 1; nth < 100000 && !succeeded; nth++) {
        rlx_debug_fail_alloc(nth, 0);
        char *out = NULL;
        size_t len = 0;
        rlx_json_schema_options o = rlx_json_schema_options_default();
        o.rule_prefix = "p-";
        int st = rlx_json_schema_to_gbnf(schema, strlen(schema), &o, &out, &len);
        rlx_debug_fail_alloc(0, 0);
        if (st == RLX_OK) {
            assert_string_equal(out, want);
            free(out);
            succeeded = 1;
        } else {
            assert_int_equal(st, RLX_E_NOMEM);
            assert_null(out);
        }
    }
    assert_true(succeeded);
    free(want);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_schema_cases),        cmocka_unit_test(test_prefix),
        cmocka_unit_test(test_whitespace),          cmocka_unit_test(test_arguments),
        cmocka_unit_test(test_allocation_failures),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
