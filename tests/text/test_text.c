/* Unit tests of rlx/text.h on small tokenizers written by the test: loading errors, encoding
 * rules (merges, added tokens, NFC, invalid UTF-8), decoding and the streaming decoder, chat
 * template detection. The real Qwen3 tokenizer is checked against Hugging Face in text_parity.
 *
 * The test vocabulary gives each byte b the id b (its ByteLevel character), then "Ġt" 256,
 * "he" 257, "Ġthe" 258, "ll" 259, "ell" 260, "hell" 261, "hello" 262, merged in the order
 * ll, ell, hell, hello, Ġt, he, Ġthe; added tokens are <|im_end|> (special) 263, <think> 264 and
 * <mask> (special, lstrip, rstrip) 265. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <pthread.h>

#include "rlx/text.h"

static char dir[256];

// ---- writing tokenizers

static uint32_t byte_char(int b) {
    int n = 0;
    for (int i = 0; i < 256; i++) {
        int printable = (i >= '!' && i <= '~') || (i >= 0xA1 && i <= 0xAC) || (i >= 0xAE && i <= 0xFF);
        if (i == b)
            return printable ? (uint32_t)i : (uint32_t)(256 + n);
        if (!printable)
            n++;
    }
    return 0;
}

/* The JSON string literal of byte b's ByteLevel character. */
static const char *byte_json(int b) {
    static char buf[8];
    uint32_t c = byte_char(b);
    if (c == '"' || c == '\\')
        snprintf(buf, sizeof buf, "\"\\%c\"", (char)c);
    else if (c < 0x80)
        snprintf(buf, sizeof buf, "\"%c\"", (char)c);
    else
        snprintf(buf, sizeof buf, "\"%c%c\"", (char)(0xC0 | (c >> 6)), (char)(0x80 | (c & 0x3F)));
    return buf;
}

static const char qwen_regex[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p{N}| "
                                 "?[^\\\\s\\\\p{L}\\\\p{N}]+[\\\\r\\\\n]*|\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+";

typedef struct tok_opts {
    const char *normalizer;     /* JSON, default {"type": "NFC"} */
    int pair_merges;            /* merges as ["a", "b"] */
    const char *bad_merge;      /* an extra merge entry, as JSON */
    const char *post_processor; /* JSON, default null */
    const char *decoder;        /* JSON, default {"type": "ByteLevel"} */
} tok_opts;

static void write_file(const char *name, const char *text) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void remove_file(const char *name) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    unlink(path);
}

static void write_tokenizer(const tok_opts *o) {
    static const char *const merges[][2] = {{"l", "l"}, {"e", "ll"}, {"h", "ell"}, {"hell", "o"},
                                            {"Ġ", "t"}, {"h", "e"},  {"Ġt", "he"}};
    static const char *const merged[] = {"Ġt", "he", "Ġthe", "ll", "ell", "hell", "hello"};
    char path[512];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fprintf(f,
            "{\"version\": \"1.0\", \"added_tokens\": ["
            "{\"id\": 263, \"content\": \"<|im_end|>\", \"single_word\": false, \"lstrip\": false, \"rstrip\": false, "
            "\"normalized\": false, \"special\": true},"
            "{\"id\": 264, \"content\": \"<think>\", \"single_word\": false, \"lstrip\": false, \"rstrip\": false, "
            "\"normalized\": false, \"special\": false},"
            "{\"id\": 265, \"content\": \"<mask>\", \"single_word\": false, \"lstrip\": true, \"rstrip\": true, "
            "\"normalized\": false, \"special\": true}],\n");
    fprintf(f, "\"normalizer\": %s,\n", o->normalizer ? o->normalizer : "{\"type\": \"NFC\"}");
    fprintf(f,
            "\"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\": "
            "{\"Regex\": \"%s\"}, \"behavior\": \"Isolated\", \"invert\": false}, {\"type\": \"ByteLevel\", "
            "\"add_prefix_space\": false, \"trim_offsets\": false, \"use_regex\": false}]},\n",
            qwen_regex);
    fprintf(f, "\"post_processor\": %s, \"decoder\": %s,\n", o->post_processor ? o->post_processor : "null",
            o->decoder ? o->decoder : "{\"type\": \"ByteLevel\"}");
    fprintf(f, "\"model\": {\"type\": \"BPE\", \"dropout\": null, \"unk_token\": null, \"byte_fallback\": false, "
               "\"vocab\": {");
    for (int b = 0; b < 256; b++)
        fprintf(f, "%s%s: %d", b ? ", " : "", byte_json(b), b);
    for (int i = 0; i < 7; i++)
        fprintf(f, ", \"%s\": %d", merged[i], 256 + i);
    fprintf(f, "}, \"merges\": [");
    for (int i = 0; i < 7; i++)
        fprintf(f, o->pair_merges ? "%s[\"%s\", \"%s\"]" : "%s\"%s %s\"", i ? ", " : "", merges[i][0], merges[i][1]);
    if (o->bad_merge)
        fprintf(f, ", %s", o->bad_merge);
    fprintf(f, "]}}\n");
    fclose(f);
}

static rlx_tokenizer *load_default(void) {
    tok_opts o = {0};
    write_tokenizer(&o);
    rlx_tokenizer *tok = NULL;
    assert_int_equal(rlx_tokenizer_open(dir, &tok), RLX_OK);
    return tok;
}

static int setup(void **state) {
    (void)state;
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/rlx_text_XXXXXX", tmp && *tmp ? tmp : "/tmp");
    return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    remove_file("tokenizer.json");
    remove_file("tokenizer_config.json");
    remove_file("chat_template.jinja");
    return rmdir(dir);
}

/* Encodes text (NUL-terminated) and compares with want[n]. */
static void expect_ids(rlx_tokenizer *tok, const char *text, int special, const int32_t *want, size_t n) {
    int32_t *ids = NULL;
    size_t n_ids = 0;
    assert_int_equal(rlx_tokenizer_encode(tok, text, strlen(text), special, &ids, &n_ids), RLX_OK);
    assert_int_equal(n_ids, n);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(ids[i], want[i]);
    free(ids);
}

// ---- loading

static void test_load_missing_dir(void **state) {
    (void)state;
    rlx_tokenizer *tok = (rlx_tokenizer *)&tok; /* non-NULL sentinel */
    assert_int_equal(rlx_tokenizer_open("/nonexistent/rlx-model", &tok), RLX_E_IO);
    assert_null(tok);
    assert_non_null(strstr(rlx_last_error(), "/nonexistent/rlx-model: "));
}

static void test_load_malformed_json(void **state) {
    (void)state;
    write_file("tokenizer.json", "{\"model\": {\"vocab\": {\"a\": 0,}}");
    rlx_tokenizer *tok = (rlx_tokenizer *)&tok;
    assert_int_equal(rlx_tokenizer_open(dir, &tok), RLX_E_FORMAT);
    assert_null(tok);
    assert_non_null(strstr(rlx_last_error(), "tokenizer.json"));
    assert_non_null(strstr(rlx_last_error(), "line 1"));
}

static void test_load_missing_model(void **state) {
    (void)state;
    write_file("tokenizer.json", "{\"normalizer\": null}");
    rlx_tokenizer *tok;
    assert_int_equal(rlx_tokenizer_open(dir, &tok), RLX_E_FORMAT);
    assert_non_null(strstr(rlx_last_error(), "'model'"));
}

static void test_load_unsupported_normalizer(void **state) {
    (void)state;
    tok_opts o = {.normalizer = "{\"type\": \"NFKC\"}"};
    write_tokenizer(&o);
    rlx_tokenizer *tok;
    assert_int_equal(rlx_tokenizer_open(dir, &tok), RLX_E_UNSUPPORTED);
    assert_non_null(strstr(rlx_last_error(), "NFKC"));
}

/* A component the tokenizer does not implement is refused naming it, not run differently. */
static void test_load_unsupported_components(void **state) {
    (void)state;
    static const struct {
        tok_opts o;
        const char *named;
    } cases[] = {
        {{.normalizer = "{\"type\": \"Replace\", \"pattern\": {\"Regex\": \" +\"}, \"content\": \" \"}"}, "Regex"},
        {{.post_processor = "{\"type\": \"RobertaProcessing\", \"sep\": [\"</s>\", 2], \"cls\": [\"<s>\", 0]}"},
         "RobertaProcessing"},
        {{.decoder = "{\"type\": \"WordPiece\", \"prefix\": \"##\"}"}, "WordPiece"},
        {{.decoder = "{\"type\": \"Sequence\", \"decoders\": [{\"type\": \"Fuse\"}, {\"type\": \"Strip\", "
                     "\"content\": \" \", \"start\": 0, \"stop\": 1}]}"},
         "Strip"},
        {{.decoder =
              "{\"type\": \"Sequence\", \"decoders\": [{\"type\": \"ByteLevel\"}, {\"type\": \"ByteFallback\"}]}"},
         "ByteLevel decoder combined"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        write_tokenizer(&cases[i].o);
        rlx_tokenizer *tok = (rlx_tokenizer *)&tok;
        assert_int_equal(rlx_tokenizer_open(dir, &tok), RLX_E_UNSUPPORTED);
        assert_null(tok);
        assert_non_null(strstr(rlx_last_error(), cases[i].named));
    }
}

/* add_special: the TemplateProcessing post-processor's single template, or tokenizer_config.json's
 * add_bos_token / add_eos_token where given. */
static void test_add_special(void **state) {
    (void)state;
    tok_opts o = {.post_processor =
                      "{\"type\": \"Sequence\", \"processors\": [{\"type\": \"ByteLevel\"}, "
                      "{\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": {\"id\": "
                      "\"<mask>\", \"type_id\": 0}}, {\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}, "
                      "{\"SpecialToken\": {\"id\": \"<|im_end|>\", \"type_id\": 0}}], \"special_tokens\": "
                      "{\"<mask>\": {\"id\": \"<mask>\", \"ids\": [265]}, \"<|im_end|>\": {\"id\": "
                      "\"<|im_end|>\", \"ids\": [263]}}}]}"};
    write_tokenizer(&o);
    rlx_tokenizer *tok;
    assert_int_equal(rlx_tokenizer_open(dir, &tok), RLX_OK);
    int32_t *ids;
    size_t n;
    int truncated;
    rlx_encode_options eo = {.size = sizeof eo, .add_special = 1};
    assert_int_equal(rlx_tokenizer_encode_ex(tok, "hello", 5, &eo, &ids, &n, NULL), RLX_OK);
    assert_int_equal(n, 3);
    assert_int_equal(ids[0], 265);
    assert_int_equal(ids[1], 262);
    assert_int_equal(ids[2], 263);
    free(ids);
    /* an empty text still gets them, as Hugging Face's encode("") does */
    assert_int_equal(rlx_tokenizer_encode_ex(tok, "", 0, &eo, &ids, &n, NULL), RLX_OK);
    assert_int_equal(n, 2);
    free(ids);
    /* they count toward max_ids */
    eo.max_ids = 1;
    assert_int_equal(rlx_tokenizer_encode_ex(tok, "hello", 5, &eo, &ids, &n, &truncated), RLX_OK);
    assert_int_equal(n, 1);
    assert_int_equal(ids[0], 265);
    assert_true(truncated);
    free(ids);
    expect_ids(tok, "hello", 1, (const int32_t[]){262}, 1); /* without add_special: the text alone */
    rlx_tokenizer_close(tok);

    /* add_bos_token / add_eos_token override the template */
    write_file("tokenizer_config.json", "{\"bos_token\": \"<think>\", \"eos_token\": \"<|im_end|>\", "
                                        "\"add_bos_token\": true, \"add_eos_token\": false}");
    assert_int_equal(rlx_tokenizer_open(dir, &tok), RLX_OK);
    eo.max_ids = 0;
    assert_int_equal(rlx_tokenizer_encode_ex(tok, "hello", 5, &eo, &ids, &n, NULL), RLX_OK);
    assert_int_equal(n, 2);
    assert_int_equal(ids[0], 264);
    assert_int_equal(ids[1], 262);
    free(ids);
    rlx_tokenizer_close(tok);
    write_file("tokenizer_config.json", "{\"add_bos_token\": true}");
    assert_int_equal(rlx_tokenizer_open(dir, &tok), RLX_E_FORMAT);
    assert_non_null(strstr(rlx_last_error(), "add_bos_token"));
    remove_file("tokenizer_config.json");
}

static void test_load_bad_merge(void **state) {
    (void)state;
    tok_opts o = {.bad_merge = "\"zz qq\""};
    write_tokenizer(&o);
    rlx_tokenizer *tok;
    assert_int_equal(rlx_tokenizer_open(dir, &tok), RLX_E_FORMAT);
    assert_non_null(strstr(rlx_last_error(), "merge 7"));
    o.bad_merge = "\"a b c\"";
    write_tokenizer(&o);
    assert_int_equal(rlx_tokenizer_open(dir, &tok), RLX_E_FORMAT);
    o.bad_merge = "[\"a\"]";
    write_tokenizer(&o);
    assert_int_equal(rlx_tokenizer_open(dir, &tok), RLX_E_FORMAT);
}

// ---- encoding

static void test_merges_both_formats(void **state) {
    (void)state;
    const int32_t want[] = {262, 258, 'h', 'i'}; /* " thehi": Ġt, he, then Ġthe; h and i stay */
    for (int pairs = 0; pairs < 2; pairs++) {
        tok_opts o = {.pair_merges = pairs};
        write_tokenizer(&o);
        rlx_tokenizer *tok;
        assert_int_equal(rlx_tokenizer_open(dir, &tok), RLX_OK);
        assert_int_equal(rlx_tokenizer_vocab_size(tok), 266);
        expect_ids(tok, "hello thehi", 1, want, 4);
        expect_ids(tok, "hello the hi", 1, (const int32_t[]){262, 258, 32, 'h', 'i'}, 5);
        rlx_tokenizer_close(tok);
    }
}

static void test_digits_and_spaces(void **state) {
    (void)state;
    rlx_tokenizer *tok = load_default();
    /* digits one by one; a run of spaces before a word keeps its last space for the word */
    expect_ids(tok, "x 12", 1, (const int32_t[]){'x', 32, '1', '2'}, 4);
    expect_ids(tok, "a   the", 1, (const int32_t[]){'a', 32, 32, 258}, 4);
    expect_ids(tok, "a\r\n\r\nb", 1, (const int32_t[]){'a', '\r', '\n', '\r', '\n', 'b'}, 6);
    rlx_tokenizer_close(tok);
}

static void test_added_tokens(void **state) {
    (void)state;
    rlx_tokenizer *tok = load_default();
    expect_ids(tok, "hi<|im_end|>hello", 1, (const int32_t[]){'h', 'i', 263, 262}, 4);
    /* without special parsing <|im_end|> is text, but <think> (not special) is still a token */
    int32_t *ids;
    size_t n;
    assert_int_equal(rlx_tokenizer_encode(tok, "hi<|im_end|><think>", 19, 0, &ids, &n), RLX_OK);
    assert_true(n > 4);
    for (size_t i = 0; i + 1 < n; i++)
        assert_int_not_equal(ids[i], 263);
    assert_int_equal(ids[n - 1], 264);
    free(ids);
    /* lstrip and rstrip take the whitespace around <mask> */
    expect_ids(tok, "a  <mask>  b", 1, (const int32_t[]){'a', 265, 'b'}, 3);
    /* leftmost-longest: a token inside text that only starts like one */
    expect_ids(tok, "<|im_end<|im_end|>", 1, (const int32_t[]){'<', '|', 'i', 'm', '_', 'e', 'n', 'd', 263}, 9);
    assert_int_equal(rlx_tokenizer_token_id(tok, "<|im_end|>"), 263);
    assert_int_equal(rlx_tokenizer_token_id(tok, "Ġthe"), 258);
    assert_string_equal(rlx_tokenizer_token_text(tok, 258), "Ġthe");
    assert_null(rlx_tokenizer_token_text(tok, 266));
    assert_true(rlx_tokenizer_is_special(tok, 263));
    assert_false(rlx_tokenizer_is_special(tok, 264));
    rlx_tokenizer_close(tok);
}

/* Encodes text with special tokens recognised only inside spans[0, n). */
static void encode_spans(rlx_tokenizer *tok, const char *text, const rlx_text_span *spans, size_t n, int32_t **ids,
                         size_t *n_ids) {
    rlx_encode_options eo = {.size = sizeof eo, .special_spans = spans, .n_special_spans = n};
    assert_int_equal(rlx_tokenizer_encode_ex(tok, text, strlen(text), &eo, ids, n_ids, NULL), RLX_OK);
}

static void assert_same_ids(const int32_t *a, size_t n_a, const int32_t *b, size_t n_b) {
    assert_int_equal(n_a, n_b);
    if (n_a)
        assert_memory_equal(a, b, n_a * sizeof *a);
}

static void test_special_spans(void **state) {
    (void)state;
    rlx_tokenizer *tok = load_default();
    int32_t *ids, *plain;
    size_t n, n_plain;
    /* the first <|im_end|> is markup, the second is message text and stays characters */
    const char *text = "a<|im_end|>b<|im_end|>c";
    encode_spans(tok, text, (const rlx_text_span[]){{1, 10}}, 1, &ids, &n);
    assert_int_equal(rlx_tokenizer_encode(tok, "b<|im_end|>c", 12, 0, &plain, &n_plain), RLX_OK);
    assert_true(n == 2 + n_plain && ids[0] == 'a' && ids[1] == 263);
    assert_same_ids(ids + 2, n - 2, plain, n_plain);
    free(ids);
    free(plain);
    /* no special text outside the spans: the ids of a whole-text encoding, even where the
     * pre-tokenizer joins the markup's newline with the message's ("\n" + "\n\n", "  " + "\n") */
    const char *joined = "x<|im_end|>\n\nhello  \n<|im_end|>\n";
    encode_spans(tok, joined, (const rlx_text_span[]){{1, 11}, {20, 12}}, 2, &ids, &n);
    assert_int_equal(rlx_tokenizer_encode(tok, joined, strlen(joined), 1, &plain, &n_plain), RLX_OK);
    assert_same_ids(ids, n, plain, n_plain);
    free(ids);
    free(plain);
    /* a token that crosses a span's edge is text, and so is one with lstrip/rstrip outside */
    const char *across = "<|im_end|> <mask> b";
    encode_spans(tok, across, (const rlx_text_span[]){{0, 5}}, 1, &ids, &n);
    assert_int_equal(rlx_tokenizer_encode(tok, across, strlen(across), 0, &plain, &n_plain), RLX_OK);
    assert_same_ids(ids, n, plain, n_plain);
    free(ids);
    free(plain);
    /* a token that starts like one in the text and ends in a span: the span's own is found */
    encode_spans(tok, "<|im<|im_end|>", (const rlx_text_span[]){{4, 10}}, 1, &ids, &n);
    assert_int_equal(ids[n - 1], 263);
    free(ids);
    /* non-special added tokens are tokens everywhere */
    encode_spans(tok, "<think>", (const rlx_text_span[]){{0, 0}}, 1, &ids, &n);
    assert_true(n == 1 && ids[0] == 264);
    free(ids);
    /* spans out of order or past the text */
    rlx_encode_options eo = {
        .size = sizeof eo, .special_spans = (const rlx_text_span[]){{5, 2}, {1, 1}}, .n_special_spans = 2};
    assert_int_equal(rlx_tokenizer_encode_ex(tok, "abcdefgh", 8, &eo, &ids, &n, NULL), RLX_E_INVALID);
    eo.special_spans = (const rlx_text_span[]){{6, 3}};
    eo.n_special_spans = 1;
    assert_int_equal(rlx_tokenizer_encode_ex(tok, "abcdefgh", 8, &eo, &ids, &n, NULL), RLX_E_INVALID);
    rlx_tokenizer_close(tok);
}

static void test_encode_limit(void **state) {
    (void)state;
    rlx_tokenizer *tok = load_default();
    const char *text = "hello the<|im_end|> hello 12 theory\n\n hell<mask>o the end";
    int32_t *full, *ids;
    size_t n_full, n;
    int truncated;
    assert_int_equal(rlx_tokenizer_encode(tok, text, strlen(text), 1, &full, &n_full), RLX_OK);
    for (size_t limit = 1; limit <= n_full + 1; limit++) {
        rlx_encode_options eo = {.size = sizeof eo, .parse_special = 1, .max_ids = limit};
        assert_int_equal(rlx_tokenizer_encode_ex(tok, text, strlen(text), &eo, &ids, &n, &truncated), RLX_OK);
        /* short words: the limit is reached exactly */
        assert_int_equal(truncated, n_full > limit);
        assert_int_equal(n, n_full > limit ? limit : n_full);
        assert_memory_equal(ids, full, n * sizeof *ids);
        free(ids);
    }
    free(full);
    /* a word that alone passes the limit is not merged: the prefix before it is all there is */
    size_t len = 100000;
    char *big = malloc(len + 12);
    memcpy(big, "<|im_end|>", 10);
    memset(big + 10, 'l', len);
    big[10 + len] = '\0';
    rlx_encode_options eo = {.size = sizeof eo, .parse_special = 1, .max_ids = 1000};
    assert_int_equal(rlx_tokenizer_encode_ex(tok, big, strlen(big), &eo, &ids, &n, &truncated), RLX_OK);
    assert_true(truncated && n == 1 && ids[0] == 263);
    free(ids);
    free(big);
    /* NULL options: no special tokens, no limit, as rlx_tokenizer_encode(..., 0, ...) */
    assert_int_equal(rlx_tokenizer_encode_ex(tok, "<|im_end|>", 10, NULL, &ids, &n, NULL), RLX_OK);
    assert_true(n > 1);
    free(ids);
    rlx_tokenizer_close(tok);
}

static void test_unknown_token(void **state) {
    (void)state;
    rlx_tokenizer *tok = load_default();
    assert_int_equal(rlx_tokenizer_token_id(tok, "<|nope|>"), RLX_E_NOT_FOUND);
    assert_non_null(strstr(rlx_last_error(), "<|nope|>"));
    rlx_tokenizer_close(tok);
}

static void test_nfc(void **state) {
    (void)state;
    rlx_tokenizer *tok = load_default();
    /* e + COMBINING ACUTE becomes U+00E9 (C3 A9) */
    expect_ids(tok, "e\xCC\x81", 1, (const int32_t[]){0xC3, 0xA9}, 2);
    rlx_tokenizer_close(tok);
    tok_opts o = {.normalizer = "null"};
    write_tokenizer(&o);
    assert_int_equal(rlx_tokenizer_open(dir, &tok), RLX_OK);
    expect_ids(tok, "e\xCC\x81", 1, (const int32_t[]){'e', 0xCC, 0x81}, 3);
    rlx_tokenizer_close(tok);
}

static void test_invalid_utf8(void **state) {
    (void)state;
    rlx_tokenizer *tok = load_default();
    static const struct {
        const char *text;
        size_t len, offset;
    } bad[] = {
        {"ab\xC3(", 4, 2},          /* continuation missing */
        {"\xC0\x80", 2, 0},         /* overlong NUL */
        {"x\xED\xA0\x80", 4, 1},    /* surrogate */
        {"\xF4\x90\x80\x80", 4, 0}, /* above U+10FFFF */
        {"ok \xE4\xB8", 5, 3},      /* truncated at the end */
        {"\xFF", 1, 0},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int32_t *ids = (int32_t *)&ids;
        size_t n = 99;
        assert_int_equal(rlx_tokenizer_encode(tok, bad[i].text, bad[i].len, 1, &ids, &n), RLX_E_INVALID);
        assert_null(ids);
        assert_int_equal(n, 0);
        char want[32];
        snprintf(want, sizeof want, "offset %zu", bad[i].offset);
        assert_non_null(strstr(rlx_last_error(), want));
    }
    /* NUL bytes are valid text */
    int32_t *ids;
    size_t n;
    assert_int_equal(rlx_tokenizer_encode(tok, "a\0b", 3, 1, &ids, &n), RLX_OK);
    assert_int_equal(n, 3);
    free(ids);
    assert_int_equal(rlx_tokenizer_encode(tok, "", 0, 1, &ids, &n), RLX_OK);
    assert_int_equal(n, 0);
    assert_null(ids);
    rlx_tokenizer_close(tok);
}

// ---- decoding

static void test_decode(void **state) {
    (void)state;
    rlx_tokenizer *tok = load_default();
    const int32_t ids[] = {262, 258, 263, 0xE4, 0xB8, 'x', 99999, -1};
    char *text;
    size_t len;
    assert_int_equal(rlx_tokenizer_decode(tok, ids, 8, 0, &text, &len), RLX_OK);
    assert_string_equal(text, "hello the<|im_end|>\xEF\xBF\xBDx");
    assert_int_equal(len, strlen(text));
    free(text);
    assert_int_equal(rlx_tokenizer_decode(tok, ids, 3, RLX_DECODE_SKIP_SPECIAL, &text, &len), RLX_OK);
    assert_string_equal(text, "hello the");
    free(text);
    assert_int_equal(rlx_tokenizer_decode(tok, ids, 8, RLX_DECODE_STRICT, &text, &len), RLX_E_RANGE);
    assert_null(text);
    assert_non_null(strstr(rlx_last_error(), "99999"));
    rlx_tokenizer_close(tok);
}

/* 1 when s[0, n) is whole UTF-8 characters. */
static int utf8_whole(const unsigned char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        size_t k = s[i] < 0x80 ? 1 : s[i] < 0xE0 ? 2 : s[i] < 0xF0 ? 3 : 4;
        if (s[i] >= 0x80 && s[i] < 0xC2)
            return 0;
        if (i + k > n)
            return 0;
        for (size_t j = 1; j < k; j++)
            if ((s[i + j] & 0xC0) != 0x80)
                return 0;
        i += k;
    }
    return 1;
}

static void test_stream_never_splits(void **state) {
    (void)state;
    rlx_tokenizer *tok = load_default();
    const char *text =
        "h\xC3\xA9llo \xE4\xB8\x96\xE7\x95\x8C \xF0\x9F\x8E\x89 x \xF0\x9F\x91\xA8\xE2\x80\x8D\xF0\x9F\x91\xA9";
    int32_t *ids;
    size_t n;
    assert_int_equal(rlx_tokenizer_encode(tok, text, strlen(text), 1, &ids, &n), RLX_OK);
    rlx_detok *d;
    assert_int_equal(rlx_detok_create(tok, 0, &d), RLX_OK);
    char acc[256] = "";
    size_t acc_len = 0;
    for (size_t i = 0; i < n; i++) {
        const char *t;
        size_t len;
        assert_int_equal(rlx_detok_push(d, ids[i], &t, &len), RLX_OK);
        assert_true(utf8_whole((const unsigned char *)t, len));
        assert_int_equal(strlen(t), len);
        memcpy(acc + acc_len, t, len);
        acc_len += len;
    }
    const char *t;
    size_t len;
    assert_int_equal(rlx_detok_flush(d, &t, &len), RLX_OK);
    assert_int_equal(len, 0);
    acc[acc_len] = '\0';
    assert_string_equal(acc, text);
    free(ids);

    /* the first byte of a character is held back until the character is complete */
    assert_int_equal(rlx_detok_push(d, 0xE4, &t, &len), RLX_OK);
    assert_int_equal(len, 0);
    assert_int_equal(rlx_detok_push(d, 0xB8, &t, &len), RLX_OK);
    assert_int_equal(len, 0);
    assert_int_equal(rlx_detok_push(d, 0x96, &t, &len), RLX_OK);
    assert_string_equal(t, "\xE4\xB8\x96");
    rlx_detok_destroy(d);
    rlx_tokenizer_close(tok);
}

static void test_stream_invalid_bytes(void **state) {
    (void)state;
    rlx_tokenizer *tok = load_default();
    rlx_detok *d;
    assert_int_equal(rlx_detok_create(tok, 0, &d), RLX_OK);
    const char *t;
    size_t len;
    /* a sequence cut short by an ASCII byte: U+FFFD, then the byte */
    assert_int_equal(rlx_detok_push(d, 0xE4, &t, &len), RLX_OK);
    assert_int_equal(rlx_detok_push(d, 0xB8, &t, &len), RLX_OK);
    assert_int_equal(len, 0);
    assert_int_equal(rlx_detok_push(d, 'a', &t, &len), RLX_OK);
    assert_string_equal(t, "\xEF\xBF\xBD"
                           "a");
    /* a lone continuation byte and a byte that never starts a character: at once */
    assert_int_equal(rlx_detok_push(d, 0x80, &t, &len), RLX_OK);
    assert_string_equal(t, "\xEF\xBF\xBD");
    assert_int_equal(rlx_detok_push(d, 0xFF, &t, &len), RLX_OK);
    assert_string_equal(t, "\xEF\xBF\xBD");
    /* an impossible second byte (E0 80 is overlong): E0 alone is replaced, 80 on its own too */
    assert_int_equal(rlx_detok_push(d, 0xE0, &t, &len), RLX_OK);
    assert_int_equal(rlx_detok_push(d, 0x80, &t, &len), RLX_OK);
    assert_string_equal(t, "\xEF\xBF\xBD\xEF\xBF\xBD");
    /* an added token ends an incomplete sequence */
    assert_int_equal(rlx_detok_push(d, 0xF0, &t, &len), RLX_OK);
    assert_int_equal(rlx_detok_push(d, 263, &t, &len), RLX_OK);
    assert_string_equal(t, "\xEF\xBF\xBD<|im_end|>");
    /* flush replaces what is held */
    assert_int_equal(rlx_detok_push(d, 0xF0, &t, &len), RLX_OK);
    assert_int_equal(rlx_detok_push(d, 0x9F, &t, &len), RLX_OK);
    assert_int_equal(len, 0);
    assert_int_equal(rlx_detok_flush(d, &t, &len), RLX_OK);
    assert_string_equal(t, "\xEF\xBF\xBD");
    /* unknown ids: skipped, or an error under STRICT */
    assert_int_equal(rlx_detok_push(d, 5000, &t, &len), RLX_OK);
    assert_int_equal(len, 0);
    rlx_detok_destroy(d);
    assert_int_equal(rlx_detok_create(tok, RLX_DECODE_STRICT, &d), RLX_OK);
    assert_int_equal(rlx_detok_push(d, 5000, &t, &len), RLX_E_RANGE);
    rlx_detok_destroy(d);
    rlx_tokenizer_close(tok);
}

// ---- tokenizer_config.json and chat templates

static void test_config(void **state) {
    (void)state;
    tok_opts o = {0};
    write_tokenizer(&o);
    write_file("tokenizer_config.json",
               "{\"eos_token\": \"<|im_end|>\", \"pad_token\": {\"content\": \"<think>\"}, \"bos_token\": null,"
               " \"added_tokens_decoder\": {\"300\": {\"content\": \"<extra>\", \"special\": true}},"
               " \"chat_template\": \"{{ messages[0].content }}{% frobnicate %}\"}");
    rlx_tokenizer *tok;
    assert_int_equal(rlx_tokenizer_open(dir, &tok), RLX_OK);
    assert_int_equal(rlx_tokenizer_eos_id(tok), 263);
    assert_int_equal(rlx_tokenizer_pad_id(tok), 264);
    assert_int_equal(rlx_tokenizer_bos_id(tok), -1);
    /* a token only tokenizer_config.json names gets the next id, as transformers adds it */
    assert_int_equal(rlx_tokenizer_token_id(tok, "<extra>"), 266);
    expect_ids(tok, "a<extra>", 1, (const int32_t[]){'a', 266}, 2);
    /* a template the engine cannot parse: the error names the tag and the line */
    assert_int_equal(rlx_chat_template_of(tok), RLX_CHAT_TEMPLATE_UNKNOWN);
    rlx_chat_message m = {.role = "user", .content = "hi"};
    char *out = (char *)&out;
    assert_int_equal(rlx_chat_render(tok, &m, 1, 1, 1, &out), RLX_E_FORMAT);
    assert_null(out);
    assert_non_null(strstr(rlx_last_error(), "line 1 column 29: unknown tag {% frobnicate %}"));
    rlx_tokenizer_close(tok);

    write_file("tokenizer_config.json", "{\"eos_token\": \"<|im_end|>\"}");
    assert_int_equal(rlx_tokenizer_open(dir, &tok), RLX_OK);
    assert_int_equal(rlx_chat_template_of(tok), RLX_CHAT_TEMPLATE_NONE);
    assert_int_equal(rlx_chat_render(tok, &m, 1, 1, 1, &out), RLX_E_NOT_FOUND);
    rlx_tokenizer_close(tok);

    /* a separate chat_template.jinja is read when tokenizer_config.json has none */
    write_file("chat_template.jinja", "{% for m in messages %}{{ m.role }}:{{ m.content }};{% endfor %}");
    assert_int_equal(rlx_tokenizer_open(dir, &tok), RLX_OK);
    assert_int_equal(rlx_chat_template_of(tok), RLX_CHAT_TEMPLATE_JINJA);
    assert_int_equal(rlx_chat_render(tok, &m, 1, 1, 1, &out), RLX_OK);
    assert_string_equal(out, "user:hi;");
    free(out);
    rlx_tokenizer_close(tok);
    remove_file("chat_template.jinja");

    /* a list of named templates: "tool_use" when tools are given, else "default"; eos_token is the
     * tokenizer's, kwargs are variables, messages_json passes tool calls through */
    write_file("tokenizer_config.json",
               "{\"eos_token\": \"<|im_end|>\", \"chat_template\": ["
               "{\"name\": \"default\", \"template\": \"D:{{ messages[0].content }}{{ eos_token }}{{ x }}\"},"
               "{\"name\": \"tool_use\", \"template\": \"T:{{ tools | length }}"
               "{{ messages[0].tool_calls[0].function.arguments | tojson }}\"}]}");
    assert_int_equal(rlx_tokenizer_open(dir, &tok), RLX_OK);
    rlx_chat_options co = {.size = sizeof co, .kwargs_json = "{\"x\": 7}"};
    assert_int_equal(rlx_chat_render_ex(tok, &m, 1, &co, &out, NULL, NULL), RLX_OK);
    assert_string_equal(out, "D:hi<|im_end|>7");
    free(out);
    co.tools_json = "[{\"type\": \"function\", \"function\": {\"name\": \"f\"}}]";
    co.messages_json = "[{\"role\": \"assistant\", \"content\": null, \"tool_calls\": [{\"type\": \"function\","
                       " \"function\": {\"name\": \"f\", \"arguments\": {\"a\": [1, \"\u00e9\"]}}}]}]";
    assert_int_equal(rlx_chat_render_ex(tok, NULL, 0, &co, &out, NULL, NULL), RLX_OK);
    assert_string_equal(out, "T:1{\"a\": [1, \"\u00e9\"]}");
    free(out);
    co.kwargs_json = "[1]"; /* not an object */
    assert_int_equal(rlx_chat_render_ex(tok, NULL, 0, &co, &out, NULL, NULL), RLX_E_INVALID);
    assert_null(out);
    assert_non_null(strstr(rlx_last_error(), "kwargs_json"));
    rlx_tokenizer_close(tok);

    write_file("tokenizer_config.json", "{\"eos_token\": 5}");
    assert_int_equal(rlx_tokenizer_open(dir, &tok), RLX_E_FORMAT);
    assert_non_null(strstr(rlx_last_error(), "tokenizer_config.json"));
    remove_file("tokenizer_config.json");
}

// ---- threads

typedef struct thread_job {
    rlx_tokenizer *tok;
    const char *text;
    int32_t *ids;
    size_t n;
    rlx_status st;
} thread_job;

static void *encode_job(void *arg) {
    thread_job *j = arg;
    j->st = rlx_tokenizer_encode(j->tok, j->text, strlen(j->text), 1, &j->ids, &j->n);
    return NULL;
}

static void test_threads_share_a_tokenizer(void **state) {
    (void)state;
    rlx_tokenizer *tok = load_default();
    char text[4096] = "";
    for (int i = 0; i < 100; i++) /* many distinct words, so the threads fill the cache at once */
        snprintf(text + strlen(text), sizeof text - strlen(text), "hello%d the%c ", i, 'a' + i % 26);
    thread_job jobs[4];
    pthread_t threads[4];
    for (int i = 0; i < 4; i++) {
        jobs[i] = (thread_job){.tok = tok, .text = text};
        assert_int_equal(pthread_create(&threads[i], NULL, encode_job, &jobs[i]), 0);
    }
    for (int i = 0; i < 4; i++)
        assert_int_equal(pthread_join(threads[i], NULL), 0);
    int32_t *ids;
    size_t n;
    assert_int_equal(rlx_tokenizer_encode(tok, text, strlen(text), 1, &ids, &n), RLX_OK);
    for (int i = 0; i < 4; i++) {
        assert_int_equal(jobs[i].st, RLX_OK);
        assert_int_equal(jobs[i].n, n);
        assert_memory_equal(jobs[i].ids, ids, n * sizeof *ids);
        free(jobs[i].ids);
    }
    free(ids);
    rlx_tokenizer_close(tok);
}

static void test_null_arguments(void **state) {
    (void)state;
    int32_t *ids;
    size_t n;
    char *text;
    assert_int_equal(rlx_tokenizer_open(dir, NULL), RLX_E_INVALID);
    assert_int_equal(rlx_tokenizer_encode(NULL, "a", 1, 1, &ids, &n), RLX_E_INVALID);
    assert_int_equal(rlx_tokenizer_decode(NULL, NULL, 0, 0, &text, &n), RLX_E_INVALID);
    rlx_tokenizer_close(NULL);
    rlx_detok_destroy(NULL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_load_missing_dir),
        cmocka_unit_test(test_load_malformed_json),
        cmocka_unit_test(test_load_missing_model),
        cmocka_unit_test(test_load_unsupported_normalizer),
        cmocka_unit_test(test_load_unsupported_components),
        cmocka_unit_test(test_add_special),
        cmocka_unit_test(test_load_bad_merge),
        cmocka_unit_test(test_merges_both_formats),
        cmocka_unit_test(test_digits_and_spaces),
        cmocka_unit_test(test_added_tokens),
        cmocka_unit_test(test_special_spans),
        cmocka_unit_test(test_encode_limit),
        cmocka_unit_test(test_unknown_token),
        cmocka_unit_test(test_nfc),
        cmocka_unit_test(test_invalid_utf8),
        cmocka_unit_test(test_decode),
        cmocka_unit_test(test_stream_never_splits),
        cmocka_unit_test(test_stream_invalid_bytes),
        cmocka_unit_test(test_config),
        cmocka_unit_test(test_threads_share_a_tokenizer),
        cmocka_unit_test(test_null_arguments),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
