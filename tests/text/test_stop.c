/* Stop strings over streamed text: a stop string split across pushes is never shown, the text
 * before it is, held-back bytes come out once they cannot start a stop string any more (or at
 * flush), multi-byte UTF-8 stop strings, overlapping prefixes and a stop string starting inside
 * the held tail. Random texts cut into random pushes (byte by byte among them) are checked
 * against strstr for one stop string and against the whole-text definition for several. */
#include <stdio.h>
#include <stdlib.h>

#include "testutil.h"

typedef struct stream {
    rlx_stop_matcher *m;
    char shown[512];
    size_t n_shown;
    int stopped;
} stream;

static void open_stream(stream *s, const char *const *stops, size_t n) {
    memset(s, 0, sizeof *s);
    assert_ok(rlx_stop_matcher_create(stops, n, &s->m));
}

/* Pushes len bytes; returns what this push emitted, NUL-terminated, in a static buffer. */
static const char *push(stream *s, const char *text, size_t len) {
    static char out[512];
    const char *emit;
    size_t n;
    assert_ok(rlx_stop_matcher_push(s->m, text, len, &emit, &n, &s->stopped));
    assert_true(s->n_shown + n < sizeof s->shown);
    memcpy(s->shown + s->n_shown, emit, n);
    s->n_shown += n;
    s->shown[s->n_shown] = '\0';
    memcpy(out, emit, n);
    out[n] = '\0';
    return out;
}

static const char *push_str(stream *s, const char *text) { return push(s, text, strlen(text)); }

static void flush(stream *s) {
    const char *emit;
    size_t n;
    rlx_stop_matcher_flush(s->m, &emit, &n);
    memcpy(s->shown + s->n_shown, emit, n);
    s->n_shown += n;
    s->shown[s->n_shown] = '\0';
}

static void close_stream(stream *s) { rlx_stop_matcher_destroy(s->m); }

static void test_split_stop_string_is_never_shown(void **state) {
    (void)state;
    const char *stops[] = {"</s>"};
    stream s;
    open_stream(&s, stops, 1);
    assert_string_equal(push_str(&s, "Hello<"), "Hello");
    assert_string_equal(push_str(&s, "/"), "");
    assert_string_equal(push_str(&s, "s"), "");
    assert_false(s.stopped);
    assert_string_equal(push_str(&s, ">World"), "");
    assert_true(s.stopped);
    assert_string_equal(push_str(&s, "more"), ""); /* nothing after a stop */
    assert_true(s.stopped);
    flush(&s);
    assert_string_equal(s.shown, "Hello");
    /* a held tail that turns out not to be the stop string is shown once that is known */
    rlx_stop_matcher_reset(s.m);
    s.n_shown = 0;
    s.stopped = 0;
    assert_string_equal(push_str(&s, "a</"), "a");
    assert_string_equal(push_str(&s, "b"), "</b");
    assert_string_equal(push_str(&s, "c<"), "c");
    flush(&s);
    assert_false(s.stopped);
    assert_string_equal(s.shown, "a</bc<");
    close_stream(&s);
}

static void test_byte_by_byte(void **state) {
    (void)state;
    const char *stops[] = {"\nUser:", "###"};
    const char *text = "The answer is 42.\n##\nUser: next";
    stream s;
    open_stream(&s, stops, 2);
    for (size_t i = 0; text[i] && !s.stopped; i++)
        push(&s, text + i, 1);
    assert_true(s.stopped);
    flush(&s);
    assert_string_equal(s.shown, "The answer is 42.\n##");
    close_stream(&s);
}

/* "。" is E3 80 82: no byte of it shows, in whatever pieces it comes; E3 80 followed by
 * another character is released whole. */
static void test_utf8_stop_strings(void **state) {
    (void)state;
    const char *stops[] = {"\xe3\x80\x82", "\xf0\x9f\x9b\x91"}; /* 。 and 🛑 */
    stream s;
    open_stream(&s, stops, 2);
    assert_string_equal(push_str(&s, "\xe5\xa5\xbd\xe3"), "\xe5\xa5\xbd"); /* 好 and a lead byte */
    assert_string_equal(push_str(&s, "\x80"), "");
    assert_string_equal(push_str(&s, "\x81\x81"), "\xe3\x80\x81\x81"); /* 、 then ... */
    push_str(&s, "\xf0\x9f");
    assert_string_equal(push_str(&s, "\x9b"), "");
    assert_false(s.stopped);
    push_str(&s, "\x91tail");
    assert_true(s.stopped);
    flush(&s);
    assert_string_equal(s.shown, "\xe5\xa5\xbd\xe3\x80\x81\x81");
    close_stream(&s);
}

/* Stop strings sharing prefixes; the first to complete in the text wins, however it is cut. */
static void test_overlapping_prefixes(void **state) {
    (void)state;
    const char *stops[] = {"abcd", "bce", "c"};
    const struct {
        const char *text, *shown;
    } cases[] = {{"xabce", "xab"}, {"xabcd", "xab"}, {"xab", "xab"}, {"xbce", "xb"}, {"abd", "abd"}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (int bytewise = 0; bytewise <= 1; bytewise++) {
            stream s;
            open_stream(&s, stops, 3);
            size_t len = strlen(cases[i].text);
            for (size_t at = 0; at < len && !s.stopped; at += bytewise ? 1 : len)
                push(&s, cases[i].text + at, bytewise ? 1 : len);
            flush(&s);
            if (strcmp(s.shown, cases[i].shown) != 0)
                fail_msg("'%s' pushed %s: shown '%s', want '%s'", cases[i].text, bytewise ? "byte by byte" : "whole",
                         s.shown, cases[i].shown);
            close_stream(&s);
        }
    /* "abcd" and "bc" both complete in "abcd": "bc" does first */
    const char *two[] = {"abcd", "bc"};
    stream s;
    open_stream(&s, two, 2);
    push_str(&s, "abcd");
    assert_true(s.stopped);
    assert_string_equal(s.shown, "a");
    close_stream(&s);
}

/* A stop string can begin inside the tail held for an earlier, failed attempt. */
static void test_stop_starting_inside_the_held_tail(void **state) {
    (void)state;
    const char *stops[] = {"abab"};
    stream s;
    open_stream(&s, stops, 1);
    assert_string_equal(push_str(&s, "aba"), "");
    assert_string_equal(push_str(&s, "a"), "aba"); /* "abaa": only the last "a" can still start it */
    assert_string_equal(push_str(&s, "ba"), "");
    assert_false(s.stopped);
    assert_string_equal(push_str(&s, "b!"), "");
    assert_true(s.stopped);
    assert_string_equal(s.shown, "aba");
    rlx_stop_matcher_reset(s.m);
    s.n_shown = 0;
    assert_string_equal(push_str(&s, "ababab"), ""); /* complete in one push */
    close_stream(&s);
}

static void test_bad_stop_strings_are_refused(void **state) {
    (void)state;
    rlx_stop_matcher *m = (rlx_stop_matcher *)&m;
    const char *with_empty[] = {"ok", ""};
    assert_int_equal(rlx_stop_matcher_create(with_empty, 2, &m), RLX_E_INVALID);
    assert_null(m);
    assert_error_mentions("stop string 1 is empty");
    const char *with_null[] = {NULL};
    assert_int_equal(rlx_stop_matcher_create(with_null, 1, &m), RLX_E_INVALID);
    assert_error_mentions("stop string 0 is NULL");
    assert_int_equal(rlx_stop_matcher_create(with_empty, 0, &m), RLX_E_INVALID);
    assert_error_mentions("at least one");
    /* the strings are copied */
    char stop[] = "zz";
    char *one[] = {stop};
    assert_ok(rlx_stop_matcher_create((const char *const *)one, 1, &m));
    stop[0] = 'q';
    const char *emit;
    size_t n;
    int stopped;
    assert_ok(rlx_stop_matcher_push(m, "azz", 3, &emit, &n, &stopped));
    assert_true(stopped && n == 1 && emit[0] == 'a');
    assert_int_equal(rlx_stop_matcher_push(m, NULL, 1, &emit, &n, &stopped), RLX_E_INVALID);
    rlx_stop_matcher_destroy(m);
    rlx_stop_matcher_destroy(NULL);
}

// ---- random texts ----

/* The definition on the whole text: cut before the stop string that completes first (the one
 * starting first among those). Returns the length kept, or -1 when nothing matches. */
static long whole_text_cut(const char *t, size_t len, const char *const *stops, size_t n) {
    for (size_t end = 1; end <= len; end++) {
        long best = -1;
        for (size_t i = 0; i < n; i++) {
            size_t l = strlen(stops[i]);
            if (l <= end && memcmp(t + end - l, stops[i], l) == 0 && (best < 0 || (long)(end - l) < best))
                best = (long)(end - l);
        }
        if (best >= 0)
            return best;
    }
    return -1;
}

/* The longest tail of t[0, len) that is a proper prefix of a stop string: what must be held. */
static size_t must_hold(const char *t, size_t len, const char *const *stops, size_t n) {
    size_t best = 0;
    for (size_t i = 0; i < n; i++) {
        size_t l = strlen(stops[i]);
        for (size_t k = 1; k < l && k <= len; k++)
            if (k > best && memcmp(t + len - k, stops[i], k) == 0)
                best = k;
    }
    return best;
}

static void test_random_texts_and_cuts(void **state) {
    (void)state;
    static const char *const pieces[] = {"a", "b", "c", "\xc3\xa9"}; /* é has two bytes */
    srand(12345);
    int stopped_runs = 0;
    for (int run = 0; run < 3000; run++) {
        char stop_text[3][16];
        const char *stops[3];
        size_t n = 1 + (size_t)(rand() % 3);
        for (size_t i = 0; i < n; i++) {
            stop_text[i][0] = '\0';
            for (int c = 1 + rand() % 3; c > 0; c--)
                strcat(stop_text[i], pieces[rand() % 4]);
            stops[i] = stop_text[i];
        }
        char text[128] = "";
        for (int c = rand() % 30; c > 0; c--)
            strcat(text, pieces[rand() % 4]);
        size_t len = strlen(text);
        long cut = whole_text_cut(text, len, stops, n);
        if (n == 1) { /* for one stop string the definition is strstr's */
            const char *at = strstr(text, stops[0]);
            assert_int_equal(cut, at ? at - text : -1);
        }
        stream s;
        open_stream(&s, stops, n);
        int mode = run % 3; /* byte by byte, random pieces, whole */
        for (size_t at = 0; at < len && !s.stopped;) {
            size_t piece = mode == 0 ? 1 : mode == 1 ? 1 + (size_t)(rand() % 5) : len;
            piece = piece > len - at ? len - at : piece;
            push(&s, text + at, piece);
            at += piece;
            /* everything safe is shown, nothing more */
            if (!s.stopped)
                assert_int_equal(s.n_shown, at - must_hold(text, at, stops, n));
        }
        flush(&s);
        size_t want = cut < 0 ? len : (size_t)cut;
        assert_int_equal(s.stopped, cut >= 0);
        if (s.n_shown != want || memcmp(s.shown, text, want) != 0)
            fail_msg("text '%s', %zu stop strings (first '%s'), mode %d: shown '%s', want %zu bytes", text, n, stops[0],
                     mode, s.shown, want);
        stopped_runs += s.stopped;
        close_stream(&s);
    }
    assert_true(stopped_runs > 500 && stopped_runs < 2900);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_split_stop_string_is_never_shown),
        cmocka_unit_test(test_byte_by_byte),
        cmocka_unit_test(test_utf8_stop_strings),
        cmocka_unit_test(test_overlapping_prefixes),
        cmocka_unit_test(test_stop_starting_inside_the_held_tail),
        cmocka_unit_test(test_bad_stop_strings_are_refused),
        cmocka_unit_test(test_random_texts_and_cuts),
    };
    return cmocka_run_group_tests_name("stop", tests, NULL, NULL);
}
