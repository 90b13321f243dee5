/* The sampler against sampler_ref.py, a NumPy transcription of Hugging Face's logits processors
 * (repetition penalty, temperature, top-k, top-p, min-p) and OpenAI's presence and frequency
 * penalties: every case's distribution, with its history fed through rlx_sampler_accept (and
 * again after rlx_sampler_reset_history), within 1e-5 and with exactly the same tokens
 * filtered out; the logit biases before them (added, summed when a token is listed twice, -inf
 * banning). Also: draws follow the distribution, the parameters are checked, the history
 * refuses ids outside the vocabulary, temperatures down to the smallest float are greedy,
 * extreme penalties give no NaN, and a window of 2^31 - 1 tokens costs what the tokens take. */
#include <float.h>
#include <malloc.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "testutil.h"

#ifdef __SANITIZE_ADDRESS__
/* AddressSanitizer's count of the bytes malloc'd (its header, sanitizer/allocator_interface.h,
 * comes with clang, not with Debian's gcc) */
size_t __sanitizer_get_current_allocated_bytes(void);
#endif

#define CASES RLX_TEST_DATA "/sampler_cases.txt"
#define MAX_VOCAB 512
#define MAX_HISTORY 512
#define TOLERANCE 1e-5
#define MAX_BIAS 16

typedef struct sampler_case {
    char name[64];
    rlx_sampler_params p;
    rlx_logit_bias bias[MAX_BIAS];
    int32_t history[MAX_HISTORY];
    int n_history;
    float logits[MAX_VOCAB];
    double probs[MAX_VOCAB];
    int vocab;
} sampler_case;

/* Reads the next case; 0 at "end". */
static int read_case(FILE *f, sampler_case *c) {
    char word[16];
    assert_int_equal(fscanf(f, "%15s", word), 1);
    if (strcmp(word, "end") == 0)
        return 0;
    assert_string_equal(word, "case");
    assert_int_equal(fscanf(f, "%63s", c->name), 1);
    c->p = rlx_sampler_params_default();
    int greedy, n;
    assert_int_equal(fscanf(f, " params %d %f %d %f %f %f %d %f %f", &greedy, &c->p.temperature, &c->p.top_k,
                            &c->p.top_p, &c->p.min_p, &c->p.repeat_penalty, &c->p.repeat_last_n, &c->p.presence_penalty,
                            &c->p.frequency_penalty),
                     9);
    c->p.greedy = greedy;
    assert_int_equal(fscanf(f, " bias %d", &n), 1);
    assert_true(n >= 0 && n <= MAX_BIAS);
    for (int i = 0; i < n; i++) /* glibc's %f reads "-inf" */
        assert_int_equal(fscanf(f, "%d %f", &c->bias[i].token, &c->bias[i].bias), 2);
    c->p.logit_bias = n ? c->bias : NULL;
    c->p.n_logit_bias = (uint32_t)n;
    assert_int_equal(fscanf(f, " history %d", &c->n_history), 1);
    assert_true(c->n_history >= 0 && c->n_history <= MAX_HISTORY);
    for (int i = 0; i < c->n_history; i++)
        assert_int_equal(fscanf(f, "%d", &c->history[i]), 1);
    assert_int_equal(fscanf(f, " logits %d", &c->vocab), 1);
    assert_true(c->vocab > 0 && c->vocab <= MAX_VOCAB);
    for (int i = 0; i < c->vocab; i++)
        assert_int_equal(fscanf(f, "%f", &c->logits[i]), 1);
    assert_int_equal(fscanf(f, " probs %d", &n), 1);
    assert_int_equal(n, c->vocab);
    for (int i = 0; i < n; i++)
        assert_int_equal(fscanf(f, "%lf", &c->probs[i]), 1);
    return 1;
}

static void accept_all(rlx_sampler *s, const int32_t *ids, int n) {
    for (int i = 0; i < n; i++)
        assert_ok(rlx_sampler_accept(s, ids[i]));
}

static void check_probs(const sampler_case *c, rlx_sampler *s, const char *when) {
    float got[MAX_VOCAB];
    rlx_sampler_probs(s, c->logits, got);
    for (int i = 0; i < c->vocab; i++) {
        /* a token the reference filters out must be filtered out here, and only those (or ones
         * whose probability a float cannot hold) */
        int filtered = c->probs[i] == 0, underflows = c->probs[i] < 1e-38;
        if ((filtered && got[i] != 0) || (got[i] == 0 && !underflows) || fabs(got[i] - c->probs[i]) > TOLERANCE)
            fail_msg("case %s (%s): p[%d] = %.9g, the reference says %.9g", c->name, when, i, (double)got[i],
                     c->probs[i]);
    }
}

static void test_matches_numpy_reference(void **state) {
    (void)state;
    FILE *f = fopen(CASES, "r");
    if (!f)
        fail_msg("%s: cannot open (written by the make_sampler_cases fixture)", CASES);
    static sampler_case c;
    int n_cases = 0, n_greedy = 0, n_penalised = 0, n_wrapped = 0, n_biased = 0, n_banned = 0;
    const int32_t noise[] = {0, 1, 1, 2, 0, 3, 4, 1};
    while (read_case(f, &c)) {
        rlx_sampler *s;
        assert_ok(rlx_sampler_create(&c.p, c.vocab, &s));
        accept_all(s, c.history, c.n_history);
        check_probs(&c, s, "after accepting the history");
        /* the same history after forgetting another one */
        rlx_sampler_reset_history(s);
        for (int i = 0; i < 8; i++)
            assert_ok(rlx_sampler_accept(s, noise[i] % c.vocab));
        rlx_sampler_reset_history(s);
        accept_all(s, c.history, c.n_history);
        check_probs(&c, s, "after a reset and the history again");
        /* a draw lands on the argmax under greedy, on a token with mass otherwise */
        int32_t t = rlx_sampler_sample(s, c.logits);
        assert_true(t >= 0 && t < c.vocab);
        if (c.probs[t] <= 0)
            fail_msg("case %s: sampled token %d, which the reference gives probability 0", c.name, t);
        if (rlx_sampler_is_greedy(s)) {
            assert_true(c.probs[t] == 1);
            n_greedy++;
        }
        n_penalised += c.n_history > 0 && c.p.repeat_last_n != 0 &&
                       (c.p.repeat_penalty != 1 || c.p.presence_penalty != 0 || c.p.frequency_penalty != 0);
        n_wrapped += c.p.repeat_last_n > 0 && c.n_history > c.p.repeat_last_n;
        n_biased += c.p.n_logit_bias > 0;
        for (uint32_t i = 0; i < c.p.n_logit_bias; i++)
            n_banned += c.bias[i].bias == -INFINITY;
        rlx_sampler_destroy(s);
        n_cases++;
    }
    fclose(f);
    print_message("%d cases: %d greedy, %d penalised, %d with a history longer than the window, %d with logit biases "
                  "(%d bans)\n",
                  n_cases, n_greedy, n_penalised, n_wrapped, n_biased, n_banned);
    assert_true(n_cases >= 400 && n_greedy >= 20 && n_penalised >= 100 && n_wrapped >= 50 && n_biased >= 80 &&
                n_banned >= 20);
}

/* 20000 draws of a penalised, filtered distribution land within 5 standard deviations of it. */
static void test_draws_follow_probs(void **state) {
    (void)state;
    enum { V = 8, DRAWS = 20000 };
    const float logits[V] = {2.0f, -1.0f, 0.5f, 3.0f, -2.5f, 1.5f, 0.0f, -0.5f};
    rlx_sampler_params p = rlx_sampler_params_default();
    p.seed = 7;
    p.top_k = 6;
    p.min_p = 0.05f;
    p.repeat_penalty = 1.5f;
    p.frequency_penalty = 0.3f;
    rlx_sampler *s;
    assert_ok(rlx_sampler_create(&p, V, &s));
    accept_all(s, (const int32_t[]){3, 3, 5, 1}, 4);
    float probs[V];
    rlx_sampler_probs(s, logits, probs);
    int counts[V] = {0};
    for (int i = 0; i < DRAWS; i++)
        counts[rlx_sampler_sample(s, logits)]++;
    for (int i = 0; i < V; i++) {
        double sd = sqrt(probs[i] * (1 - probs[i]) / DRAWS);
        if (fabs(counts[i] / (double)DRAWS - probs[i]) > 5 * sd + 1e-3)
            fail_msg("token %d drawn %d times in %d, probability %g", i, counts[i], DRAWS, (double)probs[i]);
    }
    rlx_sampler_destroy(s);
}

static void expect_refused(rlx_sampler_params p, const char *needle) {
    rlx_sampler *s = (rlx_sampler *)&s;
    assert_int_equal(rlx_sampler_create(&p, 16, &s), RLX_E_INVALID);
    assert_null(s);
    assert_error_mentions(needle);
}

static void test_parameters_are_checked(void **state) {
    (void)state;
    rlx_sampler_params d = rlx_sampler_params_default();
    assert_int_equal(d.greedy, 0);
    assert_true(d.temperature == 1 && d.top_k == 0 && d.top_p == 1 && d.min_p == 0);
    assert_true(d.repeat_penalty == 1 && d.repeat_last_n == 64 && d.presence_penalty == 0 && d.frequency_penalty == 0);
    rlx_sampler_params p;
    /* greedy does not excuse a nonsensical value */
    p = d, p.greedy = 1, p.temperature = -0.5f, expect_refused(p, "temperature must be a finite number >= 0");
    p = d, p.temperature = INFINITY, expect_refused(p, "temperature");
    p = d, p.temperature = NAN, expect_refused(p, "temperature");
    p = d, p.top_k = -1, expect_refused(p, "top-k must be >= 0");
    p = d, p.top_p = 0, expect_refused(p, "top-p must be in (0, 1]");
    p = d, p.top_p = 1.5f, expect_refused(p, "top-p");
    p = d, p.min_p = -0.1f, expect_refused(p, "min-p must be in [0, 1]");
    p = d, p.min_p = 1.1f, expect_refused(p, "min-p");
    p = d, p.min_p = NAN, expect_refused(p, "min-p");
    p = d, p.repeat_penalty = 0, expect_refused(p, "repeat penalty must be a finite number > 0");
    p = d, p.repeat_penalty = -1, expect_refused(p, "repeat penalty");
    p = d, p.repeat_penalty = INFINITY, expect_refused(p, "repeat penalty");
    p = d, p.repeat_last_n = -2, expect_refused(p, "repeat-last-n must be >= -1");
    p = d, p.presence_penalty = NAN, expect_refused(p, "presence and frequency penalties must be finite");
    p = d, p.frequency_penalty = -INFINITY, expect_refused(p, "presence and frequency");
    const rlx_logit_bias outside = {16, 1}, nan = {3, NAN}, plus_inf = {3, INFINITY}, negative = {-1, 1};
    p = d, p.logit_bias = &outside, p.n_logit_bias = 1, expect_refused(p, "token 16, outside the vocabulary [0, 16)");
    p = d, p.logit_bias = &negative, p.n_logit_bias = 1, expect_refused(p, "token -1, outside the vocabulary");
    p = d, p.logit_bias = &nan, p.n_logit_bias = 1, expect_refused(p, "logit bias of token 3 is nan");
    p = d, p.logit_bias = &plus_inf, p.n_logit_bias = 1, expect_refused(p, "a finite number or -inf");
    p = d, p.logit_bias = NULL, p.n_logit_bias = 2, expect_refused(p, "2 logit biases but a NULL list");
    rlx_logit_bias all[17];
    for (int i = 0; i < 16; i++)
        all[i] = (rlx_logit_bias){i, -INFINITY};
    all[16] = (rlx_logit_bias){5, 2}; /* listed again: still banned, -inf + 2 */
    p = d, p.logit_bias = all, p.n_logit_bias = 17, expect_refused(p, "the logit biases ban every token");
    rlx_sampler *s;
    /* one token listed 300 times (past a byte's count) is one distinct id whose biases sum */
    static rlx_logit_bias many[300];
    for (int i = 0; i < 300; i++)
        many[i] = (rlx_logit_bias){7, 0.5f};
    p = d, p.logit_bias = many, p.n_logit_bias = 300;
    assert_ok(rlx_sampler_create(&p, 16, &s));
    assert_int_equal(rlx_sampler_params_of(s).n_logit_bias, 1);
    assert_true(rlx_sampler_params_of(s).logit_bias[0].token == 7 &&
                rlx_sampler_params_of(s).logit_bias[0].bias == 150);
    rlx_sampler_destroy(s);
    /* the list is copied: the sampler keeps the distinct ids after the caller's array is gone */
    p = d, p.logit_bias = all, p.n_logit_bias = 17, p.greedy = 1;
    all[0].bias = 0;
    assert_ok(rlx_sampler_create(&p, 16, &s));
    for (int i = 0; i < 17; i++)
        all[i] = (rlx_logit_bias){0, -INFINITY};
    const float flat[16] = {0};
    assert_int_equal(rlx_sampler_sample(s, flat), 0);
    assert_int_equal(rlx_sampler_params_of(s).n_logit_bias, 16);
    rlx_sampler_destroy(s);
    assert_int_equal(rlx_sampler_create(&d, 0, &s), RLX_E_INVALID);
    /* the edges that are allowed */
    p = d, p.temperature = 0, p.min_p = 1, p.repeat_last_n = -1, p.presence_penalty = -2, p.frequency_penalty = -2;
    assert_ok(rlx_sampler_create(&p, 16, &s));
    assert_true(rlx_sampler_is_greedy(s));
    assert_int_equal(rlx_sampler_params_of(s).repeat_last_n, -1);
    rlx_sampler_destroy(s);
}

/* An id outside the vocabulary is refused and leaves the history as it was. */
static void test_accept_refuses_ids_outside_vocabulary(void **state) {
    (void)state;
    enum { V = 4 };
    const float logits[V] = {1.0f, 0.9f, 0.0f, -1.0f};
    rlx_sampler_params p = rlx_sampler_params_default();
    p.greedy = 1;
    p.repeat_penalty = 2;
    rlx_sampler *s;
    assert_ok(rlx_sampler_create(&p, V, &s));
    assert_int_equal(rlx_sampler_sample(s, logits), 0);
    assert_int_equal(rlx_sampler_accept(s, V), RLX_E_INVALID);
    assert_error_mentions("token 4 is outside the vocabulary [0, 4)");
    assert_int_equal(rlx_sampler_accept(s, -1), RLX_E_INVALID);
    assert_int_equal(rlx_sampler_sample(s, logits), 0);
    assert_ok(rlx_sampler_accept(s, 0)); /* 1.0 / 2 falls below 0.9 */
    assert_int_equal(rlx_sampler_sample(s, logits), 1);
    rlx_sampler_destroy(s);
}

/* Every temperature below FLT_MIN is greedy, and those just above it, which divide logits past
 * the float range, still draw the argmax: no NaN, never the least likely token. */
static void test_tiny_temperatures_are_greedy(void **state) {
    (void)state;
    enum { V = 5 };
    const float logits[V] = {100.0f, 300.0f, 200.0f, -300.0f, 299.0f};
    const float tiny[] = {1e-45f, 1e-40f, FLT_MIN / 2, FLT_MIN, 1e-37f, 1e-30f};
    for (size_t t = 0; t < sizeof tiny / sizeof tiny[0]; t++) {
        rlx_sampler_params p = rlx_sampler_params_default();
        p.temperature = tiny[t];
        p.top_p = 0.9f; /* the filters see the same distribution */
        p.min_p = 0.05f;
        for (uint64_t seed = 0; seed < 20; seed++) {
            p.seed = seed;
            rlx_sampler *s;
            assert_ok(rlx_sampler_create(&p, V, &s));
            if (rlx_sampler_sample(s, logits) != 1)
                fail_msg("temperature %g, seed %llu: not the argmax", (double)tiny[t], (unsigned long long)seed);
            assert_int_equal(rlx_sampler_is_greedy(s), tiny[t] < FLT_MIN);
            float probs[V];
            rlx_sampler_probs(s, logits, probs);
            for (int i = 0; i < V; i++)
                if (probs[i] != (i == 1))
                    fail_msg("temperature %g: probability %g for token %d", (double)tiny[t], (double)probs[i], i);
            rlx_sampler_destroy(s);
        }
    }
}

/* Finite parameters that push penalised logits past FLT_MAX give a distribution still: the
 * tokens pushed up share the top, those pushed down lose all mass; nothing is NaN. */
static void test_extreme_penalties_stay_finite(void **state) {
    (void)state;
    enum { V = 3 };
    const float logits[V] = {5.0f, 6.0f, 1.0f};
    const int32_t history[] = {0, 1, 0, 1};
    const struct {
        float repeat_penalty, presence, frequency;
        float want[V];
    } cases[] = {{1e-38f, 0, 0, {0.5f, 0.5f, 0}}, /* 5 / 1e-38 and 6 / 1e-38: both past FLT_MAX */
                 {1, 3e38f, 3e38f, {0, 0, 1}},    /* 5 - 3e38 - 6e38: below -FLT_MAX */
                 {1e-38f, -3e38f, -3e38f, {0.5f, 0.5f, 0}}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        rlx_sampler_params p = rlx_sampler_params_default();
        p.repeat_penalty = cases[c].repeat_penalty;
        p.presence_penalty = cases[c].presence;
        p.frequency_penalty = cases[c].frequency;
        rlx_sampler *s;
        assert_ok(rlx_sampler_create(&p, V, &s));
        for (int i = 0; i < 4; i++)
            assert_ok(rlx_sampler_accept(s, history[i]));
        float probs[V];
        rlx_sampler_probs(s, logits, probs);
        for (int i = 0; i < V; i++)
            if (!(fabsf(probs[i] - cases[c].want[i]) < 1e-6f))
                fail_msg("case %zu: probability %g for token %d, not %g", c, (double)probs[i], i,
                         (double)cases[c].want[i]);
        const int32_t drawn = rlx_sampler_sample(s, logits);
        assert_true(cases[c].want[drawn] > 0);
        rlx_sampler_destroy(s);
    }
}

/* Bytes the process holds on the heap now. */
static size_t heap_bytes(void) {
#ifdef __SANITIZE_ADDRESS__
    return __sanitizer_get_current_allocated_bytes();
#else
    struct mallinfo2 m = mallinfo2();
    return m.uordblks + m.hblkhd;
#endif
}

/* A window of 2^31 - 1 tokens (as a client may ask) costs what the accepted tokens take, and
 * still penalises the first of them: nothing has left it. */
static void test_wide_window_costs_what_it_holds(void **state) {
    (void)state;
    enum { V = 16, ACCEPTED = 5000 };
    rlx_sampler_params p = rlx_sampler_params_default();
    p.greedy = 1;
    p.repeat_penalty = 2;
    p.repeat_last_n = INT32_MAX;
    const size_t before = heap_bytes();
    rlx_sampler *s;
    assert_ok(rlx_sampler_create(&p, V, &s));
    assert_ok(rlx_sampler_accept(s, 0));
    for (int i = 1; i < ACCEPTED; i++)
        assert_ok(rlx_sampler_accept(s, 1));
    const size_t used = heap_bytes() - before;
    if (used > 1u << 20)
        fail_msg("a sampler that accepted %d tokens holds %zu bytes", ACCEPTED, used);
    /* token 0, still in the window, falls from 1 to 0.5: below token 2's unpenalised 0.8 */
    float logits[V];
    for (int i = 0; i < V; i++)
        logits[i] = -1.0f;
    logits[0] = 1.0f;
    logits[2] = 0.8f;
    assert_int_equal(rlx_sampler_sample(s, logits), 2);
    rlx_sampler_destroy(s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matches_numpy_reference),
        cmocka_unit_test(test_draws_follow_probs),
        cmocka_unit_test(test_parameters_are_checked),
        cmocka_unit_test(test_accept_refuses_ids_outside_vocabulary),
        cmocka_unit_test(test_tiny_temperatures_are_greedy),
        cmocka_unit_test(test_extreme_penalties_stay_finite),
        cmocka_unit_test(test_wide_window_costs_what_it_holds),
    };
    return cmocka_run_group_tests_name("sampler", tests, NULL, NULL);
}
